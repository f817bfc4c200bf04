//! `vm exec -i` / `-t`: the host side of an interactive guest command.
//!
//! - `-i`: the host's stdin is read on a thread of its own (so a read blocked on a terminal
//!   never holds up `vm`'s exit) into a channel of two chunks, and sent as fast as the guest
//!   command consumes it (the agent's acknowledged window); its EOF closes the command's
//!   stdin, output continues.
//! - `-t`: stdin must be a terminal (else exit 2, before anything boots); the guest command
//!   gets a pseudo-terminal of our window's size, resized on every `SIGWINCH`; `TERM` is
//!   passed from our environment. With `-i` our terminal is in raw mode for the session
//!   (restored by a guard on every way out: exit, error, guest death, wall expiry, signal,
//!   unwinding panic), so Ctrl-C is a byte the guest's line discipline turns into `SIGINT`;
//!   a `SIGINT` sent to `vm` itself is forwarded as that byte too.
//! - Otherwise `SIGINT`/`SIGTERM` cancel the guest command's whole tree and `vm` exits 130.

use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;
use vm_sandbox::agent::{
    ClientError, ExecEvent, Interactive, InteractiveInput, InteractiveOutput, TtySize,
};
use vm_sys::term;

use crate::exit;
use crate::stream::{Outputs, Signals};

/// How long a cancelled session may take to report its end before `vm` stops waiting.
const CANCEL_GRACE: Duration = Duration::from_secs(5);
/// Largest chunk read from our stdin at once.
const STDIN_CHUNK: usize = 64 * 1024;
/// The terminal's interrupt character (`VINTR`, Ctrl-C).
const CTRL_C: u8 = 0x03;

/// What `-i` and `-t` ask for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mode {
    pub stdin: bool,
    pub tty: bool,
}

impl Mode {
    /// Either flag: the command runs through an interactive exec.
    pub fn any(self) -> bool {
        self.stdin || self.tty
    }

    /// The terminal to ask for, checked before anything boots: `-t` needs a terminal on
    /// stdin (as docker says, "the input device is not a TTY").
    pub fn terminal(self) -> anyhow::Result<Option<TtySize>> {
        if !self.tty {
            return Ok(None);
        }
        if !std::io::stdin().is_terminal() {
            return Err(exit::usage(
                "-t: the input device is not a terminal (drop -t, or run vm from a terminal)",
            ));
        }
        Ok(Some(size()))
    }

    /// The variables `-t` adds to the command's environment: `TERM` from ours, when set.
    pub fn env(self) -> Vec<(String, String)> {
        match std::env::var("TERM") {
            Ok(term) if self.tty && !term.is_empty() => vec![("TERM".into(), term)],
            _ => Vec::new(),
        }
    }
}

/// Our terminal's size (80x24 when it cannot be read).
fn size() -> TtySize {
    match term::window_size(std::io::stdin().as_fd()) {
        Ok((rows, cols)) if rows > 0 && cols > 0 => TtySize { rows, cols },
        _ => TtySize { rows: 24, cols: 80 },
    }
}

/// Reads our stdin on its own thread into a channel of two chunks (back-pressure: the
/// thread waits while the guest is not consuming).
fn stdin_reader() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(2);
    let spawned = std::thread::Builder::new()
        .name("vm-stdin".into())
        .spawn(move || {
            let mut buf = vec![0u8; STDIN_CHUNK];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::debug!("reading stdin: {e}");
                        return;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the stdin reader ({e}); the guest command gets EOF");
    }
    rx
}

/// What the main loop asks of the input pump.
enum Ctl {
    Resize(TtySize),
    Bytes(Vec<u8>),
    Cancel,
}

async fn recv_opt(rx: &mut Option<mpsc::Receiver<Vec<u8>>>) -> Option<Vec<u8>> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Sends stdin chunks and control messages; a control message is never stuck behind a
/// chunk waiting for the guest (the wait for window is cancel-safe).
async fn pump(
    mut input: InteractiveInput,
    mut stdin: Option<mpsc::Receiver<Vec<u8>>>,
    mut ctl: mpsc::Receiver<Ctl>,
) -> Result<(), ClientError> {
    let mut pending: Option<Vec<u8>> = None;
    loop {
        tokio::select! {
            c = ctl.recv() => match c {
                Some(Ctl::Resize(size)) => input.resize(size).await?,
                Some(Ctl::Bytes(b)) => input.write(&b).await?,
                Some(Ctl::Cancel) => return input.cancel().await,
                None => return Ok(()),
            },
            d = recv_opt(&mut stdin), if pending.is_none() => match d {
                Some(d) => pending = Some(d),
                None => {
                    input.close_stdin().await?;
                    stdin = None;
                }
            },
            r = input.writable(pending.as_ref().map_or(0, Vec::len)), if pending.is_some() => {
                r?;
                if let Some(d) = pending.take() {
                    input.write(&d).await?;
                }
            }
        }
    }
}

async fn winch(s: &mut Option<Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Starts the session with `start` and relays it: our stdin (with `-i`) to the guest
/// command, its output to ours. Returns the command's exit code (see [`crate::stream::status_code`]), or
/// [`exit::INTERRUPTED`] after a signal cancelled it.
pub async fn relay_interactive(
    start: impl Future<Output = anyhow::Result<Interactive>>,
    signals: &mut Signals,
    mode: Mode,
) -> anyhow::Result<u8> {
    let Interactive { input, mut output } = tokio::select! {
        s = start => s.context("starting the command in the guest")?,
        sig = signals.recv() => {
            tracing::info!("{sig}: interrupted before the command started");
            return Ok(exit::INTERRUPTED);
        }
    };
    let raw_keys = mode.tty && mode.stdin;
    // Dropped on every way out of this function, unwinding included: settings restored.
    let _raw = match raw_keys {
        true => Some(
            term::RawMode::enable(std::io::stdin().as_fd())
                .context("putting the terminal in raw mode")?,
        ),
        false => None,
    };
    let mut winch_sig = match mode.tty {
        true => Some(signal(SignalKind::window_change()).context("installing SIGWINCH")?),
        false => None,
    };
    let (ctl, ctl_rx) = mpsc::channel(16);
    let pump = tokio::spawn(pump(input, mode.stdin.then(stdin_reader), ctl_rx));
    let _abort = AbortOnDrop(pump);
    let mut out = Outputs::new();
    loop {
        tokio::select! {
            ev = output.next() => if let Some(code) = out.event(ev).await? {
                return Ok(code);
            },
            () = winch(&mut winch_sig) => {
                let _ = ctl.try_send(Ctl::Resize(size()));
            }
            sig = signals.recv() => {
                if raw_keys && sig == "SIGINT" {
                    let _ = ctl.try_send(Ctl::Bytes(vec![CTRL_C]));
                    continue;
                }
                tracing::info!("{sig}: cancelling the guest command tree");
                let _ = ctl.try_send(Ctl::Cancel);
                cancelled(&mut output).await;
                return Ok(exit::INTERRUPTED);
            }
        }
    }
}

/// Waits (bounded) for the cancelled command's exit; past the grace the connection is
/// dropped, which kills the tree from the agent's side too.
async fn cancelled(output: &mut InteractiveOutput) {
    let end = async {
        loop {
            match output.next().await {
                Ok(Some(ExecEvent::Exit(status))) => {
                    tracing::debug!(?status, "guest command cancelled");
                    return;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    };
    if tokio::time::timeout(CANCEL_GRACE, end).await.is_err() {
        tracing::debug!("cancel timed out; connection dropped");
    }
}

/// Aborts the input pump however the relay ends.
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), ClientError>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

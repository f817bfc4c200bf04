//! Streaming a guest command: output relayed as it comes, Ctrl-C/SIGTERM turned into a
//! cancel of the guest command's whole process tree.

use std::time::Duration;

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{Signal, SignalKind, signal};
use vm_sandbox::agent::{ClientError, ExecEvent, ExecStream, ExitStatus};

use crate::exit;

/// How long a cancel may take before the connection is dropped (which also kills the
/// guest process tree, from the agent's side).
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// SIGINT and SIGTERM listeners. Installed before anything is booted so an interrupt at
/// any point tears down what was started and exits 130.
pub struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    /// Installs the listeners (this replaces the default "die now" disposition).
    pub fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        })
    }

    /// Resolves when SIGINT or SIGTERM arrives; returns the signal's name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}

/// `SIGUSR1` and `SIGUSR2` as the supervisor's pause and resume requests (`vm pause`,
/// `vm unpause`).
pub struct PauseSignals {
    pause: Signal,
    resume: Signal,
}

impl PauseSignals {
    /// Installs the listeners (replacing the default "die" disposition of both).
    pub fn install() -> anyhow::Result<PauseSignals> {
        Ok(PauseSignals {
            pause: signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?,
            resume: signal(SignalKind::user_defined2())
                .context("installing the SIGUSR2 handler")?,
        })
    }

    /// Resolves when a request arrives: true to pause, false to resume.
    pub async fn recv(&mut self) -> bool {
        tokio::select! {
            _ = self.pause.recv() => true,
            _ = self.resume.recv() => false,
        }
    }
}

/// The exit code for a finished guest command.
pub fn status_code(status: &ExitStatus) -> u8 {
    if status.timed_out {
        exit::TIMEOUT
    } else {
        exit::from_guest(status.code, status.signal)
    }
}

/// Starts a streaming exec with `start`, writing the command's stdout/stderr to ours as
/// chunks arrive. Returns the exit code to use: the command's (see [`status_code`]), or
/// [`exit::INTERRUPTED`] after a signal cancelled it.
pub async fn relay_stream(
    start: impl Future<Output = anyhow::Result<ExecStream>>,
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    let mut stream = tokio::select! {
        s = start => s.context("starting the command in the guest")?,
        sig = signals.recv() => {
            tracing::info!("{sig}: interrupted before the command started");
            return Ok(exit::INTERRUPTED);
        }
    };
    let mut out = Outputs::new();
    loop {
        tokio::select! {
            ev = stream.next() => if let Some(code) = out.event(ev).await? {
                return Ok(code);
            },
            sig = signals.recv() => {
                tracing::info!("{sig}: cancelling the guest command tree");
                // `next` is not cancel-safe mid-frame; if the cancel exchange fails the
                // stream is dropped, which closes the connection and the agent kills the
                // tree anyway.
                match tokio::time::timeout(CANCEL_GRACE, stream.cancel()).await {
                    Ok(Ok(status)) => tracing::debug!(?status, "guest command cancelled"),
                    Ok(Err(e)) => tracing::debug!("cancel exchange failed ({e}); connection dropped"),
                    Err(_) => tracing::debug!("cancel timed out; connection dropped"),
                }
                return Ok(exit::INTERRUPTED);
            }
        }
    }
}

/// Our stdout and stderr, for a guest command's events.
pub struct Outputs {
    stdout: tokio::io::Stdout,
    stderr: tokio::io::Stderr,
}

impl Outputs {
    pub fn new() -> Outputs {
        Outputs {
            stdout: tokio::io::stdout(),
            stderr: tokio::io::stderr(),
        }
    }

    /// Relays one event of a guest command; its exit code once it exited (see
    /// [`status_code`]).
    pub async fn event(
        &mut self,
        ev: Result<Option<ExecEvent>, ClientError>,
    ) -> anyhow::Result<Option<u8>> {
        match ev.context("reading the command's output from the guest")? {
            Some(ExecEvent::Stdout(d)) => relay(&mut self.stdout, &d).await,
            Some(ExecEvent::Stderr(d)) => relay(&mut self.stderr, &d).await,
            Some(ExecEvent::Exit(status)) => {
                tracing::debug!(?status, "guest command exited");
                return Ok(Some(status_code(&status)));
            }
            None => anyhow::bail!("the guest closed the command's stream without an exit status"),
        }
        Ok(None)
    }
}

/// Writes a chunk to one of our outputs. A closed output (e.g. `| head`) is not an error
/// for the guest command; its output is discarded from then on.
async fn relay(out: &mut (impl AsyncWriteExt + Unpin), data: &[u8]) {
    if let Err(e) = async {
        out.write_all(data).await?;
        out.flush().await
    }
    .await
    {
        tracing::debug!("dropping guest output: {e}");
    }
}

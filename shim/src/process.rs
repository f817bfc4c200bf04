//! One guest process of a container (its init or an exec), wired to containerd's FIFOs.
//!
//! A process runs as one interactive exec through `vm-sandbox`, confined as a container's
//! ([`vm_sandbox::Guest::exec_container`]): stdin streamed from containerd's stdin FIFO with the agent's flow
//! control (a command that does not read costs no memory), output written to the stdout and
//! stderr FIFOs (with a terminal everything is stdout), the terminal resized on
//! `resize_pty`, stdin closed on `close_io`, the whole tree killed on `kill`. Two tasks drive
//! it: the input task (stdin, control) and the output task (output, then the exit status,
//! published through a `watch` channel that `wait` and the `TaskExit` event read).
//!
//! Nothing here polls the agent: a process's status, its signals and its exit all travel on
//! its own exec connection, which holds an exec slot of the agent that forwards and file
//! streams cannot take (`guest_agent::agent::slots`), so no load on the VM's other
//! connections makes a running process look dead or an exec start fail for their sake.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};
use vm_sandbox::agent::container::Confine;
use vm_sandbox::agent::{
    Command, ExecEvent, ExitStatus, Interactive, InteractiveInput, InteractiveOutput, TtySize,
};
use vm_sandbox::{Guest, Run};
use vm_sync::Lock;

use crate::bundle::ProcessSpec;
use crate::error::ShimError;

/// Exit code reported for a process killed with `SIGKILL` (or lost with its VM).
pub const KILLED: u32 = 128 + libc::SIGKILL as u32;
/// The first terminal size, until containerd sends the real one.
const FIRST_TTY: TtySize = TtySize { rows: 24, cols: 80 };
/// Read size from the stdin FIFO.
const STDIN_CHUNK: usize = 32 * 1024;

/// containerd's FIFO paths for one process (empty = not connected).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stdio {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub code: u32,
    pub at: SystemTime,
}

/// A process's lifecycle state, as containerd's `Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Stopped,
}

enum Control {
    Resize(TtySize),
    CloseStdin,
    Kill,
    Signal(i32, bool),
}

/// One process (see the module docs).
#[derive(Debug)]
pub struct Process {
    pub exec_id: String,
    pub stdio: Stdio,
    pub spec: ProcessSpec,
    status: Mutex<Status>,
    exit_tx: watch::Sender<Option<Exit>>,
    /// `close_io` was asked for (kept for a process not started yet).
    stdin_closed: std::sync::atomic::AtomicBool,
    /// Set once the exit has been published (`TaskExit`) and, for init, the VM torn down.
    reported: watch::Sender<bool>,
    control: Mutex<Option<mpsc::UnboundedSender<Control>>>,
}

/// The exit code containerd reports for `s`: the code, or 128 + the signal. The status comes
/// from the guest: any value maps to some code without overflowing.
pub fn exit_code(s: &ExitStatus) -> u32 {
    match (s.code, s.signal) {
        (Some(c), _) => c as u32,
        (None, Some(sig)) => 128u32.saturating_add(sig as u32),
        (None, None) => KILLED,
    }
}

impl Process {
    pub fn new(exec_id: String, stdio: Stdio, spec: ProcessSpec) -> Arc<Process> {
        let (exit_tx, _) = watch::channel(None);
        let (reported, _) = watch::channel(false);
        Arc::new(Process {
            exec_id,
            stdio,
            spec,
            status: Mutex::new(Status::Created),
            exit_tx,
            reported,
            stdin_closed: Default::default(),
            control: Mutex::new(None),
        })
    }

    pub fn status(&self) -> Status {
        *self.status.locked()
    }

    pub fn exit(&self) -> Option<Exit> {
        *self.exit_tx.borrow()
    }

    /// Waits until the process has ended.
    pub async fn wait(&self) -> Exit {
        let mut rx = self.exit_tx.subscribe();
        loop {
            if let Some(e) = *rx.borrow_and_update() {
                return e;
            }
            if rx.changed().await.is_err() {
                return Exit {
                    code: KILLED,
                    at: SystemTime::now(),
                };
            }
        }
    }

    pub fn set_reported(&self) {
        self.reported.send_replace(true);
    }

    /// Waits until the exit has been reported (see [`Process::set_reported`]).
    pub async fn wait_reported(&self) {
        let mut rx = self.reported.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Records the end (the first one wins).
    pub fn set_exited(&self, code: u32) {
        *self.status.locked() = Status::Stopped;
        *self.control.locked() = None;
        self.exit_tx.send_if_modified(|e| match e {
            Some(_) => false,
            None => {
                *e = Some(Exit {
                    code,
                    at: SystemTime::now(),
                });
                true
            }
        });
    }

    /// Starts the process in `guest` (whose working directory is the container's `cwd`),
    /// confined as `confine` says (its own [`ProcessSpec::confine`] with the container's
    /// seccomp profile, and for the init process what it sets up for the container).
    pub async fn start(
        self: &Arc<Self>,
        guest: &Guest,
        container_cwd: &str,
        confine: Confine,
    ) -> Result<(), ShimError> {
        if self.status() != Status::Created {
            return Err(ShimError::State(format!(
                "process {:?} already started",
                self.exec_id
            )));
        }
        if self.spec.cwd != container_cwd {
            return Err(ShimError::Unsupported(format!(
                "process.cwd {:?}: an exec runs in the container's working directory {container_cwd:?}",
                self.spec.cwd
            )));
        }
        let run = Run {
            command: Command::Argv(self.spec.args.clone()),
            // On top of the VM's environment (the container's); the same secret rule, with
            // the names the runtime's options allow.
            env: self.spec.env.clone(),
            user: self.spec.user.clone(),
            timeout: Some(std::time::Duration::from_secs(100 * 365 * 24 * 3600)),
            ..Default::default()
        };
        let tty = self.stdio.terminal.then_some(FIRST_TTY);
        let out = open_writer(&self.stdio.stdout).await?;
        let err = match self.stdio.terminal {
            true => None,
            false => open_writer(&self.stdio.stderr).await?,
        };
        let Interactive { input, output } = guest
            .exec_container(run, tty, confine)
            .await
            .map_err(ShimError::sandbox("starting the process"))?;
        let (tx, rx) = mpsc::unbounded_channel();
        *self.control.locked() = Some(tx);
        *self.status.locked() = Status::Running;
        tokio::spawn(input_task(self.clone(), input, rx));
        tokio::spawn(output_task(self.clone(), output, out, err));
        Ok(())
    }

    fn send(&self, c: Control) -> bool {
        self.control
            .locked()
            .as_ref()
            .is_some_and(|tx| tx.send(c).is_ok())
    }

    /// Kills the process tree (a process not started yet just ends).
    pub fn kill(&self) {
        if self.status() == Status::Created {
            self.set_exited(KILLED);
            return;
        }
        self.send(Control::Kill);
    }

    /// Delivers `signal` to the running process (`all`: its process group in the guest).
    pub fn signal(&self, signal: i32, all: bool) -> Result<(), ShimError> {
        if self.status() != Status::Running || !self.send(Control::Signal(signal, all)) {
            return Err(ShimError::State(format!(
                "process {:?} is not running",
                self.exec_id
            )));
        }
        Ok(())
    }

    pub fn resize(&self, rows: u16, cols: u16) {
        self.send(Control::Resize(TtySize { rows, cols }));
    }

    /// containerd's `close_io`: ends stdin (after what is already in the FIFO), also when it
    /// comes before the process has started.
    pub fn close_stdin(&self) {
        self.stdin_closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.send(Control::CloseStdin);
    }

    fn stdin_close_requested(&self) -> bool {
        self.stdin_closed.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Opens a FIFO for writing, without waiting for a reader (read-write on Linux: a
/// containerd that restarts and re-opens its end finds the pipe still there).
async fn open_writer(path: &str) -> Result<Option<pipe::Sender>, ShimError> {
    if path.is_empty() {
        return Ok(None);
    }
    pipe::OpenOptions::new()
        .read_write(true)
        .open_sender(Path::new(path))
        .map(Some)
        .map_err(ShimError::io(format!("opening {path}")))
}

/// Opens the stdin FIFO read-write, without waiting for containerd's writer: the pipe
/// then never reads end-of-file by itself (a writer that comes and goes, or never comes, is
/// not an end); containerd ends stdin with `close_io`, as with runc.
fn open_stdin(path: &str) -> Option<pipe::Receiver> {
    match pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(Path::new(path))
    {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(path, error = %e, "cannot open stdin FIFO");
            None
        }
    }
}

/// Applies a control message other than `CloseStdin`; false once the session is gone.
async fn control(input: &mut InteractiveInput, c: Control) -> bool {
    let r = match c {
        Control::Resize(size) => input.resize(size).await,
        Control::Kill => input.cancel().await,
        Control::Signal(sig, all) => input.signal(sig, all).await,
        Control::CloseStdin => Ok(()),
    };
    r.is_ok()
}

/// Sends `data` to the command's stdin (waiting for the agent's credit).
async fn forward(input: &mut InteractiveInput, data: &[u8]) -> bool {
    input.writable(data.len()).await.is_ok() && input.write(data).await.is_ok()
}

/// containerd's `close_io`: what its writer left in the FIFO goes first (it closes after its
/// last write, and the message can overtake our reading), then the command's stdin ends.
async fn close_stdin(
    input: &mut InteractiveInput,
    stdin: &mut Option<pipe::Receiver>,
    buf: &mut [u8],
) -> bool {
    if let Some(r) = stdin.take() {
        loop {
            let n = read_now(&r, buf);
            if n == 0 || !forward(input, &buf[..n]).await {
                break;
            }
        }
    }
    input.close_stdin().await.is_ok()
}

/// What the FIFO holds now, read straight from its (non-blocking) descriptor; 0 when empty.
/// Not tokio's `try_read`: that answers `WouldBlock` without reading until the reactor has
/// seen the pipe readable, which it may not have yet for bytes written just before
/// `close_io` — they were lost (`wc -l` printed 0 in about one run of six).
fn read_now(r: &pipe::Receiver, buf: &mut [u8]) -> usize {
    loop {
        match nix::unistd::read(r, buf) {
            Ok(n) => return n,
            Err(nix::errno::Errno::EINTR) => continue,
            // EAGAIN: nothing left; any other error ends stdin the same way.
            Err(_) => return 0,
        }
    }
}

async fn input_task(
    proc: Arc<Process>,
    mut input: InteractiveInput,
    mut rx: mpsc::UnboundedReceiver<Control>,
) {
    let mut stdin = match proc.stdio.stdin.is_empty() {
        true => None,
        false => open_stdin(&proc.stdio.stdin),
    };
    let mut buf = vec![0u8; STDIN_CHUNK];
    if (stdin.is_none() || proc.stdin_close_requested())
        && !close_stdin(&mut input, &mut stdin, &mut buf).await
    {
        return;
    }
    loop {
        let n = tokio::select! {
            c = rx.recv() => {
                let ok = match c {
                    Some(Control::CloseStdin) => close_stdin(&mut input, &mut stdin, &mut buf).await,
                    Some(c) => control(&mut input, c).await,
                    None => false,
                };
                if !ok { return }
                continue;
            }
            r = async { stdin.as_mut().unwrap().read(&mut buf).await }, if stdin.is_some() => {
                r.unwrap_or(0)
            }
        };
        if n == 0 {
            if !close_stdin(&mut input, &mut stdin, &mut buf).await {
                return;
            }
            continue;
        }
        // Wait for the agent's credit without holding up control messages; a close that
        // arrives meanwhile is applied after this chunk.
        let mut close_after = false;
        loop {
            tokio::select! {
                w = input.writable(n) => { if w.is_err() { return } break }
                c = rx.recv() => match c {
                    Some(Control::CloseStdin) => close_after = true,
                    Some(c) => if !control(&mut input, c).await { return },
                    None => return,
                },
            }
        }
        if input.write(&buf[..n]).await.is_err() {
            return;
        }
        if close_after && !close_stdin(&mut input, &mut stdin, &mut buf).await {
            return;
        }
    }
}

async fn output_task(
    proc: Arc<Process>,
    mut output: InteractiveOutput,
    mut out: Option<pipe::Sender>,
    mut err: Option<pipe::Sender>,
) {
    let code = loop {
        match output.next().await {
            Ok(Some(ExecEvent::Stdout(d))) => write_or_drop(&mut out, &d).await,
            Ok(Some(ExecEvent::Stderr(d))) => match err.is_some() {
                true => write_or_drop(&mut err, &d).await,
                false => write_or_drop(&mut out, &d).await,
            },
            Ok(Some(ExecEvent::Exit(s))) => break exit_code(&s),
            Ok(None) => break KILLED,
            Err(e) => {
                tracing::warn!(exec_id = %proc.exec_id, error = %e, "process lost");
                break KILLED;
            }
        }
    };
    if let Some(o) = out.as_mut() {
        let _ = o.flush().await;
    }
    proc.set_exited(code);
}

/// Writes `d`; a FIFO whose reader is gone is dropped (the output is discarded from then on).
async fn write_or_drop(w: &mut Option<pipe::Sender>, d: &[u8]) {
    if let Some(p) = w.as_mut()
        && p.write_all(d).await.is_err()
    {
        *w = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Option<i32>, signal: Option<i32>) -> ExitStatus {
        ExitStatus {
            code,
            signal,
            timed_out: false,
        }
    }

    #[test]
    fn exit_codes_as_containerd_reports_them() {
        assert_eq!(exit_code(&status(Some(3), None)), 3);
        assert_eq!(exit_code(&status(None, Some(libc::SIGTERM))), 143);
        assert_eq!(exit_code(&status(None, None)), KILLED);
        // Whatever a hostile guest reports maps to a code, without a panic.
        assert_eq!(exit_code(&status(None, Some(-1))), u32::MAX);
        assert_eq!(exit_code(&status(Some(-1), None)), u32::MAX);
    }
}

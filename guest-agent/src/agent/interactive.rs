//! Interactive exec: one command with stdin streamed from the host, on pipes or on a
//! pseudo-terminal ([`super::pty`]).
//!
//! # Frames
//! `ExecInteractive` -> `Started`, then the agent sends `Stdout`/`Stderr` (a terminal's output
//! is all `Stdout`), `StdinAck` and finally `Exit`; the host sends `Data` (stdin), `DataEnd`
//! (stdin EOF), `Resize` (terminal size) and `Cancel`.
//!
//! # Back-pressure without blocking the control path
//! The host may have at most [`STDIN_WINDOW`] stdin bytes unacknowledged. The agent queues
//! what it receives (never more than the window: a host that sends more is refused) and
//! writes the queue to the command as fast as the command reads; every quarter window
//! written it sends `StdinAck`. So a 10 GiB stdin costs at most the window in agent memory
//! and the host's own stdin is read only as fast as the guest command consumes it, while the
//! agent keeps reading frames: a `Cancel` or `Resize` is seen at once, whatever the command
//! does with its stdin.
//!
//! Output frames are written without a timeout (a host that reads slowly blocks the command
//! on its full pipe or terminal; nothing is lost), raced against the host's frames so a
//! dead connection still ends the session.
//!
//! # End
//! `DataEnd` closes the command's stdin once the queue is written (a half-close: output
//! continues); on a terminal it writes the EOF character (`^D`) instead. The command's exit,
//! its timeout, a `Cancel` or a closed connection kill the whole tree, as for Exec; the
//! output left in the pipes or terminal is then drained and `Exit` sent.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::unix::pipe;

use super::conn::{send, send_error};
use super::container;
use super::process::{self, OutputMode, Proc, SpawnSpec};
use super::pty::Pty;
use super::{Agent, Stream};
use vm_agent_protocol::container::Confine;
use vm_agent_protocol::frame::{FrameError, FrameReader, encode_frame};
use vm_agent_protocol::protocol::{
    AgentFrame, ClientFrame, ErrorKind, ExitStatus, InteractiveRequest, MAX_FRAME, MAX_SIGNAL,
    STDIN_WINDOW,
};
use vm_error_chain::error_chain;

const READ_BUF: usize = 64 * 1024;
const DRAIN_IDLE: Duration = Duration::from_secs(2);
/// The longest a drain lasts, however busy a writer left behind keeps its output.
const DRAIN_MAX: Duration = Duration::from_secs(10);
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// The terminal's end-of-file character (`VEOF`, `^D`), written on `DataEnd` with a pty.
const VEOF: u8 = 0x04;

/// Where queued stdin goes.
enum Sink {
    Pipe(pipe::Sender),
    Pty,
    Closed,
}

/// The command's stdin: the queue of received bytes and the acknowledgement count.
struct Input {
    sink: Sink,
    queue: VecDeque<Vec<u8>>,
    /// Bytes of the queue's front already written.
    pos: usize,
    /// Bytes received and not yet written (or discarded).
    queued: usize,
    /// Bytes written (or discarded) and not yet acknowledged.
    unacked: usize,
    /// `DataEnd` arrived: close once the queue is written.
    eof: bool,
}

impl Input {
    fn new(sink: Sink) -> Input {
        Input {
            sink,
            queue: VecDeque::new(),
            pos: 0,
            queued: 0,
            unacked: 0,
            eof: false,
        }
    }

    /// Queue stdin from the host; `Err` names how the host broke the protocol.
    fn push(&mut self, d: Vec<u8>) -> Result<(), &'static str> {
        if self.eof {
            return Err("stdin data after its end");
        }
        if self.queued + self.unacked + d.len() > STDIN_WINDOW as usize {
            return Err("stdin beyond the acknowledged window");
        }
        if matches!(self.sink, Sink::Closed) {
            // The command closed its stdin: discard, but keep the host's window open.
            self.unacked += d.len();
        } else if !d.is_empty() {
            self.queued += d.len();
            self.queue.push_back(d);
        }
        Ok(())
    }

    /// The host's stdin ended.
    fn end(&mut self) {
        if self.eof {
            return;
        }
        self.eof = true;
        if matches!(self.sink, Sink::Pty) {
            self.queued += 1;
            self.queue.push_back(vec![VEOF]);
        }
        self.close_if_done();
    }

    fn close_if_done(&mut self) {
        if self.eof && self.queue.is_empty() && matches!(self.sink, Sink::Pipe(_)) {
            self.sink = Sink::Closed; // dropping the pipe's write end: the command reads EOF
        }
    }

    fn ready(&self) -> bool {
        !self.queue.is_empty() && !matches!(self.sink, Sink::Closed)
    }

    /// Write (part of) the queue's front; cancel-safe (a dropped call wrote nothing).
    async fn write(&self, pty: Option<&Pty>) -> std::io::Result<usize> {
        let Some(front) = self.queue.front() else {
            return std::future::pending().await;
        };
        let buf = &front[self.pos..];
        match (&self.sink, pty) {
            (Sink::Pipe(p), _) => loop {
                p.writable().await?;
                match p.try_write(buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    r => return r,
                }
            },
            (Sink::Pty, Some(pty)) => pty.write(buf).await,
            _ => std::future::pending().await,
        }
    }

    /// Account for a [`Input::write`]; a failed write (the command closed its stdin) discards
    /// the queue and everything after it.
    fn wrote(&mut self, r: std::io::Result<usize>) {
        match r {
            Ok(n) => {
                self.pos += n;
                self.queued -= n;
                self.unacked += n;
                if self.queue.front().is_some_and(|f| self.pos >= f.len()) {
                    self.queue.pop_front();
                    self.pos = 0;
                }
                self.close_if_done();
            }
            Err(_) => {
                self.sink = Sink::Closed;
                self.unacked += self.queued;
                self.queued = 0;
                self.queue.clear();
                self.pos = 0;
            }
        }
    }

    /// An acknowledgement to send, once a quarter window has been consumed.
    fn take_ack(&mut self) -> Option<u32> {
        if self.unacked >= STDIN_WINDOW as usize / 4 {
            return Some(std::mem::take(&mut self.unacked) as u32);
        }
        None
    }
}

/// What a frame from the host means for the session.
enum Step {
    Continue,
    Cancel,
    /// Deliver a signal to the command (or its group).
    Signal(i32, bool),
    /// The connection is dead or the host broke the protocol.
    Gone(FrameError),
}

fn on_frame(f: Result<ClientFrame, FrameError>, input: &mut Input, pty: Option<&Pty>) -> Step {
    let bad = |m: &str| Step::Gone(FrameError::Io(std::io::Error::other(m.to_string())));
    match f {
        Ok(ClientFrame::Data(d)) => match input.push(d) {
            Ok(()) => Step::Continue,
            Err(m) => bad(m),
        },
        Ok(ClientFrame::DataEnd) => {
            input.end();
            Step::Continue
        }
        Ok(ClientFrame::Resize(size)) => {
            if let Some(pty) = pty
                && let Err(e) = pty.resize(size)
            {
                tracing::debug!(error = %e, "resize failed");
            }
            Step::Continue
        }
        Ok(ClientFrame::Cancel) => Step::Cancel,
        Ok(ClientFrame::Signal { signal, all }) if (1..=MAX_SIGNAL).contains(&signal) => {
            Step::Signal(signal, all)
        }
        Ok(ClientFrame::Signal { .. }) => bad("signal number out of range"),
        Ok(_) => bad("unexpected frame during an interactive exec"),
        Err(e) => Step::Gone(e),
    }
}

/// How the command's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
}

/// One interactive session on one connection.
struct Session<'a, S: Stream> {
    rd: ReadHalf<S>,
    wr: WriteHalf<S>,
    frames: FrameReader,
    input: Input,
    pty: Option<&'a Pty>,
    io_timeout: Duration,
    /// A `Cancel` arrived while a frame was being written.
    cancelled: bool,
    /// Signals that arrived while a frame was being written (at most [`MAX_PENDING_SIGNALS`];
    /// more are dropped), delivered by the session loop.
    pending_signals: Vec<(i32, bool)>,
    /// A container's exec: what its command leaves running when it exits by itself stays in
    /// the container (as with runc), ending with the container, not with this exec.
    keep_leftovers: bool,
    /// Set when the command exited by itself and, as `keep_leftovers` asks, what it left
    /// running was not killed.
    left_running: bool,
}

/// Bound on signals queued while a frame is written.
const MAX_PENDING_SIGNALS: usize = 16;

impl<S: Stream> Session<'_, S> {
    /// Write a frame without a timeout, reading the host's frames meanwhile (stdin keeps
    /// being queued; a dead connection ends the wait). A `Cancel` lets the frame finish.
    async fn send(&mut self, f: &AgentFrame) -> Result<(), FrameError> {
        let buf = encode_frame(f, MAX_FRAME)?;
        let wr = &mut self.wr;
        let write = async {
            wr.write_all(&buf).await?;
            wr.flush().await
        };
        tokio::pin!(write);
        loop {
            tokio::select! {
                r = &mut write => return r.map_err(FrameError::Io),
                f = self.frames.read(&mut self.rd, None, self.io_timeout), if !self.cancelled => {
                    match on_frame(f, &mut self.input, self.pty) {
                        Step::Continue => {}
                        Step::Cancel => self.cancelled = true,
                        Step::Signal(sig, all) => {
                            if self.pending_signals.len() < MAX_PENDING_SIGNALS {
                                self.pending_signals.push((sig, all));
                            }
                        }
                        Step::Gone(e) => return Err(e),
                    }
                }
            }
        }
    }

    async fn ack(&mut self) -> Result<(), FrameError> {
        match self.input.take_ack() {
            Some(n) => self.send(&AgentFrame::StdinAck(n)).await,
            None => Ok(()),
        }
    }
}

/// Stdout: the terminal when there is one, else the stdout pipe.
async fn read_out(
    out: &mut Option<pipe::Receiver>,
    pty: Option<&Pty>,
    open: bool,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match (open, pty, out) {
        (true, Some(pty), _) => pty.read(buf).await,
        (true, None, Some(p)) => p.read(buf).await,
        _ => std::future::pending().await,
    }
}

async fn read_err(err: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> std::io::Result<usize> {
    match err {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Handle one `ExecInteractive` (`root`: an `ExecInteractiveIn`'s root; `confine`: an
/// `ExecContainer`'s confinement); `conn` is positioned right after the request frame.
pub(super) async fn run<S: Stream>(
    agent: &Agent,
    conn: S,
    req: InteractiveRequest,
    root: Option<&str>,
    confine: Option<&Confine>,
) -> Result<(), FrameError> {
    let t = agent.io_timeout();
    let (rd, mut wr) = tokio::io::split(conn);
    if !req.exec.stdin.is_empty() {
        let msg = "interactive exec: stdin comes as Data frames, not inline";
        return send_error(&mut wr, ErrorKind::BadRequest, msg, t).await;
    }
    let mut pty = match req.tty.map(Pty::open).transpose() {
        Ok(p) => p,
        Err(e) => {
            let msg = format!("cannot open a pseudo-terminal: {e}");
            return send_error(&mut wr, ErrorKind::Io, &msg, t).await;
        }
    };
    // A pod member's user is looked up in its own root's /etc.
    let looked_up = match root {
        None => super::user::resolve_opt(req.exec.user.as_deref()),
        Some(r) => {
            let etc = Path::new(r).join("etc");
            (req.exec.user.as_deref())
                .map(|u| super::user::resolve(u, &etc))
                .transpose()
        }
    };
    let ids = match looked_up {
        Ok(ids) => ids,
        Err(e) => return send_error(&mut wr, ErrorKind::BadRequest, &e.to_string(), t).await,
    };
    let prepared = match confine.map(|c| container::prepare(agent, root, c, ids.as_ref())) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => return send_error(&mut wr, e.kind(), &error_chain(&e), t).await,
    };
    let name = format!("exec-{}", agent.next_id());
    let group = root.and_then(|r| agent.pod_group(r));
    let spawned = {
        let spec = SpawnSpec {
            command: &req.exec.command,
            env: &req.exec.env,
            cwd: req.exec.cwd.as_deref(),
            default_cwd: agent.root_path(),
            with_stdin: true,
            output: match pty.as_ref().and_then(Pty::slave) {
                Some(slave) => OutputMode::Terminal(slave),
                None => OutputMode::Separate,
            },
            name: &name,
            user: ids.as_ref(),
            root: root.map(Path::new),
            group: group.as_deref(),
            confine: prepared.as_ref(),
        };
        process::spawn(agent.reaper(), agent.cgroups(), &spec)
    };
    let mut p = match spawned {
        Ok(p) => p,
        Err(e) => return send_error(&mut wr, e.kind(), &error_chain(&e), t).await,
    };
    if let Some(pty) = pty.as_mut() {
        pty.close_slave();
    }
    tracing::debug!(
        pid = p.pid,
        name,
        tty = pty.is_some(),
        "interactive exec started"
    );
    let sink = match (&pty, p.stdin.take()) {
        (Some(_), _) => Sink::Pty,
        (None, Some(s)) => Sink::Pipe(s),
        (None, None) => Sink::Closed,
    };
    let mut s = Session {
        rd,
        wr,
        frames: FrameReader::new(MAX_FRAME),
        input: Input::new(sink),
        pty: pty.as_ref(),
        io_timeout: t,
        cancelled: false,
        pending_signals: Vec::new(),
        keep_leftovers: confine.is_some(),
        left_running: false,
    };
    let result = session(&mut s, &mut p, req.exec.timeout).await;
    let leftovers = s.left_running;
    if !leftovers {
        // The session killed the tree before draining its output, unless the connection
        // died first: then only this kill ends it (a second one finds nothing).
        p.kill_tree();
    }
    if let Some(cg) = p.cgroup.take() {
        if leftovers {
            // Its leaf goes now if nothing was left in it, else with the container's group
            // (`PodMount::Unmount`) or the VM.
            cg.remove_if_empty();
        } else {
            drop(tokio::spawn(cg.remove()));
        }
    }
    result
}

/// Run the session to its `Exit` frame (or to a dead connection).
async fn session<S: Stream>(
    s: &mut Session<'_, S>,
    p: &mut Proc,
    timeout: Option<Duration>,
) -> Result<(), FrameError> {
    let t = s.io_timeout;
    send(&mut s.wr, &AgentFrame::Started, t).await?;
    let (mut out, mut err) = (p.out.take(), p.err.take());
    let mut out_open = s.pty.is_some() || out.is_some();
    let (mut bo, mut be) = (vec![0u8; READ_BUF], vec![0u8; READ_BUF]);
    let sleep = async {
        match timeout {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    let end = loop {
        if s.cancelled {
            break End::Cancelled;
        }
        for (sig, all) in s.pending_signals.drain(..) {
            p.signal(sig, all);
        }
        tokio::select! {
            f = s.frames.read(&mut s.rd, None, t) => match on_frame(f, &mut s.input, s.pty) {
                Step::Continue => s.ack().await?,
                Step::Signal(sig, all) => p.signal(sig, all),
                Step::Cancel => break End::Cancelled,
                Step::Gone(e) => return Err(e),
            },
            r = s.input.write(s.pty), if s.input.ready() => {
                s.input.wrote(r);
                s.ack().await?;
            }
            _ = &mut sleep => break End::TimedOut,
            st = &mut p.exit => break End::Exited(st.unwrap_or_default()),
            r = read_out(&mut out, s.pty, out_open, &mut bo) => match r {
                Ok(n) if n > 0 => s.send(&AgentFrame::Stdout(bo[..n].to_vec())).await?,
                _ => out_open = false,
            },
            r = read_err(&mut err, &mut be) => match r {
                Ok(n) if n > 0 => s.send(&AgentFrame::Stderr(be[..n].to_vec())).await?,
                _ => err = None,
            },
        }
    };
    // A container's exec that ended by itself leaves what it started running, as `runc exec`
    // does (`kubectl exec -- sh -c 'daemon &'`); any other end (a cancel, a timeout) ends the
    // whole tree.
    s.left_running = s.keep_leftovers && matches!(end, End::Exited(_));
    if !s.left_running {
        p.kill_tree();
    }
    let mut status = match end {
        End::Exited(st) => st,
        _ => match tokio::time::timeout(EXIT_WAIT, &mut p.exit).await {
            Ok(Ok(st)) => st,
            _ => ExitStatus {
                code: None,
                signal: Some(libc::SIGKILL),
                timed_out: false,
            },
        },
    };
    status.timed_out = end == End::TimedOut;
    if end == End::Cancelled {
        // The host asked for the end and is reading: only the status, bounded.
        return send(&mut s.wr, &AgentFrame::Exit(status), t).await;
    }
    // Drain what the tree left behind; a source silent for DRAIN_IDLE (a writer that
    // escaped the kill, or a container's process left running) ends the drain, and so does
    // DRAIN_MAX, however busy such a writer is.
    let drain_end = tokio::time::Instant::now() + DRAIN_MAX;
    while out_open || err.is_some() {
        let idle = DRAIN_IDLE.min(drain_end.saturating_duration_since(tokio::time::Instant::now()));
        let read = tokio::time::timeout(idle, async {
            tokio::select! {
                r = read_out(&mut out, s.pty, out_open, &mut bo) => (r, false),
                r = read_err(&mut err, &mut be) => (r, true),
            }
        })
        .await;
        let Ok((r, is_err)) = read else { break };
        match (r, is_err) {
            (Ok(n), false) if n > 0 => s.send(&AgentFrame::Stdout(bo[..n].to_vec())).await?,
            (Ok(n), true) if n > 0 => s.send(&AgentFrame::Stderr(be[..n].to_vec())).await?,
            (_, false) => out_open = false,
            (_, true) => err = None,
        }
    }
    s.send(&AgentFrame::Exit(status)).await
}

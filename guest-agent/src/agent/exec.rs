//! Exec: run one command to completion over one connection.
//!
//! Combined form: one pipe for stdout+stderr, forwarded as `Data` frames up to the request's
//! cap (the rest is drained and dropped), then `ExecDone`. Streaming form: separate pipes as
//! `Stdout`/`Stderr` frames, then `Exit`.
//!
//! Back-pressure, not timeouts: the pipes are read only as fast as frames can be written, and
//! writes to the host have no timeout, so a host that reads slowly (a pager, `| (sleep 60; wc)`)
//! makes the command block on its full pipe and loses nothing. Only a dead host connection
//! (EOF or error on its read side, which every write races), a `Cancel` frame, or the command's
//! own timeout ends it early; each kills the whole tree. When the main process exits, anything
//! it left behind in its group/cgroup is killed too, and the pipes are drained to EOF (a pipe
//! silent for 2 s ends the drain). Memory stays bounded: one 64 KiB buffer per pipe.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::net::unix::pipe;

use super::conn::{send, send_error};
use super::process::{self, OutputMode, SpawnSpec};
use super::{Agent, Stream};
use vm_agent_protocol::frame::{FrameError, read_frame};
use vm_agent_protocol::protocol::{
    AgentFrame, ClientFrame, DEFAULT_EXEC_OUTPUT, ErrorKind, ExecRequest, ExitStatus,
    MAX_EXEC_OUTPUT, MAX_FRAME, MAX_STDIN_BYTES,
};
use vm_error_chain::error_chain;

const READ_BUF: usize = 64 * 1024;
const DRAIN_IDLE: Duration = Duration::from_secs(2);
const EXIT_WAIT: Duration = Duration::from_secs(10);

async fn read_opt(p: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> std::io::Result<usize> {
    match p {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

struct Sink<'a, S: Stream> {
    wr: &'a mut WriteHalf<S>,
    streaming: bool,
    cap: u64,
    sent: u64,
    truncated: bool,
}

impl<S: Stream> Sink<'_, S> {
    /// Forward one chunk, without a timeout (the caller races it against the client's
    /// connection); `Err` means the client is gone.
    async fn chunk(&mut self, data: &[u8], is_err: bool) -> Result<(), FrameError> {
        if self.streaming {
            let f = if is_err {
                AgentFrame::Stderr(data.to_vec())
            } else {
                AgentFrame::Stdout(data.to_vec())
            };
            return send_untimed(self.wr, &f).await;
        }
        let room = self.cap.saturating_sub(self.sent) as usize;
        if data.len() > room {
            self.truncated = true;
        }
        let n = data.len().min(room);
        if n > 0 {
            self.sent += n as u64;
            send_untimed(self.wr, &AgentFrame::Data(data[..n].to_vec())).await?;
        }
        Ok(())
    }
}

/// The command's output pipes and their read buffers.
struct Pipes {
    out: Option<pipe::Receiver>,
    err: Option<pipe::Receiver>,
    bo: Vec<u8>,
    be: Vec<u8>,
}

/// What one read of the pipes got.
enum Chunk {
    Out(usize),
    Err(usize),
    /// A pipe reached EOF or failed; it is closed now.
    Closed,
}

impl Pipes {
    fn take(p: &mut process::Proc) -> Pipes {
        Pipes {
            out: p.out.take(),
            err: p.err.take(),
            bo: vec![0u8; READ_BUF],
            be: vec![0u8; READ_BUF],
        }
    }

    fn open(&self) -> bool {
        self.out.is_some() || self.err.is_some()
    }

    /// The next chunk from either pipe. Cancel-safe (a pipe read), so it can race the exit,
    /// the timeout and the host's cancel; forwarding happens outside the race.
    async fn read(&mut self) -> Chunk {
        tokio::select! {
            r = read_opt(&mut self.out, &mut self.bo) => match r {
                Ok(n) if n > 0 => Chunk::Out(n),
                _ => { self.out = None; Chunk::Closed }
            },
            r = read_opt(&mut self.err, &mut self.be) => match r {
                Ok(n) if n > 0 => Chunk::Err(n),
                _ => { self.err = None; Chunk::Closed }
            },
        }
    }

    /// Forwards a chunk read by [`Pipes::read`]; `Err` means the host is gone.
    async fn forward<S: Stream>(&self, c: Chunk, sink: &mut Sink<'_, S>) -> Result<(), FrameError> {
        match c {
            Chunk::Out(n) => sink.chunk(&self.bo[..n], false).await,
            Chunk::Err(n) => sink.chunk(&self.be[..n], true).await,
            Chunk::Closed => Ok(()),
        }
    }

    /// After the process ended: forwards what is left in the pipes to EOF, however slowly
    /// the host reads; a pipe silent for [`DRAIN_IDLE`] (a writer that escaped the kill) or
    /// a dead host connection (`cancel`) ends it. Returns true when the host went away.
    async fn drain<S: Stream>(
        &mut self,
        sink: &mut Sink<'_, S>,
        mut cancel: Pin<&mut impl Future>,
    ) -> bool {
        while self.open() {
            let Ok(c) = tokio::time::timeout(DRAIN_IDLE, self.read()).await else {
                return false;
            };
            tokio::select! {
                r = self.forward(c, sink) => if r.is_err() { return true; },
                _ = &mut cancel => return true,
            }
        }
        false
    }
}

/// How the wait for the command ended.
struct Outcome {
    /// The exit status, when the process exited by itself.
    status: Option<ExitStatus>,
    timed_out: bool,
    /// The host cancelled, went away or sent garbage.
    cancelled: bool,
}

/// Forwards output until the process exits, the timeout fires or the host cancels (any
/// frame, EOF or garbage from the host while the command runs means cancel: `cancel`). A
/// write blocks as long as the host does not read (the command then blocks on its full
/// pipe); it races only `cancel` and the deadline, which kills the tree while the frame in
/// flight is finished, so the stream stays well-formed.
async fn wait<S: Stream>(
    p: &mut process::Proc,
    pipes: &mut Pipes,
    sink: &mut Sink<'_, S>,
    mut cancel: Pin<&mut impl Future>,
    timeout: Option<Duration>,
) -> Outcome {
    let mut o = Outcome {
        status: None,
        timed_out: false,
        cancelled: false,
    };
    let sleep = async {
        match timeout {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    loop {
        let c = tokio::select! {
            _ = &mut cancel => { o.cancelled = true; break; }
            _ = &mut sleep, if !o.timed_out => { o.timed_out = true; break; }
            st = &mut p.exit => { o.status = Some(st.unwrap_or_default()); break; }
            c = pipes.read() => c,
        };
        let write = pipes.forward(c, sink);
        tokio::pin!(write);
        loop {
            tokio::select! {
                r = &mut write => { o.cancelled = r.is_err(); break; }
                _ = &mut cancel => { o.cancelled = true; break; }
                _ = &mut sleep, if !o.timed_out => { o.timed_out = true; p.kill_tree(); }
            }
        }
        if o.cancelled {
            break;
        }
    }
    o
}

/// Kills what is left of the tree and returns the final status: the process's own, else
/// the one the kill produced (bounded wait), else SIGKILL.
async fn reap(p: &mut process::Proc, o: &Outcome) -> ExitStatus {
    p.kill_tree();
    let mut status = match o.status {
        Some(s) => s,
        None => match tokio::time::timeout(EXIT_WAIT, &mut p.exit).await {
            Ok(Ok(s)) => s,
            _ => ExitStatus {
                code: None,
                signal: Some(libc::SIGKILL),
                timed_out: false,
            },
        },
    };
    status.timed_out = o.timed_out;
    status
}

/// Spawns the request's command: separate pipes when streaming, one combined pipe else.
fn spawn(
    agent: &Agent,
    req: &ExecRequest,
    streaming: bool,
    name: &str,
    user: Option<&super::user::Ids>,
) -> Result<process::Proc, process::ProcessError> {
    let spec = SpawnSpec {
        command: &req.command,
        env: &req.env,
        cwd: req.cwd.as_deref(),
        default_cwd: agent.root_path(),
        with_stdin: !req.stdin.is_empty(),
        output: if streaming {
            OutputMode::Separate
        } else {
            OutputMode::Combined
        },
        name,
        user,
        root: None,
        group: None,
        confine: None,
    };
    process::spawn(agent.reaper(), agent.cgroups(), &spec)
}

/// Handle one `Exec`/`ExecStream` request; `conn` is positioned right after the request frame.
pub(super) async fn run<S: Stream>(
    agent: &Agent,
    conn: S,
    req: ExecRequest,
    streaming: bool,
) -> Result<(), FrameError> {
    let t = agent.io_timeout();
    let (mut rd, mut wr) = tokio::io::split(conn);
    if req.stdin.len() > MAX_STDIN_BYTES {
        return send_error(
            &mut wr,
            ErrorKind::TooLarge,
            "stdin exceeds the inline limit",
            t,
        )
        .await;
    }
    let ids = match super::user::resolve_opt(req.user.as_deref()) {
        Ok(ids) => ids,
        Err(e) => return send_error(&mut wr, ErrorKind::BadRequest, &e.to_string(), t).await,
    };
    let name = format!("exec-{}", agent.next_id());
    let mut p = match spawn(agent, &req, streaming, &name, ids.as_ref()) {
        Ok(p) => p,
        Err(e) => return send_error(&mut wr, e.kind(), &error_chain(&e), t).await,
    };
    tracing::debug!(pid = p.pid, name, "exec started");
    if let Some(mut s) = p.stdin.take() {
        let data = req.stdin;
        tokio::spawn(async move {
            let _ = s.write_all(&data).await;
        });
    }
    let cap = if streaming {
        u64::MAX
    } else {
        req.max_output
            .unwrap_or(DEFAULT_EXEC_OUTPUT)
            .min(MAX_EXEC_OUTPUT)
    };
    let mut sink = Sink {
        wr: &mut wr,
        streaming,
        cap,
        sent: 0,
        truncated: false,
    };
    let mut pipes = Pipes::take(&mut p);
    let cancel = read_frame::<_, ClientFrame>(&mut rd, MAX_FRAME, None, t);
    tokio::pin!(cancel);
    let outcome = wait(&mut p, &mut pipes, &mut sink, cancel.as_mut(), req.timeout).await;
    let status = reap(&mut p, &outcome).await;
    let cancelled = outcome.cancelled || pipes.drain(&mut sink, cancel.as_mut()).await;
    let truncated = sink.truncated;
    if let Some(cg) = p.cgroup.take() {
        tokio::spawn(cg.remove());
    }
    tracing::debug!(name, ?status, cancelled, "exec finished");
    let last = if streaming {
        AgentFrame::Exit(status)
    } else {
        AgentFrame::ExecDone { status, truncated }
    };
    if cancelled {
        // A client that sent Cancel is reading; one that went away is not: bounded.
        return send(&mut wr, &last, t).await;
    }
    tokio::select! {
        r = send_untimed(&mut wr, &last) => r,
        _ = &mut cancel => Err(FrameError::Io(std::io::ErrorKind::ConnectionAborted.into())),
    }
}

/// Write a frame with no timeout: the caller races it against the client's connection.
async fn send_untimed<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    f: &AgentFrame,
) -> Result<(), FrameError> {
    let buf = vm_agent_protocol::frame::encode_frame(f, MAX_FRAME)?;
    w.write_all(&buf).await.map_err(FrameError::Io)?;
    w.flush().await.map_err(FrameError::Io)
}

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

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::net::unix::pipe;

use super::conn::{send, send_error};
use super::process::{self, OutputMode, SpawnSpec};
use super::{Agent, Stream};
use crate::frame::{FrameError, read_frame};
use crate::protocol::{
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

/// The byte count of a pipe read, or `None` after forgetting the pipe that ended or failed.
fn bytes_or_close(r: std::io::Result<usize>, pipe: &mut Option<pipe::Receiver>) -> Option<usize> {
    match r {
        Ok(n) if n > 0 => Some(n),
        _ => {
            *pipe = None;
            None
        }
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
    let name = format!("exec-{}", agent.next_id());
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
        name: &name,
    };
    let mut p = match process::spawn(agent.reaper(), agent.cgroups(), &spec) {
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
    let (mut out, mut err) = (p.out.take(), p.err.take());
    let (mut bo, mut be) = (vec![0u8; READ_BUF], vec![0u8; READ_BUF]);
    let mut status: Option<ExitStatus> = None;
    let (mut timed_out, mut cancelled) = (false, false);
    // Any frame, EOF or garbage from the client while the command runs means cancel; it is
    // also how a dead host connection shows, so it bounds every write below instead of a
    // write timeout (a slow host consumer is back-pressure, never failure).
    let cancel = read_frame::<_, ClientFrame>(&mut rd, MAX_FRAME, None, t);
    tokio::pin!(cancel);
    let sleep = async {
        match req.timeout {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    loop {
        let (r, is_err) = tokio::select! {
            _ = &mut cancel => { cancelled = true; break; }
            _ = &mut sleep, if !timed_out => { timed_out = true; break; }
            st = &mut p.exit => { status = Some(st.unwrap_or_default()); break; }
            r = read_opt(&mut out, &mut bo) => (r, false),
            r = read_opt(&mut err, &mut be) => (r, true),
        };
        let Some(n) = bytes_or_close(r, if is_err { &mut err } else { &mut out }) else {
            continue;
        };
        let data = if is_err { &be[..n] } else { &bo[..n] };
        // The write blocks as long as the host does not read (the command then blocks on its
        // full pipe). The deadline still applies: it kills the tree, and the frame in flight
        // is finished first so the stream stays well-formed.
        let write = sink.chunk(data, is_err);
        tokio::pin!(write);
        loop {
            tokio::select! {
                r = &mut write => { cancelled = r.is_err(); break; }
                _ = &mut cancel => { cancelled = true; break; }
                _ = &mut sleep, if !timed_out => { timed_out = true; p.kill_tree(); }
            }
        }
        if cancelled {
            break;
        }
    }
    p.kill_tree();
    let mut status = match status {
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
    status.timed_out = timed_out;
    // Drain what the tree left in the pipes: every byte reaches the host however slowly it
    // reads; only a pipe that stays silent for DRAIN_IDLE (a writer that escaped the kill)
    // or a dead host connection ends the drain.
    while !cancelled && (out.is_some() || err.is_some()) {
        let read = tokio::time::timeout(DRAIN_IDLE, async {
            tokio::select! {
                r = read_opt(&mut out, &mut bo) => (r, false),
                r = read_opt(&mut err, &mut be) => (r, true),
            }
        })
        .await;
        let Ok((r, is_err)) = read else { break };
        let Some(n) = bytes_or_close(r, if is_err { &mut err } else { &mut out }) else {
            continue;
        };
        let data = if is_err { &be[..n] } else { &bo[..n] };
        tokio::select! {
            r = sink.chunk(data, is_err) => cancelled = r.is_err(),
            _ = &mut cancel => cancelled = true,
        }
    }
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
    let buf = crate::frame::encode_frame(f, MAX_FRAME)?;
    w.write_all(&buf).await.map_err(FrameError::Io)?;
    w.flush().await.map_err(FrameError::Io)
}

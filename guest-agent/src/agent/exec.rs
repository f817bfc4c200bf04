//! Exec: run one command to completion over one connection.
//!
//! Combined form: one pipe for stdout+stderr, forwarded as `Data` frames up to the request's
//! cap (the rest is drained and dropped), then `ExecDone`. Streaming form: separate pipes as
//! `Stdout`/`Stderr` frames (the pipes are read only as fast as frames can be written: natural
//! back-pressure), then `Exit`. Either way, a `Cancel` frame, a closed/garbled connection, or the
//! timeout kills the whole tree; when the main process exits, anything it left behind in its
//! group/cgroup is killed too. Pipes are then drained for a bounded time.

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
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
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
    io_timeout: Duration,
}

impl<S: Stream> Sink<'_, S> {
    /// Forward one chunk; `Err` means the client is gone.
    async fn chunk(&mut self, data: &[u8], is_err: bool) -> Result<(), FrameError> {
        if self.streaming {
            let f = if is_err {
                AgentFrame::Stderr(data.to_vec())
            } else {
                AgentFrame::Stdout(data.to_vec())
            };
            return send(self.wr, &f, self.io_timeout).await;
        }
        let room = self.cap.saturating_sub(self.sent) as usize;
        if data.len() > room {
            self.truncated = true;
        }
        let n = data.len().min(room);
        if n > 0 {
            self.sent += n as u64;
            send(
                self.wr,
                &AgentFrame::Data(data[..n].to_vec()),
                self.io_timeout,
            )
            .await?;
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
    let ids = match super::user::resolve_opt(req.user.as_deref()) {
        Ok(ids) => ids,
        Err(e) => return send_error(&mut wr, ErrorKind::BadRequest, &e.to_string(), t).await,
    };
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
        user: ids.as_ref(),
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
        io_timeout: t,
    };
    let (mut out, mut err) = (p.out.take(), p.err.take());
    let (mut bo, mut be) = (vec![0u8; READ_BUF], vec![0u8; READ_BUF]);
    let mut status: Option<ExitStatus> = None;
    let (mut timed_out, mut cancelled) = (false, false);
    {
        // Any frame, EOF or garbage from the client while the command runs means cancel.
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
            tokio::select! {
                _ = &mut cancel => { cancelled = true; break; }
                _ = &mut sleep => { timed_out = true; break; }
                st = &mut p.exit => { status = Some(st.unwrap_or_default()); break; }
                r = read_opt(&mut out, &mut bo) => match r {
                    Ok(n) if n > 0 => if sink.chunk(&bo[..n], false).await.is_err() { cancelled = true; break; },
                    _ => out = None,
                },
                r = read_opt(&mut err, &mut be) => match r {
                    Ok(n) if n > 0 => if sink.chunk(&be[..n], true).await.is_err() { cancelled = true; break; },
                    _ => err = None,
                },
            }
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
    if !cancelled {
        let _ = tokio::time::timeout(DRAIN_LIMIT, async {
            while out.is_some() || err.is_some() {
                tokio::select! {
                    r = read_opt(&mut out, &mut bo) => match r {
                        Ok(n) if n > 0 => if sink.chunk(&bo[..n], false).await.is_err() { break },
                        _ => out = None,
                    },
                    r = read_opt(&mut err, &mut be) => match r {
                        Ok(n) if n > 0 => if sink.chunk(&be[..n], true).await.is_err() { break },
                        _ => err = None,
                    },
                }
            }
        })
        .await;
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
    send(&mut wr, &last, t).await
}

//! One connection: handshake, one request, that request's stream.

use std::os::fd::AsFd;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::files::{self, FileError};
use super::slots::Admitted;
use super::{Agent, Stream, guard, transfer};
use vm_agent_protocol::PROTOCOL_VERSION;
use vm_agent_protocol::frame::{FrameError, read_frame, write_frame};
use vm_agent_protocol::protocol::{
    AgentFrame, ClientFrame, ErrorKind, MAX_FRAME, Request, WireError,
};

/// Join an error and its sources into one line.
pub(super) async fn send<W: AsyncWrite + Unpin>(
    w: &mut W,
    f: &AgentFrame,
    t: Duration,
) -> Result<(), FrameError> {
    write_frame(w, f, MAX_FRAME, t).await
}

pub(super) async fn send_error<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: ErrorKind,
    message: &str,
    t: Duration,
) -> Result<(), FrameError> {
    let message: String = message.chars().take(1024).collect();
    send(w, &AgentFrame::Error(WireError { kind, message }), t).await
}

pub(super) async fn recv<S: Stream>(s: &mut S, t: Duration) -> Result<ClientFrame, FrameError> {
    read_frame(s, MAX_FRAME, Some(t), t).await
}

/// Read the first frame, a small `Hello` within the agent's `auth_timeout`, and check its token
/// (constant-time). `Err` = close the connection without a reply; the reason is for the
/// rate-limited refusal log. A valid token with another protocol version gets a
/// `VersionMismatch` error (also an `Err`).
pub(super) async fn authenticate<S: Stream>(agent: &Agent, s: &mut S) -> Result<(), &'static str> {
    let t = agent.auth_timeout();
    let first = read_frame::<_, ClientFrame>(s, guard::MAX_HELLO_FRAME, Some(t), t).await;
    let (version, token) = match first {
        Ok(ClientFrame::Hello { version, token }) => (version, token),
        Ok(_) => return Err("first frame is not Hello"),
        Err(FrameError::Timeout) => return Err("no Hello before the deadline"),
        Err(_) => return Err("malformed or oversized Hello"),
    };
    if agent.token_matches(&token) == Some(false) {
        return Err("wrong token");
    }
    if version != PROTOCOL_VERSION {
        let msg = format!("client speaks protocol {version}, agent speaks {PROTOCOL_VERSION}");
        let _ = send_error(s, ErrorKind::VersionMismatch, &msg, agent.io_timeout()).await;
        return Err("protocol version mismatch");
    }
    Ok(())
}

/// Serve one authenticated connection to completion; its slots are taken once the request
/// says what it is for (see [`super::slots`]) and held until it ends.
pub(super) async fn handle<S: Stream>(
    agent: &Agent,
    mut s: S,
    admitted: Admitted,
) -> Result<(), FrameError> {
    let t = agent.io_timeout();
    let hello = AgentFrame::HelloOk {
        version: PROTOCOL_VERSION,
        info: agent.info(),
    };
    send(&mut s, &hello, t).await?;
    let req = match recv(&mut s, t).await {
        Ok(ClientFrame::Request(r)) => r,
        Ok(_) => return send_error(&mut s, ErrorKind::BadRequest, "expected a request", t).await,
        // A request this agent does not know (a newer client): say so rather than hang up.
        Err(FrameError::Decode(_)) => {
            let msg = format!(
                "request not supported by this agent (protocol {PROTOCOL_VERSION}, agent {}); rebuild the guest image",
                env!("CARGO_PKG_VERSION")
            );
            return send_error(&mut s, ErrorKind::Unsupported, &msg, t).await;
        }
        Err(e) => return Err(e),
    };
    let _held = match agent.slots().take(admitted, req.class()) {
        Ok(held) => held,
        Err(why) => return send_error(&mut s, ErrorKind::Busy, why, t).await,
    };
    match req {
        Request::Ping => send(&mut s, &AgentFrame::Pong, t).await,
        Request::Exec(r) => super::exec::run(agent, s, r, false).await,
        Request::ExecStream(r) => super::exec::run(agent, s, r, true).await,
        Request::ReadFile { root, path, max } => {
            transfer::read_file(agent, &mut s, &root, &path, max).await
        }
        Request::WriteFile { root, path, max } => {
            transfer::write_file(agent, &mut s, &root, &path, max).await
        }
        Request::List { root, path } => list(agent, &mut s, root, path).await,
        Request::ServeStart(r) => match agent.serves().start(agent, &r, agent.max_serves()) {
            Ok(id) => send(&mut s, &AgentFrame::ServeStarted(id), t).await,
            Err(e) => send_error(&mut s, e.kind(), &vm_error_chain::error_chain(&e), t).await,
        },
        Request::ServeStatus(id) => match agent.serves().status(id) {
            Ok(st) => send(&mut s, &AgentFrame::ServeState(st), t).await,
            Err(e) => send_error(&mut s, e.kind(), &vm_error_chain::error_chain(&e), t).await,
        },
        Request::ServeStop(id) => match agent.serves().stop(id).await {
            Ok(st) => send(&mut s, &AgentFrame::ServeState(st), t).await,
            Err(e) => send_error(&mut s, e.kind(), &vm_error_chain::error_chain(&e), t).await,
        },
        Request::Forward { port } => super::forward::run(agent, s, port).await,
        Request::ExecInteractive(r) => super::interactive::run(agent, s, r, None, None).await,
        Request::ExecInteractiveIn { root, request } => {
            super::interactive::run(agent, s, request, Some(&root), None).await
        }
        Request::ExecContainer(c) => {
            let c = *c;
            let root = c.root.as_deref();
            super::interactive::run(agent, s, c.request, root, Some(&c.confine)).await
        }
        Request::PodMount(m) => match super::podroot::apply(agent, &m).await {
            Ok(()) => send(&mut s, &AgentFrame::Ok, t).await,
            Err(e) => send_error(&mut s, e.kind(), &vm_error_chain::error_chain(&e), t).await,
        },
        Request::MakeDirs { path, owner } => {
            match files::make_dirs(agent.base_fd(), &path, owner.as_deref()) {
                Ok(()) => send(&mut s, &AgentFrame::Ok, t).await,
                Err(e) => file_error(&mut s, e, t).await,
            }
        }
        Request::MountTmpfs { path, size_bytes } => {
            match super::tmpfs::mount_tmpfs(agent, &path, size_bytes) {
                Ok(()) => send(&mut s, &AgentFrame::Ok, t).await,
                Err(e) => send_error(&mut s, e.kind(), &vm_error_chain::error_chain(&e), t).await,
            }
        }
        Request::SetMode { path, mode } => match files::set_mode(agent.base_fd(), &path, mode) {
            Ok(()) => send(&mut s, &AgentFrame::Ok, t).await,
            Err(e) => file_error(&mut s, e, t).await,
        },
        Request::Resume {
            token,
            unix_nanos,
            entropy,
            generation,
        } => {
            let r = super::resume::Resume {
                token,
                unix_nanos,
                entropy,
                generation,
            };
            match super::resume::resume(agent, r) {
                Ok(()) => send(&mut s, &AgentFrame::Ok, t).await,
                Err(e) => send_error(&mut s, e.kind(), &vm_error_chain::error_chain(&e), t).await,
            }
        }
        Request::Remove { root, path } => {
            let base = agent.base_fd();
            match files::open_root(base, &root).and_then(|r| files::remove(r.as_fd(), &path)) {
                Ok(()) => send(&mut s, &AgentFrame::Ok, t).await,
                Err(e) => file_error(&mut s, e, t).await,
            }
        }
        Request::ListeningPorts => match super::listening::read() {
            Ok(ports) => send(&mut s, &AgentFrame::Ports(ports), t).await,
            Err(e) => send_error(&mut s, ErrorKind::Io, &format!("/proc/net/tcp: {e}"), t).await,
        },
        Request::Shutdown => {
            let r = send(&mut s, &AgentFrame::Ok, t).await;
            let _ = s.shutdown().await;
            agent.request_shutdown();
            r
        }
    }
}

pub(super) async fn file_error<W: AsyncWrite + Unpin>(
    s: &mut W,
    e: FileError,
    t: Duration,
) -> Result<(), FrameError> {
    send_error(s, e.kind(), &vm_error_chain::error_chain(&e), t).await
}

/// Batches are flushed at this many path bytes, well under the frame limit.
const LIST_BATCH_BYTES: usize = 256 * 1024;

async fn list<S: Stream>(
    agent: &Agent,
    s: &mut S,
    root: String,
    path: String,
) -> Result<(), FrameError> {
    let t = agent.io_timeout();
    let base = match agent.base_fd().try_clone_to_owned() {
        Ok(b) => b,
        Err(e) => return send_error(s, ErrorKind::Io, &e.to_string(), t).await,
    };
    let walked = tokio::task::spawn_blocking(move || {
        files::open_root(base.as_fd(), &root).and_then(|r| files::list(r.as_fd(), &path))
    })
    .await;
    let entries = match walked {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => return file_error(s, e, t).await,
        Err(_) => return send_error(s, ErrorKind::Io, "list task failed", t).await,
    };
    let mut batch = Vec::new();
    let mut bytes = 0;
    for e in entries {
        bytes += e.path.len() + 16;
        batch.push(e);
        if bytes >= LIST_BATCH_BYTES {
            send(s, &AgentFrame::ListBatch(std::mem::take(&mut batch)), t).await?;
            bytes = 0;
        }
    }
    if !batch.is_empty() {
        send(s, &AgentFrame::ListBatch(batch), t).await?;
    }
    send(s, &AgentFrame::ListEnd, t).await
}

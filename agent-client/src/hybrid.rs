//! The hybrid-vsock side of a connection: connecting to a VM's socket (a full listen backlog
//! retried), the `CONNECT <port>\n` → `OK <n>\n` exchange (with the first bytes sent behind
//! the line, written in the same breath as the connect), and what a failed exchange means.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::ClientError;

/// What a failed `CONNECT` exchange means, for [`ClientError::VsockHandshake`].
pub(super) fn describe_handshake(port: u32, reply: &str) -> String {
    if reply.is_empty() {
        return format!(
            "the VM's vsock device closed the connection without answering CONNECT {port} (the \
             guest refused or reset it, did not answer within the device's deadline, or the \
             device was at its connection cap)"
        );
    }
    let shown: String = reply.escape_debug().take(80).collect();
    format!("the VM's vsock device answered CONNECT {port} with \"{shown}\", not OK")
}

/// Runs `attempt` until it does not fail with `EAGAIN`: on a Unix socket, a full listen
/// backlog (a flood of other clients the backend has not accepted yet), retried after a short
/// pause; the caller's connect timeout bounds the whole.
async fn retry_full_backlog<T, F, Fut>(mut attempt: F) -> std::io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<T>>,
{
    let mut pause = Duration::from_millis(5);
    loop {
        match attempt().await {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// Connects to `path`, a full listen backlog retried ([`retry_full_backlog`]).
pub(super) async fn connect_retrying(path: &std::path::Path) -> std::io::Result<UnixStream> {
    retry_full_backlog(|| UnixStream::connect(path)).await
}

/// Connects to the VM's socket at `path` and writes `out` (the `CONNECT` line and the bytes
/// behind it) at once, with nothing between the two system calls: the vsock device reads what
/// a client sent as it accepts it, and at its connection cap only a client whose first bytes
/// are there may take the slot of a silent one (`vmm::virtio::vsock::muxer::host`).
/// Connecting through the runtime first (a wait for writability between the connect and the
/// write) let a loaded host's device accept the client before it spoke, and refuse it.
/// Returns the stream and how much of `out` went out (the rest is written by the handshake).
/// A full listen backlog is retried ([`retry_full_backlog`]).
pub(super) async fn connect_sending(
    path: &Path,
    out: &[u8],
) -> std::io::Result<(UnixStream, usize)> {
    retry_full_backlog(|| async {
        let mut s = connect_nonblocking(path)?;
        // A write that fails here (the device already closed it) is tried again by the
        // handshake, which says what it means.
        let sent = s.write(out).unwrap_or(0);
        Ok((UnixStream::from_std(s)?, sent))
    })
    .await
}

/// A non-blocking Unix stream socket connected to `path` (`EAGAIN`: its backlog is full).
fn connect_nonblocking(path: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(std::os::unix::net::UnixStream::from(fd))
}

/// How long an abandoned hybrid-vsock handshake stays open waiting for the backend's reply.
const HANDSHAKE_LINGER: Duration = Duration::from_secs(30);

/// The hybrid-vsock `CONNECT` exchange, in a task of its own that owns the connection.
///
/// A backend must never see the host side close between `CONNECT` and its `OK`:
/// vhost-device-vsock 0.3.0 (the tcg driver's backend before `vm-vsock`) then failed to write
/// `OK` and its vring worker panicked, after which that VM's vsock answered no connection. So neither a
/// timeout nor a caller that drops this future (a `select!`, Ctrl-C) closes a connection
/// mid-handshake: the caller gets its timeout at once, while the task keeps the connection
/// until the reply line or EOF arrives (at most [`HANDSHAKE_LINGER`]), and only then drops it.
pub(super) async fn vsock_handshake(
    s: UnixStream,
    port: u32,
    rest: Vec<u8>,
    timeout: Duration,
) -> Result<UnixStream, ClientError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut s = s;
        match tokio::time::timeout(timeout, vsock_connect(&mut s, port, &rest)).await {
            Ok(result) => {
                // If the caller is gone, `s` is dropped after the reply: harmless.
                let _ = tx.send(result.map(|()| s));
            }
            Err(_) => {
                let _ = tx.send(Err(ClientError::Timeout {
                    step: "hybrid vsock connect",
                }));
                let _ = tokio::time::timeout(HANDSHAKE_LINGER, drain_line(&mut s)).await;
            }
        }
    });
    rx.await.unwrap_or_else(|_| {
        Err(ClientError::Io {
            step: "hybrid vsock connect",
            source: std::io::Error::other("the handshake task ended without an answer"),
        })
    })
}

/// Reads until a newline or EOF, at most 64 bytes (the rest of a `CONNECT` reply line).
async fn drain_line(s: &mut UnixStream) {
    let mut b = [0u8; 1];
    for _ in 0..64 {
        match s.read(&mut b).await {
            Ok(1) if b[0] != b'\n' => {}
            _ => return,
        }
    }
}

/// The `CONNECT <port>\n` line and `first` (the bytes that follow it; the backend passes them
/// on once the guest accepted), as one write.
pub(super) fn connect_line(port: u32, first: &[u8]) -> Vec<u8> {
    let mut out = format!("CONNECT {port}\n").into_bytes();
    out.extend_from_slice(first);
    out
}

/// Sends `rest` (what [`connect_sending`] could not write of the [`connect_line`]), then
/// reads the reply line.
async fn vsock_connect(s: &mut UnixStream, port: u32, rest: &[u8]) -> Result<(), ClientError> {
    let step = "hybrid vsock connect";
    // The backend closed the connection (before our bytes were read it is a reset, not an
    // end of file): it answered nothing, or only `line`.
    let io = |line: &[u8], source: std::io::Error| match source.kind() {
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
            ClientError::VsockHandshake {
                port,
                reply: String::from_utf8_lossy(line).into_owned(),
            }
        }
        _ => ClientError::Io { step, source },
    };
    s.write_all(rest).await.map_err(|e| io(&[], e))?;
    // Read byte by byte so nothing past the line is consumed; bounded to 64 bytes.
    let mut line = Vec::with_capacity(64);
    loop {
        let mut b = [0u8; 1];
        let n = s.read(&mut b).await.map_err(|e| io(&line, e))?;
        if n == 0 || line.len() >= 64 {
            return Err(ClientError::VsockHandshake {
                port,
                reply: String::from_utf8_lossy(&line).into_owned(),
            });
        }
        if b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
    }
    let reply = String::from_utf8_lossy(&line);
    match reply.strip_prefix("OK ") {
        Some(n) if n.trim().parse::<u32>().is_ok() => Ok(()),
        _ => Err(ClientError::VsockHandshake {
            port,
            reply: reply.into_owned(),
        }),
    }
}

//! Forward: splice one agent connection to a TCP connection on `127.0.0.1:<port>` in the guest.
//!
//! # How each side's end of stream is passed on
//! - **Host EOF** (the host client shut down its write side): the agent half-closes the guest
//!   TCP connection (`shutdown(SHUT_WR)`) and keeps copying the guest's answer back, so a client
//!   that sends a request, shuts down its write side and then reads (the way the echo test and
//!   many RPC clients work) still gets the whole reply.
//! - **Guest EOF** (the guest TCP peer closed or shut down its write side): the agent flushes
//!   everything it has read to the vsock stream and then closes the whole connection, both
//!   directions, and the TCP connection with it. It does NOT half-close the vsock stream: a
//!   half close is a `VSOCK_OP_SHUTDOWN` carrying only the SEND flag, which vhost-device-vsock
//!   0.3.0 (the tcg driver's backend before `vm-vsock`) ignores (it acts only on RCV|SEND), so the host would never see EOF and every
//!   read-to-EOF client (HTTP/1.0, `Connection: close`) would hang. A full close sends
//!   RCV|SEND, which the backend turns into EOF on the host socket.
//!
//! # Memory, per forward
//! Two copy buffers of 8 KiB (one each way) in the agent, and the TCP connection's socket
//! buffers fixed at [`TCP_BUFFER`] each way (the kernel doubles it for its bookkeeping), so a
//! guest server that stops reading, or a host that stops taking its answer, holds at most
//! that in the agent's socket instead of what TCP autotuning would grow to (megabytes a
//! connection); the vsock side is bounded by the guest kernel's vsock buffer, whose credit the
//! vsock device keeps to. An idle forward is a task waiting on two sockets: no timer, no CPU.
//!
//! # Trade-offs
//! - A guest peer that only half-closes (shuts down its write side but still wants to read)
//!   loses whatever the host sends afterwards: guest-side half close is treated as a full
//!   close. Servers (the use of Forward) close after answering, so this is the right default.
//! - vhost-device-vsock 0.3.0 also ignores a full close while it still holds bytes it could
//!   not yet write to the host socket (a host reader that is not draining); the guest kernel
//!   then resets the connection after its close timeout (8 s), which ends the host stream,
//!   dropping any bytes the backend still held. A host reader that keeps reading sees
//!   everything followed by EOF. Our own KVM vsock device does not need this workaround, but
//!   the agent cannot tell which backend it is behind.

use std::net::{Ipv4Addr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt, split};
use tokio::net::{TcpSocket, TcpStream};

use super::conn::{send, send_error};
use super::{Agent, Stream};
use vm_agent_protocol::frame::FrameError;
use vm_agent_protocol::protocol::{AgentFrame, ErrorKind};

/// The agent's send and receive buffer of a forward's TCP connection (see the module docs).
pub const TCP_BUFFER: u32 = 64 * 1024;

/// Connects to `127.0.0.1:port` with [`TCP_BUFFER`]-sized socket buffers.
async fn connect(port: u16) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.set_send_buffer_size(TCP_BUFFER)?;
    s.set_recv_buffer_size(TCP_BUFFER)?;
    s.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
}

/// Handle a `Forward{port}` request: connect, answer `ForwardOk`, splice until done. A host
/// that closes or sends anything before `ForwardOk` has given up (it sends nothing before):
/// the connect is abandoned then, not held until [`Agent::io_timeout`].
pub(super) async fn run<S: Stream>(agent: &Agent, mut s: S, port: u16) -> Result<(), FrameError> {
    let t = agent.io_timeout();
    let mut early = [0u8; 1];
    let connected = tokio::select! {
        c = tokio::time::timeout(t, connect(port)) => c,
        // Cancel-safe: nothing is lost if the connect wins.
        _ = s.read(&mut early) => {
            tracing::debug!(port, "forward: the host went away before the connect ended");
            return Ok(());
        }
    };
    let tcp = match connected {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let msg = format!("connect 127.0.0.1:{port}: {e}");
            return send_error(&mut s, ErrorKind::Io, &msg, t).await;
        }
        Err(_) => {
            let msg = format!("connect 127.0.0.1:{port}: timed out");
            return send_error(&mut s, ErrorKind::Io, &msg, t).await;
        }
    };
    send(&mut s, &AgentFrame::ForwardOk, t).await?;
    splice(s, tcp).await;
    Ok(())
}

/// Copy both ways until the guest side ends (see the module docs), then drop both streams.
async fn splice<S: Stream>(conn: S, tcp: TcpStream) {
    let (mut conn_rd, mut conn_wr) = split(conn);
    let (mut tcp_rd, mut tcp_wr) = tcp.into_split();
    // Guest -> host, until the guest peer's EOF or an error on either side.
    let down = async {
        if let Err(e) = tokio::io::copy(&mut tcp_rd, &mut conn_wr).await {
            tracing::debug!(error = %e, "forward: guest to host copy ended");
        }
        let _ = conn_wr.flush().await;
    };
    // Host -> guest; a clean host EOF half-closes the TCP write side. `true` = clean EOF.
    let up = async {
        match tokio::io::copy(&mut conn_rd, &mut tcp_wr).await {
            Ok(_) => {
                let _ = tcp_wr.shutdown().await;
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "forward: host to guest copy ended");
                false
            }
        }
    };
    tokio::pin!(down, up);
    tokio::select! {
        () = &mut down => {}
        clean = &mut up => if clean { down.await },
    }
    // Returning drops both halves of both streams: the connection is closed in full.
}

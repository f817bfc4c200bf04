//! One published port's forwarding: the accept loop (at most [`MAX_CONNECTIONS`] at once,
//! past it clients wait in the listen backlog), each connection spliced to an agent Forward
//! asked again while the agent is busy, and the descriptors that takes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use vm_agent_client::ForwardStream;
use vm_drivers::MachineError;

use super::{COPY_BUFFER, FORWARD_BUSY_WAIT, MAX_CONNECTIONS, Throttle, is_busy};
use crate::link::Link;

/// Forwards every connection `listener` accepts to `guest_port` in the guest over vsock, at
/// most [`MAX_CONNECTIONS`] at once, until aborted (also what [`crate::Guest::forward_from`]
/// runs).
pub(crate) async fn accept_loop(listener: TcpListener, machine: Link, guest_port: u16) {
    enough_descriptors();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let busy = Arc::new(Throttle::default());
    let mut conns = JoinSet::new(); // aborted (every connection) when this task is aborted
    loop {
        while conns.try_join_next().is_some() {}
        // At the cap, nothing is accepted: the next clients wait in the listen backlog.
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (mut tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (machine, busy) = (machine.clone(), busy.clone());
        conns.spawn(async move {
            let _permit = permit;
            match forward_when_free(&machine, guest_port, &busy).await {
                Ok(mut guest) => {
                    let (a, b) = (COPY_BUFFER, COPY_BUFFER);
                    let copied =
                        tokio::io::copy_bidirectional_with_sizes(&mut tcp, &mut guest, a, b).await;
                    if let Err(e) = copied {
                        tracing::debug!(%peer, error = %e, "forward ended");
                    }
                }
                Err(e) => tracing::debug!(%peer, error = %e, "forward to guest refused"),
            }
        });
    }
}

/// Raises the soft descriptor limit so that [`MAX_CONNECTIONS`] forwards (two descriptors
/// each) fit, once a process; warns when the hard limit leaves less (accepting then fails
/// with `EMFILE` past it, and clients wait in the backlog).
fn enough_descriptors() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let want = 2 * MAX_CONNECTIONS as u64 + 256;
        match vm_sys::control::raise_nofile() {
            Ok(n) if n >= want => {}
            Ok(n) => tracing::warn!(
                limit = n,
                want,
                "RLIMIT_NOFILE is too low for a full published port"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot read or raise RLIMIT_NOFILE"),
        }
    });
}

/// A Forward, asked again while the agent answers `Busy` (backing off, at most
/// [`FORWARD_BUSY_WAIT`]): the client waits rather than losing its connection.
async fn forward_when_free(
    machine: &Link,
    port: u16,
    busy: &Throttle,
) -> Result<ForwardStream, MachineError> {
    let deadline = Instant::now() + FORWARD_BUSY_WAIT;
    let mut delay = Duration::from_millis(20);
    loop {
        match machine.call(|c| c.forward(port)).await {
            Err(e) if is_busy(&e) && Instant::now() + delay < deadline => {
                if busy.ready() {
                    tracing::warn!(port, "the guest agent is busy; forwarded connections wait");
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            r => return r,
        }
    }
}

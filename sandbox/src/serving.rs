//! [`Serving`]: a long-lived guest process reachable on a host loopback port.
//!
//! `start` binds the host listener first (so a taken port fails before anything starts in
//! the guest), then starts the process through the agent's Serve, then runs two tasks:
//! - the accept loop: each host connection gets its own task that opens an agent Forward
//!   to the guest port over vsock and splices the two with `copy_bidirectional` (at most
//!   [`MAX_CONNECTIONS`] at once; more wait in the listen backlog);
//! - the monitor: polls the agent's ServeStatus every [`POLL_INTERVAL`] and publishes
//!   running/exit/output to the handle.
//!
//! `stop` ends the guest process, aborts both tasks and every connection, and drops the
//! listener, so the host port is closed when it returns. Idempotent; `Drop` does the same
//! without waiting for the guest.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use guest_agent::protocol::{Command, ExitStatus, ServeId, ServeRequest, ServeStatus};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use vm_drivers::MachineError;

use crate::link::Link;
use crate::publish::PublishSpec;

/// How often the monitor asks the agent about the process.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Concurrent forwarded connections per [`Serving`].
pub const MAX_CONNECTIONS: usize = 64;

/// What to serve: an argv run directly (no shell) in the root, and where to publish it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeSpec {
    pub argv: Vec<String>,
    /// Host address and guest port; host port 0 picks a free port.
    pub publish: PublishSpec,
}

/// Why serving failed.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error("serve: empty argv")]
    EmptyArgv,
    #[error("serve: cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serve: starting the guest process failed")]
    Start(#[source] MachineError),
    #[error("serve: stopping the guest process failed")]
    Stop(#[source] MachineError),
}

#[derive(Debug, Clone, Default)]
struct State {
    running: bool,
    exit: Option<ExitStatus>,
    output: Vec<u8>,
}

/// A running guest server (see the module docs).
#[derive(Debug)]
pub struct Serving {
    addr: SocketAddr,
    id: ServeId,
    machine: Link,
    state: Arc<watch::Sender<State>>,
    tasks: Mutex<Option<(JoinHandle<()>, JoinHandle<()>)>>,
}

impl Serving {
    pub(crate) async fn start(
        machine: Link,
        spec: ServeSpec,
        env: Vec<(String, String)>,
        cwd: String,
    ) -> Result<Serving, ServeError> {
        if spec.argv.is_empty() {
            return Err(ServeError::EmptyArgv);
        }
        let want = spec.publish.host_addr();
        let listener = TcpListener::bind(want)
            .await
            .map_err(|source| ServeError::Bind { addr: want, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ServeError::Bind { addr: want, source })?;
        let req = ServeRequest {
            command: Command::Argv(spec.argv),
            env,
            cwd: Some(cwd),
        };
        let id = machine.serve_start(req).await.map_err(ServeError::Start)?;
        let initial = State {
            running: true,
            ..Default::default()
        };
        let state = Arc::new(watch::Sender::new(initial));
        let accept = tokio::spawn(accept_loop(
            listener,
            machine.clone(),
            spec.publish.guest_port,
        ));
        let monitor = tokio::spawn(monitor(machine.clone(), id, state.clone()));
        tracing::info!(%addr, guest_port = spec.publish.guest_port, "serving");
        Ok(Serving {
            addr,
            id,
            machine,
            state,
            tasks: Mutex::new(Some((accept, monitor))),
        })
    }

    /// The host address the server is reachable at.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// True until the guest process exits or `stop` is called.
    pub fn running(&self) -> bool {
        self.state.borrow().running
    }

    /// How the process ended, once it has.
    pub fn exit(&self) -> Option<ExitStatus> {
        self.state.borrow().exit
    }

    /// The retained tail of the process's combined output.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.state.borrow().output).into_owned()
    }

    /// Resolves when the process is no longer running.
    pub async fn done(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| !s.running).await;
    }

    /// End the guest process and close the host port. Idempotent.
    pub async fn stop(&self) -> Result<(), ServeError> {
        let Some((accept, monitor)) = self.take_tasks() else {
            return Ok(());
        };
        accept.abort();
        monitor.abort();
        let _ = accept.await; // the listener is dropped when the task is gone
        let _ = monitor.await;
        let result = self.machine.serve_stop(self.id).await;
        self.state.send_modify(|s| s.running = false);
        match result {
            Ok(status) => {
                self.state.send_replace(State {
                    running: false,
                    exit: status.exit,
                    output: status.output_tail,
                });
                Ok(())
            }
            // A machine that is gone has no process left to stop.
            Err(MachineError::Closed { .. } | MachineError::WallExpired { .. }) => Ok(()),
            Err(MachineError::Stopped { .. }) => Ok(()),
            Err(e) => Err(ServeError::Stop(e)),
        }
    }

    fn take_tasks(&self) -> Option<(JoinHandle<()>, JoinHandle<()>)> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some((accept, monitor)) = self.take_tasks() {
            accept.abort();
            monitor.abort();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (machine, id) = (self.machine.clone(), self.id);
                rt.spawn(async move {
                    let _ = machine.serve_stop(id).await;
                });
            }
        }
    }
}

async fn accept_loop(listener: TcpListener, machine: Link, guest_port: u16) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut conns = JoinSet::new(); // aborted (every connection) when this task is aborted
    loop {
        while conns.try_join_next().is_some() {}
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
        let machine = machine.clone();
        conns.spawn(async move {
            let _permit = permit;
            match machine.forward(guest_port).await {
                Ok(mut guest) => {
                    if let Err(e) = tokio::io::copy_bidirectional(&mut tcp, &mut guest).await {
                        tracing::debug!(%peer, error = %e, "forward ended");
                    }
                }
                Err(e) => tracing::debug!(%peer, error = %e, "forward to guest refused"),
            }
        });
    }
}

async fn monitor(machine: Link, id: ServeId, tx: Arc<watch::Sender<State>>) {
    let mut failures = 0u32;
    loop {
        tokio::time::sleep(POLL_INTERVAL).await;
        match machine.serve_status(id).await {
            Ok(ServeStatus {
                running,
                exit,
                output_tail,
            }) => {
                failures = 0;
                tx.send_replace(State {
                    running,
                    exit,
                    output: output_tail,
                });
                if !running {
                    return;
                }
            }
            Err(MachineError::Agent(e)) if failures < 3 => {
                failures += 1;
                tracing::debug!(error = %e, "serve status failed");
            }
            Err(e) => {
                tracing::debug!(error = %e, "serve monitor ends");
                tx.send_modify(|s| s.running = false);
                return;
            }
        }
    }
}

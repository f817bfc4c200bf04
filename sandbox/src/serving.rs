//! [`Serving`]: a long-lived guest process reachable on a host loopback port.
//!
//! `start` binds every host listener first (so a taken port fails before anything starts in
//! the guest), then starts the process through the agent's Serve, then runs its tasks:
//! - one accept loop per published port: each host connection gets its own task that opens
//!   an agent Forward to the guest port over vsock and splices the two with
//!   `copy_bidirectional` (two [`COPY_BUFFER`] buffers: the memory a connection holds here,
//!   with its task; an idle one waits on its two sockets, with no timer, costing no CPU). At
//!   most [`MAX_CONNECTIONS`] at once per port, sized for a model server's hundreds of
//!   keep-alive clients: at the cap the loop stops accepting, so later clients wait in the
//!   listener's kernel backlog (bounded by `somaxconn`; past it the kernel drops their SYNs
//!   and TCP retries) and are accepted, in order, as connections end. The agent keeps its
//!   forwards and file streams below its own cap (640 for every port together), apart from
//!   the slots its control requests need (see `guest_agent::agent::slots`); a forward it
//!   answers `Busy` (several busy ports, `vm cp` beside them) is asked again for up to
//!   [`FORWARD_BUSY_WAIT`] while the client waits;
//! - the monitor: polls the agent's ServeStatus every [`POLL_INTERVAL`] and publishes
//!   running/exit/output to the handle. The server has ended when the agent says its process
//!   exited, or when the VM is gone; a `Busy` agent is a loaded one and is asked again, and
//!   other agent failures end it only after [`UNREACHABLE_AFTER`] without one answer.
//!
//! [`Serving::wait_ready`] (module `ready`) waits until the server answers.
//!
//! `stop` ends the guest process, aborts the tasks and every connection, and drops the
//! listeners, so the host ports are closed when it returns. Idempotent; `Drop` does the same
//! without waiting for the guest.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use vm_agent_protocol::protocol::{
    Command, ErrorKind, ExitStatus, ServeId, ServeRequest, ServeStatus,
};
use vm_drivers::MachineError;
use vm_sync::Lock;

use crate::link::Link;
use crate::publish::PublishSpec;

mod forward;
pub(crate) use forward::accept_loop;

/// How often the monitor asks the agent about the process.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Concurrent forwarded connections per published port (see the module docs for what waits
/// past it, and where). The agent takes 640 forwards in all, under the VM's vsock device cap.
pub const MAX_CONNECTIONS: usize = 512;
/// Each way's copy buffer of a forwarded connection.
pub const COPY_BUFFER: usize = 8 * 1024;
/// How long a forwarded connection waits for the agent to have a slot for it.
pub const FORWARD_BUSY_WAIT: Duration = Duration::from_secs(30);
/// How long the agent may fail to answer the monitor (other than `Busy`) before the server
/// is reported stopped.
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(30);
/// The least time between two warnings of one kind (what a guest can cause is rate-limited).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What to serve: an argv run directly (no shell) in the root, and where to publish it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeSpec {
    pub argv: Vec<String>,
    /// Host addresses and guest ports (at least one); host port 0 picks a free port.
    pub publish: Vec<PublishSpec>,
}

/// A served process as a snapshot records it: the agent's id for it (the agent, in the
/// snapshot's memory, still knows it after a restore), its argv and its guest ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedProcess {
    pub id: u64,
    pub argv: Vec<String>,
    pub guest_ports: Vec<u16>,
}

/// Why serving failed.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error("serve: empty argv")]
    EmptyArgv,
    #[error("serve: nothing to publish (give at least one port)")]
    NoPublish,
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
    #[error("serve: the server exited before it was ready ({})", describe_exit(.status))]
    ExitedEarly { status: Option<ExitStatus> },
    #[error("serve: ready path {path:?} must be /, then visible ASCII (at most 1024 bytes)")]
    ReadyPath { path: String },
    #[error("serve: not ready after {}s: {last}", .waited.as_secs())]
    NotReady { waited: Duration, last: String },
}

/// How a server's end reads in messages: `exit code 3`, `signal 9`, or `status unknown`.
pub fn describe_exit(status: &Option<ExitStatus>) -> String {
    match status {
        Some(ExitStatus { code: Some(c), .. }) => format!("exit code {c}"),
        Some(ExitStatus {
            signal: Some(s), ..
        }) => format!("killed by signal {s}"),
        _ => "status unknown".into(),
    }
}

/// One published port: where the host listens and the guest port it reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub host: SocketAddr,
    pub guest_port: u16,
}

impl Published {
    /// `http://IP:PORT` (`http://[v6]:PORT`), the URL a client uses.
    pub fn url(&self) -> String {
        format!("http://{}", self.host)
    }
}

#[derive(Debug, Clone, Default)]
struct State {
    running: bool,
    exit: Option<ExitStatus>,
    output: Vec<u8>,
}

/// How a guest process runs: its whole environment, working directory and user.
#[derive(Debug, Clone)]
pub(crate) struct GuestProcess {
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub user: Option<String>,
}

/// A running guest server (see the module docs).
#[derive(Debug)]
pub struct Serving {
    published: Vec<Published>,
    id: ServeId,
    argv: Vec<String>,
    pub(crate) machine: Link,
    state: Arc<watch::Sender<State>>,
    tasks: Mutex<Option<Tasks>>,
}

/// The accept loops (one per published port) and the monitor.
#[derive(Debug)]
struct Tasks {
    accept: Vec<JoinHandle<()>>,
    monitor: JoinHandle<()>,
}

impl Tasks {
    fn abort(&self) {
        self.accept.iter().for_each(JoinHandle::abort);
        self.monitor.abort();
    }

    async fn join(self) {
        // A listener is dropped when its task is gone.
        for t in self.accept {
            let _ = t.await;
        }
        let _ = self.monitor.await;
    }
}

impl Serving {
    pub(crate) async fn start(
        machine: Link,
        spec: ServeSpec,
        process: GuestProcess,
    ) -> Result<Serving, ServeError> {
        if spec.argv.is_empty() {
            return Err(ServeError::EmptyArgv);
        }
        let listeners = bind_all(&spec.publish).await?;
        let req = ServeRequest {
            command: Command::Argv(spec.argv.clone()),
            env: process.env,
            cwd: Some(process.cwd),
            user: process.user,
        };
        let id = machine
            .call(|c| c.serve_start(req))
            .await
            .map_err(ServeError::Start)?;
        Ok(Serving::run(machine, id, spec.argv, listeners))
    }

    /// Publishes a process the agent already serves (one a snapshot recorded, running on in
    /// the restored guest): the host listeners and the monitor of [`Serving::start`], without
    /// starting anything in the guest.
    pub(crate) async fn attach(
        machine: Link,
        served: &ServedProcess,
        publish: &[PublishSpec],
    ) -> Result<Serving, ServeError> {
        let listeners = bind_all(publish).await?;
        Ok(Serving::run(
            machine,
            ServeId(served.id),
            served.argv.clone(),
            listeners,
        ))
    }

    fn run(
        machine: Link,
        id: ServeId,
        argv: Vec<String>,
        listeners: Vec<(Published, TcpListener)>,
    ) -> Serving {
        let initial = State {
            running: true,
            ..Default::default()
        };
        let state = Arc::new(watch::Sender::new(initial));
        let mut published = Vec::with_capacity(listeners.len());
        let mut accept = Vec::with_capacity(listeners.len());
        for (p, listener) in listeners {
            tracing::info!(host = %p.host, guest_port = p.guest_port, "serving");
            accept.push(tokio::spawn(accept_loop(
                listener,
                machine.clone(),
                p.guest_port,
            )));
            published.push(p);
        }
        let monitor = tokio::spawn(monitor(machine.clone(), id, state.clone()));
        Serving {
            published,
            id,
            argv,
            machine,
            state,
            tasks: Mutex::new(Some(Tasks { accept, monitor })),
        }
    }

    /// The argv the process was started with.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// What a snapshot records of this server, to publish it again after a restore
    /// ([`crate::Guest::attach_served`]).
    pub fn served(&self) -> ServedProcess {
        let mut guest_ports: Vec<u16> = self.published.iter().map(|p| p.guest_port).collect();
        guest_ports.dedup();
        ServedProcess {
            id: self.id.0,
            argv: self.argv.clone(),
            guest_ports,
        }
    }

    /// Closes the host ports and ends the monitor, leaving the guest process running (a
    /// snapshot keeps it). Afterwards this handle serves nothing; `stop` does nothing.
    pub fn detach(&self) {
        if let Some(tasks) = self.take_tasks() {
            tasks.abort();
        }
    }

    /// The host address of the first published port.
    pub fn addr(&self) -> SocketAddr {
        self.published[0].host // `start` refuses an empty publish list
    }

    /// Every published port, in the order given.
    pub fn published(&self) -> &[Published] {
        &self.published
    }

    /// True until the guest process exits or `stop` is called.
    pub fn running(&self) -> bool {
        self.state.borrow().running
    }

    /// How the process ended, once it has.
    pub fn exit(&self) -> Option<ExitStatus> {
        self.state.borrow().exit
    }

    /// How the process ended: what the monitor saw, else the agent's answer now.
    pub(crate) async fn exit_status(&self) -> Option<ExitStatus> {
        if let Some(s) = self.exit() {
            return Some(s);
        }
        let status = self.machine.call(|c| c.serve_status(self.id)).await.ok()?;
        status.exit
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
        let Some(tasks) = self.take_tasks() else {
            return Ok(());
        };
        tasks.abort();
        tasks.join().await;
        let result = self.machine.call(|c| c.serve_stop(self.id)).await;
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

    fn take_tasks(&self) -> Option<Tasks> {
        self.tasks.locked().take()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(tasks) = self.take_tasks() {
            tasks.abort();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (machine, id) = (self.machine.clone(), self.id);
                rt.spawn(async move {
                    let _ = machine.call(|c| c.serve_stop(id)).await;
                });
            }
        }
    }
}

/// Binds every host listener first, so a taken port fails before anything starts.
async fn bind_all(publish: &[PublishSpec]) -> Result<Vec<(Published, TcpListener)>, ServeError> {
    if publish.is_empty() {
        return Err(ServeError::NoPublish);
    }
    let mut listeners = Vec::with_capacity(publish.len());
    for p in publish {
        let want = p.host_addr();
        let bound = TcpListener::bind(want)
            .await
            .and_then(|l| Ok((l.local_addr()?, l)));
        let (host, listener) = bound.map_err(|source| ServeError::Bind { addr: want, source })?;
        let published = Published {
            host,
            guest_port: p.guest_port,
        };
        listeners.push((published, listener));
    }
    Ok(listeners)
}

/// True for the agent's `Busy` answer.
fn is_busy(e: &MachineError) -> bool {
    matches!(e, MachineError::Agent(c) if c.agent_kind() == Some(ErrorKind::Busy))
}

/// At most one `true` per [`WARN_EVERY`].
#[derive(Debug, Default)]
struct Throttle(Mutex<Option<Instant>>);

impl Throttle {
    fn ready(&self) -> bool {
        let mut last = self.0.locked();
        match *last {
            Some(t) if t.elapsed() < WARN_EVERY => false,
            _ => {
                *last = Some(Instant::now());
                true
            }
        }
    }
}

/// What the monitor makes of one failed status poll.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Ask again at the next poll.
    Wait,
    /// The server is gone (the VM is, or the agent has not answered for too long).
    Gone,
}

/// A failed poll: `Busy` and a paused VM are waits, whatever how long; other agent errors
/// are waits until [`UNREACHABLE_AFTER`] has passed since the first of them in a row
/// (`failing_since`); anything else (the VM closed, stopped or expired) means gone.
fn judge(e: &MachineError, failing_since: &mut Option<Instant>) -> Verdict {
    match e {
        _ if is_busy(e) => Verdict::Wait,
        MachineError::Paused { .. } => {
            *failing_since = None;
            Verdict::Wait
        }
        MachineError::Agent(_) => {
            let since = *failing_since.get_or_insert_with(Instant::now);
            match since.elapsed() < UNREACHABLE_AFTER {
                true => Verdict::Wait,
                false => Verdict::Gone,
            }
        }
        _ => Verdict::Gone,
    }
}

async fn monitor(machine: Link, id: ServeId, tx: Arc<watch::Sender<State>>) {
    let mut failing_since = None;
    let busy = Throttle::default();
    loop {
        tokio::time::sleep(POLL_INTERVAL).await;
        match machine.call(|c| c.serve_status(id)).await {
            Ok(ServeStatus {
                running,
                exit,
                output_tail,
            }) => {
                failing_since = None;
                tx.send_replace(State {
                    running,
                    exit,
                    output: output_tail,
                });
                if !running {
                    return;
                }
            }
            Err(e) => match judge(&e, &mut failing_since) {
                Verdict::Wait => {
                    if is_busy(&e) && busy.ready() {
                        tracing::warn!("the guest agent is busy; the server's status waits");
                    }
                    tracing::debug!(error = %e, "serve status failed");
                }
                Verdict::Gone => {
                    tracing::warn!(error = %e, "serve monitor ends: the server is unreachable");
                    tx.send_modify(|s| s.running = false);
                    return;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_agent_client::ClientError;

    fn agent(kind: ErrorKind) -> MachineError {
        MachineError::Agent(ClientError::Agent {
            kind,
            message: "x".into(),
        })
    }

    /// A published port takes as many connections as the agent has forwards for; the agent's
    /// authenticated connections fit under the vsock device's cap (the rest, which the agent
    /// never answered, the device may push out), and its handshake pool never refuses what
    /// the device lets through.
    #[test]
    fn a_full_port_fits_the_agent_and_the_device() {
        use guest_agent::agent::{AgentOptions, slots::SlotLimits};
        let (agent, device) = (SlotLimits::default(), vm_drivers::VSOCK_MAX_CONNECTIONS);
        const { assert!(MAX_CONNECTIONS >= 500) };
        assert!(MAX_CONNECTIONS <= agent.max_data_conns);
        assert!(agent.max_conns < device, "{}", agent.max_conns);
        assert!(AgentOptions::default().max_pending >= device);
    }

    /// 64 idle forwarded connections once made three status polls in a row `Busy`, and
    /// `vm serve` took that for a dead server and tore the VM down.
    #[test]
    fn busy_never_ends_the_server() {
        let mut since = Some(Instant::now());
        for _ in 0..1000 {
            assert_eq!(judge(&agent(ErrorKind::Busy), &mut since), Verdict::Wait);
        }
    }

    #[test]
    fn other_agent_failures_end_it_only_after_a_while() {
        let mut since = None;
        let timeout = || MachineError::Agent(ClientError::Timeout { step: "x" });
        for _ in 0..10 {
            assert_eq!(judge(&timeout(), &mut since), Verdict::Wait);
        }
        since = since.and_then(|t| t.checked_sub(UNREACHABLE_AFTER));
        assert_eq!(judge(&agent(ErrorKind::Io), &mut since), Verdict::Gone);
        let paused = MachineError::Paused { name: "v".into() };
        assert_eq!(judge(&paused, &mut since), Verdict::Wait);
        assert_eq!(since, None);
        let closed = MachineError::Closed { name: "v".into() };
        assert_eq!(judge(&closed, &mut None), Verdict::Gone);
    }
}

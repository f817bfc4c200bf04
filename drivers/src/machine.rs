//! The driver-neutral running guest.
//!
//! A [`Machine`] pairs a backend [`VmHandle`] with the [`AgentClient`] that talks to the guest
//! agent over the VM's hybrid-vsock socket. Every guest operation is one [`Machine::call`] of
//! a client method (`m.call(|c| c.exec(req))`), guarded here; lifetime (close, drop, wall
//! expiry) is handled here, once, for every backend.
//!
//! State machine: `Running` -> `Closed` (by [`Machine::close`], [`Machine::close_now`] or drop)
//! or `Running` -> `WallExpired` (by the watchdog). Both end states are final and make every
//! guest operation fail at once with a typed error; an operation in flight when the state
//! changes is abandoned (its future is dropped), and so is one whose VM stops by itself, so
//! nothing waits on a dead guest.
//!
//! A running machine may be paused ([`Machine::pause`]: every VM process stopped, see
//! `pause`) and resumed; while paused every guest operation fails at once with
//! [`MachineError::Paused`], the wall watchdog keeps counting, and closing resumes it first.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::watch;
use vm_agent_client::{AgentClient, ClientError, ClientLimits};
use vm_spec::Containment;
use vm_sync::{Lock, Wait};

use crate::DriverError;
use crate::snapshot::{BackendSnapshot, SNAPSHOT_TIMEOUT, SnapshotError, Snapshotted};

/// What a backend's handle reports about its VM beyond the console, fixed for the VM's life:
/// front ends ask this, never the driver's name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reports {
    /// [`VmHandle::vmm_log_tail`] gives the log of a VMM of ours.
    pub vmm_log: bool,
    /// [`VmHandle::device_metrics`] gives per-device counters (when the VMM answers).
    pub device_metrics: bool,
}

/// A backend's handle on one running VM. Implemented by the drivers (child processes for
/// `tcg`, the `vm-vmm` process for `kvm`); public so test doubles can build a [`Machine`].
/// Every method may be called from several threads at once.
pub trait VmHandle: Send + Sync {
    /// True while the VM has not stopped.
    fn is_running(&self) -> bool;
    /// Stops the VM now, reaps everything it started and removes the files the driver created.
    /// Idempotent.
    fn kill(&self);
    /// Waits up to `timeout` for the VM to stop by itself; true if it has stopped.
    fn wait(&self, timeout: Duration) -> bool;
    /// The tail of the guest console (bounded).
    fn console_tail(&self) -> String;
    /// Host processes that make up this VM, each the leader of its own process group (which
    /// holds the rest of that process: a jailed program and its reaper).
    fn host_pids(&self) -> Vec<u32>;
    /// Once stopped: which part ended and how, with what it printed (bounded); empty when
    /// there is nothing to add to the console tail.
    fn stop_detail(&self) -> String {
        String::new()
    }
    /// What this handle reports beyond the console (none by default).
    fn reports(&self) -> Reports {
        Reports::default()
    }
    /// The tail of the VMM's own log (bounded): `None` where the driver runs no VMM of ours
    /// (tcg: QEMU's output is its console tail).
    fn vmm_log_tail(&self) -> Option<String> {
        None
    }
    /// The VMM's per-device counters: `None` where the driver has none (tcg) or the VMM did
    /// not answer in time.
    fn device_metrics(&self) -> Option<vm_vmm_protocol::MetricsReport> {
        None
    }
    /// Writes a snapshot of the VM into its plan's `snapshot_dir` and ends it, waiting at most
    /// `timeout` (see [`crate::snapshot`]).
    fn snapshot(&self, timeout: Duration) -> Result<BackendSnapshot, SnapshotError> {
        let _ = timeout;
        Err(SnapshotError::Unsupported {
            driver: "this backend",
            reason: "its VM handle cannot write snapshots".into(),
        })
    }
}

/// Errors of guest operations on a [`Machine`].
#[derive(Debug, Error)]
pub enum MachineError {
    /// The wall-clock lifetime expired and the VM was torn down.
    #[error("wall expired: machine {name} was torn down after {wall:?}")]
    WallExpired {
        /// The machine's name.
        name: String,
        /// The lifetime it had.
        wall: Duration,
    },
    /// The machine was closed.
    #[error("machine {name} is closed")]
    Closed {
        /// The machine's name.
        name: String,
    },
    /// The VM stopped by itself (guest power-off, panic, or a backend crash).
    #[error("machine {name} is no longer running")]
    Stopped {
        /// The machine's name.
        name: String,
        /// The tail of the guest console, for diagnosis.
        console_tail: String,
    },
    /// The guest agent call failed while the VM was running.
    #[error("guest agent call failed")]
    Agent(#[source] ClientError),
    /// The machine is paused: resume it first.
    #[error("machine {name} is paused")]
    Paused {
        /// The machine's name.
        name: String,
    },
    /// Pausing or resuming the VM's processes failed.
    #[error("pausing machine {name}")]
    Pause {
        /// The machine's name.
        name: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Identity of a machine, given by the driver that booted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// The boot plan's name.
    pub name: String,
    /// The driver's name.
    pub driver: &'static str,
    /// The driver's containment.
    pub containment: Containment,
    /// Wall-clock lifetime, enforced by a watchdog.
    pub wall: Option<Duration>,
    /// The host Unix socket the agent client connects to: the VM's hybrid-vsock socket for
    /// the real drivers (`<run_dir>/vsock.sock`, padded under tcg; a client writes
    /// `CONNECT <port>\n` first, then presents the boot's token: `vm_drivers::attach_client`).
    /// It exists while the machine runs and is removed when it is closed.
    pub agent_socket: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Closed,
    WallExpired,
}

struct Shared {
    handle: Box<dyn VmHandle>,
    state: Mutex<State>,
    cv: Condvar,
    /// Mirrors `state` for async waiters.
    tx: watch::Sender<State>,
    /// Set once the backend's teardown (kill, reap, files removed) has returned after the
    /// machine left `Running`: a call that fails because of the state change waits for it,
    /// so "wall expired" and "closed" mean the VM is already gone.
    down: watch::Sender<bool>,
    /// Set while the VM's processes are stopped ([`Machine::pause`]).
    paused: Mutex<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Moves `Running` to `to`; returns false if the machine had already left `Running`.
    fn leave_running(&self, to: State) -> bool {
        let mut st = self.lock();
        if *st != State::Running {
            return false;
        }
        *st = to;
        self.tx.send_replace(to);
        self.cv.notify_all();
        true
    }

    fn state(&self) -> State {
        *self.lock()
    }

    fn paused(&self) -> MutexGuard<'_, bool> {
        self.paused.locked()
    }

    /// Lets the VM's processes run again if they were paused.
    fn resume(&self) {
        let mut paused = self.paused();
        if *paused {
            crate::pause::thaw(&self.handle.host_pids());
            *paused = false;
        }
    }

    /// Kills and reaps the VM and removes its files, then says so to waiting calls.
    fn tear_down(&self) {
        self.resume();
        self.handle.kill();
        self.down.send_replace(true);
    }
}

/// How long a call that failed on a state change waits for the teardown to finish.
const TEARDOWN_WAIT: Duration = Duration::from_secs(10);

/// A running guest (see the module docs). Dropping it tears the VM down.
pub struct Machine {
    info: MachineInfo,
    agent: AgentClient,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("info", &self.info)
            .field("state", &self.shared.state())
            .finish()
    }
}

/// How often a pending guest operation checks that the VM is still alive.
const VM_POLL: Duration = Duration::from_millis(200);

/// How long [`Machine::close`] gives the guest to power off after asking the agent.
const GRACEFUL_SHUTDOWN: Duration = Duration::from_secs(3);

impl Machine {
    /// Wraps a started VM. Starts the wall watchdog when `info.wall` is set; if that thread
    /// cannot be started the VM is killed and an error returned (the lifetime is never
    /// silently unenforced).
    pub fn new(
        info: MachineInfo,
        handle: Box<dyn VmHandle>,
        agent: AgentClient,
    ) -> Result<Machine, DriverError> {
        let (tx, _rx) = watch::channel(State::Running);
        let (down, _rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            handle,
            state: Mutex::new(State::Running),
            cv: Condvar::new(),
            tx,
            down,
            paused: Mutex::new(false),
        });
        if let Some(wall) = info.wall {
            let s = shared.clone();
            let name = info.name.clone();
            let spawned = thread::Builder::new()
                .name(format!("vm-wall-{}", info.driver))
                .spawn(move || watchdog(&s, &name, wall));
            if let Err(source) = spawned {
                shared.leave_running(State::Closed);
                shared.tear_down();
                return Err(DriverError::Spawn {
                    program: "wall watchdog thread".into(),
                    source,
                });
            }
        }
        Ok(Machine {
            info,
            agent,
            shared,
        })
    }

    /// The boot plan's name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The driver that booted this machine.
    pub fn driver(&self) -> &'static str {
        self.info.driver
    }

    /// The containment the guest runs under.
    pub fn containment(&self) -> Containment {
        self.info.containment
    }

    /// The identity the driver gave this machine.
    pub fn info(&self) -> &MachineInfo {
        &self.info
    }

    /// The host Unix socket the agent client connects to (see [`MachineInfo::agent_socket`]).
    /// Another process can reach the same agent through it, e.g. with
    /// `AgentClient::hybrid_vsock(path, vm_agent_protocol::AGENT_PORT)` for the real drivers.
    pub fn agent_socket(&self) -> &Path {
        &self.info.agent_socket
    }

    /// The agent client, unguarded. Prefer [`Machine::call`]: it fails fast once the machine
    /// is closed, expired or paused.
    pub fn agent(&self) -> &AgentClient {
        &self.agent
    }

    /// The tail of the guest console (bounded).
    pub fn console_tail(&self) -> String {
        self.shared.handle.console_tail()
    }

    /// What this machine's backend reports beyond the console.
    pub fn reports(&self) -> Reports {
        self.shared.handle.reports()
    }

    /// The tail of the VMM's own log (kvm: `vm-vmm`'s); `None` on drivers without one.
    pub fn vmm_log_tail(&self) -> Option<String> {
        self.shared.handle.vmm_log_tail()
    }

    /// The VMM's per-device counters (kvm); `None` on drivers without them (tcg), when the
    /// VMM did not answer in time, and while the machine is paused or closed (a stopped VMM
    /// reads no query: none is sent, so none piles up in its control channel).
    pub fn device_metrics(&self) -> Option<vm_vmm_protocol::MetricsReport> {
        // Held across the query, so a pause waits for it instead of stopping the VMM mid-way.
        let paused = self.shared.paused();
        if *paused || self.shared.state() != State::Running {
            return None;
        }
        self.shared.handle.device_metrics()
    }

    /// The host processes that make up this VM.
    pub fn host_pids(&self) -> Vec<u32> {
        self.shared.handle.host_pids()
    }

    /// True until the machine is closed, expires, or the VM stops by itself.
    pub fn is_running(&self) -> bool {
        self.shared.state() == State::Running && self.shared.handle.is_running()
    }

    /// True once the watchdog has torn the machine down.
    pub fn wall_expired(&self) -> bool {
        self.shared.state() == State::WallExpired
    }

    fn state_error(&self, state: State) -> MachineError {
        let name = self.info.name.clone();
        match state {
            State::WallExpired => MachineError::WallExpired {
                name,
                wall: self.info.wall.unwrap_or_default(),
            },
            State::Closed => MachineError::Closed { name },
            State::Running => MachineError::Stopped {
                name,
                console_tail: self.console_tail(),
            },
        }
    }

    /// Pauses the VM: returns once every thread of every VM process is stopped. Guest
    /// operations fail with [`MachineError::Paused`] until [`Machine::resume`]. Pausing a
    /// paused machine does nothing.
    pub fn pause(&self) -> Result<(), MachineError> {
        let mut paused = self.shared.paused();
        let state = self.shared.state();
        if state != State::Running || !self.shared.handle.is_running() {
            return Err(self.state_error(state));
        }
        if !*paused {
            crate::pause::freeze(&self.shared.handle.host_pids()).map_err(|source| {
                MachineError::Pause {
                    name: self.info.name.clone(),
                    source,
                }
            })?;
            *paused = true;
        }
        Ok(())
    }

    /// Lets a paused VM run again (the guest sees its clock jump). Resuming a machine that
    /// is not paused does nothing.
    pub fn resume(&self) -> Result<(), MachineError> {
        let state = self.shared.state();
        if state != State::Running {
            return Err(self.state_error(state));
        }
        self.shared.resume();
        Ok(())
    }

    /// Whether the VM is paused.
    pub fn is_paused(&self) -> bool {
        *self.shared.paused()
    }

    /// What the VM's host processes use now (CPU time, resident memory — the guest RAM it
    /// has touched included — and how many there are), summed over every process group of
    /// the VM.
    pub fn host_usage(&self) -> vm_sys::control::Usage {
        vm_sys::control::group_usage(&self.shared.handle.host_pids())
    }

    /// Runs one agent call, `op(client)`, on this machine's client: `m.call(|c| c.exec(req))`.
    /// It fails at once if the machine is closed, expired or paused, and is abandoned (its
    /// future dropped) when the machine is closed or expires meanwhile or the VM stops by
    /// itself, so nothing waits on a dead guest. Every guest operation goes through here: an
    /// agent request needs no method of its own on `Machine`. A stream the call returns
    /// ([`vm_agent_client::ExecStream`], a forward) is not cut by a later close or expiry,
    /// but the VM behind it is, so it ends with an error.
    pub async fn call<'a, T, Fut>(
        &'a self,
        op: impl FnOnce(&'a AgentClient) -> Fut,
    ) -> Result<T, MachineError>
    where
        Fut: Future<Output = Result<T, ClientError>>,
    {
        self.guard(op(&self.agent)).await
    }

    /// [`Machine::call`]'s guard around one agent call's future.
    async fn guard<T>(
        &self,
        fut: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, MachineError> {
        if self.is_paused() {
            return Err(MachineError::Paused {
                name: self.info.name.clone(),
            });
        }
        let mut rx = self.shared.tx.subscribe();
        let state = *rx.borrow_and_update();
        if state != State::Running {
            self.torn_down().await;
            return Err(self.state_error(state));
        }
        let r = tokio::select! {
            r = fut => r.map_err(|e| {
                match self.shared.state() {
                    State::Running if !self.shared.handle.is_running() => self.state_error(State::Running),
                    State::Running => MachineError::Agent(e),
                    other => self.state_error(other),
                }
            }),
            changed = rx.wait_for(|s| *s != State::Running) => {
                let state = changed.map(|s| *s).unwrap_or(State::Closed);
                Err(self.state_error(state))
            }
            () = self.vm_stopped() => Err(self.state_error(self.shared.state())),
        };
        if r.is_err() && self.shared.state() != State::Running {
            self.torn_down().await;
        }
        r
    }

    /// Waits (bounded) until the teardown that followed leaving `Running` has returned.
    async fn torn_down(&self) {
        let mut down = self.shared.down.subscribe();
        let _ = tokio::time::timeout(TEARDOWN_WAIT, down.wait_for(|d| *d)).await;
    }

    /// Resolves once the backend reports the VM stopped (guest power-off, crash), so a call
    /// does not wait out the agent client's timeouts on a dead VM.
    async fn vm_stopped(&self) {
        while self.shared.handle.is_running() {
            tokio::time::sleep(VM_POLL).await;
        }
    }

    /// Snapshots the VM into its plan's `snapshot_dir` and ends it: afterwards the machine is
    /// closed, as after [`Machine::close`]. Refused (the VM runs on) on a machine booted
    /// without a snapshot directory, a paused or stopped one, or a driver without snapshots.
    pub fn snapshot(&self) -> Result<Snapshotted, SnapshotError> {
        if self.is_paused() {
            return Err(SnapshotError::Machine(MachineError::Paused {
                name: self.info.name.clone(),
            }));
        }
        let state = self.shared.state();
        if state != State::Running || !self.shared.handle.is_running() {
            return Err(SnapshotError::Machine(self.state_error(state)));
        }
        let token = self.agent.token().cloned();
        let written = match self.shared.handle.snapshot(SNAPSHOT_TIMEOUT) {
            Err(SnapshotError::Unsupported { reason, .. }) => {
                return Err(SnapshotError::Unsupported {
                    driver: self.info.driver,
                    reason,
                });
            }
            // The handle does not know the machine's name.
            Err(SnapshotError::NotConfigured { .. }) => {
                return Err(SnapshotError::NotConfigured {
                    name: self.info.name.clone(),
                });
            }
            Err(e @ SnapshotError::Timeout(_)) => {
                self.close_now();
                return Err(e);
            }
            other => other?,
        };
        self.close_now();
        // Every real driver's client presents a token; a snapshot without one is unusable.
        let token = token.ok_or(SnapshotError::NoToken {
            name: self.info.name.clone(),
        })?;
        Ok(written.with_token(token))
    }

    /// Asks the agent to power the guest off (bounded to a few seconds), then kills and reaps
    /// whatever is left and removes the driver's socket files. Idempotent.
    pub async fn close(&self) {
        self.shared.resume();
        if self.shared.state() == State::Running && self.shared.handle.is_running() {
            let limits = ClientLimits {
                connect_timeout: Duration::from_secs(1),
                step_timeout: Duration::from_secs(2),
                ..self.agent.limits().clone()
            };
            let quick = self.agent.clone().with_limits(limits);
            let asked = tokio::time::timeout(GRACEFUL_SHUTDOWN, quick.shutdown()).await;
            if matches!(asked, Ok(Ok(()))) {
                let deadline = Instant::now() + GRACEFUL_SHUTDOWN;
                while self.shared.handle.is_running() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        self.close_now();
    }

    /// Kills the VM without asking the guest, reaps it and removes the driver's files.
    /// Idempotent; this is what `Drop` does.
    pub fn close_now(&self) {
        self.shared.leave_running(State::Closed);
        self.shared.tear_down();
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.close_now();
    }
}

fn watchdog(shared: &Shared, name: &str, wall: Duration) {
    let deadline = Instant::now() + wall;
    let mut st = shared.lock();
    loop {
        if *st != State::Running {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        st = shared.cv.wait_timeout_locked(st, deadline - now);
    }
    drop(st);
    if shared.leave_running(State::WallExpired) {
        tracing::warn!(
            machine = name,
            ?wall,
            "wall lifetime expired; tearing the vm down"
        );
        shared.tear_down();
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;

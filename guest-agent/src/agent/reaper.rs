//! The single owner of `waitpid`.
//!
//! Children are spawned while the table lock is held and registered by pid before it is
//! released; the reaper takes the same lock to reap, so it can never reap a child before its
//! waiter exists. In `all` mode (PID 1, or a subreaper on the host) it reaps with
//! `waitpid(-1)` and discards the statuses of orphans nobody waits for; otherwise it polls only
//! the registered pids (so it cannot steal statuses from other code in the same process).

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use vm_sync::Lock;

use super::sys::proc::{self as sys, Waited};
use vm_agent_protocol::protocol::ExitStatus;

/// Reaper errors.
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    #[error("cannot install the SIGCHLD handler")]
    Signal(#[source] std::io::Error),
    #[error("cannot spawn the process")]
    Spawn(#[source] std::io::Error),
}

type Table = HashMap<i32, oneshot::Sender<ExitStatus>>;

/// Handle to the reaper; cheap to clone.
#[derive(Debug, Clone)]
pub struct Reaper {
    table: Arc<Mutex<Table>>,
    all: bool,
}

/// Convert a raw `waitpid` status.
pub fn decode_status(st: libc::c_int) -> ExitStatus {
    if libc::WIFEXITED(st) {
        ExitStatus {
            code: Some(libc::WEXITSTATUS(st)),
            signal: None,
            timed_out: false,
        }
    } else if libc::WIFSIGNALED(st) {
        ExitStatus {
            code: None,
            signal: Some(libc::WTERMSIG(st)),
            timed_out: false,
        }
    } else {
        ExitStatus::default()
    }
}

impl Reaper {
    /// Start the reaper task on the current tokio runtime.
    pub fn start(all: bool) -> Result<Reaper, ReaperError> {
        let mut sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            .map_err(ReaperError::Signal)?;
        let r = Reaper {
            table: Arc::new(Mutex::new(HashMap::new())),
            all,
        };
        let r2 = r.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = sig.recv() => {}
                    _ = tick.tick() => {}
                }
                r2.reap();
            }
        });
        Ok(r)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A poisoned lock only means a panic elsewhere; the table itself is still consistent.
        self.table.locked()
    }

    /// Reap everything that has exited and dispatch statuses to waiters.
    pub fn reap(&self) {
        let mut t = self.lock();
        if self.all {
            while let Ok(Waited::Exited { pid, status }) = sys::wait_nohang(-1) {
                if let Some(tx) = t.remove(&pid) {
                    let _ = tx.send(decode_status(status));
                }
            }
        } else {
            let pids: Vec<i32> = t.keys().copied().collect();
            for pid in pids {
                match sys::wait_nohang(pid) {
                    Ok(Waited::Exited { status, .. }) => {
                        if let Some(tx) = t.remove(&pid) {
                            let _ = tx.send(decode_status(status));
                        }
                    }
                    Ok(Waited::Running) => {}
                    // Not our child any more (ECHILD): nothing will ever report it.
                    Err(_) => {
                        t.remove(&pid);
                    }
                }
            }
        }
    }

    /// Spawn `cmd` and register it; the receiver gets its exit status exactly once.
    /// The returned `Child` must never be waited on directly.
    pub fn spawn(&self, cmd: &mut Command) -> Result<Spawned, ReaperError> {
        self.spawn_then(cmd, |_| {})
    }

    /// As [`Reaper::spawn`], calling `started` with the child's pid while the child cannot
    /// be reaped yet (its pid cannot be reused meanwhile: a child that already ended stays a
    /// zombie until `started` returns).
    pub fn spawn_then(
        &self,
        cmd: &mut Command,
        started: impl FnOnce(i32),
    ) -> Result<Spawned, ReaperError> {
        let (tx, rx) = oneshot::channel();
        let mut t = self.lock();
        let child = cmd.spawn().map_err(ReaperError::Spawn)?;
        let pid = child.id() as i32;
        started(pid);
        t.insert(pid, tx);
        drop(t);
        Ok((child, rx))
    }
}

/// A spawned child and the receiver of its exit status.
pub type Spawned = (std::process::Child, oneshot::Receiver<ExitStatus>);

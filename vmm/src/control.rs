//! Shared VM lifecycle state: the stop flag, the first recorded outcome, the live vCPU threads
//! and how to kick them out of KVM_RUN.
//!
//! Stopping is two-sided: the stop flag is set first, then every registered vCPU thread gets the
//! kick signal. The signal handler sets `immediate_exit` in that thread's `kvm_run`, so a thread
//! between its flag check and KVM_RUN returns at once instead of blocking (e.g. on a HLT with
//! interrupts disabled, which KVM handles in the kernel without any exit). The handler and the
//! thread registry are [`crate::sys::kick`]'s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, Once};
use std::time::{Duration, Instant};

use crate::exit::{FaultKind, VmExit};
use crate::sys::KickableThreads;

/// Offset from SIGRTMIN of the signal used to kick vCPU threads.
pub const KICK_SIGNAL_OFFSET: i32 = 0;

/// A vCPU that stopped on an exit the VM cannot continue from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("vcpu {vcpu} stopped: {kind} at rip {rip:#x}")]
pub struct GuestFault {
    /// vCPU index.
    pub vcpu: u8,
    /// What happened.
    pub kind: FaultKind,
    /// Guest RIP at the exit (0 if unreadable).
    pub rip: u64,
}

/// The outcome of a VM run.
pub type Outcome = Result<VmExit, GuestFault>;

/// The kick signal number.
pub fn kick_signal() -> i32 {
    vmm_sys_util::signal::SIGRTMIN() + KICK_SIGNAL_OFFSET
}

/// Install the kick handler once per process.
pub fn install_kick_handler() -> Result<(), vmm_sys_util::errno::Error> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = crate::sys::install_kick_handler(kick_signal());
    });
    result
}

struct State {
    outcome: Option<Outcome>,
    live: usize,
}

/// Shared by the VM handle and its vCPU threads.
pub struct Control {
    stop: AtomicBool,
    state: Mutex<State>,
    threads: KickableThreads,
    finished: Condvar,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("stop", &self.stop_requested())
            .finish()
    }
}

impl Control {
    /// State for `vcpus` threads, none registered yet.
    pub fn new(vcpus: usize) -> Self {
        Self {
            stop: AtomicBool::new(false),
            state: Mutex::new(State {
                outcome: None,
                live: 0,
            }),
            threads: KickableThreads::new(vcpus, kick_signal()),
            finished: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the VM is stopping.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Record `outcome` (the first one wins), set the stop flag and kick every vCPU thread.
    pub fn request_stop(&self, outcome: Outcome) {
        let mut st = self.lock();
        if st.outcome.is_none() {
            st.outcome = Some(outcome);
        }
        self.stop.store(true, Ordering::SeqCst);
        drop(st);
        self.threads.kick_all();
    }

    /// Kick the vCPU threads again (closes any race with a thread entering KVM_RUN).
    pub fn kick(&self) {
        if self.stop_requested() {
            self.threads.kick_all();
        }
    }

    /// Run `f` (vCPU thread `index`'s loop) with the calling thread registered for kicks. The
    /// stop flag is checked after registering: a stop either sees the thread registered or
    /// is seen here, so it is never missed.
    pub fn run_registered<R>(&self, index: usize, f: impl FnOnce() -> R) -> R {
        self.threads.run_registered(index, || {
            if self.stop_requested() {
                self.threads.kick_current();
            }
            f()
        })
    }

    /// Count a thread that is about to be spawned.
    pub fn add_live(&self) {
        self.lock().live += 1;
    }

    /// Called by every vCPU thread as its last action (and for one that failed to spawn).
    pub fn thread_done(&self) {
        let mut st = self.lock();
        st.live = st.live.saturating_sub(1);
        if st.live == 0 {
            self.stop.store(true, Ordering::SeqCst);
            if st.outcome.is_none() {
                st.outcome = Some(Ok(VmExit::Stopped));
            }
            self.finished.notify_all();
        }
    }

    /// Whether every vCPU thread has finished.
    pub fn is_finished(&self) -> bool {
        self.lock().live == 0
    }

    /// Wait until every vCPU thread finished or `timeout` passed, kicking them while stopping.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Outcome> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if st.live == 0 {
                return st.outcome.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if self.stop_requested() {
                self.threads.kick_all();
            }
            let slice = (deadline - now).min(Duration::from_millis(20));
            st = self
                .finished
                .wait_timeout(st, slice)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn first_outcome_wins_and_finish_is_signalled() {
        let c = Arc::new(Control::new(2));
        c.add_live();
        c.add_live();
        assert_eq!(c.wait_timeout(Duration::from_millis(10)), None);
        c.request_stop(Ok(VmExit::Reset));
        c.request_stop(Ok(VmExit::Stopped));
        assert!(c.stop_requested());
        let c2 = c.clone();
        let t = std::thread::spawn(move || {
            c2.thread_done();
            c2.thread_done();
        });
        assert_eq!(
            c.wait_timeout(Duration::from_secs(5)),
            Some(Ok(VmExit::Reset))
        );
        t.join().unwrap();
        assert!(c.is_finished());
    }
}

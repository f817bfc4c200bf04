//! Shared VM lifecycle state: the stop flag, the first recorded outcome, the live vCPU threads
//! and how to kick them out of KVM_RUN.
//!
//! Stopping is two-sided: the stop flag is set first, then every registered vCPU thread gets the
//! kick signal. The signal handler sets `immediate_exit` in that thread's `kvm_run`, so a thread
//! between its flag check and KVM_RUN returns at once instead of blocking (e.g. on a HLT with
//! interrupts disabled, which KVM handles in the kernel without any exit). The handler and the
//! thread registry are [`crate::sys::kick`]'s.
//!
//! Pausing (for a snapshot) uses the same kick: [`Control::pause`] sets the pause flag, kicks
//! every vCPU thread and waits on a condition variable until each has parked itself in
//! [`Control::park`] (out of `KVM_RUN`, its pending I/O completed). A parked thread sleeps on
//! that condition variable until the VM resumes or stops, and meanwhile serves
//! [`Control::collect_vcpu_states`]: each reads its own vCPU's state on its own thread (it owns
//! the `VcpuFd`) and hands it back here. Nothing busy-waits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, Once};
use std::time::{Duration, Instant};

use std::sync::Arc;

use vm_sync::{Lock, Wait};

use crate::exit::{FaultKind, VmExit};
use crate::snapshot::VcpuState;
use crate::snapshot::vcpu::{SavePlan, VcpuStateError};
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

/// What one vCPU thread hands back from a save round.
pub type VcpuSave = Result<VcpuState, VcpuStateError>;

/// Why the vCPUs could not be paused or their states collected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PauseError {
    /// The VM ended (or is stopping) before every vCPU parked.
    #[error("the VM is not running")]
    NotRunning,
    /// Not every vCPU parked (or answered) in time.
    #[error("{parked} of {live} vCPUs parked within {waited:?}")]
    Timeout {
        /// Threads parked.
        parked: usize,
        /// Threads alive.
        live: usize,
        /// How long it waited.
        waited: Duration,
    },
    /// Another pause is in progress.
    #[error("the VM is already paused")]
    AlreadyPaused,
}

struct State {
    outcome: Option<Outcome>,
    live: usize,
    /// vCPU threads inside [`Control::park`].
    parked: usize,
    /// Bumped by every [`Control::collect_vcpu_states`]; a parked thread serves each round once.
    save_round: u64,
    /// What the current round reads.
    save_plan: Option<Arc<SavePlan>>,
    /// One slot per vCPU for the current round.
    saved: Vec<Option<VcpuSave>>,
}

/// Shared by the VM handle and its vCPU threads.
pub struct Control {
    stop: AtomicBool,
    pause: AtomicBool,
    state: Mutex<State>,
    threads: KickableThreads,
    finished: Condvar,
    /// Signalled when a thread parks or unparks, a save round starts or a state is handed
    /// back, and on resume and stop.
    parking: Condvar,
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
            pause: AtomicBool::new(false),
            state: Mutex::new(State {
                outcome: None,
                live: 0,
                parked: 0,
                save_round: 0,
                save_plan: None,
                saved: Vec::new(),
            }),
            threads: KickableThreads::new(vcpus, kick_signal()),
            finished: Condvar::new(),
            parking: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
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
        self.parking.notify_all();
        self.threads.kick_all();
    }

    /// Kick the vCPU threads again (closes any race with a thread entering KVM_RUN).
    pub fn kick(&self) {
        if self.stop_requested() || self.pause_requested() {
            self.threads.kick_all();
        }
    }

    /// Whether the vCPUs are asked to park.
    pub fn pause_requested(&self) -> bool {
        self.pause.load(Ordering::SeqCst)
    }

    /// Ask every vCPU thread to park, and wait up to `timeout` until all have. On an error
    /// the pause is withdrawn (the threads that parked run on).
    pub fn pause(&self, timeout: Duration) -> Result<(), PauseError> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        if self.stop_requested() || st.live == 0 {
            return Err(PauseError::NotRunning);
        }
        if self.pause.swap(true, Ordering::SeqCst) {
            return Err(PauseError::AlreadyPaused);
        }
        loop {
            if self.stop_requested() || st.live == 0 {
                drop(st);
                self.resume();
                return Err(PauseError::NotRunning);
            }
            if st.parked == st.live {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let err = PauseError::Timeout {
                    parked: st.parked,
                    live: st.live,
                    waited: timeout,
                };
                drop(st);
                self.resume();
                return Err(err);
            }
            // Kick under the lock's protection of `parked`: a thread that has not parked yet is
            // either in KVM_RUN (the kick makes it return) or about to check the flag.
            self.threads.kick_all();
            let slice = (deadline - now).min(Duration::from_millis(20));
            st = self.parking.wait_timeout_locked(st, slice);
        }
    }

    /// Withdraw the pause: parked threads return to `KVM_RUN`.
    pub fn resume(&self) {
        let st = self.lock();
        self.pause.store(false, Ordering::SeqCst);
        drop(st);
        self.parking.notify_all();
    }

    /// With every vCPU parked ([`Self::pause`]), have each read its own state with `plan`
    /// and return them by vCPU index; waits up to `timeout`.
    pub fn collect_vcpu_states(
        &self,
        plan: SavePlan,
        timeout: Duration,
    ) -> Result<Vec<VcpuSave>, PauseError> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        if !self.pause_requested() || st.parked != st.live || st.live == 0 {
            return Err(PauseError::NotRunning);
        }
        let n = st.live;
        st.save_round += 1;
        st.save_plan = Some(Arc::new(plan));
        st.saved = (0..self.threads.len()).map(|_| None).collect();
        self.parking.notify_all();
        loop {
            if self.stop_requested() || st.live != n {
                return Err(PauseError::NotRunning);
            }
            let done = st.saved.iter().filter(|s| s.is_some()).count();
            if done == n {
                st.save_plan = None;
                return Ok(std::mem::take(&mut st.saved)
                    .into_iter()
                    .flatten()
                    .collect());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(PauseError::Timeout {
                    parked: done,
                    live: n,
                    waited: timeout,
                });
            }
            st = self.parking.wait_timeout_locked(st, deadline - now);
        }
    }

    /// vCPU thread `index`, out of `KVM_RUN` with its pending I/O completed and the pause
    /// flag set: sleep until the VM resumes or stops, serving each save round with `save`.
    pub fn park(&self, index: usize, mut save: impl FnMut(&SavePlan) -> VcpuSave) {
        let mut st = self.lock();
        st.parked += 1;
        let mut served = st.save_round;
        self.parking.notify_all();
        while self.pause_requested() && !self.stop_requested() {
            if st.save_round != served {
                served = st.save_round;
                if let Some(plan) = st.save_plan.clone() {
                    drop(st);
                    let r = save(&plan);
                    st = self.lock();
                    // A round that timed out and was replaced keeps its slots to itself.
                    let current = st.save_round == served;
                    if let Some(slot) = st.saved.get_mut(index)
                        && current
                    {
                        *slot = Some(r);
                    }
                    self.parking.notify_all();
                }
                continue;
            }
            st = self.parking.wait_locked(st);
        }
        st.parked -= 1;
        drop(st);
        self.parking.notify_all();
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
        drop(st);
        self.parking.notify_all();
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
            st = self.finished.wait_timeout_locked(st, slice);
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

    /// A stand-in vCPU thread: runs until paused, parks (serving save rounds with its index
    /// as the state's RIP), and returns when resumed (true) or stopped (false).
    fn fake_vcpu(c: Arc<Control>, index: usize) -> std::thread::JoinHandle<Vec<bool>> {
        c.add_live();
        std::thread::spawn(move || {
            let mut resumed = Vec::new();
            c.run_registered(index, || {
                while !c.stop_requested() {
                    if c.pause_requested() {
                        c.park(index, |_| {
                            let mut s = crate::snapshot::state::tests::sample(1, 16);
                            let mut v = s.vcpus.remove(0);
                            v.regs.rip = index as u64;
                            Ok(v)
                        });
                        resumed.push(!c.stop_requested());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            c.thread_done();
            resumed
        })
    }

    #[test]
    fn pause_parks_every_thread_collects_their_states_and_resumes() {
        crate::control::install_kick_handler().unwrap();
        let c = Arc::new(Control::new(2));
        let threads: Vec<_> = (0..2).map(|i| fake_vcpu(c.clone(), i)).collect();
        let plan = || crate::snapshot::vcpu::SavePlan {
            xsave: false,
            xcrs: false,
            msrs: vec![],
        };
        // Not paused yet: nothing to collect.
        assert_eq!(
            c.collect_vcpu_states(plan(), Duration::from_secs(1)).err(),
            Some(PauseError::NotRunning)
        );
        c.pause(Duration::from_secs(10)).unwrap();
        assert_eq!(
            c.pause(Duration::from_secs(1)),
            Err(PauseError::AlreadyPaused)
        );
        assert_eq!(c.lock().parked, 2);
        for _ in 0..2 {
            let states = c
                .collect_vcpu_states(plan(), Duration::from_secs(10))
                .unwrap();
            let rips: Vec<u64> = states
                .iter()
                .map(|s| s.as_ref().unwrap().regs.rip)
                .collect();
            assert_eq!(rips, vec![0, 1], "one state per vCPU, by index");
        }
        c.resume();
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.lock().parked > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(c.lock().parked, 0, "resumed threads unpark");
        // Pausing again works, and a stop releases parked threads.
        c.pause(Duration::from_secs(10)).unwrap();
        c.request_stop(Ok(VmExit::Stopped));
        assert_eq!(
            c.wait_timeout(Duration::from_secs(10)),
            Some(Ok(VmExit::Stopped))
        );
        for t in threads {
            assert_eq!(t.join().unwrap(), vec![true, false]);
        }
        assert_eq!(c.pause(Duration::from_secs(1)), Err(PauseError::NotRunning));
    }
}

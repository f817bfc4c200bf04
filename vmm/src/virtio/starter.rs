//! Device workers are started by the VM's device control thread, never by a vCPU thread.
//!
//! When the guest sets DRIVER_OK, the vCPU thread that took the MMIO exit prepares the worker
//! (the handler, the queues, duplicated eventfds: allocation and `fcntl` only), leaves it in
//! the device's [`WorkerSlot`] and signals the [`Starter`]'s eventfd; the write returns at
//! once, it never waits for the start. The control thread ([`Starter::serve`], `vm<N>-devctl`)
//! wakes on the eventfd, and for every slot with a pending worker creates its stop eventfd and
//! epoll set and spawns its thread. So the vCPU filter needs no thread creation, no `seccomp`
//! and none of the devices' calls (`socket`, `connect`, `accept4`, …): those are the control
//! thread's, whose children (the workers) inherit its filter and add their own.
//!
//! Bounded by construction: a slot holds at most one pending worker and one running worker,
//! and a new DRIVER_OK needs a device reset first, which drops the pending one and stops (joins)
//! the running one. A guest toggling DRIVER_OK and reset forever costs at most one worker
//! thread per device at a time, and the control thread holds the slot's lock while it spawns,
//! so a reset waits at most for one thread start, never for the control thread's loop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use vm_sync::Lock;
use vmm_sys_util::eventfd::EventFd;

use super::VirtioError;
use super::worker::{Worker, WorkerSetup};

/// One device's worker: the one being started and the one running.
#[derive(Default)]
pub(crate) struct WorkerSlot {
    pending: Option<(WorkerSetup, String)>,
    worker: Option<Worker>,
}

impl WorkerSlot {
    /// Leaves `setup` to be started as thread `name`.
    pub(crate) fn request(&mut self, setup: WorkerSetup, name: String) {
        self.pending = Some((setup, name));
    }

    /// Drops the pending worker and stops the running one (joins it).
    pub(crate) fn clear(&mut self) {
        self.pending = None;
        if let Some(mut w) = self.worker.take() {
            w.stop();
        }
    }

    /// Quiesces the device for a snapshot: stops (joins) the running worker and returns its
    /// queues, or drops the pending one and returns the queues it would have started with;
    /// `None` when neither was there (or the worker panicked).
    pub(crate) fn quiesce(&mut self) -> Option<Vec<virtio_queue::Queue>> {
        if let Some((setup, _)) = self.pending.take() {
            return Some(setup.io.queues);
        }
        self.worker.take()?.stop_and_take_queues()
    }

    /// Whether a worker runs or is about to.
    pub(crate) fn active(&self) -> bool {
        self.pending.is_some() || self.worker.is_some()
    }

    /// Whether a worker runs.
    pub(crate) fn running(&self) -> bool {
        self.worker.is_some()
    }

    /// Starts the pending worker, if any. A failure puts the device into DEVICE_NEEDS_RESET.
    fn start(&mut self) {
        let Some((setup, name)) = self.pending.take() else {
            return;
        };
        let irq = setup.io.irq.clone();
        match Worker::spawn(setup, name.clone()) {
            Ok(w) => self.worker = Some(w),
            Err(e) => {
                tracing::error!("{name}: activation failed: {e}");
                irq.set_needs_reset();
            }
        }
    }
}

/// A shared worker slot.
pub(crate) type SharedSlot = Arc<Mutex<WorkerSlot>>;

struct Shared {
    /// Written by a vCPU thread (or the owner, to stop the loop); read by the control thread.
    wake: EventFd,
    stopping: AtomicBool,
    slots: Mutex<Vec<Weak<Mutex<WorkerSlot>>>>,
}

/// Where devices ask for their workers to be started (cheap to clone: one per device).
#[derive(Clone)]
pub struct Starter {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Starter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Starter").finish_non_exhaustive()
    }
}

impl Starter {
    /// A starter with no device yet and no thread serving it.
    pub fn new() -> Result<Starter, VirtioError> {
        Ok(Starter {
            shared: Arc::new(Shared {
                // Blocking: the control thread sleeps in read(2) until woken.
                wake: EventFd::new(0).map_err(VirtioError::os("starter eventfd"))?,
                stopping: AtomicBool::new(false),
                slots: Mutex::new(Vec::new()),
            }),
        })
    }

    /// A new slot served by this starter (at device creation, before any vCPU runs).
    pub(crate) fn slot(&self) -> SharedSlot {
        let slot = SharedSlot::default();
        self.shared.slots.locked().push(Arc::downgrade(&slot));
        slot
    }

    /// Wakes the control thread (a vCPU thread, after leaving a pending worker in a slot).
    /// Never blocks: the counter cannot reach its 2^64 - 1 limit one increment at a time
    /// between two reads.
    pub(crate) fn wake(&self) {
        if let Err(e) = self.shared.wake.write(1) {
            tracing::warn!("virtio: cannot wake the device control thread: {e}");
        }
    }

    /// The control thread's loop: sleeps until woken, starts every pending worker, until
    /// [`StarterThread::stop`]. Call with the thread's seccomp filter installed.
    pub fn serve(&self) {
        loop {
            match self.shared.wake.read() {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("virtio: device control thread: {e}; it exits");
                    return;
                }
            }
            if self.shared.stopping.load(Ordering::SeqCst) {
                return;
            }
            self.start_pending();
        }
    }

    /// Starts every pending worker now, on the calling thread.
    pub fn start_pending(&self) {
        let slots: Vec<SharedSlot> = self
            .shared
            .slots
            .locked()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for slot in &slots {
            slot.locked().start();
        }
    }

    /// Starts the thread that serves this starter, named `name`; it installs the seccomp
    /// filter of the device control thread first.
    pub fn spawn(&self, name: String) -> Result<StarterThread, VirtioError> {
        let starter = self.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                vm_jail::seccomp::apply_or_exit(vm_jail::seccomp::ThreadKind::DeviceControl);
                starter.serve();
            })
            .map_err(VirtioError::os("device control thread"))?;
        Ok(StarterThread {
            starter: self.clone(),
            thread: Some(thread),
        })
    }
}

/// The running control thread of a [`Starter`]; stopped (and joined) on drop.
#[derive(Debug)]
pub struct StarterThread {
    starter: Starter,
    thread: Option<JoinHandle<()>>,
}

impl StarterThread {
    /// Stops the thread and waits for it (idempotent). Workers it started keep running until
    /// their devices are shut down.
    pub fn stop(&mut self) {
        self.starter.shared.stopping.store(true, Ordering::SeqCst);
        self.starter.wake();
        let _ = super::worker::join_logged(self.thread.take(), "the device control thread");
    }
}

impl Drop for StarterThread {
    fn drop(&mut self) {
        self.stop();
    }
}

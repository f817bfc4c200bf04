//! The per-device worker thread: an epoll loop over the queue-notify events, a stop event, a
//! request event and the handler's own file descriptors. It sleeps in `epoll_wait` until
//! something happens or until the handler's next deadline; it never polls.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use virtio_queue::Queue;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::queue::{self, Buf};
use super::{GuestMemoryMmap, VirtioError};
use crate::metrics::DeviceMetrics;
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};

/// Token of the stop event.
const TOKEN_STOP: u64 = u64::MAX;
/// Token of the request event (e.g. vsock transport reset).
const TOKEN_REQUEST: u64 = u64::MAX - 1;
/// Tokens at or above this value (and below the two above) belong to the handler.
pub const HANDLER_TOKEN_BASE: u64 = 1 << 32;

/// The interrupt line of a device: the interrupt status register plus the irqfd.
pub struct Interrupt {
    status: AtomicU32,
    needs_reset: AtomicBool,
    evt: EventFd,
}

impl Interrupt {
    pub(crate) fn new() -> Result<Self, VirtioError> {
        Ok(Interrupt {
            status: AtomicU32::new(0),
            needs_reset: AtomicBool::new(false),
            evt: EventFd::new(EFD_NONBLOCK).map_err(VirtioError::os("irq eventfd"))?,
        })
    }

    /// Set `bits` in the interrupt status and raise the interrupt.
    pub fn raise(&self, bits: u32) {
        self.status.fetch_or(bits, Ordering::SeqCst);
        if let Err(e) = self.evt.write(1) {
            crate::warn_limited!(None, "virtio: cannot signal irqfd: {e}");
        }
    }

    /// Signal that used buffers were added.
    pub fn signal_used(&self) {
        self.raise(VIRTIO_MMIO_INT_VRING);
    }

    /// Enter DEVICE_NEEDS_RESET (the guest drove the device wrongly) and tell the driver.
    pub fn set_needs_reset(&self) {
        if !self.needs_reset.swap(true, Ordering::SeqCst) {
            crate::warn_limited!(None, "virtio: device needs reset (invalid guest input)");
            self.raise(VIRTIO_MMIO_INT_CONFIG);
        }
    }

    pub(crate) fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::SeqCst)
    }

    pub(crate) fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    pub(crate) fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    pub(crate) fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
        self.needs_reset.store(false, Ordering::SeqCst);
    }

    /// Set the saved interrupt status and DEVICE_NEEDS_RESET (a restore), raising nothing.
    pub(crate) fn restore(&self, status: u32, needs_reset: bool) {
        self.status.store(status, Ordering::SeqCst);
        self.needs_reset.store(needs_reset, Ordering::SeqCst);
    }

    pub(crate) fn event(&self) -> &EventFd {
        &self.evt
    }
}

/// What a handler gets to work with.
pub struct Ctx<'a> {
    /// Guest memory.
    pub mem: &'a GuestMemoryMmap,
    /// The device's queues, configured and validated by the transport.
    pub queues: &'a mut [Queue],
    /// The interrupt line.
    pub irq: &'a Interrupt,
    /// The worker's epoll set, for the handler's own descriptors (tokens from
    /// [`HANDLER_TOKEN_BASE`]).
    pub epoll: &'a Epoll,
    /// The device's counters.
    pub metrics: &'a DeviceMetrics,
}

impl Ctx<'_> {
    /// Serves every available request on the request/response queue `index`: pops each chain,
    /// answers it with `serve` (which gets the chain's buffers and the device's counters and
    /// returns the bytes written; a malformed chain is answered with length 0), puts it on the
    /// used ring, and raises one interrupt if the driver wants it. A broken queue sets
    /// DEVICE_NEEDS_RESET. Each chain counts as a request (with the bytes written), a
    /// malformed one or a broken queue as an error; their warnings are rate-limited.
    pub fn serve_requests(
        &mut self,
        index: usize,
        device: &str,
        mut serve: impl FnMut(&[Buf], &GuestMemoryMmap, &DeviceMetrics) -> u32,
    ) {
        let Some(q) = self.queues.get_mut(index) else {
            return;
        };
        let mut used = false;
        loop {
            let chain = match queue::pop_chain(q, self.mem) {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    self.metrics.error();
                    crate::warn_limited!(Some(self.metrics), "{device}: {e}");
                    self.irq.set_needs_reset();
                    return;
                }
            };
            let len = match &chain.bufs {
                Ok(bufs) => serve(bufs, self.mem, self.metrics),
                Err(e) => {
                    self.metrics.error();
                    crate::warn_limited!(Some(self.metrics), "{device}: malformed request: {e}");
                    0
                }
            };
            self.metrics.request(u64::from(len));
            if queue::add_used(q, self.mem, chain.head, len).is_err() {
                self.irq.set_needs_reset();
                return;
            }
            used = true;
        }
        if used && queue::needs_notification(q, self.mem) {
            self.irq.signal_used();
        }
    }

    /// Add, modify or remove a handler descriptor in the epoll set.
    pub fn epoll_ctl(&self, op: ControlOperation, fd: RawFd, events: EventSet, token: u64) {
        if let Err(e) = self.epoll.ctl(op, fd, EpollEvent::new(events, token)) {
            tracing::debug!("virtio: epoll_ctl failed: {e}");
        }
    }
}

/// The event-handling side of an activated device.
pub trait Handler: Send {
    /// Called once in the worker thread before the loop starts.
    fn start(&mut self, _ctx: &mut Ctx<'_>) {}
    /// The driver notified queue `index`.
    fn queue_notify(&mut self, index: usize, ctx: &mut Ctx<'_>);
    /// A handler descriptor is ready.
    fn fd_event(&mut self, _token: u64, _events: EventSet, _ctx: &mut Ctx<'_>) {}
    /// The earliest deadline at which [`Handler::timeout`] must run.
    fn deadline(&self) -> Option<Instant> {
        None
    }
    /// A deadline passed.
    fn timeout(&mut self, _ctx: &mut Ctx<'_>) {}
    /// The VMM asked for a device-specific action (vsock: transport reset event).
    fn request(&mut self, _ctx: &mut Ctx<'_>) {}
}

/// Builds a device's handler on the device control thread (see `VirtioDevice::activate`).
pub type MakeHandler = Box<dyn FnOnce() -> Box<dyn Handler> + Send>;

/// A running worker thread.
pub(crate) struct Worker {
    stop: EventFd,
    /// Hands the queues back when it ends (their positions final: see `mmio/persist.rs`).
    thread: Option<JoinHandle<Vec<Queue>>>,
}

/// Everything a worker thread owns: its I/O, how to build its handler, and the seccomp filter
/// it installs.
pub(crate) struct WorkerSetup {
    pub io: WorkerIo,
    pub handler: MakeHandler,
    pub kind: vm_jail::seccomp::ThreadKind,
}

/// A worker thread's guest memory, queues, events and counters.
pub(crate) struct WorkerIo {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<Queue>,
    pub notify: Vec<EventFd>,
    pub request: EventFd,
    pub irq: Arc<Interrupt>,
    pub metrics: Arc<DeviceMetrics>,
}

impl Worker {
    /// Builds the handler of `setup` and starts its thread as `name` (on the device control
    /// thread).
    pub(crate) fn spawn(setup: WorkerSetup, name: String) -> Result<Worker, VirtioError> {
        let WorkerSetup { io, handler, kind } = setup;
        let handler = handler();
        let stop = EventFd::new(EFD_NONBLOCK).map_err(VirtioError::os("stop eventfd"))?;
        let epoll = Epoll::new().map_err(VirtioError::os("epoll"))?;
        let add = |fd: RawFd, token: u64| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(VirtioError::os("epoll registration"))
        };
        for (i, evt) in io.notify.iter().enumerate() {
            add(evt.as_raw_fd(), i as u64)?;
        }
        add(stop.as_raw_fd(), TOKEN_STOP)?;
        add(io.request.as_raw_fd(), TOKEN_REQUEST)?;
        let thread_stop = stop.try_clone().map_err(VirtioError::os("stop eventfd"))?;
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(io, handler, epoll, thread_stop, kind))
            .map_err(VirtioError::os("worker thread"))?;
        Ok(Worker {
            stop,
            thread: Some(thread),
        })
    }

    /// Stop the thread and wait for it.
    pub(crate) fn stop(&mut self) {
        let _ = self.stop_and_take_queues();
    }

    /// Stop the thread, wait for it and take back its queues (`None` if it panicked or was
    /// already stopped).
    pub(crate) fn stop_and_take_queues(&mut self) -> Option<Vec<Queue>> {
        let _ = self.stop.write(1);
        join_logged(self.thread.take(), "worker thread")
    }
}

/// Waits for `thread` (if any), logging a panic of `what`; what the thread returned.
pub(crate) fn join_logged<T>(thread: Option<JoinHandle<T>>, what: &str) -> Option<T> {
    match thread?.join() {
        Ok(v) => Some(v),
        Err(_) => {
            crate::error_limited!(None, "virtio: {what} panicked");
            None
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The loop; returns the queues when stopped (or when epoll fails).
fn run(
    mut s: WorkerIo,
    mut handler: Box<dyn Handler>,
    epoll: Epoll,
    stop: EventFd,
    kind: vm_jail::seccomp::ThreadKind,
) -> Vec<Queue> {
    vm_jail::seccomp::apply_or_exit(kind);
    let mut events = vec![EpollEvent::default(); 64];
    {
        let mut ctx = Ctx {
            mem: &s.mem,
            queues: &mut s.queues,
            irq: &s.irq,
            epoll: &epoll,
            metrics: &s.metrics,
        };
        handler.start(&mut ctx);
    }
    loop {
        let timeout_ms = match handler.deadline() {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so a deadline is never polled early in a tight loop.
                i32::try_from(left.as_millis().saturating_add(1)).unwrap_or(i32::MAX)
            }
        };
        let n = match epoll.wait(timeout_ms, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!("virtio: epoll_wait failed: {e}; worker exits");
                return s.queues;
            }
        };
        let mut ctx = Ctx {
            mem: &s.mem,
            queues: &mut s.queues,
            irq: &s.irq,
            epoll: &epoll,
            metrics: &s.metrics,
        };
        for ev in &events[..n] {
            match ev.data() {
                TOKEN_STOP => {
                    let _ = stop.read();
                    return s.queues;
                }
                TOKEN_REQUEST => {
                    let _ = s.request.read();
                    handler.request(&mut ctx);
                }
                t if t < HANDLER_TOKEN_BASE => {
                    let i = t as usize;
                    if let Some(evt) = s.notify.get(i) {
                        let _ = evt.read();
                    }
                    // In DEVICE_NEEDS_RESET the queues stay untouched until the driver resets
                    // the device: a guest that keeps notifying a broken queue costs one eventfd
                    // read, never another walk of its rings or another log line.
                    if !ctx.irq.needs_reset() {
                        handler.queue_notify(i, &mut ctx);
                    }
                }
                t => handler.fd_event(t, ev.event_set(), &mut ctx),
            }
        }
        if handler.deadline().is_some_and(|d| d <= Instant::now()) {
            handler.timeout(&mut ctx);
        }
    }
}

//! The vsock device as a vhost-user backend (`vm-vsock`, the tcg driver's QEMU talks to it):
//! the same [`Muxer`] the in-process virtio-mmio device runs, driven through
//! rust-vmm's `vhost-user-backend` instead of our worker thread.
//!
//! - QEMU owns the virtqueues' configuration and sends it over the vhost-user socket; the
//!   library keeps each queue in a `VringMutex` and calls [`VsockBackend`]'s `handle_event`
//!   when the guest kicks one. [`VringIo`] lends those queues to the muxer through
//!   [`VsockQueues`], with the same validation the mmio transport does: a queue is served only
//!   while it is enabled, ready and lies in guest RAM ([`virtio_queue::QueueT::is_valid`]),
//!   and every chain goes through `queue::pop_chain`.
//! - The muxer's own descriptors (the hybrid-vsock listener, host clients, connections) sit in
//!   an epoll set of their own, with a timerfd for its deadlines; that epoll fd is one listener
//!   of the library's event loop ([`BACKEND_EVENT`]), so one thread runs everything and the
//!   muxer's 64-bit tokens never meet the library's 16-bit event ids.
//! - A guest that breaks a queue gets what DEVICE_NEEDS_RESET gives it on mmio: its queues
//!   are no longer served until QEMU resets the device; the process keeps running for nobody
//!   else (one backend process per VM).
//!
//! [`run`] binds the hybrid socket, serves one QEMU connection and returns when QEMU hangs up.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackendMut, VhostUserDaemon, VringMutex, VringState, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use super::muxer::Muxer;
use super::transport::VsockQueues;
use crate::virtio::queue::{self, Chain, QueueError};
use crate::virtio::{GuestMemoryMmap, VirtioError, read_config_bytes};

#[cfg(test)]
mod tests;

/// The guest memory as the library shares it.
pub type Gm = GuestMemoryAtomic<GuestMemoryMmap>;
/// One queue as the library keeps it.
pub type Vring = VringMutex<Gm>;

/// RX, TX and event queues.
pub const NUM_QUEUES: usize = 3;
/// Largest queue QEMU may configure: its `vhost-user-vsock-device` sets 1024 entries (seen
/// from QEMU 7.2: `SET_VRING_NUM` 1024; a smaller maximum makes the library refuse it and
/// close the connection). A chain is still at most `queue::MAX_CHAIN_LEN` descriptors.
pub const MAX_QUEUE_SIZE: usize = 1024;
/// The library's event id of our epoll set (ids up to `NUM_QUEUES` are its own).
pub const BACKEND_EVENT: u16 = NUM_QUEUES as u16 + 1;
/// The timerfd's token in our epoll set (the muxer's own start at `HANDLER_TOKEN_BASE`).
const TOKEN_TIMER: u64 = 1;
/// Longest configuration read answered (the vsock config space is 8 bytes).
const MAX_CONFIG_READ: usize = 256;

/// Descriptors the backend keeps for itself beyond its connections: stdio, the vhost-user
/// socket, QEMU's memory-region fds, two eventfds per queue, the epoll sets and timer, the
/// hybrid listener, and two for host clients past the cap (one held until it speaks, one
/// accepted only to be closed).
pub const OWN_FDS: u64 = 64;

/// The descriptor budget: the soft `RLIMIT_NOFILE` to set (raised toward the hard limit as far
/// as the full cap needs) and the connection cap that limit leaves room for, so connections
/// alone can never make `accept` fail with `EMFILE`. `None`: not even one connection fits.
pub fn fd_budget(soft: u64, hard: u64) -> Option<(u64, usize)> {
    let want = super::muxer::MAX_CONNECTIONS as u64 + OWN_FDS;
    let soft = soft.max(want.min(hard));
    let cap = soft.checked_sub(OWN_FDS).filter(|c| *c > 0)?;
    Some((soft, cap.min(super::muxer::MAX_CONNECTIONS as u64) as usize))
}

/// Why the backend could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum VhostUserError {
    /// An invalid guest CID, or the hybrid socket could not be bound.
    #[error("vsock device")]
    Device(#[from] VirtioError),
    /// Creating an epoll set or timer failed.
    #[error("cannot create {what}")]
    Os {
        /// What was being created.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The vhost-user library failed (its error does not implement `Error`: kept as text).
    #[error("vhost-user: {0}")]
    Daemon(String),
}

fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> VhostUserError {
    move |source| VhostUserError::Os { what, source }
}

/// What [`run`] serves.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// The guest's CID (3 and up).
    pub guest_cid: u64,
    /// The vhost-user socket QEMU connects to (created here).
    pub socket: PathBuf,
    /// The hybrid-vsock socket host clients connect to (created here, removed at the end).
    pub uds_path: PathBuf,
    /// The connection cap ([`Muxer::with_max_connections`]).
    pub max_connections: usize,
}

/// The vhost-user vsock backend: a muxer, its epoll set and deadline timer, and the guest
/// memory QEMU shared.
pub struct VsockBackend {
    muxer: Muxer,
    config: [u8; 8],
    mem: Option<Gm>,
    /// Stands in for guest memory before QEMU sent its table (no queue is served then).
    no_mem: GuestMemoryMmap,
    epoll: Epoll,
    timer: TimerFd,
    timer_at: TimerState,
    broken: AtomicBool,
}

/// What the timerfd is set to. A fired timerfd stays readable (and our epoll set with it)
/// until it is set again, so `Fired` must always be followed by a `reset` or a `clear`:
/// leaving it fired once the last deadline passed spun the backend at 40 % of a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerState {
    Clear,
    Armed(Instant),
    Fired,
}

impl VsockBackend {
    /// A backend for guest `guest_cid` serving the bound hybrid socket `listener`, with at
    /// most `max_connections` connections.
    pub fn new(
        guest_cid: u64,
        listener: std::os::unix::net::UnixListener,
        max_connections: usize,
    ) -> Result<Self, VhostUserError> {
        if guest_cid < 3 || guest_cid > u64::from(u32::MAX) {
            return Err(VirtioError::InvalidCid(guest_cid).into());
        }
        let epoll = Epoll::new().map_err(os("epoll"))?;
        let timer = TimerFd::new()
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
            .map_err(os("timerfd"))?;
        epoll
            .ctl(
                ControlOperation::Add,
                timer.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TOKEN_TIMER),
            )
            .map_err(os("epoll registration"))?;
        let mut b = VsockBackend {
            muxer: Muxer::new(guest_cid, listener).with_max_connections(max_connections),
            config: guest_cid.to_le_bytes(),
            mem: None,
            no_mem: GuestMemoryMmap::default(),
            epoll,
            timer,
            timer_at: TimerState::Clear,
            broken: AtomicBool::new(false),
        };
        {
            let mut io = VringIo::idle(&b.no_mem, &b.epoll, &b.broken);
            b.muxer.start_io(&mut io);
        }
        Ok(b)
    }

    /// The epoll set the library's event loop must watch as [`BACKEND_EVENT`].
    pub fn epoll_fd(&self) -> std::os::fd::RawFd {
        self.epoll.as_raw_fd()
    }

    /// The muxer (for tests and diagnostics).
    pub fn muxer(&self) -> &Muxer {
        &self.muxer
    }

    /// Arms the timer for the muxer's next deadline, or clears it when there is none (setting
    /// it either way also makes a fired one unreadable again).
    fn arm_timer(&mut self) {
        let want = match self.muxer.next_deadline() {
            Some(at) => TimerState::Armed(at),
            None => TimerState::Clear,
        };
        if want == self.timer_at {
            return;
        }
        let r = match want {
            TimerState::Armed(at) => {
                let left = at.saturating_duration_since(Instant::now());
                self.timer.reset(left.max(Duration::from_millis(1)), None)
            }
            TimerState::Clear | TimerState::Fired => self.timer.clear(),
        };
        match r {
            Ok(()) => self.timer_at = want,
            Err(e) => crate::warn_limited!(None, "vm-vsock: cannot arm the deadline timer: {e}"),
        }
    }
}

/// Runs the muxer on what our epoll set reports, then on deadlines that passed.
fn dispatch(muxer: &mut Muxer, epoll: &Epoll, io: &mut VringIo<'_>, timer_fired: &mut bool) {
    let mut events = [EpollEvent::default(); 64];
    let n = match epoll.wait(0, &mut events) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
        Err(e) => {
            crate::warn_limited!(None, "vm-vsock: epoll_wait: {e}");
            0
        }
    };
    for ev in &events[..n] {
        match ev.data() {
            TOKEN_TIMER => *timer_fired = true,
            t => muxer.socket_event(t, ev.event_set(), io),
        }
    }
}

impl VhostUserBackendMut for VsockBackend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
    }

    fn set_event_idx(&mut self, _enabled: bool) {
        // Not offered: `needs_notification` follows whatever the queue was told.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let size = usize::try_from(size).map_or(0, |s| s.min(MAX_CONFIG_READ));
        let mut out = vec![0u8; size];
        read_config_bytes(&self.config, u64::from(offset), &mut out);
        out
    }

    fn reset_device(&mut self) {
        self.muxer.drop_all();
        self.broken.store(false, Ordering::SeqCst);
    }

    fn update_memory(&mut self, mem: Gm) -> std::io::Result<()> {
        self.mem = Some(mem);
        Ok(())
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        let guard = self.mem.as_ref().map(|m| m.memory());
        let mut timer_fired = false;
        {
            let mut io = match guard.as_deref() {
                Some(mem) => VringIo::new(mem, vrings, &self.epoll, &self.broken),
                None => VringIo::idle(&self.no_mem, &self.epoll, &self.broken),
            };
            match device_event {
                q if usize::from(q) < NUM_QUEUES => self.muxer.queue_event(usize::from(q), &mut io),
                BACKEND_EVENT => dispatch(&mut self.muxer, &self.epoll, &mut io, &mut timer_fired),
                _ => {}
            }
            if self
                .muxer
                .next_deadline()
                .is_some_and(|d| d <= Instant::now())
            {
                self.muxer.expire(&mut io);
            }
        }
        if timer_fired {
            self.timer_at = TimerState::Fired;
        }
        self.arm_timer();
        // Never an error: the library would end its event loop for good.
        Ok(())
    }
}

/// The library's queues, locked for one event, as the muxer's [`VsockQueues`].
pub struct VringIo<'a> {
    mem: &'a GuestMemoryMmap,
    rings: Vec<MutexGuard<'a, VringState<Gm>>>,
    epoll: &'a Epoll,
    broken: &'a AtomicBool,
}

impl<'a> VringIo<'a> {
    /// The queues of `vrings` over `mem`.
    pub fn new(
        mem: &'a GuestMemoryMmap,
        vrings: &'a [Vring],
        epoll: &'a Epoll,
        broken: &'a AtomicBool,
    ) -> Self {
        VringIo {
            mem,
            rings: vrings.iter().map(|v| v.get_mut()).collect(),
            epoll,
            broken,
        }
    }

    /// No queue at all (before QEMU shared guest memory): pops find nothing.
    pub fn idle(mem: &'a GuestMemoryMmap, epoll: &'a Epoll, broken: &'a AtomicBool) -> Self {
        VringIo {
            mem,
            rings: Vec::new(),
            epoll,
            broken,
        }
    }

    /// Queue `q` if it may be served now: the device is not broken, QEMU enabled the ring and
    /// its rings lie in guest memory.
    fn usable(&mut self, q: usize) -> Option<&mut VringState<Gm>> {
        if self.broken.load(Ordering::SeqCst) {
            return None;
        }
        let mem = self.mem;
        let ring = self.rings.get_mut(q)?;
        (ring.is_enabled() && ring.get_queue().is_valid(mem)).then_some(&mut **ring)
    }
}

impl VsockQueues for VringIo<'_> {
    fn mem(&self) -> &GuestMemoryMmap {
        self.mem
    }

    fn pop(&mut self, q: usize) -> Result<Option<Chain>, QueueError> {
        let mem = self.mem;
        match self.usable(q) {
            Some(ring) => queue::pop_chain(ring.get_queue_mut(), mem),
            None => Ok(None),
        }
    }

    fn undo_pop(&mut self, q: usize) {
        if let Some(ring) = self.rings.get_mut(q) {
            queue::undo_pop(ring.get_queue_mut());
        }
    }

    fn add_used(&mut self, q: usize, head: u16, len: u32) -> Result<(), QueueError> {
        let mem = self.mem;
        match self.rings.get_mut(q) {
            Some(ring) => queue::add_used(ring.get_queue_mut(), mem, head, len),
            None => Err(QueueError::UsedRing),
        }
    }

    fn needs_notification(&mut self, q: usize) -> bool {
        let mem = self.mem;
        self.rings
            .get_mut(q)
            .is_none_or(|ring| queue::needs_notification(ring.get_queue_mut(), mem))
    }

    fn signal_used(&mut self, q: usize) {
        if let Some(ring) = self.rings.get(q)
            && let Err(e) = ring.signal_used_queue()
        {
            tracing::debug!("vm-vsock: cannot signal queue {q}: {e}");
        }
    }

    fn set_needs_reset(&self) {
        if !self.broken.swap(true, Ordering::SeqCst) {
            crate::warn_limited!(
                None,
                "vm-vsock: the guest broke a queue; serving none until a reset"
            );
        }
    }

    fn epoll_ctl(
        &self,
        op: ControlOperation,
        fd: std::os::fd::RawFd,
        events: EventSet,
        token: u64,
    ) {
        if let Err(e) = self.epoll.ctl(op, fd, EpollEvent::new(events, token)) {
            tracing::debug!("vm-vsock: epoll_ctl failed: {e}");
        }
    }
}

/// Binds the hybrid socket, serves one QEMU connection on `cfg.socket` until QEMU hangs up,
/// and removes the hybrid socket.
pub fn run(cfg: &BackendConfig) -> Result<(), VhostUserError> {
    let listener = super::unix::bind(&cfg.uds_path)?;
    let result = serve(cfg, listener);
    let _ = std::fs::remove_file(&cfg.uds_path);
    result
}

fn serve(
    cfg: &BackendConfig,
    listener: std::os::unix::net::UnixListener,
) -> Result<(), VhostUserError> {
    let backend = VsockBackend::new(cfg.guest_cid, listener, cfg.max_connections)?;
    let epoll_fd = backend.epoll_fd();
    let backend = Arc::new(RwLock::new(backend));
    let daemon_err = |e: vhost_user_backend::Error| VhostUserError::Daemon(e.to_string());
    let mut daemon = VhostUserDaemon::new(
        "vm-vsock".into(),
        backend,
        GuestMemoryAtomic::new(GuestMemoryMmap::default()),
    )
    .map_err(daemon_err)?;
    let handlers = daemon.get_epoll_handlers();
    let Some(handler) = handlers.first() else {
        return Err(VhostUserError::Daemon("no event loop thread".into()));
    };
    handler
        .register_listener(epoll_fd, EventSet::IN, u64::from(BACKEND_EVENT))
        .map_err(os("event loop registration"))?;
    daemon.serve(&cfg.socket).map_err(daemon_err)
}

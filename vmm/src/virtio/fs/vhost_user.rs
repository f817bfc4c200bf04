//! The read-only file server as a vhost-user backend (`vm-virtiofs`, one process per host
//! mount; the tcg driver's QEMU talks to it through its `vhost-user-fs-device`).
//!
//! QEMU owns the queues' configuration and sends it over the vhost-user socket; rust-vmm's
//! `vhost-user-backend` keeps each queue in a `VringMutex` and calls
//! [`FsBackend::handle_event`] when the guest kicks one. A queue is served only while QEMU has
//! enabled it and its rings lie in guest memory; every chain goes through `queue::pop_chain`
//! (bounded, every buffer inside guest RAM) and [`super::serve_chain`]. A guest that breaks a
//! queue (an available index running ahead, a used ring outside RAM) gets what
//! DEVICE_NEEDS_RESET gives it on mmio: no queue is served until QEMU resets the device. QEMU
//! keeps the device's configuration (the tag) itself, so the backend offers no config space.
//! QEMU 7.2 has no DAX window for this device: `SETUPMAPPING` is `ENOSYS` here.
//!
//! [`run`] opens the share, serves one QEMU connection on the socket and returns when QEMU
//! hangs up.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackendMut, VhostUserDaemon, VringMutex, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vm_sync::ReadWrite;
use vm_virtiofs::{Fs, Limits, Outcome, Server};
use vmm_sys_util::epoll::EventSet;

use super::{NUM_QUEUES, Scratch, serve_chain};
use crate::virtio::GuestMemoryMmap;
use crate::virtio::queue;

#[cfg(test)]
mod tests;

/// The guest memory as the library shares it.
pub type Gm = GuestMemoryAtomic<GuestMemoryMmap>;
/// One queue as the library keeps it.
pub type Vring = VringMutex<Gm>;

/// Largest queue QEMU may configure (its `vhost-user-fs-device` defaults to 128 entries and
/// allows up to 1024). A chain is still at most `queue::MAX_CHAIN_LEN` descriptors.
pub const MAX_QUEUE_SIZE: usize = 1024;

/// Why the backend could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum FsBackendError {
    /// The share could not be opened.
    #[error("share")]
    Share(#[from] vm_virtiofs::FsError),
    /// The vhost-user library failed (its error does not implement `Error`: kept as text).
    #[error("vhost-user: {0}")]
    Daemon(String),
}

/// What [`run`] serves.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// The vhost-user socket QEMU connects to (created here).
    pub socket: PathBuf,
    /// The host directory or file shared, read-only.
    pub share: PathBuf,
    /// The server's caps.
    pub limits: Limits,
}

/// What the backend has served, for its log line at the end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Requests answered (errors included).
    pub replies: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Malformed chains.
    pub malformed: u64,
}

/// The vhost-user file system backend: the server, and the guest memory QEMU shared.
pub struct FsBackend {
    server: Server,
    mem: Option<Gm>,
    scratch: Scratch,
    broken: bool,
    counters: Counters,
}

impl FsBackend {
    /// A backend serving `fs` (no DAX window: QEMU 7.2 has none for this device).
    pub fn new(fs: Fs) -> FsBackend {
        FsBackend {
            server: Server::new(fs, None),
            mem: None,
            scratch: Scratch::default(),
            broken: false,
            counters: Counters::default(),
        }
    }

    /// What it has served so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The server (for tests).
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Serves every available chain of queue `q`.
    fn serve_queue(&mut self, mem: &GuestMemoryMmap, vring: &Vring) {
        let mut state = vring.get_mut();
        if self.broken || !state.is_enabled() || !state.get_queue().is_valid(mem) {
            return;
        }
        let mut used = false;
        loop {
            let chain = match queue::pop_chain(state.get_queue_mut(), mem) {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    self.set_broken(&e.to_string());
                    return;
                }
            };
            let len = match &chain.bufs {
                Ok(bufs) => {
                    let (len, outcome) =
                        serve_chain(&mut self.server, mem, bufs, &mut self.scratch);
                    if let Outcome::Replied { errno, .. } = outcome {
                        self.counters.replies += 1;
                        self.counters.errors += u64::from(errno != 0);
                    }
                    len
                }
                Err(e) => {
                    self.counters.malformed += 1;
                    crate::warn_limited!(None, "vm-virtiofs: malformed request: {e}");
                    0
                }
            };
            if queue::add_used(state.get_queue_mut(), mem, chain.head, len).is_err() {
                self.set_broken("cannot add to the used ring");
                return;
            }
            used = true;
        }
        if used
            && queue::needs_notification(state.get_queue_mut(), mem)
            && let Err(e) = state.signal_used_queue()
        {
            tracing::debug!("vm-virtiofs: cannot signal a queue: {e}");
        }
    }

    fn set_broken(&mut self, why: &str) {
        if !self.broken {
            self.broken = true;
            crate::warn_limited!(
                None,
                "vm-virtiofs: the guest broke a queue ({why}); serving none until a reset"
            );
        }
    }
}

impl VhostUserBackendMut for FsBackend {
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
        VhostUserProtocolFeatures::empty()
    }

    fn set_event_idx(&mut self, _enabled: bool) {
        // Not offered: `needs_notification` follows whatever the queue was told.
    }

    fn reset_device(&mut self) {
        self.broken = false;
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
        let Some(mem) = self.mem.clone() else {
            return Ok(());
        };
        let mem = mem.memory();
        if let Some(vring) = vrings.get(usize::from(device_event)) {
            self.serve_queue(&mem, vring);
        }
        // Never an error: the library would end its event loop for good.
        Ok(())
    }
}

/// Opens the share, serves one QEMU connection on `cfg.socket` until QEMU hangs up.
pub fn run(cfg: &BackendConfig) -> Result<Counters, FsBackendError> {
    let fs = Fs::open(&cfg.share, cfg.limits)?;
    let backend = Arc::new(RwLock::new(FsBackend::new(fs)));
    let daemon_err = |e: vhost_user_backend::Error| FsBackendError::Daemon(e.to_string());
    let mut daemon = VhostUserDaemon::new(
        "vm-virtiofs".into(),
        backend.clone(),
        GuestMemoryAtomic::new(GuestMemoryMmap::default()),
    )
    .map_err(daemon_err)?;
    daemon.serve(&cfg.socket).map_err(daemon_err)?;
    let counters = backend.read_locked().counters();
    Ok(counters)
}

//! virtio-mmio devices: the transport (virtio 1.2, MMIO version 2) and the block, vsock and rng
//! devices a guest needs. There is no network device, by design.
//!
//! # Design
//!
//! The code is split the way Firecracker splits it: pure logic that parses and validates what
//! the guest put into memory, and event handling around it.
//!
//! - [`mmio`]: [`MmioDevice`], the register window (implements [`crate::bus::BusDevice`]). It owns
//!   the status handshake and feature negotiation, and the queue configuration. When the driver
//!   sets DRIVER_OK and every queue is valid it *activates* the device: the device builds a
//!   [`worker::Handler`] and one worker thread per device runs it, started by the VM's device
//!   control thread ([`starter`]), never by the vCPU thread that wrote DRIVER_OK.
//! - [`worker`]: the per-device thread. It waits with epoll on the queue-notify `EventFd`s (the
//!   VMM registers them as ioeventfds), a stop event, a request event and whatever file
//!   descriptors the handler adds (vsock sockets). It never busy-loops: it only wakes on events
//!   or on a deadline the handler asks for.
//! - [`queue`]: helpers over `virtio-queue`: collect a descriptor chain with every descriptor
//!   checked against guest RAM, its total length bounded, and loops/truncation detected.
//! - [`block`], [`vsock`], [`rng`], [`fs`]: the devices, each in its folder (model, worker
//!   handler, `persist.rs`); `block::request` and `vsock::packet`
//!   hold the pure parsers (fuzzed by the `fuzz/` crate), as `vm_virtiofs` does for [`fs`].
//! - [`persist`]: a device's snapshot state (identity, transport registers, queue
//!   positions) and its checks; `mmio/persist.rs` saves and restores it. Each device's
//!   identity (what it is, what a restore must match) is in its own folder's `persist.rs`.
//! - `test_utils` (feature `test-utils`, as rust-vmm's `virtio-queue` does it): a harness that
//!   plays the guest driver against a real `GuestMemoryMmap`; not in normal builds.
//!
//! Interrupts go through an `EventFd` ([`MmioDevice::interrupt_event`]) the VMM registers as an
//! irqfd; the interrupt status register is set before the event is signalled.
//!
//! A guest that drives a device wrongly gets a failed request (e.g. `VIRTIO_BLK_S_IOERR`) or the
//! device enters DEVICE_NEEDS_RESET; nothing it does can panic the VMM, make it allocate by a
//! guest-chosen size, or make it spin.
//!
//! # API
//! [`MmioDevice`]: `new`, `queue_notify_events` (ioeventfds at
//! `base + VIRTIO_MMIO_QUEUE_NOTIFY`), `interrupt_event`, `request_transport_reset`, `shutdown`.

pub mod block;
pub mod fs;
pub mod mmio;
pub mod persist;
pub mod queue;
pub mod rng;
pub mod starter;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;
pub mod vsock;
pub mod worker;

pub use mmio::{MmioDevice, PersistError};
pub use starter::{Starter, StarterThread};

/// The guest memory type devices use.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

use std::path::PathBuf;

pub use vm_vmm_protocol::config::DeviceConfig;

/// Errors of building or running a virtio device.
#[derive(Debug, thiserror::Error)]
pub enum VirtioError {
    /// Opening or inspecting a disk image failed.
    #[error("cannot open disk image {path}")]
    DiskOpen {
        /// The image path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A block device id longer than 20 bytes.
    #[error("block device id {0:?} is longer than 20 bytes")]
    BlockIdTooLong(String),
    /// A vsock guest CID below 3.
    #[error("invalid guest cid {0}")]
    InvalidCid(u64),
    /// Binding the vsock Unix socket failed.
    #[error("cannot bind vsock socket {path}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Creating an eventfd, epoll instance or thread failed.
    #[error("cannot create {what}")]
    Os {
        /// What was being created.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A queue could not be created.
    #[error("invalid queue")]
    Queue(#[source] virtio_queue::Error),
    /// An operation this device does not support.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// A virtio-fs tag that is empty or longer than 36 bytes.
    #[error("virtio-fs tag {0:?} is not 1-36 bytes")]
    InvalidTag(String),
    /// A virtio-fs share that cannot be opened.
    #[error("virtio-fs share")]
    Share(#[source] vm_virtiofs::FsError),
    /// The process's `RLIMIT_NOFILE` leaves a virtio-fs share too few descriptors to serve.
    #[error("RLIMIT_NOFILE leaves the virtio-fs share {have} descriptors (at least {need})")]
    Descriptors {
        /// What it was given.
        have: u64,
        /// The fewest it serves with.
        need: u64,
    },
    /// A virtio-fs session a snapshot kept that the share no longer matches.
    #[error("restoring the virtio-fs session")]
    Session(#[source] vm_virtiofs::fs::RestoreError),
    /// A DAX window that is not a multiple of 2 MiB, larger than the stride between windows,
    /// or that cannot be reserved.
    #[error("virtio-fs DAX window of {size} bytes")]
    Window {
        /// The size asked for.
        size: u64,
        /// The cause.
        #[source]
        source: nix::Error,
    },
}

impl VirtioError {
    pub(crate) fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> VirtioError {
        move |source| VirtioError::Os { what, source }
    }
}

/// A device model behind the MMIO transport.
pub(crate) trait VirtioDevice: Send {
    /// What the device is (its identity, `<device>/persist.rs`): its virtio type, queue sizes
    /// and offered features, and what a snapshot records of it. Fixed once the device is built.
    fn kind(&self) -> persist::DeviceKind;
    /// Read the device-specific configuration space.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Whether a worker started again after a snapshot (or from one) must tell the guest its
    /// connections are gone (vsock: `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`).
    fn resets_on_restart(&self) -> bool {
        false
    }
    /// The seccomp filter its worker thread installs.
    fn worker_kind(&self) -> vm_jail::seccomp::ThreadKind {
        vm_jail::seccomp::ThreadKind::Device
    }
    /// The shared-memory region `id` (guest physical base, length), if the device has one.
    fn shm_region(&self, _id: u32) -> Option<(u64, u64)> {
        None
    }
    /// Opens the host files the device serves (called once the VM process is jailed, before
    /// any vCPU runs: a file server opens its share inside the jail, through its read-only
    /// bind), holding at most `descriptors` of them open (its share of the process's
    /// `RLIMIT_NOFILE`: [`fs::descriptors_per_share`]).
    fn open_host_files(&mut self, _descriptors: u64) -> Result<(), VirtioError> {
        Ok(())
    }
    /// Whether the device serves host files ([`VirtioDevice::open_host_files`] opens some).
    fn serves_host_files(&self) -> bool {
        false
    }
    /// The file system session a snapshot keeps (virtio-fs), if any.
    fn save_session(&self) -> Option<vm_virtiofs::SessionState> {
        None
    }
    /// A saved session to rebuild when the host files are opened (a restore).
    fn restore_session(&mut self, _session: &vm_virtiofs::SessionState) {}
    /// The DAX window KVM must map (read-only) for this device, if any.
    fn window(&self) -> Option<&fs::Window> {
        None
    }
    /// What builds the handler that serves the queues; called on DRIVER_OK, on the vCPU
    /// thread that wrote it, so it only duplicates descriptors: the handler itself (its tables,
    /// whose hash seeds come from `getrandom`) is built on the device control thread.
    fn activate(&mut self, acked_features: u64) -> Result<worker::MakeHandler, VirtioError>;
}

/// Copy `src[offset..]` into `data`, zero-filling what lies outside `src`.
pub(crate) fn read_config_bytes(src: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(off) = usize::try_from(offset) else {
        return;
    };
    if off >= src.len() {
        return;
    }
    let n = data.len().min(src.len() - off);
    data[..n].copy_from_slice(&src[off..off + n]);
}

/// Build the device model for a configuration, as the VM's device `index` (a virtio-fs DAX
/// window sits at `layout::dax_window_base(index)`).
pub(crate) fn build_device(
    cfg: &DeviceConfig,
    index: usize,
) -> Result<Box<dyn VirtioDevice>, VirtioError> {
    Ok(match cfg {
        DeviceConfig::Block {
            path,
            read_only,
            id,
        } => Box::new(block::Block::new(&block::BlockConfig {
            path: path.clone(),
            read_only: *read_only,
            id: id.clone(),
        })?),
        DeviceConfig::Vsock {
            guest_cid,
            uds_path,
        } => Box::new(vsock::Vsock::new(*guest_cid, uds_path)?),
        DeviceConfig::Rng => Box::new(rng::Rng::new()),
        DeviceConfig::Fs {
            tag,
            share,
            max_inodes,
            dax_window,
        } => {
            let limits = vm_virtiofs::Limits {
                max_inodes: *max_inodes,
                ..vm_virtiofs::Limits::default()
            };
            let window = match *dax_window {
                0 => None,
                size => Some(fs::Window {
                    guest_base: crate::layout::dax_window_base(index),
                    mapping: std::sync::Arc::new(dax_mapping(size)?),
                }),
            };
            Box::new(fs::FsDevice::new(tag, share.clone(), limits, window)?)
        }
    })
}

/// A DAX window's host reservation of `size` bytes (checked against the layout).
fn dax_mapping(size: u64) -> Result<crate::sys::window::DaxMapping, VirtioError> {
    let fits = size.is_multiple_of(vm_virtiofs::dax::DAX_ALIGN)
        && size <= crate::layout::DAX_WINDOW_STRIDE;
    let err = |source| VirtioError::Window { size, source };
    if !fits {
        return Err(err(nix::Error::EINVAL));
    }
    crate::sys::window::DaxMapping::reserve(size).map_err(err)
}

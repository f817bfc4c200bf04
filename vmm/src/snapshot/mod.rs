//! Snapshot and restore of a VM and its virtio devices (issue #28, item 1).
//!
//! A snapshot is two files in a directory the caller gives, both created `0600` and never
//! overwritten: `vmstate`, the vCPU and VM-wide KVM state ([`state`], framed by
//! [`format`]: magic, version, postcard payload, SHA-256), and `memory`, the guest RAM
//! regions back to back in layout order (all-zero pages skipped, so the file is sparse).
//!
//! - [`RunningVm::snapshot`](crate::RunningVm::snapshot) ([`save`]): pause the vCPUs (they
//!   leave `KVM_RUN`, complete any exit in flight and park: `Control::pause`), have each read
//!   its own state on its own thread ([`vcpu::save`]), read the irqchip (both PICs, the
//!   IOAPIC), the PIT and the KVM clock, write `memory` then `vmstate`, then resume or stop
//!   the VM as asked ([`AfterSnapshot`]).
//! - [`Vm::restore`](crate::Vm::restore) ([`restore`]): read and check `vmstate` before
//!   anything is created, refuse a config whose vcpus, mem_mib or CPU profile differ (naming
//!   the field), create the KVM VM as `Vm::create` does, map `memory` `MAP_PRIVATE`
//!   (copy-on-write: the guest's writes never reach the file), set the irqchip and PIT,
//!   create the vCPUs with the CPUID boot gives them and their saved state, and set the clock
//!   last. The result is a [`Vm`](crate::Vm) ready for `start()`.
//!
//! Virtio devices (`crate::virtio::persist`, `virtio/mmio/persist.rs`): with the vCPUs
//! parked, each device's worker is stopped and hands its queues back, so the saved queue
//! positions are final; the state holds each device's identity (block: path, size, read-only;
//! vsock: guest CID), its transport registers and its queues. After the save a running VM's
//! workers start again through the starter. A restore rebuilds the devices from the config,
//! whose device list must be the snapshot's (count, then type and identity in order, a disk's
//! size checked once opened), sets their registers and queues, requests the workers of those
//! past DRIVER_OK (they start at `start()`) and signals a saved interrupt again. vsock
//! connections are not carried (host sockets cannot be): the device starts with none and
//! sends `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` (on the snapshot's own VM too, when it runs
//! on). A writable disk is refused ([`SnapshotError::Device`], `PersistError::Unsupported`):
//! its file goes on changing after the snapshot. The legacy devices keep nothing a restore
//! needs: the i8042 holds no state, and the serial port's registers (interrupt enable, line
//! control, divisor, scratch) start at their reset values in the restored VM while its
//! console ring starts empty; a guest driver that relies on a programmed interrupt enable
//! must program it again. The KVM state of the in-kernel devices (PIC, IOAPIC, PIT, LAPIC) is
//! saved.
//!
//! Through the `vm-vmm` process (`crate::process::snapshot`): the control commands
//! `snapshot` and `snapshot-stop` write into the one directory the launcher configured
//! (bound into the jail, with the snapshot system calls added to that VMM's seccomp filters
//! only), and `ProcessConfig::restore` restores at start. Not yet: the `vm` CLI has no
//! snapshot command.

pub mod files;
pub mod format;
pub mod memory_file;
mod restore;
mod save;
pub mod state;
pub mod vcpu;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use files::SnapshotFiles;
pub use format::StateError;
pub use restore::{FailedRestore, PendingRestore};
pub use state::{ConfigFacts, VcpuState, VmState};

use crate::control::PauseError;
use crate::vm::VmmError;

/// The state file's name inside a snapshot directory.
pub const STATE_FILE: &str = "vmstate";
/// The memory file's name inside a snapshot directory.
pub const MEMORY_FILE: &str = "memory";

/// The two files of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotPaths {
    /// The state file.
    pub state: PathBuf,
    /// The memory file.
    pub memory: PathBuf,
}

impl SnapshotPaths {
    /// `dir/vmstate` and `dir/memory`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            state: dir.join(STATE_FILE),
            memory: dir.join(MEMORY_FILE),
        }
    }
}

pub use vm_vmm_protocol::snapshot::AfterSnapshot;

/// What a snapshot wrote and how long it took.
#[derive(Clone, Debug)]
pub struct SnapshotInfo {
    /// Its files.
    pub paths: SnapshotPaths,
    /// Bytes of the state file.
    pub state_bytes: u64,
    /// Bytes of guest RAM (the memory file's length).
    pub memory_bytes: u64,
    /// Bytes of RAM actually written (pages that are not all zeros).
    pub memory_written: u64,
    /// From the pause request until every vCPU was parked.
    pub pause_latency: Duration,
    /// From the pause request until both files were written.
    pub took: Duration,
}

/// Errors of taking or restoring a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Something the snapshot cannot carry yet.
    #[error("cannot snapshot: {0}")]
    Unsupported(String),
    /// The VM has ended (or was never started).
    #[error("the VM is not running")]
    NotRunning,
    /// The vCPUs did not pause, or did not hand back their state.
    #[error("pausing the vCPUs")]
    Pause(#[source] PauseError),
    /// A vCPU's state could not be read or set.
    #[error("vcpu state")]
    Vcpu(#[source] vcpu::VcpuStateError),
    /// A KVM VM ioctl failed.
    #[error("{what} failed")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// Cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A file could not be created, written, read or mapped.
    #[error("{what} {path}")]
    Io {
        /// The operation.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot file or its directory is not the invoking user's own.
    #[error("{path} must belong to uid {owner} and be writable by no one else")]
    NotPrivate {
        /// The file or directory.
        path: PathBuf,
        /// The uid it must belong to (this process's effective uid).
        owner: u32,
        /// What is wrong with it.
        #[source]
        source: vm_sys::private::Refusal,
    },
    /// The state file is refused.
    #[error("state file {path}")]
    State {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: StateError,
    },
    /// The config to restore into differs from the snapshot's.
    #[error("snapshot has {field} {snapshot}, the config {config}")]
    Mismatch {
        /// The `VmConfig` field.
        field: &'static str,
        /// The snapshot's value.
        snapshot: String,
        /// The config's value.
        config: String,
    },
    /// The memory file does not hold exactly the RAM of the config's `mem_mib`.
    #[error("memory file {path} has {found} bytes, mem_mib {mem_mib} needs {expected}")]
    MemoryFileSize {
        /// The file.
        path: PathBuf,
        /// The config's guest RAM.
        mem_mib: u32,
        /// Bytes of RAM of `mem_mib`.
        expected: u64,
        /// The file's length.
        found: u64,
    },
    /// A device of the config differs from the snapshot's device at the same index.
    #[error("virtio device {index}: snapshot has {field} {snapshot}, the config {config}")]
    DeviceMismatch {
        /// Device index.
        index: usize,
        /// What differs: `type`, `path`, `read_only`, `guest_cid`.
        field: &'static str,
        /// The snapshot's value.
        snapshot: String,
        /// The config's value.
        config: String,
    },
    /// A virtio device could not be saved or restored.
    #[error("virtio device {index}")]
    Device {
        /// Its index in the config's device list.
        index: usize,
        /// Cause.
        #[source]
        source: crate::virtio::PersistError,
    },
    /// Creating the restored VM failed.
    #[error("creating the restored VM")]
    Vmm(#[source] Box<VmmError>),
}

impl From<VmmError> for SnapshotError {
    fn from(e: VmmError) -> Self {
        SnapshotError::Vmm(Box::new(e))
    }
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> SnapshotError {
    move |source| SnapshotError::Kvm { what, source }
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let path = path.to_path_buf();
    move |source| SnapshotError::Io { what, path, source }
}

//! `vm-drivers`: the backends that boot a guest, and the [`Machine`] they hand back.
//!
//! # Design
//!
//! A [`Driver`] is one way of running a guest kernel on this host. It is backend-neutral and
//! small: a name, the [`Containment`] it provides, a side-effect-free [`Driver::detect`] that
//! says in plain language whether it can run here and why, and [`Driver::boot`], which turns a
//! [`BootPlan`] into a running [`Machine`].
//!
//! | driver   | containment  | what it is |
//! |----------|--------------|------------|
//! | `kvm`    | `MicroVm`    | our `vmm`, one `vm-vmm` process per VM, on `/dev/kvm` backed by VT-x/AMD-V |
//! | `tcg`    | `UserKernel` | QEMU with software CPU emulation plus `vm-vsock` (our vsock device, vhost-user) |
//! | `hvf`    | `MicroVm`    | macOS Hypervisor.framework: detection only, boot is `Unsupported` |
//! | `hyperv` | `MicroVm`    | Windows Hypervisor Platform: not probed, boot is `Unsupported` |
//!
//! The [`Registry`] holds drivers in preference order and
//! [`Registry::select_first_available`] returns the first whose detection is OK, or a
//! [`NoDriverError`] carrying every driver's diagnosis. The registry only reports: it never
//! decides whether a driver is strong enough for some work (the admission gate in `vm-sandbox`
//! does, with `vm_spec::admit`), so there is no silent downgrade from `kvm` to `tcg` here.
//! `boot` does not re-check detection either, so tests can boot kernels on hosts where a driver
//! is not "available" in the policy sense (kvm on a PVM host).
//!
//! A [`Machine`] is driver-neutral: it owns a backend handle ([`VmHandle`]: the QEMU and
//! vm-vsock child processes for tcg, the `vm-vmm` process for kvm) and a
//! [`vm_agent_client::AgentClient`] over the VM's hybrid-vsock Unix socket. Everything a
//! caller does inside the guest goes through that client. The Machine enforces the wall-clock
//! lifetime itself: a watchdog thread tears the VM down at expiry whatever is happening, and
//! later calls fail with [`MachineError::WallExpired`]. [`Machine::close`] is idempotent and
//! `Drop` closes.
//!
//! Drivers create files only inside [`BootPlan::run_dir`] (`vhu.sock`, `vsock.sock`) and remove
//! what they created when the machine is closed.
//!
//! The API is the items below ([`Driver`], [`BootPlan`], [`Registry`], [`Machine`], [`sys`]);
//! their docs are the reference (no hand-written copy of the signatures to drift).

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use vm_agent_protocol::config::{DiskFs, ShareKind};
pub use vm_spec::Containment;
/// Connections a VM's vsock device holds at most (both drivers run the same device): what
/// the guest agent's connection budget and the hosts' forwards are sized under.
pub use vm_vmm_protocol::layout::VSOCK_MAX_CONNECTIONS;

mod boot;
pub use boot::KernelKind;
mod error;
pub mod hvf;
pub mod hyperv;
pub mod jail;
pub mod kvm;
mod machine;
mod pause;
mod process;
mod registry;
mod ring;
pub mod snapshot;
pub mod tcg;
#[cfg(test)]
mod test_support;

pub use boot::{attach_client, share_tag};
pub use error::DriverError;

impl BootPlan {
    /// Every read-only block device of the plan, in attachment order: the disks (`disk<N>`),
    /// then the root (`root`).
    pub fn block_devices(&self) -> Vec<BlockDevice> {
        let disks = self.disks.iter().enumerate().map(|(i, d)| BlockDevice {
            host_path: d.host_path.clone(),
            serial: boot::disk_id(i),
        });
        let root = self.rootfs.iter().map(|r| BlockDevice {
            host_path: r.host_path.clone(),
            serial: ROOT_DISK_SERIAL.into(),
        });
        disks.chain(root).collect()
    }
}
pub use hvf::HvfDriver;
pub use hyperv::HypervDriver;
pub use jail::JailReport;
pub use kvm::KvmDriver;
pub use machine::{Machine, MachineError, MachineInfo, Reports, VmHandle};
pub use registry::{NoDriverError, Registry};
pub use snapshot::{RestoreFrom, Snapshotted};
pub use tcg::TcgDriver;

/// Whether a driver can run a guest on this host right now, and why (or why not), in plain
/// language for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Availability {
    /// The driver can boot a guest here.
    pub ok: bool,
    /// What was found, or what is missing and how to fix it.
    pub detail: String,
}

impl Availability {
    /// An OK verdict.
    pub fn yes(detail: impl Into<String>) -> Availability {
        Availability {
            ok: true,
            detail: detail.into(),
        }
    }

    /// A not-OK verdict.
    pub fn no(detail: impl Into<String>) -> Availability {
        Availability {
            ok: false,
            detail: detail.into(),
        }
    }
}

/// One way of running a guest kernel (see the crate docs).
pub trait Driver: Send + Sync {
    /// The backend's short name: `kvm`, `tcg`, `hvf`, `hyperv`.
    fn name(&self) -> &'static str;
    /// The isolation a guest on this backend gets.
    fn containment(&self) -> Containment;
    /// Whether this backend can run here, without booting anything.
    fn detect(&self) -> Availability;
    /// Boots a guest and waits for its agent. An error means no guest is left running.
    fn boot(&self, plan: BootPlan) -> Result<Machine, DriverError>;
    /// The jail this driver builds around each VM's host processes (`None`: it boots nothing).
    fn jail(&self) -> Option<JailReport> {
        None
    }
    /// Most disks (the root included) one VM of this backend can have: each is a
    /// virtio-mmio device, and the machine has a fixed number of them. 0: not known (a
    /// caller that needs spare disks then has none).
    fn max_disks(&self) -> usize {
        0
    }
    /// The DAX window, in MiB, each read-only share of a VM with `mem_mib` of memory gets
    /// when `asked` (`None`: the driver's default; `Some(0)`: none), or why `asked` cannot be
    /// had here. The admission check before anything is created, and `boot`'s own first
    /// check: a window asked for is never dropped. Without one, a share is read into the
    /// guest's own page cache.
    fn dax_window_mib(&self, asked: Option<u32>, mem_mib: u32) -> Result<u32, DriverError> {
        let _ = mem_mib;
        no_dax_window(self.name(), asked, "it has no DAX window")
    }
    /// Whether this driver can snapshot its VMs and restore them here, and why not.
    fn snapshots(&self) -> Availability {
        Availability::no("this driver has no snapshots")
    }
    /// Starts `plan`'s VM from the snapshot in `from` instead of booting it, and hands the
    /// restored agent a new token (see [`snapshot`]). The plan must describe the VM the
    /// snapshot was taken of (vcpus, memory, the same disks in the same order); an error
    /// means no guest is left running.
    fn restore(&self, plan: BootPlan, from: &RestoreFrom) -> Result<Machine, DriverError> {
        let _ = (plan, from);
        Err(DriverError::Unsupported {
            driver: self.name(),
            reason: self.snapshots().detail,
        })
    }
}

/// [`Driver::dax_window_mib`] of a driver without DAX: none, and a window asked for is
/// refused, saying `why` there is none.
pub fn no_dax_window(
    driver: &'static str,
    asked: Option<u32>,
    why: &str,
) -> Result<u32, DriverError> {
    match asked {
        None | Some(0) => Ok(0),
        Some(mib) => Err(DriverError::Unsupported {
            driver,
            reason: format!("dax_window_mib: {mib} MiB asked for, and {why}"),
        }),
    }
}

impl std::fmt::Debug for dyn Driver + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.name())
            .field("containment", &self.containment())
            .finish()
    }
}

/// The guest images a boot uses. A driver reads the ones it needs: `kvm` boots `vmlinux`,
/// `tcg` boots `bz_image`; both load `initramfs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePaths {
    /// Uncompressed ELF kernel with a PVH note.
    pub vmlinux: PathBuf,
    /// Compressed kernel.
    pub bz_image: PathBuf,
    /// Uncompressed newc initramfs whose `/init` is the guest agent.
    pub initramfs: PathBuf,
}

impl ImagePaths {
    /// The standard file names inside an image directory (`<images dir>/<hash>` or `current`).
    /// A set without a `vmlinux` (`images/build.sh --kernel debian`: a distribution kernel,
    /// which comes compressed only) names its `bzImage` there too; the kvm driver refuses it
    /// by its initramfs (`KernelKind`).
    pub fn in_dir(dir: &Path) -> ImagePaths {
        let vmlinux = dir.join("vmlinux");
        ImagePaths {
            vmlinux: match vmlinux.is_file() {
                true => vmlinux,
                false => dir.join("bzImage"),
            },
            bz_image: dir.join("bzImage"),
            initramfs: dir.join("initramfs.cpio"),
        }
    }
}

/// The images directory: `$VM_IMAGES_DIR`, else `$XDG_CACHE_HOME/vm/images`, else
/// `$HOME/.cache/vm/images`. `None` when none of those variables is set.
pub fn default_images_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("VM_IMAGES_DIR") {
        return Some(d);
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return Some(d.join("vm/images"));
    }
    var("HOME").map(|h| h.join(".cache/vm/images"))
}

/// A host file exposed read-only to the guest and mounted by the agent at `guest_path`.
/// Disk `N` of a plan gets the virtio-blk serial `disk<N>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskPlan {
    /// The raw image file on the host (opened read-only).
    pub host_path: PathBuf,
    /// Absolute mount point inside the guest.
    pub guest_path: String,
    /// The filesystem the agent mounts it as.
    pub fs: DiskFs,
}

/// A host directory or file the guest reads through a read-only virtio-fs device (every host
/// mount), mounted by the agent at `guest_path`. Share `N` of a plan has the tag `fs<N>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharePlan {
    /// The host directory or regular file (its server holds it by descriptor, read-only).
    pub host_path: PathBuf,
    /// Absolute mount point inside the guest.
    pub guest_path: String,
    /// A directory, or one file (the guest sees a regular file at `guest_path`).
    pub kind: ShareKind,
}

/// The read-only image file that becomes the guest's root (the agent puts a tmpfs overlay
/// on it and runs every command inside). Its virtio-blk serial is [`ROOT_DISK_SERIAL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootfsPlan {
    /// The erofs or ext4 image file on the host (opened read-only).
    pub host_path: PathBuf,
    /// Erofs or ext4 (a raw root is refused by the agent configuration).
    pub fs: DiskFs,
}

/// The virtio-blk serial of the root disk.
pub const ROOT_DISK_SERIAL: &str = "root";

/// One read-only virtio-blk device as every backend attaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    pub host_path: PathBuf,
    /// The serial the guest agent finds it by.
    pub serial: String,
}

/// Everything a driver needs to boot one guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootPlan {
    /// A name for logs and the guest hostname (sanitized to `[A-Za-z0-9.-]`).
    pub name: String,
    /// Kernel and initramfs.
    pub images: ImagePaths,
    /// Virtual CPUs (at least 1).
    pub vcpus: u32,
    /// Guest memory in MiB.
    pub mem_mib: u32,
    /// `pids.max` for the guest's work cgroup (0 = the agent's default, no limit).
    pub pids_max: u32,
    /// Read-only disks, in order (erofs images: `--image` layers a root is made of, a mount
    /// that asked for an erofs copy; raw disks: a pod's spare disks).
    pub disks: Vec<DiskPlan>,
    /// Read-only virtio-fs shares, in order: every host mount but those that asked for an
    /// erofs copy.
    pub shares: Vec<SharePlan>,
    /// The image root, if any (else commands run in the initramfs).
    pub rootfs: Option<RootfsPlan>,
    /// A directory for this VM's sockets and logs; created if missing, and the driver creates
    /// files only here.
    pub run_dir: PathBuf,
    /// Wall-clock lifetime, counted from when `boot` returns the machine (the boot itself is
    /// bounded by `boot_timeout`); the machine is torn down when it expires.
    pub wall: Option<Duration>,
    /// How long to wait for the guest agent to answer after starting the VM.
    pub boot_timeout: Duration,
    /// Run the VM's processes without their jail when this host cannot build it (the caller's
    /// explicit choice, `--allow-weaker-jail`); otherwise such a boot is refused
    /// ([`DriverError::JailUnavailable`]).
    pub allow_weaker_jail: bool,
    /// The size of each share's DAX window in MiB, on a driver that has DAX (kvm): `None`, the
    /// driver's default ([`kvm::default_dax_window_mib`]); `Some(0)`, no window.
    pub dax_window_mib: Option<u32>,
    /// A VM that may be snapshotted ([`Machine::snapshot`]): its snapshot is written into this
    /// directory (absolute, empty, mode 0700). `None` keeps the snapshot's system calls and
    /// file writes out of the VM process's jail and filters.
    pub snapshot_dir: Option<PathBuf>,
}

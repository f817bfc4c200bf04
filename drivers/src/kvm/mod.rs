//! `kvm`: our VMM on `/dev/kvm`, one `vm-vmm` process per VM.
//!
//! Detection ([`detect`]) is a pure verdict over [`HostFacts`] gathered from the host. Only
//! `/dev/kvm` backed by hardware virtualization (VT-x/AMD-V) is OK; a PVM host in native mode
//! (this project's development machines) is *not*: guest kernels are interpreted there and
//! guest user space cannot run, so no agent could ever answer.
//!
//! [`KvmDriver::boot`] does not consult detection (selection does): it builds a
//! `vm_vmm_protocol::VmConfig` (the ELF `vmlinux`, the boot's initrd — the initramfs plus the agent token
//! archive, see `boot::boot_secret` —, one read-only virtio-blk per disk with
//! serial `disk<N>`, a hybrid vsock at `<run_dir>/vsock.sock` for guest CID 3, and an rng),
//! starts the VM in its own `vm-vmm` process (found by [`locate`]: `$VM_VMM_BIN`, next to the
//! running executable, or one directory up) and waits for the agent. The process's log goes
//! to `<run_dir>/vmm.log` ([`log`]), apart from the console.

pub mod detect;
pub(crate) mod locate;
pub(crate) mod log;
pub(crate) mod vm;

use vm_spec::Containment;

pub use detect::{HostFacts, KVM_API_VERSION, KvmDevice, classify};
pub use locate::{VIRTIOFS_BIN_ENV, VMM_BIN_ENV, VSOCK_BIN_ENV};

/// Disks (the root included) and shares a VM can have: every virtio-mmio device but the vsock
/// and the rng.
pub const MAX_DEVICES: usize = vm_vmm_protocol::layout::MAX_VIRTIO_DEVICES - 2;

/// The largest DAX window a share may have, in MiB (the distance between two windows).
pub const MAX_DAX_WINDOW_MIB: u32 = (vm_vmm_protocol::layout::DAX_WINDOW_STRIDE >> 20) as u32;

/// Each share's DAX window when the plan asks for no size: 1 GiB, or four times the guest's
/// RAM when that is less (the guest kernel spends 64 bytes of RAM on each 4 KiB page of the
/// window: a 1 GiB window costs it 16 MiB).
pub fn default_dax_window_mib(mem_mib: u32) -> u32 {
    1024.min(mem_mib.saturating_mul(4))
}

/// The window `asked` for (else [`default_dax_window_mib`]), when it fits the stride between
/// windows and is whole 2 MiB ranges (what the guest maps): refused by name, never rounded.
pub(crate) fn dax_window(asked: Option<u32>, mem_mib: u32) -> Result<u32, DriverError> {
    let mib = asked.unwrap_or_else(|| default_dax_window_mib(mem_mib));
    let why = if mib > MAX_DAX_WINDOW_MIB {
        format!("is over the {MAX_DAX_WINDOW_MIB} MiB a window may have")
    } else if !mib.is_multiple_of(2) {
        "is not a multiple of 2 MiB (the guest maps 2 MiB ranges)".to_string()
    } else {
        return Ok(mib);
    };
    Err(DriverError::InvalidPlan {
        reason: format!("dax_window_mib: {mib} MiB {why}"),
    })
}

use crate::{Availability, BootPlan, Driver, DriverError, Machine};

/// The KVM driver.
#[derive(Debug, Default, Clone, Copy)]
pub struct KvmDriver;

impl KvmDriver {
    /// The driver (stateless).
    pub fn new() -> KvmDriver {
        KvmDriver
    }
}

impl Driver for KvmDriver {
    fn name(&self) -> &'static str {
        "kvm"
    }

    fn containment(&self) -> Containment {
        Containment::MicroVm
    }

    fn detect(&self) -> Availability {
        classify(&HostFacts::gather())
    }

    fn boot(&self, plan: BootPlan) -> Result<Machine, DriverError> {
        vm::boot(plan)
    }

    fn jail(&self) -> Option<crate::JailReport> {
        Some(crate::jail::kvm_report())
    }

    /// Every virtio-mmio device but the vsock and the rng.
    fn max_disks(&self) -> usize {
        MAX_DEVICES
    }

    fn dax_window_mib(&self, asked: Option<u32>, mem_mib: u32) -> Result<u32, DriverError> {
        dax_window(asked, mem_mib)
    }

    fn snapshots(&self) -> Availability {
        Availability::yes(
            "vm-vmm writes the vCPU, device and memory state; restores map it copy-on-write",
        )
    }

    fn restore(&self, plan: BootPlan, from: &crate::RestoreFrom) -> Result<Machine, DriverError> {
        vm::restore(plan, from)
    }
}

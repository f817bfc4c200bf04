//! Guest RAM: allocation from a [`MemoryLayout`] and registration with KVM.

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::layout::MemoryLayout;

/// Guest memory type used throughout the VMM.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// Errors of setting up guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// Host allocation failed.
    #[error("cannot allocate guest memory")]
    Alloc(#[source] vm_memory::mmap::FromRangesError),
    /// KVM refused a memory slot.
    #[error("cannot register memory slot {slot}")]
    Register {
        /// Slot number.
        slot: u32,
        /// Cause.
        #[source]
        source: kvm_ioctls::Error,
    },
}

/// Allocate (lazily: anonymous, untouched pages cost nothing) the guest RAM of `layout`.
pub fn allocate(layout: &MemoryLayout) -> Result<GuestMemoryMmap, MemoryError> {
    GuestMemoryMmap::from_ranges(&layout.ranges()).map_err(MemoryError::Alloc)
}

/// Register every region of `mem` as a KVM memory slot.
pub fn register(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), MemoryError> {
    for (slot, region) in mem.iter().enumerate() {
        let slot = slot as u32;
        let desc = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
        };
        // SAFETY: the region is a live mapping of `memory_size` bytes owned by `mem`, which the
        // caller keeps alive as long as the VM fd (both are dropped together by `Vm`).
        unsafe { vm.set_user_memory_region(desc) }
            .map_err(|source| MemoryError::Register { slot, source })?;
    }
    Ok(())
}

//! Guest RAM: allocation from a [`MemoryLayout`] and registration with KVM (through
//! [`crate::sys::GuestVm`], which owns the two together).

use kvm_ioctls::VmFd;

use crate::layout::MemoryLayout;
use crate::sys::GuestVm;

/// Guest memory type used throughout the VMM.
pub use crate::sys::GuestMemoryMmap;

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

/// Register every region of `mem` as a KVM memory slot of `vm`, running `beside(&vm)` on
/// another thread meanwhile ([`GuestVm::register_beside`]); the result owns both.
pub fn register<R: Send>(
    vm: VmFd,
    mem: GuestMemoryMmap,
    beside: impl FnOnce(&VmFd) -> R + Send,
) -> Result<(GuestVm, R), MemoryError> {
    GuestVm::register_beside(vm, mem, beside).map_err(|e| MemoryError::Register {
        slot: e.slot,
        source: e.source,
    })
}

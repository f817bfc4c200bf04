//! Guest RAM registered with KVM, owned so that it outlives everything that can reach it.
//!
//! `KVM_SET_USER_MEMORY_REGION` hands KVM a host address range; the guest reads and writes it
//! for as long as the kernel's VM lives, which is as long as the VM fd *or any vCPU fd* is
//! open. [`GuestVm`] therefore owns the VM fd and the memory together (the fd is dropped
//! first), and every vCPU it makes holds its own reference to the memory.

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::kick::KickableVcpu;

/// Guest memory as the VMM maps it.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// KVM refused a memory slot.
#[derive(Debug, thiserror::Error)]
#[error("cannot register memory slot {slot}")]
pub struct SlotError {
    /// Slot number.
    pub slot: u32,
    /// Cause.
    #[source]
    pub source: kvm_ioctls::Error,
}

/// A KVM VM with its guest RAM registered. Field order is drop order: the VM fd, then the
/// memory.
#[derive(Debug)]
pub struct GuestVm {
    vm: VmFd,
    mem: GuestMemoryMmap,
}

impl GuestVm {
    /// Register every region of `mem` as a KVM memory slot of `vm` (slot `i` for region `i`).
    pub fn register(vm: VmFd, mem: GuestMemoryMmap) -> Result<Self, SlotError> {
        for (slot, region) in mem.iter().enumerate() {
            let slot = slot as u32;
            let desc = kvm_userspace_memory_region {
                slot,
                flags: 0,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
            };
            // SAFETY: the region is a live mapping of `memory_size` bytes that stays mapped
            // while the kernel's VM can reach it: `mem` is dropped after `vm` (field order),
            // and every vCPU made by `create_vcpu` holds a reference to the same mappings.
            unsafe { vm.set_user_memory_region(desc) }
                .map_err(|source| SlotError { slot, source })?;
        }
        Ok(Self { vm, mem })
    }

    /// The VM fd, for device and interrupt set-up (make vCPUs with
    /// [`GuestVm::create_vcpu`], which keeps the memory mapped).
    pub fn vm(&self) -> &VmFd {
        &self.vm
    }

    /// The guest memory.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Create vCPU `id`, holding its own reference to the memory.
    pub fn create_vcpu(&self, id: u64) -> Result<KickableVcpu, kvm_ioctls::Error> {
        Ok(KickableVcpu::new(
            self.vm.create_vcpu(id)?,
            self.mem.clone(),
        ))
    }
}

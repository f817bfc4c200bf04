//! Guest RAM registered with KVM, owned so that it outlives everything that can reach it.
//!
//! `KVM_SET_USER_MEMORY_REGION` hands KVM a host address range; the guest reads and writes it
//! for as long as the kernel's VM lives, which is as long as the VM fd *or any vCPU fd* is
//! open. [`GuestVm`] therefore owns the VM fd and the memory together (the fd is dropped
//! first), and every vCPU it makes holds its own reference to the memory.

use std::sync::Arc;

use kvm_bindings::{KVM_MEM_READONLY, kvm_userspace_memory_region};
use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vm_sync::Lock;

use super::kick::KickableVcpu;
use super::window::DaxMapping;

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

/// A KVM VM with its guest RAM (and any DAX windows) registered. Field order is drop order:
/// the VM fd, then the memory and the windows.
#[derive(Debug)]
pub struct GuestVm {
    vm: VmFd,
    mem: GuestMemoryMmap,
    windows: Vec<Arc<DaxMapping>>,
}

/// Registers every region of `mem` as a KVM memory slot of `vm` (slot `i` for region `i`).
fn add_slots(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), SlotError> {
    for (slot, region) in mem.iter().enumerate() {
        let slot = slot as u32;
        let desc = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
        };
        // SAFETY: the region is a live mapping of `memory_size` bytes that stays mapped while
        // the kernel's VM can reach it: the caller moves `vm` and `mem` into one `GuestVm`,
        // which drops `mem` after `vm` (field order), and every vCPU made by `create_vcpu`
        // holds a reference to the same mappings (on an error no vCPU exists yet).
        unsafe { vm.set_user_memory_region(desc) }.map_err(|source| SlotError { slot, source })?;
    }
    Ok(())
}

impl GuestVm {
    /// Registers every region of `mem` as a KVM memory slot of `vm` (slot `i` for region
    /// `i`), running `beside(&vm)` on another thread meanwhile (inline if no thread can be
    /// made): set-up that waits in the kernel as a slot does, for an SRCU grace period,
    /// shares the slot's instead of waiting for one of its own.
    pub fn register_beside<R: Send>(
        vm: VmFd,
        mem: GuestMemoryMmap,
        beside: impl FnOnce(&VmFd) -> R + Send,
    ) -> Result<(Self, R), SlotError> {
        let job = std::sync::Mutex::new(Some(beside));
        let run = |vm: &VmFd| {
            let f = job.locked().take();
            f.map(|f| f(vm))
        };
        let (slots, side) = std::thread::scope(|s| {
            let thread = std::thread::Builder::new()
                .name("vm-setup".into())
                .spawn_scoped(s, || run(&vm));
            let slots = add_slots(&vm, &mem);
            let side = match thread {
                Ok(t) => t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(_) => None,
            };
            (slots, side.or_else(|| run(&vm)))
        });
        slots?;
        let side = side.expect("`beside` ran, on the thread or inline");
        Ok((
            Self {
                vm,
                mem,
                windows: Vec::new(),
            },
            side,
        ))
    }

    /// Registers `window` as a read-only memory slot at guest physical `guest_addr` (the slot
    /// after the RAM regions and the windows before it), and keeps it mapped for as long as
    /// the VM and its vCPUs live. Call before any vCPU is made. A guest store into a
    /// read-only slot exits to the VMM (`KVM_EXIT_MMIO`) and writes nothing.
    pub fn add_window(
        &mut self,
        guest_addr: u64,
        window: Arc<DaxMapping>,
    ) -> Result<(), SlotError> {
        let slot = (self.mem.num_regions() + self.windows.len()) as u32;
        let desc = kvm_userspace_memory_region {
            slot,
            flags: KVM_MEM_READONLY,
            guest_phys_addr: guest_addr,
            memory_size: window.len(),
            userspace_addr: window.host_addr(),
        };
        // SAFETY: the window is a live mapping of `memory_size` bytes that stays mapped while
        // the kernel's VM can reach it: `self` keeps a reference (dropped after the VM fd) and
        // so does every vCPU made after this by `create_vcpu`. KVM maps it read-only.
        unsafe { self.vm.set_user_memory_region(desc) }
            .map_err(|source| SlotError { slot, source })?;
        self.windows.push(window);
        Ok(())
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
            self.windows.clone(),
        ))
    }
}

//! Initial vCPU register state for a direct 64-bit entry.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs};
use vm_memory::{Bytes, GuestAddress};

use super::gdt::{GDT, kvm_segment_from};
use crate::layout::{BOOT_STACK_TOP, GDT_ADDR, IDT_ADDR, PML4_ADDR, ZERO_PAGE_ADDR};
use crate::memory::GuestMemoryMmap;

/// CR0: protection enable.
pub const CR0_PE: u64 = 1;
/// CR0: extension type (387 present).
pub const CR0_ET: u64 = 1 << 4;
/// CR0: numeric error reporting.
pub const CR0_NE: u64 = 1 << 5;
/// CR0: paging.
pub const CR0_PG: u64 = 1 << 31;
/// CR4: physical address extension.
pub const CR4_PAE: u64 = 1 << 5;
/// EFER: long mode enable.
pub const EFER_LME: u64 = 1 << 8;
/// EFER: long mode active.
pub const EFER_LMA: u64 = 1 << 10;

/// Error of writing the descriptor tables.
#[derive(Debug, thiserror::Error)]
#[error("cannot write descriptor tables")]
pub struct RegsError(#[source] pub vm_memory::GuestMemoryError);

/// Write the GDT and the (empty) IDT into guest memory.
pub fn write_descriptor_tables(mem: &GuestMemoryMmap) -> Result<(), RegsError> {
    for (i, e) in GDT.iter().enumerate() {
        mem.write_obj(*e, GuestAddress(GDT_ADDR + i as u64 * 8))
            .map_err(RegsError)?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_ADDR))
        .map_err(RegsError)
}

/// Special registers for 64-bit mode with paging on, starting from KVM's defaults.
pub fn long_mode_sregs(mut s: kvm_sregs) -> kvm_sregs {
    s.gdt.base = GDT_ADDR;
    s.gdt.limit = (std::mem::size_of_val(&GDT) - 1) as u16;
    s.idt.base = IDT_ADDR;
    s.idt.limit = 7;
    let code = kvm_segment_from(&GDT, 1);
    let data = kvm_segment_from(&GDT, 2);
    s.cs = code;
    s.ds = data;
    s.es = data;
    s.fs = data;
    s.gs = data;
    s.ss = data;
    s.tr = kvm_segment_from(&GDT, 3);
    s.cr3 = PML4_ADDR;
    s.cr4 |= CR4_PAE;
    s.cr0 |= CR0_PE | CR0_ET | CR0_NE | CR0_PG;
    s.efer |= EFER_LME | EFER_LMA;
    s
}

/// General registers: RIP at `entry`, RSI -> boot_params, a small boot stack, RFLAGS = 2.
pub fn boot_regs(entry: u64) -> kvm_regs {
    kvm_regs {
        rflags: 0x2,
        rip: entry,
        rsp: BOOT_STACK_TOP,
        rbp: BOOT_STACK_TOP,
        rsi: ZERO_PAGE_ADDR,
        ..Default::default()
    }
}

/// FPU state at reset (x87 control word 0x37f, MXCSR 0x1f80).
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sregs_enter_long_mode() {
        let s = long_mode_sregs(kvm_sregs::default());
        assert_eq!(s.cr0 & (CR0_PE | CR0_PG), CR0_PE | CR0_PG);
        assert_eq!(s.cr4 & CR4_PAE, CR4_PAE);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cr3, PML4_ADDR);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.gdt.limit, 31);
    }

    #[test]
    fn regs_point_at_entry_and_zero_page() {
        let r = boot_regs(0x100_0000);
        assert_eq!((r.rip, r.rsi, r.rflags), (0x100_0000, ZERO_PAGE_ADDR, 2));
    }
}

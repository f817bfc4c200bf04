//! Identity-mapped page tables for entering long mode directly.
//!
//! One PML4 entry points to one PDPT whose first four entries point to four page directories of
//! 2 MiB pages: the first 4 GiB (all of low memory, plus the MMIO gap) are identity mapped. The
//! kernel replaces these tables with its own early in `startup_64`.

use vm_memory::{Bytes, GuestAddress};

use crate::layout::{PD_ADDR, PDPT_ADDR, PML4_ADDR};
use crate::memory::GuestMemoryMmap;

/// Present | writable.
const PRESENT_RW: u64 = 0x3;
/// Page size bit of a PDE (2 MiB page).
const PAGE_SIZE_2M: u64 = 0x80;
/// Number of page directories (each maps 1 GiB).
pub const PD_COUNT: u64 = 4;

// The tables end below the command line.
const _: () = assert!(PD_ADDR + PD_COUNT * 0x1000 <= crate::layout::CMDLINE_ADDR);

/// Error of writing the tables.
#[derive(Debug, thiserror::Error)]
#[error("cannot write page tables")]
pub struct PagingError(#[source] pub vm_memory::GuestMemoryError);

/// The (address, value) pairs of every page-table entry written.
pub fn entries() -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(1 + PD_COUNT as usize + 512 * PD_COUNT as usize);
    out.push((PML4_ADDR, PDPT_ADDR | PRESENT_RW));
    for pd in 0..PD_COUNT {
        let pd_addr = PD_ADDR + pd * 0x1000;
        out.push((PDPT_ADDR + pd * 8, pd_addr | PRESENT_RW));
        for i in 0..512u64 {
            let phys = (pd << 30) | (i << 21);
            out.push((pd_addr + i * 8, phys | PRESENT_RW | PAGE_SIZE_2M));
        }
    }
    out
}

/// Write the tables into guest memory; returns the CR3 value.
pub fn write(mem: &GuestMemoryMmap) -> Result<u64, PagingError> {
    for (addr, val) in entries() {
        mem.write_obj(val, GuestAddress(addr))
            .map_err(PagingError)?;
    }
    Ok(PML4_ADDR)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walk the tables like the MMU would for a 2 MiB mapping.
    fn translate(mem: &GuestMemoryMmap, cr3: u64, va: u64) -> Option<u64> {
        let pml4e: u64 = mem
            .read_obj(GuestAddress(cr3 + ((va >> 39) & 511) * 8))
            .ok()?;
        if pml4e & 1 == 0 {
            return None;
        }
        let pdpte: u64 = mem
            .read_obj(GuestAddress((pml4e & !0xfff) + ((va >> 30) & 511) * 8))
            .ok()?;
        if pdpte & 1 == 0 {
            return None;
        }
        let pde: u64 = mem
            .read_obj(GuestAddress((pdpte & !0xfff) + ((va >> 21) & 511) * 8))
            .ok()?;
        if pde & 1 == 0 || pde & PAGE_SIZE_2M == 0 {
            return None;
        }
        Some((pde & !0x1f_ffff & 0x000f_ffff_ffff_ffff) | (va & 0x1f_ffff))
    }

    #[test]
    fn identity_maps_first_4_gib_with_2m_pages() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let cr3 = write(&mem).unwrap();
        assert_eq!(cr3, PML4_ADDR);
        for va in [
            0u64,
            0x1234,
            0x100_0000,
            0x3fff_ffff,
            0x4000_0000,
            0xd000_0123,
            0xffff_ffff,
        ] {
            assert_eq!(translate(&mem, cr3, va), Some(va), "va {va:#x}");
        }
        assert_eq!(translate(&mem, cr3, 1 << 32), None, "nothing above 4 GiB");
        // Tables stay inside the reserved low pages and do not overlap the zero page.
        let max = entries().iter().map(|e| e.0).max().unwrap();
        assert!(max < PD_ADDR + PD_COUNT * 0x1000);
    }
}

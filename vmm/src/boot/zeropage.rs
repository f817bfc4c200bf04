//! The Linux zero page (`struct boot_params`) for the 64-bit boot protocol.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::{Bytes, GuestAddress};

use crate::layout::{CMDLINE_ADDR, E820Entry, MemoryLayout, ZERO_PAGE_ADDR};
use crate::memory::GuestMemoryMmap;

/// "HdrS".
const HDRS_MAGIC: u32 = 0x5372_6448;
/// 0xAA55 boot flag.
const BOOT_FLAG: u16 = 0xaa55;
/// Loader id "undefined" (0xff): we are not a registered boot loader.
const LOADER_UNDEFINED: u8 = 0xff;
/// loadflags: kernel loaded high (at 1 MiB).
const LOADED_HIGH: u8 = 0x01;
/// loadflags: do not reload segment registers.
const KEEP_SEGMENTS: u8 = 0x40;
/// loadflags: heap_end_ptr is valid.
const CAN_USE_HEAP: u8 = 0x80;
/// Kernel alignment we declare for an ELF kernel (2 MiB would also do).
const KERNEL_ALIGNMENT: u32 = 0x100_0000;

/// Errors of building the zero page.
#[derive(Debug, thiserror::Error)]
pub enum ZeroPageError {
    /// More e820 entries than the zero page holds.
    #[error("too many e820 entries: {0}")]
    TooManyE820(usize),
    /// Guest memory write failed.
    #[error("cannot write the zero page")]
    Write(#[source] vm_memory::GuestMemoryError),
}

/// Inputs of [`build`].
#[derive(Clone, Debug)]
pub struct ZeroPageInput<'a> {
    /// Memory layout (for the e820 map).
    pub layout: &'a MemoryLayout,
    /// The bzImage setup header, if the kernel came with one.
    pub setup_header: Option<setup_header>,
    /// Length of the command line without its NUL.
    pub cmdline_len: usize,
    /// Initrd (address, size).
    pub initrd: Option<(u64, u64)>,
}

/// Build the zero page.
pub fn build(input: &ZeroPageInput<'_>) -> Result<boot_params, ZeroPageError> {
    let mut p = boot_params::default();
    if let Some(h) = input.setup_header {
        p.hdr = h;
    }
    p.hdr.boot_flag = BOOT_FLAG;
    p.hdr.header = HDRS_MAGIC;
    p.hdr.type_of_loader = LOADER_UNDEFINED;
    p.hdr.loadflags |= LOADED_HIGH | KEEP_SEGMENTS | CAN_USE_HEAP;
    p.hdr.heap_end_ptr = 0xfe00;
    if p.hdr.kernel_alignment == 0 {
        p.hdr.kernel_alignment = KERNEL_ALIGNMENT;
    }
    p.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    p.hdr.cmdline_size = input.cmdline_len as u32;
    if let Some((addr, size)) = input.initrd {
        p.hdr.ramdisk_image = addr as u32;
        p.hdr.ramdisk_size = size as u32;
        p.ext_ramdisk_image = (addr >> 32) as u32;
        p.ext_ramdisk_size = (size >> 32) as u32;
    }
    let e820 = input.layout.e820();
    if e820.len() > p.e820_table.len() {
        return Err(ZeroPageError::TooManyE820(e820.len()));
    }
    for (slot, e) in p.e820_table.iter_mut().zip(e820.iter()) {
        *slot = to_boot_entry(e);
    }
    p.e820_entries = e820.len() as u8;
    Ok(p)
}

fn to_boot_entry(e: &E820Entry) -> boot_e820_entry {
    boot_e820_entry {
        addr: e.addr,
        size: e.size,
        r#type: e.kind.code(),
    }
}

/// Write the zero page to its fixed address.
pub fn write(mem: &GuestMemoryMmap, params: &boot_params) -> Result<(), ZeroPageError> {
    mem.write_obj(*params, GuestAddress(ZERO_PAGE_ADDR))
        .map_err(ZeroPageError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_page_for_64_mib_has_exactly_64_mib_minus_legacy_hole_of_ram() {
        let layout = MemoryLayout::new(64).unwrap();
        let p = build(&ZeroPageInput {
            layout: &layout,
            setup_header: None,
            cmdline_len: 42,
            initrd: Some((0x300_0000, 0x1234)),
        })
        .unwrap();
        let n = p.e820_entries as usize;
        let table = p.e820_table;
        let ram: u64 = table[..n]
            .iter()
            .filter(|e| e.r#type == 1)
            .map(|e| e.size)
            .sum();
        let reserved_low: u64 = table[..n]
            .iter()
            .filter(|e| e.r#type == 2 && e.addr < 0x10_0000)
            .map(|e| e.size)
            .sum();
        // RAM plus the reserved legacy area is the whole allocation; nothing beyond 64 MiB.
        assert_eq!(ram + (0x10_0000 - 0x9_fc00), 64 << 20);
        assert!(reserved_low <= 0x10_0000 - 0x9_fc00);
        let top = table[..n].iter().map(|e| e.addr + e.size).max().unwrap();
        assert_eq!(top, 64 << 20);
        let hdr = p.hdr;
        assert_eq!(hdr.type_of_loader, 0xff);
        assert_eq!({ hdr.header }, HDRS_MAGIC);
        assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_ADDR as u32);
        assert_eq!({ hdr.cmdline_size }, 42);
        assert_eq!((hdr.ramdisk_image, hdr.ramdisk_size), (0x300_0000, 0x1234));
        assert_ne!(hdr.loadflags & KEEP_SEGMENTS, 0);
    }

    #[test]
    fn keeps_bzimage_header_fields() {
        let layout = MemoryLayout::new(64).unwrap();
        let h = setup_header {
            version: 0x20f,
            kernel_alignment: 0x20_0000,
            initrd_addr_max: 0x7fff_ffff,
            ..Default::default()
        };
        let p = build(&ZeroPageInput {
            layout: &layout,
            setup_header: Some(h),
            cmdline_len: 1,
            initrd: None,
        })
        .unwrap();
        let hdr = p.hdr;
        assert_eq!((hdr.version, hdr.kernel_alignment), (0x20f, 0x20_0000));
        assert_eq!({ hdr.ramdisk_image }, 0);
    }
}

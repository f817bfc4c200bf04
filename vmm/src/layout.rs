//! Guest physical address layout (x86-64) and the e820 map derived from it.
//!
//! RAM starts at 0 and runs up to the 32-bit MMIO gap at [`MMIO_GAP_START`] (3.25 GiB); whatever
//! does not fit below the gap continues at 4 GiB. The gap holds the virtio-mmio windows, the
//! IOAPIC, the local APIC and KVM's TSS / identity-map pages. The total of all RAM regions is
//! exactly the requested size: this is the hard memory cap.
//!
//! Low fixed addresses used by the boot setup (all inside the first MiB):
//! GDT 0x500, IDT 0x520, boot stack top 0x8ff0, PML4 0x9000, PDPT 0xa000, page directories
//! 0xb000..0xf000, boot_params (zero page) 0x7000, command line 0x20000, MP table 0x9fc00 (EBDA).

use vm_memory::GuestAddress;

/// Start of the 32-bit MMIO gap; low RAM ends here at the latest.
pub const MMIO_GAP_START: u64 = 0xd000_0000;
/// End of the 32-bit MMIO gap (4 GiB); high RAM starts here.
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// First virtio-mmio window; device `i` is at `VIRTIO_MMIO_BASE + i * VIRTIO_MMIO_SIZE`.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// Size of one virtio-mmio window.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
pub use vm_vmm_protocol::layout::{
    DAX_WINDOW_STRIDE, MAX_GSI, MAX_VIRTIO_DEVICES, VIRTIO_GSI_BASE,
};
/// Where virtio-fs DAX windows start: far above the highest RAM (4 GiB + the 64 GiB cap) and
/// below 1 TiB, which every x86-64 CPU's physical address width reaches.
pub const DAX_WINDOWS_BASE: u64 = 128 << 30;

/// The guest physical base of device `index`'s DAX window.
pub fn dax_window_base(index: usize) -> u64 {
    DAX_WINDOWS_BASE + index as u64 * DAX_WINDOW_STRIDE
}

/// IOAPIC MMIO base.
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
/// Local APIC MMIO base.
pub const LAPIC_ADDR: u64 = 0xfee0_0000;
/// KVM identity-map page (needed by KVM on some hosts before vCPU creation).
pub const IDENTITY_MAP_ADDR: u64 = 0xfffb_c000;
/// KVM TSS area (three pages after the identity map page).
pub const TSS_ADDR: u64 = 0xfffb_d000;

/// GDT location.
pub const GDT_ADDR: u64 = 0x500;
/// IDT location (an empty IDT: limit 0).
pub const IDT_ADDR: u64 = 0x520;
/// Zero page (struct boot_params).
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial stack pointer.
pub const BOOT_STACK_TOP: u64 = 0x8ff0;
/// PML4 page.
pub const PML4_ADDR: u64 = 0x9000;
/// PDPT page.
pub const PDPT_ADDR: u64 = 0xa000;
/// First page directory; four of them map 4 GiB.
pub const PD_ADDR: u64 = 0xb000;
/// Kernel command line.
pub const CMDLINE_ADDR: u64 = 0x20000;
/// Largest command line we pass (the kernel's COMMAND_LINE_SIZE is 2048 on x86).
pub const CMDLINE_MAX: usize = 2048;
/// Start of the EBDA; the MP table lives here.
pub const EBDA_START: u64 = 0x9_fc00;
/// Start of the legacy VGA/ROM hole.
pub const LEGACY_HOLE_START: u64 = 0xa_0000;
/// High memory: where the kernel is loaded (1 MiB).
pub const HIMEM_START: u64 = 0x10_0000;
/// Load address for raw (test) images.
pub const RAW_IMAGE_ADDR: u64 = 0x10_0000;

/// One RAM region of the guest: start address and length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRegion {
    /// Guest physical start.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Kind of an e820 entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum E820Kind {
    /// Usable RAM (type 1).
    Ram,
    /// Reserved (type 2).
    Reserved,
}

impl E820Kind {
    /// The numeric e820 type.
    pub fn code(self) -> u32 {
        match self {
            E820Kind::Ram => 1,
            E820Kind::Reserved => 2,
        }
    }
}

/// One e820 entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820Entry {
    /// Start address.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Type.
    pub kind: E820Kind,
}

/// Errors of computing a layout.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// Too little memory for the boot structures and a kernel.
    #[error("guest memory of {0} MiB is too small (minimum 16 MiB)")]
    TooSmall(u32),
}

/// The guest memory layout for a given RAM size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryLayout {
    /// RAM regions (backed by host memory); their lengths sum to the requested size.
    pub regions: Vec<RamRegion>,
}

/// Smallest accepted guest.
pub const MIN_MEM_MIB: u32 = 16;

impl MemoryLayout {
    /// Layout for `mem_mib` MiB of RAM.
    pub fn new(mem_mib: u32) -> Result<Self, LayoutError> {
        if mem_mib < MIN_MEM_MIB {
            return Err(LayoutError::TooSmall(mem_mib));
        }
        let total = u64::from(mem_mib) << 20;
        let low = total.min(MMIO_GAP_START);
        let mut regions = vec![RamRegion { start: 0, len: low }];
        if total > low {
            regions.push(RamRegion {
                start: MMIO_GAP_END,
                len: total - low,
            });
        }
        Ok(Self { regions })
    }

    /// Total bytes of host memory backing the guest.
    pub fn total_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.len).sum()
    }

    /// End of RAM below 4 GiB (exclusive).
    pub fn low_end(&self) -> u64 {
        self.regions.first().map(|r| r.start + r.len).unwrap_or(0)
    }

    /// The e820 map the guest sees: RAM below the EBDA, the EBDA and legacy hole reserved,
    /// RAM from 1 MiB to the low end, and RAM above 4 GiB.
    pub fn e820(&self) -> Vec<E820Entry> {
        let mut out = vec![
            E820Entry {
                addr: 0,
                size: EBDA_START,
                kind: E820Kind::Ram,
            },
            E820Entry {
                addr: EBDA_START,
                size: LEGACY_HOLE_START - EBDA_START,
                kind: E820Kind::Reserved,
            },
            E820Entry {
                addr: 0xf_0000,
                size: HIMEM_START - 0xf_0000,
                kind: E820Kind::Reserved,
            },
            E820Entry {
                addr: HIMEM_START,
                size: self.low_end() - HIMEM_START,
                kind: E820Kind::Ram,
            },
        ];
        for r in self.regions.iter().skip(1) {
            out.push(E820Entry {
                addr: r.start,
                size: r.len,
                kind: E820Kind::Ram,
            });
        }
        out
    }

    /// Sum of the RAM entries of [`Self::e820`].
    pub fn e820_ram_bytes(&self) -> u64 {
        self.e820()
            .iter()
            .filter(|e| e.kind == E820Kind::Ram)
            .map(|e| e.size)
            .sum()
    }

    /// The start addresses as vm-memory ranges.
    pub fn ranges(&self) -> Vec<(GuestAddress, usize)> {
        self.regions
            .iter()
            .map(|r| (GuestAddress(r.start), r.len as usize))
            .collect()
    }
}

/// MMIO window base of virtio device `index`.
pub fn virtio_mmio_base(index: usize) -> u64 {
    VIRTIO_MMIO_BASE + index as u64 * VIRTIO_MMIO_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const LEGACY_HOLE: u64 = HIMEM_START - EBDA_START;

    fn check_common(l: &MemoryLayout, mib: u64) {
        assert_eq!(
            l.total_bytes(),
            mib * MIB,
            "host backing is exactly the request"
        );
        assert_eq!(l.e820_ram_bytes(), mib * MIB - LEGACY_HOLE);
        assert!(l.e820_ram_bytes() <= mib * MIB);
        let e = l.e820();
        for w in e.windows(2) {
            assert!(
                w[0].addr + w[0].size <= w[1].addr,
                "sorted, no overlap: {e:?}"
            );
        }
        // Nothing in the legacy hole or the MMIO gap is RAM.
        for x in e.iter().filter(|x| x.kind == E820Kind::Ram) {
            let end = x.addr + x.size;
            assert!(end <= LEGACY_HOLE_START || x.addr >= HIMEM_START);
            assert!(end <= MMIO_GAP_START || x.addr >= MMIO_GAP_END);
        }
    }

    #[test]
    fn layout_64_mib() {
        let l = MemoryLayout::new(64).unwrap();
        assert_eq!(
            l.regions,
            vec![RamRegion {
                start: 0,
                len: 64 * MIB
            }]
        );
        check_common(&l, 64);
        let e = l.e820();
        assert_eq!(e.len(), 4);
        assert_eq!(
            e[3],
            E820Entry {
                addr: HIMEM_START,
                size: 63 * MIB,
                kind: E820Kind::Ram
            }
        );
    }

    #[test]
    fn layout_3_5_gib_splits_at_gap() {
        let l = MemoryLayout::new(3584).unwrap();
        assert_eq!(
            l.regions,
            vec![
                RamRegion {
                    start: 0,
                    len: MMIO_GAP_START
                },
                RamRegion {
                    start: MMIO_GAP_END,
                    len: 256 * MIB
                },
            ]
        );
        check_common(&l, 3584);
        assert_eq!(l.e820().last().unwrap().addr, 1 << 32);
    }

    #[test]
    fn layout_6_gib() {
        let l = MemoryLayout::new(6144).unwrap();
        assert_eq!(l.low_end(), MMIO_GAP_START);
        assert_eq!(
            l.regions[1],
            RamRegion {
                start: 1 << 32,
                len: 6 * 1024 * MIB - MMIO_GAP_START
            }
        );
        check_common(&l, 6144);
    }

    #[test]
    fn too_small_is_an_error() {
        assert_eq!(MemoryLayout::new(8), Err(LayoutError::TooSmall(8)));
    }

    #[test]
    fn virtio_windows_are_in_the_gap() {
        assert_eq!(virtio_mmio_base(0), 0xd000_0000);
        assert_eq!(virtio_mmio_base(3), 0xd000_3000);
        assert!(virtio_mmio_base(15) + VIRTIO_MMIO_SIZE <= IOAPIC_ADDR);
    }
}

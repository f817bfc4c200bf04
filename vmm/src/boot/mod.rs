//! Direct 64-bit boot: kernel and initrd loading, zero page, page tables, GDT, MP table and
//! initial registers.
//!
//! Kernels enter at their 64-bit entry point with paging on (identity mapped), RSI pointing at
//! the zero page, like the x86 64-bit boot protocol describes:
//! - an ELF `vmlinux` at its ELF entry (`startup_64`'s physical address). A PVH note is detected
//!   and logged, but not used: the PVH entry is a 32-bit protected-mode entry without paging,
//!   which is not the direct 64-bit boot this VMM does (and which a PVM host cannot run).
//! - a `bzImage` at its protected-mode load address + 0x200 (the decompressor's `startup_64`);
//!   the setup header is copied into the zero page.
//! - a raw image (tests, benchmark) loaded at 1 MiB and entered at its first byte.

pub mod gdt;
pub mod mptable;
pub mod paging;
pub mod regs;
pub mod zeropage;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout::{CMDLINE_ADDR, CMDLINE_MAX, HIMEM_START, MemoryLayout, RAW_IMAGE_ADDR};
use crate::memory::GuestMemoryMmap;

/// Offset of the 64-bit entry in a bzImage's protected-mode code.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// xloadflags: the kernel has a 64-bit entry at +0x200.
const XLF_KERNEL_64: u16 = 1;
/// Default initrd_addr_max for kernels without a setup header.
const DEFAULT_INITRD_ADDR_MAX: u64 = 0x7fff_ffff;

pub use vm_vmm_protocol::config::KernelFormat;

/// Errors of loading and preparing the guest.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// Cannot open or read a file.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The ELF loader refused the kernel.
    #[error("cannot load ELF kernel")]
    Elf(#[source] linux_loader::loader::Error),
    /// The bzImage loader refused the kernel.
    #[error("cannot load bzImage kernel")]
    BzImage(#[source] linux_loader::loader::Error),
    /// A bzImage without a 64-bit entry point.
    #[error("bzImage has no 64-bit entry point (xloadflags {0:#x})")]
    No64BitEntry(u16),
    /// The kernel, initrd or raw image does not fit.
    #[error("{what} of {size} bytes does not fit in guest memory")]
    TooLarge {
        /// Which image.
        what: &'static str,
        /// Its size.
        size: u64,
    },
    /// Command line longer than the kernel accepts.
    #[error("kernel command line is {0} bytes (max {max})", max = CMDLINE_MAX - 1)]
    CmdlineTooLong(usize),
    /// Command line with a NUL byte.
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    /// Guest memory write failed.
    #[error("cannot write guest memory")]
    Memory(#[source] vm_memory::GuestMemoryError),
    /// Page tables.
    #[error(transparent)]
    Paging(#[from] paging::PagingError),
    /// Descriptor tables.
    #[error(transparent)]
    Regs(#[from] regs::RegsError),
    /// Zero page.
    #[error(transparent)]
    ZeroPage(#[from] zeropage::ZeroPageError),
    /// MP table.
    #[error(transparent)]
    MpTable(#[from] mptable::MpTableError),
}

/// A kernel placed in guest memory.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    /// 64-bit entry point (guest physical = virtual, identity mapped).
    pub entry: u64,
    /// First byte after the kernel image.
    pub end: u64,
    /// bzImage setup header.
    pub setup_header: Option<setup_header>,
    /// Whether every vCPU starts at the entry (raw images) instead of waiting for INIT/SIPI.
    pub all_vcpus_start: bool,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BootError + '_ {
    move |source| BootError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Load the kernel at `path` into `mem`.
pub fn load_kernel(
    mem: &GuestMemoryMmap,
    path: &Path,
    format: KernelFormat,
) -> Result<LoadedKernel, BootError> {
    let mut file = File::open(path).map_err(io_err(path))?;
    if format == KernelFormat::Raw {
        let size = file.metadata().map_err(io_err(path))?.len();
        let end = RAW_IMAGE_ADDR
            .checked_add(size)
            .filter(|e| *e <= mem.last_addr().0 + 1);
        let end = end.ok_or(BootError::TooLarge {
            what: "raw image",
            size,
        })?;
        mem.read_exact_volatile_from(GuestAddress(RAW_IMAGE_ADDR), &mut file, size as usize)
            .map_err(BootError::Memory)?;
        return Ok(LoadedKernel {
            entry: RAW_IMAGE_ADDR,
            end,
            setup_header: None,
            all_vcpus_start: true,
        });
    }
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).map_err(io_err(path))?;
    file.seek(SeekFrom::Start(0)).map_err(io_err(path))?;
    if &magic == b"\x7fELF" {
        let r = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
            .map_err(BootError::Elf)?;
        match r.pvh_boot_cap {
            PvhBootCapability::PvhEntryPresent(a) => {
                tracing::debug!(
                    pvh_entry = a.0,
                    "PVH note present; entering at the 64-bit ELF entry"
                )
            }
            _ => tracing::debug!("no PVH note; entering at the 64-bit ELF entry"),
        }
        Ok(LoadedKernel {
            entry: r.kernel_load.0,
            end: r.kernel_end,
            setup_header: None,
            all_vcpus_start: false,
        })
    } else {
        let r = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
            .map_err(BootError::BzImage)?;
        let hdr = r.setup_header.unwrap_or_default();
        if hdr.xloadflags & XLF_KERNEL_64 == 0 {
            return Err(BootError::No64BitEntry(hdr.xloadflags));
        }
        Ok(LoadedKernel {
            entry: r.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET,
            end: r.kernel_end,
            setup_header: Some(hdr),
            all_vcpus_start: false,
        })
    }
}

/// Where an initrd of `size` bytes goes: page aligned, as high as allowed below the top of low
/// memory and `initrd_addr_max`, above the kernel.
pub fn initrd_address(layout: &MemoryLayout, kernel: &LoadedKernel, size: u64) -> Option<u64> {
    let addr_max = kernel
        .setup_header
        .map(|h| u64::from(h.initrd_addr_max))
        .filter(|m| *m != 0)
        .unwrap_or(DEFAULT_INITRD_ADDR_MAX);
    let top = layout.low_end().min(addr_max.saturating_add(1));
    let addr = top.checked_sub(size)? & !0xfff;
    (addr >= kernel.end.max(HIMEM_START)).then_some(addr)
}

/// Load the initrd; returns (address, size).
pub fn load_initrd(
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    kernel: &LoadedKernel,
    path: &Path,
) -> Result<(u64, u64), BootError> {
    let mut file = File::open(path).map_err(io_err(path))?;
    let size = file.metadata().map_err(io_err(path))?.len();
    let addr = initrd_address(layout, kernel, size).ok_or(BootError::TooLarge {
        what: "initrd",
        size,
    })?;
    mem.read_exact_volatile_from(GuestAddress(addr), &mut file, size as usize)
        .map_err(BootError::Memory)?;
    Ok((addr, size))
}

/// Write the command line (NUL terminated) at its fixed address; returns its length.
pub fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str) -> Result<usize, BootError> {
    if cmdline.len() >= CMDLINE_MAX {
        return Err(BootError::CmdlineTooLong(cmdline.len()));
    }
    if cmdline.as_bytes().contains(&0) {
        return Err(BootError::CmdlineNul);
    }
    let mut bytes = Vec::with_capacity(cmdline.len() + 1);
    bytes.extend_from_slice(cmdline.as_bytes());
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))
        .map_err(BootError::Memory)?;
    Ok(cmdline.len())
}

/// Everything [`prepare`] needs.
#[derive(Debug)]
pub struct BootInput<'a> {
    /// Memory layout.
    pub layout: &'a MemoryLayout,
    /// Kernel file.
    pub kernel: &'a Path,
    /// Kernel format.
    pub format: KernelFormat,
    /// Initrd file.
    pub initrd: Option<&'a Path>,
    /// Full command line.
    pub cmdline: &'a str,
    /// Number of vCPUs (for the MP table).
    pub vcpus: u8,
}

/// Load everything into guest memory and write the boot structures.
pub fn prepare(mem: &GuestMemoryMmap, input: &BootInput<'_>) -> Result<LoadedKernel, BootError> {
    let kernel = load_kernel(mem, input.kernel, input.format)?;
    let initrd = match input.initrd {
        Some(p) => Some(load_initrd(mem, input.layout, &kernel, p)?),
        None => None,
    };
    let cmdline_len = write_cmdline(mem, input.cmdline)?;
    let params = zeropage::build(&zeropage::ZeroPageInput {
        layout: input.layout,
        setup_header: kernel.setup_header,
        cmdline_len,
        initrd,
    })?;
    zeropage::write(mem, &params)?;
    paging::write(mem)?;
    regs::write_descriptor_tables(mem)?;
    mptable::write(mem, input.vcpus)?;
    Ok(kernel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(end: u64, hdr: Option<setup_header>) -> LoadedKernel {
        LoadedKernel {
            entry: 0x100_0000,
            end,
            setup_header: hdr,
            all_vcpus_start: false,
        }
    }

    #[test]
    fn initrd_goes_to_top_of_low_memory_page_aligned() {
        let layout = MemoryLayout::new(64).unwrap();
        let a = initrd_address(&layout, &kernel(0x200_0000, None), 0x1001).unwrap();
        assert_eq!(a % 4096, 0);
        assert!(a + 0x1001 <= 64 << 20);
        assert!(a + 0x1001 + 4096 > 64 << 20);
        // Respect initrd_addr_max.
        let layout = MemoryLayout::new(4096).unwrap();
        let h = setup_header {
            initrd_addr_max: 0x3fff_ffff,
            ..Default::default()
        };
        let a = initrd_address(&layout, &kernel(0x200_0000, Some(h)), 0x10_0000).unwrap();
        assert_eq!(a, 0x4000_0000 - 0x10_0000);
        // Too big to fit above the kernel.
        let layout = MemoryLayout::new(64).unwrap();
        assert_eq!(
            initrd_address(&layout, &kernel(0x200_0000, None), 63 << 20),
            None
        );
    }

    #[test]
    fn cmdline_is_bounded_and_nul_terminated() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        assert_eq!(write_cmdline(&mem, "console=ttyS0").unwrap(), 13);
        let mut b = [0u8; 14];
        mem.read_slice(&mut b, GuestAddress(CMDLINE_ADDR)).unwrap();
        assert_eq!(&b, b"console=ttyS0\0");
        assert!(matches!(
            write_cmdline(&mem, &"x".repeat(CMDLINE_MAX)),
            Err(BootError::CmdlineTooLong(_))
        ));
        assert!(matches!(
            write_cmdline(&mem, "a\0b"),
            Err(BootError::CmdlineNul)
        ));
    }
}

//! A DAX window's host mapping: an address range reserved for the guest's view of a virtio-fs
//! device's shared-memory region, into which file ranges are mapped read-only and shared.
//!
//! [`DaxMapping::reserve`] maps the whole window as private, anonymous, read-only,
//! `MAP_NORESERVE` zero pages (no memory used until read, and then the shared zero page). KVM
//! gets it as a read-only memory slot (`GuestVm::add_window`), so the guest reads what is
//! mapped there and a guest store exits to the VMM instead of writing.
//! [`DaxMapping::map_file`] replaces a range by `PROT_READ`, `MAP_SHARED` pages of a file (the
//! host's page cache: every VM mapping the same file shares one copy);
//! [`DaxMapping::zero`] puts zero pages back. Both replace pages in place (`MAP_FIXED`) inside
//! the reservation only: the range is checked against the window first. The reservation
//! stays until the last owner drops it (the VM's slots, its vCPUs and the device hold it).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use nix::errno::Errno;

/// A reserved window (see the module docs).
#[derive(Debug)]
pub struct DaxMapping {
    addr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; concurrent `map_file`/`zero` calls
// replace pages with `mmap(MAP_FIXED)`, which the kernel serialises, and no Rust reference into
// the range is ever handed out (the guest reads it through KVM).
unsafe impl Send for DaxMapping {}
// SAFETY: as above: every method takes `&self` and only makes system calls on the range.
unsafe impl Sync for DaxMapping {}

const PAGE: u64 = 4096;

impl DaxMapping {
    /// Reserves `len` bytes (page-aligned, not 0) of zero pages.
    pub fn reserve(len: u64) -> Result<DaxMapping, Errno> {
        let size = usize::try_from(len).map_err(|_| Errno::EINVAL)?;
        if size == 0 || !len.is_multiple_of(PAGE) {
            return Err(Errno::EINVAL);
        }
        // SAFETY: a new anonymous mapping at an address of the kernel's choosing; nothing else
        // is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let addr = NonNull::new(p.cast::<u8>()).ok_or(Errno::ENOMEM)?;
        Ok(DaxMapping { addr, len: size })
    }

    /// The host address of the window (for KVM's memory slot).
    pub fn host_addr(&self) -> u64 {
        self.addr.as_ptr() as u64
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether it is empty (never: [`DaxMapping::reserve`] refuses 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host address of `[offset, offset + len)`, when it lies inside and is page-aligned.
    fn range(&self, offset: u64, len: u64) -> Result<*mut libc::c_void, Errno> {
        let inside = offset.checked_add(len).is_some_and(|end| end <= self.len());
        if !inside || len == 0 || !offset.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Err(Errno::EINVAL);
        }
        // In bounds: the offset fits the mapping's length, a usize.
        Ok(self.addr.as_ptr().wrapping_add(offset as usize).cast())
    }

    /// Maps `len` bytes of `fd` from `foffset`, read-only and shared, at `offset`.
    pub fn map_file(
        &self,
        offset: u64,
        len: u64,
        fd: BorrowedFd<'_>,
        foffset: u64,
    ) -> Result<(), Errno> {
        let at = self.range(offset, len)?;
        let foff = i64::try_from(foffset).map_err(|_| Errno::EINVAL)?;
        // SAFETY: `at..at + len` lies inside this reservation (checked above), which this
        // value owns and never exposes as Rust memory; MAP_FIXED replaces only those pages.
        let p = unsafe {
            libc::mmap(
                at,
                len as usize,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                foff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        Ok(())
    }

    /// Puts zero pages back over `len` bytes at `offset`.
    pub fn zero(&self, offset: u64, len: u64) -> Result<(), Errno> {
        let at = self.range(offset, len)?;
        // SAFETY: as in `map_file`: only pages of this reservation are replaced.
        let p = unsafe {
            libc::mmap(
                at,
                len as usize,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        Ok(())
    }

    /// Fills `len` bytes at `offset` with private pages holding `fd`'s data `extents` (each
    /// inside `[foffset, foffset + len)`, at its distance from `foffset`), zero pages
    /// elsewhere, then makes them read-only. The pages are fresh and anonymous: only the
    /// extents' bytes use memory, and it goes with the range's next `zero` or `map_file`.
    /// On an error the range is zero pages again.
    pub fn copy_file(
        &self,
        offset: u64,
        len: u64,
        fd: BorrowedFd<'_>,
        foffset: u64,
        extents: &[vm_virtiofs::dax::Extent],
    ) -> Result<(), Errno> {
        let at = self.range(offset, len)?;
        let fend = foffset.checked_add(len).ok_or(Errno::EINVAL)?;
        let inside = extents
            .iter()
            .all(|e| e.at >= foffset && e.at.checked_add(e.len).is_some_and(|end| end <= fend));
        if !inside {
            return Err(Errno::EINVAL);
        }
        // The pages are writable until the `mprotect` below; KVM maps the window read-only, so
        // only the `pread`s here write them.
        // SAFETY: as in `map_file`: only pages of this reservation are replaced.
        let p = unsafe {
            libc::mmap(
                at,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let filled = extents.iter().try_for_each(|e| {
            // In the range: `e` lies inside `[foffset, foffset + len)` (checked above).
            let dst = at.wrapping_byte_add((e.at - foffset) as usize);
            read_at(fd, dst.cast(), e.len as usize, e.at)
        });
        // SAFETY: the range mapped just above, inside this reservation.
        let sealed = match unsafe { libc::mprotect(at, len as usize, libc::PROT_READ) } {
            0 => Ok(()),
            _ => Err(Errno::last()),
        };
        if let Err(e) = filled.and(sealed) {
            self.zero(offset, len)?;
            return Err(e);
        }
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the window (what the guest would read).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), Errno> {
        offset
            .checked_add(out.len() as u64)
            .filter(|e| *e <= self.len())
            .ok_or(Errno::EINVAL)?;
        // SAFETY: `offset` lies inside the mapping (checked above), so the pointer stays in
        // the same allocation.
        let src = unsafe { self.addr.as_ptr().add(offset as usize) };
        // SAFETY: the source range lies inside the mapping (checked), which is readable
        // (PROT_READ everywhere); a file page past the file's end would fault, and no range
        // here maps past one (the server maps whole pages up to the file's end only). `out` is
        // a distinct, writable buffer of `out.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

/// `pread`s `len` bytes of `fd` from `offset` into `dst`, retried on `EINTR` and short reads;
/// a file that ends sooner leaves the rest as it was (zero pages).
fn read_at(fd: BorrowedFd<'_>, dst: *mut u8, len: usize, offset: u64) -> Result<(), Errno> {
    let mut done = 0usize;
    while done < len {
        let off = i64::try_from(offset + done as u64).map_err(|_| Errno::EINVAL)?;
        // `dst..dst + len` lies inside the reservation (checked by `copy_file`).
        // SAFETY: writable window memory `copy_file` mapped; no Rust reference covers it.
        let n = unsafe {
            libc::pread64(
                fd.as_raw_fd(),
                dst.wrapping_add(done).cast(),
                len - done,
                off,
            )
        };
        match n {
            0 => return Ok(()),
            n if n > 0 => done += n as usize,
            _ if Errno::last() == Errno::EINTR => {}
            _ => return Err(Errno::last()),
        }
    }
    Ok(())
}

impl Drop for DaxMapping {
    fn drop(&mut self) {
        // SAFETY: the whole reservation, which this value owns; nothing refers to it once the
        // last owner (slots, vCPUs, device) is gone.
        unsafe { libc::munmap(self.addr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn file_pages_appear_and_go_and_ranges_are_checked() {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &[7u8; 8192]).unwrap();
        let w = DaxMapping::reserve(4 << 20).unwrap();
        let mut b = [1u8; 16];
        w.read(4096, &mut b).unwrap();
        assert_eq!(b, [0; 16]);
        w.map_file(4096, 8192, f.as_fd(), 0).unwrap();
        w.read(8190, &mut b).unwrap();
        assert_eq!(b, [7; 16]);
        w.zero(4096, 8192).unwrap();
        w.read(4096, &mut b).unwrap();
        assert_eq!(b, [0; 16]);
        assert_eq!(w.map_file(4 << 20, 4096, f.as_fd(), 0), Err(Errno::EINVAL));
        assert_eq!(w.map_file(100, 4096, f.as_fd(), 0), Err(Errno::EINVAL));
        assert_eq!(w.zero(u64::MAX - 4095, 4096), Err(Errno::EINVAL));
        assert_eq!(w.read(4 << 20, &mut b), Err(Errno::EINVAL));
        assert!(DaxMapping::reserve(0).is_err() && DaxMapping::reserve(100).is_err());
    }

    #[test]
    fn a_copy_holds_its_extents_read_only_and_zero_pages_elsewhere() {
        use vm_virtiofs::dax::Extent;
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &[9u8; 16384]).unwrap();
        let w = DaxMapping::reserve(4 << 20).unwrap();
        w.map_file(0, 16384, f.as_fd(), 0).unwrap();
        let one = [Extent {
            at: 8192,
            len: 4096,
        }];
        w.copy_file(0, 16384, f.as_fd(), 4096, &one).unwrap();
        let mut b = vec![1u8; 16384];
        w.read(0, &mut b).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 0));
        assert!(b[4096..8192].iter().all(|&x| x == 9));
        assert!(b[8192..].iter().all(|&x| x == 0));
        let start = format!("{:x}-", w.host_addr());
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|l| l.starts_with(&start)).unwrap();
        assert!(line.contains(" r--p "), "{line}");
        // An extent outside the range: refused, and the range is as it was.
        let out = [Extent { at: 0, len: 4096 }];
        assert_eq!(
            w.copy_file(0, 16384, f.as_fd(), 4096, &out),
            Err(Errno::EINVAL)
        );
        w.read(4096, &mut b[..4096]).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 9));
    }
}

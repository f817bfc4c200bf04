//! DAX: the guest asks for ranges of a file to be mapped into the device's shared-memory
//! window (`SETUPMAPPING`) and back out (`REMOVEMAPPING`); the transport that owns the window
//! (the kvm VMM: `PROT_READ` + `MAP_SHARED` mappings of the host file under a read-only KVM
//! memory slot) implements [`DaxWindow`].
//!
//! What the guest sends is checked here first, the same for every window: a writable mapping
//! is `EROFS`; `moffset` and `len` must be multiples of [`DAX_ALIGN`] (Linux maps 2 MiB
//! ranges, and the alignment bounds the host mappings a guest can make to the window's size
//! over 2 MiB, each at most two mappings: file pages, then zero pages past the end of the
//! file); the range must lie inside the window; `foffset` must be page-aligned. The part of
//! the range past the file's end (rounded up to a page) is left as zero pages, so no guest
//! access can reach past a file's end on the host.

use std::os::fd::BorrowedFd;

use nix::errno::Errno;

use crate::abi::SETUPMAPPING_FLAG_WRITE;

/// Alignment of a window range (Linux's `FUSE_DAX_SZ`).
pub const DAX_ALIGN: u64 = 2 << 20;
/// log2 of [`DAX_ALIGN`], the `map_alignment` told to the guest at `INIT`.
pub const DAX_ALIGN_SHIFT: u16 = 21;
/// Host page size the file offset must be aligned to.
pub const PAGE: u64 = 4096;

/// A transport's shared-memory window.
pub trait DaxWindow: Send + Sync {
    /// Its size in bytes (a multiple of [`DAX_ALIGN`]).
    fn size(&self) -> u64;
    /// Maps `len` bytes of `fd` from `foffset`, read-only and shared, at `moffset` of the
    /// window (everything checked and page-aligned).
    fn map(
        &mut self,
        moffset: u64,
        len: u64,
        fd: BorrowedFd<'_>,
        foffset: u64,
    ) -> Result<(), Errno>;
    /// Puts zero pages back over `len` bytes at `moffset` (checked and aligned).
    fn unmap(&mut self, moffset: u64, len: u64) -> Result<(), Errno>;
}

/// A checked `SETUPMAPPING`: the window range, and how much of it is file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// Window offset.
    pub moffset: u64,
    /// Window bytes.
    pub len: u64,
    /// File offset.
    pub foffset: u64,
    /// Bytes of the range backed by the file (the rest stays zero pages).
    pub file_len: u64,
}

/// A window range `[moffset, moffset + len)` inside a window of `size` bytes.
pub fn check_range(size: u64, moffset: u64, len: u64) -> Result<(), Errno> {
    let aligned = moffset.is_multiple_of(DAX_ALIGN) && len.is_multiple_of(DAX_ALIGN) && len > 0;
    let inside = moffset.checked_add(len).is_some_and(|end| end <= size);
    if aligned && inside {
        Ok(())
    } else {
        Err(Errno::EINVAL)
    }
}

/// Checks a `SETUPMAPPING` against a window of `size` bytes and a file of `file_size` bytes.
pub fn check_setup(
    size: u64,
    foffset: u64,
    len: u64,
    flags: u64,
    moffset: u64,
    file_size: u64,
) -> Result<Mapping, Errno> {
    if flags & SETUPMAPPING_FLAG_WRITE != 0 {
        return Err(Errno::EROFS);
    }
    check_range(size, moffset, len)?;
    if !foffset.is_multiple_of(PAGE) || foffset.checked_add(len).is_none() {
        return Err(Errno::EINVAL);
    }
    let end = file_size.div_ceil(PAGE).saturating_mul(PAGE);
    let file_len = end.saturating_sub(foffset).min(len);
    Ok(Mapping {
        moffset,
        len,
        foffset,
        file_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 64 << 20;

    #[test]
    fn ranges_are_aligned_and_inside() {
        assert!(check_range(W, 0, DAX_ALIGN).is_ok());
        assert!(check_range(W, W - DAX_ALIGN, DAX_ALIGN).is_ok());
        assert_eq!(check_range(W, W, DAX_ALIGN), Err(Errno::EINVAL));
        assert_eq!(check_range(W, 4096, DAX_ALIGN), Err(Errno::EINVAL));
        assert_eq!(check_range(W, 0, 0), Err(Errno::EINVAL));
        assert_eq!(
            check_range(W, u64::MAX - DAX_ALIGN + 1, DAX_ALIGN),
            Err(Errno::EINVAL)
        );
    }

    #[test]
    fn writable_mappings_are_refused_and_file_ends_are_zero_pages() {
        assert_eq!(
            check_setup(W, 0, DAX_ALIGN, SETUPMAPPING_FLAG_WRITE, 0, 1 << 30),
            Err(Errno::EROFS)
        );
        let m = check_setup(W, 0, DAX_ALIGN, 0, 0, 10_000).unwrap();
        assert_eq!(m.file_len, 12_288);
        let past = check_setup(W, 1 << 30, DAX_ALIGN, 0, DAX_ALIGN, 10_000).unwrap();
        assert_eq!(past.file_len, 0);
        assert_eq!(
            check_setup(W, 100, DAX_ALIGN, 0, 0, 1 << 30),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            check_setup(W, u64::MAX - 4095, DAX_ALIGN, 0, 0, 1 << 30),
            Err(Errno::EINVAL)
        );
    }
}

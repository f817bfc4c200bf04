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
//!
//! A file is mapped shared (one copy in the host's page cache for every VM) unless it lives on
//! tmpfs and the chunk has a hole: a read fault through a shared mapping of a tmpfs hole
//! allocates a page that stays with the host's file (an 8 GiB sparse file read whole would
//! become 8 GiB of host memory, reclaimable only by swap). Such a chunk is copied instead
//! ([`place`]): its data extents only, into private pages; its holes stay zero pages.

use std::os::fd::BorrowedFd;

use nix::errno::Errno;
use nix::unistd::Whence;

use crate::abi::SETUPMAPPING_FLAG_WRITE;
use crate::sys;

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
    /// Fills `len` bytes at `moffset` with private, read-only pages holding `fd`'s data
    /// `extents` (each inside `[foffset, foffset + len)`, placed at its distance from
    /// `foffset`) and zero pages elsewhere: a copy, for a file whose holes a shared mapping
    /// would allocate (checked and aligned as for [`DaxWindow::map`]).
    fn copy(
        &mut self,
        moffset: u64,
        len: u64,
        fd: BorrowedFd<'_>,
        foffset: u64,
        extents: &[Extent],
    ) -> Result<(), Errno>;
}

/// A run of file data: `len` bytes from file offset `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// File offset.
    pub at: u64,
    /// Bytes.
    pub len: u64,
}

/// Puts `file_len` bytes of `fd` from `foffset` at window offset `moffset` (one chunk, checked
/// by [`check_setup`]): mapped shared, or copied when `fd` is on tmpfs and the range has a
/// hole (see the module docs). What a guest reads there is the file's bytes either way.
pub fn place(
    window: &mut dyn DaxWindow,
    moffset: u64,
    file_len: u64,
    fd: BorrowedFd<'_>,
    foffset: u64,
) -> Result<(), Errno> {
    if sys::faults_allocate(fd)? {
        let end = foffset.checked_add(file_len).ok_or(Errno::EINVAL)?;
        let extents = data_extents(fd, foffset, end)?;
        // One extent from the start to the file's end (inside the range's last page) or past.
        let whole = matches!(extents.as_slice(),
            [e] if e.at == foffset && e.at + e.len > end.saturating_sub(PAGE));
        if !whole {
            return window.copy(moffset, file_len, fd, foffset, &extents);
        }
    }
    window.map(moffset, file_len, fd, foffset)
}

/// The data extents of `fd` inside `[start, end)` in order, holes left out (`SEEK_DATA`,
/// `SEEK_HOLE`). Each answer must move forward, and there can be at most one extent a page
/// (and one more for an unaligned end): anything else is `EIO`, so no answer loops here.
pub fn data_extents(fd: BorrowedFd<'_>, start: u64, end: u64) -> Result<Vec<Extent>, Errno> {
    let max = usize::try_from(end.saturating_sub(start) / PAGE + 1).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let data = match sys::seek(fd, at, Whence::SeekData) {
            Ok(d) => d,
            Err(Errno::ENXIO) => break,
            Err(e) => return Err(e),
        };
        if data >= end {
            break;
        }
        let hole = sys::seek(fd, data, Whence::SeekHole)?.min(end);
        if data < at || hole <= data || out.len() == max {
            return Err(Errno::EIO);
        }
        out.push(Extent {
            at: data,
            len: hole - data,
        });
        at = hole;
    }
    Ok(out)
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
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileExt, MetadataExt};

    /// What a window was asked: `(copied, moffset, foffset, extents)`.
    #[derive(Default)]
    struct Record(Vec<(bool, u64, u64, Vec<Extent>)>);

    impl DaxWindow for Record {
        fn size(&self) -> u64 {
            64 << 20
        }
        fn map(&mut self, m: u64, _: u64, _: BorrowedFd<'_>, f: u64) -> Result<(), Errno> {
            self.0.push((false, m, f, Vec::new()));
            Ok(())
        }
        fn unmap(&mut self, _: u64, _: u64) -> Result<(), Errno> {
            Ok(())
        }
        fn copy(
            &mut self,
            m: u64,
            _: u64,
            _: BorrowedFd<'_>,
            f: u64,
            extents: &[Extent],
        ) -> Result<(), Errno> {
            self.0.push((true, m, f, extents.to_vec()));
            Ok(())
        }
    }

    /// A file on tmpfs (`/dev/shm`, which these tests need).
    fn shm_file() -> (tempfile::TempDir, std::fs::File) {
        let d = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
        let f = std::fs::File::create(d.path().join("sparse")).unwrap();
        assert!(
            sys::faults_allocate(f.as_fd()).unwrap(),
            "/dev/shm is not tmpfs here"
        );
        (d, f)
    }

    #[test]
    fn a_tmpfs_chunk_with_holes_is_copied_by_its_data_extents() {
        let (_d, f) = shm_file();
        let mib = 1u64 << 20;
        f.set_len(8 * mib + 100).unwrap();
        f.write_all_at(&vec![1u8; 2 << 20], 0).unwrap();
        f.write_all_at(&[2u8; 4096], 2 * mib + 8192).unwrap();
        f.write_all_at(&[3u8; 4096], 3 * mib).unwrap();
        f.write_all_at(&[4u8; 100], 8 * mib).unwrap();
        let blocks = f.metadata().unwrap().blocks();
        let mut w = Record::default();
        let chunk = DAX_ALIGN;
        place(&mut w, 0, chunk, f.as_fd(), 0).unwrap();
        place(&mut w, chunk, chunk, f.as_fd(), 2 * mib).unwrap();
        place(&mut w, 2 * chunk, chunk, f.as_fd(), 4 * mib).unwrap();
        place(&mut w, 3 * chunk, PAGE, f.as_fd(), 8 * mib).unwrap();
        let extent = |at, len| Extent { at, len };
        assert_eq!(
            w.0,
            [
                (false, 0, 0, vec![]),
                (
                    true,
                    chunk,
                    2 * mib,
                    vec![extent(2 * mib + 8192, 4096), extent(3 * mib, 4096)]
                ),
                (true, 2 * chunk, 4 * mib, vec![]),
                (false, 3 * chunk, 8 * mib, vec![]),
            ],
            "all data: mapped; holes: copied; the last page, data to the file's end: mapped"
        );
        assert_eq!(f.metadata().unwrap().blocks(), blocks);
        // Data, then a hole: copied too.
        w.0.clear();
        place(&mut w, 0, chunk, f.as_fd(), mib).unwrap();
        assert_eq!(w.0[0].3, [extent(mib, mib), extent(2 * mib + 8192, 4096)]);
        assert_eq!(
            data_extents(f.as_fd(), 0, 8 * mib + 100).unwrap(),
            [
                extent(0, 2 * mib),
                extent(2 * mib + 8192, 4096),
                extent(3 * mib, 4096),
                extent(8 * mib, 100)
            ]
        );
    }

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

//! The memory file: guest RAM regions back to back, in layout order.
//!
//! [`write`] skips pages that are all zeros (the file is sparse where the guest never wrote)
//! and sets the file's length to the whole RAM. [`map_private`] maps the file back
//! `MAP_PRIVATE` through vm-memory's safe `MmapRegion::build` (no `unsafe` here): pages are
//! read from the file on first touch and copied on the guest's first write, so a restored
//! guest never changes the file and any number of VMs can be restored from one snapshot at
//! once. The file is opened read-only and its length must be exactly the RAM the state
//! describes; as with any file mapping, truncating it while a restored VM runs would fault
//! that VM's host process (keep snapshots where only their owner can write).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use vm_memory::mmap::{GuestRegionMmap, MmapRegion};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::state::RegionState;
use super::{SnapshotError, io_err};
use crate::memory::GuestMemoryMmap;

/// Pages are compared with zero (and written) at this granularity.
const PAGE: usize = 4096;
/// RAM is copied out through a buffer of this many bytes.
const CHUNK: usize = 1 << 20;

/// Create `path` (`0600`, refusing an existing file) for a snapshot's contents.
pub fn create_private(path: &Path) -> Result<File, SnapshotError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("creating", path))
}

/// Write every region of `mem` to the new file `path`; returns the bytes written (the
/// non-zero pages).
pub fn write(mem: &GuestMemoryMmap, path: &Path) -> Result<u64, SnapshotError> {
    let file = create_private(path)?;
    let werr = io_err("writing", path);
    let mut buf = vec![0u8; CHUNK];
    let (mut offset, mut written) = (0u64, 0u64);
    let result = (|| {
        for region in mem.iter() {
            let len = region.len();
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(CHUNK as u64) as usize;
                let chunk = &mut buf[..n];
                mem.read_slice(chunk, GuestAddress(region.start_addr().0 + done))
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                written += write_nonzero(&file, chunk, offset + done)?;
                done += n as u64;
            }
            offset += len;
        }
        file.set_len(offset)?;
        file.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(path);
        return Err(werr(e));
    }
    Ok(written)
}

/// Write the runs of non-zero pages of `chunk` at `at` (zero pages stay holes).
fn write_nonzero(file: &File, chunk: &[u8], at: u64) -> std::io::Result<u64> {
    let mut written = 0u64;
    let mut run_start: Option<usize> = None;
    let pages = chunk.len().div_ceil(PAGE);
    for p in 0..=pages {
        let page = chunk.get(p * PAGE..((p + 1) * PAGE).min(chunk.len()));
        let zero = page.is_none_or(|b| b.iter().all(|&x| x == 0));
        match (zero, run_start) {
            (false, None) => run_start = Some(p * PAGE),
            (true, Some(start)) => {
                let end = (p * PAGE).min(chunk.len());
                file.write_all_at(&chunk[start..end], at + start as u64)?;
                written += (end - start) as u64;
                run_start = None;
            }
            _ => {}
        }
    }
    Ok(written)
}

/// Map the memory file `file` (at `path`, for messages) copy-on-write as the guest RAM
/// `regions` (in file order) of a VM of `mem_mib`: its length must be exactly theirs.
pub fn map_private(
    file: &File,
    path: &Path,
    mem_mib: u32,
    regions: &[RegionState],
) -> Result<GuestMemoryMmap, SnapshotError> {
    let found = file.metadata().map_err(io_err("reading", path))?.len();
    let expected: u64 = regions.iter().map(|r| r.size).sum();
    if found != expected {
        return Err(SnapshotError::MemoryFileSize {
            path: path.to_path_buf(),
            mem_mib,
            expected,
            found,
        });
    }
    let map_err = |e: vm_memory::mmap::MmapRegionError| {
        io_err("mapping", path)(std::io::Error::other(e.to_string()))
    };
    let mut mapped = Vec::with_capacity(regions.len());
    let mut offset = 0u64;
    for r in regions {
        let fd = file.try_clone().map_err(io_err("duplicating", path))?;
        let size = usize::try_from(r.size)
            .map_err(|_| io_err("mapping", path)(std::io::ErrorKind::InvalidInput.into()))?;
        let region = MmapRegion::build(
            Some(FileOffset::new(fd, offset)),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_NORESERVE | libc::MAP_PRIVATE,
        )
        .map_err(map_err)?;
        let region = GuestRegionMmap::new(region, GuestAddress(r.guest_addr))
            .ok_or_else(|| io_err("mapping", path)(std::io::ErrorKind::InvalidInput.into()))?;
        mapped.push(region);
        offset += r.size;
    }
    GuestMemoryMmap::from_regions(mapped)
        .map_err(|e| io_err("mapping", path)(std::io::Error::other(e.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn zero_pages_are_holes_and_the_mapping_is_copy_on_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let mib = 1usize << 20;
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 * mib)]).unwrap();
        mem.write_obj(0xdead_beef_u32, GuestAddress(0x1000))
            .unwrap();
        mem.write_obj(7u8, GuestAddress(2 * mib as u64 - 1))
            .unwrap();
        assert_eq!(write(&mem, &path).unwrap(), 2 * PAGE as u64);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 2 * mib as u64);
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(meta.blocks() * 512 < mib as u64, "the file is sparse");
        // Never overwritten.
        assert!(matches!(write(&mem, &path), Err(SnapshotError::Io { .. })));

        let regions = [RegionState {
            guest_addr: 0,
            size: 2 * mib as u64,
        }];
        let before = std::fs::read(&path).unwrap();
        let map =
            |regions: &[RegionState]| map_private(&File::open(&path).unwrap(), &path, 2, regions);
        let restored = map(&regions).unwrap();
        assert_eq!(
            restored.read_obj::<u32>(GuestAddress(0x1000)).unwrap(),
            0xdead_beef
        );
        restored.write_obj(1u64, GuestAddress(0x1000)).unwrap();
        let again = map(&regions).unwrap();
        assert_eq!(
            again.read_obj::<u32>(GuestAddress(0x1000)).unwrap(),
            0xdead_beef
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the file never changes"
        );

        let wrong = [RegionState {
            guest_addr: 0,
            size: 4 * mib as u64,
        }];
        assert!(matches!(
            map(&wrong),
            Err(SnapshotError::MemoryFileSize { found, .. }) if found == 2 * mib as u64
        ));
    }
}

//! `SETUPMAPPING` as Linux sends it, through a window that really maps what it is given.

use vm_sync::Lock;

use super::super::*;
use super::guest::Guest;
use super::tree;
use crate::abi::opcode;
use crate::fs::{Limits, ROOT_ID};

/// A window that maps what it is given for real (`mmap` of the host descriptor, read-only and
/// shared, as the kvm VMM's window does) and keeps the first bytes each mapping showed.
struct ReadingWindow {
    seen: Seen,
}

/// Each mapping's window offset and first bytes.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(u64, Vec<u8>)>>>;

impl DaxWindow for ReadingWindow {
    fn size(&self) -> u64 {
        8 * crate::dax::DAX_ALIGN
    }

    fn map(
        &mut self,
        moffset: u64,
        len: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        foffset: u64,
    ) -> Result<(), Errno> {
        use std::os::fd::AsRawFd;
        // The mapping is read within `len` bytes below and unmapped before returning.
        // SAFETY: a fresh mapping at an address the kernel picks; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                foffset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let n = (len as usize).min(16);
        // SAFETY: `p` maps at least `len >= n` readable bytes (checked by mmap's success).
        let head = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec();
        // SAFETY: `p`/`len` is exactly the mapping made above.
        unsafe { libc::munmap(p, len as usize) };
        self.seen.locked().push((moffset, head));
        Ok(())
    }

    fn unmap(&mut self, _moffset: u64, _len: u64) -> Result<(), Errno> {
        Ok(())
    }

    fn copy(
        &mut self,
        moffset: u64,
        len: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        foffset: u64,
        extents: &[crate::dax::Extent],
    ) -> Result<(), Errno> {
        let mut bytes = vec![0u8; len as usize];
        for e in extents {
            let at = (e.at - foffset) as usize;
            crate::sys::pread(fd, &mut bytes[at..at + e.len as usize], e.at)?;
        }
        bytes.truncate(16);
        self.seen.locked().push((moffset, bytes));
        Ok(())
    }
}

/// `fuse_setupmapping_in` as Linux's `fuse_setup_one_mapping` sends it: `fh` is always -1,
/// the file is the header's node id, and the range is one 2 MiB chunk, mapped for reading.
fn setupmapping(foffset: u64, moffset: u64, flags: u64) -> Vec<u8> {
    let mut b = Vec::new();
    put_u64(&mut b, u64::MAX);
    put_u64(&mut b, foffset);
    put_u64(&mut b, crate::dax::DAX_ALIGN);
    put_u64(&mut b, flags);
    put_u64(&mut b, moffset);
    b
}

#[test]
fn dax_maps_the_file_linux_names_by_node_id_with_no_handle() {
    const READ: u64 = 2;
    let d = tree();
    let big: Vec<u8> = (0..5u32 << 20)
        .map(|i| (i / 4096) as u8 ^ (i as u8))
        .collect();
    std::fs::write(d.path().join("big"), &big).unwrap();
    let seen = Seen::default();
    let window = ReadingWindow {
        seen: std::sync::Arc::clone(&seen),
    };
    let mut g = Guest::with(d.path(), Limits::default(), Some(Box::new(window)));
    let node = g.lookup(ROOT_ID, "big").entry().0;
    assert_eq!(g.open(node, libc::O_RDONLY).errno, 0);
    let chunk = crate::dax::DAX_ALIGN;
    let a = g.call(
        opcode::SETUPMAPPING,
        node,
        &setupmapping(chunk, 3 * chunk, READ),
    );
    assert_eq!(a.errno, 0, "a read mapping of a looked-up file");
    let got = seen.locked().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, 3 * chunk);
    assert_eq!(got[0].1, big[chunk as usize..chunk as usize + 16]);
    // Past the end of the file: zero pages only, nothing mapped from the host.
    let a = g.call(
        opcode::SETUPMAPPING,
        node,
        &setupmapping(2 * chunk, 0, READ),
    );
    assert_eq!(a.errno, 0);
    assert_eq!(seen.locked().len(), 2, "the file's last 1 MiB");
    let a = g.call(
        opcode::SETUPMAPPING,
        node,
        &setupmapping(6 * chunk, 0, READ),
    );
    assert_eq!(a.errno, 0);
    assert_eq!(seen.locked().len(), 2, "nothing of the file lies there");
    // Not a readable regular file, or a writable mapping: refused, nothing mapped.
    let write = setupmapping(0, 0, READ | abi::SETUPMAPPING_FLAG_WRITE);
    assert_eq!(
        g.call(opcode::SETUPMAPPING, node, &write).errno,
        libc::EROFS
    );
    let dir = g.lookup(ROOT_ID, "sub").entry().0;
    let link = g.lookup(ROOT_ID, "inside").entry().0;
    let on = |g: &mut Guest, n| {
        g.call(opcode::SETUPMAPPING, n, &setupmapping(0, 0, READ))
            .errno
    };
    assert_eq!(on(&mut g, dir), libc::EISDIR);
    assert_eq!(on(&mut g, link), libc::EINVAL);
    assert_eq!(on(&mut g, 9999), libc::EBADF);
    assert_eq!(seen.locked().len(), 2);
}

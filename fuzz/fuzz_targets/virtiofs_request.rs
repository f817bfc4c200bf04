//! Fuzz the read-only virtio-fs server: a sequence of FUSE requests (decoder and every handler)
//! against a small real tree, with a DAX window that checks every range it is asked to map.
//!
//! Input: one byte choosing the reply room (`16 << (b % 17)` bytes), then records of a
//! little-endian `u16` length and that many request bytes, served in order after an `INIT`
//! (so node ids 2, 3, ... and handles 1, 2, ... are what lookups and opens return).
#![no_main]

use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nix::errno::Errno;
use vm_virtiofs::dax::{DAX_ALIGN, DaxWindow, Extent};
use vm_virtiofs::{Fs, Limits, MAX_REQUEST_BYTES, Outcome, Server};

const WINDOW: u64 = 64 << 20;

/// A window that only checks what the server asks of it.
struct CheckedWindow;

impl DaxWindow for CheckedWindow {
    fn size(&self) -> u64 {
        WINDOW
    }
    fn map(
        &mut self,
        moffset: u64,
        len: u64,
        _fd: BorrowedFd<'_>,
        foffset: u64,
    ) -> Result<(), Errno> {
        assert!(moffset.is_multiple_of(DAX_ALIGN) && len > 0);
        assert!(len.is_multiple_of(4096) && foffset.is_multiple_of(4096));
        assert!(moffset + len <= WINDOW);
        Ok(())
    }
    fn unmap(&mut self, moffset: u64, len: u64) -> Result<(), Errno> {
        assert!(moffset.is_multiple_of(DAX_ALIGN) && len.is_multiple_of(DAX_ALIGN));
        assert!(moffset + len <= WINDOW);
        Ok(())
    }
    fn copy(
        &mut self,
        moffset: u64,
        len: u64,
        fd: BorrowedFd<'_>,
        foffset: u64,
        extents: &[Extent],
    ) -> Result<(), Errno> {
        self.map(moffset, len, fd, foffset)?;
        assert!(extents.is_sorted_by_key(|e| e.at));
        assert!(extents.iter().all(|e| e.at >= foffset && e.at + e.len <= foffset + len));
        Ok(())
    }
}

fn tree() -> &'static PathBuf {
    static TREE: OnceLock<PathBuf> = OnceLock::new();
    TREE.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("vm-fuzz-virtiofs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
        std::fs::write(d.join("a"), vec![1u8; 10_000]).unwrap();
        std::fs::write(d.join("sub/b"), b"bee").unwrap();
        std::os::unix::fs::symlink("/etc", d.join("out")).unwrap();
        std::os::unix::fs::symlink("sub/b", d.join("in")).unwrap();
        d
    })
}

fn init() -> Vec<u8> {
    let mut v = Vec::new();
    for x in [
        104u32,
        26,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        7,
        41,
        1 << 17,
        0x0fff_ffff,
    ] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.resize(104, 0);
    v
}

fuzz_target!(|data: &[u8]| {
    let Some((&room_sel, mut rest)) = data.split_first() else {
        return;
    };
    let room = 16usize << (room_sel % 17);
    let limits = Limits {
        max_inodes: 8,
        max_handles: 4,
        max_read: 64 << 10,
        max_readdir: 8 << 10,
    };
    let fs = Fs::open(tree(), limits).unwrap();
    let mut server = Server::new(fs, Some(Box::new(CheckedWindow)));
    let mut out = Vec::new();
    let init = init();
    assert!(matches!(
        server.handle(&init, init.len(), 4096, &mut out),
        Outcome::Replied { errno: 0, .. }
    ));
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        let body = &rest[2..];
        let req = &body[..n.min(body.len())];
        rest = &body[req.len()..];
        let copied = &req[..req.len().min(MAX_REQUEST_BYTES)];
        match server.handle(copied, req.len(), room, &mut out) {
            Outcome::NoReply => {}
            Outcome::Replied { len, errno } => {
                assert!(out.len() <= room && len as usize == out.len() && out.len() >= 16);
                assert_eq!(u32::from_le_bytes(out[..4].try_into().unwrap()), len);
                assert_eq!(i32::from_le_bytes(out[4..8].try_into().unwrap()), -errno);
                assert!(errno >= 0 && errno < 4096);
                assert!(errno != 0 || out.len() <= 16 + (64 << 10) + 4096);
            }
        }
        let (inodes, handles) = server.fs().usage();
        assert!(inodes <= 8 && handles <= 4);
    }
});

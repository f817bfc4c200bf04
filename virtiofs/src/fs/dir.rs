//! `READDIR` and `READDIRPLUS`: one batch of a directory from the cookie the guest passes,
//! never more than the byte budget the server gives (the guest's size, our cap and the room in
//! its reply buffers, whichever is least). A `READDIRPLUS` entry is a lookup too (its count
//! raised, as the guest expects), so the entry's size is checked against the budget *before*
//! the lookup: an entry that does not fit is left for the next batch, never counted twice.

use std::os::fd::AsFd;

use nix::errno::Errno;

use super::{Fs, Kind, ROOT_ID, Root};
use crate::abi::{self, Attr, ENTRY_OUT_LEN, Validity};
use crate::sys;

const DT_DIR: u32 = libc::DT_DIR as u32;
const DT_REG: u32 = libc::DT_REG as u32;

/// One batch asked for.
#[derive(Debug, Clone, Copy)]
pub struct Batch {
    /// The cookie to start from (0: the start).
    pub offset: u64,
    /// Most bytes to append.
    pub budget: usize,
    /// `READDIRPLUS`: `fuse_direntplus` records, each entry looked up.
    pub plus: bool,
    /// The validity given to looked-up entries.
    pub valid: Validity,
}

impl Batch {
    /// The bytes an entry named `name_len` bytes takes.
    fn size(&self, name_len: usize) -> usize {
        abi::dirent_size(name_len) + if self.plus { ENTRY_OUT_LEN } else { 0 }
    }
}

/// A `READDIRPLUS` entry with no node id (`.`, `..`, a name not looked up): the guest links
/// nothing for it.
fn write_unlinked(out: &mut Vec<u8>, ino: u64, kind: u32, valid: Validity) {
    let attr = Attr {
        ino,
        mode: kind << 12,
        ..Attr::default()
    };
    abi::write_entry(out, 0, &attr, valid);
}

impl Fs {
    /// Appends one batch of directory handle `fh` to `out` (see [`Batch`]).
    pub fn readdir(&mut self, fh: u64, b: Batch, out: &mut Vec<u8>) -> Result<(), Errno> {
        let h = self.handle(fh)?;
        if !h.dir {
            return Err(Errno::ENOTDIR);
        }
        let (nodeid, fd) = (h.nodeid, h.fd.clone());
        if self.inode(nodeid).map(|i| i.kind) == Ok(Kind::SingleFileRoot) {
            return self.readdir_single(b, out);
        }
        let start = out.len();
        sys::seek_dir(fd.as_fd(), b.offset)?;
        let mut buf = std::mem::take(&mut self.dents);
        let result = (|| {
            loop {
                let n = sys::getdents(fd.as_fd(), &mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                for d in sys::dirents(&buf[..n]) {
                    if out.len() - start + b.size(d.name.len()) > b.budget {
                        return Ok(());
                    }
                    let kind = u32::from(d.kind);
                    if b.plus && d.name != b"." && d.name != b".." {
                        match self.lookup(nodeid, d.name) {
                            Ok((node, attr)) => abi::write_entry(out, node, &attr, b.valid),
                            // Gone since it was listed: left out.
                            Err(Errno::ENOENT) => continue,
                            // Not looked up (the inode cap reached, no descriptor left, not
                            // readable): listed all the same, with no node id, so the listing
                            // stays whole; the guest's own `LOOKUP` of it gets the error.
                            Err(_) => write_unlinked(out, d.ino, kind, b.valid),
                        }
                    } else if b.plus {
                        write_unlinked(out, d.ino, kind, b.valid);
                    }
                    abi::write_dirent(out, d.ino, d.off, kind, d.name);
                }
            }
        })();
        self.dents = buf;
        result
    }

    /// The made-up root of a single-file share: `.`, `..` and the file, cookies 1..=3.
    fn readdir_single(&mut self, b: Batch, out: &mut Vec<u8>) -> Result<(), Errno> {
        let Root::SingleFile { name, file } = &self.root else {
            return Err(Errno::EBADF);
        };
        let (name, file) = (name.clone(), *file);
        let file_ino = self.getattr(file)?.ino;
        let entries: [(&[u8], u64, u32); 3] = [
            (b".", ROOT_ID, DT_DIR),
            (b"..", ROOT_ID, DT_DIR),
            (&name, file_ino, DT_REG),
        ];
        let start = out.len();
        for (i, (n, ino, kind)) in entries.iter().enumerate().skip(b.offset.min(3) as usize) {
            if out.len() - start + b.size(n.len()) > b.budget {
                break;
            }
            if b.plus && *kind == DT_REG {
                let (node, attr) = self.lookup_single(n)?;
                abi::write_entry(out, node, &attr, b.valid);
            } else if b.plus {
                write_unlinked(out, *ino, *kind, b.valid);
            }
            abi::write_dirent(out, *ino, i as u64 + 1, *kind, n);
        }
        Ok(())
    }
}

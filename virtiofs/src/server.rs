//! The dispatcher: one request's bytes in, one reply's bytes out, for a transport to carry.
//!
//! [`Server::handle`] never panics and never allocates by a size the guest chose: the request
//! is at most [`MAX_REQUEST_BYTES`] (the transport copies no more), the reply buffer grows at
//! most to the `READ` cap plus a header, and every reply is cut to the room the guest gave (a
//! `READ` or `READDIR` asks for less; a fixed-size reply that does not fit is `EINVAL`, and no
//! reply at all when not even a header fits). What it answers:
//!
//! | opcodes | answer |
//! |---|---|
//! | `INIT`, `DESTROY` | a new session (every inode but the root forgotten, every handle closed, the DAX window emptied) |
//! | `LOOKUP`, `FORGET`, `BATCH_FORGET`, `GETATTR`, `READLINK`, `STATFS`, `ACCESS` | the tree ([`crate::fs`]); the forgets have no reply |
//! | `OPEN`, `OPENDIR`, `READ`, `READDIR`, `READDIRPLUS`, `LSEEK`, `FLUSH`, `RELEASE`, `RELEASEDIR` | handles; an `OPEN` for writing or with `O_TRUNC` is `EROFS` |
//! | `GETXATTR`, `LISTXATTR` | `user.*` attributes of files and directories only |
//! | `SETUPMAPPING`, `REMOVEMAPPING` | the DAX window ([`crate::dax`]); `ENOSYS` without one |
//! | every write-like opcode | `EROFS` |
//! | anything else | `ENOSYS` |
//!
//! Before `INIT` everything else is `EIO`.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::AsFd;

use nix::errno::Errno;

use crate::abi::{
    self, GETXATTR_OUT_LEN, InHeader, KERNEL_MINOR_VERSION, KERNEL_VERSION, MIN_MINOR,
    OUT_HEADER_LEN, Validity, init, put_u16, put_u32, put_u64,
};
use crate::dax::{self, DaxWindow};
use crate::fs::Fs;
use crate::request::{self, Op};
use crate::sys;

/// Most bytes of one request a transport copies out for the decoder: enough for every request
/// served (a name of 255 bytes, 256 `REMOVEMAPPING` entries); a longer request (a `WRITE`'s
/// data) is decoded from its first bytes and refused by its opcode.
pub const MAX_REQUEST_BYTES: usize = 8192;
/// Largest extended attribute value or list served.
pub const MAX_XATTR: usize = 64 << 10;
/// Longest symlink target served (`PATH_MAX`).
const MAX_LINK: usize = 4096;
/// What `INIT` offers, intersected with what the guest asks.
const OFFERED: u64 = init::ASYNC_READ
    | init::DO_READDIRPLUS
    | init::READDIRPLUS_AUTO
    | init::PARALLEL_DIROPS
    | init::MAX_PAGES
    | init::CACHE_SYMLINKS;

/// What one request came to, for the transport's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered (an error included).
    Replied {
        /// Bytes written into the guest's buffers.
        len: u32,
        /// The errno answered, 0 for success.
        errno: i32,
    },
    /// Nothing to answer (`FORGET`), or not even a header fits, or no header was sent.
    NoReply,
}

/// The server of one share for one guest.
pub struct Server {
    fs: Fs,
    dax: Option<Box<dyn DaxWindow>>,
    session: bool,
    valid: Validity,
    scratch: Vec<u8>,
    /// What each 2 MiB chunk of the DAX window maps (a snapshot re-maps it).
    mappings: BTreeMap<u64, ChunkMapping>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("session", &self.session)
            .field("usage", &self.fs.usage())
            .field("dax", &self.dax.as_ref().map(|d| d.size()))
            .finish()
    }
}

fn errno_of(e: Errno) -> i32 {
    match e as i32 {
        0 => libc::EIO,
        n => n,
    }
}

impl Server {
    /// A server for `fs`, with a DAX window when the transport has one.
    pub fn new(fs: Fs, dax: Option<Box<dyn DaxWindow>>) -> Server {
        Server {
            fs,
            dax,
            session: false,
            valid: Validity { secs: 1 },
            scratch: Vec::new(),
            mappings: BTreeMap::new(),
        }
    }

    /// The tree (for counters and tests).
    pub fn fs(&self) -> &Fs {
        &self.fs
    }

    /// Whether a DAX window is attached.
    pub fn has_dax(&self) -> bool {
        self.dax.is_some()
    }

    /// Handles one request: `input` is what the transport copied of it (at most
    /// [`MAX_REQUEST_BYTES`]), `total` how many readable bytes the guest gave, `room` how
    /// many writable ones. The reply is left in `out` (cleared first; at most `room` bytes).
    pub fn handle(
        &mut self,
        input: &[u8],
        total: usize,
        room: usize,
        out: &mut Vec<u8>,
    ) -> Outcome {
        out.clear();
        let req = match request::decode(input, total) {
            Ok(r) => r,
            Err(e) => {
                return match e.header() {
                    Some(h) => finish(out, h, Err(Errno::EINVAL), room),
                    None => Outcome::NoReply,
                };
            }
        };
        let h = req.header;
        out.resize(OUT_HEADER_LEN, 0);
        let room_payload = room.saturating_sub(OUT_HEADER_LEN);
        let result = match req.op {
            Op::Forget { nlookup } => {
                self.fs.forget(h.nodeid, nlookup);
                return Outcome::NoReply;
            }
            Op::BatchForget { items } => {
                for (node, n) in items.iter() {
                    self.fs.forget(node, n);
                }
                return Outcome::NoReply;
            }
            Op::Init {
                major,
                minor,
                max_readahead,
                flags,
            } => self.init(major, minor, max_readahead, flags, out),
            _ if !self.session => Err(Errno::EIO),
            op => self.serve(&h, op, room_payload, out),
        };
        finish(out, &h, result, room)
    }

    fn reset(&mut self) {
        self.fs.reset();
        self.mappings.clear();
        if let Some(d) = self.dax.as_mut() {
            let size = d.size();
            if size > 0 && d.unmap(0, size).is_err() {
                tracing::debug!("virtio-fs: emptying the DAX window failed");
            }
        }
    }

    fn init(
        &mut self,
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), Errno> {
        if major != KERNEL_VERSION || minor < MIN_MINOR {
            return Err(Errno::EPROTO);
        }
        self.reset();
        self.session = true;
        let mut offered = OFFERED;
        if self.dax.is_some() {
            offered |= init::MAP_ALIGNMENT;
        }
        let limits = self.fs.limits();
        put_u32(out, KERNEL_VERSION);
        put_u32(out, minor.min(KERNEL_MINOR_VERSION));
        put_u32(out, max_readahead);
        put_u32(out, (flags & offered) as u32);
        put_u16(out, 16); // max_background
        put_u16(out, 12); // congestion_threshold
        put_u32(out, 4096); // max_write: nothing is written
        put_u32(out, 1); // time_gran: nanoseconds
        put_u16(
            out,
            (limits.max_read / 4096).clamp(1, u32::from(u16::MAX)) as u16,
        );
        put_u16(
            out,
            if self.dax.is_some() {
                dax::DAX_ALIGN_SHIFT
            } else {
                0
            },
        );
        put_u32(out, 0); // flags2
        out.resize(OUT_HEADER_LEN + abi::INIT_OUT_LEN, 0);
        Ok(())
    }

    fn serve(
        &mut self,
        h: &InHeader,
        op: Op<'_>,
        room: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), Errno> {
        let valid = self.valid;
        match op {
            Op::Destroy => {
                self.reset();
                self.session = false;
            }
            Op::Lookup { name } => {
                let (node, attr) = self.fs.lookup(h.nodeid, name)?;
                abi::write_entry(out, node, &attr, valid);
            }
            Op::Getattr { .. } => {
                let attr = self.fs.getattr(h.nodeid)?;
                abi::write_attr_out(out, &attr, valid);
            }
            Op::Readlink => {
                let base = out.len();
                out.resize(base + MAX_LINK, 0);
                let n = self.fs.readlink(h.nodeid, &mut out[base..])?;
                out.truncate(base + n);
            }
            Op::Open { flags } => {
                let acc = flags as i32 & libc::O_ACCMODE;
                if acc != libc::O_RDONLY || flags as i32 & libc::O_TRUNC != 0 {
                    return Err(Errno::EROFS);
                }
                let fh = self.fs.open_handle(h.nodeid, false)?;
                open_out(out, fh);
            }
            Op::Opendir { .. } => {
                let fh = self.fs.open_handle(h.nodeid, true)?;
                open_out(out, fh);
            }
            Op::Read { fh, offset, size } => {
                let n = (size as usize)
                    .min(self.fs.limits().max_read as usize)
                    .min(room);
                let base = out.len();
                out.resize(base + n, 0);
                let got = self.fs.read(fh, offset, &mut out[base..])?;
                out.truncate(base + got);
            }
            Op::Readdir {
                fh,
                offset,
                size,
                plus,
            } => {
                let budget = (size as usize)
                    .min(self.fs.limits().max_readdir as usize)
                    .min(room);
                let batch = crate::fs::Batch {
                    offset,
                    budget,
                    plus,
                    valid,
                };
                self.fs.readdir(fh, batch, out)?;
            }
            Op::Release { fh } => self.fs.release(fh, false)?,
            Op::Releasedir { fh } => self.fs.release(fh, true)?,
            Op::Flush { fh } => {
                self.fs.file_handle(fh)?;
            }
            Op::Statfs => statfs(&self.fs, out)?,
            Op::Getxattr { size, name } => self.getxattr(h.nodeid, name, size, out)?,
            Op::Listxattr { size } => self.listxattr(h.nodeid, size, out)?,
            Op::Access { mask } => {
                self.fs.inode(h.nodeid)?;
                if mask & libc::W_OK as u32 != 0 {
                    return Err(Errno::EROFS);
                }
            }
            Op::Lseek { fh, offset, whence } => {
                let whence = match whence as i32 {
                    libc::SEEK_DATA => nix::unistd::Whence::SeekData,
                    libc::SEEK_HOLE => nix::unistd::Whence::SeekHole,
                    _ => return Err(Errno::EINVAL),
                };
                let hd = self.fs.file_handle(fh)?;
                let at = sys::seek(hd.fd.as_fd(), offset, whence)?;
                put_u64(out, at);
            }
            Op::SetupMapping {
                fh: _,
                foffset,
                len,
                flags,
                moffset,
            } => self.setup_mapping(h.nodeid, foffset, len, flags, moffset)?,
            Op::RemoveMapping { items } => {
                let dax = self.dax.as_mut().ok_or(Errno::ENOSYS)?;
                let size = dax.size();
                for (moffset, len) in items.iter() {
                    dax::check_range(size, moffset, len)?;
                    dax.unmap(moffset, len)?;
                    let end = moffset + len;
                    self.mappings.retain(|&at, _| at < moffset || at >= end);
                }
            }
            Op::WriteLike(_) => return Err(Errno::EROFS),
            Op::Unsupported(_) => return Err(Errno::ENOSYS),
            Op::Init { .. } | Op::Forget { .. } | Op::BatchForget { .. } => {
                return Err(Errno::EINVAL);
            }
        }
        Ok(())
    }

    /// Maps a range of file `nodeid` (named by its node id: Linux sends no handle).
    fn setup_mapping(
        &mut self,
        nodeid: u64,
        foffset: u64,
        len: u64,
        flags: u64,
        moffset: u64,
    ) -> Result<(), Errno> {
        let dax = self.dax.as_mut().ok_or(Errno::ENOSYS)?;
        let fd = self.fs.mappable(nodeid)?;
        let size = u64::try_from(sys::stat(fd.as_fd())?.st_size).unwrap_or(0);
        let m = dax::check_setup(dax.size(), foffset, len, flags, moffset, size)?;
        let end = m.moffset + m.len;
        self.mappings.retain(|&at, _| at < m.moffset || at >= end);
        dax.unmap(m.moffset, m.len)?;
        let mut at = 0;
        while at < m.file_len {
            let chunk = ChunkMapping {
                moffset: m.moffset + at,
                nodeid,
                foffset: m.foffset + at,
                file_len: (m.file_len - at).min(dax::DAX_ALIGN),
            };
            let placed = dax::place(
                dax.as_mut(),
                chunk.moffset,
                chunk.file_len,
                fd.as_fd(),
                chunk.foffset,
            );
            if let Err(e) = placed {
                // What was placed goes back to zero pages, so the table stays the window.
                self.mappings.retain(|&at, _| at < m.moffset || at >= end);
                dax.unmap(m.moffset, m.len)?;
                return Err(e);
            }
            self.mappings.insert(chunk.moffset, chunk);
            at += dax::DAX_ALIGN;
        }
        Ok(())
    }

    /// The fd of inode `nodeid` when its attributes can be read (an open file or directory).
    fn xattr_fd(&self, nodeid: u64) -> Result<Option<std::os::fd::BorrowedFd<'_>>, Errno> {
        let ino = self.fs.inode(nodeid)?;
        let ok = ino.readable && matches!(ino.kind, crate::fs::Kind::File | crate::fs::Kind::Dir);
        Ok(ok.then(|| ino.fd.as_fd()))
    }

    fn getxattr(
        &mut self,
        nodeid: u64,
        name: &[u8],
        size: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Errno> {
        if !name.starts_with(b"user.") {
            return Err(Errno::ENODATA);
        }
        let cname = CString::new(name).map_err(|_| Errno::EINVAL)?;
        let mut buf = std::mem::take(&mut self.scratch);
        buf.resize(MAX_XATTR, 0);
        let r = (|| {
            let fd = self.xattr_fd(nodeid)?.ok_or(Errno::ENODATA)?;
            let n = sys::getxattr(fd, &cname, &mut buf)?;
            if size == 0 {
                put_u32(out, n as u32);
                put_u32(out, 0);
            } else if n > size as usize {
                return Err(Errno::ERANGE);
            } else {
                out.extend_from_slice(&buf[..n]);
            }
            Ok(())
        })();
        self.scratch = buf;
        r
    }

    fn listxattr(&mut self, nodeid: u64, size: u32, out: &mut Vec<u8>) -> Result<(), Errno> {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.resize(MAX_XATTR, 0);
        let r = (|| {
            let n = match self.xattr_fd(nodeid)? {
                Some(fd) => sys::listxattr(fd, &mut buf)?,
                None => 0,
            };
            let base = out.len();
            let reserve = if size == 0 { GETXATTR_OUT_LEN } else { 0 };
            out.resize(base + reserve, 0);
            let mut total = 0usize;
            for name in buf[..n]
                .split(|&b| b == 0)
                .filter(|n| n.starts_with(b"user."))
            {
                total += name.len() + 1;
                if size != 0 {
                    if total > size as usize {
                        return Err(Errno::ERANGE);
                    }
                    out.extend_from_slice(name);
                    out.push(0);
                }
            }
            if size == 0 {
                out[base..base + 4].copy_from_slice(&(total as u32).to_le_bytes());
            }
            Ok(())
        })();
        self.scratch = buf;
        r
    }
}

fn open_out(out: &mut Vec<u8>, fh: u64) {
    put_u64(out, fh);
    put_u32(out, 0); // open_flags: the guest's page cache is dropped at each open
    put_u32(out, 0);
}

fn statfs(fs: &Fs, out: &mut Vec<u8>) -> Result<(), Errno> {
    let st = sys::statvfs(fs.root_fd()?)?;
    for v in [
        st.blocks(),
        st.blocks_free(),
        st.blocks_available(),
        st.files(),
        st.files_free(),
    ] {
        put_u64(out, v);
    }
    put_u32(out, st.block_size() as u32);
    put_u32(out, st.name_max() as u32);
    put_u32(out, st.fragment_size() as u32);
    out.resize(OUT_HEADER_LEN + abi::STATFS_OUT_LEN, 0);
    Ok(())
}

/// Writes the header (or an error reply) and checks the reply fits in `room`.
fn finish(out: &mut Vec<u8>, h: &InHeader, result: Result<(), Errno>, room: usize) -> Outcome {
    let mut errno = match result {
        Ok(()) => 0,
        Err(e) => errno_of(e),
    };
    if errno != 0 || out.len() < OUT_HEADER_LEN {
        out.clear();
        out.resize(OUT_HEADER_LEN, 0);
    }
    if out.len() > room {
        errno = libc::EINVAL;
        out.truncate(OUT_HEADER_LEN);
    }
    if room < OUT_HEADER_LEN {
        out.clear();
        return Outcome::NoReply;
    }
    let len = out.len() as u32;
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[4..8].copy_from_slice(&(-errno).to_le_bytes());
    out[8..16].copy_from_slice(&h.unique.to_le_bytes());
    Outcome::Replied { len, errno }
}

mod session;
#[cfg(test)]
mod tests;

pub use session::{ChunkMapping, SessionState};

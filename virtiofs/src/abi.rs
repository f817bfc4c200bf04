//! The subset of the FUSE wire format (`include/uapi/linux/fuse.h`, protocol 7.x) a read-only
//! virtio-fs server speaks: opcodes, flags, and the structures as little-endian byte layouts.
//!
//! Nothing here is `repr(C)` or transmuted: every structure is read field by field through
//! [`Reader`] (which fails on a short buffer instead of panicking) and written field by field
//! into a `Vec<u8>`. Sizes are the ABI's and are checked by the unit tests below.

/// The FUSE major version spoken.
pub const KERNEL_VERSION: u32 = 7;
/// The highest minor version spoken (Linux 6.1+; a lower one from the guest is answered in
/// its own minor, down to [`MIN_MINOR`]).
pub const KERNEL_MINOR_VERSION: u32 = 38;
/// The lowest minor version accepted (Linux 4.20: `max_pages`, `map_alignment`).
pub const MIN_MINOR: u32 = 28;

/// `fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;
/// `fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;
/// `fuse_attr`.
pub const ATTR_LEN: usize = 88;
/// `fuse_entry_out`.
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
/// `fuse_attr_out`.
pub const ATTR_OUT_LEN: usize = 16 + ATTR_LEN;
/// `fuse_init_out` (minor 23 and up).
pub const INIT_OUT_LEN: usize = 64;
/// `fuse_open_out`.
pub const OPEN_OUT_LEN: usize = 16;
/// `fuse_kstatfs` (`fuse_statfs_out`).
pub const STATFS_OUT_LEN: usize = 80;
/// `fuse_dirent` without its name.
pub const DIRENT_LEN: usize = 24;
/// `fuse_getxattr_out`.
pub const GETXATTR_OUT_LEN: usize = 8;
/// `fuse_lseek_out`.
pub const LSEEK_OUT_LEN: usize = 8;
/// `fuse_forget_one` and `fuse_removemapping_one` (two `u64`s each).
pub const PAIR_LEN: usize = 16;

/// Longest name a lookup or an xattr request may carry (`NAME_MAX`, `XATTR_NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// Opcodes (`enum fuse_opcode`).
#[allow(missing_docs)]
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const TMPFILE: u32 = 51;
    pub const COPY_FILE_RANGE_64: u32 = 53;

    /// Every opcode that would change the tree or a file: answered `EROFS`.
    pub const WRITE_LIKE: [u32; 17] = [
        SETATTR,
        SYMLINK,
        MKNOD,
        MKDIR,
        UNLINK,
        RMDIR,
        RENAME,
        LINK,
        WRITE,
        SETXATTR,
        REMOVEXATTR,
        CREATE,
        FALLOCATE,
        RENAME2,
        COPY_FILE_RANGE,
        TMPFILE,
        COPY_FILE_RANGE_64,
    ];
}

/// `FUSE_INIT` flags (`flags`, and `flags2` shifted up by 32).
#[allow(missing_docs)]
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    /// In `flags`: `flags2` is valid.
    pub const INIT_EXT: u64 = 1 << 30;
}

/// `fuse_open_out.open_flags`: the guest may keep its page cache across opens.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// `fuse_setupmapping_in.flags`: a writable mapping was asked for.
pub const SETUPMAPPING_FLAG_WRITE: u64 = 1 << 0;

/// A little-endian cursor over a request's bytes; every read fails (`None`) past the end.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    /// What is left.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// The next `u16`.
    pub fn u16(&mut self) -> Option<u16> {
        self.bytes(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    /// The next `u32`.
    pub fn u32(&mut self) -> Option<u32> {
        let b = self.bytes(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The next `u64`.
    pub fn u64(&mut self) -> Option<u64> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
}

/// `fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InHeader {
    /// Total request length as the guest states it.
    pub len: u32,
    /// The operation.
    pub opcode: u32,
    /// The request id echoed in the reply.
    pub unique: u64,
    /// The inode the request is about.
    pub nodeid: u64,
    /// The calling guest process's ids (not used for access checks: the guest kernel checks
    /// permissions itself, `default_permissions`).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// See `uid`.
    pub pid: u32,
}

impl InHeader {
    /// Reads a header, `None` when `r` is shorter than one.
    pub fn read(r: &mut Reader<'_>) -> Option<InHeader> {
        let h = InHeader {
            len: r.u32()?,
            opcode: r.u32()?,
            unique: r.u64()?,
            nodeid: r.u64()?,
            uid: r.u32()?,
            gid: r.u32()?,
            pid: r.u32()?,
        };
        // total_extlen and padding: ignored (no extension is negotiated).
        r.u32()?;
        Some(h)
    }

    /// Appends the 40-byte header (what a guest driver sends; for tests and tools).
    pub fn write(&self, out: &mut Vec<u8>) {
        put_u32(out, self.len);
        put_u32(out, self.opcode);
        put_u64(out, self.unique);
        put_u64(out, self.nodeid);
        for v in [self.uid, self.gid, self.pid, 0] {
            put_u32(out, v);
        }
    }

    /// A whole request: this header (its `len` set to fit) and `body`.
    pub fn request(mut self, body: &[u8]) -> Vec<u8> {
        self.len = (IN_HEADER_LEN + body.len()) as u32;
        let mut v = Vec::with_capacity(self.len as usize);
        self.write(&mut v);
        v.extend_from_slice(body);
        v
    }
}

/// `fuse_attr`, as the guest will see the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

/// Appends `v` little-endian.
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends `v` little-endian.
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends `v` little-endian.
pub fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

impl Attr {
    /// Appends the 88-byte `fuse_attr`.
    pub fn write(&self, out: &mut Vec<u8>) {
        for v in [
            self.ino,
            self.size,
            self.blocks,
            self.atime,
            self.mtime,
            self.ctime,
        ] {
            put_u64(out, v);
        }
        for v in [
            self.atimensec,
            self.mtimensec,
            self.ctimensec,
            self.mode,
            self.nlink,
            self.uid,
            self.gid,
            self.rdev,
            self.blksize,
            0, // flags
        ] {
            put_u32(out, v);
        }
    }
}

/// How long the guest may cache a name or attributes, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Seconds.
    pub secs: u64,
}

/// Appends a `fuse_entry_out` for `nodeid` (0: a negative or attribute-less entry).
pub fn write_entry(out: &mut Vec<u8>, nodeid: u64, attr: &Attr, valid: Validity) {
    put_u64(out, nodeid);
    put_u64(out, 0); // generation: node ids are never reused
    put_u64(out, valid.secs); // entry_valid
    put_u64(out, valid.secs); // attr_valid
    put_u32(out, 0);
    put_u32(out, 0);
    attr.write(out);
}

/// Appends a `fuse_attr_out`.
pub fn write_attr_out(out: &mut Vec<u8>, attr: &Attr, valid: Validity) {
    put_u64(out, valid.secs);
    put_u32(out, 0);
    put_u32(out, 0);
    attr.write(out);
}

/// The bytes a `fuse_dirent` with a name of `name_len` bytes takes, padded to 8.
pub fn dirent_size(name_len: usize) -> usize {
    (DIRENT_LEN + name_len).next_multiple_of(8)
}

/// Appends a `fuse_dirent` (padded to 8 bytes).
pub fn write_dirent(out: &mut Vec<u8>, ino: u64, off: u64, kind: u32, name: &[u8]) {
    let start = out.len();
    put_u64(out, ino);
    put_u64(out, off);
    put_u32(out, name.len() as u32);
    put_u32(out, kind);
    out.extend_from_slice(name);
    out.resize(start + dirent_size(name.len()), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_the_abi_sizes() {
        let mut v = Vec::new();
        Attr::default().write(&mut v);
        assert_eq!(v.len(), ATTR_LEN);
        v.clear();
        write_entry(&mut v, 1, &Attr::default(), Validity { secs: 1 });
        assert_eq!(v.len(), ENTRY_OUT_LEN);
        v.clear();
        write_attr_out(&mut v, &Attr::default(), Validity { secs: 1 });
        assert_eq!(v.len(), ATTR_OUT_LEN);
        v.clear();
        write_dirent(&mut v, 1, 2, 4, b"abc");
        assert_eq!(v.len(), 32);
        assert_eq!(dirent_size(8), 32);
        assert_eq!(dirent_size(9), 40);
    }

    #[test]
    fn a_short_buffer_is_none_never_a_panic() {
        let bytes = [1u8; IN_HEADER_LEN - 1];
        assert_eq!(InHeader::read(&mut Reader::new(&bytes)), None);
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u32(), None);
        assert_eq!(r.u16(), Some(0x0201));
        assert_eq!(r.bytes(2), None);
        assert_eq!(r.rest(), &[3]);
    }
}

//! The read-only tree: inodes and open handles, each a host descriptor, both tables capped.
//!
//! - **Inodes** ([`Inode`]): node id → the descriptor a `LOOKUP` opened beneath its parent's.
//!   A lookup opens the name `O_PATH | O_NOFOLLOW` first and looks at what it is: a directory
//!   is opened again `O_RDONLY | O_DIRECTORY` (to list it), a regular file `O_RDONLY |
//!   O_NONBLOCK` (to read it), both by the same name beneath the same parent and kept only if
//!   they are the same inode (`st_dev`, `st_ino`) the first open found; a symlink, FIFO, socket
//!   or device stays `O_PATH` (never opened for reading: no FIFO blocks the server, no device
//!   is touched). A name the server's uid may not read stays `O_PATH` too (stat works, open is
//!   `EACCES`). One host inode is one node id however many names and lookups reach it; the
//!   guest's lookup count is kept and `FORGET` drops the entry at zero. At most
//!   [`Limits::max_inodes`] (`ENFILE` past it).
//! - **Handles** ([`Handle`]): `OPEN`/`OPENDIR` give a handle that shares the inode's
//!   descriptor (reads use `pread`; a directory is read from the cookie the guest passes, on
//!   one thread), so an open costs no descriptor; at most [`Limits::max_handles`].
//! - **A single-file share** ([`Fs::open`] of a regular file): the root is a directory made up
//!   here holding only that file under its own name (`0555`, the file's owner and times), so
//!   nothing else of its host directory is reachable.

mod attr;
mod dir;
mod session;

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, SFlag};

use crate::abi::Attr;
use crate::sys;

pub use dir::Batch;
pub use session::{FsState, RestoreError, SavedHandle, SavedInode};

/// The root's node id (FUSE's `FUSE_ROOT_ID`).
pub const ROOT_ID: u64 = 1;

/// The default inode cap ([`Limits::max_inodes`]): a launcher sizes the server's
/// `RLIMIT_NOFILE` from it.
pub const DEFAULT_MAX_INODES: usize = 32_768;

/// What one share may hold open for one guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Inodes the guest may hold (each a host descriptor).
    pub max_inodes: usize,
    /// Open handles (memory only: they share their inode's descriptor).
    pub max_handles: usize,
    /// Largest `READ` answered, in bytes (the reply buffer is this plus a header).
    pub max_read: u32,
    /// Largest `READDIR`/`READDIRPLUS` reply, in bytes.
    pub max_readdir: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_inodes: DEFAULT_MAX_INODES,
            max_handles: 16_384,
            max_read: 1 << 20,
            max_readdir: 128 << 10,
        }
    }
}

/// The fewest inodes a share is served with.
pub const MIN_INODES: u64 = 16;

impl Limits {
    /// These limits with the inodes capped to the `descriptors` a server may use, less the
    /// `reserved` ones its process keeps for itself: a guest looking up more names gets
    /// `ENFILE` from the server, never a process out of descriptors. `None` when fewer than
    /// [`MIN_INODES`] fit. One rule for both transports: the VMM's device (its share of the
    /// VMM's descriptors) and `vm-virtiofs` (its own process's).
    pub fn fit(self, descriptors: u64, reserved: u64) -> Option<Limits> {
        let fits = descriptors.saturating_sub(reserved);
        (fits >= MIN_INODES).then(|| Limits {
            max_inodes: self
                .max_inodes
                .min(usize::try_from(fits).unwrap_or(usize::MAX)),
            ..self
        })
    }
}

/// Why a share's root could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The root could not be opened or is not a directory or regular file.
    #[error("share root {path}: {errno}")]
    Root {
        /// The path.
        path: std::path::PathBuf,
        /// The cause.
        errno: Errno,
    },
}

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory (its descriptor lists it when `readable`).
    Dir,
    /// A regular file (its descriptor reads it when `readable`).
    File,
    /// A symbolic link (`O_PATH`).
    Symlink,
    /// A FIFO, socket or device (`O_PATH`, never opened).
    Other,
    /// The made-up root of a single-file share.
    SingleFileRoot,
}

/// One inode the guest holds.
#[derive(Debug)]
pub struct Inode {
    /// The descriptor (for [`Kind::SingleFileRoot`]: the file's).
    pub fd: Arc<OwnedFd>,
    /// What it is.
    pub kind: Kind,
    /// Whether `fd` is open for reading (else `O_PATH`).
    pub readable: bool,
    /// `(st_dev, st_ino)` on the host.
    key: (u64, u64),
    /// The guest's lookup count.
    nlookup: u64,
    /// Never forgotten (the root, a single file's inode).
    pinned: bool,
    /// The directory it was first looked up in, and the name (what a restored session
    /// resolves again; 0 and empty for a pinned inode).
    parent: u64,
    name: Vec<u8>,
}

/// An open handle.
#[derive(Debug, Clone)]
pub struct Handle {
    /// The inode it was opened on.
    pub nodeid: u64,
    /// Its descriptor (shared with the inode, and kept if the guest forgets the inode).
    pub fd: Arc<OwnedFd>,
    /// Opened with `OPENDIR`.
    pub dir: bool,
}

/// The share's root as opened.
#[derive(Debug)]
enum Root {
    Dir,
    SingleFile { name: Vec<u8>, file: u64 },
}

/// The tree of one share, as one guest sees it.
#[derive(Debug)]
pub struct Fs {
    root: Root,
    inodes: HashMap<u64, Inode>,
    by_key: HashMap<(u64, u64), u64>,
    next_node: u64,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    limits: Limits,
    /// Reused `getdents64` buffer.
    dents: Vec<u8>,
}

fn kind_of(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFREG => Kind::File,
        SFlag::S_IFLNK => Kind::Symlink,
        _ => Kind::Other,
    }
}

fn key_of(st: &FileStat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// `name` in `dir` (already opened `O_PATH` as `path_fd`, `st` its attributes) opened again
/// to be read when it is a directory or regular file and the same inode is found; else the
/// `O_PATH` descriptor (not readable).
fn open_to_read(
    dir: BorrowedFd<'_>,
    name: &[u8],
    path_fd: OwnedFd,
    st: &FileStat,
) -> (OwnedFd, bool) {
    let key = key_of(st);
    match read_flags(kind_of(st))
        .and_then(|f| sys::open_beneath(dir, name, f).ok())
        .filter(|fd| sys::stat(fd.as_fd()).is_ok_and(|s| key_of(&s) == key))
    {
        Some(fd) => (fd, true),
        None => (path_fd, false),
    }
}

/// The flags a directory or regular file is opened again with, to be read.
fn read_flags(kind: Kind) -> Option<OFlag> {
    match kind {
        Kind::Dir => Some(OFlag::O_RDONLY | OFlag::O_DIRECTORY),
        Kind::File => Some(OFlag::O_RDONLY | OFlag::O_NONBLOCK),
        _ => None,
    }
}

impl Fs {
    /// Opens the share at `path` (a directory, or a single regular file), decided by the host.
    pub fn open(path: &Path, limits: Limits) -> Result<Fs, FsError> {
        let err = |errno| FsError::Root {
            path: path.to_path_buf(),
            errno,
        };
        let probe = sys::open_root(path, OFlag::O_PATH).map_err(err)?;
        let st = sys::stat(probe.as_fd()).map_err(err)?;
        let kind = kind_of(&st);
        let flags = read_flags(kind).ok_or(err(Errno::EINVAL))?;
        let fd = sys::open_root(path, flags).map_err(err)?;
        let st2 = sys::stat(fd.as_fd()).map_err(err)?;
        if key_of(&st2) != key_of(&st) {
            return Err(err(Errno::ESTALE));
        }
        let mut fs = Fs {
            root: Root::Dir,
            inodes: HashMap::new(),
            by_key: HashMap::new(),
            next_node: ROOT_ID + 1,
            handles: HashMap::new(),
            next_fh: 1,
            limits,
            dents: vec![0u8; 32 << 10],
        };
        let fd = Arc::new(fd);
        let pinned = |fd: Arc<OwnedFd>, kind, key| Inode {
            fd,
            kind,
            readable: true,
            key,
            nlookup: 1,
            pinned: true,
            parent: 0,
            name: Vec::new(),
        };
        if kind == Kind::Dir {
            fs.inodes
                .insert(ROOT_ID, pinned(fd, Kind::Dir, key_of(&st)));
            fs.by_key.insert(key_of(&st), ROOT_ID);
        } else {
            use std::os::unix::ffi::OsStrExt;
            let name = path
                .file_name()
                .map(|n| n.as_bytes().to_vec())
                .ok_or(err(Errno::EINVAL))?;
            let file = fs.next_node;
            fs.next_node += 1;
            fs.inodes
                .insert(ROOT_ID, pinned(fd.clone(), Kind::SingleFileRoot, (0, 0)));
            fs.inodes.insert(file, pinned(fd, Kind::File, key_of(&st)));
            fs.by_key.insert(key_of(&st), file);
            fs.root = Root::SingleFile { name, file };
        }
        Ok(fs)
    }

    /// The limits it was opened with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// How many inodes and handles the guest holds.
    pub fn usage(&self) -> (usize, usize) {
        (self.inodes.len(), self.handles.len())
    }

    /// Forgets every inode but the pinned ones and closes every handle (a new session).
    pub fn reset(&mut self) {
        self.handles.clear();
        self.inodes.retain(|_, i| i.pinned);
        // In place: a new map would draw hash keys (`getrandom`), which a worker's seccomp
        // filter does not allow.
        let inodes = &self.inodes;
        self.by_key.retain(|_, node| inodes.contains_key(node));
    }

    /// The inode `nodeid`.
    pub fn inode(&self, nodeid: u64) -> Result<&Inode, Errno> {
        self.inodes.get(&nodeid).ok_or(Errno::EBADF)
    }

    /// The handle `fh`.
    pub fn handle(&self, fh: u64) -> Result<&Handle, Errno> {
        self.handles.get(&fh).ok_or(Errno::EBADF)
    }

    /// The root's descriptor (for `STATFS`).
    pub fn root_fd(&self) -> Result<BorrowedFd<'_>, Errno> {
        Ok(self.inode(ROOT_ID)?.fd.as_fd())
    }

    /// The guest's view of inode `nodeid`.
    pub fn getattr(&self, nodeid: u64) -> Result<Attr, Errno> {
        let ino = self.inode(nodeid)?;
        let st = sys::stat(ino.fd.as_fd())?;
        Ok(match ino.kind {
            Kind::SingleFileRoot => attr::single_file_root(&st),
            _ => attr::from_stat(&st),
        })
    }

    /// `name` in directory `parent`: its node id (its lookup count raised by one) and attributes.
    pub fn lookup(&mut self, parent: u64, name: &[u8]) -> Result<(u64, Attr), Errno> {
        let dir = self.inode(parent)?;
        match dir.kind {
            Kind::Dir => {}
            Kind::SingleFileRoot => return self.lookup_single(name),
            _ => return Err(Errno::ENOTDIR),
        }
        let dir_fd = dir.fd.clone();
        let path_fd = sys::open_beneath(dir_fd.as_fd(), name, OFlag::O_PATH)?;
        let st = sys::stat(path_fd.as_fd())?;
        let key = key_of(&st);
        if let Some(&node) = self.by_key.get(&key)
            && let Some(ino) = self.inodes.get_mut(&node)
        {
            ino.nlookup = ino.nlookup.saturating_add(1);
            return Ok((node, attr::from_stat(&st)));
        }
        if self.inodes.len() >= self.limits.max_inodes {
            return Err(Errno::ENFILE);
        }
        let (fd, readable) = open_to_read(dir_fd.as_fd(), name, path_fd, &st);
        let node = self.next_node;
        self.next_node += 1;
        self.insert(node, parent, name, fd, readable, &st, 1);
        Ok((node, attr::from_stat(&st)))
    }

    /// Adds inode `node` (`name` in `parent`) with `nlookup` lookups.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        node: u64,
        parent: u64,
        name: &[u8],
        fd: OwnedFd,
        readable: bool,
        st: &FileStat,
        nlookup: u64,
    ) {
        let key = key_of(st);
        self.inodes.insert(
            node,
            Inode {
                fd: Arc::new(fd),
                kind: kind_of(st),
                readable,
                key,
                nlookup,
                pinned: false,
                parent,
                name: name.to_vec(),
            },
        );
        self.by_key.insert(key, node);
    }

    fn lookup_single(&mut self, name: &[u8]) -> Result<(u64, Attr), Errno> {
        let Root::SingleFile { name: own, file } = &self.root else {
            return Err(Errno::ENOENT);
        };
        if name != own.as_slice() {
            return Err(Errno::ENOENT);
        }
        let file = *file;
        let attr = self.getattr(file)?;
        if let Some(ino) = self.inodes.get_mut(&file) {
            ino.nlookup = ino.nlookup.saturating_add(1);
        }
        Ok((file, attr))
    }

    /// The guest dropped `n` lookups of `nodeid` (unknown ids are ignored: `FORGET` has no
    /// answer).
    pub fn forget(&mut self, nodeid: u64, n: u64) {
        let Some(ino) = self.inodes.get_mut(&nodeid) else {
            return;
        };
        ino.nlookup = ino.nlookup.saturating_sub(n);
        if ino.nlookup == 0 && !ino.pinned {
            let key = ino.key;
            self.inodes.remove(&nodeid);
            if self.by_key.get(&key) == Some(&nodeid) {
                self.by_key.remove(&key);
            }
        }
    }

    /// Opens `nodeid` for reading (`dir`: with `OPENDIR`).
    pub fn open_handle(&mut self, nodeid: u64, dir: bool) -> Result<u64, Errno> {
        let ino = self.inode(nodeid)?;
        match (ino.kind, dir) {
            (Kind::File, false) | (Kind::Dir | Kind::SingleFileRoot, true) => {}
            (Kind::Dir | Kind::SingleFileRoot, false) => return Err(Errno::EISDIR),
            (_, true) => return Err(Errno::ENOTDIR),
            (Kind::Symlink, false) => return Err(Errno::ELOOP),
            (_, false) => return Err(Errno::ENXIO),
        }
        if !ino.readable {
            return Err(Errno::EACCES);
        }
        if self.handles.len() >= self.limits.max_handles {
            return Err(Errno::ENFILE);
        }
        let handle = Handle {
            nodeid,
            fd: ino.fd.clone(),
            dir,
        };
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, handle);
        Ok(fh)
    }

    /// Closes handle `fh` (`dir`: a directory handle); an unknown one is `EBADF`.
    pub fn release(&mut self, fh: u64, dir: bool) -> Result<(), Errno> {
        match self.handles.get(&fh) {
            Some(h) if h.dir == dir => {
                self.handles.remove(&fh);
                Ok(())
            }
            _ => Err(Errno::EBADF),
        }
    }

    /// The file handle `fh` (not a directory's).
    pub fn file_handle(&self, fh: u64) -> Result<&Handle, Errno> {
        self.handle(fh).and_then(|h| match h.dir {
            false => Ok(h),
            true => Err(Errno::EISDIR),
        })
    }

    /// The descriptor of regular file `nodeid`, to be mapped for DAX: Linux names the file of
    /// a `SETUPMAPPING` by its node id alone (its `fh` is always -1), so no handle is needed.
    pub fn mappable(&self, nodeid: u64) -> Result<Arc<OwnedFd>, Errno> {
        let ino = self.inode(nodeid)?;
        match ino.kind {
            Kind::File if ino.readable => Ok(ino.fd.clone()),
            Kind::File => Err(Errno::EACCES),
            Kind::Dir | Kind::SingleFileRoot => Err(Errno::EISDIR),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Reads up to `buf.len()` bytes of handle `fh` at `offset`.
    pub fn read(&self, fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let h = self.file_handle(fh)?;
        sys::pread(h.fd.as_fd(), buf, offset)
    }

    /// The target of symlink `nodeid`, into `buf`.
    pub fn readlink(&self, nodeid: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let ino = self.inode(nodeid)?;
        if ino.kind != Kind::Symlink {
            return Err(Errno::EINVAL);
        }
        sys::readlink(ino.fd.as_fd(), buf)
    }
}

#[cfg(test)]
mod tests;

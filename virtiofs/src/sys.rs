//! The system calls the server makes on the host tree, each behind a safe wrapper. Every path
//! operation is relative to a descriptor the server holds and names one component the decoder
//! already checked (no `/`, not `.` or `..`), resolved by `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS` and `O_NOFOLLOW`: a host symlink is opened as itself (`O_PATH`),
//! never followed, and nothing resolves outside the directory it started from.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::FileStat;

/// Opens `name` beneath `dir` with `flags` (plus `O_NOFOLLOW | O_CLOEXEC`), confined.
pub fn open_beneath(dir: BorrowedFd<'_>, name: &[u8], flags: OFlag) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    nix::fcntl::openat2(dir, name, how)
}

/// `fstat`: works on `O_PATH` descriptors too.
pub fn stat(fd: BorrowedFd<'_>) -> Result<FileStat, Errno> {
    nix::sys::stat::fstat(fd)
}

/// `pread` into `buf` at `offset`, retried on `EINTR`; fewer bytes at end of file.
pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
    let off = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
    loop {
        match nix::sys::uio::pread(fd, buf, off) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// The target of the symlink `fd` was opened as (`O_PATH | O_NOFOLLOW`), into `buf`.
pub fn readlink(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for `buf.len()` bytes and the path is a static NUL-terminated
    // empty string (readlinkat on the descriptor itself).
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    usize::try_from(n).map_err(|_| Errno::last())
}

/// Moves the directory stream of `fd` to `offset` (a cookie `getdents64` gave).
pub fn seek_dir(fd: BorrowedFd<'_>, offset: u64) -> Result<(), Errno> {
    let off = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
    nix::unistd::lseek(fd, off, nix::unistd::Whence::SeekSet).map(|_| ())
}

/// `lseek` with `whence` (`SEEK_DATA`/`SEEK_HOLE`) on a file.
pub fn seek(fd: BorrowedFd<'_>, offset: u64, whence: nix::unistd::Whence) -> Result<u64, Errno> {
    let off = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
    nix::unistd::lseek(fd, off, whence).map(|o| o as u64)
}

/// Whether `fd`'s file lives in memory that a shared mapping's read fault allocates: tmpfs
/// (shmem). A read fault on a hole of such a file allocates a page that stays with the file;
/// `pread` of a hole, and a fault on a disk file system's hole (reclaimable page cache), do not.
pub fn faults_allocate(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    let fs = nix::sys::statfs::fstatfs(fd)?;
    Ok(fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// Reads directory entries of `fd` into `buf` (`getdents64`); 0 at the end.
pub fn getdents(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for `buf.len()` bytes; the kernel writes at most that many.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    usize::try_from(n).map_err(|_| Errno::last())
}

/// One `linux_dirent64` of a [`getdents`] buffer.
#[derive(Debug, Clone, Copy)]
pub struct Dirent<'a> {
    /// Inode number.
    pub ino: u64,
    /// The cookie of the entry after this one.
    pub off: u64,
    /// `DT_*`.
    pub kind: u8,
    /// The name, without its NUL.
    pub name: &'a [u8],
}

/// The entries of the first `len` bytes of a [`getdents`] buffer (a malformed record ends the
/// walk: the kernel wrote it, but nothing here trusts a length it did not check).
pub fn dirents(buf: &[u8]) -> impl Iterator<Item = Dirent<'_>> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let mut r = crate::abi::Reader::new(rest);
        let ino = r.u64()?;
        let off = r.u64()?;
        let reclen = usize::from(r.u16()?);
        let kind = r.bytes(1)?[0];
        if reclen < 20 || reclen > rest.len() {
            return None;
        }
        let raw = &rest[19..reclen];
        let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
        rest = &rest[reclen..];
        Some(Dirent {
            ino,
            off,
            kind,
            name,
        })
    })
}

/// `fstatvfs` of the tree's file system.
pub fn statvfs(fd: BorrowedFd<'_>) -> Result<nix::sys::statvfs::Statvfs, Errno> {
    nix::sys::statvfs::fstatvfs(fd)
}

/// `fgetxattr`; with an empty `buf`, the value's size.
pub fn getxattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `name` is NUL-terminated and `buf` valid for `buf.len()` bytes (a null pointer
    // with length 0 asks for the size).
    let n = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    usize::try_from(n).map_err(|_| Errno::last())
}

/// `flistxattr` into `buf` (NUL-separated names).
pub fn listxattr(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for `buf.len()` bytes.
    let n = unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    usize::try_from(n).map_err(|_| Errno::last())
}

/// Opens the share's root (`path`, decided by the host) with `flags`, without following a
/// final symlink.
pub fn open_root(path: &std::path::Path, flags: OFlag) -> Result<OwnedFd, Errno> {
    nix::fcntl::open(
        path,
        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
}

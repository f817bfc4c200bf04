//! Filesystem calls with no std equivalent: `mount(2)`, `openat2(2)` with resolve flags,
//! `fstat`/`mkdirat`/`renameat`/`unlinkat`/`fchownat` on descriptors, bounded directory
//! listing of a descriptor, `BLKROSET`/`BLKFLSBUF`, `umount2`, entering a root (`pivot_root` in a
//! mount namespace of its own), `sync`, and pointing the standard descriptors at a file.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::check;

/// `mount(2)`: mount `src` (of type `fstype`, with `data` as its options) on `target`, or, with
/// `MS_MOVE`/`MS_BIND` in `flags`, move or bind it (type and data `None`).
pub fn mount(
    src: &CStr,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> std::io::Result<()> {
    let fstype = fstype.map_or(std::ptr::null(), CStr::as_ptr);
    let data = data.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call; the
    // kernel only reads them.
    check(unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype, flags, data.cast()) })?;
    Ok(())
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// One `openat2(2)` call: open `path` relative to `dir` with `flags` (plus `O_CLOEXEC`),
/// `mode` for a created file, and the `RESOLVE_*` bits in `resolve`. Errors are the kernel's
/// (`EAGAIN`/`EINTR` included: the caller decides whether to retry).
pub fn openat2(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> std::io::Result<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: u64::from(mode),
        resolve,
    };
    // SAFETY: a valid directory fd, a NUL-terminated path and an open_how of the size we
    // pass, all outliving the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstat(2)` of an open descriptor.
pub fn fstat(fd: BorrowedFd<'_>) -> std::io::Result<libc::stat> {
    // SAFETY: `stat` is plain data; all-zero is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; the kernel writes one `stat` into ours.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `mkdirat(2)`: create directory `name` (one component) in `dir` with `mode`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t) -> std::io::Result<()> {
    // SAFETY: dir is an open descriptor; name is NUL-terminated and outlives the call.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })?;
    Ok(())
}

/// Give the file open on `fd` (an `O_PATH` descriptor will do) to `uid`:`gid`
/// (`fchownat` with `AT_EMPTY_PATH`: the descriptor itself, never a path that could be swapped).
pub fn chown_fd(fd: BorrowedFd<'_>, uid: libc::uid_t, gid: libc::gid_t) -> std::io::Result<()> {
    // SAFETY: fd is open; the empty path with AT_EMPTY_PATH names it; the path is a static
    // NUL-terminated string.
    check(unsafe { libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) })?;
    Ok(())
}

/// `renameat(2)` within one directory: `from` over `to` (one component each), atomically.
pub fn renameat(dir: BorrowedFd<'_>, from: &CStr, to: &CStr) -> std::io::Result<()> {
    // SAFETY: dir is an open descriptor; both names are NUL-terminated and outlive the call.
    check(unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) })?;
    Ok(())
}

/// `unlinkat(2)`: remove the non-directory `name` (one component) from `dir`.
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr) -> std::io::Result<()> {
    // SAFETY: dir is an open descriptor; name is NUL-terminated and outlives the call.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })?;
    Ok(())
}

/// The entry names of the open directory `dir` (not `.`/`..`), at most `max + 1` of them (so
/// a caller can tell "more than `max`"). Reads through a duplicate of `dir`, which shares its
/// file offset: list a freshly opened descriptor, once.
pub fn read_dir_names(dir: BorrowedFd<'_>, max: usize) -> std::io::Result<Vec<Vec<u8>>> {
    let dup = dir.try_clone_to_owned()?;
    // SAFETY: fdopendir takes a descriptor we own; on success the DIR stream owns it.
    let d = unsafe { libc::fdopendir(dup.as_raw_fd()) };
    if d.is_null() {
        return Err(std::io::Error::last_os_error());
    }
    std::mem::forget(dup); // now owned by the DIR stream, closed by closedir
    let mut names = Vec::new();
    while names.len() <= max {
        // SAFETY: d is a valid DIR stream until closedir below.
        let ent = unsafe { libc::readdir64(d) };
        if ent.is_null() {
            break;
        }
        // SAFETY: readdir64 returned a valid entry, live until the next readdir64/closedir.
        let d_name = unsafe { &(*ent).d_name };
        // SAFETY: d_name is NUL-terminated within the entry; the bytes are copied below,
        // before the next readdir64/closedir.
        let name = unsafe { CStr::from_ptr(d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    // SAFETY: d came from fdopendir and is closed exactly once.
    unsafe { libc::closedir(d) };
    Ok(names)
}

const BLKROSET: libc::c_ulong = 0x125d;

/// Make the block device open on `fd` read-only in the kernel (`BLKROSET`): no write reaches
/// it afterwards, whoever opens it.
pub fn set_block_read_only(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: BLKROSET reads one int from the pointer, which outlives the call; fd is open.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), BLKROSET as _, &one) })?;
    Ok(())
}

const BLKFLSBUF: libc::c_ulong = 0x1261;

/// Drop the cached blocks of the block device open on `fd` (`BLKFLSBUF`): the next read goes
/// to the device, so data the host wrote after the kernel first read it is seen.
pub fn flush_block_buffers(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: BLKFLSBUF takes no argument; fd is open.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), BLKFLSBUF as _, 0) })?;
    Ok(())
}

/// `umount2(2)` of `target` with `flags` (0: fails with `EBUSY` rather than detaching).
pub fn umount(target: &CStr, flags: libc::c_int) -> std::io::Result<()> {
    // SAFETY: `target` is a NUL-terminated string that outlives the call.
    check(unsafe { libc::umount2(target.as_ptr(), flags) })?;
    Ok(())
}

/// Makes the mount `root` this process's `/` in a mount namespace of its own, as container
/// runtimes do: `unshare(CLONE_NEWNS)`, every mount private, `pivot_root(".", ".")` inside
/// `root` and the old root detached (so no `chroot` trick leads back out), then `chdir(cwd)`
/// resolved inside it. Async-signal-safe (between `fork` and `exec`): both paths are
/// allocated before the fork.
pub fn pivot_into(root: &CStr, cwd: &CStr) -> std::io::Result<()> {
    super::secure::private_mounts()?;
    super::secure::pivot_here(root)?;
    super::secure::chdir(cwd)
}

/// `sync(2)`: flush every filesystem.
pub fn sync() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// A standard descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdFd {
    In = 0,
    Out = 1,
    Err = 2,
}

/// Point standard descriptor `to` at the file open on `fd` (`dup2`). Rust's own stdio handles
/// keep working: they refer to the descriptor number, not to what it was.
pub fn replace_std_fd(fd: BorrowedFd<'_>, to: StdFd) -> std::io::Result<()> {
    // SAFETY: dup2 onto 0, 1 or 2, which no OwnedFd of ours owns (std's stdio handles
    // only borrow the numbers); fd is open.
    check(unsafe { libc::dup2(fd.as_raw_fd(), to as libc::c_int) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn dir_fd(p: &std::path::Path) -> OwnedFd {
        std::fs::File::open(p).unwrap().into()
    }

    #[test]
    fn listing_is_bounded_and_skips_dot_entries() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::write(tmp.path().join(format!("f{i}")), b"").unwrap();
        }
        let mut all = read_dir_names(dir_fd(tmp.path()).as_fd(), 100).unwrap();
        all.sort();
        assert_eq!(all.len(), 10);
        assert!(all.iter().all(|n| n.starts_with(b"f")), "{all:?}");
        // At most max + 1: enough to tell "more than max".
        assert_eq!(
            read_dir_names(dir_fd(tmp.path()).as_fd(), 3).unwrap().len(),
            4
        );
    }

    #[test]
    fn openat2_beneath_refuses_an_escaping_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("inside"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", tmp.path().join("out")).unwrap();
        let root = dir_fd(tmp.path());
        let beneath = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        let fd = openat2(root.as_fd(), c"inside", libc::O_RDONLY, 0, beneath).unwrap();
        assert_eq!(fstat(fd.as_fd()).unwrap().st_size, 1);
        let err = openat2(root.as_fd(), c"out/passwd", libc::O_RDONLY, 0, beneath).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{err}");
        mkdirat(root.as_fd(), c"d", 0o700).unwrap();
        let err = mkdirat(root.as_fd(), c"d", 0o700).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
    }
}

//! Filesystem operations confined to one directory tree (the image being unpacked).
//!
//! Every path inside the tree is resolved by the kernel with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` relative to the tree's root fd: `..`
//! and symlinks (absolute or relative, planted by an earlier entry or layer) resolve as they
//! would inside the image and can never leave it. The last path component is then handled
//! through `/proc/self/fd/<parent fd>/<name>` with calls that never follow a final symlink
//! (`O_EXCL`/`O_NOFOLLOW` creates, `lchown`, `AT_SYMLINK_NOFOLLOW`, `linkat` without
//! `AT_SYMLINK_FOLLOW`).

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

const IN_ROOT: u64 = vm_sys::fs::RESOLVE_IN_ROOT | vm_sys::fs::RESOLVE_NO_MAGICLINKS;

/// Opens `path` (relative, `""` = the root) inside the tree rooted at `root`.
pub(crate) fn open_in_root(root: BorrowedFd<'_>, path: &OsStr, flags: i32) -> io::Result<OwnedFd> {
    vm_sys::fs::openat2(root, path, flags, 0, IN_ROOT).map_err(io::Error::from)
}

/// The directory `dir` (an fd inside the tree) as a path, for the final-component calls.
pub(crate) fn at(dir: BorrowedFd<'_>, name: &OsStr) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name)
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Removes `name` in `dir` whatever it is (a directory with everything in it); absent is fine.
pub(crate) fn remove(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let p = at(dir, name);
    match std::fs::symlink_metadata(&p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        // remove_dir_all does not follow symlinks inside the directory.
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
        Ok(_) => std::fs::remove_file(&p),
    }
}

/// Sets the times of `name` in `dir` without following a final symlink.
pub(crate) fn set_mtime(dir: BorrowedFd<'_>, name: &OsStr, secs: u64) -> io::Result<()> {
    let c = cstr(name)?;
    let t = libc::timespec {
        tv_sec: secs.min(i64::MAX as u64) as libc::time_t,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: a valid dirfd, a NUL-terminated name and two timespecs.
    let rc = unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Creates a FIFO `name` in `dir`.
pub(crate) fn mkfifo(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: a valid dirfd and a NUL-terminated name.
    let rc = unsafe { libc::mkfifoat(dir.as_raw_fd(), c.as_ptr(), mode) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets extended attribute `key` on `path` without following a final symlink.
pub(crate) fn set_xattr(path: &std::path::Path, key: &str, value: &[u8]) -> io::Result<()> {
    let p = cstr(path.as_os_str())?;
    let k = cstr(OsStr::new(key))?;
    // SAFETY: NUL-terminated path and key, and a value buffer of the length passed.
    let rc = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            k.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

//! Path resolution the kernel confines: `openat2(2)` relative to a directory fd, with resolve
//! flags. Host crates that open a path someone else controls (a tree being unpacked, a file
//! kubelet named, a snapshot directory) resolve it here, so `..`, symlinks and magic links are
//! handled by the kernel in one call instead of by string checks that race with the tree.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;

/// Resolve flags (`RESOLVE_*`), re-exported for callers.
pub use libc::{RESOLVE_BENEATH, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};

/// The kernel's `struct open_how`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `path` relative to `dir` with open `flags` (plus `O_CLOEXEC`), `mode` for a create,
/// and `resolve` (`RESOLVE_*`): one `openat2(2)` call, retried on `EAGAIN` (a rename raced the
/// lookup) and `EINTR`. `""` names `dir` itself. A path with a NUL byte is `EINVAL`.
pub fn openat2(
    dir: BorrowedFd<'_>,
    path: &OsStr,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> Result<OwnedFd, Errno> {
    let path = if path.is_empty() {
        OsStr::new(".")
    } else {
        path
    };
    let c = CString::new(path.as_bytes()).map_err(|_| Errno::EINVAL)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: u64::from(mode),
        resolve,
    };
    loop {
        // SAFETY: `dir` is a live descriptor, `c` a NUL-terminated path and `how` an open_how
        // of exactly the size passed; the kernel reads both and writes nothing.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                c.as_ptr(),
                &how,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        match Errno::last() {
            Errno::EAGAIN | Errno::EINTR => continue,
            e => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn open_dir(p: &std::path::Path) -> OwnedFd {
        std::fs::File::open(p).unwrap().into()
    }

    #[test]
    fn no_symlinks_refuses_a_link_anywhere_in_the_path() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/f"), b"x").unwrap();
        std::os::unix::fs::symlink("a", d.path().join("l")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("a/p")).unwrap();
        let root = open_dir(d.path());
        let flags = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
        assert!(openat2(root.as_fd(), OsStr::new("a/f"), libc::O_RDONLY, 0, flags).is_ok());
        let e = openat2(root.as_fd(), OsStr::new("l/f"), libc::O_RDONLY, 0, flags);
        assert_eq!(e.unwrap_err(), Errno::ELOOP);
        let e = openat2(root.as_fd(), OsStr::new("a/p"), libc::O_RDONLY, 0, flags);
        assert_eq!(e.unwrap_err(), Errno::ELOOP);
        let e = openat2(root.as_fd(), OsStr::new("../x"), libc::O_RDONLY, 0, flags);
        assert_eq!(e.unwrap_err(), Errno::EXDEV);
        let e = openat2(root.as_fd(), OsStr::new("a\0b"), libc::O_RDONLY, 0, flags);
        assert_eq!(e.unwrap_err(), Errno::EINVAL);
    }
}

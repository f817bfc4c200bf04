//! The calls that confine a container's process: capability sets (`capset`, the bounding
//! and ambient sets, `PR_SET_KEEPCAPS`), a seccomp filter, namespaces (`unshare`, `setns`)
//! and the mount steps of a container's root. Every function here is async-signal-safe (it
//! allocates nothing and takes no lock) unless its doc says otherwise, so it may run between
//! `fork` and `exec`; what it reads was allocated before the fork.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::check;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `capset(2)` of the calling thread: its effective, permitted and inheritable sets, one bit
/// per capability number.
pub fn capset(effective: u64, permitted: u64, inheritable: u64) -> std::io::Result<()> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let word = |set: u64, i: u32| (set >> (32 * i)) as u32;
    let data = [0, 1].map(|i| CapData {
        effective: word(effective, i),
        permitted: word(permitted, i),
        inheritable: word(inheritable, i),
    });
    // SAFETY: the header and the two data words are ours and outlive the call; the kernel
    // only reads them (version 3 takes two words).
    check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } as libc::c_int)?;
    Ok(())
}

/// `PR_SET_KEEPCAPS`: keep the permitted set across a `setuid` away from root.
pub fn keep_caps(on: bool) -> std::io::Result<()> {
    prctl(libc::PR_SET_KEEPCAPS, libc::c_ulong::from(on), 0)
}

/// `PR_CAP_AMBIENT_RAISE` of `cap` (it must be permitted and inheritable).
pub fn raise_ambient(cap: u32) -> std::io::Result<()> {
    let raise = libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong;
    prctl(libc::PR_CAP_AMBIENT, raise, libc::c_ulong::from(cap))
}

fn prctl(op: libc::c_int, a: libc::c_ulong, b: libc::c_ulong) -> std::io::Result<()> {
    // SAFETY: integer-argument operations only.
    check(unsafe { libc::prctl(op, a, b, 0, 0) })?;
    Ok(())
}

/// Installs the seccomp filter `program` on the calling thread (`SECCOMP_SET_MODE_FILTER`).
/// Needs `no_new_privs` or `CAP_SYS_ADMIN`.
pub fn install_filter(program: &[libc::sock_filter]) -> std::io::Result<()> {
    let len =
        u16::try_from(program.len()).map_err(|_| std::io::Error::from_raw_os_error(libc::E2BIG))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: the program and its header outlive the call; the kernel copies the program.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    check(r as libc::c_int)?;
    Ok(())
}

/// `setrlimit(2)` of `resource` (an `RLIMIT_*` number).
pub fn set_rlimit(resource: u32, soft: u64, hard: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: the kernel reads the rlimit we own, which outlives the call.
    check(unsafe { libc::setrlimit(resource as _, &limit) })?;
    Ok(())
}

/// `umask(2)`.
pub fn set_umask(mask: u32) {
    // SAFETY: umask takes an integer and cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) };
}

/// `unshare(2)` with `flags` (`CLONE_NEWPID` on a thread only changes the namespace its later
/// children are born in).
pub fn unshare(flags: libc::c_int) -> std::io::Result<()> {
    // SAFETY: unshare takes a flag word.
    check(unsafe { libc::unshare(flags) })?;
    Ok(())
}

/// `setns(2)` into the namespace open on `fd`, of type `nstype` (`CLONE_NEWNS` also resets the
/// root and working directory to the namespace's root; `CLONE_NEWPID` only changes where the
/// thread's later children are born).
pub fn setns(fd: BorrowedFd<'_>, nstype: libc::c_int) -> std::io::Result<()> {
    // SAFETY: fd is open; setns takes integers.
    check(unsafe { libc::setns(fd.as_raw_fd(), nstype) })?;
    Ok(())
}

/// A mount namespace of its own for the calling process, with every mount private (nothing
/// done in it propagates back).
pub fn private_mounts() -> std::io::Result<()> {
    unshare(libc::CLONE_NEWNS)?;
    super::fs::mount(c"none", c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
}

/// `chdir(2)`.
pub fn chdir(path: &CStr) -> std::io::Result<()> {
    // SAFETY: a NUL-terminated string that outlives the call.
    check(unsafe { libc::chdir(path.as_ptr()) })?;
    Ok(())
}

/// Makes the mount `root` the calling process's `/` (in its own mount namespace, made with
/// [`private_mounts`]): `pivot_root(".", ".")` inside it and the old root detached.
pub fn pivot_here(root: &CStr) -> std::io::Result<()> {
    chdir(root)?;
    let dot = c".".as_ptr();
    // SAFETY: pivot_root reads two NUL-terminated strings that outlive the call.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, dot, dot) } as libc::c_int)?;
    // SAFETY: as above; the old root, now stacked on ".", is detached from this namespace.
    check(unsafe { libc::umount2(dot, libc::MNT_DETACH) })?;
    chdir(c"/")
}

/// `path` bound onto itself (`MS_REC` with `recursive`): a mount of its own whose flags can
/// then change.
pub fn bind_self(path: &CStr, recursive: bool) -> std::io::Result<()> {
    let flags = libc::MS_BIND | if recursive { libc::MS_REC } else { 0 };
    super::fs::mount(path, path, None, flags, None)
}

/// Remounts the mount at `path` read-only, keeping `keep` (its `MS_NOSUID`/`MS_NODEV`/
/// `MS_NOEXEC` flags).
pub fn remount_read_only(path: &CStr, keep: libc::c_ulong) -> std::io::Result<()> {
    let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | keep;
    super::fs::mount(c"none", path, None, flags, None)
}

/// The `MS_NOSUID`/`MS_NODEV`/`MS_NOEXEC` flags of the mount `path` is on (`statvfs(3)`:
/// glibc takes them from `statfs(2)`'s `f_flags`, which the kernel always fills, so nothing
/// is read from `/proc` or allocated).
pub fn mount_flags(path: &CStr) -> std::io::Result<libc::c_ulong> {
    // SAFETY: `statvfs` is plain data; all-zero is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs we own, both outliving the call.
    check(unsafe { libc::statvfs(path.as_ptr(), &mut st) })?;
    let mut flags = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    Ok(flags)
}

/// Hides `path`: `/dev/null` bound over a file, an empty read-only tmpfs over a directory. A
/// path that does not exist is left alone (`Ok`).
pub fn mask(path: &CStr) -> std::io::Result<()> {
    match super::fs::mount(c"/dev/null", path, None, libc::MS_BIND, None) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => super::fs::mount(
            c"tmpfs",
            path,
            Some(c"tmpfs"),
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some(c"size=0,mode=0555"),
        ),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

/// A fresh `proc` at `/proc` for the calling process's PID namespace.
pub fn mount_proc() -> std::io::Result<()> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    super::fs::mount(c"proc", c"/proc", Some(c"proc"), flags, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_of_a_mount_are_read() {
        // For a few mount points of this process's namespace, the flags statvfs gives are
        // the per-mount options /proc/self/mountinfo lists (`ID PARENT DEV ROOT POINT
        // OPTIONS ...`): a host's /proc need not be nosuid.
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mut checked = 0;
        for line in info.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let (point, opts) = (f[4], f[5]);
            if !["/", "/proc", "/sys", "/dev"].contains(&point) {
                continue;
            }
            let mut want = 0;
            for (opt, flag) in [
                ("nosuid", libc::MS_NOSUID),
                ("nodev", libc::MS_NODEV),
                ("noexec", libc::MS_NOEXEC),
            ] {
                if opts.split(',').any(|o| o == opt) {
                    want |= flag;
                }
            }
            let path = std::ffi::CString::new(point).unwrap();
            // The last mount on a point is the one a path resolves to.
            if info.lines().rfind(|l| l.split(' ').nth(4) == Some(point)) == Some(line) {
                assert_eq!(mount_flags(&path).unwrap(), want, "{point}: {opts}");
                checked += 1;
            }
        }
        assert!(checked > 0, "no mount point checked:\n{info}");
        assert!(mount_flags(c"/nonexistent/vm-agent").is_err());
    }
}

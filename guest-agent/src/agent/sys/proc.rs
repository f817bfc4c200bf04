//! Process calls: signals, reaping, sessions and identities (the ones marked async-signal-safe
//! may run between `fork` and `exec`: they allocate nothing and take no lock), the agent's own
//! process attributes (`prctl`), the hostname, the wall clock, kernel modules and power-off.

use std::ffi::CStr;

use super::check;

/// Send `sig` to process `pid` (`kill(2)`). No memory is touched; a stale pid is the caller's
/// concern (`ESRCH` when it is gone).
pub fn kill(pid: i32, sig: i32) -> std::io::Result<()> {
    // SAFETY: kill(2) takes plain integers.
    check(unsafe { libc::kill(pid, sig) })?;
    Ok(())
}

/// Send `sig` to every process in process group `pgid` (`killpg(3)`).
pub fn killpg(pgid: i32, sig: i32) -> std::io::Result<()> {
    // SAFETY: killpg takes plain integers.
    check(unsafe { libc::killpg(pgid, sig) })?;
    Ok(())
}

/// What a non-blocking wait found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// Child `pid` exited or was killed; `status` is the raw wait status.
    Exited { pid: i32, status: i32 },
    /// The child (or every child) is still running.
    Running,
}

/// `waitpid(pid, WNOHANG)`: reap `pid` (`-1`: any child) if it has ended. `ECHILD` (no such
/// child) is an error.
pub fn wait_nohang(pid: i32) -> std::io::Result<Waited> {
    let mut status = 0;
    // SAFETY: waitpid only writes the status integer we own.
    let r = check(unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) })?;
    Ok(if r == 0 {
        Waited::Running
    } else {
        Waited::Exited { pid: r, status }
    })
}

/// `setsid(2)`: make the calling process a session and group leader. Async-signal-safe.
pub fn setsid() -> std::io::Result<()> {
    // SAFETY: setsid takes no arguments and touches no memory of ours.
    check(unsafe { libc::setsid() })?;
    Ok(())
}

/// Switch the calling process to `groups`, then gid `gid`, then uid `uid` (in that order: after
/// `setuid` away from root the others are refused). Async-signal-safe; `groups` must be
/// allocated before `fork`.
pub fn set_ids(groups: &[libc::gid_t], gid: libc::gid_t, uid: libc::uid_t) -> std::io::Result<()> {
    // SAFETY: the pointer and length describe `groups`, which outlives the call.
    check(unsafe { libc::setgroups(groups.len(), groups.as_ptr()) })?;
    // SAFETY: setgid/setuid take plain integers.
    check(unsafe { libc::setgid(gid) })?;
    // SAFETY: as above.
    check(unsafe { libc::setuid(uid) })?;
    Ok(())
}

/// Sets `RLIMIT_NOFILE` to `soft` and `hard`: raising the hard limit takes
/// `CAP_SYS_RESOURCE`, which PID 1 has.
pub fn set_nofile(soft: u64, hard: u64) -> std::io::Result<()> {
    let l = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `l` is a valid rlimit that outlives the call, which only reads it.
    check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) })?;
    Ok(())
}

/// `RLIMIT_NOFILE` as (soft, hard).
pub fn nofile() -> std::io::Result<(u64, u64)> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid rlimit that outlives the call, which only writes it.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) })?;
    Ok((l.rlim_cur, l.rlim_max))
}

/// `PR_SET_NO_NEW_PRIVS`: `execve` can never again raise the privileges of this process or
/// anything it starts (setuid bits and file capabilities are ignored). Async-signal-safe.
pub fn set_no_new_privs() -> std::io::Result<()> {
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1)
}

/// `PR_SET_CHILD_SUBREAPER`: orphaned descendants are re-parented to this process.
pub fn set_child_subreaper() -> std::io::Result<()> {
    prctl(libc::PR_SET_CHILD_SUBREAPER, 1)
}

/// `PR_SET_DUMPABLE 0`: no core dumps, and `/proc/<pid>/{mem,environ,fd}` of this process open
/// only with `CAP_SYS_PTRACE`.
pub fn set_not_dumpable() -> std::io::Result<()> {
    prctl(libc::PR_SET_DUMPABLE, 0)
}

/// `PR_CAPBSET_DROP`: remove capability number `cap` from the calling thread's bounding set,
/// which every child inherits.
pub fn drop_bounding_cap(cap: libc::c_ulong) -> std::io::Result<()> {
    prctl(libc::PR_CAPBSET_DROP, cap)
}

fn prctl(op: libc::c_int, arg: libc::c_ulong) -> std::io::Result<()> {
    // SAFETY: only the integer-argument operations above reach here.
    check(unsafe { libc::prctl(op, arg, 0, 0, 0) })?;
    Ok(())
}

/// `finit_module(2)` of the module file open at `fd`, with no parameters.
pub fn finit_module(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (fd, params) = (fd.as_raw_fd(), c"".as_ptr());
    // SAFETY: `fd` is borrowed open for the call; `params` is a NUL-terminated static.
    let r = unsafe { libc::syscall(libc::SYS_finit_module, fd, params, 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Write `data` to the existing file `path` with three raw system calls and no allocation:
/// async-signal-safe, for use between `fork` and `exec`. True when every byte was written
/// (errno tells why not).
pub fn write_file_raw(path: &CStr, data: &[u8]) -> bool {
    // SAFETY: open with a NUL-terminated path that outlives the call.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    // SAFETY: fd is open; the kernel reads at most `data.len()` bytes from `data`.
    let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    // SAFETY: fd was opened above and is closed exactly once.
    unsafe { libc::close(fd) };
    usize::try_from(n) == Ok(data.len())
}

/// `sethostname(2)`.
pub fn set_hostname(name: &str) -> std::io::Result<()> {
    // SAFETY: the pointer and length describe `name`, which outlives the call.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })?;
    Ok(())
}

/// `clock_settime(CLOCK_REALTIME)` to `unix_nanos` nanoseconds after the epoch (needs
/// `CAP_SYS_TIME`: PID 1 in the guest).
pub fn set_realtime(unix_nanos: u64) -> std::io::Result<()> {
    let ts = libc::timespec {
        tv_sec: (unix_nanos / 1_000_000_000) as libc::time_t,
        tv_nsec: (unix_nanos % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: the kernel reads the timespec we own, which outlives the call.
    check(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) })?;
    Ok(())
}

/// Sync the filesystems and reboot, which ends the VM (the guest has no firmware to return
/// to). Returns only when the kernel refuses, with its error.
pub fn reboot() -> std::io::Error {
    super::fs::sync();
    // SAFETY: reboot(2) with a valid command; it returns only on failure.
    unsafe { libc::reboot(libc::RB_AUTOBOOT) };
    std::io::Error::last_os_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[expect(
        clippy::zombie_processes,
        reason = "the child is reaped by wait_nohang, the call under test"
    )]
    fn wait_nohang_sees_running_then_exited_then_no_child() {
        let child = std::process::Command::new("sh")
            .args(["-c", "read x; exit 3"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert_eq!(wait_nohang(pid).unwrap(), Waited::Running);
        drop(child.stdin); // EOF: `read` returns and sh exits 3
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            match wait_nohang(pid).unwrap() {
                Waited::Exited { pid: p, status } => {
                    assert_eq!(p, pid);
                    break status;
                }
                Waited::Running => {
                    assert!(std::time::Instant::now() < deadline, "child did not exit");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 3);
        let err = wait_nohang(pid).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ECHILD));
        assert_eq!(
            kill(pid, 0).unwrap_err().raw_os_error(),
            Some(libc::ESRCH),
            "reaped: gone"
        );
    }

    #[test]
    fn raw_write_reports_a_missing_file() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        std::fs::write(&p, b"").unwrap();
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        assert!(write_file_raw(&c, b"0"));
        assert_eq!(std::fs::read(&p).unwrap(), b"0");
        assert!(!write_file_raw(c"/nonexistent/vm-agent-test", b"0"));
    }
}

//! Process-level system calls of the jail (`vm-jail`): descriptors, the reaper's pidfd,
//! the capability bounding set, and leaving a forked process. Each wrapper is safe to call
//! from a forked child of a multi-threaded parent: none allocates or takes a lock.
//!
//! Two calls stay `unsafe fn` because their contract is about the whole process, which no
//! wrapper can check: [`fork`] (the child of a multi-threaded process may only make system
//! calls) and [`add_pre_exec`] (the hook runs in such a child).

use std::os::fd::RawFd;
use std::process::Command;

use nix::errno::Errno;
use nix::unistd::ForkResult;

/// Closes the descriptors `first..=last` (`close_range(2)`).
pub fn close_range(first: u32, last: u32) -> Result<(), Errno> {
    // SAFETY: close_range only closes descriptors; the caller owns the range (callers use it
    // on descriptors nothing in the process refers to any more).
    let rc = unsafe { libc::close_range(first, last, 0) };
    Errno::result(rc).map(drop)
}

/// Marks the descriptors `first..=last` close-on-exec (`close_range(2)` with
/// `CLOSE_RANGE_CLOEXEC`).
pub fn cloexec_range(first: u32, last: u32) -> Result<(), Errno> {
    // SAFETY: only changes descriptor flags; no descriptor is closed.
    let rc = unsafe { libc::close_range(first, last, libc::CLOSE_RANGE_CLOEXEC as libc::c_int) };
    Errno::result(rc).map(drop)
}

/// Lets `fd` through `exec` (clears its close-on-exec flag).
pub fn keep_across_exec(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: F_SETFD only changes a descriptor flag; an invalid `fd` answers EBADF.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    Errno::result(rc).map(drop)
}

/// Closes `fd`, a raw descriptor the caller owns and never uses again.
pub fn close(fd: RawFd) {
    // SAFETY: closing a descriptor cannot violate memory safety; the caller owns `fd`, so no
    // other owner will use or close it again.
    unsafe { libc::close(fd) };
}

/// Joins the network namespace behind the descriptor `fd` (`setns(2)`; a descriptor that is
/// not open, or not a network namespace, is an error).
pub fn join_net_namespace(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: setns only reads the descriptor number; an invalid one answers EBADF or EINVAL.
    let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
    Errno::result(rc).map(drop)
}

/// A pidfd of this process (`pidfd_open(2)`), close-on-exec; the raw descriptor is the
/// caller's to close (it crosses a `fork`).
pub fn pidfd_of_self() -> Result<RawFd, Errno> {
    let me = nix::unistd::getpid().as_raw();
    // SAFETY: pidfd_open of this process's own pid with no flags; the result is a new
    // descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, me, 0) };
    Errno::result(fd).map(|fd| fd as RawFd)
}

/// Whether the process behind the pidfd `fd` has exited (it polls readable then), without
/// waiting. An error counts as exited.
pub fn pidfd_exited(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd that outlives the call; timeout 0 does not wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n != 0
}

/// Drops capability `cap` from the bounding set (`PR_CAPBSET_DROP`); `EINVAL` for a number
/// the kernel does not know.
pub fn capbset_drop(cap: u32) -> Result<(), Errno> {
    // SAFETY: PR_CAPBSET_DROP takes a capability number and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
    Errno::result(rc).map(drop)
}

/// Drops every capability but `keep` (if any) from the bounding set, up to the first number
/// the kernel does not know (`EINVAL`). Returns the first other error (`EPERM` without
/// `CAP_SETPCAP`). Allocates nothing.
pub fn capbset_drop_all_but(keep: Option<u32>) -> Result<(), Errno> {
    for cap in 0..64 {
        if Some(cap) == keep {
            continue;
        }
        match capbset_drop(cap) {
            Ok(()) => {}
            Err(Errno::EINVAL) if cap > 0 => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sets `no_new_privs` on the calling thread (inherited by its children and kept across
/// `exec`): `exec` can no longer grant privileges (set-uid bits, file capabilities).
pub fn set_no_new_privs() -> Result<(), Errno> {
    nix::sys::prctl::set_no_new_privs()
}

/// Ends the process now with `code` (`_exit(2)`): no destructors, no `atexit` handlers
/// (they belong to the process a forked child was copied from), no buffered output flushed.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(code) }
}

/// Ends the process the way `sig` would (its default action restored, then raised), or with
/// `128 + sig` if the signal does not end it.
pub fn exit_by_signal(sig: nix::sys::signal::Signal) -> ! {
    use nix::sys::signal::{SigHandler, signal};
    // SAFETY: restoring a signal's default action installs no handler of ours.
    let _ = unsafe { signal(sig, SigHandler::SigDfl) };
    let _ = nix::sys::signal::raise(sig);
    exit_now(128 + sig as i32)
}

/// `fork(2)`.
///
/// # Safety
///
/// If the process has more than one thread, the child may only make async-signal-safe calls
/// (no allocation, no locks) until it execs or exits: another thread may have held the
/// allocator's lock at the fork. A single-threaded caller has no such limit.
pub unsafe fn fork() -> Result<ForkResult, Errno> {
    // SAFETY: the caller upholds the contract above.
    unsafe { nix::unistd::fork() }
}

/// Adds `hook` to the steps `cmd` runs in its forked child before `exec`.
///
/// # Safety
///
/// The launcher may have many threads, so `hook` runs under [`fork`]'s contract: only
/// async-signal-safe system calls on data prepared before the fork; no allocation, no lock.
pub unsafe fn add_pre_exec<F>(cmd: &mut Command, hook: F)
where
    F: FnMut() -> std::io::Result<()> + Send + Sync + 'static,
{
    use std::os::unix::process::CommandExt;
    // SAFETY: the caller upholds the contract above.
    unsafe { cmd.pre_exec(hook) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};

    #[test]
    fn keep_across_exec_clears_the_flag_and_cloexec_range_sets_it() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = f.as_raw_fd();
        let flags = || nix::fcntl::fcntl(f.as_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_eq!(flags() & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        keep_across_exec(fd).unwrap();
        assert_eq!(flags() & libc::FD_CLOEXEC, 0);
        cloexec_range(fd as u32, fd as u32).unwrap();
        assert_eq!(flags() & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        assert_eq!(keep_across_exec(-1), Err(Errno::EBADF));
    }

    #[test]
    fn close_range_closes_and_a_pidfd_of_a_live_process_is_not_readable() {
        let fd = pidfd_of_self().unwrap();
        assert!(!pidfd_exited(fd), "this process is alive");
        close_range(fd as u32, fd as u32).unwrap();
        assert!(pidfd_exited(fd), "a closed descriptor polls as an error");
    }

    #[test]
    fn an_unknown_capability_number_is_einval() {
        // Not dropped for real (the test process keeps its capabilities): 4096 is no capability.
        assert_eq!(capbset_drop(4096), Err(Errno::EINVAL));
    }
}

//! Safe wrappers over the host system calls the VMM makes outside KVM's own safe ioctls:
//! each `unsafe` block of the VMM is here (or in [`kick`] and [`guest_memory`]),
//! behind a function or type whose doc states its contract.
//!
//! - [`kick`]: the vCPU kick — the signal handler's store into the running vCPU's `kvm_run`,
//!   and signalling registered vCPU threads.
//! - [`guest_memory`]: guest RAM registered with KVM, owned so it outlives the VM and its
//!   vCPUs.
//!
//! - [`set_xsave`]: `KVM_SET_XSAVE` (a snapshot's restore), whose size contract KVM cannot
//!   check for us.
//!
//! The jail's process-level calls (descriptors, the reaper's pidfd, the capability bounding
//! set, `_exit`, `fork` and `pre_exec` hooks) are shared with other host crates: `vm-sys`.

pub mod guest_memory;
pub mod kick;

pub use guest_memory::{GuestMemoryMmap, GuestVm, SlotError};
pub use kick::{KickableThreads, KickableVcpu, install_kick_handler};

use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// `KVM_SET_XSAVE` of a 4096-byte `kvm_xsave` (what `KVM_GET_XSAVE` returned for a vCPU of
/// this VMM).
pub fn set_xsave(
    vcpu: &kvm_ioctls::VcpuFd,
    xsave: &kvm_bindings::kvm_xsave,
) -> Result<(), kvm_ioctls::Error> {
    // SAFETY: KVM reads the vCPU's `guest_fpu.uabi_size` bytes, which is more than
    // `size_of::<kvm_xsave>()` (4096) only after the process asked for dynamically enabled
    // guest XSTATE components (`arch_prctl(ARCH_REQ_XCOMP_GUEST_PERM)`, e.g. AMX). This VMM
    // never asks, so the kernel reads exactly the struct, which `xsave` borrows whole.
    unsafe { vcpu.set_xsave(xsave) }
}

/// Fills the start of `buf` from the kernel's random source (`getrandom(2)`, blocking only
/// until the pool is initialised); returns how many bytes were written.
pub fn getrandom(buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, a live, exclusively borrowed buffer.
    let got = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    usize::try_from(got).map_err(|_| io::Error::last_os_error())
}

/// Connects a non-blocking Unix stream socket to `path` without ever blocking: a listener
/// whose accept backlog is full refuses (`WouldBlock`) instead of stalling the caller. A path
/// too long for `sockaddr_un` is `InvalidInput`.
pub fn connect_unix_nonblocking(path: &Path) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::from(ErrorKind::InvalidInput));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let flags = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, flags, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket we exclusively own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes living across the call.
    let r = unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

/// Whether bytes wait unread in the socket `s` (a peek of one byte, never blocking; an error
/// or end of file is false).
pub fn has_unread(s: &UnixStream) -> bool {
    let mut b = 0u8;
    let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT;
    // SAFETY: recv(2) writes at most one byte into `b`, which outlives the call; `s` is open.
    let n = unsafe { libc::recv(s.as_raw_fd(), (&raw mut b).cast(), 1, flags) };
    n > 0
}

/// Waits up to `timeout` (capped at `i32::MAX` ms) for `fd` to become readable; false on
/// timeout or error.
pub fn wait_readable(fd: &impl AsRawFd, timeout: std::time::Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `pfd` is a valid pollfd array of length 1 that outlives the call.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    n > 0
}

/// The calling thread's pthread handle.
pub fn current_thread() -> libc::pthread_t {
    // SAFETY: pthread_self(3) has no arguments and cannot fail.
    unsafe { libc::pthread_self() }
}

/// Ignores `SIGXFSZ` for the whole process, so a write past `RLIMIT_FSIZE` (the jail's is 0:
/// a log on a regular file) fails with `EFBIG` instead of killing the process.
pub fn ignore_file_size_signal() -> Result<(), nix::Error> {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: `SIG_IGN` installs no handler, so no code of ours runs in signal context.
    unsafe { signal(Signal::SIGXFSZ, SigHandler::SigIgn) }.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getrandom_fills_the_buffer() {
        let mut a = [0u8; 64];
        assert_eq!(getrandom(&mut a).unwrap(), 64);
        let mut b = [0u8; 64];
        getrandom(&mut b).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn nonblocking_connect() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        assert!(
            connect_unix_nonblocking(&path).is_err(),
            "nobody listens yet"
        );
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let s = connect_unix_nonblocking(&path).unwrap();
        // Non-blocking: a read with nothing sent is WouldBlock, not a hang.
        use std::io::Read;
        let err = (&s).read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::WouldBlock);
        drop(listener);
        let long = dir.path().join("x".repeat(200));
        let err = connect_unix_nonblocking(&long).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
}

//! Terminals and raw descriptor I/O: opening a pseudo-terminal pair, setting its window
//! size, making it a controlling terminal, non-blocking mode, and `read`/`write` on a
//! borrowed descriptor.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::check;
use vm_agent_protocol::protocol::TtySize;

/// A new pseudo-terminal pair `(master, slave)`, both close-on-exec (no other child
/// spawned meanwhile inherits them), the slave not made anyone's controlling terminal, and
/// the window size set to `size`.
pub fn openpty(size: TtySize) -> std::io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: posix_openpt takes flags only and returns a new fd or -1.
    let m = check(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    // SAFETY: `m` was just opened and is owned by nobody else.
    let master = unsafe { OwnedFd::from_raw_fd(m) };
    // SAFETY: grantpt/unlockpt act on the fd only.
    check(unsafe { libc::grantpt(master.as_raw_fd()) })?;
    // SAFETY: as above.
    check(unsafe { libc::unlockpt(master.as_raw_fd()) })?;
    let mut name = [0 as libc::c_char; 64];
    // SAFETY: ptsname_r writes at most `name.len()` bytes (NUL included) into our buffer.
    let r = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r));
    }
    // SAFETY: ptsname_r succeeded, so `name` holds a NUL-terminated string.
    let path = unsafe { CStr::from_ptr(name.as_ptr()) };
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: open with a valid NUL-terminated path.
    let s = check(unsafe { libc::open(path.as_ptr(), flags) })?;
    // SAFETY: `s` was just opened and is owned by nobody else.
    let slave = unsafe { OwnedFd::from_raw_fd(s) };
    set_winsize(std::os::fd::AsFd::as_fd(&master), size)?;
    Ok((master, slave))
}

/// Set the window size of the terminal `fd` (master or slave); the terminal's foreground
/// process group gets `SIGWINCH` when it changes.
pub fn set_winsize(fd: BorrowedFd<'_>, size: TtySize) -> std::io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which outlives the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) })?;
    Ok(())
}

/// Make the terminal on fd 0 the controlling terminal of the calling process, which must be
/// a session leader without one (a child after `setsid`). Async-signal-safe and
/// allocation-free: callable between `fork` and `exec`.
pub fn take_stdin_as_controlling_tty() -> std::io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal from another session).
    check(unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) })?;
    Ok(())
}

/// Put `fd` in non-blocking mode.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: F_GETFL takes no argument.
    let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: F_SETFL takes an integer argument.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

/// Register a non-blocking terminal or pipe fd with tokio's reactor.
pub fn async_fd(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns `fd`, so it stays open and refers to the same file for as
    // long as it is registered.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(std::io::Error::from)
}

/// `read(2)` into `buf`.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `write(2)` from `buf`.
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> std::io::Result<usize> {
    // SAFETY: the kernel reads at most `buf.len()` bytes from `buf`.
    let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

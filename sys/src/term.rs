//! Safe wrappers over the terminal calls of `vm exec -t`: a terminal's window size, and raw
//! mode with a guard that restores the saved settings when dropped (normal return, error,
//! unwinding panic). Whether a descriptor is a terminal is `std::io::IsTerminal`.

use std::os::fd::{AsRawFd, BorrowedFd};

/// The window size `(rows, cols)` of the terminal `fd`.
pub fn window_size(fd: BorrowedFd<'_>) -> std::io::Result<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the pointer, which outlives the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((ws.ws_row, ws.ws_col))
}

fn get_termios(fd: i32) -> std::io::Result<libc::termios> {
    let mut t = std::mem::MaybeUninit::<libc::termios>::uninit();
    // SAFETY: tcgetattr fills the termios we point to.
    if unsafe { libc::tcgetattr(fd, t.as_mut_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: tcgetattr succeeded, so every field was written.
    Ok(unsafe { t.assume_init() })
}

fn set_termios(fd: i32, t: &libc::termios) -> std::io::Result<()> {
    // SAFETY: tcsetattr reads the termios we point to.
    if unsafe { libc::tcsetattr(fd, libc::TCSADRAIN, t) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A terminal in raw mode; dropping it restores the settings it had before.
#[derive(Debug)]
pub struct RawMode {
    fd: i32,
    saved: libc::termios,
}

impl RawMode {
    /// Put the terminal `fd` in raw mode: no echo, no line editing, no signals from keys
    /// (Ctrl-C is a byte), no output processing. `fd` must stay open while the guard lives.
    pub fn enable(fd: BorrowedFd<'_>) -> std::io::Result<RawMode> {
        let fd = fd.as_raw_fd();
        let saved = get_termios(fd)?;
        let mut raw = saved;
        // SAFETY: cfmakeraw only edits the struct we own.
        unsafe { libc::cfmakeraw(&mut raw) };
        set_termios(fd, &raw)?;
        Ok(RawMode { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Err(e) = set_termios(self.fd, &self.saved) {
            tracing::warn!("cannot restore the terminal settings: {e}");
        }
    }
}

//! [`Pty`]: the pseudo-terminal of an interactive exec. The agent keeps the master side
//! (non-blocking, driven by tokio); the slave becomes the command's stdin, stdout, stderr
//! and controlling terminal, and the agent closes its own copy once the command is spawned.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use tokio::io::unix::AsyncFd;

use super::sys;
use vm_agent_protocol::protocol::TtySize;

/// A pseudo-terminal pair.
#[derive(Debug)]
pub struct Pty {
    master: AsyncFd<OwnedFd>,
    slave: Option<OwnedFd>,
}

impl Pty {
    /// Open a pair with the window size `size`. Must run inside a tokio runtime.
    pub fn open(size: TtySize) -> std::io::Result<Pty> {
        let (master, slave) = sys::openpty(size)?;
        sys::set_nonblocking(master.as_fd())?;
        Ok(Pty {
            master: sys::async_fd(master)?,
            slave: Some(slave),
        })
    }

    /// The slave side, to hand to the command (until [`Pty::close_slave`]).
    pub fn slave(&self) -> Option<BorrowedFd<'_>> {
        self.slave.as_ref().map(AsFd::as_fd)
    }

    /// Close the agent's copy of the slave: once the command and its children close theirs,
    /// reading the master ends.
    pub fn close_slave(&mut self) {
        self.slave = None;
    }

    /// Read what the command wrote; `Ok(0)` once every slave copy is closed (Linux reports
    /// that as `EIO` on the master).
    pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.master.readable().await?;
            match guard.try_io(|fd| sys::read(fd.get_ref().as_fd(), buf)) {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Write to the command's terminal input (what it reads, after the line discipline).
    pub async fn write(&self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.master.writable().await?;
            match guard.try_io(|fd| sys::write(fd.get_ref().as_fd(), buf)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Set the window size (the terminal's foreground process group gets `SIGWINCH`).
    pub fn resize(&self, size: TtySize) -> std::io::Result<()> {
        sys::set_winsize(self.master.get_ref().as_fd(), size)
    }
}

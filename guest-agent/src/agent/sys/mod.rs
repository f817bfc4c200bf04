//! The agent's system calls: every `unsafe` block of the agent lives in this module, behind a
//! safe function whose doc states its contract (what it does, what it needs from the caller,
//! and whether it may run between `fork` and `exec`). Where std already has the call (`chroot`,
//! pipes, `getpid`), the callers use std instead.
//!
//! Two unsafe calls stay with their callers because no safe wrapper can state their contract:
//! clearing the environment (sound only while the process has one thread) and
//! `CommandExt::pre_exec` (the closure itself must be async-signal-safe).
//!
//! - [`tty`]: pseudo-terminals, window size, non-blocking mode, raw `read`/`write`.
//! - [`fs`]: mounts, `openat2`, `fstat`, `mkdirat`, directory listing, read-only block
//!   devices, standard descriptors.
//! - [`proc`]: signals, reaping, session and identity changes, process attributes, power-off.
//! - [`net`]: bringing up the loopback interface.
//! - [`secure`]: what confines a container's process: capabilities, seccomp, namespaces and
//!   the mount steps of its root.
//! - [`random`]: host entropy into the kernel's pool and a forced CRNG reseed.

pub mod fs;
pub mod net;
pub mod proc;
pub mod random;
pub mod secure;
pub mod tty;

pub use tty::{
    async_fd, openpty, read, set_nonblocking, set_winsize, take_stdin_as_controlling_tty, write,
};

/// A `-1`-on-error return value as an `io::Result` (errno taken right away).
fn check(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

//! Pausing a VM from the host: every process of the VM is stopped with `SIGSTOP` and let go
//! with `SIGCONT`, as a whole process group (each VM process leads its own group, and a jailed
//! program runs in its reaper's group), the way a cgroup freezer holds a container. The guest
//! sees time jump when it runs again; its memory, devices and connections stay as they were.
//! Every VM process's seccomp filters allow `restart_syscall`, which a sleep interrupted by the
//! stop resumes through.

use std::io;
use std::time::{Duration, Instant};

use vm_sys::control::{self, Signal};

/// How long [`freeze`] waits for every thread to be seen stopped.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Stops every process group in `groups` and returns once each of their threads is stopped.
/// On failure the groups already stopped are continued again (nothing is left half-paused).
pub(crate) fn freeze(groups: &[u32]) -> io::Result<()> {
    for (i, &g) in groups.iter().enumerate() {
        if let Err(e) = control::signal_group(g, Signal::Stop) {
            thaw(&groups[..i]);
            return Err(e);
        }
    }
    let deadline = Instant::now() + STOP_WAIT;
    while !groups.iter().all(|&g| control::group_stopped(g)) {
        if Instant::now() >= deadline {
            thaw(groups);
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the VM's processes were not all stopped within 5 s",
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Continues every process group in `groups` (a group that is gone is skipped).
pub(crate) fn thaw(groups: &[u32]) {
    for &g in groups {
        if let Err(e) = control::signal_group(g, Signal::Continue)
            && e.raw_os_error() != Some(libc::ESRCH)
        {
            tracing::warn!(group = g, error = %e, "continuing a VM process group failed");
        }
    }
}

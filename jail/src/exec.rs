//! The jail around a program we launch as a separate executable (the tcg driver's QEMU, which
//! we did not write, and our vm-vsock), built by the same steps as `vm-vmm`'s, between `fork` and `exec`.
//!
//! [`ExecJail::install`] adds a `pre_exec` hook to a [`Command`]. In the forked child it:
//! unshares the namespaces and forks once more (the child becomes a reaper that mirrors how the
//! program ends, as in `vm-vmm`); in the grandchild, PID 1 of the new namespace, it arms the
//! parent-death signal, hands the socket directory (group, mode `01770`) and the files only
//! this program may read (owner, mode `0400`) to the jail's ids, marks every inherited
//! descriptor close-on-exec except the ones passed on purpose, builds the root
//! ([`RootPlan::build`]), sets the hostname and umask `007`, restricts itself ([`restrict`]:
//! rlimits with the memory cap, no capabilities, its own uid, `no_new_privs`) and installs the
//! program's seccomp filter, if any; then `exec` runs the program inside.
//!
//! Everything is prepared in the launcher ([`ExecJail::new`]): the hook allocates nothing
//! (the launcher has many threads; after `fork` only system calls are safe). A failing step
//! comes back through the `exec` error channel as one number ([`encode`]) that
//! [`spawn_error`] turns back into the step and its cause.

use std::ffi::CString;
use std::io;
use std::path::PathBuf;
use std::process::Command;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::stat::Mode;
use nix::unistd::{ForkResult, Gid, Uid, getpid};
use seccompiler::BpfProgram;

use super::root::{at, cstring};
use super::{
    Identity, JAIL_ID_BASE, JailConfig, JailError, MemoryCap, RootPlan, Step, StepError, reap,
    restrict,
};
use crate::seccomp::{self, Compiled, ThreadKind};
use vm_sys::process as sys;

/// A step error travels as one positive `i32`: `ERRNO_BASE | item << 17 | step << 12 | errno`
/// (errnos are < 4096, steps < 32, items < 256).
const ERRNO_BASE: i32 = 0x4000_0000;

/// Who the jailed program runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Its own: uid and gid are `JAIL_ID_BASE` + the reaper's pid.
    Own,
    /// Its own uid, and this gid (shared with another process of the same VM, such as the
    /// vsock backend whose socket QEMU connects to).
    Shared(u32),
}

/// What a program's jail is made of, before it is prepared.
#[derive(Debug, Clone)]
pub struct ExecJailConfig {
    /// The root and its binds.
    pub jail: JailConfig,
    /// The memory cap.
    pub memory: MemoryCap,
    /// Its gid.
    pub group: Group,
    /// Directories handed to the jail's gid with mode `01770` (sticky: the jail may remove
    /// only what it created): where it creates its sockets.
    pub group_dirs: Vec<PathBuf>,
    /// Files handed to the jail's uid and gid with mode `0400`: what only it may read.
    pub own_files: Vec<PathBuf>,
    /// Descriptors passed on purpose (opened close-on-exec by the launcher; they stay open
    /// across `exec`, every other one is closed).
    pub keep_fds: Vec<i32>,
    /// The seccomp filter installed just before `exec`, if any.
    pub seccomp: Option<&'static BpfProgram>,
}

/// A prepared jail, ready to install on a [`Command`].
#[derive(Debug)]
pub struct ExecJail {
    root: RootPlan,
    memory: MemoryCap,
    group: Group,
    group_dirs: Vec<CString>,
    own_files: Vec<CString>,
    keep_fds: Vec<i32>,
    seccomp: Option<&'static BpfProgram>,
    reaper: &'static Compiled,
    netns: Option<i32>,
}

impl ExecJail {
    /// Prepares `cfg` (plans the root, compiles the reaper's filter).
    pub fn new(cfg: ExecJailConfig) -> Result<ExecJail, JailError> {
        let memory = MemoryCap {
            open_files: crate::NOFILE_LIMIT.saturating_add(cfg.jail.extra_open_files),
            ..cfg.memory
        };
        Ok(ExecJail {
            root: RootPlan::new(&cfg.jail)?,
            memory,
            group: cfg.group,
            group_dirs: cfg
                .group_dirs
                .iter()
                .map(|p| cstring(p))
                .collect::<Result<_, _>>()?,
            own_files: cfg
                .own_files
                .iter()
                .map(|p| cstring(p))
                .collect::<Result<_, _>>()?,
            keep_fds: cfg.keep_fds,
            seccomp: cfg.seccomp,
            reaper: seccomp::compiled(ThreadKind::Reaper).map_err(JailError::Seccomp)?,
            netns: cfg.jail.netns_fd,
        })
    }

    /// Adds the jail to `cmd`, as its last `pre_exec` hook (hooks added before it, such as the
    /// driver's parent-death signal, run in the reaper too).
    pub fn install(self, cmd: &mut Command) {
        let hook = move || {
            self.run()
                .map_err(|e| io::Error::from_raw_os_error(encode(e)))
        };
        // SAFETY: the hook only makes system calls on data prepared before the fork (C
        // strings, compiled BPF programs); it allocates nothing and takes no lock.
        unsafe { sys::add_pre_exec(cmd, hook) };
    }

    fn run(&self) -> Result<(), StepError> {
        super::enter_namespaces(self.netns)?;
        let id = JAIL_ID_BASE + getpid().as_raw() as u32;
        let (launcher, reaper_fd) = super::before_fork()?;
        // SAFETY: this is already a forked child; the grandchild runs only the allocation-free
        // steps below, the reaper only system calls.
        match unsafe { sys::fork() }.map_err(at(Step::Fork))? {
            ForkResult::Child => {}
            // Every descriptor closed: the pipes (and the exec error channel) are the program's.
            ForkResult::Parent { child } => {
                reap(child, id, 0..=libc::c_uint::MAX, self.reaper, launcher)
            }
        }
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(at(Step::DeathSignal))?;
        let who = Identity {
            uid: id,
            gid: match self.group {
                Group::Own => id,
                Group::Shared(gid) => gid,
            },
        };
        self.grant(who)?;
        self.close_fds()?;
        self.root.build()?;
        nix::unistd::sethostname("vm").map_err(at(Step::Hostname))?;
        nix::sys::stat::umask(Mode::from_bits_truncate(0o007));
        restrict(who, self.memory).map_err(|e| match e {
            JailError::Step(s, _) => s,
            _ => at(Step::ClearCaps)(Errno::EPERM),
        })?;
        // The uid change cleared the parent-death signal set above.
        super::rearm_under_reaper(reaper_fd)?;
        if let Some(prog) = self.seccomp {
            seccompiler::apply_filter(prog).map_err(|_| at(Step::Seccomp)(Errno::last()))?;
        }
        Ok(())
    }

    fn grant(&self, who: Identity) -> Result<(), StepError> {
        let (uid, gid) = (Uid::from_raw(who.uid), Gid::from_raw(who.gid));
        for d in &self.group_dirs {
            hand_over(d, None, gid, 0o1770)?;
        }
        for f in &self.own_files {
            hand_over(f, Some(uid), gid, 0o400)?;
        }
        Ok(())
    }

    /// Every descriptor above stderr becomes close-on-exec (the exec error channel must stay
    /// open until then), except the ones passed on purpose.
    fn close_fds(&self) -> Result<(), StepError> {
        sys::cloexec_range(3, libc::c_uint::MAX).map_err(at(Step::Fds))?;
        for fd in &self.keep_fds {
            sys::keep_across_exec(*fd).map_err(at(Step::Fds))?;
        }
        Ok(())
    }
}

/// Gives `path` to `owner` (if any) and `group` with `mode`.
pub(crate) fn hand_over(
    path: &CString,
    owner: Option<Uid>,
    group: Gid,
    mode: u32,
) -> Result<(), StepError> {
    nix::unistd::chown(path.as_c_str(), owner, Some(group)).map_err(at(Step::Grant))?;
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        path.as_c_str(),
        Mode::from_bits_truncate(mode),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .map_err(at(Step::Grant))
}

/// One number for a failed step.
fn encode(e: StepError) -> i32 {
    ERRNO_BASE | i32::from(e.item) << 17 | (e.step as i32) << 12 | (e.errno as i32 & 0xfff)
}

/// The jail step behind a spawn error, when the error came from an [`ExecJail`].
pub fn spawn_error(e: &io::Error) -> Option<StepError> {
    let code = e.raw_os_error()?;
    if code & !0x1ff_ffff != ERRNO_BASE {
        return None;
    }
    let step = Step::from_u8(((code >> 12) & 0x1f) as u8)?;
    Some(StepError {
        step,
        item: ((code >> 17) & 0xff) as u8,
        errno: Errno::from_raw(code & 0xfff),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_error_survives_the_exec_error_channel() {
        let e = StepError {
            step: Step::Bind,
            item: 200,
            errno: Errno::EINVAL,
        };
        let io = io::Error::from_raw_os_error(encode(e));
        assert_eq!(spawn_error(&io), Some(e));
        assert_eq!(
            spawn_error(&io::Error::from_raw_os_error(libc::ENOENT)),
            None
        );
    }
}

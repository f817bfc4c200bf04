//! The jail `vm-vmm` builds around itself before any guest code runs.
//!
//! In order ([`enter`] right after the configuration is read, [`confine`] after the VM is
//! created — every file it needs is open by then — and before a vCPU starts):
//!
//! 1. New mount, PID, IPC, UTS and network namespaces (`unshare`). A PID namespace applies to
//!    children only, so the process forks once: the child is PID 1 of the new namespace and runs
//!    the VM; the parent becomes a *reaper* that only waits for it and exits the same way (code,
//!    or the same signal: a seccomp kill reads as `SIGSYS` to the launcher). Each arms
//!    `PR_SET_PDEATHSIG(SIGKILL)` on its parent.
//! 2. The root: mounts are made private, a small tmpfs is mounted on [`JailConfig::root`] (an
//!    empty host directory; the tmpfs exists only in the VM's mount namespace), each of
//!    [`JailConfig::binds`] (the run directory with the vsock socket) is bind-mounted at its own
//!    path inside, then `pivot_root`, the old root detached, and the tmpfs made read-only. The
//!    kernel, initrd, disks and `/dev/kvm` are already open, so the root holds nothing else.
//! 3. Limits and identity: hostname `vm`, `RLIMIT_NOFILE`, `RLIMIT_FSIZE=0` (the VMM writes no
//!    files), `RLIMIT_CORE=0`, `RLIMIT_NPROC`, and the memory cap: `RLIMIT_DATA` = guest RAM +
//!    [`VMM_OVERHEAD_MIB`] (the host's cgroups are v1 and the VMM drops the privileges it would
//!    need to manage one, so the cap is an rlimit; guest RAM is private anonymous memory, which
//!    `RLIMIT_DATA` counts); every capability dropped from the bounding set,
//!    then a uid/gid of the VM's own (`JAIL_ID_BASE + pid`, no supplementary groups), which
//!    empties the permitted and effective sets; the inheritable and ambient sets cleared;
//!    `no_new_privs`.
//!
//! Inherited file descriptors other than stdin/stdout/stderr are closed at start whether or not
//! the jail is on ([`close_inherited_fds`]).

use std::path::{Path, PathBuf};

use caps::CapSet;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{SigHandler, Signal, signal};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{
    ForkResult, Gid, Uid, fork, getpid, pivot_root, setgroups, setresgid, setresuid,
};
use serde::{Deserialize, Serialize};

/// The uid and gid of a jailed VM are this plus the host pid of its reaper (unique among live
/// VMs, and far above the ids of real users).
pub const JAIL_ID_BASE: u32 = 1_000_000_000;

/// Open files a VMM may hold: device fds, eventfds, up to 1023 vsock connections and margin.
pub const NOFILE_LIMIT: u64 = 4096;

/// Processes (threads) the VM's uid may have: vCPUs, device workers, control, reaper.
pub const NPROC_LIMIT: u64 = 256;

/// What the VMM process may allocate beyond the guest's RAM (`RLIMIT_DATA`): device queues,
/// vsock buffers, thread stacks, the allocator's arenas. A device-model leak ends the VM
/// instead of eating the host.
pub const VMM_OVERHEAD_MIB: u64 = 64;

/// `RLIMIT_DATA` of the reaper, which allocates next to nothing.
const REAPER_DATA_MIB: u64 = 16;

/// Size of the root tmpfs (it holds only the directories leading to the bind mounts).
const ROOT_TMPFS_OPTIONS: &str = "size=64k,nr_inodes=64,mode=0755";

/// What the jail of one VM is built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailConfig {
    /// An empty host directory the jail's root tmpfs is mounted on.
    pub root: PathBuf,
    /// Host directories bind-mounted read-write at the same path inside (the run directory).
    pub binds: Vec<PathBuf>,
}

/// Why the jail could not be built; the VM does not start.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A system call of the jail set-up failed.
    #[error("{what}")]
    Sys {
        /// The step.
        what: String,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// Changing the capability sets failed.
    #[error("{what}")]
    Caps {
        /// The step.
        what: &'static str,
        /// The cause.
        #[source]
        source: caps::errors::CapsError,
    },
    /// A configured path is not absolute.
    #[error("jail path {0} is not absolute")]
    Relative(PathBuf),
}

fn sys(what: impl Into<String>) -> impl FnOnce(nix::Error) -> JailError {
    let what = what.into();
    move |source| JailError::Sys { what, source }
}

/// Closes every file descriptor above stderr.
pub fn close_inherited_fds() {
    // SAFETY: close_range only closes descriptors; nothing in this process uses any above 2 yet
    // (it is called first thing in main).
    let rc = unsafe { libc::close_range(3, libc::c_uint::MAX, 0) };
    if rc != 0 {
        eprintln!("vm-vmm: close_range: {}", std::io::Error::last_os_error());
    }
}

/// Step 1: new namespaces and the fork into the PID namespace. Returns in the child (PID 1 of
/// the new namespace); the parent becomes the reaper and never returns.
///
/// Must be called while the process has a single thread.
pub fn enter(cfg: &JailConfig) -> Result<(), JailError> {
    for p in std::iter::once(&cfg.root).chain(&cfg.binds) {
        if !p.is_absolute() {
            return Err(JailError::Relative(p.clone()));
        }
    }
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWPID
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWNET,
    )
    .map_err(sys("unshare(mount, pid, ipc, uts, net)"))?;
    let id = JAIL_ID_BASE + getpid().as_raw() as u32;
    // SAFETY: the caller guarantees this process has one thread, so the child may run any code.
    match unsafe { fork() }.map_err(sys("fork into the pid namespace"))? {
        ForkResult::Child => {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(sys("PR_SET_PDEATHSIG"))?;
            JAIL_ID.set(id).ok();
            Ok(())
        }
        ForkResult::Parent { child } => reap(child, id),
    }
}

/// The uid/gid chosen in [`enter`] (read by [`confine`] in the child).
static JAIL_ID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// The reaper: restricts itself like the VM, waits for it, and ends the same way.
fn reap(child: nix::unistd::Pid, id: u32) -> ! {
    // The control channel and the console belong to the child.
    // SAFETY: closes our copies of stdin and stdout; the reaper never uses them again.
    unsafe { libc::close_range(0, 1, 0) };
    if let Err(e) = restrict(id, REAPER_DATA_MIB << 20) {
        eprintln!("vm-vmm: reaper: {}", vm_error_chain::error_chain(&e));
        // Without its restrictions the reaper must not outlive the VM: take it down.
        let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
    }
    crate::seccomp::apply_or_exit(crate::seccomp::ThreadKind::Reaper);
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => std::process::exit(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                // SAFETY: restoring the default action of a signal has no preconditions.
                let _ = unsafe { signal(sig, SigHandler::SigDfl) };
                let _ = nix::sys::signal::raise(sig);
                std::process::exit(128 + sig as i32);
            }
            Ok(_) | Err(nix::Error::EINTR) => continue,
            Err(_) => std::process::exit(1),
        }
    }
}

/// Steps 2 and 3, in the child, once every file the VM needs is open (its guest RAM of
/// `guest_mib` included, which counts against the data limit).
pub fn confine(cfg: &JailConfig, guest_mib: u32) -> Result<(), JailError> {
    build_root(cfg)?;
    nix::unistd::sethostname("vm").map_err(sys("sethostname"))?;
    let id = *JAIL_ID
        .get()
        .unwrap_or(&(JAIL_ID_BASE + getpid().as_raw() as u32));
    restrict(id, data_limit(guest_mib))
}

/// The `RLIMIT_DATA` of a VM process with `guest_mib` of guest RAM.
pub fn data_limit(guest_mib: u32) -> u64 {
    (u64::from(guest_mib) + VMM_OVERHEAD_MIB) << 20
}

fn build_root(cfg: &JailConfig) -> Result<(), JailError> {
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(sys("making mounts private"))?;
    let root = &cfg.root;
    mount(
        Some("tmpfs"),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(ROOT_TMPFS_OPTIONS),
    )
    .map_err(sys(format!(
        "mounting the root tmpfs on {}",
        root.display()
    )))?;
    for b in &cfg.binds {
        let target = inside(root, b);
        std::fs::create_dir_all(&target).map_err(|e| JailError::Sys {
            what: format!("creating {}", target.display()),
            source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        mount(
            Some(b.as_path()),
            &target,
            none,
            MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            none,
        )
        .map_err(sys(format!("bind-mounting {}", b.display())))?;
    }
    let old = root.join(".old");
    std::fs::create_dir(&old).map_err(|e| JailError::Sys {
        what: "creating the old-root mount point".into(),
        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })?;
    pivot_root(root, &old).map_err(sys("pivot_root"))?;
    nix::unistd::chdir("/").map_err(sys("chdir /"))?;
    umount2("/.old", MntFlags::MNT_DETACH).map_err(sys("detaching the old root"))?;
    std::fs::remove_dir("/.old").map_err(|e| JailError::Sys {
        what: "removing the old-root mount point".into(),
        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })?;
    mount(
        none,
        "/",
        none,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(ROOT_TMPFS_OPTIONS),
    )
    .map_err(sys("making the root read-only"))
}

/// `path` (absolute) under `root`.
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Rlimits (`data` bytes of `RLIMIT_DATA`), capabilities, uid/gid and `no_new_privs`.
fn restrict(id: u32, data: u64) -> Result<(), JailError> {
    for (res, limit, what) in [
        (Resource::RLIMIT_DATA, data, "RLIMIT_DATA"),
        (Resource::RLIMIT_NOFILE, NOFILE_LIMIT, "RLIMIT_NOFILE"),
        (Resource::RLIMIT_FSIZE, 0, "RLIMIT_FSIZE"),
        (Resource::RLIMIT_CORE, 0, "RLIMIT_CORE"),
        (Resource::RLIMIT_NPROC, NPROC_LIMIT, "RLIMIT_NPROC"),
    ] {
        setrlimit(res, limit, limit).map_err(sys(what))?;
    }
    let caps_err = |what| move |source| JailError::Caps { what, source };
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap).map_err(caps_err("dropping the bounding set"))?;
    }
    setgroups(&[]).map_err(sys("setgroups"))?;
    let (uid, gid) = (Uid::from_raw(id), Gid::from_raw(id));
    setresgid(gid, gid, gid).map_err(sys(format!("setresgid {id}")))?;
    setresuid(uid, uid, uid).map_err(sys(format!("setresuid {id}")))?;
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable] {
        caps::clear(None, set).map_err(caps_err("clearing capabilities"))?;
    }
    caps::clear(None, CapSet::Ambient).map_err(caps_err("clearing ambient capabilities"))?;
    nix::sys::prctl::set_no_new_privs().map_err(sys("PR_SET_NO_NEW_PRIVS"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_land_at_their_own_path_inside_the_root() {
        assert_eq!(
            inside(Path::new("/run/vm/a/root"), Path::new("/run/vm/a")),
            PathBuf::from("/run/vm/a/root/run/vm/a")
        );
    }

    #[test]
    fn relative_paths_are_refused_before_anything_changes() {
        let cfg = JailConfig {
            root: "rel".into(),
            binds: vec![],
        };
        assert!(matches!(enter(&cfg), Err(JailError::Relative(p)) if p == Path::new("rel")));
    }
}

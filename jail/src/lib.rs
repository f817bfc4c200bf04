//! `vm-jail`: the jail around every VM process we start, and the seccomp filters, kept apart
//! from the VMM (as Firecracker's `jailer` and crosvm's `jail/` stand apart from theirs) so the
//! tcg driver jails QEMU and vm-vsock without importing the KVM VMM.
//!
//! What this crate owns:
//! - this module: namespaces, the reaper, parent death, rlimits (the memory cap among them),
//!   capabilities, uid/gid and `no_new_privs` ([`enter`], [`confine`], [`restrict`]);
//! - [`root`]: the root (a read-only tmpfs of bind mounts) and `pivot_root` into it;
//! - [`exec`]: the same steps between `fork` and `exec` of a separate program;
//! - [`seccomp`]: every seccomp filter, one allowlist per kind of `vm-vmm` thread, one per
//!   jailed program, and one for the `vm` processes that read agent frames once they start
//!   nothing more ([`seccomp::client`]), each system call with the reason it is there.
//!
//! The raw system calls behind these steps are `vm-sys`'s.
//!
//! # The jail of `vm-vmm`, built around itself before any guest code runs
//!
//! In order ([`enter`] right after the configuration is read, [`confine`] after the VM is
//! created — every file it needs is open by then — and before a vCPU starts):
//!
//! 1. New mount, PID, IPC, UTS and network namespaces (`unshare`). A PID namespace applies to
//!    children only, so the process forks once: the child is PID 1 of the new namespace and runs
//!    the VM; the parent becomes a *reaper* that only waits for it and exits the same way (code,
//!    or the same signal: a seccomp kill reads as `SIGSYS` to the launcher). Each arms
//!    `PR_SET_PDEATHSIG(SIGKILL)` on its parent.
//! 2. The root ([`root`]): a read-only tmpfs holding only the bind mounts of the config. For
//!    `vm-vmm` that is the run directory with the vsock socket: the kernel, initrd, disks and
//!    `/dev/kvm` are already open, so the root holds nothing else.
//! 3. Limits and identity: hostname `vm`, `RLIMIT_NOFILE`, `RLIMIT_FSIZE=0` (the VMM writes no
//!    files — unless it is configured for snapshots: then its snapshot directory, bound
//!    read-write and handed to its uid with mode `0700`, and files up to its guest RAM plus
//!    the state file bound ([`Writable`]); QEMU gets its guest RAM size, for its memfd), `RLIMIT_CORE=0`, `RLIMIT_NPROC`, and the memory cap: `RLIMIT_DATA` = guest RAM +
//!    [`VMM_OVERHEAD_MIB`] (the host's cgroups are v1 and the VMM drops the privileges it would
//!    need to manage one, so the cap is an rlimit; guest RAM is private anonymous memory, which
//!    `RLIMIT_DATA` counts); every capability dropped from the bounding set,
//!    then a uid/gid of the VM's own (`JAIL_ID_BASE + pid`, no supplementary groups), which
//!    empties the permitted and effective sets; the inheritable and ambient sets cleared;
//!    `no_new_privs`.
//!
//! Inherited file descriptors other than stdin/stdout/stderr are closed at start whether or not
//! the jail is on ([`close_inherited_fds`]).
//!
//! The same builder jails the tcg driver's separate executables (QEMU, which we do not write,
//! and our vm-vsock): [`exec::ExecJail`] runs these steps between `fork` and `exec`.

pub mod exec;
pub mod root;
pub mod seccomp;

use std::path::PathBuf;

use caps::CapSet;
use nix::sched::{CloneFlags, unshare};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Uid, getpid, setgroups, setresgid, setresuid};
use serde::{Deserialize, Serialize};

use root::at;
pub use root::{RootPlan, Step, StepError};
use vm_sys::process as sys;

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

/// The namespaces every jailed process gets.
pub const NAMESPACES: [&str; 5] = ["mnt", "pid", "ipc", "uts", "net"];

fn namespace_flags(netns: Option<i32>) -> CloneFlags {
    let new = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    if netns.is_some() {
        new
    } else {
        new | CloneFlags::CLONE_NEWNET
    }
}

/// Step 1's namespaces: joins the empty network namespace `netns` when given (see
/// [`shared_netns`]), then unshares the others (and the network one when not given).
/// Allocates nothing.
pub(crate) fn enter_namespaces(netns: Option<i32>) -> Result<(), StepError> {
    if let Some(fd) = netns {
        sys::join_net_namespace(fd).map_err(at(Step::Unshare))?;
    }
    unshare(namespace_flags(netns)).map_err(at(Step::Unshare))
}

/// One empty network namespace per launcher process, made on first use by a short-lived
/// thread (`unshare` applies to the calling thread only) and kept as a descriptor: the VM
/// processes this launcher starts join it instead of each creating and destroying one of
/// their own, which is most of the jail's cost (about 2 ms per VM here, see
/// docs/benchmarks.md). It has no interface but a loopback that is down; what its members
/// share is the abstract Unix socket namespace, and no VM process listens there (the kvm
/// filters allow no `bind` or `listen`; vm-vsock binds paths only).
pub fn shared_netns() -> std::io::Result<i32> {
    use std::os::fd::{AsRawFd, OwnedFd};
    static NETNS: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = NETNS.get() {
        return Ok(fd.as_raw_fd());
    }
    let fd = std::thread::spawn(|| -> std::io::Result<OwnedFd> {
        unshare(CloneFlags::CLONE_NEWNET)?;
        Ok(OwnedFd::from(std::fs::File::open(
            "/proc/thread-self/ns/net",
        )?))
    })
    .join()
    .map_err(|_| std::io::Error::other("the network namespace thread panicked"))??;
    Ok(NETNS.get_or_init(|| fd).as_raw_fd())
}

/// Lets `fd` (close-on-exec in the launcher) through `exec` of `cmd`.
pub fn pass_fd(cmd: &mut std::process::Command, fd: i32) {
    let hook = move || sys::keep_across_exec(fd).map_err(std::io::Error::from);
    // SAFETY: the hook only clears a descriptor flag: one system call, no allocation.
    unsafe { sys::add_pre_exec(cmd, hook) };
}

/// What the jail of one VM process is built from (all paths absolute; each bind lands at its
/// own host path inside the root).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailConfig {
    /// An empty host directory the jail's root tmpfs is mounted on.
    pub root: PathBuf,
    /// Bound read-write, `noexec` (the run directory with the sockets).
    pub binds: Vec<PathBuf>,
    /// Bound read-only, `noexec` (kernel, initrd, firmware).
    #[serde(default)]
    pub ro: Vec<PathBuf>,
    /// Bound read-only with `exec` allowed (a program and its shared libraries).
    #[serde(default)]
    pub exec: Vec<PathBuf>,
    /// Symbolic links (path inside, target), as the host has them (`/lib` -> `usr/lib`).
    #[serde(default)]
    pub links: Vec<(PathBuf, PathBuf)>,
    /// A network namespace to join (an inherited descriptor, [`shared_netns`]) instead of
    /// creating one.
    #[serde(default)]
    pub netns_fd: Option<i32>,
    /// Descriptors beyond [`NOFILE_LIMIT`] the process may hold: a file server's inodes (one
    /// descriptor each, capped by the server).
    #[serde(default)]
    pub extra_open_files: u64,
}

/// Why the jail could not be built; the VM does not start.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A step of the jail set-up failed.
    #[error("{}", describe(.0, .1))]
    Step(StepError, Option<PathBuf>),
    /// Changing the capability sets failed.
    #[error("{what}")]
    Caps {
        /// The step.
        what: &'static str,
        /// The cause.
        #[source]
        source: caps::errors::CapsError,
    },
    /// A configured path is not absolute (or holds a NUL byte).
    #[error("jail path {0} is not absolute")]
    Relative(PathBuf),
    /// A path to bind into the root cannot be read.
    #[error("jail path {path}")]
    Source {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A seccomp filter for the jailed program could not be built.
    #[error("seccomp filter")]
    Seccomp(#[source] crate::seccomp::SeccompError),
}

impl From<StepError> for JailError {
    fn from(e: StepError) -> JailError {
        JailError::Step(e, None)
    }
}

fn describe(e: &StepError, path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => format!("{} {}: {}", e.step.describe(), p.display(), e.errno.desc()),
        None => format!("{}: {}", e.step.describe(), e.errno.desc()),
    }
}

/// The identity and limits a jailed process ends up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Its uid.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
}

/// A memory cap: which rlimit, how many bytes; and the largest file the process may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryCap {
    /// `RLIMIT_DATA` (private memory: our VMM, whose guest RAM is private) or `RLIMIT_AS`
    /// (every mapping: QEMU and vm-vsock map the guest RAM as a shared memfd, which
    /// `RLIMIT_DATA` does not count).
    pub resource: Resource,
    /// The limit.
    pub bytes: u64,
    /// `RLIMIT_FSIZE`: 0 for a process that writes no files; QEMU needs the guest's RAM (it
    /// sizes its memfd with `ftruncate`, which this limit covers).
    pub file_size: u64,
    /// `RLIMIT_NOFILE`: [`NOFILE_LIMIT`] plus the jail's [`JailConfig::extra_open_files`]
    /// (the builders set it from the config).
    pub open_files: u64,
}

/// Closes every file descriptor above stderr but `keep` (the network namespace passed on
/// purpose).
pub fn close_inherited_fds(keep: Option<i32>) {
    let ranges = match keep.and_then(|k| libc::c_uint::try_from(k).ok()) {
        Some(k) if k > 3 => [(3, k - 1), (k + 1, libc::c_uint::MAX)],
        Some(3) => [(4, libc::c_uint::MAX), (1, 0)],
        _ => [(3, libc::c_uint::MAX), (1, 0)],
    };
    // Nothing in this process uses a descriptor above 2 yet but `keep` (this runs right
    // after the configuration is read).
    for (first, last) in ranges.into_iter().filter(|(f, l)| f <= l) {
        if let Err(e) = sys::close_range(first, last) {
            tracing::warn!("close_range: {}", e.desc());
        }
    }
}

/// Step 1: new namespaces and the fork into the PID namespace. Returns in the child (PID 1 of
/// the new namespace); the parent becomes the reaper and never returns.
///
/// Must be called while the process has a single thread.
pub fn enter(cfg: &JailConfig) -> Result<(), JailError> {
    let plan = RootPlan::new(cfg)?;
    ROOT.set(plan).ok();
    let reaper =
        crate::seccomp::compiled(crate::seccomp::ThreadKind::Reaper).map_err(JailError::Seccomp)?;
    enter_namespaces(cfg.netns_fd)?;
    if let Some(fd) = cfg.netns_fd {
        // The namespace is joined; the descriptor is not used again.
        sys::close(fd);
    }
    let id = JAIL_ID_BASE + getpid().as_raw() as u32;
    let (launcher, reaper_fd) = before_fork()?;
    // SAFETY: the caller guarantees this process has one thread, so the child may run any code.
    match unsafe { sys::fork() }.map_err(at(Step::Fork))? {
        ForkResult::Child => {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(at(Step::DeathSignal))?;
            JAIL_ID.set(id).ok();
            REAPER_FD.set(reaper_fd).ok();
            Ok(())
        }
        // The control channel and the console belong to the child; stderr stays for errors.
        ForkResult::Parent { child } => reap(child, id, 0..=1, reaper, launcher),
    }
}

/// What the two sides of the jail's fork need to know their parent is alive once a uid change
/// has cleared the parent-death signal: the launcher's pid (the reaper's parent), and a pidfd
/// of the reaper-to-be (the child's parent, outside its PID namespace, where `getppid` says 0).
fn before_fork() -> Result<(i32, i32), StepError> {
    let fd = sys::pidfd_of_self().map_err(at(Step::DeathSignal))?;
    Ok((nix::unistd::getppid().as_raw(), fd))
}

/// After a uid change (which clears it): re-arms the parent-death signal and checks the parent,
/// the reaper behind `reaper_fd`, has not died in between.
pub(crate) fn rearm_under_reaper(reaper_fd: i32) -> Result<(), StepError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(at(Step::DeathSignal))?;
    let exited = sys::pidfd_exited(reaper_fd);
    sys::close(reaper_fd);
    if exited {
        return Err(at(Step::DeathSignal)(nix::errno::Errno::ESRCH));
    }
    Ok(())
}

/// The pidfd of the reaper (kept by [`enter`] for [`confine`]).
static REAPER_FD: std::sync::OnceLock<i32> = std::sync::OnceLock::new();

/// The uid/gid chosen in [`enter`] (read by [`confine`] in the child).
static JAIL_ID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// The root prepared in [`enter`] (built by [`confine`]).
static ROOT: std::sync::OnceLock<RootPlan> = std::sync::OnceLock::new();

/// The reaper: closes the descriptors in `close`, restricts itself like the VM, waits for it,
/// and ends the same way (code, or the same signal). Allocates nothing.
fn reap(
    child: nix::unistd::Pid,
    id: u32,
    close: std::ops::RangeInclusive<libc::c_uint>,
    filter: &crate::seccomp::Compiled,
    launcher: i32,
) -> ! {
    // The reaper never uses these again.
    let _ = sys::close_range(*close.start(), *close.end());
    let me = Identity { uid: id, gid: id };
    let cap = MemoryCap {
        resource: Resource::RLIMIT_DATA,
        bytes: REAPER_DATA_MIB << 20,
        file_size: 0,
        open_files: NOFILE_LIMIT,
    };
    // The uid change in `restrict` cleared the parent-death signal: re-armed, then the launcher
    // must still be the parent (it may have died in between).
    let filtered = restrict(me, cap).is_ok()
        && nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_ok()
        && nix::unistd::getppid().as_raw() == launcher
        && filter.apply().is_ok();
    if !filtered {
        // Without its restrictions the reaper must not outlive the VM: take it down.
        let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
        sys::exit_now(1);
    }
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => sys::exit_now(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => sys::exit_by_signal(sig),
            Ok(_) | Err(nix::Error::EINTR) => continue,
            Err(_) => sys::exit_now(1),
        }
    }
}

/// A directory the jailed VM process writes files into (its snapshot directory), and the
/// largest file it may write there.
#[derive(Debug, Clone, Copy)]
pub struct Writable<'a> {
    /// The directory (also in [`JailConfig::binds`], so it is in the root): handed to the
    /// jail's uid and gid with mode `0700` before the uid change.
    pub dir: &'a std::path::Path,
    /// `RLIMIT_FSIZE` (0 without a writable directory).
    pub max_file_bytes: u64,
}

/// Steps 2 and 3, in the child, once every file the VM needs is open (its guest RAM of
/// `guest_mib` included, which counts against the data limit). With `writable`, the process
/// keeps one directory it may write files into, up to its size limit; without, it writes no
/// files (`RLIMIT_FSIZE` 0).
pub fn confine(
    cfg: &JailConfig,
    guest_mib: u32,
    writable: Option<Writable<'_>>,
) -> Result<(), JailError> {
    let fresh;
    let plan = match ROOT.get() {
        Some(plan) => plan,
        None => {
            fresh = RootPlan::new(cfg)?;
            &fresh
        }
    };
    plan.build()
        .map_err(|e| JailError::Step(e, plan.path_of(&e)))?;
    nix::unistd::sethostname("vm").map_err(at(Step::Hostname))?;
    let id = *JAIL_ID
        .get()
        .unwrap_or(&(JAIL_ID_BASE + getpid().as_raw() as u32));
    let mut cap = MemoryCap {
        resource: Resource::RLIMIT_DATA,
        bytes: data_limit(guest_mib),
        file_size: 0,
        open_files: NOFILE_LIMIT.saturating_add(cfg.extra_open_files),
    };
    if let Some(w) = writable {
        let dir = root::cstring(w.dir)?;
        exec::hand_over(&dir, Some(Uid::from_raw(id)), Gid::from_raw(id), 0o700)
            .map_err(|e| JailError::Step(e, Some(w.dir.to_path_buf())))?;
        cap.file_size = w.max_file_bytes;
    }
    restrict(Identity { uid: id, gid: id }, cap)?;
    if let Some(fd) = REAPER_FD.get() {
        rearm_under_reaper(*fd)?;
    }
    Ok(())
}

/// The `RLIMIT_DATA` of a VM process with `guest_mib` of guest RAM.
pub fn data_limit(guest_mib: u32) -> u64 {
    (u64::from(guest_mib) + VMM_OVERHEAD_MIB) << 20
}

/// Rlimits (the memory cap among them), capabilities, uid/gid and `no_new_privs`. Allocates
/// nothing on success.
pub fn restrict(who: Identity, memory: MemoryCap) -> Result<(), JailError> {
    // A hard limit is raised only with CAP_SYS_RESOURCE (a root launcher has it: Linux's own
    // hard limit, 4096, is what a minimal init leaves), which a launcher in a container may
    // lack: there the descriptors asked for are capped at the hard limit it has (a file
    // server lowers its inode cap to what it finds).
    let open_files = match setrlimit(
        Resource::RLIMIT_NOFILE,
        memory.open_files,
        memory.open_files,
    ) {
        Ok(()) => memory.open_files,
        Err(_) => {
            let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(at(Step::Rlimit))?;
            memory.open_files.min(hard)
        }
    };
    for (res, limit) in [
        (memory.resource, memory.bytes),
        (Resource::RLIMIT_NOFILE, open_files),
        (Resource::RLIMIT_FSIZE, memory.file_size),
        (Resource::RLIMIT_CORE, 0),
        (Resource::RLIMIT_NPROC, NPROC_LIMIT),
    ] {
        setrlimit(res, limit, limit).map_err(at(Step::Rlimit))?;
    }
    drop_bounding_set()?;
    setgroups(&[]).map_err(at(Step::Groups))?;
    let (uid, gid) = (Uid::from_raw(who.uid), Gid::from_raw(who.gid));
    setresgid(gid, gid, gid).map_err(at(Step::SetGid))?;
    setresuid(uid, uid, uid).map_err(at(Step::SetUid))?;
    let caps_err = |what| move |source| JailError::Caps { what, source };
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable] {
        caps::clear(None, set).map_err(caps_err("clearing capabilities"))?;
    }
    caps::clear(None, CapSet::Ambient).map_err(caps_err("clearing ambient capabilities"))?;
    nix::sys::prctl::set_no_new_privs().map_err(at(Step::NoNewPrivs))?;
    Ok(())
}

/// Drops every capability from the bounding set (without allocating: `caps::all()` would).
fn drop_bounding_set() -> Result<(), JailError> {
    sys::capbset_drop_all_but(None).map_err(|e| at(Step::Bounding)(e).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn relative_paths_are_refused_before_anything_changes() {
        let cfg = JailConfig {
            root: "rel".into(),
            ..JailConfig::default()
        };
        assert!(matches!(enter(&cfg), Err(JailError::Relative(p)) if p == Path::new("rel")));
    }
}

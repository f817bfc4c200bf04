//! Seccomp filters, one allowlist per kind of VMM thread (reviewed here, and only here).
//!
//! Off unless the process turns them on ([`enable`]: `vm-vmm` does, a library user running a
//! VM on its own threads does not). Each thread installs its filter itself ([`apply`]) before
//! it touches guest data: the main thread once the vCPU and control threads exist, a vCPU
//! thread first thing, the device control thread and a device worker first thing, the
//! reaper once it is jailed. A
//! non-allowlisted system call kills the whole process (`SECCOMP_RET_KILL_PROCESS`), which the
//! launcher sees as death by `SIGSYS`.
//!
//! Filters stack: a thread inherits the filter of the thread that created it. Device workers
//! are started by the VM's device control thread (when the guest activates a device, the vCPU
//! thread only asks for it: `vmm::virtio::starter`), so the device control list also holds
//! what a worker needs to start and run; the worker then adds its own, narrower list. A vCPU
//! thread starts nothing: its list has no thread creation, no `seccomp`, and none of the
//! devices' calls (no `socket`, `connect`, `accept4`), as Firecracker's vCPU filter.
//! Every thread kind may use the syscalls of [`COMMON`] (memory, futexes, signals, exit), and
//! gets `EACCES` for those of [`REFUSED`] (opening files: the C library tries on its own).
//!
//! `ioctl` is checked by request number (its second argument): a vCPU thread may issue
//! `KVM_RUN` and `KVM_GET_REGS` (`VCPU_IOCTLS`) only, a worker (and the device control thread
//! that starts it) only the requests of `DEVICE_IOCTLS`. The fd itself cannot be checked (seccomp sees numbers only),
//! so a vCPU could issue `KVM_RUN` on another vCPU's fd: that only runs that vCPU.
//!
//! A VMM configured for snapshots adds the lists of [`snapshot`] (control thread: the files
//! and the VM-wide `KVM_GET_*`; vCPU threads: their own `KVM_GET_*`), chosen once per process
//! before any filter is compiled; every other VMM keeps the lists below alone. A restoring
//! VMM decodes and sets the snapshot's state on a thread of its own ([`ThreadKind::Restore`],
//! after `confine`): the main thread starts it and waits, so no other thread inherits its
//! filter, and its list is the vCPU's activation calls plus the `KVM_SET_*` requests of
//! [`snapshot::RESTORE_IOCTLS`].
//!
//! The device lists are exercised by every virtio test: the guest-driver harness
//! (`virtio::test_utils`, feature `test-utils`) turns the filters on, so each device's workers
//! run under the production filter through every happy path and malformed input there.

pub mod client;
pub mod snapshot;
pub mod vhost;

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The kinds of thread a `vm-vmm` process has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// The main thread once the VM runs: waits for the outcome, reports it, exits.
    Main,
    /// Reads the control channel and stops the VM.
    Control,
    /// Runs one vCPU.
    Vcpu,
    /// The VM's device control thread: starts the device workers the vCPU threads ask for.
    DeviceControl,
    /// A virtio device worker (block, vsock, rng).
    Device,
    /// The jail's reaper: waits for the VM process and exits the same way.
    Reaper,
    /// A virtio-fs device worker: the read-only file server of one host mount.
    FsDevice,
    /// Decodes a snapshot's state file and sets it into the restored VM (`vm-vmm` with a
    /// restore only: one short-lived thread, started after `confine`, that starts nothing).
    Restore,
}

/// Why a filter could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// Building the BPF program failed.
    #[error("building the {0:?} seccomp filter")]
    Build(ThreadKind, #[source] seccompiler::BackendError),
    /// Installing it failed.
    #[error("installing the {0:?} seccomp filter")]
    Install(ThreadKind, #[source] seccompiler::Error),
    /// Building the filter of a program we launch failed.
    #[error("building the seccomp filter of {0}")]
    External(&'static str, #[source] seccompiler::BackendError),
    /// Setting `no_new_privs` before a process-wide filter failed.
    #[error("setting no_new_privs")]
    NoNewPrivs(#[source] vm_sys::Errno),
    /// Installing an agent reader's filter on every thread failed ([`client`]).
    #[error("installing the agent reader's seccomp filter on every thread")]
    Reader(#[source] seccompiler::Error),
}

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns filters on for this process: every later [`apply`] installs one.
pub fn enable() {
    ENABLED.store(true, Ordering::SeqCst);
}

/// Whether [`enable`] was called.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// Installs the filter of `kind` on the calling thread (nothing when filters are off).
pub fn apply(kind: ThreadKind) -> Result<(), SeccompError> {
    if !enabled() {
        return Ok(());
    }
    compiled(kind)?.apply()
}

/// The two BPF programs of a thread kind, compiled once per process ([`compiled`]).
#[derive(Debug)]
pub struct Compiled {
    kind: ThreadKind,
    refusals: BpfProgram,
    allow: BpfProgram,
}

impl Compiled {
    /// Installs both programs on the calling thread. Allocates nothing on success (a forked
    /// child of a multi-threaded process may call it).
    pub fn apply(&self) -> Result<(), SeccompError> {
        seccompiler::apply_filter(&self.refusals)
            .map_err(|e| SeccompError::Install(self.kind, e))?;
        seccompiler::apply_filter(&self.allow).map_err(|e| SeccompError::Install(self.kind, e))
    }
}

static CACHE: [OnceLock<Compiled>; 8] = [const { OnceLock::new() }; 8];

/// The filters of `kind`, compiled on first use and kept: every vCPU and worker thread of a
/// VM installs the same programs, and compiling them is the costly part.
pub fn compiled(kind: ThreadKind) -> Result<&'static Compiled, SeccompError> {
    let slot = &CACHE[kind as usize];
    if let Some(c) = slot.get() {
        return Ok(c);
    }
    let c = Compiled {
        kind,
        refusals: refusals(kind)?,
        allow: program(kind)?,
    };
    Ok(slot.get_or_init(|| c))
}

/// The calls every thread gets `EACCES` for instead of being killed: the C library makes them
/// on its own and copes with the failure. A second filter, stacked with the allowlist (which
/// lists them, so the kernel's most restrictive answer is this one's errno).
const REFUSED: &[Entry] = &[(
    libc::SYS_openat,
    "glibc's malloc reads /proc/sys/vm/overcommit_memory when it trims a thread's heap",
)];

fn refusals(kind: ThreadKind) -> Result<BpfProgram, SeccompError> {
    refusals_with(kind, snapshot::snapshots_enabled())
}

/// The refusal program of `kind`; with `snapshots`, the control thread's `openat` is let
/// through for [`snapshot::CREATE_FLAGS`] (and refused for every other flag set).
fn refusals_with(kind: ThreadKind, snapshots: bool) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        REFUSED.iter().map(|(nr, _)| (*nr, Vec::new())).collect();
    if snapshots && kind == ThreadKind::Control {
        let other_flags = SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            snapshot::CREATE_FLAGS,
        )
        .and_then(|c| SeccompRule::new(vec![c]))
        .map_err(|e| SeccompError::Build(kind, e))?;
        rules.insert(libc::SYS_openat, vec![other_flags]);
    }
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| SeccompError::Build(kind, e))?
    .try_into()
    .map_err(|e| SeccompError::Build(kind, e))
}

/// Like [`apply`] for threads that cannot return an error: a thread that cannot be filtered
/// must not run, so the process ends.
pub fn apply_or_exit(kind: ThreadKind) {
    if let Err(e) = apply(kind) {
        tracing::error!("{e}: {}", vm_error_chain::error_chain(&e));
        std::process::exit(1);
    }
}

/// The BPF program of `kind`.
pub fn program(kind: ThreadKind) -> Result<BpfProgram, SeccompError> {
    program_with(kind, snapshot::snapshots_enabled())
}

/// The BPF program of `kind`, with or without the [`snapshot`] lists.
pub fn program_with(kind: ThreadKind, snapshots: bool) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowlist_with(kind, snapshots)
        .iter()
        .map(|(nr, _why)| (*nr, Vec::new()))
        .collect();
    // vCPUs and workers may issue only these ioctl requests (an empty rule list allows any).
    // A worker inherits the device control thread's filter, which allows the worker's requests.
    let requests: &[&[u64]] = match (kind, snapshots) {
        (ThreadKind::Device | ThreadKind::DeviceControl, _) => &[DEVICE_IOCTLS],
        (ThreadKind::Vcpu, false) => &[VCPU_IOCTLS],
        (ThreadKind::Vcpu, true) => &[VCPU_IOCTLS, snapshot::VCPU_IOCTLS],
        (ThreadKind::Control, true) => &[snapshot::CONTROL_IOCTLS],
        (ThreadKind::Restore, _) => &[snapshot::RESTORE_IOCTLS],
        _ => &[],
    };
    if !requests.is_empty() {
        let only = requests
            .iter()
            .flat_map(|l| l.iter())
            .map(|req| {
                SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *req)
                    .and_then(|c| SeccompRule::new(vec![c]))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SeccompError::Build(kind, e))?;
        rules.insert(libc::SYS_ioctl, only);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(|e| SeccompError::Build(kind, e))?;
    filter.try_into().map_err(|e| SeccompError::Build(kind, e))
}

/// A syscall and who needs it.
pub(crate) type Entry = (i64, &'static str);

/// Every thread kind.
const COMMON: &[Entry] = &[
    (libc::SYS_futex, "mutexes, condvars, thread joins"),
    (libc::SYS_mmap, "allocation"),
    (libc::SYS_munmap, "allocation, thread stacks at thread exit"),
    (libc::SYS_mremap, "allocation (realloc)"),
    (libc::SYS_madvise, "the allocator returning memory"),
    (libc::SYS_brk, "allocation"),
    (libc::SYS_mprotect, "allocation (new arenas)"),
    (libc::SYS_write, "diagnostics on stderr"),
    (libc::SYS_rt_sigreturn, "return from the vCPU kick handler"),
    (libc::SYS_rt_sigprocmask, "thread exit, signal masks"),
    (libc::SYS_sigaltstack, "thread exit (the guard stack)"),
    (
        libc::SYS_clock_gettime,
        "Instant::now when the vDSO falls back",
    ),
    (libc::SYS_clock_nanosleep, "thread::sleep"),
    (libc::SYS_nanosleep, "thread::sleep"),
    (
        libc::SYS_restart_syscall,
        "a sleep or timed wait resumed after the VM process was stopped and continued (pause)",
    ),
    (libc::SYS_sched_yield, "spin loops in locks"),
    (libc::SYS_gettid, "thread ids (locks, logging)"),
    (libc::SYS_getpid, "thread ids (locks, logging)"),
    (libc::SYS_exit, "thread exit"),
    (libc::SYS_exit_group, "process exit"),
    (
        libc::SYS_fcntl,
        "debug builds check an fd is open before closing it; fd duplication",
    ),
];

/// The main thread after start.
const MAIN: &[Entry] = &[
    (libc::SYS_tgkill, "kicking vCPU threads while the VM stops"),
    (libc::SYS_close, "releasing the VM (its fds) once it ended"),
    (
        libc::SYS_unlink,
        "the vsock device removing its socket as the VM is released",
    ),
];

/// The control thread.
const CONTROL: &[Entry] = &[
    (libc::SYS_read, "the control channel (stdin)"),
    (
        libc::SYS_tgkill,
        "kicking vCPU threads out of KVM_RUN on stop",
    ),
];

/// A vCPU thread. Activating a device leaves the worker to the device control thread, so
/// nothing here starts a thread or touches a host socket.
const VCPU: &[Entry] = &[
    (
        libc::SYS_ioctl,
        "KVM_RUN and KVM_GET_REGS on its vCPU fd only (VCPU_IOCTLS)",
    ),
    (
        libc::SYS_tgkill,
        "kicking the other vCPUs on reset or fault",
    ),
    (libc::SYS_read, "draining eventfds on device reset"),
    (
        libc::SYS_close,
        "dropping a stopped worker's fds (or a pending one's) on device reset",
    ),
];

/// The device control thread (and what a worker it starts needs to get going).
const DEVICE_CONTROL: &[Entry] = &[
    (libc::SYS_read, "its wake eventfd"),
    (libc::SYS_eventfd2, "a worker's stop eventfd"),
    (libc::SYS_epoll_create1, "a worker's epoll"),
    (libc::SYS_epoll_ctl, "registering a worker's fds"),
    (libc::SYS_close, "a worker's fds when its start fails"),
    (libc::SYS_clone3, "starting a device worker thread"),
    (
        libc::SYS_clone,
        "starting a device worker thread (fallback)",
    ),
    (libc::SYS_set_robust_list, "new thread set-up"),
    (libc::SYS_rseq, "new thread set-up"),
    (libc::SYS_prctl, "naming the new worker thread"),
    (libc::SYS_sched_getaffinity, "new thread set-up"),
    (
        libc::SYS_seccomp,
        "the worker installing its own, narrower filter",
    ),
];

/// `_IO(KVMIO, nr)`: a KVM request number without data.
const fn kvm_io(nr: u64) -> u64 {
    (0xae << 8) | nr
}

/// `_IOR(KVMIO, nr, size)`: a KVM request number that reads `size` bytes.
const fn kvm_ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (0xae << 8) | nr
}

/// `_IOW(KVMIO, nr, size)`: a KVM request number that writes `size` bytes.
const fn kvm_iow(nr: u64, size: usize) -> u64 {
    (1 << 30) | ((size as u64) << 16) | (0xae << 8) | nr
}

/// `_IOWR(KVMIO, nr, size)`: a KVM request number that writes and reads `size` bytes.
const fn kvm_iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (0xae << 8) | nr
}

/// `KVM_RUN` (`_IO(KVMIO, 0x80)`).
pub const KVM_RUN: u64 = 0xae80;
/// `KVM_GET_REGS` (`_IOR(KVMIO, 0x81, struct kvm_regs)`).
pub const KVM_GET_REGS: u64 = kvm_ior(0x81, std::mem::size_of::<kvm_bindings::kvm_regs>());

/// The only `ioctl` requests a vCPU thread makes once filtered.
const VCPU_IOCTLS: &[u64] = &[
    KVM_RUN,      // the vCPU loop
    KVM_GET_REGS, // the faulting instruction's address, when a vCPU faults
];

/// The only `ioctl` requests a device worker may make.
const DEVICE_IOCTLS: &[u64] = &[
    libc::FIONBIO, // vsock: set_nonblocking on accepted and connected host sockets
];

/// A device worker (its filter stacks on the device control thread's, see the module docs).
const DEVICE: &[Entry] = &[
    (libc::SYS_ioctl, "vsock: FIONBIO only (DEVICE_IOCTLS)"),
    (libc::SYS_epoll_wait, "the worker loop"),
    (libc::SYS_epoll_pwait, "the worker loop"),
    (
        libc::SYS_epoll_ctl,
        "vsock: adding and removing connections",
    ),
    (libc::SYS_read, "eventfds; vsock: host sockets"),
    (libc::SYS_readv, "vsock: host sockets"),
    (libc::SYS_writev, "vsock: host sockets"),
    (libc::SYS_recvfrom, "vsock: host sockets"),
    (libc::SYS_sendto, "vsock: host sockets"),
    (libc::SYS_recvmsg, "vsock: host sockets"),
    (libc::SYS_sendmsg, "vsock: host sockets"),
    (libc::SYS_accept4, "vsock: host clients on the Unix socket"),
    (libc::SYS_socket, "vsock: guest connections to <uds>_<port>"),
    (
        libc::SYS_connect,
        "vsock: guest connections to <uds>_<port>",
    ),
    (libc::SYS_shutdown, "vsock: half-close"),
    (libc::SYS_getsockopt, "vsock: SO_ERROR of a pending connect"),
    (libc::SYS_setsockopt, "vsock: socket options"),
    (libc::SYS_close, "vsock: closing connections"),
    (libc::SYS_pread64, "block: reads of the disk image"),
    (libc::SYS_preadv, "block: reads of the disk image"),
    (libc::SYS_lseek, "block: the image size"),
    (libc::SYS_fstat, "block: the image size"),
    (libc::SYS_fsync, "block: flush requests"),
    (libc::SYS_fdatasync, "block: flush requests"),
    (libc::SYS_getrandom, "rng: guest entropy"),
    (libc::SYS_tgkill, "a worker fault stopping the VM"),
];

/// What the read-only file server (`vm_virtiofs`) calls on the tree it holds by descriptor,
/// in a `vm-vmm` worker ([`FS_DEVICE`]) and in `vm-virtiofs` ([`vhost::VIRTIOFS`]) alike.
pub(crate) const FILE_SERVER: &[Entry] = &[
    (
        libc::SYS_openat2,
        "LOOKUP: one name beneath a held directory (RESOLVE_BENEATH, O_NOFOLLOW)",
    ),
    (libc::SYS_getdents64, "READDIR and READDIRPLUS"),
    (libc::SYS_readlinkat, "READLINK of a symlink held O_PATH"),
    (libc::SYS_fgetxattr, "GETXATTR (user.* only)"),
    (libc::SYS_flistxattr, "LISTXATTR"),
    (
        libc::SYS_fstatfs,
        "STATFS of the share (fstatvfs); SETUPMAPPING: is the file on tmpfs",
    ),
];

/// A virtio-fs worker of `vm-vmm`: the file server of one host mount ([`FILE_SERVER`]) and its
/// DAX window (`mmap` with `MAP_FIXED` inside it: [`COMMON`]'s `mmap`). It stacks on the
/// device control thread's filter, whose list includes this one. No `ioctl` at all.
const FS_DEVICE: &[Entry] = &[
    (libc::SYS_epoll_wait, "the worker loop"),
    (libc::SYS_epoll_pwait, "the worker loop"),
    (libc::SYS_read, "its notify and stop eventfds"),
    (
        libc::SYS_fstat,
        "GETATTR, LOOKUP: attributes of a held descriptor",
    ),
    (
        libc::SYS_newfstatat,
        "GETATTR, LOOKUP: fstat through fstatat(AT_EMPTY_PATH)",
    ),
    (
        libc::SYS_statx,
        "GETATTR, LOOKUP: fstat through statx (newer C libraries)",
    ),
    (
        libc::SYS_pread64,
        "READ; SETUPMAPPING's copy of a tmpfs chunk",
    ),
    (
        libc::SYS_lseek,
        "READDIR from the guest's cookie; SEEK_DATA/SEEK_HOLE for LSEEK and SETUPMAPPING",
    ),
    (
        libc::SYS_close,
        "FORGET and RELEASE closing descriptors; a lookup's probe",
    ),
    (libc::SYS_tgkill, "a worker fault stopping the VM"),
];

/// The restore thread: the state decoded (allocation only, in [`COMMON`]), then set with
/// `KVM_SET_*` requests, and each device past DRIVER_OK given its worker as a vCPU thread
/// gives it at DRIVER_OK (descriptors duplicated, eventfds drained and signalled).
const RESTORE: &[Entry] = &[
    (
        libc::SYS_ioctl,
        "the saved vCPU and VM-wide state: KVM_SET_* only (snapshot::RESTORE_IOCTLS)",
    ),
    (libc::SYS_read, "a device's request eventfd, drained"),
    (libc::SYS_close, "a replaced pending worker's descriptors"),
];

/// The reaper.
const REAPER: &[Entry] = &[
    (libc::SYS_wait4, "waiting for the VM process"),
    (libc::SYS_waitid, "waiting for the VM process"),
    (
        libc::SYS_kill,
        "killing the VM process if the reaper cannot be confined",
    ),
    (
        libc::SYS_rt_sigaction,
        "restoring the default action of the VM's fatal signal",
    ),
    (libc::SYS_tgkill, "re-raising the VM's fatal signal"),
];

/// The allowlist of `kind`: [`COMMON`] plus its own (for the device control thread, plus
/// [`DEVICE`]).
pub fn allowlist(kind: ThreadKind) -> Vec<Entry> {
    allowlist_with(kind, snapshot::snapshots_enabled())
}

/// The allowlist of `kind`, with or without the [`snapshot`] lists.
pub fn allowlist_with(kind: ThreadKind, snapshots: bool) -> Vec<Entry> {
    let own: &[&[Entry]] = match kind {
        ThreadKind::Main => &[MAIN],
        ThreadKind::Control if snapshots => &[CONTROL, snapshot::CONTROL],
        ThreadKind::Control => &[CONTROL],
        ThreadKind::Vcpu => &[VCPU],
        // A worker inherits the device control thread's filter: that list must let the
        // worker's calls pass.
        ThreadKind::DeviceControl => &[DEVICE_CONTROL, DEVICE, FS_DEVICE, FILE_SERVER],
        ThreadKind::Device => &[DEVICE],
        ThreadKind::FsDevice => &[FS_DEVICE, FILE_SERVER],
        ThreadKind::Reaper => &[REAPER],
        ThreadKind::Restore => &[RESTORE],
    };
    COMMON
        .iter()
        .chain(REFUSED)
        .chain(own.iter().flat_map(|l| l.iter()))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_request_numbers_are_the_kernels() {
        assert_eq!(KVM_RUN, 0xae80);
        assert_eq!(KVM_GET_REGS, 0x8090_ae81);
    }

    const KINDS: [ThreadKind; 8] = [
        ThreadKind::Main,
        ThreadKind::Control,
        ThreadKind::Vcpu,
        ThreadKind::DeviceControl,
        ThreadKind::Device,
        ThreadKind::Reaper,
        ThreadKind::FsDevice,
        ThreadKind::Restore,
    ];

    #[test]
    fn every_filter_compiles_and_every_entry_says_who_needs_it() {
        for kind in KINDS {
            assert!(!program(kind).unwrap().is_empty(), "{kind:?}");
            assert!(allowlist(kind).iter().all(|(_, why)| !why.is_empty()));
        }
    }

    #[test]
    fn dangerous_calls_are_on_no_list() {
        for kind in KINDS {
            let list = allowlist(kind);
            for nr in [
                libc::SYS_execve,
                libc::SYS_open,
                libc::SYS_ptrace,
                libc::SYS_mount,
                libc::SYS_unshare,
                libc::SYS_setns,
                libc::SYS_bpf,
                libc::SYS_process_vm_writev,
            ] {
                assert!(list.iter().all(|(n, _)| *n != nr), "{kind:?} allows {nr}");
            }
        }
        // A worker runs under the device control thread's filter too: everything it may do,
        // that filter allows.
        let control = allowlist(ThreadKind::DeviceControl);
        let workers = allowlist(ThreadKind::Device)
            .into_iter()
            .chain(allowlist(ThreadKind::FsDevice));
        for (nr, why) in workers {
            assert!(
                control.iter().any(|(n, _)| *n == nr),
                "device control filter blocks {nr} ({why})"
            );
        }
        // Only vCPU threads, devices and the restore thread issue any ioctl (devices:
        // FIONBIO only; the restore thread: KVM_SET_* only); only the device control thread
        // starts threads or installs a filter.
        for kind in KINDS {
            let has = |nr| allowlist(kind).iter().any(|(n, _)| *n == nr);
            let ioctl = matches!(
                kind,
                ThreadKind::Vcpu
                    | ThreadKind::Device
                    | ThreadKind::DeviceControl
                    | ThreadKind::Restore
            );
            assert_eq!(has(libc::SYS_ioctl), ioctl, "{kind:?}");
            for nr in [libc::SYS_clone3, libc::SYS_clone, libc::SYS_seccomp] {
                assert_eq!(has(nr), kind == ThreadKind::DeviceControl, "{kind:?} {nr}");
            }
        }
    }

    /// Thread creation, filter changes and host sockets: what neither a vCPU thread nor the
    /// restore thread may do.
    const STARTS_OR_TALKS: [i64; 8] = [
        libc::SYS_clone3,
        libc::SYS_clone,
        libc::SYS_seccomp,
        libc::SYS_socket,
        libc::SYS_connect,
        libc::SYS_accept4,
        libc::SYS_sendmsg,
        libc::SYS_recvmsg,
    ];

    fn allows_none(kind: ThreadKind, calls: &[i64]) {
        let list = allowlist(kind);
        for nr in calls {
            assert!(list.iter().all(|(n, _)| n != nr), "{kind:?} allows {nr}");
        }
    }

    /// A vCPU thread has Firecracker's narrowness: no thread creation, no filter changes, no
    /// host sockets, no new descriptors of any kind.
    #[test]
    fn the_vcpu_list_starts_nothing_and_opens_nothing() {
        allows_none(ThreadKind::Vcpu, &STARTS_OR_TALKS);
        allows_none(
            ThreadKind::Vcpu,
            &[
                libc::SYS_eventfd2,
                libc::SYS_epoll_create1,
                libc::SYS_epoll_ctl,
                libc::SYS_prctl,
                libc::SYS_getrandom,
                libc::SYS_pread64,
            ],
        );
    }

    /// The restore thread parses a hostile file: it starts nothing, opens nothing, touches no
    /// socket or file, and of the ioctls only sets state (none of `KVM_RUN`, `KVM_GET_*`).
    #[test]
    fn the_restore_list_parses_and_sets_state_only() {
        allows_none(ThreadKind::Restore, &STARTS_OR_TALKS);
        allows_none(
            ThreadKind::Restore,
            &[
                libc::SYS_eventfd2,
                libc::SYS_prctl,
                libc::SYS_tgkill,
                libc::SYS_pread64,
                libc::SYS_pwrite64,
                libc::SYS_unlink,
                libc::SYS_statx,
            ],
        );
        assert!(!snapshot::RESTORE_IOCTLS.contains(&KVM_RUN));
        assert!(snapshot::RESTORE_IOCTLS.iter().all(|r| {
            !snapshot::VCPU_IOCTLS.contains(r) && !snapshot::CONTROL_IOCTLS.contains(r)
        }));
    }

    /// The refusal filter, installed on a thread of its own: `openat` fails with EACCES and
    /// the thread lives on.
    #[test]
    fn refused_calls_fail_with_eacces_instead_of_killing() {
        let prog = refusals(ThreadKind::Device).unwrap();
        let r = std::thread::spawn(move || {
            seccompiler::apply_filter(&prog).unwrap();
            std::fs::File::open("/proc/sys/vm/overcommit_memory").map(|_| ())
        })
        .join()
        .unwrap();
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EACCES));
        assert!(std::fs::File::open("/proc/sys/vm/overcommit_memory").is_ok());
    }

    #[test]
    fn filters_are_off_until_enabled() {
        // Not enabled in this test process: applying is a no-op (the thread stays unfiltered).
        assert!(!enabled());
        apply(ThreadKind::Device).unwrap();
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        assert!(status.contains("Seccomp:\t0"), "{status}");
    }
}

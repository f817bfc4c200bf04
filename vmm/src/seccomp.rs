//! Seccomp filters, one allowlist per kind of VMM thread (reviewed here, and only here).
//!
//! Off unless the process turns them on ([`enable`]: `vm-vmm` does, a library user running a
//! VM on its own threads does not). Each thread installs its filter itself ([`apply`]) before
//! it touches guest data: the main thread once the vCPU and control threads exist, a vCPU
//! thread first thing, a device worker first thing, the reaper once it is jailed. A
//! non-allowlisted system call kills the whole process (`SECCOMP_RET_KILL_PROCESS`), which the
//! launcher sees as death by `SIGSYS`.
//!
//! Filters stack: a thread inherits the filter of the thread that created it. Device workers
//! are started by a vCPU thread (when the guest activates the device), so the vCPU list also
//! holds what a worker needs to start and run; the worker then adds its own, narrower list.
//! Every thread kind may use the syscalls of [`COMMON`] (memory, futexes, signals, exit).
//!
//! `ioctl` is allowed without argument checks on vCPU threads (they issue `KVM_RUN` and
//! register reads on their own vCPU fd); narrowing it to the KVM request numbers is future work.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// The kinds of thread a `vm-vmm` process has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// The main thread once the VM runs: waits for the outcome, reports it, exits.
    Main,
    /// Reads the control channel and stops the VM.
    Control,
    /// Runs one vCPU (and starts device workers).
    Vcpu,
    /// A virtio device worker (block, vsock, rng).
    Device,
    /// The jail's reaper: waits for the VM process and exits the same way.
    Reaper,
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
    let prog = program(kind)?;
    seccompiler::apply_filter(&prog).map_err(|e| SeccompError::Install(kind, e))
}

/// Like [`apply`] for threads that cannot return an error: a thread that cannot be filtered
/// must not run, so the process ends.
pub fn apply_or_exit(kind: ThreadKind) {
    if let Err(e) = apply(kind) {
        eprintln!("vm-vmm: {e}: {}", vm_error_chain::error_chain(&e));
        std::process::exit(1);
    }
}

/// The BPF program of `kind`.
pub fn program(kind: ThreadKind) -> Result<BpfProgram, SeccompError> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = allowlist(kind)
        .iter()
        .map(|(nr, _why)| (*nr, Vec::new()))
        .collect();
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
type Entry = (i64, &'static str);

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

/// A vCPU thread (and what a worker it starts needs to get going).
const VCPU: &[Entry] = &[
    (libc::SYS_ioctl, "KVM_RUN, register reads on its vCPU fd"),
    (
        libc::SYS_tgkill,
        "kicking the other vCPUs on reset or fault",
    ),
    (libc::SYS_read, "eventfds"),
    (
        libc::SYS_close,
        "dropping eventfds and worker fds on device reset",
    ),
    (libc::SYS_eventfd2, "a worker's stop eventfd"),
    (libc::SYS_epoll_create1, "a worker's epoll"),
    (libc::SYS_epoll_ctl, "registering a worker's fds"),
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

/// A device worker (its filter stacks on its vCPU's, see the module docs).
const DEVICE: &[Entry] = &[
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

/// The allowlist of `kind`: [`COMMON`] plus its own.
pub fn allowlist(kind: ThreadKind) -> Vec<Entry> {
    let own = match kind {
        ThreadKind::Main => MAIN,
        ThreadKind::Control => CONTROL,
        ThreadKind::Vcpu => VCPU,
        ThreadKind::Device => DEVICE,
        ThreadKind::Reaper => REAPER,
    };
    COMMON.iter().chain(own).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [ThreadKind; 5] = [
        ThreadKind::Main,
        ThreadKind::Control,
        ThreadKind::Vcpu,
        ThreadKind::Device,
        ThreadKind::Reaper,
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
                libc::SYS_openat,
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
        // Only vCPU threads issue ioctls; only they start threads.
        for kind in KINDS {
            let has = |nr| allowlist(kind).iter().any(|(n, _)| *n == nr);
            assert_eq!(has(libc::SYS_ioctl), kind == ThreadKind::Vcpu, "{kind:?}");
            assert_eq!(has(libc::SYS_clone3), kind == ThreadKind::Vcpu, "{kind:?}");
        }
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

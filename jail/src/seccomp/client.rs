//! The filter of a host process that reads agent frames once it starts nothing more: `vm exec`
//! (after the boot, or from the start for a named VM), `vm serve`, `vm cp`, the `run -d`
//! supervisor. Such a process parses what a hostile guest's agent sends (frames, file
//! contents, forwarded bytes) but from then on only talks over sockets, touches its own
//! records and run directories, and signals and waits for the VM processes it started: it
//! never executes a program, forks, changes identity or namespaces, mounts, or traces.
//!
//! The filter is installed on every thread of the process at once (`SECCOMP_FILTER_FLAG_TSYNC`,
//! after `no_new_privs`): the async runtime's threads, the drivers' spawner thread (which
//! spawns nothing any more), signal handling. Threads the runtime starts later inherit it;
//! `clone` is allowed only with `CLONE_THREAD` (a new thread, never a process), and `clone3`,
//! whose flags a filter cannot read, answers `ENOSYS`, so the C library falls back to `clone`.
//! Any other call outside the list kills the process (`SECCOMP_RET_KILL_PROCESS`: the exit is
//! `SIGSYS`).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::{Entry, SeccompError};

/// What such a process may call, each with who needs it.
pub const ALLOWED: &[Entry] = &[
    // Memory, threads, synchronization, signals, time.
    (libc::SYS_brk, "allocation"),
    (libc::SYS_mmap, "allocation, thread stacks"),
    (libc::SYS_munmap, "allocation, thread stacks"),
    (libc::SYS_mremap, "allocation (realloc)"),
    (libc::SYS_mprotect, "allocation, thread stack guards"),
    (libc::SYS_madvise, "the allocator returning memory"),
    (libc::SYS_futex, "locks, condition variables, thread joins"),
    (libc::SYS_sched_yield, "spin loops in locks"),
    (
        libc::SYS_sched_getaffinity,
        "the runtime sizing its blocking pool",
    ),
    (
        libc::SYS_rseq,
        "a new thread registers its restartable sequence",
    ),
    (
        libc::SYS_set_robust_list,
        "a new thread's robust futex list",
    ),
    (
        libc::SYS_sigaltstack,
        "a new thread's guard stack, and at its exit",
    ),
    (libc::SYS_exit, "thread exit"),
    (libc::SYS_exit_group, "process exit"),
    (libc::SYS_gettid, "thread ids (locks, logs)"),
    (libc::SYS_getpid, "process id (records, logs)"),
    (libc::SYS_getppid, "the supervisor checks its launcher"),
    (libc::SYS_getuid, "the runtime directory's owner"),
    (libc::SYS_geteuid, "the runtime directory's owner"),
    (libc::SYS_getrandom, "hash maps' seeds, agent tokens"),
    (libc::SYS_rt_sigaction, "signal handlers (Ctrl-C, SIGTERM)"),
    (libc::SYS_rt_sigprocmask, "thread creation and exit"),
    (libc::SYS_rt_sigreturn, "return from a signal handler"),
    (
        libc::SYS_restart_syscall,
        "a wait resumed after SIGSTOP/SIGCONT",
    ),
    (libc::SYS_clock_gettime, "time when the vDSO falls back"),
    (libc::SYS_clock_nanosleep, "sleeps"),
    (libc::SYS_nanosleep, "sleeps"),
    // Event loop.
    (libc::SYS_epoll_create1, "the runtime's reactor"),
    (libc::SYS_epoll_ctl, "the runtime's reactor"),
    (libc::SYS_epoll_wait, "the runtime's reactor"),
    (libc::SYS_epoll_pwait, "the runtime's reactor"),
    (libc::SYS_eventfd2, "waking the reactor"),
    (libc::SYS_poll, "waiting on a descriptor (terminals, pipes)"),
    (
        libc::SYS_ppoll,
        "waiting on a descriptor (terminals, pipes)",
    ),
    (libc::SYS_timerfd_create, "timers"),
    (libc::SYS_timerfd_settime, "timers"),
    // Descriptors and I/O.
    (libc::SYS_read, "sockets, pipes, files"),
    (libc::SYS_readv, "sockets, pipes, files"),
    (libc::SYS_pread64, "files"),
    (libc::SYS_write, "sockets, pipes, files, the console"),
    (libc::SYS_writev, "sockets, pipes, logs"),
    (libc::SYS_pwrite64, "files"),
    (libc::SYS_close, "descriptors"),
    (
        libc::SYS_fcntl,
        "non-blocking and close-on-exec flags, duplicates",
    ),
    (libc::SYS_dup, "descriptors"),
    (libc::SYS_dup3, "descriptors"),
    (libc::SYS_pipe2, "pipes between tasks"),
    (libc::SYS_lseek, "files"),
    (libc::SYS_copy_file_range, "vm cp: file to file"),
    (libc::SYS_sendfile, "vm cp: file to socket"),
    (libc::SYS_splice, "copies between pipes and sockets"),
    // Files: records, run directories, copies.
    (libc::SYS_openat, "records, run directories, vm cp's files"),
    (libc::SYS_newfstatat, "metadata"),
    (libc::SYS_fstat, "metadata"),
    (libc::SYS_statx, "metadata"),
    (libc::SYS_getdents64, "listing run directories"),
    (libc::SYS_mkdir, "run directories"),
    (libc::SYS_mkdirat, "run directories"),
    (libc::SYS_unlink, "removing a run directory's files"),
    (libc::SYS_unlinkat, "removing a run directory's files"),
    (libc::SYS_rmdir, "removing a run directory"),
    (libc::SYS_rename, "records written by rename"),
    (libc::SYS_renameat, "records written by rename"),
    (libc::SYS_renameat2, "records written by rename"),
    (libc::SYS_readlink, "procfs lookups (liveness of a pid)"),
    (libc::SYS_readlinkat, "procfs lookups (liveness of a pid)"),
    (libc::SYS_ftruncate, "records and copies"),
    (libc::SYS_fsync, "records"),
    (libc::SYS_fdatasync, "records"),
    (libc::SYS_fchmod, "vm cp keeps a file's mode"),
    (libc::SYS_flock, "record locks"),
    (libc::SYS_getcwd, "relative paths of vm cp"),
    // Sockets (families checked below).
    (libc::SYS_socket, "connecting to the agent, serving a port"),
    (libc::SYS_socketpair, "signal delivery to the runtime"),
    (libc::SYS_connect, "the agent's socket"),
    (libc::SYS_bind, "a published port"),
    (libc::SYS_listen, "a published port"),
    (libc::SYS_accept4, "a published port's clients"),
    (libc::SYS_recvfrom, "sockets"),
    (libc::SYS_recvmsg, "sockets"),
    (libc::SYS_sendto, "sockets"),
    (libc::SYS_sendmsg, "sockets"),
    (libc::SYS_shutdown, "half-closing a stream"),
    (libc::SYS_getsockopt, "socket errors after a connect"),
    (libc::SYS_setsockopt, "socket options"),
    (libc::SYS_getsockname, "the port a listener got"),
    (libc::SYS_getpeername, "a client's address"),
    // The VM processes this process started.
    (
        libc::SYS_kill,
        "stopping the VM's process group; liveness checks",
    ),
    (libc::SYS_tgkill, "signal delivery within the process"),
    (libc::SYS_pidfd_open, "waiting for a VM process"),
    (libc::SYS_pidfd_send_signal, "stopping a VM process"),
    (libc::SYS_wait4, "reaping a VM process"),
    (libc::SYS_waitid, "reaping a VM process"),
    // Checked by argument below.
    (libc::SYS_clone, "a new thread (CLONE_THREAD only)"),
    (
        libc::SYS_clone3,
        "listed so the stacked filter's ENOSYS answers it (the strictest answer wins)",
    ),
    (
        libc::SYS_ioctl,
        "terminal modes and sizes, non-blocking flags",
    ),
    (libc::SYS_prctl, "naming a new thread (PR_SET_NAME only)"),
    (
        libc::SYS_prlimit64,
        "reading this process's own limits (getrlimit); never setting them",
    ),
];

/// `ioctl` requests a reader makes: the terminal's modes and size (`vm exec -t`), and the
/// standard library's descriptor flags.
const IOCTLS: &[u64] = &[
    libc::TCGETS,
    libc::TCSETS,
    libc::TCSETSW,
    libc::TCSETSF,
    libc::TIOCGWINSZ,
    libc::FIONBIO,
    libc::FIOCLEX,
    libc::FIONREAD,
];

/// Socket families a reader opens: Unix (the agent's hybrid vsock socket) and IP (a published
/// port on loopback). No netlink, packet or raw sockets.
const FAMILIES: &[u64] = &[
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
];

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(conds)
}

fn eq(arg: u8, value: u64) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
}

fn build() -> Result<(BpfProgram, BpfProgram), seccompiler::BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|(nr, _)| (*nr, Vec::new())).collect();
    let thread = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
        libc::CLONE_THREAD as u64,
    )?;
    rules.insert(libc::SYS_clone, vec![rule(vec![thread])?]);
    rules.insert(
        libc::SYS_ioctl,
        IOCTLS
            .iter()
            .map(|r| rule(vec![eq(1, *r)?]))
            .collect::<Result<_, _>>()?,
    );
    rules.insert(
        libc::SYS_socket,
        FAMILIES
            .iter()
            .map(|f| rule(vec![eq(0, *f)?]))
            .collect::<Result<_, _>>()?,
    );
    rules.insert(
        libc::SYS_prctl,
        vec![rule(vec![eq(0, libc::PR_SET_NAME as u64)?])?],
    );
    // getrlimit is prlimit64(0, resource, NULL, old): this process, nothing set.
    rules.insert(libc::SYS_prlimit64, vec![rule(vec![eq(0, 0)?, eq(2, 0)?])?]);
    let allow = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )?
    .try_into()?;
    // clone3's flags live in memory a filter cannot read: ENOSYS sends the C library to clone.
    let no_clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )?
    .try_into()?;
    Ok((no_clone3, allow))
}

/// The two programs ([`apply_to_process`] installs both), for tests and listings.
pub fn programs() -> Result<(BpfProgram, BpfProgram), SeccompError> {
    build().map_err(|e| SeccompError::External("an agent reader", e))
}

/// Confines this whole process as a reader of agent frames that starts nothing more
/// ([`apply_to_process`]). Call it once every process this one will ever start is started
/// (the VM's), before more of the guest is read.
///
/// The soft descriptor limit is raised to the hard one first: a confined process may read its
/// limits but never set them, and a served port's forwards need the descriptors. Failing to
/// raise it is logged, not fatal (forwards then wait at the lower limit).
pub fn confine_reader() -> Result<(), SeccompError> {
    if let Err(e) = vm_sys::control::raise_nofile() {
        tracing::warn!(error = %e, "cannot raise RLIMIT_NOFILE before confining");
    }
    apply_to_process()
}

/// Sets `no_new_privs` and installs the reader's filter on every thread of this process
/// (see the module docs). From then on the process cannot start a program or a process.
pub fn apply_to_process() -> Result<(), SeccompError> {
    let (no_clone3, allow) = programs()?;
    vm_sys::process::set_no_new_privs().map_err(SeccompError::NoNewPrivs)?;
    for p in [&no_clone3, &allow] {
        seccompiler::apply_filter_all_threads(p).map_err(SeccompError::Reader)?;
    }
    Ok(())
}

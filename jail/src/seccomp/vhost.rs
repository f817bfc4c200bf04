//! The filters of our vhost-user backends, installed by our launcher between `fork` and `exec`
//! ([`crate::exec`]): `vm-vsock` (the tcg driver's vsock device,
//! `vmm::virtio::vsock::vhost_user`) and `vm-virtiofs` (its read-only file server, one per host
//! mount, `vmm::virtio::fs::vhost_user`).
//!
//! A filter survives `execve` (with `no_new_privs`, which the jail sets), so it covers the
//! dynamic loader, the C library's start-up, the Rust runtime and the program itself: the
//! lists below are what those and the backend's code paths call, each with who needs it.
//! [`BASE`] is what both share (the loader and runtime, the vhost-user protocol over its
//! listening socket, guest memory mappings, the event loop); [`VSOCK`] and [`VIRTIOFS`] add
//! each one's own. `execve` itself must be allowed, since the filter is in place before the
//! launcher's own `execve`; after that the jail leaves nothing worth executing (a read-only
//! root with the binary and its libraries, `no_new_privs`, no capabilities, the same filter
//! inherited). Neither has `connect`: the vsock backend never connects anywhere (guest-initiated
//! connections get `RST`), and the file server only answers QEMU. The file server opens files
//! only with `openat2` beneath the descriptors it holds (its `openat` is the loader's); neither
//! can write a file (`RLIMIT_FSIZE` 0 besides). Anything else kills the process (`SIGSYS`),
//! which the driver reports as the cause.

use std::sync::OnceLock;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

use super::SeccompError;

use super::Entry;

/// What both backends, their loader and their runtime call.
pub const BASE: &[Entry] = &[
    (
        libc::SYS_execve,
        "our launcher's exec of the program (the filter is already on)",
    ),
    (libc::SYS_brk, "loader and malloc"),
    (libc::SYS_arch_prctl, "loader: thread pointer"),
    (libc::SYS_set_tid_address, "C library start-up"),
    (
        libc::SYS_set_robust_list,
        "C library start-up and every new thread",
    ),
    (libc::SYS_rseq, "C library start-up and every new thread"),
    (
        libc::SYS_prlimit64,
        "Rust runtime: main thread stack size; RLIMIT_NOFILE read and raised at start",
    ),
    (
        libc::SYS_access,
        "loader: /etc/ld.so.preload (absent in the jail)",
    ),
    (
        libc::SYS_openat,
        "loader: libraries; Rust runtime: /proc/self/maps (absent)",
    ),
    (libc::SYS_newfstatat, "loader: library sizes"),
    (libc::SYS_fstat, "C library (older paths of fstat)"),
    (libc::SYS_statx, "Rust std metadata calls"),
    (libc::SYS_pread64, "loader: ELF headers"),
    (libc::SYS_read, "loader; vsock data from host connections"),
    (
        libc::SYS_write,
        "logging to stderr; vsock data to host connections; eventfd kicks",
    ),
    (libc::SYS_readv, "C library vectored reads (rare)"),
    (libc::SYS_writev, "C library vectored writes (rare)"),
    (
        libc::SYS_lseek,
        "sizing the guest memory regions QEMU passes",
    ),
    (libc::SYS_close, "closing fds"),
    (
        libc::SYS_dup,
        "duplicating the vhost-user socket and memory fds",
    ),
    (libc::SYS_fcntl, "fd flags"),
    (libc::SYS_ioctl, "FIONBIO on sockets, TCGETS on stderr"),
    (libc::SYS_mmap, "memory; mapping the guest RAM memfds"),
    (
        libc::SYS_munmap,
        "memory; unmapping guest RAM on reconfiguration",
    ),
    (libc::SYS_mprotect, "loader; thread stack guards"),
    (libc::SYS_mremap, "realloc of large buffers"),
    (libc::SYS_madvise, "malloc trimming, thread exit"),
    (libc::SYS_futex, "locks and condition variables"),
    (libc::SYS_sched_yield, "spin locks (rare)"),
    (
        libc::SYS_sched_getaffinity,
        "Rust std: available_parallelism",
    ),
    (libc::SYS_getrandom, "hash map seeds"),
    (libc::SYS_gettid, "logging"),
    (libc::SYS_getpid, "C library (abort path)"),
    (libc::SYS_tgkill, "C library abort() on a panic"),
    (libc::SYS_clone3, "starting threads"),
    (libc::SYS_clone, "starting threads (fallback of clone3)"),
    (libc::SYS_exit, "thread exit"),
    (libc::SYS_exit_group, "process exit"),
    (libc::SYS_prctl, "PR_SET_NAME of its threads"),
    (
        libc::SYS_rt_sigaction,
        "Rust runtime: SIGSEGV/SIGBUS handlers, SIGPIPE ignored",
    ),
    (libc::SYS_rt_sigprocmask, "thread start-up"),
    (libc::SYS_rt_sigreturn, "return from a signal handler"),
    (
        libc::SYS_sigaltstack,
        "Rust runtime: stack overflow handler per thread",
    ),
    (
        libc::SYS_restart_syscall,
        "a system call interrupted by a signal",
    ),
    (libc::SYS_clock_nanosleep, "sleeps (rare)"),
    (libc::SYS_nanosleep, "sleeps (rare)"),
    (libc::SYS_clock_gettime, "time, when the vDSO is not used"),
    (
        libc::SYS_poll,
        "Rust runtime: checking fds 0-2 at start; waiting on a socket",
    ),
    (
        libc::SYS_ppoll,
        "waiting on the vhost-user socket (newer C library)",
    ),
    (libc::SYS_epoll_create1, "its event loops"),
    (libc::SYS_epoll_ctl, "its event loops"),
    (libc::SYS_epoll_wait, "its event loops"),
    (libc::SYS_epoll_pwait, "its event loops (newer C library)"),
    (libc::SYS_eventfd2, "event loop exit and kick eventfds"),
    (
        libc::SYS_socket,
        "the vhost-user and hybrid-vsock listeners",
    ),
    (libc::SYS_bind, "the vhost-user and hybrid-vsock listeners"),
    (
        libc::SYS_listen,
        "the vhost-user and hybrid-vsock listeners",
    ),
    (libc::SYS_unlink, "removing a stale socket file before bind"),
    (libc::SYS_accept4, "QEMU's and the host's connections"),
    (libc::SYS_recvmsg, "vhost-user messages with fds"),
    (libc::SYS_sendmsg, "vhost-user replies"),
];

/// What `vm-vsock` adds: the muxer's deadline timer and its host connections.
pub const VSOCK: &[Entry] = &[
    (libc::SYS_timerfd_create, "the muxer's deadline timer"),
    (
        libc::SYS_timerfd_settime,
        "arming the deadline timer (CONNECT and RESPONSE deadlines)",
    ),
    (libc::SYS_recvfrom, "hybrid-vsock handshake and data"),
    (libc::SYS_sendto, "hybrid-vsock handshake and data"),
    (libc::SYS_shutdown, "closing a host connection"),
    (libc::SYS_getsockopt, "socket errors (rare)"),
    (libc::SYS_setsockopt, "socket options (rare)"),
];

/// What `vm-virtiofs` adds: reading the tree it holds by descriptor (the file server's list,
/// shared with `vm-vmm`'s virtio-fs worker).
pub const VIRTIOFS: &[Entry] = super::FILE_SERVER;

/// A system call the filters leave out, for the tests' way to prove a backend that makes a
/// call outside its allowlist dies with `SIGSYS` and the driver names the cause (builds with
/// the `test-hooks` feature only; -1: none).
#[cfg(feature = "test-hooks")]
pub static TEST_DENY: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(-1);

#[cfg(feature = "test-hooks")]
fn test_deny() -> i64 {
    TEST_DENY.load(std::sync::atomic::Ordering::SeqCst)
}

#[cfg(not(feature = "test-hooks"))]
fn test_deny() -> i64 {
    -1
}

/// [`BASE`] and `own` allowed, anything else kills the process; compiled once per process
/// into `slot` (a test's filter with a call left out is never cached).
fn program(
    name: &'static str,
    own: &[Entry],
    slot: &'static OnceLock<BpfProgram>,
) -> Result<&'static BpfProgram, SeccompError> {
    let deny = test_deny();
    if let Some(p) = slot.get().filter(|_| deny < 0) {
        return Ok(p);
    }
    let rules = BASE
        .iter()
        .chain(own)
        .filter(|(nr, _)| *nr != deny)
        .map(|(nr, _)| (*nr, Vec::new()))
        .collect();
    let prog: BpfProgram = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .and_then(TryInto::try_into)
    .map_err(|e| SeccompError::External(name, e))?;
    if deny >= 0 {
        // Leaked, once per boot of that test.
        return Ok(Box::leak(Box::new(prog)));
    }
    Ok(slot.get_or_init(|| prog))
}

/// The filter of `vm-vsock`: [`BASE`] and [`VSOCK`].
pub fn vm_vsock() -> Result<&'static BpfProgram, SeccompError> {
    static PROGRAM: OnceLock<BpfProgram> = OnceLock::new();
    program("vm-vsock", VSOCK, &PROGRAM)
}

/// The filter of `vm-virtiofs`: [`BASE`] and [`VIRTIOFS`].
pub fn vm_virtiofs() -> Result<&'static BpfProgram, SeccompError> {
    static PROGRAM: OnceLock<BpfProgram> = OnceLock::new();
    program("vm-virtiofs", VIRTIOFS, &PROGRAM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_and_every_entry_says_who_needs_it() {
        assert!(!vm_vsock().unwrap().is_empty());
        assert!(!vm_virtiofs().unwrap().is_empty());
        for own in [VSOCK, VIRTIOFS] {
            let mut seen = std::collections::BTreeSet::new();
            for (nr, why) in BASE.iter().chain(own) {
                assert!(seen.insert(nr), "syscall {nr} listed twice");
                assert!(why.len() > 5, "syscall {nr} has no reason");
            }
            // Neither opens a connection of its own or changes its privileges, and neither
            // writes or creates a file anywhere but its socket.
            for nr in [
                libc::SYS_connect,
                libc::SYS_setuid,
                libc::SYS_ptrace,
                libc::SYS_mount,
                libc::SYS_pwrite64,
                libc::SYS_rename,
                libc::SYS_mkdir,
                libc::SYS_ftruncate,
            ] {
                assert!(!seen.contains(&nr), "syscall {nr} allowed");
            }
        }
        // The file server has none of the vsock backend's own calls.
        for (nr, _) in VSOCK {
            assert!(!VIRTIOFS.iter().any(|(n, _)| n == nr));
        }
    }
}

//! The filter of a host process that reads agent frames (`vm exec`, `vm serve`, `vm cp`, the
//! `run -d` supervisor, once they start nothing more: `vm_jail::seccomp::client`), installed
//! in a forked child that then makes one call: what a compromised reader would try (run a
//! program, fork, mount, trace, change uid, open a netlink socket) ends it with `SIGSYS`, while
//! what a reader does (a thread, a Unix socket) goes through.

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::ForkResult;
use vm_jail::seccomp::client;
use vm_sys::process::{exit_now, fork};

/// Forks; the child installs the reader's filter on itself (its only thread), runs `call`
/// and exits 0 if it lived through it. Returns how the child ended.
fn under_filter(call: fn()) -> WaitStatus {
    // Compiled before the fork: the child must not allocate to install it.
    let (no_clone3, allow) = client::programs().unwrap();
    // SAFETY: the child installs two compiled programs, makes the one call under test and
    // leaves with `_exit`; nextest runs each test in a process of its own, so no other thread
    // holds a lock the child could need.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            if vm_sys::process::set_no_new_privs().is_err()
                || seccompiler::apply_filter_all_threads(&no_clone3).is_err()
                || seccompiler::apply_filter_all_threads(&allow).is_err()
            {
                exit_now(2);
            }
            call();
            exit_now(0)
        }
        ForkResult::Parent { child } => waitpid(child, None).unwrap(),
    }
}

fn killed(status: WaitStatus) -> bool {
    matches!(status, WaitStatus::Signaled(_, Signal::SIGSYS, _))
}

#[test]
fn a_reader_cannot_run_a_program_fork_mount_trace_or_change_identity() {
    let cases: [(&str, fn()); 8] = [
        ("execve", || {
            let _ = nix::unistd::execv(c"/bin/true", &[c"true"]);
        }),
        ("fork", || {
            // SAFETY: the call under test; a child that got through would just exit.
            if let Ok(ForkResult::Child) = unsafe { nix::unistd::fork() } {
                exit_now(0);
            }
        }),
        ("mount", || {
            let _ = nix::mount::mount(
                Some("none"),
                "/",
                None::<&str>,
                nix::mount::MsFlags::MS_REMOUNT,
                None::<&str>,
            );
        }),
        ("ptrace", || {
            let _ = nix::sys::ptrace::attach(nix::unistd::Pid::from_raw(1));
        }),
        ("setuid", || {
            let _ = nix::unistd::setuid(nix::unistd::Uid::from_raw(0));
        }),
        ("unshare", || {
            let _ = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS);
        }),
        ("setrlimit", || {
            use nix::sys::resource::{Resource, getrlimit, setrlimit};
            if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
                let _ = setrlimit(Resource::RLIMIT_NOFILE, soft.min(hard) / 2, hard);
            }
        }),
        ("netlink socket", || {
            let _ = nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Netlink,
                nix::sys::socket::SockType::Raw,
                nix::sys::socket::SockFlag::empty(),
                None,
            );
        }),
    ];
    for (what, call) in cases {
        assert!(
            killed(under_filter(call)),
            "{what} went through the reader's filter"
        );
    }
}

#[test]
fn a_reader_may_start_a_thread_read_its_limits_and_use_a_unix_socket() {
    // The control: the same child under the same filter lives through what a reader does,
    // so the SIGSYS above is the list's doing, not the harness's.
    let status = under_filter(|| {
        // A served port checks its descriptor limit (getrlimit) after confinement.
        if nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).is_err() {
            exit_now(4);
        }
        let t = std::thread::spawn(|| {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            use std::io::{Read, Write};
            (&a).write_all(b"frame").unwrap();
            let mut got = [0u8; 5];
            (&b).read_exact(&mut got).unwrap();
            assert_eq!(&got, b"frame");
        });
        if t.join().is_err() {
            exit_now(3);
        }
    });
    assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
}

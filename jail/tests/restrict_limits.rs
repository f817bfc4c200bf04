//! `restrict`'s descriptor limit as a VM process gets it, in a forked child (the call changes
//! the uid and drops every capability): a launcher with `CAP_SYS_RESOURCE` under Linux's own
//! hard limit (4096, what the nested CI's busybox init leaves) still gives a file server the
//! descriptors its inodes need; one without it gets its hard limit, never an error. Needs root
//! (CI runs as root); elsewhere it says so and passes nothing.

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::ForkResult;
use vm_jail::{Identity, MemoryCap, restrict};
use vm_sys::process::{exit_now, fork};

const WANT: u64 = 40_000;
const INIT_HARD: u64 = 4096;

/// Forks; the child sets NOFILE to 4096/4096, drops `CAP_SYS_RESOURCE` when `drop_resource`,
/// then restricts itself asking for [`WANT`] descriptors and exits with 0 when its limit is
/// `expect` (soft and hard), 3 when it is not, 2 when a step failed. Returns how it ended.
fn child_gets(drop_resource: bool, expect: u64) -> Option<i32> {
    let cap = MemoryCap {
        resource: Resource::RLIMIT_DATA,
        bytes: 1 << 30,
        file_size: 0,
        open_files: WANT,
    };
    // The child makes a few system calls and leaves with `_exit`.
    // SAFETY: nothing the child calls takes a lock another test thread could hold.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            if setrlimit(Resource::RLIMIT_NOFILE, INIT_HARD, INIT_HARD).is_err() {
                exit_now(2);
            }
            if drop_resource
                && caps::drop(
                    None,
                    caps::CapSet::Effective,
                    caps::Capability::CAP_SYS_RESOURCE,
                )
                .is_err()
            {
                exit_now(2);
            }
            if restrict(
                Identity {
                    uid: 65534,
                    gid: 65534,
                },
                cap,
            )
            .is_err()
            {
                exit_now(2);
            }
            match getrlimit(Resource::RLIMIT_NOFILE) {
                Ok((soft, hard)) if soft == expect && hard == expect => exit_now(0),
                _ => exit_now(3),
            }
        }
        ForkResult::Parent { child } => match waitpid(child, None).unwrap() {
            WaitStatus::Exited(_, code) => Some(code),
            _ => None,
        },
    }
}

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("restrict_limits: not root, nothing checked");
    false
}

#[test]
fn a_privileged_launcher_raises_the_hard_limit_for_the_file_server() {
    if !is_root() {
        return;
    }
    let resource = caps::has_cap(
        None,
        caps::CapSet::Effective,
        caps::Capability::CAP_SYS_RESOURCE,
    );
    if !resource.unwrap() {
        // A container without it (these CI machines): the other test covers it.
        eprintln!("restrict_limits: no CAP_SYS_RESOURCE here, nothing raised to check");
        return;
    }
    assert_eq!(child_gets(false, WANT), Some(0));
}

#[test]
fn without_cap_sys_resource_the_hard_limit_caps_it() {
    if is_root() {
        assert_eq!(child_gets(true, INIT_HARD), Some(0));
    }
}

//! The production filters, installed in a forked child that then makes one system call: a
//! vCPU thread that calls `socket` dies with `SIGSYS` (the whole process, as in `vm-vmm`),
//! while the device control thread, which starts the vsock worker, may. Needs no KVM: the
//! filter is the kernel's, whatever thread installs it. (`vmm/tests/jail.rs` proves the same
//! for a real vCPU thread of a jailed `vm-vmm`, where KVM is available.)

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::ForkResult;
use vm_jail::seccomp::{ThreadKind, compiled};
use vm_sys::process::{exit_now, fork};

/// Forks; the child installs the filters of `kind`, makes a `socket` call and exits 0 if it
/// lived through it. Returns how the child ended.
fn socket_under(kind: ThreadKind) -> WaitStatus {
    // Compiled before the fork: the child must not allocate.
    let filter = compiled(kind).unwrap();
    // SAFETY: the child only installs a compiled filter (no allocation), makes one socket
    // call and exits with `_exit`.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            if filter.apply().is_err() {
                exit_now(2);
            }
            let _ = std::os::unix::net::UnixDatagram::unbound();
            exit_now(0)
        }
        ForkResult::Parent { child } => waitpid(child, None).unwrap(),
    }
}

#[test]
fn a_vcpu_thread_calling_socket_dies_with_sigsys() {
    assert!(
        matches!(
            socket_under(ThreadKind::Vcpu),
            WaitStatus::Signaled(_, Signal::SIGSYS, _)
        ),
        "the vCPU filter let socket(2) through"
    );
}

#[test]
fn the_device_control_thread_may_call_socket() {
    // The control: the same child under the filter that starts workers lives (exit 0), so
    // the SIGSYS above is the vCPU list's doing, not the harness's.
    assert!(matches!(
        socket_under(ThreadKind::DeviceControl),
        WaitStatus::Exited(_, 0)
    ));
}

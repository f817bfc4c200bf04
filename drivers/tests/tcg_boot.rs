//! TCG boots through the real `qemu-system-x86_64` and our `vm-vsock` (the ones that need
//! guest images are `#[ignore]`d: the slow tier, `cargo test -- --ignored`). Each test checks
//! that nothing is left behind: no child process whose command line names the run dir, and no
//! socket file. Without tcg or the guest images each test fails (a SKIP only with
//! `VM_TEST_ALLOW_NO_DRIVER=1`); a guest whose agent never answers is a failure, never a skip.

mod tcg_common;

use std::path::Path;
use std::time::{Duration, Instant};

use tcg_common::*;
use vm_agent_protocol::protocol::ExecRequest;
use vm_drivers::{Driver, DriverError, ImagePaths, MachineError};

/// QEMU refuses a garbage kernel and exits at once: the boot must fail (not hang for the
/// whole boot timeout), say why, and leave no process or socket behind.
#[test]
fn failed_boot_cleans_up_children_and_sockets() {
    let Some(driver) = tcg_or_no_driver("failed_boot_cleans_up_children_and_sockets") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("img");
    std::fs::create_dir(&img).unwrap();
    std::fs::write(img.join("bzImage"), b"this is not a kernel").unwrap();
    std::fs::write(img.join("initramfs.cpio"), b"").unwrap();
    let run_dir = tmp.path().join("run");
    let start = Instant::now();
    let err = driver
        .boot(plan("bad", ImagePaths::in_dir(&img), run_dir.clone()))
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
    match &err {
        DriverError::AgentNotReady {
            reason,
            console_tail,
            ..
        } => {
            assert!(reason.contains("stopped"), "{reason}");
            assert!(
                console_tail.contains("qemu") || console_tail.contains("kernel"),
                "{console_tail}"
            );
        }
        other => panic!("unexpected error: {other}"),
    }
    assert_nothing_left(&run_dir);
    assert!(
        !run_dir.exists(),
        "the run dir this boot created was not removed"
    );
}

/// Boot the real guest images, run `uname -r` through the agent, close.
#[test]
#[ignore = "slow tier: boots the real guest images under QEMU TCG"]
fn boot_exec_uname_and_close() {
    let test = "boot_exec_uname_and_close";
    let Some((driver, images)) = tcg_and_images(test) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let machine = boot_or_fail(&driver, plan("uname", images, run_dir.clone()));
    assert_eq!(machine.driver(), "tcg");
    let pids = machine.host_pids();
    assert_eq!(pids.len(), 2);
    // QEMU (the first) runs every thread under its own seccomp sandbox.
    for t in std::fs::read_dir(format!("/proc/{}/task", pids[0]))
        .unwrap()
        .flatten()
    {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        assert!(
            status.lines().any(|l| l == "Seccomp:\t2"),
            "qemu thread {:?} has no seccomp filter",
            t.file_name()
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = rt
        .block_on(machine.call(|c| c.exec(ExecRequest::argv(["uname", "-r"]))))
        .expect("exec uname");
    assert!(out.status.success(), "{:?}", out.status);
    let release = String::from_utf8_lossy(&out.output).trim().to_string();
    assert!(release.starts_with("6."), "unexpected release {release:?}");
    // The recorded agent socket reaches the same agent from a fresh client with the boot's
    // token; without the token the agent answers nothing.
    assert_eq!(machine.agent_socket().parent(), Some(run_dir.as_path()));
    assert_eq!(
        machine.agent_socket().as_os_str().len(),
        107,
        "padded socket path"
    );
    let other = vm_drivers::attach_client(machine.agent_socket()).expect("token beside socket");
    rt.block_on(other.ping())
        .expect("ping through Machine::agent_socket()");
    let stranger = vm_agent_client::AgentClient::hybrid_vsock(
        machine.agent_socket(),
        vm_agent_protocol::AGENT_PORT,
    );
    let e = rt.block_on(stranger.ping()).unwrap_err();
    assert!(e.agent_kind().is_none(), "tokenless ping answered: {e}");
    rt.block_on(machine.close());
    assert!(!machine.is_running());
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} still exists"
        );
    }
    assert_nothing_left(&run_dir);
}

/// The wall lifetime kills the VM whatever it is doing; later calls say so.
#[test]
#[ignore = "slow tier: boots the real guest images under QEMU TCG"]
fn wall_expiry_tears_the_vm_down() {
    let test = "wall_expiry_tears_the_vm_down";
    let Some((driver, images)) = tcg_and_images(test) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let mut p = plan("wall", images, run_dir.clone());
    p.wall = Some(Duration::from_secs(2));
    let machine = boot_or_fail(&driver, p);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    let err = rt
        .block_on(machine.call(|c| c.exec(ExecRequest::shell("sleep 60"))))
        .unwrap_err();
    assert!(matches!(err, MachineError::WallExpired { .. }), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    assert!(machine.wall_expired());
    assert!(!machine.is_running());
    assert_nothing_left(&run_dir);
    drop(machine);
}

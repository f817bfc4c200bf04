//! The jail of a running tcg VM, seen from the host through `/proc` (`drivers/src/tcg/jail.rs`):
//! QEMU and vm-vsock each run under a reaper, and every thread of all four processes
//! has `no_new_privs`, no effective capabilities, a seccomp filter (QEMU its own `-sandbox`,
//! vm-vsock ours, the reapers theirs), an unprivileged uid, namespaces other than the
//! test's, and a root that holds only what the program needs. Runs as root (the jail needs
//! it); fails like every guest test when tcg or the images are missing.

mod tcg_common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tcg_common::*;
use vm_agent_protocol::protocol::ExecRequest;
use vm_drivers::Driver;
use vm_drivers::tcg::{QEMU, VM_VSOCK, find_program, find_vsock_backend};
use vm_sync::Lock;
use vm_test_support::procfs::{
    children, namespace, root_entries, status_field, thread_status_files,
};

const JAIL_ID_BASE: u64 = 1_000_000_000;

/// The first component of each absolute path.
fn tops(paths: &[&Path]) -> BTreeSet<String> {
    paths
        .iter()
        .filter_map(|p| p.components().nth(1))
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect()
}

/// Checks every thread of `pid`: filtered, no privileges, an unprivileged uid. Returns the uid.
fn assert_jailed_threads(pid: u32, what: &str) -> u64 {
    let files = thread_status_files(pid);
    assert!(!files.is_empty(), "{what} ({pid}) has no threads");
    let mut uid = None;
    for st in files {
        let name = status_field(&st, "Name");
        let ctx = format!("{what} ({pid}) thread {name} ({})", st.display());
        assert_eq!(status_field(&st, "NoNewPrivs"), "1", "{ctx}");
        assert_eq!(status_field(&st, "CapEff"), "0000000000000000", "{ctx}");
        assert_eq!(status_field(&st, "CapPrm"), "0000000000000000", "{ctx}");
        assert_eq!(status_field(&st, "CapBnd"), "0000000000000000", "{ctx}");
        assert_eq!(status_field(&st, "Seccomp"), "2", "{ctx}");
        let uids: Vec<u64> = status_field(&st, "Uid")
            .split_whitespace()
            .map(|u| u.parse().unwrap())
            .collect();
        assert_eq!(uids.len(), 4, "{ctx}");
        assert!(
            uids.iter().all(|u| *u == uids[0] && *u > JAIL_ID_BASE),
            "{ctx}: {uids:?}"
        );
        uid = Some(uids[0]);
    }
    uid.unwrap()
}

/// A reaper stays in the test's PID namespace (its children are in the new one), so for it
/// `pid` is checked as `pid_for_children`.
fn assert_own_namespaces(pid: u32, what: &str, reaper: bool) {
    let pid_kind = if reaper { "pid_for_children" } else { "pid" };
    for kind in ["mnt", pid_kind, "net", "ipc", "uts"] {
        let mine = namespace("self", kind);
        let theirs = namespace(&pid.to_string(), kind);
        assert!(!theirs.is_empty(), "{what}: no {kind} namespace");
        assert_ne!(mine, theirs, "{what} shares the test's {kind} namespace");
    }
}

/// The one child of a reaper: the program itself.
fn program_of(reaper: u32, what: &str) -> u32 {
    let kids = children(reaper);
    assert_eq!(kids.len(), 1, "{what}'s reaper {reaper} children: {kids:?}");
    kids[0]
}

#[test]
#[ignore = "slow tier: boots the real guest images under QEMU TCG"]
fn every_thread_of_a_tcg_vm_is_jailed() {
    let test = "every_thread_of_a_tcg_vm_is_jailed";
    let _serial = one_at_a_time();
    let Some((driver, images)) = tcg_and_images(test) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let kernel = images.bz_image.clone();
    let machine = boot_or_fail(&driver, plan("jail", images, run_dir.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = rt
        .block_on(machine.call(|c| c.exec(ExecRequest::argv(["echo", "through the jail"]))))
        .expect("exec through the jailed vsock backend");
    assert_eq!(String::from_utf8_lossy(&out.output), "through the jail\n");

    // host_pids: QEMU's reaper, then vm-vsock's.
    let pids = machine.host_pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    let (qemu_reaper, vhost_reaper) = (pids[0], pids[1]);
    let qemu = program_of(qemu_reaper, QEMU);
    let vhost = program_of(vhost_reaper, VM_VSOCK);
    assert!(
        status_field(&PathBuf::from(format!("/proc/{qemu}/status")), "Name").starts_with("qemu"),
        "{qemu} is not QEMU"
    );
    let mut uids = Vec::new();
    for (pid, what, reaper) in [
        (qemu_reaper, "QEMU's reaper", true),
        (qemu, QEMU, false),
        (vhost_reaper, "vm-vsock's reaper", true),
        (vhost, VM_VSOCK, false),
    ] {
        uids.push(assert_jailed_threads(pid, what));
        assert_own_namespaces(pid, what, reaper);
    }
    // QEMU and the vsock backend run as different uids (each its reaper's).
    assert_ne!(uids[1], uids[3], "QEMU and vm-vsock share a uid");
    // PID 1 of their own namespaces.
    for pid in [qemu, vhost] {
        let nspid = status_field(&PathBuf::from(format!("/proc/{pid}/status")), "NSpid");
        assert_eq!(nspid.split_whitespace().last(), Some("1"), "{pid}: {nspid}");
    }

    // Roots: only what each program needs.
    let libs = [
        Path::new("/usr/lib"),
        Path::new("/lib"),
        Path::new("/lib64"),
    ];
    let vhost_bin = find_vsock_backend().unwrap();
    let qemu_bin = find_program(QEMU).unwrap();
    let mut want: Vec<&Path> = libs.to_vec();
    want.extend([vhost_bin.as_path(), run_dir.as_path()]);
    assert_eq!(root_entries(vhost, "/"), tops(&want), "vm-vsock's root");
    let mut want: Vec<&Path> = libs.to_vec();
    want.extend([qemu_bin.as_path(), kernel.as_path(), run_dir.as_path()]);
    want.push(Path::new("/usr/share/qemu"));
    assert_eq!(root_entries(qemu, "/"), tops(&want), "QEMU's root");
    assert_eq!(
        root_entries(qemu, "/usr/share"),
        BTreeSet::from(["qemu".to_string()]),
        "QEMU's /usr/share"
    );
    for pid in [qemu, vhost] {
        for absent in ["etc", "proc", "home", "dev", "sys"] {
            assert!(
                !root_entries(pid, "/").contains(absent),
                "/{absent} is in {pid}'s root"
            );
        }
        // The run dir inside is the host's (sockets, token, initrd).
        assert_eq!(
            root_entries(pid, &run_dir.to_string_lossy()),
            std::fs::read_dir(&run_dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<BTreeSet<_>>(),
            "{pid}'s run dir"
        );
    }
    // The agent token stays root's; the initrd (which carries it too) is QEMU's alone.
    use std::os::unix::fs::MetadataExt;
    let token = std::fs::metadata(run_dir.join("agent.token")).unwrap();
    assert_eq!((token.uid(), token.mode() & 0o777), (0, 0o600));
    let initrd = std::fs::metadata(run_dir.join("initrd.cpio")).unwrap();
    assert_eq!(
        (u64::from(initrd.uid()), initrd.mode() & 0o777),
        (uids[1], 0o400)
    );
    rt.block_on(machine.close());
    assert_nothing_left(&run_dir);
}

/// The tests of this file one at a time: `TEST_DENY` is process-wide, and `cargo test` runs
/// tests as threads of one process (nextest, which CI uses, runs each in its own).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.locked()
}

/// A vsock backend whose filter lacks `accept4` (test hook `TEST_DENY`, feature `test-hooks`)
/// dies by `SIGSYS` as soon as QEMU connects to it: the boot fails with the driver's typed
/// error naming the program and the cause, and leaves nothing behind.
#[test]
#[ignore = "slow tier: boots the real guest images under QEMU TCG"]
fn a_vsock_backend_killed_by_its_filter_is_a_typed_error() {
    let test = "a_vsock_backend_killed_by_its_filter_is_a_typed_error";
    let _serial = one_at_a_time();
    let Some((driver, images)) = tcg_and_images(test) else {
        return;
    };
    vm_jail::seccomp::vhost::TEST_DENY
        .store(libc::SYS_accept4, std::sync::atomic::Ordering::SeqCst);
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let err = match driver.boot(plan("sigsys", images, run_dir.clone())) {
        Ok(_) => panic!("the boot succeeded with accept4 forbidden to vm-vsock"),
        Err(e) => e,
    };
    vm_jail::seccomp::vhost::TEST_DENY.store(-1, std::sync::atomic::Ordering::SeqCst);
    match &err {
        vm_drivers::DriverError::SeccompKilled { program, .. } => {
            assert_eq!(program, VM_VSOCK, "{err}")
        }
        other => panic!("not a seccomp error: {other} ({other:?})"),
    }
    assert!(err.to_string().contains("SIGSYS"), "{err}");
    assert_nothing_left(&run_dir);
}

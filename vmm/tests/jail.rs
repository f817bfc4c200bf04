//! The jail `vm-vmm` builds around a VM (`vm_jail`), seen from the host through
//! `/proc` while a tiny guest sleeps in `cli; hlt`: every thread of both VM processes (the
//! reaper and PID 1 of the VM's PID namespace) has a seccomp filter, no capabilities and
//! `no_new_privs`, runs as the VM's own uid, has namespaces of its own, and sees a root holding
//! only the run directory. A thread that makes a system call outside its allowlist (the control
//! thread, or a virtio device's worker started by a tiny guest driving virtio-rng) takes the
//! process down with `SIGSYS`. A snapshot of that guest, its rng device past DRIVER_OK,
//! restores jailed: the restore thread sets the device up (its worker requested) under the
//! restore filter, and the worker starts and serves on.

mod proc_harness;
mod tiny_harness;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proc_harness::VmProc;
use tiny_harness::{mmio, skip_without_kvm};
use vm_test_support::procfs::{children, namespace as ns, status_field, thread_states};
use vmm::process::{ExitKind, JailConfig, ProcessConfig, ProcessExit};
use vmm::virtio::DeviceConfig;
use vmm::{KernelFormat, VmConfig};

/// `cli ; hlt`: the vCPU sleeps in KVM for good, using no CPU.
const SLEEP_FOREVER: &[u8] = &[0xfa, 0xf4];

fn jailed_config(dir: &Path) -> ProcessConfig {
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::create_dir(run.join("root")).unwrap();
    let kernel = dir.join("guest.bin");
    std::fs::write(&kernel, SLEEP_FOREVER).unwrap();
    let mut cfg = ProcessConfig::new(VmConfig {
        mem_mib: 64,
        kernel,
        kernel_format: KernelFormat::Raw,
        devices: vec![
            DeviceConfig::Vsock {
                guest_cid: 3,
                uds_path: run.join("vsock.sock"),
            },
            DeviceConfig::Rng,
        ],
        ..VmConfig::default()
    });
    cfg.jail = Some(JailConfig {
        root: run.join("root"),
        binds: vec![run],
        ..JailConfig::default()
    });
    cfg.seccomp = true;
    cfg
}

/// Every path under `/proc/PID/root`, relative to it.
fn root_listing(pid: u32) -> BTreeSet<String> {
    let base = PathBuf::from(format!("/proc/{pid}/root"));
    let mut out = BTreeSet::new();
    let mut todo = vec![base.clone()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            out.insert(p.strip_prefix(&base).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    out
}

/// Waits (up to 60 s) until the VM process has a thread whose name starts with `prefix`;
/// fails with its output if it exits first.
fn wait_for_thread(vm: &mut VmProc, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !vm.thread_names().iter().any(|t| t.starts_with(prefix)) {
        assert!(
            Instant::now() < deadline && vm.try_exit().is_none(),
            "no thread {prefix}*; output:\n{}",
            vm.console()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_vm_thread_is_jailed() {
    let test = "every_vm_thread_is_jailed";
    if skip_without_kvm(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cfg = jailed_config(tmp.path());
    let run = cfg.jail.as_ref().unwrap().binds[0].clone();
    let mut vm = VmProc::start_process(&cfg);
    let reaper = vm.pid();
    // The VM process is the reaper's only child. Wait for its vCPU and control threads and
    // for its main thread to have installed its filter (it does so right after starting them).
    let deadline = Instant::now() + Duration::from_secs(30);
    let inner = loop {
        if let Some(&c) = children(reaper).first() {
            let tasks: Vec<(String, String)> = std::fs::read_dir(format!("/proc/{c}/task"))
                .map(|d| {
                    d.flatten()
                        .map(|t| {
                            let st = t.path().join("status");
                            (status_field(&st, "Name"), status_field(&st, "Seccomp"))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let has = |n: &str| tasks.iter().any(|(name, _)| name == n);
            let main_filtered = tasks.iter().any(|(n, s)| n == "vm-vmm" && s == "2");
            if has("vm0-vcpu0") && has("vmm-control") && main_filtered {
                break c;
            }
        }
        assert!(
            Instant::now() < deadline && vm.try_exit().is_none(),
            "no running, filtered vm process in the jail; exit {:?}; output:\n{}",
            vm.try_exit(),
            vm.console()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut threads = 0;
    for pid in [reaper, inner] {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
        {
            let st = t.path().join("status");
            let name = status_field(&st, "Name");
            threads += 1;
            assert_eq!(status_field(&st, "NoNewPrivs"), "1", "{pid}/{name}");
            assert_eq!(status_field(&st, "Seccomp"), "2", "{pid}/{name}");
            assert_eq!(
                status_field(&st, "CapEff"),
                "0000000000000000",
                "{pid}/{name}"
            );
            assert_eq!(
                status_field(&st, "CapPrm"),
                "0000000000000000",
                "{pid}/{name}"
            );
            assert_eq!(
                status_field(&st, "CapBnd"),
                "0000000000000000",
                "{pid}/{name}"
            );
            let uid = status_field(&st, "Uid");
            assert!(
                uid.split_whitespace()
                    .all(|u| u.parse::<u32>().unwrap() >= 1_000_000_000),
                "{pid}/{name} uid {uid}"
            );
        }
        for kind in ["mnt", "net", "ipc", "uts"] {
            assert_ne!(ns(&pid.to_string(), kind), ns("self", kind), "{pid} {kind}");
        }
        let rel = |p: &Path| p.strip_prefix("/").unwrap().display().to_string();
        let mut expected: BTreeSet<String> = run
            .ancestors()
            .filter(|a| *a != Path::new("/"))
            .map(rel)
            .collect();
        expected.insert(rel(&run.join("vsock.sock")));
        expected.insert(rel(&run.join("root")));
        assert_eq!(root_listing(pid), expected, "root of {pid}");
    }
    assert!(
        threads >= 4,
        "reaper, vm main, vCPU and control threads: {threads}"
    );
    // PID 1 of its own PID namespace; the reaper holds that namespace for its children.
    assert_ne!(ns(&inner.to_string(), "pid"), ns("self", "pid"));
    assert_eq!(
        status_field(&PathBuf::from(format!("/proc/{inner}/status")), "NSpid")
            .split_whitespace()
            .last(),
        Some("1")
    );
    let limits = std::fs::read_to_string(format!("/proc/{inner}/limits")).unwrap();
    let data = vm_jail::data_limit(64).to_string();
    for (what, value) in [
        ("Max data size", data.as_str()),
        ("Max file size", "0"),
        ("Max core file size", "0"),
        ("Max open files", "4096"),
        ("Max processes", "256"),
    ] {
        let line = limits.lines().find(|l| l.starts_with(what)).unwrap();
        assert_eq!(
            line.split_whitespace().nth(what.split_whitespace().count()),
            Some(value),
            "{line}"
        );
    }
    vm.stop();
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(10)),
        Some(ProcessExit::Exited(ExitKind::Ended)),
        "output:\n{}",
        vm.console()
    );
    assert!(
        !Path::new(&format!("/proc/{inner}")).exists(),
        "the vm process outlived its reaper"
    );
    // The root tmpfs lived only in the VM's mount namespace.
    assert_eq!(std::fs::read_dir(run.join("root")).unwrap().count(), 0);
}

#[test]
fn a_jail_that_cannot_be_built_is_a_typed_exit_naming_the_step() {
    let test = "a_jail_that_cannot_be_built_is_a_typed_exit_naming_the_step";
    if skip_without_kvm(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = jailed_config(tmp.path());
    if let Some(j) = cfg.jail.as_mut() {
        j.root = tmp.path().join("missing");
    }
    let mut vm = VmProc::start_process(&cfg);
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(30)),
        Some(ProcessExit::Exited(ExitKind::JailFailed))
    );
    let out = vm.console();
    assert!(
        out.contains("mounting the root tmpfs on") && out.contains("missing"),
        "{out}"
    );
}

#[test]
fn a_forbidden_system_call_kills_the_vm_process_with_sigsys() {
    let test = "a_forbidden_system_call_kills_the_vm_process_with_sigsys";
    if skip_without_kvm(test) {
        return;
    }
    let (_tmp, mut vm) = start_until_control();
    let pids = vm.pids();
    vm.send_line(vmm::process::TEST_FORBIDDEN_SYSCALL);
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(10)),
        Some(ProcessExit::Seccomp),
        "output:\n{}",
        vm.console()
    );
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "{pid} left");
    }
}

/// A jailed VM sleeping in `cli; hlt`, once its control thread runs.
fn start_until_control() -> (tempfile::TempDir, VmProc) {
    let tmp = tempfile::tempdir().unwrap();
    let mut vm = VmProc::start_process(&jailed_config(tmp.path()));
    wait_for_thread(&mut vm, "vmm-control");
    (tmp, vm)
}

/// `mov dword [addr], v` (an address below 2 GiB).
fn store(addr: u32, v: u32) -> Vec<u8> {
    [
        &[0xc7, 0x04, 0x25][..],
        &addr.to_le_bytes(),
        &v.to_le_bytes(),
    ]
    .concat()
}

/// A guest that drives the virtio-rng device at `base` as a driver does: one request of
/// `len` writable bytes in a 16-entry queue, then FEATURES_OK (`VIRTIO_F_VERSION_1` only)
/// and DRIVER_OK, which starts the device's worker thread; then it sleeps.
fn rng_request_guest(base: u64, len: u32) -> Vec<u8> {
    use virtio_bindings::virtio_mmio::*;
    const DESC: u32 = 0x20_0000;
    const AVAIL: u32 = 0x20_1000;
    const USED: u32 = 0x20_2000;
    const BUF: u32 = 0x21_0000;
    let base = u32::try_from(base).expect("an MMIO window below 4 GiB");
    let mut prog = vec![
        // The descriptor (addr, len, flags = WRITE, next 0) and avail ring (idx 1, ring[0] 0).
        store(DESC, BUF),
        store(DESC + 4, 0),
        store(DESC + 8, len),
        store(DESC + 12, 2),
        store(AVAIL, 1 << 16),
        store(AVAIL + 4, 0),
        [0xbb].iter().chain(&base.to_le_bytes()).copied().collect(), // mov ebx, base
    ];
    for (reg, v) in [
        (VIRTIO_MMIO_STATUS, 1),
        (VIRTIO_MMIO_STATUS, 3),
        (VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1),
        (VIRTIO_MMIO_DRIVER_FEATURES, 1), // VIRTIO_F_VERSION_1, bit 32
        (VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0),
        (VIRTIO_MMIO_DRIVER_FEATURES, 0),
        (VIRTIO_MMIO_STATUS, 0xb),
        (VIRTIO_MMIO_QUEUE_SEL, 0),
        (VIRTIO_MMIO_QUEUE_NUM, 16),
        (VIRTIO_MMIO_QUEUE_DESC_LOW, DESC),
        (VIRTIO_MMIO_QUEUE_AVAIL_LOW, AVAIL),
        (VIRTIO_MMIO_QUEUE_USED_LOW, USED),
        (VIRTIO_MMIO_QUEUE_READY, 1),
        (VIRTIO_MMIO_STATUS, 0xf),
    ] {
        prog.push(mmio(reg, v));
    }
    prog.push(SLEEP_FOREVER.to_vec());
    prog.concat()
}

#[test]
fn a_device_threads_forbidden_system_call_kills_the_vm_process_with_sigsys() {
    let test = "a_device_threads_forbidden_system_call_kills_the_vm_process_with_sigsys";
    if skip_without_kvm(test) {
        return;
    }
    // First an ordinary request: the worker starts under the device filter and serves it.
    let (_tmp, mut vm) = start_rng_guest(64);
    wait_for_thread(&mut vm, "virtio-");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(vm.try_exit(), None, "{}", vm.console());
    vm.stop();
    // Then the test hook's length: the worker calls getppid, outside its allowlist.
    let (_tmp, mut vm) = start_rng_guest(vmm::virtio::rng::TEST_FORBIDDEN_SYSCALL_LEN);
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(60)),
        Some(ProcessExit::Seccomp),
        "output:\n{}",
        vm.console()
    );
}

/// `mov al, 1; out port, al`, then sleep.
fn port_write_guest(port: u8) -> Vec<u8> {
    [&[0xb0, 0x01, 0xe6, port][..], SLEEP_FOREVER].concat()
}

#[test]
fn a_vcpu_threads_socket_call_kills_the_vm_process_with_sigsys() {
    let test = "a_vcpu_threads_socket_call_kills_the_vm_process_with_sigsys";
    if skip_without_kvm(test) {
        return;
    }
    let start = |port: u8| {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = jailed_config(tmp.path());
        std::fs::write(&cfg.vm.kernel, port_write_guest(port)).unwrap();
        (tmp, VmProc::start_process(&cfg))
    };
    // First a write to the POST-code port: absorbed, the VM runs on.
    let (_tmp, mut vm) = start(0x80);
    wait_for_thread(&mut vm, "vmm-control");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(vm.try_exit(), None, "{}", vm.console());
    vm.stop();
    // Then the test hook's port: the vCPU thread calls socket(2), which is the device control
    // thread's alone (Firecracker's vCPU filter allows no socket either).
    let port = u8::try_from(vmm::legacy::TEST_FORBIDDEN_SYSCALL_PORT).unwrap();
    let (_tmp, mut vm) = start(port);
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(60)),
        Some(ProcessExit::Seccomp),
        "output:\n{}",
        vm.console()
    );
}

/// A jailed VM whose guest makes one virtio-rng request of `len` bytes.
fn start_rng_guest(len: u32) -> (tempfile::TempDir, VmProc) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = jailed_config(tmp.path());
    let rng = cfg
        .vm
        .devices
        .iter()
        .position(|d| matches!(d, DeviceConfig::Rng));
    let base = vmm::layout::virtio_mmio_base(rng.unwrap());
    std::fs::write(&cfg.vm.kernel, rng_request_guest(base, len)).unwrap();
    let vm = VmProc::start_process(&cfg);
    (tmp, vm)
}

/// A jailed snapshot of the rng guest, its device past DRIVER_OK with a request served,
/// restored in a new jailed process: the restore thread (under its own filter) sets the
/// device's registers and queues and requests its worker, as a vCPU thread does at DRIVER_OK;
/// the worker starts under the device filter and the VM runs on, killed by no filter.
#[test]
fn a_restore_sets_up_a_running_device_under_the_restore_filter() {
    let test = "a_restore_sets_up_a_running_device_under_the_restore_filter";
    if skip_without_kvm(test) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let snap = tmp.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut cfg = jailed_config(tmp.path());
    let rng = cfg
        .vm
        .devices
        .iter()
        .position(|d| matches!(d, DeviceConfig::Rng));
    let base = vmm::layout::virtio_mmio_base(rng.unwrap());
    std::fs::write(&cfg.vm.kernel, rng_request_guest(base, 64)).unwrap();
    cfg.snapshot_dir = Some(snap.clone());
    let mut vm = VmProc::start_process(&cfg);
    wait_for_thread(&mut vm, "virtio-");
    vm.send_line("snapshot-stop");
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(60)),
        Some(ProcessExit::Exited(ExitKind::Ended)),
        "{}",
        vm.final_output()
    );
    vmm::process::snapshot::hand_back(&snap).unwrap();

    cfg.snapshot_dir = None;
    // A copy with one state byte flipped is refused with its reason, not killed by the
    // restore filter: the VM built for it is dropped on the main thread (its vsock socket
    // removed), not on the restore thread.
    let flipped = tmp.path().join("flipped");
    std::fs::create_dir(&flipped).unwrap();
    std::fs::set_permissions(&flipped, std::fs::Permissions::from_mode(0o700)).unwrap();
    for f in ["vmstate", "memory"] {
        std::fs::copy(snap.join(f), flipped.join(f)).unwrap();
    }
    let mut state = std::fs::read(flipped.join("vmstate")).unwrap();
    let mid = state.len() / 2;
    state[mid] ^= 0x40;
    std::fs::write(flipped.join("vmstate"), state).unwrap();
    cfg.restore = Some(flipped);
    let mut refused = VmProc::start_process(&cfg);
    assert_eq!(
        refused.wait_timeout(Duration::from_secs(60)),
        Some(ProcessExit::Exited(ExitKind::RestoreFailed)),
        "{}",
        refused.final_output()
    );
    let out = refused.final_output();
    assert!(out.contains("checksum mismatch"), "{out}");

    cfg.restore = Some(snap);
    let mut restored = VmProc::start_process(&cfg);
    wait_for_thread(&mut restored, "virtio-");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(restored.try_exit(), None, "{}", restored.console());
    restored.stop();
    assert_eq!(
        restored.wait_timeout(Duration::from_secs(60)),
        Some(ProcessExit::Exited(ExitKind::Ended)),
        "{}",
        restored.final_output()
    );
}

#[test]
fn a_vm_process_stopped_and_continued_keeps_running() {
    let test = "a_vm_process_stopped_and_continued_keeps_running";
    if skip_without_kvm(test) {
        return;
    }
    // A device worker too: every thread kind is asleep in some system call when stopped.
    let (_tmp, mut vm) = start_rng_guest(64);
    wait_for_thread(&mut vm, "virtio-");
    wait_for_thread(&mut vm, "vmm-control");
    let pids = vm.pids();
    assert_eq!(pids.len(), 2, "reaper and VM process: {pids:?}");
    use nix::sys::signal::{Signal, kill};
    for round in 0..3 {
        for &p in &pids {
            kill(nix::unistd::Pid::from_raw(p as i32), Signal::SIGSTOP).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pids
            .iter()
            .all(|&p| thread_states(p).iter().all(|&s| s == 'T'))
        {
            assert!(Instant::now() < deadline, "round {round}: not stopped");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(300));
        for &p in &pids {
            kill(nix::unistd::Pid::from_raw(p as i32), Signal::SIGCONT).unwrap();
        }
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(vm.try_exit(), None, "round {round}: {}", vm.console());
        assert!(
            pids.iter().all(|&p| !thread_states(p).contains(&'T')),
            "round {round}: still stopped"
        );
    }
    vm.stop();
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(10)),
        Some(ProcessExit::Exited(ExitKind::Ended)),
        "{}",
        vm.console()
    );
}

#[test]
fn a_vmm_that_allocates_past_its_cap_dies_instead_of_eating_the_host() {
    let test = "a_vmm_that_allocates_past_its_cap_dies_instead_of_eating_the_host";
    if skip_without_kvm(test) {
        return;
    }
    let (_tmp, mut vm) = start_until_control();
    vm.send_line(vmm::process::TEST_LEAK);
    let exit = vm.wait_timeout(Duration::from_secs(10));
    assert!(
        matches!(
            exit,
            Some(ProcessExit::Signaled(libc::SIGABRT) | ProcessExit::Seccomp)
        ),
        "{exit:?}; output:\n{}",
        vm.console()
    );
    assert!(
        vm.console().contains("memory allocation"),
        "{}",
        vm.console()
    );
}

/// `kill -9` of the launcher: within 2 s neither VM process is left (parent-death signals on
/// the reaper and on the VM process). The test re-runs itself as the launcher (selected by an
/// environment variable), which starts a jailed VM, reports its pids and waits to be killed.
#[test]
fn killing_the_launcher_ends_both_vm_processes() {
    const ROLE: &str = "VMM_JAIL_LAUNCHER";
    let test = "killing_the_launcher_ends_both_vm_processes";
    if std::env::var_os(ROLE).is_some() {
        let tmp = tempfile::tempdir().unwrap();
        let vm = VmProc::start_process(&jailed_config(tmp.path()));
        let deadline = Instant::now() + Duration::from_secs(30);
        while vm.pids().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("VM_PIDS {:?}", vm.pids());
        std::mem::forget(vm);
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    if skip_without_kvm(test) {
        return;
    }
    use std::io::BufRead;
    let mut launcher = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(ROLE, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(launcher.stdout.take().unwrap());
    let pids: Vec<u32> = out
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("VM_PIDS [").map(|rest| {
                rest.trim_end_matches(']')
                    .split(", ")
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
        })
        .expect("the launcher reported its vm pids");
    assert_eq!(pids.len(), 2, "reaper and vm process: {pids:?}");
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let gone = |pid: u32| match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while !pids.iter().all(|p| gone(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for pid in pids {
        assert!(
            gone(pid),
            "vm process {pid} outlived its killed launcher by 2 s"
        );
    }
}

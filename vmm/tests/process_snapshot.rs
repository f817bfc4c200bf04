//! Snapshot and restore through jailed `vm-vmm` processes (seccomp on), seen as a launcher
//! sees them: the checksum guest of the snapshot tests (`checksum_guest::console_program`)
//! prints `G` at its gate and waits there; `snapshot-stop` on the control channel writes the
//! snapshot into the configured directory and ends the process; a second process restores it
//! and the guest prints the exact checksum of an uninterrupted run on its console. Also: the
//! files' modes, the jail's file size limit, the files the jail's uid wrote handed back to
//! the launcher's (`hand_back`), a restore into a different config refused with its own exit
//! code, the state decoded on the restore thread under its filter (a forbidden call there
//! kills the process), a snapshot others could write refused by name before any VM exists,
//! the command refused by a VMM not configured for snapshots (which runs on), and that VMM's
//! filters killing it on the snapshot path's first system call.

mod checksum_guest;
mod proc_harness;
mod tiny_harness;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use checksum_guest::{console_hash, console_program};
use proc_harness::VmProc;
use tiny_harness::{Tiny, skip_without_kvm};
use vm_test_support::procfs::children;
use vmm::process::snapshot::{SnapshotReply, hand_back, max_file_bytes, parse_reply_line};
use vmm::process::{ExitKind, JailConfig, ProcessConfig, ProcessExit};

/// Bounded waits: guest CPL0 code is interpreted on PVM hosts.
const WAIT: Duration = Duration::from_secs(60);
/// The guest's RAM.
const MEM_MIB: u32 = 16;

/// A jailed, filtered configuration of the console checksum guest with `mem_mib` of RAM, its
/// files (code, jail root) under `dir/<name>`.
fn jailed(dir: &Path, name: &str, mem_mib: u32) -> ProcessConfig {
    let base = dir.join(name);
    std::fs::create_dir_all(base.join("root")).unwrap();
    let program = console_program();
    let mut vm = Tiny::new(&program).config(&base);
    vm.mem_mib = mem_mib;
    let mut cfg = ProcessConfig::new(vm);
    cfg.jail = Some(JailConfig {
        root: base.join("root"),
        ..JailConfig::default()
    });
    cfg.seccomp = true;
    cfg
}

/// A new, empty snapshot directory of mode 0700 (as a launcher makes it).
fn snapshot_dir(dir: &Path) -> PathBuf {
    let snap = dir.join("snap");
    std::fs::create_dir(&snap).unwrap();
    std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o700)).unwrap();
    snap
}

/// Waits for the guest's `G` (it waits at its gate).
fn wait_at_gate(vm: &mut VmProc) {
    assert!(
        vm.wait_console(WAIT, &["G\n"]),
        "guest reached the gate; exit {:?}; output:\n{}",
        vm.try_exit(),
        vm.console()
    );
}

/// The `n`-th snapshot reply on the log stream (waits up to [`WAIT`], and for the pipes to
/// be drained once the process has exited).
fn reply(vm: &mut VmProc, n: usize) -> SnapshotReply {
    let end = Instant::now() + WAIT;
    let mut exited_at = None;
    loop {
        let replies: Vec<SnapshotReply> = vm
            .console()
            .lines()
            .filter_map(|l| parse_reply_line(l.as_bytes()))
            .collect();
        if let Some(r) = replies.get(n) {
            return r.clone();
        }
        if vm.try_exit().is_some() {
            exited_at.get_or_insert_with(Instant::now);
        }
        let drained = exited_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2));
        assert!(
            Instant::now() < end && !drained,
            "snapshot reply {n}; exit {:?}; output:\n{}",
            vm.try_exit(),
            vm.console()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Runs the guest to its gate in a VMM configured for snapshots into `snap` and stops it with
/// `snapshot-stop`; returns the reply. Checks the jail's file size limit on the way.
fn snapshot_and_stop(dir: &Path, snap: &Path) -> SnapshotReply {
    let mut cfg = jailed(dir, "a", MEM_MIB);
    cfg.snapshot_dir = Some(snap.to_path_buf());
    let mut vm = VmProc::start_process(&cfg);
    wait_at_gate(&mut vm);
    let inner = children(vm.pid())[0];
    let limits = std::fs::read_to_string(format!("/proc/{inner}/limits")).unwrap();
    let fsize = limits
        .lines()
        .find(|l| l.starts_with("Max file size"))
        .unwrap();
    assert!(
        fsize.contains(&max_file_bytes(MEM_MIB).to_string()),
        "{fsize}"
    );
    vm.send_line("snapshot-stop");
    let r = reply(&mut vm, 0);
    assert_eq!(
        vm.wait_timeout(WAIT),
        Some(ProcessExit::Exited(ExitKind::Ended)),
        "{}",
        vm.console()
    );
    assert!(
        !vm.console().contains(&console_hash()),
        "stopped at the gate"
    );
    // Jailed, the directory and the files are the VM's uid's (a pid's, which a later jail
    // reuses) until the launcher takes them back.
    let me = nix::unistd::geteuid().as_raw();
    let owners = |p: &Path| {
        ["", "vmstate", "memory"]
            .iter()
            .filter(|f| f.is_empty() || p.join(f).exists())
            .map(|f| std::fs::metadata(p.join(f)).unwrap().uid())
            .collect::<Vec<_>>()
    };
    if me == 0 && r.ok {
        assert!(
            owners(snap).iter().all(|&u| u >= vm_jail::JAIL_ID_BASE),
            "{:?}",
            owners(snap)
        );
    }
    hand_back(snap).unwrap();
    assert!(owners(snap).iter().all(|&u| u == me), "{:?}", owners(snap));
    assert_eq!(mode(snap), 0o700);
    r
}

#[test]
fn jailed_snapshot_restores_in_a_new_process_to_the_exact_checksum() {
    if skip_without_kvm("jailed_snapshot_restores_in_a_new_process_to_the_exact_checksum") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let snap = snapshot_dir(tmp.path());
    let r = snapshot_and_stop(tmp.path(), &snap);
    assert!(r.ok, "{r:?}");
    assert_eq!(r.memory_bytes, u64::from(MEM_MIB) << 20);
    assert!(r.state_bytes > 0 && r.memory_written > 0 && r.took_us >= r.pause_us);
    eprintln!("snapshot reply: {r:?}");
    assert_eq!(mode(&snap), 0o700);
    for f in ["vmstate", "memory"] {
        assert_eq!(mode(&snap.join(f)), 0o600, "{f}");
    }
    assert_eq!(
        std::fs::metadata(snap.join("memory")).unwrap().len(),
        u64::from(MEM_MIB) << 20
    );

    let mut cfg = jailed(tmp.path(), "b", MEM_MIB);
    cfg.restore = Some(snap.clone());
    let mut b = VmProc::start_process(&cfg);
    assert!(
        b.wait_console(WAIT, &[&console_hash()]),
        "restored guest printed {}; exit {:?}; output:\n{}",
        console_hash(),
        b.try_exit(),
        b.console()
    );
    assert_eq!(
        b.wait_timeout(WAIT),
        Some(ProcessExit::Exited(ExitKind::Ended))
    );
    // It went on from the gate: it never printed the gate's G itself.
    assert!(!b.console().contains("G\n"), "{}", b.console());
}

#[test]
fn a_restore_into_a_different_config_is_refused() {
    if skip_without_kvm("a_restore_into_a_different_config_is_refused") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let snap = snapshot_dir(tmp.path());
    assert!(snapshot_and_stop(tmp.path(), &snap).ok);
    let mut cfg = jailed(tmp.path(), "c", MEM_MIB * 2);
    cfg.restore = Some(snap.clone());
    let mut c = VmProc::start_process(&cfg);
    assert_eq!(
        c.wait_timeout(WAIT),
        Some(ProcessExit::Exited(ExitKind::RestoreFailed))
    );
    let out = c.final_output();
    assert!(
        out.contains("restoring the snapshot in") && out.contains("mem_mib 32 needs 33554432"),
        "{out}"
    );
    // A snapshot directory open to others is refused before anything starts.
    std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cfg = jailed(tmp.path(), "d", MEM_MIB);
    cfg.snapshot_dir = Some(snap);
    let mut d = VmProc::start_process(&cfg);
    assert_eq!(
        d.wait_timeout(WAIT),
        Some(ProcessExit::Exited(ExitKind::SetupFailed))
    );
    // The log is read on another thread: it may trail the exit.
    let out = d.final_output();
    assert!(out.contains("must be 0700"), "{out}");
}

/// The restore thread decodes the state under its own filter: the test hook makes it call
/// `getppid` right after installing it, and the process dies by `SIGSYS` before any guest
/// code runs (before the split, the state was decoded unfiltered, as root, before `confine`).
#[test]
fn the_state_is_decoded_under_the_restore_filter() {
    if skip_without_kvm("the_state_is_decoded_under_the_restore_filter") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let snap = snapshot_dir(tmp.path());
    assert!(snapshot_and_stop(tmp.path(), &snap).ok);
    let mut cfg = jailed(tmp.path(), "b", MEM_MIB);
    cfg.restore = Some(snap);
    cfg.test_forbidden_syscall_in_restore = true;
    let mut b = VmProc::start_process(&cfg);
    assert_eq!(
        b.wait_timeout(WAIT),
        Some(ProcessExit::Seccomp),
        "{}",
        b.console()
    );
    assert!(!b.console().contains(&console_hash()), "{}", b.console());
}

/// A snapshot directory someone else could write is refused by `vm-vmm` itself, on the
/// descriptors it would use, naming the file, before any VM exists (no KVM needed): the
/// memory file writable by others, the state file a symbolic link, the directory open to
/// others. The launcher checks before it starts the process too (`vm-sandbox`); this is the
/// check that holds whatever changed in between.
#[test]
fn a_restore_of_files_others_could_write_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let snap = snapshot_dir(tmp.path());
    for f in ["vmstate", "memory"] {
        std::fs::write(snap.join(f), b"bytes").unwrap();
        std::fs::set_permissions(snap.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let refused = |what: &Path, why: &str| {
        let mut cfg = ProcessConfig::new(vmm::VmConfig::default());
        cfg.restore = Some(snap.clone());
        let mut p = VmProc::start_process(&cfg);
        assert_eq!(
            p.wait_timeout(WAIT),
            Some(ProcessExit::Exited(ExitKind::RestoreFailed)),
            "{}",
            p.console()
        );
        let out = p.final_output();
        let named = format!("{} must belong to uid", what.display());
        assert!(out.contains(&named) && out.contains(why), "{out}");
    };
    let chmod =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    chmod(&snap.join("memory"), 0o666);
    refused(&snap.join("memory"), "writable by group or others");
    chmod(&snap.join("memory"), 0o600);
    std::fs::rename(snap.join("vmstate"), snap.join("real")).unwrap();
    std::os::unix::fs::symlink("real", snap.join("vmstate")).unwrap();
    refused(&snap.join("vmstate"), "is a symbolic link");
    std::fs::remove_file(snap.join("vmstate")).unwrap();
    std::fs::rename(snap.join("real"), snap.join("vmstate")).unwrap();
    chmod(&snap, 0o757);
    refused(&snap, "writable by group or others");
}

#[test]
fn a_vmm_not_configured_for_snapshots_refuses_and_runs_on() {
    if skip_without_kvm("a_vmm_not_configured_for_snapshots_refuses_and_runs_on") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut vm = VmProc::start_process(&jailed(tmp.path(), "a", MEM_MIB));
    wait_at_gate(&mut vm);
    vm.send_line("snapshot");
    let r = reply(&mut vm, 0);
    assert!(!r.ok);
    assert!(r.error.unwrap().contains("not configured for snapshots"));
    vm.send_line("snapshot /tmp/elsewhere");
    let r = reply(&mut vm, 1);
    assert!(!r.ok && r.error.unwrap().contains("unknown snapshot command"));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(vm.try_exit(), None, "{}", vm.console());
    vm.stop();
    assert_eq!(
        vm.wait_timeout(WAIT),
        Some(ProcessExit::Exited(ExitKind::Ended))
    );
}

#[test]
fn the_snapshot_path_is_outside_the_filters_of_an_unconfigured_vmm() {
    if skip_without_kvm("the_snapshot_path_is_outside_the_filters_of_an_unconfigured_vmm") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut vm = VmProc::start_process(&jailed(tmp.path(), "a", MEM_MIB));
    wait_at_gate(&mut vm);
    vm.send_line(vmm::process::TEST_SNAPSHOT_UNCHECKED);
    assert_eq!(
        vm.wait_timeout(WAIT),
        Some(ProcessExit::Seccomp),
        "{}",
        vm.console()
    );
}

//! Snapshot and restore under KVM with a tiny guest: a checksum loop whose state lives in
//! registers (the LCG state, the hash, the counter, the buffer and slot pointers in r8/r9/rdi)
//! and in memory (a 1024-word buffer it keeps xoring into). Each vCPU stops at iteration
//! [`HALF`] until the host opens a gate, so the snapshot is taken mid-computation on any
//! host speed; a restored VM must finish with exactly the checksum of an uninterrupted run
//! (and of the same loop in Rust).

mod checksum_guest;
mod tiny_harness;

use std::path::Path;
use std::time::{Duration, Instant};

use checksum_guest::*;
use sha2::{Digest, Sha256};
use tiny_harness::*;
use vm_memory::{Bytes, GuestAddress};
use vmm::memory::GuestMemoryMmap;
use vmm::snapshot::{AfterSnapshot, SnapshotError, SnapshotPaths, StateError};
use vmm::virtio::{DeviceConfig, PersistError};
use vmm::{RunningVm, Vm, VmConfig, VmExit};

/// Generous: CPL0 code is interpreted on PVM hosts (~1.7 M instructions/s).
const WAIT: Duration = Duration::from_secs(60);

fn slot(id: u64) -> u64 {
    RESULT_ADDR + 32 * id
}

fn u32_at(mem: &GuestMemoryMmap, addr: u64) -> u32 {
    mem.read_obj(GuestAddress(addr)).unwrap()
}

fn progress(mem: &GuestMemoryMmap, id: u64) -> u32 {
    u32_at(mem, slot(id))
}

/// vCPU `id`'s hash once it is done.
fn result(mem: &GuestMemoryMmap, id: u64) -> Option<u64> {
    (u32_at(mem, slot(id) + 16) == 1).then(|| mem.read_obj(GuestAddress(slot(id) + 8)).unwrap())
}

fn open_gate(mem: &GuestMemoryMmap) {
    mem.write_obj(1u32, GuestAddress(GATE)).unwrap();
}

fn mem(vm: &RunningVm) -> &GuestMemoryMmap {
    vm.memory().expect("vm alive")
}

/// A config for the program (its code file is written but, for a restore, never read).
fn config(vcpus: u8) -> VmConfig {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tiny::new(PROGRAM);
    t.vcpus = vcpus;
    t.config(dir.path())
}

/// Start the program and wait until every vCPU waits at the gate.
fn run_to_gate(vcpus: u8) -> RunningVm {
    let mut t = Tiny::new(PROGRAM);
    t.vcpus = vcpus;
    let vm = t.start();
    let at_gate = wait_for(WAIT, || {
        (0..u64::from(vcpus)).all(|id| progress(mem(&vm), id) == HALF)
    });
    assert!(
        at_gate,
        "guest reached the gate: {:?}",
        vm.wait_timeout(Duration::ZERO)
    );
    vm
}

/// Wait until every vCPU is done and return their hashes; then stop the VM.
fn finish(vm: RunningVm, vcpus: u8) -> Vec<u64> {
    let all = || {
        (0..u64::from(vcpus))
            .map(|id| result(mem(&vm), id))
            .collect::<Option<Vec<_>>>()
    };
    assert!(
        wait_for(WAIT, || all().is_some()),
        "guest finished: {:?}",
        vm.wait_timeout(Duration::ZERO)
    );
    let hashes = all().unwrap();
    vm.stop();
    assert_eq!(vm.wait().unwrap(), VmExit::Stopped);
    hashes
}

fn sha256_file(path: &Path) -> Vec<u8> {
    Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

fn file_u32(bytes: &[u8], addr: u64) -> u32 {
    let a = addr as usize;
    u32::from_le_bytes(bytes[a..a + 4].try_into().unwrap())
}

#[test]
fn restored_guest_finishes_with_the_uninterrupted_checksum() {
    if skip_without_kvm("restored_guest_finishes_with_the_uninterrupted_checksum") {
        return;
    }
    // The VMM's warnings (an MSR KVM refused, …) in the test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("vmm=info")
        .with_test_writer()
        .try_init();
    let want = expected(0);
    // Uninterrupted, the gate open from the start.
    let vm = Tiny::new(PROGRAM).create();
    open_gate(vm.memory());
    let vm = vm.start().unwrap();
    assert_eq!(
        finish(vm, 1),
        vec![want],
        "uninterrupted run = the Rust loop"
    );

    // Snapshot mid-computation, stopping the original.
    let vm = run_to_gate(1);
    let dir = tempfile::tempdir().unwrap();
    let info = vm.snapshot(dir.path(), AfterSnapshot::Stop).unwrap();
    eprintln!(
        "snapshot: state {} bytes, memory {} bytes ({} written), pause {:?}, took {:?}",
        info.state_bytes, info.memory_bytes, info.memory_written, info.pause_latency, info.took
    );
    assert_eq!(vm.wait_timeout(WAIT), Some(Ok(VmExit::Stopped)));
    assert_eq!(vm.wait().unwrap(), VmExit::Stopped);
    let paths = SnapshotPaths::in_dir(dir.path());
    assert_eq!(info.paths, paths);
    assert_eq!(info.memory_bytes, 16 << 20);
    for p in [&paths.state, &paths.memory] {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let file = std::fs::read(&paths.memory).unwrap();
    assert_eq!(file.len() as u64, info.memory_bytes);
    assert_eq!(
        file_u32(&file, slot(0)),
        HALF,
        "the memory file holds the guest mid-loop"
    );
    assert_eq!(file_u32(&file, slot(0) + 16), 0, "not done when saved");
    let file_sum = sha256_file(&paths.memory);
    // The state holds the vCPU mid-loop: at the gate, its loop registers as the program
    // left them, every required MSR saved.
    let state = vmm::snapshot::format::read_state_file(&paths.state).unwrap();
    let regs = &state.vcpus[0].regs;
    assert!(
        (0x10_0085..0x10_0097).contains(&regs.rip),
        "rip {:#x}",
        regs.rip
    );
    assert_eq!(
        (regs.rcx, regs.rdi, regs.r8, regs.r9),
        (u64::from(HALF), BUFFER, 0, 0)
    );
    let saved: Vec<u32> = state.vcpus[0].msrs.iter().map(|m| m.index).collect();
    for index in vmm::snapshot::vcpu::REQUIRED_MSRS {
        assert!(saved.contains(index), "MSR {index:#x} saved");
    }
    let listed = vmm::snapshot::vcpu::msrs_to_save(&kvm_ioctls::Kvm::new().unwrap());
    eprintln!("MSRs: {} saved of {} asked for", saved.len(), listed.len());

    // Two restores of the one snapshot, alive together.
    let t = Instant::now();
    let a = Vm::restore(config(1), dir.path()).unwrap();
    let restore_time = t.elapsed();
    let b = Vm::restore(config(1), dir.path()).unwrap();
    assert_eq!(progress(a.memory(), 0), HALF);
    open_gate(a.memory());
    let t = Instant::now();
    let a = a.start().unwrap();
    let start_time = t.elapsed();
    let b = b.start().unwrap();
    let a_done = wait_for(WAIT, || result(mem(&a), 0).is_some());
    let run_time = t.elapsed();
    assert!(
        a_done,
        "restored guest finished: {:?}",
        a.wait_timeout(Duration::ZERO)
    );
    eprintln!(
        "restore: Vm::restore {restore_time:?}, start {start_time:?}, start to done {run_time:?}"
    );
    // A's gate and writes are its own: B still waits at the gate, its memory untouched.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(progress(mem(&b), 0), HALF);
    assert_eq!(result(mem(&b), 0), None);
    let buffer_in_a: u64 = mem(&a).read_obj(GuestAddress(BUFFER)).unwrap();
    let buffer_in_file = u64::from_le_bytes(file[BUFFER as usize..][..8].try_into().unwrap());
    assert_ne!(
        buffer_in_a, buffer_in_file,
        "the restored guest wrote its buffer"
    );
    assert_eq!(finish(a, 1), vec![want], "restored run = uninterrupted run");
    open_gate(mem(&b));
    assert_eq!(finish(b, 1), vec![want], "the second restore too");
    assert_eq!(
        sha256_file(&paths.memory),
        file_sum,
        "the memory file is never written"
    );
}

#[test]
fn two_vcpus_are_paused_saved_and_restored_together() {
    if skip_without_kvm("two_vcpus_are_paused_saved_and_restored_together") {
        return;
    }
    let vm = run_to_gate(2);
    let dir = tempfile::tempdir().unwrap();
    vm.snapshot(dir.path(), AfterSnapshot::Stop).unwrap();
    assert_eq!(vm.wait().unwrap(), VmExit::Stopped);
    let restored = Vm::restore(config(2), dir.path()).unwrap();
    open_gate(restored.memory());
    let hashes = finish(restored.start().unwrap(), 2);
    assert_eq!(hashes, vec![expected(0), expected(1)]);
}

#[test]
fn resume_refusals_and_a_tampered_state_file() {
    if skip_without_kvm("resume_refusals_and_a_tampered_state_file") {
        return;
    }
    let vm = run_to_gate(1);
    let dir = tempfile::tempdir().unwrap();
    vm.snapshot(dir.path(), AfterSnapshot::Resume).unwrap();
    // Never overwritten: a second snapshot into the same directory is refused (and the VM
    // resumes after it too).
    let again = vm.snapshot(dir.path(), AfterSnapshot::Stop);
    assert!(
        matches!(
            again,
            Err(SnapshotError::Io {
                what: "creating",
                ..
            })
        ),
        "{again:?}"
    );
    // The original runs on after both and finishes as if nothing happened.
    open_gate(mem(&vm));
    assert_eq!(finish(vm, 1), vec![expected(0)]);

    // The config must match the snapshot, naming the field (mem_mib by the memory file's
    // length, which is checked before the state is decoded).
    let mut cfg = config(1);
    cfg.mem_mib = 32;
    match Vm::restore(cfg, dir.path()) {
        Err(SnapshotError::MemoryFileSize { mem_mib: 32, .. }) => {}
        other => panic!("restore with another mem_mib: {other:?}"),
    }
    match Vm::restore(config(2), dir.path()) {
        Err(SnapshotError::Mismatch { field: "vcpus", .. }) => {}
        other => panic!("restore with other vcpus: {other:?}"),
    }
    // One byte flipped in the state file: refused before any vCPU runs.
    let paths = SnapshotPaths::in_dir(dir.path());
    let mut bytes = std::fs::read(&paths.state).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&paths.state, &bytes).unwrap();
    match Vm::restore(config(1), dir.path()) {
        Err(SnapshotError::State {
            source: StateError::Checksum,
            ..
        }) => {}
        other => panic!("restore of a tampered state: {other:?}"),
    }
    // A memory file of the wrong size is refused too.
    bytes[mid] ^= 0x40;
    std::fs::write(&paths.state, &bytes).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths.memory)
        .unwrap();
    f.set_len(8 << 20).unwrap();
    match Vm::restore(config(1), dir.path()) {
        Err(SnapshotError::MemoryFileSize { found, .. }) => assert_eq!(found, 8 << 20),
        other => panic!("restore with a short memory file: {other:?}"),
    }
}

#[test]
fn a_vm_with_a_writable_disk_is_refused() {
    if skip_without_kvm("a_vm_with_a_writable_disk_is_refused") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 4096]).unwrap();
    let mut cfg = Tiny::new(&[0xfa, 0xf4, 0xeb, 0xfc]).config(dir.path());
    cfg.devices.push(DeviceConfig::Block {
        path: disk,
        read_only: false,
        id: "rw".into(),
    });
    let vm = Vm::create(cfg).unwrap().start().unwrap();
    let snap = tempfile::tempdir().unwrap();
    match vm.snapshot(snap.path(), AfterSnapshot::Stop) {
        Err(SnapshotError::Device {
            index: 0,
            source: PersistError::Unsupported { what, .. },
        }) => assert_eq!(what, "a writable disk"),
        other => panic!("snapshot of a VM with a writable disk: {other:?}"),
    }
    assert_eq!(
        std::fs::read_dir(snap.path()).unwrap().count(),
        0,
        "no file written"
    );
    assert!(!vm.is_finished(), "the VM was not stopped");
    vm.stop();
    assert_eq!(vm.wait().unwrap(), VmExit::Stopped);
}

#[test]
fn a_vm_with_virtio_rng_restores_with_the_same_device_list() {
    if skip_without_kvm("a_vm_with_virtio_rng_restores_with_the_same_device_list") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::new(&[0xfa, 0xf4, 0xeb, 0xfc]);
    let with_rng = |dir: &Path| {
        let mut cfg = tiny.config(dir);
        cfg.devices.push(DeviceConfig::Rng);
        cfg
    };
    let vm = Vm::create(with_rng(dir.path())).unwrap().start().unwrap();
    let snap = tempfile::tempdir().unwrap();
    vm.snapshot(snap.path(), AfterSnapshot::Stop).unwrap();
    assert_eq!(vm.wait().unwrap(), VmExit::Stopped);
    match Vm::restore(tiny.config(dir.path()), snap.path()) {
        Err(SnapshotError::Mismatch { field, .. }) => assert_eq!(field, "devices"),
        other => panic!("restore without the device: {other:?}"),
    }
    // A disk that opens (the VM is built from the config before the state is decoded and
    // compared with it).
    std::fs::write(dir.path().join("disk.img"), vec![0u8; 4096]).unwrap();
    let mut block = with_rng(dir.path());
    block.devices[0] = DeviceConfig::Block {
        path: dir.path().join("disk.img"),
        read_only: true,
        id: "d".into(),
    };
    match Vm::restore(block, snap.path()) {
        Err(SnapshotError::DeviceMismatch {
            index: 0, field, ..
        }) => assert_eq!(field, "type"),
        other => panic!("restore with another device: {other:?}"),
    }
    let restored = Vm::restore(with_rng(dir.path()), snap.path())
        .unwrap()
        .start()
        .unwrap();
    assert!(!restored.is_finished());
    restored.stop();
    assert_eq!(restored.wait().unwrap(), VmExit::Stopped);
}

//! A virtio-fs DAX window under KVM: a tiny guest maps the window's first 2 MiB (a page
//! directory entry of its own), reads what the host mapped there (a file's page, read-only
//! and shared), stores into it and reads again. The store is refused by KVM: it exits to the
//! VMM as an MMIO write (a probe at the window's address records it), the guest reads the
//! file's bytes unchanged, and the host file is byte for byte what it was. And a file its
//! owner shrinks under the window gives the guest none of its old bytes, nor the VMM a
//! `SIGBUS`.

mod tiny_harness;

use std::os::fd::AsFd;
use std::time::Duration;

use tiny_harness::*;
use vmm::VmExit;
use vmm::virtio::DeviceConfig;

const TIMEOUT: Duration = Duration::from_secs(30);

/// `mov rax, imm64`, then `mov [abs32], rax`.
fn store_imm64(at: u32, v: u64) -> Vec<u8> {
    let mut c = vec![0x48, 0xb8];
    c.extend_from_slice(&v.to_le_bytes());
    c.extend_from_slice(&[0x48, 0x89, 0x04, 0x25]);
    c.extend_from_slice(&at.to_le_bytes());
    c
}

/// The guest maps the window's first 2 MiB (a page directory at 0x5000 linked from the boot
/// PDPT at 0xa000: guest virtual = guest physical, as the boot page tables map the first
/// 4 GiB), reads its first 8 bytes into [`RESULT_ADDR`], stores `0x5a` at its first byte,
/// reads them again into `RESULT_ADDR + 8` and resets.
fn read_store_read(base: u64) -> Vec<u8> {
    let pdpt_entry = 0xa000 + 8 * u32::try_from(base >> 30).unwrap();
    let mut prog = store_imm64(0x5000, base | 0x83);
    prog.extend(store_imm64(pdpt_entry, 0x5003));
    prog.extend_from_slice(&[0x0f, 0x20, 0xd8, 0x0f, 0x22, 0xd8]); // mov rax, cr3; mov cr3, rax
    prog.extend_from_slice(&[0x48, 0xbb]); // mov rbx, base
    prog.extend_from_slice(&base.to_le_bytes());
    prog.extend_from_slice(&[0x48, 0x8b, 0x03]); // mov rax, [rbx]
    prog.extend_from_slice(&[0x48, 0x89, 0x04, 0x25, 0x00, 0x30, 0x00, 0x00]); // mov [0x3000], rax
    prog.extend_from_slice(&[0xc6, 0x03, 0x5a]); // mov byte [rbx], 0x5a
    prog.extend_from_slice(&[0x48, 0x8b, 0x03]); // mov rax, [rbx]
    prog.extend_from_slice(&[0x48, 0x89, 0x04, 0x25, 0x08, 0x30, 0x00, 0x00]); // mov [0x3008], rax
    prog.extend_from_slice(RESET);
    prog
}

/// The window of a VM whose one device shares `share` (a 2 MiB window).
fn fs_config(prog: &[u8], dir: &std::path::Path, share: &std::path::Path) -> vmm::VmConfig {
    let mut cfg = Tiny::new(prog).config(dir);
    cfg.devices = vec![DeviceConfig::Fs {
        tag: "fs0".into(),
        share: share.to_path_buf(),
        max_inodes: 16,
        dax_window: 2 << 20,
    }];
    cfg
}

/// Over the window (where a guest store exits as MMIO): the guest's store is the host
/// shrinking the mapped file to nothing, and a read that reaches it answers [`UNBACKED`].
struct TruncatesOnStore(std::path::PathBuf);

/// What a read of the window that exits to the VMM (no page behind it) answers.
const UNBACKED: u64 = 0x0bad_0bad_0bad_0bad;

impl vmm::bus::BusDevice for TruncatesOnStore {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        let v = UNBACKED.to_le_bytes();
        data.iter_mut().enumerate().for_each(|(i, b)| *b = v[i % 8]);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {
        let f = std::fs::OpenOptions::new().write(true).open(&self.0);
        f.and_then(|f| f.set_len(0))
            .expect("truncating the shared file");
    }
}

/// The host shrinks a file while a page of it is mapped in the window and the guest has
/// read it (the file's owner may, whatever the guest does): the guest's next read of that
/// page has no page behind it. It gets none of the file's old bytes: KVM either fails the
/// vCPU's run (the VM stops with a fault naming `KVM_RUN`, as under QEMU) or sends the read
/// to the VMM as MMIO. The VMM takes no `SIGBUS` (this test process runs it and lives on),
/// and the file stays as its owner left it.
#[test]
fn a_file_truncated_under_the_window_gives_the_guest_none_of_its_old_bytes() {
    if skip_without_kvm("a_file_truncated_under_the_window_gives_the_guest_none_of_its_old_bytes") {
        return;
    }
    let share = tempfile::tempdir().unwrap();
    let file = share.path().join("w");
    std::fs::write(&file, vec![0x11u8; 4096]).unwrap();
    let old = 0x1111_1111_1111_1111;
    let base = vmm::layout::dax_window_base(0);
    let prog = read_store_read(base); // the store: the host truncates
    let dir = tempfile::tempdir().unwrap();
    let mut vm = vmm::Vm::create(fs_config(&prog, dir.path(), share.path())).expect("create");
    let window = vm.dax_window(0).expect("a window");
    let f = std::fs::File::open(&file).unwrap();
    window.mapping.map_file(0, 4096, f.as_fd(), 0).unwrap();
    let truncates = TruncatesOnStore(file.clone());
    vm.add_mmio_device(
        std::sync::Arc::new(std::sync::Mutex::new(truncates)),
        base,
        2 << 20,
    )
    .unwrap();
    let vm = vm.start().expect("start");
    let outcome = vm.wait_timeout(TIMEOUT);
    assert_eq!(read_u64(&vm, RESULT_ADDR), old, "the first read, before");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0, "truncated");
    match outcome {
        Some(Ok(VmExit::Reset)) => assert_eq!(
            read_u64(&vm, RESULT_ADDR + 8),
            UNBACKED,
            "the read after the truncation did not exit to the VMM"
        ),
        Some(Err(fault)) => assert!(fault.to_string().contains("KVM_RUN"), "{fault}"),
        other => panic!("the guest neither read nor faulted: {other:?}"),
    }
}

#[test]
fn a_guest_store_into_the_window_is_refused_by_kvm() {
    if skip_without_kvm("a_guest_store_into_the_window_is_refused_by_kvm") {
        return;
    }
    let share = tempfile::tempdir().unwrap();
    let file = share.path().join("w");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(&file, &pattern).unwrap();
    let base = vmm::layout::dax_window_base(0);
    let prog = read_store_read(base);

    let dir = tempfile::tempdir().unwrap();
    let mut vm = vmm::Vm::create(fs_config(&prog, dir.path(), share.path())).expect("create");
    let window = vm.dax_window(0).expect("a window");
    assert_eq!(window.guest_base, base);
    // What a SETUPMAPPING of the file's first page at window offset 0 does.
    let f = std::fs::File::open(&file).unwrap();
    window.mapping.map_file(0, 4096, f.as_fd(), 0).unwrap();
    let probe = Probe::new(0);
    vm.add_mmio_device(
        std::sync::Arc::new(std::sync::Mutex::new(ProbeOf(probe.clone()))),
        base,
        2 << 20,
    )
    .unwrap();
    let vm = vm.start().expect("start");
    assert_eq!(vm.wait_timeout(TIMEOUT), Some(Ok(VmExit::Reset)));
    let first = u64::from_le_bytes(pattern[..8].try_into().unwrap());
    assert_eq!(
        read_u64(&vm, RESULT_ADDR),
        first,
        "the guest reads the file page"
    );
    assert_eq!(
        read_u64(&vm, RESULT_ADDR + 8),
        first,
        "the store changed the page"
    );
    let writes: Vec<_> = probe.accesses().into_iter().filter(|a| a.write).collect();
    assert_eq!(
        writes.len(),
        1,
        "the store did not exit to the VMM: {writes:?}"
    );
    assert_eq!(writes[0].data, vec![0x5a]);
    vm.wait().unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), pattern);
}

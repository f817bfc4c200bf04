//! A virtio-fs DAX window under KVM: a tiny guest maps the window's first 2 MiB (a page
//! directory entry of its own), reads what the host mapped there (a file's page, read-only
//! and shared), stores into it and reads again. The store is refused by KVM: it exits to the
//! VMM as an MMIO write (a probe at the window's address records it), the guest reads the
//! file's bytes unchanged, and the host file is byte for byte what it was.

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
    // A 2 MiB page directory at 0x5000 for the window, linked from the boot PDPT (0xa000):
    // guest virtual = guest physical, as the boot page tables map the first 4 GiB.
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

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Tiny::new(&prog).config(dir.path());
    cfg.devices = vec![DeviceConfig::Fs {
        tag: "fs0".into(),
        share: share.path().to_path_buf(),
        max_inodes: 16,
        dax_window: 2 << 20,
    }];
    let mut vm = vmm::Vm::create(cfg).expect("create");
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

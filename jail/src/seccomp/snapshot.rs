//! What a `vm-vmm` configured for snapshots (a `snapshot_dir` in its process configuration)
//! adds to its filters, and only then ([`enable_snapshots`], before the first filter is
//! compiled): a VMM without a snapshot directory keeps the narrower lists of the parent
//! module, so these calls still kill it.
//!
//! The snapshot runs on the control thread (`RunningVm::snapshot`): it checks the directory,
//! asks KVM for the VM-wide state (irqchip, PIT, clock) and what the vCPU save reads
//! (extensions, the MSR index list), creates the two files (`O_EXCL`, mode `0600`), writes
//! them (the memory file's non-zero pages with `pwrite64`, its length with `ftruncate`),
//! syncs and closes them, and removes them again after an error. Each vCPU reads its own
//! state on its own thread while parked: only the `KVM_GET_*` requests of [`VCPU_IOCTLS`]
//! are added there. A restore decodes and sets the saved state on its own thread, whose
//! requests are [`RESTORE_IOCTLS`] (`ThreadKind::Restore`).
//!
//! `openat` stays refused (`EACCES`, see `REFUSED`) on the control thread for every flag set
//! but [`CREATE_FLAGS`], the flags a snapshot file is created with: the thread cannot open an
//! existing file, for reading or writing, through it.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{Entry, kvm_io, kvm_ior, kvm_iow, kvm_iowr};

static SNAPSHOTS: AtomicBool = AtomicBool::new(false);

/// Adds the snapshot lists to this process's filters (call before any is compiled).
pub fn enable_snapshots() {
    SNAPSHOTS.store(true, Ordering::SeqCst);
}

/// Whether [`enable_snapshots`] was called.
pub fn snapshots_enabled() -> bool {
    SNAPSHOTS.load(Ordering::SeqCst)
}

/// The `openat` flags of a snapshot file: `O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC` (Rust's
/// `OpenOptions` with `write` and `create_new`).
pub const CREATE_FLAGS: u64 =
    (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC) as u64;

/// `KVM_CHECK_EXTENSION`.
pub const KVM_CHECK_EXTENSION: u64 = kvm_io(0x03);
/// `KVM_GET_MSR_INDEX_LIST`.
pub const KVM_GET_MSR_INDEX_LIST: u64 =
    kvm_iowr(0x02, std::mem::size_of::<kvm_bindings::kvm_msr_list>());
/// `KVM_GET_IRQCHIP`.
pub const KVM_GET_IRQCHIP: u64 = kvm_iowr(0x62, std::mem::size_of::<kvm_bindings::kvm_irqchip>());
/// `KVM_GET_PIT2`.
pub const KVM_GET_PIT2: u64 = kvm_ior(0x9f, std::mem::size_of::<kvm_bindings::kvm_pit_state2>());
/// `KVM_GET_CLOCK`.
pub const KVM_GET_CLOCK: u64 = kvm_ior(0x7c, std::mem::size_of::<kvm_bindings::kvm_clock_data>());

/// The control thread's requests during a snapshot.
pub const CONTROL_IOCTLS: &[u64] = &[
    KVM_CHECK_EXTENSION,    // the save plan: KVM_CAP_XSAVE, KVM_CAP_XCRS (system fd)
    KVM_GET_MSR_INDEX_LIST, // the save plan: the MSRs to read (system fd)
    KVM_GET_IRQCHIP,        // both PICs and the IOAPIC (VM fd)
    KVM_GET_PIT2,           // the PIT (VM fd)
    KVM_GET_CLOCK,          // the KVM clock (VM fd)
];

/// The requests a parked vCPU issues to read its own state (`vmm::snapshot::vcpu::save`).
pub const VCPU_IOCTLS: &[u64] = &[
    kvm_ior(0x98, std::mem::size_of::<kvm_bindings::kvm_mp_state>()), // KVM_GET_MP_STATE
    kvm_ior(0x83, std::mem::size_of::<kvm_bindings::kvm_sregs>()),    // KVM_GET_SREGS
    kvm_ior(0x8c, std::mem::size_of::<kvm_bindings::kvm_fpu>()),      // KVM_GET_FPU
    kvm_ior(0xa4, std::mem::size_of::<kvm_bindings::kvm_xsave>()),    // KVM_GET_XSAVE
    kvm_ior(0xa6, std::mem::size_of::<kvm_bindings::kvm_xcrs>()),     // KVM_GET_XCRS
    kvm_ior(0xa1, std::mem::size_of::<kvm_bindings::kvm_debugregs>()), // KVM_GET_DEBUGREGS
    kvm_ior(0x8e, std::mem::size_of::<kvm_bindings::kvm_lapic_state>()), // KVM_GET_LAPIC
    kvm_iowr(0x88, std::mem::size_of::<kvm_bindings::kvm_msrs>()),    // KVM_GET_MSRS
    kvm_ior(0x9f, std::mem::size_of::<kvm_bindings::kvm_vcpu_events>()), // KVM_GET_VCPU_EVENTS
];

/// The requests of the restore thread (`vmm::snapshot::PendingRestore::finish`): the VM-wide
/// state, then each vCPU's, in the order they are set.
pub const RESTORE_IOCTLS: &[u64] = &[
    kvm_ior(0x63, std::mem::size_of::<kvm_bindings::kvm_irqchip>()), // KVM_SET_IRQCHIP (_IOR, as the kernel has it)
    kvm_iow(0xa0, std::mem::size_of::<kvm_bindings::kvm_pit_state2>()), // KVM_SET_PIT2
    kvm_iow(0x7b, std::mem::size_of::<kvm_bindings::kvm_clock_data>()), // KVM_SET_CLOCK
    kvm_iow(0x99, std::mem::size_of::<kvm_bindings::kvm_mp_state>()), // KVM_SET_MP_STATE
    kvm_iow(0x82, std::mem::size_of::<kvm_bindings::kvm_regs>()),    // KVM_SET_REGS
    kvm_iow(0x84, std::mem::size_of::<kvm_bindings::kvm_sregs>()),   // KVM_SET_SREGS
    kvm_iow(0x8d, std::mem::size_of::<kvm_bindings::kvm_fpu>()),     // KVM_SET_FPU
    kvm_iow(0xa5, std::mem::size_of::<kvm_bindings::kvm_xsave>()),   // KVM_SET_XSAVE
    kvm_iow(0xa7, std::mem::size_of::<kvm_bindings::kvm_xcrs>()),    // KVM_SET_XCRS
    kvm_iow(0xa2, std::mem::size_of::<kvm_bindings::kvm_debugregs>()), // KVM_SET_DEBUGREGS
    kvm_iow(0x8f, std::mem::size_of::<kvm_bindings::kvm_lapic_state>()), // KVM_SET_LAPIC
    kvm_iow(0x89, std::mem::size_of::<kvm_bindings::kvm_msrs>()),    // KVM_SET_MSRS
    kvm_iow(0xa0, std::mem::size_of::<kvm_bindings::kvm_vcpu_events>()), // KVM_SET_VCPU_EVENTS
];

/// What the control thread adds (with `openat` let through the refusal filter for
/// [`CREATE_FLAGS`] only).
pub const CONTROL: &[Entry] = &[
    (
        libc::SYS_ioctl,
        "snapshot: VM-wide KVM_GET_* and the save plan (CONTROL_IOCTLS only)",
    ),
    (
        libc::SYS_statx,
        "snapshot: checking the directory (metadata)",
    ),
    (
        libc::SYS_pwrite64,
        "snapshot: the memory file's non-zero pages",
    ),
    (libc::SYS_ftruncate, "snapshot: the memory file's length"),
    (
        libc::SYS_fsync,
        "snapshot: both files synced before the reply",
    ),
    (libc::SYS_close, "snapshot: closing the files written"),
    (
        libc::SYS_unlink,
        "snapshot: removing a partial snapshot after an error",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers of `<linux/kvm.h>` on x86_64.
    #[test]
    fn request_numbers_are_the_kernels() {
        assert_eq!(KVM_CHECK_EXTENSION, 0xae03);
        assert_eq!(KVM_GET_MSR_INDEX_LIST, 0xc004_ae02);
        assert_eq!(KVM_GET_IRQCHIP, 0xc208_ae62);
        assert_eq!(KVM_GET_PIT2, 0x8070_ae9f);
        assert_eq!(KVM_GET_CLOCK, 0x8030_ae7c);
        assert_eq!(
            VCPU_IOCTLS,
            &[
                0x8004_ae98,
                0x8138_ae83,
                0x81a0_ae8c,
                0x9000_aea4,
                0x8188_aea6,
                0x8080_aea1,
                0x8400_ae8e,
                0xc008_ae88,
                0x8040_ae9f
            ]
        );
        assert_eq!(CREATE_FLAGS, 0o2_000_301);
        assert_eq!(
            RESTORE_IOCTLS,
            &[
                0x8208_ae63, // KVM_SET_IRQCHIP
                0x4070_aea0, // KVM_SET_PIT2
                0x4030_ae7b, // KVM_SET_CLOCK
                0x4004_ae99, // KVM_SET_MP_STATE
                0x4090_ae82, // KVM_SET_REGS
                0x4138_ae84, // KVM_SET_SREGS
                0x41a0_ae8d, // KVM_SET_FPU
                0x5000_aea5, // KVM_SET_XSAVE
                0x4188_aea7, // KVM_SET_XCRS
                0x4080_aea2, // KVM_SET_DEBUGREGS
                0x4400_ae8f, // KVM_SET_LAPIC
                0x4008_ae89, // KVM_SET_MSRS
                0x4040_aea0, // KVM_SET_VCPU_EVENTS
            ]
        );
    }

    /// Without a snapshot directory no thread gets a snapshot call; with one, only the
    /// control thread gets the file calls and only it and the vCPUs get new requests.
    #[test]
    fn the_lists_apply_only_when_configured() {
        use super::super::{ThreadKind, allowlist_with, program_with};
        let has = |kind, snap: bool, nr| allowlist_with(kind, snap).iter().any(|(n, _)| *n == nr);
        for nr in [
            libc::SYS_ioctl,
            libc::SYS_statx,
            libc::SYS_pwrite64,
            libc::SYS_ftruncate,
            libc::SYS_fsync,
            libc::SYS_unlink,
        ] {
            assert!(!has(ThreadKind::Control, false, nr), "{nr}");
            assert!(has(ThreadKind::Control, true, nr), "{nr}");
        }
        for kind in [
            ThreadKind::Main,
            ThreadKind::Vcpu,
            ThreadKind::Device,
            ThreadKind::Reaper,
            ThreadKind::Restore,
        ] {
            assert_eq!(
                allowlist_with(kind, true),
                allowlist_with(kind, false),
                "{kind:?}"
            );
        }
        assert!(CONTROL.iter().all(|(_, why)| !why.is_empty()));
        for kind in [ThreadKind::Control, ThreadKind::Vcpu] {
            assert_ne!(
                program_with(kind, true).unwrap(),
                program_with(kind, false).unwrap()
            );
        }
    }

    /// The control thread's refusal filter with snapshots: a snapshot file can be created,
    /// an existing file cannot be opened (read or write) and gets `EACCES`.
    #[test]
    fn only_snapshot_creation_passes_the_refusal_filter() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("existing");
        std::fs::write(&existing, b"x").unwrap();
        let new = dir.path().join("new");
        let prog = super::super::refusals_with(super::super::ThreadKind::Control, true).unwrap();
        let (created, read, write) = std::thread::spawn(move || {
            seccompiler::apply_filter(&prog).unwrap();
            let created = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&new)
                .map(|_| ());
            let read = std::fs::File::open(&existing).map(|_| ());
            let write = std::fs::OpenOptions::new()
                .write(true)
                .open(&existing)
                .map(|_| ());
            (created, read, write)
        })
        .join()
        .unwrap();
        created.unwrap();
        assert_eq!(read.unwrap_err().raw_os_error(), Some(libc::EACCES));
        assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EACCES));
    }
}

//! [`Vm::restore`]: a VM from a snapshot directory, ready for `start()`, in two steps that
//! differ in what they trust.
//!
//! 1. [`Vm::prepare_restore`] touches no byte of the state file: it takes the files opened
//!    and checked by [`SnapshotFiles::open`] (the state file's bytes read, not decoded),
//!    checks the memory file's length against the layout of the *config's* `mem_mib`, and
//!    builds the VM as `Vm::create` builds it (the same KVM VM set-up, the same legacy and
//!    virtio devices from the config, the same CPUID on each of the config's vCPUs) with
//!    the memory file mapped copy-on-write instead of fresh RAM and no kernel loaded. Every
//!    descriptor the VM needs is open after it, so `vm-vmm` runs it before its jail's
//!    `confine` (which takes away the host's files and root).
//! 2. [`PendingRestore::finish`] decodes the state ([`format::decode`]: size, magic,
//!    version, checksum, payload, vCPU count, MSRs, regions, devices), checks it against the
//!    config the VM was built from (vcpus, mem_mib, the resolved CPU profile, the device list:
//!    count, then each device's type and identity in order), then sets the irqchip and PIT,
//!    each virtio device's registers and queues (its worker requested from the starter, so
//!    it runs from `start()`), each vCPU's saved state and the KVM clock last (its flags
//!    cleared: the saved clock value itself is what the guest reads on). It opens nothing
//!    and starts nothing: `vm-vmm` runs it after `confine`, on a thread of its own under the
//!    restore filter (`vm_jail::seccomp::ThreadKind::Restore`), so the state file's bytes are
//!    parsed by a process that holds no privilege, no host file and no system call beyond
//!    the `KVM_SET_*` requests of a restore.

use std::path::PathBuf;
use std::time::Instant;

use kvm_ioctls::VmFd;
use vm_sync::Lock;

use super::files::SnapshotFiles;
use super::state::{ConfigFacts, VmState, VmWideState, regions_of};
use super::{SnapshotError, format, kvm_err, memory_file};
use crate::config::{self, ConsoleConfig, CpuProfile, VmConfig, build_cmdline};
use crate::layout::MemoryLayout;
use crate::vcpu;
use crate::virtio::DeviceConfig;
use crate::virtio::persist::DeviceState;
use crate::vm::{
    Vm, VmmError, assemble, check_config, create_kvm_vm, install_kick, register_fenced,
};

/// What of the config a restore's state must match (kept from the config the VM was built
/// from, whose console sink the VM took).
#[derive(Debug, Clone)]
struct Expected {
    vcpus: u8,
    mem_mib: u32,
    cpu_profile: CpuProfile,
    devices: Vec<DeviceConfig>,
}

impl Expected {
    fn of(cfg: &VmConfig) -> Expected {
        Expected {
            vcpus: cfg.vcpus,
            mem_mib: cfg.mem_mib,
            cpu_profile: cfg.cpu_profile,
            devices: cfg.devices.clone(),
        }
    }
}

/// The config facts a restore must match, field by field.
fn check_facts(snap: &ConfigFacts, cfg: &Expected) -> Result<(), SnapshotError> {
    let mismatch = |field, snapshot: String, config: String| SnapshotError::Mismatch {
        field,
        snapshot,
        config,
    };
    if snap.vcpus != cfg.vcpus {
        return Err(mismatch(
            "vcpus",
            snap.vcpus.to_string(),
            cfg.vcpus.to_string(),
        ));
    }
    if snap.mem_mib != cfg.mem_mib {
        return Err(mismatch(
            "mem_mib",
            snap.mem_mib.to_string(),
            cfg.mem_mib.to_string(),
        ));
    }
    let profile = config::resolve(cfg.cpu_profile);
    if snap.cpu_profile != profile {
        return Err(mismatch(
            "cpu_profile",
            format!("{:?}", snap.cpu_profile),
            format!("{:?} (resolved {profile:?})", cfg.cpu_profile),
        ));
    }
    Ok(())
}

/// The config's device list against the snapshot's: count, then each device's type and
/// identity in order (a block disk's size is checked once it is opened, by
/// `MmioDevice::restore_state`).
fn check_devices(snap: &[DeviceState], cfg: &Expected) -> Result<(), SnapshotError> {
    if snap.len() != cfg.devices.len() {
        return Err(SnapshotError::Mismatch {
            field: "devices",
            snapshot: snap.len().to_string(),
            config: cfg.devices.len().to_string(),
        });
    }
    for (index, (s, c)) in snap.iter().zip(&cfg.devices).enumerate() {
        if let Some(d) = s.kind.config_difference(c) {
            return Err(SnapshotError::DeviceMismatch {
                index,
                field: d.field,
                snapshot: d.saved,
                config: d.now,
            });
        }
    }
    Ok(())
}

/// Set every rebuilt device to its saved state (workers requested, not yet started).
fn restore_devices(vm: &Vm, snap: &[DeviceState]) -> Result<(), SnapshotError> {
    for (index, (dev, s)) in vm.virtio.iter().zip(snap).enumerate() {
        dev.locked()
            .restore_state(s)
            .map_err(|source| SnapshotError::Device { index, source })?;
    }
    Ok(())
}

/// KVM_SET_IRQCHIP (both PICs, the IOAPIC) and KVM_SET_PIT2.
fn set_irqchip_and_pit(vm: &VmFd, s: &VmWideState) -> Result<(), SnapshotError> {
    vm.set_irqchip(&s.pic_master)
        .map_err(kvm_err("KVM_SET_IRQCHIP (PIC master)"))?;
    vm.set_irqchip(&s.pic_slave)
        .map_err(kvm_err("KVM_SET_IRQCHIP (PIC slave)"))?;
    vm.set_irqchip(&s.ioapic)
        .map_err(kvm_err("KVM_SET_IRQCHIP (IOAPIC)"))?;
    vm.set_pit2(&s.pit).map_err(kvm_err("KVM_SET_PIT2"))
}

impl Vm {
    /// Restore the snapshot in `dir` (written by [`crate::RunningVm::snapshot`]) into a new
    /// VM for `cfg`, whose vcpus, mem_mib, CPU profile and device list must be the
    /// snapshot's; `cfg.kernel` is not read. Both steps at once, on the calling thread
    /// (`vm-vmm` runs them apart: see the module docs). Call `start()` to run it.
    pub fn restore(cfg: VmConfig, dir: &std::path::Path) -> Result<Vm, SnapshotError> {
        Vm::prepare_restore(cfg, ConsoleConfig::default(), SnapshotFiles::open(dir)?)?.finish()
    }

    /// Step 1 of a restore (see the module docs): the VM for `cfg` around the snapshot's
    /// memory file, its state not yet decoded; its console as `console` says.
    pub fn prepare_restore(
        cfg: VmConfig,
        console: ConsoleConfig,
        files: SnapshotFiles,
    ) -> Result<PendingRestore, SnapshotError> {
        let begin = Instant::now();
        check_config(&cfg)?;
        let layout = MemoryLayout::new(cfg.mem_mib).map_err(VmmError::from)?;
        install_kick()?;
        let (kvm, vm_fd) = create_kvm_vm()?;
        let mem = memory_file::map_private(
            &files.memory,
            &files.memory_path,
            cfg.mem_mib,
            &regions_of(&layout),
        )?;
        let profile = config::resolve(cfg.cpu_profile);
        let (guest, supported) = register_fenced(&kvm, vm_fd, mem, profile)?;
        let expected = Expected::of(&cfg);
        let cmdline = build_cmdline(profile, 0, &cfg.cmdline);
        let mut vm = assemble(kvm, guest, &cfg, console, cmdline)?;
        for index in 0..cfg.vcpus {
            let v = vm
                .guest
                .create_vcpu(u64::from(index))
                .map_err(kvm_err("KVM_CREATE_VCPU"))?;
            vcpu::set_cpuid(
                v.fd(),
                index,
                &supported,
                cfg.vcpus,
                profile == CpuProfile::Baseline,
            )
            .map_err(VmmError::from)?;
            vm.vcpus.push(v);
        }
        Ok(PendingRestore {
            vm,
            expected,
            dir: files.dir,
            state_path: files.state_path,
            state: files.state,
            begin,
        })
    }
}

/// A VM built for a restore whose state is not yet decoded ([`Vm::prepare_restore`]).
pub struct PendingRestore {
    vm: Vm,
    expected: Expected,
    dir: PathBuf,
    state_path: PathBuf,
    state: Vec<u8>,
    begin: Instant,
}

impl std::fmt::Debug for PendingRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRestore")
            .field("dir", &self.dir)
            .field("state_bytes", &self.state.len())
            .finish_non_exhaustive()
    }
}

/// A restore that failed in step 2, with the VM step 1 built: dropping it closes its
/// descriptors and removes its vsock socket, which the restore filter does not allow, so
/// `vm-vmm` drops it on its main thread.
pub struct FailedRestore {
    /// Why.
    pub error: SnapshotError,
    /// The VM as step 1 left it (and step 2 partly set).
    pub vm: Vm,
}

impl std::fmt::Debug for FailedRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailedRestore")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl PendingRestore {
    /// Step 2 of a restore (see the module docs): decode and check the state, then set it.
    /// Opens no file, starts no thread, and issues only `KVM_SET_*` requests.
    pub fn finish(self) -> Result<Vm, SnapshotError> {
        self.apply().map_err(|failed| failed.error)
    }

    /// [`PendingRestore::finish`], handing the VM back on a failure (for the caller to drop
    /// where it may close descriptors: see [`FailedRestore`]).
    pub fn apply(self) -> Result<Vm, Box<FailedRestore>> {
        let PendingRestore {
            vm,
            expected,
            dir,
            state_path,
            state,
            begin,
        } = self;
        match decode_and_set(&vm, &expected, state_path, &state) {
            Ok(()) => {
                tracing::info!(
                    dir = %dir.display(),
                    vcpus = expected.vcpus,
                    mem_mib = expected.mem_mib,
                    took_us = begin.elapsed().as_micros() as u64,
                    "snapshot restored"
                );
                Ok(vm)
            }
            Err(error) => Err(Box::new(FailedRestore { error, vm })),
        }
    }
}

/// Decodes the state file's `bytes` (read from `state_path`), checks it against what the VM
/// was built from, and sets it into `vm`: the irqchip and PIT, the devices, each vCPU, and the
/// KVM clock last.
fn decode_and_set(
    vm: &Vm,
    expected: &Expected,
    state_path: PathBuf,
    bytes: &[u8],
) -> Result<(), SnapshotError> {
    let state: VmState = format::decode(bytes).map_err(|source| SnapshotError::State {
        path: state_path,
        source,
    })?;
    check_facts(&state.config, expected)?;
    check_devices(&state.devices, expected)?;
    set_irqchip_and_pit(vm.guest.vm(), &state.vm)?;
    restore_devices(vm, &state.devices)?;
    for ((index, v), saved) in (0u8..).zip(&vm.vcpus).zip(&state.vcpus) {
        super::vcpu::restore(v.fd(), index, saved).map_err(SnapshotError::Vcpu)?;
    }
    let mut clock = state.vm.clock;
    clock.flags = 0;
    vm.guest
        .vm()
        .set_clock(&clock)
        .map_err(kvm_err("KVM_SET_CLOCK"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_config_fact_is_named_when_it_differs() {
        let snap = ConfigFacts {
            vcpus: 1,
            mem_mib: 16,
            cpu_profile: config::resolve(CpuProfile::Host),
        };
        let cfg = |vcpus, mem_mib| VmConfig {
            vcpus,
            mem_mib,
            cpu_profile: CpuProfile::Host,
            ..VmConfig::default()
        };
        check_facts(&snap, &Expected::of(&cfg(1, 16))).unwrap();
        let field = |c: &VmConfig| match check_facts(&snap, &Expected::of(c)) {
            Err(SnapshotError::Mismatch { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(&cfg(2, 16)), "vcpus");
        assert_eq!(field(&cfg(1, 32)), "mem_mib");
        let mut c = cfg(1, 16);
        c.cpu_profile = CpuProfile::Baseline;
        assert_eq!(field(&c), "cpu_profile");
    }

    #[test]
    fn each_device_difference_is_named() {
        use crate::virtio::persist::{BlockIdentity, DeviceKind, RngIdentity, VsockIdentity};
        let block = |path: &str, read_only| DeviceConfig::Block {
            path: path.into(),
            read_only,
            id: "d".into(),
        };
        let saved = |kind| DeviceState {
            kind,
            ..crate::virtio::persist::tests::sample_rng()
        };
        let snap = vec![
            saved(DeviceKind::Rng(RngIdentity)),
            saved(DeviceKind::Block(BlockIdentity {
                path: "/a".into(),
                size: 512,
                read_only: true,
            })),
            saved(DeviceKind::Vsock(VsockIdentity { guest_cid: 3 })),
        ];
        let vsock = |guest_cid| DeviceConfig::Vsock {
            guest_cid,
            uds_path: "/v".into(),
        };
        let cfg = |devices| VmConfig {
            devices,
            ..VmConfig::default()
        };
        check_devices(
            &snap,
            &Expected::of(&cfg(vec![DeviceConfig::Rng, block("/a", true), vsock(3)])),
        )
        .unwrap();
        let err = |devices| match check_devices(&snap, &Expected::of(&cfg(devices))) {
            Err(SnapshotError::DeviceMismatch { index, field, .. }) => (index, field.to_string()),
            Err(SnapshotError::Mismatch { field, .. }) => (usize::MAX, field.to_string()),
            other => panic!("{other:?}"),
        };
        let f = |i, s: &str| (i, s.to_string());
        assert_eq!(err(vec![DeviceConfig::Rng]), f(usize::MAX, "devices"));
        assert_eq!(
            err(vec![block("/a", true), DeviceConfig::Rng, vsock(3)]),
            f(0, "type")
        );
        assert_eq!(
            err(vec![DeviceConfig::Rng, block("/b", true), vsock(3)]),
            f(1, "path")
        );
        assert_eq!(
            err(vec![DeviceConfig::Rng, block("/a", false), vsock(3)]),
            f(1, "read_only")
        );
        assert_eq!(
            err(vec![DeviceConfig::Rng, block("/a", true), vsock(4)]),
            f(2, "guest_cid")
        );
    }
}

//! [`Vm::restore`]: a VM from a snapshot directory, ready for `start()`.
//!
//! Everything that can be checked without KVM is checked before anything is created: the
//! state file ([`super::format::read_state_file`]: size, magic, version, checksum, payload,
//! vCPU count, regions, devices), the config against the snapshot (vcpus, mem_mib, the
//! resolved CPU profile, the device list: count, then each device's type and identity in
//! order) and the memory file's length. Then the VM is built as
//! `Vm::create` builds it (the same KVM VM set-up, the same legacy devices, the same CPUID)
//! with the memory file mapped copy-on-write instead of fresh RAM and no kernel loaded, the
//! irqchip and PIT are set, each virtio device gets its registers and queues (its worker
//! requested from the starter, so it runs from `start()`), each vCPU gets its saved state, and the KVM clock is set last
//! (its flags cleared: the saved clock value itself is what the guest reads on).

use std::path::Path;
use std::time::Instant;

use kvm_ioctls::VmFd;

use super::state::{ConfigFacts, VmState, VmWideState};
use super::{SnapshotError, SnapshotPaths, format, kvm_err, memory_file};
use crate::config::{CpuProfile, VmConfig, build_cmdline};
use crate::vcpu;
use crate::virtio::DeviceConfig;
use crate::virtio::persist::{DeviceKind, DeviceState};
use crate::vm::{
    Vm, VmmError, assemble, check_config, create_kvm_vm, install_kick, register_fenced,
};

/// The config facts a restore must match, field by field.
fn check_facts(snap: &ConfigFacts, cfg: &VmConfig) -> Result<(), SnapshotError> {
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
    let profile = cfg.cpu_profile.resolve();
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
fn check_devices(snap: &[DeviceState], cfg: &VmConfig) -> Result<(), SnapshotError> {
    if snap.len() != cfg.devices.len() {
        return Err(SnapshotError::Mismatch {
            field: "devices",
            snapshot: snap.len().to_string(),
            config: cfg.devices.len().to_string(),
        });
    }
    for (index, (s, c)) in snap.iter().zip(&cfg.devices).enumerate() {
        let differs =
            |what: &'static str, snapshot: String, config: String| SnapshotError::DeviceMismatch {
                index,
                field: what,
                snapshot,
                config,
            };
        match (&s.kind, c) {
            (
                DeviceKind::Block {
                    path, read_only, ..
                },
                DeviceConfig::Block {
                    path: p,
                    read_only: r,
                    ..
                },
            ) => {
                if path != p {
                    return Err(differs(
                        "path",
                        path.display().to_string(),
                        p.display().to_string(),
                    ));
                }
                if read_only != r {
                    return Err(differs("read_only", read_only.to_string(), r.to_string()));
                }
            }
            (DeviceKind::Vsock { guest_cid }, DeviceConfig::Vsock { guest_cid: g, .. }) => {
                if guest_cid != g {
                    return Err(differs("guest_cid", guest_cid.to_string(), g.to_string()));
                }
            }
            (DeviceKind::Rng, DeviceConfig::Rng) => {}
            (
                DeviceKind::Fs {
                    tag,
                    share,
                    dax_window,
                },
                DeviceConfig::Fs {
                    tag: t,
                    share: s,
                    dax_window: w,
                    ..
                },
            ) => {
                if tag != t {
                    return Err(differs("tag", tag.clone(), t.clone()));
                }
                if share != s {
                    let show = |p: &std::path::Path| p.display().to_string();
                    return Err(differs("share", show(share), show(s)));
                }
                if dax_window != w {
                    return Err(differs("dax_window", dax_window.to_string(), w.to_string()));
                }
            }
            (k, c) => return Err(differs("type", k.name().into(), c.name())),
        }
    }
    Ok(())
}

/// Set every rebuilt device to its saved state (workers requested, not yet started).
fn restore_devices(vm: &Vm, snap: &[DeviceState]) -> Result<(), SnapshotError> {
    for (index, (dev, s)) in vm.virtio.iter().zip(snap).enumerate() {
        dev.lock()
            .unwrap_or_else(|p| p.into_inner())
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
    /// snapshot's; `cfg.kernel` is not read. Call `start()` to run it.
    pub fn restore(mut cfg: VmConfig, dir: &Path) -> Result<Vm, SnapshotError> {
        let begin = Instant::now();
        let paths = SnapshotPaths::in_dir(dir);
        let state: VmState =
            format::read_state_file(&paths.state).map_err(|source| SnapshotError::State {
                path: paths.state.clone(),
                source,
            })?;
        check_config(&cfg)?;
        check_facts(&state.config, &cfg)?;
        check_devices(&state.devices, &cfg)?;
        install_kick()?;
        let (kvm, vm_fd) = create_kvm_vm()?;
        let mem = memory_file::map_private(&paths.memory, &state.regions)?;
        let profile = state.config.cpu_profile;
        let (guest, supported) = register_fenced(&kvm, vm_fd, mem, profile)?;
        set_irqchip_and_pit(guest.vm(), &state.vm)?;

        let cmdline = build_cmdline(profile, 0, &cfg.cmdline);
        let mut vm = assemble(kvm, guest, &mut cfg, cmdline)?;
        restore_devices(&vm, &state.devices)?;
        for (index, saved) in (0..cfg.vcpus).zip(&state.vcpus) {
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
            super::vcpu::restore(v.fd(), index, saved).map_err(SnapshotError::Vcpu)?;
            vm.vcpus.push(v);
        }
        let mut clock = state.vm.clock;
        clock.flags = 0;
        vm.guest
            .vm()
            .set_clock(&clock)
            .map_err(kvm_err("KVM_SET_CLOCK"))?;
        tracing::info!(
            dir = %dir.display(),
            vcpus = cfg.vcpus,
            mem_mib = cfg.mem_mib,
            took_us = begin.elapsed().as_micros() as u64,
            "snapshot restored"
        );
        Ok(vm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_config_fact_is_named_when_it_differs() {
        let snap = ConfigFacts {
            vcpus: 1,
            mem_mib: 16,
            cpu_profile: CpuProfile::Host.resolve(),
        };
        let cfg = |vcpus, mem_mib| VmConfig {
            vcpus,
            mem_mib,
            cpu_profile: CpuProfile::Host,
            ..VmConfig::default()
        };
        check_facts(&snap, &cfg(1, 16)).unwrap();
        let field = |c: &VmConfig| match check_facts(&snap, c) {
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
            saved(DeviceKind::Rng),
            saved(DeviceKind::Block {
                path: "/a".into(),
                size: 512,
                read_only: true,
            }),
            saved(DeviceKind::Vsock { guest_cid: 3 }),
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
            &cfg(vec![DeviceConfig::Rng, block("/a", true), vsock(3)]),
        )
        .unwrap();
        let err = |devices| match check_devices(&snap, &cfg(devices)) {
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

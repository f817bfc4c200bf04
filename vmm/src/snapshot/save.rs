//! [`RunningVm::snapshot`]: pause, read every vCPU's and the VM's state, write the memory file
//! and then the state file, then resume or stop.
//!
//! The memory file is written before the state file, so a directory holding a `vmstate`
//! holds a complete snapshot; on an error every file this call created is removed again (an
//! existing file is never touched: both are created with `O_EXCL`) and the VM resumes,
//! whatever [`AfterSnapshot`] said.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use kvm_bindings::{
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, kvm_irqchip,
};
use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vm_sync::Lock;

use super::memory_file::{self, create_private};
use super::state::{RegionState, VmState, VmWideState};
use super::vcpu::SavePlan;
use super::{AfterSnapshot, SnapshotError, SnapshotInfo, SnapshotPaths, format, io_err, kvm_err};
use crate::exit::VmExit;
use crate::vm::{RunningVm, Vm};

/// How long the vCPUs get to park, and then to hand back their state.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);

/// KVM_GET_IRQCHIP of chip `chip_id`.
fn irqchip(vm: &VmFd, chip_id: u32, what: &'static str) -> Result<kvm_irqchip, SnapshotError> {
    let mut chip = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    vm.get_irqchip(&mut chip).map_err(kvm_err(what))?;
    Ok(chip)
}

/// The irqchip, PIT and clock of `vm`.
fn vm_wide(vm: &VmFd) -> Result<VmWideState, SnapshotError> {
    Ok(VmWideState {
        pic_master: irqchip(vm, KVM_IRQCHIP_PIC_MASTER, "KVM_GET_IRQCHIP (PIC master)")?,
        pic_slave: irqchip(vm, KVM_IRQCHIP_PIC_SLAVE, "KVM_GET_IRQCHIP (PIC slave)")?,
        ioapic: irqchip(vm, KVM_IRQCHIP_IOAPIC, "KVM_GET_IRQCHIP (IOAPIC)")?,
        pit: vm.get_pit2().map_err(kvm_err("KVM_GET_PIT2"))?,
        clock: vm.get_clock().map_err(kvm_err("KVM_GET_CLOCK"))?,
    })
}

/// Start again every worker a save stopped (the VM runs on); a device whose worker cannot
/// start is logged and enters DEVICE_NEEDS_RESET, as at a failed DRIVER_OK.
fn resume_devices(vm: &Vm) {
    for (index, dev) in vm.virtio.iter().enumerate() {
        if let Err(e) = dev.locked().resume_after_save() {
            tracing::error!("snapshot: virtio device {index} not restarted: {e}");
        }
    }
}

/// With the vCPUs parked: read the state (stopping the device workers) and write both files.
fn save_paused(vm: &Vm, paths: &SnapshotPaths) -> Result<(u64, u64, u64), SnapshotError> {
    let plan = SavePlan::new(&vm.kvm);
    let vcpus = vm
        .control
        .collect_vcpu_states(plan, PAUSE_TIMEOUT)
        .map_err(SnapshotError::Pause)?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(SnapshotError::Vcpu)?;
    // The workers stop (and finish what they serve) before RAM is read.
    let devices = vm
        .virtio
        .iter()
        .enumerate()
        .map(|(index, dev)| {
            dev.locked()
                .save_state()
                .map_err(|source| SnapshotError::Device { index, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mem = vm.guest.memory();
    let state = VmState {
        config: vm.facts,
        regions: mem
            .iter()
            .map(|r| RegionState {
                guest_addr: r.start_addr().0,
                size: r.len(),
            })
            .collect(),
        vcpus,
        vm: vm_wide(vm.guest.vm())?,
        devices,
    };
    // What a restore will check, checked now: a snapshot that cannot be restored is an error
    // here, not later.
    state.validate().map_err(|e| SnapshotError::State {
        path: paths.state.clone(),
        source: format::StateError::Invalid(e),
    })?;
    let bytes = format::encode(&state).map_err(|source| SnapshotError::State {
        path: paths.state.clone(),
        source,
    })?;
    let written = memory_file::write(mem, &paths.memory)?;
    let state_written = create_private(&paths.state).and_then(|mut file| {
        let r = file
            .write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(io_err("writing", &paths.state));
        if r.is_err() {
            let _ = std::fs::remove_file(&paths.state);
        }
        r
    });
    if let Err(e) = state_written {
        let _ = std::fs::remove_file(&paths.memory);
        return Err(e);
    }
    Ok((bytes.len() as u64, state.memory_bytes(), written))
}

impl RunningVm {
    /// Snapshot the VM into the directory `dir` (which must exist and hold no snapshot
    /// files), then resume or stop it as `then` says. Refused for a VM with a writable disk.
    /// See [`crate::snapshot`].
    pub fn snapshot(&self, dir: &Path, then: AfterSnapshot) -> Result<SnapshotInfo, SnapshotError> {
        let vm = self.vm.as_ref().ok_or(SnapshotError::NotRunning)?;
        let meta = std::fs::metadata(dir).map_err(io_err("reading", dir))?;
        if !meta.is_dir() {
            return Err(io_err("snapshot directory", dir)(
                std::io::ErrorKind::NotADirectory.into(),
            ));
        }
        let paths = SnapshotPaths::in_dir(dir);
        let start = Instant::now();
        vm.control.pause(PAUSE_TIMEOUT).map_err(|e| match e {
            crate::control::PauseError::NotRunning => SnapshotError::NotRunning,
            e => SnapshotError::Pause(e),
        })?;
        let pause_latency = start.elapsed();
        let saved = save_paused(vm, &paths);
        let took = start.elapsed();
        match (&saved, then) {
            (Ok(_), AfterSnapshot::Stop) => vm.control.request_stop(Ok(VmExit::Stopped)),
            _ => {
                resume_devices(vm);
                vm.control.resume();
            }
        }
        let (state_bytes, memory_bytes, memory_written) = saved?;
        tracing::info!(
            dir = %dir.display(),
            state_bytes,
            memory_bytes,
            memory_written,
            pause_us = pause_latency.as_micros() as u64,
            took_us = took.as_micros() as u64,
            "snapshot written"
        );
        Ok(SnapshotInfo {
            paths,
            state_bytes,
            memory_bytes,
            memory_written,
            pause_latency,
            took,
        })
    }
}

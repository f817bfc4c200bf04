//! Booting on the in-process VMM (`vmm::Vm`), and its [`VmHandle`].

use std::sync::Mutex;
use std::time::Duration;

use guest_agent::AGENT_PORT;
use guest_agent::client::AgentClient;
use vm_spec::Containment;
use vmm::virtio::DeviceConfig;
use vmm::{ConsoleConfig, CpuProfile, KernelFormat, RunningVm, Vm, VmConfig};

use crate::boot::{self, GUEST_CID, RunDir, VSOCK_SOCKET};
use crate::machine::{MachineInfo, VmHandle};
use crate::{BootPlan, DriverError, Machine};

/// The `vmm` configuration for a plan (pure apart from reading nothing; paths are not opened).
pub(crate) fn vm_config(
    plan: &BootPlan,
    agent_cmdline: String,
    uds: std::path::PathBuf,
    initrd: std::path::PathBuf,
) -> Result<VmConfig, DriverError> {
    let vcpus = u8::try_from(plan.vcpus).map_err(|_| DriverError::InvalidPlan {
        reason: format!("vcpus: {} does not fit the kvm vmm", plan.vcpus),
    })?;
    let mut devices: Vec<DeviceConfig> = plan
        .disks
        .iter()
        .enumerate()
        .map(|(i, d)| DeviceConfig::Block {
            path: d.host_path.clone(),
            read_only: true,
            id: boot::disk_id(i),
        })
        .collect();
    devices.push(DeviceConfig::Vsock {
        guest_cid: GUEST_CID,
        uds_path: uds,
    });
    devices.push(DeviceConfig::Rng);
    Ok(VmConfig {
        mem_mib: plan.mem_mib,
        vcpus,
        kernel: plan.images.vmlinux.clone(),
        kernel_format: KernelFormat::Auto,
        initrd: Some(initrd),
        cmdline: agent_cmdline,
        cpu_profile: CpuProfile::Auto,
        devices,
        console: ConsoleConfig::default(),
    })
}

pub(super) fn boot(plan: BootPlan) -> Result<Machine, DriverError> {
    boot::check_plan(&plan)?;
    boot::require_file("images.vmlinux", &plan.images.vmlinux)?;
    let cmdline = boot::agent_cmdline(&plan)?;
    let mut files = vec![VSOCK_SOCKET];
    files.extend(boot::RUN_FILES);
    let run = RunDir::prepare(&plan.run_dir, &files)?;
    let uds = run.path(VSOCK_SOCKET);
    let (token, initrd) = boot::boot_secret(&plan, &run)?;
    let cfg = vm_config(&plan, cmdline, uds.clone(), initrd)?;
    let vmm_err = |e: vmm::VmmError| DriverError::Vmm {
        source: Box::new(e),
    };
    let running = Vm::create(cfg).and_then(Vm::start).map_err(vmm_err)?;
    tracing::info!(name = %plan.name, "kvm vm started");
    let handle = KvmHandle {
        vm: Mutex::new(Some(running)),
        last_console: Mutex::new(String::new()),
        run: Mutex::new(run),
    };
    let client = AgentClient::hybrid_vsock(uds.clone(), AGENT_PORT).with_token(token);
    if let Err(e) = boot::wait_for_agent(&handle, &client, plan.boot_timeout) {
        handle.kill();
        return Err(e);
    }
    let info = MachineInfo {
        name: plan.name,
        driver: "kvm",
        containment: Containment::MicroVm,
        wall: plan.wall,
        agent_socket: uds,
    };
    Machine::new(info, Box::new(handle), client)
}

/// One in-process VM: its vCPU threads and devices live in `vm` until killed.
struct KvmHandle {
    vm: Mutex<Option<RunningVm>>,
    /// The console as it was when the VM was torn down.
    last_console: Mutex<String>,
    run: Mutex<RunDir>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl VmHandle for KvmHandle {
    fn is_running(&self) -> bool {
        lock(&self.vm).as_ref().is_some_and(|vm| !vm.is_finished())
    }

    fn kill(&self) {
        let taken = lock(&self.vm).take();
        if let Some(vm) = taken {
            *lock(&self.last_console) = vm.console();
            vm.stop();
            if let Err(e) = vm.wait() {
                tracing::info!(error = %e, "kvm vm ended with a guest fault");
            }
        }
        lock(&self.run).cleanup();
    }

    fn wait(&self, timeout: Duration) -> bool {
        match lock(&self.vm).as_ref() {
            Some(vm) => vm.wait_timeout(timeout).is_some(),
            None => true,
        }
    }

    fn console_tail(&self) -> String {
        match lock(&self.vm).as_ref() {
            Some(vm) => vm.console(),
            None => lock(&self.last_console).clone(),
        }
    }

    fn host_pids(&self) -> Vec<u32> {
        vec![std::process::id()]
    }
}

impl Drop for KvmHandle {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::dummy_plan;
    use crate::{DiskFs, DiskPlan};

    #[test]
    fn config_has_read_only_disks_vsock_and_rng() {
        let mut plan = dummy_plan();
        plan.vcpus = 2;
        plan.mem_mib = 256;
        plan.disks = vec![
            DiskPlan {
                host_path: "/a".into(),
                guest_path: "/a".into(),
                fs: DiskFs::Erofs,
            },
            DiskPlan {
                host_path: "/b".into(),
                guest_path: "/b".into(),
                fs: DiskFs::Raw,
            },
        ];
        let initrd = std::path::PathBuf::from("/run/initrd.cpio");
        let cfg = vm_config(
            &plan,
            "vm.hostname=x".into(),
            "/run/v.sock".into(),
            initrd.clone(),
        )
        .unwrap();
        assert_eq!(cfg.mem_mib, 256);
        assert_eq!(cfg.vcpus, 2);
        assert_eq!(cfg.kernel, plan.images.vmlinux);
        assert_eq!(cfg.initrd.as_ref(), Some(&initrd));
        assert_eq!(cfg.cmdline, "vm.hostname=x");
        assert_eq!(
            cfg.devices,
            vec![
                DeviceConfig::Block {
                    path: "/a".into(),
                    read_only: true,
                    id: "disk0".into()
                },
                DeviceConfig::Block {
                    path: "/b".into(),
                    read_only: true,
                    id: "disk1".into()
                },
                DeviceConfig::Vsock {
                    guest_cid: 3,
                    uds_path: "/run/v.sock".into()
                },
                DeviceConfig::Rng,
            ]
        );
        plan.vcpus = 1000;
        assert!(vm_config(&plan, String::new(), "/x".into(), initrd).is_err());
    }
}

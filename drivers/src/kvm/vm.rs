//! Booting a VM in its own `vm-vmm` process, and its [`VmHandle`].
//!
//! The process is started through the driver's long-lived spawner thread (its own process
//! group, `PR_SET_PDEATHSIG(SIGKILL)` armed before `exec`); the configuration is the first line
//! of its control channel (stdin), its console and diagnostics stream into one bounded ring,
//! and its exit status says how the VM ended (`vmm::process`).

use std::time::Duration;

use guest_agent::AGENT_PORT;
use guest_agent::client::AgentClient;
use vm_spec::Containment;
use vmm::process::{JailConfig, ProcessConfig, ProcessExit};
use vmm::virtio::DeviceConfig;
use vmm::{ConsoleConfig, CpuProfile, KernelFormat, VmConfig};

use crate::boot::{self, GUEST_CID, RunDir, VSOCK_SOCKET};
use crate::machine::{MachineInfo, VmHandle};
use crate::process::{Supervised, spawn_supervised};
use crate::{BootPlan, DriverError, Machine};

use super::locate;

/// The bounded tail of console and diagnostics kept per VM.
const CONSOLE_RING_BYTES: usize = 64 * 1024;

/// The directory in the run dir the VM's jail root is mounted on (only in its own mount
/// namespace: on the host it stays empty).
const JAIL_ROOT: &str = "root";

/// How long a stopped VM process gets to exit by itself before it is killed.
const STOP_GRACE: Duration = Duration::from_millis(500);

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
        .block_devices()
        .into_iter()
        .map(|d| DeviceConfig::Block {
            path: d.host_path,
            read_only: true,
            id: d.serial,
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

/// The jail of a VM: its root tmpfs on `<run_dir>/root`, the run dir (sockets) bound inside.
fn jail_config(run: &mut RunDir) -> Result<JailConfig, DriverError> {
    Ok(JailConfig {
        root: run.make_dir(JAIL_ROOT)?,
        binds: vec![run.dir().to_path_buf()],
        netns_fd: Some(shared_netns()?),
        ..JailConfig::default()
    })
}

/// This process's empty network namespace, which every VM process it starts joins.
pub(crate) fn shared_netns() -> Result<i32, DriverError> {
    vm_jail::shared_netns().map_err(|source| DriverError::Spawn {
        program: "an empty network namespace for the jail".into(),
        source,
    })
}

/// Starts `vm-vmm` and hands it `cfg`.
fn spawn_vmm(cfg: &ProcessConfig) -> Result<Supervised, DriverError> {
    let bin = locate::vmm_binary()?;
    let program = vmm::process::BINARY;
    let mut cmd = vmm::process::command(&bin);
    if let Some(fd) = cfg.jail.as_ref().and_then(|j| j.netns_fd) {
        vm_jail::pass_fd(&mut cmd, fd);
    }
    let child = spawn_supervised(program, cmd, CONSOLE_RING_BYTES).map_err(|source| {
        DriverError::Spawn {
            program: bin.display().to_string(),
            source,
        }
    })?;
    let sent = child.with_stdin(|w| vmm::process::write_config(w, cfg));
    match sent {
        Some(Ok(())) => Ok(child),
        Some(Err(e)) => Err(DriverError::Helper {
            program: program.into(),
            reason: format!("cannot send the configuration: {e}"),
            output: child.output_tail(),
        }),
        None => Err(DriverError::Helper {
            program: program.into(),
            reason: "no control channel".into(),
            output: child.output_tail(),
        }),
    }
}

pub(super) fn boot(plan: BootPlan) -> Result<Machine, DriverError> {
    boot::check_plan(&plan)?;
    boot::require_file("images.vmlinux", &plan.images.vmlinux)?;
    let cmdline = boot::agent_cmdline(&plan)?;
    let mut files = vec![VSOCK_SOCKET];
    files.extend(boot::RUN_FILES);
    let mut run = RunDir::prepare(&plan.run_dir, &files)?;
    let uds = run.path(VSOCK_SOCKET);
    let (token, initrd) = boot::boot_secret(&plan, &run)?;
    let jailed = crate::jail::kvm_report()
        .decide(plan.allow_weaker_jail)
        .map_err(|reason| DriverError::JailUnavailable {
            driver: "kvm",
            reason,
        })?;
    let mut cfg = ProcessConfig::new(vm_config(&plan, cmdline, uds.clone(), initrd)?);
    if jailed {
        cfg.jail = Some(jail_config(&mut run)?);
    }
    cfg.seccomp = true;
    let child = spawn_vmm(&cfg)?;
    tracing::info!(name = %plan.name, pid = child.pid(), "kvm vm process started");
    let handle = KvmHandle {
        child,
        run: std::sync::Mutex::new(run),
    };
    let client = AgentClient::hybrid_vsock(uds.clone(), AGENT_PORT).with_token(token);
    if let Err(e) = boot::wait_for_agent(&handle, &client, plan.boot_timeout) {
        // The wait's error carries the stop detail and the console tail (the guest's last
        // words, as on every driver); only a seccomp kill is worth a variant of its own.
        let exit = handle.child.exit_status().map(ProcessExit::from_status);
        handle.kill();
        return Err(match exit {
            Some(ProcessExit::Seccomp) => seccomp_killed(handle.console_tail()),
            _ => e,
        });
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

/// The error for a VM process its seccomp filter killed before the agent answered, as for
/// the tcg driver's programs.
fn seccomp_killed(console_tail: String) -> DriverError {
    DriverError::SeccompKilled {
        program: vmm::process::BINARY.into(),
        console_tail,
    }
}

/// One VM in its own `vm-vmm` process.
struct KvmHandle {
    child: Supervised,
    run: std::sync::Mutex<RunDir>,
}

impl VmHandle for KvmHandle {
    fn is_running(&self) -> bool {
        self.child.is_running()
    }

    fn kill(&self) {
        if self.child.is_running() {
            // Ask first (the VMM stops its vCPUs and exits 0), then make sure.
            let _ = self.child.with_stdin(vmm::process::send_stop);
            self.child.wait_exit(STOP_GRACE);
        }
        if let Some(status) = self.child.kill_and_reap() {
            tracing::info!(exit = %ProcessExit::from_status(status), "kvm vm process reaped");
        }
        self.run.lock().unwrap_or_else(|p| p.into_inner()).cleanup();
    }

    fn wait(&self, timeout: Duration) -> bool {
        self.child.wait_exit(timeout)
    }

    fn console_tail(&self) -> String {
        self.child.output_tail()
    }

    fn host_pids(&self) -> Vec<u32> {
        vec![self.child.pid()]
    }

    fn stop_detail(&self) -> String {
        self.child
            .ended_detail(vmm::process::BINARY, |st| {
                ProcessExit::from_status(st).to_string()
            })
            .unwrap_or_default()
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
    use crate::{DiskFs, DiskPlan, RootfsPlan};

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
        plan.rootfs = Some(RootfsPlan {
            host_path: "/r.erofs".into(),
            fs: DiskFs::Erofs,
        });
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
                DeviceConfig::Block {
                    path: "/r.erofs".into(),
                    read_only: true,
                    id: "root".into()
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

    #[test]
    fn a_seccomp_kill_before_the_agent_answered_names_the_program() {
        let e = seccomp_killed("tail".into());
        assert!(
            matches!(&e, DriverError::SeccompKilled { program, console_tail }
                if program == vmm::process::BINARY && console_tail == "tail"),
            "{e:?}"
        );
        assert!(e.to_string().contains("SIGSYS"), "{e}");
    }
}

//! Booting a VM in its own `vm-vmm` process, and its [`VmHandle`].
//!
//! The process is started through the driver's long-lived spawner thread (its own process
//! group, `PR_SET_PDEATHSIG(SIGKILL)` armed before `exec`); the configuration is the first line
//! of its control channel (stdin), its console streams into a bounded ring, its log (stderr)
//! into the run directory's `vmm.log` ([`super::log`]), and its exit status says how the VM
//! ended (`vm_vmm_protocol`).

use std::time::Duration;

use vm_agent_client::AgentClient;
use vm_agent_protocol::AGENT_PORT;
use vm_spec::Containment;
use vm_sync::Lock;
use vm_vmm_protocol::{CpuProfile, KernelFormat, VmConfig};
use vm_vmm_protocol::{DeviceConfig, JailConfig, ProcessConfig, ProcessExit};

use crate::boot::{self, GUEST_CID, RunDir, VSOCK_SOCKET};
use crate::machine::{MachineInfo, Reports, VmHandle};
use crate::process::{Supervised, spawn_supervised};
use crate::snapshot::{BackendSnapshot, RestoreFrom, SnapshotError};
use crate::{BootPlan, DriverError, Machine};

use super::locate;
use super::log::{VMM_LOG, VmmLog};

/// How long a metrics query waits for the VMM's reply.
const METRICS_WAIT: Duration = Duration::from_millis(500);

/// The bounded tail of the console kept per VM.
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
    let dax_window = u64::from(dax_window_mib(plan)) << 20;
    devices.extend(
        plan.shares
            .iter()
            .enumerate()
            .map(|(i, s)| DeviceConfig::Fs {
                tag: boot::share_tag(i),
                share: s.host_path.clone(),
                max_inodes: crate::tcg::MAX_INODES,
                dax_window,
            }),
    );
    Ok(VmConfig {
        mem_mib: plan.mem_mib,
        vcpus,
        kernel: plan.images.vmlinux.clone(),
        kernel_format: KernelFormat::Auto,
        initrd: Some(initrd),
        cmdline: agent_cmdline,
        cpu_profile: CpuProfile::Auto,
        devices,
    })
}

/// Descriptors a share's server keeps beyond its inodes (its worker's eventfds and epoll).
const SHARE_OWN_FDS: u64 = 16;

/// The size of each share's DAX window for `plan`, in MiB: what it asks for, else
/// [`super::default_dax_window_mib`] (a multiple of 2 MiB: DAX maps 2 MiB ranges; [`super::dax_window`]
/// refuses any other size asked for).
pub(crate) fn dax_window_mib(plan: &BootPlan) -> u32 {
    plan.dax_window_mib
        .unwrap_or_else(|| super::default_dax_window_mib(plan.mem_mib))
}

/// The jail of a VM: its root tmpfs on `<run_dir>/root`, the run dir (sockets) bound inside,
/// and each share's source bound read-only at its own path (the VMM opens it there).
fn jail_config(run: &mut RunDir, plan: &BootPlan) -> Result<JailConfig, DriverError> {
    Ok(JailConfig {
        root: run.make_dir(JAIL_ROOT)?,
        binds: vec![run.dir().to_path_buf()],
        ro: plan.shares.iter().map(|s| s.host_path.clone()).collect(),
        netns_fd: Some(shared_netns()?),
        extra_open_files: plan.shares.len() as u64
            * (crate::tcg::MAX_INODES as u64 + SHARE_OWN_FDS),
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

/// Starts `vm-vmm` with its log going to `log_path`, and hands it `cfg`.
fn spawn_vmm(
    cfg: &ProcessConfig,
    log_path: &std::path::Path,
) -> Result<(Supervised, VmmLog), DriverError> {
    let bin = locate::vmm_binary()?;
    let program = vm_vmm_protocol::BINARY;
    let spawn_err = |source| DriverError::Spawn {
        program: bin.display().to_string(),
        source,
    };
    let mut cmd = vm_vmm_protocol::command(&bin);
    if let Some(fd) = cfg.jail.as_ref().and_then(|j| j.netns_fd) {
        vm_jail::pass_fd(&mut cmd, fd);
    }
    // Our own pipe for stderr, so the supervisor's output ring gets the console only. The
    // write end in `cmd` is closed once the spawner has started the child.
    let (log_rx, log_tx) = std::io::pipe().map_err(spawn_err)?;
    cmd.stderr(log_tx);
    let log = VmmLog::to_file(log_rx, log_path).map_err(|source| DriverError::Io {
        what: "creating",
        path: log_path.to_path_buf(),
        source,
    })?;
    let child = spawn_supervised(program, cmd, CONSOLE_RING_BYTES).map_err(spawn_err)?;
    let failed = |reason: String| DriverError::Helper {
        program: program.into(),
        reason,
        output: log.tail(!child.is_running()),
    };
    match child.with_stdin(|w| vm_vmm_protocol::write_config(w, cfg)) {
        Some(Ok(())) => Ok((child, log)),
        Some(Err(e)) => Err(failed(format!("cannot send the configuration: {e}"))),
        None => Err(failed("no control channel".into())),
    }
}

pub(super) fn boot(plan: BootPlan) -> Result<Machine, DriverError> {
    start(plan, None)
}

/// Starts the VM of `plan` from the snapshot `from` (see [`crate::snapshot`]).
pub(super) fn restore(plan: BootPlan, from: &RestoreFrom) -> Result<Machine, DriverError> {
    start(plan, Some(from))
}

/// Boots `plan` (`from` = `None`) or restores it from a snapshot: the same run directory,
/// jail, filters and supervision either way. A restore boots no kernel (so no boot initrd
/// carries a token: the snapshot's agent has one) and re-keys the agent once it answers.
fn start(plan: BootPlan, from: Option<&RestoreFrom>) -> Result<Machine, DriverError> {
    boot::check_plan(&plan)?;
    boot::require_file("images.vmlinux", &plan.images.vmlinux)?;
    if boot::kernel_kind(&plan)? == boot::KernelKind::Distribution {
        return Err(boot::invalid(format!(
            "images.initramfs: {} carries a distribution kernel's modules (images/build.sh --kernel debian); \
             that kernel finds its devices through ACPI, which this VMM does not describe yet: \
             boot the tuned kernel (images/build.sh)",
            plan.images.initramfs.display()
        )));
    }
    boot::check_device_count(&plan, super::MAX_DEVICES)?;
    let dax = !plan.shares.is_empty() && super::dax_window(plan.dax_window_mib, plan.mem_mib)? > 0;
    let cmdline = boot::agent_cmdline(&plan, dax)?;
    let mut files = vec![VSOCK_SOCKET, VMM_LOG];
    files.extend(boot::RUN_FILES);
    let mut run = RunDir::prepare(&plan.run_dir, &files)?;
    let uds = run.path(VSOCK_SOCKET);
    let (token, initrd) = match from {
        None => boot::boot_secret(&plan, &run)?,
        Some(f) => (f.token.clone(), plan.images.initramfs.clone()),
    };
    let jailed = crate::jail::kvm_report()
        .decide(plan.allow_weaker_jail)
        .map_err(|reason| DriverError::JailUnavailable {
            driver: "kvm",
            reason,
        })?;
    let mut cfg = ProcessConfig::new(vm_config(&plan, cmdline, uds.clone(), initrd)?);
    if jailed {
        cfg.jail = Some(jail_config(&mut run, &plan)?);
    }
    cfg.seccomp = true;
    cfg.snapshot_dir = plan.snapshot_dir.clone();
    cfg.restore = from.map(|f| f.dir.clone());
    let (child, log) = spawn_vmm(&cfg, &run.path(VMM_LOG))?;
    tracing::info!(name = %plan.name, pid = child.pid(), restore = from.is_some(), "kvm vm process started");
    let handle = KvmHandle {
        child,
        log,
        run: std::sync::Mutex::new(run),
        snapshot_dir: plan.snapshot_dir.clone(),
    };
    let mut client = AgentClient::hybrid_vsock(uds.clone(), AGENT_PORT).with_token(token);
    let ready = boot::wait_for_agent(&handle, &client, plan.boot_timeout).and_then(|()| {
        tracing::debug!(name = %plan.name, "agent answered");
        if let Some(from) = from {
            let run = handle.run.locked();
            client = boot::rekey(&run, &client, from.generation)?;
            tracing::debug!(name = %plan.name, "agent re-keyed");
        }
        Ok(())
    });
    if let Err(e) = ready {
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
        program: vm_vmm_protocol::BINARY.into(),
        console_tail,
    }
}

/// Lines of the VMM's log a stop detail quotes.
const LOG_LINES: usize = 3;

/// `detail` followed by the last [`LOG_LINES`] lines of the VMM's log (why it gave up).
fn with_log_lines(detail: String, log: &str) -> String {
    let mut last: Vec<&str> = log.trim_end().lines().rev().take(LOG_LINES).collect();
    if last.is_empty() {
        return detail;
    }
    last.reverse();
    format!(
        "{detail}; its log ends: {:?}",
        crate::process::clip(&last.join(" | "))
    )
}

/// One VM in its own `vm-vmm` process.
struct KvmHandle {
    child: Supervised,
    log: VmmLog,
    run: std::sync::Mutex<RunDir>,
    /// The snapshot directory the VMM was given, if any.
    snapshot_dir: Option<std::path::PathBuf>,
}

impl VmHandle for KvmHandle {
    fn is_running(&self) -> bool {
        self.child.is_running()
    }

    fn kill(&self) {
        if self.child.is_running() {
            // Ask first (the VMM stops its vCPUs and exits 0), then make sure.
            let _ = self.child.with_stdin(vm_vmm_protocol::send_stop);
            self.child.wait_exit(STOP_GRACE);
        }
        if let Some(status) = self.child.kill_and_reap() {
            tracing::info!(exit = %ProcessExit::from_status(status), "kvm vm process reaped");
        }
        self.run.locked().cleanup();
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
        let Some(ended) = self.child.ended_detail(vm_vmm_protocol::BINARY, |st| {
            ProcessExit::from_status(st).to_string()
        }) else {
            return String::new();
        };
        with_log_lines(ended, &self.log.tail(true))
    }

    fn reports(&self) -> Reports {
        Reports {
            vmm_log: true,
            device_metrics: true,
        }
    }

    fn vmm_log_tail(&self) -> Option<String> {
        Some(self.log.tail(!self.child.is_running()))
    }

    fn device_metrics(&self) -> Option<vm_vmm_protocol::MetricsReport> {
        let seen = self.log.replies();
        self.child
            .with_stdin(vm_vmm_protocol::send_metrics_query)?
            .ok()?;
        self.log.report_after(seen, METRICS_WAIT)
    }

    fn snapshot(&self, timeout: Duration) -> Result<BackendSnapshot, SnapshotError> {
        let Some(dir) = &self.snapshot_dir else {
            // Named by the machine, which knows its name.
            return Err(SnapshotError::NotConfigured {
                name: String::new(),
            });
        };
        let seen = self.log.snapshot_replies();
        let stop = vm_vmm_protocol::AfterSnapshot::Stop;
        self.child
            .with_stdin(|w| vm_vmm_protocol::send_snapshot(w, stop))
            .unwrap_or_else(|| Err(std::io::Error::other("no control channel")))
            .map_err(SnapshotError::Control)?;
        let Some(reply) = self.log.snapshot_after(seen, timeout) else {
            self.kill();
            return Err(SnapshotError::Timeout(timeout));
        };
        if !reply.ok {
            return Err(SnapshotError::Refused(reply.error.unwrap_or_default()));
        }
        // `snapshot-stop`: the VMM exits once the files are written.
        if !self.child.wait_exit(timeout) {
            tracing::warn!("the vm process did not exit after its snapshot; killing it");
            self.kill();
        }
        // The jail made the directory and the files its own uid's, one a later jail reuses.
        vm_vmm_protocol::snapshot::hand_back(dir).map_err(SnapshotError::HandBack)?;
        Ok(BackendSnapshot {
            state_bytes: reply.state_bytes,
            memory_bytes: reply.memory_bytes,
            memory_written: reply.memory_written,
            pause: Duration::from_micros(reply.pause_us),
            took: Duration::from_micros(reply.took_us),
        })
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
    fn a_distribution_kernel_is_refused_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let entries = ["init", "lib/modules/vm/order", "TRAILER!!!"];
        let mut plan = crate::boot::tests::plan_with_initramfs(dir.path(), &entries);
        plan.run_dir = dir.path().join("run");
        let err = start(plan, None).unwrap_err().to_string();
        assert!(
            err.contains("distribution kernel") && err.contains("ACPI"),
            "{err}"
        );
        assert!(!dir.path().join("run").exists(), "nothing was prepared");
    }

    #[test]
    fn a_dax_window_is_whole_2_mib_ranges_within_the_stride_or_refused() {
        let mut plan = dummy_plan();
        plan.mem_mib = 128;
        let check = |mib: Option<u32>| {
            let mut p = plan.clone();
            p.dax_window_mib = mib;
            super::super::dax_window(p.dax_window_mib, p.mem_mib).map_err(|e| e.to_string())
        };
        assert_eq!(check(None), Ok(512), "the default, 4 x 128 MiB");
        assert_eq!(check(Some(0)), Ok(0));
        assert_eq!(check(Some(64)), Ok(64));
        let max = super::super::MAX_DAX_WINDOW_MIB;
        assert_eq!(check(Some(max)), Ok(max));
        let odd = check(Some(3)).unwrap_err();
        assert!(
            odd.contains("dax_window_mib: 3 MiB is not a multiple of 2 MiB"),
            "{odd}"
        );
        let over = check(Some(super::super::MAX_DAX_WINDOW_MIB + 2)).unwrap_err();
        assert!(over.contains("is over the"), "{over}");
    }

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

    /// `vm-vmm` as the driver starts it, for a tiny guest (`cli; hlt`) with a virtio-rng:
    /// its log goes to the run directory's `vmm.log`, never to the console; it answers the
    /// metrics query with its device's counters; and the stop detail quotes its log's end.
    #[test]
    fn the_vm_process_logs_to_its_file_and_answers_metrics() {
        let test = "the_vm_process_logs_to_its_file_and_answers_metrics";
        if let Err(e) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
        {
            vm_test_support::skip_line(&format!("SKIP {test}: /dev/kvm unavailable: {e}"));
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let kernel = tmp.path().join("guest.bin");
        std::fs::write(&kernel, [0xfa, 0xf4]).unwrap();
        let run = RunDir::prepare(&tmp.path().join("run"), &[VMM_LOG]).unwrap();
        let log_path = run.path(VMM_LOG);
        let mut cfg = ProcessConfig::new(VmConfig {
            mem_mib: 64,
            kernel,
            kernel_format: KernelFormat::Raw,
            devices: vec![DeviceConfig::Rng],
            ..VmConfig::default()
        });
        cfg.seccomp = true;
        let (child, log) = spawn_vmm(&cfg, &log_path).expect("vm-vmm (built with the workspace)");
        let handle = KvmHandle {
            child,
            log,
            run: std::sync::Mutex::new(run),
            snapshot_dir: None,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let report = loop {
            if let Some(r) = handle.device_metrics() {
                break r;
            }
            assert!(
                std::time::Instant::now() < deadline && handle.is_running(),
                "no metrics reply; log: {:?}",
                handle.vmm_log_tail()
            );
        };
        assert_eq!(report.devices.len(), 1, "{report:?}");
        assert_eq!(report.devices[0].name, "virtio-rng");
        assert_eq!(report.devices[0].errors, 0);
        // It says it reports what it just gave.
        assert!(handle.vmm_log_tail().is_some());
        assert_eq!(
            handle.reports(),
            Reports {
                vmm_log: true,
                device_metrics: true
            }
        );
        handle
            .child
            .with_stdin(vm_vmm_protocol::send_stop)
            .unwrap()
            .unwrap();
        assert!(handle.wait(Duration::from_secs(30)));
        let file = std::fs::read_to_string(&log_path).unwrap();
        assert!(file.contains("exit Ended"), "{file:?}");
        assert!(
            !file.contains('\u{1e}'),
            "a metrics reply in the log: {file:?}"
        );
        assert_eq!(handle.vmm_log_tail().as_deref(), Some(file.as_str()));
        assert!(!handle.console_tail().contains("exit Ended"));
        assert!(
            handle.stop_detail().contains("exit Ended"),
            "{}",
            handle.stop_detail()
        );
        drop(handle);
        assert!(!log_path.exists(), "the run dir's log outlived the VM");
    }

    #[test]
    fn a_stop_detail_quotes_the_end_of_the_log() {
        assert_eq!(with_log_lines("ended".into(), ""), "ended");
        let d = with_log_lines("ended".into(), "a\nb\nc\nd\n");
        assert_eq!(d, r#"ended; its log ends: "b | c | d""#);
        let long = format!("{}\n", "x".repeat(10_000));
        assert!(with_log_lines(String::new(), &long).len() < 600);
    }

    #[test]
    fn a_seccomp_kill_before_the_agent_answered_names_the_program() {
        let e = seccomp_killed("tail".into());
        assert!(
            matches!(&e, DriverError::SeccompKilled { program, console_tail }
                if program == vm_vmm_protocol::BINARY && console_tail == "tail"),
            "{e:?}"
        );
        assert!(e.to_string().contains("SIGSYS"), "{e}");
    }
}

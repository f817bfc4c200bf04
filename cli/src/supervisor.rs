//! The detached supervisor of a `vm run -d` VM.
//!
//! `vm run -d` writes the VM's record (state `starting`, the request to boot) and spawns
//! `vm __supervise NAME` in a new session (setsid) with stdio going to `supervisor.log` in
//! the VM's state directory. The supervisor:
//! 1. records its own pid (+ start time) so later commands can find and signal it;
//! 2. boots the [`MicroVm`] with the VM's state directory as the parent of the driver's run
//!    directory, creates the guest root, and records the agent socket, the VM's host
//!    processes, the driver and labels, then marks the record `running` (which is what
//!    `vm run -d` waits for);
//! 3. holds the VM, refreshing `console.log` (the bounded console tail) every second — and,
//!    for a VM on our own VMM (kvm), `vmm.log` (its log's tail) and `metrics.json` (its
//!    device counters, for `vm stats --json`) —, until
//!    SIGTERM/SIGINT (`vm stop`), the VM's wall lifetime, or the VM exiting by itself;
//!    meanwhile `SIGUSR1` pauses the VM and `SIGUSR2` resumes it (`vm pause`/`vm unpause`),
//!    the record saying `paused` only once every VM process is stopped;
//! 4. closes the VM (agent power-off, then kill), and marks the record `exited` with the
//!    reason. The state directory stays until `vm rm`.
//!
//! A boot failure is recorded as `exited` with the error and its exit code, for `vm run`
//! to report.

use std::path::Path;
use std::time::Duration;

pub use vm_sandbox::state::named::StartRequest;
use vm_sandbox::{MicroVm, Options};
use vm_spec::Trust;

use crate::args::SuperviseArgs;
use crate::exit;
use crate::output::errln;
use crate::state::{ProcId, Record, Runtime, VmState, labels, now_unix};
use crate::stream::{PauseSignals, Signals};

/// The console snapshot file in a VM's state directory.
pub const CONSOLE_LOG: &str = "console.log";
/// The VMM's log snapshot (kvm) in a VM's state directory.
pub const VMM_LOG: &str = "vmm.log";
/// The VMM's device counters (kvm; one JSON object) in a VM's state directory.
pub const METRICS_JSON: &str = "metrics.json";
/// The supervisor's own stdout/stderr.
pub const SUPERVISOR_LOG: &str = "supervisor.log";
/// How long the guest agent may take to answer after the VM starts.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// A `vm serve` VM's server output snapshot in its state directory.
pub const SERVER_LOG: &str = "server.log";

/// Replaces `dir/file` with `text` (write + rename) unless it is `last`, the text written
/// before.
pub fn write_snapshot(dir: &Path, file: &str, text: String, last: &mut String) {
    if text == *last {
        return;
    }
    let tmp = dir.join(format!(".{file}.tmp"));
    if std::fs::write(&tmp, text.as_bytes())
        .and_then(|()| std::fs::rename(&tmp, dir.join(file)))
        .is_ok()
    {
        *last = text;
    }
}

/// The snapshot files of one VM, each with the text last written.
#[derive(Debug, Default)]
pub struct Snapshots {
    console: String,
    vmm_log: String,
    metrics: String,
}

impl Snapshots {
    /// Refreshes [`CONSOLE_LOG`], and where the VM runs on our VMM, [`VMM_LOG`] and
    /// [`METRICS_JSON`] (kept as they were when the VMM no longer answers).
    pub fn refresh(&mut self, dir: &Path, vm: &MicroVm) {
        let m = vm.machine();
        write_snapshot(dir, CONSOLE_LOG, m.console_tail(), &mut self.console);
        if let Some(log) = m.vmm_log_tail() {
            write_snapshot(dir, VMM_LOG, log, &mut self.vmm_log);
        }
        if let Some(json) = m
            .device_metrics()
            .and_then(|r| serde_json::to_string(&r).ok())
        {
            write_snapshot(dir, METRICS_JSON, json, &mut self.metrics);
        }
    }
}

/// Records a booted VM as running: driver, containment, agent socket, host processes and
/// their labels, then saves the record (what `vm run -d` and `vm serve` wait for).
pub fn mark_running(
    rt: &Runtime,
    record: &mut Record,
    vm: &MicroVm,
    trust: Trust,
) -> anyhow::Result<()> {
    record.state = VmState::Running;
    record.started_unix = Some(now_unix());
    record.driver = Some(vm.driver().to_string());
    record.containment = Some(vm.containment().to_string());
    let reports = vm.machine().reports();
    record.vmm_log = reports.vmm_log;
    record.device_metrics = reports.device_metrics;
    record.agent_socket = Some(vm.agent_socket().to_path_buf());
    record.host_pids = vm
        .machine()
        .host_pids()
        .into_iter()
        .filter_map(ProcId::of)
        .collect();
    record
        .labels
        .insert(labels::DRIVER.into(), vm.driver().into());
    record
        .labels
        .insert(labels::CONTAINMENT.into(), vm.containment().to_string());
    if vm.containment() < vm_spec::required(trust) {
        record.labels.insert(labels::EMULATED.into(), "true".into());
    }
    rt.save(record)?;
    Ok(())
}

/// Entry point of `vm __supervise NAME`. Returns 0 when the VM ran and was stopped, else
/// the failure's code (also recorded).
pub async fn run(a: SuperviseArgs) -> anyhow::Result<u8> {
    let rt = Runtime::from_env()?;
    let mut record = rt.load(&a.name)?;
    record.supervisor = ProcId::current();
    rt.save(&record)?;
    let mut signals = Signals::install()?;
    match supervise(&rt, &mut record, &mut signals).await {
        Ok(()) => Ok(exit::OK),
        Err(err) => {
            let code = exit::classify(&err);
            let reason = exit::one_line(&err);
            errln!("vm supervisor: {reason}");
            // A VM that never booted has no console snapshot yet: its last words (the
            // boot error's console tail) are what `vm logs --console NAME` shows.
            let tail = err
                .chain()
                .find_map(|c| c.downcast_ref::<vm_sandbox::SandboxError>())
                .and_then(vm_sandbox::SandboxError::console_tail);
            if let Some(tail) = tail {
                write_snapshot(
                    &rt.dir(&a.name),
                    CONSOLE_LOG,
                    tail.to_string(),
                    &mut String::new(),
                );
            }
            if let Ok(mut r) = rt.load(&a.name) {
                r.state = VmState::Exited;
                r.exited_unix = Some(now_unix());
                r.exit_reason = Some(reason);
                r.error_code = Some(code);
                rt.save(&r)?;
            }
            Ok(code)
        }
    }
}

/// Pauses (`true`) or resumes the VM and records its state; a failure is logged and leaves
/// the record as it was (`vm pause` reports that the VM did not change).
pub fn set_paused(
    rt: &Runtime,
    record: &mut Record,
    vm: &MicroVm,
    pause: bool,
) -> anyhow::Result<()> {
    let (r, state) = if pause {
        (vm.pause(), VmState::Paused)
    } else {
        (vm.resume(), VmState::Running)
    };
    match r {
        Ok(()) => {
            record.state = state;
            rt.save(record)?;
            tracing::info!(name = %record.name, state = state.as_str(), "VM {}", state.as_str());
        }
        Err(e) => errln!("vm supervisor: {}", exit::one_line(&e.into())),
    }
    Ok(())
}

async fn supervise(rt: &Runtime, record: &mut Record, signals: &mut Signals) -> anyhow::Result<()> {
    let req: StartRequest = serde_json::from_value(record.request.clone())?;
    let dir = rt.dir(&record.name);
    let options = Options {
        trust: req.trust,
        policy: req.policy,
        driver: req.driver.clone(),
        name: record.name.clone(),
        boot_timeout: BOOT_TIMEOUT,
        run_dir_parent: Some(dir.clone()),
        dax_window_mib: req.dax_window_mib,
        ..Options::default()
    };
    let start = async {
        match &req.from {
            Some(path) => MicroVm::restore(path.clone(), options).await,
            None => MicroVm::boot(req.spec.clone(), options).await,
        }
    };
    let vm = tokio::select! {
        vm = start => vm?,
        sig = signals.recv() => anyhow::bail!("{sig} while booting; VM not started"),
    };
    crate::cmd::confine_reader(&vm).await?;
    // Creates the guest root (the sandbox does so lazily) and proves the agent works.
    vm.walk("").await?;
    let mut pauses = PauseSignals::install()?;
    record.pausable = true;
    mark_running(rt, record, &vm, req.trust)?;
    tracing::info!(name = %record.name, driver = vm.driver(), "VM running");

    let mut snaps = Snapshots::default();
    let reason = loop {
        snaps.refresh(&dir, &vm);
        if !vm.machine().is_running() {
            break if vm.machine().wall_expired() {
                crate::state::WALL_EXPIRED.to_string()
            } else {
                "the VM exited by itself".to_string()
            };
        }
        tokio::select! {
            sig = signals.recv() => break format!("stopped ({sig})"),
            pause = pauses.recv() => set_paused(rt, record, &vm, pause)?,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    tracing::info!(name = %record.name, %reason, "stopping VM");
    record.state = VmState::Stopping;
    rt.save(record)?;
    vm.close().await;
    snaps.refresh(&dir, &vm);
    record.state = VmState::Exited;
    record.exited_unix = Some(now_unix());
    record.exit_reason = Some(reason);
    rt.save(record)?;
    Ok(())
}

//! `vm run -d --name NAME`: start a long-lived VM held by a detached supervisor, booted, or
//! restored from a snapshot with `--from`.

use std::os::unix::fs::OpenOptionsExt;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use vm_sandbox::Options;
use vm_sys::control::{self, Signal};

use crate::args::RunArgs;
use crate::cmd::from::FromSnapshot;
use crate::dryrun;
use crate::exit;
use crate::output::{errln, outln};
use crate::resolve;
use crate::state::{Record, Runtime, VmState};
use crate::stream::Signals;
use crate::supervisor::{SUPERVISOR_LOG, StartRequest};

/// The last lines of a file, for error messages.
fn tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

/// `vm run -d`.
pub async fn run(a: RunArgs) -> anyhow::Result<u8> {
    if !a.detach {
        return Err(exit::usage(
            "vm run needs -d (a foreground run is `vm exec [OPTIONS] -- CMD`)",
        ));
    }
    let mut signals = Signals::install()?;
    let (spec, trust, policy, from) = match &a.from {
        Some(snapshot) => {
            // The VM is the snapshot's: its shape, environment and user are recorded with it.
            let from = FromSnapshot::open(snapshot, &a.vm, &a.cmd, a.dry.dry_run)?;
            let r = from.resolved;
            (r.spec, r.trust, r.policy, Some(from.path))
        }
        None => {
            let resolved = resolve::flags(&a.vm, &a.cmd).await?;
            if a.dry.dry_run {
                let plan = dryrun::Plan {
                    workdir: a.cmd.workdir.as_deref(),
                    name: Some(&a.name),
                    ..dryrun::Plan::new(&resolved, a.vm.driver.as_deref())
                };
                return dryrun::report(&plan, a.dry.json);
            }
            let resolve::Resolved {
                spec,
                trust,
                policy,
            } = resolved;
            (spec, trust, policy, None)
        }
    };
    // Refuse before anything is created: the same checks the boot runs first.
    resolve::check_workdir(&spec, a.cmd.workdir.as_deref())?;
    let options = Options {
        trust,
        policy,
        driver: a.vm.driver.clone(),
        dax_window_mib: a.vm.dax_window_mib(),
        ..Options::default()
    };
    vm_sandbox::preflight(&spec, &options)?;

    let rt = Runtime::from_env()?;
    let request = StartRequest {
        spec,
        trust,
        policy,
        driver: a.vm.driver.clone(),
        workdir: a.cmd.workdir.clone(),
        from,
        dax_window_mib: a.vm.dax_window_mib(),
    };
    match start_detached(&rt, &a.name, &request, &[], signals.recv()).await? {
        Started::Running => {
            outln!("{}", a.name);
            Ok(exit::OK)
        }
        Started::Interrupted => Ok(exit::INTERRUPTED),
    }
}

/// How [`start_detached`] ended without an error.
#[derive(Debug, PartialEq, Eq)]
pub enum Started {
    /// The VM runs, held by its supervisor.
    Running,
    /// `interrupted` resolved first: what was started is stopped and its record removed.
    Interrupted,
}

/// Starts the named VM `name` as `vm run -d` does: its record (with `labels` added to the base
/// ones), then its detached supervisor, and waits until the VM runs. A boot the supervisor saw
/// fail keeps its record (state exited, the error, the guest's last console lines) for
/// `vm logs --console NAME`, until `vm rm NAME`, as docker keeps a container that failed to
/// start; nothing else of a VM that never started is left behind. Prints nothing (`vm mcp`
/// speaks MCP on stdout).
pub async fn start_detached(
    rt: &Runtime,
    name: &str,
    request: &StartRequest,
    labels: &[(&str, &str)],
    interrupted: impl Future<Output = &'static str>,
) -> anyhow::Result<Started> {
    let mut record = Record::starting(
        name,
        &request.spec.guarantees.limits,
        request.trust,
        serde_json::to_value(request)?,
    );
    for (k, v) in labels {
        record.labels.insert(k.to_string(), v.to_string());
    }
    let dir = rt.create(&record)?;
    match start(rt, name, &dir, interrupted).await {
        Ok(started) => Ok(started),
        Err(e) => {
            let recorded = rt
                .load(name)
                .is_ok_and(|r| r.state == VmState::Exited && r.exit_reason.is_some());
            if recorded {
                errln!(
                    "vm: {name} did not start; `vm logs --console {name}` shows its console, `vm rm {name}` removes it"
                );
            } else if let Err(rm) = rt.remove(name) {
                tracing::warn!("removing {}: {rm}", dir.display());
            }
            Err(e)
        }
    }
}

/// Spawns the supervisor and waits for the record to say running (or failed).
async fn start(
    rt: &Runtime,
    name: &str,
    dir: &std::path::Path,
    interrupted: impl Future<Output = &'static str>,
) -> anyhow::Result<Started> {
    let mut interrupted = std::pin::pin!(interrupted);
    let log_path = dir.join(SUPERVISOR_LOG);
    let log = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let exe = std::env::current_exe().context("locating the vm binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("-v")
        .arg("__supervise")
        .arg(name)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    control::new_session(&mut cmd);
    let mut child = cmd.spawn().context("starting the supervisor")?;
    loop {
        let record = rt.load(name)?;
        match record.state {
            VmState::Running | VmState::Paused => return Ok(Started::Running),
            VmState::Exited | VmState::Stopping => {
                let _ = child.wait();
                let reason = record.exit_reason.unwrap_or_else(|| tail(&log_path, 3));
                let code = record.error_code.unwrap_or(exit::FAILED);
                return Err(exit::Coded {
                    code,
                    message: reason,
                }
                .into());
            }
            VmState::Starting => {}
        }
        if let Some(status) = child.try_wait()? {
            return Err(exit::failed(format!(
                "the supervisor exited ({status}) before the VM was ready: {}",
                tail(&log_path, 3)
            )));
        }
        tokio::select! {
            sig = &mut interrupted => {
                tracing::info!("{sig}: stopping the VM being started");
                terminate(&mut child, Duration::from_secs(10)).await;
                if let Ok(record) = rt.load(name) {
                    crate::state::kill_leftovers(&record);
                }
                rt.remove(name)?;
                return Ok(Started::Interrupted);
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// SIGTERM to the supervisor, then SIGKILL to its process group after `grace`; reaps it.
async fn terminate(child: &mut std::process::Child, grace: Duration) {
    let pid = child.id();
    // Our own unreaped child: the pid cannot have been recycled.
    if let Err(e) = control::signal(pid, Signal::Terminate) {
        tracing::debug!(pid, error = %e, "the supervisor is already gone");
    }
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The child leads its own process group (setsid) and is not reaped yet.
    if let Err(e) = control::signal_group(pid, Signal::Kill) {
        tracing::debug!(pid, error = %e, "the supervisor's group is already gone");
    }
    let _ = child.wait();
}

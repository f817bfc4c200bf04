//! `vm run -d --name NAME`: start a long-lived VM held by a detached supervisor.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use vm_sandbox::Options;

use crate::args::RunArgs;
use crate::dryrun;
use crate::exit;
use crate::resolve;
use crate::state::{Record, Runtime, VmState, labels, now_unix};
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
    let resolved = resolve::flags(&a.vm, &a.cmd)?;
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
    // Refuse before anything is created: the same checks the boot runs first.
    resolve::check_workdir(&spec, a.cmd.workdir.as_deref())?;
    let options = Options {
        trust,
        policy,
        driver: a.vm.driver.clone(),
        ..Options::default()
    };
    vm_sandbox::preflight(&spec, &options)?;

    let rt = Runtime::from_env()?;
    let request = StartRequest {
        spec: spec.clone(),
        trust,
        policy,
        driver: a.vm.driver.clone(),
        workdir: a.cmd.workdir.clone(),
    };
    let mut record_labels = BTreeMap::new();
    record_labels.insert(
        labels::CLI.to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    record_labels.insert(labels::NAME.to_string(), a.name.clone());
    record_labels.insert(labels::TRUST.to_string(), trust.to_string());
    let record = Record {
        version: 1,
        name: a.name.clone(),
        state: VmState::Starting,
        supervisor: None,
        driver: None,
        containment: None,
        created_unix: now_unix(),
        started_unix: None,
        exited_unix: None,
        exit_reason: None,
        error_code: None,
        agent_socket: None,
        host_pids: Vec::new(),
        mem_mib: spec.guarantees.limits.mem_mib,
        vcpus: spec.guarantees.limits.vcpus,
        request: serde_json::to_value(&request)?,
        labels: record_labels,
    };
    let dir = rt.create(&record)?;
    match start(&rt, &a.name, &dir, &mut signals).await {
        Ok(code) => Ok(code),
        Err(e) => {
            // Nothing of a VM that never started is left behind.
            if let Err(rm) = rt.remove(&a.name) {
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
    signals: &mut Signals,
) -> anyhow::Result<u8> {
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
    let new_session = || {
        // SAFETY: setsid(2) has no preconditions; it is async-signal-safe, as required
        // between fork and exec.
        if unsafe { libc::setsid() } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure only calls setsid(2), which is async-signal-safe, and allocates
    // nothing (last_os_error reads errno).
    unsafe { cmd.pre_exec(new_session) };
    let mut child = cmd.spawn().context("starting the supervisor")?;
    loop {
        let record = rt.load(name)?;
        match record.state {
            VmState::Running => {
                println!("{name}");
                return Ok(exit::OK);
            }
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
            sig = signals.recv() => {
                tracing::info!("{sig}: stopping the VM being started");
                terminate(&mut child, Duration::from_secs(10)).await;
                if let Ok(record) = rt.load(name) {
                    crate::state::kill_leftovers(&record);
                }
                rt.remove(name)?;
                return Ok(exit::INTERRUPTED);
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// SIGTERM to the supervisor, then SIGKILL to its process group after `grace`; reaps it.
async fn terminate(child: &mut std::process::Child, grace: Duration) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own unreaped child, so the pid cannot have been recycled.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // SAFETY: the child leads its own process group (setsid) and is not reaped yet.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let _ = child.wait();
}

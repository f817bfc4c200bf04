//! `vm serve -p [IP:]HOSTPORT:GUESTPORT [--ready PATH] [--from SNAPSHOT] -- CMD`: a server in
//! a VM (booted, or restored from a snapshot), published on the host, reported once it answers.
//!
//! The VM gets a record like a `vm run -d` one (named `--name`, else `serve-PID`), held by
//! this process: `vm stop NAME` signals it, `vm logs NAME` reads the server output it
//! snapshots into `server.log` every second (`console.log` beside it), `vm exec NAME` runs
//! commands beside the server. Without `--name` the record is removed when the VM ends.
//! Publishing, readiness and the server's lifecycle are `vm_sandbox::Serving`'s; this module
//! parses, records and prints.

use std::time::Duration;

use vm_sandbox::{MicroVm, Options, PublishSpec, Readiness, ServeError, ServeSpec, Serving};
use vm_spec::Trust;

use crate::args::ServeArgs;
use crate::cmd::from::FromSnapshot;
use crate::dryrun;
use crate::exit;
use crate::output::{errln, outln};
use crate::resolve;
use crate::state::{ProcId, Record, Runtime, VmState, labels, now_unix};
use crate::stream::{self, PauseSignals, Signals};
use crate::supervisor::{self, SERVER_LOG, StartRequest};

/// Lines of the console and of the server output shown when the server is not ready.
const FAILURE_TAIL_LINES: usize = 20;

/// `vm serve`.
pub async fn run(a: ServeArgs) -> anyhow::Result<u8> {
    if a.cmd.workdir.is_some() {
        return Err(exit::usage(
            "-w does not apply to vm serve (the server runs in the guest root)",
        ));
    }
    let publish = PublishSpec::parse_all(&a.publish)?;
    let signals = Signals::install()?;
    let (spec, trust, policy, from) = match &a.from {
        Some(snapshot) => {
            // The VM is the snapshot's: its shape, environment and user are recorded with it.
            let from = FromSnapshot::open(snapshot, &a.vm, &a.cmd, a.dry.dry_run)?;
            // A snapshot taken serving (`vm snapshot create -p`) holds its server: without a
            // command, that one is published.
            let served = from.serving.filter(|_| a.command.is_empty());
            if served.is_none() {
                resolve::require_command(&from.resolved.spec, &a.command)?;
            }
            let r = from.resolved;
            (r.spec, r.trust, r.policy, Some((from.path, served)))
        }
        None => {
            let resolved = resolve::flags(&a.vm, &a.cmd).await?;
            resolve::require_command(&resolved.spec, &a.command)?;
            if a.dry.dry_run {
                let plan = dryrun::Plan {
                    command: Some(&a.command),
                    publish: Some(publish.iter().map(|p| p.to_string()).collect()),
                    name: a.name.as_deref(),
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
    let options = Options {
        trust,
        policy,
        driver: a.vm.driver.clone(),
        dax_window_mib: a.vm.dax_window_mib(),
        ..Options::default()
    };
    vm_sandbox::preflight(&spec, &options)?;

    let rt = Runtime::from_env()?;
    let keep = a.name.is_some();
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| format!("serve-{}", std::process::id()));
    let request = StartRequest {
        spec: spec.clone(),
        trust,
        policy,
        driver: a.vm.driver.clone(),
        workdir: None,
        from: from.as_ref().map(|(path, _)| path.clone()),
        dax_window_mib: a.vm.dax_window_mib(),
    };
    let mut record = Record::starting(
        &name,
        &spec.guarantees.limits,
        trust,
        serde_json::to_value(&request)?,
    );
    record.supervisor = ProcId::current();
    if !keep {
        record
            .labels
            .insert(labels::EPHEMERAL.into(), "true".into());
    }
    let dir = rt.create(&record)?;
    let options = Options {
        name: name.clone(),
        run_dir_parent: Some(dir),
        ..options
    };
    let mut session = Session {
        rt: &rt,
        record,
        args: &a,
        trust,
        signals,
    };
    let start = match from {
        Some((path, served)) => Start::Restore(path, served),
        None => Start::Boot(Box::new(spec)),
    };
    let result = session.boot_and_serve(start, options, publish).await;
    let (code, reason) = match &result {
        Ok((code, reason)) => (*code, reason.clone()),
        Err(e) => (exit::classify(e), exit::one_line(e)),
    };
    let mut record = session.record;
    record.state = VmState::Exited;
    record.exited_unix = Some(now_unix());
    record.exit_reason = Some(reason);
    if code != exit::OK && code != exit::INTERRUPTED {
        record.error_code = Some(code);
    }
    let saved = match keep {
        true => rt.save(&record),
        false => rt.remove(&name),
    };
    if let Err(e) = saved {
        tracing::warn!("recording the end of {name}: {e}");
    }
    result.map(|(code, _)| code)
}

/// How the server's VM starts: booted from the spec, or restored from a snapshot (`--from`),
/// with the server the snapshot holds when it is the one to publish.
enum Start {
    Boot(Box<vm_spec::Spec>),
    Restore(std::path::PathBuf, Option<vm_sandbox::ServedProcess>),
}

/// One `vm serve` run: its record (held by this process) and what it was asked.
struct Session<'a> {
    rt: &'a Runtime,
    record: Record,
    args: &'a ServeArgs,
    trust: Trust,
    signals: Signals,
}

impl Session<'_> {
    /// Boots, serves, waits for readiness, then holds the server until a signal or its
    /// exit. Returns the exit code and the reason recorded.
    async fn boot_and_serve(
        &mut self,
        start: Start,
        options: Options,
        publish: Vec<PublishSpec>,
    ) -> anyhow::Result<(u8, String)> {
        let served = match &start {
            Start::Restore(_, served) => served.clone(),
            Start::Boot(_) => None,
        };
        let started = async {
            match start {
                Start::Boot(spec) => MicroVm::boot(*spec, options).await,
                Start::Restore(path, _) => MicroVm::restore(path, options).await,
            }
        };
        let vm = tokio::select! {
            vm = started => vm?,
            sig = self.signals.recv() => {
                return Ok((exit::INTERRUPTED, format!("{sig} while booting")));
            }
        };
        crate::cmd::confine_reader(&vm).await?;
        let argv = self.args.command.clone();
        let serving = match &served {
            Some(served) => vm.attach_served(served, &publish).await,
            None => vm.serve(ServeSpec { argv, publish }).await,
        };
        let serving = match serving {
            Ok(s) => s,
            Err(e) => {
                vm.close().await;
                return Err(e.into());
            }
        };
        let outcome = self.hold(&vm, &serving).await;
        if let Err(e) = serving.stop().await {
            tracing::warn!("stopping the server: {e}");
        }
        let dir = self.rt.dir(&self.record.name);
        supervisor::write_snapshot(&dir, SERVER_LOG, serving.output(), &mut String::new());
        vm.close().await;
        supervisor::Snapshots::default().refresh(&dir, &vm);
        outcome
    }

    /// Waits until ready, records and prints the URLs, then holds the server.
    async fn hold(&mut self, vm: &MicroVm, serving: &Serving) -> anyhow::Result<(u8, String)> {
        let ready = Readiness {
            http_path: self.args.ready.clone(),
            timeout: self.args.ready_timeout,
        };
        let urls: Vec<String> = serving.published().iter().map(|p| p.url()).collect();
        let name = self.record.name.clone();
        // From here `vm logs NAME` shows the server's output, already while it starts.
        self.record
            .labels
            .insert(labels::SERVE.into(), urls.join(" "));
        self.rt.save(&self.record)?;
        let dir = self.rt.dir(&name);
        let (mut snaps, mut output) = (supervisor::Snapshots::default(), String::new());
        let waiting = serving.wait_ready(&ready);
        tokio::pin!(waiting);
        let waited = loop {
            snaps.refresh(&dir, vm);
            supervisor::write_snapshot(&dir, SERVER_LOG, serving.output(), &mut output);
            tokio::select! {
                r = &mut waiting => break r,
                sig = self.signals.recv() => {
                    return Ok((exit::INTERRUPTED, format!("stopped ({sig}) before ready")));
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        };
        if let Err(e) = waited {
            return Ok(not_ready(vm, serving, e));
        }
        let mut pauses = PauseSignals::install()?;
        self.record.pausable = true;
        supervisor::mark_running(self.rt, &mut self.record, vm, self.trust)?;
        for url in &urls {
            outln!("{url}");
        }
        let shown = serving.argv().join(" ");
        errln!(
            "vm: serving {shown} as {name} on {} ({} driver); Ctrl-C or `vm stop {name}` stops it",
            urls.join(" "),
            vm.driver(),
        );
        loop {
            snaps.refresh(&dir, vm);
            supervisor::write_snapshot(&dir, SERVER_LOG, serving.output(), &mut output);
            tokio::select! {
                sig = self.signals.recv() => {
                    tracing::info!("{sig}: stopping the server");
                    return Ok((exit::INTERRUPTED, format!("stopped ({sig})")));
                }
                () = serving.done() => return Ok(server_ended(vm, serving)),
                pause = pauses.recv() => supervisor::set_paused(self.rt, &mut self.record, vm, pause)?,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

/// The server stopped on its own: say how, exit with its code.
fn server_ended(vm: &MicroVm, serving: &Serving) -> (u8, String) {
    let tail = last_lines(&serving.output(), 5).join(" | ");
    match serving.exit() {
        Some(status) => {
            let how = vm_sandbox::describe_exit(&Some(status));
            errln!("vm: the server exited ({how}): {tail}");
            (
                stream::status_code(&status),
                format!("the server exited ({how})"),
            )
        }
        None if vm.machine().wall_expired() => {
            errln!("vm: the VM's wall lifetime expired");
            (exit::TIMEOUT, crate::state::WALL_EXPIRED.into())
        }
        None => {
            errln!("vm: the server stopped: {tail}");
            (exit::FAILED, "the server stopped".into())
        }
    }
}

/// The server never became ready: the reason, the console tail and the server-output tail
/// on stderr; the server's own code when it exited non-zero, else FAILED.
fn not_ready(vm: &MicroVm, serving: &Serving, e: ServeError) -> (u8, String) {
    let code = match &e {
        ServeError::ExitedEarly {
            status: Some(status),
        } if !status.success() => stream::status_code(status),
        _ => exit::FAILED,
    };
    let reason = exit::one_line(&anyhow::Error::new(e));
    errln!("vm: {reason}");
    errln!("vm: --- console (last {FAILURE_TAIL_LINES} lines) ---");
    for l in last_lines(&vm.machine().console_tail(), FAILURE_TAIL_LINES) {
        errln!("{l}");
    }
    errln!("vm: --- server output (last {FAILURE_TAIL_LINES} lines) ---");
    for l in last_lines(&serving.output(), FAILURE_TAIL_LINES) {
        errln!("{l}");
    }
    (code, reason)
}

/// The last `n` non-empty lines of `text`.
fn last_lines(text: &str, n: usize) -> Vec<&str> {
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(n)..].to_vec()
}

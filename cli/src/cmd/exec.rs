//! `vm exec`: boot a VM, run one command with its output streamed, tear the VM down; or,
//! with a NAME, run the command in that running VM.

use std::time::Duration;

use vm_sandbox::agent::Command;
use vm_sandbox::{MicroVm, Options, Run};

use crate::args::ExecArgs;
use crate::dryrun;
use crate::exit;
use crate::interactive::{self, Mode};
use crate::parse;
use crate::resolve;
use crate::state::Runtime;
use crate::state::named::NamedVm;
use crate::stream::{self, Signals};

fn mode(a: &ExecArgs) -> Mode {
    Mode {
        stdin: a.interactive,
        tty: a.tty,
    }
}

/// Runs `run` with its output streamed: through an interactive exec with `-i`/`-t`, else
/// with an empty stdin.
async fn relay(
    vm: &vm_sandbox::Guest,
    mut run: Run,
    mode: Mode,
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    if !mode.any() {
        return stream::relay_stream(async { Ok(vm.exec_stream(run).await?) }, signals).await;
    }
    let tty = mode.terminal()?;
    for (k, v) in mode.env() {
        if !run.env.iter().any(|(ek, _)| *ek == k) {
            run.env.push((k, v));
        }
    }
    let start = async { Ok(vm.exec_interactive(run, tty).await?) };
    interactive::relay_interactive(start, signals, mode).await
}

/// `vm exec`.
pub async fn run(a: ExecArgs) -> anyhow::Result<u8> {
    match (a.name.clone(), a.from.clone()) {
        (Some(name), _) => in_named(a, name).await,
        (None, Some(from)) => restore_and_exec(a, from).await,
        (None, None) => boot_and_exec(a).await,
    }
}

/// `vm exec --from SNAPSHOT -- CMD`: restore, run the command as in a named VM (`-e`, `-w`,
/// `--user` apply to it, `--timeout` bounds it), tear the VM down.
async fn restore_and_exec(a: ExecArgs, from: String) -> anyhow::Result<u8> {
    crate::cmd::from::refuse_shaping_flags(&a.vm, a.dry.dry_run)?;
    if a.command.is_empty() {
        return Err(exit::usage(format!(
            "vm exec --from {from} needs a command after --"
        )));
    }
    if a.vm.timeout.is_some_and(|t| t.is_zero()) {
        return Err(exit::usage(
            "--timeout: 0 refused; give a positive duration, or none",
        ));
    }
    mode(&a).terminal()?;
    let mut signals = Signals::install()?;
    let name = format!("exec-{}", std::process::id());
    let vm = tokio::select! {
        vm = crate::cmd::from::restore(&from, &a.vm, name) => vm?,
        sig = signals.recv() => {
            tracing::info!("{sig} while restoring");
            return Ok(exit::INTERRUPTED);
        }
    };
    crate::cmd::confine_reader(&vm).await?;
    let run = Run {
        command: Command::Argv(a.command.clone()),
        cwd: a.cmd.workdir.clone(),
        timeout: a.vm.timeout,
        env: resolve::env(&a.cmd.env),
        env_allow: a.cmd.env_allow.clone(),
        user: a.cmd.user.clone(),
        ..Default::default()
    };
    let result = relay(&vm, run, mode(&a), &mut signals).await;
    vm.close().await;
    result
}

/// Flags that configure a VM to boot, which mean nothing for an existing one: the ones that
/// shape it (as for a restore) and the ones that choose and admit its driver.
fn boot_flags_given(a: &ExecArgs) -> Vec<&'static str> {
    let v = &a.vm;
    let mut given = crate::cmd::from::shaping_flags_given(v, a.dry.dry_run);
    if v.driver.is_some() {
        given.push("--driver");
    }
    if v.trust != crate::args::TrustArg::Untrusted {
        given.push("--trust");
    }
    if v.allow_emulation {
        given.push("--allow-emulation");
    }
    given
}

/// `vm exec NAME -- CMD`: the command runs in the named VM with the VM's environment plus
/// `-e`, in `-w` (else the VM's default directory, else the image's working directory, else
/// its root), as `--user` (else the VM's user); `--timeout` bounds the command.
async fn in_named(a: ExecArgs, name: String) -> anyhow::Result<u8> {
    let name = parse::vm_name(&name).map_err(|e| exit::usage(e.to_string()))?;
    if a.command.is_empty() {
        return Err(exit::usage(format!(
            "vm exec {name} needs a command after -- (an image's Entrypoint + Cmd runs only when a VM boots)"
        )));
    }
    let given = boot_flags_given(&a);
    if !given.is_empty() {
        return Err(exit::usage(format!(
            "{} configure a VM to boot; {name} is already running (only -e, -w, --user and --timeout apply)",
            given.join(", ")
        )));
    }
    // A booting exec has this refused by the spec (`guarantees.limits.wall_ms`); here it
    // bounds the command alone, which a zero would kill before it ran.
    if a.vm.timeout.is_some_and(|t| t.is_zero()) {
        return Err(exit::usage(
            "--timeout: 0 refused; give a positive duration, or none",
        ));
    }
    mode(&a).terminal()?;
    let mut signals = Signals::install()?;
    let rt = Runtime::from_env()?;
    // From here on this process starts nothing: only sockets, its records and the guest.
    vm_sandbox::confine_reader()?;
    let vm = NamedVm::attach(&rt, &name)?;
    let run = Run {
        command: Command::Argv(a.command.clone()),
        cwd: a.cmd.workdir.clone().or(vm.request().workdir.clone()),
        timeout: a.vm.timeout,
        env: resolve::env(&a.cmd.env),
        env_allow: a.cmd.env_allow.clone(),
        user: a.cmd.user.clone(),
        ..Default::default()
    };
    relay(&vm, run, mode(&a), &mut signals).await
}

/// `vm exec [OPTIONS] -- CMD`.
async fn boot_and_exec(a: ExecArgs) -> anyhow::Result<u8> {
    let mut signals = Signals::install()?;
    let mut resolved = resolve::flags(&a.vm, &a.cmd).await?;
    resolve::require_command(&resolved.spec, &a.command)?;
    // `-t` passes TERM (unless -e set it): in the spec, so --dry-run shows it.
    let env = &mut resolved.spec.guarantees.env;
    for (k, v) in mode(&a).env() {
        if !env.iter().any(|(ek, _)| *ek == k) {
            env.push((k, v));
        }
    }
    if a.dry.dry_run {
        let plan = dryrun::Plan {
            command: Some(&a.command),
            workdir: a.cmd.workdir.as_deref(),
            ..dryrun::Plan::new(&resolved, a.vm.driver.as_deref())
        };
        return dryrun::report(&plan, a.dry.json);
    }
    let resolve::Resolved {
        spec,
        trust,
        policy,
    } = resolved;
    resolve::check_workdir(&spec, a.cmd.workdir.as_deref())?;
    mode(&a).terminal()?;
    let options = Options {
        trust,
        policy,
        driver: a.vm.driver.clone(),
        name: format!("exec-{}", std::process::id()),
        run_dir_parent: Some(crate::state::Runtime::from_env()?.ephemeral_parent()),
        dax_window_mib: a.vm.dax_window_mib(),
        ..Options::default()
    };
    let vm = tokio::select! {
        vm = MicroVm::boot(spec, options) => vm?,
        sig = signals.recv() => {
            tracing::info!("{sig} while booting");
            return Ok(exit::INTERRUPTED);
        }
    };
    tracing::info!(driver = vm.driver(), containment = %vm.containment(), "VM booted");
    crate::cmd::confine_reader(&vm).await?;
    let run = Run {
        command: Command::Argv(a.command.clone()),
        cwd: a.cmd.workdir.clone(),
        timeout: a.vm.timeout,
        ..Default::default()
    };
    let result = relay(&vm, run, mode(&a), &mut signals).await;
    let expired = vm.machine().wall_expired();
    vm.close().await;
    match result {
        Err(_) if expired => Err(exit::Coded {
            code: exit::TIMEOUT,
            message: format!(
                "the VM's wall lifetime ({}) expired",
                parse::fmt_duration(a.vm.timeout.unwrap_or(Duration::ZERO))
            ),
        }
        .into()),
        other => other,
    }
}

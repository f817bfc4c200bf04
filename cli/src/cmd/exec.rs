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
    match a.name.clone() {
        Some(name) => in_named(a, name).await,
        None => boot_and_exec(a).await,
    }
}

/// Flags that configure a VM to boot, which mean nothing for an existing one.
fn boot_flags_given(a: &ExecArgs) -> Vec<&'static str> {
    let v = &a.vm;
    let mut given = Vec::new();
    let mut check = |on: bool, flag| {
        if on {
            given.push(flag);
        }
    };
    check(v.memory.is_some(), "--memory");
    check(v.cpus.is_some(), "--cpus");
    check(v.pids.is_some(), "--pids");
    check(!v.volumes.is_empty(), "-v");
    check(v.kernel.is_some(), "--kernel");
    check(v.initrd.is_some(), "--initrd");
    check(v.rootfs.is_some(), "--rootfs");
    check(v.image.is_some(), "--image");
    check(v.driver.is_some(), "--driver");
    check(v.trust != crate::args::TrustArg::Untrusted, "--trust");
    check(v.allow_emulation, "--allow-emulation");
    check(a.dry.dry_run, "--dry-run");
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

//! `vm snapshot create|ls|rm`. A restore (`--from`) is [`super::from`]'s.

use std::time::Duration;

use serde_json::json;
use vm_sandbox::agent::Command;
use vm_sandbox::{
    MicroVm, Options, PublishSpec, Readiness, Run, ServeSpec, Serving, SnapshotStore,
};

use crate::args::{SnapshotCommand, SnapshotCreateArgs};
use crate::exit;
use crate::output::{Table, errln, outln, print_json, print_table};
use crate::resolve;
use crate::stream::{self, Signals};

/// Runs a snapshot subcommand.
pub async fn run(cmd: SnapshotCommand) -> anyhow::Result<u8> {
    let store = SnapshotStore::default_location()?;
    match cmd {
        SnapshotCommand::Create(a) => create(&store, &a).await,
        SnapshotCommand::Ls { json } => ls(&store, json),
        SnapshotCommand::Rm { names } => {
            for n in &names {
                store.remove(n)?;
                outln!("{n}");
            }
            Ok(exit::OK)
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}M", bytes as f64 / f64::from(1 << 20))
}

/// `vm snapshot create NAME [OPTIONS] [-p GUESTPORT [--ready PATH]] [-- CMD]`.
async fn create(store: &SnapshotStore, a: &SnapshotCreateArgs) -> anyhow::Result<u8> {
    let (name, vm, cmd) = (a.name.as_str(), &a.vm, &a.cmd);
    let path = store.path(name)?;
    if path.exists() {
        return Err(exit::usage(format!(
            "snapshot {name} exists ({}): `vm snapshot rm {name}` first",
            path.display()
        )));
    }
    let mut signals = Signals::install()?;
    let resolve::Resolved {
        spec,
        trust,
        policy,
    } = resolve::flags(vm, cmd).await?;
    let options = Options {
        trust,
        policy,
        driver: vm.driver.clone(),
        name: format!("snapshot-{name}"),
        run_dir_parent: Some(crate::state::Runtime::from_env()?.ephemeral_parent()),
        snapshots: Some(store.dir().to_path_buf()),
        dax_window_mib: vm.dax_window_mib(),
        ..Options::default()
    };
    let booted = tokio::select! {
        vm = MicroVm::boot(spec, options) => vm?,
        sig = signals.recv() => {
            tracing::info!("{sig} while booting");
            return Ok(exit::INTERRUPTED);
        }
    };
    let serving = if a.ports.is_empty() {
        if !a.command.is_empty() {
            let code = warm_up(&booted, a, &mut signals).await?;
            if code != exit::OK {
                booted.close().await;
                return Err(exit::failed(format!(
                    "the warm-up command exited {code}: no snapshot written"
                )));
            }
        }
        None
    } else {
        match serve_until_ready(&booted, a, &mut signals).await {
            Ok(Some(s)) => Some(s),
            Ok(None) => {
                booted.close().await;
                return Ok(exit::INTERRUPTED);
            }
            Err(e) => {
                booted.close().await;
                return Err(e);
            }
        }
    };
    let r = match &serving {
        Some(s) => booted.snapshot_serving(&path, s).await,
        None => booted.snapshot(&path).await,
    };
    booted.close().await;
    let r = r?;
    errln!(
        "snapshot {name}: {} of memory ({} written), state {} bytes, written in {} ms; restore with `vm exec --from {name} -- CMD`",
        mib(r.memory_bytes),
        mib(r.memory_written),
        r.state_bytes,
        r.took_us / 1000
    );
    if let Some(served) = &r.serving {
        errln!(
            "snapshot {name}: serving {} on guest port(s) {:?}; publish it with `vm serve --from {name} -p HOSTPORT:GUESTPORT`",
            served.argv.join(" "),
            served.guest_ports
        );
    }
    outln!("{name}");
    Ok(exit::OK)
}

/// Runs the warm-up command to its end, streaming its output; returns its exit code.
async fn warm_up(
    vm: &MicroVm,
    a: &SnapshotCreateArgs,
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    let run = Run {
        command: Command::Argv(a.command.clone()),
        cwd: a.cmd.workdir.clone(),
        ..Default::default()
    };
    stream::relay_stream(async { Ok(vm.exec_stream(run).await?) }, signals).await
}

/// `-p`: starts the server (CMD, else the image's Entrypoint + Cmd) and waits until every
/// port accepts and `--ready` answers. `None` when a signal came first.
async fn serve_until_ready(
    vm: &MicroVm,
    a: &SnapshotCreateArgs,
    signals: &mut Signals,
) -> anyhow::Result<Option<Serving>> {
    // The host side of these ports is never used: a loopback port the kernel picks.
    let publish = a
        .ports
        .iter()
        .map(|p| PublishSpec::loopback(0, *p))
        .collect();
    let serving = vm
        .serve(ServeSpec {
            argv: a.command.clone(),
            publish,
        })
        .await?;
    let ready = Readiness {
        http_path: a.ready.clone(),
        timeout: a.ready_timeout,
    };
    let waited = tokio::select! {
        r = serving.wait_ready(&ready) => r,
        sig = signals.recv() => {
            tracing::info!("{sig} before the server was ready");
            let _ = serving.stop().await;
            return Ok(None);
        }
    };
    if let Err(e) = waited {
        let output = serving.output();
        let _ = serving.stop().await;
        let tail: Vec<&str> = output.lines().rev().take(5).collect();
        for l in tail.into_iter().rev() {
            errln!("{l}");
        }
        return Err(exit::failed(format!("{e}: no snapshot written")));
    }
    Ok(Some(serving))
}

fn ls(store: &SnapshotStore, json: bool) -> anyhow::Result<u8> {
    let listed = store.list()?;
    if json {
        let list: Vec<_> = listed
            .iter()
            .map(|l| match &l.record {
                Ok(r) => json!({
                    "name": l.name,
                    "driver": r.driver,
                    "created_unix_secs": r.created_unix_secs,
                    "memory_bytes": r.memory_bytes,
                    "disk_bytes": l.disk_bytes,
                    "serving": r.serving,
                    "spec": r.spec,
                }),
                Err(e) => json!({
                    "name": l.name,
                    "error": vm_error_chain::error_chain(e),
                }),
            })
            .collect();
        print_json(&serde_json::Value::Array(list))?;
        return Ok(exit::OK);
    }
    let mut t = Table::new(&["NAME", "DRIVER", "MEMORY", "ON DISK", "AGE", "IMAGE"]);
    for l in &listed {
        let row = match &l.record {
            Ok(r) => vec![
                l.name.clone(),
                r.driver.clone(),
                mib(r.memory_bytes),
                mib(l.disk_bytes),
                age(r.created_unix_secs),
                r.spec
                    .image
                    .source
                    .as_ref()
                    .map_or_else(|| "built-in".into(), |s| s.reference.clone()),
            ],
            Err(e) => vec![
                l.name.clone(),
                "?".into(),
                "-".into(),
                mib(l.disk_bytes),
                "-".into(),
                format!("unreadable: {}", vm_error_chain::error_chain(e)),
            ],
        };
        t.row(row);
    }
    print_table(&t)?;
    Ok(exit::OK)
}

fn age(created: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    crate::parse::fmt_duration(Duration::from_secs(now.saturating_sub(created)))
}

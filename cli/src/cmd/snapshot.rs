//! `vm snapshot create|ls|rm`, and the restore behind `vm exec --from`.

use std::time::{Duration, Instant};

use serde_json::json;
use vm_sandbox::agent::Command;
use vm_sandbox::{MicroVm, Options, Run, SnapshotStore};

use crate::args::{CmdOpts, SnapshotCommand, VmOpts};
use crate::exit;
use crate::output::{Table, errln, outln, print_json, print_table};
use crate::resolve;
use crate::stream::{self, Signals};

/// Runs a snapshot subcommand.
pub async fn run(cmd: SnapshotCommand) -> anyhow::Result<u8> {
    let store = SnapshotStore::default_location()?;
    match cmd {
        SnapshotCommand::Create(a) => create(&store, &a.name, &a.vm, &a.cmd, a.command).await,
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

/// `vm snapshot create NAME [OPTIONS] [-- CMD]`.
async fn create(
    store: &SnapshotStore,
    name: &str,
    vm: &VmOpts,
    cmd: &CmdOpts,
    warmup: Vec<String>,
) -> anyhow::Result<u8> {
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
        ..Options::default()
    };
    let booted = tokio::select! {
        vm = MicroVm::boot(spec, options) => vm?,
        sig = signals.recv() => {
            tracing::info!("{sig} while booting");
            return Ok(exit::INTERRUPTED);
        }
    };
    if !warmup.is_empty() {
        let run = Run {
            command: Command::Argv(warmup),
            cwd: cmd.workdir.clone(),
            ..Default::default()
        };
        let code = stream::relay_stream(async { Ok(booted.exec_stream(run).await?) }, &mut signals)
            .await?;
        if code != exit::OK {
            booted.close().await;
            return Err(exit::failed(format!(
                "the warm-up command exited {code}: no snapshot written"
            )));
        }
    }
    let r = booted.snapshot(&path).await;
    booted.close().await;
    let r = r?;
    errln!(
        "snapshot {name}: {} of memory ({} written), state {} bytes, written in {} ms; restore with `vm exec --from {name} -- CMD`",
        mib(r.memory_bytes),
        mib(r.memory_written),
        r.state_bytes,
        r.took_us / 1000
    );
    outln!("{name}");
    Ok(exit::OK)
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
                format!("unreadable: {e}"),
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

/// The flags given that shape a VM (its memory, CPUs, mounts, image), and `--dry-run`.
pub fn shaping_flags_given(v: &VmOpts, dry_run: bool) -> Vec<&'static str> {
    let checks = [
        (v.memory.is_some(), "--memory"),
        (v.cpus.is_some(), "--cpus"),
        (v.pids.is_some(), "--pids"),
        (!v.volumes.is_empty(), "-v"),
        (!v.allow_mount_secret.is_empty(), "--allow-mount-secret"),
        (v.kernel.is_some(), "--kernel"),
        (v.initrd.is_some(), "--initrd"),
        (v.rootfs.is_some(), "--rootfs"),
        (v.image.is_some(), "--image"),
        (dry_run, "--dry-run"),
    ];
    checks
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, f)| f)
        .collect()
}

/// The flags that shape a VM, which a restore takes from its snapshot: refused by name.
pub fn refuse_shaping_flags(v: &VmOpts, dry_run: bool) -> anyhow::Result<()> {
    let given = shaping_flags_given(v, dry_run);
    if given.is_empty() {
        return Ok(());
    }
    Err(exit::usage(format!(
        "{} refused with --from: a restored VM has the snapshot's memory, CPUs, mounts and image (see `vm snapshot ls --json`)",
        given.join(", ")
    )))
}

/// A snapshot a `--from` start restores: where it is and what it recorded (the spec the VM
/// will run under, which `vm run -d` records and `vm serve` reads the default command from).
pub struct OpenedSnapshot {
    pub path: std::path::PathBuf,
    pub record: vm_sandbox::SnapshotRecord,
}

/// Finds the snapshot `name` and reads its record (a missing, unreadable or other-version
/// snapshot is refused here, before anything is created).
pub fn open(name: &str) -> anyhow::Result<OpenedSnapshot> {
    let path = SnapshotStore::default_location()?.existing(name)?;
    let record = vm_sandbox::snapshots::read_record(&path)?;
    Ok(OpenedSnapshot { path, record })
}

/// The options of `vm run -d`/`vm serve` that would configure a restored VM's processes (its
/// environment and user are the snapshot's): refused by name, pointing at `vm exec NAME`.
pub fn refuse_env_flags(c: &CmdOpts) -> anyhow::Result<()> {
    let given: Vec<&str> = [
        (!c.env.is_empty(), "-e"),
        (!c.env_allow.is_empty(), "--env-allow"),
        (c.user.is_some(), "--user"),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, f)| f)
    .collect();
    if given.is_empty() {
        return Ok(());
    }
    Err(exit::usage(format!(
        "{} refused with --from: a restored VM has the snapshot's environment and user (give them to `vm exec NAME` per command)",
        given.join(", ")
    )))
}

/// The options a restore runs under: the admission the flags ask for (`--trust`,
/// `--allow-emulation`, `--driver`: a restore still passes the gate).
pub fn restore_options(v: &VmOpts, vm_name: String) -> anyhow::Result<Options> {
    Ok(Options {
        trust: v.trust.into(),
        policy: resolve::policy(v),
        driver: v.driver.clone(),
        name: vm_name,
        run_dir_parent: Some(crate::state::Runtime::from_env()?.ephemeral_parent()),
        ..Options::default()
    })
}

/// Restores the snapshot `name` with the admission the flags ask for (`--trust`,
/// `--allow-emulation`, `--driver`: a restore still passes the gate).
pub async fn restore(name: &str, v: &VmOpts, vm_name: String) -> anyhow::Result<MicroVm> {
    let path = SnapshotStore::default_location()?.existing(name)?;
    let options = restore_options(v, vm_name)?;
    let start = Instant::now();
    let vm = MicroVm::restore(path, options).await?;
    tracing::info!(
        snapshot = name,
        took_ms = start.elapsed().as_millis() as u64,
        "VM restored"
    );
    Ok(vm)
}

//! The `--from SNAPSHOT` start that `vm exec`, `vm run -d` and `vm serve` share: the flags
//! a snapshot fixes refused by name, the snapshot opened and its record read, and the restore
//! run under the admission the flags ask for. Writing and listing snapshots is
//! [`super::snapshot`]'s.

use std::time::Instant;

use vm_sandbox::{MicroVm, Options, SnapshotStore};

use crate::args::{CmdOpts, VmOpts};
use crate::exit;
use crate::resolve;

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

/// A `--from SNAPSHOT` start of `vm run -d` or `vm serve`: the flags that a snapshot fixes
/// refused by name, the snapshot opened, and what the VM runs under (its spec the
/// snapshot's, the admission the flags'), before anything is created.
pub struct FromSnapshot {
    pub resolved: resolve::Resolved,
    pub path: std::path::PathBuf,
    /// The server the snapshot was taken with (`vm snapshot create -p`), if any.
    pub serving: Option<vm_sandbox::ServedProcess>,
}

impl FromSnapshot {
    pub fn open(name: &str, v: &VmOpts, c: &CmdOpts, dry_run: bool) -> anyhow::Result<Self> {
        refuse_shaping_flags(v, dry_run)?;
        refuse_env_flags(c)?;
        // A missing, unreadable or other-version snapshot is refused here.
        let path = SnapshotStore::default_location()?.existing(name)?;
        let record = vm_sandbox::snapshots::read_record(&path)?;
        Ok(FromSnapshot {
            resolved: resolve::Resolved {
                spec: record.spec,
                trust: v.trust.into(),
                policy: resolve::policy(v),
            },
            path,
            serving: record.serving,
        })
    }
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

//! Snapshots of microVMs: [`MicroVm::snapshot`] and [`MicroVm::restore`], and the named store
//! `vm snapshot` keeps them in ([`SnapshotStore`], `<cache home>/vm/snapshots/NAME/`).
//!
//! A snapshot directory (0700) holds what the driver wrote (for kvm: `vmstate` and `memory`,
//! `vmm::snapshot`), the snapshot's agent token ([`TOKEN_FILE`], 0600) and the record
//! ([`RECORD_FILE`], 0600): the spec the VM ran under, its driver, and the identity (path,
//! size, mtime) of every read-only disk it had, the image root included. It is staged in a
//! private directory made at boot ([`crate::Options::snapshots`]) and renamed into place
//! once complete, so a listed snapshot is never half written.
//!
//! A restore is a new VM under the snapshot's own spec: its memory, CPUs, mounts, environment
//! and wall limit are the snapshot's (a restore takes no spec, so it cannot ask for more), its
//! driver is the one that took it (a restore on another one is refused by name), and each
//! disk must be the very file the snapshot saw, unchanged: the mounts are prepared again (a
//! directory's erofs is found by its content key, so a changed directory yields another file)
//! and every disk's path, size and mtime are compared with the record, naming the mount that
//! differs. The restored VM gets a new run directory, sockets and agent token (see
//! `vm_drivers::snapshot`).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use vm_drivers::{BlockDevice, Registry, RestoreFrom, ShareKind, SharePlan};
use vm_spec::{Spec, ValidSpec};
use vm_sync::Lock;

use vm_agent_protocol::token::TokenError;

use crate::error::SandboxError;
use crate::microvm::{MicroVm, Options, Prepared, private_dir};
use crate::select::select;
use crate::serving::{ServedProcess, Serving};
pub use crate::snapshot_files::{OpenSnapshot, read_record};

/// The record of a snapshot, inside its directory.
pub const RECORD_FILE: &str = "snapshot.json";
/// The snapshot's agent token (hex), inside its directory: a restore presents it once.
pub const TOKEN_FILE: &str = "agent.token";
/// The version of [`SnapshotRecord`] this build writes and reads.
/// 2: [`SnapshotRecord::generation`], and a guest agent of protocol 4 in the snapshot (its
/// `Resume` takes the host's entropy): a version-1 snapshot's agent could not be re-keyed.
pub const RECORD_VERSION: u32 = 2;
/// The largest record read (a spec with its paths and a few devices is a few KiB).
pub const MAX_RECORD_BYTES: u64 = 1 << 20;
/// The prefix of a staging directory in a snapshot parent.
const STAGING_PREFIX: &str = ".staging-";

/// Why a snapshot was not taken, listed, removed or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("this VM was not booted for snapshots (Options::snapshots)")]
    NotEnabled,
    #[error("{} already exists", .0.display())]
    Exists(PathBuf),
    #[error("no snapshot named {0:?}")]
    NoSuchName(String),
    #[error(
        "invalid snapshot name {0:?}: use 1-63 characters [a-z0-9_.-] starting with a letter or digit"
    )]
    Name(String),
    #[error("no cache directory: set HOME or XDG_CACHE_HOME")]
    NoCacheDir,
    #[error("{what} {}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is larger than {MAX_RECORD_BYTES} bytes: not a snapshot record", .0.display())]
    RecordTooLarge(PathBuf),
    #[error("{}: not a snapshot record", .path.display())]
    Record {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: snapshot record version {found}; this build reads version {RECORD_VERSION}", .path.display())]
    Version { path: PathBuf, found: u32 },
    #[error("the snapshot's agent token")]
    Token(#[source] TokenError),
    #[error(
        "{} must belong to uid {owner} (the user restoring) and be writable by no one else",
        .path.display()
    )]
    NotPrivate {
        path: PathBuf,
        owner: u32,
        #[source]
        source: vm_sys::private::Refusal,
    },
    #[error("the snapshot was taken on {recorded}; it cannot be restored on {asked}")]
    Driver { recorded: String, asked: String },
    #[error("{driver}: no snapshots: {reason}")]
    Unsupported {
        driver: &'static str,
        reason: String,
    },
    #[error("{what} changed since the snapshot was taken ({detail}): the snapshot is invalid")]
    Changed { what: String, detail: String },
    #[error(
        "moving the snapshot to {}: it must be on the filesystem of the staging directory {}",
        .to.display(),
        .staging.display()
    )]
    Publish {
        staging: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the VM was not snapshotted")]
    Machine(#[source] vm_drivers::snapshot::SnapshotError),
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SnapshotError {
    let path = path.to_path_buf();
    move |source| SnapshotError::Io { what, path, source }
}

/// One read-only disk as the snapshot saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskIdentity {
    /// Its virtio-blk serial (`disk<N>`, `root`).
    pub serial: String,
    /// The host file.
    pub path: PathBuf,
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl DiskIdentity {
    fn of(dev: &BlockDevice) -> Result<DiskIdentity, SnapshotError> {
        let meta = std::fs::metadata(&dev.host_path).map_err(io_err("reading", &dev.host_path))?;
        Ok(DiskIdentity {
            serial: dev.serial.clone(),
            path: dev.host_path.clone(),
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        })
    }
}

/// One host mount (a virtio-fs share) as the snapshot saw it. The VMM also checks, when it
/// restores the share's session, that every file and directory the guest held is still the
/// same host inode; this is the mount itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareIdentity {
    /// Its tag (`fs<N>`).
    pub tag: String,
    /// The host directory or file.
    pub path: PathBuf,
    /// `dir` or `file`.
    pub kind: String,
    /// Its host device and inode: the same directory or file, not one put in its place.
    pub dev: u64,
    pub ino: u64,
    /// For a file: its size and modification time (nanoseconds since the epoch); 0 for a
    /// directory, whose files the VMM checks one by one.
    pub size: u64,
    pub mtime_ns: i128,
}

impl ShareIdentity {
    fn of(index: usize, share: &SharePlan) -> Result<ShareIdentity, SnapshotError> {
        let meta =
            std::fs::metadata(&share.host_path).map_err(io_err("reading", &share.host_path))?;
        let file = share.kind == ShareKind::File;
        Ok(ShareIdentity {
            tag: vm_drivers::share_tag(index),
            path: share.host_path.clone(),
            kind: share.kind.as_str().into(),
            dev: meta.dev(),
            ino: meta.ino(),
            size: if file { meta.len() } else { 0 },
            mtime_ns: if file {
                i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
            } else {
                0
            },
        })
    }
}

/// What a snapshot's record holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// [`RECORD_VERSION`] when written.
    pub version: u32,
    /// The driver that took it (and the only one that restores it).
    pub driver: String,
    /// Seconds since the epoch when it was taken.
    pub created_unix_secs: u64,
    /// The spec the VM ran under: a restored VM runs under it again.
    pub spec: Spec,
    /// Every read-only disk, in attachment order.
    pub disks: Vec<DiskIdentity>,
    /// Every host mount served by the file server, in order.
    #[serde(default)]
    pub shares: Vec<ShareIdentity>,
    /// The shares' DAX window size asked for (a restore asks for the same).
    #[serde(default)]
    pub dax_window_mib: Option<u32>,
    /// Bytes of the state file and of guest RAM, and how much RAM was written.
    pub state_bytes: u64,
    pub memory_bytes: u64,
    pub memory_written: u64,
    /// Microseconds from the snapshot request until its files were written.
    pub took_us: u64,
    /// How many restores lay behind the VM snapshotted ([`MicroVm::generation`]); a VM
    /// restored from this snapshot is one more.
    pub generation: u64,
    /// The server the snapshot was taken with, running on in it (`vm snapshot create -p`):
    /// a restore publishes it again instead of starting one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<ServedProcess>,
}

/// Makes a private staging directory under `parent` (created 0700 if missing).
pub(crate) fn staging_dir(parent: &Path) -> Result<tempfile::TempDir, SandboxError> {
    let fail = |source| SnapshotError::Io {
        what: "creating the snapshot staging directory in",
        path: parent.to_path_buf(),
        source,
    };
    private_dir(parent).map_err(fail)?;
    let dir = tempfile::Builder::new()
        .prefix(STAGING_PREFIX)
        .tempdir_in(parent)
        .map_err(fail)?;
    // The VMM refuses any other mode, whatever the umask made of tempfile's.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
    Ok(dir)
}

/// Writes `bytes` to the new file `path`, mode 0600.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(io_err("writing", path))
}

/// Compares the disks a restore prepared with the ones the snapshot saw, naming the first
/// that differs by its mount (or the image root).
fn check_disks(
    spec: &ValidSpec,
    recorded: &[DiskIdentity],
    now: &[BlockDevice],
) -> Result<(), SnapshotError> {
    // Disk N is the N-th mount copied to erofs (the rest are shares).
    let copied: Vec<_> = spec
        .mounts()
        .iter()
        .filter(|m| m.via == vm_spec::MountVia::Erofs)
        .collect();
    let name = |serial: &str| match serial
        .strip_prefix("disk")
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(n) => copied.get(n).map_or_else(
            || format!("disk {serial}"),
            |m| format!("the mount {}", m.guest_path),
        ),
        None => "the image root".to_string(),
    };
    if recorded.len() != now.len() {
        return Err(SnapshotError::Changed {
            what: "the disk list".into(),
            detail: format!("{} disks then, {} now", recorded.len(), now.len()),
        });
    }
    for (then, dev) in recorded.iter().zip(now) {
        let changed = |detail: String| SnapshotError::Changed {
            what: name(&then.serial),
            detail,
        };
        if then.serial != dev.serial || then.path != dev.host_path {
            return Err(changed(format!(
                "it was {}, it is now {}",
                then.path.display(),
                dev.host_path.display()
            )));
        }
        let current = DiskIdentity::of(dev).map_err(|e| changed(e.to_string()))?;
        if current.size != then.size || current.mtime_ns != then.mtime_ns {
            return Err(changed(format!(
                "{}: size {} and mtime {} ns then, size {} and mtime {} ns now",
                then.path.display(),
                then.size,
                then.mtime_ns,
                current.size,
                current.mtime_ns
            )));
        }
    }
    Ok(())
}

/// Compares the shares a restore prepared with the ones the snapshot saw, naming the first
/// that differs by its mount.
fn check_shares(
    spec: &ValidSpec,
    recorded: &[ShareIdentity],
    now: &[SharePlan],
) -> Result<(), SnapshotError> {
    let shared: Vec<_> = spec
        .mounts()
        .iter()
        .filter(|m| m.via == vm_spec::MountVia::Share)
        .collect();
    if recorded.len() != now.len() {
        return Err(SnapshotError::Changed {
            what: "the mount list".into(),
            detail: format!("{} shares then, {} now", recorded.len(), now.len()),
        });
    }
    for (i, (then, share)) in recorded.iter().zip(now).enumerate() {
        let changed = |detail: String| SnapshotError::Changed {
            what: shared.get(i).map_or_else(
                || format!("share {}", then.tag),
                |m| format!("the mount {}", m.guest_path),
            ),
            detail,
        };
        let current = ShareIdentity::of(i, share).map_err(|e| changed(e.to_string()))?;
        if current != *then {
            return Err(changed(format!(
                "{}: {} {} (device {}, inode {}, size {}, mtime {} ns) then, {} {} (device {}, \
                 inode {}, size {}, mtime {} ns) now",
                then.path.display(),
                then.kind,
                then.tag,
                then.dev,
                then.ino,
                then.size,
                then.mtime_ns,
                current.kind,
                current.tag,
                current.dev,
                current.ino,
                current.size,
                current.mtime_ns
            )));
        }
    }
    Ok(())
}

impl MicroVm {
    /// Snapshots this VM into the new directory `path` and ends the VM (it is closed
    /// afterwards; restore the snapshot to go on). The VM must have been created with
    /// [`Options::snapshots`], and `path` must not exist and be on that directory's
    /// filesystem. Refused with the VM still running when the driver cannot (tcg).
    pub async fn snapshot(&self, path: &Path) -> Result<SnapshotRecord, SandboxError> {
        self.snapshot_with(path, None).await
    }

    /// [`MicroVm::snapshot`] of a VM serving: the guest process keeps running in the
    /// snapshot and its record names it ([`SnapshotRecord::serving`]), so a VM restored from
    /// it publishes the same server, ready at once. `serving`'s host ports close first.
    pub async fn snapshot_serving(
        &self,
        path: &Path,
        serving: &Serving,
    ) -> Result<SnapshotRecord, SandboxError> {
        serving.detach();
        self.snapshot_with(path, Some(serving.served())).await
    }

    async fn snapshot_with(
        &self,
        path: &Path,
        serving: Option<ServedProcess>,
    ) -> Result<SnapshotRecord, SandboxError> {
        let staging = self
            .staging
            .locked()
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .ok_or(SnapshotError::NotEnabled)?;
        if std::fs::symlink_metadata(path).is_ok() {
            return Err(SnapshotError::Exists(path.to_path_buf()).into());
        }
        let disks = self
            .devices
            .iter()
            .map(DiskIdentity::of)
            .collect::<Result<Vec<_>, _>>()?;
        let shares = self
            .shares
            .iter()
            .enumerate()
            .map(|(i, s)| ShareIdentity::of(i, s))
            .collect::<Result<Vec<_>, _>>()?;
        let machine = self.machine_arc();
        let written = tokio::task::spawn_blocking(move || machine.snapshot())
            .await
            .map_err(|e| SandboxError::Join(e.to_string()))?
            .map_err(SnapshotError::Machine)?;
        let record = SnapshotRecord {
            version: RECORD_VERSION,
            driver: self.driver().to_string(),
            created_unix_secs: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            spec: self.source.clone(),
            disks,
            shares,
            dax_window_mib: self.dax_window_mib,
            state_bytes: written.state_bytes,
            memory_bytes: written.memory_bytes,
            memory_written: written.memory_written,
            took_us: u64::try_from(written.took.as_micros()).unwrap_or(u64::MAX),
            generation: self.generation,
            serving,
        };
        let json = serde_json::to_vec_pretty(&record).map_err(|source| SnapshotError::Record {
            path: staging.join(RECORD_FILE),
            source,
        })?;
        written
            .token
            .write_file(&staging.join(TOKEN_FILE))
            .map_err(SnapshotError::Token)?;
        write_private(&staging.join(RECORD_FILE), &json)?;
        std::fs::rename(&staging, path).map_err(|source| SnapshotError::Publish {
            staging: staging.clone(),
            to: path.to_path_buf(),
            source,
        })?;
        if let Some(dir) = self.staging.locked().take() {
            // Renamed away: nothing is left to remove.
            let _ = dir.keep();
        }
        self.remove_run_dir();
        Ok(record)
    }

    /// Restores the snapshot in `path` as a new VM on the default registry (see the module
    /// docs for what is checked). Blocks until the restored agent answers; from async code
    /// use [`MicroVm::restore`].
    pub fn restore_blocking(path: &Path, options: &Options) -> Result<MicroVm, SandboxError> {
        MicroVm::restore_with(&Registry::with_defaults(), path, options)
    }

    /// [`MicroVm::restore_blocking`] in a blocking task.
    pub async fn restore(path: PathBuf, options: Options) -> Result<MicroVm, SandboxError> {
        tokio::task::spawn_blocking(move || MicroVm::restore_blocking(&path, &options))
            .await
            .map_err(|e| SandboxError::Join(e.to_string()))?
    }

    /// [`MicroVm::restore_blocking`] over an explicit registry.
    pub fn restore_with(
        registry: &Registry,
        path: &Path,
        options: &Options,
    ) -> Result<MicroVm, SandboxError> {
        let dir = std::path::absolute(path).map_err(io_err("resolving", path))?;
        let opened = OpenSnapshot::open(&dir)?;
        let record = opened.record()?;
        if let Some(asked) = options.driver.as_deref().filter(|d| *d != record.driver) {
            return Err(SnapshotError::Driver {
                recorded: record.driver.clone(),
                asked: asked.to_string(),
            }
            .into());
        }
        let token = opened.token()?;
        let valid = record.spec.validate()?;
        let driver = select(
            registry,
            Some(record.driver.as_str()),
            options.trust,
            &options.policy,
        )?;
        let can = driver.snapshots();
        if !can.ok {
            return Err(SnapshotError::Unsupported {
                driver: driver.name(),
                reason: can.detail,
            }
            .into());
        }
        let options = &Options {
            dax_window_mib: record.dax_window_mib,
            ..options.clone()
        };
        let prepared = Prepared::new(&valid, options)?;
        check_disks(&valid, &record.disks, &prepared.plan.block_devices())?;
        check_shares(&valid, &record.shares, &prepared.plan.shares)?;
        let generation = record.generation.saturating_add(1);
        let from = RestoreFrom {
            dir,
            token,
            generation,
        };
        let name = driver.name();
        let machine = driver
            .restore(prepared.plan.clone(), &from)
            .map_err(|source| SandboxError::Boot {
                driver: name,
                source,
            })?;
        let mut vm = MicroVm::wrap(machine, valid, record.spec, options, prepared)?;
        vm.generation = generation;
        Ok(vm)
    }
}

/// The named snapshots of `vm snapshot`: one directory per name under `<cache home>/vm/snapshots`.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    dir: PathBuf,
}

/// One entry of [`SnapshotStore::list`].
#[derive(Debug)]
pub struct Listed {
    pub name: String,
    /// The record, or why it cannot be read (listed rather than hidden).
    pub record: Result<SnapshotRecord, SnapshotError>,
    /// Bytes the directory's files take on disk.
    pub disk_bytes: u64,
}

impl SnapshotStore {
    /// The store in `dir` (created when a snapshot is staged).
    pub fn new(dir: impl Into<PathBuf>) -> SnapshotStore {
        SnapshotStore { dir: dir.into() }
    }

    /// `$VM_SNAPSHOTS_DIR`, else `<cache home>/vm/snapshots`.
    pub fn default_location() -> Result<SnapshotStore, SnapshotError> {
        if let Some(d) = std::env::var_os("VM_SNAPSHOTS_DIR").filter(|d| !d.is_empty()) {
            return Ok(SnapshotStore::new(d));
        }
        let home = crate::mounts::cache_home().ok_or(SnapshotError::NoCacheDir)?;
        Ok(SnapshotStore::under(&home))
    }

    /// The store's default place under the cache home `home`: `vm/snapshots`, apart from the
    /// containerd shim's snapshot roots ([`crate::snapshot_root::SnapshotRoots::under`]).
    pub fn under(home: &Path) -> SnapshotStore {
        SnapshotStore::new(home.join("vm/snapshots"))
    }

    /// The store's directory (the parent to give [`Options::snapshots`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of the snapshot `name` (the name checked; it need not exist).
    pub fn path(&self, name: &str) -> Result<PathBuf, SnapshotError> {
        if !crate::state::valid_name(name) {
            return Err(SnapshotError::Name(name.to_string()));
        }
        Ok(self.dir.join(name))
    }

    /// The directory of the existing snapshot `name`.
    pub fn existing(&self, name: &str) -> Result<PathBuf, SnapshotError> {
        let p = self.path(name)?;
        if !p.join(RECORD_FILE).is_file() {
            return Err(SnapshotError::NoSuchName(name.to_string()));
        }
        Ok(p)
    }

    /// Every snapshot, by name (staging directories are not listed).
    pub fn list(&self) -> Result<Vec<Listed>, SnapshotError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("listing", &self.dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err("listing", &self.dir))?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !crate::state::valid_name(&name) || !entry.path().is_dir() {
                continue;
            }
            out.push(Listed {
                record: read_record(&entry.path()),
                disk_bytes: disk_bytes(&entry.path()),
                name,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes the snapshot `name` (VMs restored from it keep running: their memory is
    /// their own once mapped).
    pub fn remove(&self, name: &str) -> Result<(), SnapshotError> {
        let p = self.existing(name)?;
        std::fs::remove_dir_all(&p).map_err(io_err("removing", &p))
    }
}

/// Bytes the files directly in `dir` occupy on disk (a sparse memory file counts what it holds).
fn disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

#[cfg(test)]
#[path = "snapshots_tests.rs"]
mod tests;

//! cgroup2 containment for what the agent runs.
//!
//! Layout: `<base>/work` carries the limits (`pids.max`, `memory.max`) and has the `pids` and
//! `memory` controllers enabled for its children; each Exec/Serve runs in its own leaf
//! `<base>/work/<name>`, entered from `pre_exec` by writing `0` to its `cgroup.procs`. Killing a
//! leaf writes `1` to `cgroup.kill` (kernel >= 5.14) or, failing that, SIGKILLs every pid listed
//! in `cgroup.procs` until it is empty. A pod member (one container of a pod's VM) gets a group
//! `<base>/work/<group>` with its own limits, and its processes' leaves go inside it
//! ([`Cgroups::create_group`], [`Cgroups::create_in`]). When `<base>` is not cgroup2 everything
//! here is skipped (see [`Cgroups::setup`]).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// cgroup errors.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Limits applied to the shared `work` cgroup.
#[derive(Debug, Clone, Copy, Default)]
pub struct CgroupLimits {
    pub pids_max: Option<u32>,
    pub mem_limit_mib: Option<u32>,
}

/// A pod member's own limits ([`Cgroups::create_group`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupLimits {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// `cpu.max`: quota and period, microseconds.
    pub cpu_max: Option<(u64, u64)>,
}

/// The controllers the agent's cgroups use (`cpu` where the kernel has it).
const CONTROLLERS: [&str; 3] = ["+pids", "+memory", "+cpu"];

/// The `work` cgroup.
#[derive(Debug)]
pub struct Cgroups {
    work: PathBuf,
    has_kill: bool,
}

/// The most leaves of one group looked at when it is killed or removed (a container's
/// processes cannot make more: each leaf holds a process of its `pids.max`).
const MAX_LEAVES: usize = 4096;

/// One leaf cgroup (one Exec or Serve).
#[derive(Debug)]
pub struct CgroupDir {
    path: PathBuf,
    procs: CString,
    has_kill: bool,
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        source,
    })
}

impl Cgroups {
    /// Set up `<base>/work` with `limits`. Returns `Ok(None)` (logged once) when `base` is not
    /// a cgroup2 mount.
    pub fn setup(base: &Path, limits: CgroupLimits) -> Result<Option<Cgroups>, CgroupError> {
        if !base.join("cgroup.controllers").exists() {
            tracing::warn!(base = %base.display(), "not a cgroup2 hierarchy: per-exec cgroups and limits disabled");
            return Ok(None);
        }
        for c in CONTROLLERS {
            if let Err(e) = write(&base.join("cgroup.subtree_control"), c) {
                tracing::warn!(controller = c, error = %e, "cannot enable controller at the root");
            }
        }
        let work = base.join("work");
        match std::fs::create_dir(&work) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(CgroupError::Create { path: work, source }),
        }
        if let Some(p) = limits.pids_max {
            write(&work.join("pids.max"), &p.to_string())?;
        }
        if let Some(m) = limits.mem_limit_mib {
            let bytes = u64::from(m) * 1024 * 1024;
            write(&work.join("memory.max"), &bytes.to_string())?;
            // No swap in the guest, but if there were, the limit must not leak through it.
            let _ = write(&work.join("memory.swap.max"), "0");
        }
        for c in CONTROLLERS {
            if let Err(e) = write(&work.join("cgroup.subtree_control"), c) {
                tracing::warn!(controller = c, error = %e, "cannot enable controller in work");
            }
        }
        let has_kill = work.join("cgroup.kill").exists();
        Ok(Some(Cgroups { work, has_kill }))
    }

    /// Creates the group `work/<name>` with `limits` (its own `memory.max`, `pids.max`), whose
    /// children get the controllers.
    pub fn create_group(&self, name: &str, limits: GroupLimits) -> Result<(), CgroupError> {
        let path = self.work.join(name);
        std::fs::create_dir(&path).map_err(|source| CgroupError::Create {
            path: path.clone(),
            source,
        })?;
        if let Some(p) = limits.pids {
            write(&path.join("pids.max"), &p.to_string())?;
        }
        if let Some(bytes) = limits.memory_bytes {
            write(&path.join("memory.max"), &bytes.to_string())?;
            let _ = write(&path.join("memory.swap.max"), "0");
        }
        // Its quota holds for all its processes together (the leaves below share it).
        if let Some((quota, period)) = limits.cpu_max {
            write(&path.join("cpu.max"), &format!("{quota} {period}"))?;
        }
        for c in ["+pids", "+memory"] {
            write(&path.join("cgroup.subtree_control"), c)?;
        }
        Ok(())
    }

    fn group(&self, name: &str) -> CgroupDir {
        CgroupDir {
            path: self.work.join(name),
            procs: CString::default(),
            has_kill: self.has_kill,
        }
    }

    /// Kills every process of the group `work/<name>`, in all its leaves: a container's
    /// processes, what its execs left running included, end with it.
    pub fn kill_group(&self, name: &str) {
        let group = self.group(name);
        if self.has_kill && write(&group.path.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for leaf in group.leaves() {
            leaf.kill();
        }
    }

    /// Removes the group `work/<name>` and the leaves left in it (each once its processes are
    /// gone; one still busy after a few seconds is left, logged).
    pub async fn remove_group(&self, name: &str) {
        let group = self.group(name);
        for leaf in group.leaves() {
            leaf.remove().await;
        }
        group.remove().await;
    }

    /// Create the leaf `work/<name>`.
    pub fn create(&self, name: &str) -> Result<CgroupDir, CgroupError> {
        self.create_in(None, name)
    }

    /// Create the leaf `work/<group>/<name>` (`None`: `work/<name>`).
    pub fn create_in(&self, group: Option<&str>, name: &str) -> Result<CgroupDir, CgroupError> {
        let path = match group {
            Some(g) => self.work.join(g).join(name),
            None => self.work.join(name),
        };
        std::fs::create_dir(&path).map_err(|source| CgroupError::Create {
            path: path.clone(),
            source,
        })?;
        let procs =
            CString::new(path.join("cgroup.procs").as_os_str().as_bytes()).map_err(|e| {
                CgroupError::Create {
                    path: path.clone(),
                    source: std::io::Error::other(e),
                }
            })?;
        Ok(CgroupDir {
            path,
            procs,
            has_kill: self.has_kill,
        })
    }
}

impl CgroupDir {
    /// Path of `cgroup.procs` (written from `pre_exec`).
    pub fn procs_path(&self) -> &CString {
        &self.procs
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kill every process in the leaf.
    pub fn kill(&self) {
        if self.has_kill && write(&self.path.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for p in pids {
                // A process gone meanwhile (ESRCH) is what we want anyway.
                let _ = super::sys::proc::kill(p, libc::SIGKILL);
            }
        }
    }

    /// The leaves of a group (its child directories), at most [`MAX_LEAVES`].
    fn leaves(&self) -> Vec<CgroupDir> {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .take(MAX_LEAVES)
            .map(|e| CgroupDir {
                procs: CString::new(e.path().join("cgroup.procs").as_os_str().as_bytes())
                    .unwrap_or_default(),
                path: e.path(),
                has_kill: self.has_kill,
            })
            .collect()
    }

    /// Removes the leaf now if no process is in it; else leaves it to its group's removal
    /// (or the VM's end), logged.
    pub fn remove_if_empty(self) {
        if let Err(e) = std::fs::remove_dir(&self.path) {
            tracing::debug!(path = %self.path.display(), error = %e, "cgroup kept: its processes run on");
        }
    }

    /// Remove the leaf once its processes are gone (reaped); retried for a few seconds.
    pub async fn remove(self) {
        for _ in 0..50 {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        tracing::warn!(path = %self.path.display(), "cgroup still busy; left behind");
    }
}

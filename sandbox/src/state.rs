//! The runtime state directory: one directory per named VM, holding its record. The one
//! implementation the `vm` CLI (`vm run -d`, `ps`, `exec NAME`, `stop`, `rm`) and the Python
//! SDK (`vm_sandbox.ps()`, `Sandbox.attach`) share; [`named`] attaches to a VM found here.
//!
//! Location: `$VM_RUNTIME_DIR` when set; else `$XDG_RUNTIME_DIR/vm`; else
//! `/run/user/$UID/vm` when that user runtime directory exists; else `/tmp/vm-$UID/vm`
//! (the `/tmp/vm-$UID` parent is created 0700 and refused unless owned by us and private).
//! Every directory `vm` creates here is 0700.
//!
//! `<runtime dir>/<name>/` holds:
//! - `record.json` — the [`Record`]: supervisor pid (+ its start time, so a recycled pid is
//!   not mistaken for ours), driver, sockets, the request, labels, state; written atomically
//!   (temp file + rename) by `vm run` and then by the supervisor;
//! - `supervisor.log` — the detached supervisor's stdout/stderr;
//! - whatever the driver creates in its run directory (the VM's sockets, console log); the
//!   state directory *is* the driver's run directory so socket paths stay short (Unix
//!   socket paths are limited to 107 bytes).
//!
//! A record whose supervisor is gone while it still says starting/running is *stale*: it is
//! shown as `exited` and cleaned (leftover VM processes killed, sockets removed) by `ps`,
//! `stop` and `rm`.
//!
//! `<runtime dir>/.exec/` holds the run directories of ephemeral VMs (`vm exec`, `vm serve`).
//! Every run directory names its owner process (pid + start time); every `vm` invocation
//! first sweeps the run directories whose owner is gone ([`Runtime::sweep`]), so a `kill -9`
//! of `vm exec` or of a supervisor leaves nothing behind past the next `vm` command.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::rundir;
use vm_sys::control::{self, Signal};

pub mod named;
mod record;

pub use record::{ProcId, Record, VmState, WALL_EXPIRED, labels, now_unix};

/// Errors of the state directory.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The runtime directory is unusable.
    #[error("runtime directory {path}: {why}")]
    Unsafe { path: PathBuf, why: String },
    /// An I/O error on a path.
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// No VM of that name.
    #[error("no VM named {0:?} (see `vm ps`)")]
    NotFound(String),
    /// Not a VM name (see [`valid_name`]).
    #[error(
        "invalid VM name {0:?}: use 1-63 characters [a-z0-9_.-] starting with a letter or digit"
    )]
    BadName(String),
    /// The name is taken.
    #[error(
        "a VM named {name:?} already exists ({state}); pick another name or remove it with `vm rm {name}`"
    )]
    Exists { name: String, state: String },
    /// The record cannot be parsed.
    #[error("corrupt record {path}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// True for a VM name: `[a-z0-9][a-z0-9_.-]{0,62}` (so it is one safe path component).
pub fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    let first_ok = b
        .first()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = b
        .iter()
        .skip(1)
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'.' | b'-'));
    first_ok && rest_ok && b.len() <= 63
}

/// The directory under the runtime root holding ephemeral VMs' run directories.
pub const EPHEMERAL_DIR: &str = ".exec";

/// The runtime directory holding one directory per VM.
#[derive(Debug, Clone)]
pub struct Runtime {
    root: PathBuf,
}

fn mkdir_private(path: &Path) -> Result<(), StateError> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
    {
        Ok(()) => Ok(()),
        Err(e) => Err(io_err(path)(e)),
    }
}

fn check_private(path: &Path) -> Result<(), StateError> {
    let md = fs::symlink_metadata(path).map_err(io_err(path))?;
    let uid = control::uid();
    let unsafe_dir = |why: &str| StateError::Unsafe {
        path: path.to_path_buf(),
        why: why.into(),
    };
    if !md.is_dir() {
        return Err(unsafe_dir("not a directory"));
    }
    if md.uid() != uid {
        return Err(unsafe_dir(
            "owned by another user; set VM_RUNTIME_DIR to a private directory",
        ));
    }
    if md.mode() & 0o022 != 0 {
        return Err(unsafe_dir(
            "writable by others; chmod 700 it or set VM_RUNTIME_DIR",
        ));
    }
    Ok(())
}

impl Runtime {
    /// Resolves the runtime directory from the environment (see the module docs) and
    /// creates it.
    pub fn from_env() -> Result<Runtime, StateError> {
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let uid = control::uid();
        let root = if let Some(dir) = env("VM_RUNTIME_DIR") {
            dir
        } else if let Some(xdg) = env("XDG_RUNTIME_DIR") {
            xdg.join("vm")
        } else if Path::new(&format!("/run/user/{uid}")).is_dir() {
            PathBuf::from(format!("/run/user/{uid}/vm"))
        } else {
            let parent = PathBuf::from(format!("/tmp/vm-{uid}"));
            mkdir_private(&parent)?;
            check_private(&parent)?;
            parent.join("vm")
        };
        Runtime::at(root)
    }

    /// Uses `root` as the runtime directory, creating it (0700) if needed.
    pub fn at(root: PathBuf) -> Result<Runtime, StateError> {
        mkdir_private(&root)?;
        check_private(&root)?;
        Ok(Runtime { root })
    }

    /// The runtime directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The state directory of VM `name`.
    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Claims `name`: creates its directory atomically and writes the first record.
    /// A name that exists (running or not) is refused.
    pub fn create(&self, record: &Record) -> Result<PathBuf, StateError> {
        if !valid_name(&record.name) {
            return Err(StateError::BadName(record.name.clone()));
        }
        let dir = self.dir(&record.name);
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let state = match self.load(&record.name) {
                    Ok(r) => r.effective_state().as_str().to_string(),
                    Err(_) => "unreadable record".to_string(),
                };
                return Err(StateError::Exists {
                    name: record.name.clone(),
                    state,
                });
            }
            Err(e) => return Err(io_err(&dir)(e)),
        }
        self.save(record)?;
        Ok(dir)
    }

    /// Writes a record atomically.
    pub fn save(&self, record: &Record) -> Result<(), StateError> {
        let dir = self.dir(&record.name);
        let tmp = dir.join(format!(".record.json.{}", std::process::id()));
        let path = dir.join("record.json");
        let bytes = serde_json::to_vec_pretty(record).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(io_err(&tmp))?;
        fs::rename(&tmp, &path).map_err(io_err(&path))
    }

    /// Loads VM `name`'s record. A name that is not a VM name is refused.
    pub fn load(&self, name: &str) -> Result<Record, StateError> {
        if !valid_name(name) {
            return Err(StateError::BadName(name.to_string()));
        }
        let path = self.dir(name).join("record.json");
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StateError::NotFound(name.to_string()));
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        serde_json::from_slice(&bytes).map_err(|source| StateError::Corrupt { path, source })
    }

    /// All records, sorted by name. Unreadable entries are skipped with a warning.
    pub fn list(&self) -> Result<Vec<Record>, StateError> {
        let mut out = Vec::new();
        let root = self.root();
        for entry in fs::read_dir(root).map_err(io_err(root))? {
            let entry = entry.map_err(io_err(root))?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !valid_name(&name) || !entry.path().is_dir() {
                continue;
            }
            match self.load(&name) {
                Ok(r) => out.push(r),
                // A directory claimed a moment ago may not have its record yet.
                Err(StateError::NotFound(_)) => {}
                Err(e) => tracing::warn!("skipping {name}: {e}"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// What `vm ps` shows: every record, sorted by name, the stale ones first marked exited
    /// and cleaned ([`Runtime::reap_stale`]; a failure there is logged, the record still listed).
    pub fn ps(&self) -> Result<Vec<Record>, StateError> {
        let mut records = self.list()?;
        for r in &mut records {
            if let Err(e) = self.reap_stale(r) {
                tracing::warn!("cleaning stale VM {}: {e}", r.name);
            }
        }
        Ok(records)
    }

    /// Marks a stale record exited and cleans what its VM left behind: kills recorded VM
    /// processes that still exist (same pid *and* start time) and removes the agent socket.
    pub fn reap_stale(&self, record: &mut Record) -> Result<(), StateError> {
        if !record.is_stale() {
            return Ok(());
        }
        kill_leftovers(record);
        if let Some(sock) = &record.agent_socket {
            let _ = fs::remove_file(sock);
        }
        record.state = VmState::Exited;
        record.exited_unix.get_or_insert_with(now_unix);
        record
            .exit_reason
            .get_or_insert_with(|| "supervisor gone".to_string());
        self.save(record)
    }

    /// Where ephemeral VMs (`vm exec`, `vm serve`) put their run directories: one directory
    /// under the runtime root (its name is not a valid VM name), created 0700 by the sandbox
    /// only once a VM is about to boot, so a refused command leaves nothing behind.
    pub fn ephemeral_parent(&self) -> PathBuf {
        self.root.join(EPHEMERAL_DIR)
    }

    /// Removes the run directories of VMs whose owning `vm` process or supervisor is gone
    /// (killed without its teardown): under [`EPHEMERAL_DIR`] and under every VM's state
    /// directory. Returns how many were removed. Every `vm` invocation runs it first.
    /// Also removes the records of ephemeral VMs ([`labels::EPHEMERAL`]) whose holder is
    /// gone, after killing what their VM left.
    pub fn sweep(&self) -> usize {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return 0;
        };
        let swept = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| rundir::sweep(&e.path()).len())
            .sum();
        let records = self.list().unwrap_or_default();
        let ephemeral = records
            .into_iter()
            .filter(|r| r.labels.get(labels::EPHEMERAL).is_some_and(|v| v == "true"));
        for mut r in ephemeral.filter(Record::is_stale) {
            tracing::info!(name = %r.name, "removing the record of an ephemeral VM whose holder is gone");
            if let Err(e) = self.reap_stale(&mut r).and_then(|()| self.remove(&r.name)) {
                tracing::warn!(name = %r.name, "removing a stale ephemeral VM: {e}");
            }
        }
        swept
    }

    /// Removes VM `name`'s state directory.
    pub fn remove(&self, name: &str) -> Result<(), StateError> {
        let dir = self.dir(name);
        fs::remove_dir_all(&dir).map_err(io_err(&dir))
    }
}

/// SIGKILLs the record's VM processes that are still the same processes.
pub fn kill_leftovers(record: &Record) {
    for p in &record.host_pids {
        if p.alive() {
            tracing::info!(pid = p.pid, "killing leftover VM process");
            // The pid was just verified (pid + start time) to be the VM's process.
            if let Err(e) = control::signal(p.pid, Signal::Kill) {
                tracing::debug!(pid = p.pid, error = %e, "leftover VM process already gone");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn record(name: &str) -> Record {
        let limits = vm_spec::Limits::default(); // 256 MiB, one vCPU
        Record::starting(
            name,
            &limits,
            vm_spec::Trust::Untrusted,
            serde_json::Value::Null,
        )
    }

    #[test]
    fn create_load_list_remove() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = Runtime::at(tmp.path().join("vm")).unwrap();
        let mode = fs::metadata(rt.root()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        rt.create(&record("a")).unwrap();
        rt.create(&record("b")).unwrap();
        let err = rt.create(&record("a")).unwrap_err();
        assert!(err.to_string().contains("already exists"), "{err}");
        assert_eq!(rt.load("a").unwrap().name, "a");
        let names: Vec<_> = rt.list().unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["a", "b"]);
        rt.remove("a").unwrap();
        assert!(matches!(rt.load("a"), Err(StateError::NotFound(_))));
    }

    #[test]
    fn names_are_one_safe_path_component() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = Runtime::at(tmp.path().join("vm")).unwrap();
        let long = "a".repeat(64);
        for bad in ["", "../x", "a/b", "Box", "-x", ".exec", long.as_str()] {
            assert!(!valid_name(bad), "{bad:?}");
            assert!(
                matches!(rt.load(bad), Err(StateError::BadName(_))),
                "{bad:?}"
            );
            assert!(
                matches!(rt.create(&record(bad)), Err(StateError::BadName(_))),
                "{bad:?}"
            );
        }
        assert!(valid_name("box-1.a_b") && valid_name(&long[1..]));
        let err = rt.load("nobox").unwrap_err();
        assert_eq!(err.to_string(), "no VM named \"nobox\" (see `vm ps`)");
    }

    #[test]
    fn uptime_runs_until_exit() {
        let mut r = record("u");
        assert_eq!(r.uptime(VmState::Running), None);
        r.started_unix = Some(now_unix() - 5);
        assert!(r.uptime(VmState::Running).unwrap() >= Duration::from_secs(5));
        r.exited_unix = r.started_unix.map(|s| s + 2);
        assert_eq!(r.uptime(VmState::Exited), Some(Duration::from_secs(2)));
        assert!(!r.wall_expired());
        r.state = VmState::Exited;
        r.exit_reason = Some(WALL_EXPIRED.into());
        assert!(r.wall_expired());
    }

    #[test]
    fn liveness_uses_pid_and_start_time() {
        let me = ProcId::current().unwrap();
        assert!(me.alive());
        let recycled = ProcId {
            pid: me.pid,
            start_ticks: me.start_ticks + 1,
        };
        assert!(!recycled.alive());
        // A finished child: dead once reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcId::of(child.id()).unwrap();
        child.wait().unwrap();
        assert!(!id.alive());
    }

    #[test]
    fn stale_record_is_exited_and_reaped() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = Runtime::at(tmp.path().join("vm")).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = ProcId::of(child.id()).unwrap();
        child.wait().unwrap();
        let mut r = record("s");
        r.state = VmState::Running;
        r.supervisor = Some(gone);
        let sock = rt.dir("s").join("agent.sock");
        rt.create(&r).unwrap();
        fs::write(&sock, b"").unwrap();
        r.agent_socket = Some(sock.clone());
        assert!(r.is_stale());
        assert_eq!(r.effective_state(), VmState::Exited);
        rt.reap_stale(&mut r).unwrap();
        assert!(!sock.exists());
        assert_eq!(rt.load("s").unwrap().state, VmState::Exited);
        // A live supervisor keeps its state.
        r.state = VmState::Running;
        r.supervisor = ProcId::current();
        assert_eq!(r.effective_state(), VmState::Running);
    }
}

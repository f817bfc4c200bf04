//! Serve: long-lived processes with a bounded retained output tail.
//!
//! Each runs like an Exec (own session, own leaf cgroup, exact environment, stdin from
//! /dev/null, stdout+stderr on one pipe) but outlives the connection that started it. A task
//! keeps the last [`SERVE_TAIL_BYTES`] of its output; another records its exit status and then
//! kills whatever it left behind. At most `max_serves` are tracked (running or exited but not
//! yet stopped); `stop` kills the tree, waits for the exit (bounded) and forgets the entry.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use vm_sync::Lock;

use super::Agent;
use super::cgroup::CgroupDir;
use super::process::{self, OutputMode, SpawnSpec};
use vm_agent_protocol::protocol::{
    ErrorKind, ExitStatus, SERVE_TAIL_BYTES, ServeId, ServeRequest, ServeStatus,
};

#[derive(Debug)]
struct Entry {
    pid: i32,
    cgroup: Mutex<Option<CgroupDir>>,
    tail: Mutex<VecDeque<u8>>,
    exit: watch::Receiver<Option<ExitStatus>>,
}

/// The table of Serve processes.
#[derive(Debug, Default)]
pub struct Serves {
    map: Mutex<HashMap<u64, Arc<Entry>>>,
}

/// Why a Serve request failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("at most {0} serve processes")]
    Busy(usize),
    #[error("no serve process {0}")]
    Unknown(u64),
    /// The process could not be started (its message is the spawn error's own, e.g.
    /// `NAME: command not found`).
    #[error(transparent)]
    Spawn(#[from] process::ProcessError),
    /// The requested user is malformed or unknown in the guest's `/etc/passwd`/`/etc/group`.
    #[error(transparent)]
    User(#[from] super::user::UserError),
}

impl ServeError {
    /// The error kind reported on the wire.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ServeError::Busy(_) => ErrorKind::Busy,
            ServeError::Unknown(_) => ErrorKind::NotFound,
            ServeError::Spawn(e) => e.kind(),
            ServeError::User(_) => ErrorKind::BadRequest,
        }
    }
}

impl Entry {
    fn kill(&self) {
        let cg = self.cgroup.locked();
        process::kill_tree(self.pid, cg.as_ref());
    }

    fn status(&self) -> ServeStatus {
        let exit = *self.exit.borrow();
        let tail = self.tail.locked();
        ServeStatus {
            running: exit.is_none(),
            exit,
            output_tail: tail.iter().copied().collect(),
        }
    }
}

impl Serves {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Entry>>> {
        self.map.locked()
    }

    pub fn start(
        &self,
        agent: &Agent,
        req: &ServeRequest,
        max: usize,
    ) -> Result<ServeId, ServeError> {
        if self.lock().len() >= max {
            return Err(ServeError::Busy(max));
        }
        let id = agent.next_id();
        let name = format!("serve-{id}");
        let ids = super::user::resolve_opt(req.user.as_deref())?;
        let spec = SpawnSpec {
            command: &req.command,
            env: &req.env,
            cwd: req.cwd.as_deref(),
            default_cwd: agent.root_path(),
            with_stdin: false,
            output: OutputMode::Combined,
            name: &name,
            user: ids.as_ref(),
            root: None,
            group: None,
            confine: None,
        };
        let mut p = process::spawn(agent.reaper(), agent.cgroups(), &spec)?;
        let (tx, rx) = watch::channel(None);
        let entry = Arc::new(Entry {
            pid: p.pid,
            cgroup: Mutex::new(p.cgroup.take()),
            tail: Mutex::new(VecDeque::new()),
            exit: rx,
        });
        if let Some(mut out) = p.out.take() {
            let e = entry.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = out.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut t = e.tail.locked();
                    t.extend(&buf[..n]);
                    let excess = t.len().saturating_sub(SERVE_TAIL_BYTES);
                    t.drain(..excess);
                }
            });
        }
        let e = entry.clone();
        let exit = p.exit;
        tokio::spawn(async move {
            let st = exit.await.unwrap_or_default();
            e.kill();
            let _ = tx.send(Some(st));
            let cg = e.cgroup.locked().take();
            if let Some(cg) = cg {
                cg.remove().await;
            }
        });
        self.lock().insert(id, entry);
        Ok(ServeId(id))
    }

    pub fn status(&self, id: ServeId) -> Result<ServeStatus, ServeError> {
        let e = self.lock().get(&id.0).cloned();
        e.map(|e| e.status()).ok_or(ServeError::Unknown(id.0))
    }

    pub async fn stop(&self, id: ServeId) -> Result<ServeStatus, ServeError> {
        let e = self.lock().remove(&id.0).ok_or(ServeError::Unknown(id.0))?;
        e.kill();
        let mut rx = e.exit.clone();
        let _ = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| s.is_some())).await;
        Ok(e.status())
    }

    /// Kill every serve tree (shutdown).
    pub fn kill_all(&self) {
        for e in self.lock().values() {
            e.kill();
        }
    }
}

//! One client's sandboxes. A session (one stdio connection, one HTTP session) owns the VMs
//! its calls booted: the sandboxes it created and the fresh VMs of `run` calls in flight.
//! When it ends (stdin closed, the HTTP session deleted or idle past `--session-idle`, the
//! server stopped) every one of them is killed and its run directory removed; a killed
//! `vm mcp` takes them with it (the VM processes die with the process that started them).
//!
//! A sandbox created with `keep` and a name is not the session's: it is a named VM started
//! as `vm run -d` starts one (a detached supervisor, a record labelled [`KEPT_LABEL`]), which
//! later sessions of any `vm mcp` of this user reach by name, and `vm ps`, `vm exec NAME` and
//! `vm rm -f NAME` too. A server a session started in a kept sandbox forwards its port from
//! this process, so it stops when the session ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use vm_sandbox::state::named::NamedVm;
use vm_sandbox::state::{Record, StateError, VmState};
use vm_sandbox::{Guest, MicroVm, Serving};
use vm_sync::Lock;

use super::fault::Fault;
use super::host::Host;

/// The label (value `kept`) on the record of a sandbox a `vm mcp` session kept: the only named
/// VMs a tool call can reach (a VM the user started with `vm run -d` is not the agent's).
pub const KEPT_LABEL: &str = "vm.mcp";

/// What a sandbox was given, for `sandbox_list`.
#[derive(Debug, Clone)]
pub struct Info {
    pub image: Option<String>,
    pub memory_mib: i64,
    pub wall: Duration,
}

/// A sandbox this session booted.
pub struct Owned {
    pub vm: MicroVm,
    pub info: Info,
    servers: Mutex<Vec<Serving>>,
    _permit: OwnedSemaphorePermit,
}

impl Owned {
    pub fn new(vm: MicroVm, info: Info, permit: OwnedSemaphorePermit) -> Owned {
        Owned {
            vm,
            info,
            servers: Mutex::new(Vec::new()),
            _permit: permit,
        }
    }
}

/// A sandbox a call names.
pub enum Target {
    Owned(Arc<Owned>),
    Kept(Box<NamedVm>),
}

impl Target {
    pub fn guest(&self) -> &Guest {
        match self {
            Target::Owned(o) => &o.vm,
            Target::Kept(n) => n,
        }
    }
}

#[derive(Default)]
struct Inner {
    boxes: BTreeMap<String, Arc<Owned>>,
    /// The fresh VMs of `run` calls in flight, by call.
    runs: HashMap<u64, Arc<MicroVm>>,
    /// Servers this session started in kept sandboxes.
    kept_servers: Vec<Serving>,
    next_run: u64,
    next_name: u64,
    ended: bool,
}

/// One client's sandboxes (see the module docs).
pub struct Session {
    host: Arc<Host>,
    inner: Mutex<Inner>,
}

impl Session {
    pub fn new(host: Arc<Host>) -> Arc<Session> {
        Arc::new(Session {
            host,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// A name for a sandbox created without one.
    pub fn fresh_name(&self) -> String {
        let mut inner = self.lock();
        loop {
            inner.next_name += 1;
            let name = format!("sandbox-{}", inner.next_name);
            if !inner.boxes.contains_key(&name) && !self.kept_exists(&name) {
                return name;
            }
        }
    }

    /// Refuses a name this session or a kept sandbox already uses.
    pub fn check_free(&self, name: &str) -> Result<(), Fault> {
        if self.lock().boxes.contains_key(name) || self.kept_exists(name) {
            return Err(Fault::refused(
                "name",
                format!("a sandbox named {name:?} already exists (sandbox_remove removes it)"),
            ));
        }
        Ok(())
    }

    fn kept_exists(&self, name: &str) -> bool {
        !matches!(self.host.runtime.load(name), Err(StateError::NotFound(_)))
    }

    /// Adds a sandbox this session booted; a session that already ended kills it instead.
    pub fn insert(&self, name: String, sandbox: Owned) -> Result<(), Fault> {
        let mut inner = self.lock();
        if inner.ended || inner.boxes.contains_key(&name) {
            drop(inner);
            sandbox.vm.machine().close_now();
            return Err(Fault::failed(format!(
                "the sandbox {name:?} was not kept: the session ended or took the name meanwhile"
            )));
        }
        inner.boxes.insert(name, Arc::new(sandbox));
        Ok(())
    }

    /// Registers the VM of a `run` call until [`Session::run_done`]; a session that already
    /// ended kills it.
    pub fn run_started(&self, vm: Arc<MicroVm>) -> Result<u64, Fault> {
        let mut inner = self.lock();
        if inner.ended {
            vm.machine().close_now();
            return Err(Fault::failed("the session ended"));
        }
        inner.next_run += 1;
        let id = inner.next_run;
        inner.runs.insert(id, vm);
        Ok(id)
    }

    pub fn run_done(&self, id: u64) -> Option<Arc<MicroVm>> {
        self.lock().runs.remove(&id)
    }

    /// The sandbox `name`: this session's, or a kept one (a named VM with [`KEPT_LABEL`]).
    pub fn find(&self, name: &str) -> Result<Target, Fault> {
        if let Some(o) = self.lock().boxes.get(name) {
            return Ok(Target::Owned(o.clone()));
        }
        self.kept(name)?;
        NamedVm::attach(&self.host.runtime, name)
            .map(|n| Target::Kept(Box::new(n)))
            .map_err(|e| Fault::from_error(&e, 0))
    }

    /// Checks that `name` is a kept sandbox (running or not): the record of a named VM
    /// labelled [`KEPT_LABEL`]. Any other name, a VM the user started included, is not found.
    pub fn kept(&self, name: &str) -> Result<(), Fault> {
        match self.host.runtime.load(name) {
            Ok(r) if is_kept(&r) => Ok(()),
            Ok(_) | Err(StateError::NotFound(_)) => Err(Fault::NotFound(format!(
                "no sandbox named {name:?} (sandbox_list lists them; sandbox_create makes one)"
            ))),
            Err(e) => Err(Fault::from_error(&e, 0)),
        }
    }

    /// Takes this session's sandbox `name` out of it (its VM is then the caller's to close).
    pub fn take(&self, name: &str) -> Option<Arc<Owned>> {
        self.lock().boxes.remove(name)
    }

    /// Keeps a server started in a sandbox until the sandbox or the session ends.
    pub fn add_server(&self, target: &Target, serving: Serving) {
        match target {
            Target::Owned(o) => o.servers.locked().push(serving),
            Target::Kept(_) => self.lock().kept_servers.push(serving),
        }
    }

    /// This session's sandboxes and the kept ones, by name.
    pub fn list(&self) -> Vec<(String, Listed)> {
        let mut out: Vec<(String, Listed)> = self
            .lock()
            .boxes
            .iter()
            .map(|(name, o)| {
                let servers = o.servers.locked();
                let urls = servers
                    .iter()
                    .filter(|s| s.running())
                    .flat_map(|s| s.published().iter().map(|p| p.url()))
                    .collect();
                (
                    name.clone(),
                    Listed {
                        kept: false,
                        state: "running".into(),
                        info: Some(o.info.clone()),
                        memory_mib: o.info.memory_mib,
                        urls,
                    },
                )
            })
            .collect();
        if let Ok(records) = self.host.runtime.ps() {
            for r in records {
                if !is_kept(&r) {
                    continue;
                }
                out.push((
                    r.name.clone(),
                    Listed {
                        kept: true,
                        state: r.effective_state().as_str().into(),
                        info: None,
                        memory_mib: r.mem_mib,
                        urls: Vec::new(),
                    },
                ));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// How many kept sandboxes run now (they count toward `--max-vms` when one is made).
    pub fn kept_running(&self) -> usize {
        self.host.runtime.ps().map_or(0, |rs| {
            rs.iter()
                .filter(|r| is_kept(r))
                .filter(|r| r.effective_state() != VmState::Exited)
                .count()
        })
    }

    /// Ends the session: every VM it booted is killed (its run directory goes with the last
    /// reference), every server it started stops. Idempotent; later inserts are refused.
    pub fn end(&self) {
        let (boxes, runs, kept_servers) = {
            let mut inner = self.lock();
            inner.ended = true;
            (
                std::mem::take(&mut inner.boxes),
                std::mem::take(&mut inner.runs),
                std::mem::take(&mut inner.kept_servers),
            )
        };
        if !boxes.is_empty() || !runs.is_empty() {
            tracing::info!(
                sandboxes = boxes.len(),
                runs = runs.len(),
                "mcp: the session ended; removing its VMs"
            );
        }
        drop(kept_servers);
        for (_, o) in boxes {
            o.servers.locked().clear();
            o.vm.machine().close_now();
        }
        for (_, vm) in runs {
            vm.machine().close_now();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.end();
    }
}

fn is_kept(r: &Record) -> bool {
    r.labels.get(KEPT_LABEL).map(String::as_str) == Some("kept")
}

/// One line of `sandbox_list`.
pub struct Listed {
    pub kept: bool,
    pub state: String,
    pub info: Option<Info>,
    pub memory_mib: i64,
    pub urls: Vec<String>,
}

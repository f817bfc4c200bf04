//! [`NamedVm`]: a VM started by `vm run -d --name NAME`, found by its record and attached
//! through its agent socket ([`RunningVm`]). The CLI (`vm exec NAME`, `vm cp`, `vm pause`)
//! and the Python SDK (`Sandbox.attach`) use this one implementation.
//!
//! Attaching never owns the VM: dropping a `NamedVm` only closes its connections; the VM's
//! holder (the detached supervisor) keeps it running until `vm stop`/`vm rm -f` or its wall
//! lifetime. Pausing goes through that holder too ([`set_paused`]): it stops every VM process
//! on `SIGUSR1`, resumes them on `SIGUSR2`, and records the new state.

use std::ops::Deref;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vm_spec::{Policy, Spec, Trust};

use super::{Record, Runtime, StateError, VmState};
use crate::error::SandboxError;
use crate::running::{Attach, RunningVm};
use vm_sys::control::{self, Signal};

/// How long the holder gets to report a pause or resume (it waits for every VM thread).
const CHANGE_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// What `vm run -d` asks the supervisor to boot (stored in the record as `request`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartRequest {
    pub spec: Spec,
    pub trust: Trust,
    pub policy: Policy,
    pub driver: Option<String>,
    /// Default working directory for `vm exec NAME` (guest path).
    pub workdir: Option<String>,
    /// The snapshot directory to restore instead of booting (`vm run -d --from`); `spec` is
    /// then the snapshot's own, recorded with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<std::path::PathBuf>,
    /// Each host mount's DAX window in MiB ([`crate::Options::dax_window_mib`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dax_window_mib: Option<u32>,
}

/// Errors of attaching to a named VM and of pausing it.
#[derive(Debug, thiserror::Error)]
pub enum NamedError {
    /// The record could not be found or read (an unknown name is [`StateError::NotFound`]).
    #[error(transparent)]
    State(#[from] StateError),
    #[error("VM {name} is paused; `vm unpause {name}` first")]
    Paused { name: String },
    #[error("VM {name} is {state}{why}; start one with `vm run -d --name {name}`")]
    NotRunning {
        name: String,
        state: &'static str,
        why: String,
    },
    #[error("VM {0} has no agent socket recorded")]
    NoSocket(String),
    #[error("VM {name}: the request in its record cannot be read")]
    Request {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("attaching to VM {name}")]
    Attach {
        name: String,
        #[source]
        source: Box<SandboxError>,
    },
    #[error("VM {name} is already {state}")]
    Already { name: String, state: &'static str },
    #[error("VM {name} is {state}")]
    Wrong { name: String, state: &'static str },
    #[error(
        "VM {name} cannot be paused: its holder takes no pause requests (a `vm serve` before \
         its server is ready)"
    )]
    NotPausable { name: String },
    #[error("signalling the holder of VM {name}")]
    Signal {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("VM {name} is {state} (see its supervisor.log)")]
    Unchanged { name: String, state: &'static str },
}

/// A running named VM, attached (see the module docs). Dereferences to [`RunningVm`] and so
/// to [`crate::Guest`].
#[derive(Debug)]
pub struct NamedVm {
    runtime: Runtime,
    record: Record,
    request: StartRequest,
    vm: RunningVm,
}

impl NamedVm {
    /// Attaches to the VM `name` of `runtime`. Refuses an unknown name, a VM that is not
    /// running (paused, exited, still starting) and a record without an agent socket.
    pub fn attach(runtime: &Runtime, name: &str) -> Result<NamedVm, NamedError> {
        let record = running_record(runtime, name)?;
        let Some(sock) = record.agent_socket.clone() else {
            return Err(NamedError::NoSocket(name.to_string()));
        };
        let request: StartRequest =
            serde_json::from_value(record.request.clone()).map_err(|source| {
                NamedError::Request {
                    name: name.to_string(),
                    source,
                }
            })?;
        let vm = RunningVm::attach(Attach {
            agent_socket: sock,
            spec: request.spec.clone(),
        })
        .map_err(|source| NamedError::Attach {
            name: name.to_string(),
            source: Box::new(source),
        })?;
        Ok(NamedVm {
            runtime: runtime.clone(),
            record,
            request,
            vm,
        })
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.record.name
    }

    /// The record as it was when attached.
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// The VM's state directory (its record, logs, sockets).
    pub fn dir(&self) -> std::path::PathBuf {
        self.runtime.dir(&self.record.name)
    }

    /// The request the VM was started from (its spec, trust, default working directory).
    pub fn request(&self) -> &StartRequest {
        &self.request
    }

    /// The VM's record now (its state, its processes).
    pub fn current(&self) -> Result<Record, StateError> {
        self.runtime.load(&self.record.name)
    }

    /// Ok while the VM is still running; else why not (paused, exited: its reason), so a
    /// guest call on a VM another command paused or stopped fails at once with that reason.
    pub fn check(&self) -> Result<(), NamedError> {
        running_record(&self.runtime, &self.record.name).map(drop)
    }

    /// Pauses (`true`) or resumes the VM through its holder ([`set_paused`]).
    pub async fn set_paused(&self, pause: bool) -> Result<(), NamedError> {
        set_paused(&self.runtime, &self.record.name, pause).await
    }
}

impl Deref for NamedVm {
    type Target = RunningVm;

    fn deref(&self) -> &RunningVm {
        &self.vm
    }
}

/// VM `name`'s record, cleaned if stale, when it says the VM is running.
fn running_record(rt: &Runtime, name: &str) -> Result<Record, NamedError> {
    let mut record = rt.load(name)?;
    rt.reap_stale(&mut record)?;
    match record.effective_state() {
        VmState::Running => Ok(record),
        VmState::Paused => Err(NamedError::Paused {
            name: name.to_string(),
        }),
        state => Err(NamedError::NotRunning {
            name: name.to_string(),
            state: state.as_str(),
            why: record
                .exit_reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
        }),
    }
}

/// Pauses (`pause`) or resumes VM `name`: signals its holder (`SIGUSR1`/`SIGUSR2`) and
/// waits until the record says the new state (every VM process stopped or continued).
pub async fn set_paused(rt: &Runtime, name: &str, pause: bool) -> Result<(), NamedError> {
    let mut record = rt.load(name)?;
    rt.reap_stale(&mut record)?;
    let (from, to) = if pause {
        (VmState::Running, VmState::Paused)
    } else {
        (VmState::Paused, VmState::Running)
    };
    let name = name.to_string();
    let state = record.effective_state();
    if state == to {
        return Err(NamedError::Already {
            name,
            state: to.as_str(),
        });
    }
    if state != from {
        return Err(NamedError::Wrong {
            name,
            state: state.as_str(),
        });
    }
    let Some(holder) = record.supervisor.filter(|_| record.pausable) else {
        return Err(NamedError::NotPausable { name });
    };
    // The holder's identity (pid + start time) was just checked by effective_state.
    let sig = if pause { Signal::User1 } else { Signal::User2 };
    if let Err(source) = control::signal(holder.pid, sig) {
        return Err(NamedError::Signal { name, source });
    }
    let deadline = Instant::now() + CHANGE_WAIT;
    loop {
        let state = rt.load(&name)?.effective_state();
        if state == to {
            return Ok(());
        }
        if state != from || Instant::now() >= deadline {
            return Err(NamedError::Unchanged {
                name,
                state: state.as_str(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

//! One module per subcommand group.

pub mod cp;
pub mod drivers;
pub mod exec;
pub mod images;
pub mod manage;
pub mod pause;
pub mod run;
pub mod serve;
pub mod stats;

use vm_sandbox::{Attach, RunningVm};

use crate::exit;
use crate::state::{Runtime, VmState};
use crate::supervisor::StartRequest;

/// A running named VM, attached through its record's agent socket, with the request it
/// was started from. Refuses a VM that is not running.
pub fn attach(rt: &Runtime, name: &str) -> anyhow::Result<(RunningVm, StartRequest)> {
    let mut record = rt.load(name)?;
    rt.reap_stale(&mut record)?;
    let state = record.effective_state();
    if state == VmState::Paused {
        return Err(exit::failed(format!(
            "VM {name} is paused; `vm unpause {name}` first"
        )));
    }
    if state != VmState::Running {
        let why = record
            .exit_reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        return Err(exit::failed(format!(
            "VM {name} is {}{why}; start one with `vm run -d --name {name}`",
            state.as_str()
        )));
    }
    let Some(sock) = record.agent_socket.clone() else {
        return Err(exit::failed(format!(
            "VM {name} has no agent socket recorded"
        )));
    };
    let request: StartRequest = serde_json::from_value(record.request)?;
    let vm = RunningVm::attach(Attach {
        agent_socket: sock,
        spec: request.spec.clone(),
    })?;
    Ok((vm, request))
}

//! One module per subcommand group.

pub mod cp;
pub mod drivers;
pub mod exec;
pub mod images;
pub mod manage;
pub mod run;
pub mod serve;

use guest_agent::AgentClient;

use crate::exit;
use crate::state::{Record, Runtime, VmState};

/// The agent client of a running named VM (its record's hybrid-vsock socket), with the
/// record. Refuses a VM that is not running.
pub fn attach(rt: &Runtime, name: &str) -> anyhow::Result<(AgentClient, Record)> {
    let mut record = rt.load(name)?;
    rt.reap_stale(&mut record)?;
    let state = record.effective_state();
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
    let client = vm_drivers::attach_client(&sock).map_err(|e| {
        let e = anyhow::Error::new(e);
        exit::failed(format!("VM {name}: {}", exit::one_line(&e)))
    })?;
    Ok((client, record))
}

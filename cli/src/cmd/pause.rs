//! `vm pause` and `vm unpause`: the VM's holder (a `vm run -d` supervisor, or a `vm serve`
//! once its server is ready) stops (or continues) every host process of the VM, as
//! `docker pause` freezes a container's cgroup; the record says `paused` while it is. A paused
//! VM refuses `vm exec`/`vm cp` and its published ports drop new connections until unpaused;
//! `vm stop` works either way.

use std::time::{Duration, Instant};

use vm_sandbox::sys::{self, Signal};

use crate::exit;
use crate::output::{errln, outln};
use crate::state::{Runtime, VmState};

/// How long the supervisor gets to report the change (it waits for every VM thread to stop).
const CHANGE_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// `vm pause NAME…` (`pause`) or `vm unpause NAME…`.
pub async fn run(names: &[String], pause: bool) -> anyhow::Result<u8> {
    let rt = Runtime::from_env()?;
    let mut code = exit::OK;
    let verb = if pause { "pause" } else { "unpause" };
    for name in names {
        match change(&rt, name, pause).await {
            Ok(()) => outln!("{name}"),
            Err(e) => {
                errln!("vm: {verb} {name}: {}", exit::one_line(&e));
                code = exit::classify(&e);
            }
        }
    }
    Ok(code)
}

async fn change(rt: &Runtime, name: &str, pause: bool) -> anyhow::Result<()> {
    let mut record = rt.load(name)?;
    rt.reap_stale(&mut record)?;
    let (from, to) = if pause {
        (VmState::Running, VmState::Paused)
    } else {
        (VmState::Paused, VmState::Running)
    };
    let state = record.effective_state();
    if state == to {
        return Err(exit::failed(format!(
            "VM {name} is already {}",
            to.as_str()
        )));
    }
    if state != from {
        return Err(exit::failed(format!("VM {name} is {}", state.as_str())));
    }
    let Some(sup) = record.supervisor.filter(|_| record.pausable) else {
        return Err(exit::failed(format!(
            "VM {name} cannot be paused: its holder takes no pause requests (a `vm serve` \
             before its server is ready)"
        )));
    };
    // The supervisor's identity (pid + start time) was just checked by effective_state.
    let sig = if pause { Signal::User1 } else { Signal::User2 };
    sys::signal(sup.pid, sig)?;
    let deadline = Instant::now() + CHANGE_WAIT;
    loop {
        let state = rt.load(name)?.effective_state();
        if state == to {
            return Ok(());
        }
        if state != from || Instant::now() >= deadline {
            return Err(exit::failed(format!(
                "VM {name} is {} (see its supervisor.log)",
                state.as_str()
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

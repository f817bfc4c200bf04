//! [`Link`]: how the sandbox reaches a guest's agent — through the [`Machine`] this process
//! booted (which fails fast once the VM is closed, expired, stopped or paused), or through the
//! agent socket of a VM another process holds (a named VM's record). Every guest operation
//! of [`crate::Guest`] and [`crate::Serving`] is one [`Link::call`] of an [`AgentClient`]
//! method, so both kinds of VM share one call path and a new agent request needs nothing
//! here; agent errors come back as [`MachineError::Agent`] either way.

use std::future::Future;
use std::sync::Arc;

use vm_agent_client::{AgentClient, ClientError};
use vm_drivers::{Machine, MachineError};

/// The way to one guest's agent.
#[derive(Debug, Clone)]
pub(crate) enum Link {
    /// A VM booted (and owned) by this process.
    Booted(Arc<Machine>),
    /// A VM held by another process, reached through its agent socket.
    Attached(AgentClient),
}

impl Link {
    /// Runs one agent call, `op(client)`, on either kind of link: `link.call(|c| c.exec(req))`.
    /// A booted VM's call is guarded by its [`Machine::call`].
    pub(crate) async fn call<'a, T, Fut>(
        &'a self,
        op: impl FnOnce(&'a AgentClient) -> Fut,
    ) -> Result<T, MachineError>
    where
        Fut: Future<Output = Result<T, ClientError>>,
    {
        match self {
            Link::Booted(m) => m.call(op).await,
            Link::Attached(c) => op(c).await.map_err(MachineError::Agent),
        }
    }
}

//! [`Link`]: how the sandbox reaches a guest's agent — through the [`Machine`] this process
//! booted (which fails fast once the VM is closed, expired or stopped), or through the
//! agent socket of a VM another process holds (a named VM's record). Every guest operation
//! of [`crate::Guest`] and [`crate::Serving`] goes through it, so both kinds of VM share one
//! implementation; agent errors come back as [`MachineError::Agent`] either way.

use std::sync::Arc;

use guest_agent::client::{AgentClient, ClientError, ExecStream, ForwardStream, Interactive};
use guest_agent::protocol::{
    ExecOutput, ExecRequest, FileEntry, InteractiveRequest, ServeId, ServeRequest, ServeStatus,
};
use guest_agent::sparse::ChunkSink;
use tokio::io::AsyncRead;
use vm_drivers::{Machine, MachineError};

/// The way to one guest's agent.
#[derive(Debug, Clone)]
pub(crate) enum Link {
    /// A VM booted (and owned) by this process.
    Booted(Arc<Machine>),
    /// A VM held by another process, reached through its agent socket.
    Attached(AgentClient),
}

/// Runs the same agent call on either kind of link.
macro_rules! call {
    ($link:expr, $method:ident ( $($arg:expr),* )) => {
        match $link {
            Link::Booted(m) => m.$method($($arg),*).await,
            Link::Attached(c) => c.$method($($arg),*).await.map_err(agent),
        }
    };
}

fn agent(e: ClientError) -> MachineError {
    MachineError::Agent(e)
}

impl Link {
    pub(crate) async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, MachineError> {
        call!(self, exec(req))
    }

    pub(crate) async fn exec_stream(&self, req: ExecRequest) -> Result<ExecStream, MachineError> {
        call!(self, exec_stream(req))
    }

    pub(crate) async fn exec_interactive(
        &self,
        req: InteractiveRequest,
    ) -> Result<Interactive, MachineError> {
        call!(self, exec_interactive(req))
    }

    pub(crate) async fn read_file(&self, root: &str, path: &str) -> Result<Vec<u8>, MachineError> {
        call!(self, read_file(root, path))
    }

    pub(crate) async fn write_file(
        &self,
        root: &str,
        path: &str,
        data: &[u8],
    ) -> Result<(), MachineError> {
        call!(self, write_file(root, path, data))
    }

    pub(crate) async fn make_dirs(
        &self,
        path: &str,
        owner: Option<&str>,
    ) -> Result<(), MachineError> {
        call!(self, make_dirs(path, owner))
    }

    pub(crate) async fn read_file_to<S: ChunkSink>(
        &self,
        root: &str,
        path: &str,
        max: u64,
        out: &mut S,
    ) -> Result<u64, MachineError> {
        call!(self, read_file_to(root, path, max, out))
    }

    pub(crate) async fn write_file_from<R: AsyncRead + Unpin>(
        &self,
        root: &str,
        path: &str,
        max: u64,
        src: &mut R,
    ) -> Result<u64, MachineError> {
        call!(self, write_file_from(root, path, max, src))
    }

    pub(crate) async fn list(
        &self,
        root: &str,
        path: &str,
    ) -> Result<Vec<FileEntry>, MachineError> {
        call!(self, list(root, path))
    }

    pub(crate) async fn serve_start(&self, req: ServeRequest) -> Result<ServeId, MachineError> {
        call!(self, serve_start(req))
    }

    pub(crate) async fn serve_status(&self, id: ServeId) -> Result<ServeStatus, MachineError> {
        call!(self, serve_status(id))
    }

    pub(crate) async fn serve_stop(&self, id: ServeId) -> Result<ServeStatus, MachineError> {
        call!(self, serve_stop(id))
    }

    pub(crate) async fn forward(&self, port: u16) -> Result<ForwardStream, MachineError> {
        call!(self, forward(port))
    }
}

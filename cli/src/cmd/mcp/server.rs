//! The MCP server: its tools, each a thin call into [`calls`](super::calls) with the call's
//! parameters and its cancellation, and the server's description of itself.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, Implementation, ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use tokio_util::sync::CancellationToken;

use super::calls::Calls;
use super::host::Host;
use super::session::Session;
use super::tools::{
    CreateParams, ExecParams, ListParams, NameParams, NoParams, ReadParams, RunCodeParams,
    RunParams, ServeParams, WriteParams,
};

/// How the session reaches the server, which decides the protocol revisions it offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// One session per process: every revision, 2026-07-28's stateless one included.
    Stdio,
    /// Sessions (`Mcp-Session-Id`): the revisions up to 2025-11-25. The 2026-07-28 revision
    /// has no sessions over HTTP, and a sandbox belongs to the session that made it.
    Http,
}

const INSTRUCTIONS: &str = "Runs commands and code in microVMs: a separate Linux kernel per VM, no network \
device, read-only host mounts, capped memory, processes and lifetime. `run` and `run_code` use \
a fresh VM per call, torn down when the call ends. For state across calls, `sandbox_create` a \
sandbox, then `sandbox_exec`, `sandbox_write_file`, `sandbox_read_file`, `sandbox_list_files`, \
`sandbox_serve` (a guest port on a loopback URL), and `sandbox_remove` it; a sandbox is removed \
when this session ends unless it was created with keep and a name. Files live under /work. \
Output is cut at the server's limit, and the result says so; a refused argument is an error \
naming it.";

/// The `vm mcp` tool server of one session.
#[derive(Clone)]
pub struct VmMcp {
    calls: Arc<Calls>,
    transport: Transport,
    tool_router: ToolRouter<Self>,
}

impl VmMcp {
    pub fn new(host: Arc<Host>, session: Arc<Session>, transport: Transport) -> VmMcp {
        VmMcp {
            calls: Arc::new(Calls::new(host, session)),
            transport,
            tool_router: Self::tool_router(),
        }
    }
}

#[tool_router]
impl VmMcp {
    #[tool(
        description = "Run a shell command (/bin/sh -c) in a fresh microVM that is torn down when it ends. Returns the exit code, stdout and stderr apart, each cut at the server's limit (the result says so). Cancelling the call kills the command."
    )]
    async fn run(
        &self,
        Parameters(p): Parameters<RunParams>,
        ct: CancellationToken,
    ) -> CallToolResult {
        self.calls.run(p, ct).await
    }

    #[tool(
        description = "Run a code snippet (python, sh, bash or node, given on the interpreter's stdin) in a fresh microVM that is torn down when it ends. Returns the exit code, stdout and stderr apart."
    )]
    async fn run_code(
        &self,
        Parameters(p): Parameters<RunCodeParams>,
        ct: CancellationToken,
    ) -> CallToolResult {
        self.calls.run_code(p, ct).await
    }

    #[tool(
        description = "Create a sandbox: a microVM that stays for later calls (sandbox_exec, files, sandbox_serve). It is removed when this session ends, unless created with keep and a name."
    )]
    async fn sandbox_create(
        &self,
        Parameters(p): Parameters<CreateParams>,
        ct: CancellationToken,
    ) -> CallToolResult {
        self.calls.create(p, ct).await
    }

    #[tool(description = "Remove a sandbox: its VM is powered off and everything in it is gone.")]
    async fn sandbox_remove(&self, Parameters(p): Parameters<NameParams>) -> CallToolResult {
        self.calls.remove(p).await
    }

    #[tool(
        description = "Run a shell command (/bin/sh -c) in a sandbox. Returns the exit code, stdout and stderr apart, each cut at the server's limit. Cancelling the call kills the command's process tree."
    )]
    async fn sandbox_exec(
        &self,
        Parameters(p): Parameters<ExecParams>,
        ct: CancellationToken,
    ) -> CallToolResult {
        self.calls.exec(p, ct).await
    }

    #[tool(
        description = "Read a file in a sandbox (a path under /work). Text comes back as text, other bytes as base64; a file larger than the server's limit comes back cut, and the result says so."
    )]
    async fn sandbox_read_file(&self, Parameters(p): Parameters<ReadParams>) -> CallToolResult {
        self.calls.read(p).await
    }

    #[tool(
        description = "Write a file in a sandbox (a path under /work; parent directories are created; an existing file is replaced)."
    )]
    async fn sandbox_write_file(&self, Parameters(p): Parameters<WriteParams>) -> CallToolResult {
        self.calls.write(p).await
    }

    #[tool(
        description = "List the regular files under a directory of a sandbox (recursively, relative to /work)."
    )]
    async fn sandbox_list_files(&self, Parameters(p): Parameters<ListParams>) -> CallToolResult {
        self.calls.list_files(p).await
    }

    #[tool(
        description = "Start a server in a sandbox and publish its guest TCP port on a host loopback URL, returned once the port accepts connections (and ready_path answers 2xx). It stops when the sandbox or this session ends."
    )]
    async fn sandbox_serve(
        &self,
        Parameters(p): Parameters<ServeParams>,
        ct: CancellationToken,
    ) -> CallToolResult {
        self.calls.serve(p, ct).await
    }

    #[tool(description = "List the sandboxes this session can use: its own and the kept ones.")]
    async fn sandbox_list(&self, Parameters(_): Parameters<NoParams>) -> CallToolResult {
        self.calls.list()
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for VmMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("vm", env!("CARGO_PKG_VERSION"))
                    .with_title("vm: microVM sandboxes"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        match self.transport {
            Transport::Stdio => Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS),
            Transport::Http => {
                Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
            }
        }
    }
}

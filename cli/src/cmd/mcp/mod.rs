//! `vm mcp`: the sandbox as Model Context Protocol tools, for agent hosts (desktop assistants,
//! IDEs, agent frameworks) that start a tool server over stdio or reach one over streamable
//! HTTP. Built on the official Rust SDK (`rmcp`).
//!
//! - [`host`]: what the host decided on the command line (trust, policy, limits as defaults
//!   and ceilings, the images and host directories a call may ask for), and the one place a
//!   tool call's ask becomes a [`vm_sandbox::Request`] or a refusal naming the argument;
//! - [`tools`]: the tools' parameters (their JSON schemas are the tools' input schemas);
//! - [`server`]: the tools and the server's description of itself; [`calls`] and [`files`]:
//!   what each tool does, through the API as the CLI's other commands go (`MicroVm::boot`,
//!   `Guest`, `NamedVm::attach`); [`fault`]: a call that did nothing, as a tool error;
//! - [`session`]: one client's sandboxes, removed when its session ends unless a call named
//!   one to outlive it (`keep`: a named VM held by a supervisor, as `vm run -d` makes);
//! - [`output`]: a guest command's output, bounded, cancelled as Ctrl-C cancels `vm exec`;
//! - [`http`]: streamable HTTP on a loopback address with a bearer token; stdio is here.

mod calls;
mod fault;
mod files;
mod host;
mod http;
mod output;
mod server;
mod session;
mod tools;

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use rmcp::ServiceExt;

use crate::args::{CmdOpts, VmOpts};
use crate::exit;
use crate::parse;
use crate::stream::Signals;

/// Serve sandboxes as MCP tools to an agent host, over stdio or streamable HTTP.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm mcp --allow-emulation                                   # stdio: what an agent host starts
  vm mcp --allow-emulation --image 127.0.0.1:5000/python:3.11 --memory 512M --max-memory 2G
  vm mcp --allow-emulation --allow-mount /srv/datasets       # calls may mount paths under it (read-only)
  vm mcp --http 127.0.0.1:0 --allow-emulation                # prints the URL and a bearer token

Tools: run (a command in a fresh microVM), run_code (a snippet: python, sh, bash, node),
sandbox_create, sandbox_remove, sandbox_exec, sandbox_read_file, sandbox_write_file,
sandbox_list_files, sandbox_serve (a guest port on a loopback URL), sandbox_list.

The flags decide what a tool call may ask for: trust and driver policy as `vm exec`'s;
--memory/--timeout (default 256M, 10m) are the defaults and, unless --max-memory or
--max-timeout say more, the ceilings; -v mounts and -e variables apply to every sandbox; a
call's image must be --image or an --allow-image; a call's mounts must lie under an
--allow-mount directory (read-only, as always). Each stream of a command's output is cut at --max-output (the result says so). A
cancelled call kills the guest command tree, as Ctrl-C does. A sandbox is removed when the
session that created it ends (stdin closes; over HTTP the session is deleted or idles out),
unless it was created with keep and a name: then it is a named VM (`vm ps`, `vm exec NAME`,
`vm rm -f NAME`).

Over HTTP the address must be loopback (127.0.0.0/8 or ::1); every request needs the header
`Authorization: Bearer TOKEN` ($VM_MCP_TOKEN, at least 32 characters, or one made at start);
the URL and the token are printed on stdout.")]
pub struct McpArgs {
    /// Serve streamable HTTP on this loopback address instead of stdio (port 0: a free one)
    #[arg(long, value_name = "IP:PORT")]
    pub http: Option<String>,
    /// Another image a tool call may ask for (besides --image, the default); repeatable
    #[arg(long = "allow-image", value_name = "REF")]
    pub allow_images: Vec<String>,
    /// A host directory whose files a tool call may mount (always read-only); repeatable
    #[arg(long = "allow-mount", value_name = "DIR")]
    pub allow_mounts: Vec<std::path::PathBuf>,
    /// The most memory a tool call may ask for [default: --memory]
    #[arg(long, value_name = "SIZE", value_parser = parse::mem_mib)]
    pub max_memory: Option<i64>,
    /// The longest VM lifetime a tool call may ask for [default: --timeout]
    #[arg(long, value_name = "DURATION", value_parser = parse::duration)]
    pub max_timeout: Option<Duration>,
    /// The most bytes of each output stream (stdout, stderr) or file a result carries
    #[arg(long, value_name = "SIZE", default_value = "64K", value_parser = output_size)]
    pub max_output: usize,
    /// The most VMs this server runs at once (fresh `run` VMs and sandboxes, all sessions)
    #[arg(long, value_name = "N", default_value_t = 8,
        value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_vms: u32,
    /// How long an HTTP session may stay idle before it ends (and its sandboxes with it)
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = parse::duration)]
    pub session_idle: Duration,
    #[command(flatten)]
    pub vm: VmOpts,
    #[command(flatten)]
    pub cmd: CmdOpts,
}

/// `--max-output`: like a size flag, but kibibytes are fine (at least 1 KiB, at most 64 MiB).
fn output_size(s: &str) -> Result<usize, parse::ParseError> {
    let t = s.trim();
    let bytes = match t.strip_suffix(['K', 'k']) {
        Some(k) => k.parse::<u64>().ok().map(|k| k * 1024),
        None => parse::byte_size(t).ok(),
    };
    match bytes {
        Some(b) if (1024..=64 << 20).contains(&b) => Ok(b as usize),
        _ => Err(parse::ParseError(format!(
            "invalid size {s:?}: give 1K to 64M (K, M suffix)"
        ))),
    }
}

/// The VM lifetime when neither the host nor the call gives one: a tool call that hangs
/// must not hold a VM for ever.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// `vm mcp`.
pub async fn run(a: McpArgs) -> anyhow::Result<u8> {
    let host = host::Host::new(&a)?;
    let mut signals = Signals::install()?;
    match &a.http {
        Some(addr) => {
            let addr: SocketAddr = addr
                .parse()
                .map_err(|_| exit::usage(format!("--http {addr:?}: expected IP:PORT")))?;
            http::serve(host, addr, a.session_idle, &mut signals).await
        }
        None => stdio(host, &mut signals).await,
    }
}

/// One session over stdin/stdout: it ends when the client closes stdin (or on SIGINT or
/// SIGTERM), and its sandboxes with it.
async fn stdio(host: host::Host, signals: &mut Signals) -> anyhow::Result<u8> {
    let host = std::sync::Arc::new(host);
    let session = session::Session::new(host.clone());
    let server = server::VmMcp::new(host, session.clone(), server::Transport::Stdio);
    let running = server
        .serve(rmcp::transport::stdio_pipes())
        .await
        .map_err(|e| exit::failed(format!("mcp: the session did not start: {e}")))?;
    let ct = running.cancellation_token();
    tokio::select! {
        ended = running.waiting() => {
            if let Err(e) = ended {
                tracing::info!("mcp: the session ended: {e}");
            }
        }
        sig = signals.recv() => {
            tracing::info!("{sig}: ending the MCP session");
            ct.cancel();
        }
    }
    session.end();
    Ok(exit::OK)
}

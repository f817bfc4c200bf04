//! `vm`: the command line of the microVM runtime.
//!
//! The CLI parses (clap derive, [`args`]), calls the library crates (`vm-sandbox` and
//! `vm-spec`, nothing below them), prints, and maps errors to exit codes ([`exit`], the one
//! table). Everything with a policy decision in it lives in the libraries: spec validation
//! and admission in `vm-spec`; driver selection, booting, the records of named VMs and attaching to one, the
//! rules of every guest operation, publish-spec normalization and the image cache in
//! `vm-sandbox`. What the CLI owns itself:
//! - flag value syntax ([`parse`]): sizes, durations, `-v`, `-e`, VM names; resolving the
//!   flags into a spec, trust and policy ([`resolve`]);
//! - stopping and removing named VMs (their records and the runtime state directory are
//!   `vm_sandbox::state`, shared with the Python SDK);
//! - the detached supervisor ([`supervisor`]) that holds a `vm run -d` VM: `vm` re-executed
//!   as the hidden `__supervise` subcommand in its own session, stdio to a log file;
//! - streaming a guest command's output and forwarding Ctrl-C/SIGTERM as a cancel of the
//!   guest command tree ([`stream`]); `vm exec -i`/`-t` sessions: stdin, raw terminal,
//!   window size ([`interactive`], terminal calls in [`sys`]);
//! - output formatting ([`output`]).
//!
//! Data flows one way: CLI -> vm-sandbox (validate -> admit -> select -> boot, or attach)
//! -> driver -> machine -> agent client -> agent.
//!
//! No `unsafe` here: process control (signals, sessions, uid) is `vm_sys::control`.

#![forbid(unsafe_code)]
// Every print goes through `output`'s macros, which survive a closed stdout/stderr.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod cmd;
mod dryrun;
mod exit;
mod interactive;
mod output;
mod parse;
mod resolve;
mod stream;
mod supervisor;

use std::io::Write;

use clap::Parser;
/// The state directory of named VMs: `vm_sandbox::state`, shared with the Python SDK.
use vm_sandbox::state;

use crate::args::{Cli, Command};
use crate::output::errln;

fn init_logging(quiet: bool, verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let level = match (quiet, verbose) {
        (true, _) => "error",
        // rmcp warns about every answer that is an error, the -32022 that steers an MCP
        // client probing for the stateless revision to `vm mcp --http`'s sessions included.
        (false, 0) => "warn,rmcp=error",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(verbose >= 2);
    // A failure here means a subscriber is already installed; nothing to do about it.
    let _ = if verbose >= 2 {
        builder.try_init()
    } else {
        builder.without_time().try_init()
    };
}

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    // Whatever a killed `vm` or supervisor left behind goes first (best effort: a runtime
    // directory we cannot use is reported by the command that needs it).
    if let Ok(rt) = state::Runtime::from_env() {
        rt.sweep();
    }
    match cli.command {
        Command::Exec(a) => cmd::exec::run(a).await,
        Command::Run(a) => cmd::run::run(a).await,
        Command::Serve(a) => cmd::serve::run(a).await,
        Command::Ps(a) => cmd::manage::ps(a).await,
        Command::Stats(a) => cmd::stats::run(a).await,
        Command::Stop(a) => cmd::manage::stop(a).await,
        Command::Pause(a) => cmd::pause::run(&a.names, true).await,
        Command::Unpause(a) => cmd::pause::run(&a.names, false).await,
        Command::Rm(a) => cmd::manage::rm(a).await,
        Command::Logs(a) => cmd::manage::logs(a).await,
        Command::Cp(a) => cmd::cp::run(a).await,
        Command::Drivers(a) => cmd::drivers::run(a),
        Command::Images(a) => cmd::images::run(a).await,
        Command::Snapshot(a) => cmd::snapshot::run(a).await,
        Command::Mcp(a) => cmd::mcp::run(a).await,
        Command::Supervise(a) => supervisor::run(a).await,
    }
}

fn main() {
    let cli = Cli::parse();
    init_logging(cli.quiet, cli.verbose);
    // No thread_keep_alive workaround: vm-drivers forks its helper processes (armed with
    // PR_SET_PDEATHSIG, which fires when the *forking thread* exits) from its own
    // process-lifetime spawner thread, so tokio retiring an idle blocking thread that ran a
    // boot cannot kill a VM (lifecycle.rs keeps a `run -d` VM idle past tokio's 10 s).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let code = match runtime {
        Ok(rt) => {
            let result = rt.block_on(dispatch(cli));
            // Let blocking teardown finish before exiting, but never hang on it.
            rt.shutdown_timeout(std::time::Duration::from_secs(10));
            match result {
                Ok(code) => code,
                Err(err) => {
                    let code = exit::classify(&err);
                    errln!("vm: {}", exit::one_line(&err));
                    code
                }
            }
        }
        Err(err) => {
            errln!("vm: cannot start the async runtime: {err}");
            exit::FAILED
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(i32::from(code));
}

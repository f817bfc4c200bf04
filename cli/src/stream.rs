//! Streaming a guest command: output relayed as it comes, Ctrl-C/SIGTERM turned into a
//! cancel of the guest command's whole process tree.

use std::time::Duration;

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{Signal, SignalKind, signal};
use vm_sandbox::agent::{ExecEvent, ExecStream, ExitStatus};

use crate::exit;

/// How long a cancel may take before the connection is dropped (which also kills the
/// guest process tree, from the agent's side).
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// SIGINT and SIGTERM listeners. Installed before anything is booted so an interrupt at
/// any point tears down what was started and exits 130.
pub struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    /// Installs the listeners (this replaces the default "die now" disposition).
    pub fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        })
    }

    /// Resolves when SIGINT or SIGTERM arrives; returns the signal's name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}

/// The exit code for a finished guest command.
pub fn status_code(status: &ExitStatus) -> u8 {
    if status.timed_out {
        exit::TIMEOUT
    } else {
        exit::from_guest(status.code, status.signal)
    }
}

/// Starts a streaming exec with `start`, writing the command's stdout/stderr to ours as
/// chunks arrive. Returns the exit code to use: the command's (see [`status_code`]), or
/// [`exit::INTERRUPTED`] after a signal cancelled it.
pub async fn relay_stream(
    start: impl Future<Output = anyhow::Result<ExecStream>>,
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    let mut stream = tokio::select! {
        s = start => s.context("starting the command in the guest")?,
        sig = signals.recv() => {
            tracing::info!("{sig}: interrupted before the command started");
            return Ok(exit::INTERRUPTED);
        }
    };
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    loop {
        tokio::select! {
            ev = stream.next() => match ev.context("reading the command's output from the guest")? {
                Some(ExecEvent::Stdout(d)) => relay(&mut stdout, &d).await,
                Some(ExecEvent::Stderr(d)) => relay(&mut stderr, &d).await,
                Some(ExecEvent::Exit(status)) => {
                    tracing::debug!(?status, "guest command exited");
                    return Ok(status_code(&status));
                }
                None => anyhow::bail!("the guest closed the command's stream without an exit status"),
            },
            sig = signals.recv() => {
                tracing::info!("{sig}: cancelling the guest command tree");
                // `next` is not cancel-safe mid-frame; if the cancel exchange fails the
                // stream is dropped, which closes the connection and the agent kills the
                // tree anyway.
                match tokio::time::timeout(CANCEL_GRACE, stream.cancel()).await {
                    Ok(Ok(status)) => tracing::debug!(?status, "guest command cancelled"),
                    Ok(Err(e)) => tracing::debug!("cancel exchange failed ({e}); connection dropped"),
                    Err(_) => tracing::debug!("cancel timed out; connection dropped"),
                }
                return Ok(exit::INTERRUPTED);
            }
        }
    }
}

/// Writes a chunk to one of our outputs. A closed output (e.g. `| head`) is not an error
/// for the guest command; its output is discarded from then on.
async fn relay(out: &mut (impl AsyncWriteExt + Unpin), data: &[u8]) {
    if let Err(e) = async {
        out.write_all(data).await?;
        out.flush().await
    }
    .await
    {
        tracing::debug!("dropping guest output: {e}");
    }
}

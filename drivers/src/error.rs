//! Errors of detecting and booting.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use vm_agent_client::ClientError;

/// Why a boot failed. Whatever the variant, no guest and no child process is left running.
#[derive(Debug, Error)]
pub enum DriverError {
    /// This backend cannot boot on this build or platform.
    #[error("{driver}: unsupported: {reason}")]
    Unsupported {
        /// The driver's name.
        driver: &'static str,
        /// Why.
        reason: String,
    },
    /// The boot plan cannot be carried out as given (a missing image, a bad name, ...).
    #[error("invalid boot plan: {reason}")]
    InvalidPlan {
        /// What is wrong, naming the field and value.
        reason: String,
    },
    /// A host file operation failed.
    #[error("{what} {}", .path.display())]
    Io {
        /// The operation ("creating run dir", ...).
        what: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A VM restored from a snapshot did not take its new agent token (`Request::Resume`).
    #[error("the restored agent did not take its new token")]
    Resume {
        /// The agent's answer.
        #[source]
        source: ClientError,
    },
    /// The agent token could not be made, read or written.
    #[error("agent token")]
    Token(#[source] vm_agent_protocol::token::TokenError),
    /// A helper process (or thread) could not be started.
    #[error("cannot start {program}")]
    Spawn {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The jail of a VM process could not be built (the step and its cause).
    #[error("cannot jail {program}")]
    Jail {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: vm_jail::JailError,
    },
    /// A VM process was killed by its seccomp filter (`SIGSYS`) before the agent answered.
    #[error("{program} was killed by SIGSYS: it made a system call outside its seccomp allowlist")]
    SeccompKilled {
        /// The program.
        program: String,
        /// The tail of the guest console and the program's output.
        console_tail: String,
    },
    /// This host cannot build the driver's jail and the caller did not accept a weaker one.
    #[error(
        "{driver}: the jail cannot be built here ({reason}); refusing rather than running \
             the VM unjailed (pass --allow-weaker-jail to accept that)"
    )]
    JailUnavailable {
        /// The driver.
        driver: &'static str,
        /// What is missing.
        reason: String,
    },
    /// A helper process exited or never became ready; `output` is the tail of what it printed.
    #[error("{program} failed: {reason}")]
    Helper {
        /// The program.
        program: String,
        /// What went wrong.
        reason: String,
        /// The tail of its stdout/stderr.
        output: String,
    },
    /// A program the driver runs is not installed where it looks.
    #[error(
        "{program} not found (looked at {searched}); build it (`cargo build -p vmm --bin {program}`) or set the variable named"
    )]
    MissingBinary {
        /// The program.
        program: &'static str,
        /// Every place looked at.
        searched: String,
    },
    /// The guest agent did not answer in time, or the VM stopped before it did.
    #[error("guest agent not ready after {waited:?}: {reason}")]
    AgentNotReady {
        /// How long the driver waited.
        waited: Duration,
        /// Why the wait ended ("timed out", "the VM exited", ...).
        reason: String,
        /// The tail of the guest console, for diagnosis.
        console_tail: String,
        /// The last client error, if any.
        #[source]
        source: Option<ClientError>,
    },
}

impl DriverError {
    /// The guest console's tail (with the VM process's diagnostics) a boot failure carries:
    /// the guest's last words, whichever driver booted it.
    pub fn console_tail(&self) -> Option<&str> {
        match self {
            DriverError::AgentNotReady { console_tail, .. }
            | DriverError::SeccompKilled { console_tail, .. } => Some(console_tail),
            _ => None,
        }
    }
}

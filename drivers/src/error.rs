//! Errors of detecting and booting.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use guest_agent::client::ClientError;
use thiserror::Error;

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
    /// A helper process could not be started.
    #[error("agent token")]
    Token(#[source] guest_agent::token::TokenError),
    #[error("cannot start {program}")]
    Spawn {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: io::Error,
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
    /// The in-process VMM refused the configuration or failed to start.
    #[error("vmm failed")]
    Vmm {
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
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

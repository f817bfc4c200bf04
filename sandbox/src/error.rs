//! [`SandboxError`]: the errors of creating, attaching to and using a sandbox. Library
//! errors keep their cause as `#[source]`, so a caller can map the cause (a refused spec, a
//! failed driver selection, a guest command that was not found) without parsing text.

use thiserror::Error;
use vm_drivers::{DriverError, MachineError};
use vm_spec::SpecError;

use crate::confine::PathError;
use crate::glob::GlobError;
use crate::mounts::MountError;
use crate::select::SelectError;
use crate::serving::ServeError;

/// Errors of creating and using a [`crate::MicroVm`] or a [`crate::RunningVm`].
#[derive(Debug, Error)]
pub enum SandboxError {
    #[error("spec refused")]
    Spec(#[from] SpecError),
    /// A command's environment (the VM's plus its own variables) was refused.
    #[error("environment refused")]
    Env(#[source] SpecError),
    /// No driver was selected; the [`SelectError`] (the cause) lists every diagnosis.
    #[error("selecting a driver")]
    Select(#[from] SelectError),
    /// The booted machine's containment was refused by the admission gate (the cause).
    #[error("admission refused")]
    Admit(#[from] vm_spec::AdmitError),
    #[error("preparing mounts")]
    Mount(#[from] MountError),
    #[error("{0}")]
    Unsupported(&'static str),
    #[error("no command given and the image has no Entrypoint or Cmd")]
    NoCommand,
    #[error("creating run directory")]
    RunDir(#[source] std::io::Error),
    /// Attaching to a running VM: its agent token (beside the socket) could not be read; the
    /// cause names the file.
    #[error("attaching to a running VM")]
    Attach(#[source] DriverError),
    /// The DAX window asked for cannot be had on the selected driver (the cause says why);
    /// refused before anything is created.
    #[error("the DAX window on {driver}")]
    DaxWindow {
        driver: &'static str,
        #[source]
        source: DriverError,
    },
    #[error("boot on {driver} failed")]
    Boot {
        driver: &'static str,
        #[source]
        source: DriverError,
    },
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Glob(#[from] GlobError),
    #[error("{op} failed")]
    Machine {
        op: &'static str,
        #[source]
        source: MachineError,
    },
    /// A host file could not be copied into or out of the guest (the cause says why).
    #[error(transparent)]
    Copy(#[from] crate::guest::CopyError),
    #[error("serve failed")]
    Serve(#[from] ServeError),
    #[error("cannot create the guest root: {0}")]
    Root(String),
    /// A snapshot was not taken, or a restore refused (the cause says which and why).
    #[error(transparent)]
    Snapshot(#[from] crate::snapshots::SnapshotError),
    #[error("a blocking boot task failed: {0}")]
    Join(String),
}

impl SandboxError {
    /// The guest console's tail a boot failure carries (the guest's last words: a kernel
    /// panic, the agent's fatal error), on every driver.
    pub fn console_tail(&self) -> Option<&str> {
        match self {
            SandboxError::Boot { source, .. } => source.console_tail(),
            _ => None,
        }
    }

    /// A `MachineError` of the operation `op`, as a closure for `map_err`.
    pub(crate) fn machine(op: &'static str) -> impl FnOnce(MachineError) -> SandboxError {
        move |source| SandboxError::Machine { op, source }
    }
}

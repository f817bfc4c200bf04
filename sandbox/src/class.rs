//! [`Class`]: what kind of failure an error is, decided once for every front end. The CLI
//! maps a class to an exit code, the Python SDK to an exception, the containerd shim to a
//! ttrpc code, `vm mcp` to a tool error; none of them looks at an error type itself.
//!
//! [`classify`] walks an error's cause chain, outermost first, and stops at the first
//! error whose meaning is known here: a refused spec, a driver selection, an unknown VM, the
//! agent's verdict on a command. Wrappers that only say which step failed (`booting`,
//! `attaching to VM x`) are looked through to their cause. An error nothing here knows is
//! [`Class::Internal`].
//!
//! A class comes with the field a refusal names, when it names one: the spec's field
//! (`guarantees.limits.mem_mib`), the policy's (`allow_emulation`) or the argument's
//! (`driver`, `image`, `ports`), so a front end can point at what to change.

use std::error::Error;

use vm_drivers::{DriverError, MachineError, NoDriverError};
use vm_spec::{AdmitError, SpecError};

use crate::SandboxError;
use crate::agent::{ClientError, ErrorKind};
use crate::confine::PathError;
use crate::glob::GlobError;
use crate::image_root::ImageRootError;
use crate::publish::PublishError;
use crate::request::NoImage;
use crate::select::SelectError;
use crate::serving::ServeError;
use crate::snapshots::SnapshotError;
use crate::state::StateError;
use crate::state::named::NamedError;

/// What kind of failure an error is. The refusals come first: nothing was started and the
/// same call will be refused again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// The call is malformed: an unknown driver, a bad name, a port spec, an image
    /// reference, no command.
    Usage,
    /// A guest path leaves its root (`..`, absolute) or is not a pattern.
    Path,
    /// The spec is refused (`vm-spec`): its field is named.
    Refused,
    /// The host's policy refuses the work: admission, a named driver too weak for it, a
    /// snapshot that cannot be restored here.
    Forbidden,
    /// No driver on this host can contain the work (with a field when a policy flag would
    /// admit one).
    NoDriver,
    /// No VM or snapshot of that name.
    NotFound,
    /// The named VM is not running (exited, stopping, no agent socket).
    NotRunning,
    /// The VM is paused: resume it first.
    Paused,
    /// The VM did not boot.
    BootFailed,
    /// The VM's wall lifetime expired; the VM is gone.
    WallExpired,
    /// The guest (its agent, a copy into or out of it) failed an operation.
    GuestError,
    /// The guest command does not exist.
    CommandNotFound,
    /// The guest command exists and cannot be executed.
    NotExecutable,
    /// The guest agent has no slot left for the request; a later one may find one.
    Busy,
    /// A served process exited or was not ready in time.
    ServeFailed,
    /// A guest image or an OCI image could not be found, pulled or turned into a root.
    Image,
    /// The VM, its driver or its agent does not do this.
    Unsupported,
    /// Anything else: the host, a state directory, a bug.
    Internal,
}

impl Class {
    /// Every class, in the order above.
    pub const ALL: [Class; 18] = [
        Class::Usage,
        Class::Path,
        Class::Refused,
        Class::Forbidden,
        Class::NoDriver,
        Class::NotFound,
        Class::NotRunning,
        Class::Paused,
        Class::BootFailed,
        Class::WallExpired,
        Class::GuestError,
        Class::CommandNotFound,
        Class::NotExecutable,
        Class::Busy,
        Class::ServeFailed,
        Class::Image,
        Class::Unsupported,
        Class::Internal,
    ];

    /// True for the refusals: nothing ran, and the same call is refused again.
    pub fn is_refusal(self) -> bool {
        matches!(
            self,
            Class::Usage | Class::Path | Class::Refused | Class::Forbidden | Class::NoDriver
        )
    }
}

/// An error's [`Class`], with what a front end shows beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    pub class: Class,
    /// The field a refusal names: a spec field (`guarantees.mounts[0].read_only`), a policy
    /// field (`allow_emulation`, `trust`) or an argument (`driver`, `image`, `ports`, `argv`,
    /// `name`, `ready`).
    pub field: Option<String>,
    /// The own message (without its causes) of the error that decided the class; for
    /// [`Class::Internal`] with nothing decided, that of the outermost error.
    pub message: String,
    /// For [`Class::CommandNotFound`] and [`Class::NotExecutable`]: the agent's shell-like
    /// line (`NAME: command not found`, `NAME: cannot execute: REASON`).
    pub command_line: Option<String>,
}

impl Classified {
    fn new(class: Class) -> Classified {
        Classified {
            class,
            field: None,
            message: String::new(),
            command_line: None,
        }
    }

    fn field(class: Class, field: impl Into<String>) -> Classified {
        Classified {
            field: Some(field.into()),
            ..Classified::new(class)
        }
    }
}

impl SandboxError {
    /// This error's class (see [`classify`]).
    pub fn class(&self) -> Classified {
        classify(self)
    }
}

/// The class of `e`: that of the first error in its cause chain (outermost first) whose
/// meaning is known, else [`Class::Internal`].
pub fn classify(e: &(dyn Error + 'static)) -> Classified {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(found) = link(c) {
            return Classified {
                message: c.to_string(),
                ..found
            };
        }
        cause = c.source();
    }
    Classified {
        message: e.to_string(),
        ..Classified::new(Class::Internal)
    }
}

/// The class of one error in a chain, or `None` when it only says which step failed and
/// its cause decides.
fn link(e: &(dyn Error + 'static)) -> Option<Classified> {
    use Class::*;
    if let Some(c) = e.downcast_ref::<ClientError>() {
        return Some(agent(c));
    }
    if let Some(s) = e.downcast_ref::<SpecError>() {
        let text = s.to_string();
        return Some(match text.split_once(": ") {
            Some((field, _)) => Classified::field(Refused, field),
            None => Classified::new(Refused),
        });
    }
    if let Some(a) = e.downcast_ref::<AdmitError>() {
        return Some(match a {
            AdmitError::NoneAdmissible { .. } => Classified::new(NoDriver),
            AdmitError::Forbidden { allowed_by, .. } => {
                Classified::field(Forbidden, allowed_by.map_or("trust".into(), policy_field))
            }
        });
    }
    if e.is::<NoDriverError>() {
        return Some(Classified::new(NoDriver));
    }
    if let Some(s) = e.downcast_ref::<SelectError>() {
        return Some(match s {
            SelectError::NoDriver {
                allowed_by: Some(flag),
                ..
            } => Classified::field(NoDriver, policy_field(flag)),
            SelectError::NoDriver { .. } => Classified::new(NoDriver),
            SelectError::Unknown { .. } => Classified::field(Usage, "driver"),
            SelectError::Unusable(d) if d.available => Classified::field(Forbidden, "driver"),
            SelectError::Unusable(_) => Classified::new(NoDriver),
        });
    }
    if let Some(s) = e.downcast_ref::<SandboxError>() {
        return sandbox(s);
    }
    if e.is::<PathError>() || e.is::<GlobError>() {
        return Some(Classified::new(Path));
    }
    if e.is::<PublishError>() {
        return Some(Classified::field(Usage, "ports"));
    }
    if let Some(s) = e.downcast_ref::<SnapshotError>() {
        return snapshot(s);
    }
    if let Some(r) = e.downcast_ref::<ImageRootError>() {
        return Some(match r.is_bad_reference() {
            true => Classified::field(Usage, "image"),
            false => Classified::new(Image),
        });
    }
    if e.is::<NoImage>() {
        return Some(Classified::new(Image));
    }
    if let Some(m) = e.downcast_ref::<MachineError>() {
        return match m {
            MachineError::WallExpired { .. } => Some(Classified::new(WallExpired)),
            MachineError::Paused { .. } => Some(Classified::new(Paused)),
            MachineError::Agent(_) => None,
            _ => Some(Classified::new(GuestError)),
        };
    }
    if let Some(n) = e.downcast_ref::<NamedError>() {
        return match n {
            NamedError::State(s) => Some(state(s)),
            NamedError::Paused { .. } => Some(Classified::new(Paused)),
            NamedError::NotRunning { .. } | NamedError::NoSocket(_) => {
                Some(Classified::new(NotRunning))
            }
            NamedError::Attach { .. } => None,
            _ => Some(Classified::new(Internal)),
        };
    }
    if let Some(s) = e.downcast_ref::<StateError>() {
        return Some(state(s));
    }
    if let Some(s) = e.downcast_ref::<ServeError>() {
        return match s {
            ServeError::ReadyPath { .. } => Some(Classified::field(Usage, "ready")),
            ServeError::Start(_) | ServeError::Stop(_) => None,
            _ => Some(Classified::new(ServeFailed)),
        };
    }
    None
}

/// The agent's verdict: a command it could not start, no slot, or another failure.
fn agent(e: &ClientError) -> Classified {
    let class = match e.agent_kind() {
        Some(ErrorKind::CommandNotFound) => Class::CommandNotFound,
        Some(ErrorKind::NotExecutable) => Class::NotExecutable,
        Some(ErrorKind::Busy) => Class::Busy,
        _ => return Classified::new(Class::GuestError),
    };
    let line = match e {
        ClientError::Agent { message, .. } => message.replace('\n', " "),
        _ => String::new(),
    };
    Classified {
        command_line: (class != Class::Busy).then_some(line),
        ..Classified::new(class)
    }
}

/// `SandboxError`'s own variants; those that wrap a cause (a spec, a selection, a machine
/// call) are decided by it. `Path`, `Glob`, `Copy` and `Snapshot` are transparent: their
/// error is not in the chain, so it is read here.
fn sandbox(e: &SandboxError) -> Option<Classified> {
    Some(match e {
        SandboxError::Path(_) | SandboxError::Glob(_) => Classified::new(Class::Path),
        SandboxError::NoCommand => Classified::field(Class::Usage, "argv"),
        SandboxError::Unsupported(_) => Classified::new(Class::Unsupported),
        SandboxError::Boot { .. } | SandboxError::Root(_) => Classified::new(Class::BootFailed),
        SandboxError::DaxWindow { source, .. } => match source {
            DriverError::InvalidPlan { .. } => Classified::field(Class::Refused, "dax_window_mib"),
            _ => Classified::new(Class::Unsupported),
        },
        SandboxError::Copy(_) => Classified::new(Class::GuestError),
        SandboxError::Snapshot(s) => return snapshot(s),
        _ => return None,
    })
}

/// A snapshot's name or an existing one is usage; what a restore cannot honour here
/// (another driver, a changed mount, another record version, a driver without snapshots,
/// a directory or file someone else could write) is the host's refusal; the rest is decided
/// by its cause.
fn snapshot(e: &SnapshotError) -> Option<Classified> {
    use vm_drivers::snapshot::SnapshotError as Machine;
    Some(match e {
        SnapshotError::Name(_) | SnapshotError::Exists(_) => Classified::new(Class::Usage),
        SnapshotError::NoSuchName(_) => Classified::new(Class::NotFound),
        SnapshotError::Changed { .. }
        | SnapshotError::Driver { .. }
        | SnapshotError::Unsupported { .. }
        | SnapshotError::Version { .. }
        | SnapshotError::NotPrivate { .. }
        | SnapshotError::Machine(Machine::Unsupported { .. }) => Classified::new(Class::Forbidden),
        _ => return None,
    })
}

/// A state-directory error: an unknown VM, a bad name, or the directory itself.
fn state(e: &StateError) -> Classified {
    match e {
        StateError::NotFound(_) => Classified::new(Class::NotFound),
        StateError::BadName(_) => Classified::field(Class::Usage, "name"),
        _ => Classified::new(Class::Internal),
    }
}

/// The policy field a flag sets: `--allow-emulation (Policy::allow_emulation)` is
/// `allow_emulation`.
fn policy_field(flag: &str) -> String {
    let flag = flag.split_whitespace().next().unwrap_or(flag);
    flag.trim_start_matches('-').replace('-', "_")
}

#[cfg(test)]
#[path = "class_tests.rs"]
mod tests;

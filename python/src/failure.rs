//! [`Failure`]: a library error as the Python exception it becomes. The class is chosen from
//! the error's cause chain (the first cause whose meaning is known, outermost first); the
//! message is the whole chain on one line (`vm_error_chain::error_chain`). The classes are
//! `vm_sandbox._errors`' (pure Python, so `SpecRefused` can also be a `ValueError`).

use std::error::Error;

use pyo3::prelude::*;
use vm_sandbox::agent::{ClientError, ErrorKind};
use vm_sandbox::drivers::{MachineError, NoDriverError};
use vm_sandbox::state::StateError;
use vm_sandbox::state::named::NamedError;
use vm_sandbox::{
    ImageRootError, NoImage, PublishError, RequestError, SandboxError, SelectError, ServeError,
};
use vm_spec::{AdmitError, SpecError};

/// The exception classes of `vm_sandbox._errors` this crate raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    VmError,
    SpecRefused,
    PathRefused,
    NoDriver,
    NoSuchVm,
    NotRunning,
    BootFailed,
    GuestError,
    WallExpired,
    Paused,
    ServeFailed,
    ImageError,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::VmError => "VmError",
            Kind::SpecRefused => "SpecRefused",
            Kind::PathRefused => "PathRefused",
            Kind::NoDriver => "NoDriver",
            Kind::NoSuchVm => "NoSuchVm",
            Kind::NotRunning => "NotRunning",
            Kind::BootFailed => "BootFailed",
            Kind::GuestError => "GuestError",
            Kind::WallExpired => "WallExpired",
            Kind::Paused => "Paused",
            Kind::ServeFailed => "ServeFailed",
            Kind::ImageError => "ImageError",
        }
    }
}

/// An error on its way to Python: its class, its one-line message and, for a refusal, the
/// field it names (`guarantees.mounts[0].read_only`, `allow_emulation`, `memory`).
#[derive(Debug)]
pub struct Failure {
    pub kind: Kind,
    pub message: String,
    pub field: Option<String>,
}

impl Failure {
    pub fn new(kind: Kind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
            field: None,
        }
    }

    /// A refusal of the argument `field` (before anything boots).
    pub fn refused(field: &str, message: impl std::fmt::Display) -> Failure {
        Failure {
            kind: Kind::SpecRefused,
            message: format!("{field}: {message}"),
            field: Some(field.to_string()),
        }
    }

    /// Classifies `e` by its cause chain.
    pub fn from_error(e: &(dyn Error + 'static)) -> Failure {
        let mut message = vm_error_chain::error_chain(e);
        let mut found = None;
        let mut cause: Option<&(dyn Error + 'static)> = Some(e);
        while let Some(c) = cause {
            if let Some(k) = classify(c) {
                found = Some(k);
                break;
            }
            cause = c.source();
        }
        let (kind, field) = found.unwrap_or((Kind::VmError, None));
        if field.as_deref() == Some("allow_emulation") {
            message.push_str(" (in Python: Sandbox(..., allow_emulation=True))");
        }
        Failure {
            kind,
            message,
            field,
        }
    }

    /// The Python exception (`vm_sandbox._errors.<Kind>(message, field)`).
    pub fn to_pyerr(&self, py: Python<'_>) -> PyErr {
        let made = py
            .import("vm_sandbox._errors")
            .and_then(|m| m.getattr(self.kind.class_name()))
            .and_then(|cls| cls.call1((self.message.clone(), self.field.clone())));
        match made {
            Ok(obj) => PyErr::from_value(obj),
            Err(e) => e,
        }
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        Python::attach(|py| f.to_pyerr(py))
    }
}

impl From<SandboxError> for Failure {
    fn from(e: SandboxError) -> Failure {
        Failure::from_error(&e)
    }
}

impl From<NamedError> for Failure {
    fn from(e: NamedError) -> Failure {
        Failure::from_error(&e)
    }
}

impl From<StateError> for Failure {
    fn from(e: StateError) -> Failure {
        Failure::from_error(&e)
    }
}

impl From<RequestError> for Failure {
    fn from(e: RequestError) -> Failure {
        Failure::from_error(&e)
    }
}

impl From<ServeError> for Failure {
    fn from(e: ServeError) -> Failure {
        Failure::from_error(&e)
    }
}

impl From<vm_sandbox::oci::Error> for Failure {
    fn from(e: vm_sandbox::oci::Error) -> Failure {
        let mut f = Failure::from_error(&e);
        if f.kind == Kind::VmError {
            f.kind = Kind::ImageError;
        }
        f
    }
}

/// `--allow-emulation (Policy::allow_emulation)` → `allow_emulation`: the keyword argument
/// a CLI flag is.
fn keyword(flag: &str) -> String {
    let flag = flag.split_whitespace().next().unwrap_or(flag);
    flag.trim_start_matches('-').replace('-', "_")
}

/// The field a `vm-spec` refusal names: its message up to the first `": "`.
fn spec_field(e: &SpecError) -> Option<String> {
    let text = e.to_string();
    text.split_once(": ").map(|(f, _)| f.to_string())
}

/// The class (and field) of one error in a chain, when its meaning is known.
fn classify(e: &(dyn Error + 'static)) -> Option<(Kind, Option<String>)> {
    if let Some(s) = e.downcast_ref::<SpecError>() {
        return Some((Kind::SpecRefused, spec_field(s)));
    }
    if let Some(a) = e.downcast_ref::<AdmitError>() {
        return Some(match a {
            AdmitError::NoneAdmissible { .. } => (Kind::NoDriver, None),
            AdmitError::Forbidden { allowed_by, .. } => (
                Kind::SpecRefused,
                Some(allowed_by.map_or("trust".into(), keyword)),
            ),
        });
    }
    if e.is::<NoDriverError>() {
        return Some((Kind::NoDriver, None));
    }
    if let Some(s) = e.downcast_ref::<SelectError>() {
        return Some(match s {
            SelectError::NoDriver {
                allowed_by: Some(flag),
                ..
            } => (Kind::SpecRefused, Some(keyword(flag))),
            SelectError::NoDriver { .. } => (Kind::NoDriver, None),
            SelectError::Unknown { .. } => (Kind::SpecRefused, Some("driver".into())),
            SelectError::Unusable(d) if d.available => (Kind::SpecRefused, Some("driver".into())),
            SelectError::Unusable(_) => (Kind::NoDriver, None),
        });
    }
    if let Some(s) = e.downcast_ref::<SandboxError>() {
        match s {
            SandboxError::Boot { .. } | SandboxError::Root(_) => {
                return Some((Kind::BootFailed, None));
            }
            SandboxError::Path(_) | SandboxError::Glob(_) => {
                return Some((Kind::PathRefused, None));
            }
            SandboxError::NoCommand => return Some((Kind::SpecRefused, Some("argv".into()))),
            SandboxError::Copy(_) => return Some((Kind::GuestError, None)),
            _ => {}
        }
    }
    if let Some(n) = e.downcast_ref::<NamedError>() {
        return match n {
            NamedError::State(s) => Some(state_kind(s)),
            NamedError::Paused { .. } => Some((Kind::Paused, None)),
            NamedError::NotRunning { .. } | NamedError::NoSocket(_) => {
                Some((Kind::NotRunning, None))
            }
            // Classified by its cause (a missing agent token, a refused spec).
            NamedError::Attach { .. } => None,
            _ => Some((Kind::VmError, None)),
        };
    }
    if let Some(s) = e.downcast_ref::<StateError>() {
        return Some(state_kind(s));
    }
    if e.is::<NoImage>() {
        return Some((Kind::ImageError, None));
    }
    if let Some(r) = e.downcast_ref::<ImageRootError>() {
        return Some(match r.is_bad_reference() {
            true => (Kind::SpecRefused, Some("image".into())),
            false => (Kind::ImageError, None),
        });
    }
    if e.is::<PublishError>() {
        return Some((Kind::SpecRefused, Some("ports".into())));
    }
    if let Some(s) = e.downcast_ref::<ServeError>() {
        return match s {
            ServeError::ReadyPath { .. } => Some((Kind::SpecRefused, Some("ready".into()))),
            ServeError::Start(_) | ServeError::Stop(_) => None,
            _ => Some((Kind::ServeFailed, None)),
        };
    }
    if let Some(m) = e.downcast_ref::<MachineError>() {
        return match m {
            MachineError::WallExpired { .. } => Some((Kind::WallExpired, None)),
            MachineError::Paused { .. } => Some((Kind::Paused, None)),
            MachineError::Agent(_) => None,
            _ => Some((Kind::GuestError, None)),
        };
    }
    if e.is::<ClientError>() {
        return Some((Kind::GuestError, None));
    }
    None
}

/// The class of a state-directory error: an unknown VM, a bad name, or the directory itself.
fn state_kind(e: &StateError) -> (Kind, Option<String>) {
    match e {
        StateError::NotFound(_) => (Kind::NoSuchVm, None),
        StateError::BadName(_) => (Kind::SpecRefused, Some("name".into())),
        _ => (Kind::VmError, None),
    }
}

/// The exit code and the shell-like message when the guest command itself could not be
/// started (not found: 127, not executable: 126), as `vm exec` reports them.
pub fn command_not_run(e: &(dyn Error + 'static)) -> Option<(i32, String)> {
    let mut cause: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(ClientError::Agent { kind, message }) = c.downcast_ref::<ClientError>() {
            return match kind {
                ErrorKind::CommandNotFound => Some((127, message.clone())),
                ErrorKind::NotExecutable => Some((126, message.clone())),
                _ => None,
            };
        }
        cause = c.source();
    }
    None
}

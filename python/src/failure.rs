//! [`Failure`]: a library error as the Python exception it becomes. The class is the error's
//! class ([`vm_sandbox::classify`], decided once in `vm-sandbox` for every front end) mapped
//! to an exception ([`kind`]); the message is the whole chain on one line
//! (`vm_error_chain::error_chain`). The classes are `vm_sandbox._errors`' (pure Python, so
//! `SpecRefused` can also be a `ValueError`).

use std::error::Error;

use pyo3::prelude::*;
use vm_sandbox::state::StateError;
use vm_sandbox::state::named::NamedError;
use vm_sandbox::{Class, RequestError, SandboxError, ServeError};

mod kind;

pub use kind::{Kind, kind};

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

    /// Classifies `e` by its class.
    pub fn from_error(e: &(dyn Error + 'static)) -> Failure {
        let mut message = vm_error_chain::error_chain(e);
        let c = vm_sandbox::classify(e);
        let kind = kind(&c);
        if c.field.as_deref() == Some("allow_emulation") {
            message.push_str(" (in Python: Sandbox(..., allow_emulation=True))");
        }
        Failure {
            kind,
            message,
            field: c.field,
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

/// The exit code and the shell-like message when the guest command itself could not be
/// started (not found: 127, not executable: 126), as `vm exec` reports them.
pub fn command_not_run(e: &(dyn Error + 'static)) -> Option<(i32, String)> {
    let c = vm_sandbox::classify(e);
    let code = match c.class {
        Class::CommandNotFound => 127,
        Class::NotExecutable => 126,
        _ => return None,
    };
    Some((code, c.command_line?))
}

//! The shim's error type and its mapping onto the ttrpc status containerd shows the user.
//!
//! A `vm-sandbox` error's code is its class's ([`vm_sandbox::classify`], decided once for the
//! CLI, the Python SDK and this shim; [`code`] is the one `match`): a refused spec is
//! `InvalidArgument` with its field in the message, the host's policy or a missing driver
//! `FailedPrecondition`, never `Internal`.

use containerd_shim::protos::ttrpc;
use thiserror::Error;
use vm_sandbox::Class;

/// Why a task request failed. The message reaches the user (`ctr: …`), so it names the
/// field or the step.
#[derive(Debug, Error)]
pub enum ShimError {
    #[error("refused: {0}")]
    Refused(String),
    #[error("runtime options: {0}")]
    Options(String),
    #[error("bundle {what}: {detail}")]
    Bundle { what: &'static str, detail: String },
    #[error("rootfs: {0}")]
    Rootfs(String),
    /// A step through `vm-sandbox` failed; the cause says why.
    #[error("{what}")]
    Sandbox {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    State(String),
    #[error("{0}")]
    Unsupported(String),
}

impl ShimError {
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ShimError {
        let what = what.into();
        move |source| ShimError::Io { what, source }
    }

    /// A `vm-sandbox` step `what` failed with `e` (the user sees the whole chain).
    pub fn sandbox<E>(what: &'static str) -> impl FnOnce(E) -> ShimError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        move |e| ShimError::Sandbox {
            what,
            source: Box::new(e),
        }
    }
}

impl From<ShimError> for ttrpc::Error {
    fn from(e: ShimError) -> ttrpc::Error {
        let code = match &e {
            ShimError::Refused(_) | ShimError::Options(_) | ShimError::Bundle { .. } => {
                ttrpc::Code::INVALID_ARGUMENT
            }
            ShimError::NotFound(_) => ttrpc::Code::NOT_FOUND,
            ShimError::State(_) => ttrpc::Code::FAILED_PRECONDITION,
            ShimError::Unsupported(_) => ttrpc::Code::UNIMPLEMENTED,
            ShimError::Sandbox { source, .. } => code(vm_sandbox::classify(source.as_ref()).class),
            ShimError::Rootfs(_) | ShimError::Io { .. } => ttrpc::Code::INTERNAL,
        };
        let msg = vm_error_chain::error_chain(&e);
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg))
    }
}

/// The ttrpc code of a `vm-sandbox` error of class `class`.
pub fn code(class: Class) -> ttrpc::Code {
    use ttrpc::Code;
    match class {
        Class::Usage | Class::Path | Class::Refused => Code::INVALID_ARGUMENT,
        Class::Forbidden | Class::NoDriver | Class::NotRunning | Class::Paused => {
            Code::FAILED_PRECONDITION
        }
        Class::NotExecutable | Class::Image => Code::FAILED_PRECONDITION,
        Class::NotFound | Class::CommandNotFound => Code::NOT_FOUND,
        Class::WallExpired => Code::DEADLINE_EXCEEDED,
        Class::Busy => Code::RESOURCE_EXHAUSTED,
        Class::Unsupported => Code::UNIMPLEMENTED,
        Class::BootFailed | Class::GuestError | Class::ServeFailed | Class::Internal => {
            Code::INTERNAL
        }
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;

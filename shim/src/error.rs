//! The shim's error type and its mapping onto the ttrpc status containerd shows the user.

use containerd_shim::protos::ttrpc;
use thiserror::Error;

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
    #[error("{0}")]
    Sandbox(String),
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

    /// The sandbox's error with its whole cause chain on one line (what the user sees).
    pub fn sandbox(e: &(dyn std::error::Error + 'static)) -> ShimError {
        ShimError::Sandbox(vm_error_chain::error_chain(e))
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
            _ => ttrpc::Code::INTERNAL,
        };
        let msg = vm_error_chain::error_chain(&e);
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg))
    }
}

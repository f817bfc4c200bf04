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
            _ => ttrpc::Code::INTERNAL,
        };
        let msg = vm_error_chain::error_chain(&e);
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg))
    }
}

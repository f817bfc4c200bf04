//! [`AgentClient::wait_ready`]: ping until the agent answers, each attempt bounded, the
//! pauses between them short (a restored guest answers moments after its VMM starts).

use std::time::Duration;

use tokio::time::Instant;

use super::{AgentClient, ClientError};
use vm_agent_protocol::protocol::AgentInfo;

/// How long one readiness ping of [`AgentClient::wait_ready`] may take before a new one is
/// tried (a ready agent answers in milliseconds; this leaves room for a loaded guest).
pub const READY_ATTEMPT: Duration = Duration::from_secs(3);

/// The longest pause between two readiness pings of [`AgentClient::wait_ready`] (the pauses
/// start at 20 ms and double up to it). A restored guest answers moments after its VMM's
/// socket appears, so a long pause would only be slept through; a failed ping costs one
/// connection attempt.
pub const READY_RETRY_MAX: Duration = Duration::from_millis(100);

impl AgentClient {
    /// Ping until the agent answers or `timeout` passes (connection errors are retried).
    /// Each attempt is bounded by [`READY_ATTEMPT`]: one the guest will never answer (a
    /// connection that raced a restored guest's vsock transport reset) is retried at once.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<AgentInfo, ClientError> {
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_millis(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = tokio::time::timeout(left.min(READY_ATTEMPT), self.ping()).await;
            match attempt {
                Ok(Ok(info)) => return Ok(info),
                Ok(Err(e @ (ClientError::VersionMismatch { .. } | ClientError::Agent { .. }))) => {
                    return Err(e);
                }
                Ok(Err(e)) if Instant::now() + delay >= deadline => return Err(e),
                Err(_) if Instant::now() + delay >= deadline => {
                    return Err(ClientError::Timeout { step: "wait_ready" });
                }
                Ok(Err(_)) => {}
                Err(_) => tracing::debug!(
                    "a readiness ping went unanswered for {READY_ATTEMPT:?}; trying anew"
                ),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(READY_RETRY_MAX);
        }
    }
}

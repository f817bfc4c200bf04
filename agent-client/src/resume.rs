//! `Resume`: the host's first request to a VM restored from a snapshot (see
//! `protocol::Request::Resume`).

use std::time::{SystemTime, UNIX_EPOCH};

use super::{AgentClient, ClientError, unexpected};
use vm_agent_protocol::protocol::{AgentFrame, Request};
use vm_agent_protocol::token::{AgentToken, random_bytes};

impl AgentClient {
    /// Hands the restored agent `token`, this host's wall clock, 32 fresh bytes of this host's
    /// CRNG (the guest kernel mixes them in and reseeds) and the VM's `generation` (1 for a
    /// VM restored from a snapshot of a booted one), then returns a client that presents the
    /// new token (this one's token is refused from now on). An agent older than protocol 4
    /// refuses the handshake (`ClientError::VersionMismatch`).
    pub async fn resume(
        &self,
        token: AgentToken,
        generation: u64,
    ) -> Result<AgentClient, ClientError> {
        let unix_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let entropy = random_bytes().map_err(|source| ClientError::Io {
            step: "resume (the host's entropy)",
            source,
        })?;
        let (mut c, _) = self.connect().await?;
        let req = Request::Resume {
            token: *token.bytes(),
            unix_nanos,
            entropy,
            generation,
        };
        match c.request(req, "resume").await? {
            AgentFrame::Ok => Ok(self.clone().with_token(token)),
            f => Err(unexpected("resume", &f)),
        }
    }
}

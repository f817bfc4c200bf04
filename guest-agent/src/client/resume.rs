//! `Resume`: the host's first request to a VM restored from a snapshot (see
//! `protocol::Request::Resume`).

use std::time::{SystemTime, UNIX_EPOCH};

use super::{AgentClient, ClientError, unexpected};
use crate::protocol::{AgentFrame, Request};
use crate::token::AgentToken;

impl AgentClient {
    /// Hands the restored agent `token` and this host's wall clock, then returns a client
    /// that presents the new token (this one's token is refused from now on). An agent
    /// older than this request answers an error of kind `Unsupported`.
    pub async fn resume(&self, token: AgentToken) -> Result<AgentClient, ClientError> {
        let unix_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let (mut c, _) = self.connect().await?;
        let req = Request::Resume {
            token: *token.bytes(),
            unix_nanos,
        };
        match c.request(req, "resume").await? {
            AgentFrame::Ok => Ok(self.clone().with_token(token)),
            f => Err(unexpected("resume", &f)),
        }
    }
}

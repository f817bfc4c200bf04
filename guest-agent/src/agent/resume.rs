//! `Resume`: the first request to a VM restored from a snapshot. The agent takes the new
//! token (the snapshot's own is refused from then on, so two VMs restored from one snapshot
//! share no secret) and, as PID 1, steps the guest's wall clock to the host's: the clock stood
//! still while the snapshot lay on disk.

use super::{Agent, sys};
use crate::protocol::ErrorKind;
use crate::token::{AgentToken, TOKEN_LEN};

/// The earliest wall-clock time a resume accepts (2020-01-01T00:00:00Z): a host clock
/// before it is broken, and stepping the guest there would only break it too.
pub const MIN_UNIX_NANOS: u64 = 1_577_836_800 * 1_000_000_000;

/// Why a resume failed (the token is replaced only when the whole request succeeds).
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("the host's time {0} ns after the epoch is before 2020: refused")]
    ClockTooEarly(u64),
    #[error("the new token is all zeros: refused")]
    ZeroToken,
    #[error("cannot step the guest clock")]
    SetClock(#[source] std::io::Error),
}

impl ResumeError {
    /// The wire error kind of this failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ResumeError::SetClock(_) => ErrorKind::Io,
            _ => ErrorKind::BadRequest,
        }
    }
}

/// Checks the request, steps the clock (PID 1 only), then replaces the token.
pub(super) fn resume(
    agent: &Agent,
    token: [u8; TOKEN_LEN],
    unix_nanos: u64,
) -> Result<(), ResumeError> {
    if unix_nanos < MIN_UNIX_NANOS {
        return Err(ResumeError::ClockTooEarly(unix_nanos));
    }
    if token == [0; TOKEN_LEN] {
        return Err(ResumeError::ZeroToken);
    }
    if agent.is_pid1() {
        sys::proc::set_realtime(unix_nanos).map_err(ResumeError::SetClock)?;
    }
    agent.set_token(AgentToken::from_bytes(token));
    tracing::info!(
        clock_stepped = agent.is_pid1(),
        "resumed from a snapshot: new token"
    );
    Ok(())
}

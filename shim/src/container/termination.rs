//! A container's termination message: what kubelet reports, read back from the guest's
//! termination log (kubelet's file's destination, or `/dev/termination-log`) when the init process ends.

use super::{Container, Place};
use crate::bundle::kubelet::{self, TerminationTail};
use vm_sync::Lock;

/// A container's termination message: the last [`kubelet::MAX_TERMINATION_BYTES`] of its
/// `/dev/termination-log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminationMessage {
    pub message: String,
    /// More was written than kept.
    pub truncated: bool,
}

/// How long reading the termination log back may take (the guest's agent answers it).
const TERMINATION_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Container {
    /// The termination message read back when the init process ended, if any.
    pub fn termination_message(&self) -> Option<TerminationMessage> {
        self.termination.locked().clone()
    }

    /// Reads the last 4 KiB of the guest's termination log `log` (bounded in size and time)
    /// into [`Container::termination_message`]; an empty log is no message.
    pub(super) async fn read_termination_log(&self, log: &str) {
        let mut tail = TerminationTail::default();
        let path = match &self.place {
            Place::Member { member, .. } => member.path(log),
            Place::Own | Place::Sandbox { .. } => log.to_string(),
        };
        let read = self
            .vm
            .copy_out_to(&path, kubelet::MAX_TERMINATION_READ, &mut tail);
        match tokio::time::timeout(TERMINATION_READ_TIMEOUT, read).await {
            Ok(Ok(_)) if tail.total > 0 => {
                if let Some(host) = &self.termination_host
                    && let Err(e) = kubelet::write_termination_message(host, tail.bytes())
                {
                    tracing::warn!(
                        container = %self.id,
                        error = %e,
                        path = %host.path.display(),
                        "writing the termination message for kubelet"
                    );
                }
                *self.termination.locked() = Some(TerminationMessage {
                    message: tail.message(),
                    truncated: tail.truncated(),
                });
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(container = %self.id, error = %vm_error_chain::error_chain(&e), "reading the termination log")
            }
            Err(_) => tracing::warn!(container = %self.id, "reading the termination log timed out"),
        }
    }
}

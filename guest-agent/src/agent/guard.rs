//! Who may speak to the agent, and how the host keeps its capacity.
//!
//! Three gates, in order, before a connection takes one of the `max_conns` slots:
//! 1. **Peer**: over vsock only the host (CID 2) is accepted ([`host_peer`]); anything else is
//!    closed at `accept` (the guest kernel has no vsock loopback either, so guest code cannot
//!    even reach the listener — this is the second line).
//! 2. **Pending pool**: a connection that has not yet authenticated holds one of `max_pending`
//!    handshake places ([`super::pending`]), for at most `auth_timeout`; when they are all
//!    taken the oldest is closed to make room for the new one. Slots for authenticated work
//!    are never taken by unauthenticated peers.
//! 3. **Token**: the first frame must be a small `Hello` carrying the per-boot token
//!    ([`vm_agent_protocol::token`]); a wrong token, an oversized or malformed first frame, or silence until
//!    the deadline closes the connection without a reply.
//!
//! Every refusal is counted and logged through a [`RefusalLog`] (a few lines per window, the
//! rest counted), so a flood cannot fill the console.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vm_sync::Lock;

/// vsock CID of the host.
pub const HOST_CID: u32 = 2;

/// Largest first frame (`Hello`) read before authentication.
pub const MAX_HELLO_FRAME: u32 = 256;

/// Whether a vsock peer may connect: only the host.
pub fn host_peer(cid: u32) -> bool {
    cid == HOST_CID
}

/// Counts refusals and logs at most `burst` of them per `window`.
#[derive(Debug)]
pub struct RefusalLog {
    burst: u32,
    window: Duration,
    state: Mutex<(Option<Instant>, u32)>,
    total: AtomicU64,
    suppressed: AtomicU64,
}

impl RefusalLog {
    pub fn new(burst: u32, window: Duration) -> RefusalLog {
        RefusalLog {
            burst,
            window,
            state: Mutex::new((None, 0)),
            total: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Count a refusal; true when it may be logged (within the burst of the current window).
    pub fn allow(&self, now: Instant) -> bool {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state.locked();
        match st.0 {
            Some(start) if now.duration_since(start) < self.window => {}
            _ => *st = (Some(now), 0),
        }
        st.1 = st.1.saturating_add(1);
        if st.1 <= self.burst {
            true
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// Count and (rate-limited) log one refused connection.
    pub fn refuse(&self, why: &str) {
        if self.allow(Instant::now()) {
            tracing::warn!(
                why,
                refused = self.total(),
                unlogged = self.suppressed.load(Ordering::Relaxed),
                "connection refused"
            );
        }
    }

    /// Refusals so far.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog::new(5, Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_host_cid_is_a_peer() {
        assert!(host_peer(2));
        for cid in [0, 1, 3, 4, u32::MAX] {
            assert!(!host_peer(cid), "{cid}");
        }
    }

    #[test]
    fn refusal_log_bounds_lines_per_window_and_counts_all() {
        let l = RefusalLog::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        let allowed = (0..1000).filter(|_| l.allow(t0)).count();
        assert_eq!(allowed, 3);
        assert_eq!(l.total(), 1000);
        assert!(
            l.allow(t0 + Duration::from_secs(11)),
            "a new window logs again"
        );
        assert_eq!(l.total(), 1001);
    }
}

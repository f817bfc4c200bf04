//! Deadlines of the vsock muxer: host clients that must finish `CONNECT` and host-initiated
//! connections the guest must answer, both within [`super::unix::CONNECT_TIMEOUT`]. All timers
//! have the same duration, so a FIFO is ordered by deadline; entries may be stale (the client or
//! connection already moved on) and are checked when they fire.

use std::collections::VecDeque;
use std::time::Instant;

use super::connection::ConnKey;

/// What a timer guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// A host client (by epoll token) still sending its `CONNECT` line.
    Pending(u64),
    /// A host-initiated connection (key, token) waiting for the guest's RESPONSE.
    Connecting(ConnKey, u64),
}

/// A FIFO of deadlines.
#[derive(Debug, Default)]
pub struct Timers {
    q: VecDeque<(Instant, Timer)>,
}

impl Timers {
    /// Entries kept before stale ones are purged.
    pub const CAP: usize = 4096;

    /// Add a timer (deadlines must be pushed in non-decreasing order).
    pub fn push(&mut self, at: Instant, t: Timer) {
        self.q.push_back((at, t));
    }

    /// Number of entries (live or stale).
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Keep only the entries `live` accepts.
    pub fn retain(&mut self, mut live: impl FnMut(&Timer) -> bool) {
        self.q.retain(|(_, t)| live(t));
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.q.front().map(|e| e.0)
    }

    /// Pop one expired timer.
    pub fn pop_expired(&mut self, now: Instant) -> Option<Timer> {
        if self.q.front()?.0 <= now {
            return self.q.pop_front().map(|e| e.1);
        }
        None
    }
}

//! Deadlines of the vsock muxer: host clients that must finish `CONNECT` within
//! [`super::unix::CONNECT_TIMEOUT`], host-initiated connections the guest must answer within
//! [`super::unix::RESPONSE_TIMEOUT`], and connections the guest closed with data still buffered
//! for the host, which linger at most [`super::connection::CLOSE_LINGER`]. Timers of one kind all have the same duration, so one FIFO
//! per kind is ordered by deadline; entries may be stale (the client or connection already
//! moved on) and are checked when they fire.

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
    /// A connection (key, token) the guest closed, lingering until the host has taken what
    /// the guest sent before it closed.
    Closing(ConnKey, u64),
}

/// Three FIFOs of deadlines, one per kind of [`Timer`].
#[derive(Debug, Default)]
pub struct Timers {
    pending: VecDeque<(Instant, Timer)>,
    connecting: VecDeque<(Instant, Timer)>,
    closing: VecDeque<(Instant, Timer)>,
}

impl Timers {
    /// Entries kept before stale ones are purged.
    pub const CAP: usize = 4096;

    fn fifo(&mut self, t: &Timer) -> &mut VecDeque<(Instant, Timer)> {
        match t {
            Timer::Pending(_) => &mut self.pending,
            Timer::Connecting(..) => &mut self.connecting,
            Timer::Closing(..) => &mut self.closing,
        }
    }

    /// Add a timer (deadlines of one kind must be pushed in non-decreasing order).
    pub fn push(&mut self, at: Instant, t: Timer) {
        self.fifo(&t).push_back((at, t));
    }

    /// Number of entries (live or stale).
    pub fn len(&self) -> usize {
        self.pending.len() + self.connecting.len() + self.closing.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keep only the entries `live` accepts.
    pub fn retain(&mut self, mut live: impl FnMut(&Timer) -> bool) {
        self.pending.retain(|(_, t)| live(t));
        self.connecting.retain(|(_, t)| live(t));
        self.closing.retain(|(_, t)| live(t));
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        [&self.pending, &self.connecting, &self.closing]
            .into_iter()
            .filter_map(|q| q.front().map(|e| e.0))
            .min()
    }

    /// Pops pending-client timers, oldest first, until one whose token `live` accepts (that
    /// one is returned, its timer gone with it); stale ones on the way are dropped. The timer
    /// of `keep` is passed over and stays.
    pub fn pop_oldest_pending(
        &mut self,
        live: impl Fn(u64) -> bool,
        keep: Option<u64>,
    ) -> Option<u64> {
        let mut i = 0;
        while let Some((_, t)) = self.pending.get(i) {
            let Timer::Pending(tok) = *t else {
                self.pending.remove(i);
                continue;
            };
            if Some(tok) == keep {
                i += 1;
                continue;
            }
            self.pending.remove(i);
            if live(tok) {
                return Some(tok);
            }
        }
        None
    }

    /// Pop one expired timer.
    pub fn pop_expired(&mut self, now: Instant) -> Option<Timer> {
        for q in [&mut self.pending, &mut self.connecting, &mut self.closing] {
            if q.front().is_some_and(|e| e.0 <= now) {
                return q.pop_front().map(|e| e.1);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn three_kinds_fire_in_deadline_order() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.push(t0 + Duration::from_secs(3), Timer::Connecting((1, 2), 7));
        t.push(t0 + Duration::from_secs(2), Timer::Pending(5));
        t.push(t0 + Duration::from_secs(4), Timer::Closing((3, 4), 8));
        assert_eq!(t.next(), Some(t0 + Duration::from_secs(2)));
        assert_eq!(t.pop_expired(t0 + Duration::from_secs(1)), None);
        assert_eq!(
            t.pop_expired(t0 + Duration::from_secs(2)),
            Some(Timer::Pending(5))
        );
        assert_eq!(t.pop_expired(t0 + Duration::from_secs(2)), None);
        assert_eq!(t.next(), Some(t0 + Duration::from_secs(3)));
        assert_eq!(
            t.pop_expired(t0 + Duration::from_secs(9)),
            Some(Timer::Connecting((1, 2), 7))
        );
        assert_eq!(t.next(), Some(t0 + Duration::from_secs(4)));
        assert_eq!(
            t.pop_expired(t0 + Duration::from_secs(9)),
            Some(Timer::Closing((3, 4), 8))
        );
        assert!(t.is_empty());
    }
}

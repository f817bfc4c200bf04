//! A bounded byte ring for guest console and child-process output.
//!
//! Everything pushed here can come from the guest, so the ring never grows past its capacity:
//! old bytes are dropped (and counted) when new ones arrive. The ring also counts the writers
//! still feeding it (pipe readers until EOF), so a reader can wait for the last bytes of a
//! process that has exited before taking the tail.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use vm_sync::{Lock, Wait};

#[derive(Debug)]
struct Ring {
    buf: VecDeque<u8>,
    cap: usize,
    dropped: u64,
    /// Writers that have not finished (see [`SharedRing::writer`]).
    writers: usize,
}

/// A cloneable handle to one bounded ring.
#[derive(Debug, Clone)]
pub(crate) struct SharedRing(Arc<(Mutex<Ring>, Condvar)>);

/// One writer of a ring: counted from [`SharedRing::writer`] until dropped.
#[derive(Debug)]
pub(crate) struct RingWriter(SharedRing);

impl RingWriter {
    /// Appends `bytes` (see [`SharedRing::push`]).
    pub(crate) fn push(&self, bytes: &[u8]) {
        self.0.push(bytes);
    }
}

impl Drop for RingWriter {
    fn drop(&mut self) {
        let mut r = self.0.lock();
        r.writers = r.writers.saturating_sub(1);
        self.0.0.1.notify_all();
    }
}

impl SharedRing {
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        SharedRing(Arc::new((
            Mutex::new(Ring {
                buf: VecDeque::with_capacity(cap.min(64 * 1024)),
                cap,
                dropped: 0,
                writers: 0,
            }),
            Condvar::new(),
        )))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.0.0.locked()
    }

    /// A counted writer: [`SharedRing::wait_writers_done`] waits for it to be dropped.
    pub(crate) fn writer(&self) -> RingWriter {
        self.lock().writers += 1;
        RingWriter(self.clone())
    }

    /// Waits up to `timeout` until every writer is dropped; true when none is left.
    pub(crate) fn wait_writers_done(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut r = self.lock();
        while r.writers > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            r = self.0.1.wait_timeout_locked(r, deadline - now);
        }
        true
    }

    /// Appends `bytes`, dropping the oldest bytes beyond capacity.
    pub(crate) fn push(&self, bytes: &[u8]) {
        let mut r = self.lock();
        let cap = r.cap;
        let bytes = if bytes.len() > cap {
            r.dropped += (bytes.len() - cap) as u64;
            &bytes[bytes.len() - cap..]
        } else {
            bytes
        };
        let overflow = (r.buf.len() + bytes.len()).saturating_sub(cap);
        if overflow > 0 {
            r.buf.drain(..overflow);
            r.dropped += overflow as u64;
        }
        r.buf.extend(bytes);
    }

    /// The retained bytes as (lossy) UTF-8.
    pub(crate) fn tail_string(&self) -> String {
        let r = self.lock();
        let (a, b) = r.buf.as_slices();
        let mut v = Vec::with_capacity(a.len() + b.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }

    /// How many bytes were dropped because the ring was full.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.lock().dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_newest_bytes() {
        let r = SharedRing::new(8);
        r.push(b"abcdef");
        assert_eq!(r.tail_string(), "abcdef");
        r.push(b"ghij");
        assert_eq!(r.tail_string(), "cdefghij");
        assert_eq!(r.dropped(), 2);
        r.push(b"0123456789xyz");
        assert_eq!(r.tail_string(), "56789xyz");
        assert_eq!(r.dropped(), 2 + 8 + 5);
    }

    #[test]
    fn waiting_for_writers_ends_when_the_last_is_dropped() {
        let r = SharedRing::new(8);
        assert!(r.wait_writers_done(Duration::ZERO), "no writer yet");
        let w = r.writer();
        let w2 = r.writer();
        assert!(!r.wait_writers_done(Duration::from_millis(20)));
        drop(w2);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w.push(b"last");
            drop(w);
        });
        assert!(r.wait_writers_done(Duration::from_secs(10)));
        assert_eq!(r.tail_string(), "last");
        t.join().unwrap();
    }
}

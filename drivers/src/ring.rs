//! A bounded byte ring for guest console and child-process output.
//!
//! Everything pushed here can come from the guest, so the ring never grows past its capacity:
//! old bytes are dropped (and counted) when new ones arrive.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
struct Ring {
    buf: VecDeque<u8>,
    cap: usize,
    dropped: u64,
}

/// A cloneable handle to one bounded ring.
#[derive(Debug, Clone)]
pub(crate) struct SharedRing(Arc<Mutex<Ring>>);

impl SharedRing {
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        SharedRing(Arc::new(Mutex::new(Ring {
            buf: VecDeque::with_capacity(cap.min(64 * 1024)),
            cap,
            dropped: 0,
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
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
}

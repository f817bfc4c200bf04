//! The pool of connections still in their handshake (no valid `Hello` yet), bounded, where a
//! newcomer pushes out the oldest.
//!
//! A connection that has not authenticated has proved nothing, so the pool only bounds what
//! such peers hold (a task and a socket each, for at most the auth deadline). When it is
//! full, the **oldest** one is dropped to make room, not the newcomer: peers that connect
//! and stay silent, however many and however fast they come back, then only ever push out
//! each other, and a real client, which sends its `Hello` at once, is read before
//! [`PendingPool::capacity`] newer connections arrive. Refusing the newcomer instead (what
//! the agent did before, with 16 places) let a few hundred silent connections, reopened as
//! they closed, keep every new connection out. The per-boot token stays the gate: nothing
//! here admits anyone.
//!
//! In a guest the pool's default (1024, `AgentOptions::max_pending`) is more than the vsock
//! device ever holds at once (1023), so there it never fills: silent peers wait out their
//! deadline instead of being replaced at once, which makes a flood of them reconnect once
//! per deadline rather than as fast as the guest can accept (each accept and close costs the
//! guest's one CPU). At its own cap the device pushes out the oldest connection the guest has
//! not answered on, and the agent answers nothing before a valid `Hello`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use vm_sync::Lock;

/// The pool (shared by the accept loop and the connection tasks).
#[derive(Debug)]
pub struct PendingPool {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    /// Entry order → the eviction signal of that connection (dropping the sender evicts).
    waiting: BTreeMap<u64, oneshot::Sender<()>>,
}

/// One connection's place in the pool; dropping it leaves the pool.
#[derive(Debug)]
pub struct Pending {
    id: u64,
    pool: Arc<PendingPool>,
    evicted: oneshot::Receiver<()>,
}

impl PendingPool {
    /// A pool of at most `capacity` connections (at least one).
    pub fn new(capacity: usize) -> Arc<PendingPool> {
        Arc::new(PendingPool {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// How many connections it holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Connections in it now.
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// A place for a new connection; true with it when the oldest one was evicted for it.
    pub fn enter(self: &Arc<Self>) -> (Pending, bool) {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        let evicted = inner.waiting.len() >= self.capacity;
        if evicted {
            // Dropping its sender wakes the oldest connection's task, which closes it.
            inner.waiting.pop_first();
        }
        let id = inner.next;
        inner.next += 1;
        inner.waiting.insert(id, tx);
        let pending = Pending {
            id,
            pool: self.clone(),
            evicted: rx,
        };
        (pending, evicted)
    }
}

impl Pending {
    /// Resolves once a newer connection pushed this one out of a full pool.
    pub async fn evicted(&mut self) {
        let _ = (&mut self.evicted).await;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.pool.lock().waiting.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn is_evicted(p: &mut Pending) -> bool {
        tokio::time::timeout(Duration::from_millis(20), p.evicted())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_full_pool_evicts_its_oldest_not_the_newcomer() {
        let pool = PendingPool::new(3);
        let mut held: Vec<Pending> = (0..3)
            .map(|_| {
                let (p, evicted) = pool.enter();
                assert!(!evicted);
                p
            })
            .collect();
        assert_eq!(pool.len(), 3);
        let (mut newest, evicted) = pool.enter();
        assert!(evicted, "the pool was full");
        assert_eq!(pool.len(), 3, "never more than its capacity");
        assert!(is_evicted(&mut held[0]).await, "the oldest goes");
        assert!(!is_evicted(&mut held[1]).await);
        assert!(!is_evicted(&mut held[2]).await);
        assert!(!is_evicted(&mut newest).await, "the newcomer stays");
        // A connection that leaves (authenticated or refused) frees its place at once.
        drop(held.remove(2));
        let (_p, evicted) = pool.enter();
        assert!(!evicted);
        assert!(!is_evicted(&mut held[1]).await);
    }

    #[tokio::test]
    async fn eviction_goes_in_order_of_arrival() {
        let pool = PendingPool::new(2);
        let mut all: Vec<Pending> = Vec::new();
        for i in 0..10 {
            let (p, evicted) = pool.enter();
            assert_eq!(evicted, i >= 2, "{i}");
            all.push(p);
        }
        for (i, p) in all.iter_mut().enumerate() {
            assert_eq!(is_evicted(p).await, i < 8, "connection {i}");
        }
        drop(all);
        assert!(pool.is_empty());
    }
}

//! `vm-sync`: how every crate here takes a standard lock, decided once (as crosvm's
//! `common/sync`).
//!
//! The decision: **a poisoned lock is taken as it is.** Poison only says that some thread
//! panicked while it held the guard. In this workspace that thread's own work has already
//! failed and been reported (a panic in a device worker, a request handler or a test double
//! ends that unit), while the data behind the lock is kept consistent by each holder between
//! its statements, never left half-written across a call that can panic. Turning the poison
//! into a second panic in every later holder would spread one failure to a whole VM, shim or
//! agent: the VMM could no longer stop its vCPUs, the shim no longer answer containerd, the
//! agent no longer reap. So no crate calls `lock().unwrap()` outside tests, nor writes
//! `unwrap_or_else(|p| p.into_inner())` by hand: it calls [`Lock::locked`],
//! [`ReadWrite::read_locked`] / [`ReadWrite::write_locked`] or [`Wait::wait_locked`].
//!
//! This crate has no dependencies: the guest agent, a static binary built for the guest
//! image, uses it too without linking anything of the host's.

// The one place the standard calls are made (clippy.toml sends every other crate here).
#![allow(clippy::disallowed_methods)]

use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::Duration;

/// A [`Mutex`] taken whether or not a holder panicked.
pub trait Lock<T: ?Sized> {
    /// Blocks until the lock is held and returns its guard, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Lock<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An [`RwLock`] taken whether or not a holder panicked.
pub trait ReadWrite<T: ?Sized> {
    /// Blocks until shared access is held.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// Blocks until exclusive access is held.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWrite<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A [`Condvar`] waited on with a guard from [`Lock::locked`].
pub trait Wait {
    /// Releases `guard`, blocks until notified (or woken spuriously) and takes the lock again,
    /// poisoned or not.
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
    /// As [`Wait::wait_locked`], but wakes after `timeout` at most; the caller tells a timeout
    /// from a notification by its own deadline or state, as every waiter here does.
    fn wait_timeout_locked<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> MutexGuard<'a, T>;
}

impl Wait for Condvar {
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_timeout_locked<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> MutexGuard<'a, T> {
        match self.wait_timeout(guard, timeout) {
            Ok((guard, _)) => guard,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;

    use super::*;

    /// Poisons `lock` by panicking in a thread that holds it through `hold`.
    fn poison<L: Send + Sync + 'static>(lock: &Arc<L>, hold: fn(&L)) {
        let l = Arc::clone(lock);
        let ended = thread::spawn(move || hold(&l)).join();
        assert!(ended.is_err(), "the holder was meant to panic");
    }

    #[test]
    fn a_poisoned_mutex_is_taken_with_what_its_holder_left() {
        let m = Arc::new(Mutex::new(vec![1]));
        poison(&m, |m| {
            m.locked().push(2);
            let _held = m.locked();
            panic!("on purpose, holding the lock");
        });
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), [1, 2]);
        m.locked().push(3);
        assert_eq!(*m.locked(), [1, 2, 3]);
    }

    #[test]
    fn a_poisoned_rwlock_is_read_and_written() {
        let l = Arc::new(RwLock::new(0));
        poison(&l, |l| {
            *l.write_locked() = 5;
            let _held = l.write_locked();
            panic!("on purpose, holding the lock");
        });
        assert!(l.is_poisoned());
        assert_eq!(*l.read_locked(), 5);
        *l.write_locked() += 1;
        assert_eq!(*l.read_locked(), 6);
    }

    #[test]
    fn a_wait_on_a_poisoned_mutex_returns_its_guard() {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        poison(&pair, |(m, _)| {
            let _held = m.locked();
            panic!("on purpose, holding the lock");
        });
        let waker = Arc::clone(&pair);
        let t = thread::spawn(move || {
            *waker.0.locked() = true;
            waker.1.notify_all();
        });
        let mut ready = pair.0.locked();
        while !*ready {
            ready = pair.1.wait_locked(ready);
        }
        t.join().unwrap();
        assert!(*ready);
        // Nothing notifies now: the timed wait still comes back, with the guard.
        let again = pair.1.wait_timeout_locked(ready, Duration::from_millis(50));
        assert!(*again);
    }
}

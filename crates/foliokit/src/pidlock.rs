//! A process-wide value behind a lock that a forked child can break, and
//! that a child sees afresh: the registries of foliokit's threads (the
//! shared channel pools, the helper threads) use it, since a child has
//! their memory but none of their threads.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// `owner` is 0 when free, else the pid of the process one of whose threads
/// holds it. Why not a `Mutex`: if another thread of the parent holds the
/// lock when some thread forks, the child's copy is locked by a thread that
/// does not exist there, and a `Mutex` would block the child forever; no
/// atfork handler is needed either (raw `clone` skips those). A holder's
/// pid tells the child the lock is its parent's: it takes it over and,
/// since the holder may have been mid-update, overwrites the value without
/// reading or dropping it. A pid in the lock word that is not ours is
/// always stale: the lock lives in private memory, so only threads of this
/// process (or of the parent, before the fork copied it) wrote it. Pids are
/// never 0. (A child forked into a new pid namespace could get its
/// parent's pid number; that case is not detected.) Critical sections must
/// be short (a lookup, a push): waiters spin briefly, then yield.
pub(crate) struct PidLock<T> {
    owner: AtomicU32,
    /// The value and the process that made it.
    value: UnsafeCell<Option<(u32, T)>>,
}

// SAFETY: `value` is only accessed by the thread that holds `owner` (see
// `lock`), which hands access from thread to thread with Acquire/Release;
// so the value moves between threads but is never shared: `T: Send`.
unsafe impl<T: Send> Sync for PidLock<T> {}

/// Holds a [`PidLock`]; releases it when dropped.
pub(crate) struct PidGuard<'a, T> {
    lock: &'a PidLock<T>,
    me: u32,
}

impl<T> PidLock<T> {
    /// A free lock with no value.
    pub(crate) const fn new() -> Self {
        PidLock {
            owner: AtomicU32::new(0),
            value: UnsafeCell::new(None),
        }
    }

    /// Takes the lock, from a parent's thread that held it at the fork if
    /// need be.
    pub(crate) fn lock(&self) -> PidGuard<'_, T> {
        let me = std::process::id();
        let mut spins = 0u32;
        loop {
            match self
                .owner
                .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return PidGuard { lock: self, me },
                Err(0) => {}
                Err(holder) if holder == me => {
                    // Another thread of this process: wait for it.
                    if spins < 64 {
                        spins += 1;
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                Err(holder) => {
                    // A parent's thread held it when we were forked, and
                    // that thread does not exist here: take the lock over.
                    if self
                        .owner
                        .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        // SAFETY: we hold the lock now. The parent's value
                        // may be half-written: overwrite it without reading
                        // or dropping it (leaked, as in `get_or_insert_with`).
                        unsafe { self.value.get().write(None) };
                        return PidGuard { lock: self, me };
                    }
                }
            }
        }
    }
}

impl<T> PidGuard<'_, T> {
    /// This process's value, made by `make` if there is none yet or the one
    /// there is the parent's. A parent's value is leaked, never dropped:
    /// dropping it could join threads that do not exist here, and someone
    /// may still hold a part of it.
    pub(crate) fn get_or_insert_with(&mut self, make: impl FnOnce() -> T) -> &mut T {
        // SAFETY: we hold the lock (see `PidLock::lock`), so nobody else
        // accesses the value while this borrow of `self` lives; a value
        // left mid-update by a parent thread was overwritten in `lock`
        // before any reference to it was made.
        let slot = unsafe { &mut *self.lock.value.get() };
        if slot.as_ref().is_some_and(|(pid, _)| *pid != self.me) {
            std::mem::forget(slot.take());
        }
        &mut slot.get_or_insert_with(|| (self.me, make())).1
    }
}

impl<T> Drop for PidGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.owner.store(0, Ordering::Release);
    }
}

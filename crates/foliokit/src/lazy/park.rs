//! Parking fill threads while glibc's fork() holds the allocator's locks.
//!
//! fork() raises the FORK event and waits until the fill thread reads it;
//! glibc takes every malloc arena lock before the clone syscall, so a fill
//! thread that allocated meanwhile would never read it. The prepare
//! handler runs before those locks are taken: it waits until every fill
//! thread has parked, i.e. promised to do nothing but read messages into
//! room reserved beforehand until fork() returns (the parent handler).
//! Dekker-style (all SeqCst) with [`Active::enter`], as `migrate/fork.rs`.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Once;

/// Fill threads running, process-wide.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Of those, parked now.
static PARKED: AtomicUsize = AtomicUsize::new(0);
/// Threads inside glibc's fork().
static FORKING: AtomicUsize = AtomicUsize::new(0);

extern "C" fn prepare() {
    FORKING.fetch_add(1, SeqCst);
    while PARKED.load(SeqCst) < ACTIVE.load(SeqCst) {
        std::thread::yield_now();
    }
}

extern "C" fn parent() {
    FORKING.fetch_sub(1, SeqCst);
}

extern "C" fn child() {
    // The child has one thread and no fill thread.
    ACTIVE.store(0, SeqCst);
    PARKED.store(0, SeqCst);
    FORKING.store(0, SeqCst);
}

/// Held by a fill thread for as long as it runs.
pub struct Active(());

impl Active {
    pub fn enter() -> Active {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            // SAFETY: the handlers are async-signal-safe (atomics and
            // sched_yield only) and live for the whole program.
            unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        });
        loop {
            while FORKING.load(SeqCst) != 0 {
                std::thread::yield_now();
            }
            ACTIVE.fetch_add(1, SeqCst);
            if FORKING.load(SeqCst) == 0 {
                return Active(());
            }
            ACTIVE.fetch_sub(1, SeqCst);
        }
    }

    /// Whether a fork waits for this thread to park.
    pub fn fork_pending(&self) -> bool {
        FORKING.load(SeqCst) != 0
    }

    /// Parks: `read` (which must not allocate) runs until no fork is in
    /// progress.
    pub fn park(&self, mut read: impl FnMut()) {
        loop {
            PARKED.fetch_add(1, SeqCst);
            while FORKING.load(SeqCst) != 0 {
                read();
            }
            PARKED.fetch_sub(1, SeqCst);
            // A fork that began after the check above may have counted
            // this thread parked: look again after unparking.
            if FORKING.load(SeqCst) == 0 {
                return;
            }
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, SeqCst);
    }
}

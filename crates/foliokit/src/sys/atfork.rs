//! Holding glibc's fork() back while threads do work it must not interrupt.
//!
//! glibc's fork() takes every malloc arena lock (and the stdio lock) before
//! the clone syscall and holds them until it returns; a thread that must
//! answer something the fork raises (a userfaultfd FORK event) and
//! allocates meanwhile would never answer. A [`ForkGate`] makes such forks
//! wait in a `pthread_atfork` prepare handler, which runs before glibc
//! takes those locks, until every thread inside the gate has either left
//! it or parked (promised to do nothing but [`Inside::park`]'s `read`, which
//! must not allocate, until the fork returns).
//!
//! Entering and the prepare handler are Dekker-style (all `SeqCst`): either
//! the fork sees the thread inside, or the thread sees the fork and backs
//! off until it is over.
//!
//! A gate is a `static ForkGate` named by a type implementing [`Gated`]:
//! each gate has handlers of its own (`pthread_atfork` takes plain
//! functions, so they are generic over that type).

use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Once;

/// The counts of one gate, process-wide.
pub(crate) struct ForkGate {
    /// Threads inside the gate.
    active: AtomicUsize,
    /// Of those, parked now.
    parked: AtomicUsize,
    /// Threads inside glibc's fork(), waiting for the gate.
    forking: AtomicUsize,
    /// Registers the gate's handlers, on first entry.
    install: Once,
}

impl ForkGate {
    pub(crate) const fn new() -> ForkGate {
        ForkGate {
            active: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            forking: AtomicUsize::new(0),
            install: Once::new(),
        }
    }

    /// Whether a fork waits at this gate now: for a thread that works for
    /// one inside it (a copy channel running its batch) and can make it
    /// reach [`Inside::park`] sooner.
    pub(crate) fn fork_waits(&self) -> bool {
        self.forking.load(SeqCst) != 0
    }
}

/// Names a gate: `GATE` is the `static` it counts in.
pub(crate) trait Gated: 'static {
    const GATE: &'static ForkGate;
}

extern "C" fn prepare<G: Gated>() {
    let g = G::GATE;
    g.forking.fetch_add(1, SeqCst);
    while g.parked.load(SeqCst) < g.active.load(SeqCst) {
        std::thread::yield_now();
    }
}

extern "C" fn parent<G: Gated>() {
    G::GATE.forking.fetch_sub(1, SeqCst);
}

extern "C" fn child<G: Gated>() {
    // The child has one thread: none is inside the gate.
    let g = G::GATE;
    g.active.store(0, SeqCst);
    g.parked.store(0, SeqCst);
    g.forking.store(0, SeqCst);
}

/// Held by a thread for as long as it is inside gate `G`: glibc forks wait
/// meanwhile, unless it is parked.
pub(crate) struct Inside<G: Gated>(PhantomData<G>);

impl<G: Gated> Inside<G> {
    /// Enters the gate, first waiting for any fork in progress to return.
    pub(crate) fn enter() -> Inside<G> {
        let g = G::GATE;
        g.install.call_once(|| {
            // SAFETY: the handlers are async-signal-safe (atomics and
            // sched_yield only) and live for the whole program.
            unsafe {
                libc::pthread_atfork(Some(prepare::<G>), Some(parent::<G>), Some(child::<G>))
            };
        });
        loop {
            while g.forking.load(SeqCst) != 0 {
                std::thread::yield_now();
            }
            g.active.fetch_add(1, SeqCst);
            if g.forking.load(SeqCst) == 0 {
                return Inside(PhantomData);
            }
            g.active.fetch_sub(1, SeqCst);
        }
    }

    /// Whether a fork waits for this thread to leave or park.
    pub(crate) fn fork_pending(&self) -> bool {
        G::GATE.fork_waits()
    }

    /// Parks: `read` (which must not allocate) runs until no fork is in
    /// progress.
    pub(crate) fn park(&self, mut read: impl FnMut()) {
        let g = G::GATE;
        loop {
            g.parked.fetch_add(1, SeqCst);
            while g.forking.load(SeqCst) != 0 {
                read();
            }
            g.parked.fetch_sub(1, SeqCst);
            // A fork that began after the check above may have counted
            // this thread parked: look again after unparking.
            if g.forking.load(SeqCst) == 0 {
                return;
            }
        }
    }
}

impl<G: Gated> Drop for Inside<G> {
    fn drop(&mut self) {
        G::GATE.active.fetch_sub(1, SeqCst);
    }
}

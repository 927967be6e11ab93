//! The fork gate of every thread that answers userfaultfd events.
//!
//! glibc's fork() takes every malloc arena lock (and the stdio lock) before
//! the clone syscall and holds them while the kernel waits for its FORK
//! event to be read; a thread that must read that event and allocates
//! meanwhile would never read it. Such a thread enters this gate
//! ([`Inside::enter`]) for as long as a range of its descriptor is
//! registered: a relocation batch, which never parks (forks wait until the
//! batch ends), and a lazy fill thread, which parks ([`Inside::park`]:
//! reads messages into room reserved beforehand, allocating nothing) when
//! a fork waits. One gate for both: a fork proceeds once every such
//! thread has left or parked, whichever job it serves. A raw clone(2)
//! passes no gate; its child is filled through its own descriptor
//! ([`super::child`]).

use crate::sys::atfork::{self, Gated};

/// Threads answering userfaultfd events, process-wide.
static ANSWERING: atfork::ForkGate = atfork::ForkGate::new();

/// The gate's name for `sys::atfork`.
pub(crate) struct Answering;

impl Gated for Answering {
    const GATE: &'static atfork::ForkGate = &ANSWERING;
}

/// Held by a thread for as long as it answers events: glibc forks wait
/// meanwhile, unless it is parked.
pub(crate) type Inside = atfork::Inside<Answering>;

/// Whether a fork waits at the gate now: work done for a thread inside it
/// (a copy channel running a lazy fill's batch) can stop early so that
/// thread parks sooner.
pub(crate) fn fork_waits() -> bool {
    ANSWERING.fork_waits()
}

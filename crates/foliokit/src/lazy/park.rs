//! Parking fill threads while glibc's fork() holds the allocator's locks.
//!
//! fork() raises the FORK event and waits until the fill thread reads it;
//! glibc takes every malloc arena lock before the clone syscall, so a fill
//! thread that allocated meanwhile would never read it. The prepare
//! handler runs before those locks are taken: it waits until every fill
//! thread has parked, i.e. promised to do nothing but read messages into
//! room reserved beforehand until fork() returns (the parent handler).
//! The gate is `sys::atfork`'s, as `migrate/fork.rs`'s.

use crate::sys::atfork::{ForkGate, Gated, Inside};

/// Fill threads running, process-wide.
static FILL_THREADS: ForkGate = ForkGate::new();

/// The gate fill threads enter.
pub(crate) struct FillThreads;

impl Gated for FillThreads {
    const GATE: &'static ForkGate = &FILL_THREADS;
}

/// Held by a fill thread for as long as it runs
/// ([`Inside::fork_pending`], [`Inside::park`]).
pub(crate) type Active = Inside<FillThreads>;

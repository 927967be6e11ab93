//! A fork in the middle of a batch.
//!
//! fork() copies page tables as they are: pages of the batch that are out
//! in the parking area are empty entries in the child, which would read
//! zeros. Two defences:
//!
//! 1. [`ForkGate`]: a `pthread_atfork` prepare handler makes glibc's
//!    fork() (and so `std::process::Command` when it forks) wait until no
//!    batch is registered (at most one batch). This is needed, not just
//!    nicer: glibc's fork takes every malloc arena lock and the stdio lock
//!    before the clone syscall and holds them while the kernel waits for
//!    its FORK event to be read, so a migrating thread that allocated
//!    anything meanwhile would never read it. The prepare handler runs
//!    before glibc takes those locks.
//! 2. For a raw clone(2) without CLONE_VM (no atfork handlers, no glibc
//!    locks held), UFFD_FEATURE_EVENT_FORK: the child's copy of the
//!    registered range is registered with a new userfaultfd handed to us,
//!    and the fork does not return (the child does not run) until we read
//!    that event; so we fill those entries with the parked bytes through
//!    the child's descriptor, then close it, which unregisters the child's
//!    ranges and wakes any of its threads that touched them first.
//!    Wipe-on-fork mappings are left empty: the child must see zeros there.

use crate::sys::atfork::{self, Gated, Inside};
use crate::sys::uffd::{Msg, Uffd};

/// Batches currently registered, process-wide.
static BATCHES: atfork::ForkGate = atfork::ForkGate::new();

/// The gate a batch enters; it never parks.
pub(crate) struct Batches;

impl Gated for Batches {
    const GATE: &'static atfork::ForkGate = &BATCHES;
}

/// Held for as long as a batch is registered: glibc forks wait meanwhile.
pub(crate) type ForkGate = Inside<Batches>;

/// How often a fill may be interrupted by the child's own events before
/// we give up on it (each interruption is the child unmapping or forking).
const MAX_ROUNDS: usize = 64;

/// Fills `pages` (`(address in the child, address of the bytes here)`,
/// one page each) into the child behind `child`, then closes it.
pub fn fill_child(child: Uffd, mut pages: Vec<(usize, usize)>, page: usize) {
    for _ in 0..MAX_ROUNDS {
        let mut interrupted = false;
        pages.retain(|&(dst, src)| {
            if interrupted {
                return true;
            }
            match child.copy(dst, src, page) {
                Ok(_) => false,
                // The child changed its mappings: read that first.
                Err(p) if p.error.raw_os_error() == Some(libc::EAGAIN) => {
                    interrupted = true;
                    true
                }
                // EEXIST, ENOENT, EINVAL: the child has something there
                // already, or no mapping of ours any more.
                Err(_) => false,
            }
        });
        if !interrupted {
            break;
        }
        let Ok(msgs) = child.read_all() else { break };
        for m in msgs {
            match m {
                Msg::Fork(grandchild) => fill_child(grandchild, pages.clone(), page),
                Msg::Remove { start, end } | Msg::Unmap { start, end } => {
                    pages.retain(|&(d, _)| d < start || d >= end)
                }
                Msg::Remap { from, to, len } => {
                    for (d, _) in pages.iter_mut() {
                        if *d >= from && *d < from + len {
                            *d = *d - from + to;
                        }
                    }
                }
                Msg::Fault { .. } => {}
            }
        }
    }
    drop(child);
}

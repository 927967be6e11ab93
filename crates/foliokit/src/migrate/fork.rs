//! A fork in the middle of a batch.
//!
//! fork() copies page tables as they are: pages of the batch that are out
//! in the parking area are empty entries in the child, which would read
//! zeros. With UFFD_FEATURE_EVENT_FORK the child's copy of the registered
//! range is registered with a new userfaultfd handed to us, and the fork
//! does not return (the child does not run) until we read that event; so
//! we fill those entries with the parked bytes through the child's
//! descriptor, then close it, which unregisters the child's ranges and
//! wakes any of its threads that touched them first. Wipe-on-fork
//! mappings are left empty: the child must see zeros there.

use crate::sys::uffd::{Msg, Uffd};

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

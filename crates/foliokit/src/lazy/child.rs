//! Filling a forked child's copy of the range.
//!
//! fork() copied the page tables as they were: where the fill had not got
//! yet the child has empty entries, registered with the userfaultfd the
//! FORK event handed us. We fill them from the source through that
//! descriptor (a child's touch meanwhile waits on it), then close it,
//! which unregisters the child's ranges and wakes its waiters. Pages
//! discarded before the fork stay empty (zeros in the child too); source
//! pages the parent found unreadable are poisoned in the child as well,
//! never read again and never left to read zeros.
//!
//! The fill never gives up on a page while the child's range exists: an
//! interruption (the child discarding, unmapping, moving or forking: the
//! kernel answers `-EAGAIN` until we read its event) or a transient
//! `-ENOMEM` only delays it, as it would delay a fault. Giving up would
//! leave the child reading zeros where the snapshot had bytes.

use std::time::Duration;

use crate::sys::uffd::{Msg, Uffd};

/// A run of the child's range to fill.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    /// Address in the child.
    pub dst: usize,
    /// Source address (in this process).
    pub src: usize,
    pub len: usize,
    /// The parent found the source unreadable: poison, never copy.
    pub bad: bool,
}

/// Splits pieces at `a` and `b` so none straddles either.
fn split(pieces: Vec<Piece>, a: usize, b: usize) -> Vec<Piece> {
    let mut out = Vec::with_capacity(pieces.len() + 2);
    for p in pieces {
        let mut cuts = vec![p.dst];
        for c in [a, b] {
            if c > p.dst && c < p.dst + p.len {
                cuts.push(c);
            }
        }
        cuts.sort_unstable();
        cuts.push(p.dst + p.len);
        for w in cuts.windows(2) {
            out.push(Piece {
                dst: w[0],
                src: p.src + (w[0] - p.dst),
                len: w[1] - w[0],
                bad: p.bad,
            });
        }
    }
    out
}

/// What became of one piece.
enum Step {
    Done,
    /// Stopped at this offset: read the child's events, then go on.
    Interrupted(usize),
}

/// Fills (or poisons) `p` from offset `at`.
fn fill_piece(child: &Uffd, p: Piece, mut at: usize, unit: usize, poison: bool) -> Step {
    while at < p.len {
        let (d, s, l) = (p.dst + at, p.src + at, p.len - at);
        let r = if !p.bad {
            child.copy(d, s, l)
        } else if poison {
            child.poison(d, l)
        } else {
            // No poison marker on this kernel: the page stays empty and
            // reads zeros once the child is released, as in the parent,
            // whose report names it.
            return Step::Done;
        };
        let Err(e) = r else { return Step::Done };
        at += e.done / unit * unit;
        match e.error.raw_os_error() {
            Some(libc::EAGAIN) => return Step::Interrupted(at),
            Some(libc::ENOMEM) => std::thread::sleep(Duration::from_millis(1)),
            // Unreadable after all (the file shrank since the fork):
            // poisoned like the parent's bad pages.
            Some(libc::EFAULT) if poison && !p.bad => {
                let _ = child.poison(d + e.done / unit * unit, unit);
                at += unit;
            }
            // EEXIST: the child got there first; EFAULT without poison:
            // left empty, zeros once closed.
            Some(libc::EEXIST | libc::EFAULT) => at += unit,
            // ESRCH (the child exited or exec'd), ENOENT, EINVAL: nothing
            // of ours there any more.
            _ => return Step::Done,
        }
    }
    Step::Done
}

/// Fills `pieces` in the child behind `child` (copying `unit` bytes at a
/// time after an error), poisoning source pages that cannot be read when
/// `poison`, then closes it.
pub fn fill_child(child: Uffd, mut pieces: Vec<Piece>, unit: usize, poison: bool) {
    loop {
        let mut rest = Vec::new();
        for (i, &p) in pieces.iter().enumerate() {
            if let Step::Interrupted(at) = fill_piece(&child, p, 0, unit, poison) {
                rest.push(Piece {
                    dst: p.dst + at,
                    src: p.src + at,
                    len: p.len - at,
                    bad: p.bad,
                });
                rest.extend_from_slice(&pieces[i + 1..]);
                break;
            }
        }
        if rest.is_empty() {
            break;
        }
        pieces = rest;
        // Only the child's events interrupt: read them, then go on.
        let Ok(msgs) = child.read_all() else { break };
        for m in msgs {
            match m {
                Msg::Fork(grandchild) => {
                    let copy = pieces.clone();
                    let _ =
                        crate::worker::spawn_shielded("foliokit-lazy-child".into(), move || {
                            fill_child(grandchild, copy, unit, poison)
                        });
                }
                Msg::Remove { start, end } | Msg::Unmap { start, end } => {
                    pieces = split(pieces, start, end);
                    pieces.retain(|p| p.dst < start || p.dst >= end);
                }
                Msg::Remap { from, to, len } => {
                    pieces = split(pieces, from, from + len);
                    for p in pieces.iter_mut() {
                        if p.dst >= from && p.dst < from + len {
                            p.dst = p.dst - from + to;
                        }
                    }
                }
                Msg::Fault { .. } => {}
            }
        }
    }
    drop(child);
}

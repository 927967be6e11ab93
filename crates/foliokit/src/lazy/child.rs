//! Filling a forked child's copy of the range.
//!
//! fork() copied the page tables as they were: where the fill had not got
//! yet the child has empty entries, registered with the userfaultfd the
//! FORK event handed us. We fill them from the source through that
//! descriptor (a child's touch meanwhile waits on it), then close it,
//! which unregisters the child's ranges and wakes its waiters. Pages
//! discarded before the fork stay empty (zeros in the child too).

use crate::sys::uffd::{Msg, Uffd};

/// `(address in the child, source address, length)`.
pub type Piece = (usize, usize, usize);

/// How often the child's own events may interrupt the fill before we give
/// up on it (each is the child discarding, unmapping, moving or forking).
const MAX_ROUNDS: usize = 1024;

/// Splits pieces at `a` and `b` so none straddles either.
fn split(pieces: Vec<Piece>, a: usize, b: usize) -> Vec<Piece> {
    let mut out = Vec::with_capacity(pieces.len() + 2);
    for (d, s, l) in pieces {
        let mut cuts = vec![d];
        for c in [a, b] {
            if c > d && c < d + l {
                cuts.push(c);
            }
        }
        cuts.sort_unstable();
        cuts.push(d + l);
        for w in cuts.windows(2) {
            out.push((w[0], s + (w[0] - d), w[1] - w[0]));
        }
    }
    out
}

/// Fills `pieces` in the child behind `child` (copying `unit` bytes at a
/// time after an error), poisoning source pages that cannot be read when
/// `poison`, then closes it.
pub fn fill_child(child: Uffd, mut pieces: Vec<Piece>, unit: usize, poison: bool) {
    for _ in 0..MAX_ROUNDS {
        let mut interrupted = false;
        let mut rest = Vec::new();
        for (i, &(d, s, l)) in pieces.iter().enumerate() {
            let mut at = 0;
            while at < l {
                match child.copy(d + at, s + at, l - at) {
                    Ok(_) => at = l,
                    Err(p) => {
                        at += p.done / unit * unit;
                        match p.error.raw_os_error() {
                            Some(libc::EAGAIN) => {
                                interrupted = true;
                                break;
                            }
                            Some(libc::EFAULT) if poison => {
                                let _ = child.poison(d + at, unit);
                                at += unit;
                            }
                            // EEXIST: there already; EFAULT without poison:
                            // left empty, zeros once closed.
                            Some(libc::EEXIST | libc::EFAULT) => at += unit,
                            // ESRCH (the child exited or exec'd), ENOENT,
                            // EINVAL: nothing of ours there any more.
                            _ => at = l,
                        }
                    }
                }
            }
            if interrupted {
                if at < l {
                    rest.push((d + at, s + at, l - at));
                }
                rest.extend_from_slice(&pieces[i + 1..]);
                break;
            }
        }
        if !interrupted {
            break;
        }
        pieces = rest;
        let Ok(msgs) = child.read_all() else { break };
        for m in msgs {
            match m {
                Msg::Fork(grandchild) => {
                    let copy = pieces.clone();
                    let _ = std::thread::Builder::new()
                        .name("foliokit-lazy-child".into())
                        .spawn(move || fill_child(grandchild, copy, unit, poison));
                }
                Msg::Remove { start, end } | Msg::Unmap { start, end } => {
                    pieces = split(pieces, start, end);
                    pieces.retain(|&(d, _, _)| d < start || d >= end);
                }
                Msg::Remap { from, to, len } => {
                    pieces = split(pieces, from, from + len);
                    for (d, _, _) in pieces.iter_mut() {
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

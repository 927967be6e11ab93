//! Filling a forked child's copy of a registered range.
//!
//! fork() copies page tables as they are: where the parent's range had
//! empty entries (pages a relocation batch has parked, pages a lazy fill
//! has not got to yet) the child has empty entries too, registered with the
//! userfaultfd the FORK event handed us. The fork does not return until
//! that event is read; then the child's threads touching those entries
//! wait on its descriptor. [`fill_child`] installs the bytes the child is
//! owed through that descriptor, then closes it, which unregisters the
//! child's ranges and wakes its waiters.
//!
//! One policy, whoever forked: a page owed to the child is never given up
//! on while the child still has it. An interruption (the child discarding,
//! unmapping, moving or forking: the kernel answers `EAGAIN` until its
//! event is read) or a transient `ENOMEM` only delays it, as it would
//! delay a fault; giving up would leave the child reading zeros where its
//! parent had bytes. A page stops being owed only when the child no longer
//! has it: a REMOVE or UNMAP event of the child's descriptor, the kernel
//! finding no registered mapping of the child's there (`ENOENT`, `EINVAL`
//! for a unit alone), the child gone (`ESRCH`), or its own write there
//! first (`EEXIST`).
//!
//! Source pages the parent found unreadable are poisoned in the child
//! (where the kernel has `UFFDIO_POISON`), never left to read zeros; one
//! found unreadable only now (a snapshot file cut since) is poisoned too.

use std::io;

use crate::sys::errno;
use crate::sys::uffd::{after, After, Msg, Partial, Uffd};

/// A run of the child's range it is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Address in the child.
    pub dst: usize,
    /// Where the bytes are, in this process.
    pub src: usize,
    pub len: usize,
    /// The source is unreadable: poison, never copy.
    pub bad: bool,
}

/// What the child is owed, in address order of the parent's walk: a plain
/// list of pieces that the child's events edit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Owed {
    pieces: std::collections::VecDeque<Piece>,
}

impl Owed {
    /// Adds `len` bytes at child address `dst` from `src`, joined to the
    /// last piece where they continue it.
    pub(crate) fn push(&mut self, dst: usize, src: usize, len: usize, bad: bool) {
        match self.pieces.back_mut() {
            Some(p) if p.dst + p.len == dst && p.src + p.len == src && p.bad == bad => p.len += len,
            _ => self.pieces.push_back(Piece { dst, src, len, bad }),
        }
    }

    /// The next piece to install.
    fn first(&self) -> Option<Piece> {
        self.pieces.front().copied()
    }

    /// The first `n` bytes of the first piece are no longer owed
    /// (installed, or the child has something there).
    fn advance(&mut self, n: usize) {
        let Some(p) = self.pieces.front_mut() else {
            return;
        };
        if n >= p.len {
            self.pieces.pop_front();
        } else {
            p.dst += n;
            p.src += n;
            p.len -= n;
        }
    }

    /// The first `n` bytes of the first piece are unreadable: they become
    /// a bad piece of their own.
    fn first_bad(&mut self, n: usize) {
        let Some(p) = self.pieces.front().copied() else {
            return;
        };
        self.advance(n.min(p.len));
        self.pieces.push_front(Piece {
            len: n.min(p.len),
            bad: true,
            ..p
        });
    }

    /// Cuts every piece at child addresses `a` and `b`.
    fn split(&mut self, a: usize, b: usize) {
        let mut out = std::collections::VecDeque::with_capacity(self.pieces.len() + 2);
        for p in self.pieces.drain(..) {
            let mut at = p.dst;
            let end = p.dst + p.len;
            for c in [a.min(b), a.max(b)] {
                if c > at && c < end {
                    out.push_back(Piece {
                        dst: at,
                        src: p.src + (at - p.dst),
                        len: c - at,
                        bad: p.bad,
                    });
                    at = c;
                }
            }
            out.push_back(Piece {
                dst: at,
                src: p.src + (at - p.dst),
                len: end - at,
                bad: p.bad,
            });
        }
        self.pieces = out;
    }

    /// The child no longer has `[start, end)` (REMOVE, UNMAP): nothing
    /// there is owed.
    pub(crate) fn gone(&mut self, start: usize, end: usize) {
        self.split(start, end);
        self.pieces.retain(|p| p.dst < start || p.dst >= end);
    }

    /// The child moved `[from, from + len)` to `to` (REMAP).
    pub(crate) fn moved(&mut self, from: usize, to: usize, len: usize) {
        self.split(from, from + len);
        for p in self.pieces.iter_mut() {
            if p.dst >= from && p.dst < from + len {
                p.dst = p.dst - from + to;
            }
        }
    }
}

/// The calls the fill makes on the child's descriptor (a trait so that
/// the policy is tested against scripted answers).
pub(crate) trait ChildFd {
    fn copy(&self, dst: usize, src: usize, len: usize) -> Result<usize, Partial>;
    fn poison(&self, dst: usize, len: usize) -> Result<usize, Partial>;
    /// Every message waiting now.
    fn events(&self) -> io::Result<Vec<Msg>>;
}

impl ChildFd for Uffd {
    fn copy(&self, dst: usize, src: usize, len: usize) -> Result<usize, Partial> {
        Uffd::copy(self, dst, src, len)
    }
    fn poison(&self, dst: usize, len: usize) -> Result<usize, Partial> {
        Uffd::poison(self, dst, len)
    }
    fn events(&self) -> io::Result<Vec<Msg>> {
        self.read_all()
    }
}

/// How the child is filled: the same for every job.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fill {
    /// The install unit after an error (the base page, or the huge page
    /// size of a hugetlb range).
    pub unit: usize,
    /// `UFFDIO_POISON` is there: bad pieces are poisoned (else left empty:
    /// zeros once the child is released, as in the parent, whose report
    /// names them).
    pub poison: bool,
}

/// Fills what `owed` lists in the child behind `child`, then closes it.
pub(crate) fn fill_child(child: Uffd, owed: Owed, how: Fill) {
    fill(&child, owed, how);
    drop(child);
}

/// Fills `owed` through `child` (see the module docs for the policy). A
/// grandchild forked meanwhile is filled with what its parent was owed at
/// its fork, before this fill goes on.
pub(crate) fn fill(child: &impl ChildFd, mut owed: Owed, how: Fill) {
    let unit = how.unit;
    // After a run refused whole (it spans two mappings of the child's: an
    // mprotect split its range), units one at a time up to here.
    let mut single_until = 0;
    while let Some(p) = owed.first() {
        let len = if p.dst < single_until {
            unit.min(p.len)
        } else {
            p.len
        };
        let r = if !p.bad {
            child.copy(p.dst, p.src, len)
        } else if how.poison {
            child.poison(p.dst, len)
        } else {
            Ok(len)
        };
        let e = match r {
            Ok(_) => {
                owed.advance(len);
                continue;
            }
            Err(e) => e,
        };
        owed.advance(e.done / unit * unit);
        match after(&e.error) {
            After::ReadEvents => {
                // Addresses may have moved: judge runs afresh.
                single_until = 0;
                let Ok(msgs) = child.events() else {
                    // The descriptor itself failed: nothing more can be
                    // installed through it.
                    return;
                };
                for m in msgs {
                    match m {
                        Msg::Remove { start, end } | Msg::Unmap { start, end } => {
                            owed.gone(start, end)
                        }
                        Msg::Remap { from, to, len } => owed.moved(from, to, len),
                        Msg::Fork(grandchild) => fill_child(grandchild, owed.clone(), how),
                        Msg::Fault { .. } => {}
                    }
                }
            }
            After::Retry => std::thread::sleep(crate::params::UFFD_ENOMEM_WAIT),
            // The child wrote there first: its bytes stay.
            After::Exists => owed.advance(unit),
            After::Fails => match errno(&e.error) {
                // The source could not be read (a snapshot file cut since
                // the fork): poisoned like the parent's bad pages, or left
                // empty where poison is unavailable.
                libc::EFAULT if !p.bad && how.poison => owed.first_bad(unit),
                libc::EFAULT => owed.advance(unit),
                libc::ENOENT | libc::EINVAL if len > unit => single_until = p.dst + len,
                // The child has no address space any more (it exited or
                // exec'd): it is owed nothing.
                libc::ESRCH => return,
                // No registered mapping of the child's there, or a call
                // the kernel refuses there for good: the child does not
                // have this unit as we left it.
                _ => owed.advance(unit),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::VecDeque;

    const PAGE: usize = 4096;

    fn owed(pieces: &[(usize, usize, usize, bool)]) -> Owed {
        let mut o = Owed::default();
        for &(dst, src, len, bad) in pieces {
            o.push(dst, src, len, bad);
        }
        o
    }

    #[test]
    fn pieces_join_where_they_continue_and_events_edit_them() {
        let mut o = owed(&[(0x1000, 0x9000, PAGE, false), (0x2000, 0xa000, PAGE, false)]);
        assert_eq!(o.pieces.len(), 1, "joined");
        o.push(0x3000, 0xb000, PAGE, true);
        assert_eq!(o.pieces.len(), 2, "a bad page is a piece of its own");
        o.gone(0x2000, 0x3000);
        assert_eq!(o.pieces.iter().map(|p| p.len).sum::<usize>(), 2 * PAGE);
        assert_eq!(o.first().unwrap().len, PAGE);
        o.moved(0x3000, 0x7000, PAGE);
        let last = *o.pieces.back().unwrap();
        assert_eq!((last.dst, last.src, last.bad), (0x7000, 0xb000, true));
        o.first_bad(PAGE);
        assert!(o.first().unwrap().bad);
        o.advance(PAGE);
        o.advance(PAGE);
        assert!(o.pieces.is_empty());
    }

    #[test]
    fn a_removal_inside_one_piece_keeps_both_ends() {
        let mut o = owed(&[(0x10000, 0x90000, 8 * PAGE, false)]);
        o.gone(0x12000, 0x14000);
        let v: Vec<(usize, usize, usize)> =
            o.pieces.iter().map(|p| (p.dst, p.src, p.len)).collect();
        assert_eq!(
            v,
            [(0x10000, 0x90000, 2 * PAGE), (0x14000, 0x94000, 4 * PAGE)]
        );
    }

    /// A child descriptor that answers from a script and records what was
    /// installed.
    #[derive(Default)]
    struct Scripted {
        /// Answers to install calls, in order; `Ok` once it runs out.
        answers: RefCell<VecDeque<(i32, usize)>>,
        /// Messages each read of events returns, in order.
        events: RefCell<VecDeque<Vec<Msg>>>,
        /// `(poison?, dst, bytes installed)`.
        installed: RefCell<Vec<(bool, usize, usize)>>,
        calls: RefCell<usize>,
    }

    impl Scripted {
        fn answer(&self, poison: bool, dst: usize, len: usize) -> Result<usize, Partial> {
            *self.calls.borrow_mut() += 1;
            let (errno, done) = self.answers.borrow_mut().pop_front().unwrap_or((0, len));
            if done > 0 {
                self.installed
                    .borrow_mut()
                    .push((poison, dst, done.min(len)));
            }
            if errno == 0 {
                Ok(len)
            } else {
                Err(Partial {
                    done,
                    error: io::Error::from_raw_os_error(errno),
                })
            }
        }

        fn copied(&self) -> usize {
            self.installed
                .borrow()
                .iter()
                .filter(|i| !i.0)
                .map(|i| i.2)
                .sum()
        }
    }

    impl ChildFd for Scripted {
        fn copy(&self, dst: usize, _src: usize, len: usize) -> Result<usize, Partial> {
            self.answer(false, dst, len)
        }
        fn poison(&self, dst: usize, len: usize) -> Result<usize, Partial> {
            self.answer(true, dst, len)
        }
        fn events(&self) -> io::Result<Vec<Msg>> {
            Ok(self.events.borrow_mut().pop_front().unwrap_or_default())
        }
    }

    const FILL: Fill = Fill {
        unit: PAGE,
        poison: true,
    };

    #[test]
    fn enomem_and_interruptions_never_give_up_on_an_owed_page() {
        // More than the 64 interrupted rounds the relocation's child fill
        // used to allow before it dropped what was left.
        let c = Scripted::default();
        for _ in 0..200 {
            c.answers.borrow_mut().push_back((libc::EAGAIN, 0));
            c.answers.borrow_mut().push_back((libc::ENOMEM, 0));
        }
        fill(&c, owed(&[(0x10000, 0x90000, 4 * PAGE, false)]), FILL);
        assert_eq!(c.copied(), 4 * PAGE);
    }

    #[test]
    fn an_interrupted_call_goes_on_after_what_it_installed() {
        let c = Scripted::default();
        c.answers.borrow_mut().push_back((libc::EAGAIN, PAGE + 100));
        fill(&c, owed(&[(0x10000, 0x90000, 4 * PAGE, false)]), FILL);
        // The partial unit is installed again from its start.
        let v = c.installed.borrow().clone();
        assert_eq!(
            v,
            [(false, 0x10000, PAGE + 100), (false, 0x11000, 3 * PAGE)]
        );
    }

    #[test]
    fn only_the_childs_removal_drops_owed_pages_and_a_move_follows_them() {
        let c = Scripted::default();
        c.answers.borrow_mut().push_back((libc::EAGAIN, 0));
        c.events.borrow_mut().push_back(vec![
            Msg::Remove {
                start: 0x11000,
                end: 0x12000,
            },
            Msg::Remap {
                from: 0x12000,
                to: 0x50000,
                len: 2 * PAGE,
            },
        ]);
        fill(&c, owed(&[(0x10000, 0x90000, 4 * PAGE, false)]), FILL);
        let v = c.installed.borrow().clone();
        assert_eq!(v, [(false, 0x10000, PAGE), (false, 0x50000, 2 * PAGE)]);
    }

    #[test]
    fn a_run_refused_whole_goes_unit_by_unit() {
        let c = Scripted::default();
        // The run spans two mappings; then the second unit alone is not
        // the child's any more.
        c.answers.borrow_mut().push_back((libc::ENOENT, 0));
        c.answers.borrow_mut().push_back((0, PAGE));
        c.answers.borrow_mut().push_back((libc::ENOENT, 0));
        fill(&c, owed(&[(0x10000, 0x90000, 4 * PAGE, false)]), FILL);
        let v = c.installed.borrow().clone();
        assert_eq!(
            v,
            [
                (false, 0x10000, PAGE),
                (false, 0x12000, PAGE),
                (false, 0x13000, PAGE)
            ]
        );
    }

    #[test]
    fn unreadable_sources_are_poisoned_and_existing_pages_kept() {
        let c = Scripted::default();
        c.answers.borrow_mut().push_back((libc::EFAULT, PAGE));
        c.answers.borrow_mut().push_back((0, PAGE)); // the poison
        c.answers.borrow_mut().push_back((libc::EEXIST, 0));
        fill(
            &c,
            owed(&[
                (0x10000, 0x90000, 4 * PAGE, false),
                (0x20000, 0xa0000, PAGE, true),
            ]),
            FILL,
        );
        let v = c.installed.borrow().clone();
        assert_eq!(
            v,
            [
                (false, 0x10000, PAGE),
                (true, 0x11000, PAGE),
                (false, 0x13000, PAGE),
                (true, 0x20000, PAGE)
            ]
        );
    }

    #[test]
    fn without_poison_bad_pages_stay_empty_and_a_gone_child_ends_the_fill() {
        let c = Scripted::default();
        let how = Fill {
            unit: PAGE,
            poison: false,
        };
        fill(&c, owed(&[(0x20000, 0xa0000, PAGE, true)]), how);
        assert_eq!(*c.calls.borrow(), 0);
        c.answers.borrow_mut().push_back((libc::ESRCH, 0));
        fill(&c, owed(&[(0x10000, 0x90000, 4 * PAGE, false)]), how);
        assert_eq!(*c.calls.borrow(), 1);
        assert_eq!(c.copied(), 0);
    }
}

//! Serving a fault: find its block, fill it (or zeros where it was
//! discarded), wake the thread.

use std::sync::atomic::Ordering;

use super::fill::Filler;
use crate::sys::errno;
use crate::sys::uffd::{self, Uffd};

impl Filler {
    /// Serves a fault at (current) address `addr`.
    pub(super) fn serve(&mut self, addr: usize) {
        self.shared.faults.fetch_add(1, Ordering::Relaxed);
        while !self.serve_once(addr) {}
    }

    /// One attempt at serving `addr`; false when events were read on the
    /// way (an mremap may have moved what lives there): decide again.
    pub(super) fn serve_once(&mut self, addr: usize) -> bool {
        let at = addr / self.page * self.page;
        let Some((orig, b)) = self
            .ledger
            .remaps
            .original(addr)
            .and_then(|o| Some((o, self.ledger.block_of(o)?)))
        else {
            // Registered memory none of our pages lives in: the tail an
            // in-place growing mremap added, or (until its REMAP event is
            // read) where an mremap just moved some of ours; the zero
            // install then fails with -EAGAIN and we decide again.
            return self.zeros_outside(at);
        };
        let seg = self.ledger.blocks[b].seg as usize;
        let was_done = self.ledger.done(b);
        if !was_done {
            let n = self.fill_block(b, None);
            self.shared.faulted.fetch_add(n as u64, Ordering::Relaxed);
        }
        let unit = self.ledger.segs[seg].unit;
        let p = orig / unit * unit;
        let i = self.ledger.page_index(seg, p);
        if self.ledger.removed(i) || was_done && (!self.ledger.bad(i) || !self.poison) {
            // Discarded: the guest expects zeros there, also where the
            // snapshot's page was bad (the discard dropped its marker; a
            // touch of a marker raises SIGBUS and never gets here).
            // Filled before this fault: usually still there (the fault
            // raced its install, and the kernel answers EEXIST), else
            // emptied by what raises no event (a hole punched in shared
            // memory): zeros, as the kernel gives there. Only waking would
            // send the thread to fault again until the fill ends. Never
            // over a bad unit's poison marker, which zeros would replace
            // (without UFFDIO_POISON its marker is zeros anyway).
            self.install_zeros(p, unit);
        }
        let now = self.ledger.remaps.now(p);
        if !(now..now + unit).contains(&at) {
            // The fault is not where this unit lives now: the old range
            // an mremap with MREMAP_DONTUNMAP left behind, still
            // registered and empty. Its pages read zeros, as the kernel
            // gives there; waking the unit's new home alone would leave
            // this thread faulting again forever.
            return self.zeros_outside(at);
        }
        // Whatever happened above (installed, found installed, an install
        // that failed for this very unit), the faulting thread is woken:
        // cheap, and harmless where the page is present. Without it a
        // thread whose unit could not be installed slept until the fill
        // ended.
        let _ = self.uffd.wake(now, unit);
        true
    }

    /// Zeros at `at`, registered memory outside every unit of ours (a
    /// base page, or the largest unit where the mapping is hugetlb), then
    /// the thread faulting there is woken. False when the kernel answered
    /// that events wait (an mremap or a discard in progress): they are
    /// read, and the caller decides again, since `at` may now be ours.
    pub(super) fn zeros_outside(&mut self, at: usize) -> bool {
        let zero = self.zero.base;
        let mut unit = self.page;
        loop {
            let dst = at / unit * unit;
            let Err(p) = self.uffd.copy(dst, zero, unit) else {
                break;
            };
            match uffd::after(&p.error) {
                uffd::After::Retry => std::thread::sleep(crate::params::UFFD_ENOMEM_WAIT),
                uffd::After::ReadEvents => {
                    self.drain();
                    return false;
                }
                _ if errno(&p.error) == libc::EINVAL && unit < self.zero.len => {
                    unit = self.zero.len
                }
                _ => break,
            }
        }
        let _ = self.uffd.wake(at / unit * unit, unit);
        true
    }

    /// Installs zeros for the discarded unit at original address `orig`.
    pub(super) fn install_zeros(&mut self, orig: usize, unit: usize) {
        let zero = self.zero.base;
        self.install(orig, unit, false, |uffd, dst| uffd.copy(dst, zero, unit));
    }

    /// Runs `op` (an install of `unit` bytes at the unit's current
    /// address) until it is done or cannot be: `-EAGAIN` (events waiting;
    /// read them: the address may have moved, the unit been discarded)
    /// and `-ENOMEM` are retried without limit, as a fault would be,
    /// since giving up would leave the page to read zeros. With
    /// `unless_discarded`, a unit found discarded once the events are read
    /// is left alone: installing there after its zap would bring back
    /// bytes the guest dropped. Returns whether `op` installed it;
    /// `-EEXIST` (someone got there first) wakes the waiters and returns
    /// false.
    pub(super) fn install(
        &mut self,
        orig: usize,
        unit: usize,
        unless_discarded: bool,
        op: impl Fn(&Uffd, usize) -> Result<usize, uffd::Partial>,
    ) -> bool {
        let seg = self.ledger.seg_of(orig).expect("inside a segment");
        let (i, n) = (self.ledger.page_index(seg, orig), unit / self.page);
        let r = uffd::retrying(
            self,
            crate::params::UFFD_ENOMEM_WAIT,
            |f| {
                let owed = !unless_discarded || !f.ledger.any_removed(i, n);
                owed.then(|| op(&f.uffd, f.ledger.remaps.now(orig)))
            },
            Filler::drain,
        );
        match r {
            Some(Ok(_)) => true,
            Some(Err(p)) if uffd::after(&p.error) == uffd::After::Exists => {
                let _ = self.uffd.wake(self.ledger.remaps.now(orig), unit);
                false
            }
            _ => false,
        }
    }
}

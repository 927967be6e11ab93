//! Installing a block: moved in whole from a staging slot, or copied unit
//! by unit from the source, and what an unreadable source page becomes.

use std::sync::atomic::Ordering;

use super::fill::Filler;
use super::LazyBad;
use crate::mc::{FaultKind, McError};
use crate::sys::errno;

impl Filler {
    /// Faults the fault slot's huge page in now, while the channels copy a
    /// batch, so that serving the next fault does not: the first write
    /// into an empty slot makes the kernel zero the whole folio, and the
    /// channels splitting a fault's folio would wait for that one zeroing
    /// before they copy. On the dev machine the first-touch p99 fell by
    /// 0.1–0.2 ms (`foliokit bench restore -s 4G`, four A/B pairs); the
    /// zeroing itself is only moved, so the fill takes as long. Best
    /// effort: where the kernel lacks `MADV_POPULATE_WRITE` (5.14) the
    /// copy faults it in as before.
    pub(super) fn ready_fault_slot(&mut self) {
        if self.fault_slot_ready || self.staging.is_none() {
            return;
        }
        let s = self.slot(self.slots);
        // SAFETY: advice on the fault slot, a folio of our private staging
        // mapping that nobody uses while a batch is in flight (faults then
        // copy on this thread, not now).
        let rc = unsafe {
            libc::madvise(
                s as *mut libc::c_void,
                self.folio,
                libc::MADV_POPULATE_WRITE,
            )
        };
        self.fault_slot_ready = rc == 0;
    }

    /// Whether block `b` can go in whole with `UFFDIO_MOVE`. A block whose
    /// source reads all zero does not: it gets zero pages, never a copy.
    pub(super) fn movable(&self, b: usize) -> bool {
        self.could_move(b) && !self.zero_block(b)
    }

    /// Whether block `b` could go in whole with `UFFDIO_MOVE` if its
    /// source holds data (not looked at here).
    pub(super) fn could_move(&self, b: usize) -> bool {
        let blk = self.ledger.blocks[b];
        self.ledger.segs[blk.seg as usize].movable
            && blk.len == self.folio
            && self.staging.is_some()
            && self.ledger.whole(b)
            && self.ledger.remaps.now(blk.start) % self.folio == 0
    }

    /// Whether block `b`'s source has been looked at (zero or not).
    pub(super) fn zero_found(&self, b: usize) -> bool {
        self.zero_blocks[b].load(Ordering::Relaxed) != 0
    }

    /// Whether block `b`'s source is already known to read all zero (no
    /// look now).
    pub(super) fn zero_known(&self, b: usize) -> bool {
        self.zero_blocks[b].load(Ordering::Relaxed) == super::fill::ZERO_ALL
    }

    /// Whether block `b`'s source shows data in its first bytes (then kept
    /// as its verdict): a look that costs one short read.
    pub(super) fn data_at_start(&self, b: usize) -> bool {
        let blk = self.ledger.blocks[b];
        let data = self
            .source
            .starts_with_data(self.ledger.src_offset(blk.seg as usize, blk.start));
        if data {
            self.zero_blocks[b].store(super::fill::ZERO_DATA, Ordering::Relaxed);
        }
        data
    }

    /// Whether block `b`'s source reads all zero, found once.
    pub(super) fn zero_block(&self, b: usize) -> bool {
        use super::fill::{ZERO_ALL, ZERO_DATA};
        match self.zero_blocks[b].load(Ordering::Relaxed) {
            ZERO_DATA => false,
            ZERO_ALL => true,
            _ => {
                let blk = self.ledger.blocks[b];
                let off = self.ledger.src_offset(blk.seg as usize, blk.start);
                let z = self.source.reads_zero(off, blk.len);
                self.zero_blocks[b].store(if z { ZERO_ALL } else { ZERO_DATA }, Ordering::Relaxed);
                z
            }
        }
    }

    /// Installs zeros over the `len` bytes at (current) address `dst`, a
    /// run of whole units of `unit` bytes, without reading the source:
    /// the shared zero page where the unit is a base page (the
    /// registration offered `UFFDIO_ZEROPAGE` exactly there: setup takes
    /// its absence for hugetlb), else a copy from the zero mapping unit
    /// by unit (hugetlb: the kernel writes the huge page from the zero
    /// page, reading no snapshot byte). Counts what it installed as zero
    /// pages.
    pub(super) fn install_zero_run(
        &self,
        dst: usize,
        len: usize,
        unit: usize,
    ) -> Result<usize, crate::sys::uffd::Partial> {
        let r = zero_run(&self.uffd, (self.zero.base, self.zero.len), dst, len, unit);
        let done = match &r {
            Ok(n) => *n,
            Err(p) => p.done,
        };
        self.shared
            .zero
            .fetch_add((done / self.page) as u64, Ordering::Relaxed);
        r
    }

    pub(super) fn slot(&self, k: usize) -> usize {
        let base = self.staging.as_ref().expect("staging area").base;
        base.next_multiple_of(self.folio) + k * self.folio
    }

    /// Maps the page tables of block `b`'s source in one call before the
    /// kernel copies it with `UFFDIO_COPY` (see [`Source::prefault`]).
    /// Holes are left alone: reading one would fill the page cache (or a
    /// tmpfs file) with pages of zeros.
    pub(super) fn prefault_source(&self, b: usize) {
        let blk = self.ledger.blocks[b];
        let off = self.ledger.src_offset(blk.seg as usize, blk.start);
        for (s, n, hole) in self.source.holes().pieces(off as u64, blk.len as u64, 1) {
            if !hole {
                self.source.prefault(s as usize, n as usize);
            }
        }
    }

    /// Fills block `b` now; with `staged`, its bytes are already in that
    /// staging slot. Returns the base pages installed.
    pub(super) fn fill_block(&mut self, b: usize, staged: Option<usize>) -> usize {
        if self.ledger.done(b) {
            return 0;
        }
        let movable = self.movable(b);
        // Only where the kernel copies a large block: a base page's copy
        // faults its source in once, and the call would only add to it.
        if !movable && self.ledger.blocks[b].len >= crate::params::LAZY_PARALLEL_COPY_LEAST_BYTES {
            self.prefault_source(b);
        }
        let n = if movable {
            let blk = self.ledger.blocks[b];
            let slot = match staged {
                Some(s) => Some(s),
                None if self.in_batch => {
                    // The channels are busy with the batch: copy on this
                    // thread into the fault slot (the batch's are in use).
                    let s = self.slot(self.slots);
                    let src = self.src(blk.seg as usize, blk.start);
                    // SAFETY: the fault slot is our private staging folio,
                    // used by no batch; the source is mapped for the
                    // segment's bytes (checked at start) and may fault,
                    // which the mc copy reports.
                    let r = unsafe {
                        crate::mc::copy_mc_raw(
                            s as *mut u8,
                            src as *const u8,
                            blk.len,
                            self.strategy,
                        )
                    };
                    r.is_ok().then_some(s)
                }
                None => {
                    // A faulting thread waits for this copy: the channels
                    // (and this thread) split the one folio between them,
                    // into the fault slot.
                    let s = self.slot(self.slots);
                    let src = self.src(blk.seg as usize, blk.start);
                    // SAFETY: the slot is our private staging mapping
                    // (blk.len == folio bytes from a folio-aligned slot),
                    // untouched by anyone else until the batch ends; the
                    // source is mapped for the segment's bytes (checked at
                    // start) and may fault, which the mc copy reports.
                    let r = unsafe {
                        self.pool.submit_copy_mc(
                            &[s as *mut u8],
                            &[src as *const u8],
                            blk.len,
                            self.mc,
                        )
                    };
                    r.ok()
                        .map(|b| {
                            b.run_unstarted();
                            b.wait()
                        })
                        .filter(|o| o.failed.is_empty())
                        .map(|_| s)
                }
            };
            match slot {
                Some(s) => self.move_in(b, s),
                None => self.copy_block(b, 0),
            }
        } else {
            self.copy_block(b, 0)
        };
        self.ledger.mark_done(b);
        n
    }

    /// Finishes block `b`, whose first `from` bytes a call that ended
    /// early installed (its source already prefaulted). Returns the base
    /// pages installed.
    pub(super) fn finish_block(&mut self, b: usize, from: usize) -> usize {
        if self.ledger.done(b) {
            return 0;
        }
        let n = self.copy_block(b, from);
        self.ledger.mark_done(b);
        n
    }

    /// Moves the staged folio into block `b`; what the move could not do
    /// is copied from the source.
    pub(super) fn move_in(&mut self, b: usize, slot: usize) -> usize {
        let blk = self.ledger.blocks[b];
        let dst = self.ledger.remaps.now(blk.start);
        if slot == self.slot(self.slots) {
            self.fault_slot_ready = false;
        }
        match self.uffd.move_pages(dst, slot, blk.len) {
            Ok(_) => {
                self.tally.whole += 1;
                blk.len / self.page
            }
            Err(p) => {
                if errno(&p.error) == libc::EAGAIN {
                    self.drain();
                }
                // The pages moved are there (and woken): the copy goes on
                // after them.
                p.done / self.page + self.copy_block(b, p.done)
            }
        }
    }

    /// Copies block `b` from the source with `UFFDIO_COPY`, unit by unit
    /// where needed, skipping discarded and bad pages and pages already
    /// there, from `from` bytes into it on (a call that ended early
    /// installed and woke what lies before). Returns the base pages
    /// installed.
    pub(super) fn copy_block(&mut self, b: usize, from: usize) -> usize {
        let blk = self.ledger.blocks[b];
        let seg = blk.seg as usize;
        let unit = self.ledger.segs[seg].unit;
        let upages = unit / self.page;
        let end = blk.start + blk.len;
        let mut at = blk.start + from / unit * unit;
        let mut installed = 0;
        // Unit by unit from here: a run was refused whole.
        let mut single = false;
        // Which units read zero, found once for the call (not unit by
        // unit: each look at a page past a truncated file's end is a
        // SIGBUS).
        let first = at;
        let zeros = if self.zero_block(b) {
            vec![true; (end - first).div_ceil(unit)]
        } else {
            self.source
                .zero_units(self.ledger.src_offset(seg, first), end - first, unit)
        };
        let zero_at = |x: usize| zeros.get((x - first) / unit).copied().unwrap_or(false);
        let mut noted = false;
        while at < end {
            let i = self.ledger.page_index(seg, at);
            if self.ledger.any_gap(i, upages) {
                at += unit;
                continue;
            }
            // A run is all zeros (hole in the source) or all data.
            let zero = zero_at(at);
            let mut run_end = at + unit;
            if self.ledger.remaps.is_empty() && !single {
                while run_end < end {
                    let j = self.ledger.page_index(seg, run_end);
                    if self.ledger.any_gap(j, upages) || zero_at(run_end) != zero {
                        break;
                    }
                    run_end += unit;
                }
            }
            let dst = self.ledger.remaps.now(at);
            let src = self.src(seg, at);
            let r = if zero {
                self.install_zero_run(dst, run_end - at, unit)
            } else {
                self.uffd.copy(dst, src, run_end - at)
            };
            let Err(p) = r else {
                installed += (run_end - at) / self.page;
                at = run_end;
                continue;
            };
            let done = p.done / unit * unit;
            installed += done / self.page;
            at += done;
            match errno(&p.error) {
                libc::EEXIST => {
                    let _ = self.uffd.wake(self.ledger.remaps.now(at), unit);
                    at += unit;
                }
                // Only a source can be unreadable; the zero page cannot.
                libc::EFAULT if !zero => {
                    installed += self.bad_unit(seg, at, unit);
                    at += unit;
                }
                // Transient: events were waiting (now read) or the kernel
                // was short of memory. Never given up on, as a fault would
                // not: giving up made the page read zeros instead of its
                // snapshot bytes.
                libc::EAGAIN | libc::ENOMEM => {
                    if errno(&p.error) == libc::ENOMEM {
                        std::thread::sleep(crate::params::UFFD_ENOMEM_WAIT);
                    }
                    self.drain();
                }
                // A run over two mappings (mprotect, mlock or madvise split
                // the folio's range) is refused whole: the kernel fills
                // within one. Only a unit refused alone is not ours.
                libc::ENOENT | libc::EINVAL if run_end - at > unit => single = true,
                libc::ENOENT | libc::EINVAL => {
                    // Nothing of ours is mapped there any more (its
                    // neighbours may still be).
                    if !std::mem::replace(&mut noted, true) {
                        self.tally.notes.push(format!(
                            "{:#x}: the mapping went away during the fill ({})",
                            self.ledger.remaps.now(at),
                            p.error
                        ));
                    }
                    self.discard(at, at + unit, false);
                    at += unit;
                }
                libc::ESRCH => {
                    // The process has no address space any more.
                    self.tally.notes.push(format!(
                        "{:#x}..{end:#x}: the address space went away during the fill ({})",
                        self.ledger.remaps.now(at),
                        p.error
                    ));
                    self.discard(at, end, false);
                    at = end;
                }
                _ => {
                    self.tally.notes.push(format!(
                        "{:#x}: could not be filled ({}); it reads zeros",
                        self.ledger.remaps.now(at),
                        p.error
                    ));
                    self.discard(at, at + unit, false);
                    at += unit;
                }
            }
        }
        installed
    }

    /// The kernel could not read the source for the unit at `at`: find out
    /// why, then poison it (or fill zeros where poison is unavailable).
    /// Returns the base pages installed (a retry that worked).
    pub(super) fn bad_unit(&mut self, seg: usize, at: usize, unit: usize) -> usize {
        let src = self.src(seg, at);
        // SAFETY: `scratch` is ours and `unit` bytes long; the source is
        // mapped there and may fault, which the mc copy reports.
        let r = unsafe {
            crate::mc::copy_mc_raw(
                self.scratch.as_mut_ptr(),
                src as *const u8,
                unit,
                self.strategy,
            )
        };
        let kind = match r {
            Err(McError::Fault(f)) => f.kind,
            Ok(_) => {
                // Readable now (the file grew back, a transient error):
                // install what we read. An install that is interrupted
                // is retried, never taken for a bad page: an EAGAIN here
                // means a discard or a move is being reported, and
                // poisoning the page would turn the guest's zeros into
                // SIGBUS.
                let scratch = self.scratch.as_ptr() as usize;
                if self.install(at, unit, true, |uffd, dst| uffd.copy(dst, scratch, unit)) {
                    return unit / self.page;
                }
                // There already (the guest's write), or nothing of ours
                // mapped there any more: not a bad page either way.
                return 0;
            }
            Err(_) => FaultKind::Other(libc::EFAULT),
        };
        let i = self.ledger.page_index(seg, at);
        self.ledger.set_bad(i, unit / self.page);
        self.shared
            .bad
            .fetch_add((unit / self.page) as u64, Ordering::Relaxed);
        match self.tally.bad.last_mut() {
            Some(l) if l.kind == kind && l.addr + l.len == at => l.len += unit,
            _ => self.tally.bad.push(LazyBad {
                addr: at,
                len: unit,
                kind,
            }),
        }
        // The marker (or, without UFFDIO_POISON, zeros the report names)
        // goes in unless the unit is discarded meanwhile: the guest then
        // expects plain zeros, which a later touch gets.
        if self.poison {
            self.install(at, unit, true, |uffd, dst| uffd.poison(dst, unit));
        } else {
            let zero = self.zero.base;
            self.install(at, unit, true, |uffd, dst| uffd.copy(dst, zero, unit));
        }
        0
    }
}

/// Installs zeros over `[dst, dst + len)`, whole units of `unit` bytes,
/// with `uffd`: `UFFDIO_ZEROPAGE` for base pages, else `UFFDIO_COPY` of
/// each unit from `zero` (base, length: a read-only mapping never written,
/// at least a unit long). Returns the bytes installed, or how far it got.
pub(super) fn zero_run(
    uffd: &crate::sys::uffd::Uffd,
    zero: (usize, usize),
    dst: usize,
    len: usize,
    unit: usize,
) -> Result<usize, crate::sys::uffd::Partial> {
    if unit == crate::batch::page_size() {
        return uffd.zeropage(dst, len);
    }
    debug_assert!(unit <= zero.1);
    let mut done = 0;
    while done < len {
        if let Err(mut p) = uffd.copy(dst + done, zero.0, unit) {
            p.done += done;
            return Err(p);
        }
        done += unit;
    }
    Ok(len)
}

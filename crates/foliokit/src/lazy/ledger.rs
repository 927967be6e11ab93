//! What the fill knows of each segment, block and page: a plain type.
//!
//! Segments are carved into blocks (folio-aligned windows: what one fill
//! installs); each block is pending or done (filled, or nothing left in it
//! to fill); each base page may be discarded (never to be filled: a
//! discard, an unmap, a skip) or bad (its source unreadable). Addresses
//! here are where the pages were when the fill began ("original"); the
//! guest's mremaps are recorded ([`Remaps`]) and translated both ways. The
//! events the fill reads are edits to it: REMOVE and UNMAP discard, REMAP
//! moves; a FORK asks it what the child is owed.

use super::remap::Remaps;
use crate::uffd::child::Owed;

/// One segment as the fill sees it.
#[derive(Debug)]
pub(super) struct Seg {
    pub addr: usize,
    pub len: usize,
    pub offset: u64,
    /// Install unit: the base page, or the huge page size on hugetlb.
    pub unit: usize,
    /// Private anonymous memory `UFFDIO_MOVE` can fill folio by folio.
    pub movable: bool,
    /// Global index of its first base page.
    pub first_page: usize,
}

/// A folio-aligned window of one segment: what one fill installs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Block {
    pub start: usize,
    pub len: usize,
    pub seg: u32,
}

/// A bit per base page.
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 != 0
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn any(&self, i: usize, n: usize) -> bool {
        (i..i + n).any(|j| self.get(j))
    }
    fn all(&self, i: usize, n: usize) -> bool {
        (i..i + n).all(|j| self.get(j))
    }
}

/// The segments, their blocks and pages, and where the guest moved them.
pub(super) struct Ledger {
    pub segs: Vec<Seg>,
    pub blocks: Vec<Block>,
    /// Per block: done (filled, or nothing left to fill).
    done: Vec<bool>,
    pending: usize,
    /// Per base page: discarded, unmapped or skipped: never filled.
    removed: Bits,
    /// Per base page: the source could not be read.
    bad: Bits,
    pub remaps: Remaps,
    page: usize,
}

impl Ledger {
    /// Segments sorted by address and their blocks in address order, in
    /// `page`-sized base pages; every block pending.
    pub(super) fn new(segs: Vec<Seg>, blocks: Vec<Block>, page: usize) -> Ledger {
        let pages = segs.iter().map(|s| s.len / page).sum();
        Ledger {
            done: vec![false; blocks.len()],
            pending: blocks.len(),
            removed: Bits::new(pages),
            bad: Bits::new(pages),
            remaps: Remaps::default(),
            segs,
            blocks,
            page,
        }
    }

    /// Cuts segment `seg`, `[addr, addr + len)`, into blocks of `block`
    /// bytes aligned to `block` (the first and last may be shorter).
    pub(super) fn carve(addr: usize, len: usize, block: usize, seg: u32, out: &mut Vec<Block>) {
        let mut at = addr;
        while at < addr + len {
            let end = ((at / block + 1) * block).min(addr + len);
            out.push(Block {
                start: at,
                len: end - at,
                seg,
            });
            at = end;
        }
    }

    /// The segment holding original address `addr`.
    pub(super) fn seg_of(&self, addr: usize) -> Option<usize> {
        let i = self.segs.partition_point(|s| s.addr <= addr);
        let s = self.segs.get(i.checked_sub(1)?)?;
        (addr < s.addr + s.len).then_some(i - 1)
    }

    /// The block holding original address `addr`.
    pub(super) fn block_of(&self, addr: usize) -> Option<usize> {
        self.seg_of(addr)?;
        let i = self.blocks.partition_point(|b| b.start <= addr);
        Some(i - 1)
    }

    /// Global base-page index of an original address inside a segment.
    pub(super) fn page_index(&self, seg: usize, addr: usize) -> usize {
        let s = &self.segs[seg];
        s.first_page + (addr - s.addr) / self.page
    }

    /// The offset into the source of original address `addr`'s bytes.
    pub(super) fn src_offset(&self, seg: usize, addr: usize) -> usize {
        let s = &self.segs[seg];
        s.offset as usize + (addr - s.addr)
    }

    /// Base pages in all segments.
    pub(super) fn pages(&self) -> usize {
        self.segs.iter().map(|s| s.len / self.page).sum()
    }

    pub(super) fn done(&self, b: usize) -> bool {
        self.done[b]
    }

    /// Blocks still pending.
    pub(super) fn pending(&self) -> usize {
        self.pending
    }

    pub(super) fn mark_done(&mut self, b: usize) {
        if !self.done[b] {
            self.done[b] = true;
            self.pending -= 1;
        }
    }

    pub(super) fn removed(&self, i: usize) -> bool {
        self.removed.get(i)
    }

    /// Whether any of the `n` pages from index `i` is discarded.
    pub(super) fn any_removed(&self, i: usize, n: usize) -> bool {
        self.removed.any(i, n)
    }

    pub(super) fn bad(&self, i: usize) -> bool {
        self.bad.get(i)
    }

    /// Whether any of the `n` pages from index `i` is discarded or bad.
    pub(super) fn any_gap(&self, i: usize, n: usize) -> bool {
        self.removed.any(i, n) || self.bad.any(i, n)
    }

    /// The `n` pages from index `i` have unreadable sources.
    pub(super) fn set_bad(&mut self, i: usize, n: usize) {
        (i..i + n).for_each(|j| self.bad.set(j));
    }

    /// Marks `[start, end)` never to be filled: original addresses, or
    /// with `now_addresses` where its pages are now (an event's). Any
    /// range: only its part inside the segments is walked. Returns how
    /// many pages were newly discarded while their block was pending (the
    /// fill counts them skipped).
    pub(super) fn discard(&mut self, start: usize, end: usize, now_addresses: bool) -> u64 {
        let page = self.page;
        let mut skipped = 0;
        if now_addresses && !self.remaps.is_empty() {
            // Moved pages: each current address maps back on its own.
            let mut a = start / page * page;
            while a < end {
                if let Some(orig) = self.remaps.original(a) {
                    skipped += self.discard_page(orig);
                }
                let Some(next) = a.checked_add(page) else {
                    break;
                };
                a = next;
            }
            return skipped;
        }
        let spans: Vec<(usize, usize)> = self
            .segs
            .iter()
            .map(|s| (start.max(s.addr) / page * page, end.min(s.addr + s.len)))
            .filter(|(lo, hi)| lo < hi)
            .collect();
        for (lo, hi) in spans {
            for a in (lo..hi).step_by(page) {
                skipped += self.discard_page(a);
            }
        }
        skipped
    }

    /// [`Ledger::discard`] of the page at original address `orig`.
    fn discard_page(&mut self, orig: usize) -> u64 {
        let page = self.page;
        let Some(seg) = self.seg_of(orig) else {
            return 0;
        };
        let i = self.page_index(seg, orig);
        let b = self.block_of(orig).expect("inside a segment");
        let mut skipped = 0;
        if !self.removed.get(i) {
            self.removed.set(i);
            if !self.done[b] {
                skipped = 1;
            }
        }
        let blk = self.blocks[b];
        let first = self.page_index(seg, blk.start);
        if !self.done[b] && self.removed.all(first, blk.len / page) {
            self.mark_done(b);
        }
        skipped
    }

    /// Whether block `b` can be installed whole: nothing in it discarded
    /// or bad, and in one piece where it lives now.
    pub(super) fn whole(&self, b: usize) -> bool {
        let blk = self.blocks[b];
        let i = self.page_index(blk.seg as usize, blk.start);
        let now = self.remaps.now(blk.start);
        !self.any_gap(i, blk.len / self.page)
            && self.remaps.now(blk.start + blk.len - 1) == now + blk.len - 1
    }

    /// What a child forked now is owed: every page of a pending block not
    /// discarded, where it lives now, its bytes at `src_base` plus its
    /// source offset; none in segments `wipe` says are wipe-on-fork (the
    /// child must see zeros there). Also returns the largest install
    /// unit among them.
    pub(super) fn owed_to_child(&self, wipe: &[bool], src_base: usize) -> (Owed, usize) {
        let page = self.page;
        let mut owed = Owed::default();
        let mut unit = page;
        for (b, blk) in self.blocks.iter().enumerate() {
            let seg = blk.seg as usize;
            if self.done[b] || wipe[seg] {
                continue;
            }
            unit = unit.max(self.segs[seg].unit);
            for a in (blk.start..blk.start + blk.len).step_by(page) {
                let i = self.page_index(seg, a);
                if !self.removed.get(i) {
                    let src = src_base + self.src_offset(seg, a);
                    owed.push(self.remaps.now(a), src, page, self.bad.get(i));
                }
            }
        }
        (owed, unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;
    const FOLIO: usize = 4 * PAGE;

    /// Two segments: 6 pages at 0x10000 (source offset 0) and 4 pages at
    /// 0x40000 (source offset 0x100000), in 4-page blocks.
    fn ledger() -> Ledger {
        let mut blocks = Vec::new();
        Ledger::carve(0x10000, 6 * PAGE, FOLIO, 0, &mut blocks);
        Ledger::carve(0x40000, 4 * PAGE, FOLIO, 1, &mut blocks);
        let segs = vec![
            Seg {
                addr: 0x10000,
                len: 6 * PAGE,
                offset: 0,
                unit: PAGE,
                movable: false,
                first_page: 0,
            },
            Seg {
                addr: 0x40000,
                len: 4 * PAGE,
                offset: 0x100000,
                unit: PAGE,
                movable: false,
                first_page: 6,
            },
        ];
        Ledger::new(segs, blocks, PAGE)
    }

    #[test]
    fn segments_are_carved_into_aligned_blocks_and_found_by_address() {
        let l = ledger();
        let b: Vec<(usize, usize)> = l.blocks.iter().map(|b| (b.start, b.len)).collect();
        assert_eq!(b, [(0x10000, FOLIO), (0x14000, 2 * PAGE), (0x40000, FOLIO)]);
        assert_eq!(l.pending(), 3);
        assert_eq!(l.block_of(0x15fff), Some(1));
        assert_eq!(l.block_of(0x16000), None, "between segments");
        assert_eq!(l.block_of(0x41000), Some(2));
        assert_eq!(l.seg_of(0xf000), None);
        assert_eq!(l.page_index(1, 0x42000), 8);
        assert_eq!(l.src_offset(1, 0x42000), 0x102000);
    }

    #[test]
    fn discards_count_pending_pages_once_and_finish_emptied_blocks() {
        let mut l = ledger();
        assert_eq!(l.discard(0x14000, 0x16000, false), 2);
        assert!(l.done(1), "every page of block 1 is discarded");
        assert_eq!(l.pending(), 2);
        assert_eq!(l.discard(0x0, 0x15000, false), 4, "four new, one again");
        assert!(l.done(0));
        l.mark_done(2);
        assert_eq!(
            l.discard(0x40000, 0x41000, false),
            0,
            "a done block's pages are not skipped"
        );
        assert!(l.removed(6) && !l.removed(7));
        assert_eq!(l.pending(), 0);
    }

    #[test]
    fn discards_at_moved_addresses_map_back_and_whole_needs_one_piece() {
        let mut l = ledger();
        assert!(l.whole(0));
        // The guest moved the first two pages of block 0 away.
        l.remaps.push(0x10000, 0x80000, 2 * PAGE);
        assert!(!l.whole(0), "no longer in one piece");
        assert!(l.whole(2));
        assert_eq!(l.discard(0x81000, 0x82000, true), 1);
        assert!(l.removed(1) && !l.removed(0));
        l.set_bad(8, 1);
        assert!(!l.whole(2) && l.any_gap(8, 1) && !l.any_removed(8, 1));
    }

    #[test]
    fn a_child_is_owed_the_pending_pages_where_they_are_now() {
        let mut l = ledger();
        l.mark_done(1);
        l.discard(0x11000, 0x12000, false);
        l.set_bad(9, 1);
        l.remaps.push(0x40000, 0x90000, 4 * PAGE);
        let (owed, unit) = l.owed_to_child(&[false, false], 0x7000_0000);
        assert_eq!(unit, PAGE);
        let mut want = Owed::default();
        want.push(0x10000, 0x7000_0000, PAGE, false);
        want.push(0x12000, 0x7000_2000, 2 * PAGE, false);
        want.push(0x90000, 0x7010_0000, 3 * PAGE, false);
        want.push(0x93000, 0x7010_3000, PAGE, true);
        assert_eq!(owed, want);
        let (owed, _) = l.owed_to_child(&[true, false], 0x7000_0000);
        let mut want = Owed::default();
        want.push(0x90000, 0x7010_0000, 3 * PAGE, false);
        want.push(0x93000, 0x7010_3000, PAGE, true);
        assert_eq!(owed, want, "nothing in a wipe-on-fork segment");
    }
}

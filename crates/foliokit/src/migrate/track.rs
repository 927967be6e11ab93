//! Bookkeeping of one relocation batch: where each page is, and what the
//! application's concurrent zaps, unmaps and remaps (userfaultfd events)
//! mean for it. Pure logic, so every rule is unit-tested.

use crate::sys::pagemap::PageState;

/// The one folio size `UFFDIO_MOVE` moves whole (a PMD).
const PMD: usize = super::folios::PMD;

/// Where one page of a batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Nothing there; relocation never touches it.
    Empty,
    /// Populated, still in the application's mapping, not yet taken.
    Untouched,
    /// Taken out into the staging area; the application's entry is empty
    /// and any thread touching it waits.
    Out,
    /// Its copy on the target node is installed.
    In,
    /// Zapped or unmapped by the application while the batch was in
    /// flight: never installed, left as the application made it.
    Dropped,
    /// Left where it was (pinned, shared, swapped, mapping changed); the
    /// kernel path gets it.
    Left,
    /// Moved out of the range by the application's mremap before we took
    /// it: no longer ours to migrate.
    Gone,
}

/// Where each page of one relocation batch stands: the ledger relocation
/// keeps while the batch is in flight (a copy batch on the channels is
/// another thing: [`crate::channels::InFlight`]).
#[derive(Debug)]
pub struct PageLedger {
    /// Address of page 0 when the batch began.
    pub base: usize,
    page: usize,
    pub state: Vec<State>,
    /// Current address of each page (mremap moves them).
    pub addr: Vec<usize>,
    /// The page's content is in the staging area (T) at the same offset.
    pub in_stage: Vec<bool>,
    /// Ranges registered with our userfaultfd, `[start, end)`.
    pub registered: Vec<(usize, usize)>,
    /// Page `i` starts a PMD-sized folio that moves as one unit (out,
    /// back) and is left as one: never split into base pages.
    pub whole: Vec<bool>,
}

fn within(a: usize, start: usize, end: usize) -> bool {
    a >= start && a < end
}

impl PageLedger {
    pub fn new(base: usize, page: usize, pages: &[PageState]) -> PageLedger {
        PageLedger {
            base,
            page,
            state: pages
                .iter()
                .map(|s| match s {
                    PageState::Present => State::Untouched,
                    // UFFDIO_MOVE refuses shared pages, and the zero page
                    // is no memory to relocate: the kernel path decides.
                    PageState::Swapped | PageState::Shared => State::Left,
                    PageState::Empty => State::Empty,
                })
                .collect(),
            addr: (0..pages.len()).map(|i| base + i * page).collect(),
            in_stage: vec![false; pages.len()],
            whole: vec![false; pages.len()],
            registered: vec![(base, base + pages.len() * page)],
        }
    }

    pub fn len(&self) -> usize {
        self.state.len()
    }

    /// `[start, end)` is being zapped (REMOVE) or was unmapped (UNMAP).
    pub fn zap(&mut self, start: usize, end: usize, unmapped: bool) {
        for i in 0..self.len() {
            if within(self.addr[i], start, end)
                && matches!(self.state[i], State::Untouched | State::Out)
            {
                self.state[i] = State::Dropped;
            }
        }
        if unmapped {
            self.registered = subtract(&self.registered, start, end);
        }
    }

    /// `[from, from + len)` was moved to `to`.
    pub fn remap(&mut self, from: usize, to: usize, len: usize) {
        let end = from + len;
        for i in 0..self.len() {
            if within(self.addr[i], from, end) {
                self.addr[i] = self.addr[i] - from + to;
                if self.state[i] == State::Untouched {
                    self.state[i] = State::Gone;
                }
            }
        }
        // The moved part stays registered at its new place; the old place
        // stays registered too if it was kept (MREMAP_DONTUNMAP).
        let moved: Vec<(usize, usize)> = self
            .registered
            .iter()
            .filter_map(|&(s, e)| {
                let (s, e) = (s.max(from), e.min(end));
                (s < e).then(|| (s - from + to, e - from + to))
            })
            .collect();
        self.registered.extend(moved);
    }

    /// Runs of consecutive pages in state `s` whose current addresses are
    /// contiguous too: `(first index, pages)`.
    pub fn runs(&self, s: State) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for i in 0..self.len() {
            if self.state[i] != s {
                continue;
            }
            match out.last_mut() {
                Some((first, n))
                    if *first + *n == i && self.addr[i - 1] + self.page == self.addr[i] =>
                {
                    *n += 1
                }
                _ => out.push((i, 1)),
            }
        }
        out
    }

    /// Pages in a PMD unit.
    pub fn unit_pages(&self) -> usize {
        PMD / self.page
    }

    /// The unit page `i` moves in: `(first index, pages)`: its whole PMD
    /// folio, or the page alone.
    pub fn unit_of(&self, i: usize) -> (usize, usize) {
        let (k, off) = (self.unit_pages(), (self.addr[i] % PMD) / self.page);
        let Some(first) = i.checked_sub(off) else {
            return (i, 1);
        };
        if self.whole[first]
            && first + k <= self.len()
            && self.addr[first] + off * self.page == self.addr[i]
        {
            (first, k)
        } else {
            (i, 1)
        }
    }

    /// Keeps every PMD unit whole: where a page of one is no longer
    /// `Untouched` (left for a reason of its own), the rest of it is left
    /// too, and it stops being a unit. Returns the pages this left.
    pub fn keep_units_whole(&mut self) -> usize {
        let k = self.unit_pages();
        let mut left = 0;
        for i in 0..self.len() {
            if !self.whole[i] {
                continue;
            }
            let end = (i + k).min(self.len());
            if self.state[i..end].iter().all(|&s| s == State::Untouched) && end == i + k {
                continue;
            }
            self.whole[i] = false;
            for s in &mut self.state[i..end] {
                if *s == State::Untouched {
                    *s = State::Left;
                    left += 1;
                }
            }
        }
        left
    }

    /// Pages `first .. first + slots.len()` the kernel moved out although
    /// the call that moved them did not count them: an `Untouched` page
    /// whose staging slot (`slots`, read from pagemap) holds a page is
    /// out. Linux 6.18's `UFFDIO_MOVE` can move a run of PTEs after an
    /// internal retry and then stop at the slot it just filled (EEXIST)
    /// without counting the run; trusting the count would leave those
    /// pages parked and their entries empty. Returns how many it found.
    pub fn taken_uncounted(&mut self, first: usize, slots: &[PageState]) -> usize {
        let mut found = 0;
        for (j, slot) in (first..self.len()).zip(slots) {
            if self.state[j] == State::Untouched && *slot != PageState::Empty {
                self.state[j] = State::Out;
                self.in_stage[j] = true;
                found += 1;
            }
        }
        found
    }

    pub fn count(&self, s: State) -> usize {
        self.state.iter().filter(|&&x| x == s).count()
    }
}

/// `set` minus `[start, end)`.
fn subtract(set: &[(usize, usize)], start: usize, end: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &(s, e) in set {
        if e <= start || s >= end {
            out.push((s, e));
            continue;
        }
        if s < start {
            out.push((s, start));
        }
        if e > end {
            out.push((end, e));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use PageState::{Empty as E, Present as P, Shared as Z, Swapped as S};

    const PG: usize = 0x1000;
    const B: usize = 0x10_0000;

    fn batch() -> PageLedger {
        PageLedger::new(B, PG, &[P, P, E, P, S, P, P, P, Z])
    }

    #[test]
    fn initial_states_follow_pagemap() {
        let b = batch();
        assert_eq!(b.count(State::Untouched), 6);
        assert_eq!(b.state[2], State::Empty);
        assert_eq!(b.state[4], State::Left);
        assert_eq!(
            b.state[8],
            State::Left,
            "zero page or shared: not ours to move"
        );
        assert_eq!(b.runs(State::Untouched), vec![(0, 2), (3, 1), (5, 3)]);
        assert_eq!(b.registered, vec![(B, B + 9 * PG)]);
    }

    #[test]
    fn a_zap_drops_pages_not_yet_installed_and_nothing_else() {
        let mut b = batch();
        b.state[0] = State::Out;
        b.state[1] = State::In;
        b.zap(B, B + 4 * PG, false);
        assert_eq!(b.state[0], State::Dropped, "out: never installed");
        assert_eq!(b.state[1], State::In, "installed: the zap zaps our copy");
        assert_eq!(b.state[2], State::Empty);
        assert_eq!(b.state[3], State::Dropped, "untouched: never taken");
        assert_eq!(b.state[5], State::Untouched, "outside the zap");
        assert_eq!(b.registered.len(), 1, "a zap keeps the mapping");
    }

    #[test]
    fn an_unmap_also_unregisters_that_part() {
        let mut b = batch();
        b.zap(B + 2 * PG, B + 3 * PG, true);
        assert_eq!(
            b.registered,
            vec![(B, B + 2 * PG), (B + 3 * PG, B + 9 * PG)]
        );
    }

    #[test]
    fn a_remap_moves_taken_pages_and_gives_up_untouched_ones() {
        let mut b = batch();
        b.state[5] = State::Out;
        let to = 0x90_0000;
        b.remap(B + 5 * PG, to, 2 * PG);
        assert_eq!(b.addr[5], to);
        assert_eq!(b.addr[6], to + PG);
        assert_eq!(b.state[5], State::Out, "installed at the new place");
        assert_eq!(b.state[6], State::Gone);
        assert_eq!(b.state[7], State::Untouched);
        assert!(b.registered.contains(&(to, to + 2 * PG)));
        // The run of Out pages breaks where addresses stop being contiguous.
        b.state[7] = State::Out;
        assert_eq!(b.runs(State::Out), vec![(5, 1), (7, 1)]);
        // A later zap at the new address finds the moved page.
        b.zap(to, to + PG, true);
        assert_eq!(b.state[5], State::Dropped);
    }

    #[test]
    fn a_pmd_unit_moves_and_stays_whole() {
        let k = PMD / PG;
        // A batch of two PMD blocks plus one page, starting PMD-aligned.
        let base = 0x4000_0000;
        let mut b = PageLedger::new(base, PG, &vec![P; 2 * k + 1]);
        b.whole[0] = true;
        b.whole[k] = true;
        assert_eq!(b.unit_of(0), (0, k));
        assert_eq!(b.unit_of(k - 1), (0, k), "a tail belongs to its head");
        assert_eq!(b.unit_of(k + 3), (k, k));
        assert_eq!(b.unit_of(2 * k), (2 * k, 1), "a base page alone");
        // One page of the second unit left for its own reason: the whole
        // unit stays, never split.
        b.state[k + 7] = State::Left;
        assert_eq!(b.keep_units_whole(), k - 1);
        assert!(b.state[k..2 * k].iter().all(|&s| s == State::Left));
        assert!(!b.whole[k]);
        assert_eq!(b.unit_of(k + 3), (k + 3, 1));
        assert_eq!(b.count(State::Untouched), k + 1, "the first unit is kept");
    }

    #[test]
    fn a_unit_cut_by_the_batch_is_no_unit() {
        let k = PMD / PG;
        let base = 0x4000_0000;
        let mut b = PageLedger::new(base, PG, &vec![P; k - 1]);
        b.whole[0] = true;
        assert_eq!(b.keep_units_whole(), k - 1);
        assert_eq!(b.unit_of(5), (5, 1));
    }

    #[test]
    fn pages_moved_but_not_counted_are_out() {
        let mut b = batch();
        b.state[0] = State::Out;
        b.in_stage[0] = true;
        // Slots 0, 1 and 3 hold pages: 0 was counted, 1 and 3 were not;
        // slot 4 holds nothing (its page is swapped, left), 5 is empty.
        let slots = [P, P, E, P, E, E];
        assert_eq!(b.taken_uncounted(0, &slots), 2);
        assert_eq!(b.state[1], State::Out);
        assert!(b.in_stage[1]);
        assert_eq!(b.state[3], State::Out);
        assert_eq!(b.state[4], State::Left, "never taken");
        assert_eq!(b.state[5], State::Untouched, "its slot is empty");
        assert_eq!(b.taken_uncounted(0, &slots), 0, "found once");
    }

    #[test]
    fn subtract_cuts_intervals() {
        let set = [(0, 10), (20, 30)];
        assert_eq!(subtract(&set, 5, 25), vec![(0, 5), (25, 30)]);
        assert_eq!(subtract(&set, 0, 40), vec![]);
        assert_eq!(subtract(&set, 10, 20), set.to_vec());
    }
}

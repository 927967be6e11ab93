//! Destination folios for a relocation batch, found before the batch
//! starts so that it does not allocate them on its own time (the kernel
//! zeroes each new folio, which costs about what copying into it does):
//!
//! - recycled: the previous batch's parking area holds the old folios it
//!   took out, which are garbage once their bytes are copied and the new
//!   folios installed. Those already on the target node (and of the size
//!   the new batch needs) are the next batch's destination: every byte of
//!   them is copied over before one is installed, and one that is not
//!   copied over (its page turned out empty, or stayed in place) is never
//!   installed, so nothing of what they held can show.
//! - prepared ahead: while a batch is out, a helper maps the next batch's
//!   destination area on the target node and faults in its folios there.
//!
//! Nothing here touches the application's memory or the userfaultfd: it
//! reads pagemap, which can be stale by the time the batch starts. That
//! costs only time, never correctness: the batch reads pagemap again and
//! allocates whatever is missing, and a destination page allocated for a
//! page that turned out empty or stays in place is freed with the area.

use std::time::{Duration, Instant};

use super::folios::PMD;
use super::stage::Stage;
use super::track::{PageLedger, State};
use super::vma::Vma;
use crate::sys::pagemap::{self, page_states, PageState};

/// A batch's destination area, with the pages allocated in it so far.
pub struct Prepared {
    /// The batch it was prepared for: `[start, start + len)`.
    pub start: usize,
    pub len: usize,
    pub dest: Stage<'static>,
    /// Per page of the batch: allocated already.
    filled: Vec<bool>,
    /// Recycled areas: per page, whether a PMD maps it (a PMD folio of the
    /// batch needs one there). `None`: allocated for this batch, with THP
    /// wherever a whole PMD was.
    pmd: Option<Vec<bool>>,
    /// How long preparing it took.
    pub took: Duration,
}

/// The runs `(first, pages)` of `want` pages (indices) not yet in `filled`.
fn missing(filled: &[bool], want: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &(i, k) in want {
        for j in (i..i + k).filter(|&j| !filled.get(j).copied().unwrap_or(false)) {
            match out.last_mut() {
                Some((f, m)) if *f + *m == j => *m += 1,
                _ => out.push((j, 1)),
            }
        }
    }
    out
}

impl Prepared {
    /// Prepares `[start, start + len)` of mapping `v` (a batch to come):
    /// maps its destination area bound to `node` and allocates a folio for
    /// every page populated now. `None` where any step fails: the batch
    /// then does it all itself, and reports the error.
    pub fn ahead(
        start: usize,
        len: usize,
        v: &Vma,
        node: u32,
        folio: usize,
        page: usize,
    ) -> Option<Prepared> {
        let t = Instant::now();
        let states = page_states(start, len / page, page).ok()?;
        let dest = Stage::dest(start, len, v, node, folio).ok()?;
        let mut filled = vec![false; states.len()];
        let mut i = 0;
        while i < states.len() {
            if states[i] == PageState::Empty {
                i += 1;
                continue;
            }
            let k = states[i..]
                .iter()
                .take_while(|&&s| s != PageState::Empty)
                .count();
            dest.populate(i, k, page).ok()?;
            filled[i..i + k].iter_mut().for_each(|f| *f = true);
            i += k;
        }
        Some(Prepared {
            start,
            len,
            dest,
            filled,
            pmd: None,
            took: t.elapsed(),
        })
    }

    /// Recycles `area`, the previous batch's parking area, as the
    /// destination of the batch `[start, start + len)` of mapping `v`:
    /// keeps its old folios that are on `node`, frees the rest. `None`
    /// where it does not fit the batch or cannot be bound to `node`.
    pub fn recycled(
        area: Stage<'static>,
        start: usize,
        len: usize,
        v: &Vma,
        (node, folio, page): (u32, usize, usize),
    ) -> Option<Prepared> {
        let t = Instant::now();
        if !area.fits(start, len) {
            return None;
        }
        area.bind(v, node, folio).ok()?;
        let n = len / page;
        let states = page_states(area.base, n, page).ok()?;
        let mut pmd = vec![false; n];
        for (s, e) in pagemap::pmd_mapped(area.base, len).ok().flatten()? {
            pmd[(s - area.base) / page..(e - area.base) / page]
                .iter_mut()
                .for_each(|p| *p = true);
        }
        // One address per folio to ask for its node: a PMD's first page,
        // or a base page.
        let units: Vec<(usize, usize)> = (0..n)
            .filter(|&i| states[i] == PageState::Present)
            .filter(|&i| !pmd[i] || i == 0 || !pmd[i - 1] || (area.base + i * page) % PMD == 0)
            .map(|i| {
                let k = if pmd[i] {
                    (PMD - (area.base + i * page) % PMD) / page
                } else {
                    1
                };
                (i, k.min(n - i))
            })
            .collect();
        let addrs: Vec<usize> = units.iter().map(|&(i, _)| area.base + i * page).collect();
        let mut at = vec![-1i32; addrs.len()];
        crate::sys::numa::page_nodes(&addrs, &mut at).ok()?;
        let mut filled = vec![false; n];
        for (&(i, k), &got) in units.iter().zip(&at) {
            if got == node as i32 {
                filled[i..i + k].iter_mut().for_each(|f| *f = true);
            } else {
                area.zap(i, k, page).ok()?;
                pmd[i..i + k].iter_mut().for_each(|p| *p = false);
            }
        }
        Some(Prepared {
            start,
            len,
            dest: area,
            filled,
            pmd: Some(pmd),
            took: t.elapsed(),
        })
    }

    /// How many pages are allocated already.
    pub fn filled(&self) -> usize {
        self.filled.iter().filter(|&&f| f).count()
    }

    /// Whether this was prepared for the batch `[start, start + len)`.
    pub fn fits(&self, start: usize, len: usize) -> bool {
        self.start == start && self.len == len
    }

    /// Allocates the pages of runs `want` (first index, pages) not
    /// allocated yet; `heads` are the batch's PMD folios (first page, at
    /// a PMD boundary), which need a PMD folio here too: a recycled area
    /// holding base pages there has them freed first.
    pub fn fill(
        &mut self,
        want: &[(usize, usize)],
        heads: impl Iterator<Item = usize>,
        page: usize,
    ) -> std::io::Result<()> {
        if let Some(pmd) = &mut self.pmd {
            let k = PMD / page;
            let heads: Vec<usize> = heads.filter(|&h| h + k <= pmd.len() && !pmd[h]).collect();
            for h in heads {
                if self.filled[h..h + k].contains(&true) {
                    self.dest.zap(h, k, page)?;
                    self.filled[h..h + k].iter_mut().for_each(|f| *f = false);
                }
                pmd[h..h + k].iter_mut().for_each(|p| *p = true);
            }
        }
        for (i, k) in missing(&self.filled, want) {
            self.dest.populate(i, k, page)?;
            self.filled[i..i + k].iter_mut().for_each(|f| *f = true);
        }
        Ok(())
    }

    /// A batch's destination area, prepared now: nothing allocated yet.
    pub fn now(start: usize, len: usize, dest: Stage<'static>, page: usize) -> Prepared {
        Prepared {
            start,
            len,
            dest,
            filled: vec![false; len / page],
            pmd: None,
            took: Duration::ZERO,
        }
    }
}

/// Whether every folio of `b` still to be taken is on `node` (then its
/// old folios, once parked, can be the next batch's destination).
pub fn on_node(b: &PageLedger, node: u32) -> bool {
    let heads: Vec<usize> = b
        .runs(State::Untouched)
        .into_iter()
        .flat_map(|(i, k)| {
            let mut j = i;
            std::iter::from_fn(move || {
                (j < i + k).then(|| {
                    let at = j;
                    j += b.unit_of(j).1.max(1);
                    at
                })
            })
        })
        .map(|i| b.addr[i])
        .collect();
    let mut at = vec![-1i32; heads.len()];
    crate::sys::numa::page_nodes(&heads, &mut at).is_ok() && at.iter().all(|&n| n == node as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prepared ahead: a folio on the node for every page populated then,
    /// none for the holes; what the batch later finds populated too is
    /// added, nothing twice.
    #[test]
    fn ahead_allocates_for_the_populated_pages_only() {
        let page = crate::batch::page_size();
        let n = 64;
        // SAFETY: a fresh private mapping of our own.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let a = p as usize;
        // SAFETY: advice on our own mapping: base pages.
        unsafe { libc::madvise(p, n * page, libc::MADV_NOHUGEPAGE) };
        for i in [0usize, 1, 2, 40] {
            // SAFETY: inside our mapping.
            unsafe { ((a + i * page) as *mut u8).write_volatile(1) };
        }
        let v = super::super::vma::overlapping(a, n * page)
            .unwrap()
            .remove(0);
        let node = crate::mem::system::numa_nodes()[0];
        let mut r = Prepared::ahead(a, n * page, &v, node, page, page).expect("prepared");
        assert!(r.fits(a, n * page) && !r.fits(a, page));
        assert_eq!(r.filled(), 4);
        let states = page_states(r.dest.base, n, page).unwrap();
        let present: Vec<usize> = (0..n).filter(|&i| states[i] != PageState::Empty).collect();
        assert_eq!(present, [0, 1, 2, 40]);
        r.fill(&[(0, 4), (40, 2)], std::iter::empty(), page)
            .unwrap();
        assert_eq!(r.filled(), 6);
        // SAFETY: our mapping, unused from here.
        unsafe { libc::munmap(p, n * page) };
    }

    #[test]
    fn only_what_is_missing_is_filled() {
        let filled = [true, true, false, false, true, false];
        assert_eq!(missing(&filled, &[(0, 6)]), [(2, 2), (5, 1)]);
        assert_eq!(missing(&filled, &[(0, 2)]), []);
        assert_eq!(missing(&filled, &[(1, 2), (4, 2)]), [(2, 1), (5, 1)]);
        // Past the end: missing (never prepared).
        assert_eq!(missing(&filled[..2], &[(1, 2)]), [(2, 1)]);
    }
}

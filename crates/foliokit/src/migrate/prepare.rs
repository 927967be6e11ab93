//! Destination folios for a relocation batch, prepared ahead: while one
//! batch is out, a helper maps the next batch's destination area on the
//! target node and faults in its folios there (the kernel zeroes each new
//! folio, which costs about what copying into it does), so the batch finds
//! them ready instead of allocating them on its own time.
//!
//! Nothing here touches the application's memory or the userfaultfd: it
//! reads pagemap, which can be stale by the time the batch starts. That
//! costs only time, never correctness: the batch reads pagemap again and
//! allocates whatever is missing, and a destination page allocated for a
//! page that turned out empty or stays in place is freed with the area.

use std::time::{Duration, Instant};

use super::stage::Stage;
use super::vma::Vma;
use crate::sys::pagemap::{page_states, PageState};

/// A batch's destination area, with the pages allocated in it so far.
pub struct Prepared {
    /// The batch it was prepared for: `[start, start + len)`.
    pub start: usize,
    pub len: usize,
    pub dest: Stage<'static>,
    /// Per page of the batch: allocated already.
    filled: Vec<bool>,
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
            took: t.elapsed(),
        })
    }

    /// Whether this was prepared for the batch `[start, start + len)`.
    pub fn fits(&self, start: usize, len: usize) -> bool {
        self.start == start && self.len == len
    }

    /// Allocates the pages of runs `want` (first index, pages) not
    /// allocated yet.
    pub fn fill(&mut self, want: &[(usize, usize)], page: usize) -> std::io::Result<()> {
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
            took: Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::missing;

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

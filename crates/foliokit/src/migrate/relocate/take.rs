//! Taking a batch's pages out: which pages must stay whole and in place
//! (step 1) and moving the rest into the parking area (step 5).

use super::events::drain;
use super::{Outcome, Run};
use crate::migrate::folios::{self, Fol};
use crate::migrate::stage::{self as staging, Stage};
use crate::migrate::track::{PageLedger, State};
use crate::migrate::vma::Vma;
use crate::migrate::Refusal;
use crate::sys::errno;
use crate::sys::pagemap::page_states;

/// Step 5: moves the batch's populated pages into the parking area. An
/// error means nothing could be taken because the kernel finds the
/// mapping incompatible.
pub(super) fn take_out(
    run: &Run,
    b: &mut PageLedger,
    parking: &Stage,
    out: &mut Outcome,
) -> Result<(), Refusal> {
    let page = run.page;
    // A run can span a mapping split made meanwhile (mprotect and back):
    // after an EINVAL, pages go one at a time, so each is judged alone.
    let mut single = false;
    loop {
        let mut runs = b.runs(State::Untouched);
        if single {
            // One unit at a time: a page alone, or a whole PMD folio.
            runs = runs
                .into_iter()
                .flat_map(|(i, k)| {
                    let mut units = Vec::new();
                    let mut j = i;
                    while j < i + k {
                        let (f, m) = b.unit_of(j);
                        let m = if f == j && j + m <= i + k { m } else { 1 };
                        units.push((j, m));
                        j += m;
                    }
                    units
                })
                .collect();
        }
        if runs.is_empty() {
            return Ok(());
        }
        for (i, k) in runs {
            let res = run
                .uffd
                .move_pages(parking.base + i * page, b.addr[i], k * page);
            let done = match &res {
                Ok(_) => k,
                Err(p) => p.done / page,
            };
            for j in i..i + done {
                b.state[j] = State::Out;
                b.in_stage[j] = true;
            }
            let Err(p) = res else { continue };
            // The count may fall short of what moved (see
            // `PageLedger::taken_uncounted`): the staging slots say.
            if let Ok(slots) = page_states(parking.base + (i + done) * page, k - done, page) {
                if b.taken_uncounted(i + done, &slots) > 0 {
                    break; // runs changed: recompute
                }
            }
            let at = i + done;
            match errno(&p.error) {
                libc::EAGAIN => {
                    drain(run, b, parking, out);
                    break; // runs changed: recompute
                }
                libc::EINVAL if !single => {
                    single = true;
                    break;
                }
                // Pinned or shared: the whole folio stays (moving on at
                // the next page would split a THP).
                libc::EBUSY => {
                    let (f, m) = b.unit_of(at);
                    for s in &mut b.state[f..f + m] {
                        if *s == State::Untouched {
                            *s = State::Left;
                            if m > 1 {
                                out.whole_left += 1;
                            }
                        }
                    }
                }
                libc::ENOENT => b.state[at] = State::Empty,
                libc::EINVAL if !b.in_stage.contains(&true) => {
                    return Err(Refusal::Incompatible(p.error))
                }
                libc::EINVAL => b.state[at] = State::Left, // its mapping changed
                _ => {
                    out.stop = Some(format!("moving pages out failed: {}", p.error));
                    for s in b.state.iter_mut().filter(|s| **s == State::Untouched) {
                        *s = State::Left;
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// Marks the pages of `b` relocation must leave whole and in place
/// (large folios `UFFDIO_MOVE` would split, see `folios.rs`) and the PMD
/// folios it moves as one unit. Returns how many pages it left. Refuses
/// where folio sizes cannot be read and mTHP is enabled for the mapping.
pub(super) fn keep_large(b: &mut PageLedger, v: &Vma, page: usize) -> Result<usize, Refusal> {
    let n = b.len();
    let start = b.base;
    let mut left = 0;
    match folios::judge(start, n, page) {
        Some(fol) => {
            for (i, f) in fol.into_iter().enumerate() {
                match f {
                    Fol::Leave if b.state[i] == State::Untouched => {
                        b.state[i] = State::Left;
                        left += 1;
                    }
                    Fol::PmdHead => b.whole[i] = true,
                    _ => {}
                }
            }
        }
        None => {
            if folios::mthp_possible(v) {
                return Err(Refusal::UnknownFolios);
            }
            if staging::thp_allowed(v) {
                // Folio sizes unknown: a PMD block cut by the batch's
                // edges may be a THP, which a move would split: leave
                // it. Whole aligned blocks may be THPs: move each as
                // one, and leave it whole if the kernel refuses it.
                let k = folios::PMD / page;
                for i in 0..n {
                    let block = (start + i * page) / folios::PMD * folios::PMD;
                    if block < start || block + folios::PMD > start + n * page {
                        if b.state[i] == State::Untouched {
                            b.state[i] = State::Left;
                            left += 1;
                        }
                    } else if (start + i * page) % folios::PMD == 0
                        && i + k <= n
                        && b.state[i..i + k].iter().all(|&s| s == State::Untouched)
                    {
                        b.whole[i] = true;
                    }
                }
            }
        }
    }
    Ok(left + b.keep_units_whole())
}

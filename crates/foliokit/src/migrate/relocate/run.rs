//! One relocation call: its preconditions, the userfaultfd it opens, the
//! range cut into batches (each driven by [`super::batch`]), and the kernel
//! path and the report for whatever the batches left.

use std::time::Instant;

use super::{batch, Outcome, Run, Start};
use crate::batch::page_size;
use crate::migrate::prepare::Prepared;
use crate::migrate::stage::{Probe, Stage};
use crate::migrate::threads;
use crate::migrate::vma;
use crate::migrate::{
    kernel, sys, BatchController, MigrateError, MigrateOptions, MigratePath, MigrateReport, Refusal,
};
use crate::sys::pagemap::{page_states, PageState};
use crate::sys::uffd::{self, Uffd};

const FEATURES: u64 = uffd::FEATURE_EVENT_FORK
    | uffd::FEATURE_EVENT_REMAP
    | uffd::FEATURE_EVENT_REMOVE
    | uffd::FEATURE_EVENT_UNMAP
    | uffd::FEATURE_MOVE;

/// Opens the userfaultfd relocation needs, or says why it cannot.
fn open_uffd(addr: usize, o: &MigrateOptions) -> Result<Uffd, MigrateError> {
    Uffd::open_for(FEATURES, 0, o.allow_user_mode_only)
        .map(|opened| opened.uffd)
        .map_err(|why| MigrateError::Refused {
            addr,
            why: why.into(),
        })
}

/// Relocates `[addr, addr + len)` (validated by the caller) to `node`.
///
/// The whole batch loop runs on a helper thread that blocks every
/// asynchronous signal, while the calling thread only waits: a signal
/// handler running on the caller may then touch a page that is out, and
/// waits (like any other thread) for the helper to put it back. Were the
/// caller the one taking pages out and putting them back, its handler
/// would wait for itself.
pub fn relocate(
    addr: usize,
    len: usize,
    node: u32,
    o: &MigrateOptions,
) -> Result<MigrateReport, MigrateError> {
    let o = *o;
    crate::helpers::on_helper(move || relocate_here(addr, len, node, &o)).unwrap_or(Err(
        MigrateError::Refused {
            addr,
            why: Refusal::NoHelper,
        },
    ))
}

/// [`relocate`]'s work, on the helper.
fn relocate_here(
    addr: usize,
    len: usize,
    node: u32,
    o: &MigrateOptions,
) -> Result<MigrateReport, MigrateError> {
    let page = page_size();
    // Every precondition is checked before anything is touched; the pool
    // first, so that the check sees its memory and its threads' stacks
    // (a new thread may get the cached stack of one that exited).
    let pool = crate::channels::shared(o.channels)?;
    let vmas = vma::relocatable(addr, len)?;
    let uffd = open_uffd(addr, o)?;
    let folio = o.folio_size.max(page);
    let copy = o.strategy.resolve(
        crate::tune::Shape::batch(folio, len.div_ceil(folio), crate::Reuse::Stream)
            .on_channels(o.channels),
    );
    let copy_fn = copy.function()?;
    let probe = Probe::new(&uffd, page).map_err(|e| MigrateError::Refused {
        addr,
        why: uffd::UffdRefusal::NoUffd(e).into(),
    })?;
    let run = Run {
        uffd: &uffd,
        probe: std::cell::RefCell::new(probe),
        node,
        page,
        folio,
        pool: &pool,
        copy: copy_fn,
        registered: std::cell::Cell::new(0),
        layout: threads::Layout::of_this_process(),
    };
    let mut r = MigrateReport::new(MigratePath::Relocate, len);
    r.strategy = Some(copy);
    let mut ctl = o
        .latency_budget
        .map(|b| BatchController::new(b, o.batch_pages, folio / page, len / page));
    let mut leftovers: Vec<usize> = Vec::new();
    let mut stopped: Option<String> = None;
    let mut touched = false;
    let mut ready: Option<Prepared> = None;
    let mut spare: Option<Stage<'static>> = None;
    let t0 = Instant::now();
    for v in &vmas {
        let end = v.end.min(addr + len);
        let mut at = v.start.max(addr);
        while at < end {
            let want = ctl
                .as_ref()
                .map_or(o.batch_pages, BatchController::pages)
                .saturating_mul(page);
            let stop = batch_end(at, end, want, page, folio);
            if stopped.is_some() {
                leftovers.extend(populated(at, stop - at, page)?);
                at = stop;
                continue;
            }
            // The next batch as it would be cut now (a latency budget may
            // cut it otherwise: then what was prepared is not used).
            let next = vmas.iter().find_map(|w| {
                let end = w.end.min(addr + len);
                let at = w.start.max(addr).max(stop);
                (at < end).then(|| (at, batch_end(at, end, want, page, folio) - at, w))
            });
            let out = match batch(&run, at, stop - at, v, ready.take(), spare.take(), next) {
                Ok(out) => out,
                Err(Start::Refused(why)) if !touched => {
                    return Err(MigrateError::Refused { addr: at, why })
                }
                Err(Start::Refused(why)) => Outcome {
                    stop: Some(why.to_string()),
                    left: populated(at, stop - at, page)?,
                    ..Outcome::default()
                },
                Err(Start::Stop(why)) => Outcome {
                    stop: Some(why),
                    left: populated(at, stop - at, page)?,
                    ..Outcome::default()
                },
            };
            // Only a batch that went through take-out can have touched
            // the memory: one whose pages were all left (large folios a
            // move would split, holes) did not, and a refusal after it
            // still finds everything as it was.
            touched |= out.stat.is_some();
            if let (Some(c), Some(s)) = (ctl.as_mut(), out.stat.as_ref()) {
                c.observe(std::time::Duration::from_secs_f64(s.first_folio_us / 1e6));
            }
            r.batches.extend(out.stat);
            ready = out.ahead;
            spare = out.spare;
            r.pool_secs += out.pool_secs;
            r.pages_to_move += out.populated;
            r.relocated_pages += out.relocated;
            r.dropped_pages += out.dropped;
            r.left_in_place += out.left.len();
            r.left_whole_folio_pages += out.whole_left;
            r.left_thread_pages += out.thread_left;
            leftovers.extend(out.left);
            r.notes.extend(out.notes);
            if let Some(why) = out.stop {
                r.notes.push(format!(
                    "relocation stopped at {at:#x} ({why}); the rest went to move_pages"
                ));
                stopped = Some(why);
            }
            at = stop;
        }
        // A parking area matches its own mapping's protections and lock
        // state: the next mapping's batches get areas of their own.
        spare = None;
    }
    r.registered_batches = run.registered.get();
    // Every batch ended quiet (see `quiesce`), so no event is left unread
    // and closing the descriptor cannot strand a forking thread; closing is
    // also the backstop that unregisters anything a failed unregistration
    // left behind and wakes every waiter.
    drop(run);
    drop(uffd);
    if r.left_whole_folio_pages > 0 {
        r.notes.push(format!(
            "{} pages of large folios UFFDIO_MOVE would split (mTHP, PTE-mapped, cut by the range or pinned) were left whole: kernel path for them",
            r.left_whole_folio_pages
        ));
    }
    if r.left_thread_pages > 0 {
        r.notes.push(format!(
            "{} pages holding live threads' descriptors or rseq areas were left in place: kernel path for them",
            r.left_thread_pages
        ));
    }
    if !leftovers.is_empty() {
        let (_, failed) = kernel::move_list(&leftovers, node, o)?;
        r.notes.push(format!(
            "{} populated pages relocation could not take (pinned, shared, swapped or changed) were handed to move_pages",
            leftovers.len()
        ));
        r.failed = failed;
    }
    r.secs = t0.elapsed().as_secs_f64();
    Ok(r)
}

/// Where the batch starting at `at` ends, asked for `want` bytes, in a
/// mapping ending at `end`: on a folio boundary, so THPs move whole (`end`
/// is below the top of the address space, so this cannot wrap).
fn batch_end(at: usize, end: usize, want: usize, page: usize, folio: usize) -> usize {
    (at + want.min(end - at).max(page))
        .next_multiple_of(folio)
        .min(end)
}

/// Addresses of the populated (present or swapped) pages of a range.
pub(super) fn populated(at: usize, len: usize, page: usize) -> Result<Vec<usize>, MigrateError> {
    let states = page_states(at, len / page, page).map_err(sys("read /proc/self/pagemap"))?;
    Ok(states
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != PageState::Empty)
        .map(|(i, _)| at + i * page)
        .collect())
}

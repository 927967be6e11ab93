//! One relocation call: its preconditions, the userfaultfd it opens, the
//! range cut into batches (each driven by [`super::batch`]), and the kernel
//! path and the report for whatever the batches left.

use std::time::Instant;

use super::{batch, Outcome, Run, Start};
use crate::batch::page_size;
use crate::migrate::prepare::Prepared;
use crate::migrate::stage::{Probe, Stage};
use crate::migrate::threads;
use crate::migrate::vma::{self, Vma};
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
    let mut batches = Batches::new(&run, &vmas, addr, len, o);
    let t0 = Instant::now();
    batches.all(&mut r)?;
    let leftovers = batches.leftovers;
    r.registered_batches = run.registered.get();
    // Every batch ended quiet (see `quiesce`), so no event is left unread
    // and closing the descriptor cannot strand a forking thread; closing is
    // also the backstop that unregisters anything a failed unregistration
    // left behind and wakes every waiter.
    drop(run);
    drop(uffd);
    hand_over(&mut r, &leftovers, node, o)?;
    r.secs = t0.elapsed().as_secs_f64();
    Ok(r)
}

/// The range cut into batches, and what passes from one batch to the
/// next.
struct Batches<'r, 'a> {
    run: &'r Run<'a>,
    vmas: &'r [Vma],
    addr: usize,
    len: usize,
    batch_pages: usize,
    ctl: Option<BatchController>,
    /// Populated pages no batch relocated, for the kernel path.
    leftovers: Vec<usize>,
    /// Why relocation stopped, once it has: the rest goes to the kernel
    /// path.
    stopped: Option<String>,
    /// Whether a batch went through take-out (then a refusal no longer
    /// finds everything as it was).
    touched: bool,
    /// The next batch's destination, where the last one prepared it.
    ready: Option<Prepared>,
    /// The last batch's parking area, kept for the next one.
    spare: Option<Stage<'static>>,
}

impl<'r, 'a> Batches<'r, 'a> {
    fn new(run: &'r Run<'a>, vmas: &'r [Vma], addr: usize, len: usize, o: &MigrateOptions) -> Self {
        let (page, folio) = (run.page, run.folio);
        Batches {
            run,
            vmas,
            addr,
            len,
            batch_pages: o.batch_pages,
            ctl: o
                .latency_budget
                .map(|b| BatchController::new(b, o.batch_pages, folio / page, len / page)),
            leftovers: Vec::new(),
            stopped: None,
            touched: false,
            ready: None,
            spare: None,
        }
    }

    /// Relocates every batch of every mapping, in order, into `r`.
    fn all(&mut self, r: &mut MigrateReport) -> Result<(), MigrateError> {
        let (page, folio) = (self.run.page, self.run.folio);
        let vmas = self.vmas;
        for v in vmas {
            let end = v.end.min(self.addr + self.len);
            let mut at = v.start.max(self.addr);
            while at < end {
                let want = self.want();
                let stop = batch_end(at, end, want, page, folio);
                if self.stopped.is_some() {
                    self.leftovers.extend(populated(at, stop - at, page)?);
                } else {
                    let out = self.one(at, stop, v, want)?;
                    self.absorb(r, out, at);
                }
                at = stop;
            }
            // A parking area matches its own mapping's protections and lock
            // state: the next mapping's batches get areas of their own.
            self.spare = None;
        }
        Ok(())
    }

    /// The bytes the next batch asks for.
    fn want(&self) -> usize {
        self.ctl
            .as_ref()
            .map_or(self.batch_pages, BatchController::pages)
            .saturating_mul(self.run.page)
    }

    /// Relocates the batch `[at, stop)` of `v`; a refusal before any batch
    /// touched the memory refuses the call, a later one stops relocation.
    fn one(
        &mut self,
        at: usize,
        stop: usize,
        v: &Vma,
        want: usize,
    ) -> Result<Outcome, MigrateError> {
        let (page, folio) = (self.run.page, self.run.folio);
        let (addr, len) = (self.addr, self.len);
        // The next batch as it would be cut now (a latency budget may
        // cut it otherwise: then what was prepared is not used).
        let next = self.vmas.iter().find_map(|w| {
            let end = w.end.min(addr + len);
            let at = w.start.max(addr).max(stop);
            (at < end).then(|| (at, batch_end(at, end, want, page, folio) - at, w))
        });
        let (ready, spare) = (self.ready.take(), self.spare.take());
        Ok(
            match batch(self.run, at, stop - at, v, ready, spare, next) {
                Ok(out) => out,
                Err(Start::Refused(why)) if !self.touched => {
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
            },
        )
    }

    /// Adds what the batch at `at` did to `r`, and keeps what the next
    /// batch takes over.
    fn absorb(&mut self, r: &mut MigrateReport, out: Outcome, at: usize) {
        // Only a batch that went through take-out can have touched
        // the memory: one whose pages were all left (large folios a
        // move would split, holes) did not, and a refusal after it
        // still finds everything as it was.
        self.touched |= out.stat.is_some();
        if let (Some(c), Some(s)) = (self.ctl.as_mut(), out.stat.as_ref()) {
            c.observe(std::time::Duration::from_secs_f64(s.first_folio_us / 1e6));
        }
        r.batches.extend(out.stat);
        self.ready = out.ahead;
        self.spare = out.spare;
        r.pool_secs += out.pool_secs;
        r.pages_to_move += out.populated;
        r.relocated_pages += out.relocated;
        r.dropped_pages += out.dropped;
        r.left_in_place += out.left.len();
        r.left_whole_folio_pages += out.whole_left;
        r.left_thread_pages += out.thread_left;
        self.leftovers.extend(out.left);
        r.notes.extend(out.notes);
        if let Some(why) = out.stop {
            r.notes.push(format!(
                "relocation stopped at {at:#x} ({why}); the rest went to move_pages"
            ));
            self.stopped = Some(why);
        }
    }
}

/// Says in `r` what relocation left in place and why, and hands the
/// `leftovers` to the kernel path.
fn hand_over(
    r: &mut MigrateReport,
    leftovers: &[usize],
    node: u32,
    o: &MigrateOptions,
) -> Result<(), MigrateError> {
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
        let (_, failed) = kernel::move_list(leftovers, node, o)?;
        r.notes.push(format!(
            "{} populated pages relocation could not take (pinned, shared, swapped or changed) were handed to move_pages",
            leftovers.len()
        ));
        r.failed = failed;
    }
    Ok(())
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

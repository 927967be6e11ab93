//! The relocation path.
//!
//! Everything below runs on a helper thread that blocks asynchronous
//! signals (see [`relocate`]); the caller only waits.
//!
//! Per batch (a run of pages inside one mapping):
//!
//! 1. read pagemap: which pages are populated (holes stay holes), and
//!    kpageflags: which belong to large folios a move would split
//!    (`folios.rs`; those stay in place, whole, for `move_pages`);
//! 2. map the parking area, and find destination folios on the target
//!    node for the populated pages (threads are not held up yet): the
//!    last batch's old folios where they are on that node already (its
//!    parking area, kept), else an area a helper prepared while the last
//!    batch was out, and allocate whatever is still missing
//!    (`prepare.rs`);
//! 3. register the batch with our userfaultfd in missing mode (the
//!    parking area in write-protect mode: see below), with the
//!    REMOVE, UNMAP, REMAP and FORK events;
//! 4. read pagemap and kpageflags again (from here the populated set can
//!    only shrink), and look up every thread's descriptor (`threads.rs`):
//!    those pages stay in place; from here to the end of step 5 a helper
//!    may prepare the next batch's destination, unless this batch's old
//!    folios will be it;
//! 5. `UFFDIO_MOVE` the populated pages out into the parking area (a
//!    PMD folio as one unit; one the kernel refuses stays whole); a
//!    thread touching one now finds an empty entry and waits on the
//!    userfaultfd, kernel-mode accesses included (the descriptor is not
//!    user-mode-only); then look at the threads again and put back any descriptor page of a
//!    thread that started meanwhile; clear the `tid` word of a thread that
//!    exited meanwhile in the parked copy (its wake follows step 7): the
//!    parked pages are searched for its descriptor only where a task id
//!    allocated since the first look is gone (`threads::Births`);
//! 6. copy parking → destination through the copy channels;
//! 7. `UFFDIO_MOVE` the destination folios in (this wakes their waiters);
//! 8. unregister, which wakes everyone left, and unmap the destination
//!    area; the parking area is kept, unregistered, for the next batch if
//!    every page it took is back or dropped.
//!
//! Why no write is lost, resurrected or exposed:
//!
//! - A destination folio is installed only at a page that was taken out
//!   (step 5) and copied over whole (step 6): a recycled old folio, or a
//!   fresh one allocated for a page that then stayed in place or went
//!   empty, is never installed and goes with its area, so nothing of what
//!   it held shows. Preparing ahead touches only our own staging areas and
//!   pagemap; what it got wrong (stale) step 2 allocates, or frees unused.
//! - The mapping is never replaced: only its pages move, so protections,
//!   VmFlags and advice, lock state and memory policy are untouched.
//! - A store before step 5 lands in the old page, which is then moved and
//!   copied; a store after it waits until step 7 or 8. A page empty at
//!   step 4 is never touched; a store to it waits (missing mode) until 8
//!   and then faults in normally. Nothing we install can overwrite a
//!   store, because `UFFDIO_MOVE` only installs into an empty entry.
//! - `UFFDIO_MOVE` checks, under the userfaultfd's `map_changing_lock`,
//!   that no event is unread (else EAGAIN), that the destination mapping
//!   is registered with *our* descriptor, and that both mappings are
//!   compatible. madvise(DONTNEED/FREE) raises that flag before it zaps and
//!   waits for us to read its REMOVE event; munmap and mremap raise it
//!   under the mmap lock while they change the mapping and wait until we
//!   read UNMAP/REMAP; fork raises it while it copies page tables and
//!   waits for FORK. So every move either completed before such a change
//!   began, or fails and we read the event first. A zapped or unmapped
//!   page is then never installed (it reads zero, or stays unmapped:
//!   nothing is ever mapped where the application unmapped, and a mapping
//!   the application put in its place is not registered with us, so a move
//!   into it fails); a remapped page is installed where it went; a child
//!   forked with pages out gets them filled through its own descriptor
//!   (see `uffd/child.rs`).
//! - We never trust `UFFDIO_MOVE`'s count alone: Linux 6.18 can move a
//!   run of PTEs after an internal retry without counting it and then
//!   fail with EEXIST at the slot it filled. After any failed move the
//!   staging slots are read (pagemap) and a page found there is out
//!   (`PageLedger::taken_uncounted`); else it would stay parked, its entry
//!   empty, and read zero once the batch ends (a lost write).
//! - `MADV_FREE`'d clean pages keep their lazy-free state when moved: reclaim
//!   (`MADV_PAGEOUT`) may drop one from the staging area, which is legal
//!   (a freed page may read zero). The parking area is registered in
//!   write-protect mode where the kernel has it, so the channel that then
//!   faults there gets the kernel's zeros instead of waiting on our
//!   descriptor, which nobody reads during the copy (a hang). `MADV_COLLAPSE` of a batch in flight sees
//!   its entries empty (EINVAL/EBUSY): docs/migration.md says to retry.
//! - Pages pinned for DMA or shared with another process: the kernel
//!   refuses to move them (EBUSY), they stay in place and go to the
//!   kernel path. A page the application changes under us in another way
//!   (mprotect, munlock) makes the move fail (EINVAL); the page goes back
//!   with `UFFDIO_COPY`, which installs into any mapping registered with us.

use std::io;
use std::time::{Duration, Instant};

use super::folios::{self, Fol};
use super::prepare::{self, Prepared};
use super::stage::{self as staging, Probe, Stage};
use super::threads;
use super::track::{PageLedger, State};
use super::vma::{self, Vma};
use super::{
    kernel, sys, BatchController, BatchStat, MigrateError, MigrateOptions, MigratePath,
    MigrateReport, Phases, Refusal,
};
use crate::batch::page_size;
use crate::channels::{ChannelPool, Policy};
use crate::strategy::CopyFn;
use crate::sys::errno;
use crate::sys::pagemap::{page_states, PageState};
use crate::sys::uffd::{self, Msg, Uffd};
use crate::uffd::child::{fill_child, Fill, Owed};
use crate::uffd::gate::Inside as ForkGate;

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

/// What stays the same for every batch of one call.
struct Run<'a> {
    uffd: &'a Uffd,
    probe: std::cell::RefCell<Probe<'a>>,
    node: u32,
    page: usize,
    folio: usize,
    pool: &'a ChannelPool,
    copy: CopyFn,
    /// Batches registered with `uffd` so far (the report's
    /// `registered_batches`), whatever became of them.
    registered: std::cell::Cell<usize>,
    /// Where threads keep their exit-time words: read once, before any
    /// batch is registered (it looks up glibc symbols, under a loader lock
    /// a thread in dlopen may hold while it touches the range).
    layout: Result<threads::Layout, threads::Unknown>,
}

/// What one batch did.
#[derive(Default)]
struct Outcome {
    /// `tid` words to wake once the batch is unregistered.
    wake: Vec<usize>,
    stat: Option<BatchStat>,
    pool_secs: f64,
    populated: usize,
    relocated: usize,
    dropped: usize,
    /// Populated pages left where they were, for the kernel path.
    left: Vec<usize>,
    notes: Vec<String>,
    /// Why relocation should stop here (the rest goes to the kernel path).
    stop: Option<String>,
    /// Of `left`, pages of large folios left whole.
    whole_left: usize,
    /// Of `left`, pages holding a live thread's exit-time words.
    thread_left: usize,
    phases: Phases,
    /// The next batch's destination, prepared while this one was out.
    ahead: Option<Prepared>,
    /// This batch's parking area, its pages garbage now.
    spare: Option<Stage<'static>>,
}

/// Why a batch could not start.
enum Start {
    Refused(Refusal),
    Stop(String),
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
fn populated(at: usize, len: usize, page: usize) -> Result<Vec<usize>, MigrateError> {
    let states = page_states(at, len / page, page).map_err(sys("read /proc/self/pagemap"))?;
    Ok(states
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != PageState::Empty)
        .map(|(i, _)| at + i * page)
        .collect())
}

/// Relocates one batch `[start, start + len)` of mapping `v`, with its
/// destination `ready` where it was prepared ahead, or recycled from the
/// last batch's parking area (`spare`); prepares the `next` batch's
/// meanwhile where a helper is free and this batch's old folios will not
/// do.
fn batch(
    run: &Run,
    start: usize,
    len: usize,
    v: &Vma,
    ready: Option<Prepared>,
    spare: Option<Stage<'static>>,
    next: Option<(usize, usize, &Vma)>,
) -> Result<Outcome, Start> {
    let t0 = Instant::now();
    let page = run.page;
    let n = len / page;
    let stop = |what: &str, e: io::Error| Start::Stop(format!("{what}: {e}"));
    let pre = page_states(start, n, page).map_err(|e| stop("pagemap", e))?;
    let mut pb = PageLedger::new(start, page, &pre);
    let whole_left = keep_large(&mut pb, v, page).map_err(Start::Refused)?;
    if pb.count(State::Untouched) == 0 {
        // Nothing relocation can move whole: not even registered.
        let left = populated(start, len, page).unwrap_or_default();
        return Ok(Outcome {
            populated: left.len(),
            whole_left: whole_left.min(left.len()),
            left,
            ..Outcome::default()
        });
    }
    let tp = Instant::now();
    let ready = ready.filter(|r| r.fits(start, len));
    let ready_took = ready.as_ref().map_or(Duration::ZERO, |r| r.took);
    // The last batch's old folios first: those on the target node need no
    // allocating (and no zeroing) at all.
    let recycled =
        spare.and_then(|a| Prepared::recycled(a, start, len, v, (run.node, run.folio, page)));
    // Whichever holds more of the folios the batch needs.
    let (ready, prepared_ahead) = match (recycled, ready) {
        (Some(r), Some(a)) if a.filled() > r.filled() => (Some(a), ready_took),
        (Some(r), _) => (Some(r), Duration::ZERO),
        (None, a) => (a, ready_took),
    };
    let mut dest = match ready {
        Some(r) => r,
        None => {
            let d = Stage::dest(start, len, v, run.node, run.folio).map_err(|e| {
                if v.has("lo") {
                    Start::Refused(Refusal::Mlock(e))
                } else {
                    stop("destination area", e)
                }
            })?;
            Prepared::now(start, len, d, page)
        }
    };
    let heads = (0..n).filter(|&i| pb.whole[i] && pb.state[i] == State::Untouched);
    dest.fill(&pb.runs(State::Untouched), heads, page)
        .map_err(|e| stop("allocating on the target node", e))?;
    let parking = Stage::parking(start, len, v, run.uffd).map_err(|e| stop("parking area", e))?;
    let pool_secs = tp.elapsed().as_secs_f64();
    let prepare = t0.elapsed();
    let tg = Instant::now();

    // From here threads touching an empty entry of the batch wait, and
    // glibc forks wait for the batch to end (see `uffd/gate.rs`).
    let _gate = ForkGate::enter();
    let tb = Instant::now();
    let ioctls = match run.uffd.register_missing(start, len) {
        Ok(i) => i,
        Err(e) if errno(&e) == libc::EBUSY => {
            return Err(Start::Refused(Refusal::Flag {
                flag: "um",
                meaning: "already registered with another userfaultfd",
            }))
        }
        Err(e) => return Err(stop("the mapping changed before its batch", e)),
    };
    run.registered.set(run.registered.get() + 1);
    let mut b = PageLedger::new(start, page, &vec![PageState::Empty; n]);
    let mut out = Outcome {
        pool_secs,
        phases: Phases {
            prepare,
            // Waiting for forks in flight, and registering.
            checks: tg.elapsed(),
            prepared_ahead,
            ..Phases::default()
        },
        ..Outcome::default()
    };
    let res = registered(
        run, &mut b, &pre, &parking, &dest.dest, ioctls, v, next, &mut out,
    );
    let tf = Instant::now();
    // Whatever happened: read what is left, unregister, and make sure no
    // event is still in flight when the batch ends.
    quiesce(run, &mut b, &parking, &mut out);
    // Joiners of threads whose exit clear was redone: only words whose page
    // is back (a shared wake looks the page up, and would fault in a page
    // the application zapped meanwhile).
    let installed: Vec<usize> = std::mem::take(&mut out.wake)
        .into_iter()
        .filter(|&w| {
            let at = w / page * page;
            (0..n).any(|i| b.addr[i] == at && b.state[i] == State::In)
        })
        .collect();
    threads::wake(&installed);
    let total = tb.elapsed();
    // Once every page is back or dropped, what is left in the parking area
    // is garbage: the next batch's destination, where it fits.
    if res.is_ok() && !b.state.contains(&State::Out) {
        out.spare = Some(parking.keep());
    } else {
        drop(parking);
    }
    drop(dest);
    out.phases.finish = tf.elapsed();
    let first_in = res?;
    out.populated = b.state.iter().filter(|&&s| s != State::Empty).count();
    out.relocated = b.count(State::In);
    out.dropped = b.count(State::Dropped);
    out.left.extend(
        (0..n)
            .filter(|&i| b.state[i] == State::Left)
            .map(|i| b.addr[i]),
    );
    out.stat = Some(BatchStat {
        pages: n,
        // From the batch's start (before anything was taken out) to the
        // first install: the take-out and the copy are part of the wait.
        first_folio_us: first_in.map_or(total, |t| t - tb).as_secs_f64() * 1e6,
        total_us: total.as_secs_f64() * 1e6,
        phases: out.phases,
    });
    Ok(out)
}

/// Steps 4 to 7, with the batch registered. Returns the moment the first
/// pages were usable again.
#[allow(clippy::too_many_arguments)]
fn registered(
    run: &Run,
    b: &mut PageLedger,
    pre: &[PageState],
    parking: &Stage,
    dest: &Stage,
    ioctls: u64,
    v: &Vma,
    next: Option<(usize, usize, &Vma)>,
    out: &mut Outcome,
) -> Result<Option<Instant>, Start> {
    let mut lap = Instant::now();
    let page = run.page;
    let start = b.addr[0];
    *b = PageLedger::new(
        start,
        page,
        &page_states(start, b.len(), page).map_err(|e| Start::Stop(format!("pagemap: {e}")))?,
    );
    uffd::require_ioctls(ioctls, uffd::IOCTL_MOVE | uffd::IOCTL_COPY)
        .map_err(|why| Start::Refused(why.into()))?;
    // Folios can only have changed by faults before the registration (and
    // khugepaged collapses): judge them again.
    out.whole_left = keep_large(b, v, page).map_err(Start::Refused)?;
    // Pages faulted in between the two reads need destinations too.
    for (i, (s, p)) in b.state.iter().zip(pre).enumerate() {
        if *s == State::Untouched && *p != PageState::Present {
            let _ = dest.populate(i, 1, page);
        }
    }
    // First look at the threads: a page holding a live thread's
    // exit-time words is never taken (see `threads.rs`).
    let unknown = |u: threads::Unknown| Start::Refused(Refusal::UnknownThread { tid: u.tid });
    let layout = run.layout.map_err(unknown)?;
    let births = threads::Births::open();
    let areas = threads::exit_areas(&layout, page).map_err(unknown)?;
    for i in 0..b.len() {
        if b.state[i] == State::Untouched && threads::inside(&areas, b.addr[i]) {
            b.state[i] = State::Left;
            out.thread_left += 1;
        }
    }
    out.whole_left += b.keep_units_whole();
    // While the batch is out, a helper prepares the next one's
    // destination (nothing of the application's is touched there), unless
    // this batch's old folios, on the target node already, will be it.
    let (node, folio) = (run.node, run.folio);
    let next = next.filter(|_| !prepare::on_node(b, node));
    out.phases.checks += since(&mut lap);
    let mut steps = || {
        let first = out_copy_in(run, b, parking, dest, &layout, births, out);
        (first, Instant::now())
    };
    let ((first, done), ahead) = match next {
        Some((s, l, w)) => {
            crate::helpers::beside(steps, move || Prepared::ahead(s, l, w, node, folio, page))
        }
        None => (steps(), None),
    };
    // Waiting for the helper to finish preparing: on this thread's time.
    out.phases.prepare += done.elapsed();
    out.ahead = ahead.flatten();
    first
}

/// Steps 5 to 7: takes the batch out, looks at the threads again, copies
/// and installs. Returns the moment the first pages were usable again.
fn out_copy_in(
    run: &Run,
    b: &mut PageLedger,
    parking: &Stage,
    dest: &Stage,
    layout: &threads::Layout,
    mut births: threads::Births,
    out: &mut Outcome,
) -> Result<Option<Instant>, Start> {
    let mut lap = Instant::now();
    let page = run.page;
    let start = b.addr[0];
    // An error means nothing was taken: the memory is as it was.
    let taken = take_out(run, b, parking, out).map_err(Start::Refused);
    births.seal();
    out.phases.out += since(&mut lap);
    taken?;
    // Second look, now that the pages are out: a thread that started
    // meanwhile and has its descriptor in a page we took gets that page
    // back before anything is copied. (One that also exited meanwhile is
    // found below; the ordering argument is in `migrate`'s contract.)
    match threads::exit_areas(layout, page) {
        Ok(areas) => {
            let back = put_back(run, b, parking, out, |b, i| {
                threads::inside(&areas, b.addr[i])
            });
            out.thread_left += back;
        }
        Err(u) => {
            put_back(run, b, parking, out, |_, _| true);
            return Err(Start::Stop(format!(
                "thread {} has no robust list: its exit-time words cannot be located",
                u.tid
            )));
        }
    }
    // A thread that started after the first look and exited before the
    // second, with its descriptor taken out in between, lost the
    // kernel's clear of its `tid` word: redo it in the parked copy, and
    // wake its joiners once the page is back. Only where such a thread
    // can have lived (see `threads::Births`) are the parked pages
    // searched for its descriptor.
    let lost = if births.may_have_lost() {
        let parked: Vec<(usize, usize)> = (0..b.len())
            .filter(|&i| b.state[i] == State::Out)
            .map(|i| (b.addr[i], parking.base + i * page))
            .collect();
        threads::repair_lost_exits(layout, &parked, page)
    } else {
        threads::Repaired::default()
    };
    out.phases.checks += since(&mut lap);
    if let Err(e) = copy_in_stage(run, b, parking, dest, start) {
        // Cannot happen (pieces are never empty, lists never differ); if it
        // did, the parked pages go back unchanged rather than uncopied.
        out.notes.push(format!("copy failed ({e}); pages put back"));
        restore(run, b, parking, out);
    }
    out.phases.copy += since(&mut lap);
    let first = install(run, b, parking, dest, out);
    out.phases.install += since(&mut lap);
    // Woken after the batch is unregistered (see `batch`), so a shared
    // wake never faults on a page of ours that is not back.
    out.wake = lost.wake;
    if lost.cleared > 0 {
        out.notes.push(format!(
            "{} threads exited while their descriptors were out: their tid words were cleared and their joiners woken, as the kernel would have",
            lost.cleared
        ));
    }
    Ok(first)
}

/// The time since `*lap`, which moves to now.
fn since(lap: &mut Instant) -> Duration {
    let now = Instant::now();
    let d = now - *lap;
    *lap = now;
    d
}

/// How many rounds [`quiesce`] waits for in-flight events before it gives
/// up (each round reads them; none can start once nothing is registered).
const QUIESCE_ROUNDS: usize = 100_000;

/// Unregisters the batch and waits until no event is in flight, handling
/// every one that arrives meanwhile (a remap read late moves a registered
/// range, which is unregistered in turn).
fn quiesce(run: &Run, b: &mut PageLedger, parking: &Stage, out: &mut Outcome) {
    for _ in 0..QUIESCE_ROUNDS {
        drain(run, b, parking, out);
        for &(s, e) in &b.registered {
            // Fails where no mapping of ours is left there: nothing to do.
            let _ = run.uffd.unregister(s, e - s);
        }
        match run.probe.borrow_mut().quiet(run.uffd) {
            Ok(true) => return,
            Ok(false) => std::thread::yield_now(),
            Err(e) => {
                out.notes.push(format!("event probe failed: {e}"));
                return;
            }
        }
    }
    out.notes
        .push("events kept arriving after the batch was unregistered".into());
}

/// Reads every waiting message and applies it to the batch; returns
/// once none is left.
fn drain(run: &Run, b: &mut PageLedger, parking: &Stage, out: &mut Outcome) {
    let msgs = match run.uffd.read_all() {
        Ok(m) => m,
        Err(e) => {
            out.notes
                .push(format!("reading userfaultfd events failed: {e}"));
            return;
        }
    };
    for m in msgs {
        match m {
            Msg::Fault { .. } => {} // woken by the install or unregistration
            Msg::Remove { start: s, end: e } => b.zap(s, e, false),
            Msg::Unmap { start: s, end: e } => b.zap(s, e, true),
            Msg::Remap { from, to, len: l } => b.remap(from, to, l),
            Msg::Fork(child) => {
                // A wipe-on-fork child must see zeros there, never the
                // parent's bytes.
                let wipe = crate::sys::vma::wipes_on_fork(b.base, b.len() * run.page);
                let mut owed = Owed::default();
                for i in (0..b.len()).filter(|&i| {
                    !wipe && b.in_stage[i] && !matches!(b.state[i], State::In | State::Dropped)
                }) {
                    owed.push(b.addr[i], parking.base + i * run.page, run.page, false);
                }
                let how = Fill {
                    unit: run.page,
                    poison: false,
                };
                fill_child(child, owed, how);
            }
        }
    }
}

/// Step 5: moves the batch's populated pages into the parking area. An
/// error means nothing could be taken because the kernel finds the
/// mapping incompatible.
fn take_out(
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

/// Step 6: copies parked pages into the destination folios, in pieces
/// that never cross a folio boundary, through the channels.
fn copy_in_stage(
    run: &Run,
    b: &PageLedger,
    parking: &Stage,
    dest: &Stage,
    start: usize,
) -> Result<(), crate::channels::ChannelError> {
    let page = run.page;
    let mut pieces: Vec<(usize, usize)> = Vec::new(); // (first index, pages)
    for (i, k) in runs_by_index(b) {
        let mut j = i;
        while j < i + k {
            let to_boundary = (run.folio - (start + j * page) % run.folio) / page;
            let m = to_boundary.min(i + k - j);
            pieces.push((j, m));
            j += m;
        }
    }
    pieces.sort_by_key(|&(_, m)| m);
    for group in pieces.chunk_by(|a, b| a.1 == b.1) {
        let size = group[0].1 * page;
        let dsts: Vec<*mut u8> = group
            .iter()
            .map(|&(j, _)| (dest.base + j * page) as *mut u8)
            .collect();
        let srcs: Vec<*const u8> = group
            .iter()
            .map(|&(j, _)| (parking.base + j * page) as *const u8)
            .collect();
        // Never wait for a channel to start: its worker may wait for a page
        // this relocation has out (see `crate::worker`).
        let policy = Policy::default().run_unstarted_after(crate::params::CHANNEL_STALL);
        // SAFETY: both areas are our own mappings, private to this call;
        // every parked page is present (moved there), every destination
        // page allocated; pieces are disjoint.
        unsafe {
            run.pool
                .copy_folios_with(&dsts, &srcs, size, run.copy, policy)
        }?;
    }
    Ok(())
}

/// Moves parked pages back where they came from (their bytes unchanged).
fn restore(run: &Run, b: &mut PageLedger, parking: &Stage, out: &mut Outcome) {
    put_back(run, b, parking, out, |_, _| true);
}

/// Moves the parked pages `pick` chooses back where they came from, their
/// bytes unchanged, each with its whole PMD unit (a THP goes back as the
/// PMD it came out as); they become `Left`, for the kernel path. Returns
/// how many pages went back.
fn put_back(
    run: &Run,
    b: &mut PageLedger,
    parking: &Stage,
    out: &mut Outcome,
    pick: impl Fn(&PageLedger, usize) -> bool,
) -> usize {
    let mut back = 0;
    let mut i = 0;
    while i < b.len() {
        let (f, m) = b.unit_of(i);
        let unit = f..f + m;
        let chosen = unit.clone().any(|j| b.state[j] == State::Out && pick(b, j));
        if !chosen {
            i = f + m;
            continue;
        }
        let whole = m > 1 && move_back(run, b, parking, out, f, m, false).is_ok();
        for j in unit {
            if b.state[j] != State::Out {
                continue; // zapped or unmapped meanwhile (an event said so)
            }
            let res = if whole {
                Ok(())
            } else {
                move_back(run, b, parking, out, j, 1, false)
                    .or_else(|_| move_back(run, b, parking, out, j, 1, true))
            };
            match res {
                Ok(()) => {
                    b.state[j] = State::Left;
                    b.in_stage[j] = false;
                    back += 1;
                }
                Err(e) => {
                    // No mapping of ours there any more (unmapped,
                    // replaced): as in `install`.
                    out.notes.push(format!(
                        "page {:#x} could not be put back ({e}); its mapping changed under the batch",
                        b.addr[j]
                    ));
                    b.state[j] = State::Dropped;
                }
            }
        }
        i = f + m;
    }
    back
}

/// Moves (or, with `by_copy`, copies) parked pages `f .. f + m` back to
/// their application addresses, reading events and retrying while one is
/// unread (EAGAIN) and waiting while the kernel is short of memory. Fails
/// where a page of the unit is no longer out (an event dropped it) or the
/// kernel refuses for good.
fn move_back(
    run: &Run,
    b: &mut PageLedger,
    parking: &Stage,
    out: &mut Outcome,
    f: usize,
    m: usize,
    by_copy: bool,
) -> io::Result<()> {
    let page = run.page;
    // EAGAIN means events were waiting and are now read: progress, never
    // counted. ENOMEM waits for memory as a fault would: giving up would
    // drop the page's bytes.
    loop {
        if (f..f + m).any(|j| b.state[j] != State::Out)
            || (f..f + m).any(|j| b.addr[j] != b.addr[f] + (j - f) * page)
        {
            return Err(io::Error::other("the unit changed under the batch"));
        }
        let (dst, src) = (b.addr[f], parking.base + f * page);
        let res = if by_copy {
            run.uffd.copy(dst, src, m * page)
        } else {
            run.uffd.move_pages(dst, src, m * page)
        };
        let p = match res {
            Ok(_) => return Ok(()),
            Err(p) => p,
        };
        match uffd::after(&p.error) {
            uffd::After::ReadEvents => drain(run, b, parking, out),
            uffd::After::Retry => std::thread::sleep(crate::params::RELOCATE_ENOMEM_WAIT),
            _ => return Err(p.error),
        }
    }
}

/// Runs of parked pages by index (the staging areas are indexed by page,
/// so the application's addresses do not matter here).
fn runs_by_index(b: &PageLedger) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for i in (0..b.len()).filter(|&i| b.in_stage[i]) {
        match out.last_mut() {
            Some((f, k)) if *f + *k == i => *k += 1,
            _ => out.push((i, 1)),
        }
    }
    out
}

/// Step 7: installs the destination folios where their pages are now.
/// Returns the moment the first one became usable.
fn install(
    run: &Run,
    b: &mut PageLedger,
    parking: &Stage,
    dest: &Stage,
    out: &mut Outcome,
) -> Option<Instant> {
    let page = run.page;
    let mut first = None;
    drain(run, b, parking, out);
    loop {
        let runs = b.runs(State::Out);
        if runs.is_empty() {
            return first;
        }
        for (i, k) in runs {
            let res = run
                .uffd
                .move_pages(b.addr[i], dest.base + i * page, k * page);
            let done = match &res {
                Ok(_) => k,
                Err(p) => p.done / page,
            };
            for j in i..i + done {
                b.state[j] = State::In;
            }
            if done > 0 && first.is_none() {
                first = Some(Instant::now());
            }
            let Err(p) = res else { continue };
            let at = i + done;
            if errno(&p.error) == libc::EAGAIN {
                drain(run, b, parking, out);
                break;
            }
            // The mapping changed under the batch (mprotect, munlock) or
            // the folio could not be moved: put the bytes back by copy.
            match run.uffd.copy(b.addr[at], dest.base + at * page, page) {
                Ok(_) => b.state[at] = State::In,
                Err(c) => match errno(&c.error) {
                    libc::EAGAIN => {
                        drain(run, b, parking, out);
                        break;
                    }
                    // Short of memory for a page table or the page: wait
                    // and try again, as a fault would; dropping it would
                    // lose its bytes.
                    libc::ENOMEM => {
                        std::thread::sleep(crate::params::RELOCATE_ENOMEM_WAIT);
                        break;
                    }
                    _ => {
                        // ENOENT/EINVAL: no mapping of ours there any more
                        // (unmapped, replaced); EEXIST: something is there.
                        out.notes.push(format!(
                            "page {:#x} could not be put back ({}); its mapping changed under the batch",
                            b.addr[at], c.error
                        ));
                        b.state[at] = State::Dropped;
                    }
                },
            }
        }
    }
}

/// Marks the pages of `b` relocation must leave whole and in place
/// (large folios `UFFDIO_MOVE` would split, see `folios.rs`) and the PMD
/// folios it moves as one unit. Returns how many pages it left. Refuses
/// where folio sizes cannot be read and mTHP is enabled for the mapping.
fn keep_large(b: &mut PageLedger, v: &Vma, page: usize) -> Result<usize, Refusal> {
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

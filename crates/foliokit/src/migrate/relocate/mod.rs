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

//!
//! Where each part lives: `run.rs` is the call (preconditions, cutting the
//! range into batches, the kernel path for what is left, the report); this
//! module drives one batch through the steps; `take.rs` judges what a
//! batch may take and takes it out (steps 1 and 5); `install.rs` copies,
//! installs and puts back (steps 6 and 7); `events.rs` reads the
//! userfaultfd's events and ends a batch quiet (step 8).

mod events;
mod install;
mod run;
mod take;

pub use run::relocate;

use std::io;
use std::time::{Duration, Instant};

use super::prepare::{self, Prepared};
use super::stage::{Probe, Stage};
use super::threads;
use super::track::{PageLedger, State};
use super::vma::Vma;
use super::{BatchStat, Phases, Refusal};
use crate::channels::ChannelPool;
use crate::strategy::CopyFn;
use crate::sys::errno;
use crate::sys::pagemap::{page_states, PageState};
use crate::sys::uffd::{self, Uffd};
use crate::uffd::gate::Inside as ForkGate;
use events::quiesce;
use install::{copy_in_stage, install, put_back, restore};
use run::populated;
use take::{keep_large, take_out};

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
    /// Step 8 ran already (before waiting for the next batch's
    /// destination to be prepared).
    settled: bool,
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
    let pre = page_states(start, n, page).map_err(|e| stop("pagemap", e))?;
    let mut pb = PageLedger::new(start, page, &pre);
    let whole_left = keep_large(&mut pb, v, page).map_err(Start::Refused)?;
    if pb.count(State::Untouched) == 0 {
        return Ok(nothing_to_take(start, len, page, whole_left));
    }
    let tp = Instant::now();
    let (dest, prepared_ahead) = destination(run, &pb, len, v, ready, spare)?;
    let parking = Stage::parking(start, len, v, run.uffd).map_err(|e| stop("parking area", e))?;
    let pool_secs = tp.elapsed().as_secs_f64();
    let prepare = t0.elapsed();
    let tg = Instant::now();

    // From here threads touching an empty entry of the batch wait, and
    // glibc forks wait for the batch to end (see `uffd/gate.rs`).
    let _gate = ForkGate::enter();
    let tb = Instant::now();
    let ioctls = register(run, start, len)?;
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
    if !out.settled {
        settle(run, &mut b, &parking, &mut out);
    }
    let total = tb.elapsed();
    // Once every page is back or dropped, what is left in the parking area
    // is garbage: the next batch's destination, where it fits and its old
    // folios are on the target node already (elsewhere every page would
    // be freed and faulted again: no gain, a batch more memory held).
    if res.is_ok() && !b.state.contains(&State::Out) && prepare::on_node(&b, run.node) {
        out.spare = parking.keep();
    } else {
        drop(parking);
    }
    drop(dest);
    out.phases.finish += tf.elapsed();
    let first_in = res?;
    tally(&b, &mut out);
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

/// A batch stops, saying `what` failed and why.
fn stop(what: &str, e: io::Error) -> Start {
    Start::Stop(format!("{what}: {e}"))
}

/// What a batch with nothing relocation can move whole did: it is not
/// even registered, and its populated pages are left.
fn nothing_to_take(start: usize, len: usize, page: usize, whole_left: usize) -> Outcome {
    let left = populated(start, len, page).unwrap_or_default();
    Outcome {
        populated: left.len(),
        whole_left: whole_left.min(left.len()),
        left,
        ..Outcome::default()
    }
}

/// Step 2: the destination folios for the pages of `pb` still to take,
/// and how long preparing it ahead took where it was: the last batch's
/// old folios, the area prepared ahead, whichever holds more of what the
/// batch needs, else a new area; whatever is missing is allocated.
fn destination(
    run: &Run,
    pb: &PageLedger,
    len: usize,
    v: &Vma,
    ready: Option<Prepared>,
    spare: Option<Stage<'static>>,
) -> Result<(Prepared, Duration), Start> {
    let page = run.page;
    let (start, n) = (pb.base, pb.len());
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
    Ok((dest, prepared_ahead))
}

/// Step 3: registers the batch with our userfaultfd; returns the ioctls
/// the registration allows.
fn register(run: &Run, start: usize, len: usize) -> Result<u64, Start> {
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
    Ok(ioctls)
}

/// Step 8, whatever happened before: reads what is left, unregisters, and
/// makes sure no event is still in flight when the batch ends; then wakes
/// the joiners of threads whose exit clear was redone.
fn settle(run: &Run, b: &mut PageLedger, parking: &Stage, out: &mut Outcome) {
    let page = run.page;
    quiesce(run, b, parking, out);
    // Joiners of threads whose exit clear was redone: only words whose page
    // is back, installed or put back (a shared wake looks the page up, and
    // would fault in a page the application zapped meanwhile).
    let installed: Vec<usize> = std::mem::take(&mut out.wake)
        .into_iter()
        .filter(|&w| {
            let at = w / page * page;
            (0..b.len()).any(|i| b.addr[i] == at && matches!(b.state[i], State::In | State::Left))
        })
        .collect();
    threads::wake(&installed);
}

/// Counts in `out` where the pages of the finished batch `b` ended.
fn tally(b: &PageLedger, out: &mut Outcome) {
    out.populated = b.state.iter().filter(|&&s| s != State::Empty).count();
    out.relocated = b.count(State::In);
    out.dropped = b.count(State::Dropped);
    out.left.extend(
        (0..b.len())
            .filter(|&i| b.state[i] == State::Left)
            .map(|i| b.addr[i]),
    );
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
    let unknown = |u: threads::Unknown| {
        Start::Refused(match u {
            threads::Unknown::Thread(tid) => Refusal::UnknownThread { tid },
            threads::Unknown::PidNamespace(levels) => Refusal::ForeignPidNamespace { levels },
        })
    };
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
        // Step 8 here, not after the helper preparing the next batch is
        // done: threads waiting on the batch, and the senders of events,
        // wait for this batch only.
        let tf = Instant::now();
        settle(run, b, parking, out);
        out.settled = true;
        out.phases.finish += tf.elapsed();
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
            // Everything goes back; a thread that started and exited
            // while its descriptor was out lost its clear all the same, so
            // the parked copies are repaired first (no window tells here
            // that none did).
            let lost = threads::repair_lost_exits(layout, &parked(b, parking, page), page);
            put_back(run, b, parking, out, |_, _| true);
            out.wake = lost.wake;
            return Err(Start::Stop(format!(
                "{u}: its exit-time words cannot be located"
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
        threads::repair_lost_exits(layout, &parked(b, parking, page), page)
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

/// The pages of `b` that are out: (their address, their parked copy).
fn parked(b: &PageLedger, parking: &Stage, page: usize) -> Vec<(usize, usize)> {
    (0..b.len())
        .filter(|&i| b.state[i] == State::Out)
        .map(|i| (b.addr[i], parking.base + i * page))
        .collect()
}

/// The time since `*lap`, which moves to now.
fn since(lap: &mut Instant) -> Duration {
    let now = Instant::now();
    let d = now - *lap;
    *lap = now;
    d
}

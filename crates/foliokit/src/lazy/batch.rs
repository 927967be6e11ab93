//! Background batches: the next pending blocks in order, copied by the
//! channels into staging slots and moved in, or copied in place by the
//! kernel on several threads, under the latency budget.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::fill::Filler;
use crate::channels::{BatchOutcome, InFlight, Policy};

/// Whether work in a background batch should stop for a message: a fork
/// waits, or a message waits (on `watch`, the userfaultfd) and the batch
/// has run until `from` (its least run).
fn cut_due(watch: Option<&OwnedFd>, from: Instant) -> bool {
    crate::uffd::gate::fork_waits()
        || watch.is_some_and(|fd| {
            Instant::now() >= from
                && crate::sys::poll::readable([fd.as_raw_fd()], Some(Duration::ZERO))[0]
        })
}

/// A block offered to the copy in place.
#[derive(Debug, Clone, Copy)]
struct Offer {
    /// Its current address.
    dst: usize,
    /// Its offset in the source.
    src_off: usize,
    len: usize,
    /// Its segment's unit.
    unit: usize,
    /// Its source is known to read all zero.
    all_zero: bool,
}

/// Installs one block of a batch's copy in place (`o`): `len` bytes at
/// (current) address `dst` from `src_off` in `source`, piece by piece,
/// whole units of `unit` bytes: what the source has as data copied by the
/// kernel (its page tables mapped in one call first: the kernel faulting
/// the source in as it copies cost the fill about as much as the copy),
/// holes and all-zero units installed as zeros without a copy (`zero`: the
/// zero mapping and the zero-page count; `all_zero`: the block is known to
/// read all zero). Returns the bytes installed and whether that was
/// all of them (else a call failed there: the fill thread finishes the
/// block with every error handled).
fn install_in_place(
    uffd: &crate::sys::uffd::Uffd,
    source: &super::Source,
    zero: (usize, usize, &AtomicU64),
    o: Offer,
) -> (usize, bool) {
    let Offer {
        dst,
        src_off,
        len,
        unit,
        all_zero,
    } = o;
    let page = crate::batch::page_size();
    let mut done = 0;
    let pieces = if all_zero {
        vec![(src_off, len, true)]
    } else {
        source.pieces(src_off, len, unit)
    };
    for (s, n, zero_piece) in pieces {
        let at = dst + (s - src_off);
        let r = if zero_piece {
            let r = super::install::zero_run(uffd, (zero.0, zero.1), at, n, unit);
            let z = r.as_ref().map_or_else(|p| p.done, |&n| n);
            zero.2.fetch_add((z / page) as u64, Ordering::Relaxed);
            r
        } else {
            uffd.copy(at, source.as_ptr() as usize + s, n)
        };
        match r {
            Ok(_) => done += n,
            Err(p) => return (done + p.done, false),
        }
    }
    (done, true)
}

/// What [`Filler::copy_parallel`] did with one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    /// Not offered (see [`Filler::offerable`]).
    NotOffered,
    /// Offered, but the runs stopped before it: a message or a fork
    /// waits, or a run's call failed.
    Unstarted,
    /// Installed whole by one call (bytes).
    Finished(usize),
    /// The call ended early (bytes installed before the error).
    Stopped(usize),
}

/// How a background batch took a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// Copied by the channels into a staging slot, then moved in.
    Mover,
    /// Offered to the copy in place (`Filler::offerable`) when taken.
    InPlace,
    /// Filled by this thread, unit by unit.
    Other,
}

/// A block a background batch took.
#[derive(Debug, Clone, Copy)]
struct Pick {
    block: usize,
    how: Taken,
}

/// What became of a mover in the channels' copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Copied into its slot.
    Copied,
    /// Its source faulted, or the channels could not take the batch.
    Failed,
    /// Given back unstarted (a message cut the batch short).
    GivenBack,
}

/// The movers' copy: each one's fate, how long the batch ran on after
/// this thread stopped waiting for it (cut short, or ended), and whether
/// a message cut it short.
struct Staged {
    fates: Vec<Fate>,
    tail: Option<Duration>,
    cut_short: bool,
}

impl Filler {
    /// One background batch: the next pending blocks in order, as many as
    /// the budget allows (blocks copied in place, which are cut one by
    /// one, up to the largest batch).
    pub(super) fn batch(&mut self) {
        let t = Instant::now();
        // Blocks the batch gives back are taken again from here: the ones
        // before them in the order are all done, so the next batch skips
        // them.
        let start = self.cursor;
        let picks = self.select();
        if picks.is_empty() {
            // Only blocks done out of order are left: the cursor passed
            // them all; pending must be 0 then, or a fault holds one.
            self.cursor = 0;
            return;
        }
        let movers: Vec<usize> = picks
            .iter()
            .filter(|p| p.how == Taken::Mover)
            .map(|p| p.block)
            .collect();
        let taken: Vec<usize> = picks.iter().map(|p| p.block).collect();
        let staged = self.stage_movers(&movers, &taken, t);
        let post = Instant::now();
        let mut n = self.move_in_staged(&movers, &staged.fates, start);
        // A message cut the batch short: what it gave back, non-movers
        // included, waits for the next batch.
        let mut cut_short = staged.cut_short;
        let rest: Vec<Pick> = picks
            .into_iter()
            .filter(|p| p.how != Taken::Mover)
            .collect();
        let blocks: Vec<usize> = rest.iter().map(|p| p.block).collect();
        let (tried, cut_at, in_place_took) = self.copy_parallel(&blocks, t, !cut_short);
        cut_short |= tried.contains(&Tried::Unstarted);
        n += self.settle_in_place(&rest, &tried, cut_short, start);
        self.shared.filled.fetch_add(n as u64, Ordering::Relaxed);
        let took = t.elapsed();
        self.tally.batches += 1;
        self.tally.longest = self.tally.longest.max(took);
        // What a fault read during the batch waited for: the tail of a
        // batch it cut short (the folios in progress, from when the cut
        // began), then the moves and what this thread filled itself.
        // Serving faults during batches, the whole batch. Cut short while
        // copying in place: from the cut on; else the copy in place, which
        // the budget does not size, is left out.
        self.ctl.observe(match (cut_at, staged.tail) {
            (Some(at), _) => at.elapsed(),
            (None, Some(w)) => (w + post.elapsed()).saturating_sub(in_place_took),
            (None, None) => took.saturating_sub(in_place_took),
        });
    }

    /// Takes the next pending blocks in order for a batch, advancing the
    /// cursor past them: movers up to the slots and the budget, blocks
    /// copied in place up to the largest batch (they are cut block by
    /// block, see `copy_parallel`, so the budget does not size them and a
    /// batch of them costs its setup once), others up to the budget.
    fn select(&mut self) -> Vec<Pick> {
        let want = self.ctl.pages() * self.page;
        let mut picks = Vec::new();
        let (mut bytes, mut moving, mut in_place) = (0, 0, 0);
        let begun = Instant::now();
        while self.cursor < self.order.len() {
            let b = self.order[self.cursor] as usize;
            if self.ledger.done(b) {
                self.cursor += 1;
                continue;
            }
            let len = self.ledger.blocks[b].len;
            // Whether it is moved in whole depends on its source holding
            // data, found by reading it on this thread: its first bytes
            // mostly tell; a longer look (a dense zero block is read
            // whole) waits for the next batch where a message waits.
            if self.could_move(b) && !self.zero_found(b) && !self.data_at_start(b) {
                if !picks.is_empty() && cut_due(self.watch.as_deref(), begun) {
                    break;
                }
                self.zero_block(b);
            }
            let how = if self.movable(b) {
                if moving == self.slots || bytes >= want {
                    break;
                }
                moving += 1;
                bytes += len;
                Taken::Mover
            } else if self.offerable(b) {
                if in_place >= crate::params::LAZY_MAX_BATCH_BYTES {
                    break;
                }
                in_place += len;
                Taken::InPlace
            } else {
                if bytes >= want {
                    break;
                }
                bytes += len;
                Taken::Other
            };
            picks.push(Pick { block: b, how });
            self.cursor += 1;
        }
        picks
    }

    /// Has the channels copy the `movers` into the staging slots (slot `k`
    /// for mover `k`), begun at `t`, serving faults outside the batch's
    /// `taken` blocks meanwhile where asked to, and says what became of
    /// each.
    fn stage_movers(&mut self, movers: &[usize], taken: &[usize], t: Instant) -> Staged {
        let mut staged = Staged {
            fates: vec![Fate::GivenBack; movers.len()],
            tail: None,
            cut_short: false,
        };
        if movers.is_empty() {
            return staged;
        }
        let dsts: Vec<*mut u8> = (0..movers.len()).map(|k| self.slot(k) as *mut u8).collect();
        let srcs: Vec<*const u8> = movers
            .iter()
            .map(|&b| {
                let blk = self.ledger.blocks[b];
                self.src(blk.seg as usize, blk.start) as *const u8
            })
            .collect();
        let pool = self.pool.clone();
        // The channels cut the batch short themselves when a message
        // waits and the least run is over: submitting wakes them, and
        // where they take every CPU this thread may not run again
        // until they stop. Serving faults during the batch, messages
        // do not cut it. A fork cuts it at once: the forking thread
        // waits for this one to park, which it does between batches.
        // Weak: a batch queued behind other work on a shared channel
        // must not keep the userfaultfd open after the fill ends.
        let watch = match &self.watch {
            Some(fd) if !self.serve_during => Arc::downgrade(fd),
            _ => Weak::new(),
        };
        let from = t + self.least_run;
        let due = move || cut_due(watch.upgrade().as_deref(), from);
        let mut policy = Policy::default().cut_when(due);
        // The batch posts its end to `ended`, where `await_batch` sleeps
        // beside the userfaultfd (on a duplicate: see `post_end`).
        let posts = match self.ended.try_clone() {
            Ok(fd) => {
                policy = policy.post_end(fd);
                true
            }
            Err(_) => false,
        };
        // SAFETY: the slots are distinct folios of our private staging
        // mapping, touched by nobody else until the batch ends (faults
        // served meanwhile use the fault slot); the sources are mapped
        // (checked at start) and only read, and a source page that
        // faults ends its piece short (mc copy).
        let r = unsafe { pool.submit_copy_mc_with(&dsts, &srcs, self.folio, self.mc, policy) };
        let mut batch = match r {
            Ok(batch) => batch,
            Err(e) => {
                self.tally.notes.push(format!("copy channels: {e}"));
                staged.fates.fill(Fate::Failed);
                return staged;
            }
        };
        self.ready_fault_slot();
        // Serving during batches: while the channels copy, faults on
        // folios outside the batch are served on this thread (a vCPU then
        // waits for its own folio, not for the batch); faults inside it
        // wait for the batch, which installs them.
        let outcome = loop {
            if let Some(o) = batch.try_wait() {
                break o;
            }
            if !self.serve_during {
                let (o, cut, wait) = self.await_batch(&mut batch, t, posts);
                staged.cut_short = cut;
                staged.tail = Some(wait);
                break o;
            }
            if self.uffd.poll_for(crate::params::LAZY_BATCH_POLL) {
                self.serve_outside(taken);
            }
        };
        for f in outcome.failed {
            let end = (f.folio + f.folios).min(movers.len());
            staged.fates[f.folio.min(end)..end].fill(Fate::Failed);
        }
        for (k, fate) in staged.fates.iter_mut().enumerate() {
            if batch.folio_done(k) {
                *fate = Fate::Copied;
            }
        }
        staged
    }

    /// While a batch of the `taken` blocks is in flight: reads the
    /// messages and serves the faults outside it; those inside wait for
    /// the batch.
    fn serve_outside(&mut self, taken: &[usize]) {
        self.in_batch = true;
        self.drain();
        let mut later = VecDeque::new();
        while let Some(addr) = self.faults.pop_front() {
            let orig = self.ledger.remaps.original(addr);
            match orig.and_then(|o| self.ledger.block_of(o)) {
                Some(b) if taken.contains(&b) => later.push_back(addr),
                _ => self.serve(addr),
            }
        }
        self.faults = later;
        self.in_batch = false;
    }

    /// Installs the staged movers (copied ones moved in, failed ones
    /// copied from the source); those given back are left for the next
    /// batch, which starts at `start`. Returns the base pages installed.
    fn move_in_staged(&mut self, movers: &[usize], fates: &[Fate], start: usize) -> usize {
        let mut n = 0;
        for (k, (&b, &fate)) in movers.iter().zip(fates).enumerate() {
            if fate == Fate::GivenBack {
                self.cursor = start;
                continue;
            }
            // An event read meanwhile may have made it unmovable (a
            // discard): then it is copied page by page instead.
            let staged = (fate == Fate::Copied && self.movable(b)).then(|| self.slot(k));
            n += match staged {
                Some(s) => self.move_in(b, s),
                None => self.copy_block(b, 0),
            };
            self.ledger.mark_done(b);
        }
        n
    }

    /// Settles the batch's blocks other than movers after the copy in
    /// place tried them: finished ones done, stopped ones finished with
    /// every error handled, the rest filled here, or given back to the
    /// next batch (from `start`) where the batch was cut short or the
    /// budget never sized them. Returns the base pages installed.
    fn settle_in_place(
        &mut self,
        rest: &[Pick],
        tried: &[Tried],
        cut_short: bool,
        start: usize,
    ) -> usize {
        let mut n = 0;
        // What the runs installed whole is done before anything below reads
        // events: a discard read there must find those blocks done (their
        // pages counted once, as filled), not still to fill.
        for (p, tried) in rest.iter().zip(tried) {
            if let Tried::Finished(bytes) = *tried {
                self.ledger.mark_done(p.block);
                n += bytes / self.page;
            }
        }
        for (p, &tried) in rest.iter().zip(tried) {
            n += match tried {
                Tried::Finished(_) => 0,
                // The rest is copied with every error handled.
                Tried::Stopped(bytes) => bytes / self.page + self.finish_block(p.block, bytes),
                // Not started, or no longer offered (events read since
                // made it so): the budget never sized it, so it is not
                // copied here uncut; the next batch takes it as it is.
                _ if cut_short || p.how == Taken::InPlace => {
                    self.cursor = start;
                    0
                }
                _ => self.fill_block(p.block, None),
            };
        }
        n
    }

    /// Copies the blocks `bs` of a background batch with `UFFDIO_COPY`, on
    /// this thread and up to a channel count less one helpers at once (on
    /// this thread alone with one channel, still cut block by block): the
    /// kernel copies on the calling thread, so one thread alone fills at a
    /// fraction of the memory's bandwidth. Only blocks one call can fill
    /// whole are offered ([`Filler::offerable`]). A run takes no further
    /// block once a message waits and the batch has run its least share
    /// of the budget, or a fork waits, or any run's call failed: the
    /// caller then copies the rest of that block with every error handled
    /// (`copy_block`, which also reads the events that made the kernel
    /// refuse, EAGAIN), and gives back the blocks no run started. Also
    /// returns when a run first saw a message or fork cut, if one did, and
    /// how long the copying took. With `offer` false (the batch was cut
    /// short before), it offers none.
    fn copy_parallel(
        &self,
        bs: &[usize],
        begun: Instant,
        offer: bool,
    ) -> (Vec<Tried>, Option<Instant>, Duration) {
        let offered: Vec<Option<Offer>> = bs
            .iter()
            .map(|&b| {
                let blk = self.ledger.blocks[b];
                let seg = blk.seg as usize;
                (offer && self.offerable(b) && !self.ledger.done(b)).then(|| Offer {
                    dst: self.ledger.remaps.now(blk.start),
                    src_off: self.ledger.src_offset(seg, blk.start),
                    len: blk.len,
                    unit: self.ledger.segs[seg].unit,
                    // Only a verdict already found: a scan here would read
                    // zero blocks one after another on this thread, uncut.
                    all_zero: self.zero_known(b),
                })
            })
            .collect();
        let jobs: Vec<usize> = (0..bs.len()).filter(|&k| offered[k].is_some()).collect();
        if jobs.is_empty() {
            return (vec![Tried::NotOffered; bs.len()], None, Duration::ZERO);
        }
        let t = Instant::now();
        let extra = self.pool.len().saturating_sub(1).min(jobs.len() - 1);
        // 0: not started; else 1 + bytes installed, with FINISHED set
        // where the call installed the whole block.
        const FINISHED: usize = 1 << (usize::BITS - 1);
        let results: Vec<AtomicUsize> = (0..bs.len()).map(|_| AtomicUsize::new(0)).collect();
        let next = AtomicUsize::new(0);
        let cut_at = std::sync::OnceLock::new();
        let watch = self.watch.as_deref();
        let uffd = &self.uffd;
        let source = &*self.source;
        let zero = (self.zero.base, self.zero.len, &self.shared.zero);
        // Any error ends every run: the fill thread deals with that block
        // (events to read first, for EAGAIN), and the rest goes back to
        // the next batch rather than to this thread one by one, uncut.
        let failed = std::sync::atomic::AtomicBool::new(false);
        let from = begun + self.least_run;
        let due = || cut_due(watch, from);
        crate::helpers::fan_out(extra, &|| loop {
            if failed.load(Ordering::Relaxed) {
                break;
            }
            if due() {
                cut_at.get_or_init(Instant::now);
                break;
            }
            let Some(&k) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            let r = match install_in_place(uffd, source, zero, offered[k].expect("offered")) {
                (done, true) => FINISHED | (1 + done),
                (done, false) => {
                    failed.store(true, Ordering::Relaxed);
                    1 + done
                }
            };
            results[k].store(r, Ordering::Relaxed);
        });
        // fan_out returned: every run ended, and its stores are seen.
        let tried = results
            .iter()
            .enumerate()
            .map(|(k, r)| match r.load(Ordering::Relaxed) {
                _ if offered[k].is_none() => Tried::NotOffered,
                0 => Tried::Unstarted,
                v if v & FINISHED != 0 => Tried::Finished((v & !FINISHED) - 1),
                v => Tried::Stopped(v - 1),
            })
            .collect();
        (tried, cut_at.get().copied(), t.elapsed())
    }

    /// Whether block `b` is one `copy_parallel` offers: not movable, large
    /// enough, nothing in it discarded or bad, and in one piece where it
    /// lives now. Others count against the budget: the fill thread copies
    /// them unit by unit, uncut.
    fn offerable(&self, b: usize) -> bool {
        self.ledger.blocks[b].len >= crate::params::LAZY_PARALLEL_COPY_LEAST_BYTES
            && !self.movable(b)
            && self.ledger.whole(b)
    }

    /// Waits for background `batch`, begun at `begun`, sleeping until it
    /// ends or a message comes. A message cuts the batch short once it has
    /// run its least share of the budget (else faults coming one after the
    /// other would cut every batch before a channel began it): the pieces
    /// no channel has started go back, so a fault waits for the pieces in
    /// progress, not for the whole batch. The channels usually make that
    /// cut themselves (the batch's cut test) before this thread runs;
    /// this one covers a batch whose channels are all mid-piece. `posts`:
    /// the batch posts its end to `ended`. Returns the outcome, whether
    /// pieces went back, and how long it waited after the cut began (or it
    /// stopped sleeping).
    fn await_batch(
        &self,
        batch: &mut InFlight<'_>,
        begun: Instant,
        posts: bool,
    ) -> (BatchOutcome, bool, Duration) {
        self.ended.reset();
        // A batch that ended before the reset is seen here; one that ends
        // after it posts `ended`.
        match (posts, batch.try_wait().is_some()) {
            (true, false) => loop {
                if self.uffd.poll_or(&self.ended) {
                    let until = begun + self.least_run;
                    loop {
                        let now = Instant::now();
                        if now >= until || batch.try_wait().is_some() {
                            break;
                        }
                        self.ended.wait_for(until - now);
                        // A late post of the batch before may have woken
                        // it: look again.
                        self.ended.reset();
                    }
                    batch.cut();
                    break;
                }
                self.ended.reset();
                if batch.try_wait().is_some() {
                    break;
                }
            },
            (true, true) => {}
            // No descriptor to spare for the event: as before it, this
            // thread runs what no channel started (the shared channels may
            // all be busy with a copy that faulted on this very fill), then
            // waits for the rest.
            (false, _) => batch.run_unstarted(),
        }
        // A cut the channels made began before this thread woke to it.
        let stopped = batch
            .cut_at()
            .map_or(Instant::now(), |at| at.min(Instant::now()));
        let o = batch.wait_in_place();
        (o, batch.cut_at().is_some(), stopped.elapsed())
    }
}

//! The fill thread: serves faults, fills in the background, ends by
//! unregistering. The ordering argument is in the module docs (mod.rs);
//! starting is `setup.rs`, serving a fault `serve.rs`, installing a block
//! `install.rs`, background batches `batch.rs`, the bookkeeping
//! `ledger.rs`.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ledger::Ledger;
use super::map::Map;
use super::park::{Active, Parked};
use super::{BadOutcome, LazyBad, LazyReport, Shared, Source};
use crate::budget::BatchController;
use crate::channels::ChannelPool;
use crate::copy::CopyStrategy;
use crate::mc::McCopyFn;
use crate::sys::uffd::{Msg, Uffd};
use crate::uffd::child::{fill_child, Fill};

/// The fill thread's state.
/// A block's source holds data (see `Filler::zero_blocks`).
pub(super) const ZERO_DATA: u8 = 1;
/// A block's source reads all zero.
pub(super) const ZERO_ALL: u8 = 2;

pub(super) struct Filler {
    pub(super) uffd: Uffd,
    pub(super) poison: bool,
    pub(super) source: Arc<Source>,
    /// Segments, blocks, pages, and where the guest moved them.
    pub(super) ledger: Ledger,
    /// Blocks in the order background batches take them.
    pub(super) order: Vec<u32>,
    /// Where in `order` the next batch starts.
    pub(super) cursor: usize,
    pub(super) faults: VecDeque<usize>,
    /// A background batch is in flight (its slots and the channels busy).
    pub(super) in_batch: bool,
    /// Serve faults outside a batch while it is in flight.
    pub(super) serve_during: bool,
    /// Posted when a background batch ends: the fill thread waits for it
    /// and for the userfaultfd at once.
    pub(super) ended: crate::sys::event::Event,
    /// How long a batch runs before a message may cut it short.
    pub(super) least_run: Duration,
    /// The userfaultfd again, for the channels to poll between pieces
    /// (`None` where no descriptor was left for it). The only strong
    /// reference: batches hold weak ones.
    pub(super) watch: Option<Arc<OwnedFd>>,
    pub(super) staging: Option<Map>,
    pub(super) slots: usize,
    /// The fault slot has its huge page already (see
    /// [`Filler::ready_fault_slot`]).
    pub(super) fault_slot_ready: bool,
    pub(super) zero: Map,
    /// Each block's source: 0 not looked at yet, else [`ZERO_DATA`] or
    /// [`ZERO_ALL`] (found once: finding a dense block's zeros reads it,
    /// and a block is asked about at every batch that considers it).
    pub(super) zero_blocks: Vec<std::sync::atomic::AtomicU8>,
    pub(super) scratch: Vec<u8>,
    pub(super) folio: usize,
    pub(super) page: usize,
    pub(super) pool: Arc<ChannelPool>,
    pub(super) mc: McCopyFn,
    pub(super) strategy: CopyStrategy,
    pub(super) ctl: BatchController,
    pub(super) shared: Arc<Shared>,
    /// What happens once every page is in.
    pub(super) end: End,
    /// The owner went away before every page was in.
    pub(super) abandoned: bool,
    pub(super) tally: Tally,
}

/// How a fill ends: the caller's policy.
pub(super) enum End {
    /// The ranges are this process's: unregister them, and they are plain
    /// memory again.
    Unregister,
    /// The ranges are another process's (a VMM's, whose registration is
    /// its own): keep serving faults (zeros where it discarded pages)
    /// until the descriptor becomes readable (it says that process has
    /// gone: its pidfd, the socket it connected on); a fill still running
    /// then stops.
    ServeUntil(OwnedFd),
}

/// What the report says beyond the shared counters.
pub(super) struct Tally {
    pub(super) bad: Vec<LazyBad>,
    pub(super) notes: Vec<String>,
    pub(super) whole: u64,
    pub(super) batches: u64,
    pub(super) longest: Duration,
    pub(super) forks: u64,
    pub(super) t0: Instant,
    /// When every page was in (a fill that serves on afterwards).
    pub(super) resident: Option<Duration>,
}

impl Filler {
    /// Where the source's bytes for original address `addr` are.
    pub(super) fn src(&self, seg: usize, addr: usize) -> usize {
        self.source.as_ptr() as usize + self.ledger.src_offset(seg, addr)
    }

    /// Marks the range `[start, end)` never to be filled (counted as
    /// skipped where it was still to fill): original addresses, or with
    /// `now_addresses` where its pages are now (an event's).
    pub(super) fn discard(&mut self, start: usize, end: usize, now_addresses: bool) {
        let skipped = self.ledger.discard(start, end, now_addresses);
        self.shared.skipped.fetch_add(skipped, Ordering::Relaxed);
    }

    /// Applies one message; faults are queued.
    pub(super) fn apply(&mut self, m: Msg) {
        match m {
            Msg::Fault { addr } => self.faults.push_back(addr),
            Msg::Remove { start, end } | Msg::Unmap { start, end } => {
                self.discard(start, end, true)
            }
            Msg::Remap { from, to, len } => self.ledger.remaps.push(from, to, len),
            Msg::Fork(child) => self.fork(child),
        }
    }

    /// Reads and applies every waiting message.
    pub(super) fn drain(&mut self) {
        match self.uffd.read_all() {
            Ok(msgs) => msgs.into_iter().for_each(|m| self.apply(m)),
            Err(e) => {
                let note = format!("reading the userfaultfd: {e}");
                if self.tally.notes.last() != Some(&note) {
                    self.tally.notes.push(note);
                }
            }
        }
    }

    /// A fork: fill the child's empty pages from the source.
    pub(super) fn fork(&mut self, child: Uffd) {
        self.tally.forks += 1;
        // A wipe-on-fork child must see zeros there.
        let wipe: Vec<bool> = self
            .ledger
            .segs
            .iter()
            .map(|s| crate::sys::vma::wipes_on_fork(self.ledger.remaps.now(s.addr), s.len))
            .collect();
        let (owed, unit) = self
            .ledger
            .owed_to_child(&wipe, self.source.as_ptr() as usize);
        let how = Fill {
            unit,
            poison: self.poison,
        };
        let keep = self.source.clone();
        let spawned = crate::worker::spawn_shielded("foliokit-lazy-child".into(), move || {
            fill_child(child, owed, how);
            drop(keep);
        });
        if let Err(e) = spawned {
            self.tally.notes.push(format!(
                "could not fill a forked child ({e}); its unfilled pages read zeros"
            ));
        }
    }

    /// Runs the fill; `active` is its place in the fork gate (none for
    /// another process's memory: a fork of ours raises no event on its
    /// descriptor, so forks never wait for this thread).
    pub(super) fn run(mut self, active: Option<Active>, mut parked: Parked) {
        loop {
            if let Some(active) = active.as_ref().filter(|a| a.fork_pending()) {
                let u = &self.uffd;
                active.park(|| {
                    // No allocation here: a fork holds the allocator's
                    // locks until we read its event.
                    let _ = u.read_each(|m| parked.push(m));
                    u.poll(1);
                });
                let dropped = parked.take(|m| self.apply(m));
                if let Some((lo, hi)) = dropped {
                    // Where those threads wait: the addresses they faulted
                    // at, whatever was moved since (UFFDIO_WAKE needs no
                    // registration there).
                    let lo = lo / self.page * self.page;
                    let _ = self
                        .uffd
                        .wake(lo, hi / self.page * self.page + self.page - lo);
                }
            }
            self.drain();
            while let Some(addr) = self.faults.pop_front() {
                self.serve(addr);
            }
            if self.ledger.pending() == 0 {
                break;
            }
            if self.owner_gone(Some(Duration::ZERO)) {
                self.abandon();
                break;
            }
            let cancelled = self.shared.cancelled.load(Ordering::Acquire)
                && !self.shared.finish.load(Ordering::Acquire);
            if cancelled {
                self.uffd.poll(10);
                continue;
            }
            self.batch();
        }
        if matches!(self.end, End::ServeUntil(_)) {
            if !self.abandoned {
                self.tally.resident = Some(self.tally.t0.elapsed());
            }
            // Every page is in: what the caller waits for (the report
            // comes when the owner has gone).
            self.shared.done.store(true, Ordering::Release);
            self.linger();
        }
        self.finish();
        drop(active);
    }

    /// Whether the process whose memory this is has gone, waiting up to
    /// `wait` (`None`: until it has, or a message comes). Always false for
    /// the caller's own memory.
    pub(super) fn owner_gone(&self, wait: Option<Duration>) -> bool {
        let End::ServeUntil(gone) = &self.end else {
            return false;
        };
        let [_, g] = crate::sys::poll::readable([self.uffd.raw(), gone.as_raw_fd()], wait);
        g
    }

    /// The owner went away mid-fill: nothing left to fill is filled.
    fn abandon(&mut self) {
        self.abandoned = true;
        self.tally
            .notes
            .push("the process whose memory this is went away before every page was in".into());
        for s in 0..self.ledger.segs.len() {
            let (a, l) = (self.ledger.segs[s].addr, self.ledger.segs[s].len);
            self.discard(a, a + l, false);
        }
    }

    /// Every page is in; the memory is another process's, still registered
    /// there: serve what faults now (pages it discarded, which read zeros)
    /// until it goes away.
    fn linger(&mut self) {
        while !self.owner_gone(None) {
            self.drain();
            while let Some(addr) = self.faults.pop_front() {
                self.serve(addr);
            }
        }
    }

    /// Unregisters everything (where it is now), reads what is left, and
    /// publishes the report.
    pub(super) fn finish(mut self) {
        let own = matches!(self.end, End::Unregister);
        for i in (0..self.ledger.segs.len()).filter(|_| own) {
            let (a, l) = (self.ledger.segs[i].addr, self.ledger.segs[i].len);
            for (s, n) in self.ledger.remaps.image(a, l) {
                if let Err(e) = self.uffd.unregister(s, n) {
                    self.tally.notes.push(format!(
                        "unregistering {s:#x} + {n:#x}: {e} (closing does it)"
                    ));
                }
            }
        }
        // Events raised before the unregistration: read them so their
        // threads go on (faults were woken by the unregistration).
        for _ in (0..3).filter(|_| own) {
            self.drain();
            self.faults.clear();
        }
        let report = LazyReport {
            progress: super::LazyProgress {
                done: true,
                ..self.shared.progress()
            },
            bad: self.tally.bad.clone(),
            bad_outcome: if self.poison {
                BadOutcome::Poisoned
            } else {
                BadOutcome::Zeroed
            },
            whole_folios: self.tally.whole,
            batches: self.tally.batches,
            longest_batch_us: self.tally.longest.as_secs_f64() * 1e6,
            secs: self
                .tally
                .resident
                .unwrap_or_else(|| self.tally.t0.elapsed())
                .as_secs_f64(),
            forks: self.tally.forks,
            strategy: Some(self.strategy),
            notes: std::mem::take(&mut self.tally.notes),
        };
        *self.shared.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
        self.shared.done.store(true, Ordering::Release);
        drop(self);
    }
}

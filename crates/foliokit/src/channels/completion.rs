//! A batch's bookkeeping while it is in flight: which pieces are taken,
//! reported, or taken back, what is left per folio, and how it ended.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::op::NO_BATCH;
use super::policy::CutRule;
use super::{Op, Piece};

/// Batch ids, never [`NO_BATCH`]; a u64 does not wrap in practice.
static NEXT_BATCH: AtomicU64 = AtomicU64::new(NO_BATCH + 1);

/// Tracks a batch in flight: which pieces are done, pieces left per folio
/// and in total, and when the first folio and the whole batch finished.
pub struct Completion {
    id: u64,
    start: Instant,
    remaining: AtomicUsize,
    per_folio: Vec<AtomicUsize>,
    /// One flag per piece: taken by a channel already.
    claimed: Vec<AtomicBool>,
    /// One flag per piece: reported already.
    reported: Vec<AtomicBool>,
    first_ns: AtomicU64,
    /// When the last piece was reported, from the start.
    done_ns: AtomicU64,
    /// Pieces a channel reported failed, with the bytes it did copy.
    failed: Mutex<Vec<PieceFailure>>,
    done: Mutex<bool>,
    cv: Condvar,
    /// Posted when the batch ends: the caller's (`Policy::post_end`).
    ended: Option<OwnedFd>,
    /// Asked by a channel before it starts each piece (`Policy::cut_when`):
    /// `true` cuts the batch short there.
    cut: Option<CutRule>,
    /// When the batch was first cut short (its rule answered `true`, or
    /// its caller cut it), from the start (0: never): from then on every
    /// start is withdrawn.
    cut_ns: AtomicU64,
    /// Pieces taken back unstarted, by anyone.
    withdrawn: AtomicUsize,
}

/// A piece a channel could not finish (a hardware engine's page fault or
/// error status). The first `copied` bytes of it are done; the folios it
/// covers do not count as finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PieceFailure {
    /// The (first) folio of the piece within its batch.
    pub folio: usize,
    /// Folios the piece covers.
    pub folios: usize,
    /// Byte offset of the piece within its first folio.
    pub offset: usize,
    /// The piece's length.
    pub len: usize,
    /// Bytes from its start that were copied and are visible.
    pub copied: usize,
    /// The piece's number in its batch, to finish it.
    pub(super) seq: usize,
}

/// When a batch's first folio and last piece completed, from submission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchTiming {
    /// Until the first folio was wholly done: the latency a migration's
    /// first page waits (seed 001's first-folio figure).
    pub first_folio: Duration,
    /// Until every piece was done or had failed.
    pub done: Duration,
}

/// How a batch ended.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BatchOutcome {
    /// When its first folio and its last piece completed.
    pub timing: BatchTiming,
    /// Pieces a channel could not finish (empty for CPU channels, which do
    /// not fail). Their folios are not done; the rest of the batch is.
    pub failed: Vec<PieceFailure>,
}

impl Completion {
    /// A batch of `pieces` pieces where folio `f` is finished after
    /// `per_folio[f]` of them, cut short by `cut` and posting `ended` as its
    /// caller chose.
    pub(super) fn new(
        per_folio: Vec<usize>,
        pieces: usize,
        cut: Option<CutRule>,
        ended: Option<OwnedFd>,
    ) -> Self {
        if pieces == 0 {
            // Ended before it began: nothing will count it down.
            if let Some(fd) = &ended {
                crate::sys::event::Event::post_raw(fd.as_raw_fd());
            }
        }
        Completion {
            id: NEXT_BATCH.fetch_add(1, Ordering::Relaxed),
            start: Instant::now(),
            remaining: AtomicUsize::new(pieces),
            per_folio: per_folio.into_iter().map(AtomicUsize::new).collect(),
            claimed: (0..pieces).map(|_| AtomicBool::new(false)).collect(),
            reported: (0..pieces).map(|_| AtomicBool::new(false)).collect(),
            first_ns: AtomicU64::new(0),
            done_ns: AtomicU64::new(0),
            failed: Mutex::new(Vec::new()),
            done: Mutex::new(pieces == 0),
            cv: Condvar::new(),
            ended,
            cut,
            cut_ns: AtomicU64::new(0),
            withdrawn: AtomicUsize::new(0),
        }
    }

    /// Takes `piece` for running: `true` for exactly one caller per piece of
    /// this batch, `false` for every later one and for pieces of other
    /// batches. A channel that [`Channel::claims_pieces`](super::Channel::claims_pieces) runs a piece only
    /// after claiming it, which is what lets several channels be offered
    /// the same piece.
    pub fn claim(&self, piece: &Piece) -> bool {
        // The load first: a channel passing pieces others took writes
        // nothing.
        self.unclaimed(piece) && !self.claimed[piece.seq].swap(true, Ordering::AcqRel)
    }

    /// Whether `piece` is of this batch and nobody has claimed it yet.
    fn unclaimed(&self, piece: &Piece) -> bool {
        piece.batch == self.id
            && self
                .claimed
                .get(piece.seq)
                .is_some_and(|f| !f.load(Ordering::Relaxed))
    }

    /// Called by a channel after a piece's bytes are visible (drained);
    /// the channel must not touch the piece's ranges afterwards. Returns
    /// whether the piece counted: a piece of another batch (or one made by
    /// [`Piece::new`]) and a repeated report are ignored, so a channel can
    /// never finish a batch while pieces it was not given are in flight.
    pub fn piece_done(&self, piece: &Piece) -> bool {
        if !self.report(piece) {
            return false;
        }
        // Pieces with this batch's id were made by `ChannelPool::start` with
        // folio indices below `per_folio.len()`; `get` only avoids a panic.
        // A run's folios all finish when the run does.
        for f in piece.folio..piece.folio.saturating_add(piece.folios) {
            if let Some(left) = self.per_folio.get(f) {
                if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let ns = self.start.elapsed().as_nanos().max(1) as u64;
                    let _ =
                        self.first_ns
                            .compare_exchange(0, ns, Ordering::AcqRel, Ordering::Acquire);
                }
            }
        }
        self.count_down();
        true
    }

    /// Called by a channel that could not finish `piece`: its first
    /// `copied` bytes are done and visible, the rest untouched, and the
    /// channel will not touch its ranges again. The batch then ends with
    /// the piece in its report ([`BatchOutcome::failed`]); the blocking
    /// calls finish such pieces on the calling thread. Same rules as
    /// [`Completion::piece_done`]: other batches' pieces and repeats are
    /// ignored.
    pub fn piece_failed(&self, piece: &Piece, copied: usize) -> bool {
        if !self.report(piece) {
            return false;
        }
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(PieceFailure {
                folio: piece.folio,
                folios: piece.folios,
                offset: piece.offset,
                len: piece.len,
                copied: copied.min(piece.len),
                seq: piece.seq,
            });
        self.count_down();
        true
    }

    /// Marks `piece` reported: `true` the first time for a piece of this
    /// batch.
    fn report(&self, piece: &Piece) -> bool {
        piece.batch == self.id
            && self
                .reported
                .get(piece.seq)
                .is_some_and(|flag| !flag.swap(true, Ordering::AcqRel))
    }

    /// Takes `piece` back before anyone runs it: claimed here, so no
    /// channel will, and counted as ended without finishing its folios.
    /// Whether it was still unclaimed.
    fn withdraw(&self, piece: &Piece) -> bool {
        if !self.claim(piece) || !self.report(piece) {
            return false;
        }
        self.withdrawn.fetch_add(1, Ordering::Relaxed);
        self.count_down();
        true
    }

    /// Whether the batch is to be cut short: cut before, or its rule says
    /// so now.
    fn cut_due(&self) -> bool {
        if self.cut_ns.load(Ordering::Relaxed) != 0 {
            return true;
        }
        let due = self.cut.as_ref().is_some_and(|f| f());
        if due {
            self.mark_cut();
        }
        due
    }

    /// Records the cut's start, if it is the first.
    fn mark_cut(&self) {
        let ns = self.start.elapsed().as_nanos().max(1) as u64;
        let _ = self
            .cut_ns
            .compare_exchange(0, ns, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Cuts the batch short from outside the channels: each of `pieces`
    /// nobody has claimed yet is taken back. Returns how many were.
    pub(super) fn cut_short<'a>(&self, pieces: impl IntoIterator<Item = &'a Piece>) -> usize {
        self.mark_cut();
        pieces.into_iter().filter(|p| self.withdraw(p)).count()
    }

    /// When the batch was first cut short, if pieces were taken back.
    pub(super) fn cut_at(&self) -> Option<Instant> {
        if self.withdrawn.load(Ordering::Relaxed) == 0 {
            return None;
        }
        match self.cut_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(self.start + Duration::from_nanos(ns)),
        }
    }

    /// A channel worker's turn at `piece`: withdrawn if the batch is being
    /// cut short and nobody took it yet, else [`Completion::run_claimed`].
    /// The test runs only for pieces still free, so a worker passing the
    /// pieces others took pays nothing for it.
    ///
    /// # Safety
    /// As [`Completion::run_claimed`].
    pub(super) unsafe fn start_or_withdraw(&self, op: Op, piece: &Piece) -> bool {
        if !self.unclaimed(piece) {
            return false;
        }
        if self.cut_due() {
            self.withdraw(piece);
            return false;
        }
        // SAFETY: the caller's contract.
        unsafe { self.run_claimed(op, piece) }
    }

    fn count_down(&self) {
        // AcqRel: the last report acquires every earlier channel's release,
        // so the waiter (through the mutex) sees every piece's bytes.
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let ns = self.start.elapsed().as_nanos().max(1) as u64;
            self.done_ns.store(ns, Ordering::Release);
            *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
            self.cv.notify_all();
            // After `done` is set: a caller woken by the post sees it.
            if let Some(fd) = &self.ended {
                crate::sys::event::Event::post_raw(fd.as_raw_fd());
            }
        }
    }

    /// Runs `piece` with `op` on this thread if this thread can claim it
    /// ([`Completion::claim`]), drains, and reports it; whether it ran.
    /// The one place a claimed piece runs: on a CPU channel's worker, on
    /// the caller for a refusing channel, and on a caller that runs the
    /// pieces no channel started (`InFlight::run_unstarted`). An `op` that panics aborts the process: the piece would
    /// stay claimed and never reported, so the batch could never end, or
    /// its caller would free memory still being written.
    ///
    /// # Safety
    /// The piece's ranges are valid for `op`, and touched by nobody else
    /// until it is reported (the [`Channel::submit`](super::Channel::submit) contract).
    pub(super) unsafe fn run_claimed(&self, op: Op, piece: &Piece) -> bool {
        if !self.claim(piece) {
            return false;
        }
        let ran = std::panic::catch_unwind(|| {
            // SAFETY: the caller's contract; the claim makes this the
            // piece's only run, and it is not touched after the report.
            unsafe { op.run_partial(piece) }
        });
        let Ok(did) = ran else {
            eprintln!("foliokit: a copy channel's operation panicked; aborting");
            std::process::abort();
        };
        // Streaming stores are only ordered by a fence on the thread that
        // issued them: drain before reporting.
        crate::arch::sfence();
        if did < piece.len {
            // An mc copy's source faulted: the rest of the piece is
            // untouched, and reported so.
            self.piece_failed(piece, did);
        } else {
            self.piece_done(piece);
        }
        true
    }

    /// This batch's id, which its pieces carry.
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Folios in the batch.
    pub(super) fn folios(&self) -> usize {
        self.per_folio.len()
    }

    /// Whether folio `i` is done (see `InFlight::folio_done`).
    pub(super) fn folio_done(&self, i: usize) -> bool {
        self.per_folio
            .get(i)
            .is_some_and(|left| left.load(Ordering::Acquire) == 0)
    }

    /// Pieces not reported yet.
    pub(super) fn remaining(&self) -> usize {
        self.remaining.load(Ordering::Acquire)
    }

    /// Time since the batch started.
    pub(super) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// How the batch ended, once it has.
    pub(super) fn outcome(&self) -> BatchOutcome {
        let total = match self.done_ns.load(Ordering::Acquire) {
            // An empty batch is done at once.
            0 => Duration::ZERO,
            ns => Duration::from_nanos(ns),
        };
        let first = Duration::from_nanos(self.first_ns.load(Ordering::Acquire));
        let mut failed = self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        failed.sort_by_key(|f| f.seq);
        BatchOutcome {
            timing: BatchTiming {
                first_folio: if first.is_zero() {
                    total
                } else {
                    first.min(total)
                },
                done: total,
            },
            failed,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        *self.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `d` for the batch to end; whether it has.
    pub(super) fn wait_for(&self, d: Duration) -> bool {
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let (done, _) = self
            .cv
            .wait_timeout_while(done, d, |done| !*done)
            .unwrap_or_else(|p| p.into_inner());
        *done
    }

    pub(super) fn wait(&self) -> Duration {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(|p| p.into_inner());
        }
        self.start.elapsed()
    }
}

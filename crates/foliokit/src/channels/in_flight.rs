//! The caller's handle on a batch in flight: poll it, wait for it, see
//! which folios are done, cut it short, or run its unstarted pieces.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{BatchOutcome, BatchTiming, ChannelPool, Completion, Op, Piece};

/// A batch in flight on a [`ChannelPool`] ([`ChannelPool::submit_copy`],
/// [`ChannelPool::submit_clear`]). Dropping it waits for the batch: the
/// channels may still be writing into the caller's memory. Do not carry
/// one across `fork()`: the child has no worker threads to finish it, so
/// its copy would wait forever (the parent's is unaffected).
///
/// Formerly `Batch`: the handle is not the batch, and relocation has
/// batches of its own.
pub struct InFlight<'p> {
    pub(super) _pool: &'p ChannelPool,
    pub(super) done: Arc<Completion>,
    pub(super) op: Op,
    /// Every piece, by its number.
    pub(super) pieces: Vec<Piece>,
    /// The pieces this thread may run or take back, by number, in the
    /// order it takes them (see `placement::Placement::for_caller`).
    pub(super) for_caller: Vec<usize>,
    /// The caller's `Policy::run_unstarted_after`.
    pub(super) stall: Option<Duration>,
    pub(super) outcome: Option<BatchOutcome>,
}

/// The old name of [`InFlight`], kept so code written against it builds.
#[doc(hidden)]
pub type Batch<'p> = InFlight<'p>;

impl InFlight<'_> {
    /// Folios in the batch.
    pub fn folios(&self) -> usize {
        self.done.folios()
    }

    /// Whether folio `i` is done: every byte of it copied (or cleared) and
    /// visible to this thread. `false` for a folio a failed piece covers,
    /// and for `i` out of range.
    pub fn folio_done(&self, i: usize) -> bool {
        self.done.folio_done(i)
    }

    /// The outcome if the batch has ended, without blocking.
    pub fn try_wait(&mut self) -> Option<BatchOutcome> {
        if self.outcome.is_none() && self.done.is_done() {
            self.outcome = Some(self.done.outcome());
        }
        self.outcome.clone()
    }

    /// Blocks until the batch ends.
    pub fn wait(mut self) -> BatchOutcome {
        self.wait_in_place()
    }

    /// [`InFlight::wait`] that keeps the handle, to ask
    /// [`InFlight::folio_done`] afterwards. A batch whose caller chose
    /// `Policy::run_unstarted_after` runs stalled pieces here meanwhile.
    pub(crate) fn wait_in_place(&mut self) -> BatchOutcome {
        if let Some(o) = &self.outcome {
            return o.clone();
        }
        if let Some(stall) = self.stall {
            self.unstall(stall);
        }
        self.done.wait();
        let o = self.done.outcome();
        self.outcome = Some(o.clone());
        o
    }

    /// Waits, then finishes on this thread what channels failed: the
    /// blocking calls' promise that every byte is done.
    pub(super) fn finish(mut self) -> BatchTiming {
        let outcome = self.wait_in_place();
        // An mc copy's failed piece faulted on its source: copying it again
        // would fault again. Only `submit_copy_mc` makes such batches, and
        // its callers read the failures instead.
        let redo = !matches!(self.op, Op::CopyMc(_));
        for f in outcome.failed.iter().filter(|_| redo) {
            let Some(p) = self.pieces.get(f.seq) else {
                continue;
            };
            let rest = Piece {
                dst: p.dst.wrapping_add(f.copied),
                src: if p.src.is_null() {
                    p.src
                } else {
                    p.src.wrapping_add(f.copied)
                },
                len: p.len - f.copied,
                ..*p
            };
            // SAFETY: the batch's contract covers the piece's ranges until
            // this returns; the failing channel gave the piece up for good
            // (piece_failed), and `copied <= len` keeps the rest inside it.
            unsafe { self.op.run(&rest) };
        }
        let mut timing = outcome.timing;
        if !outcome.failed.is_empty() {
            crate::arch::sfence();
            // The batch ends when its last byte does, here.
            timing.done = self.done.elapsed();
        }
        timing
    }

    /// Runs, on the calling thread, the pieces no channel has taken yet
    /// (from the batch's end, where the channels take last), then returns;
    /// [`InFlight::wait`] afterwards waits only for pieces a channel is
    /// running. For a caller with its own CPU time to give, where channels
    /// share CPUs with other busy threads: a channel not scheduled yet then
    /// holds up nothing. Only pieces of channels that claim pieces can be.
    pub(crate) fn run_unstarted(&self) {
        for &seq in &self.for_caller {
            // SAFETY: the batch's contract covers every piece's ranges
            // until it ends, which is not before this handle is dropped.
            unsafe { self.done.run_claimed(self.op, &self.pieces[seq]) };
        }
    }

    /// Cuts the batch short: the pieces no channel has started are taken
    /// back and never run (their folios stay not done, and are not in
    /// [`BatchOutcome::failed`]), so the batch ends when the pieces in
    /// progress do. Returns how many were taken back. Only pieces of
    /// channels that claim pieces can be. The same cut as the one the
    /// caller's `Policy::cut_when` makes the channels take.
    pub(crate) fn cut(&self) -> usize {
        self.done
            .cut_short(self.for_caller.iter().map(|&seq| &self.pieces[seq]))
    }

    /// When the batch was first cut short (by [`InFlight::cut`], or by the
    /// channels when the caller's rule said so), if pieces were taken back:
    /// what waited on the cut waited from then, however late its caller
    /// woke.
    pub(crate) fn cut_at(&self) -> Option<Instant> {
        self.done.cut_at()
    }

    /// Waits for the batch, and whenever its channels finish no piece for
    /// `stall`, runs on this thread the pieces no channel has started
    /// ([`InFlight::run_unstarted`]). For a caller that must not wait for a
    /// channel to start (relocation's loop, which puts back pages that
    /// other threads, a channel's worker among them, may be waiting for:
    /// that worker cannot start this batch's pieces queued behind its
    /// wait). Pieces a channel did start finish on their own.
    fn unstall(&self, stall: Duration) {
        let mut left = self.done.remaining();
        while !self.done.wait_for(stall) {
            let now = self.done.remaining();
            if now < left {
                left = now;
                continue;
            }
            self.run_unstarted();
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // The channels may still be writing into the caller's memory.
        self.done.wait();
    }
}

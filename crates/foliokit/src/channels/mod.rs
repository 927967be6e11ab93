//! Copy channels: engines that copy pieces of a batch in parallel.
//!
//! The implemented backend is a persistent, CPU-pinned worker thread per
//! channel ([`CpuChannel`]); the [`Channel`] trait is what a hardware copy
//! engine (Intel DSA, a GPU copy engine) would implement instead. Workers
//! are never spawned per call: the pool lives as long as its owner. They
//! are foliokit's one kind of persistent thread (the helpers that run
//! populate and relocation are the other role of it), each channel with a
//! thread of its own: a relocation loop waiting for its copies on a
//! helper can never hold up the channel that runs them. A worker blocks
//! the application's asynchronous signals (a handler run on it could wait
//! for a page that relocation has out); the signals a fault raises still
//! reach it, so a machine-check-safe copy recovers there.
//!
//! # Soundness
//!
//! A [`Piece`] carries raw pointers, so everything that could make memory
//! be written through them is `unsafe`: making a piece ([`Piece::new`]),
//! handing pieces to a channel ([`Channel::submit`]) and running an
//! operation on one ([`Op::run`]), and implementing [`Channel`] itself.
//! Safe code can only look at pieces; a batch counts each of its own
//! pieces at most once ([`Completion::piece_done`] ignores repeats and
//! pieces of other batches). That a channel reports only pieces it ran
//! itself — so no batch ends while another channel still writes into it —
//! is part of the `unsafe impl Channel` promise.
//!
//! Implementing [`Channel`] is `unsafe` (an `unsafe impl`): a channel is
//! handed the caller's memory, and only its implementer can promise to run
//! each piece once, where it was meant to go. Without `unsafe` it does not
//! compile:
//!
//! ```compile_fail,E0200
//! use foliokit::channels::{Channel, ChannelError, Completion, Op, Piece};
//! use std::sync::Arc;
//! struct Redirect;
//! impl Channel for Redirect {
//!     fn name(&self) -> &str { "redirect" }
//!     unsafe fn submit(&self, _: Vec<Piece>, _: Op, _: Arc<Completion>) -> Result<(), ChannelError> {
//!         Ok(())
//!     }
//! }
//! ```
//!
//! The same with `unsafe impl` compiles (and then must keep the promises):
//!
//! ```no_run
//! use foliokit::channels::{Channel, ChannelError, Completion, Op, Piece};
//! use std::sync::Arc;
//! struct Refuse;
//! // SAFETY: refuses every batch and touches nothing.
//! unsafe impl Channel for Refuse {
//!     fn name(&self) -> &str { "refuse" }
//!     unsafe fn submit(&self, _: Vec<Piece>, _: Op, _: Arc<Completion>) -> Result<(), ChannelError> {
//!         Err(ChannelError::Stopped("refuse".into()))
//!     }
//! }
//! ```
//!
//! # Batches in flight
//!
//! [`ChannelPool::submit_copy`] and [`ChannelPool::submit_clear`] return
//! an [`InFlight`] handle at once: poll it ([`InFlight::try_wait`]), wait
//! for it, ask which folios are done ([`InFlight::folio_done`]), and read
//! which pieces a channel could not finish ([`BatchOutcome::failed`], as a DMA engine reports a
//! partial completion). The blocking [`ChannelPool::copy_folios`] and
//! [`ChannelPool::clear_folios`] are built on them and finish failed
//! pieces on the calling thread.
//!
//! # Fork
//!
//! After `fork()` a child has none of its parent's threads. A CPU channel
//! made before the fork refuses work in the child (its pool then runs the
//! pieces on the calling thread), and [`shared`] hands the child fresh
//! pools instead of the inherited ones.

mod completion;
mod cpu;
mod in_flight;
mod op;
mod placement;
mod policy;
mod pool;
mod shared;
#[cfg(test)]
mod tests;

pub use completion::{BatchOutcome, BatchTiming, Completion, PieceFailure};
pub(crate) use cpu::{fix_placement, placement_fixed};
pub use cpu::{ChannelCpus, CpuChannel};
#[doc(hidden)]
pub use in_flight::Batch;
pub use in_flight::InFlight;
pub use op::{Op, Piece};
pub(crate) use policy::Policy;
pub use pool::ChannelPool;
#[doc(hidden)]
pub use shared::hold_shared_lock;
pub(crate) use shared::shared_pool_ranges;
pub use shared::{release_shared, shared, start_shared};

use std::sync::Arc;
use thiserror::Error;

/// Why a channel pool or batch could not start.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelError {
    /// A pool was asked for 0 channels.
    #[error("a channel pool needs at least one channel")]
    Zero,
    /// The named channel takes no more work (its worker is gone, e.g. in a
    /// forked child). From [`Channel::submit`]; the pool then runs the
    /// pieces on the calling thread, so pool calls do not return it.
    #[error("copy channel '{0}' has stopped")]
    Stopped(String),
    /// A pool was asked for more channels (threads) than a pool may have.
    #[error("{asked} copy channels asked for; at most {most}")]
    TooMany {
        /// Channels asked for.
        asked: usize,
        /// The most a pool may have.
        most: usize,
    },
    /// A batch's folio size was 0.
    #[error("a batch's folio size must not be zero")]
    ZeroFolio,
    /// A copy batch's destination and source lists differ in length.
    #[error("{dsts} destinations but {srcs} sources")]
    LengthMismatch {
        /// Destinations given.
        dsts: usize,
        /// Sources given.
        srcs: usize,
    },
}

/// A copy engine (it clears too: a clear is a copy from nothing).
///
/// # Safety
///
/// Implementing it is `unsafe`: the pool hands an implementation the
/// caller's memory and trusts it to keep these promises, which no type can
/// check:
/// - each accepted piece is run at most once, with the `op` given, on its
///   own ranges (never another piece's, never redirected elsewhere);
/// - it reports (`done.piece_done` / `done.piece_failed`) only pieces it
///   ran itself: with [`Channel::claims_pieces`], only those it claimed;
///   without, only its own (a channel offered another's piece that it did
///   not claim must leave it alone, or the batch could end while that
///   other channel still writes);
/// - its bytes are visible (drained) before `done.piece_done` is called for
///   it, or the bytes it did copy before `done.piece_failed`, and its
///   ranges are not touched after either call;
/// - `Err` from `submit` means no piece was, or will be, touched (the pool
///   then runs them itself);
/// - with [`Channel::claims_pieces`], a piece is run only after
///   `done.claim` returned `true` for it.
pub unsafe trait Channel: Send + Sync {
    /// A short name for messages and worker threads, e.g. `"cpu0"`.
    fn name(&self) -> &str;

    /// Whether this channel runs a piece only after [`Completion::claim`]
    /// returned `true` for it (and skips it otherwise). The pool then also
    /// offers it the pieces of other claiming channels, after its own, so
    /// an idle channel takes over work a busy one has not started.
    /// Returning `true` is a promise the channel's `submit` must keep.
    fn claims_pieces(&self) -> bool {
        false
    }

    /// Starts running `op` on `pieces` in order, making each piece's bytes
    /// visible (drained) before calling `done.piece_done` for it.
    ///
    /// A channel that [`Channel::claims_pieces`] must run a piece only if
    /// its `done.claim` returned `true`, and must not touch the ranges of
    /// any other piece.
    ///
    /// # Safety
    /// Every piece's ranges must be valid for `op` (`dst` for writes and,
    /// for [`Op::Copy`], `src` for reads of `len` bytes), disjoint, and
    /// accessed by nobody else from this call until `done` reports the
    /// piece done, or until the call returns if it returns `Err`.
    unsafe fn submit(
        &self,
        pieces: Vec<Piece>,
        op: Op,
        done: Arc<Completion>,
    ) -> Result<(), ChannelError>;
}

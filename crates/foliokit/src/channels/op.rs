//! The operations a channel runs, and the pieces of a batch it runs them
//! on.

use crate::strategy::{ClearFn, CopyFn};

/// What a channel does with each piece.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// Copy `src` to `dst`.
    Copy(CopyFn),
    /// Zero `dst` (`src` is unused).
    Clear(ClearFn),
    /// Copy `src` to `dst` with a machine-check-safe routine
    /// ([`crate::mc::mc_routine`]): a source page that raises SIGBUS ends
    /// the piece short, and the channel reports it failed with the bytes it
    /// did copy ([`Completion::piece_failed`](super::Completion::piece_failed)) instead of dying.
    CopyMc(crate::mc::McCopyFn),
}

impl Op {
    /// Runs the operation on one piece.
    ///
    /// # Safety
    /// The piece's ranges must still be valid as promised when it was made
    /// (see [`Piece::new`]): `dst` for writes and, for [`Op::Copy`], `src`
    /// for reads of `len` bytes, disjoint, and accessed by nobody else. For
    /// a piece of a pool's batch that holds until the piece is reported done
    /// ([`Completion::piece_done`](super::Completion::piece_done)); a piece must never be run after that.
    pub unsafe fn run(self, p: &Piece) {
        match self {
            // SAFETY: forwarded contract.
            Op::Copy(f) => unsafe { f(p.dst, p.src, p.len) },
            // SAFETY: forwarded contract.
            Op::Clear(f) => unsafe { f(p.dst, p.len) },
            Op::CopyMc(f) => {
                // SAFETY: forwarded contract (a faulting source is
                // reported by the routine's return value, here ignored).
                unsafe { f(p.dst, p.src, p.len) };
            }
        }
    }

    /// Runs the operation on one piece and returns the bytes done from its
    /// start: `p.len()` unless an [`Op::CopyMc`] source page faulted.
    ///
    /// # Safety
    /// As [`Op::run`].
    pub unsafe fn run_partial(self, p: &Piece) -> usize {
        match self {
            // SAFETY: forwarded contract; the routine returns the bytes
            // it did not copy.
            Op::CopyMc(f) => p.len - unsafe { f(p.dst, p.src, p.len) }.min(p.len),
            other => {
                // SAFETY: forwarded contract.
                unsafe { other.run(p) };
                p.len
            }
        }
    }
}

/// The batch id of pieces made by [`Piece::new`]: no [`Completion`](super::Completion) has it.
pub(super) const NO_BATCH: u64 = 0;

/// A piece of a batch: `len` bytes of folio `folio`, or, for a run of
/// `folios` folios contiguous in memory, the whole run.
///
/// The fields are private so that only `unsafe` code can point a piece at
/// memory; the getters let a channel look at what it was given.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    pub(super) dst: *mut u8,
    pub(super) src: *const u8,
    pub(super) len: usize,
    pub(super) folio: usize,
    /// How many folios, from `folio` on, the piece covers whole (1 for a
    /// folio or a part of one).
    pub(super) folios: usize,
    /// Byte offset within folio `folio` where the piece starts.
    pub(super) offset: usize,
    /// The [`Completion`](super::Completion) this piece counts towards ([`NO_BATCH`]: none).
    pub(super) batch: u64,
    /// Its number within that batch.
    pub(super) seq: usize,
}

// SAFETY: a Piece is a work order; whoever made it keeps both ranges valid
// and unaliased until it is reported done (see `Piece::new`), so it may be
// run on any thread.
unsafe impl Send for Piece {}

impl Piece {
    /// A piece of `len` bytes of folio `folio`, copied from `src` to `dst`
    /// (or, for a clear, zeroing `dst`). It belongs to no pool batch:
    /// [`Completion::piece_done`](super::Completion::piece_done) ignores it. Pools make their own pieces.
    ///
    /// # Safety
    /// Whoever makes a piece promises, for as long as the piece (or a copy
    /// of it) may be run with [`Op::run`] or submitted to a [`Channel`](super::Channel):
    /// `dst` is valid for writes of `len` bytes; `src` is valid for reads
    /// of `len` bytes (unless the piece is only ever cleared); the two
    /// ranges do not overlap; and nobody else reads or writes `dst`, or
    /// writes `src`, meanwhile.
    pub unsafe fn new(dst: *mut u8, src: *const u8, len: usize, folio: usize) -> Piece {
        Piece {
            dst,
            src,
            len,
            folio,
            folios: 1,
            offset: 0,
            batch: NO_BATCH,
            seq: 0,
        }
    }

    /// Where the piece's bytes go.
    pub fn dst(&self) -> *mut u8 {
        self.dst
    }

    /// Where they come from (unused for clears; a pool's clears pass null).
    pub fn src(&self) -> *const u8 {
        self.src
    }

    /// Bytes in the piece.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the piece has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The index of the (first) folio within its batch.
    pub fn folio(&self) -> usize {
        self.folio
    }

    /// How many folios the piece covers (1 for a folio or part of one).
    pub fn folios(&self) -> usize {
        self.folios
    }
}

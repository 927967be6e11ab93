//! Copy channels: engines that copy pieces of a batch in parallel.
//!
//! The implemented backend is a persistent, CPU-pinned worker thread per
//! channel ([`CpuChannel`]); the [`Channel`] trait is what a hardware copy
//! engine (Intel DSA, a GPU copy engine) would implement instead. Workers
//! are never spawned per call: the pool lives as long as its owner.

mod cpu;

pub use cpu::CpuChannel;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

use crate::arch::{ClearFn, CopyFn};
use crate::batch::page_size;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChannelError {
    #[error("a channel pool needs at least one channel")]
    Zero,
    #[error("copy channel '{0}' has stopped")]
    Stopped(String),
}

/// What a channel does with each piece.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// Copy `src` to `dst`.
    Copy(CopyFn),
    /// Zero `dst` (`src` is unused).
    Clear(ClearFn),
}

impl Op {
    /// Runs the operation on one piece.
    ///
    /// # Safety
    /// The piece's ranges must be valid as its batch's submitter promised.
    pub unsafe fn run(self, p: &Piece) {
        match self {
            // SAFETY: forwarded contract.
            Op::Copy(f) => unsafe { f(p.dst, p.src, p.len) },
            // SAFETY: forwarded contract.
            Op::Clear(f) => unsafe { f(p.dst, p.len) },
        }
    }
}

/// A piece of a batch: `len` bytes of folio `folio`.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    pub dst: *mut u8,
    pub src: *const u8,
    pub len: usize,
    pub folio: usize,
}

// SAFETY: a Piece is a work order; the submitter keeps both ranges valid
// and unaliased until the batch's Completion reports every piece done.
unsafe impl Send for Piece {}

/// Tracks a batch in flight: pieces left per folio and in total, and when
/// the first folio and the whole batch finished.
pub struct Completion {
    start: Instant,
    remaining: AtomicUsize,
    per_folio: Vec<AtomicUsize>,
    first_ns: AtomicU64,
    done: Mutex<bool>,
    cv: Condvar,
}

impl Completion {
    fn new(folios: usize, pieces_per_folio: usize) -> Self {
        Completion {
            start: Instant::now(),
            remaining: AtomicUsize::new(folios * pieces_per_folio),
            per_folio: (0..folios)
                .map(|_| AtomicUsize::new(pieces_per_folio))
                .collect(),
            first_ns: AtomicU64::new(0),
            done: Mutex::new(folios == 0),
            cv: Condvar::new(),
        }
    }

    /// Called by a channel after a piece's bytes are visible (drained).
    pub fn piece_done(&self, folio: usize) {
        if self.per_folio[folio].fetch_sub(1, Ordering::AcqRel) == 1 {
            let ns = self.start.elapsed().as_nanos().max(1) as u64;
            let _ = self
                .first_ns
                .compare_exchange(0, ns, Ordering::AcqRel, Ordering::Acquire);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
            self.cv.notify_all();
        }
    }

    fn wait(&self) -> Duration {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(|p| p.into_inner());
        }
        self.start.elapsed()
    }
}

/// A copy engine (it clears too: a clear is a copy from nothing).
pub trait Channel: Send + Sync {
    fn name(&self) -> &str;
    /// Starts running `op` on `pieces` in order, making each piece's bytes
    /// visible (drained) before calling `done.piece_done`.
    fn submit(&self, pieces: Vec<Piece>, op: Op, done: Arc<Completion>)
        -> Result<(), ChannelError>;
}

/// When a batch's first folio and last piece completed, from submission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchTiming {
    pub first_folio: Duration,
    pub done: Duration,
}

/// The process-wide CPU pool with `n` channels, created on first use and
/// kept: callers that copy or migrate repeatedly reuse the same workers
/// instead of spawning threads per call. Batches from several threads may
/// share it; each has its own completion.
pub fn shared(n: usize) -> Result<Arc<ChannelPool>, ChannelError> {
    /// Pools by channel count.
    type Pools = Vec<(usize, Arc<ChannelPool>)>;
    static POOLS: Mutex<Pools> = Mutex::new(Vec::new());
    let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = pools.iter().find(|(k, _)| *k == n) {
        return Ok(p.clone());
    }
    let p = Arc::new(ChannelPool::cpu(n)?);
    pools.push((n, p.clone()));
    Ok(p)
}

/// A set of channels a batch is spread across.
pub struct ChannelPool {
    channels: Vec<Box<dyn Channel>>,
}

impl ChannelPool {
    /// `n` CPU channels, pinned round-robin to the CPUs we may run on.
    pub fn cpu(n: usize) -> Result<Self, ChannelError> {
        if n == 0 {
            return Err(ChannelError::Zero);
        }
        Ok(ChannelPool {
            channels: (0..n)
                .map(|i| Box::new(CpuChannel::new(i)) as Box<dyn Channel>)
                .collect(),
        })
    }

    /// A pool of other engines.
    pub fn of(channels: Vec<Box<dyn Channel>>) -> Result<Self, ChannelError> {
        if channels.is_empty() {
            return Err(ChannelError::Zero);
        }
        Ok(ChannelPool { channels })
    }

    pub fn len(&self) -> usize {
        self.channels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    /// Copies folio `i` from `srcs[i]` to `dsts[i]` for every `i`, spread
    /// across the channels by folio; when there are fewer folios than
    /// channels each folio is split so every channel gets work. Blocks until
    /// every byte is copied and visible; pieces a channel refuses are copied
    /// on the calling thread.
    ///
    /// # Safety
    /// Each pair must be valid for `folio_size` bytes (reads from the
    /// source, writes to the destination), no destination may overlap
    /// another range of the batch, and none may be touched by anyone else
    /// until this returns.
    pub unsafe fn copy_folios(
        &self,
        dsts: &[*mut u8],
        srcs: &[*const u8],
        folio_size: usize,
        copy: CopyFn,
    ) -> BatchTiming {
        let n = dsts.len().min(srcs.len());
        // SAFETY: forwarded contract.
        unsafe { self.run(n, folio_size, Op::Copy(copy), |f| (dsts[f], srcs[f])) }
    }

    /// Zeroes folio `i` at `dsts[i]` for every `i`, spread as
    /// [`ChannelPool::copy_folios`] spreads copies.
    ///
    /// # Safety
    /// Each destination must be valid for writes of `folio_size` bytes, none
    /// may overlap another, and none may be touched by anyone else until
    /// this returns.
    pub unsafe fn clear_folios(
        &self,
        dsts: &[*mut u8],
        folio_size: usize,
        clear: ClearFn,
    ) -> BatchTiming {
        // SAFETY: forwarded contract; clears never read `src`.
        unsafe {
            self.run(dsts.len(), folio_size, Op::Clear(clear), |f| {
                (dsts[f], std::ptr::null())
            })
        }
    }

    /// Cuts `n` folios into pieces, hands them out round-robin, waits.
    ///
    /// # Safety
    /// `folio(f)` for `f < n` gives ranges valid for `op` over `folio_size`
    /// bytes, untouched by anyone else until this returns.
    unsafe fn run(
        &self,
        n: usize,
        folio_size: usize,
        op: Op,
        folio: impl Fn(usize) -> (*mut u8, *const u8),
    ) -> BatchTiming {
        let ch = self.channels.len();
        let split = if n >= ch { 1 } else { ch.div_ceil(n.max(1)) };
        let piece = folio_size
            .div_ceil(split)
            .next_multiple_of(page_size())
            .min(folio_size.max(1));
        let per_folio = folio_size.div_ceil(piece).max(1);
        let done = Arc::new(Completion::new(n, per_folio));
        let mut work: Vec<Vec<Piece>> = vec![Vec::new(); ch];
        let mut k = 0;
        for f in 0..n {
            let (dst, src) = folio(f);
            for p in 0..per_folio {
                let off = p * piece;
                work[k % ch].push(Piece {
                    // off < folio_size: inside the folio.
                    dst: dst.wrapping_add(off),
                    src: src.wrapping_add(off),
                    len: piece.min(folio_size - off),
                    folio: f,
                });
                k += 1;
            }
        }
        for (c, pieces) in self.channels.iter().zip(work) {
            if pieces.is_empty() {
                continue;
            }
            // A channel that cannot take work means "finish on the CPU",
            // never "give up with pieces still in flight elsewhere".
            if c.submit(pieces.clone(), op, done.clone()).is_err() {
                for p in &pieces {
                    // SAFETY: the caller's contract covers every piece.
                    unsafe { op.run(p) };
                    crate::arch::sfence();
                    done.piece_done(p.folio);
                }
            }
        }
        let total = done.wait();
        let first = Duration::from_nanos(done.first_ns.load(Ordering::Acquire));
        BatchTiming {
            first_folio: first.min(total),
            done: total,
        }
    }
}

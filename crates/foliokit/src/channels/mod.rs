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

mod cpu;

pub(crate) use cpu::{fix_placement, placement_fixed};
pub use cpu::{ChannelCpus, CpuChannel};

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use thiserror::Error;

use crate::batch::page_size;
use crate::pidlock::PidLock;
use crate::strategy::{ClearFn, CopyFn};

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
    /// did copy ([`Completion::piece_failed`]) instead of dying.
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
    /// ([`Completion::piece_done`]); a piece must never be run after that.
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

/// The batch id of pieces made by [`Piece::new`]: no [`Completion`] has it.
const NO_BATCH: u64 = 0;

/// A piece of a batch: `len` bytes of folio `folio`, or, for a run of
/// `folios` folios contiguous in memory, the whole run.
///
/// The fields are private so that only `unsafe` code can point a piece at
/// memory; the getters let a channel look at what it was given.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    dst: *mut u8,
    src: *const u8,
    len: usize,
    folio: usize,
    /// How many folios, from `folio` on, the piece covers whole (1 for a
    /// folio or a part of one).
    folios: usize,
    /// Byte offset within folio `folio` where the piece starts.
    offset: usize,
    /// The [`Completion`] this piece counts towards ([`NO_BATCH`]: none).
    batch: u64,
    /// Its number within that batch.
    seq: usize,
}

// SAFETY: a Piece is a work order; whoever made it keeps both ranges valid
// and unaliased until it is reported done (see `Piece::new`), so it may be
// run on any thread.
unsafe impl Send for Piece {}

impl Piece {
    /// A piece of `len` bytes of folio `folio`, copied from `src` to `dst`
    /// (or, for a clear, zeroing `dst`). It belongs to no pool batch:
    /// [`Completion::piece_done`] ignores it. Pools make their own pieces.
    ///
    /// # Safety
    /// Whoever makes a piece promises, for as long as the piece (or a copy
    /// of it) may be run with [`Op::run`] or submitted to a [`Channel`]:
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
    /// An eventfd posted when the batch ends (`InFlight::notify`): a
    /// duplicate of the caller's, so that posting it after the caller saw
    /// the batch end and closed its own never writes to a reused number.
    notify: Mutex<Option<OwnedFd>>,
    /// Asked by a channel before it starts each piece
    /// (`ChannelPool::submit_copy_mc_cut_when`): `true` cuts the batch
    /// short there. Set before any channel is given the batch.
    cut_when: OnceLock<CutWhen>,
    /// When `cut_when` first answered `true`, from the start (0: never):
    /// from then on every start is withdrawn.
    cut_ns: AtomicU64,
    /// Pieces taken back unstarted, by anyone.
    withdrawn: AtomicUsize,
}

/// A test a channel runs before it starts a piece of a batch (see
/// `ChannelPool::submit_copy_mc_cut_when`).
type CutWhen = Box<dyn Fn() -> bool + Send + Sync>;

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
    seq: usize,
}

impl Completion {
    /// A batch of `pieces` pieces where folio `f` is finished after
    /// `per_folio[f]` of them.
    fn new(per_folio: Vec<usize>, pieces: usize) -> Self {
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
            notify: Mutex::new(None),
            cut_when: OnceLock::new(),
            cut_ns: AtomicU64::new(0),
            withdrawn: AtomicUsize::new(0),
        }
    }

    /// Takes `piece` for running: `true` for exactly one caller per piece of
    /// this batch, `false` for every later one and for pieces of other
    /// batches. A channel that [`Channel::claims_pieces`] runs a piece only
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
        // Pieces with this batch's id were made by `ChannelPool::run` with
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

    /// Whether the batch is to be cut short: its `cut_when` test said so,
    /// now or before.
    fn cut_due(&self) -> bool {
        if self.cut_ns.load(Ordering::Relaxed) != 0 {
            return true;
        }
        let due = self.cut_when.get().is_some_and(|f| f());
        if due {
            let ns = self.start.elapsed().as_nanos().max(1) as u64;
            let _ = self
                .cut_ns
                .compare_exchange(0, ns, Ordering::Relaxed, Ordering::Relaxed);
        }
        due
    }

    /// A channel worker's turn at `piece`: withdrawn if the batch is being
    /// cut short and nobody took it yet, else [`Completion::run_claimed`].
    /// The test runs only for pieces still free, so a worker passing the
    /// pieces others took pays nothing for it.
    ///
    /// # Safety
    /// As [`Completion::run_claimed`].
    unsafe fn start_or_withdraw(&self, op: Op, piece: &Piece) -> bool {
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
            // After `done` is set: `InFlight::notify` sets the descriptor
            // before it reads `done`, so one of the two sees the other.
            if let Some(fd) = &*self.notify.lock().unwrap_or_else(|p| p.into_inner()) {
                crate::sys::event::Event::post_raw(fd.as_raw_fd());
            }
        }
    }

    /// Runs `piece` with `op` on this thread if this thread can claim it
    /// ([`Completion::claim`]), drains, and reports it; whether it ran.
    /// The one place a claimed piece runs: on a CPU channel's worker, on
    /// the caller for a refusing channel, and on a helper whose batch
    /// stalled. An `op` that panics aborts the process: the piece would
    /// stay claimed and never reported, so the batch could never end, or
    /// its caller would free memory still being written.
    ///
    /// # Safety
    /// The piece's ranges are valid for `op`, and touched by nobody else
    /// until it is reported (the [`Channel::submit`] contract).
    pub(crate) unsafe fn run_claimed(&self, op: Op, piece: &Piece) -> bool {
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

    fn is_done(&self) -> bool {
        *self.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `d` for the batch to end; whether it has.
    fn wait_for(&self, d: Duration) -> bool {
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let (done, _) = self
            .cv
            .wait_timeout_while(done, d, |done| !*done)
            .unwrap_or_else(|p| p.into_inner());
        *done
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

/// When a batch's first folio and last piece completed, from submission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchTiming {
    /// Until the first folio was wholly done: the latency a migration's
    /// first page waits (seed 001's first-folio figure).
    pub first_folio: Duration,
    /// Until every piece was done or had failed.
    pub done: Duration,
}

/// The shared pools of this process, by channel count.
type Pools = Vec<(usize, Arc<ChannelPool>)>;

static POOLS: PidLock<Pools> = PidLock::new();

/// This process's pools, under the lock (fresh in a forked child).
fn with_pools<R>(f: impl FnOnce(&mut Pools) -> R) -> R {
    f(POOLS.lock().get_or_insert_with(Vec::new))
}

/// The shared pools' own memory, `[lo, hi)` each: the pool, its list of
/// channels, each channel. Relocating it would leave the channels waiting
/// on a page only their own copy puts back.
pub(crate) fn shared_pool_ranges() -> Vec<(usize, usize)> {
    let range = |p: usize, n: usize| (p, p.saturating_add(n.max(1)));
    with_pools(|pools| {
        let mut out = Vec::new();
        for (_, pool) in pools.iter() {
            out.push(range(
                Arc::as_ptr(pool) as usize,
                std::mem::size_of::<ChannelPool>(),
            ));
            out.push(range(
                pool.channels.as_ptr() as usize,
                std::mem::size_of_val(pool.channels.as_slice()),
            ));
            out.extend(pool.channels.iter().map(|c| {
                range(
                    std::ptr::addr_of!(**c).cast::<u8>() as usize,
                    std::mem::size_of_val(&**c),
                )
            }));
        }
        out
    })
}

/// The process-wide CPU pool with `n` channels, created on first use and
/// kept: callers that copy or migrate repeatedly reuse the same workers
/// instead of spawning threads per call. Batches from several threads may
/// share it; each has its own completion.
///
/// Fork-safe: a child process gets pools of its own, with live workers,
/// instead of its parent's (whose threads it does not have), and does not
/// wait for the registry's lock if a parent thread held it at the fork.
pub fn shared(n: usize) -> Result<Arc<ChannelPool>, ChannelError> {
    let find = |pools: &[(usize, Arc<ChannelPool>)]| {
        pools.iter().find(|(k, _)| *k == n).map(|(_, p)| p.clone())
    };
    if let Some(p) = with_pools(|pools| find(pools)) {
        return Ok(p);
    }
    // Spawn the workers outside the lock, then publish, unless another
    // thread published first: then ours are dropped (joined), unlocked.
    let fresh = Arc::new(ChannelPool::cpu(n)?);
    let theirs = with_pools(|pools| {
        let theirs = find(pools);
        if theirs.is_none() {
            pools.push((n, fresh.clone()));
        }
        theirs
    });
    Ok(theirs.unwrap_or(fresh))
}

/// Starts the [`shared`] pool of `n` channels, and `n - 1` of the helper
/// threads that [`crate::mem::populate`] and the kernel migration path
/// share, now: afterwards, calls with at most `n` channels make no thread
/// (for a process about to forbid `clone` with seccomp, say). A helper that
/// cannot start leaves its share of that work to the calling thread.
pub fn start_shared(n: usize) -> Result<Arc<ChannelPool>, ChannelError> {
    let pool = shared(n)?;
    crate::helpers::start(n - 1);
    Ok(pool)
}

/// Forgets the [`shared`] pools: their worker threads end once the last
/// batch or caller holding a pool lets go of it; the next [`shared`] call
/// starts new ones. The helper threads of [`crate::mem::populate`] and the
/// kernel migration path end too, once they finish the work they are in.
/// For an application that wants no foliokit threads while it does
/// something else (or before it exits).
pub fn release_shared() {
    crate::helpers::release();
    let released = with_pools(std::mem::take);
    // Dropped outside the lock: the last drop joins the workers.
    drop(released);
}

/// Runs `f` while holding the locks of the [`shared`] pools and of the
/// helper threads: a test hook, for forking while another thread holds
/// them. `f` must not call [`shared`], populate or migrate itself (it would
/// wait for its own thread forever).
#[doc(hidden)]
pub fn hold_shared_lock<R>(f: impl FnOnce() -> R) -> R {
    let _pools = POOLS.lock();
    let _helpers = crate::helpers::hold_lock();
    f()
}

/// A set of channels a batch is spread across.
pub struct ChannelPool {
    channels: Vec<Box<dyn Channel>>,
    /// Blocking batches below this many bytes run on the calling thread
    /// ([`crate::params::CHANNEL_MIN_BATCH_BYTES`] for CPU pools; 0, never,
    /// for pools of other engines, whose owners decide).
    inline_below: usize,
}

/// Aborts the process if a batch unwinds while pieces may be in flight.
///
/// A panic out of a channel's `submit` (or a copy function run on the
/// calling thread) would otherwise return from `copy_folios` while other
/// channels still write into the caller's memory, which the caller then
/// frees. No pieces can be recalled, so the only sound way out is to stop.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        use std::io::Write;
        // Best effort: the abort must happen even if stderr is gone.
        let _ = writeln!(
            std::io::stderr(),
            "foliokit: a channel batch panicked with pieces in flight; aborting"
        );
        std::process::abort();
    }
}

/// Folio `f`'s (destination, source) of a copy batch, once the two lists
/// are known to be equally long.
fn copy_pairs<'a>(
    dsts: &'a [*mut u8],
    srcs: &'a [*const u8],
) -> Result<impl Fn(usize) -> (*mut u8, *const u8) + 'a, ChannelError> {
    if dsts.len() != srcs.len() {
        return Err(ChannelError::LengthMismatch {
            dsts: dsts.len(),
            srcs: srcs.len(),
        });
    }
    Ok(move |f| (dsts[f], srcs[f]))
}

/// Folio `f`'s destination of a clear batch (clears never read a source).
fn clear_pairs(dsts: &[*mut u8]) -> impl Fn(usize) -> (*mut u8, *const u8) + '_ {
    move |f| (dsts[f], std::ptr::null())
}

impl ChannelPool {
    /// `n` CPU channels, pinned as [`crate::Config::channel_cpus`] says.
    pub fn cpu(n: usize) -> Result<Self, ChannelError> {
        if n == 0 {
            return Err(ChannelError::Zero);
        }
        if n > crate::params::MAX_CHANNELS {
            return Err(ChannelError::TooMany {
                asked: n,
                most: crate::params::MAX_CHANNELS,
            });
        }
        Ok(ChannelPool {
            channels: (0..n)
                .map(|i| Box::new(CpuChannel::new(i)) as Box<dyn Channel>)
                .collect(),
            inline_below: crate::params::CHANNEL_MIN_BATCH_BYTES,
        })
    }

    /// A pool of other engines.
    pub fn of(channels: Vec<Box<dyn Channel>>) -> Result<Self, ChannelError> {
        if channels.is_empty() {
            return Err(ChannelError::Zero);
        }
        Ok(ChannelPool {
            channels,
            inline_below: 0,
        })
    }

    /// Channels in the pool (at least 1).
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    /// Always false: a pool has at least one channel.
    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    /// Copies folio `i` from `srcs[i]` to `dsts[i]` for every `i`, spread
    /// across the channels in contiguous shares (channel `c` gets folios
    /// `c*n/ch .. (c+1)*n/ch`); within a share, the first folio is a piece
    /// of its own (so `first_folio` is exact) and folios adjacent in both
    /// source and destination are merged into one piece. When there are
    /// fewer folios than channels each folio is split so every channel
    /// gets work. Blocks until
    /// every byte is copied and visible; pieces a channel refuses are copied
    /// on the calling thread. On a pool of CPU channels ([`ChannelPool::cpu`],
    /// [`shared`]) a batch smaller than
    /// [`crate::params::CHANNEL_MIN_BATCH_BYTES`] is copied on the calling
    /// thread outright: waking the workers would cost more than they save.
    ///
    /// A zero `folio_size` ([`ChannelError::ZeroFolio`]) or lists of
    /// different lengths ([`ChannelError::LengthMismatch`]) are refused
    /// before anything is copied.
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
    ) -> Result<BatchTiming, ChannelError> {
        let folio = copy_pairs(dsts, srcs)?;
        // SAFETY: forwarded contract; `copy_pairs` checked the lengths.
        unsafe { self.run(dsts.len(), folio_size, Op::Copy(copy), folio) }
    }

    /// Zeroes folio `i` at `dsts[i]` for every `i`, spread as
    /// [`ChannelPool::copy_folios`] spreads copies. A zero `folio_size` is
    /// refused ([`ChannelError::ZeroFolio`]) before anything is written.
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
    ) -> Result<BatchTiming, ChannelError> {
        // SAFETY: forwarded contract; clears never read `src`.
        unsafe { self.run(dsts.len(), folio_size, Op::Clear(clear), clear_pairs(dsts)) }
    }

    /// Starts copying folio `i` from `srcs[i]` to `dsts[i]` for every `i`,
    /// spread as [`ChannelPool::copy_folios`] spreads it, and returns at
    /// once with a handle: poll it, wait for it, see which folios are done.
    /// Refused before anything starts: a zero `folio_size`, lists of
    /// different lengths.
    ///
    /// # Safety
    /// As [`ChannelPool::copy_folios`], for as long as the batch is in
    /// flight: until [`InFlight::wait`] or an [`InFlight::try_wait`] that returns
    /// `Some` — dropping the handle waits too. A handle that is leaked
    /// (`mem::forget`) leaves the channels writing: the ranges must then
    /// stay valid for the life of the process.
    pub unsafe fn submit_copy(
        &self,
        dsts: &[*mut u8],
        srcs: &[*const u8],
        folio_size: usize,
        copy: CopyFn,
    ) -> Result<InFlight<'_>, ChannelError> {
        let folio = copy_pairs(dsts, srcs)?;
        // SAFETY: forwarded contract; `copy_pairs` checked the lengths.
        unsafe { self.start(dsts.len(), folio_size, Op::Copy(copy), folio, None) }
    }

    /// Starts copying folio `i` from `srcs[i]` to `dsts[i]` for every `i`
    /// with the machine-check-safe routine `copy` ([`crate::mc::mc_routine`]),
    /// as [`ChannelPool::submit_copy`] does. A piece whose source raises
    /// SIGBUS (poison, a truncated file) ends short and is listed in
    /// [`BatchOutcome::failed`] with the bytes it did copy; its folios do
    /// not count as done, and nothing finishes them.
    ///
    /// # Safety
    /// As [`ChannelPool::submit_copy`], except that source pages may raise
    /// SIGBUS (see [`crate::copy_mc_raw`]).
    pub unsafe fn submit_copy_mc(
        &self,
        dsts: &[*mut u8],
        srcs: &[*const u8],
        folio_size: usize,
        copy: crate::mc::McCopyFn,
    ) -> Result<InFlight<'_>, ChannelError> {
        let folio = copy_pairs(dsts, srcs)?;
        // SAFETY: forwarded contract; `copy_pairs` checked the lengths.
        unsafe { self.start(dsts.len(), folio_size, Op::CopyMc(copy), folio, None) }
    }

    /// [`ChannelPool::submit_copy_mc`] for a caller that sleeps while the
    /// batch runs but must not wait for all of it once something needs it
    /// (a fault to serve, a fork waiting for the caller to park): before
    /// starting each piece a CPU channel asks `due`, and once it answers
    /// `true` that piece and every later unstarted one are taken back as
    /// by [`InFlight::cancel_unstarted`]. The channels then stop at their
    /// next piece and free their CPUs, even where the caller has no CPU to
    /// run on and cut the batch itself. `due` is in place before any
    /// channel starts: a caller preempted by the very channels it woke is
    /// covered from the first piece. Pieces are merged only up to
    /// [`crate::params::CHANNEL_CUT_PIECE_BYTES`], which bounds what a cut
    /// waits for. `due` runs on the channels' threads, once per piece, so
    /// it must be cheap and must not block.
    ///
    /// # Safety
    /// As [`ChannelPool::submit_copy_mc`].
    pub(crate) unsafe fn submit_copy_mc_cut_when(
        &self,
        dsts: &[*mut u8],
        srcs: &[*const u8],
        folio_size: usize,
        copy: crate::mc::McCopyFn,
        due: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Result<InFlight<'_>, ChannelError> {
        let folio = copy_pairs(dsts, srcs)?;
        let due: CutWhen = Box::new(due);
        // SAFETY: forwarded contract; `copy_pairs` checked the lengths.
        unsafe { self.start(dsts.len(), folio_size, Op::CopyMc(copy), folio, Some(due)) }
    }

    /// Starts zeroing folio `i` at `dsts[i]` for every `i`; see
    /// [`ChannelPool::submit_copy`].
    ///
    /// # Safety
    /// As [`ChannelPool::clear_folios`], for as long as the batch is in
    /// flight (see [`ChannelPool::submit_copy`]).
    pub unsafe fn submit_clear(
        &self,
        dsts: &[*mut u8],
        folio_size: usize,
        clear: ClearFn,
    ) -> Result<InFlight<'_>, ChannelError> {
        // SAFETY: forwarded contract; clears never read `src`.
        unsafe {
            self.start(
                dsts.len(),
                folio_size,
                Op::Clear(clear),
                clear_pairs(dsts),
                None,
            )
        }
    }

    /// Runs a batch to the end: pieces a channel failed are finished on the
    /// calling thread, so every byte is done when this returns.
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
    ) -> Result<BatchTiming, ChannelError> {
        if folio_size == 0 {
            return Err(ChannelError::ZeroFolio);
        }
        if n > 0 && n.saturating_mul(folio_size) < self.inline_below {
            let t0 = Instant::now();
            let mut first = Duration::ZERO;
            for f in 0..n {
                let (dst, src) = folio(f);
                let p = Piece {
                    dst,
                    src,
                    len: folio_size,
                    folio: f,
                    folios: 1,
                    offset: 0,
                    batch: NO_BATCH,
                    seq: f,
                };
                // SAFETY: forwarded contract: folio f's ranges are valid for
                // `op` and untouched by anyone else until this returns.
                unsafe { op.run(&p) };
                if f == 0 {
                    first = t0.elapsed();
                }
            }
            // The ops drain their own streaming stores; this orders any a
            // caller-supplied op left.
            crate::arch::sfence();
            return Ok(BatchTiming {
                first_folio: first,
                done: t0.elapsed(),
            });
        }
        // SAFETY: forwarded contract; the batch is waited for below.
        let batch = unsafe { self.start(n, folio_size, op, folio, None) }?;
        Ok(batch.finish())
    }

    /// Cuts `n` folios into pieces, hands them to the channels, returns the
    /// batch in flight.
    ///
    /// # Safety
    /// `folio(f)` for `f < n` gives ranges valid for `op` over `folio_size`
    /// bytes, untouched by anyone else while the batch is in flight.
    unsafe fn start(
        &self,
        n: usize,
        folio_size: usize,
        op: Op,
        folio: impl Fn(usize) -> (*mut u8, *const u8),
        cut_when: Option<CutWhen>,
    ) -> Result<InFlight<'_>, ChannelError> {
        if folio_size == 0 {
            return Err(ChannelError::ZeroFolio);
        }
        if n == 0 {
            return Ok(InFlight {
                _pool: self,
                done: Arc::new(Completion::new(Vec::new(), 0)),
                op,
                pieces: Vec::new(),
                claimable: Vec::new(),
                outcome: None,
            });
        }
        let ch = self.channels.len();
        let mut work: Vec<Vec<Piece>> = vec![Vec::new(); ch];
        // Every piece by its number (made in that order), to finish failed
        // ones.
        let mut all: Vec<Piece> = Vec::new();
        let done = if n >= ch {
            // Each channel gets a contiguous share of the folios (channel c
            // folios c*n/ch .. (c+1)*n/ch), so it streams through memory
            // instead of hopping from folio to folio. Its first folio is a
            // piece of its own: the batch's first folio then completes at
            // its true time (the earliest folio to finish is some channel's
            // first). The rest of the share goes in as few pieces as the
            // memory allows: folios adjacent in both source and
            // destination are merged into runs of up to CHANNEL_PIECE_BYTES.
            // Channels that claim pieces are offered the others' shares too,
            // after their own (from the far end), so one whose CPU is busy
            // elsewhere holds the batch up by one piece at most.
            // A batch that can be cut short is cut between pieces: its
            // pieces are smaller, so a cut waits for less.
            let bytes = if cut_when.is_some() {
                crate::params::CHANNEL_CUT_PIECE_BYTES
            } else {
                crate::params::CHANNEL_PIECE_BYTES
            };
            let most = (bytes / folio_size).max(1);
            let mut pieces = Vec::new();
            for c in 0..ch {
                let (lo, hi) = (c * n / ch, (c + 1) * n / ch);
                let mut f = lo;
                while f < hi {
                    let (dst, src) = folio(f);
                    let mut end = f + 1;
                    if f != lo {
                        while end < hi && end - f < most {
                            let (d, s) = folio(end);
                            let step = (end - f) * folio_size;
                            let adjacent = d == dst.wrapping_add(step)
                                && (src.is_null() && s.is_null()
                                    || !src.is_null() && s == src.wrapping_add(step));
                            if !adjacent {
                                break;
                            }
                            end += 1;
                        }
                    }
                    pieces.push((c, dst, src, f, end - f));
                    f = end;
                }
            }
            let done = Arc::new(Completion::new(vec![1; n], pieces.len()));
            for (seq, (c, dst, src, f, folios)) in pieces.into_iter().enumerate() {
                let p = Piece {
                    dst,
                    src,
                    len: folios * folio_size,
                    folio: f,
                    folios,
                    offset: 0,
                    batch: done.id,
                    seq,
                };
                all.push(p);
                work[c].push(p);
            }
            done
        } else {
            // Fewer folios than channels: split each folio so every channel
            // gets work, whole pages per piece where possible.
            let split = ch.div_ceil(n);
            let piece = folio_size
                .div_ceil(split)
                .checked_next_multiple_of(page_size())
                .unwrap_or(folio_size)
                .min(folio_size);
            let per_folio = folio_size.div_ceil(piece);
            let done = Arc::new(Completion::new(vec![per_folio; n], n * per_folio));
            let mut k = 0;
            for f in 0..n {
                let (dst, src) = folio(f);
                for p in 0..per_folio {
                    let off = p * piece;
                    let one = Piece {
                        // off < folio_size: inside the folio.
                        dst: dst.wrapping_add(off),
                        // A clear's null source stays null.
                        src: if src.is_null() {
                            src
                        } else {
                            src.wrapping_add(off)
                        },
                        len: piece.min(folio_size - off),
                        folio: f,
                        folios: 1,
                        offset: off,
                        batch: done.id,
                        seq: k,
                    };
                    all.push(one);
                    work[k % ch].push(one);
                    k += 1;
                }
            }
            done
        };
        if let Some(due) = cut_when {
            // Fresh, so unset: `set` cannot fail.
            let _ = done.cut_when.set(due);
        }
        let claims: Vec<bool> = self.channels.iter().map(|c| c.claims_pieces()).collect();
        // Pieces whose own channel claims before it runs: a helper whose
        // batch stalls may run them itself (see `InFlight::unstall`).
        let mut claimable = vec![false; all.len()];
        for (c, own) in work.iter().enumerate() {
            for p in own {
                claimable[p.seq] = claims[c];
            }
        }
        let offered: Vec<Vec<Piece>> = (0..ch)
            .map(|c| {
                let mut list = work[c].clone();
                if claims[c] {
                    for o in (0..ch).filter(|&o| o != c && claims[o]) {
                        list.extend(work[o].iter().rev());
                    }
                }
                list
            })
            .collect();
        // From the first submission until every piece is reported, leaving
        // this function by a panic would free memory under the channels.
        let in_flight = AbortOnUnwind;
        // A batch started on a channel's worker (by a caller's copy
        // function that copies again) is run right here: queued, it could
        // wait for this very worker, which waits for it (see
        // `crate::worker`: a channel never waits for a channel).
        let nested = crate::worker::on_channel();
        for ((c, own), list) in self.channels.iter().zip(work).zip(offered) {
            if own.is_empty() {
                continue;
            }
            let submitted = if nested {
                Err(ChannelError::Stopped(c.name().to_string()))
            } else {
                // SAFETY: the caller's contract covers every piece until
                // this function returns, and it returns only after
                // `done.wait()`, i.e. after every piece was reported done.
                // A piece offered to several channels is run only by the
                // one that claims it.
                unsafe { c.submit(list, op, done.clone()) }
            };
            // A channel that cannot take work means "finish on the CPU",
            // never "give up with pieces still in flight elsewhere". Its
            // own pieces are claimed first: another channel may have taken
            // some already.
            if submitted.is_err() {
                for p in &own {
                    // SAFETY: the caller's contract covers every piece, and
                    // a refusing channel touches none of them.
                    unsafe { done.run_claimed(op, p) };
                }
            }
        }
        // From here the handle owns the batch: dropping it waits.
        std::mem::forget(in_flight);
        Ok(InFlight {
            _pool: self,
            done,
            op,
            pieces: all,
            claimable,
            outcome: None,
        })
    }
}

/// A batch in flight on a [`ChannelPool`] ([`ChannelPool::submit_copy`],
/// [`ChannelPool::submit_clear`]). Dropping it waits for the batch: the
/// channels may still be writing into the caller's memory. Do not carry
/// one across `fork()`: the child has no worker threads to finish it, so
/// its copy would wait forever (the parent's is unaffected).
///
/// Formerly `Batch`: the handle is not the batch, and relocation has
/// batches of its own.
pub struct InFlight<'p> {
    _pool: &'p ChannelPool,
    done: Arc<Completion>,
    op: Op,
    /// Every piece, by its number.
    pieces: Vec<Piece>,
    /// By piece number: its channel claims pieces before running them.
    claimable: Vec<bool>,
    outcome: Option<BatchOutcome>,
}

/// The old name of [`InFlight`], kept so code written against it builds.
#[doc(hidden)]
pub type Batch<'p> = InFlight<'p>;

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

impl InFlight<'_> {
    /// Folios in the batch.
    pub fn folios(&self) -> usize {
        self.done.per_folio.len()
    }

    /// Whether folio `i` is done: every byte of it copied (or cleared) and
    /// visible to this thread. `false` for a folio a failed piece covers,
    /// and for `i` out of range.
    pub fn folio_done(&self, i: usize) -> bool {
        self.done
            .per_folio
            .get(i)
            .is_some_and(|left| left.load(Ordering::Acquire) == 0)
    }

    /// The outcome if the batch has ended, without blocking.
    pub fn try_wait(&mut self) -> Option<BatchOutcome> {
        if self.outcome.is_none() && self.done.is_done() {
            self.outcome = Some(self.collect());
        }
        self.outcome.clone()
    }

    /// Blocks until the batch ends.
    pub fn wait(mut self) -> BatchOutcome {
        self.wait_inner()
    }

    fn wait_inner(&mut self) -> BatchOutcome {
        if let Some(o) = &self.outcome {
            return o.clone();
        }
        self.done.wait();
        let o = self.collect();
        self.outcome = Some(o.clone());
        o
    }

    fn collect(&self) -> BatchOutcome {
        let total = match self.done.done_ns.load(Ordering::Acquire) {
            // An empty batch is done at once.
            0 => Duration::ZERO,
            ns => Duration::from_nanos(ns),
        };
        let first = Duration::from_nanos(self.done.first_ns.load(Ordering::Acquire));
        let mut failed = self
            .done
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

    /// Waits, then finishes on this thread what channels failed: the
    /// blocking calls' promise that every byte is done.
    fn finish(mut self) -> BatchTiming {
        if crate::worker::on_helper() {
            self.unstall();
        }
        let outcome = self.wait_inner();
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
            timing.done = self.done.start.elapsed();
        }
        timing
    }

    /// Runs, on the calling thread, the pieces no channel has taken yet
    /// (from the batch's end, where the channels take last), then returns;
    /// [`InFlight::wait`] afterwards waits only for pieces a channel is
    /// running. For a caller with its own CPU time to give, where channels
    /// share CPUs with other busy threads: a channel not scheduled yet then
    /// holds up nothing.
    pub(crate) fn help(&self) {
        for (p, _) in self
            .pieces
            .iter()
            .zip(&self.claimable)
            .rev()
            .filter(|(_, c)| **c)
        {
            // SAFETY: the batch's contract covers every piece's ranges
            // until it ends, which is not before this handle is dropped.
            unsafe { self.done.run_claimed(self.op, p) };
        }
    }

    /// Cuts the batch short: the pieces no channel has started are taken
    /// back and never run (their folios stay not done, and are not in
    /// [`BatchOutcome::failed`]), so the batch ends when the pieces in
    /// progress do. Returns how many were taken back. Only pieces of
    /// channels that claim pieces can be.
    pub(crate) fn cancel_unstarted(&self) -> usize {
        self.pieces
            .iter()
            .zip(&self.claimable)
            .filter(|(p, c)| **c && self.done.withdraw(p))
            .count()
    }

    /// Whether pieces were taken back, by [`InFlight::cancel_unstarted`]
    /// or by channels whose cut test said so
    /// (`ChannelPool::submit_copy_mc_cut_when`).
    pub(crate) fn was_cut(&self) -> bool {
        self.done.withdrawn.load(Ordering::Relaxed) > 0
    }

    /// When a channel's cut test first answered `true`, if it did: what
    /// waited on the cut waited from then, however late its caller woke.
    pub(crate) fn cut_by_channels_at(&self) -> Option<Instant> {
        match self.done.cut_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(self.done.start + Duration::from_nanos(ns)),
        }
    }

    /// Posts `event` when the batch ends, for a caller that waits on it
    /// beside other descriptors; whether the batch has ended already (then
    /// it may not be posted).
    pub(crate) fn notify(&self, event: &crate::sys::event::Event) -> std::io::Result<bool> {
        let dup = event.try_clone()?;
        *self.done.notify.lock().unwrap_or_else(|p| p.into_inner()) = Some(dup);
        Ok(self.done.is_done())
    }

    /// [`InFlight::wait`] that keeps the handle, to ask
    /// [`InFlight::folio_done`] afterwards.
    pub(crate) fn wait_in_place(&mut self) -> BatchOutcome {
        self.wait_inner()
    }

    /// Waits for the batch, and whenever its channels finish no piece for
    /// [`crate::params::CHANNEL_STALL`], runs on this thread the pieces no
    /// channel has started (of channels that claim pieces; others may run
    /// any piece they were given). Only a helper waits so: relocation's
    /// loop, which puts back pages that other threads, a channel's worker
    /// among them, may be waiting for. That worker cannot start this
    /// batch's pieces queued behind its wait, so waiting for it would close
    /// a circle; pieces a channel did start copy relocation's own staging
    /// memory and finish (see `crate::worker`).
    fn unstall(&self) {
        let mut left = self.done.remaining.load(Ordering::Acquire);
        while !self.done.wait_for(crate::params::CHANNEL_STALL) {
            let now = self.done.remaining.load(Ordering::Acquire);
            if now < left {
                left = now;
                continue;
            }
            for (p, _) in self.pieces.iter().zip(&self.claimable).filter(|(_, c)| **c) {
                // SAFETY: the batch's contract covers every piece's ranges
                // until it ends, which is not before this returns.
                unsafe { self.done.run_claimed(self.op, p) };
            }
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // The channels may still be writing into the caller's memory.
        self.done.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Set while [`held_copy`] keeps its worker; set to false to let go.
    static HOLD: AtomicBool = AtomicBool::new(false);
    static HELD: AtomicBool = AtomicBool::new(false);
    /// Taken by each test that holds a worker with [`held_copy`].
    static HOLDING: Mutex<()> = Mutex::new(());

    /// Holds `pool`'s one channel with a copy of `src` into `dst` until
    /// [`HOLD`] is cleared.
    fn hold<'p>(pool: &'p ChannelPool, dst: &mut [u8], src: &[u8]) -> InFlight<'p> {
        HELD.store(false, Ordering::SeqCst);
        HOLD.store(true, Ordering::SeqCst);
        // SAFETY: the caller keeps both buffers until the handle is waited
        // for.
        let other =
            unsafe { pool.submit_copy(&[dst.as_mut_ptr()], &[src.as_ptr()], src.len(), held_copy) }
                .unwrap();
        while !HELD.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        other
    }

    /// A copy that holds its thread until [`HOLD`] is cleared, as a copy
    /// from a page relocation has out waits for relocation.
    ///
    /// # Safety
    /// As any copy: both ranges valid for `len` bytes and disjoint.
    unsafe fn held_copy(dst: *mut u8, src: *const u8, len: usize) {
        HELD.store(true, Ordering::SeqCst);
        while HOLD.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }

    /// # Safety
    /// As any copy.
    unsafe fn plain_copy(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }

    #[test]
    fn a_helper_runs_the_pieces_of_a_channel_held_up_elsewhere() {
        if crate::helpers::start(1) == 0 {
            eprintln!("SKIP: no helper thread could be started here");
            return;
        }
        let _one = HOLDING.lock().unwrap_or_else(|p| p.into_inner());
        // One channel, held by another batch's copy: the helper's batch
        // (big enough for the workers) is queued behind it.
        let pool = ChannelPool::cpu(1).unwrap();
        let len = 2 * crate::params::CHANNEL_MIN_BATCH_BYTES;
        let (a_src, mut a_dst) = (vec![1u8; PAGE_BYTES], vec![0u8; PAGE_BYTES]);
        let (src, mut dst) = (vec![7u8; len], vec![0u8; len]);
        let other = hold(&pool, &mut a_dst, &a_src);
        let (d, s) = (dst.as_mut_ptr() as usize, src.as_ptr() as usize);
        let (tx, rx) = std::sync::mpsc::channel();
        let ran = std::thread::scope(|scope| {
            let pool = &pool;
            scope.spawn(move || {
                let ran = crate::helpers::on_helper(|| {
                    // SAFETY: one folio inside live vectors, untouched
                    // until the scope ends.
                    unsafe { pool.copy_folios(&[d as *mut u8], &[s as *const u8], len, plain_copy) }
                        .is_ok()
                });
                let _ = tx.send(ran);
            });
            // Without the helper's own run it would wait for the held
            // channel: let go after a while either way, so a failure ends.
            let ran = rx.recv_timeout(Duration::from_secs(30));
            HOLD.store(false, Ordering::SeqCst);
            ran
        });
        other.wait();
        assert_eq!(
            ran,
            Ok(Some(true)),
            "the helper waited for the held channel"
        );
        assert!(dst == src && a_dst == a_src);
    }

    #[test]
    fn a_batch_cut_short_gives_back_its_unstarted_pieces_and_posts_its_end() {
        use std::os::fd::AsRawFd;
        let _one = HOLDING.lock().unwrap_or_else(|p| p.into_inner());
        let pool = ChannelPool::cpu(1).unwrap();
        let (a_src, mut a_dst) = (vec![1u8; PAGE_BYTES], vec![0u8; PAGE_BYTES]);
        let other = hold(&pool, &mut a_dst, &a_src);
        // Lets the held copy go however this test ends (before `other` is
        // dropped, which waits for it): a failed check fails, never hangs.
        struct Release;
        impl Drop for Release {
            fn drop(&mut self) {
                HOLD.store(false, Ordering::SeqCst);
            }
        }
        let release = Release;
        // Queued behind the held copy: no piece of it can have started.
        let folio = 64 << 10;
        let src = vec![7u8; 4 * folio];
        let mut dst = vec![0u8; 4 * folio];
        let dsts: Vec<*mut u8> = (0..4).map(|i| dst[i * folio..].as_mut_ptr()).collect();
        let srcs: Vec<*const u8> = (0..4).map(|i| src[i * folio..].as_ptr()).collect();
        let ended = crate::sys::event::Event::new().unwrap();
        // SAFETY: both vectors outlive the handle, waited for below.
        let mut cut = unsafe { pool.submit_copy(&dsts, &srcs, folio, plain_copy) }.unwrap();
        assert_eq!(cut.notify(&ended).ok(), Some(false));
        assert!(cut.cancel_unstarted() > 0);
        // Ends without the held channel, which never runs a piece of it.
        let out = cut.wait_in_place();
        assert!(out.failed.is_empty());
        assert!((0..4).all(|i| !cut.folio_done(i)));
        let [posted] = crate::sys::poll::readable([ended.as_raw_fd()], Some(Duration::ZERO));
        assert!(posted, "the end was not posted");
        assert_eq!(cut.cancel_unstarted(), 0);
        drop(cut);
        drop(release);
        other.wait();
        assert!(dst.iter().all(|&b| b == 0), "a withdrawn piece ran");
        assert_eq!(a_dst, a_src);
    }

    /// Set by [`cutting_copy`]: the cut test of the batch below reads it.
    static CUT: AtomicBool = AtomicBool::new(false);

    /// An mc copy (it returns the bytes it did not copy: none) that makes
    /// the cut test answer yes.
    ///
    /// # Safety
    /// As any copy.
    unsafe fn cutting_copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        CUT.store(true, Ordering::SeqCst);
        0
    }

    #[test]
    fn a_channel_whose_cut_test_says_so_stops_at_the_next_folio() {
        let _one = HOLDING.lock().unwrap_or_else(|p| p.into_inner());
        CUT.store(false, Ordering::SeqCst);
        // One channel: it runs the first folio's piece, whose copy makes
        // the test answer yes, and must start no other. Adjacent folios,
        // which an uncut batch would merge into one piece.
        let pool = ChannelPool::cpu(1).unwrap();
        let folio = 64 << 10;
        let src = vec![7u8; 4 * folio];
        let mut dst = vec![0u8; 4 * folio];
        let dsts: Vec<*mut u8> = (0..4).map(|i| dst[i * folio..].as_mut_ptr()).collect();
        let srcs: Vec<*const u8> = (0..4).map(|i| src[i * folio..].as_ptr()).collect();
        let due = || CUT.load(Ordering::SeqCst);
        // SAFETY: both vectors outlive the handle, waited for below; the
        // sources are plain memory (nothing can fault).
        let mut b = unsafe { pool.submit_copy_mc_cut_when(&dsts, &srcs, folio, cutting_copy, due) }
            .unwrap();
        let out = b.wait_in_place();
        assert!(out.failed.is_empty());
        assert!(b.was_cut());
        assert!(b.folio_done(0));
        assert!(
            (1..4).all(|i| !b.folio_done(i)),
            "a piece ran after the cut"
        );
        drop(b);
        assert!(dst[..folio].iter().all(|&x| x == 7));
        assert!(
            dst[folio..].iter().all(|&x| x == 0),
            "a withdrawn piece ran"
        );
    }

    /// Pieces [`counting_copy`] ran; the cut test of the batch below
    /// answers yes from [`CUT_AFTER`] of them on.
    static RAN: AtomicUsize = AtomicUsize::new(0);
    static CUT_AFTER: AtomicUsize = AtomicUsize::new(0);

    /// An mc copy that counts its runs.
    ///
    /// # Safety
    /// As any copy.
    unsafe fn counting_copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        RAN.fetch_add(1, Ordering::SeqCst);
        0
    }

    #[test]
    fn a_folio_is_done_exactly_when_copied_however_channels_and_caller_cut() {
        let _one = HOLDING.lock().unwrap_or_else(|p| p.into_inner());
        // Two channels cut by their test after k pieces while the caller
        // cuts too, at some point: whatever interleaving results, a folio
        // reported done holds every byte, and one not done holds none (a
        // withdrawn piece never ran, a started one finished).
        let pool = ChannelPool::cpu(2).unwrap();
        let (folio, n) = (crate::params::CHANNEL_CUT_PIECE_BYTES, 12);
        let src: Vec<u8> = (0..n * folio).map(|i| (i % 251) as u8 + 1).collect();
        let mut dst = vec![0u8; n * folio];
        for k in 0..n {
            RAN.store(0, Ordering::SeqCst);
            CUT_AFTER.store(k, Ordering::SeqCst);
            dst.fill(0);
            let dsts: Vec<*mut u8> = (0..n).map(|i| dst[i * folio..].as_mut_ptr()).collect();
            let srcs: Vec<*const u8> = (0..n).map(|i| src[i * folio..].as_ptr()).collect();
            let due = || RAN.load(Ordering::SeqCst) >= CUT_AFTER.load(Ordering::SeqCst);
            // SAFETY: both vectors outlive the handle, waited for below;
            // plain memory, nothing can fault.
            let mut b =
                unsafe { pool.submit_copy_mc_cut_when(&dsts, &srcs, folio, counting_copy, due) }
                    .unwrap();
            if k % 2 == 1 {
                while RAN.load(Ordering::SeqCst) < k / 2 && b.try_wait().is_none() {
                    std::hint::spin_loop();
                }
                b.cancel_unstarted();
            }
            let out = b.wait_in_place();
            assert!(out.failed.is_empty());
            let done: Vec<bool> = (0..n).map(|i| b.folio_done(i)).collect();
            // One piece per folio at this size: each ran piece is a folio.
            assert_eq!(
                done.iter().filter(|&&d| d).count(),
                RAN.load(Ordering::SeqCst)
            );
            drop(b);
            for (i, d) in done.iter().enumerate() {
                let (got, want) = (&dst[i * folio..][..folio], &src[i * folio..][..folio]);
                if *d {
                    assert!(got == want, "k={k}: folio {i} done but not copied");
                } else {
                    assert!(
                        got.iter().all(|&x| x == 0),
                        "k={k}: folio {i} copied but not done"
                    );
                }
            }
        }
    }

    const PAGE_BYTES: usize = 4096;
}

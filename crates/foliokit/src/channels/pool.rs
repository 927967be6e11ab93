//! A pool of channels: a batch's folios placed into pieces
//! ([`super::placement`]), handed to the channels, and its handle returned.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::op::NO_BATCH;
use super::placement::{self, Shape};
use super::BatchTiming;
use super::{Channel, ChannelError, Completion, CpuChannel, InFlight, Op, Piece, Policy};
use crate::batch::page_size;
use crate::strategy::{ClearFn, CopyFn};

/// A set of channels a batch is spread across.
pub struct ChannelPool {
    pub(super) channels: Vec<Box<dyn Channel>>,
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
    /// [`super::shared`]) a batch smaller than
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
        // SAFETY: forwarded contract.
        unsafe { self.copy_folios_with(dsts, srcs, folio_size, copy, Policy::default()) }
    }

    /// [`ChannelPool::copy_folios`] run as its caller's `policy` says
    /// (e.g. running the pieces stalled channels have not started).
    ///
    /// # Safety
    /// As [`ChannelPool::copy_folios`].
    pub(crate) unsafe fn copy_folios_with(
        &self,
        dsts: &[*mut u8],
        srcs: &[*const u8],
        folio_size: usize,
        copy: CopyFn,
        policy: Policy,
    ) -> Result<BatchTiming, ChannelError> {
        let folio = copy_pairs(dsts, srcs)?;
        // SAFETY: forwarded contract; `copy_pairs` checked the lengths.
        unsafe { self.run(dsts.len(), folio_size, Op::Copy(copy), folio, policy) }
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
        unsafe {
            self.run(
                dsts.len(),
                folio_size,
                Op::Clear(clear),
                clear_pairs(dsts),
                Policy::default(),
            )
        }
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
        unsafe {
            self.start(
                dsts.len(),
                folio_size,
                Op::Copy(copy),
                folio,
                Policy::default(),
            )
        }
    }

    /// Starts copying folio `i` from `srcs[i]` to `dsts[i]` for every `i`
    /// with the machine-check-safe routine `copy` ([`crate::mc::mc_routine`]),
    /// as [`ChannelPool::submit_copy`] does. A piece whose source raises
    /// SIGBUS (poison, a truncated file) ends short and is listed in
    /// [`super::BatchOutcome::failed`] with the bytes it did copy; its folios do
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
        unsafe {
            self.start(
                dsts.len(),
                folio_size,
                Op::CopyMc(copy),
                folio,
                Policy::default(),
            )
        }
    }

    /// [`ChannelPool::submit_copy_mc`] run as its caller's `policy` says
    /// (when to cut it short, what to post when it ends).
    ///
    /// # Safety
    /// As [`ChannelPool::submit_copy_mc`].
    pub(crate) unsafe fn submit_copy_mc_with(
        &self,
        dsts: &[*mut u8],
        srcs: &[*const u8],
        folio_size: usize,
        copy: crate::mc::McCopyFn,
        policy: Policy,
    ) -> Result<InFlight<'_>, ChannelError> {
        let folio = copy_pairs(dsts, srcs)?;
        // SAFETY: forwarded contract; `copy_pairs` checked the lengths.
        unsafe { self.start(dsts.len(), folio_size, Op::CopyMc(copy), folio, policy) }
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
                Policy::default(),
            )
        }
    }

    /// Runs a batch to the end, as `policy` says: pieces a channel failed
    /// are finished on the calling thread, so every byte is done when this
    /// returns. A batch run on the calling thread outright has no use for
    /// the policy.
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
        policy: Policy,
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
        let batch = unsafe { self.start(n, folio_size, op, folio, policy) }?;
        Ok(batch.finish())
    }

    /// Places `n` folios into pieces, hands them to the channels, returns
    /// the batch in flight.
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
        policy: Policy,
    ) -> Result<InFlight<'_>, ChannelError> {
        if folio_size == 0 {
            return Err(ChannelError::ZeroFolio);
        }
        let ch = self.channels.len();
        let shape = Shape {
            folios: n,
            folio_size,
            channels: ch,
            piece_bytes: policy.piece_bytes(),
            page: page_size(),
        };
        let placed = placement::place(shape, |f| {
            let (d, s) = folio(f);
            (d as usize, s as usize)
        });
        let claims: Vec<bool> = self.channels.iter().map(|c| c.claims_pieces()).collect();
        let Policy { cut, ended, stall } = policy;
        let done = Arc::new(Completion::new(
            vec![placed.per_folio; n],
            placed.pieces.len(),
            cut,
            ended,
        ));
        let pieces: Vec<Piece> = placed
            .pieces
            .iter()
            .enumerate()
            .map(|(seq, p)| {
                let (dst, src) = folio(p.folio);
                Piece {
                    // offset < folio_size: inside the folio.
                    dst: dst.wrapping_add(p.offset),
                    // A clear's null source stays null.
                    src: if src.is_null() {
                        src
                    } else {
                        src.wrapping_add(p.offset)
                    },
                    len: p.len,
                    folio: p.folio,
                    folios: p.folios,
                    offset: p.offset,
                    batch: done.id(),
                    seq,
                }
            })
            .collect();
        let for_caller = placed.for_caller(&claims);
        // SAFETY: forwarded contract; the handle below waits for the batch
        // before the caller may let go of its ranges.
        unsafe {
            self.hand_out(
                &pieces,
                &placed.shares(ch),
                &placed.offers(&claims),
                op,
                &done,
            )
        };
        Ok(InFlight {
            _pool: self,
            done,
            op,
            pieces,
            for_caller,
            stall,
            outcome: None,
        })
    }

    /// Submits to each channel what it is offered (`offers[c]`, piece
    /// numbers into `pieces`); a channel that refuses has its own share
    /// (`shares[c]`) run on the calling thread.
    ///
    /// # Safety
    /// Every piece's ranges are valid for `op` and untouched by anyone else
    /// until `done` reports it; the caller waits for `done` before letting
    /// go of them (the handle it returns waits when dropped).
    unsafe fn hand_out(
        &self,
        pieces: &[Piece],
        shares: &[Vec<usize>],
        offers: &[Vec<usize>],
        op: Op,
        done: &Arc<Completion>,
    ) {
        // From the first submission until every piece is reported, leaving
        // this function by a panic would free memory under the channels.
        let in_flight = AbortOnUnwind;
        // A batch started on a channel's worker (by a caller's copy
        // function that copies again) is run right here: queued, it could
        // wait for this very worker, which waits for it (see
        // `crate::worker`: a channel never waits for a channel).
        let nested = crate::worker::on_channel();
        for ((c, own), offer) in self.channels.iter().zip(shares).zip(offers) {
            if own.is_empty() {
                continue;
            }
            let submitted = if nested {
                Err(ChannelError::Stopped(c.name().to_string()))
            } else {
                let list = offer.iter().map(|&seq| pieces[seq]).collect();
                // SAFETY: the caller's contract covers every piece until
                // the batch ends. A piece offered to several channels is
                // run only by the one that claims it.
                unsafe { c.submit(list, op, done.clone()) }
            };
            // A channel that cannot take work means "finish on the CPU",
            // never "give up with pieces still in flight elsewhere". Its
            // own pieces are claimed first: another channel may have taken
            // some already.
            if submitted.is_err() {
                for &seq in own {
                    // SAFETY: the caller's contract covers every piece, and
                    // a refusing channel touches none of them.
                    unsafe { done.run_claimed(op, &pieces[seq]) };
                }
            }
        }
        // From here the caller's handle owns the batch: dropping it waits.
        std::mem::forget(in_flight);
    }
}

//! The copy operations: one range, or a batch of folios, with any
//! strategy of the table in [`crate::strategy`] or `auto`.

use crate::batch::{self, BatchError, BatchReport, Reuse};
pub use crate::strategy::copy::CopyStrategy;
use crate::tune::{self, Shape};

/// Options for a batched copy: `CopyOptions::default().strategy(..)`.
/// Fields are added in minor versions, so build it with the setters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyOptions {
    /// The primitive (`Auto`: chosen per batch).
    pub strategy: CopyStrategy,
    /// Whether the data is read again soon (decides streaming stores).
    pub reuse: Reuse,
}

impl CopyOptions {
    setters! {
        /// Sets the strategy.
        strategy: CopyStrategy,
        /// Sets the reuse hint.
        reuse: Reuse,
    }
}

impl CopyStrategy {
    /// The concrete strategy for a request of this shape (`Auto` asks the
    /// tuning rules; every other strategy is itself).
    pub fn resolve(self, shape: Shape) -> CopyStrategy {
        match self {
            Self::Auto => tune::choose_copy(shape),
            s => s,
        }
    }
}

/// Copies `src` into `dst` (any length and alignment) with `strategy`.
/// Returns the concrete strategy that ran.
pub fn copy(
    dst: &mut [u8],
    src: &[u8],
    strategy: CopyStrategy,
) -> Result<CopyStrategy, BatchError> {
    batch::check_lengths(dst, src)?;
    // SAFETY: the slices are valid for their (equal) lengths, and a `&mut`
    // and a `&` slice cannot overlap; this call holds the only references.
    unsafe { copy_raw(dst.as_mut_ptr(), src.as_ptr(), dst.len(), strategy) }
}

/// Copies `len` bytes from `src` to `dst` with `strategy`: any length, any
/// alignment, no references formed. Returns the concrete strategy that ran.
///
/// This is the entry point for memory a `&[u8]` cannot soundly describe,
/// such as guest RAM that vCPUs write while it is copied. Ranges that
/// overlap or wrap around the address space are refused with
/// [`BatchError::Overlap`] / [`BatchError::Wraps`] before anything is
/// written.
///
/// # Safety
/// - `src` must be valid for reads and `dst` valid for writes of `len`
///   bytes (mapped, with those permissions) for the whole call; neither
///   range may raise a fault (for a source that may raise SIGBUS, use
///   [`crate::mc::copy_mc_raw`]). With `len == 0` nothing is accessed and
///   the pointers may be dangling.
/// - No Rust reference this call would invalidate may be in use meanwhile:
///   no `&mut` covering either range, no `&` covering `dst`.
/// - Other threads (or vCPUs, or devices) may write `src` and read or write
///   `dst` concurrently, through raw pointers, volatile or atomic accesses,
///   or outside Rust. The bytes copied are then some interleaving of the
///   old and new values (each byte is one or the other; nothing wider is
///   guaranteed to be read or written at once), and `dst` holds what this
///   call or the other writer stored last. On x86_64 every strategy is
///   inline assembly or the platform `memcpy`, which the compiler cannot
///   see into; the portable fallback on other architectures copies with
///   `core::ptr::copy_nonoverlapping`, whose concurrent writers are, as
///   with volatile copies, formally a data race.
pub unsafe fn copy_raw(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    strategy: CopyStrategy,
) -> Result<CopyStrategy, BatchError> {
    batch::check_raw_pair(dst as usize, src as usize, len)?;
    let s = strategy.resolve(Shape::single(dst as usize, len));
    let f = s.function()?;
    // SAFETY: validity and the concurrency rules are the caller's contract;
    // the ranges were checked to be disjoint and not to wrap.
    unsafe { f(dst, src, len) };
    Ok(s)
}

/// Copies a contiguous region folio by folio: `dst` and `src` are split into
/// `folio_size` pieces, which form one batch.
pub fn copy_folios(
    dst: &mut [u8],
    src: &[u8],
    folio_size: usize,
    opts: CopyOptions,
) -> Result<BatchReport<CopyStrategy>, BatchError> {
    let n = batch::check_contiguous_copy(dst, src, folio_size)?;
    let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
    // SAFETY: folio i lies at offset i*folio_size < len of both slices, which
    // are valid and (being `&mut` and `&`) disjoint.
    unsafe {
        run(n, folio_size, opts, |i| {
            (d.add(i * folio_size), s.add(i * folio_size))
        })
    }
}

/// Copies a batch of equal-size folios given as `(dst, src)` pairs.
///
/// # Safety
/// Each `dsts[i]` must be valid for writes and each `srcs[i]` for reads of
/// `folio_size` bytes for the duration of the call. Overlap, alignment and
/// size are checked here and rejected with an error before anything is
/// written.
///
/// Streaming strategies fence once, after the last folio: another thread
/// reading the destinations during the call may see a later folio's bytes
/// before an earlier one's. All of them are visible when the call returns.
pub unsafe fn copy_folios_raw(
    dsts: &[*mut u8],
    srcs: &[*const u8],
    folio_size: usize,
    opts: CopyOptions,
) -> Result<BatchReport<CopyStrategy>, BatchError> {
    if dsts.len() != srcs.len() {
        return Err(BatchError::CountMismatch(dsts.len(), srcs.len()));
    }
    batch::check_folio_size(folio_size)?;
    let d: Vec<usize> = dsts.iter().map(|&p| p as usize).collect();
    let s: Vec<usize> = srcs.iter().map(|&p| p as usize).collect();
    batch::check_addrs("destination", d.iter().copied(), folio_size)?;
    batch::check_addrs("source", s.iter().copied(), folio_size)?;
    batch::check_overlap(&d, &s, folio_size)?;
    // SAFETY: validity is the caller's contract; disjointness was checked.
    unsafe { run(dsts.len(), folio_size, opts, |i| (dsts[i], srcs[i])) }
}

/// Resolves the strategy once for the whole batch, then copies each folio.
///
/// # Safety
/// `folio(i)` for `i < n` must give valid, disjoint ranges of `folio_size`.
unsafe fn run(
    n: usize,
    folio_size: usize,
    opts: CopyOptions,
    folio: impl Fn(usize) -> (*mut u8, *const u8),
) -> Result<BatchReport<CopyStrategy>, BatchError> {
    let s = opts
        .strategy
        .resolve(Shape::batch(folio_size, n, opts.reuse));
    let f = s.function()?;
    // SAFETY: folio `i < n` is valid and disjoint (this function's
    // contract), and `drive` fences an undrained `f` before it returns.
    unsafe {
        batch::drive(n, f, s.row().undrained, |i, f| {
            let (d, src) = folio(i);
            f(d, src, folio_size)
        })
    };
    Ok(BatchReport {
        strategy: s,
        folios: n,
        bytes: n * folio_size,
    })
}

//! The clear (zero-fill) operations: one range, or a batch of folios,
//! with any strategy of the table in [`crate::strategy`] or `auto`.

use crate::batch::{self, page_size, BatchError, BatchReport, Reuse};
use crate::strategy::clear::butterfly;
pub use crate::strategy::clear::{butterfly_order, ClearStrategy};
use crate::strategy::{Body, ClearFn, StrategyError};
use crate::tune::{self, Shape};

/// Options for a batched clear: `ClearOptions::default().strategy(..)`.
/// Fields are added in minor versions, so build it with the setters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClearOptions {
    /// The primitive (`Auto`: chosen per batch).
    pub strategy: ClearStrategy,
    /// Whether the zeroed memory is used again soon (decides streaming).
    pub reuse: Reuse,
    /// For `butterfly`: the page (index within each folio) the clearing
    /// converges on, as the faulting address does in the kernel.
    pub hint_page: usize,
}

impl ClearOptions {
    setters! {
        /// Sets the strategy.
        strategy: ClearStrategy,
        /// Sets the reuse hint.
        reuse: Reuse,
        /// Sets the butterfly's hint page.
        hint_page: usize,
    }
}

/// A resolved clear: butterfly needs the hint, the others are plain ranges.
#[derive(Clone, Copy)]
enum Clear {
    Butterfly,
    Range(ClearFn),
}

impl ClearStrategy {
    /// The concrete strategy for a request of this shape.
    pub fn resolve(self, shape: Shape) -> ClearStrategy {
        match self {
            Self::Auto => tune::choose_clear(shape),
            s => s,
        }
    }

    fn dispatch(self) -> Result<Clear, StrategyError> {
        match self.row().body {
            Body::Paged => Ok(Clear::Butterfly),
            _ => self.function().map(Clear::Range),
        }
    }
}

/// Zeroes `dst` (any length and alignment) with `strategy`; `butterfly`
/// converges on page 0. Returns the concrete strategy that ran.
pub fn clear(dst: &mut [u8], strategy: ClearStrategy) -> Result<ClearStrategy, BatchError> {
    // SAFETY: the slice is valid for writes of its length and this call
    // holds the only reference to it.
    unsafe { clear_raw(dst.as_mut_ptr(), dst.len(), strategy) }
}

/// Zeroes `len` bytes at `dst` with `strategy`: any length, any alignment,
/// no references formed; `butterfly` converges on page 0. Returns the
/// concrete strategy that ran. A range that wraps around the address space
/// is refused with [`BatchError::Wraps`] before anything is written.
///
/// # Safety
/// - `dst` must be valid for writes of `len` bytes (mapped writable, and
///   not faulting) for the whole call. With `len == 0` nothing is accessed
///   and the pointer may be dangling.
/// - No `&` or `&mut` covering the range may be in use meanwhile.
/// - Other threads (or vCPUs, or devices) may read or write the range
///   concurrently through raw pointers, volatile or atomic accesses, or
///   outside Rust: each byte then ends as zero or as what they stored
///   after this call's store. On x86_64 every strategy is inline assembly
///   or the platform `memset`; the portable fallback elsewhere uses
///   `core::ptr::write_bytes`, whose concurrent accessors are formally a
///   data race.
pub unsafe fn clear_raw(
    dst: *mut u8,
    len: usize,
    strategy: ClearStrategy,
) -> Result<ClearStrategy, BatchError> {
    let addr = dst as usize;
    if addr.checked_add(len).is_none() {
        return Err(BatchError::Wraps { addr, len });
    }
    let s = strategy.resolve(Shape::single(addr, len));
    let c = s.dispatch()?;
    // SAFETY: validity is the caller's contract; hint 0 is always a valid
    // page index (an empty range clears no page).
    unsafe { apply(c, dst, len, 0) };
    Ok(s)
}

/// # Safety
/// `dst` valid for writes of `len` bytes; `hint` inside the range's pages.
unsafe fn apply(c: Clear, dst: *mut u8, len: usize, hint: usize) {
    match c {
        // SAFETY: forwarded contract.
        Clear::Butterfly => unsafe { butterfly(dst, len, hint) },
        // SAFETY: forwarded contract.
        Clear::Range(f) => unsafe { f(dst, len) },
    }
}

/// Zeroes a contiguous region folio by folio as one batch.
pub fn clear_folios(
    dst: &mut [u8],
    folio_size: usize,
    opts: ClearOptions,
) -> Result<BatchReport<ClearStrategy>, BatchError> {
    let n = batch::folio_count("destination", dst.len(), folio_size)?;
    batch::check_bases(&[("destination", dst.as_ptr() as usize)], dst.len())?;
    let d = dst.as_mut_ptr();
    // SAFETY: folio i lies at offset i*folio_size < len of the valid slice.
    unsafe { run(n, folio_size, opts, |i| d.add(i * folio_size)) }
}

/// Zeroes a batch of equal-size folios given by their start addresses.
///
/// # Safety
/// Each `dsts[i]` must be valid for writes of `folio_size` bytes for the
/// duration of the call. Alignment, size and overlap are checked here.
///
/// Streaming strategies fence once, after the last folio: another thread
/// reading the folios during the call may see a later folio zeroed before
/// an earlier one. All of them are zero when the call returns.
pub unsafe fn clear_folios_raw(
    dsts: &[*mut u8],
    folio_size: usize,
    opts: ClearOptions,
) -> Result<BatchReport<ClearStrategy>, BatchError> {
    batch::check_folio_size(folio_size)?;
    let d: Vec<usize> = dsts.iter().map(|&p| p as usize).collect();
    batch::check_addrs("destination", d.iter().copied(), folio_size)?;
    batch::check_overlap(&d, &[], folio_size)?;
    // SAFETY: validity is the caller's contract.
    unsafe { run(dsts.len(), folio_size, opts, |i| dsts[i]) }
}

/// # Safety
/// `folio(i)` for `i < n` must be valid for writes of `folio_size` bytes.
unsafe fn run(
    n: usize,
    folio_size: usize,
    opts: ClearOptions,
    folio: impl Fn(usize) -> *mut u8,
) -> Result<BatchReport<ClearStrategy>, BatchError> {
    let pages = folio_size / page_size();
    if opts.hint_page >= pages {
        return Err(BatchError::HintOutOfRange {
            hint: opts.hint_page,
            pages,
        });
    }
    let s = opts
        .strategy
        .resolve(Shape::batch(folio_size, n, opts.reuse));
    let c = s.dispatch()?;
    // SAFETY: folio `i < n` is valid for writes (this function's
    // contract), hint < pages was checked, and `drive` fences an undrained
    // `c` before it returns.
    unsafe {
        batch::drive(n, c, s.row().undrained.map(Clear::Range), |i, c| {
            apply(c, folio(i), folio_size, opts.hint_page)
        })
    };
    Ok(BatchReport {
        strategy: s,
        folios: n,
        bytes: n * folio_size,
    })
}

//! Named clear (zero-fill) strategies, `auto`, and the batched folio clear.

use std::sync::OnceLock;

use crate::arch::{self, ClearFn};
use crate::batch::{self, page_size, BatchError, BatchReport, Reuse};
use crate::copy::yield_point;
use crate::cpu::cpu;
use crate::strategy::{require, Strategy, StrategyError};
use crate::tune::{self, Shape};

/// A way of zeroing memory. `Butterfly` and `PerPage` work 4 KiB at a time
/// like the kernel's `clear_huge_page` paths; the rest clear whole extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum ClearStrategy {
    /// 4 KiB clears from both ends converging on a hint page: the kernel's
    /// `process_huge_page` order, kept for comparison.
    Butterfly,
    /// 4 KiB clears in address order with a yield point between pages.
    PerPage,
    /// `rep stosb` over the whole extent. x86_64 only.
    Stosb,
    /// `rep stosq` over the whole extent. x86_64 only.
    Stosq,
    /// Streaming (non-temporal) stores of whole lines, fenced before
    /// returning: for memory not read again soon. x86_64 only.
    Nt,
    /// AMD `clzero`, one instruction per 64-byte line, fenced. x86_64 with
    /// the CLZERO flag (AMD only).
    Clzero,
    /// The platform `memset`.
    Libc,
    /// Chosen per batch from the CPU, its cache sizes, the batch's total size,
    /// the reuse hint and the calibration profile; reports say what it ran.
    #[default]
    Auto,
}

impl Strategy for ClearStrategy {
    const OP: &'static str = "clear";
    const ALL: &'static [Self] = &[
        Self::Butterfly,
        Self::PerPage,
        Self::Stosb,
        Self::Stosq,
        Self::Nt,
        Self::Clzero,
        Self::Libc,
        Self::Auto,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Butterfly => "butterfly",
            Self::PerPage => "per-page",
            Self::Stosb => "stosb",
            Self::Stosq => "stosq",
            Self::Nt => "nt",
            Self::Clzero => "clzero",
            Self::Libc => "libc",
            Self::Auto => "auto",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::Butterfly => "4 KiB clear_page calls from both ends converging on the hint page (the kernel's process_huge_page order)",
            Self::PerPage => "4 KiB clear_page calls in address order with a yield point between pages",
            Self::Stosb => "rep stosb over the whole extent",
            Self::Stosq => "rep stosq over the whole extent",
            Self::Nt => "streaming movntdq stores of whole lines, sfence before returning",
            Self::Clzero => "AMD clzero, one instruction per 64-byte line, fenced",
            Self::Libc => "the platform memset",
            Self::Auto => "picks per batch from CPU flags, cache sizes, batch size, reuse and the calibration profile",
        }
    }

    fn unavailable(self) -> Option<&'static str> {
        match self {
            Self::Butterfly | Self::PerPage | Self::Libc | Self::Auto => None,
            s => arch::clear_primitive(s, &cpu().features).err(),
        }
    }
}

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
    /// Sets the strategy.
    pub fn strategy(mut self, s: ClearStrategy) -> Self {
        self.strategy = s;
        self
    }

    /// Sets the reuse hint.
    pub fn reuse(mut self, r: Reuse) -> Self {
        self.reuse = r;
        self
    }

    /// Sets the butterfly's hint page.
    pub fn hint_page(mut self, page: usize) -> Self {
        self.hint_page = page;
        self
    }
}

/// A resolved clear: butterfly needs the hint, the others are plain ranges.
#[derive(Clone, Copy)]
enum Clear {
    Butterfly,
    Range(ClearFn),
}

impl std::fmt::Display for ClearStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl ClearStrategy {
    /// The concrete strategy for a request of this shape.
    pub fn resolve(self, shape: Shape) -> ClearStrategy {
        match self {
            Self::Auto => tune::choose_clear(shape),
            s => s,
        }
    }

    /// The range function a concrete strategy runs, for callers that hand
    /// ranges to someone else (copy channels). `butterfly` has none: it
    /// clears page by page around a hint page, so it is refused rather than
    /// silently replaced. `Auto` is [`StrategyError::Unresolved`] until
    /// [`ClearStrategy::resolve`] picks a concrete strategy.
    pub fn range_function(self) -> Result<ClearFn, StrategyError> {
        match self.dispatch()? {
            Clear::Range(f) => Ok(f),
            Clear::Butterfly => Err(StrategyError::Unavailable {
                op: Self::OP,
                name: self.name(),
                reason: "it clears page by page around a hint page, not as a range",
            }),
        }
    }

    fn dispatch(self) -> Result<Clear, StrategyError> {
        match require(self)? {
            Self::Butterfly => Ok(Clear::Butterfly),
            Self::PerPage => Ok(Clear::Range(per_page)),
            Self::Libc => Ok(Clear::Range(libc_memset)),
            Self::Auto => Err(StrategyError::Unresolved { op: Self::OP }),
            s => arch::clear_primitive(s, &cpu().features)
                .map(Clear::Range)
                .map_err(|reason| StrategyError::Unavailable {
                    op: Self::OP,
                    name: s.name(),
                    reason,
                }),
        }
    }
}

fn page_clear() -> ClearFn {
    static PAGE_CLEAR: OnceLock<ClearFn> = OnceLock::new();
    *PAGE_CLEAR.get_or_init(|| arch::page_clear(&cpu().features))
}

/// Clears page `i` (the last one may be short) of a `len`-byte range.
///
/// # Safety
/// `dst` valid for writes of `len` bytes and `i * page < len`.
#[inline]
unsafe fn clear_page_at(dst: *mut u8, len: usize, i: usize) {
    let page = page_size();
    let off = i * page;
    // SAFETY: off < len and off + n <= len.
    unsafe { page_clear()(dst.add(off), page.min(len - off)) };
}

/// # Safety
/// `dst` valid for writes of `len` bytes.
unsafe fn per_page(dst: *mut u8, len: usize) {
    let pages = len.div_ceil(page_size());
    for i in 0..pages {
        // SAFETY: i < pages, so i * page < len.
        unsafe { clear_page_at(dst, len, i) };
        if i + 1 < pages {
            yield_point();
        }
    }
}

/// Visits `pages` page indices in the kernel's `process_huge_page` order:
/// the far end first, then alternately left and right, converging on
/// `hint`, which comes last and so is hottest in cache. `hint < pages`.
pub fn butterfly_order(pages: usize, hint: usize, mut visit: impl FnMut(usize)) {
    let (base, l);
    if 2 * hint <= pages {
        // Hint in the first half: the tail end, backwards.
        base = 0;
        l = hint;
        for i in (2 * hint..pages).rev() {
            visit(i);
        }
    } else {
        // Hint in the second half: the head end, forwards.
        base = pages - 2 * (pages - hint);
        l = pages - hint;
        for i in 0..base {
            visit(i);
        }
    }
    for i in 0..l {
        visit(base + i);
        visit(base + 2 * l - 1 - i);
    }
}

/// Clears page by page in [`butterfly_order`], with a yield point after each.
///
/// # Safety
/// `dst` valid for writes of `len` bytes; `hint` < number of pages.
unsafe fn butterfly(dst: *mut u8, len: usize, hint: usize) {
    butterfly_order(len.div_ceil(page_size()), hint, |i| {
        // SAFETY: every visited index is < pages, so inside the range.
        unsafe { clear_page_at(dst, len, i) };
        yield_point();
    });
}

/// # Safety
/// `dst` valid for writes of `len` bytes.
unsafe fn libc_memset(dst: *mut u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { libc::memset(dst.cast(), 0, len) };
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
    let mut c = s.dispatch()?;
    // A streaming batch fences once, after its last folio (as copies do):
    // clzero on 4 KiB folios ran at ~57% of the zero-write limit with a
    // fence per folio.
    let undrained = if n > 1 {
        arch::clear_nodrain(s, &cpu().features)
    } else {
        None
    };
    if let Some(f) = undrained {
        c = Clear::Range(f);
    }
    for i in 0..n {
        // SAFETY: forwarded contract; hint < pages was checked; an
        // undrained primitive is fenced below before the batch returns.
        unsafe { apply(c, folio(i), folio_size, opts.hint_page) };
    }
    if undrained.is_some() {
        arch::sfence();
    }
    Ok(BatchReport {
        strategy: s,
        folios: n,
        bytes: n * folio_size,
    })
}

//! Named copy strategies, `auto`, and the batched folio copy.

use std::sync::OnceLock;

use crate::arch::{self, CopyFn};
use crate::batch::{self, page_size, BatchError, BatchReport, Reuse};
use crate::cpu::cpu;
use crate::strategy::{require, Strategy, StrategyError};
use crate::tune::{self, Shape};

/// A way of copying memory. Every variant is callable by name; `Auto` picks
/// one of the others for the shape of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum CopyStrategy {
    /// 4 KiB at a time with a yield point between pages: the kernel's old
    /// per-page folio copy loop, kept as the baseline.
    PerPage,
    /// `rep movsq` over the whole extent (the kernel's `copy_page` on
    /// REP_GOOD CPUs). x86_64 only.
    Movsq,
    /// `rep movsb` over the whole extent; fast with ERMS/FSRM, slow on
    /// some AMD parts with a misaligned destination. x86_64 only.
    Movsb,
    /// Unrolled 64-bit register moves, 64 bytes per iteration (the kernel's
    /// `memcpy_orig`, used when FSRM is absent). x86_64 only.
    Unrolled,
    /// 32-byte AVX2 loads and stores. x86_64 with AVX2.
    Avx2,
    /// 64-byte AVX-512 loads and stores. x86_64 with AVX-512F.
    Avx512,
    /// Streaming (non-temporal) stores that bypass the cache, fenced before
    /// returning: for write-once data larger than the cache. x86_64 only.
    Nt,
    /// The platform `memcpy`.
    Libc,
    /// Chosen per batch from the CPU, its cache sizes, the batch's total size,
    /// the reuse hint and the calibration profile; reports say what it ran.
    #[default]
    Auto,
}

impl Strategy for CopyStrategy {
    const OP: &'static str = "copy";
    const ALL: &'static [Self] = &[
        Self::PerPage,
        Self::Movsq,
        Self::Movsb,
        Self::Unrolled,
        Self::Avx2,
        Self::Avx512,
        Self::Nt,
        Self::Libc,
        Self::Auto,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::PerPage => "per-page",
            Self::Movsq => "movsq",
            Self::Movsb => "movsb",
            Self::Unrolled => "unrolled",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
            Self::Nt => "nt",
            Self::Libc => "libc",
            Self::Auto => "auto",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::PerPage => "one copy_page per 4 KiB with a yield point between pages (the kernel's old folio_copy loop)",
            Self::Movsq => "rep movsq over the whole extent (the kernel's copy_page on REP_GOOD CPUs)",
            Self::Movsb => "rep movsb over the whole extent (fast with ERMS/FSRM)",
            Self::Unrolled => "unrolled 64-bit register moves, 64 B per iteration (the kernel's memcpy_orig)",
            Self::Avx2 => "32-byte AVX2 loads and stores, 128 B per iteration",
            Self::Avx512 => "64-byte AVX-512 loads and stores, 256 B per iteration",
            Self::Nt => "streaming movntdq stores of whole lines, sfence before returning",
            Self::Libc => "the platform memcpy",
            Self::Auto => "picks per batch from CPU flags, cache sizes, batch size, reuse and the calibration profile",
        }
    }

    fn unavailable(self) -> Option<&'static str> {
        match self {
            Self::PerPage | Self::Libc | Self::Auto => None,
            s => arch::copy_primitive(s, &cpu().features).err(),
        }
    }
}

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
    /// Sets the strategy.
    pub fn strategy(mut self, s: CopyStrategy) -> Self {
        self.strategy = s;
        self
    }

    /// Sets the reuse hint.
    pub fn reuse(mut self, r: Reuse) -> Self {
        self.reuse = r;
        self
    }
}

impl std::fmt::Display for CopyStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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

    /// The function a concrete strategy runs. `Auto` has none of its own:
    /// it is [`StrategyError::Unresolved`] until [`CopyStrategy::resolve`]
    /// picks a concrete strategy for the request's shape.
    pub fn function(self) -> Result<CopyFn, StrategyError> {
        let f = &cpu().features;
        match require(self)? {
            Self::PerPage => Ok(per_page),
            Self::Libc => Ok(libc_memcpy),
            Self::Auto => Err(StrategyError::Unresolved { op: Self::OP }),
            s => arch::copy_primitive(s, f).map_err(|reason| StrategyError::Unavailable {
                op: Self::OP,
                name: s.name(),
                reason,
            }),
        }
    }
}

/// The kernel's `cond_resched()` stand-in between per-page copies: a cheap
/// check that lets a long per-page loop be interrupted. Kept out of line so
/// the per-page strategies pay a real call per page, as the kernel loop did.
#[inline(never)]
pub(crate) fn yield_point() {
    if crate::params::YIELD_REQUESTED.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::yield_now();
    }
}

/// # Safety
/// Both ranges valid for `len` bytes and disjoint.
unsafe fn per_page(dst: *mut u8, src: *const u8, len: usize) {
    static PAGE_COPY: OnceLock<CopyFn> = OnceLock::new();
    let page_copy = *PAGE_COPY.get_or_init(|| arch::page_copy(&cpu().features));
    let page = page_size();
    let mut off = 0;
    while off < len {
        let n = page.min(len - off);
        // SAFETY: off + n <= len, inside both ranges (caller's contract).
        unsafe { page_copy(dst.add(off), src.add(off), n) };
        off += n;
        if off < len {
            yield_point();
        }
    }
}

/// # Safety
/// Both ranges valid for `len` bytes and disjoint.
unsafe fn libc_memcpy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { libc::memcpy(dst.cast(), src.cast(), len) };
}

/// Copies `src` into `dst` (any length and alignment) with `strategy`.
/// Returns the concrete strategy that ran.
pub fn copy(
    dst: &mut [u8],
    src: &[u8],
    strategy: CopyStrategy,
) -> Result<CopyStrategy, BatchError> {
    if dst.len() != src.len() {
        return Err(BatchError::LengthMismatch {
            dst: dst.len(),
            src: src.len(),
        });
    }
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
    let shape = Shape::batch(folio_size, n, opts.reuse);
    let s = opts.strategy.resolve(shape);
    let f = s.function()?;
    // A streaming batch fences once, after its last folio: a fence per
    // folio waits for each folio's stores to drain before the next starts,
    // which at 4 KiB folios costs more than the stores.
    let undrained = if n > 1 { arch::copy_nodrain(s) } else { None };
    for i in 0..n {
        let (d, src) = folio(i);
        // SAFETY: forwarded from this function's contract; an undrained
        // primitive is fenced below before the batch is reported done.
        unsafe { undrained.unwrap_or(f)(d, src, folio_size) };
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

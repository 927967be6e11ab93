//! Machine-check-safe copy: survive a poisoned or vanished source page and
//! report exactly what was not copied.
//!
//! Reading hardware-poisoned memory raises SIGBUS (`BUS_MCEERR_AR`), and so
//! does reading a file mapping past the end of a truncated file
//! (`BUS_ADRERR`). The mc routines here are registered with a SIGBUS handler
//! that resumes them at a fixup returning the bytes not copied, as the
//! kernel's `copy_mc_to_kernel` does; `copy_mc` turns that into the first
//! bad page, as `folio_mc_copy` does.

#[cfg(target_arch = "x86_64")]
mod handler;
mod zero;

use thiserror::Error;

use crate::batch::{self, page_size, BatchError};
use crate::copy::{CopyOptions, CopyStrategy};
use crate::strategy::{require, Strategy};
use crate::tune::{self, Regime, Shape};

/// Why a source page could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum FaultKind {
    /// Hardware memory error (`BUS_MCEERR_AR`/`AO`).
    Poison,
    /// The page no longer exists, e.g. a file truncated under a mapping (`BUS_ADRERR`).
    Vanished,
    /// Another SIGBUS code.
    Other(i32),
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultKind::Poison => f.write_str("hardware poison"),
            FaultKind::Vanished => f.write_str("page vanished, e.g. truncated file"),
            FaultKind::Other(c) => write!(f, "SIGBUS code {c}"),
        }
    }
}

/// Where an mc copy stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct McFault {
    /// Bytes not copied, counted from the end (the kernel's return value).
    pub not_copied: usize,
    /// Index of the first bad page, counted in base pages from the page
    /// holding the first source byte.
    pub bad_page: usize,
    /// What the SIGBUS said about the page.
    pub kind: FaultKind,
    /// The faulting address the kernel reported.
    pub addr: usize,
}

/// Why an mc copy did not complete. Only [`McError::Fault`] and
/// [`McError::DestinationFault`] happen after bytes were written; the
/// others are returned before anything is.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum McError {
    /// A source page faulted: the destination holds the source's bytes up
    /// to `len - not_copied`, the rest is untouched.
    #[error("{} bytes not copied: source page {} faulted ({})", .0.not_copied, .0.bad_page, .0.kind)]
    Fault(McFault),
    /// A destination page raised SIGBUS (a file truncated under it, a
    /// hugetlb page the pool could not give, poison): the caller's memory
    /// broke its contract, since only the source may fault. `bad_page`
    /// counts from the page holding `dst`; the bytes before `len -
    /// not_copied` hold the source's.
    #[error("{} bytes not copied: destination page {} faulted ({})", .0.not_copied, .0.bad_page, .0.kind)]
    DestinationFault(McFault),
    /// The named strategy has no machine-check-safe variant (only those in
    /// `movsb`, `avx2`, `nt` and `auto` do).
    #[error("{0} has no machine-check-safe variant (have: movsb, avx2, nt, auto)")]
    NoVariant(&'static str),
    /// No mc copy can run: not x86_64, the application refused the SIGBUS
    /// handler (`Config::sigbus_handler(false)`), installing it failed, or
    /// the calling thread blocks SIGBUS (the kernel would then kill the
    /// process at a fault instead of running any handler).
    #[error("machine-check-safe copy is not available: {0}")]
    Unavailable(&'static str),
    /// Another SIGBUS handler was installed after foliokit's; see
    /// [`handler_state`].
    #[error("another SIGBUS handler replaced foliokit's: a fault would reach it instead of being reported (install yours before foliokit::init)")]
    HandlerReplaced,
    /// The arguments were refused (lengths, alignment, overlap, or an
    /// unavailable strategy).
    #[error(transparent)]
    Batch(#[from] BatchError),
}

pub use crate::strategy::McCopyFn;
pub(crate) use zero::zero_units_raw;
/// A routine returning the bytes it did not copy.
type McFn = McCopyFn;

/// The mc routine for `strategy` at `shape` (itself, or for `auto` the mc
/// twin of the strategy `auto` picks for that shape), with the
/// SIGBUS handler installed: for handing to the copy channels
/// ([`crate::channels::ChannelPool::submit_copy_mc`]).
pub fn mc_routine(
    strategy: CopyStrategy,
    shape: Shape,
) -> Result<(CopyStrategy, McCopyFn), McError> {
    let s = resolve_mc(strategy, shape)?;
    Ok((s, mc_fn(s)?))
}

impl CopyStrategy {
    /// Whether this strategy has a machine-check-safe variant here (its
    /// row names one; `auto` picks among those).
    pub fn has_mc(self) -> bool {
        cfg!(target_arch = "x86_64")
            && (self == CopyStrategy::Auto || self.row().mc.is_some())
            && self.unavailable().is_none()
    }
}

/// The mc strategy for `strategy` at this shape: itself when it has an mc
/// variant; for `auto`, the plain choice's mc counterpart.
pub(crate) fn resolve_mc(strategy: CopyStrategy, shape: Shape) -> Result<CopyStrategy, McError> {
    if strategy != CopyStrategy::Auto {
        require(strategy).map_err(BatchError::from)?;
        return if strategy.has_mc() {
            Ok(strategy)
        } else {
            Err(McError::NoVariant(strategy.name()))
        };
    }
    let plain = tune::choose_copy(shape);
    if plain.has_mc() {
        return Ok(plain);
    }
    // The plain choice has no mc twin (movsq, unrolled, avx512, libc...):
    // take the closest that has one for the same regime.
    let regime = tune::regime(shape.total.saturating_mul(2), shape.total, shape.reuse);
    Ok(match regime {
        Regime::Stream => CopyStrategy::Nt,
        Regime::Resident if CopyStrategy::Avx2.has_mc() && plain == CopyStrategy::Avx512 => {
            CopyStrategy::Avx2
        }
        Regime::Resident => CopyStrategy::Movsb,
    })
}

/// Whether SIGBUS still reaches foliokit's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerState {
    /// Not installed (no mc copy yet, or the application refused it).
    NotInstalled,
    /// Installed and still SIGBUS's handler.
    Installed,
    /// Installed, but another handler has replaced it since: mc copies
    /// refuse to run rather than let a fault reach that handler.
    Replaced,
}

/// Whether mc copies may install the SIGBUS handler: what [`crate::init`]
/// passed down (`Config::sigbus_handler`), or yes once the first mc copy
/// asked before any `init`.
static HANDLER_POLICY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Sets the handler policy; false when an mc copy (or an earlier `init`)
/// fixed it.
pub(crate) fn fix_handler_policy(allowed: bool) -> bool {
    HANDLER_POLICY.set(allowed).is_ok()
}

/// Whether the handler policy is fixed.
pub(crate) fn handler_policy_fixed() -> bool {
    HANDLER_POLICY.get().is_some()
}

/// Installs the SIGBUS handler (once per process); the errno on failure.
pub(crate) fn install_handler() -> Result<(), i32> {
    #[cfg(target_arch = "x86_64")]
    return handler::install();
    #[cfg(not(target_arch = "x86_64"))]
    Ok(())
}

/// Whether SIGBUS still reaches foliokit's handler. An application that
/// needs its own SIGBUS handler installs it before [`crate::init`]:
/// foliokit then passes every fault that is not its own on to it. One
/// installed after foliokit's makes mc copies fail with
/// [`McError::HandlerReplaced`] instead of sending their faults there.
#[cfg(target_arch = "x86_64")]
pub fn handler_state() -> HandlerState {
    handler::state()
}

/// Whether SIGBUS still reaches foliokit's handler (none on this
/// architecture).
#[cfg(not(target_arch = "x86_64"))]
pub fn handler_state() -> HandlerState {
    HandlerState::NotInstalled
}

#[cfg(target_arch = "x86_64")]
fn mc_fn(s: CopyStrategy) -> Result<McFn, McError> {
    if !*HANDLER_POLICY.get_or_init(|| true) && handler::state() == HandlerState::NotInstalled {
        return Err(McError::Unavailable(
            "the application refused the SIGBUS handler (Config::sigbus_handler(false))",
        ));
    }
    handler::install().map_err(|_| McError::Unavailable("could not install the SIGBUS handler"))?;
    if handler::state() == HandlerState::Replaced {
        return Err(McError::HandlerReplaced);
    }
    s.row().mc.ok_or(McError::NoVariant(s.name()))
}

/// Refuses to run an mc routine on this thread where it blocks SIGBUS (see
/// `handler::sigbus_blocked`); channel workers never block it.
fn runs_here() -> Result<(), McError> {
    #[cfg(target_arch = "x86_64")]
    if handler::sigbus_blocked() {
        return Err(McError::Unavailable(
            "SIGBUS is blocked on this thread: the kernel would kill the process at a fault rather than let it be recovered",
        ));
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn mc_fn(_s: CopyStrategy) -> Result<McFn, McError> {
    Err(McError::Unavailable(
        "no mc routines for this architecture yet",
    ))
}

/// Runs one mc copy and turns a short copy into an [`McError::Fault`], or
/// [`McError::DestinationFault`] where the address the kernel reported
/// lies in the destination's pages and not the source's.
///
/// # Safety
/// `dst` valid for writes and `src` mapped for `len` bytes, disjoint.
unsafe fn run_one(f: McFn, dst: *mut u8, src: *const u8, len: usize) -> Result<(), McError> {
    #[cfg(target_arch = "x86_64")]
    let outer = handler::reset_last_fault();
    // SAFETY: forwarded contract; the handler is installed (mc_fn did it).
    let not_copied = unsafe { f(dst, src, len) };
    #[cfg(target_arch = "x86_64")]
    let (code, addr) = handler::last_fault();
    #[cfg(target_arch = "x86_64")]
    handler::restore_last_fault(outer);
    if not_copied == 0 {
        return Ok(());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let (code, addr) = (0, 0);
    let page = page_size();
    // Poison is reported by page: the page holding a range's first byte
    // counts as the range's.
    let within = |p: usize| (p / page * page..p + len).contains(&addr);
    let (start, fault): (usize, fn(McFault) -> McError) =
        if within(dst as usize) && !within(src as usize) {
            (dst as usize, McError::DestinationFault)
        } else {
            (src as usize, McError::Fault)
        };
    let failed_at = start + (len - not_copied);
    Err(fault(McFault {
        not_copied,
        bad_page: failed_at / page - start / page,
        kind: match code {
            libc::BUS_MCEERR_AR | libc::BUS_MCEERR_AO => FaultKind::Poison,
            libc::BUS_ADRERR => FaultKind::Vanished,
            c => FaultKind::Other(c),
        },
        addr,
    }))
}

/// Copies `src` into `dst` (any length and alignment), surviving source
/// pages that fault. Returns the mc strategy that ran, or where it stopped:
/// every destination byte before `len - not_copied` equals the source.
pub fn copy_mc(
    dst: &mut [u8],
    src: &[u8],
    strategy: CopyStrategy,
) -> Result<CopyStrategy, McError> {
    batch::check_lengths(dst, src)?;
    // SAFETY: the slices are valid for their equal lengths and disjoint,
    // and this call holds the only references to them.
    unsafe { copy_mc_raw(dst.as_mut_ptr(), src.as_ptr(), dst.len(), strategy) }
}

/// Copies `len` bytes from `src` to `dst` (any length and alignment, no
/// references formed), surviving source pages that raise SIGBUS. Returns
/// the mc strategy that ran, or [`McError::Fault`] with where it stopped:
/// the `len - not_copied` destination bytes before the fault hold the
/// source's bytes, the rest of `dst` is untouched.
///
/// This is `copy_mc` for memory a `&[u8]` cannot describe: a `&[u8]`
/// promises its bytes are readable, which is exactly what a poisoned or
/// truncated source breaks, and guest RAM that vCPUs write meanwhile is
/// not immutable. Ranges that overlap or wrap around the address space
/// are refused (as [`McError::Batch`]) before anything is written.
///
/// # Safety
/// - `src` must be mapped readable for `len` bytes for the whole call. Its
///   pages may raise SIGBUS — hardware poison (`BUS_MCEERR_AR`, reported as
///   [`FaultKind::Poison`]) or a file mapping whose file was truncated
///   under it (`BUS_ADRERR`, [`FaultKind::Vanished`]) — and that is
///   reported, not fatal. Any other fault (SIGSEGV: unmapped or
///   `PROT_NONE` pages) is not caught and kills the process as usual.
/// - `dst` must be valid for writes of `len` bytes and must not fault. A
///   SIGBUS while writing it anyway (a file truncated under it, a hugetlb
///   page the pool could not give) ends the copy as
///   [`McError::DestinationFault`].
/// - With `len == 0` nothing is accessed and the pointers may be dangling.
/// - No `&mut` covering either range and no `&` covering `dst` may be in
///   use meanwhile.
/// - Other threads (or vCPUs, or devices) may write `src` and read or
///   write `dst` concurrently through raw pointers, volatile or atomic
///   accesses, or outside Rust: every mc routine is assembly the compiler
///   cannot see into, so the bytes copied are then some interleaving of
///   old and new values (each byte one or the other), not undefined
///   behaviour.
pub unsafe fn copy_mc_raw(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    strategy: CopyStrategy,
) -> Result<CopyStrategy, McError> {
    batch::check_raw_pair(dst as usize, src as usize, len)?;
    let s = resolve_mc(strategy, Shape::single(dst as usize, len))?;
    let f = mc_fn(s)?;
    runs_here()?;
    // SAFETY: validity and the concurrency rules are the caller's
    // contract; the ranges were checked to be disjoint and not to wrap; a
    // SIGBUS reading `src` is turned into a short copy by the handler
    // mc_fn installed.
    unsafe { run_one(f, dst, src, len) }?;
    Ok(s)
}

/// One folio that could not be copied whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FolioFault {
    /// The folio's index in the batch.
    pub index: usize,
    /// Where it stopped, relative to the folio's own start (`bad_page` 0 is
    /// the folio's first page).
    pub fault: McFault,
}

/// What a batched mc copy did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct McReport {
    /// The mc strategy that ran (what `auto` resolved to).
    pub strategy: CopyStrategy,
    /// Folios in the batch.
    pub folios: usize,
    /// Folios copied whole.
    pub copied: usize,
    /// Folios that faulted, in order; the others were copied regardless.
    pub faults: Vec<FolioFault>,
}

/// Copies a contiguous region folio by folio with an mc strategy. A folio
/// whose source faults is reported and skipped; the rest of the batch is
/// still copied, and no folio is copied twice.
pub fn copy_folios_mc(
    dst: &mut [u8],
    src: &[u8],
    folio_size: usize,
    opts: CopyOptions,
) -> Result<McReport, McError> {
    let n = batch::check_contiguous_copy(dst, src, folio_size)?;
    let s = resolve_mc(opts.strategy, Shape::batch(folio_size, n, opts.reuse))?;
    let f = mc_fn(s)?;
    runs_here()?;
    let (d, sp) = (dst.as_mut_ptr(), src.as_ptr());
    let mut faults = Vec::new();
    for i in 0..n {
        let off = i * folio_size;
        // SAFETY: folio i lies inside both slices, which are disjoint.
        match unsafe { run_one(f, d.add(off), sp.add(off), folio_size) } {
            Ok(()) => {}
            Err(McError::Fault(fault)) => faults.push(FolioFault { index: i, fault }),
            // The destination broke its contract: the batch ends there,
            // reported as a copy of the whole range would be.
            Err(McError::DestinationFault(mut f)) => {
                f.bad_page += off / page_size();
                f.not_copied += (n - i - 1) * folio_size;
                return Err(McError::DestinationFault(f));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(McReport {
        strategy: s,
        folios: n,
        copied: n - faults.len(),
        faults,
    })
}

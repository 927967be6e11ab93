//! The clear (zero-fill) strategies, one row each. The assembly rows point
//! into `crate::arch`; `butterfly`, `per-page` and `libc` are composites
//! written here.

use std::sync::OnceLock;

use super::copy::yield_point;
use super::{auto_row, on_x86, strategies, Body, ClearFn, Need, Row, StrategyError};
use crate::cpu::cpu;
use crate::sys::page_size;

#[cfg(target_arch = "x86_64")]
use crate::arch::x86_64::clear as asm;

strategies! {
    /// A way of zeroing memory. `Butterfly` and `PerPage` work 4 KiB at a
    /// time like the kernel's `clear_huge_page` paths; the rest clear whole
    /// extents.
    pub enum ClearStrategy: "clear", ClearFn {
        /// 4 KiB clears from both ends converging on a hint page: the
        /// kernel's `process_huge_page` order, kept for comparison.
        Butterfly => Row {
            name: "butterfly",
            description: "4 KiB clear_page calls from both ends converging on the hint page (the kernel's process_huge_page order)",
            needs: Need::Nothing,
            body: Body::Paged,
            undrained: None,
            mc: None,
        },
        /// 4 KiB clears in address order with a yield point between pages.
        PerPage => Row {
            name: "per-page",
            description: "4 KiB clear_page calls in address order with a yield point between pages",
            needs: Need::Nothing,
            body: Body::Composite(per_page),
            undrained: None,
            mc: None,
        },
        /// `rep stosb` over the whole extent. x86_64 only.
        Stosb => Row {
            name: "stosb",
            description: "rep stosb over the whole extent",
            needs: Need::Nothing,
            body: Body::Range(on_x86!(asm::clear_stosb)),
            undrained: None,
            mc: None,
        },
        /// `rep stosq` over the whole extent. x86_64 only.
        Stosq => Row {
            name: "stosq",
            description: "rep stosq over the whole extent",
            needs: Need::Nothing,
            body: Body::Range(on_x86!(asm::clear_stosq)),
            undrained: None,
            mc: None,
        },
        /// Streaming (non-temporal) stores of whole lines, fenced before
        /// returning: for memory not read again soon. x86_64 only.
        Nt => Row {
            name: "nt",
            description: "zeros stored past the cache by streaming movntdq of whole lines, sfence before returning",
            needs: Need::Nothing,
            body: Body::Range(on_x86!(asm::clear_nt)),
            undrained: on_x86!(asm::clear_nt_nodrain),
            mc: None,
        },
        /// AMD `clzero`, one instruction per 64-byte line, fenced. x86_64
        /// with the CLZERO flag (AMD only).
        Clzero => Row {
            name: "clzero",
            description: "AMD clzero, one instruction per 64-byte line, fenced",
            needs: Need::Clzero,
            body: Body::Range(on_x86!(asm::clear_clzero)),
            undrained: on_x86!(asm::clear_clzero_nodrain),
            mc: None,
        },
        /// The platform `memset`.
        Libc => Row {
            name: "libc",
            description: "the platform memset",
            needs: Need::Nothing,
            body: Body::Composite(libc_memset),
            undrained: None,
            mc: None,
        },
        /// Chosen per batch from the CPU, its cache sizes, the batch's total
        /// size, the reuse hint and the calibration profile; reports say
        /// what it ran.
        #[default]
        Auto => auto_row(),
    }
}

impl ClearStrategy {
    /// The range function a concrete strategy runs, for callers that hand
    /// ranges to someone else (copy channels). `butterfly` has none: it
    /// clears page by page around a hint page, so it is refused rather than
    /// silently replaced. `Auto` is [`StrategyError::Unresolved`] until
    /// [`ClearStrategy::resolve`] picks a concrete strategy.
    pub fn function(self) -> Result<ClearFn, StrategyError> {
        self.row().function(<Self as super::Strategy>::OP)
    }
}

/// The kernel's `clear_page`: `rep stosb` with ERMS, `rep stosq` otherwise;
/// a plain fill on other architectures.
fn page_clear() -> ClearFn {
    static PAGE_CLEAR: OnceLock<ClearFn> = OnceLock::new();
    *PAGE_CLEAR.get_or_init(|| {
        let s = if cpu().features.erms {
            ClearStrategy::Stosb
        } else {
            ClearStrategy::Stosq
        };
        // Unavailable (no such instruction on this architecture): libc.
        s.function().unwrap_or(libc_memset)
    })
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
pub(crate) unsafe fn butterfly(dst: *mut u8, len: usize, hint: usize) {
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

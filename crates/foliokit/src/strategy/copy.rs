//! The copy strategies, one row each. The assembly rows point into
//! `crate::arch`; `per-page` and `libc` are composites written here.

use std::sync::OnceLock;

use super::{auto_row, on_x86, strategies, Body, CopyFn, Need, Row, StrategyError};
use crate::cpu::cpu;
use crate::sys::page_size;

#[cfg(target_arch = "x86_64")]
use crate::arch::x86_64::copy as asm;
#[cfg(target_arch = "x86_64")]
use crate::arch::x86_64::mc as mc_asm;

strategies! {
    /// A way of copying memory. Every variant is callable by name; `Auto`
    /// picks one of the others for the shape of the request.
    pub enum CopyStrategy: "copy", CopyFn {
        /// 4 KiB at a time with a yield point between pages: the kernel's
        /// old per-page folio copy loop, kept as the baseline.
        PerPage => Row {
            name: "per-page",
            description: "one copy_page per 4 KiB with a yield point between pages (the kernel's old folio_copy loop)",
            needs: Need::Nothing,
            body: Body::Composite(per_page),
            undrained: None,
            mc: None,
        },
        /// `rep movsq` over the whole extent (the kernel's `copy_page` on
        /// REP_GOOD CPUs). x86_64 only.
        Movsq => Row {
            name: "movsq",
            description: "rep movsq over the whole extent (the kernel's copy_page on REP_GOOD CPUs)",
            needs: Need::Nothing,
            body: Body::Range(on_x86!(asm::copy_movsq)),
            undrained: None,
            mc: None,
        },
        /// `rep movsb` over the whole extent; fast with ERMS/FSRM, slow on
        /// some AMD parts with a misaligned destination. x86_64 only.
        Movsb => Row {
            name: "movsb",
            description: "rep movsb over the whole extent (fast with ERMS/FSRM)",
            needs: Need::Nothing,
            body: Body::Range(on_x86!(asm::copy_movsb)),
            undrained: None,
            mc: on_x86!(mc_asm::mc_movsb),
        },
        /// Unrolled 64-bit register moves, 64 bytes per iteration (the
        /// kernel's `memcpy_orig`, used when FSRM is absent). x86_64 only.
        Unrolled => Row {
            name: "unrolled",
            description: "unrolled 64-bit register moves, 64 B per iteration (the kernel's memcpy_orig)",
            needs: Need::Nothing,
            body: Body::Range(on_x86!(asm::copy_unrolled)),
            undrained: None,
            mc: None,
        },
        /// 32-byte AVX2 loads and stores. x86_64 with AVX2.
        Avx2 => Row {
            name: "avx2",
            description: "32-byte AVX2 loads and stores, 128 B per iteration",
            needs: Need::Avx2,
            body: Body::Range(on_x86!(asm::copy_avx2)),
            undrained: None,
            mc: on_x86!(mc_asm::mc_avx2),
        },
        /// 64-byte AVX-512 loads and stores. x86_64 with AVX-512F.
        Avx512 => Row {
            name: "avx512",
            description: "64-byte AVX-512 loads and stores, 256 B per iteration",
            needs: Need::Avx512f,
            body: Body::Range(on_x86!(asm::copy_avx512)),
            undrained: None,
            mc: None,
        },
        /// Streaming (non-temporal) stores that bypass the cache, fenced
        /// before returning: for write-once data larger than the cache.
        /// x86_64 only.
        Nt => Row {
            name: "nt",
            description: "cached loads, streaming movntdq stores of whole lines past the cache, sfence before returning",
            needs: Need::Nothing,
            body: Body::Range(on_x86!(asm::copy_nt)),
            undrained: on_x86!(asm::copy_nt_nodrain),
            mc: on_x86!(mc_asm::mc_nt),
        },
        /// The platform `memcpy`.
        Libc => Row {
            name: "libc",
            description: "the platform memcpy",
            needs: Need::Nothing,
            body: Body::Composite(libc_memcpy),
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

impl CopyStrategy {
    /// The function a concrete strategy runs. `Auto` has none of its own:
    /// it is [`StrategyError::Unresolved`] until [`CopyStrategy::resolve`]
    /// picks a concrete strategy for the request's shape.
    pub fn function(self) -> Result<CopyFn, StrategyError> {
        self.row().function(<Self as super::Strategy>::OP)
    }
}

/// The kernel's `cond_resched()` stand-in between per-page operations: a
/// cheap check that lets a long per-page loop be interrupted. Kept out of
/// line so the per-page strategies pay a real call per page, as the kernel
/// loop did.
#[inline(never)]
pub(crate) fn yield_point() {
    if crate::params::YIELD_REQUESTED.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::yield_now();
    }
}

/// The kernel's `copy_page`: `rep movsq` on REP_GOOD CPUs, else the
/// unrolled register loop; a plain copy on other architectures.
fn page_copy() -> CopyFn {
    static PAGE_COPY: OnceLock<CopyFn> = OnceLock::new();
    *PAGE_COPY.get_or_init(|| {
        let s = if cpu().features.rep_good {
            CopyStrategy::Movsq
        } else {
            CopyStrategy::Unrolled
        };
        // Unavailable (no such instruction on this architecture): libc.
        s.function().unwrap_or(libc_memcpy)
    })
}

/// # Safety
/// Both ranges valid for `len` bytes and disjoint.
unsafe fn per_page(dst: *mut u8, src: *const u8, len: usize) {
    let page_copy = page_copy();
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

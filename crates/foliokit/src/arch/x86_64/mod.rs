//! x86_64 primitives and the table mapping strategy names onto them.

pub mod clear;
pub mod copy;

use core::arch::asm;

use crate::clear::ClearStrategy;
use crate::copy::CopyStrategy;
use crate::cpu::Features;

use super::{ClearFn, CopyFn};

/// Orders all earlier stores, including non-temporal ones, before any later
/// store: the drain that makes streaming stores visible.
#[inline]
pub fn sfence() {
    // SAFETY: sfence has no operands and only orders memory operations.
    unsafe { asm!("sfence", options(nostack, preserves_flags)) }
}

/// Why a composite strategy (`per-page`, `libc`, `butterfly`, `auto`) has no
/// primitive here: `CopyStrategy::function` and `ClearStrategy` dispatch
/// resolve those.
const COMPOSITE: &str = "a composite strategy with no single primitive (resolve it through crate::copy or crate::clear)";

/// The primitive a named copy strategy runs, or why this CPU lacks it.
pub fn copy_primitive(s: CopyStrategy, f: &Features) -> Result<CopyFn, &'static str> {
    Ok(match s {
        CopyStrategy::Movsb => copy::copy_movsb,
        CopyStrategy::Movsq => copy::copy_movsq,
        CopyStrategy::Unrolled => copy::copy_unrolled,
        CopyStrategy::Nt => copy::copy_nt,
        CopyStrategy::Avx2 if f.avx2 => copy::copy_avx2,
        CopyStrategy::Avx2 => return Err("CPU or OS lacks AVX2"),
        CopyStrategy::Avx512 if f.avx512f => copy::copy_avx512,
        CopyStrategy::Avx512 => return Err("CPU or OS lacks AVX-512F"),
        CopyStrategy::PerPage | CopyStrategy::Libc | CopyStrategy::Auto => return Err(COMPOSITE),
    })
}

/// The primitive a named clear strategy runs, or why this CPU lacks it.
pub fn clear_primitive(s: ClearStrategy, f: &Features) -> Result<ClearFn, &'static str> {
    Ok(match s {
        ClearStrategy::Stosb => clear::clear_stosb,
        ClearStrategy::Stosq => clear::clear_stosq,
        ClearStrategy::Nt => clear::clear_nt,
        ClearStrategy::Clzero if f.clzero => clear::clear_clzero,
        ClearStrategy::Clzero => return Err("CLZERO is an AMD instruction this CPU lacks"),
        ClearStrategy::Butterfly
        | ClearStrategy::PerPage
        | ClearStrategy::Libc
        | ClearStrategy::Auto => return Err(COMPOSITE),
    })
}

/// The undrained primitive of a streaming copy strategy, for a batch that
/// fences once after its last folio ([`sfence`]) instead of after each;
/// `None` where the strategy's stores are ordinary.
pub fn copy_nodrain(s: CopyStrategy) -> Option<CopyFn> {
    match s {
        CopyStrategy::Nt => Some(copy::copy_nt_nodrain),
        _ => None,
    }
}

/// As [`copy_nodrain`], for clears.
pub fn clear_nodrain(s: ClearStrategy, f: &Features) -> Option<ClearFn> {
    match s {
        ClearStrategy::Nt => Some(clear::clear_nt_nodrain),
        ClearStrategy::Clzero if f.clzero => Some(clear::clear_clzero_nodrain),
        _ => None,
    }
}

/// The kernel's `copy_page`: `rep movsq` on REP_GOOD CPUs, else the unrolled
/// register loop.
pub fn page_copy(f: &Features) -> CopyFn {
    if f.rep_good {
        copy::copy_movsq
    } else {
        copy::copy_unrolled
    }
}

/// The kernel's `clear_page`: `rep stosb` with ERMS, `rep stosq` otherwise.
pub fn page_clear(f: &Features) -> ClearFn {
    if f.erms {
        clear::clear_stosb
    } else {
        clear::clear_stosq
    }
}

/// Writes back and evicts every cache line of `[ptr, ptr+len)`.
///
/// # Safety
/// The range must be mapped (flushing faults on unmapped addresses).
pub unsafe fn flush_range(ptr: *const u8, len: usize, f: &Features) {
    const LINE: usize = 64;
    let start = (ptr as usize) & !(LINE - 1);
    let end = ptr as usize + len;
    let lines = (end - start).div_ceil(LINE);
    if lines == 0 {
        return;
    }
    if f.clflushopt {
        // SAFETY: every address flushed is inside a line that overlaps the
        // mapped range (caller's precondition); clflushopt only evicts.
        // Contract: in rax=first line, rcx=lines (>0, consumed); flags clobbered.
        unsafe {
            asm!(
                "2:",
                "clflushopt byte ptr [rax]",
                "add rax, 64",
                "dec rcx",
                "jnz 2b",
                inout("rax") start => _,
                inout("rcx") lines => _,
                options(nostack),
            );
        }
        // clflushopt is only ordered by a fence.
        sfence();
    } else {
        // SAFETY: as above; clflush is ordered with respect to stores.
        unsafe {
            asm!(
                "2:",
                "clflush byte ptr [rax]",
                "add rax, 64",
                "dec rcx",
                "jnz 2b",
                inout("rax") start => _,
                inout("rcx") lines => _,
                options(nostack),
            );
        }
    }
}

/// Whether this build can evict lines from the cache.
pub const CAN_FLUSH: bool = true;

/// Streams `len` bytes without draining, taking the small-record path for
/// short, 16-byte-aligned multiples of 16 (seed 003's 64-byte records).
///
/// # Safety
/// As [`copy::copy_nt_nodrain`].
#[inline]
pub unsafe fn stream_nodrain(dst: *mut u8, src: *const u8, len: usize) {
    if len <= 256 && len % 16 == 0 && (dst as usize) % 16 == 0 {
        // SAFETY: forwarded contract; alignment and length checked above.
        unsafe { copy::stream16_nodrain(dst, src, len) }
    } else {
        // SAFETY: forwarded contract.
        unsafe { copy::copy_nt_nodrain(dst, src, len) }
    }
}

pub use copy::{stream_record_nodrain, stream_words_nodrain};

/// Whether this build has real streaming stores (else they are ordinary).
pub const HAS_STREAMING: bool = true;

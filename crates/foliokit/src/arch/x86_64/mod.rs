//! x86_64 primitives.

pub mod clear;
pub mod copy;

use core::arch::asm;

/// Orders all earlier stores, including non-temporal ones, before any later
/// store: the drain that makes streaming stores visible.
#[inline]
pub fn sfence() {
    // SAFETY: sfence has no operands and only orders memory operations.
    unsafe { asm!("sfence", options(nostack, preserves_flags)) }
}

/// Writes back and evicts every cache line of `[ptr, ptr+len)`, with
/// `clflushopt` where the CPU has it (`clflushopt`), else `clflush`.
///
/// # Safety
/// The range must be mapped (flushing faults on unmapped addresses).
pub unsafe fn flush_range(ptr: *const u8, len: usize, clflushopt: bool) {
    const LINE: usize = 64;
    let start = (ptr as usize) & !(LINE - 1);
    let end = ptr as usize + len;
    let lines = (end - start).div_ceil(LINE);
    if lines == 0 {
        return;
    }
    // The two loops differ only in the instruction.
    macro_rules! flush_lines {
        ($insn:literal) => {
            // SAFETY: every address flushed is inside a line that overlaps
            // the mapped range (caller's precondition); flushing only evicts.
            // Contract: in rax=first line, rcx=lines (>0, consumed); flags
            // clobbered.
            unsafe {
                asm!(
                    "2:",
                    concat!($insn, " byte ptr [rax]"),
                    "add rax, 64",
                    "dec rcx",
                    "jnz 2b",
                    inout("rax") start => _,
                    inout("rcx") lines => _,
                    options(nostack),
                )
            }
        };
    }
    if clflushopt {
        flush_lines!("clflushopt");
        // clflushopt is only ordered by a fence.
        sfence();
    } else {
        // clflush is ordered with respect to stores.
        flush_lines!("clflush");
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

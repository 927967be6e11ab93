//! x86_64 primitives.
//!
//! The copy and clear twins share their loop structure here: the
//! head/blocks/tail split ([`split_blocks`]), the register tail loop
//! (`words_then_bytes!`), the `rep` string pair (`rep_quads_then_bytes!`)
//! and the once-per-cache-line loop (`per_line!`); each primitive supplies
//! only its instructions, and compiles to the same instructions it had
//! when each was written out in full.

use core::arch::asm;

/// The register tail loop of the copies and the fills, as one `asm!`:
/// `rcx / 8` passes of the `$word` instructions (8 bytes each, pointers
/// advanced by them), then `rcx % 8` passes of the `$byte` ones. The
/// caller passes `rcx` (consumed) and the other operands; `{q}` is the
/// loop's own scratch counter. Clobbers flags.
macro_rules! words_then_bytes {
    ([$($word:literal),+ $(,)?], [$($byte:literal),+ $(,)?], $($operands:tt)+) => {
        asm!(
            "mov {q}, rcx",
            "shr {q}, 3",
            "jz 3f",
            "2:",
            $($word,)+
            "dec {q}",
            "jnz 2b",
            "3:",
            "and rcx, 7",
            "jz 5f",
            "4:",
            $($byte,)+
            "dec rcx",
            "jnz 4b",
            "5:",
            q = out(reg) _,
            $($operands)+
        )
    };
}

/// `rep <op>q` over `len / 8` quadwords, then `rep <op>b` over the
/// `len % 8` bytes left (`movs`: the kernel's `copy_page`; `stos`: its
/// clear). The caller passes the pointer and value operands; flags are
/// preserved.
macro_rules! rep_quads_then_bytes {
    ($op:literal, $len:expr, $($operands:tt)+) => {
        asm!(
            concat!("rep ", $op, "q"),
            "mov rcx, {tail}",
            concat!("rep ", $op, "b"),
            tail = in(reg) $len & 7,
            inout("rcx") $len >> 3 => _,
            $($operands)+
            options(nostack, preserves_flags),
        )
    };
}

/// One instruction per 64-byte line: `$insn` (which addresses the line
/// at `rax`) for `$lines` (> 0) lines from `$start`. Contract: in
/// rax=first line, rcx=lines (both consumed); clobbers flags.
macro_rules! per_line {
    ($insn:literal, $start:expr, $lines:expr) => {
        asm!(
            "2:",
            $insn,
            "add rax, 64",
            "dec rcx",
            "jnz 2b",
            inout("rax") $start => _,
            inout("rcx") $lines => _,
            options(nostack),
        )
    };
}

pub mod clear;
pub mod copy;
pub mod mc;

/// The loop structure every block primitive shares: the range of `len`
/// bytes at `addr` splits into a head up to the first `ALIGN`-aligned
/// address, as many whole `BLOCK`-byte blocks as follow, and the tail.
/// `edge(off, n)` handles the head (only when `ALIGN > 1`) and the tail;
/// `body(off, blocks)` the blocks, only when there is at least one.
///
/// Guarantees the closures may rely on: every `[off, off + n)` and `[off,
/// off + blocks * BLOCK)` lies inside `[0, len)`, the pieces are disjoint
/// and in order and together cover it, and `addr + off` is
/// `ALIGN`-aligned when `body` runs. Inlined, it compiles to the plain
/// sequence of the three steps.
#[inline(always)]
pub fn split_blocks<const ALIGN: usize, const BLOCK: usize>(
    addr: usize,
    len: usize,
    mut edge: impl FnMut(usize, usize),
    body: impl FnOnce(usize, usize),
) {
    const { assert!(ALIGN.is_power_of_two() && BLOCK > 0) };
    let head = if ALIGN > 1 {
        (addr.wrapping_neg() & (ALIGN - 1)).min(len)
    } else {
        0
    };
    if ALIGN > 1 {
        edge(0, head);
    }
    let blocks = (len - head) / BLOCK;
    if blocks > 0 {
        // Either head == len (then blocks == 0) or head is the distance
        // to the next ALIGN boundary: addr + head is aligned.
        body(head, blocks);
    }
    let done = head + blocks * BLOCK;
    edge(done, len - done);
}

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
    if clflushopt {
        // SAFETY: every address flushed is inside a line that overlaps the
        // mapped range (caller's precondition); flushing only evicts.
        unsafe { per_line!("clflushopt byte ptr [rax]", start, lines) };
        // clflushopt is only ordered by a fence.
        sfence();
    } else {
        // SAFETY: as for clflushopt. clflush is ordered with respect to
        // stores: no fence.
        unsafe { per_line!("clflush byte ptr [rax]", start, lines) };
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

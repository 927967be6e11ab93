//! x86_64 probes of what memory can do: a plain sequential read and
//! streaming writes of zeros and of other bytes (ordinary stores for
//! cache-resident buffers). They have the clear
//! primitives' signature (`unsafe fn(ptr, len)`) so the channel pool can
//! spread them like any clear; [`crate::measure`] runs them beside the
//! strategies to give each run its own limit.

use core::arch::asm;

use foliokit::internals::{split_blocks, x86_clear as clear};

/// The non-zero byte the write probe stores (some CPUs stream zeros faster).
pub const PATTERN: u8 = 0x5A;

/// Reads every byte of `[ptr, ptr + len)` with 16-byte loads, 64 bytes per
/// iteration (what a plain streaming read loop does); writes nothing.
///
/// # Safety
/// The range must be mapped and readable. (`ptr` is `*mut` only to share
/// the clear primitives' signature.)
pub unsafe fn read_probe(ptr: *mut u8, len: usize) {
    split_blocks::<16, 64>(
        ptr as usize,
        len,
        // Head and tail bytes (none for page-sized buffers) are read too.
        |off, n| {
            for off in off..off + n {
                // SAFETY: split_blocks keeps off < len, inside the readable
                // range.
                unsafe { core::ptr::read_volatile(ptr.add(off)) };
            }
        },
        |off, blocks| {
            // SAFETY: split_blocks hands ptr+off 16-byte aligned, as movdqa
            // requires, with blocks*64 <= len-off bytes inside the range.
            // Contract: in rsi=ptr+off, rcx=blocks (>0, consumed);
            //           clobbers xmm0-xmm3, flags; reads memory only.
            unsafe {
                asm!(
                    "2:",
                    "movdqa xmm0, xmmword ptr [rsi]",
                    "movdqa xmm1, xmmword ptr [rsi + 16]",
                    "movdqa xmm2, xmmword ptr [rsi + 32]",
                    "movdqa xmm3, xmmword ptr [rsi + 48]",
                    "add rsi, 64",
                    "dec rcx",
                    "jnz 2b",
                    inout("rcx") blocks => _,
                    inout("rsi") ptr.add(off) => _,
                    out("xmm0") _,
                    out("xmm1") _,
                    out("xmm2") _,
                    out("xmm3") _,
                    options(nostack, readonly),
                );
            }
        },
    );
}

/// Streams [`PATTERN`] over `[dst, dst + len)` with `movntdq`, then `sfence`:
/// the write probe for data that is not zero (copies, template init).
///
/// # Safety
/// The range must be valid for writes.
pub unsafe fn write_probe(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract; drained right after.
    unsafe { clear::fill_nt_nodrain(dst, len, PATTERN) };
    foliokit::internals::sfence();
}

/// Stores [`PATTERN`] over `[dst, dst + len)` with ordinary stores: the
/// write probe of a cache-resident buffer, which streaming stores would
/// push out to memory.
///
/// # Safety
/// The range must be valid for writes.
pub unsafe fn write_cached_probe(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { fill_cached(dst, len, PATTERN) }
}

/// Stores zeros over `[dst, dst + len)` with ordinary stores: the
/// zero-write probe of a cache-resident buffer.
///
/// # Safety
/// The range must be valid for writes.
pub unsafe fn write_zero_cached_probe(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { fill_cached(dst, len, 0) }
}

/// The fastest ordinary fill of a cached range: `rep stosb` where the CPU
/// has ERMS (measured ahead of a 16-byte store loop in cache here), else
/// `rep stosq`, the kernel's choice without it.
///
/// # Safety
/// The range must be valid for writes.
unsafe fn fill_cached(dst: *mut u8, len: usize, byte: u8) {
    if foliokit::cpu::cpu().features.erms {
        // SAFETY: forwarded contract.
        unsafe { clear::fill_stosb(dst, len, byte) }
    } else {
        // SAFETY: forwarded contract.
        unsafe { clear::fill_stosq(dst, len, byte) }
    }
}

/// Writes zeros the fastest way this CPU streams them: `clzero` where the
/// CPU has it (AMD; it zeroes a line without reading it and beats
/// `movntdq`), else `movntdq` of a zero register; drained. The write probe
/// for clears and faults.
///
/// # Safety
/// The range must be valid for writes.
pub unsafe fn write_zero_probe(dst: *mut u8, len: usize) {
    if foliokit::cpu::cpu().features.clzero {
        // SAFETY: forwarded contract; the CPU has CLZERO.
        unsafe { clear::clear_clzero(dst, len) }
    } else {
        // SAFETY: forwarded contract.
        unsafe { clear::clear_nt(dst, len) }
    }
}

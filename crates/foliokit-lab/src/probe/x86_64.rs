//! x86_64 probes of what memory can do: a plain sequential read and
//! streaming writes of zeros and of other bytes. They have the clear
//! primitives' signature (`unsafe fn(ptr, len)`) so the channel pool can
//! spread them like any clear; [`crate::measure`] runs them beside the
//! strategies to give each run its own limit.

use core::arch::asm;

/// The non-zero byte the write probe stores (some CPUs stream zeros faster).
pub const PATTERN: u8 = 0x5A;

/// Reads every byte of `[ptr, ptr + len)` with 16-byte loads, 64 bytes per
/// iteration (what a plain streaming read loop does); writes nothing.
///
/// # Safety
/// The range must be mapped and readable. (`ptr` is `*mut` only to share
/// the clear primitives' signature.)
pub unsafe fn read_probe(ptr: *mut u8, len: usize) {
    let head = ((ptr as usize).wrapping_neg() & 15).min(len);
    let blocks = (len - head) / 64;
    if blocks > 0 {
        // SAFETY: ptr+head is 16-byte aligned as movdqa requires; the loop
        // reads blocks*64 <= len-head bytes inside the range.
        // Contract: in rsi=ptr+head, rcx=blocks (>0, consumed);
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
                inout("rsi") ptr.add(head) => _,
                out("xmm0") _,
                out("xmm1") _,
                out("xmm2") _,
                out("xmm3") _,
                options(nostack, readonly),
            );
        }
    }
    // Head and tail bytes (none for page-sized buffers) are read too.
    let done = head + blocks * 64;
    for off in (0..head).chain(done..len) {
        // SAFETY: off < len, inside the readable range.
        unsafe { core::ptr::read_volatile(ptr.add(off)) };
    }
}

/// Streams [`PATTERN`] over `[dst, dst + len)` with `movntdq`, then `sfence`:
/// the write probe for data that is not zero (copies, template init).
///
/// # Safety
/// The range must be valid for writes.
pub unsafe fn write_probe(dst: *mut u8, len: usize) {
    let head = ((dst as usize).wrapping_neg() & 15).min(len);
    // SAFETY: head <= len, inside the range.
    unsafe { core::ptr::write_bytes(dst, PATTERN, head) };
    let blocks = (len - head) / 64;
    if blocks > 0 {
        // SAFETY: dst+head is 16-byte aligned as movntdq requires; the loop
        // stores blocks*64 <= len-head bytes inside the range.
        // Contract: in rdi=dst+head, rcx=blocks (>0, consumed), rax=pattern
        //           (8 copies of PATTERN); clobbers xmm0, flags.
        unsafe {
            asm!(
                "movq xmm0, rax",
                "punpcklqdq xmm0, xmm0",
                "2:",
                "movntdq xmmword ptr [rdi],      xmm0",
                "movntdq xmmword ptr [rdi + 16], xmm0",
                "movntdq xmmword ptr [rdi + 32], xmm0",
                "movntdq xmmword ptr [rdi + 48], xmm0",
                "add rdi, 64",
                "dec rcx",
                "jnz 2b",
                inout("rcx") blocks => _,
                inout("rdi") dst.add(head) => _,
                in("rax") u64::from_ne_bytes([PATTERN; 8]),
                out("xmm0") _,
                options(nostack),
            );
        }
    }
    let done = head + blocks * 64;
    // SAFETY: done <= len.
    unsafe { core::ptr::write_bytes(dst.add(done), PATTERN, len - done) };
    foliokit::arch::sfence();
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
        unsafe { foliokit::arch::x86_64::clear::clear_clzero(dst, len) }
    } else {
        // SAFETY: forwarded contract.
        unsafe { foliokit::arch::x86_64::clear::clear_nt(dst, len) }
    }
}

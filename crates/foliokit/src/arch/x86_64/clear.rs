//! x86_64 clear (zero-fill) primitives: `unsafe fn(dst, len)`.
//!
//! Inline asm for the same reason as the copies: the named instructions must
//! be the ones that run, not a `memset` the compiler substituted.

use core::arch::asm;

/// Zeroes `len` bytes with 8-byte then 1-byte register stores.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
#[inline]
pub unsafe fn clear_tail(dst: *mut u8, len: usize) {
    // SAFETY: the caller guarantees [dst, dst+len) is writable; the loops
    // store exactly that range.
    // Contract: in rdi=dst, rcx=len (consumed); clobbers flags.
    unsafe {
        asm!(
            "mov {q}, rcx",
            "shr {q}, 3",
            "jz 3f",
            "2:",
            "mov qword ptr [rdi], 0",
            "add rdi, 8",
            "dec {q}",
            "jnz 2b",
            "3:",
            "and rcx, 7",
            "jz 5f",
            "4:",
            "mov byte ptr [rdi], 0",
            "inc rdi",
            "dec rcx",
            "jnz 4b",
            "5:",
            q = out(reg) _,
            inout("rcx") len => _,
            inout("rdi") dst => _,
            options(nostack),
        );
    }
}

/// `rep stosb` over the whole extent.
///
/// # Safety
/// As [`clear_tail`].
pub unsafe fn clear_stosb(dst: *mut u8, len: usize) {
    // SAFETY: caller guarantees [dst, dst+len) is writable.
    // Contract: in rdi=dst, rcx=len, al=0; flags preserved.
    unsafe {
        asm!(
            "rep stosb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            in("al") 0u8,
            options(nostack, preserves_flags),
        );
    }
}

/// `rep stosq` over the 8-byte body, `rep stosb` for the tail.
///
/// # Safety
/// As [`clear_tail`].
pub unsafe fn clear_stosq(dst: *mut u8, len: usize) {
    // SAFETY: caller guarantees [dst, dst+len) is writable; the two string
    // ops store exactly `len` bytes.
    // Contract: in rdi=dst, rcx=len/8 then len%8, rax=0; flags preserved.
    unsafe {
        asm!(
            "rep stosq",
            "mov rcx, {tail}",
            "rep stosb",
            tail = in(reg) len & 7,
            inout("rcx") len >> 3 => _,
            inout("rdi") dst => _,
            in("rax") 0u64,
            options(nostack, preserves_flags),
        );
    }
}

/// Streaming zero-fill: `movntdq` of whole 64-byte lines, then `sfence`.
///
/// # Safety
/// As [`clear_tail`].
pub unsafe fn clear_nt(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { clear_nt_nodrain(dst, len) };
    super::sfence();
}

/// [`clear_nt`] without the closing `sfence`: the caller drains, once for
/// many calls.
///
/// # Safety
/// As [`clear_tail`]; and the stores are ordered with later ones only once
/// this thread executes `sfence`.
pub unsafe fn clear_nt_nodrain(dst: *mut u8, len: usize) {
    let head = ((dst as usize).wrapping_neg() & 15).min(len);
    // SAFETY: `head <= len`, inside the range.
    unsafe { clear_tail(dst, head) };
    let blocks = (len - head) / 64;
    if blocks > 0 {
        // SAFETY: dst+head is 16-byte aligned as movntdq requires; the loop
        // stores blocks*64 <= len-head bytes inside the range.
        // Contract: in rdi=dst+head, rcx=blocks (>0, consumed);
        //           clobbers xmm0, flags.
        unsafe {
            asm!(
                "pxor xmm0, xmm0",
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
                out("xmm0") _,
                options(nostack),
            );
        }
    }
    let done = head + blocks * 64;
    // SAFETY: `done <= len`.
    unsafe { clear_tail(dst.add(done), len - done) };
}

/// AMD `clzero`: zeroes one aligned 64-byte line per instruction without
/// reading it; unaligned head and tail use ordinary stores. Fenced, since
/// `clzero` stores are weakly ordered.
///
/// # Safety
/// As [`clear_tail`], and the CPU must support CLZERO.
pub unsafe fn clear_clzero(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { clear_clzero_nodrain(dst, len) };
    super::sfence();
}

/// [`clear_clzero`] without the closing `sfence`: the caller drains, once
/// for many calls.
///
/// # Safety
/// As [`clear_clzero`]; and the stores are ordered with later ones only
/// once this thread executes `sfence`.
pub unsafe fn clear_clzero_nodrain(dst: *mut u8, len: usize) {
    let head = ((dst as usize).wrapping_neg() & 63).min(len);
    // SAFETY: `head <= len`.
    unsafe { clear_tail(dst, head) };
    let lines = (len - head) / 64;
    if lines > 0 {
        // SAFETY: dst+head is line-aligned, so each clzero zeroes exactly the
        // line at rax, all inside the range; CLZERO support is the caller's
        // precondition. Encoded as bytes (0f 01 fc) for older assemblers.
        // Contract: in rax=dst+head (line-aligned), rcx=lines (>0, consumed);
        //           clobbers flags.
        unsafe {
            asm!(
                "2:",
                ".byte 0x0f, 0x01, 0xfc",
                "add rax, 64",
                "dec rcx",
                "jnz 2b",
                inout("rcx") lines => _,
                inout("rax") dst.add(head) => _,
                options(nostack),
            );
        }
    }
    let done = head + lines * 64;
    // SAFETY: `done <= len`.
    unsafe { clear_tail(dst.add(done), len - done) };
}

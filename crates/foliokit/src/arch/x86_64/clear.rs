//! x86_64 clear (zero-fill) primitives: `unsafe fn(dst, len)`, each built
//! on a fill of any byte (`fill_*`), which the lab's write probes share.
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
    // SAFETY: forwarded contract.
    unsafe { fill_tail(dst, len, 0) }
}

/// Fills `len` bytes with `byte`, 8-byte then 1-byte register stores.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
#[inline]
pub unsafe fn fill_tail(dst: *mut u8, len: usize, byte: u8) {
    // SAFETY: the caller guarantees [dst, dst+len) is writable; the loops
    // store exactly that range.
    // Contract: in rdi=dst, rcx=len (consumed), rax=8 copies of byte;
    //           clobbers flags.
    unsafe {
        asm!(
            "mov {q}, rcx",
            "shr {q}, 3",
            "jz 3f",
            "2:",
            "mov qword ptr [rdi], rax",
            "add rdi, 8",
            "dec {q}",
            "jnz 2b",
            "3:",
            "and rcx, 7",
            "jz 5f",
            "4:",
            "mov byte ptr [rdi], al",
            "inc rdi",
            "dec rcx",
            "jnz 4b",
            "5:",
            q = out(reg) _,
            inout("rcx") len => _,
            inout("rdi") dst => _,
            in("rax") u64::from_ne_bytes([byte; 8]),
            options(nostack),
        );
    }
}

/// `rep stosb` over the whole extent.
///
/// # Safety
/// As [`clear_tail`].
pub unsafe fn clear_stosb(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { fill_stosb(dst, len, 0) }
}

/// `rep stosb` of `byte` over the whole extent.
///
/// # Safety
/// As [`clear_tail`].
pub unsafe fn fill_stosb(dst: *mut u8, len: usize, byte: u8) {
    // SAFETY: caller guarantees [dst, dst+len) is writable.
    // Contract: in rdi=dst, rcx=len, al=byte; flags preserved.
    unsafe {
        asm!(
            "rep stosb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            in("al") byte,
            options(nostack, preserves_flags),
        );
    }
}

/// `rep stosq` over the 8-byte body, `rep stosb` for the tail.
///
/// # Safety
/// As [`clear_tail`].
pub unsafe fn clear_stosq(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { fill_stosq(dst, len, 0) }
}

/// `rep stosq` of `byte` over the 8-byte body, `rep stosb` for the tail.
///
/// # Safety
/// As [`clear_tail`].
pub unsafe fn fill_stosq(dst: *mut u8, len: usize, byte: u8) {
    // SAFETY: caller guarantees [dst, dst+len) is writable; the two string
    // ops store exactly `len` bytes.
    // Contract: in rdi=dst, rcx=len/8 then len%8, rax=8 copies of byte;
    //           flags preserved.
    unsafe {
        asm!(
            "rep stosq",
            "mov rcx, {tail}",
            "rep stosb",
            tail = in(reg) len & 7,
            inout("rcx") len >> 3 => _,
            inout("rdi") dst => _,
            in("rax") u64::from_ne_bytes([byte; 8]),
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
    // SAFETY: forwarded contract.
    unsafe { fill_nt_nodrain(dst, len, 0) }
}

/// Streams `byte` over the range: `movntdq` of whole 64-byte lines, register
/// stores for the unaligned head and the tail; not drained.
///
/// # Safety
/// As [`clear_nt_nodrain`].
pub unsafe fn fill_nt_nodrain(dst: *mut u8, len: usize, byte: u8) {
    let head = ((dst as usize).wrapping_neg() & 15).min(len);
    // SAFETY: `head <= len`, inside the range.
    unsafe { fill_tail(dst, head, byte) };
    let blocks = (len - head) / 64;
    if blocks > 0 {
        // SAFETY: dst+head is 16-byte aligned as movntdq requires; the loop
        // stores blocks*64 <= len-head bytes inside the range.
        // Contract: in rdi=dst+head, rcx=blocks (>0, consumed), rax=8
        //           copies of byte; clobbers xmm0, flags.
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
                in("rax") u64::from_ne_bytes([byte; 8]),
                out("xmm0") _,
                options(nostack),
            );
        }
    }
    let done = head + blocks * 64;
    // SAFETY: `done <= len`.
    unsafe { fill_tail(dst.add(done), len - done, byte) };
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

//! x86_64 clear (zero-fill) primitives: `unsafe fn(dst, len)`, each built
//! on a fill of any byte (`fill_*`), which the lab's write probes share.
//!
//! Inline asm for the same reason as the copies: the named instructions must
//! be the ones that run, not a `memset` the compiler substituted.

use core::arch::asm;

use super::split_blocks;

/// Each `clear_x(dst, len)` is `fill_x(dst, len, 0)`.
macro_rules! zero_fill {
    ($($(#[$doc:meta])* $clear:ident = $fill:ident;)+) => {
        $(
            $(#[$doc])*
            pub unsafe fn $clear(dst: *mut u8, len: usize) {
                // SAFETY: forwarded contract.
                unsafe { $fill(dst, len, 0) }
            }
        )+
    };
}

zero_fill! {
    /// `rep stosb` over the whole extent.
    ///
    /// # Safety
    /// As [`fill_tail`].
    clear_stosb = fill_stosb;
    /// `rep stosq` over the 8-byte body, `rep stosb` for the tail.
    ///
    /// # Safety
    /// As [`fill_tail`].
    clear_stosq = fill_stosq;
    /// [`clear_nt`] without the closing `sfence`: the caller drains, once for
    /// many calls.
    ///
    /// # Safety
    /// As [`fill_tail`]; and the stores are ordered with later ones only once
    /// this thread executes `sfence`.
    clear_nt_nodrain = fill_nt_nodrain;
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
        words_then_bytes!(
            ["mov qword ptr [rdi], rax", "add rdi, 8"],
            ["mov byte ptr [rdi], al", "inc rdi"],
            inout("rcx") len => _,
            inout("rdi") dst => _,
            in("rax") u64::from_ne_bytes([byte; 8]),
            options(nostack),
        );
    }
}

/// `rep stosb` of `byte` over the whole extent.
///
/// # Safety
/// As [`fill_tail`].
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

/// `rep stosq` of `byte` over the 8-byte body, `rep stosb` for the tail.
///
/// # Safety
/// As [`fill_tail`].
pub unsafe fn fill_stosq(dst: *mut u8, len: usize, byte: u8) {
    // SAFETY: caller guarantees [dst, dst+len) is writable; the two string
    // ops store exactly `len` bytes.
    // Contract: in rdi=dst, rcx=len/8 then len%8, rax=8 copies of byte;
    //           flags preserved.
    unsafe {
        rep_quads_then_bytes!(
            "stos",
            len,
            inout("rdi") dst => _,
            in("rax") u64::from_ne_bytes([byte; 8]),
        )
    }
}

/// The structure of every block fill: [`split_blocks`] with the head and
/// tail stored by [`fill_tail`], the `BLOCK`-byte blocks by `body(dst',
/// blocks)`.
///
/// # Safety
/// As [`fill_tail`]. `body` is called (at most once) with `dst'`
/// `ALIGN`-aligned, `blocks > 0`, and `blocks * BLOCK` bytes at `dst'`
/// inside the range.
#[inline(always)]
unsafe fn fill_blocks<const ALIGN: usize, const BLOCK: usize>(
    dst: *mut u8,
    len: usize,
    byte: u8,
    body: impl FnOnce(*mut u8, usize),
) {
    split_blocks::<ALIGN, BLOCK>(
        dst as usize,
        len,
        // SAFETY: split_blocks keeps [off, off + n) inside [0, len), which
        // is writable (caller's contract).
        |off, n| unsafe { fill_tail(dst.add(off), n, byte) },
        // SAFETY: as above, for the blocks' offset.
        |off, blocks| body(unsafe { dst.add(off) }, blocks),
    );
}

/// Streaming zero-fill: `movntdq` of whole 64-byte lines, then `sfence`.
///
/// # Safety
/// As [`fill_tail`].
pub unsafe fn clear_nt(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { clear_nt_nodrain(dst, len) };
    super::sfence();
}

/// Streams `byte` over the range: `movntdq` of whole 64-byte lines, register
/// stores for the unaligned head and the tail; not drained.
///
/// # Safety
/// As [`clear_nt_nodrain`].
pub unsafe fn fill_nt_nodrain(dst: *mut u8, len: usize, byte: u8) {
    let body = |dst: *mut u8, blocks: usize| {
        // SAFETY: fill_blocks hands dst 16-byte aligned, as movntdq
        // requires, and blocks*64 writable bytes there.
        // Contract: in rdi=dst, rcx=blocks (>0, consumed), rax=8 copies of
        //           byte; clobbers xmm0, flags.
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
                inout("rdi") dst => _,
                in("rax") u64::from_ne_bytes([byte; 8]),
                out("xmm0") _,
                options(nostack),
            );
        }
    };
    // SAFETY: forwarded contract.
    unsafe { fill_blocks::<16, 64>(dst, len, byte, body) }
}

/// AMD `clzero`: zeroes one aligned 64-byte line per instruction without
/// reading it; unaligned head and tail use ordinary stores. Fenced, since
/// `clzero` stores are weakly ordered.
///
/// # Safety
/// As [`fill_tail`], and the CPU must support CLZERO.
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
    let body = |dst: *mut u8, lines: usize| {
        // SAFETY: fill_blocks hands dst line-aligned, so each clzero zeroes
        // exactly the line at rax, all inside the range; CLZERO support is
        // the caller's precondition. Encoded as bytes (0f 01 fc) for older
        // assemblers.
        unsafe { per_line!(".byte 0x0f, 0x01, 0xfc", dst, lines) }
    };
    // SAFETY: forwarded contract.
    unsafe { fill_blocks::<64, 64>(dst, len, 0, body) }
}

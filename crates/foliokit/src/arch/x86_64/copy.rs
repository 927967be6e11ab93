//! x86_64 copy primitives.
//!
//! Every primitive has the signature `unsafe fn(dst, src, len)` and copies
//! exactly `len` bytes. They are written in inline asm so that the compiler
//! cannot replace a loop by a call to `memcpy`: a strategy's name must be the
//! instructions that run. The direction flag is clear on entry by the ABI.

use core::arch::asm;

/// Copies `len` bytes with 8-byte then 1-byte register moves.
///
/// The tail helper shared by every bulk primitive below (and the whole of a
/// short copy): no string instructions, no vectors.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the
/// ranges must not overlap.
#[inline]
pub unsafe fn copy_tail(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller guarantees both ranges are valid and disjoint; the
    // loops below touch exactly [src, src+len) and [dst, dst+len).
    //
    // Contract: in  rdi=dst, rsi=src, rcx=len (all consumed)
    //           clobbers r8, flags; memory is written.
    unsafe {
        asm!(
            "mov {q}, rcx",
            "shr {q}, 3",
            "jz 3f",
            "2:",
            "mov r8, qword ptr [rsi]",
            "mov qword ptr [rdi], r8",
            "add rsi, 8",
            "add rdi, 8",
            "dec {q}",
            "jnz 2b",
            "3:",
            "and rcx, 7",
            "jz 5f",
            "4:",
            "mov r8b, byte ptr [rsi]",
            "mov byte ptr [rdi], r8b",
            "inc rsi",
            "inc rdi",
            "dec rcx",
            "jnz 4b",
            "5:",
            q = out(reg) _,
            inout("rcx") len => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            out("r8") _,
            options(nostack),
        );
    }
}

/// `rep movsb`: the CPU's microcoded byte string copy (fast with ERMS/FSRM).
///
/// # Safety
/// As [`copy_tail`].
pub unsafe fn copy_movsb(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: caller guarantees valid, disjoint ranges of `len` bytes.
    // Contract: in rdi=dst, rsi=src, rcx=len (consumed); flags preserved.
    unsafe {
        asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags),
        );
    }
}

/// `rep movsq` over the 8-byte body, `rep movsb` for the tail: the kernel's
/// `copy_page` on REP_GOOD CPUs.
///
/// # Safety
/// As [`copy_tail`].
pub unsafe fn copy_movsq(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: caller guarantees valid, disjoint ranges of `len` bytes; the
    // two string ops together move exactly `len` bytes.
    // Contract: in rdi=dst, rsi=src, rcx=len/8 then len%8; flags preserved.
    unsafe {
        asm!(
            "rep movsq",
            "mov rcx, {tail}",
            "rep movsb",
            tail = in(reg) len & 7,
            inout("rcx") len >> 3 => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags),
        );
    }
}

/// Unrolled 64-bit register moves, 64 bytes per iteration: the kernel's
/// `memcpy_orig`, which a CPU without FSRM/ERMS gets for `memcpy`.
///
/// # Safety
/// As [`copy_tail`].
pub unsafe fn copy_unrolled(dst: *mut u8, src: *const u8, len: usize) {
    let blocks = len / 64;
    if blocks > 0 {
        // SAFETY: caller guarantees valid, disjoint ranges; the loop moves
        // exactly blocks*64 <= len bytes from the start of each range.
        // Contract: in rdi=dst, rsi=src, rcx=blocks (>0, consumed);
        //           clobbers r8-r11, flags.
        unsafe {
            asm!(
                "2:",
                "mov r8,  qword ptr [rsi]",
                "mov r9,  qword ptr [rsi + 8]",
                "mov r10, qword ptr [rsi + 16]",
                "mov r11, qword ptr [rsi + 24]",
                "mov qword ptr [rdi],      r8",
                "mov qword ptr [rdi + 8],  r9",
                "mov qword ptr [rdi + 16], r10",
                "mov qword ptr [rdi + 24], r11",
                "mov r8,  qword ptr [rsi + 32]",
                "mov r9,  qword ptr [rsi + 40]",
                "mov r10, qword ptr [rsi + 48]",
                "mov r11, qword ptr [rsi + 56]",
                "mov qword ptr [rdi + 32], r8",
                "mov qword ptr [rdi + 40], r9",
                "mov qword ptr [rdi + 48], r10",
                "mov qword ptr [rdi + 56], r11",
                "lea rsi, [rsi + 64]",
                "lea rdi, [rdi + 64]",
                "dec rcx",
                "jnz 2b",
                inout("rcx") blocks => _,
                inout("rdi") dst => _,
                inout("rsi") src => _,
                out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                options(nostack),
            );
        }
    }
    let done = blocks * 64;
    // SAFETY: `done <= len`, so the remainder lies inside both ranges.
    unsafe { copy_tail(dst.add(done), src.add(done), len - done) }
}

/// A vector copy loop: four unaligned loads then four stores of one
/// register width per iteration, `vzeroupper` after the loop (no SSE
/// penalties for the caller), the remainder by [`copy_tail`]. The AVX2 and
/// AVX-512 copies differ only in the width, the move and the registers.
macro_rules! vector_copy {
    ($(#[$doc:meta])* $name:ident, $feature:literal, $width:literal, $mov:literal, $word:literal,
     [$r0:tt, $r1:tt, $r2:tt, $r3:tt]) => {
        $(#[$doc])*
        #[target_feature(enable = $feature)]
        pub unsafe fn $name(dst: *mut u8, src: *const u8, len: usize) {
            let step = 4 * $width;
            let blocks = len / step;
            if blocks > 0 {
                // SAFETY: the feature is enabled for this function (the
                // caller checked the CPU); the loop moves blocks*step <=
                // len bytes from the start of both valid, disjoint ranges.
                // Contract: in rdi=dst, rsi=src, rcx=blocks (>0, consumed);
                //           clobbers the four vector registers, flags.
                unsafe {
                    asm!(
                        "2:",
                        concat!($mov, " ", $r0, ", ", $word, " ptr [rsi]"),
                        concat!($mov, " ", $r1, ", ", $word, " ptr [rsi + ", $width, "]"),
                        concat!($mov, " ", $r2, ", ", $word, " ptr [rsi + 2*", $width, "]"),
                        concat!($mov, " ", $r3, ", ", $word, " ptr [rsi + 3*", $width, "]"),
                        concat!($mov, " ", $word, " ptr [rdi], ", $r0),
                        concat!($mov, " ", $word, " ptr [rdi + ", $width, "], ", $r1),
                        concat!($mov, " ", $word, " ptr [rdi + 2*", $width, "], ", $r2),
                        concat!($mov, " ", $word, " ptr [rdi + 3*", $width, "], ", $r3),
                        concat!("add rsi, 4*", $width),
                        concat!("add rdi, 4*", $width),
                        "dec rcx",
                        "jnz 2b",
                        "vzeroupper",
                        inout("rcx") blocks => _,
                        inout("rdi") dst => _,
                        inout("rsi") src => _,
                        out($r0) _, out($r1) _, out($r2) _, out($r3) _,
                        options(nostack),
                    );
                }
            }
            let done = blocks * step;
            // SAFETY: `done <= len`, so the remainder lies inside both ranges.
            unsafe { copy_tail(dst.add(done), src.add(done), len - done) }
        }
    };
}

vector_copy!(
    /// AVX2: four unaligned 32-byte loads and stores per 128-byte iteration.
    ///
    /// # Safety
    /// As [`copy_tail`], and the CPU must support AVX2.
    copy_avx2, "avx2", 32, "vmovdqu", "ymmword", ["ymm0", "ymm1", "ymm2", "ymm3"]
);

vector_copy!(
    /// AVX-512: four unaligned 64-byte loads and stores per 256-byte
    /// iteration.
    ///
    /// # Safety
    /// As [`copy_tail`], and the CPU must support AVX-512F.
    copy_avx512, "avx512f", 64, "vmovdqu64", "zmmword", ["zmm0", "zmm1", "zmm2", "zmm3"]
);

/// Streaming copy: temporal loads, `movntdq` stores of whole 64-byte lines,
/// then `sfence` so the data is globally visible before we return.
///
/// # Safety
/// As [`copy_tail`].
pub unsafe fn copy_nt(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { copy_nt_nodrain(dst, src, len) };
    super::sfence();
}

/// [`copy_nt`] without the closing `sfence`: the caller drains, once for
/// many calls (PMDK's NODRAIN + drain). The destination head up to 16-byte
/// alignment and the sub-line tail use ordinary stores.
///
/// # Safety
/// As [`copy_tail`]; and nothing may read the destination, nor may it be
/// published to another thread, before this thread executes `sfence`.
pub unsafe fn copy_nt_nodrain(dst: *mut u8, src: *const u8, len: usize) {
    let head = (dst as usize).wrapping_neg() & 15;
    let head = head.min(len);
    // SAFETY: `head <= len`, inside both ranges.
    unsafe { copy_tail(dst, src, head) };
    let blocks = (len - head) / 64;
    if blocks > 0 {
        // SAFETY: dst+head is 16-byte aligned as movntdq requires; the loop
        // moves blocks*64 <= len-head bytes inside both ranges.
        // Contract: in rdi=dst+head (16-aligned), rsi=src+head, rcx=blocks
        //           (>0, consumed); clobbers xmm0-3, flags.
        unsafe {
            asm!(
                "2:",
                "movdqu xmm0, xmmword ptr [rsi]",
                "movdqu xmm1, xmmword ptr [rsi + 16]",
                "movdqu xmm2, xmmword ptr [rsi + 32]",
                "movdqu xmm3, xmmword ptr [rsi + 48]",
                "movntdq xmmword ptr [rdi],      xmm0",
                "movntdq xmmword ptr [rdi + 16], xmm1",
                "movntdq xmmword ptr [rdi + 32], xmm2",
                "movntdq xmmword ptr [rdi + 48], xmm3",
                "add rsi, 64",
                "add rdi, 64",
                "dec rcx",
                "jnz 2b",
                inout("rcx") blocks => _,
                inout("rdi") dst.add(head) => _,
                inout("rsi") src.add(head) => _,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                options(nostack),
            );
        }
    }
    let done = head + blocks * 64;
    // SAFETY: `done <= len`, so the remainder lies inside both ranges.
    unsafe { copy_tail(dst.add(done), src.add(done), len - done) };
}

/// Streams `len` bytes (a multiple of 16, `dst` 16-byte aligned) with
/// `movntdq`, no drain: the small-record fast path of template fills, where
/// the general routine's head/tail bookkeeping would dominate.
///
/// # Safety
/// As [`copy_nt_nodrain`], plus the alignment and length rules above.
#[inline]
pub unsafe fn stream16_nodrain(dst: *mut u8, src: *const u8, len: usize) {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let mut off = 0;
    while off < len {
        // SAFETY: off + 16 <= len inside both ranges; dst + off is 16-byte
        // aligned as _mm_stream_si128 requires (caller's precondition).
        unsafe {
            let v = _mm_loadu_si128(src.add(off).cast::<__m128i>());
            _mm_stream_si128(dst.add(off).cast::<__m128i>(), v);
        }
        off += 16;
    }
}

/// Streams `len` bytes (a multiple of 16, `dst` 16-byte aligned) with
/// `movntdq`, no drain, building each 16-byte store from two 8-byte loads.
///
/// The core of the template fills. The source is a record the caller has
/// just built, often with 8-byte field stores: an 8-byte load of such a
/// field is forwarded from the store buffer, whereas a 16-byte load spanning
/// two of them cannot be and waits until both stores reach the cache, which
/// is behind every streaming store still in flight. When the caller's record
/// is a local whose every access is visible (the typed fill), the compiler
/// keeps it in registers and the loads disappear altogether.
///
/// # Safety
/// `src` valid for reads of `len` initialised bytes, `dst` valid for writes of
/// `len` bytes and 16-byte aligned, `len % 16 == 0`, the ranges disjoint.
/// Nothing may read `dst` before this thread drains (`sfence`).
#[inline(always)]
pub unsafe fn stream_words_nodrain(dst: *mut u8, src: *const u8, len: usize) {
    use core::arch::x86_64::{__m128i, _mm_set_epi64x, _mm_stream_si128};
    let mut off = 0;
    while off + 16 <= len {
        // SAFETY: off + 16 <= len, so both 8-byte reads lie inside `src` and
        // are initialised (caller's precondition); `dst + off` is 16-byte
        // aligned, as `_mm_stream_si128` requires, and inside `dst`.
        unsafe {
            let lo = src.add(off).cast::<i64>().read_unaligned();
            let hi = src.add(off + 8).cast::<i64>().read_unaligned();
            _mm_stream_si128(dst.add(off).cast::<__m128i>(), _mm_set_epi64x(hi, lo));
        }
        off += 16;
    }
}

/// Streams one record of any length to any address, no drain: the 16-byte
/// aligned chunks inside `[dst, dst + len)` as [`stream_words_nodrain`] does,
/// the unaligned head and the tail with ordinary stores.
///
/// # Safety
/// `src` valid for reads of `len` initialised bytes, `dst` valid for writes of
/// `len` bytes, the ranges disjoint. Nothing may read `dst` before this thread
/// drains.
#[inline(always)]
pub unsafe fn stream_record_nodrain(dst: *mut u8, src: *const u8, len: usize) {
    let head = (dst as usize).wrapping_neg() % 16;
    let head = head.min(len);
    let body = (len - head) & !15;
    // SAFETY: head + body <= len: each piece lies inside both ranges, the
    // body starts 16-byte aligned and is a multiple of 16 bytes.
    unsafe {
        core::ptr::copy_nonoverlapping(src, dst, head);
        stream_words_nodrain(dst.add(head), src.add(head), body);
        let done = head + body;
        core::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done);
    }
}

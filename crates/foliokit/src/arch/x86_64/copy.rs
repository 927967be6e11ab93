//! x86_64 copy primitives.
//!
//! Every primitive has the signature `unsafe fn(dst, src, len)` and copies
//! exactly `len` bytes. They are written in inline asm so that the compiler
//! cannot replace a loop by a call to `memcpy`: a strategy's name must be the
//! instructions that run. The direction flag is clear on entry by the ABI.

use core::arch::asm;

use super::split_blocks;

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
    // loops touch exactly [src, src+len) and [dst, dst+len).
    //
    // Contract: in  rdi=dst, rsi=src, rcx=len (all consumed)
    //           clobbers r8, flags; memory is written.
    unsafe {
        words_then_bytes!(
            [
                "mov r8, qword ptr [rsi]",
                "mov qword ptr [rdi], r8",
                "add rsi, 8",
                "add rdi, 8",
            ],
            [
                "mov r8b, byte ptr [rsi]",
                "mov byte ptr [rdi], r8b",
                "inc rsi",
                "inc rdi",
            ],
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
    unsafe { rep_quads_then_bytes!("movs", len, inout("rdi") dst => _, inout("rsi") src => _,) }
}

/// Defines a block copy: [`split_blocks`] with the head and tail moved by
/// [`copy_tail`] and the whole `$block`-byte blocks by `$body`, an `asm!`
/// over `$dst`/`$src` (the blocks' start, the destination
/// `$align`-aligned) and `$blocks` (> 0). Only the loop differs between
/// the block copies; this is their one copy of everything else.
macro_rules! block_copy {
    ($(#[$attr:meta])* $name:ident, align $align:literal, block $block:literal,
     |$dst:ident, $src:ident, $blocks:ident| $body:expr) => {
        $(#[$attr])*
        pub unsafe fn $name(dst: *mut u8, src: *const u8, len: usize) {
            split_blocks::<$align, $block>(
                dst as usize,
                len,
                // SAFETY: split_blocks keeps [off, off + n) inside [0, len),
                // valid in both disjoint ranges (the caller's contract).
                |off, n| unsafe { copy_tail(dst.add(off), src.add(off), n) },
                |off, $blocks| {
                    // SAFETY: split_blocks keeps the blocks inside both
                    // ranges, the destination `$align`-aligned; a CPU
                    // feature the loop needs is this function's contract.
                    unsafe {
                        let ($dst, $src) = (dst.add(off), src.add(off));
                        $body
                    }
                },
            );
        }
    };
}

block_copy!(
    /// Unrolled 64-bit register moves, 64 bytes per iteration: the kernel's
    /// `memcpy_orig`, which a CPU without FSRM/ERMS gets for `memcpy`.
    ///
    /// # Safety
    /// As [`copy_tail`].
    copy_unrolled, align 1, block 64, |dst, src, blocks| {
        // Contract: in rdi=dst, rsi=src, rcx=blocks (>0, consumed);
        //           clobbers r8-r11, flags.
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
        )
    }
);

/// The four-by-four vector loop of the AVX2, AVX-512 and streaming
/// copies, as one `asm!`: per iteration four `$load`s of `$width`-byte
/// `$word`s into the four registers, then four `$store`s, both pointers
/// advanced by `4 * $width`; then the `$after` instructions once.
/// Contract: in rdi=dst, rsi=src, rcx=blocks (>0, consumed); clobbers the
/// four registers, flags.
macro_rules! four_by_four {
    ($load:literal, $store:literal, $width:literal, $word:literal, [$r0:tt, $r1:tt, $r2:tt, $r3:tt],
     [$($after:literal),*], $dst:expr, $src:expr, $blocks:expr) => {
        asm!(
            "2:",
            concat!($load, " ", $r0, ", ", $word, " ptr [rsi]"),
            concat!($load, " ", $r1, ", ", $word, " ptr [rsi + ", $width, "]"),
            concat!($load, " ", $r2, ", ", $word, " ptr [rsi + 2*", $width, "]"),
            concat!($load, " ", $r3, ", ", $word, " ptr [rsi + 3*", $width, "]"),
            concat!($store, " ", $word, " ptr [rdi], ", $r0),
            concat!($store, " ", $word, " ptr [rdi + ", $width, "], ", $r1),
            concat!($store, " ", $word, " ptr [rdi + 2*", $width, "], ", $r2),
            concat!($store, " ", $word, " ptr [rdi + 3*", $width, "], ", $r3),
            concat!("add rsi, 4*", $width),
            concat!("add rdi, 4*", $width),
            "dec rcx",
            "jnz 2b",
            $($after,)*
            inout("rcx") $blocks => _,
            inout("rdi") $dst => _,
            inout("rsi") $src => _,
            out($r0) _, out($r1) _, out($r2) _, out($r3) _,
            options(nostack),
        )
    };
}

// The vector copies: unaligned moves of one register width, `vzeroupper`
// after the loop (no SSE penalties for the caller).
block_copy!(
    /// AVX2: four unaligned 32-byte loads and stores per 128-byte iteration.
    ///
    /// # Safety
    /// As [`copy_tail`], and the CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    copy_avx2, align 1, block 128, |dst, src, blocks| four_by_four!(
        "vmovdqu", "vmovdqu", 32, "ymmword", ["ymm0", "ymm1", "ymm2", "ymm3"], ["vzeroupper"],
        dst, src, blocks
    )
);

block_copy!(
    /// AVX-512: four unaligned 64-byte loads and stores per 256-byte
    /// iteration.
    ///
    /// # Safety
    /// As [`copy_tail`], and the CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    copy_avx512, align 1, block 256, |dst, src, blocks| four_by_four!(
        "vmovdqu64", "vmovdqu64", 64, "zmmword", ["zmm0", "zmm1", "zmm2", "zmm3"], ["vzeroupper"],
        dst, src, blocks
    )
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

block_copy!(
    /// [`copy_nt`] without the closing `sfence`: the caller drains, once for
    /// many calls (PMDK's NODRAIN + drain). The destination head up to
    /// 16-byte alignment (`movntdq` needs it) and the sub-line tail use
    /// ordinary stores.
    ///
    /// # Safety
    /// As [`copy_tail`]; and nothing may read the destination, nor may it be
    /// published to another thread, before this thread executes `sfence`.
    copy_nt_nodrain, align 16, block 64, |dst, src, blocks| four_by_four!(
        "movdqu", "movntdq", 16, "xmmword", ["xmm0", "xmm1", "xmm2", "xmm3"], [],
        dst, src, blocks
    )
);

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

//! Machine-check-safe copy routines and their exception table.
//!
//! Each routine is `fn(dst: rdi, src: rsi, len: rdx) -> rax` returning the
//! bytes *not* copied (0 on success), like the kernel's `copy_mc_to_kernel`.
//! Every instruction that may fault lies in a labelled range whose fixup the
//! SIGBUS handler jumps to. Invariants every routine keeps at each faulting
//! instruction: `r9` = source end, and `rsi`/`rdi` point at the first byte of
//! the source/destination not yet known to be copied. So the final fixup
//! (`*_fail`) is always `rax = r9 - rsi`.
//!
//! Vector loops fault at block granularity; their fixup resumes in a byte
//! loop that re-copies from the block start and faults at the exact byte.
//! Clobbers: rax, rcx, rsi, rdi, r9-r11, xmm0-3/ymm0-3, flags — all
//! caller-saved in the System V ABI.

use core::arch::global_asm;

global_asm!(
    ".pushsection .text.foliokit_mc,\"ax\",@progbits",
    // ---- rep movsb --------------------------------------------------------
    ".p2align 4",
    ".globl foliokit_mc_movsb",
    ".hidden foliokit_mc_movsb",
    ".type foliokit_mc_movsb,@function",
    "foliokit_mc_movsb:",
    "    lea r9, [rsi + rdx]",
    "    mov rcx, rdx",
    ".globl foliokit_mc_movsb_copy",
    ".hidden foliokit_mc_movsb_copy",
    "foliokit_mc_movsb_copy:",
    // On a fault, rep movsb leaves rsi/rdi/rcx at the faulting byte.
    "    rep movsb",
    ".globl foliokit_mc_movsb_copy_end",
    ".hidden foliokit_mc_movsb_copy_end",
    "foliokit_mc_movsb_copy_end:",
    "    xor eax, eax",
    "    ret",
    ".globl foliokit_mc_movsb_fail",
    ".hidden foliokit_mc_movsb_fail",
    "foliokit_mc_movsb_fail:",
    "    mov rax, r9",
    "    sub rax, rsi",
    "    ret",
    ".size foliokit_mc_movsb, . - foliokit_mc_movsb",
    // ---- AVX2, 128 bytes per iteration ------------------------------------
    ".p2align 4",
    ".globl foliokit_mc_avx2",
    ".hidden foliokit_mc_avx2",
    ".type foliokit_mc_avx2,@function",
    "foliokit_mc_avx2:",
    "    lea r9, [rsi + rdx]",
    "    mov rcx, rdx",
    "    shr rcx, 7",
    "    jz foliokit_mc_avx2_bytes",
    ".globl foliokit_mc_avx2_loop",
    ".hidden foliokit_mc_avx2_loop",
    "foliokit_mc_avx2_loop:",
    "    vmovdqu ymm0, ymmword ptr [rsi]",
    "    vmovdqu ymm1, ymmword ptr [rsi + 32]",
    "    vmovdqu ymm2, ymmword ptr [rsi + 64]",
    "    vmovdqu ymm3, ymmword ptr [rsi + 96]",
    "    vmovdqu ymmword ptr [rdi], ymm0",
    "    vmovdqu ymmword ptr [rdi + 32], ymm1",
    "    vmovdqu ymmword ptr [rdi + 64], ymm2",
    "    vmovdqu ymmword ptr [rdi + 96], ymm3",
    "    add rsi, 128",
    "    add rdi, 128",
    "    dec rcx",
    "    jnz foliokit_mc_avx2_loop",
    ".globl foliokit_mc_avx2_loop_end",
    ".hidden foliokit_mc_avx2_loop_end",
    "foliokit_mc_avx2_loop_end:",
    "    vzeroupper",
    "foliokit_mc_avx2_bytes:",
    "    cmp rsi, r9",
    "    jae 3f",
    ".globl foliokit_mc_avx2_byte",
    ".hidden foliokit_mc_avx2_byte",
    "foliokit_mc_avx2_byte:",
    "    mov al, byte ptr [rsi]",
    "    mov byte ptr [rdi], al",
    ".globl foliokit_mc_avx2_byte_end",
    ".hidden foliokit_mc_avx2_byte_end",
    "foliokit_mc_avx2_byte_end:",
    "    inc rsi",
    "    inc rdi",
    "    jmp foliokit_mc_avx2_bytes",
    "3:",
    "    xor eax, eax",
    "    ret",
    ".globl foliokit_mc_avx2_fail",
    ".hidden foliokit_mc_avx2_fail",
    "foliokit_mc_avx2_fail:",
    "    mov rax, r9",
    "    sub rax, rsi",
    "    ret",
    ".size foliokit_mc_avx2, . - foliokit_mc_avx2",
    // ---- streaming stores, 64 bytes per iteration -------------------------
    ".p2align 4",
    ".globl foliokit_mc_nt",
    ".hidden foliokit_mc_nt",
    ".type foliokit_mc_nt,@function",
    "foliokit_mc_nt:",
    "    lea r9, [rsi + rdx]",
    // Head: bytes until the destination is 16-byte aligned (movntdq needs it).
    "    mov r10, rdi",
    "    neg r10",
    "    and r10, 15",
    "    cmp r10, rdx",
    "    cmova r10, rdx",
    "    lea r11, [rsi + r10]",
    "foliokit_mc_nt_head:",
    "    cmp rsi, r11",
    "    jae foliokit_mc_nt_body",
    ".globl foliokit_mc_nt_headbyte",
    ".hidden foliokit_mc_nt_headbyte",
    "foliokit_mc_nt_headbyte:",
    "    mov al, byte ptr [rsi]",
    "    mov byte ptr [rdi], al",
    ".globl foliokit_mc_nt_headbyte_end",
    ".hidden foliokit_mc_nt_headbyte_end",
    "foliokit_mc_nt_headbyte_end:",
    "    inc rsi",
    "    inc rdi",
    "    jmp foliokit_mc_nt_head",
    "foliokit_mc_nt_body:",
    "    mov rcx, r9",
    "    sub rcx, rsi",
    "    shr rcx, 6",
    "    jz foliokit_mc_nt_bytes",
    ".globl foliokit_mc_nt_loop",
    ".hidden foliokit_mc_nt_loop",
    "foliokit_mc_nt_loop:",
    "    movdqu xmm0, xmmword ptr [rsi]",
    "    movdqu xmm1, xmmword ptr [rsi + 16]",
    "    movdqu xmm2, xmmword ptr [rsi + 32]",
    "    movdqu xmm3, xmmword ptr [rsi + 48]",
    "    movntdq xmmword ptr [rdi], xmm0",
    "    movntdq xmmword ptr [rdi + 16], xmm1",
    "    movntdq xmmword ptr [rdi + 32], xmm2",
    "    movntdq xmmword ptr [rdi + 48], xmm3",
    "    add rsi, 64",
    "    add rdi, 64",
    "    dec rcx",
    "    jnz foliokit_mc_nt_loop",
    ".globl foliokit_mc_nt_loop_end",
    ".hidden foliokit_mc_nt_loop_end",
    "foliokit_mc_nt_loop_end:",
    "foliokit_mc_nt_bytes:",
    "    cmp rsi, r9",
    "    jae 3f",
    ".globl foliokit_mc_nt_byte",
    ".hidden foliokit_mc_nt_byte",
    "foliokit_mc_nt_byte:",
    "    mov al, byte ptr [rsi]",
    "    mov byte ptr [rdi], al",
    ".globl foliokit_mc_nt_byte_end",
    ".hidden foliokit_mc_nt_byte_end",
    "foliokit_mc_nt_byte_end:",
    "    inc rsi",
    "    inc rdi",
    "    jmp foliokit_mc_nt_bytes",
    "3:",
    // Streaming stores must be drained on every exit, the failing one too.
    "    sfence",
    "    xor eax, eax",
    "    ret",
    ".globl foliokit_mc_nt_fail",
    ".hidden foliokit_mc_nt_fail",
    "foliokit_mc_nt_fail:",
    "    sfence",
    "    mov rax, r9",
    "    sub rax, rsi",
    "    ret",
    ".size foliokit_mc_nt, . - foliokit_mc_nt",
    ".popsection",
);

unsafe extern "sysv64" {
    fn foliokit_mc_movsb(dst: *mut u8, src: *const u8, len: usize) -> usize;
    fn foliokit_mc_avx2(dst: *mut u8, src: *const u8, len: usize) -> usize;
    fn foliokit_mc_nt(dst: *mut u8, src: *const u8, len: usize) -> usize;
}

// Labels only: their addresses bound the fault ranges and name the fixups.
unsafe extern "C" {
    static foliokit_mc_movsb_copy: u8;
    static foliokit_mc_movsb_copy_end: u8;
    static foliokit_mc_movsb_fail: u8;
    static foliokit_mc_avx2_loop: u8;
    static foliokit_mc_avx2_loop_end: u8;
    static foliokit_mc_avx2_byte: u8;
    static foliokit_mc_avx2_byte_end: u8;
    static foliokit_mc_avx2_fail: u8;
    static foliokit_mc_nt_headbyte: u8;
    static foliokit_mc_nt_headbyte_end: u8;
    static foliokit_mc_nt_loop: u8;
    static foliokit_mc_nt_loop_end: u8;
    static foliokit_mc_nt_byte: u8;
    static foliokit_mc_nt_byte_end: u8;
    static foliokit_mc_nt_fail: u8;
}

/// # Safety
/// `dst` valid for writes and `src` mapped (it may fault: that is the
/// point) for `len` bytes; the ranges must not overlap. The SIGBUS handler
/// must be installed (see `super::handler::install`).
pub unsafe fn mc_movsb(dst: *mut u8, src: *const u8, len: usize) -> usize {
    // SAFETY: forwarded contract; the routine follows the System V ABI.
    unsafe { foliokit_mc_movsb(dst, src, len) }
}

/// # Safety
/// As [`mc_movsb`], and the CPU must support AVX2.
pub unsafe fn mc_avx2(dst: *mut u8, src: *const u8, len: usize) -> usize {
    // SAFETY: forwarded contract; the routine follows the System V ABI.
    unsafe { foliokit_mc_avx2(dst, src, len) }
}

/// # Safety
/// As [`mc_movsb`].
pub unsafe fn mc_nt(dst: *mut u8, src: *const u8, len: usize) -> usize {
    // SAFETY: forwarded contract; the routine follows the System V ABI.
    unsafe { foliokit_mc_nt(dst, src, len) }
}

/// One exception-table entry: a fault with the PC in `[start, end)` resumes
/// at `fixup`.
#[derive(Debug, Clone, Copy)]
pub struct Fixup {
    pub start: usize,
    pub end: usize,
    pub fixup: usize,
}

/// The exception table, built from the labels above.
pub fn fixups() -> [Fixup; 6] {
    let a = |p: *const u8| p as usize;
    let e = |start: *const u8, end: *const u8, fixup: *const u8| Fixup {
        start: a(start),
        end: a(end),
        fixup: a(fixup),
    };
    // Taking a label's address reads nothing.
    use core::ptr::addr_of as at;
    [
        e(
            at!(foliokit_mc_movsb_copy),
            at!(foliokit_mc_movsb_copy_end),
            at!(foliokit_mc_movsb_fail),
        ),
        e(
            at!(foliokit_mc_avx2_loop),
            at!(foliokit_mc_avx2_loop_end),
            at!(foliokit_mc_avx2_loop_end),
        ),
        e(
            at!(foliokit_mc_avx2_byte),
            at!(foliokit_mc_avx2_byte_end),
            at!(foliokit_mc_avx2_fail),
        ),
        e(
            at!(foliokit_mc_nt_headbyte),
            at!(foliokit_mc_nt_headbyte_end),
            at!(foliokit_mc_nt_fail),
        ),
        e(
            at!(foliokit_mc_nt_loop),
            at!(foliokit_mc_nt_loop_end),
            at!(foliokit_mc_nt_loop_end),
        ),
        e(
            at!(foliokit_mc_nt_byte),
            at!(foliokit_mc_nt_byte_end),
            at!(foliokit_mc_nt_fail),
        ),
    ]
}

//! Machine-check-safe copy routines and their exception table.
//!
//! Each routine is `fn(dst: rdi, src: rsi, len: rdx) -> rax` returning the
//! bytes *not* copied (0 on success), like the kernel's `copy_mc_to_kernel`.
//! Invariants every routine keeps at each faulting instruction: `r9` =
//! source end, and `rsi`/`rdi` point at the first byte of the
//! source/destination not yet known to be copied. So the final fixup
//! (`*_fail`) is always `rax = r9 - rsi`.
//!
//! Vector loops fault at block granularity (`rsi`/`rdi` advance only after
//! the block's last store); their fixup resumes in a byte loop that
//! re-copies from the block start and faults at the exact byte.
//! Clobbers: rax, rcx, rsi, rdi, r9-r11, xmm0-3/ymm0-3, flags — all
//! caller-saved in the System V ABI.
//!
//! # The exception table
//!
//! Every instruction that may fault is written `fk_may_fault FIXUP, INSN`:
//! the assembler macro below emits INSN and, in the same breath, appends
//! one entry `{start - ., end - ., FIXUP - .}` (three 32-bit offsets, each
//! relative to its own address, as the kernel's `_ASM_EXTABLE` does) to the
//! section `.rodata.foliokit_mc_extable`. So a faulting instruction cannot
//! be written without its fixup, and a unit test below checks that no
//! memory access in the routines bypasses the macro.
//!
//! Why this layout holds in every kind of build:
//! - The start label, every entry and the end label are emitted by this one
//!   `global_asm!`, in source order, into one section of one object file:
//!   the assembler lays them out contiguously and a linker never splits an
//!   input section, so `[start, end)` is exactly the entries. No linker
//!   `__start_`/`__stop_` symbols are needed.
//! - The offsets are PC-relative: resolved when the library is linked, they
//!   need no dynamic relocation, so the table stays read-only in
//!   `libfoliokit.so` as in an executable.
//! - Garbage collection (`--gc-sections`, which Rust and most C links use)
//!   keeps a section exactly when something kept refers to it. The SIGBUS
//!   handler reads the start and end labels, so the table is kept whenever
//!   the handler is, in the rlib, the cdylib and the staticlib alike; and
//!   the table refers to the routines, so it never points into a dropped
//!   section.
//! - The table is written once, by the linker, before any code runs, and
//!   never changes: the handler reads it with no lock, no allocation and
//!   no ordering to respect.

use core::arch::global_asm;

global_asm!(
    // The table opens here; `fk_may_fault` appends to it; it closes after
    // the last routine.
    ".pushsection .rodata.foliokit_mc_extable,\"a\",@progbits",
    ".balign 4",
    ".globl foliokit_mc_extable_start",
    ".hidden foliokit_mc_extable_start",
    "foliokit_mc_extable_start:",
    ".popsection",
    // `fk_may_fault FIXUP, INSN`: INSN, and the entry sending a fault in it
    // to FIXUP. 771/772 are redefined by each use (`b` finds the latest).
    ".macro fk_may_fault fixup:req, insn:vararg",
    "771:",
    "    \\insn",
    "772:",
    "    .pushsection .rodata.foliokit_mc_extable,\"a\",@progbits",
    "    .long 771b - ., 772b - ., \\fixup - .",
    "    .popsection",
    ".endm",
    // `fk_mc_bytes END, FIXUP`: copies a byte at a time from rsi to rdi
    // until rsi reaches END, then falls through; a fault in either access
    // goes to FIXUP with rsi/rdi at the faulting byte. The byte loop of
    // every routine (an exact count after a vector block faulted, and the
    // heads and tails).
    ".macro fk_mc_bytes end:req, fixup:req",
    "773:",
    "    cmp rsi, \\end",
    "    jae 774f",
    "    fk_may_fault \\fixup, mov al, byte ptr [rsi]",
    "    fk_may_fault \\fixup, mov byte ptr [rdi], al",
    "    inc rsi",
    "    inc rdi",
    "    jmp 773b",
    "774:",
    ".endm",
    ".pushsection .text.foliokit_mc,\"ax\",@progbits",
    // ---- rep movsb --------------------------------------------------------
    ".p2align 4",
    ".globl foliokit_mc_movsb",
    ".hidden foliokit_mc_movsb",
    ".type foliokit_mc_movsb,@function",
    "foliokit_mc_movsb:",
    "    lea r9, [rsi + rdx]",
    "    mov rcx, rdx",
    // On a fault, rep movsb leaves rsi/rdi/rcx at the faulting byte.
    "    fk_may_fault foliokit_mc_movsb_fail, rep movsb",
    "    xor eax, eax",
    "    ret",
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
    "foliokit_mc_avx2_loop:",
    "    fk_may_fault foliokit_mc_avx2_loop_end, vmovdqu ymm0, ymmword ptr [rsi]",
    "    fk_may_fault foliokit_mc_avx2_loop_end, vmovdqu ymm1, ymmword ptr [rsi + 32]",
    "    fk_may_fault foliokit_mc_avx2_loop_end, vmovdqu ymm2, ymmword ptr [rsi + 64]",
    "    fk_may_fault foliokit_mc_avx2_loop_end, vmovdqu ymm3, ymmword ptr [rsi + 96]",
    "    fk_may_fault foliokit_mc_avx2_loop_end, vmovdqu ymmword ptr [rdi], ymm0",
    "    fk_may_fault foliokit_mc_avx2_loop_end, vmovdqu ymmword ptr [rdi + 32], ymm1",
    "    fk_may_fault foliokit_mc_avx2_loop_end, vmovdqu ymmword ptr [rdi + 64], ymm2",
    "    fk_may_fault foliokit_mc_avx2_loop_end, vmovdqu ymmword ptr [rdi + 96], ymm3",
    "    add rsi, 128",
    "    add rdi, 128",
    "    dec rcx",
    "    jnz foliokit_mc_avx2_loop",
    "foliokit_mc_avx2_loop_end:",
    "    vzeroupper",
    "foliokit_mc_avx2_bytes:",
    "    fk_mc_bytes r9, foliokit_mc_avx2_fail",
    "    xor eax, eax",
    "    ret",
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
    "    fk_mc_bytes r11, foliokit_mc_nt_fail",
    "    mov rcx, r9",
    "    sub rcx, rsi",
    "    shr rcx, 6",
    "    jz foliokit_mc_nt_bytes",
    "foliokit_mc_nt_loop:",
    "    fk_may_fault foliokit_mc_nt_loop_end, movdqu xmm0, xmmword ptr [rsi]",
    "    fk_may_fault foliokit_mc_nt_loop_end, movdqu xmm1, xmmword ptr [rsi + 16]",
    "    fk_may_fault foliokit_mc_nt_loop_end, movdqu xmm2, xmmword ptr [rsi + 32]",
    "    fk_may_fault foliokit_mc_nt_loop_end, movdqu xmm3, xmmword ptr [rsi + 48]",
    "    fk_may_fault foliokit_mc_nt_loop_end, movntdq xmmword ptr [rdi], xmm0",
    "    fk_may_fault foliokit_mc_nt_loop_end, movntdq xmmword ptr [rdi + 16], xmm1",
    "    fk_may_fault foliokit_mc_nt_loop_end, movntdq xmmword ptr [rdi + 32], xmm2",
    "    fk_may_fault foliokit_mc_nt_loop_end, movntdq xmmword ptr [rdi + 48], xmm3",
    "    add rsi, 64",
    "    add rdi, 64",
    "    dec rcx",
    "    jnz foliokit_mc_nt_loop",
    "foliokit_mc_nt_loop_end:",
    "foliokit_mc_nt_bytes:",
    "    fk_mc_bytes r9, foliokit_mc_nt_fail",
    // Streaming stores must be drained on every exit, the failing one too.
    "    sfence",
    "    xor eax, eax",
    "    ret",
    "foliokit_mc_nt_fail:",
    "    sfence",
    "    mov rax, r9",
    "    sub rax, rsi",
    "    ret",
    ".size foliokit_mc_nt, . - foliokit_mc_nt",
    ".popsection",
    // The table closes after the last routine's last entry.
    ".pushsection .rodata.foliokit_mc_extable,\"a\",@progbits",
    ".globl foliokit_mc_extable_end",
    ".hidden foliokit_mc_extable_end",
    "foliokit_mc_extable_end:",
    ".popsection",
    // The macros are this block's own: other module-level asm never sees
    // them.
    ".purgem fk_mc_bytes",
    ".purgem fk_may_fault",
);

unsafe extern "sysv64" {
    fn foliokit_mc_movsb(dst: *mut u8, src: *const u8, len: usize) -> usize;
    fn foliokit_mc_avx2(dst: *mut u8, src: *const u8, len: usize) -> usize;
    fn foliokit_mc_nt(dst: *mut u8, src: *const u8, len: usize) -> usize;
}

/// # Safety
/// `dst` valid for writes and `src` mapped (it may fault: that is the
/// point) for `len` bytes; the ranges must not overlap. The SIGBUS handler
/// must be installed (`crate::mc` installs it before running one).
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

/// One exception-table entry as `fk_may_fault` lays it out: a fault with
/// the PC in `[start, end)` resumes at `fixup`, each stored as its offset
/// from the field's own address.
#[repr(C)]
struct Entry {
    start: i32,
    end: i32,
    fixup: i32,
}

/// The address an offset field designates: its own address plus its value.
fn target(field: &i32) -> usize {
    (field as *const i32 as usize).wrapping_add_signed(*field as isize)
}

impl Entry {
    fn covers(&self, pc: usize) -> bool {
        (target(&self.start)..target(&self.end)).contains(&pc)
    }
}

// Labels only: the table's bounds (never read as values of these types).
unsafe extern "C" {
    static foliokit_mc_extable_start: [Entry; 0];
    static foliokit_mc_extable_end: [Entry; 0];
}

/// The exception table, as the assembler gathered it.
fn table() -> &'static [Entry] {
    let start = (&raw const foliokit_mc_extable_start).cast::<Entry>();
    let end = (&raw const foliokit_mc_extable_end).cast::<Entry>();
    // SAFETY: both labels lie in the one section the asm above fills, the
    // end label after the start one with nothing but 12-byte, 4-aligned
    // entries between them (see the module docs): the range is in bounds
    // of one allocation and a whole number of `Entry`s, read-only for the
    // life of the process.
    unsafe { core::slice::from_raw_parts(start, end.offset_from(start) as usize) }
}

/// Where a fault at `pc` resumes, if `pc` is on a registered faulting
/// instruction. Async-signal-safe: it reads the immutable table, nothing
/// else (no allocation, no lock).
pub fn fixup_for(pc: usize) -> Option<usize> {
    table()
        .iter()
        .find(|e| e.covers(pc))
        .map(|e| target(&e.fixup))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of the `global_asm!` above, as written.
    fn asm_lines() -> Vec<&'static str> {
        let src = include_str!("mc.rs");
        let body = src.split("global_asm!(\n").nth(1).unwrap();
        let body = &body[..body.find("\n);\n").unwrap()];
        body.lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix('"')?.strip_suffix("\","))
            .map(str::trim)
            .collect()
    }

    #[test]
    fn mc_memory_accesses_all_go_through_the_table_macro() {
        let lines = asm_lines();
        let count =
            |lines: &[&str], prefix: &str| lines.iter().filter(|l| l.starts_with(prefix)).count();
        // The byte-loop macro's body, and the entries each use of it adds.
        let open = lines
            .iter()
            .position(|l| l.starts_with(".macro fk_mc_bytes"));
        let open = open.expect("the byte-loop macro");
        let close = open + lines[open..].iter().position(|l| *l == ".endm").unwrap();
        let per_byte_loop = count(&lines[open..close], "fk_may_fault ");
        let uses = count(&lines, "fk_may_fault ") - per_byte_loop
            + per_byte_loop * count(&lines, "fk_mc_bytes ");
        // Every instruction that touches memory (a `[...]` operand other
        // than `lea`'s arithmetic, or a string instruction) is wrapped.
        for l in &lines {
            let op = l.split_whitespace().next().unwrap_or("");
            let string_op = ["rep", "repe", "repne", "movsb", "movsw", "movsq", "stosb"];
            let touches = (l.contains('[') && op != "lea") || string_op.contains(&op);
            if touches {
                assert!(l.starts_with("fk_may_fault "), "not in the table: {l}");
            }
        }
        // And the assembler gathered one entry per use, none lost.
        assert_eq!(table().len(), uses);
    }

    #[test]
    fn mc_table_entries_are_single_instructions_in_the_routines() {
        let first = foliokit_mc_movsb as *const () as usize;
        let mut last_end = first;
        for e in table() {
            let (start, end, fixup) = (target(&e.start), target(&e.end), target(&e.fixup));
            // In source order, one x86 instruction (at most 15 bytes) each.
            assert!(last_end <= start && start < end && end - start <= 15);
            assert!(fixup > first);
            assert_eq!(fixup_for(start), Some(fixup));
            assert_eq!(fixup_for(end - 1), Some(fixup));
            last_end = end;
        }
        assert_eq!(fixup_for(first), None);
        assert_eq!(fixup_for(fixup_for as *const () as usize), None);
    }
}

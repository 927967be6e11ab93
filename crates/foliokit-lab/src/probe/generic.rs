//! Portable probes for architectures without the x86_64 kernels: ordinary
//! loads and stores (no streaming stores here), so limits still run and
//! the tests still pass, though the figures only say what plain loops do.

/// The non-zero byte the write probe stores.
pub const PATTERN: u8 = 0x5A;

/// Reads every byte of the range (volatile, so the loads stay).
///
/// # Safety
/// The range must be mapped and readable.
pub unsafe fn read_probe(ptr: *mut u8, len: usize) {
    let words = len / 8;
    for w in 0..words {
        // SAFETY: w * 8 + 8 <= len, inside the range.
        // (As bytes, so the pointer needs no alignment.)
        unsafe { core::ptr::read_volatile(ptr.add(w * 8).cast::<[u8; 8]>().cast_const()) };
    }
    for off in words * 8..len {
        // SAFETY: off < len.
        unsafe { core::ptr::read_volatile(ptr.add(off)) };
    }
}

/// Writes [`PATTERN`] over the range (ordinary stores here).
///
/// # Safety
/// The range must be valid for writes.
pub unsafe fn write_probe(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { core::ptr::write_bytes(dst, PATTERN, len) }
}

/// Writes zeros over the range (ordinary stores here).
///
/// # Safety
/// The range must be valid for writes.
pub unsafe fn write_zero_probe(dst: *mut u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { core::ptr::write_bytes(dst, 0, len) }
}

/// Ordinary stores already: the cache-resident variant is the same loop.
pub use self::write_probe as write_cached_probe;
/// Ordinary stores already: the cache-resident variant is the same loop.
pub use self::write_zero_probe as write_zero_cached_probe;

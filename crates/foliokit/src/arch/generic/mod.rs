//! Portable fallbacks: other architectures build and pass the tests with
//! only the composite strategies (`per-page`, `libc`, `auto`), so there
//! are no instruction-level primitives here.

/// Full fence standing in for `sfence`: nothing here issues streaming stores.
pub fn sfence() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// No portable cache flush exists; callers check [`CAN_FLUSH`].
///
/// # Safety
/// None required; kept `unsafe` to match the x86_64 signature.
pub unsafe fn flush_range(_ptr: *const u8, _len: usize, _clflushopt: bool) {}

/// Whether [`flush_range`] evicts anything: not here.
pub const CAN_FLUSH: bool = false;

/// Ordinary stores stand in for streaming ones here.
///
/// # Safety
/// Both ranges valid for `len` bytes and disjoint.
pub unsafe fn stream_nodrain(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Ordinary stores stand in for the record streams of the template fills.
///
/// # Safety
/// Both ranges valid for `len` bytes and disjoint.
#[inline(always)]
pub unsafe fn stream_words_nodrain(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
}

/// As [`stream_words_nodrain`], for any length and alignment.
///
/// # Safety
/// Both ranges valid for `len` bytes and disjoint.
#[inline(always)]
pub unsafe fn stream_record_nodrain(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Whether streaming stores exist: not here (ordinary stores stand in).
pub const HAS_STREAMING: bool = false;

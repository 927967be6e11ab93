//! Portable fallbacks: other architectures build and pass the tests with
//! only the composite strategies (`per-page`, `libc`, `auto`).

use crate::clear::ClearStrategy;
use crate::copy::CopyStrategy;
use crate::cpu::Features;

use super::{ClearFn, CopyFn};

const NOT_HERE: &str = "x86_64 instruction; not available on this architecture";

/// Full fence standing in for `sfence`: nothing here issues streaming stores.
pub fn sfence() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// No instruction-level copy strategy here: only the composite ones run.
pub fn copy_primitive(_s: CopyStrategy, _f: &Features) -> Result<CopyFn, &'static str> {
    Err(NOT_HERE)
}

/// No instruction-level clear strategy here: only the composite ones run.
pub fn clear_primitive(_s: ClearStrategy, _f: &Features) -> Result<ClearFn, &'static str> {
    Err(NOT_HERE)
}

/// No streaming primitives here, so none to leave undrained.
pub fn copy_nodrain(_s: CopyStrategy) -> Option<CopyFn> {
    None
}

/// No streaming primitives here, so none to leave undrained.
pub fn clear_nodrain(_s: ClearStrategy, _f: &Features) -> Option<ClearFn> {
    None
}

/// # Safety
/// Both ranges valid for `len` bytes and disjoint.
unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
}

/// # Safety
/// `dst` valid for writes of `len` bytes.
unsafe fn clear_bytes(dst: *mut u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { core::ptr::write_bytes(dst, 0, len) }
}

/// The page copy: `copy_nonoverlapping`.
pub fn page_copy(_f: &Features) -> CopyFn {
    copy_bytes
}

/// The page clear: `write_bytes`.
pub fn page_clear(_f: &Features) -> ClearFn {
    clear_bytes
}

/// No portable cache flush exists; callers check [`CAN_FLUSH`].
///
/// # Safety
/// None required; kept `unsafe` to match the x86_64 signature.
pub unsafe fn flush_range(_ptr: *const u8, _len: usize, _f: &Features) {}

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

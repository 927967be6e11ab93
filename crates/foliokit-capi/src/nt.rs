//! Streaming (non-temporal) stores: `fk_memcpy_nt` and the drain that
//! orders them, `fk_drain`.

use std::ffi::{c_int, c_void};

use crate::args::disjoint;
use crate::error::guard;

/// # Safety
/// Both ranges valid for `len` bytes and disjoint.
#[no_mangle]
pub unsafe extern "C" fn fk_memcpy_nt(dst: *mut c_void, src: *const c_void, len: usize) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let (d, s) = unsafe { disjoint(dst, src, len) }?;
        fk::nt::memcpy_nt(d, s).map_err(|_| -libc::EINVAL)?;
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn fk_drain() {
    fk::nt::drain();
}

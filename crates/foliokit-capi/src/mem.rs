//! `fk_populate`: faulting a range in from several threads.

use std::ffi::{c_int, c_uint, c_void};

use crate::error::{guard, os_code};

/// # Safety
/// `[addr, addr + len)` is mapped writable memory of this process.
#[no_mangle]
pub unsafe extern "C" fn fk_populate(addr: *mut c_void, len: usize, channels: c_uint) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract; everything else is checked inside.
        match unsafe { fk::mem::populate_raw(addr.cast(), len, channels as usize) } {
            Ok(_) => Ok(0),
            Err(fk::mem::PopulateError::Fault { source, .. }) => Err(os_code(&source, libc::EIO)),
            Err(_) => Err(-libc::EINVAL),
        }
    })
}

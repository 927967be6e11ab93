//! C arguments made Rust values, with the checks every entry point that
//! takes them shares: strategy names, byte ranges, batches of folios.

use std::ffi::{c_char, c_int, c_void, CStr};

use fk::Strategy;

use crate::error::strategy_err;

/// Parses a strategy name; NULL is auto.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
pub(crate) unsafe fn strategy<S: Strategy + Default>(name: *const c_char) -> Result<S, c_int> {
    if name.is_null() {
        return Ok(S::default());
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(name) }
        .to_str()
        .map_err(|_| -libc::EINVAL)?;
    let s = S::from_name(s).ok_or(-libc::ENOENT)?;
    fk::strategy::require(s).map_err(|e| strategy_err(&e))
}

/// The start of each `folio_size` folio of `[p, p + len)`: -EINVAL for a
/// NULL `p`, a `folio_size` that is not a whole number of pages, or a
/// `len` that is not a whole number of folios (checked before the list is
/// made: a byte-sized folio would make one entry per byte; alignment and
/// overlap are the library's to check).
pub(crate) fn folios(
    p: *const c_void,
    len: usize,
    folio_size: usize,
) -> Result<Vec<*mut u8>, c_int> {
    let page = fk::batch::page_size();
    if folio_size == 0 || folio_size % page != 0 || len % folio_size != 0 || p.is_null() {
        return Err(-libc::EINVAL);
    }
    Ok(fk::batch::folio_starts(
        p.cast_mut().cast(),
        len,
        folio_size,
    ))
}

/// `len` bytes at `dst` and at `src` as slices: -EINVAL for a NULL pointer
/// or overlapping ranges; with `len` 0 any pointers, NULL too, give empty
/// slices.
///
/// # Safety
/// With `len` > 0, both ranges are valid for `len` bytes (`dst` writable)
/// and not accessed otherwise while the slices live.
pub(crate) unsafe fn disjoint<'a>(
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
) -> Result<(&'a mut [u8], &'a [u8]), c_int> {
    if len == 0 {
        // NULL is allowed here, but not in a slice.
        return Ok((&mut [], &[]));
    }
    if dst.is_null() || src.is_null() {
        return Err(-libc::EINVAL);
    }
    let (d, s) = (dst as usize, src as usize);
    if d < s.wrapping_add(len) && s < d.wrapping_add(len) {
        return Err(-libc::EINVAL);
    }
    // SAFETY: valid (contract), non-NULL and disjoint (checked above).
    unsafe {
        Ok((
            std::slice::from_raw_parts_mut(dst.cast::<u8>(), len),
            std::slice::from_raw_parts(src.cast::<u8>(), len),
        ))
    }
}

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
    // A name that is not UTF-8 names no strategy.
    let s = unsafe { CStr::from_ptr(name) }
        .to_str()
        .map_err(|_| -libc::ENOENT)?;
    let s = S::from_name(s).ok_or(-libc::ENOENT)?;
    fk::strategy::require(s).map_err(|e| strategy_err(&e))
}

/// Checks that `[p, p + len)` can be a range of memory at all: -EINVAL
/// for a NULL `p` (with `len` > 0), a `len` over `isize::MAX` (no object
/// is that large, and no slice may be) or a range that wraps the address
/// space. Before anything is built from it: a list of its folios, or a
/// slice.
pub(crate) fn range(p: *const c_void, len: usize) -> Result<(), c_int> {
    if len == 0 {
        return Ok(());
    }
    if p.is_null() || len > isize::MAX as usize || (p as usize).checked_add(len).is_none() {
        return Err(-libc::EINVAL);
    }
    Ok(())
}

/// The start of each `folio_size` folio of `[p, p + len)`: -EINVAL for a
/// bad range ([`range`]), a `folio_size` that is not a whole number of
/// pages, or a `len` that is not a whole number of folios (checked before
/// the list is made: a byte-sized folio would make one entry per byte;
/// alignment and overlap are the library's to check). With `len` 0, an
/// empty list, whatever `p`.
pub(crate) fn folios(
    p: *const c_void,
    len: usize,
    folio_size: usize,
) -> Result<Vec<*mut u8>, c_int> {
    let page = fk::batch::page_size();
    if folio_size == 0 || folio_size % page != 0 || len % folio_size != 0 {
        return Err(-libc::EINVAL);
    }
    range(p, len)?;
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
    range(dst, len)?;
    range(src, len)?;
    // Neither range wraps (checked above), so this is plain overlap.
    let (d, s) = (dst as usize, src as usize);
    if d < s + len && s < d + len {
        return Err(-libc::EINVAL);
    }
    // SAFETY: valid (contract), non-NULL, no longer than isize::MAX, not
    // wrapping and disjoint (checked above).
    unsafe {
        Ok((
            std::slice::from_raw_parts_mut(dst.cast::<u8>(), len),
            std::slice::from_raw_parts(src.cast::<u8>(), len),
        ))
    }
}

/// `n` elements at `p` as a slice: -EINVAL for a NULL `p` with `n` > 0 or
/// more elements than any object can hold; with `n` 0, empty, whatever `p`.
///
/// # Safety
/// With `n` > 0, `p` points to `n` readable, initialised elements that are
/// not written while the slice lives.
pub(crate) unsafe fn list<'a, T>(p: *const T, n: usize) -> Result<&'a [T], c_int> {
    if n == 0 {
        return Ok(&[]);
    }
    let bytes = n.checked_mul(std::mem::size_of::<T>());
    if p.is_null() || bytes.is_none_or(|b| b > isize::MAX as usize) {
        return Err(-libc::EINVAL);
    }
    // SAFETY: non-NULL, no larger than isize::MAX bytes (checked above),
    // and `n` readable elements (the caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_that_no_object_can_be_are_refused_before_anything_is_built() {
        let page = fk::batch::page_size();
        let p = (1usize << 40) as *mut c_void;
        let near_top = (usize::MAX - page + 1) as *mut c_void;
        assert_eq!(range(std::ptr::null(), 0), Ok(()));
        assert_eq!(range(std::ptr::null(), 1), Err(-libc::EINVAL));
        assert_eq!(range(p, isize::MAX as usize + 1), Err(-libc::EINVAL));
        assert_eq!(range(near_top, 2 * page), Err(-libc::EINVAL));
        // A length that wraps the address space lists nothing (it used to
        // try to allocate a pointer per folio, and abort).
        assert_eq!(
            folios(p, usize::MAX & !(page - 1), page),
            Err(-libc::EINVAL)
        );
        assert_eq!(folios(std::ptr::null(), 0, page), Ok(Vec::new()));
        // SAFETY: refused on their arguments; no memory is touched.
        unsafe {
            assert!(disjoint(p.cast(), near_top, usize::MAX).is_err());
            assert!(disjoint(p.cast(), near_top, 2 * page).is_err());
            // Two ranges whose ends wrap used to pass the overlap test.
            assert!(disjoint(near_top.cast(), p, 2 * page).is_err());
            assert!(list(std::ptr::null::<u64>(), 1).is_err());
            assert!(list(std::ptr::dangling::<u64>(), usize::MAX / 4).is_err());
            assert_eq!(list(std::ptr::null::<u64>(), 0), Ok(&[][..]));
        }
    }
}

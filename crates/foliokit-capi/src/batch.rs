//! Batches of folios: `fk_copy_folios` and `fk_clear_folios`. Both take
//! the same steps (each range cut into folios, the strategy parsed, the
//! batch run, its error mapped), written once in [`folio_batch`]; each
//! entry point adds only its library call.

use std::ffi::{c_char, c_int, c_void};

use fk::{BatchError, ClearOptions, ClearStrategy, CopyOptions, CopyStrategy, Reuse, Strategy};

use crate::args::{folios, strategy};
use crate::error::{batch_err, guard};

/// The C flag `write_once` as the library's reuse hint.
fn reuse(write_once: c_int) -> Reuse {
    if write_once != 0 {
        Reuse::Stream
    } else {
        Reuse::Reread
    }
}

/// Checks every range (`len` bytes each, destination first) and cuts it
/// into folios, parses the strategy, then hands both to `run`. Every
/// argument is checked before the strategy name, as C callers have seen.
///
/// # Safety
/// `strategy_name` is NULL or a NUL-terminated string.
unsafe fn folio_batch<S: Strategy + Default, R, const N: usize>(
    ranges: [*const c_void; N],
    len: usize,
    folio_size: usize,
    strategy_name: *const c_char,
    run: impl FnOnce([Vec<*mut u8>; N], S) -> Result<R, BatchError>,
) -> c_int {
    guard(|| {
        let mut starts = [const { Vec::new() }; N];
        for (s, &p) in starts.iter_mut().zip(&ranges) {
            *s = folios(p, len, folio_size)?;
        }
        // SAFETY: the caller's contract.
        let s: S = unsafe { strategy(strategy_name) }?;
        run(starts, s).map_err(|e| batch_err(&e))?;
        Ok(0)
    })
}

/// # Safety
/// See `fk_copy_folios` in foliokit.h: both ranges valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn fk_copy_folios(
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
    folio_size: usize,
    strategy_name: *const c_char,
    write_once: c_int,
) -> c_int {
    let run = |[dsts, srcs]: [Vec<*mut u8>; 2], s: CopyStrategy| {
        let srcs: Vec<*const u8> = srcs.into_iter().map(<*mut u8>::cast_const).collect();
        let o = CopyOptions::default().strategy(s).reuse(reuse(write_once));
        // SAFETY: the caller guarantees validity; overlap and alignment are
        // checked inside.
        unsafe { fk::copy_folios_raw(&dsts, &srcs, folio_size, o) }
    };
    let ranges = [dst.cast_const(), src];
    // SAFETY: the caller's contract.
    unsafe { folio_batch(ranges, len, folio_size, strategy_name, run) }
}

/// # Safety
/// See `fk_clear_folios` in foliokit.h: `dst` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn fk_clear_folios(
    dst: *mut c_void,
    len: usize,
    folio_size: usize,
    strategy_name: *const c_char,
    write_once: c_int,
) -> c_int {
    let run = |[dsts]: [Vec<*mut u8>; 1], s: ClearStrategy| {
        let o = ClearOptions::default()
            .strategy(s)
            .reuse(reuse(write_once))
            .hint_page(0);
        // SAFETY: the caller guarantees validity; the rest is checked inside.
        unsafe { fk::clear_folios_raw(&dsts, folio_size, o) }
    };
    // SAFETY: the caller's contract.
    unsafe { folio_batch([dst.cast_const()], len, folio_size, strategy_name, run) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folio size that is not whole pages is refused before the folio
    /// list is made: over 4 GiB, a byte-sized folio made a list of 4 G
    /// pointers, and the allocation aborted the process.
    #[test]
    fn a_byte_sized_folio_is_refused_before_anything_is_listed() {
        let len = 4usize << 30;
        // SAFETY: address space only (no access, no reserve), unmapped
        // below; the calls refuse before reading it.
        let (a, b) = unsafe {
            let map = || {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            (map(), map())
        };
        assert!(a != libc::MAP_FAILED && b != libc::MAP_FAILED);
        // SAFETY: refused on its arguments, before either range is used.
        let copy = unsafe { fk_copy_folios(a, b, len, 1, std::ptr::null(), 0) };
        // SAFETY: as above.
        let clear = unsafe { fk_clear_folios(a, len, 1, std::ptr::null(), 0) };
        // SAFETY: our own mappings, unused.
        unsafe {
            libc::munmap(a, len);
            libc::munmap(b, len);
        }
        assert_eq!((copy, clear), (-libc::EINVAL, -libc::EINVAL));
    }
}

//! Extensible structs (the header's rule, at its top): a struct whose first
//! field is `size_t size` may gain fields at its end without breaking
//! callers built against another version. [`extensible!`] declares the Rust
//! mirror of one and proves at compile time what reading and writing it by
//! bytes needs; [`read_ext`], [`out_size`] and [`write_ext`] apply the rule.

use std::mem::size_of;

/// A `size` beyond this is not a struct size but garbage: refused without
/// reading that far (the kernel's extensible syscalls cap it the same way).
pub(crate) const STRUCT_SIZE_MAX: usize = 4096;

/// A field type for which every bit pattern is a valid value, with no
/// padding inside: an integer, a float, or a struct of those.
///
/// # Safety
/// Implementors must satisfy the above.
pub(crate) unsafe trait Plain: Copy + Default {}

// SAFETY: integers and floats: any bits are a value, no padding.
unsafe impl Plain for usize {}
// SAFETY: as above.
unsafe impl Plain for u64 {}
// SAFETY: as above.
unsafe impl Plain for std::ffi::c_int {}
// SAFETY: as above.
unsafe impl Plain for std::ffi::c_uint {}
// SAFETY: as above.
unsafe impl Plain for f64 {}

/// Compiles only for a [`Plain`] type: [`extensible!`] calls it per field.
pub(crate) const fn plain<T: Plain>() {}

/// A C struct the library reads or fills under the extensible-struct rule:
/// `size: usize` first, every field [`Plain`], and no padding (so every
/// version is larger than the last and no byte of it is uninitialised).
/// Implemented only by [`extensible!`], which checks all of that.
///
/// # Safety
/// Implementors must satisfy all of the above.
pub(crate) unsafe trait Extensible: Copy + Default {
    /// The smallest `size` accepted: the struct's first version's size.
    const MIN: usize;
}

/// Declares the mirror of an extensible C struct: `#[repr(C)]`, the
/// `size: usize` field first, then the given fields, with [`Extensible`]
/// implemented and its conditions checked while compiling (each field
/// [`Plain`], the fields' sizes adding up to the struct's: no padding).
///
/// Every struct is at its first version, so `MIN` is the whole size. The
/// release that appends a field must keep `MIN` at the old size: give the
/// macro that size then.
macro_rules! extensible {
    (
        $(#[$m:meta])*
        pub struct $name:ident {
            $($(#[$fm:meta])* pub $f:ident: $t:ty,)*
        }
    ) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct $name {
            /// In: the caller's `sizeof`; out: the bytes the library filled.
            pub size: usize,
            $($(#[$fm])* pub $f: $t,)*
        }

        // SAFETY: `size` is declared first in a repr(C) struct, every field
        // is `Plain` and the sizes add up to the struct's (both checked
        // below).
        unsafe impl $crate::ext::Extensible for $name {
            const MIN: usize = ::std::mem::size_of::<$name>();
        }

        const _: () = {
            $($crate::ext::plain::<$t>();)*
            assert!(::std::mem::offset_of!($name, size) == 0);
            assert!(
                ::std::mem::size_of::<$name>()
                    == ::std::mem::size_of::<usize>() $(+ ::std::mem::size_of::<$t>())*,
                "padding in an extensible struct"
            );
        };
    };
}
pub(crate) use extensible;

/// Reads the caller's extensible struct at `p`: fields past its `size` are
/// zero (their default), bytes past ours must be zero.
///
/// # Safety
/// `p` is NULL or points to a struct of at least `size` readable bytes,
/// aligned for `T`.
pub(crate) unsafe fn read_ext<T: Extensible>(p: *const T) -> Result<Option<T>, std::ffi::c_int> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: every version starts with `size: usize` (contract).
    let size = unsafe { p.cast::<usize>().read() };
    if size < T::MIN {
        return Err(-libc::EINVAL);
    }
    if size > STRUCT_SIZE_MAX {
        return Err(-libc::E2BIG);
    }
    let ours = size_of::<T>();
    let bytes = p.cast::<u8>();
    for i in ours..size {
        // SAFETY: i < size, and the caller's struct has `size` bytes.
        if unsafe { bytes.add(i).read() } != 0 {
            return Err(-libc::E2BIG);
        }
    }
    let mut v = T::default();
    // SAFETY: min(size, ours) bytes are readable at `p` and writable in `v`;
    // any bytes are a valid `T` (Extensible).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes, (&raw mut v).cast::<u8>(), size.min(ours));
    }
    Ok(Some(v))
}

/// Reads the caller's extensible options at `p`, all defaults for NULL.
///
/// # Safety
/// As [`read_ext`].
pub(crate) unsafe fn read_opts<T: Extensible>(p: *const T) -> Result<T, std::ffi::c_int> {
    // SAFETY: forwarded contract.
    Ok(unsafe { read_ext(p) }?.unwrap_or_default())
}

/// Checks the `size` of the caller's output struct before anything is done.
///
/// # Safety
/// `p` is NULL or points to a struct starting with `size: usize`.
pub(crate) unsafe fn out_size<T: Extensible>(p: *mut T) -> Result<usize, std::ffi::c_int> {
    if p.is_null() {
        return Ok(0);
    }
    // SAFETY: every version starts with `size: usize` (contract).
    let size = unsafe { p.cast::<usize>().read() };
    if size < T::MIN {
        return Err(-libc::EINVAL);
    }
    Ok(size.min(size_of::<T>()))
}

/// Fills the first `n` bytes (from [`out_size`]) of the caller's output
/// struct from `v`, `size` set to `n`.
///
/// # Safety
/// `p` is NULL or points to a struct of at least `n` writable bytes.
pub(crate) unsafe fn write_ext<T: Extensible>(p: *mut T, mut v: T, n: usize) {
    if p.is_null() {
        return;
    }
    // SAFETY: `size` is the first field (Extensible).
    unsafe { (&raw mut v).cast::<usize>().write(n) };
    // SAFETY: n <= size_of::<T>() bytes readable in `v`, writable at `p`.
    unsafe { std::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), p.cast::<u8>(), n) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::{FkMigrateOpts, FkMigrateResult, FK_PATH_AUTO};
    use std::mem::offset_of;

    /// An aligned buffer standing in for a caller's struct of any size.
    #[repr(C, align(8))]
    struct Buf([u8; 64]);

    impl Buf {
        fn new(fill: u8, size: usize) -> Buf {
            let mut b = Buf([fill; 64]);
            b.0[..size_of::<usize>()].copy_from_slice(&size.to_ne_bytes());
            b
        }
        fn opts(&self) -> *const FkMigrateOpts {
            self.0.as_ptr().cast()
        }
    }

    #[test]
    fn extensible_input_struct_rules() {
        let ours = size_of::<FkMigrateOpts>();
        // SAFETY: for all calls below, each pointer is NULL or a 64-byte,
        // 8-aligned buffer, and every size used is at most 64 or refused
        // before reading.
        unsafe {
            assert_eq!(read_ext::<FkMigrateOpts>(std::ptr::null()), Ok(None));
            // Too small for the first version.
            let b = Buf::new(0, ours - 1);
            assert_eq!(read_ext(b.opts()), Err(-libc::EINVAL));
            // Exactly ours: every field read.
            let want = FkMigrateOpts {
                size: ours,
                path: FK_PATH_AUTO,
                channels: 3,
                batch_pages: 64,
                latency_budget_us: 1000,
            };
            let mut b = Buf::new(0xaa, 0);
            std::ptr::copy_nonoverlapping((&raw const want).cast::<u8>(), b.0.as_mut_ptr(), ours);
            assert_eq!(read_ext(b.opts()), Ok(Some(want)));
            // A newer caller: larger size, unknown bytes zero -> accepted.
            let mut b2 = Buf::new(0, 0);
            b2.0[..ours].copy_from_slice(&b.0[..ours]);
            b2.0[..size_of::<usize>()].copy_from_slice(&64usize.to_ne_bytes());
            let got = read_ext(b2.opts()).unwrap().unwrap();
            assert_eq!(
                (got.path, got.channels, got.batch_pages),
                (FK_PATH_AUTO, 3, 64)
            );
            // ... an unknown byte set -> E2BIG, wherever it is.
            for i in [ours, 40, 63] {
                let mut b3 = Buf::new(0, 64);
                b3.0[i] = 1;
                assert_eq!(read_ext(b3.opts()), Err(-libc::E2BIG), "byte {i}");
            }
            // Garbage sizes are refused without being read.
            let b = Buf::new(0, STRUCT_SIZE_MAX + 1);
            assert_eq!(read_ext(b.opts()), Err(-libc::E2BIG));
        }
    }

    #[test]
    fn extensible_output_struct_rules() {
        let ours = size_of::<FkMigrateResult>();
        let v = FkMigrateResult {
            size: 0,
            gbps: 1.5,
            first_folio_us: 2.5,
            pages_to_move: 7,
            relocated: 1,
            batches: 9,
        };
        // SAFETY: for all calls below, 64-byte, 8-aligned buffers, sizes <= 64.
        unsafe {
            let mut b = Buf::new(0xaa, ours - 1);
            assert_eq!(
                out_size(b.0.as_mut_ptr().cast::<FkMigrateResult>()),
                Err(-libc::EINVAL)
            );
            // A newer caller's larger struct: ours filled, the rest untouched.
            let mut b = Buf::new(0xaa, 64);
            let p = b.0.as_mut_ptr().cast::<FkMigrateResult>();
            let n = out_size(p).unwrap();
            assert_eq!(n, ours);
            write_ext(p, v, n);
            assert_eq!(p.read(), FkMigrateResult { size: ours, ..v });
            assert!(b.0[ours..].iter().all(|&x| x == 0xaa));
            // An older caller (fewer fields): only what fits is written.
            let mut b = Buf::new(0xaa, 64);
            let p = b.0.as_mut_ptr().cast::<FkMigrateResult>();
            write_ext(p, v, offset_of!(FkMigrateResult, pages_to_move));
            assert_eq!((*p).gbps, 1.5);
            assert_eq!((*p).size, offset_of!(FkMigrateResult, pages_to_move));
            assert!(b.0[offset_of!(FkMigrateResult, pages_to_move)..]
                .iter()
                .all(|&x| x == 0xaa));
        }
    }
}

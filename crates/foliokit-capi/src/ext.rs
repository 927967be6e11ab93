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

//! The C ABI of foliokit (see `include/foliokit.h`, which documents every
//! function). Each entry point validates its arguments, maps typed errors to
//! negative errno-style codes, and catches panics so none crosses into C.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use fk::mc::McError;
use fk::migrate::{MigrateError, MigrateOptions, Path};
use fk::{
    BatchError, ClearOptions, ClearStrategy, CopyOptions, CopyStrategy, Reuse, Strategy,
    StrategyError,
};

/// Runs `f`, turning a panic into -EIO.
fn guard(f: impl FnOnce() -> Result<c_int, c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => e,
        Err(_) => -libc::EIO,
    }
}

fn strategy_err(e: &StrategyError) -> c_int {
    match e {
        StrategyError::Unknown { .. } | StrategyError::Empty { .. } => -libc::ENOENT,
        StrategyError::Unavailable { .. } => -libc::EOPNOTSUPP,
        StrategyError::Unresolved { .. } => -libc::EINVAL,
    }
}

fn batch_err(e: &BatchError) -> c_int {
    match e {
        BatchError::Strategy(s) => strategy_err(s),
        _ => -libc::EINVAL,
    }
}

/// Parses a strategy name; NULL is auto.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
unsafe fn strategy<S: Strategy + Default>(name: *const c_char) -> Result<S, c_int> {
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

fn reuse(write_once: c_int) -> Reuse {
    if write_once != 0 {
        Reuse::Stream
    } else {
        Reuse::Reread
    }
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
    guard(|| {
        if folio_size == 0 || len % folio_size != 0 || dst.is_null() || src.is_null() {
            return Err(-libc::EINVAL);
        }
        // SAFETY: the caller's contract.
        let s: CopyStrategy = unsafe { strategy(strategy_name) }?;
        let dsts = fk::batch::folio_starts(dst.cast(), len, folio_size);
        let srcs: Vec<*const u8> = fk::batch::folio_starts(src.cast_mut().cast(), len, folio_size)
            .into_iter()
            .map(<*mut u8>::cast_const)
            .collect();
        let o = CopyOptions {
            strategy: s,
            reuse: reuse(write_once),
        };
        // SAFETY: the caller guarantees validity; overlap and alignment are
        // checked inside.
        unsafe { fk::copy_folios_raw(&dsts, &srcs, folio_size, o) }.map_err(|e| batch_err(&e))?;
        Ok(0)
    })
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
    guard(|| {
        if folio_size == 0 || len % folio_size != 0 || dst.is_null() {
            return Err(-libc::EINVAL);
        }
        // SAFETY: the caller's contract.
        let s: ClearStrategy = unsafe { strategy(strategy_name) }?;
        let dsts = fk::batch::folio_starts(dst.cast(), len, folio_size);
        let o = ClearOptions {
            strategy: s,
            reuse: reuse(write_once),
            hint_page: 0,
        };
        // SAFETY: the caller guarantees validity; the rest is checked inside.
        unsafe { fk::clear_folios_raw(&dsts, folio_size, o) }.map_err(|e| batch_err(&e))?;
        Ok(0)
    })
}

/// # Safety
/// See `fk_copy_mc` in foliokit.h.
#[no_mangle]
pub unsafe extern "C" fn fk_copy_mc(
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
    strategy_name: *const c_char,
    not_copied: *mut usize,
    bad_page: *mut usize,
) -> c_int {
    guard(|| {
        if len > 0 && (dst.is_null() || src.is_null()) {
            return Err(-libc::EINVAL);
        }
        // SAFETY: the caller's contract.
        let s: CopyStrategy = unsafe { strategy(strategy_name) }?;
        let (d, sr) = (dst.cast::<u8>() as usize, src.cast::<u8>() as usize);
        if d < sr + len && sr < d + len && len > 0 {
            return Err(-libc::EINVAL);
        }
        // SAFETY: valid, disjoint ranges (checked above) by the contract.
        let (d, sr) = unsafe {
            (
                std::slice::from_raw_parts_mut(dst.cast::<u8>(), len),
                std::slice::from_raw_parts(src.cast::<u8>(), len),
            )
        };
        match fk::copy_mc(d, sr, s) {
            Ok(_) => Ok(0),
            Err(McError::Fault(f)) => {
                // SAFETY: the out-pointers are NULL or valid (contract).
                unsafe {
                    if !not_copied.is_null() {
                        *not_copied = f.not_copied;
                    }
                    if !bad_page.is_null() {
                        *bad_page = f.bad_page;
                    }
                }
                Err(-libc::EHWPOISON)
            }
            Err(McError::NoVariant(_)) => Err(-libc::EOPNOTSUPP),
            Err(McError::Unavailable(_)) => Err(-libc::EOPNOTSUPP),
            // Another SIGBUS handler replaced foliokit's after it started.
            Err(McError::HandlerReplaced) => Err(-libc::EBUSY),
            Err(McError::Batch(e)) => Err(batch_err(&e)),
        }
    })
}

/// # Safety
/// Both ranges valid for `len` bytes and disjoint.
#[no_mangle]
pub unsafe extern "C" fn fk_memcpy_nt(dst: *mut c_void, src: *const c_void, len: usize) -> c_int {
    guard(|| {
        if len == 0 {
            return Ok(0);
        }
        if dst.is_null() || src.is_null() {
            return Err(-libc::EINVAL);
        }
        // SAFETY: the caller's contract.
        let (d, s) = unsafe {
            (
                std::slice::from_raw_parts_mut(dst.cast::<u8>(), len),
                std::slice::from_raw_parts(src.cast::<u8>(), len),
            )
        };
        fk::nt::memcpy_nt(d, s).map_err(|_| -libc::EINVAL)?;
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn fk_drain() {
    fk::nt::drain();
}

/// # Safety
/// `[addr, addr + len)` is mapped writable memory of this process.
#[no_mangle]
pub unsafe extern "C" fn fk_populate(addr: *mut c_void, len: usize, channels: c_uint) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract; everything else is checked inside.
        match unsafe { fk::mem::populate_raw(addr.cast(), len, channels as usize) } {
            Ok(_) => Ok(0),
            Err(fk::mem::PopulateError::Fault { source, .. }) => {
                Err(-source.raw_os_error().unwrap_or(libc::EIO))
            }
            Err(_) => Err(-libc::EINVAL),
        }
    })
}

/// Mirrors `struct fk_migrate_opts`.
#[repr(C)]
pub struct FkMigrateOpts {
    pub path: c_int,
    pub batch_pages: usize,
    pub channels: c_uint,
    pub latency_budget_us: u64,
}

/// Mirrors `struct fk_migrate_result`.
#[repr(C)]
pub struct FkMigrateResult {
    pub gbps: f64,
    pub first_folio_us: f64,
    pub pages_to_move: usize,
    pub relocated: c_int,
}

/// # Safety
/// See `fk_migrate` in foliokit.h.
#[no_mangle]
pub unsafe extern "C" fn fk_migrate(
    addr: *mut c_void,
    len: usize,
    node: c_uint,
    opts: *const FkMigrateOpts,
    out: *mut FkMigrateResult,
) -> c_int {
    guard(|| {
        let mut o = MigrateOptions::default();
        // SAFETY: opts is NULL or points to a valid struct (contract).
        if let Some(c) = unsafe { opts.as_ref() } {
            o.path = match c.path {
                0 => Path::Kernel,
                1 => Path::Auto,
                2 => Path::Relocate,
                _ => return Err(-libc::EINVAL),
            };
            if c.batch_pages > 0 {
                o.batch_pages = c.batch_pages;
            }
            if c.channels > 0 {
                o.channels = c.channels as usize;
            }
            if c.latency_budget_us > 0 {
                o.latency_budget = Some(Duration::from_micros(c.latency_budget_us));
            }
        }
        // SAFETY: the caller's contract (see the header).
        let r =
            unsafe { fk::migrate::migrate(addr.cast(), len, node, &o) }.map_err(|e| match e {
                MigrateError::Misaligned { .. }
                | MigrateError::Empty
                | MigrateError::Wraps { .. }
                | MigrateError::ZeroBatch => -libc::EINVAL,
                MigrateError::Unmapped { .. } => -libc::EFAULT,
                MigrateError::NoSuchNode { .. } => -libc::ENODEV,
                MigrateError::Refused { .. } => -libc::EPERM,
                MigrateError::Sys { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
                _ => -libc::EIO,
            })?;
        // SAFETY: out is NULL or points to a valid struct (contract).
        if let Some(out) = unsafe { out.as_mut() } {
            *out = FkMigrateResult {
                gbps: r.gbps(),
                first_folio_us: r.first_folio_us().unwrap_or(0.0),
                pages_to_move: r.pages_to_move,
                relocated: c_int::from(r.path == fk::migrate::MigratePath::Relocate),
            };
        }
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn fk_strerror(code: c_int) -> *const c_char {
    let s: &'static CStr = match -code {
        0 => c"success",
        libc::EINVAL => c"invalid argument: size, alignment, overlap or option",
        libc::ENOENT => c"unknown strategy name",
        libc::EOPNOTSUPP => c"not supported on this CPU or kernel",
        libc::EHWPOISON => c"source page faulted (poison or vanished); see not_copied",
        libc::EFAULT => c"address range not mapped",
        libc::ENODEV => c"no such NUMA node",
        libc::EPERM => c"relocation needs private anonymous memory",
        libc::ENOMEM => c"out of memory",
        libc::EIO => c"internal error",
        _ => c"unknown error",
    };
    s.as_ptr()
}

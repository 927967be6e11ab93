//! The C ABI of foliokit (see `include/foliokit.h`, which documents every
//! function). Each entry point validates its arguments, maps typed errors to
//! negative errno-style codes, and catches panics so none crosses into C.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use fk::mc::{FaultKind, McError};
use fk::migrate::{MigrateError, MigrateOptions, Path};
use fk::{
    BatchError, ClearOptions, ClearStrategy, CopyOptions, CopyStrategy, Reuse, Strategy,
    StrategyError,
};

/// The code of an internal failure (a panic, or an error the C API cannot
/// name): distinct from every code the operations report.
const INTERNAL: c_int = -libc::ENOTRECOVERABLE;

/// Runs `f`, turning a panic into [`INTERNAL`].
fn guard(f: impl FnOnce() -> Result<c_int, c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => e,
        Err(_) => INTERNAL,
    }
}

/// Parses a decimal version component at compile time.
const fn parse_u32(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut v = 0u32;
    let mut i = 0;
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "version components are decimal");
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
}

/// `FK_VERSION` of this build: MAJOR * 1000000 + MINOR * 1000 + PATCH
/// (build.rs checks the header's macros against the same crate version).
const VERSION: u32 = parse_u32(env!("CARGO_PKG_VERSION_MAJOR")) * 1_000_000
    + parse_u32(env!("CARGO_PKG_VERSION_MINOR")) * 1_000
    + parse_u32(env!("CARGO_PKG_VERSION_PATCH"));

#[no_mangle]
pub extern "C" fn fk_version() -> u32 {
    VERSION
}

fn strategy_err(e: &StrategyError) -> c_int {
    match e {
        StrategyError::Unknown { .. } | StrategyError::Empty { .. } => -libc::ENOENT,
        StrategyError::Unavailable { .. } => -libc::EOPNOTSUPP,
        StrategyError::Unresolved { .. } => -libc::EINVAL,
        // A newer error the C API does not know yet.
        _ => -libc::EINVAL,
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
        let o = CopyOptions::default().strategy(s).reuse(reuse(write_once));
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
        let o = ClearOptions::default()
            .strategy(s)
            .reuse(reuse(write_once))
            .hint_page(0);
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
        let (d, sr): (&mut [u8], &[u8]) = if len == 0 {
            // NULL is allowed here, but not in a slice.
            (&mut [], &[])
        } else {
            // SAFETY: valid, disjoint ranges (checked above) by the contract;
            // both pointers are non-NULL (checked above).
            unsafe {
                (
                    std::slice::from_raw_parts_mut(dst.cast::<u8>(), len),
                    std::slice::from_raw_parts(src.cast::<u8>(), len),
                )
            }
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
                Err(fault_code(f.kind))
            }
            Err(McError::NoVariant(_)) => Err(-libc::EOPNOTSUPP),
            Err(McError::Unavailable(_)) => Err(-libc::EOPNOTSUPP),
            // Another SIGBUS handler replaced foliokit's after it started.
            Err(McError::HandlerReplaced) => Err(-libc::EBUSY),
            Err(McError::Batch(e)) => Err(batch_err(&e)),
            Err(_) => Err(-libc::EINVAL),
        }
    })
}

/// The code `fk_copy_mc` returns for a source page that faulted.
fn fault_code(kind: FaultKind) -> c_int {
    match kind {
        FaultKind::Poison => -libc::EHWPOISON,
        // What read(2) returns for a buffer in a truncated file mapping.
        FaultKind::Vanished => -libc::EFAULT,
        FaultKind::Other(_) => -libc::EIO,
    }
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

/// `enum fk_path` values.
const FK_PATH_KERNEL: c_int = 0;
const FK_PATH_AUTO: c_int = 1;
const FK_PATH_RELOCATE: c_int = 2;

/// Mirrors `struct fk_migrate_opts` (extensible: see the header's rule).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkMigrateOpts {
    pub size: usize,
    /// `enum fk_path`, read as an int: C may pass any value.
    pub path: c_int,
    pub channels: c_uint,
    pub batch_pages: usize,
    pub latency_budget_us: u64,
}

/// Mirrors `struct fk_migrate_result` (extensible: see the header's rule).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkMigrateResult {
    pub size: usize,
    pub gbps: f64,
    pub first_folio_us: f64,
    pub pages_to_move: usize,
    pub relocated: c_int,
    pub batches: c_uint,
}

/// The smallest `size` each struct accepts: its first version's size. Once
/// fields are appended, these stay what they are and `size_of` grows.
const MIGRATE_OPTS_SIZE_V1: usize = size_of::<FkMigrateOpts>();
const MIGRATE_RESULT_SIZE_V1: usize = size_of::<FkMigrateResult>();

/// A `size` beyond this is not a struct size but garbage: refused without
/// reading that far (the kernel's extensible syscalls cap it the same way).
const STRUCT_SIZE_MAX: usize = 4096;

/// A C struct the library reads or fills under the extensible-struct rule:
/// `size: usize` first, every field an integer or float (any bit pattern is
/// a valid value), and no padding (so every version is larger than the
/// last and no byte of it is uninitialised).
///
/// # Safety
/// Implementors must satisfy all of the above.
unsafe trait Extensible: Copy + Default {
    const MIN: usize;
}

// SAFETY: `size` first, then integer fields only; no padding (asserted below).
unsafe impl Extensible for FkMigrateOpts {
    const MIN: usize = MIGRATE_OPTS_SIZE_V1;
}
// SAFETY: `size` first, then integer and float fields only; no padding
// (asserted below).
unsafe impl Extensible for FkMigrateResult {
    const MIN: usize = MIGRATE_RESULT_SIZE_V1;
}

const _: () = {
    assert!(offset_of!(FkMigrateOpts, size) == 0);
    assert!(offset_of!(FkMigrateResult, size) == 0);
    // No padding: the fields' sizes add up to the struct's.
    assert!(
        size_of::<FkMigrateOpts>()
            == 2 * size_of::<usize>() + 2 * size_of::<c_int>() + size_of::<u64>()
    );
    assert!(
        size_of::<FkMigrateResult>()
            == 2 * size_of::<usize>() + 2 * size_of::<f64>() + 2 * size_of::<c_int>()
    );
};

/// Reads the caller's extensible struct at `p`: fields past its `size` are
/// zero (their default), bytes past ours must be zero.
///
/// # Safety
/// `p` is NULL or points to a struct of at least `size` readable bytes,
/// aligned for `T`.
unsafe fn read_ext<T: Extensible>(p: *const T) -> Result<Option<T>, c_int> {
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

/// Checks the `size` of the caller's output struct before anything is done.
///
/// # Safety
/// `p` is NULL or points to a struct starting with `size: usize`.
unsafe fn out_size<T: Extensible>(p: *mut T) -> Result<usize, c_int> {
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
unsafe fn write_ext<T: Extensible>(p: *mut T, mut v: T, n: usize) {
    if p.is_null() {
        return;
    }
    // SAFETY: `size` is the first field (asserted above).
    unsafe { (&raw mut v).cast::<usize>().write(n) };
    // SAFETY: n <= size_of::<T>() bytes readable in `v`, writable at `p`.
    unsafe { std::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), p.cast::<u8>(), n) };
}

fn migrate_options(c: Option<FkMigrateOpts>) -> Result<MigrateOptions, c_int> {
    let mut o = MigrateOptions::default();
    let Some(c) = c else { return Ok(o) };
    o.path = match c.path {
        FK_PATH_KERNEL => Path::Kernel,
        FK_PATH_AUTO => Path::Auto,
        FK_PATH_RELOCATE => Path::Relocate,
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
    Ok(o)
}

fn migrate_err(e: MigrateError) -> c_int {
    match e {
        MigrateError::Misaligned { .. }
        | MigrateError::Empty
        | MigrateError::Wraps { .. }
        | MigrateError::ZeroBatch => -libc::EINVAL,
        MigrateError::Unmapped { .. } => -libc::EFAULT,
        MigrateError::NoSuchNode { .. } => -libc::ENODEV,
        MigrateError::Refused { .. } => -libc::EPERM,
        MigrateError::Sys { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
        MigrateError::Strategy(s) => strategy_err(&s),
        _ => INTERNAL,
    }
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
        // SAFETY: opts is NULL or a valid struct of its `size` (contract).
        let o = migrate_options(unsafe { read_ext(opts) }?)?;
        // SAFETY: out is NULL or a valid struct of its `size` (contract).
        let n = unsafe { out_size(out) }?;
        // SAFETY: the caller's contract (see the header).
        let r = unsafe { fk::migrate::migrate(addr.cast(), len, node, &o) }.map_err(migrate_err)?;
        let result = FkMigrateResult {
            size: n,
            gbps: r.gbps(),
            first_folio_us: r.first_folio_us().unwrap_or(0.0),
            pages_to_move: r.pages_to_move,
            relocated: c_int::from(r.path == fk::migrate::MigratePath::Relocate),
            batches: c_uint::try_from(r.batches.len()).unwrap_or(c_uint::MAX),
        };
        // SAFETY: out is NULL or has `n` writable bytes (checked by out_size).
        unsafe { write_ext(out, result, n) };
        Ok(0)
    })
}

/// Mirrors `struct fk_range`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkRange {
    pub start: usize,
    pub end: usize,
}

/// Mirrors `struct fk_process_opts` (extensible: see the header's rule).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkProcessOpts {
    pub size: usize,
    pub threads: c_uint,
    pub flags: c_uint,
    pub budget_us: u64,
}

/// Mirrors `struct fk_process_result` (extensible: see the header's rule).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkProcessResult {
    pub size: usize,
    pub moved: usize,
    pub already: usize,
    pub not_present: usize,
    pub failed: usize,
    pub secs: f64,
    pub longest_call_us: f64,
}

// SAFETY: `size` first, then integer fields only; no padding (asserted below).
unsafe impl Extensible for FkProcessOpts {
    const MIN: usize = size_of::<FkProcessOpts>();
}
// SAFETY: `size` first, then integer and float fields only; no padding
// (asserted below).
unsafe impl Extensible for FkProcessResult {
    const MIN: usize = size_of::<FkProcessResult>();
}

const _: () = {
    assert!(offset_of!(FkProcessOpts, size) == 0);
    assert!(offset_of!(FkProcessResult, size) == 0);
    assert!(size_of::<FkProcessOpts>() == size_of::<usize>() + 2 * size_of::<c_uint>() + 8);
    assert!(size_of::<FkProcessResult>() == 5 * size_of::<usize>() + 2 * size_of::<f64>());
};

/// `fk_process_opts.flags` (the header's FK_PROCESS_*).
const PROCESS_DRY_RUN: c_uint = 1;
const PROCESS_WITH_STACK: c_uint = 2;

fn process_err(e: &fk::migrate::process::ProcessError) -> c_int {
    use fk::migrate::process::ProcessError as E;
    match e {
        E::NoProcess { .. } | E::Gone { .. } => -libc::ESRCH,
        E::Permission { .. } => -libc::EPERM,
        E::NoSuchNode { .. } => -libc::ENODEV,
        E::NoMemory { .. } => -libc::ENOSPC,
        E::BadRange { .. } => -libc::EINVAL,
        E::Sys { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
        _ => INTERNAL,
    }
}

/// # Safety
/// See `fk_migrate_process` in foliokit.h: `ranges` is NULL (with `n` 0)
/// or points to `n` readable `struct fk_range`.
#[no_mangle]
pub unsafe extern "C" fn fk_migrate_process(
    pid: c_int,
    ranges: *const FkRange,
    n: usize,
    node: c_uint,
    opts: *const FkProcessOpts,
    out: *mut FkProcessResult,
) -> c_int {
    use fk::migrate::process::{migrate_process, ProcessError, ProcessOptions, Ranges, Target};
    guard(|| {
        // SAFETY: opts is NULL or a valid struct of its `size` (contract).
        let c = unsafe { read_ext(opts) }?.unwrap_or_default();
        // SAFETY: out is NULL or a valid struct of its `size` (contract).
        let size = unsafe { out_size(out) }?;
        if c.flags & !(PROCESS_DRY_RUN | PROCESS_WITH_STACK) != 0 || (ranges.is_null() && n > 0) {
            return Err(-libc::EINVAL);
        }
        let mut o = ProcessOptions::default()
            .threads((c.threads as usize).max(1))
            .dry_run(c.flags & PROCESS_DRY_RUN != 0);
        if c.budget_us > 0 {
            o = o.budget(Duration::from_micros(c.budget_us));
        }
        let which = if n == 0 {
            Ranges::AllAnon {
                stack: c.flags & PROCESS_WITH_STACK != 0,
            }
        } else {
            // SAFETY: `ranges` points to `n` readable ranges (contract).
            let list = unsafe { std::slice::from_raw_parts(ranges, n) };
            Ranges::Given(list.iter().map(|r| (r.start, r.end)).collect())
        };
        let target = Target::open(pid).map_err(|e| process_err(&e))?;
        let (report, rc) = match migrate_process(&target, &which, node, &o) {
            Ok(r) => (r, 0),
            Err(ProcessError::Gone { partial, .. }) => (*partial, -libc::ESRCH),
            Err(e) => return Err(process_err(&e)),
        };
        let (moved, already, not_present, failed) = report.totals();
        let result = FkProcessResult {
            size,
            moved,
            already,
            not_present,
            failed,
            secs: report.secs,
            longest_call_us: report
                .ranges
                .iter()
                .filter_map(|r| r.longest_call_us)
                .fold(0.0, f64::max),
        };
        // SAFETY: out is NULL or has `size` writable bytes (checked by out_size).
        unsafe { write_ext(out, result, size) };
        if rc == 0 {
            Ok(0)
        } else {
            Err(rc)
        }
    })
}

/// Mirrors `struct fk_lazy_range`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkLazyRange {
    pub addr: usize,
    pub len: usize,
    pub offset: u64,
}

/// Mirrors `struct fk_lazy_opts` (extensible: see the header's rule).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkLazyOpts {
    pub size: usize,
    pub channels: c_uint,
    pub flags: c_uint,
    pub budget_us: u64,
    pub folio_size: u64,
}

/// Mirrors `struct fk_lazy_progress` (extensible).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkLazyProgress {
    pub size: usize,
    pub total_pages: u64,
    pub faulted_pages: u64,
    pub filled_pages: u64,
    pub skipped_pages: u64,
    pub bad_pages: u64,
    pub faults: u64,
    pub done: u64,
}

/// Mirrors `struct fk_lazy_report` (extensible).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkLazyReport {
    pub size: usize,
    pub progress: FkLazyProgressFields,
    pub whole_folios: u64,
    pub batches: u64,
    pub longest_batch_us: f64,
    pub secs: f64,
    pub poisoned: u64,
    pub bad_ranges: u64,
}

/// The counts of `struct fk_lazy_report`, in the order of
/// `struct fk_lazy_progress` after its `size`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkLazyProgressFields {
    pub total_pages: u64,
    pub faulted_pages: u64,
    pub filled_pages: u64,
    pub skipped_pages: u64,
    pub bad_pages: u64,
    pub faults: u64,
}

/// Mirrors `struct fk_lazy_bad`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkLazyBad {
    pub addr: usize,
    pub len: usize,
    pub kind: u64,
}

/// The opaque `struct fk_lazy`: a fill in progress.
pub struct FkLazy(fk::lazy::LazyFill);

// SAFETY: `size` first, then integer fields only; no padding (asserted below).
unsafe impl Extensible for FkLazyOpts {
    const MIN: usize = size_of::<FkLazyOpts>();
}
// SAFETY: `size` first, then integer fields only; no padding (asserted below).
unsafe impl Extensible for FkLazyProgress {
    const MIN: usize = size_of::<FkLazyProgress>();
}
// SAFETY: `size` first, then integer and float fields only; no padding
// (asserted below).
unsafe impl Extensible for FkLazyReport {
    const MIN: usize = size_of::<FkLazyReport>();
}

const _: () = {
    assert!(offset_of!(FkLazyOpts, size) == 0);
    assert!(offset_of!(FkLazyProgress, size) == 0);
    assert!(offset_of!(FkLazyReport, size) == 0);
    assert!(size_of::<FkLazyOpts>() == size_of::<usize>() + 2 * size_of::<c_uint>() + 16);
    assert!(size_of::<FkLazyProgress>() == size_of::<usize>() + 7 * 8);
    assert!(size_of::<FkLazyReport>() == size_of::<usize>() + 12 * 8);
};

/// `fk_lazy_opts.flags` (the header's FK_LAZY_*).
const LAZY_START_CANCELLED: c_uint = 1;
const LAZY_SERVE_DURING_BATCHES: c_uint = 2;

fn lazy_err(e: &fk::lazy::LazyError) -> c_int {
    use fk::lazy::{LazyError as E, LazyRefusal as R};
    match e {
        E::Refused(R::NoUffd(_)) => -libc::ENOSYS,
        E::Refused(R::UserModeOnly(_) | R::NoForkEvents(_)) => -libc::EPERM,
        E::Refused(R::KernelLacks { .. }) => -libc::EOPNOTSUPP,
        E::Refused(R::Register { source, .. }) => -source.raw_os_error().unwrap_or(libc::EINVAL),
        E::BadSegment { .. } | E::SourceTooShort { .. } => -libc::EINVAL,
        E::Copy(_) => -libc::EOPNOTSUPP,
        E::Sys { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
        _ => INTERNAL,
    }
}

fn lazy_progress(p: &fk::lazy::LazyProgress) -> FkLazyProgressFields {
    FkLazyProgressFields {
        total_pages: p.total_pages,
        faulted_pages: p.faulted_pages,
        filled_pages: p.filled_pages,
        skipped_pages: p.skipped_pages,
        bad_pages: p.bad_pages,
        faults: p.faults,
    }
}

/// # Safety
/// See `fk_lazy_start` in foliokit.h: `ranges` points to `n` readable
/// ranges, `out` to a writable pointer; the ranges are the caller's memory
/// under the header's rules.
#[no_mangle]
pub unsafe extern "C" fn fk_lazy_start(
    ranges: *const FkLazyRange,
    n: usize,
    fd: c_int,
    opts: *const FkLazyOpts,
    out: *mut *mut FkLazy,
) -> c_int {
    use std::os::fd::BorrowedFd;
    guard(|| {
        // SAFETY: opts is NULL or a valid struct of its `size` (contract).
        let c = unsafe { read_ext(opts) }?.unwrap_or_default();
        if ranges.is_null()
            || n == 0
            || out.is_null()
            || fd < 0
            || c.flags & !(LAZY_START_CANCELLED | LAZY_SERVE_DURING_BATCHES) != 0
        {
            return Err(-libc::EINVAL);
        }
        // SAFETY: `ranges` points to `n` readable ranges (contract).
        let list = unsafe { std::slice::from_raw_parts(ranges, n) };
        let segs: Vec<fk::lazy::Segment> = list
            .iter()
            .map(|r| fk::lazy::Segment {
                addr: r.addr,
                len: r.len,
                offset: r.offset,
            })
            .collect();
        let end = list
            .iter()
            .map(|r| r.offset.checked_add(r.len as u64))
            .try_fold(0u64, |m, e| e.map(|e| m.max(e)))
            .ok_or(-libc::EINVAL)?;
        let len = usize::try_from(end).map_err(|_| -libc::EINVAL)?;
        // SAFETY: the caller's open descriptor, borrowed for this call.
        let file = unsafe { BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .map_err(|e| -e.raw_os_error().unwrap_or(libc::EBADF))?;
        let source = fk::lazy::Source::map_file(&std::fs::File::from(file), len)
            .map_err(|e| -e.raw_os_error().unwrap_or(libc::EIO))?;
        let mut o = fk::lazy::LazyOptions::default();
        if c.channels > 0 {
            o.channels = c.channels as usize;
        }
        if c.budget_us > 0 {
            o.latency_budget = Duration::from_micros(c.budget_us);
        }
        if c.folio_size > 0 {
            o.folio_size = usize::try_from(c.folio_size).map_err(|_| -libc::EINVAL)?;
        }
        o.start_cancelled = c.flags & LAZY_START_CANCELLED != 0;
        o.serve_during_batches = c.flags & LAZY_SERVE_DURING_BATCHES != 0;
        // SAFETY: forwarded contract (the header's rules for the ranges).
        let h = unsafe { fk::lazy::fill_lazily(&segs, source, &o) }.map_err(|e| lazy_err(&e))?;
        // SAFETY: `out` is writable (contract, checked non-NULL).
        unsafe { out.write(Box::into_raw(Box::new(FkLazy(h)))) };
        Ok(0)
    })
}

/// # Safety
/// `h` is a live handle from `fk_lazy_start`; `out` NULL or a valid struct.
#[no_mangle]
pub unsafe extern "C" fn fk_lazy_progress(h: *const FkLazy, out: *mut FkLazyProgress) -> c_int {
    guard(|| {
        if h.is_null() {
            return Err(-libc::EINVAL);
        }
        // SAFETY: out is NULL or a valid struct of its `size` (contract).
        let size = unsafe { out_size(out) }?;
        // SAFETY: a live handle (contract).
        let p = unsafe { &*h }.0.progress();
        let f = lazy_progress(&p);
        let v = FkLazyProgress {
            size,
            total_pages: f.total_pages,
            faulted_pages: f.faulted_pages,
            filled_pages: f.filled_pages,
            skipped_pages: f.skipped_pages,
            bad_pages: f.bad_pages,
            faults: f.faults,
            done: u64::from(p.done),
        };
        // SAFETY: out is NULL or has `size` writable bytes (checked by out_size).
        unsafe { write_ext(out, v, size) };
        Ok(0)
    })
}

/// # Safety
/// `h` is a live handle from `fk_lazy_start`.
#[no_mangle]
pub unsafe extern "C" fn fk_lazy_cancel(h: *const FkLazy) -> c_int {
    guard(|| {
        if h.is_null() {
            return Err(-libc::EINVAL);
        }
        // SAFETY: a live handle (contract).
        unsafe { &*h }.0.cancel();
        Ok(0)
    })
}

/// # Safety
/// `h` is a live handle from `fk_lazy_start`, not used again after this;
/// `out` NULL or a valid struct; `bad` NULL or `n_bad` writable entries.
#[no_mangle]
pub unsafe extern "C" fn fk_lazy_wait(
    h: *mut FkLazy,
    out: *mut FkLazyReport,
    bad: *mut FkLazyBad,
    n_bad: usize,
) -> c_int {
    guard(|| {
        if h.is_null() || (bad.is_null() && n_bad > 0) {
            return Err(-libc::EINVAL);
        }
        // SAFETY: out is NULL or a valid struct of its `size` (contract).
        let size = unsafe { out_size(out) }?;
        // SAFETY: a live handle from Box::into_raw, given back (contract).
        let FkLazy(fill) = *unsafe { Box::from_raw(h) };
        let r = fill.wait();
        let v = FkLazyReport {
            size,
            progress: lazy_progress(&r.progress),
            whole_folios: r.whole_folios,
            batches: r.batches,
            longest_batch_us: r.longest_batch_us,
            secs: r.secs,
            poisoned: u64::from(r.bad_outcome == fk::lazy::BadOutcome::Poisoned),
            bad_ranges: r.bad.len() as u64,
        };
        // SAFETY: out is NULL or has `size` writable bytes (checked by out_size).
        unsafe { write_ext(out, v, size) };
        for (i, b) in r.bad.iter().take(n_bad).enumerate() {
            let kind = match b.kind {
                FaultKind::Poison => 1,
                FaultKind::Vanished => 2,
                FaultKind::Other(_) => 3,
            };
            // SAFETY: i < n_bad entries are writable (contract).
            unsafe {
                bad.add(i).write(FkLazyBad {
                    addr: b.addr,
                    len: b.len,
                    kind,
                })
            };
        }
        Ok(c_int::try_from(r.bad.len()).unwrap_or(c_int::MAX))
    })
}

/// `fk_init` flags (the header's FK_INIT_*).
const INIT_NO_SIGBUS_HANDLER: c_uint = 1;
const INIT_PROFILE_FILE: c_uint = 2;
const INIT_SPREAD_CHANNELS: c_uint = 4;

/// Explicit start-up; see the header.
#[no_mangle]
pub extern "C" fn fk_init(flags: c_uint) -> c_int {
    guard(|| {
        let known = INIT_NO_SIGBUS_HANDLER | INIT_PROFILE_FILE | INIT_SPREAD_CHANNELS;
        if flags & !known != 0 {
            return Err(-libc::EINVAL);
        }
        let mut c = fk::Config::new().sigbus_handler(flags & INIT_NO_SIGBUS_HANDLER == 0);
        if flags & INIT_PROFILE_FILE != 0 {
            c = c.profile(fk::ProfileChoice::DefaultFile);
        }
        if flags & INIT_SPREAD_CHANNELS != 0 {
            c = c.channel_cpus(fk::ChannelCpus::Spread);
        }
        match fk::init(c) {
            Ok(_) => Ok(0),
            Err(fk::InitError::AlreadyInitialized) => Err(-libc::EALREADY),
            Err(fk::InitError::Sigbus(errno)) => Err(-errno),
            Err(_) => Err(-libc::EINVAL),
        }
    })
}

/// # Safety
/// See `fk_profile_status` in foliokit.h.
#[no_mangle]
pub unsafe extern "C" fn fk_profile_status(buf: *mut c_char, len: usize) -> c_int {
    guard(|| {
        let st = fk::tune::profile_status();
        if !buf.is_null() && len > 0 {
            // The note, cut to fit on a character boundary, then the NUL.
            let mut n = st.note.len().min(len - 1);
            while !st.note.is_char_boundary(n) {
                n -= 1;
            }
            // SAFETY: the caller gives `len` writable bytes at `buf`; we
            // write n + 1 <= len of them.
            unsafe {
                std::ptr::copy_nonoverlapping(st.note.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        Ok(c_int::from(st.loaded))
    })
}

/// Starts the shared pool of `n` channels and `n - 1` helpers now; see the
/// header.
#[no_mangle]
pub extern "C" fn fk_start_channels(n: c_uint) -> c_int {
    guard(|| match fk::channels::start_shared(n as usize) {
        Ok(_) => Ok(0),
        Err(fk::channels::ChannelError::Zero) => Err(-libc::EINVAL),
        Err(_) => Err(INTERNAL),
    })
}

#[no_mangle]
pub extern "C" fn fk_strerror(code: c_int) -> *const c_char {
    // wrapping_neg: even c_int::MIN must not overflow (no panic here).
    let s: &'static CStr = match code.wrapping_neg() {
        0 => c"success",
        libc::EINVAL => c"invalid argument: size, alignment, overlap, option or struct size",
        libc::E2BIG => c"struct has fields set that this library version does not know",
        libc::ENOENT => c"unknown strategy name",
        libc::EOPNOTSUPP => c"not supported on this CPU or kernel",
        libc::EHWPOISON => c"source page has a hardware memory error (poison); see not_copied",
        libc::EFAULT => {
            c"address not mapped, or a source page vanished (file truncated under the mapping)"
        }
        libc::EIO => c"source page raised another SIGBUS; see not_copied",
        libc::ENODEV => c"no such NUMA node",
        libc::EPERM => c"relocation refused for this memory or this process, or a lazy fill needs privilege (/dev/userfaultfd, CAP_SYS_PTRACE)",
        libc::ENOSYS => c"no userfaultfd in this kernel or process",
        libc::ENOMEM => c"out of memory",
        libc::ENOTRECOVERABLE => c"internal error in foliokit",
        libc::EALREADY => c"foliokit was already initialised (fk_init must come first)",
        libc::EBUSY => c"another SIGBUS handler replaced foliokit's; install yours before fk_init",
        _ => c"unknown error",
    };
    s.as_ptr()
}

#[cfg(test)]
#[path = "../version.rs"]
mod version;

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const HEADER: &str = include_str!("../include/foliokit.h");

    fn msg(code: c_int) -> &'static str {
        // SAFETY: fk_strerror returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(fk_strerror(code)) }
            .to_str()
            .unwrap()
    }

    #[test]
    fn profile_status_writes_a_cut_nul_terminated_line_and_nothing_past_len() {
        let full = fk::tune::profile_status();
        let want = c_int::from(full.loaded);
        // SAFETY: NULL buffer: nothing is written.
        assert_eq!(unsafe { fk_profile_status(std::ptr::null_mut(), 8) }, want);
        let mut buf = [0x55 as c_char; 16];
        // SAFETY: len 0: nothing is written.
        assert_eq!(unsafe { fk_profile_status(buf.as_mut_ptr(), 0) }, want);
        assert!(buf.iter().all(|&b| b == 0x55));
        // SAFETY: 5 writable bytes of 16.
        assert_eq!(unsafe { fk_profile_status(buf.as_mut_ptr(), 5) }, want);
        // SAFETY: NUL-terminated within the 5 bytes just written.
        let got = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert_eq!(got, &full.note[..4]);
        assert!(buf[5..].iter().all(|&b| b == 0x55), "wrote past len");
    }

    #[test]
    fn header_version_matches_the_crate_and_fk_version() {
        let (major, minor, patch) = version::header_version(HEADER).expect("FK_VERSION_* macros");
        assert_eq!(major.to_string(), env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(minor.to_string(), env!("CARGO_PKG_VERSION_MINOR"));
        assert_eq!(patch.to_string(), env!("CARGO_PKG_VERSION_PATCH"));
        assert_eq!(fk_version(), major * 1_000_000 + minor * 1_000 + patch);
    }

    /// Names of the form `fk_word(` that `text` declares or defines.
    fn fk_functions(text: &str, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = text
            .split(prefix)
            .skip(1)
            .filter_map(|rest| {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest[name.len()..]
                    .starts_with('(')
                    .then(|| format!("fk_{name}"))
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    #[test]
    fn the_header_declares_exactly_the_exported_functions() {
        let exported = fk_functions(include_str!("lib.rs"), "extern \"C\" fn fk_");
        let declared: Vec<String> = fk_functions(HEADER, " fk_")
            .into_iter()
            .chain(fk_functions(HEADER, "*fk_"))
            .filter(|n| HEADER.contains(&format!("{n}(")))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert!(exported.contains(&"fk_start_channels".to_string()));
        assert_eq!(exported, declared);
    }

    #[test]
    fn fault_kinds_have_distinct_codes_and_messages() {
        let codes = [
            fault_code(FaultKind::Poison),
            fault_code(FaultKind::Vanished),
            fault_code(FaultKind::Other(libc::BUS_OBJERR)),
        ];
        assert_eq!(codes, [-libc::EHWPOISON, -libc::EFAULT, -libc::EIO]);
        let mut all: Vec<&str> = codes.iter().map(|&c| msg(c)).collect();
        all.push(msg(INTERNAL));
        all.push(msg(-libc::E2BIG));
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 5, "{all:?}");
        assert!(!all.contains(&"unknown error"));
        assert_eq!(msg(c_int::MIN), "unknown error");
        assert_eq!(msg(12345), "unknown error");
    }

    #[test]
    fn a_panic_becomes_the_internal_code() {
        assert_eq!(guard(|| panic!("test panic")), INTERNAL);
        assert_eq!(guard(|| Ok(7)), 7);
    }

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

    /// Private anonymous memory, unmapped on drop.
    struct Map(*mut u8, usize);
    impl Map {
        fn new(len: usize) -> Map {
            // SAFETY: a fresh anonymous mapping; checked below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            Map(p.cast(), len)
        }
    }
    impl Drop for Map {
        fn drop(&mut self) {
            // SAFETY: our own mapping.
            unsafe { libc::munmap(self.0.cast(), self.1) };
        }
    }

    #[test]
    fn migrate_checks_its_structs_before_moving_anything() {
        let m = Map::new(1 << 21);
        // SAFETY: m is 2 MiB of mapped memory of ours.
        unsafe { m.0.write_bytes(0x5a, m.1) };
        let opts = |path| FkMigrateOpts {
            size: size_of::<FkMigrateOpts>(),
            path,
            ..Default::default()
        };
        let mut out = FkMigrateResult {
            size: size_of::<FkMigrateResult>(),
            ..Default::default()
        };
        // SAFETY: for all calls, valid memory and structs.
        unsafe {
            assert_eq!(
                fk_migrate(m.0.cast(), m.1, 0, &opts(7), &mut out),
                -libc::EINVAL
            );
            assert_eq!(
                fk_migrate(m.0.cast(), m.1, 0, &opts(-1), &mut out),
                -libc::EINVAL
            );
            let mut small = FkMigrateResult { size: 8, ..out };
            let rc = fk_migrate(m.0.cast(), m.1, 0, &opts(FK_PATH_KERNEL), &mut small);
            assert_eq!(rc, -libc::EINVAL);
            assert_eq!(small.size, 8, "nothing written on error");
            // Node 0 always exists: the kernel path succeeds and fills `out`.
            let rc = fk_migrate(m.0.cast(), m.1, 0, &opts(FK_PATH_KERNEL), &mut out);
            assert_eq!(rc, 0, "{}", msg(rc));
            assert_eq!(out.size, size_of::<FkMigrateResult>());
            assert_eq!(out.relocated, 0);
            assert!(out.batches >= 1);
            assert_eq!(
                fk_migrate(m.0.cast(), m.1, 0, std::ptr::null(), std::ptr::null_mut()),
                0
            );
            assert!(std::slice::from_raw_parts(m.0, m.1)
                .iter()
                .all(|&x| x == 0x5a));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn copy_mc_reports_a_vanished_page_as_efault() {
        use std::os::fd::AsRawFd;
        const PAGE: usize = 4096;
        let path = std::env::temp_dir().join(format!("fk_capi_vanish_{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.set_len(4 * PAGE as u64).unwrap();
        // SAFETY: a fresh shared mapping of our file; checked below.
        let src = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * PAGE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(src, libc::MAP_FAILED);
        f.set_len(2 * PAGE as u64).unwrap();
        let dst = Map::new(4 * PAGE);
        let (mut not_copied, mut bad) = (0usize, 0usize);
        // SAFETY: both ranges are mapped for 4 pages (the source's last two
        // raise SIGBUS, which is what fk_copy_mc survives).
        let rc = unsafe {
            fk_copy_mc(
                dst.0.cast(),
                src,
                4 * PAGE,
                std::ptr::null(),
                &mut not_copied,
                &mut bad,
            )
        };
        // SAFETY: our mapping.
        unsafe { libc::munmap(src, 4 * PAGE) };
        assert_eq!((rc, not_copied, bad), (-libc::EFAULT, 2 * PAGE, 2));
        // NULL pointers with length 0: installs the handler, copies nothing.
        // SAFETY: nothing is read or written.
        let rc = unsafe {
            fk_copy_mc(
                std::ptr::null_mut(),
                std::ptr::null(),
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, 0);
    }

    /// fk_migrate_process on this very process: every present page of a
    /// range already on its node (one-node hosts; a guest moves it for
    /// real), and each bad input refused with its code, nothing moved.
    #[test]
    fn migrate_process_counts_and_refuses_bad_input() {
        let len = 16 * 4096;
        let mut buf = fk::mem::Region::new(len, 4096).unwrap();
        buf.as_mut_slice().fill(7);
        let start = buf.as_mut_ptr() as usize;
        let range = FkRange {
            start,
            end: start + len,
        };
        let node = fk::mem::system::numa_nodes()[0];
        let here = std::process::id() as c_int;
        let mut out = FkProcessResult {
            size: size_of::<FkProcessResult>(),
            ..FkProcessResult::default()
        };
        // SAFETY: valid range, NULL opts, a valid out struct.
        let rc = unsafe { fk_migrate_process(here, &range, 1, node, std::ptr::null(), &mut out) };
        assert_eq!(rc, 0);
        assert_eq!(out.moved + out.already + out.failed, 16, "{out:?}");
        assert!(buf.as_slice().iter().all(|&b| b == 7));
        let call = |pid, ranges: *const FkRange, n, node| {
            // SAFETY: ranges is NULL or points to `n` ranges.
            unsafe {
                fk_migrate_process(pid, ranges, n, node, std::ptr::null(), std::ptr::null_mut())
            }
        };
        assert_eq!(call(here, &range, 1, 4096), -libc::ENODEV);
        assert_eq!(call(here, std::ptr::null(), 1, node), -libc::EINVAL);
        assert_eq!(call(-1, &range, 1, node), -libc::ESRCH);
        let odd = FkRange {
            start: start + 1,
            end: start + len,
        };
        assert_eq!(call(here, &odd, 1, node), -libc::EINVAL);
        let opts = FkProcessOpts {
            size: size_of::<FkProcessOpts>(),
            flags: 1 << 7,
            ..FkProcessOpts::default()
        };
        // SAFETY: valid pointers.
        let rc = unsafe { fk_migrate_process(here, &range, 1, node, &opts, std::ptr::null_mut()) };
        assert_eq!(rc, -libc::EINVAL, "unknown flags");
    }

    /// The header's struct layouts, as a C compiler sees them, equal the
    /// Rust mirrors'. Needs `cc`; skips with the reason otherwise.
    #[test]
    fn header_layout_matches_rust() {
        let dir = std::env::temp_dir().join(format!("fk_capi_layout_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = dir.join("layout.c");
        std::fs::write(
            &c,
            r#"#include <stdio.h>
#include "foliokit.h"
#define F(s, f) printf("%zu %zu ", offsetof(struct s, f), sizeof(((struct s *)0)->f))
int main(void) {
    struct fk_migrate_opts o = FK_MIGRATE_OPTS_INIT;
    struct fk_migrate_result r = FK_MIGRATE_RESULT_INIT;
    F(fk_migrate_opts, size); F(fk_migrate_opts, path); F(fk_migrate_opts, channels);
    F(fk_migrate_opts, batch_pages); F(fk_migrate_opts, latency_budget_us);
    printf("%zu %zu\n", sizeof(struct fk_migrate_opts), o.size);
    F(fk_migrate_result, size); F(fk_migrate_result, gbps); F(fk_migrate_result, first_folio_us);
    F(fk_migrate_result, pages_to_move); F(fk_migrate_result, relocated);
    F(fk_migrate_result, batches);
    printf("%zu %zu\n", sizeof(struct fk_migrate_result), r.size);
    printf("%zu %d %d %d\n", sizeof(enum fk_path), FK_PATH_KERNEL, FK_PATH_AUTO, FK_PATH_RELOCATE);
    struct fk_process_opts po = FK_PROCESS_OPTS_INIT;
    struct fk_process_result pr = FK_PROCESS_RESULT_INIT;
    F(fk_process_opts, size); F(fk_process_opts, threads); F(fk_process_opts, flags);
    F(fk_process_opts, budget_us);
    printf("%zu %zu\n", sizeof(struct fk_process_opts), po.size);
    F(fk_process_result, size); F(fk_process_result, moved); F(fk_process_result, already);
    F(fk_process_result, not_present); F(fk_process_result, failed); F(fk_process_result, secs);
    F(fk_process_result, longest_call_us);
    printf("%zu %zu\n", sizeof(struct fk_process_result), pr.size);
    F(fk_range, start); F(fk_range, end);
    printf("%zu %u %u\n", sizeof(struct fk_range), FK_PROCESS_DRY_RUN, FK_PROCESS_WITH_STACK);
    struct fk_lazy_opts lo = FK_LAZY_OPTS_INIT;
    struct fk_lazy_progress lp = FK_LAZY_PROGRESS_INIT;
    struct fk_lazy_report lr = FK_LAZY_REPORT_INIT;
    F(fk_lazy_range, addr); F(fk_lazy_range, len); F(fk_lazy_range, offset);
    printf("%zu\n", sizeof(struct fk_lazy_range));
    F(fk_lazy_opts, size); F(fk_lazy_opts, channels); F(fk_lazy_opts, flags);
    F(fk_lazy_opts, budget_us); F(fk_lazy_opts, folio_size);
    printf("%zu %zu %u\n", sizeof(struct fk_lazy_opts), lo.size, FK_LAZY_START_CANCELLED);
    F(fk_lazy_progress, size); F(fk_lazy_progress, total_pages); F(fk_lazy_progress, faulted_pages);
    F(fk_lazy_progress, filled_pages); F(fk_lazy_progress, skipped_pages);
    F(fk_lazy_progress, bad_pages); F(fk_lazy_progress, faults); F(fk_lazy_progress, done);
    printf("%zu %zu\n", sizeof(struct fk_lazy_progress), lp.size);
    F(fk_lazy_report, size); F(fk_lazy_report, total_pages); F(fk_lazy_report, faults);
    F(fk_lazy_report, whole_folios); F(fk_lazy_report, batches); F(fk_lazy_report, longest_batch_us);
    F(fk_lazy_report, secs); F(fk_lazy_report, poisoned); F(fk_lazy_report, bad_ranges);
    printf("%zu %zu\n", sizeof(struct fk_lazy_report), lr.size);
    F(fk_lazy_bad, addr); F(fk_lazy_bad, len); F(fk_lazy_bad, kind);
    printf("%zu\n", sizeof(struct fk_lazy_bad));
    return 0;
}
"#,
        )
        .unwrap();
        let exe = dir.join("layout");
        let include = concat!(env!("CARGO_MANIFEST_DIR"), "/include");
        let built = Command::new("cc")
            .args(["-std=c99", "-Wall", "-Werror", "-I", include])
            .arg(&c)
            .arg("-o")
            .arg(&exe)
            .status();
        match built {
            Err(e) => {
                println!("SKIP: header_layout_matches_rust: no C compiler (cc: {e})");
                return;
            }
            Ok(s) => assert!(s.success(), "cc failed on the header"),
        }
        let out = Command::new(&exe).output().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let got = String::from_utf8(out.stdout).unwrap();
        macro_rules! f {
            ($s:ty, $f:ident) => {{
                let v = <$s>::default();
                (offset_of!($s, $f), std::mem::size_of_val(&v.$f))
            }};
        }
        let o = [
            f!(FkMigrateOpts, size),
            f!(FkMigrateOpts, path),
            f!(FkMigrateOpts, channels),
            f!(FkMigrateOpts, batch_pages),
            f!(FkMigrateOpts, latency_budget_us),
        ];
        let r = [
            f!(FkMigrateResult, size),
            f!(FkMigrateResult, gbps),
            f!(FkMigrateResult, first_folio_us),
            f!(FkMigrateResult, pages_to_move),
            f!(FkMigrateResult, relocated),
            f!(FkMigrateResult, batches),
        ];
        let line = |fields: &[(usize, usize)], size: usize| {
            let mut s: String = fields.iter().map(|(a, b)| format!("{a} {b} ")).collect();
            s += &format!("{size} {size}");
            s
        };
        let po = [
            f!(FkProcessOpts, size),
            f!(FkProcessOpts, threads),
            f!(FkProcessOpts, flags),
            f!(FkProcessOpts, budget_us),
        ];
        let pr = [
            f!(FkProcessResult, size),
            f!(FkProcessResult, moved),
            f!(FkProcessResult, already),
            f!(FkProcessResult, not_present),
            f!(FkProcessResult, failed),
            f!(FkProcessResult, secs),
            f!(FkProcessResult, longest_call_us),
        ];
        let range: String = [f!(FkRange, start), f!(FkRange, end)]
            .iter()
            .map(|(a, b)| format!("{a} {b} "))
            .collect();
        let want = format!(
            "{}\n{}\n{} {FK_PATH_KERNEL} {FK_PATH_AUTO} {FK_PATH_RELOCATE}\n{}\n{}\n{range}{} {PROCESS_DRY_RUN} {PROCESS_WITH_STACK}\n",
            line(&o, size_of::<FkMigrateOpts>()),
            line(&r, size_of::<FkMigrateResult>()),
            size_of::<c_int>(),
            line(&po, size_of::<FkProcessOpts>()),
            line(&pr, size_of::<FkProcessResult>()),
            size_of::<FkRange>()
        );
        let lazy = format!(
            "{}{}\n{} {}\n{}\n{}\n{}{}\n",
            [
                f!(FkLazyRange, addr),
                f!(FkLazyRange, len),
                f!(FkLazyRange, offset)
            ]
            .iter()
            .map(|(a, b)| format!("{a} {b} "))
            .collect::<String>(),
            size_of::<FkLazyRange>(),
            line(
                &[
                    f!(FkLazyOpts, size),
                    f!(FkLazyOpts, channels),
                    f!(FkLazyOpts, flags),
                    f!(FkLazyOpts, budget_us),
                    f!(FkLazyOpts, folio_size),
                ],
                size_of::<FkLazyOpts>()
            ),
            LAZY_START_CANCELLED,
            line(
                &[
                    f!(FkLazyProgress, size),
                    f!(FkLazyProgress, total_pages),
                    f!(FkLazyProgress, faulted_pages),
                    f!(FkLazyProgress, filled_pages),
                    f!(FkLazyProgress, skipped_pages),
                    f!(FkLazyProgress, bad_pages),
                    f!(FkLazyProgress, faults),
                    f!(FkLazyProgress, done),
                ],
                size_of::<FkLazyProgress>()
            ),
            line(
                &[
                    f!(FkLazyReport, size),
                    (offset_of!(FkLazyReport, progress), 8),
                    (offset_of!(FkLazyReport, progress) + 40, 8),
                    f!(FkLazyReport, whole_folios),
                    f!(FkLazyReport, batches),
                    f!(FkLazyReport, longest_batch_us),
                    f!(FkLazyReport, secs),
                    f!(FkLazyReport, poisoned),
                    f!(FkLazyReport, bad_ranges),
                ],
                size_of::<FkLazyReport>()
            ),
            [f!(FkLazyBad, addr), f!(FkLazyBad, len), f!(FkLazyBad, kind)]
                .iter()
                .map(|(a, b)| format!("{a} {b} "))
                .collect::<String>(),
            size_of::<FkLazyBad>(),
        );
        assert_eq!(got, want + &lazy);
    }

    /// fk_lazy_start, progress, cancel and wait over an anonymous range
    /// filled from a temporary file; skips where the kernel refuses.
    #[test]
    fn lazy_fill_through_the_c_api() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let len = 8usize << 20;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let path = std::env::temp_dir().join(format!("fk_capi_lazy_{}", std::process::id()));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&data)
            .unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let mut region = fk::mem::Region::unpopulated(len, 4096).unwrap();
        let range = FkLazyRange {
            addr: region.as_mut_ptr() as usize,
            len,
            offset: 0,
        };
        let opts = FkLazyOpts {
            size: size_of::<FkLazyOpts>(),
            flags: LAZY_START_CANCELLED,
            ..FkLazyOpts::default()
        };
        let mut h: *mut FkLazy = std::ptr::null_mut();
        // SAFETY: a fresh region of ours, untouched; a readable file.
        let rc = unsafe { fk_lazy_start(&range, 1, file.as_raw_fd(), &opts, &mut h) };
        if rc == -libc::EPERM || rc == -libc::ENOSYS || rc == -libc::EOPNOTSUPP {
            println!("SKIP: lazy_fill_through_the_c_api: refused ({rc})");
            return;
        }
        assert_eq!(rc, 0);
        // Bad arguments are refused before anything.
        let mut h2: *mut FkLazy = std::ptr::null_mut();
        // SAFETY: NULL ranges: refused before anything is read.
        let rc = unsafe { fk_lazy_start(std::ptr::null(), 1, 0, std::ptr::null(), &mut h2) };
        assert_eq!(rc, -libc::EINVAL);
        // SAFETY: a live handle.
        assert_eq!(unsafe { fk_lazy_cancel(h) }, 0);
        // A touch is served while the background fill is cancelled.
        // SAFETY: inside our region.
        let b = unsafe { std::ptr::read_volatile(region.as_ptr().add(5 << 20)) };
        assert_eq!(b, data[5 << 20]);
        let mut p = FkLazyProgress {
            size: size_of::<FkLazyProgress>(),
            ..Default::default()
        };
        // SAFETY: a live handle and a valid struct.
        assert_eq!(unsafe { fk_lazy_progress(h, &mut p) }, 0);
        assert_eq!(p.total_pages, (len / 4096) as u64);
        assert_eq!(p.done, 0);
        let mut r = FkLazyReport {
            size: size_of::<FkLazyReport>(),
            ..Default::default()
        };
        // SAFETY: a live handle, given back; a valid struct; no bad list.
        let rc = unsafe { fk_lazy_wait(h, &mut r, std::ptr::null_mut(), 0) };
        assert_eq!(rc, 0);
        assert_eq!(r.size, size_of::<FkLazyReport>());
        assert_eq!(r.bad_ranges, 0);
        assert!(r.progress.faulted_pages > 0);
        assert_eq!(
            r.progress.faulted_pages + r.progress.filled_pages,
            (len / 4096) as u64
        );
        assert!(region.as_slice() == &data[..]);
    }
}

//! Lazy restore: `fk_lazy_start` registers ranges to be filled from a file
//! on first touch and in the background; `fk_lazy_progress`,
//! `fk_lazy_cancel` and `fk_lazy_wait` follow and end that fill.

use std::ffi::{c_int, c_uint};
use std::os::fd::BorrowedFd;
use std::time::Duration;

use fk::lazy::{LazyError, LazyOptions, LazyProgress, LazyRefusal, Segment, Source};
use fk::mc::FaultKind;

use crate::args::list;
use crate::error::{guard, os_code, INTERNAL};
use crate::ext::{extensible, out_size, read_opts, write_ext, Plain};

/// Mirrors `struct fk_lazy_range`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkLazyRange {
    pub addr: usize,
    pub len: usize,
    pub offset: u64,
}

extensible! {
    /// Mirrors `struct fk_lazy_opts`.
    pub struct FkLazyOpts {
        pub channels: c_uint,
        pub flags: c_uint,
        pub budget_us: u64,
        pub folio_size: u64,
    }
}

/// The counts `struct fk_lazy_progress` and `struct fk_lazy_report` both
/// hold after their `size`, in the same order: one type, so they cannot
/// drift apart.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LazyCounts {
    pub total_pages: u64,
    pub faulted_pages: u64,
    pub filled_pages: u64,
    pub skipped_pages: u64,
    pub bad_pages: u64,
    pub faults: u64,
}

// SAFETY: repr(C), u64 fields only, so no padding and any bits are valid.
unsafe impl Plain for LazyCounts {}

impl From<&LazyProgress> for LazyCounts {
    fn from(p: &LazyProgress) -> LazyCounts {
        LazyCounts {
            total_pages: p.total_pages,
            faulted_pages: p.faulted_pages,
            filled_pages: p.filled_pages,
            skipped_pages: p.skipped_pages,
            bad_pages: p.bad_pages,
            faults: p.faults,
        }
    }
}

extensible! {
    /// Mirrors `struct fk_lazy_progress`.
    pub struct FkLazyProgress {
        pub counts: LazyCounts,
        pub done: u64,
    }
}

extensible! {
    /// Mirrors `struct fk_lazy_report`.
    pub struct FkLazyReport {
        pub counts: LazyCounts,
        pub whole_folios: u64,
        pub batches: u64,
        pub longest_batch_us: f64,
        pub secs: f64,
        pub poisoned: u64,
        pub bad_ranges: u64,
    }
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

/// `fk_lazy_opts.flags`.
pub(crate) const FK_LAZY_START_CANCELLED: c_uint = 1;
pub(crate) const FK_LAZY_SERVE_DURING_BATCHES: c_uint = 2;
pub(crate) const FK_LAZY_ALLOW_SHARED_MEMORY: c_uint = 4;

fn lazy_err(e: &LazyError) -> c_int {
    use {fk::UffdRefusal as U, LazyError as E, LazyRefusal as R};
    match e {
        E::Refused(R::Userfaultfd(U::NoUffd(_))) => -libc::ENOSYS,
        E::Refused(R::Userfaultfd(U::UserModeOnly(_) | U::NoForkEvents(_))) => -libc::EPERM,
        E::Refused(R::Userfaultfd(U::KernelLacks { .. })) => -libc::EOPNOTSUPP,
        E::Refused(R::Register { source, .. }) => os_code(source, libc::EINVAL),
        E::Refused(R::NotPrivate { .. }) => -libc::EOPNOTSUPP,
        E::BadSegment { .. } | E::SourceTooShort { .. } => -libc::EINVAL,
        E::Copy(_) => -libc::EOPNOTSUPP,
        E::Sys { source, .. } => os_code(source, libc::EIO),
        E::Channel(fk::channels::ChannelError::TooMany { .. }) => -libc::EINVAL,
        _ => INTERNAL,
    }
}

/// `fk_lazy_bad.kind` (the header lists the values).
fn bad_kind(kind: FaultKind) -> u64 {
    match kind {
        FaultKind::Poison => 1,
        FaultKind::Vanished => 2,
        FaultKind::Other(_) => 3,
    }
}

/// The library's options from the C struct; zero fields keep the defaults.
fn lazy_options(c: &FkLazyOpts) -> Result<LazyOptions, c_int> {
    let known =
        FK_LAZY_START_CANCELLED | FK_LAZY_SERVE_DURING_BATCHES | FK_LAZY_ALLOW_SHARED_MEMORY;
    if c.flags & !known != 0 {
        return Err(-libc::EINVAL);
    }
    let mut o = LazyOptions::default();
    if c.channels > 0 {
        o.channels = c.channels as usize;
    }
    if c.budget_us > 0 {
        o.latency_budget = Duration::from_micros(c.budget_us);
    }
    if c.folio_size > 0 {
        o.folio_size = usize::try_from(c.folio_size).map_err(|_| -libc::EINVAL)?;
    }
    o.start_cancelled = c.flags & FK_LAZY_START_CANCELLED != 0;
    o.serve_during_batches = c.flags & FK_LAZY_SERVE_DURING_BATCHES != 0;
    o.allow_shared_memory = c.flags & FK_LAZY_ALLOW_SHARED_MEMORY != 0;
    Ok(o)
}

/// Maps the first bytes of the caller's file that the ranges need.
fn map_source(list: &[FkLazyRange], fd: c_int) -> Result<Source, c_int> {
    let end = list
        .iter()
        .map(|r| r.offset.checked_add(r.len as u64))
        .try_fold(0u64, |m, e| e.map(|e| m.max(e)))
        .ok_or(-libc::EINVAL)?;
    let len = usize::try_from(end).map_err(|_| -libc::EINVAL)?;
    // SAFETY: the caller's open descriptor, borrowed for this call.
    let file = unsafe { BorrowedFd::borrow_raw(fd) }
        .try_clone_to_owned()
        .map_err(|e| os_code(&e, libc::EBADF))?;
    let file = std::fs::File::from(file);
    let meta = file.metadata().map_err(|e| os_code(&e, libc::EBADF))?;
    // A regular file must hold every range now: one past its end is a
    // wrong file or wrong offsets, refused here rather than poisoned on
    // first touch. (A device has no size to check.)
    if meta.file_type().is_file() && meta.len() < end {
        return Err(-libc::EINVAL);
    }
    Source::map_file(&file, len).map_err(|e| match e.raw_os_error() {
        // Empty (no errno), or a file that cannot be mapped (a pipe, a
        // socket): the caller's ranges or descriptor are wrong.
        None | Some(libc::ENODEV) => -libc::EINVAL,
        Some(n) => -n,
    })
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
    guard(|| {
        // SAFETY: opts is NULL or a valid struct of its `size` (contract).
        let c = unsafe { read_opts(opts) }?;
        if ranges.is_null() || n == 0 || out.is_null() || fd < 0 {
            return Err(-libc::EINVAL);
        }
        let o = lazy_options(&c)?;
        // SAFETY: `ranges` points to `n` readable ranges (contract).
        let list = unsafe { list(ranges, n) }?;
        let segs: Vec<Segment> = list
            .iter()
            .map(|r| Segment {
                addr: r.addr,
                len: r.len,
                offset: r.offset,
            })
            .collect();
        let source = map_source(list, fd)?;
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
        let fill = &unsafe { &*h }.0;
        if fill.in_forked_child() {
            return Err(-libc::ECHILD);
        }
        let p = fill.progress();
        let v = FkLazyProgress {
            size,
            counts: LazyCounts::from(&p),
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
        let fill = &unsafe { &*h }.0;
        if fill.in_forked_child() {
            return Err(-libc::ECHILD);
        }
        fill.cancel();
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
        // SAFETY: a live handle (contract).
        if unsafe { &*h }.0.in_forked_child() {
            return Err(-libc::ECHILD);
        }
        // SAFETY: a live handle from Box::into_raw, given back (contract).
        let FkLazy(fill) = *unsafe { Box::from_raw(h) };
        let r = fill.wait();
        let v = FkLazyReport {
            size,
            counts: LazyCounts::from(&r.progress),
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
            let entry = FkLazyBad {
                addr: b.addr,
                len: b.len,
                kind: bad_kind(b.kind),
            };
            // SAFETY: i < n_bad entries are writable (contract).
            unsafe { bad.add(i).write(entry) };
        }
        Ok(c_int::try_from(r.bad.len()).unwrap_or(c_int::MAX))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

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
            flags: FK_LAZY_START_CANCELLED,
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
        // A range past the end of the file (it used to start, and the
        // first touch there died of SIGBUS), an empty one, a descriptor
        // that is not open, one that cannot be mapped.
        let mut other = fk::mem::Region::unpopulated(2 * len, 4096).unwrap();
        let past = FkLazyRange {
            addr: other.as_mut_ptr() as usize,
            len: 2 * len,
            offset: 0,
        };
        let empty = FkLazyRange { len: 0, ..past };
        let mut fds = [0; 2];
        // SAFETY: room for the two descriptors; closed below.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let [rd, wr] = fds;
        for (r, fd, want) in [
            (past, file.as_raw_fd(), -libc::EINVAL),
            (empty, file.as_raw_fd(), -libc::EINVAL),
            (past, 1 << 20, -libc::EBADF),
            (past, rd, -libc::EINVAL),
        ] {
            // SAFETY: our untouched region; refused before registering.
            let rc = unsafe { fk_lazy_start(&r, 1, fd, &opts, &mut h2) };
            assert_eq!(rc, want, "{r:?} from fd {fd}");
            assert_ne!(crate::error::msg(rc), "unknown error");
        }
        // SAFETY: closing our own pipe.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
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
        assert_eq!(p.counts.total_pages, (len / 4096) as u64);
        assert_eq!(p.done, 0);
        // In a forked child the handle is the parent's: every call is
        // -ECHILD and frees nothing (waiting there used to panic, joining a
        // thread the child does not have), while the child's memory is
        // still filled on touch by the parent's fill.
        // SAFETY: the child makes only calls that take no lock and
        // allocate nothing on these paths, then _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: a copy of a live handle; a valid struct; our region.
            let ok = unsafe {
                fk_lazy_progress(h, &mut p) == -libc::ECHILD
                    && fk_lazy_cancel(h) == -libc::ECHILD
                    && fk_lazy_wait(h, std::ptr::null_mut(), std::ptr::null_mut(), 0)
                        == -libc::ECHILD
                    && std::ptr::read_volatile(region.as_ptr().add(len - 1)) == data[len - 1]
            };
            // SAFETY: leaving the child at once, running nothing of the parent's.
            unsafe { libc::_exit(i32::from(!ok)) };
        }
        assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the forked child's calls were not all -ECHILD, or its memory was wrong (status {status:#x})"
        );
        let mut r = FkLazyReport {
            size: size_of::<FkLazyReport>(),
            ..Default::default()
        };
        // SAFETY: a live handle, given back; a valid struct; no bad list.
        let rc = unsafe { fk_lazy_wait(h, &mut r, std::ptr::null_mut(), 0) };
        assert_eq!(rc, 0);
        assert_eq!(r.size, size_of::<FkLazyReport>());
        assert_eq!(r.bad_ranges, 0);
        assert!(r.counts.faulted_pages > 0);
        assert_eq!(
            r.counts.faulted_pages + r.counts.filled_pages,
            (len / 4096) as u64
        );
        assert!(region.as_slice() == &data[..]);
    }
}

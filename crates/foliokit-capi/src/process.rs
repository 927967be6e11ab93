//! `fk_migrate_process`: another process's pages to a NUMA node, with
//! `move_pages(2)` calls kept under a stall budget.

use std::ffi::{c_int, c_uint};
use std::time::Duration;

use fk::migrate::process::{
    migrate_process, ProcessError, ProcessOptions, ProcessReport, Ranges, Target,
};

use crate::args::list;
use crate::error::{guard, os_code, INTERNAL};
use crate::ext::{extensible, out_size, read_opts, write_ext};

/// Mirrors `struct fk_range`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FkRange {
    pub start: usize,
    pub end: usize,
}

extensible! {
    /// Mirrors `struct fk_process_opts`.
    pub struct FkProcessOpts {
        pub threads: c_uint,
        pub flags: c_uint,
        pub budget_us: u64,
    }
}

extensible! {
    /// Mirrors `struct fk_process_result`.
    pub struct FkProcessResult {
        pub moved: usize,
        pub already: usize,
        pub not_present: usize,
        pub failed: usize,
        pub secs: f64,
        pub longest_call_us: f64,
    }
}

/// `fk_process_opts.flags`.
pub(crate) const FK_PROCESS_DRY_RUN: c_uint = 1;
pub(crate) const FK_PROCESS_WITH_STACK: c_uint = 2;

fn process_err(e: &ProcessError) -> c_int {
    use ProcessError as E;
    match e {
        E::NoProcess { .. } | E::Gone { .. } => -libc::ESRCH,
        E::Permission { .. } => -libc::EPERM,
        E::NoSuchNode { .. } => -libc::ENODEV,
        E::NoMemory { .. } => -libc::ENOSPC,
        E::BadRange { .. } | E::TooManyThreads { .. } => -libc::EINVAL,
        E::Sys { source, .. } => os_code(source, libc::EIO),
        _ => INTERNAL,
    }
}

/// The report summed over its ranges, `size` set to `size`.
fn result(report: &ProcessReport, size: usize) -> FkProcessResult {
    let (moved, already, not_present, failed) = report.totals();
    FkProcessResult {
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
    guard(|| {
        // SAFETY: opts is NULL or a valid struct of its `size` (contract).
        let c = unsafe { read_opts(opts) }?;
        // SAFETY: out is NULL or a valid struct of its `size` (contract).
        let size = unsafe { out_size(out) }?;
        // WITH_STACK belongs to the every-mapping mode: with ranges given it
        // would be ignored, so it is refused.
        if c.flags & !(FK_PROCESS_DRY_RUN | FK_PROCESS_WITH_STACK) != 0
            || (ranges.is_null() && n > 0)
            || (c.flags & FK_PROCESS_WITH_STACK != 0 && n > 0)
        {
            return Err(-libc::EINVAL);
        }
        let mut o = ProcessOptions::default()
            .threads((c.threads as usize).max(1))
            .dry_run(c.flags & FK_PROCESS_DRY_RUN != 0);
        if c.budget_us > 0 {
            o = o.budget(Duration::from_micros(c.budget_us));
        }
        let which = if n == 0 {
            Ranges::AllAnon {
                stack: c.flags & FK_PROCESS_WITH_STACK != 0,
            }
        } else {
            // SAFETY: `ranges` points to `n` readable ranges (contract).
            let list = unsafe { list(ranges, n) }?;
            Ranges::Given(list.iter().map(|r| (r.start, r.end)).collect())
        };
        let target = Target::open(pid).map_err(|e| process_err(&e))?;
        // A process that exits mid-call still gets what was done reported.
        let (report, rc) = match migrate_process(&target, &which, node, &o) {
            Ok(r) => (r, Ok(0)),
            Err(ProcessError::Gone { partial, .. }) => (*partial, Err(-libc::ESRCH)),
            Err(e) => return Err(process_err(&e)),
        };
        // SAFETY: out is NULL or has `size` writable bytes (checked by out_size).
        unsafe { write_ext(out, result(&report, size), size) };
        rc
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

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
        let many = FkProcessOpts {
            size: size_of::<FkProcessOpts>(),
            threads: c_uint::MAX,
            ..FkProcessOpts::default()
        };
        // SAFETY: valid pointers.
        let rc = unsafe { fk_migrate_process(here, &range, 1, node, &many, std::ptr::null_mut()) };
        assert_eq!(rc, -libc::EINVAL, "more threads than can be");
        let stack = FkProcessOpts {
            size: size_of::<FkProcessOpts>(),
            flags: FK_PROCESS_WITH_STACK,
            ..FkProcessOpts::default()
        };
        // SAFETY: valid pointers.
        let rc = unsafe { fk_migrate_process(here, &range, 1, node, &stack, std::ptr::null_mut()) };
        assert_eq!(rc, -libc::EINVAL, "the stack flag with ranges given");
        // A range over most of the address space: only its mapped pages
        // are looked at (a list of all of them, 2^35 entries, aborted the
        // process).
        let dry = FkProcessOpts {
            size: size_of::<FkProcessOpts>(),
            flags: FK_PROCESS_DRY_RUN,
            ..FkProcessOpts::default()
        };
        let huge = FkRange {
            start: 4096,
            end: 0x7fff_ffff_f000,
        };
        let mut out = FkProcessResult {
            size: size_of::<FkProcessResult>(),
            ..FkProcessResult::default()
        };
        // SAFETY: valid pointers; a dry run moves nothing.
        let rc = unsafe { fk_migrate_process(here, &huge, 1, node, &dry, &mut out) };
        assert_eq!(rc, 0);
        assert!(out.already >= 16, "{out:?}");
        // For real, over a range whose first half is unmapped and whose
        // last page holds data: each page judged by its own status (the
        // walk indexed the statuses as if every page were mapped).
        let p = 4096usize;
        // SAFETY: a fresh private mapping of ours; its first half is
        // unmapped again, its last page written; unmapped at the end.
        let gap = unsafe {
            let a = libc::mmap(
                std::ptr::null_mut(),
                4 * p,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(a, libc::MAP_FAILED);
            libc::munmap(a, 2 * p);
            *(a as *mut u8).add(3 * p) = 9;
            a as usize
        };
        let holed = FkRange {
            start: gap,
            end: gap + 4 * p,
        };
        let mut out = FkProcessResult {
            size: size_of::<FkProcessResult>(),
            ..FkProcessResult::default()
        };
        // SAFETY: valid pointers; the range is this process's own.
        let rc = unsafe { fk_migrate_process(here, &holed, 1, node, std::ptr::null(), &mut out) };
        // SAFETY: the mapped half of our mapping, read then unmapped.
        let kept = unsafe {
            let v = *((gap + 3 * p) as *const u8);
            libc::munmap((gap + 2 * p) as *mut libc::c_void, 2 * p);
            v
        };
        assert_eq!(rc, 0);
        assert_eq!((out.moved + out.already, out.failed), (1, 0), "{out:?}");
        assert_eq!(kept, 9);
    }
}

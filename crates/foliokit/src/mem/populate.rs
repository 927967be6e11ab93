//! Parallel prefault: what a VMM does to preallocate guest RAM.
//!
//! The range is cut into `POPULATE_CHUNK`-aligned chunks (one PMD each, so
//! THP stays THP) that the calling thread and up to `channels - 1`
//! persistent helper threads take from a shared counter and fault in with
//! `MADV_POPULATE_WRITE`; where the kernel lacks that (before 5.14) a
//! thread touches each page instead. No thread is made per call (see
//! `crate::helpers`).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use thiserror::Error;

use crate::batch::page_size;
use crate::params::POPULATE_CHUNK;

/// Why a populate failed. The argument errors come before any page is
/// touched; [`PopulateError::Fault`] stops all threads at their next chunk,
/// so part of the range may already be resident.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PopulateError {
    /// `channels` was 0.
    #[error("populate needs at least one channel")]
    ZeroChannels,
    /// The range's start address is not on a base-page boundary.
    #[error("range start {0:#x} is not page-aligned")]
    Misaligned(usize),
    /// `addr + len` overflows.
    #[error("range at {addr:#x} + {len} bytes wraps around the address space")]
    Wraps {
        /// Start of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// The kernel could not fault a chunk in: `ENOMEM` (not mapped, no
    /// memory, or the hugetlb pool ran dry), `EFAULT` (a fault would have
    /// raised SIGBUS or SIGSEGV), `EINVAL` (not writable, or PFN/IO
    /// memory), `EHWPOISON` (a poisoned page). The first failure any
    /// thread hit is reported.
    #[error("faulting in {addr:#x} + {len}: {source}")]
    Fault {
        /// Start of the chunk that failed.
        addr: usize,
        /// The chunk's length in bytes.
        len: usize,
        /// The error `MADV_POPULATE_WRITE` returned.
        source: io::Error,
    },
}

/// What `populate` did.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PopulateReport {
    /// Length of the range, in bytes.
    pub bytes: usize,
    /// Chunks it was cut into (one PMD each unless `populate_chunked` was
    /// given larger ones; partial chunks at either end count).
    pub chunks: usize,
    /// Threads that faulted at least one chunk: the calling thread and the
    /// helpers that joined it. At most the request, capped at the chunk
    /// count; fewer where helpers were busy with other callers' work.
    pub channels: usize,
    /// Chunks faulted by `MADV_POPULATE_WRITE`; the rest were touched.
    pub madvised_chunks: usize,
    /// Wall-clock time of the whole call, in seconds.
    pub secs: f64,
}

/// Faults in all of `range` for writing from `channels` threads, without
/// changing its contents.
pub fn populate(range: &mut [u8], channels: usize) -> Result<PopulateReport, PopulateError> {
    // SAFETY: an exclusively borrowed slice is valid, mapped memory.
    unsafe { populate_raw(range.as_mut_ptr(), range.len(), channels) }
}

/// [`populate`] on a raw range.
///
/// # Safety
/// `[ptr, ptr + len)` must be mapped writable memory of this process. Its
/// contents are preserved (touched pages are written with an atomic no-op),
/// so concurrent users of the range are unaffected.
pub unsafe fn populate_raw(
    ptr: *mut u8,
    len: usize,
    channels: usize,
) -> Result<PopulateReport, PopulateError> {
    // SAFETY: forwarded contract.
    unsafe { populate_chunked(ptr, len, channels, POPULATE_CHUNK) }
}

/// [`populate_raw`] with chunks of `chunk` bytes (at least
/// `POPULATE_CHUNK`, a power of two). Pass the mapping's page size for
/// hugetlb ranges: a 1 GiB page is faulted whole by whichever thread touches
/// it first, so smaller chunks would only queue the other threads behind it.
///
/// # Safety
/// As [`populate_raw`].
pub unsafe fn populate_chunked(
    ptr: *mut u8,
    len: usize,
    channels: usize,
    chunk: usize,
) -> Result<PopulateReport, PopulateError> {
    // A chunk past the largest power of two is one chunk for any range.
    let chunk = chunk
        .max(POPULATE_CHUNK)
        .checked_next_power_of_two()
        .unwrap_or(1 << (usize::BITS - 1));
    if channels == 0 {
        return Err(PopulateError::ZeroChannels);
    }
    let start = ptr as usize;
    if start % page_size() != 0 {
        return Err(PopulateError::Misaligned(start));
    }
    let end = start
        .checked_add(len)
        .ok_or(PopulateError::Wraps { addr: start, len })?;
    let t0 = Instant::now();
    // Chunk boundaries: the start, every aligned boundary inside, the end.
    // No boundary above the range's start fits the address space: none
    // lies inside the range either.
    let first_boundary = start.checked_next_multiple_of(chunk).unwrap_or(end);
    let mut bounds = vec![start];
    bounds.extend((first_boundary..end).step_by(chunk).filter(|&b| b > start));
    bounds.push(end);
    let chunks = if len == 0 { 0 } else { bounds.len() - 1 };
    let next = AtomicUsize::new(0);
    let madvised = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let error: Mutex<Option<PopulateError>> = Mutex::new(None);
    let busy = AtomicUsize::new(0);
    let worker = || {
        let mut first = true;
        while !failed.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= chunks {
                break;
            }
            if std::mem::take(&mut first) {
                busy.fetch_add(1, Ordering::Relaxed);
            }
            let (a, l) = (bounds[i], bounds[i + 1] - bounds[i]);
            // SAFETY: the chunk lies inside the caller's mapped range.
            match unsafe { populate_chunk(a, l) } {
                Ok(true) => {
                    madvised.fetch_add(1, Ordering::Relaxed);
                }
                Ok(false) => {}
                Err(source) => {
                    failed.store(true, Ordering::Relaxed);
                    let mut e = error.lock().unwrap_or_else(|p| p.into_inner());
                    e.get_or_insert(PopulateError::Fault {
                        addr: a,
                        len: l,
                        source,
                    });
                }
            }
        }
    };
    crate::helpers::fan_out(channels.min(chunks.max(1)) - 1, &worker);
    if let Some(e) = error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(PopulateReport {
        bytes: len,
        chunks,
        channels: busy.into_inner(),
        madvised_chunks: madvised.load(Ordering::Relaxed),
        secs: t0.elapsed().as_secs_f64(),
    })
}

/// Faults one chunk in; `Ok(true)` if `MADV_POPULATE_WRITE` did it.
///
/// # Safety
/// The chunk must be mapped writable memory of this process.
unsafe fn populate_chunk(addr: usize, len: usize) -> io::Result<bool> {
    // SAFETY: madvise only affects our own mapping.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) } == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    // EINVAL from a kernel that has MADV_POPULATE_WRITE means the mapping
    // does not take it: not writable (a touch would raise SIGSEGV), or
    // PFN/IO memory. Only a kernel without it (before 5.14) is left to the
    // touch below. Anything else (ENOMEM, EFAULT, EHWPOISON...) is real.
    if err.raw_os_error() != Some(libc::EINVAL) || kernel_populates() {
        return Err(err);
    }
    for p in (addr..addr + len).step_by(page_size()) {
        // SAFETY: p is inside the mapped chunk; an atomic `fetch_or(0)` is a
        // write access that cannot change the byte, even under concurrency.
        unsafe { AtomicU8::from_ptr(p as *mut u8) }.fetch_or(0, Ordering::Relaxed);
    }
    Ok(false)
}

/// Whether this kernel has `MADV_POPULATE_WRITE` (5.14+), tried once on a
/// page of our own.
fn kernel_populates() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let page = page_size();
        // SAFETY: a fresh private anonymous page, advised, then unmapped;
        // nothing else knows its address.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                // Cannot tell: the safe answer (no touching of the range).
                return true;
            }
            let ok = libc::madvise(p, page, libc::MADV_POPULATE_WRITE) == 0;
            libc::munmap(p, page);
            ok
        }
    })
}

/// How many of the pages in `[ptr, ptr + len)` are resident (mincore).
pub fn resident_pages(ptr: *const u8, len: usize) -> io::Result<usize> {
    if len == 0 {
        return Ok(0);
    }
    let page = page_size();
    let start = ptr as usize & !(page - 1);
    let end = (ptr as usize)
        .checked_add(len)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let pages = (end - start).div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore writes one byte per page into `vec`, which has room.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, pages * page, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count())
}

//! The relocation path: write-protect, copy through the channels into a
//! pre-faulted pool on the target node, mremap over the source, wake.

use std::io;
use std::time::Instant;

use super::{BatchController, BatchStat, MigrateError, MigrateOptions, MigrateReport};
use crate::batch::{folio_starts, page_size};
use crate::mem::populate_raw;
use crate::sys::{numa, uffd::Uffd};

fn sys(what: &'static str) -> impl FnOnce(io::Error) -> MigrateError {
    move |source| MigrateError::Sys { what, source }
}

/// Destination folios on the target node, faulted in before the clock
/// starts. Consumed front to back: each batch's slice is mremapped away, so
/// only the unconsumed tail (and the alignment slack) is ours to unmap.
struct Pool {
    map: usize,
    map_len: usize,
    data: usize,
    used: usize,
    len: usize,
}

impl Pool {
    fn new(len: usize, folio: usize, node: u32, channels: usize) -> Result<Pool, MigrateError> {
        let align = folio.max(page_size());
        let map_len = len + align;
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(MigrateError::Sys {
                what: "mmap destination pool",
                source: io::Error::last_os_error(),
            });
        }
        let map = map as usize;
        let pool = Pool {
            map,
            map_len,
            data: map.next_multiple_of(align),
            used: 0,
            len,
        };
        numa::mbind(pool.data, len, node).map_err(sys("mbind destination pool"))?;
        if folio >= 2 << 20 {
            // SAFETY: our own mapping. THP keeps the moved range THP.
            unsafe { libc::madvise(pool.data as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        }
        // SAFETY: [data, data + len) is our writable mapping.
        unsafe { populate_raw(pool.data as *mut u8, len, channels) }?;
        Ok(pool)
    }

    fn take(&mut self, n: usize) -> usize {
        let at = self.data + self.used;
        self.used += n;
        at
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let unmap = |a: usize, l: usize| {
            if l > 0 {
                // SAFETY: these parts of the pool mapping are still ours.
                unsafe { libc::munmap(a as *mut libc::c_void, l) };
            }
        };
        unmap(self.map, self.data - self.map);
        unmap(self.data + self.used, self.len - self.used);
        let end = self.data + self.len;
        unmap(end, self.map + self.map_len - end);
    }
}

/// Releases whatever part of the source is still write-protected and
/// registered, whatever happens: no writer may stay asleep.
struct Protected<'a> {
    uffd: &'a Uffd,
    from: usize,
    end: usize,
}

impl Drop for Protected<'_> {
    fn drop(&mut self) {
        if self.from < self.end {
            let len = self.end - self.from;
            let _ = self.uffd.write_protect(self.from, len, false);
            let _ = self.uffd.unregister(self.from, len);
            let _ = self.uffd.wake(self.from, len);
        }
    }
}

/// # Safety
/// As `super::migrate`; the range is private anonymous memory.
pub unsafe fn relocate(
    addr: usize,
    len: usize,
    node: u32,
    o: &MigrateOptions,
) -> Result<MigrateReport, MigrateError> {
    let page = page_size();
    // Batches are cut into copy pieces of one folio each, so every batch
    // must be a whole number of folios: a range that is not whole folios
    // moves at page granularity instead (a 2 MiB piece would run past the
    // end of a shorter tail).
    let folio = match o.folio_size.max(page) {
        f if len % f == 0 => f,
        _ => page,
    };
    let copy = o.strategy.resolve(crate::tune::Shape::batch(
        folio,
        len / folio,
        crate::Reuse::Stream,
    ));
    let copy_fn = copy.function()?;
    let uffd = Uffd::new().map_err(MigrateError::NoUffd)?;
    let channels = crate::channels::shared(o.channels)?;
    let t_pool = Instant::now();
    let mut pool = Pool::new(len, folio, node, o.channels)?;
    let pool_secs = t_pool.elapsed().as_secs_f64();
    uffd.register_wp(addr, len).map_err(MigrateError::NoUffd)?;
    let mut guard = Protected {
        uffd: &uffd,
        from: addr,
        end: addr + len,
    };
    // Batches are whole folios so THP ranges move as whole PMDs.
    let batch_bytes = |pages: usize| (pages * page).next_multiple_of(folio).min(len);
    let mut ctl = o
        .latency_budget
        .map(|b| BatchController::new(b, o.batch_pages, folio / page, len / page));
    let mut batches = Vec::new();
    let t0 = Instant::now();
    while guard.from < guard.end {
        let src = guard.from;
        let n = batch_bytes(ctl.as_ref().map_or(o.batch_pages, BatchController::pages))
            .min(guard.end - src);
        let tb = Instant::now();
        uffd.write_protect(src, n, true)
            .map_err(sys("userfaultfd write-protect"))?;
        let dst = pool.take(n);
        let step = folio.min(n);
        debug_assert_eq!(n % step, 0, "a batch must be whole copy pieces");
        let dsts = folio_starts(dst as *mut u8, n, step);
        let srcs: Vec<*const u8> = folio_starts(src as *mut u8, n, step)
            .into_iter()
            .map(<*mut u8>::cast_const)
            .collect();
        // SAFETY: destinations are fresh pool pages nobody else can see;
        // sources are write-protected, so their bytes cannot change while
        // they are copied (readers may still read them).
        unsafe { channels.copy_folios(&dsts, &srcs, step, copy_fn) };
        // SAFETY: moves our pool pages over the source batch; the source's
        // old pages are freed by the replacement. Writers blocked on the old
        // pages retry after the wake below and land on the new ones.
        let moved = unsafe {
            libc::mremap(
                dst as *mut libc::c_void,
                n,
                n,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                src as *mut libc::c_void,
            )
        };
        if moved as usize != src {
            // The slice stayed in the pool: it is the pool's to unmap.
            pool.used -= n;
            return Err(MigrateError::Sys {
                what: "mremap destination over source",
                source: io::Error::last_os_error(),
            });
        }
        let usable = tb.elapsed();
        guard.from = src + n;
        uffd.wake(src, n).map_err(sys("userfaultfd wake"))?;
        batches.push(BatchStat {
            pages: n / page,
            first_folio_us: usable.as_secs_f64() * 1e6,
            total_us: tb.elapsed().as_secs_f64() * 1e6,
        });
        if let Some(c) = ctl.as_mut() {
            c.observe(usable);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(guard);
    Ok(MigrateReport {
        path: "relocate",
        notes: Vec::new(),
        bytes: len,
        secs,
        pool_secs,
        batches,
        pages_to_move: len / page,
        failed: Vec::new(),
        strategy: crate::strategy::Strategy::name(copy),
    })
}

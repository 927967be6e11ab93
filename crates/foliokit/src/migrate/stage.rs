//! Staging areas of one relocation batch: `Stage::dest` holds the new
//! folios on the target node, `Stage::parking` receives the old pages.
//!
//! `UFFDIO_MOVE` only moves between mappings with the same protections,
//! page protection bits and lock state, so both areas copy those from the
//! application's mapping; they sit at the same offset within a PMD as the
//! batch so whole THPs move as PMDs, and they are MADV_DONTFORK so a child
//! forked mid-batch never inherits them.

use std::io;

use super::vma::Vma;
use crate::sys::maps::MapLine;
use crate::sys::{numa, uffd::Uffd};

const PMD: usize = 2 << 20;
const MADV_POPULATE_WRITE: libc::c_int = 23;
const MLOCK_ONFAULT: libc::c_uint = 1;

pub struct Stage<'u> {
    map: usize,
    map_len: usize,
    /// Page `i` of the batch is staged at `base + i * page`.
    pub base: usize,
    len: usize,
    /// Set while registered: unregistered before unmapping, else the
    /// munmap would wait for us to read its own UNMAP event.
    uffd: Option<&'u Uffd>,
}

fn last_err(what: &'static str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Whether the application's mapping would get THPs on a fault.
pub fn thp_allowed(v: &Vma) -> bool {
    if v.has("nh") {
        return false;
    }
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    mode.contains("[always]") || (mode.contains("[madvise]") && v.has("hg"))
}

impl<'u> Stage<'u> {
    fn map(like: usize, len: usize, v: &Vma) -> io::Result<Stage<'u>> {
        let map_len = len + PMD;
        // SAFETY: a fresh private anonymous mapping at a kernel-chosen
        // address; nothing else refers to it.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                v.prot(),
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(last_err("mmap staging area"));
        }
        let map = map as usize;
        let base = map.next_multiple_of(PMD) + like % PMD;
        let s = Stage {
            map,
            map_len,
            base: if base + len <= map + map_len {
                base
            } else {
                base - PMD
            },
            len,
            uffd: None,
        };
        s.advise(libc::MADV_DONTFORK, "madvise(DONTFORK) staging area")?;
        if v.has("lo") {
            // SAFETY: our own mapping. ONFAULT: locking must not populate
            // it, or the parking area would not be empty for UFFDIO_MOVE.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_mlock2,
                    s.base,
                    len,
                    MLOCK_ONFAULT as libc::c_ulong,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(s)
    }

    fn advise(&self, advice: libc::c_int, what: &'static str) -> io::Result<()> {
        // SAFETY: our own mapping; advice changes no byte of anyone else's.
        if unsafe { libc::madvise(self.base as *mut libc::c_void, self.len, advice) } != 0 {
            return Err(last_err(what));
        }
        Ok(())
    }

    /// Where the old pages go: empty, registered with `uffd` (a move's
    /// destination must be). In write-protect mode where the kernel has it:
    /// a page the application freed (`MADV_FREE`) keeps its lazy-free state
    /// when moved, and reclaim may drop it from here; the channel copying
    /// it then faults, and in missing mode that fault would wait on our
    /// descriptor, which nobody reads during the copy. In write-protect
    /// mode the kernel serves it (zeros: what a freed page may read).
    pub fn parking(like: usize, len: usize, v: &Vma, uffd: &'u Uffd) -> io::Result<Stage<'u>> {
        let mut s = Self::map(like, len, v)?;
        uffd.register_wp(s.base, len)
            .or_else(|_| uffd.register_missing(s.base, len))?;
        s.uffd = Some(uffd);
        Ok(s)
    }

    /// Where the new folios are allocated: bound to `node`, with THP where
    /// the application's mapping would have THP and `folio` asks for it.
    pub fn dest(
        like: usize,
        len: usize,
        v: &Vma,
        node: u32,
        folio: usize,
    ) -> io::Result<Stage<'u>> {
        let s = Self::map(like, len, v)?;
        s.bind(v, node, folio)?;
        Ok(s)
    }

    /// Binds new pages of the area to `node`, with THP where the
    /// application's mapping would have THP and `folio` asks for it.
    pub fn bind(&self, v: &Vma, node: u32, folio: usize) -> io::Result<()> {
        numa::mbind(self.base, self.len, node)
            .map_err(|e| io::Error::new(e.kind(), format!("mbind: {e}")))?;
        let (advice, what) = if folio >= PMD && thp_allowed(v) {
            (libc::MADV_HUGEPAGE, "madvise(HUGEPAGE)")
        } else {
            (libc::MADV_NOHUGEPAGE, "madvise(NOHUGEPAGE)")
        };
        self.advise(advice, what)
    }

    /// A parking area whose batch is over, kept for the next batch's
    /// destination: unregistered (nothing can wait on it any more), its
    /// old pages left where they are. `None` where it could not be
    /// unregistered: it is left mapped then (see `Drop`).
    pub fn keep(mut self) -> Option<Stage<'static>> {
        if let Some(u) = self.uffd.take() {
            if u.unregister(self.base, self.len).is_err() {
                // Unmapping a range still registered would wait for its
                // UNMAP event, which only this thread reads.
                std::mem::forget(self);
                return None;
            }
        }
        let kept = Stage {
            map: self.map,
            map_len: self.map_len,
            base: self.base,
            len: self.len,
            uffd: None,
        };
        // The mapping now belongs to `kept`.
        std::mem::forget(self);
        Some(kept)
    }

    /// Whether the area can stage the batch `[like, like + len)`: as long,
    /// at the same offset within a PMD.
    pub fn fits(&self, like: usize, len: usize) -> bool {
        self.len == len && self.base % PMD == like % PMD
    }

    /// Frees pages `first .. first + pages` of the area.
    pub fn zap(&self, first: usize, pages: usize, page: usize) -> io::Result<()> {
        let at = self.base + first * page;
        // SAFETY: inside our own mapping, unregistered; its bytes are ours.
        if unsafe { libc::madvise(at as *mut libc::c_void, pages * page, libc::MADV_DONTNEED) } != 0
        {
            return Err(last_err("madvise(DONTNEED) staging area"));
        }
        Ok(())
    }

    /// Allocates pages `first .. first + pages` (write faults, so on the
    /// bound node).
    pub fn populate(&self, first: usize, pages: usize, page: usize) -> io::Result<()> {
        let (at, len) = (self.base + first * page, pages * page);
        // SAFETY: inside our own mapping.
        let rc = unsafe { libc::madvise(at as *mut libc::c_void, len, MADV_POPULATE_WRITE) };
        if rc == 0 {
            return Ok(());
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(last_err("madvise(POPULATE_WRITE) destination"));
        }
        // Kernels before 5.14: touch each page.
        for p in (at..at + len).step_by(page) {
            // SAFETY: a byte of our own writable, unregistered mapping.
            unsafe { (p as *mut u8).write_volatile(0) };
        }
        Ok(())
    }
}

impl Drop for Stage<'_> {
    fn drop(&mut self) {
        if let Some(u) = self.uffd.take() {
            if u.unregister(self.base, self.len).is_err() {
                // Still registered: unmapping it would wait for an UNMAP
                // event only this thread reads. Left mapped (a leak of
                // one batch's staging, not a hang).
                return;
            }
        }
        // SAFETY: the whole mapping is ours; pages moved out of it are gone
        // from it already, whatever is left (old pages) is freed.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.map_len) };
    }
}

/// Tells whether a userfaultfd event is in flight (raised by a zap, an
/// unmap, a remap or a fork of a registered range, and not yet read).
///
/// The kernel refuses `UFFDIO_MOVE` with EAGAIN exactly while one is; so
/// one page moved back and forth between two slots of a private, never
/// forked area is a race-free probe. Needed before a batch ends: a child
/// being forked already holds our descriptor, so closing it would not
/// release the forking thread, which waits for its FORK event to be read.
pub struct Probe<'u> {
    area: Stage<'u>,
    page: usize,
    /// Which slot holds the page.
    at: usize,
}

impl<'u> Probe<'u> {
    pub fn new(uffd: &'u Uffd, page: usize) -> io::Result<Probe<'u>> {
        let v = Vma {
            map: MapLine {
                start: 0,
                end: 0,
                perms: "rw-p".into(),
                path: String::new(),
                inode: 0,
            },
            flags: Vec::new(),
        };
        let area = Stage::parking(0, 2 * page, &v, uffd)?;
        let zeros = vec![0u8; page];
        uffd.copy(area.base, zeros.as_ptr() as usize, page)
            .map_err(|p| p.error)?;
        Ok(Probe { area, page, at: 0 })
    }

    /// `Ok(true)` if no event was in flight at some instant of the call.
    pub fn quiet(&mut self, uffd: &Uffd) -> io::Result<bool> {
        let (from, to) = (self.at, 1 - self.at);
        let slot = |i: usize| self.area.base + i * self.page;
        match uffd.move_pages(slot(to), slot(from), self.page) {
            Ok(_) => {
                self.at = to;
                Ok(true)
            }
            Err(p) if p.error.raw_os_error() == Some(libc::EAGAIN) => Ok(false),
            Err(p) => Err(p.error),
        }
    }
}

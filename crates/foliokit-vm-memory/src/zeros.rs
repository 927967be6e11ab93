//! Making guest bytes read zero (a hole of a sparse snapshot, restored
//! eagerly) with as few writes as it can: pages of private anonymous guest
//! RAM that were never populated read zero already and are left alone (not
//! faulted in: the guest's first touch gets a zeroed page from the kernel,
//! as on a fresh boot); every other byte is cleared. Never a stale byte:
//! where it cannot tell, it clears.

use std::io;
use std::os::unix::fs::FileExt;

use foliokit::{CopyStrategy, McError};
use vm_memory::bitmap::Bitmap;
use vm_memory::GuestRegionMmap;

/// pagemap entry bits: present, swapped.
const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
/// pagemap entries read per call.
const ENTRIES: usize = 1 << 16;
/// Bytes of the zero source: clears go in pieces this size.
const ZERO_LEN: usize = 2 << 20;

/// A read-only private anonymous mapping never written: every read gets
/// the shared zero page, so copying from it writes zeros with a
/// machine-check-safe copy (a poisoned guest page is reported, not fatal)
/// and reads nothing from memory.
pub(crate) struct Zeros {
    base: *const u8,
    pagemap: Option<std::fs::File>,
}

impl Zeros {
    pub(crate) fn new() -> io::Result<Zeros> {
        // SAFETY: a fresh private anonymous read-only mapping; nothing is
        // replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ZERO_LEN,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Zeros {
            base: p.cast(),
            pagemap: std::fs::File::open("/proc/self/pagemap").ok(),
        })
    }

    /// For each page of `[host, host + pages * page)` (page-aligned):
    /// whether it reads zero without a write. Only private anonymous
    /// regions qualify (elsewhere a page not mapped here may still hold
    /// bytes in its file or shared memory); any doubt answers false.
    pub(crate) fn untouched<B: Bitmap>(
        &self,
        region: &GuestRegionMmap<B>,
        host: usize,
        pages: usize,
        page: usize,
    ) -> Vec<bool> {
        let flags = region.flags();
        let private_anon = region.file_offset().is_none()
            && flags & libc::MAP_PRIVATE != 0
            && flags & libc::MAP_ANONYMOUS != 0;
        let mut out = vec![false; pages];
        let Some(f) = self.pagemap.as_ref().filter(|_| private_anon) else {
            return out;
        };
        let mut raw = vec![0u8; ENTRIES.min(pages) * 8];
        let mut i = 0;
        while i < pages {
            let n = ENTRIES.min(pages - i);
            let off = ((host / page + i) * 8) as u64;
            if f.read_exact_at(&mut raw[..n * 8], off).is_err() {
                return vec![false; pages];
            }
            for (k, e) in raw[..n * 8].chunks_exact(8).enumerate() {
                let v = u64::from_ne_bytes(e.try_into().unwrap_or([0xff; 8]));
                out[i + k] = v & (PRESENT | SWAPPED) == 0;
            }
            i += n;
        }
        out
    }

    /// Writes zeros over `[dst, dst + len)`; on a guest page that faults,
    /// how many bytes were cleared before it and the error.
    ///
    /// # Safety
    /// `[dst, dst + len)` is live writable guest RAM, not this mapping.
    pub(crate) unsafe fn clear(&self, dst: *mut u8, len: usize) -> Result<(), (usize, McError)> {
        let mut done = 0;
        while done < len {
            let n = ZERO_LEN.min(len - done);
            // SAFETY: the caller's range and our zero mapping (ZERO_LEN >=
            // n readable bytes), disjoint; the mc copy reports a guest page
            // that faults.
            let r = unsafe {
                foliokit::copy_mc_raw(dst.wrapping_add(done), self.base, n, CopyStrategy::Auto)
            };
            match r {
                Ok(_) => done += n,
                Err(McError::DestinationFault(f)) => {
                    return Err((done + n - f.not_copied, McError::DestinationFault(f)))
                }
                Err(e) => return Err((done, e)),
            }
        }
        Ok(())
    }
}

impl Drop for Zeros {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(self.base as *mut libc::c_void, ZERO_LEN) };
    }
}

//! Anonymous memory regions backed by the page size a folio size asks for.
//!
//! - 1 GiB folios: hugetlb 1 GiB pages already in the pool. A region never
//!   grows the pool (that is a system setting, changed only explicitly, e.g.
//!   by `foliokit_lab::hugetlb::HugetlbGrant`); when the pool is short the
//!   region falls back to THP and its backing note says why.
//! - the PMD size (2 MiB on x86): THP via `MADV_HUGEPAGE` on an aligned range.
//! - sizes between 4 KiB and the PMD size: mTHP, when sysfs allows it.
//! - 4 KiB: plain pages.
//!
//! Every region records the backing it asked for and what it actually got,
//! so that no table ever claims huge pages it did not have.

use std::io;
use thiserror::Error;

use super::system;
use crate::arch;
use crate::batch::page_size;
use crate::cpu::cpu;

const GIB: usize = 1 << 30;

/// Why a [`Region`] could not be made or evicted.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MemError {
    /// [`Region::new`] or [`Region::unpopulated`] was asked for 0 bytes.
    #[error("a region of 0 bytes was requested")]
    Empty,
    /// The requested length (in bytes), rounded up to whole folios plus
    /// alignment slack, does not fit in `usize`.
    #[error("region size {0} bytes overflows the address space")]
    TooLarge(usize),
    /// The kernel refused the mapping (typically `ENOMEM`: address space
    /// or overcommit limits).
    #[error("mmap of {len} bytes failed: {source}")]
    Map {
        /// Bytes asked of mmap, including alignment slack or guard pages.
        len: usize,
        /// The OS error.
        source: io::Error,
    },
    /// Making a guard page of [`Region::guarded`] inaccessible failed.
    #[error("mprotect of a guard page failed: {0}")]
    Guard(io::Error),
    /// A hugetlb mapping ([`Region::hugetlb`], or a 1 GiB [`Region::new`]
    /// before its fallback) could not have its pages.
    #[error("{}", hugetlb_refusal(*.size, *.pages, *.available, .source))]
    NoHugetlb {
        /// The huge page size asked for.
        size: usize,
        /// Pages the mapping needed.
        pages: usize,
        /// Pages the pool had for a new mapping (free, not reserved);
        /// `None`: the kernel has no pool of that size.
        available: Option<usize>,
        /// What mmap said.
        source: io::Error,
    },
    /// [`Region::evict`] on an architecture without a cache-flush
    /// instruction foliokit uses (anything but x86_64).
    #[error("cache eviction is not available on this architecture")]
    NoFlush,
}

fn hugetlb_refusal(size: usize, pages: usize, available: Option<usize>, e: &io::Error) -> String {
    match available {
        None => format!("this kernel has no {} hugetlb pool", size_name(size)),
        Some(a) if a < pages => format!(
            "the {} hugetlb pool has {a} of {pages} pages free",
            size_name(size)
        ),
        Some(_) => format!(
            "hugetlb mmap of {pages} {} pages failed: {e}",
            size_name(size)
        ),
    }
}

/// What backing a region asked for and what it got.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Backing {
    /// What the folio size asked for: `"4K"`, `"THP 2M"`, `"mTHP 64K"`,
    /// `"hugetlb 1G"`.
    pub requested: String,
    /// What the kernel actually gave, read back from smaps after faulting
    /// (e.g. `"THP 2M on 100% of the range"`, `"4K"`), or
    /// `"not faulted in yet"`.
    pub obtained: String,
    /// Why the two differ, when they do.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub note: Option<String>,
}

/// An owned, page-aligned anonymous mapping.
pub struct Region {
    map: *mut u8,
    map_len: usize,
    data: *mut u8,
    len: usize,
    backing: Backing,
    /// The THP size madvised for, if any.
    huge: Option<usize>,
}

// SAFETY: a Region exclusively owns its mapping, like a Vec owns its buffer;
// shared access only hands out `&[u8]`, mutation needs `&mut self`.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` permits only reads.
unsafe impl Sync for Region {}

fn mmap(len: usize, extra_flags: libc::c_int) -> io::Result<*mut u8> {
    // SAFETY: an anonymous mapping at a kernel-chosen address has no
    // preconditions; failure is reported as MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p.cast())
    }
}

/// A folio or page size as the kernel's sysfs and these reports name it:
/// "4K", "64K", "2M", "1G" (whole GiB or MiB where it is one, else KiB).
pub fn size_name(size: usize) -> String {
    match size {
        s if s >= GIB && s % GIB == 0 => format!("{}G", s / GIB),
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{}M", s >> 20),
        s => format!("{}K", s >> 10),
    }
}

impl Region {
    /// A region of `len` bytes (rounded up to whole folios) backed as
    /// `folio_size` asks, faulted in before it is returned.
    pub fn new(len: usize, folio_size: usize) -> Result<Region, MemError> {
        Self::map(len, folio_size, true)
    }

    /// As [`Region::new`] but not faulted in: for measuring the faults.
    /// Call [`Region::observe_backing`] after touching it.
    pub fn unpopulated(len: usize, folio_size: usize) -> Result<Region, MemError> {
        Self::map(len, folio_size, false)
    }

    fn map(len: usize, folio_size: usize, prefault: bool) -> Result<Region, MemError> {
        if len == 0 {
            return Err(MemError::Empty);
        }
        let page = page_size();
        let folio = folio_size.max(page);
        let len = len
            .checked_next_multiple_of(folio)
            .ok_or(MemError::TooLarge(len))?;
        let mut note = None;
        if folio == GIB {
            match Self::map_hugetlb(len, GIB, prefault) {
                Ok(r) => return Ok(r),
                Err(why) => note = Some(why.to_string()),
            }
        }
        let thp = system::thp_state();
        let pmd = thp.pmd_size.unwrap_or(2 << 20);
        // A 1 GiB request that hugetlb could not serve falls back to PMD THP.
        let want = if folio == GIB { pmd } else { folio };
        let requested = if folio == GIB {
            "hugetlb 1G".to_string()
        } else if folio == page {
            "4K".to_string()
        } else if want == pmd {
            format!("THP {}", size_name(pmd))
        } else {
            format!("mTHP {}", size_name(want))
        };
        let huge = want > page && thp.madvise_allows(want);
        if want > page && !huge && note.is_none() {
            note = Some(format!(
                "sysfs does not allow {} THP via madvise (enable it under {})",
                size_name(want),
                "/sys/kernel/mm/transparent_hugepage"
            ));
        }
        let align = if huge { want } else { page };
        let map_len = len.checked_add(align).ok_or(MemError::TooLarge(len))?;
        let map = mmap(map_len, 0).map_err(|source| MemError::Map {
            len: map_len,
            source,
        })?;
        let data = map.wrapping_add((map as usize).wrapping_neg() & (align - 1));
        let mut r = Region {
            map,
            map_len,
            data,
            len,
            backing: Backing {
                requested,
                obtained: "4K".into(),
                note,
            },
            huge: None,
        };
        if huge {
            // SAFETY: [data, data+len) lies inside our own mapping.
            let rc = unsafe { libc::madvise(r.data.cast(), len, libc::MADV_HUGEPAGE) };
            if rc != 0 {
                r.backing.note = Some(format!(
                    "madvise(MADV_HUGEPAGE): {}",
                    io::Error::last_os_error()
                ));
            }
        }
        r.huge = huge.then_some(want);
        if prefault {
            r.prefault();
            r.observe_backing();
        } else {
            r.backing.obtained = "not faulted in yet".into();
        }
        Ok(r)
    }

    /// Re-reads what backs the region (after the caller faulted it in).
    pub fn observe_backing(&mut self) {
        if let Some(want) = self.huge {
            self.backing.obtained = self.observed_thp(want);
        } else if !self.backing.requested.starts_with("hugetlb") {
            self.backing.obtained = "4K".into();
        }
    }

    /// Hugetlb-backed region from the pages already in the pool, or why not.
    fn map_hugetlb(len: usize, size: usize, prefault: bool) -> Result<Region, MemError> {
        let flags =
            libc::MAP_HUGETLB | ((size.trailing_zeros() as libc::c_int) << libc::MAP_HUGE_SHIFT);
        let map = mmap(len, flags).map_err(|source| MemError::NoHugetlb {
            size,
            pages: len / size,
            available: system::hugetlb_pool(size).map(|p| p.available()),
            source,
        })?;
        let mut r = Region {
            map,
            map_len: len,
            data: map,
            len,
            backing: Backing {
                requested: format!("hugetlb {}", size_name(size)),
                obtained: format!("hugetlb {}", size_name(size)),
                note: None,
            },
            huge: None,
        };
        if prefault {
            r.prefault();
        }
        Ok(r)
    }

    /// A region of `len` bytes (rounded up to whole pages) of hugetlb pages
    /// of `page_size` from the pool, faulted in or not: unlike
    /// [`Region::new`], never a fallback to other backing. Refused
    /// ([`MemError::NoHugetlb`]) where the kernel has no such pool or too
    /// few pages are free in it (growing the pool is left to the caller).
    pub fn hugetlb(len: usize, page_size: usize, populate: bool) -> Result<Region, MemError> {
        if len == 0 {
            return Err(MemError::Empty);
        }
        // A huge page size: above the base page (a size of 0 in the flags
        // would ask for the default huge page size, not this one).
        if !page_size.is_power_of_two() || page_size <= crate::batch::page_size() {
            return Err(MemError::NoHugetlb {
                size: page_size,
                pages: 0,
                available: None,
                source: io::Error::from(io::ErrorKind::InvalidInput),
            });
        }
        let len = len
            .checked_next_multiple_of(page_size)
            .ok_or(MemError::TooLarge(len))?;
        Self::map_hugetlb(len, page_size, populate)
    }

    /// A base-page region with a PROT_NONE page on each side, so any access
    /// past either end faults. For tests of the primitives.
    pub fn guarded(len: usize) -> Result<Region, MemError> {
        let page = page_size();
        let body = len
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or(MemError::TooLarge(len))?;
        let map_len = body.checked_add(2 * page).ok_or(MemError::TooLarge(len))?;
        let map = mmap(map_len, 0).map_err(|source| MemError::Map {
            len: map_len,
            source,
        })?;
        let r = Region {
            map,
            map_len,
            data: map.wrapping_add(page),
            len: body,
            backing: Backing {
                requested: "4K".into(),
                obtained: "4K".into(),
                note: Some("guard pages on both sides".into()),
            },
            huge: None,
        };
        for guard in [map, map.wrapping_add(page + body)] {
            // SAFETY: each guard page lies inside our own mapping.
            if unsafe { libc::mprotect(guard.cast(), page, libc::PROT_NONE) } != 0 {
                return Err(MemError::Guard(io::Error::last_os_error()));
            }
        }
        Ok(r)
    }

    /// Faults every page in for writing, so timed loops never take faults.
    fn prefault(&mut self) {
        // SAFETY: the range is our own mapping.
        let rc = unsafe { libc::madvise(self.data.cast(), self.len, libc::MADV_POPULATE_WRITE) };
        if rc != 0 {
            // Kernels before 5.14 lack MADV_POPULATE_WRITE: touch each page.
            for off in (0..self.len).step_by(page_size()) {
                // SAFETY: off < len, inside our writable mapping.
                unsafe { self.data.add(off).write_volatile(0) };
            }
        }
    }

    /// How much of the region the kernel backs with PMD THPs (from smaps).
    fn observed_thp(&self, want: usize) -> String {
        let pmd = system::thp_state().pmd_size.unwrap_or(2 << 20);
        if want != pmd {
            // smaps only counts PMD-mapped THP; mTHP sizes cannot be seen there.
            return format!(
                "mTHP {} (allowed by sysfs; smaps cannot confirm)",
                size_name(want)
            );
        }
        match crate::sys::smaps::anon_huge_bytes(
            None,
            self.data as usize,
            self.data as usize + self.len,
        ) {
            Some(huge) if huge >= self.len => format!("THP {}", size_name(pmd)),
            Some(0) => "4K (no THP obtained)".into(),
            Some(huge) => format!(
                "THP {} on {}% of the range",
                size_name(pmd),
                huge * 100 / self.len
            ),
            None => "unknown (no smaps)".into(),
        }
    }

    /// Length in bytes (the request rounded up to whole folios).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a region has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the region, aligned to the backing's page size.
    pub fn as_ptr(&self) -> *const u8 {
        self.data
    }

    /// Start of the region, for writes through raw pointers (the `_raw`
    /// entry points).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.data
    }

    /// The region's bytes (zero until written).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: [data, data+len) is our mapped, initialised (zero-filled or
        // written) memory for the lifetime of &self.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    /// The region's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }

    /// What backs the region, as last observed.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Writes back and evicts the whole region from the CPU caches.
    pub fn evict(&self) -> Result<(), MemError> {
        if !arch::CAN_FLUSH {
            return Err(MemError::NoFlush);
        }
        // SAFETY: the region is mapped for its whole length.
        unsafe { arch::flush_range(self.data, self.len, cpu().features.clflushopt) };
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: we own [map, map+map_len) and nothing borrows it any more.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes that are not huge page sizes are refused before mapping (1
    /// used to map the default huge page size and record a 1-byte page).
    #[test]
    fn hugetlb_refuses_sizes_that_are_no_huge_page() {
        for size in [0, 1, 3, 4096, 3 << 20] {
            assert!(
                matches!(
                    Region::hugetlb(1 << 21, size, false),
                    Err(MemError::NoHugetlb { .. })
                ),
                "{size}"
            );
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(size_name(4096), "4K");
        assert_eq!(size_name(2 << 20), "2M");
        assert_eq!(size_name(1 << 30), "1G");
    }

    #[test]
    fn regions_are_zeroed_aligned_and_sized() {
        let r = Region::new(3 * 4096 + 1, 4096).unwrap();
        assert_eq!(r.len(), 4 * 4096);
        assert_eq!(r.as_ptr() as usize % 4096, 0);
        assert!(r.as_slice().iter().all(|&b| b == 0));
        assert!(matches!(Region::new(0, 4096), Err(MemError::Empty)));
    }

    #[test]
    fn a_1g_region_never_grows_the_hugetlb_pool() {
        let Some(before) = system::hugetlb_pool(GIB) else {
            return; // no 1 GiB pool on this kernel: nothing to grow
        };
        // Not faulted in: the hugetlb mmap (or its THP fallback) is enough.
        let r = Region::unpopulated(GIB, GIB).unwrap();
        let after = system::hugetlb_pool(GIB).unwrap();
        assert_eq!(after.total, before.total, "the pool was resized");
        if before.available() == 0 {
            assert!(!r.backing().obtained.starts_with("hugetlb"));
            let note = r.backing().note.as_deref().unwrap_or_default();
            assert!(note.contains("pool has 0 of 1 pages free"), "{note}");
        }
    }
}

//! Growing a hugetlb pool for an experiment, explicitly, and giving the
//! pages back afterwards.
//!
//! The library's regions only use hugetlb pages already in the pool (a
//! library must not change system settings behind its caller's back). The
//! benches want 1 GiB rows even on a machine whose pool is empty, so they
//! hold a [`HugetlbGrant`] (root only) for as long as the memory lives;
//! [`PooledRegion`] is that for one region.

use std::ops::{Deref, DerefMut};

use foliokit::batch::page_size;
use foliokit::internals::hugetlb_dir;
use foliokit::mem::system::{hugetlb_pool, is_root};
use foliokit::mem::{size_name, Backing, MemError, Region};

const GIB: usize = 1 << 30;

fn read_usize(path: &str) -> Option<usize> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Hugetlb pages added to a pool for as long as this value lives (one
/// region, or a whole experiment); removed again on drop.
#[derive(Debug)]
pub struct HugetlbGrant {
    dir: String,
    added: usize,
    /// Its entry in the interrupt handler's list.
    id: u64,
}

impl HugetlbGrant {
    /// Makes sure `need` pages of `size` are free for the grant's lifetime:
    /// `Ok(None)` if they already were, `Ok(Some)` if the pool was grown,
    /// `Err` saying why not.
    pub fn reserve(size: usize, need: usize) -> Result<Option<HugetlbGrant>, String> {
        let free = hugetlb_pool(size)
            .ok_or_else(|| format!("this kernel has no {} hugetlb pool", size_name(size)))?
            .available();
        if free >= need {
            return Ok(None);
        }
        if !is_root() {
            return Err(format!(
                "the {} hugetlb pool has {free} of {need} pages free and growing it needs root",
                size_name(size)
            ));
        }
        Self::grow(size, need).map(Some).ok_or_else(|| {
            format!(
                "the {} hugetlb pool could not be filled with {need} pages",
                size_name(size)
            )
        })
    }

    /// Pages this grant added to the pool.
    pub fn added(&self) -> usize {
        self.added
    }

    /// Grows the `size` pool so `need` pages are free; `None` if we may not
    /// or the kernel could not find the memory.
    fn grow(size: usize, need: usize) -> Option<HugetlbGrant> {
        if !is_root() {
            return None;
        }
        let dir = hugetlb_dir(size);
        let pool = hugetlb_pool(size)?;
        if pool.available() >= need {
            return None;
        }
        let want = pool.total + (need - pool.available());
        let nr = format!("{dir}/nr_hugepages");
        std::fs::write(&nr, want.to_string()).ok()?;
        let got = read_usize(&nr)?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let grant = HugetlbGrant {
            dir,
            added: got.saturating_sub(pool.total),
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        // An interrupt gives the pages back too (Drop does not run then).
        crate::mthp::shrink_pool_on_interrupt(grant.id, nr.into(), grant.added);
        // Dropping a partial grant gives back what we did get.
        (got >= want).then_some(grant)
    }
}

impl Drop for HugetlbGrant {
    fn drop(&mut self) {
        // Shrink by what we added, not back to a remembered total, so that
        // grants for several regions can be released in any order.
        let path = format!("{}/nr_hugepages", self.dir);
        // With the interrupt handler held off: it shrinks a grant still on
        // its list, so exactly one of the two shrinks the pool.
        crate::mthp::release_pool(self.id, || {
            if let Some(now) = read_usize(&path) {
                let _ = std::fs::write(&path, now.saturating_sub(self.added).to_string());
            }
        });
    }
}

/// A [`Region`] for a bench row: for 1 GiB folios the hugetlb pool is grown
/// first when it is short (root only) and shrunk again after the region is
/// dropped. Other folio sizes are a plain [`Region`]. Derefs to the region.
pub struct PooledRegion {
    // Declared first, so dropped first: the pages are unmapped before the
    // grant gives them back to the kernel.
    region: Region,
    /// What the pool did for this region, or why it could not.
    note: Option<String>,
    _grant: Option<HugetlbGrant>,
}

impl PooledRegion {
    /// As [`Region::new`], growing the 1 GiB pool for the region's lifetime
    /// when that is what stands between the region and hugetlb pages.
    pub fn new(len: usize, folio_size: usize) -> Result<PooledRegion, MemError> {
        if folio_size.max(page_size()) != GIB {
            return Ok(PooledRegion {
                region: Region::new(len, folio_size)?,
                note: None,
                _grant: None,
            });
        }
        let need = len.div_ceil(GIB);
        let (grant, why) = match HugetlbGrant::reserve(GIB, need) {
            Ok(g) => (g, None),
            Err(why) => (None, Some(why)),
        };
        let region = Region::new(len, folio_size)?;
        let hugetlb = region.backing().obtained.starts_with("hugetlb");
        // A grant the region did not use goes back at once.
        let grant = grant.filter(|_| hugetlb);
        let note = match &grant {
            Some(g) => Some(format!("grew the pool by {} pages for this run", g.added)),
            None => why,
        };
        Ok(PooledRegion {
            region,
            note,
            _grant: grant,
        })
    }

    /// The region's backing, with what the pool did in its note.
    pub fn backing(&self) -> Backing {
        let mut b = self.region.backing().clone();
        if let Some(n) = &self.note {
            b.note = Some(n.clone());
        }
        b
    }
}

impl Deref for PooledRegion {
    type Target = Region;

    fn deref(&self) -> &Region {
        &self.region
    }
}

impl DerefMut for PooledRegion {
    fn deref_mut(&mut self) -> &mut Region {
        &mut self.region
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_the_kernel_lacks_is_an_error_and_enough_is_no_grant() {
        // 4 KiB is the base page: no kernel has a hugetlb pool of it.
        let e = HugetlbGrant::reserve(4096, 1).unwrap_err();
        assert_eq!(e, "this kernel has no 4K hugetlb pool");
        if hugetlb_pool(2 << 20).is_some() {
            assert!(HugetlbGrant::reserve(2 << 20, 0).unwrap().is_none());
        }
    }

    #[test]
    fn other_folio_sizes_are_plain_regions() {
        let r = PooledRegion::new(3 * 4096, 4096).unwrap();
        assert_eq!(r.len(), 3 * 4096);
        assert_eq!(r.backing(), *r.region.backing());
    }
}

//! Which pages of a batch belong to large folios that `UFFDIO_MOVE` could
//! not move whole, so that relocation leaves them in place for
//! `move_pages` (which migrates a large folio as one) instead of splitting
//! them.
//!
//! `UFFDIO_MOVE` (mm/userfaultfd.c, `move_pages`) moves a PMD-mapped THP
//! whole only when the whole aligned PMD is in the range; anything else in
//! a large folio goes through `move_pages_pte`, which splits the folio
//! (`split_folio`) to move one base page: every PTE-mapped large folio
//! (mTHP 16K-1M, a THP whose PMD was split, a THP cut by the range) would
//! come out as base pages. The kernel path keeps them whole.
//!
//! The folio a page belongs to is read from `/proc/self/pagemap` (the PFN)
//! and `/proc/kpageflags` (COMPOUND_HEAD/TAIL), which need CAP_SYS_ADMIN;
//! pages mapped by a PMD are told apart first with one `PAGEMAP_SCAN`
//! (Linux 6.7+): a PMD maps exactly one PMD-sized folio, so their flags
//! (512 words per THP) need not be read.
//! Where they cannot be read, [`mthp_possible`] tells whether a fault in
//! the mapping could have allocated an mTHP at all; relocation then
//! refuses (and `Auto` takes the kernel path).

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::vma::Vma;
use crate::mem::system::{read_mthp, THP_DIR};
use crate::sys::pagemap;

const PM_PRESENT: u64 = 1 << 63;
const PM_PFN_MASK: u64 = (1 << 55) - 1;
const KPF_COMPOUND_HEAD: u64 = 1 << 15;
const KPF_COMPOUND_TAIL: u64 = 1 << 16;
/// The PMD size (x86_64, arm64 with 4K pages): the only large folio
/// `UFFDIO_MOVE` moves whole.
pub const PMD: usize = 2 << 20;

/// What one page's folio lets relocation do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fol {
    /// A base page, a hole, or a tail of a PMD folio (moved with its head).
    Small,
    /// In a large folio relocation must leave whole and in place.
    Leave,
    /// First page of a PMD-sized, PMD-aligned folio mapped whole and
    /// contiguously inside the range: `UFFDIO_MOVE` moves it as one PMD.
    PmdHead,
}

/// Per page of `[start, start + n * page)`, what its folio allows: any
/// large folio that is not exactly one PMD-sized, PMD-aligned folio mapped
/// whole and contiguously inside the range is to be left. `None` where
/// PFNs or page flags are hidden (no CAP_SYS_ADMIN) or the files are
/// missing.
pub fn judge(start: usize, n: usize, page: usize) -> Option<Vec<Fol>> {
    let pagemap = File::open("/proc/self/pagemap").ok()?;
    let kflags = File::open("/proc/kpageflags").ok()?;
    let mut raw = vec![0u8; n * 8];
    pagemap
        .read_exact_at(&mut raw, (start / page * 8) as u64)
        .ok()?;
    let mut pfns: Vec<Option<u64>> = raw
        .chunks_exact(8)
        .map(|e| {
            let v = u64::from_ne_bytes(e.try_into().unwrap_or_default());
            (v & PM_PRESENT != 0).then_some(v & PM_PFN_MASK)
        })
        .collect();
    if pfns.iter().flatten().any(|&p| p == 0) {
        return None; // PFNs hidden from this process
    }
    let mut out = vec![Fol::Small; n];
    // PMD-mapped pages: judged by their PMD alone, no flags read.
    let end = start + n * page;
    let pmds = pagemap::pmd_mapped(start, n * page)
        .ok()
        .flatten()
        .unwrap_or_default();
    for (s, e) in pmds {
        let mut block = s / PMD * PMD;
        while block < e {
            let (from, to) = (block.max(start), (block + PMD).min(end));
            let (i, j) = ((from - start) / page, (to - start) / page);
            if block >= start && block + PMD <= end {
                out[i] = Fol::PmdHead;
            } else {
                out[i..j].iter_mut().for_each(|l| *l = Fol::Leave);
            }
            pfns[i..j].iter_mut().for_each(|p| *p = None);
            block += PMD;
        }
    }
    let flags = page_flags(&kflags, &pfns)?;
    let flag_of = |pfn: u64| -> u64 {
        let mut b = [0u8; 8];
        match kflags.read_exact_at(&mut b, pfn * 8) {
            Ok(()) => u64::from_ne_bytes(b),
            Err(_) => 0,
        }
    };
    let compound = KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL;
    let mut i = 0;
    while i < n {
        let (Some(pfn), f) = (pfns[i], flags[i]) else {
            i += 1;
            continue;
        };
        if f & compound == 0 {
            i += 1;
            continue;
        }
        // The run of pages mapping consecutive pages of this folio.
        let mut j = i + 1;
        while j < n && pfns[j] == Some(pfn + (j - i) as u64) && flags[j] & KPF_COMPOUND_TAIL != 0 {
            j += 1;
        }
        let last = pfn + (j - i - 1) as u64;
        let whole = f & KPF_COMPOUND_HEAD != 0 && flag_of(last + 1) & KPF_COMPOUND_TAIL == 0;
        let movable = whole && (j - i) * page == PMD && (start + i * page) % PMD == 0;
        if movable {
            out[i] = Fol::PmdHead;
        } else {
            out[i..j].iter_mut().for_each(|l| *l = Fol::Leave);
        }
        i = j;
    }
    Some(out)
}

/// The kpageflags word of each present page (0 for holes), read in runs
/// of consecutive PFNs.
fn page_flags(kflags: &File, pfns: &[Option<u64>]) -> Option<Vec<u64>> {
    let mut out = vec![0u64; pfns.len()];
    let mut i = 0;
    while i < pfns.len() {
        let Some(pfn) = pfns[i] else {
            i += 1;
            continue;
        };
        let mut j = i + 1;
        while j < pfns.len() && pfns[j] == Some(pfn + (j - i) as u64) {
            j += 1;
        }
        let mut raw = vec![0u8; (j - i) * 8];
        kflags.read_exact_at(&mut raw, pfn * 8).ok()?;
        for (k, e) in raw.chunks_exact(8).enumerate() {
            out[i + k] = u64::from_ne_bytes(e.try_into().unwrap_or_default());
        }
        i = j;
    }
    Some(out)
}

/// Whether a fault in mapping `v` may allocate a large folio smaller than
/// a PMD (an mTHP size enabled for it), as sysfs says now.
pub fn mthp_possible(v: &Vma) -> bool {
    if v.has("nh") {
        return false;
    }
    let top = std::fs::read_to_string(format!("{THP_DIR}/enabled")).unwrap_or_default();
    let allows = |mode: &str| match mode {
        "always" => true,
        "madvise" => v.has("hg"),
        _ => false,
    };
    let top_mode = if top.contains("[always]") {
        "always"
    } else if top.contains("[madvise]") {
        "madvise"
    } else {
        "never"
    };
    read_mthp(std::path::Path::new(THP_DIR))
        .iter()
        .filter(|m| m.size < PMD)
        .any(|m| match m.enabled.as_str() {
            "inherit" => allows(top_mode),
            other => allows(other),
        })
}

//! A census of the folio sizes that actually back a range, from
//! `/proc/self/pagemap` and `/proc/kpageflags` (root only).

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};

use foliokit::batch::page_size;

/// The folio sizes backing a range, from the kernel's page flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Census {
    /// Folio size in bytes → number of such folios (mapped pages only).
    pub folios: BTreeMap<usize, usize>,
    /// Pages with no physical page behind them.
    pub unmapped_pages: usize,
}

impl Census {
    /// "64K x16" style summary, largest first.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .folios
            .iter()
            .rev()
            .map(|(&size, &n)| format!("{}K x{n}", size >> 10))
            .collect();
        if self.unmapped_pages > 0 {
            parts.push(format!("{} pages unmapped", self.unmapped_pages));
        }
        parts.join(", ")
    }
}

const KPF_COMPOUND_HEAD: u64 = 1 << 15;
const KPF_COMPOUND_TAIL: u64 = 1 << 16;
const PM_PRESENT: u64 = 1 << 63;
const PM_PFN_MASK: u64 = (1 << 55) - 1;

/// Counts the folios behind `[ptr, ptr + len)` by reading
/// `/proc/self/pagemap` and `/proc/kpageflags`. `None` where the kernel
/// hides PFNs (needs CAP_SYS_ADMIN) or the files are missing. Folios that
/// extend beyond the range are counted by the part inside it.
pub fn census(ptr: *const u8, len: usize) -> Option<Census> {
    let page = page_size();
    let pages = len / page;
    let mut pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut flags = std::fs::File::open("/proc/kpageflags").ok()?;
    let mut entries = vec![0u8; pages * 8];
    pagemap
        .seek(SeekFrom::Start((ptr as usize / page * 8) as u64))
        .ok()?;
    pagemap.read_exact(&mut entries).ok()?;
    let mut c = Census {
        folios: BTreeMap::new(),
        unmapped_pages: 0,
    };
    let mut run = 0usize; // pages in the folio being counted
    let mut saw_pfn = false;
    let flush = |run: &mut usize, c: &mut Census| {
        if *run > 0 {
            *c.folios.entry(*run * page).or_default() += 1;
            *run = 0;
        }
    };
    for e in entries.chunks_exact(8) {
        let e = u64::from_le_bytes(e.try_into().ok()?);
        let pfn = e & PM_PFN_MASK;
        if e & PM_PRESENT == 0 {
            flush(&mut run, &mut c);
            c.unmapped_pages += 1;
            continue;
        }
        saw_pfn |= pfn != 0;
        let mut f = [0u8; 8];
        flags.seek(SeekFrom::Start(pfn * 8)).ok()?;
        flags.read_exact(&mut f).ok()?;
        let f = u64::from_le_bytes(f);
        // A tail continues the current folio; anything else starts one.
        if f & KPF_COMPOUND_TAIL == 0 || run == 0 {
            flush(&mut run, &mut c);
        }
        run += 1;
        if f & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL) == 0 {
            flush(&mut run, &mut c);
        }
    }
    flush(&mut run, &mut c);
    saw_pfn.then_some(c)
}

//! Prefault: fault guest RAM in before the guest runs.

use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::{check_writable, pieces, Error, Result};

/// What a prefault did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefaultReport {
    /// Guest bytes faulted in.
    pub bytes: u64,
    /// Populate chunks (one PMD each) over all pieces.
    pub chunks: usize,
    /// Chunks the kernel populated with `MADV_POPULATE_WRITE`; the others
    /// were touched page by page (kernels before 5.14, or mappings that
    /// refuse it).
    pub madvised_chunks: usize,
    /// The most threads any piece used.
    pub channels: usize,
    /// Wall time, in seconds.
    pub secs: f64,
}

/// Faults in every region of `mem` for writing, from `channels` threads
/// (the calling one and foliokit's persistent helpers, which take on the
/// caller's CPU affinity and NUMA memory policy: bind the calling thread
/// to place guest RAM), without changing its contents.
///
/// Safe to call while vCPUs run: each page is populated by the kernel
/// (`MADV_POPULATE_WRITE`) or, where that is refused, by an atomic no-op
/// write (`fetch_or(0)`), so no byte changes. Fails with
/// [`Error::NotWritable`] on a read-only region before touching anything.
pub fn prefault<B: Bitmap>(mem: &GuestMemoryMmap<B>, channels: usize) -> Result<PrefaultReport> {
    let mut report = PrefaultReport::default();
    for region in mem.iter() {
        let r = prefault_range(mem, region.start_addr(), region.len(), channels)?;
        merge(&mut report, &r);
    }
    Ok(report)
}

/// Faults in the guest range `[addr, addr + len)` (which may span regions)
/// for writing, from `channels` threads, without changing its contents.
/// The range is widened to whole host pages.
pub fn prefault_range<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    addr: GuestAddress,
    len: u64,
    channels: usize,
) -> Result<PrefaultReport> {
    let parts = pieces(mem, addr, len)?;
    check_writable(&parts)?;
    let page = foliokit::batch::page_size();
    let mut report = PrefaultReport::default();
    for p in parts {
        // The region's mapping starts on a page boundary, so rounding the
        // start down stays inside it.
        let lead = p.host as usize % page;
        let start = p.host.wrapping_sub(lead);
        // SAFETY: [start, start + lead + len) lies inside the region's live
        // host mapping (borrowed through `mem` for the whole call), which
        // was checked to be writable; populate preserves every byte, so
        // vCPUs or other threads using the range concurrently are
        // unaffected.
        let r = unsafe { foliokit::mem::populate_raw(start, lead + p.len, channels) }.map_err(
            |source| Error::Prefault {
                addr: p.addr,
                len: p.len as u64,
                source,
            },
        )?;
        report.bytes += p.len as u64;
        report.chunks += r.chunks;
        report.madvised_chunks += r.madvised_chunks;
        report.channels = report.channels.max(r.channels);
        report.secs += r.secs;
    }
    Ok(report)
}

fn merge(into: &mut PrefaultReport, r: &PrefaultReport) {
    into.bytes += r.bytes;
    into.chunks += r.chunks;
    into.madvised_chunks += r.madvised_chunks;
    into.channels = into.channels.max(r.channels);
    into.secs += r.secs;
}

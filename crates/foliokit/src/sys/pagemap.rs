//! /proc/self/pagemap: which pages of a range are populated, without
//! touching them.

use std::io;
use std::os::unix::fs::FileExt;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const EXCLUSIVE: u64 = 1 << 56;

/// What backs one page of a range right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// Never touched, or zapped: reads as zeros.
    Empty,
    /// In memory, mapped only here.
    Present,
    /// In memory but not exclusively ours: the shared zero page (read,
    /// never written), or a page shared with a forked child or merged by
    /// KSM.
    Shared,
    /// Swapped out (on no NUMA node).
    Swapped,
}

/// The state of each page of `[addr, addr + pages * page)`.
pub fn page_states(addr: usize, pages: usize, page: usize) -> io::Result<Vec<PageState>> {
    let f = std::fs::File::open("/proc/self/pagemap")?;
    let mut raw = vec![0u8; pages * 8];
    f.read_exact_at(&mut raw, (addr / page * 8) as u64)?;
    Ok(raw
        .chunks_exact(8)
        .map(|e| {
            let v = u64::from_ne_bytes(e.try_into().unwrap_or_default());
            if v & PRESENT != 0 && v & EXCLUSIVE != 0 {
                PageState::Present
            } else if v & PRESENT != 0 {
                PageState::Shared
            } else if v & SWAPPED != 0 {
                PageState::Swapped
            } else {
                PageState::Empty
            }
        })
        .collect())
}

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

/// `PAGEMAP_SCAN`: `_IOWR('f', 16, struct pm_scan_arg)` (Linux 6.7).
const PAGEMAP_SCAN: u64 = 0xC060_6610;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
const PAGE_IS_HUGE: u64 = 1 << 6;

/// `struct pm_scan_arg` (uapi/linux/fs.h).
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);

/// `struct page_region`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// The extents of `[addr, addr + len)` whose pages are populated (in
/// memory or swapped), in order, as the kernel's page-table walk finds
/// them: it skips empty page tables whole, where a query per page costs
/// the same for a hole. `None` where the kernel cannot say (before 6.7).
pub fn populated(addr: usize, len: usize) -> io::Result<Option<Vec<(usize, usize)>>> {
    scan(addr, len, 0, PAGE_IS_PRESENT | PAGE_IS_SWAPPED)
}

/// The extents of `[addr, addr + len)` mapped by present PMDs (a THP
/// mapped whole, or a PMD-sized hugetlb page), clipped to the range, in
/// order. `None` where the kernel cannot say (before 6.7).
pub fn pmd_mapped(addr: usize, len: usize) -> io::Result<Option<Vec<(usize, usize)>>> {
    scan(addr, len, PAGE_IS_HUGE | PAGE_IS_PRESENT, 0)
}

/// `PAGEMAP_SCAN` over `[addr, addr + len)`: the extents whose pages have
/// every category of `all_of` and, unless it is 0, one of `any_of`.
fn scan(
    addr: usize,
    len: usize,
    all_of: u64,
    any_of: u64,
) -> io::Result<Option<Vec<(usize, usize)>>> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open("/proc/self/pagemap")?;
    let mut out: Vec<(usize, usize)> = Vec::new();
    let mut buf = vec![PageRegion::default(); 512];
    let end = addr + len;
    let mut at = addr;
    while at < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: at as u64,
            end: end as u64,
            vec: buf.as_mut_ptr() as u64,
            vec_len: buf.len() as u64,
            category_mask: all_of,
            category_anyof_mask: any_of,
            return_mask: all_of | any_of,
            ..PmScanArg::default()
        };
        // SAFETY: `arg` is the uAPI struct of this request (its size is in
        // the request number and in `arg.size`) and `vec` points to
        // `vec_len` writable regions; both live for the call.
        let n = unsafe { libc::ioctl(f.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOTTY) | Some(libc::EINVAL) if out.is_empty() && at == addr => Ok(None),
                _ => Err(e),
            };
        }
        for r in &buf[..n as usize] {
            let (s, e) = (r.start as usize, r.end as usize);
            // Adjacent regions with other categories come apart: join them.
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => out.push((s, e)),
            }
        }
        // The walk stops where the buffer filled, or at the end.
        let next = arg.walk_end as usize;
        if next <= at {
            break;
        }
        at = next;
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh private anonymous mapping of `len` bytes, unmapped by the
    /// caller.
    fn anon(len: usize) -> *mut libc::c_void {
        // SAFETY: a new mapping; nothing else is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p
    }

    /// A THP mapped whole is found as PMD-mapped, clipped to the range;
    /// base pages next to it are not.
    #[test]
    fn pmd_mapped_extents_are_the_whole_thps() {
        let page = crate::sys::page_size();
        let pmd = 2usize << 20;
        let len = 3 * pmd;
        let p = anon(len);
        let a = (p as usize).next_multiple_of(pmd);
        // SAFETY: advice on our mapping; the aligned PMD may get a THP.
        unsafe { libc::madvise(a as *mut libc::c_void, pmd, libc::MADV_HUGEPAGE) };
        // SAFETY: inside our mapping.
        unsafe { (a as *mut u8).write_volatile(1) };
        let got = pmd_mapped(a - page, pmd).unwrap();
        let states = page_states(a, pmd / page, page).unwrap();
        match got {
            None => println!("SKIP: no PAGEMAP_SCAN here (Linux 6.7+)"),
            Some(v) if v.is_empty() => {
                // No THP could be had: every page but the first is a hole.
                assert_eq!(states[1], PageState::Empty);
                println!("SKIP: no THP allocated here");
            }
            Some(v) => {
                assert!(states.iter().all(|&s| s == PageState::Present));
                // Clipped to the range: one page short of the THP's end.
                assert_eq!(v, vec![(a, a + pmd - page)]);
            }
        }
        // SAFETY: our mapping, unused from here.
        unsafe { libc::munmap(p, len) };
    }

    /// Written pages are found, holes and never-touched pages are not, and
    /// the answer agrees with the per-page read of pagemap.
    #[test]
    fn populated_extents_are_the_written_pages() {
        let page = crate::sys::page_size();
        let len = 64 * page;
        let p = anon(len);
        let a = p as usize;
        // SAFETY: advice on our mapping; it keeps 4 KiB pages.
        unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        for i in [0usize, 1, 2, 10, 63] {
            // SAFETY: inside our mapping.
            unsafe { ((a + i * page) as *mut u8).write_volatile(1) };
        }
        let Some(ext) = populated(a, len).unwrap() else {
            println!("SKIP: no PAGEMAP_SCAN here (Linux 6.7+)");
            // SAFETY: our mapping, unused from here.
            unsafe { libc::munmap(p, len) };
            return;
        };
        assert_eq!(
            ext,
            vec![
                (a, a + 3 * page),
                (a + 10 * page, a + 11 * page),
                (a + 63 * page, a + 64 * page)
            ]
        );
        let states = page_states(a, 64, page).unwrap();
        let written = states.iter().filter(|s| **s != PageState::Empty).count();
        assert_eq!(written, 5);
        // SAFETY: our mapping, unused from here.
        unsafe { libc::munmap(p, len) };
    }
}

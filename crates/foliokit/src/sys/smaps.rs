//! `/proc/PID/smaps`: how much of a range the kernel maps with PMD-sized
//! huge pages; and the page size of a (hugetlb) mapping, which the
//! `PROCMAP_QUERY` ioctl on `/proc/self/maps` answers where the kernel has
//! it, smaps elsewhere.

use super::maps::MapLine;

/// Bytes of `AnonHugePages` in the mappings of process `pid` (`None`: this
/// one) that intersect `[start, end)`; `madvise` splits mappings, so a
/// range may span several. `None` where smaps cannot be read.
pub fn anon_huge_bytes(pid: Option<i32>, start: usize, end: usize) -> Option<usize> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/smaps"),
        None => "/proc/self/smaps".into(),
    };
    Some(parse(&std::fs::read_to_string(path).ok()?, start, end))
}

/// The page size the kernel maps this process's mapping at `addr` with
/// (its `KernelPageSize`: a hugetlb mapping's huge page size). `None`
/// where smaps cannot be read or has no mapping there.
///
/// Asks the kernel about that one mapping (`PROCMAP_QUERY`, Linux 6.11)
/// where it can: reading smaps walks the page tables of every mapping of
/// the process, milliseconds per populated gigabyte, while a VMM waits to
/// start its vCPUs.
pub fn kernel_page_size(addr: usize) -> Option<usize> {
    match query_page_size(addr) {
        Some(answer) => answer,
        None => smaps_page_size(addr),
    }
}

/// The page size of process `pid`'s mapping at each of `addrs` (its
/// `KernelPageSize`), from one read of its smaps: `None` inside where no
/// mapping is there; `None` where smaps cannot be read (another user's
/// process, no /proc).
pub fn kernel_page_sizes_of(pid: i32, addrs: &[usize]) -> Option<Vec<Option<usize>>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    Some(
        addrs
            .iter()
            .map(|&a| {
                let kib = kib_fields(&text, a, a + 1, "KernelPageSize:").next()?;
                Some(kib.unwrap_or(4) << 10)
            })
            .collect(),
    )
}

/// [`kernel_page_size`] from smaps.
fn smaps_page_size(addr: usize) -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    // Unreadable: the base page, as the kernel writes it.
    let kib = kib_fields(&text, addr, addr + 1, "KernelPageSize:").next()?;
    Some(kib.unwrap_or(4) << 10)
}

fn parse(text: &str, start: usize, end: usize) -> usize {
    kib_fields(text, start, end, "AnonHugePages:")
        .map(|kib| kib.unwrap_or(0) << 10)
        .sum()
}

/// The values (in KiB; `None` where unreadable) of the `key` lines of the
/// mappings in smaps `text` that intersect `[start, end)`, in order.
fn kib_fields<'a>(
    text: &'a str,
    start: usize,
    end: usize,
    key: &'a str,
) -> impl Iterator<Item = Option<usize>> + 'a {
    let mut inside = false;
    text.lines().filter_map(move |line| {
        if let Some(m) = MapLine::parse(line) {
            inside = m.overlaps(start, end);
            return None;
        }
        let v = line.strip_prefix(key).filter(|_| inside)?;
        Some(v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
    })
}

/// `struct procmap_query` (uapi/linux/fs.h, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 = 0xC068_6611;

/// [`kernel_page_size`] through `PROCMAP_QUERY`: `Some(None)` where no
/// mapping holds `addr`, `None` where the kernel cannot answer (older than
/// 6.11) and smaps must.
fn query_page_size(addr: usize) -> Option<Option<usize>> {
    use std::os::fd::AsRawFd;
    let maps = std::fs::File::open("/proc/self/maps").ok()?;
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        // 0: the mapping covering the address, whatever its permissions.
        query_flags: 0,
        query_addr: addr as u64,
        ..ProcmapQuery::default()
    };
    // SAFETY: `q` is the exact uAPI struct for this request (its size is
    // in the request number and in `q.size`), with no name or build-id
    // buffers; it lives for the call.
    let rc = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
    if rc == 0 {
        return Some(Some(q.vma_page_size as usize));
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENOENT) => Some(None),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_the_mappings_that_overlap() {
        let text = "\
1000-3000 rw-p 00000000 00:00 0
AnonHugePages:      2048 kB
3000-5000 rw-p 00000000 00:00 0
AnonHugePages:      4096 kB
9000-a000 rw-p 00000000 00:00 0
AnonHugePages:      8 kB
";
        assert_eq!(super::parse(text, 0x2000, 0x4000), 6144 << 10);
        assert_eq!(super::parse(text, 0x5000, 0x9000), 0);
        let first = |addr: usize| super::kib_fields(text, addr, addr + 1, "AnonHugePages:").next();
        assert_eq!(first(0x3000), Some(Some(4096)));
        assert_eq!(first(0x2fff), Some(Some(2048)));
        assert_eq!(first(0x8000), None);
    }

    /// The kernel's answer for one mapping is smaps' (where it has one),
    /// and an address nothing maps is `None` both ways.
    #[test]
    fn the_query_and_smaps_agree() {
        let heap = Box::new([0u8; 64]);
        let local = 0u8;
        for addr in [heap.as_ptr() as usize, &local as *const u8 as usize, 4096] {
            match super::query_page_size(addr) {
                Some(answer) => assert_eq!(answer, super::smaps_page_size(addr), "at {addr:#x}"),
                None => eprintln!("SKIP: PROCMAP_QUERY unavailable (Linux 6.11+)"),
            }
        }
    }
}

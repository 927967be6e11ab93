//! `/proc/PID/smaps`: how much of a range the kernel maps with PMD-sized
//! huge pages, and the page size of a (hugetlb) mapping.

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
pub fn kernel_page_size(addr: usize) -> Option<usize> {
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
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a < end && b > start;
                return None;
            }
        }
        let v = line.strip_prefix(key).filter(|_| inside)?;
        Some(v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
    })
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
}

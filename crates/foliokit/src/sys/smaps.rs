//! `/proc/PID/smaps`: how much of a range the kernel maps with PMD-sized
//! huge pages.

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

fn parse(text: &str, start: usize, end: usize) -> usize {
    let mut inside = false;
    let mut total = 0;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a < end && b > start;
                continue;
            }
        }
        if let (true, Some(v)) = (inside, line.strip_prefix("AnonHugePages:")) {
            let kib = v.trim().trim_end_matches("kB").trim().parse::<usize>();
            total += kib.unwrap_or(0) << 10;
        }
    }
    total
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
    }
}

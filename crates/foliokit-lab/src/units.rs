//! Byte sizes as people write them, and what the machine has free: the
//! experiments name their shapes in titles and notes with these, and the
//! CLI parses its options with the same units.

/// Formats bytes the way the options take them.
pub fn show_size(bytes: usize) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Bytes to read, not to type: "23.1G" for quantities that are not round.
pub fn approx_size(bytes: usize) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift {
            return format!("{:.1}{unit}", bytes as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{bytes}B")
}

/// Bytes free for new anonymous memory, from /proc/meminfo.
pub fn mem_available() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(show_size(2 << 20), "2M");
        assert_eq!(show_size(1000), "1000");
        assert_eq!(approx_size(24_268_680 << 10), "23.1G");
        assert_eq!(approx_size(1536), "1.5K");
    }
}

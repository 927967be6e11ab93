//! Argument types shared by the subcommands.

use clap::{Args, ValueEnum};

/// Parses a byte size: `4096`, `4K`, `512M`, `1G` (binary units; a trailing
/// `B` or `iB` is accepted).
/// [`foliokit::lazy::firecracker::BLOCK`] as the command line writes it
/// (`uffd-handler --block`, `bench restore --handler-block`).
pub const HANDLER_BLOCK: &str = "256K";

pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    // Any case: 4kb, 4KiB, 2mib (the suffix is ASCII, so the byte cut is
    // on a char boundary).
    let lower = t.to_ascii_lowercase();
    let t = if lower.ends_with("ib") {
        &t[..t.len() - 2]
    } else if lower.ends_with('b') {
        &t[..t.len() - 1]
    } else {
        t
    };
    let (digits, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: usize = digits.parse().map_err(|_| {
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            format!("'{text}' is too large")
        } else {
            format!("'{text}' is not a size (examples: 4096, 4K, 512M, 1G)")
        }
    })?;
    let bytes = n
        .checked_mul(1usize << shift)
        .ok_or_else(|| format!("'{text}' is too large"))?;
    if bytes == 0 {
        return Err("a size must be greater than zero".into());
    }
    Ok(bytes)
}

pub use foliokit_lab::units::{approx_size, show_size};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns with the run's notes, for a terminal.
    Table,
    /// Every figure and note, for `foliokit compare` and scripts.
    Json,
    /// One row per line under a header, for spreadsheets.
    Csv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReuseArg {
    /// The caller reads the data again soon (auto keeps it in cache if it fits).
    Reread,
    /// Write-once data (auto streams it past the cache).
    Stream,
}

impl From<ReuseArg> for foliokit::Reuse {
    fn from(r: ReuseArg) -> Self {
        match r {
            ReuseArg::Reread => foliokit::Reuse::Reread,
            ReuseArg::Stream => foliokit::Reuse::Stream,
        }
    }
}

/// Options every `bench` experiment shares (named after `perf bench mem`).
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Total bytes per loop, e.g. 1G, 512M.
    #[arg(short, long, default_value = "1G", value_parser = parse_size)]
    pub size: usize,
    /// Folio size(s), comma-separated: 4K 16K 64K 256K 1M 2M 1G.
    #[arg(short, long, default_value = "2M", value_delimiter = ',', value_parser = parse_size)]
    pub page: Vec<usize>,
    /// Strategies: name[,name...], `all`, or `help` to list them.
    #[arg(short, long, default_value = "all")]
    pub function: String,
    /// Timed loops per strategy (after one verified warm-up).
    #[arg(short, long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub loops: u32,
    /// Channel counts: each batch is spread across this many persistent CPU
    /// workers (strategies that cannot be split, like butterfly or the mc
    /// variants, stay on one).
    #[arg(short = 't', long, default_value = "1", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=256))]
    pub channels: Vec<u32>,
    /// Whether auto should expect the data to be re-read.
    #[arg(long, value_enum, default_value = "reread")]
    pub reuse: ReuseArg,
    /// Skip the same-run limit probes (streaming read, write of zeros and
    /// of other bytes) that give every row its `% limit`.
    #[arg(long)]
    pub no_limits: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_handler_block_argument_is_the_library_default() {
        assert_eq!(
            super::parse_size(super::HANDLER_BLOCK),
            Ok(foliokit::lazy::firecracker::BLOCK)
        );
    }

    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999T").is_err());
        for t in ["4kb", "4KB", "4kib", "4KIB", "4KiB"] {
            assert_eq!(parse_size(t), Ok(4096), "{t}");
        }
        assert_eq!(parse_size("2mib"), Ok(2 << 20));
        assert!(parse_size("99999999999999999999G")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size("4 G").unwrap_err().contains("not a size"));
    }
}

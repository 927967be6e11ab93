//! `foliokit bench migrate`: the options of seed 001's tables
//! (`foliokit_lab::migrate` runs them) and their table.

use clap::Args;
use foliokit::migrate::Path;
use foliokit_lab::measure::Stats;
use foliokit_lab::migrate::phases::PhasesMs;
use foliokit_lab::migrate::{self, MigratePlan, MigrateRow};
use std::time::Duration;

use crate::args::{parse_size, show_size, Format};
use crate::report::{pm, TableRow};
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// Bytes migrated per run (seed 001: 1G).
    #[arg(short, long, default_value = "1G", value_parser = parse_size)]
    pub size: usize,
    /// Folio sizes for table 1 (mTHP sizes are enabled per row when root).
    #[arg(short, long, default_value = "4K,16K,64K,256K,1M,2M", value_delimiter = ',', value_parser = parse_size)]
    pub page: Vec<usize>,
    /// Copy channel counts.
    #[arg(short = 't', long, default_value = "1,2", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=256))]
    pub channels: Vec<u32>,
    /// Batch size in pages for tables 1 and 3 (seed 001 found 8192-16384
    /// best for 2M folios; the kernel's NR_MAX_BATCHED_MIGRATION is 512).
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    pub table_batch: u64,
    /// Batch sizes in pages for table 2.
    #[arg(
        short,
        long,
        default_value = "512,1024,2048,4096,8192,16384,32768,65536,131072,262144",
        value_delimiter = ','
    )]
    pub batch: Vec<usize>,
    /// Runs per configuration.
    #[arg(short, long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub loops: u32,
    /// Also let a first-folio latency budget pick the batch (e.g. 500us, 2ms).
    #[arg(long, value_parser = parse_duration)]
    pub latency_budget: Option<Duration>,
    /// Which tables: 1, 2, 3, 4 (comma-separated). Table 4's mover is
    /// another process (a tiering agent's view), with the target's
    /// longest stall.
    #[arg(long, default_value = "1,2,3,4", value_delimiter = ',')]
    pub tables: Vec<u8>,
    /// Target NUMA node (default: the highest-numbered online node).
    #[arg(long)]
    pub node: Option<u32>,
    /// Node the source is put on before every run (default: the lowest
    /// online node other than the target). Without --node, table 3 runs
    /// seed 000's directions (CPU node to CPU node, to and from each
    /// memory-only node); --node limits it to one direction.
    #[arg(long)]
    pub from: Option<u32>,
    /// The path the relocation rows of tables 1-2 ask for: `relocate`,
    /// or `auto` (relocation where it keeps every folio and precondition,
    /// the kernel path for the rest), or `kernel`.
    #[arg(long, value_enum, default_value = "relocate")]
    pub path: PathArg,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    #[command(flatten)]
    pub guest: crate::guest::GuestArgs,
}

/// `--path`, as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PathArg {
    /// Relocation, or the row says why it was refused.
    Relocate,
    /// Relocation where it can, the kernel path elsewhere.
    Auto,
    /// move_pages(2).
    Kernel,
}

impl PathArg {
    fn path(self) -> Path {
        match self {
            PathArg::Relocate => Path::Relocate,
            PathArg::Auto => Path::Auto,
            PathArg::Kernel => Path::Kernel,
        }
    }
}

/// Parses `500us`, `2ms`, `1s`.
pub fn parse_duration(t: &str) -> Result<Duration, String> {
    let t = t.trim();
    let (num, unit) = t.split_at(t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len()));
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{t}' is not a duration (examples: 500us, 2ms, 1s)"))?;
    let secs = match unit {
        "us" | "µs" => v / 1e6,
        "ms" => v / 1e3,
        "s" | "" => v,
        _ => return Err(format!("unknown unit in '{t}' (use us, ms or s)")),
    };
    // NaN fails the comparison too; try_from keeps a budget past
    // Duration::MAX an error instead of a panic.
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("'{t}': a latency budget must be positive"));
    }
    let d = Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("'{t}' is too long for a latency budget"))?;
    // Below a nanosecond it rounds to nothing.
    if d.is_zero() {
        return Err(format!("'{t}': a latency budget must be positive"));
    }
    Ok(d)
}

impl TableRow for MigrateRow {
    fn columns() -> &'static [&'static str] {
        &[
            "table",
            "direction",
            "function",
            "folio",
            "channels",
            "batch",
            "moved",
            "GB/s median ± sd",
            "first folio µs (p50/p99)",
            "1-folio copy µs",
            "target stall µs",
            "speedup",
            "% copy limit",
            "prepare ms",
            "checks ms",
            "out ms",
            "copy ms",
            "in ms",
            "finish ms",
            "ahead ms",
            "obtained",
        ]
    }

    fn spread(&self) -> Option<&Stats> {
        self.gbps.as_ref()
    }

    fn cells(&self) -> Vec<String> {
        let dash = || "-".to_string();
        let mut cells = vec![
            self.table.to_string(),
            self.direction.clone(),
            self.function.clone(),
            show_size(self.folio_size),
            self.channels.to_string(),
            self.batch_pages.to_string(),
            self.pages_moved.to_string(),
            self.gbps
                .as_ref()
                .map_or_else(|| self.note.clone().unwrap_or_else(dash), |g| pm(g, 2)),
            self.first_folio_us
                .map_or_else(dash, |l| format!("{:.0} / {:.0}", l.median, l.p99)),
            self.folio_copy_us.map_or_else(dash, |u| format!("{u:.0}")),
            self.target_stall_us
                .map_or_else(dash, |l| format!("{:.0} / {:.0}", l.median, l.p99)),
            self.speedup.map_or_else(dash, |s| format!("{s:.2}x")),
            crate::report::pct(self.of_copy_limit),
        ];
        // Per run, summed over its batches (median over runs).
        let phase = |f: fn(&PhasesMs) -> f64| {
            self.phases
                .as_ref()
                .map_or_else(dash, |p| format!("{:.1}", f(p)))
        };
        cells.extend([
            phase(|p| p.prepare_ms),
            phase(|p| p.checks_ms),
            phase(|p| p.out_ms),
            phase(|p| p.copy_ms),
            phase(|p| p.in_ms),
            phase(|p| p.finish_ms),
            phase(|p| p.ahead_ms),
            self.obtained.clone(),
        ]);
        cells
    }
}

/// Prints the experiment's report (or runs it in a guest kernel).
pub fn run(a: MigrateArgs) -> Result<(), CliError> {
    if a.guest.kernel.is_some() {
        // The guest only needs somewhere to leave its start mark.
        let dir = std::env::temp_dir().join(format!("foliokit-guest-{}", std::process::id()));
        let r = crate::guest::run(&a.guest, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        return r;
    }
    measure(a)
}

#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// Bytes to map.
    #[arg(long)]
    pub size: usize,
    /// Folio size to ask for (2M: THP; 4K: base pages).
    #[arg(long)]
    pub folio: usize,
    /// Bytes at the start of the buffer the loop writes (default: all);
    /// the rest is written once and then left idle (cold).
    #[arg(long)]
    pub hot: Option<usize>,
}

/// The target process of table 4 (`foliokit __target`): see
/// `foliokit_lab::migrate::mover`.
pub fn target(a: TargetArgs) -> Result<(), CliError> {
    Ok(foliokit_lab::migrate::mover::target(
        a.size, a.folio, a.hot,
    )?)
}

/// Runs the tables and prints their report.
fn measure(a: MigrateArgs) -> Result<(), CliError> {
    let plan = MigratePlan {
        size: a.size,
        page: a.page,
        channels: a.channels.iter().map(|&c| c as usize).collect(),
        table_batch: a.table_batch as usize,
        batch: a.batch,
        loops: a.loops,
        latency_budget: a.latency_budget,
        tables: a.tables,
        node: a.node,
        from: a.from,
        path: a.path.path(),
    };
    super::show(migrate::run(&plan, &super::bars())?, a.format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("2ms"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0ms").is_err());
        assert!(parse_duration("3h").is_err());
        assert!(parse_duration("fast").is_err());
        // Past Duration::MAX, negative, NaN, infinite, below a nanosecond:
        // errors, not panics.
        assert!(parse_duration("100000000000000000000s").is_err());
        assert!(parse_duration("1e300").is_err());
        assert!(parse_duration("-5ms").is_err());
        assert!(parse_duration("NaN").is_err());
        assert!(parse_duration("inf").is_err());
        assert!(parse_duration("0.0000001us").is_err());
    }
}

//! `foliokit bench fault`: `perf bench mem mmap` (seed 002's demand-fault
//! experiment) — map a region, fault every page in, unmap — by page size,
//! fault method and thread count.

use clap::Args;
use foliokit_lab::fault::{self, FaultPlan, FaultRow};
use foliokit_lab::measure::Stats;

use crate::args::{parse_size, show_size, Format};
use crate::report::{pct, pm, times, TableRow};
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct FaultArgs {
    /// Bytes mapped and faulted per loop.
    #[arg(short, long, default_value = "1G", value_parser = parse_size)]
    pub size: usize,
    /// Page size(s): 4K, 2M (THP), 1G (hugetlb).
    #[arg(short, long, default_value = "2M", value_delimiter = ',', value_parser = parse_size)]
    pub page: Vec<usize>,
    /// demand (touch one byte per page) and/or populate (MADV_POPULATE_WRITE
    /// per 2 MiB chunk), comma-separated.
    #[arg(short, long, default_value = "demand,populate", value_delimiter = ',')]
    pub function: Vec<String>,
    /// Timed loops after the first-touch pass.
    #[arg(short, long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub loops: u32,
    /// Touch a random offset within each page instead of its first byte.
    #[arg(short, long)]
    pub random: bool,
    /// Thread counts (channels), comma-separated.
    #[arg(short, long, default_value = "1", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Vec<u32>,
    /// Skip the same-run limit probes (streaming write of zeros etc. over a
    /// faulted buffer of the same size, on the same thread count).
    #[arg(long)]
    pub no_limits: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

impl TableRow for FaultRow {
    fn columns() -> &'static [&'static str] {
        &[
            "page",
            "function",
            "threads",
            "first touch GB/s",
            "GB/s median ± sd",
            "speedup",
            "% limit",
        ]
    }

    fn spread(&self) -> Option<&Stats> {
        Some(&self.gbps)
    }

    fn cells(&self) -> Vec<String> {
        vec![
            show_size(self.folio_size),
            self.function.clone(),
            self.channels.to_string(),
            format!("{:.2}", self.first_touch_gbps),
            pm(&self.gbps, 2),
            times(self.speedup),
            pct(self.limit.of_limit),
        ]
    }
}

/// Runs the experiment and prints its report.
pub fn run(a: FaultArgs) -> Result<(), CliError> {
    let plan = FaultPlan {
        size: a.size,
        page: a.page,
        function: a.function,
        loops: a.loops as usize,
        random: a.random,
        threads: a.threads.iter().map(|&t| t as usize).collect(),
        limits: !a.no_limits,
    };
    super::show(fault::run(&plan, &super::bars())?, a.format)
}

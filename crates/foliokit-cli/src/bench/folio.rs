//! `foliokit bench copy` (seed 000) and `bench clear` (seed 002): their
//! options, and the table of the one strategy bench both run
//! (`foliokit_lab::copy_clear`).

use clap::Args;
use foliokit_lab::copy_clear::{self, ClearBench, CopyBench, FolioOp, Row, StrategyPlan};
use foliokit_lab::measure::{CacheMode, Stats};

use super::select;
use crate::args::{show_size, BenchArgs};
use crate::report::{pct, pm, times, TableRow};
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct CopyArgs {
    #[command(flatten)]
    pub common: BenchArgs,
    /// Flush the source from the cache before every loop (seed 000's method; the default).
    #[arg(long, conflicts_with = "hot")]
    pub evict: bool,
    /// Leave buffers in cache between loops (measures cache-resident copies).
    #[arg(long)]
    pub hot: bool,
    /// Also measure each strategy's machine-check-safe variant (`<name>-mc`)
    /// beside it, where one exists (movsb, avx2, nt, auto).
    #[arg(long)]
    pub mc: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ClearArgs {
    #[command(flatten)]
    pub common: BenchArgs,
    /// Flush the destination from the cache before every loop.
    #[arg(long, conflicts_with = "hot")]
    pub evict: bool,
    /// Leave the destination in cache between loops (the default).
    #[arg(long)]
    pub hot: bool,
    /// Page index within each folio that butterfly converges on (the
    /// faulting page; perf bench's demand faults touch page 0).
    #[arg(long, default_value_t = 0)]
    pub hint_page: usize,
}

/// Runs `op` on the strategies and shape the shared options name, and
/// prints its report (`-f help` prints the strategies instead).
fn measure<O: FolioOp>(op: O, c: &BenchArgs, evict: bool) -> Result<(), CliError> {
    let Some(selection) = select::<O::S>(&c.function)? else {
        return Ok(());
    };
    let plan = StrategyPlan {
        selection,
        size: c.size,
        folio_sizes: c.page.clone(),
        loops: c.loops as usize,
        channels: c.channels.iter().map(|&t| t as usize).collect(),
        reuse: c.reuse.into(),
        limits: !c.no_limits,
        cache: if evict {
            CacheMode::Evict
        } else {
            CacheMode::Hot
        },
    };
    super::show(copy_clear::run(&op, &plan, &super::bars())?, c.format)
}

/// `bench copy`: the source is evicted unless `--hot`.
pub fn copy(a: CopyArgs) -> Result<(), CliError> {
    measure(CopyBench { mc: a.mc }, &a.common, !a.hot)
}

/// `bench clear`: the destination stays in cache unless `--evict`.
pub fn clear(a: ClearArgs) -> Result<(), CliError> {
    let op = ClearBench {
        hint_page: a.hint_page,
    };
    measure(op, &a.common, a.evict)
}

impl TableRow for Row {
    fn columns() -> &'static [&'static str] {
        &[
            "folio",
            "function",
            "ch",
            "ran",
            "GB/s median ± sd",
            "speedup",
            "% limit",
        ]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            show_size(self.folio_size),
            self.function.clone(),
            self.channels.to_string(),
            if self.resolved == self.function {
                String::new()
            } else {
                self.resolved.clone()
            },
            pm(&self.gbps, 2),
            times(self.speedup),
            if self.limit_missed {
                "missed".into()
            } else {
                pct(self.limit.of_limit)
            },
        ]
    }

    fn csv_columns() -> &'static [&'static str] {
        &[
            "folio_size",
            "function",
            "resolved",
            "channels",
            "gbps_mean",
            "gbps_stdev",
            "gbps_median",
            "runs",
            "speedup",
            "limit_gbps",
            "of_limit",
        ]
    }

    fn csv(&self) -> Vec<String> {
        let g = &self.gbps;
        vec![
            self.folio_size.to_string(),
            self.function.clone(),
            self.resolved.clone(),
            self.channels.to_string(),
            format!("{:.3}", g.mean),
            format!("{:.3}", g.stdev),
            format!("{:.3}", g.median),
            g.runs.to_string(),
            format!("{:.3}", self.speedup),
            self.limit
                .limit_gbps
                .map_or_else(String::new, |x| format!("{x:.3}")),
            self.limit
                .of_limit
                .map_or_else(String::new, |x| format!("{x:.3}")),
        ]
    }

    fn spread(&self) -> Option<&Stats> {
        Some(&self.gbps)
    }
}

//! `foliokit bench mremap`: seed 004's test program once per mTHP size (and
//! the 4 KiB control), plus the kernel selftest's 1 GiB mremap at PTE, PMD
//! and PUD alignment.

use clap::Args;
use foliokit_lab::measure::Stats;
use foliokit_lab::remap::{self, MremapRow, RemapPlan};

use crate::args::{show_size, Format};
use crate::report::{pm, times, TableRow};
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct MremapArgs {
    /// Iterations of mmap, memset, mremap, munmap per timed loop (seed 004: 10000).
    #[arg(short = 'n', long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub iterations: u32,
    /// Timed loops per folio size (and per alignment case).
    #[arg(short, long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub loops: u32,
    /// Skip the 1 GiB PTE/PMD/PUD mremap cases.
    #[arg(long)]
    pub no_align: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

impl TableRow for MremapRow {
    fn columns() -> &'static [&'static str] {
        &["folio", "case", "obtained", "time median ± sd", "speedup"]
    }

    fn spread(&self) -> Option<&Stats> {
        Some(&self.secs)
    }

    fn cells(&self) -> Vec<String> {
        let (case, time) = match &self.alignment {
            Some(a) => (
                format!("1G mremap, {a}-aligned"),
                format!("{} ms", pm(&scale(&self.secs, 1e3), 3)),
            ),
            None => (
                "mmap+memset+mremap+munmap".to_string(),
                format!("{} s", pm(&self.secs, 3)),
            ),
        };
        vec![
            if self.folio_size == 0 {
                "-".into()
            } else {
                show_size(self.folio_size)
            },
            case,
            self.obtained.clone(),
            time,
            times(self.speedup),
        ]
    }
}

fn scale(s: &Stats, k: f64) -> Stats {
    Stats {
        mean: s.mean * k,
        stdev: s.stdev * k,
        median: s.median * k,
        min: s.min * k,
        max: s.max * k,
        runs: s.runs,
    }
}

/// Runs the experiment and prints its report.
pub fn run(a: MremapArgs) -> Result<(), CliError> {
    let plan = RemapPlan {
        iterations: a.iterations,
        loops: a.loops as usize,
        align: !a.no_align,
    };
    super::show(remap::run(&plan, &super::bars())?, a.format)
}

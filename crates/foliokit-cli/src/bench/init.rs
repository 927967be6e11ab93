//! `foliokit bench init`: seed 003's write-once initialisation of a
//! memmap-like array — field by field, template + memcpy, template +
//! streaming stores + one drain, each template form on a byte array and on
//! a typed one — first pass vs rebinds, and what each variant costs whatever
//! else was in the cache.

use clap::Args;
use foliokit_lab::init::{self, InitPlan, InitRow, VARIANTS};
use foliokit_lab::measure::Stats;

use crate::args::{parse_size, show_size, Format};
use crate::report::{pct, pm, times, TableRow};
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct InitArgs {
    /// Bytes of records initialised per pass.
    #[arg(short, long, default_value = "1G", value_parser = parse_size)]
    pub size: usize,
    /// Bytes per record: a multiple of 16 (64 is a struct page); the typed
    /// variants run for 16 to 256.
    #[arg(short = 'S', long, default_value = "64", value_parser = parse_size)]
    pub record: usize,
    /// Variants: field, template-memcpy, template-nt (comma-separated), all, or help.
    #[arg(short, long, default_value = "all")]
    pub function: String,
    /// Passes per variant: the first (fresh memory, faults included, like a
    /// first bind) and the rest (rebinds).
    #[arg(short, long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub loops: u32,
    /// Skip the same-run limit probes (streaming write of non-zero bytes
    /// etc. over the array) that give every row its `% limit`.
    #[arg(long)]
    pub no_limits: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

impl TableRow for InitRow {
    fn columns() -> &'static [&'static str] {
        &[
            "record",
            "function",
            "first pass ms",
            "rebind ms median ± sd",
            "GB/s",
            "victim re-read µs",
            "speedup",
            "% limit",
        ]
    }

    fn spread(&self) -> Option<&Stats> {
        Some(&self.rebind_ms)
    }

    fn cells(&self) -> Vec<String> {
        vec![
            show_size(self.record_size),
            self.function.clone(),
            format!("{:.1}", self.first_pass_ms),
            pm(&self.rebind_ms, 1),
            format!("{:.2}", self.rebind_gbps),
            format!("{:.0}", self.victim_reread_us.median),
            times(self.speedup),
            pct(self.limit.of_limit),
        ]
    }
}

/// Runs the experiment and prints its report.
pub fn run(a: InitArgs) -> Result<(), CliError> {
    if a.function.trim() == "help" {
        println!("init variants (-f name[,name...] | all):");
        for (n, d) in VARIANTS {
            println!("  {n:<16} {d}");
        }
        return Ok(());
    }
    let plan = InitPlan {
        size: a.size,
        record: a.record,
        function: a.function,
        loops: a.loops as usize,
        limits: !a.no_limits,
    };
    super::show(init::run(&plan, &super::bars())?, a.format)
}

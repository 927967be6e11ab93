//! `foliokit bench restore`: guest RAM restored from a snapshot file,
//! eagerly (read(2), mmap+memcpy, foliokit's mc copy over channels) and
//! lazily (userfaultfd with a background fill), with the same-run copy
//! limit. The experiment lives in `foliokit_lab::restore`.

use clap::Args;
use foliokit_lab::restore::{self, RestorePlan, RestoreRow};
use std::time::Duration;

use crate::args::{parse_size, Format};
use crate::report::{pct, TableRow};
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    /// Guest RAM bytes (2 MiB THP, or hugetlb pages), a multiple of 2M.
    #[arg(short, long, default_value = "4G", value_parser = parse_size)]
    pub size: usize,
    /// Copy channels of the foliokit rows.
    #[arg(short = 't', long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub channels: u32,
    /// Timed passes (rounded up to a multiple of the rows, which keeps the
    /// order design balanced).
    #[arg(short, long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub loops: u32,
    /// The lazy fill's latency budget, microseconds.
    #[arg(long, default_value_t = foliokit::tune::LAZY_LATENCY_BUDGET.as_micros() as u64)]
    pub budget_us: u64,
    /// Lazy: serve faults beside the background batch in flight instead of
    /// cutting it short (a fault waits for its own folio only; costs
    /// throughput where the channels already use every CPU).
    #[arg(long)]
    pub serve_faults_during_batches: bool,
    /// Restore from a cold file: drop it from the page cache before every
    /// restore (root only).
    #[arg(long)]
    pub cold: bool,
    /// Guest RAM of 2 MiB hugetlb pages instead of THP: the pool is grown
    /// for the run where it is short (root only). The lazy fill installs
    /// hugetlb pages with UFFDIO_COPY, which skips the kernel's zeroing.
    #[arg(long)]
    pub hugetlb: bool,
    /// Share of the snapshot's folios that are zero, left as holes (0 to
    /// below 1): above 0, a second snapshot with that share zero is
    /// restored too (rows `..., zero share`), and the footer gives each
    /// one's time until all resident over its twin's with none zero.
    #[arg(long, default_value_t = 0.0)]
    pub zero_fraction: f64,
    /// Write the zero share's folios as bytes of zeros instead of holes,
    /// as a snapshot written by plain writes is (Firecracker's memory
    /// file): foliokit then finds them by reading each page until its
    /// first nonzero byte.
    #[arg(long, requires = "zero_fraction")]
    pub dense_zeros: bool,
    /// Leave out the external-handler rows. By default guest memory also
    /// lives in a second process that plays Firecracker (maps it, makes
    /// and registers the userfaultfd, sends it over a socket; two vCPU
    /// threads touch pages and check every page at the end), served by
    /// this one: `handler: foliokit` (the `uffd-handler` fill, the vCPUs
    /// touching one random page of every 2 MiB), `handler: foliokit, no
    /// touch` (time until every page is in), and `handler: one fault at a
    /// time` (a thread copying the faulting page with UFFDIO_COPY, as
    /// Firecracker's example handlers do, the vCPUs touching every page).
    #[arg(long)]
    pub no_handler_rows: bool,
    /// The block the external handler rows install around a fault in
    /// 4 KiB guest memory (`uffd-handler --block`): smaller blocks cut the
    /// background fill finer, so a touch waits less behind it, at some
    /// cost to the fill's rate.
    #[arg(long, value_parser = crate::args::parse_size, default_value = crate::args::HANDLER_BLOCK)]
    pub handler_block: usize,
    /// Directory for the snapshot file (removed at once; the bench keeps it open).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: std::path::PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

fn ms(s: f64) -> String {
    if s < 0.01 {
        format!("{:.3}", s * 1e3)
    } else {
        format!("{:.1}", s * 1e3)
    }
}

fn us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.0}"))
}

impl TableRow for RestoreRow {
    fn columns() -> &'static [&'static str] {
        &[
            "restore",
            "vCPUs run after ms",
            "touch p50 µs",
            "touch p99 µs",
            "all resident ms",
            "GB/s median ± sd",
            "% limit",
            "faulted/filled pages",
            "THP",
        ]
    }

    fn csv_columns() -> &'static [&'static str] {
        &[
            "function",
            "start_ms",
            "touch_p50_us",
            "touch_p99_us",
            "touch_p99_pooled_us",
            "resident_ms",
            "gbps",
            "of_limit",
            "faulted_pages",
            "filled_pages",
            "thp_share",
        ]
    }

    fn spread(&self) -> Option<&foliokit_lab::measure::Stats> {
        Some(&self.gbps)
    }

    fn cells(&self) -> Vec<String> {
        let lazy = self.touch_p50_us.is_some();
        vec![
            self.function.clone(),
            ms(self.start_secs.median),
            us(self.touch_p50_us),
            us(self.touch_p99_us),
            ms(self.resident_secs.median),
            format!("{:.2} ± {:.2}", self.gbps.median, self.gbps.stdev),
            pct(self.share.is_finite().then_some(self.share)),
            if lazy {
                format!("{}/{}", self.faulted_pages, self.filled_pages)
            } else {
                "-".into()
            },
            format!("{:.0}%", self.thp_share * 100.0),
        ]
    }

    fn csv(&self) -> Vec<String> {
        vec![
            self.function.clone(),
            format!("{}", self.start_secs.median * 1e3),
            self.touch_p50_us.map_or(String::new(), |x| x.to_string()),
            self.touch_p99_us.map_or(String::new(), |x| x.to_string()),
            self.touch_p99_pooled_us
                .map_or(String::new(), |x| x.to_string()),
            format!("{}", self.resident_secs.median * 1e3),
            format!("{}", self.gbps.median),
            format!("{}", self.share),
            self.faulted_pages.to_string(),
            self.filled_pages.to_string(),
            format!("{}", self.thp_share),
        ]
    }
}

/// Runs the experiment and prints its report.
pub fn run(a: RestoreArgs) -> Result<(), CliError> {
    let plan = RestorePlan {
        size: a.size,
        channels: a.channels as usize,
        loops: a.loops as usize,
        cold: a.cold,
        budget: Duration::from_micros(a.budget_us),
        dir: a.dir.clone(),
        serve_during_batches: a.serve_faults_during_batches,
        hugetlb: a.hugetlb,
        zero_fraction: a.zero_fraction,
        dense_zeros: a.dense_zeros,
        vmm_exe: if a.no_handler_rows {
            None
        } else {
            Some(std::env::current_exe()?)
        },
        vmm_wait: None,
        handler_block: a.handler_block,
    };
    super::show(restore::report(&plan, &super::bars())?, a.format)
}

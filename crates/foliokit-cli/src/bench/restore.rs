//! `foliokit bench restore`: guest RAM restored from a snapshot file,
//! eagerly (read(2), mmap+memcpy, foliokit's mc copy over channels) and
//! lazily (userfaultfd with a background fill), with the same-run copy
//! limit. The experiment lives in `foliokit_lab::restore`.

use clap::Args;
use foliokit::mem::system::is_root;
use foliokit_lab::restore::{run as run_restore, RestorePlan, RestoreRow};
use serde_json::json;
use std::time::Duration;

use crate::args::{parse_size, show_size, Format};
use crate::progress::bar;
use crate::report::{pct, Report, TableRow};
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    /// Guest RAM bytes (2 MiB THP), a multiple of 2M.
    #[arg(short, long, default_value = "4G", value_parser = parse_size)]
    pub size: usize,
    /// Copy channels of the foliokit rows.
    #[arg(short = 't', long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub channels: u32,
    /// Timed passes (rounded up to whole balanced designs of 8).
    #[arg(short, long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub loops: u32,
    /// The lazy fill's latency budget, microseconds.
    #[arg(long, default_value_t = foliokit::tune::LAZY_LATENCY_BUDGET.as_micros() as u64)]
    pub budget_us: u64,
    /// Lazy: serve faults beside the background batch in flight instead of
    /// after it (a fault waits for its own folio only; costs throughput
    /// where the channels already use every CPU).
    #[arg(long)]
    pub serve_faults_during_batches: bool,
    /// Restore from a cold file: drop it from the page cache before every
    /// restore (root only).
    #[arg(long)]
    pub cold: bool,
    /// Directory for the snapshot file (removed at once; the bench keeps it open).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: std::path::PathBuf,
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
            format!("{}", self.resident_secs.median * 1e3),
            format!("{}", self.gbps.median),
            format!("{}", self.share),
            self.faulted_pages.to_string(),
            self.filled_pages.to_string(),
            format!("{}", self.thp_share),
        ]
    }
}

/// Prints the experiment's report.
pub fn run(a: RestoreArgs) -> Result<(), CliError> {
    let format = a.format;
    super::print(report(a)?, format)
}

/// Runs the experiment.
pub fn report(a: RestoreArgs) -> Result<Option<Report<RestoreRow>>, CliError> {
    if a.cold && !is_root() {
        return Err(
            "--cold drops the snapshot from the page cache before every restore: run as root"
                .into(),
        );
    }
    let plan = RestorePlan {
        size: a.size,
        channels: a.channels as usize,
        loops: a.loops as usize,
        cold: a.cold,
        budget: Duration::from_micros(a.budget_us),
        dir: a.dir.clone(),
        serve_during_batches: a.serve_faults_during_batches,
    };
    let order = foliokit_lab::measure::Order::new(8, plan.loops);
    let pb = bar(8 * (order.passes + 1), "restore");
    let r = run_restore(plan.clone(), || pb.inc(1))?;
    pb.finish_and_clear();
    let title = format!(
        "restore: {} guest of 2 MiB THP from a snapshot in {}, {} channels, budget {} µs, faults {}",
        show_size(a.size),
        if a.cold {
            "a cold file"
        } else {
            "the page cache"
        },
        a.channels,
        a.budget_us,
        if a.serve_faults_during_batches {
            "served beside the batch in flight"
        } else {
            "wait for the batch in flight"
        }
    );
    let params = json!({"size": a.size, "channels": a.channels, "loops": a.loops,
                        "budget_us": a.budget_us, "cold": a.cold,
                        "serve_during_batches": a.serve_faults_during_batches});
    let mut report = Report::<RestoreRow>::new("restore", title, params);
    report.rows = r.rows.clone();
    report.notes.extend(r.notes.iter().cloned());
    let row = |f: &str| r.rows.iter().find(|x| x.function == f);
    if let Some(l) = &r.limits {
        report.footer.push(format!(
            "copy limit {:.2} GB/s ({}; set by {}); the foliokit rows ran mc {}",
            l.gbps(),
            l.formula,
            l.set_by,
            r.strategy
        ));
    }
    if let Some(aa) = &r.aa {
        report.footer.push(aa.line(" (eager foliokit)"));
    }
    if let (Some(e), Some(z), Some(rd)) = (row("foliokit"), row("lazy"), row("read(2)")) {
        let budget = a.budget_us as f64;
        let folio_us = r.limits.as_ref().map_or(f64::NAN, |l| {
            (2 << 20) as f64 / (l.gbps() * (1u64 << 30) as f64) * 1e6
        });
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        let start = z.start_secs.median / e.resident_secs.median;
        let total = z.resident_secs.median / e.resident_secs.median;
        let vs_read = e.gbps.median / rd.gbps.median;
        let p99 = z.touch_p99_us.unwrap_or(f64::NAN);
        report.footer.push(format!(
            "targets: lazy start {:.2}% of eager foliokit (≤1%: {}); lazy all-resident {:.2}x eager foliokit (≤1.25x: {}); eager foliokit {:.2}x read(2) (≥2x: {}) and {} of the limit (≥70%: {}); lazy touch p99 {:.0} µs vs budget + one folio's copy {:.0} µs ({})",
            start * 100.0,
            verdict(start <= 0.01),
            total,
            verdict(total <= 1.25),
            vs_read,
            verdict(vs_read >= 2.0),
            pct(Some(e.share)),
            verdict(e.share >= 0.7),
            p99,
            budget + folio_us,
            verdict(p99 <= budget + folio_us),
        ));
    }
    report.footer.push(
        "vCPUs run after: eager rows when the copy ends, lazy when restore_lazy returns; touch: one random page of every folio, in random order, while the fill runs (each first touch of a folio not yet in waits for it)".into(),
    );
    report.footer.push(r.order.line());
    report.section("limits", &r.limits);
    report.section("aa", &r.aa);
    report.section("order", &r.order);
    Ok(Some(report))
}

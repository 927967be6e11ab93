//! `foliokit bench mremap`: seed 004's test program once per mTHP size (and
//! the 4 KiB control), plus the kernel selftest's 1 GiB mremap at PTE, PMD
//! and PUD alignment.

use clap::Args;
use foliokit::mem::system::{is_root, thp_state};
use foliokit_lab::measure::Stats;
use foliokit_lab::mthp::MthpSettings;
use foliokit_lab::remap::{mremap_1g, seed004_loop, Alignment, REGION};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;

use super::arm_interrupt_restore;
use crate::args::{show_size, Format};
use crate::progress::bar;
use crate::report::{pm, Report, TableRow};
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
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

#[derive(Debug, Clone, Serialize)]
pub struct MremapRow {
    /// "seed004" (the 1 MiB loop) or "mremap-1g" (the selftest cases).
    pub function: String,
    /// mTHP size under test (4096 for the control); 0 for the alignment cases.
    pub folio_size: usize,
    /// PTE, PMD or PUD for the alignment cases.
    pub alignment: Option<String>,
    /// Folios the kernel actually used, from /proc/kpageflags (root only).
    pub obtained: String,
    /// Seconds per timed loop (all iterations), or per mremap call.
    pub secs: Stats,
    /// The baseline's mean over this row's mean (4K for seed004, PTE for 1 GiB).
    pub speedup: f64,
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
            format!("{:.2}x", self.speedup),
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

/// Prints the experiment's report (`-f help` prints the strategies instead).
pub fn run(a: MremapArgs) -> Result<(), CliError> {
    let format = a.format;
    super::print(report(a)?, format)
}

/// Runs the experiment; `None` when the options only asked for help.
pub fn report(a: MremapArgs) -> Result<Option<Report<MremapRow>>, CliError> {
    let mut settings = MthpSettings::system();
    let before = settings.snapshot();
    let root = is_root();
    let top = thp_state().enabled.unwrap_or_default();
    // The sizes the test can use: mTHP sizes that fit in the 1 MiB region.
    let mut sizes: Vec<Option<usize>> = vec![None];
    sizes.extend(before.keys().copied().filter(|&s| s <= REGION).map(Some));
    let title = format!(
        "mremap: seed 004's loop ({} x mmap 1M at {:#x}, memset, mremap +1M, munmap) per mTHP size, {} loops",
        a.iterations,
        foliokit_lab::remap::HINT,
        a.loops
    );
    let params = json!({"iterations": a.iterations, "loops": a.loops, "region": REGION,
                        "hint": foliokit_lab::remap::HINT});
    let mut report = Report::<MremapRow>::new("mremap", title, params);
    let effective = |v: &str| if v == "inherit" { top.as_str() } else { v }.to_string();
    let runnable: Vec<Option<usize>> = if root {
        sizes
    } else {
        // Without root, use only what the current settings already give.
        let always: Vec<usize> = before
            .iter()
            .filter(|(_, v)| effective(v) == "always")
            .map(|(&s, _)| s)
            .collect();
        let (ok, skip): (Vec<_>, Vec<_>) = sizes.into_iter().partition(|s| match s {
            None => always.is_empty(),
            Some(s) => always == [*s],
        });
        for s in skip {
            report.notes.push(format!(
                "{}: skipped, changing mTHP settings needs root",
                s.map_or("4K control".into(), show_size)
            ));
        }
        ok
    };
    if !root {
        report.notes.push(
            "without root, mTHP settings cannot be read back per page (no kpageflags)".into(),
        );
    }
    let cases = if a.no_align { 0 } else { 3 };
    let pb = bar(
        runnable.len() * a.loops as usize + cases * a.loops as usize,
        "mremap",
    );
    let mut control = f64::NAN;
    for size in runnable {
        if root {
            settings.only(size)?;
            arm_interrupt_restore(&settings);
        }
        let (_, obtained) = seed004_loop(1, true)?; // warm-up, and the census
        let mut secs = Vec::new();
        for _ in 0..a.loops {
            secs.push(seed004_loop(a.iterations, false)?.0);
            pb.inc(1);
        }
        let s = Stats::of(&secs).expect("loops >= 1");
        if size.is_none() {
            control = s.mean;
        }
        report.rows.push(MremapRow {
            function: "seed004".into(),
            folio_size: size.unwrap_or(foliokit::batch::page_size()),
            alignment: None,
            obtained: obtained.unwrap_or_else(|| "unknown (needs root)".into()),
            secs: s,
            speedup: control / s.mean,
        });
    }
    settings.restore()?;
    arm_interrupt_restore(&settings);
    let after = settings.snapshot();
    let mut pte = f64::NAN;
    for align in [Alignment::Pte, Alignment::Pmd, Alignment::Pud]
        .into_iter()
        .take(cases)
    {
        let mut secs = Vec::new();
        for _ in 0..a.loops {
            secs.push(mremap_1g(align)?);
            pb.inc(1);
        }
        let s = Stats::of(&secs).expect("loops >= 1");
        if align == Alignment::Pte {
            pte = s.mean;
        }
        report.rows.push(MremapRow {
            function: "mremap-1g".into(),
            folio_size: 0,
            alignment: Some(format!("{align:?}").to_uppercase()),
            obtained: "4K pages".into(),
            secs: s,
            speedup: pte / s.mean,
        });
    }
    pb.finish_and_clear();
    let fmt = |m: &BTreeMap<usize, String>| {
        m.iter()
            .map(|(s, v)| format!("{}={v}", show_size(*s)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    report.header.push(format!("mTHP before: {}", fmt(&before)));
    report.footer.push(format!(
        "mTHP after:  {} ({})",
        fmt(&after),
        if after == before {
            "restored"
        } else {
            "DIFFERENT"
        }
    ));
    report.footer.push("speedup: the 4K control's mean over the row's (seed004); the PTE case's mean over the row's (1G)".into());
    report.footer.push(
        "seed 004 (Apple M3, arm64): 64K folios 1.9 s -> 1.2 s per 10,000 iterations with PTE batching (-37%)".into(),
    );
    report.section("sysfs_before", &before);
    report.section("sysfs_after", &after);
    report.section("sysfs_restored", after == before);
    if after != before {
        return Err("mTHP settings differ from before the run".into());
    }
    Ok(Some(report))
}

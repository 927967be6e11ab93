//! `foliokit bench copy`: seed 000's folio copy experiment.

use clap::Args;
use foliokit::{CopyStrategy, Strategy};
use foliokit_lab::hugetlb::PooledRegion;
use foliokit_lab::measure::{measure_copy, CacheMode, CopyCandidate, Plan};
use serde_json::json;

use super::{check_shape, select, StrategyTables};
use crate::args::{show_size, BenchArgs};
use crate::progress::bar;
use crate::report::{Report, Row};
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

/// Prints the experiment's report (`-f help` prints the strategies instead).
pub fn run(a: CopyArgs) -> Result<(), CliError> {
    let format = a.common.format;
    super::print(report(a)?, format)
}

/// Runs the experiment; `None` when the options only asked for help.
pub fn report(a: CopyArgs) -> Result<Option<Report<Row>>, CliError> {
    let c = &a.common;
    let Some(sel) = select::<CopyStrategy>(&c.function)? else {
        return Ok(None);
    };
    check_shape(c.size, &c.page, 2)?;
    let cache = if a.hot {
        CacheMode::Hot
    } else {
        CacheMode::Evict
    };
    let title = format!(
        "copy: {} per loop, {}, {} loops after a verified warm-up",
        show_size(c.size),
        match cache {
            CacheMode::Evict => "source evicted before each loop",
            CacheMode::Hot => "buffers left hot",
        },
        c.loops
    );
    let params = json!({
        "size": c.size, "folio_sizes": c.page, "loops": c.loops,
        "cache": cache, "reuse": foliokit::Reuse::from(c.reuse), "mc": a.mc, "channels": c.channels,
        "functions": sel.run.iter().map(|s| s.name()).collect::<Vec<_>>(),
    });
    let mut report = Report::<Row>::new("copy", title, params);
    let mut tables = StrategyTables::new(&sel, CopyStrategy::PerPage, &mut report);
    if a.mc && !c.channels.contains(&1) {
        report
            .notes
            .push("mc variants run on one channel only; add 1 to -t to measure them".into());
    }
    report.notes.extend(super::inline_note(c.size, &c.channels));
    let mut candidates = Vec::new();
    for &s in &sel.run {
        candidates.push(CopyCandidate::plain(s));
        if a.mc {
            if s.has_mc() {
                candidates.push(CopyCandidate::mc(s));
            } else {
                report
                    .notes
                    .push(format!("{} has no machine-check-safe variant", s.name()));
            }
        }
    }
    for &folio in &c.page {
        let ((mut src, mut dst), note) = super::with_mthp(folio, || {
            Ok((
                PooledRegion::new(c.size, folio)?,
                PooledRegion::new(c.size, folio)?,
            ))
        })?;
        src.as_mut_slice().fill(0x5A);
        report.notes.extend(note);
        tables.backing(folio, "src", &super::counted_backing(&src, folio));
        tables.backing(folio, "dst", &super::counted_backing(&dst, folio));
        for &t in &c.channels {
            let t = t as usize;
            let plan = Plan {
                folio_size: folio,
                loops: c.loops as usize,
                cache,
                reuse: c.reuse.into(),
                hint_page: 0,
                channels: t,
                limits: !c.no_limits,
            };
            let cands: Vec<CopyCandidate> = candidates
                .iter()
                .copied()
                .filter(|x| t == 1 || !x.mc)
                .collect();
            let label = format!("copy {} x{t}", show_size(folio));
            let pb = bar(
                (cands.len() + 3 * usize::from(plan.limits)) * (plan.loops + 1),
                &label,
            );
            let m = measure_copy(&src, &mut dst, &cands, &plan, || pb.inc(1))?;
            pb.finish_and_clear();
            tables.add(&mut report, &m, folio, t);
        }
    }
    // What spreading a batch across channels buys over the platform memcpy
    // on one thread: the comparison a user deciding on channels wants.
    let median = |f: &str, folio: usize, t: usize| {
        report
            .rows
            .iter()
            .find(|r| r.function == f && r.folio_size == folio && r.channels == t)
            .map(|r| r.gbps.median)
    };
    let most = c.channels.iter().copied().max().unwrap_or(1) as usize;
    if most > 1 {
        for &folio in &c.page {
            if let (Some(auto), Some(libc), Some(pp)) = (
                median("auto", folio, most),
                median("libc", folio, 1),
                median("per-page", folio, 1),
            ) {
                report.footer.push(format!(
                    "auto on {most} channels at {}: {:.2}x libc and {:.2}x per-page on one",
                    show_size(folio),
                    auto / libc,
                    auto / pp
                ));
            }
        }
    }
    tables.finish(&mut report);
    report.footer.push(
        "seed 000 (EPYC 9655 Zen 5, 2M folios, source evicted): folio_mc_copy 18.65 -> 38.03 GB/s (2.04x) with one bulk copy; Zen 3 folio_copy 13.03 -> 11.59 (0.89x: memcpy_orig vs rep movsq)"
            .into(),
    );
    Ok(Some(report))
}

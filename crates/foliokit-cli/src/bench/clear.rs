//! `foliokit bench clear`: seed 002's huge-page clearing, in user space.

use clap::Args;
use foliokit::{ClearStrategy, Strategy};
use foliokit_lab::hugetlb::PooledRegion;
use foliokit_lab::measure::{measure_clear, CacheMode, Plan};
use serde_json::json;

use super::{check_shape, select, StrategyTables};
use crate::args::{show_size, BenchArgs};
use crate::progress::bar;
use crate::report::{Report, Row};
use crate::CliError;

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

/// Prints the experiment's report (`-f help` prints the strategies instead).
pub fn run(a: ClearArgs) -> Result<(), CliError> {
    let format = a.common.format;
    super::print(report(a)?, format)
}

/// Runs the experiment; `None` when the options only asked for help.
pub fn report(a: ClearArgs) -> Result<Option<Report<Row>>, CliError> {
    let c = &a.common;
    let Some(sel) = select::<ClearStrategy>(&c.function)? else {
        return Ok(None);
    };
    check_shape(c.size, &c.page, 1)?;
    let page = foliokit::batch::page_size();
    if let Some(&folio) = c.page.iter().find(|&&f| a.hint_page >= f / page) {
        return Err(format!(
            "--hint-page {} is outside a {} folio of {} pages",
            a.hint_page,
            show_size(folio),
            folio / page
        )
        .into());
    }
    let cache = if a.evict {
        CacheMode::Evict
    } else {
        CacheMode::Hot
    };
    let title = format!(
        "clear: {} per loop, {}, butterfly converges on page {}, {} loops after a verified warm-up",
        show_size(c.size),
        match cache {
            CacheMode::Evict => "destination evicted before each loop",
            CacheMode::Hot => "no eviction",
        },
        a.hint_page,
        c.loops
    );
    let params = json!({
        "size": c.size, "folio_sizes": c.page, "loops": c.loops,
        "cache": cache, "reuse": foliokit::Reuse::from(c.reuse), "hint_page": a.hint_page,
        "functions": sel.run.iter().map(|s| s.name()).collect::<Vec<_>>(),
    });
    let mut report = Report::<Row>::new("clear", title, params);
    let mut tables = StrategyTables::new(&sel, ClearStrategy::Butterfly, &mut report);
    report.notes.extend(super::inline_note(c.size, &c.channels));
    for &folio in &c.page {
        let (mut dst, note) = super::with_mthp(folio, || Ok(PooledRegion::new(c.size, folio)?))?;
        report.notes.extend(note);
        tables.backing(folio, "dst", &super::counted_backing(&dst, folio));
        for &t in &c.channels {
            let t = t as usize;
            let plan = Plan {
                folio_size: folio,
                loops: c.loops as usize,
                cache,
                reuse: c.reuse.into(),
                hint_page: a.hint_page,
                channels: t,
                limits: !c.no_limits,
            };
            let run: Vec<ClearStrategy> = sel
                .run
                .iter()
                .copied()
                .filter(|&s| t == 1 || s != ClearStrategy::Butterfly)
                .collect();
            let label = format!("clear {} x{t}", show_size(folio));
            let pb = bar(
                (run.len() + 3 * usize::from(plan.limits)) * (plan.loops + 1),
                &label,
            );
            let m = measure_clear(&mut dst, &run, &plan, || pb.inc(1))?;
            pb.finish_and_clear();
            tables.add(&mut report, &m, folio, t);
        }
    }
    if c.channels.iter().any(|&t| t > 1) && sel.run.contains(&ClearStrategy::Butterfly) {
        report.notes.push(
            "butterfly runs on one channel only: it clears page by page around a hint page".into(),
        );
    }
    tables.finish(&mut report);
    report.footer.push(
        "seed 002 (EPYC 9J13 Genoa, kernel clearing on demand faults): 2MB pages 11.76 GB/s butterfly -> 23.58 sequential (+100%); 1GB pages 24.85 -> 25.40"
            .into(),
    );
    Ok(Some(report))
}

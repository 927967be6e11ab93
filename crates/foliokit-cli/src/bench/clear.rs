//! `foliokit bench clear`: seed 002's huge-page clearing, in user space.

use clap::Args;
use foliokit::measure::{measure_clear, CacheMode, Plan};
use foliokit::mem::Region;
use foliokit::ClearStrategy;
use serde_json::json;

use super::{baseline, check_shape, rows, select, skipped};
use crate::args::{show_size, BenchArgs};
use crate::machine::machine;
use crate::progress::bar;
use crate::report::{BackingNote, Report};
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

pub fn run(a: ClearArgs) -> Result<(), CliError> {
    let c = &a.common;
    let Some(sel) = select::<ClearStrategy>(&c.function)? else {
        return Ok(());
    };
    check_shape(c.size, &c.page, 1)?;
    let page = foliokit::batch::page_size();
    for &folio in &c.page {
        if a.hint_page >= folio / page {
            return Err(format!(
                "--hint-page {} is outside a {} folio of {} pages",
                a.hint_page,
                show_size(folio),
                folio / page
            )
            .into());
        }
    }
    let cache = if a.evict {
        CacheMode::Evict
    } else {
        CacheMode::Hot
    };
    let mut report = Report {
        experiment: "clear".into(),
        title: format!(
            "clear: {} per loop, {}, butterfly converges on page {}, {} loops after a verified warm-up",
            show_size(c.size),
            match cache {
                CacheMode::Evict => "destination evicted before each loop",
                CacheMode::Hot => "no eviction",
            },
            a.hint_page,
            c.loops
        ),
        machine: machine(),
        params: json!({
            "size": c.size, "folio_sizes": c.page, "loops": c.loops,
            "cache": cache, "reuse": foliokit::Reuse::from(c.reuse), "hint_page": a.hint_page,
            "functions": sel.run.iter().map(|s| foliokit::Strategy::name(*s)).collect::<Vec<_>>(),
        }),
        baseline: String::new(),
        rows: Vec::new(),
        auto: Vec::new(),
        mc: Vec::new(),
        backing: Vec::new(),
        skipped: skipped(&sel),
        notes: Vec::new(),
    };
    report.baseline = baseline(&sel, ClearStrategy::Butterfly, &mut report.notes);
    for &folio in &c.page {
        let mut dst = Region::new(c.size, folio)?;
        let b = dst.backing();
        report.backing.push(BackingNote {
            folio_size: folio,
            buffer: "dst".into(),
            requested: b.requested.clone(),
            obtained: b.obtained.clone(),
            note: b.note.clone(),
        });
        let plan = Plan {
            folio_size: folio,
            loops: c.loops as usize,
            cache,
            reuse: c.reuse.into(),
            hint_page: a.hint_page,
        };
        let pb = bar(
            sel.run.len() * (plan.loops + 1),
            &format!("clear {}", show_size(folio)),
        );
        let m = measure_clear(&mut dst, &sel.run, &plan, || pb.inc(1))?;
        pb.finish_and_clear();
        let (rows, auto, _) = rows(&m, folio, &report.baseline);
        report.rows.extend(rows);
        report.auto.extend(auto);
    }
    print!("{}", report.render(c.format));
    Ok(())
}

//! `foliokit bench <op>`: shared plumbing for the experiments.

pub mod clear;
pub mod copy;

use foliokit::measure::Measured;
use foliokit::strategy::{parse_list, Selection, Strategy};
use std::fmt::Write as _;

use crate::args::show_size;
use crate::machine::mem_available;
use crate::report::{AutoSummary, McRatio, Row, Skipped};
use crate::CliError;

/// `-f help`: every strategy, whether this CPU has it, and what it does.
pub fn strategy_help<S: Strategy>() -> String {
    let mut out = format!("{} strategies (-f name[,name...] | all):\n", S::OP);
    for s in S::ALL {
        let avail = match s.unavailable() {
            None => "yes".to_string(),
            Some(why) => format!("no: {why}"),
        };
        let _ = writeln!(out, "  {:<10} [{avail}] {}", s.name(), s.description());
    }
    out
}

/// Parses `-f`, or prints the help and returns `None` for `-f help`.
pub fn select<S: Strategy>(spec: &str) -> Result<Option<Selection<S>>, CliError> {
    if spec.trim() == "help" {
        print!("{}", strategy_help::<S>());
        return Ok(None);
    }
    Ok(Some(parse_list::<S>(spec)?))
}

pub fn skipped<S: Strategy>(sel: &Selection<S>) -> Vec<Skipped> {
    sel.skipped
        .iter()
        .map(|(s, why)| Skipped {
            function: s.name().into(),
            reason: (*why).into(),
        })
        .collect()
}

/// The baseline speedups are measured against: `preferred` when it runs,
/// else the first strategy selected (with a note saying so).
pub fn baseline<S: Strategy>(sel: &Selection<S>, preferred: S, notes: &mut Vec<String>) -> String {
    if sel.run.contains(&preferred) {
        return preferred.name().into();
    }
    let first = sel.run[0].name();
    notes.push(format!(
        "{} not run; speedups are against {first}",
        preferred.name()
    ));
    first.into()
}

/// Checks the folio sizes divide the size and the memory is there.
pub fn check_shape(size: usize, folios: &[usize], buffers: usize) -> Result<(), CliError> {
    let page = foliokit::batch::page_size();
    for &f in folios {
        if f % page != 0 {
            return Err(format!(
                "folio size {} is not a multiple of the {page}-byte page",
                show_size(f)
            )
            .into());
        }
        if size % f != 0 {
            return Err(format!(
                "size {} is not a whole number of {} folios",
                show_size(size),
                show_size(f)
            )
            .into());
        }
    }
    let need = size.saturating_mul(buffers);
    if let Some(avail) = mem_available() {
        if need > avail {
            return Err(format!(
                "this run needs {} of memory ({buffers} × {}) but only {} is available",
                show_size(need),
                show_size(size),
                show_size(avail)
            )
            .into());
        }
    }
    Ok(())
}

/// Turns measurements at one folio size into rows (speedup against
/// `baseline`), a summary of how `auto` compared, and each `-mc` variant's
/// ratio to its plain twin.
pub fn rows(
    m: &[Measured],
    folio: usize,
    baseline: &str,
) -> (Vec<Row>, Option<AutoSummary>, Vec<McRatio>) {
    let median = |name: &str| m.iter().find(|x| x.function == name).map(|x| x.gbps.median);
    let base = median(baseline).unwrap_or(f64::NAN);
    let rows = m
        .iter()
        .map(|x| Row {
            function: x.function.clone(),
            resolved: x.resolved.clone(),
            folio_size: folio,
            channels: 1,
            gbps: x.gbps,
            speedup: x.gbps.median / base,
        })
        .collect();
    let summary = median("auto").and_then(|auto| {
        let best = m
            .iter()
            .filter(|x| x.function != "auto" && !x.function.ends_with("-mc"))
            .max_by(|a, b| a.gbps.median.total_cmp(&b.gbps.median))?;
        Some(AutoSummary {
            folio_size: folio,
            auto_resolved: m.iter().find(|x| x.function == "auto")?.resolved.clone(),
            auto_vs_baseline: auto / base,
            auto_vs_libc: median("libc").map(|l| auto / l),
            best_named: best.function.clone(),
            auto_vs_best_named: auto / best.gbps.median,
        })
    });
    let mc = m
        .iter()
        .filter_map(|x| {
            let plain = x.function.strip_suffix("-mc")?;
            Some(McRatio {
                function: plain.to_string(),
                folio_size: folio,
                mc_over_plain: x.gbps.median / median(plain)?,
            })
        })
        .collect();
    (rows, summary, mc)
}

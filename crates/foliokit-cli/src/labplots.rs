//! The lab page's plots, one builder per experiment: which rows go where,
//! and which of the seeds' figures are drawn as reference marks (only where
//! our experiment has the seed's shape).

use crate::args::show_size;
use crate::plots::{self, CurvePoint, Frame, Point, Reference, Series};
use crate::report::Report;
use foliokit_lab::copy_clear::Row;
use foliokit_lab::measure::Stats;
use foliokit_lab::migrate::MigrateRow;
use foliokit_lab::{fault::FaultRow, init::InitRow, remap::MremapRow};

const M2: usize = 2 << 20;

fn point(s: &Stats) -> Point {
    Point {
        center: s.median,
        sd: s.stdev,
    }
}

/// The seeds' reference marks for plot `key`, all at category `at`.
fn marks_at(key: &str, at: usize) -> Vec<Reference> {
    foliokit_lab::seeds::marks(key)
        .into_iter()
        .map(|(y, label)| Reference { at, y, label })
        .collect()
}

fn unique<T: PartialEq + Clone>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// Copy or clear: GB/s by folio size, one series per strategy, one panel
/// per channel count. `refs` are (folio size, GB/s, label) seed figures.
pub fn strategies(op: &str, r: &Report<Row>, refs: &[(usize, f64, String)]) -> Vec<String> {
    let folios = unique(r.rows.iter().map(|x| x.folio_size));
    let x: Vec<String> = folios.iter().map(|&f| show_size(f)).collect();
    let mut out = Vec::new();
    for ch in unique(r.rows.iter().map(|x| x.channels)) {
        let rows: Vec<&Row> = r.rows.iter().filter(|x| x.channels == ch).collect();
        let series: Vec<Series> = unique(rows.iter().map(|x| x.function.clone()))
            .into_iter()
            .map(|name| Series {
                points: folios
                    .iter()
                    .map(|&f| {
                        rows.iter()
                            .find(|x| x.function == name && x.folio_size == f)
                            .map(|x| point(&x.gbps))
                    })
                    .collect(),
                name,
            })
            .collect();
        let marks: Vec<Reference> = refs
            .iter()
            .filter_map(|(f, y, label)| {
                folios.iter().position(|g| g == f).map(|at| Reference {
                    at,
                    y: *y,
                    label: label.clone(),
                })
            })
            .collect();
        let title = format!(
            "{op}: GB/s by strategy and folio size, {ch} channel{}",
            if ch == 1 { "" } else { "s" }
        );
        out.push(plots::lines(
            &Frame {
                title: &title,
                x_desc: "folio size",
                x: &x,
                y_desc: "GB/s (median ± sd)",
            },
            &series,
            &marks,
        ));
    }
    out
}

/// Demand faults vs prefault: steady-state GB/s per (folio, mode, threads),
/// with the seed's demand-fault figures at 2M.
pub fn fault(r: &Report<FaultRow>) -> String {
    let cats: Vec<String> = r
        .rows
        .iter()
        .map(|x| format!("{} {} x{}", show_size(x.folio_size), x.function, x.channels))
        .collect();
    let series = [Series {
        name: "GB/s".into(),
        points: r.rows.iter().map(|x| Some(point(&x.gbps))).collect(),
    }];
    let refs: Vec<Reference> = r
        .rows
        .iter()
        .position(|x| x.folio_size == M2 && x.function == "demand" && x.channels == 1)
        .map(|at| marks_at("fault", at))
        .unwrap_or_default();
    plots::bars(
        &Frame {
            title: "page faults: GB/s by folio size, mode and threads",
            x_desc: "folio size, mode, threads",
            x: &cats,
            y_desc: "GB/s (median ± sd)",
        },
        &series,
        &refs,
    )
}

/// Template init: rebind time per variant (the seed's figure is for a
/// 100 GB array, another shape: no reference mark).
pub fn init(r: &Report<InitRow>) -> String {
    let cats: Vec<String> = r.rows.iter().map(|x| x.function.clone()).collect();
    plots::bars(
        &Frame {
            title: "write-once init: time per pass over the array",
            x_desc: "variant",
            x: &cats,
            y_desc: "ms per rebind (median ± sd)",
        },
        &[Series {
            name: "rebind".into(),
            points: r.rows.iter().map(|x| Some(point(&x.rebind_ms))).collect(),
        }],
        &[],
    )
}

/// Migration table 2: throughput against first-folio latency, one curve per
/// channel count (batch size grows along each curve, each point labelled
/// with it), median GB/s with ± sd bars.
pub fn migrate(r: &Report<MigrateRow>) -> String {
    let mut curves: Vec<(String, Vec<CurvePoint>)> = Vec::new();
    for x in r
        .rows
        .iter()
        .filter(|x| x.table == 2 && x.function == "relocate")
    {
        let (Some(g), Some(l)) = (x.gbps, x.first_folio_us) else {
            continue;
        };
        let name = format!(
            "{} channel{}",
            x.channels,
            if x.channels == 1 { "" } else { "s" }
        );
        let q = CurvePoint {
            x: l.median,
            y: point(&g),
            label: format!("{} p", x.batch_pages),
        };
        match curves.iter_mut().find(|c| c.0 == name) {
            Some(c) => c.1.push(q),
            None => curves.push((name, vec![q])),
        }
    }
    plots::log_x_curves(
        "migration: throughput vs first-folio latency (points labelled with the batch in pages)",
        "first-folio latency, µs (median, log scale)",
        "GB/s (median ± sd)",
        &curves,
    )
}

/// mremap: loop time per folio size; the seed's 64K figures are drawn when
/// the loop has the seed's 10,000 iterations.
pub fn mremap(r: &Report<MremapRow>, iterations: usize) -> String {
    let rows: Vec<&MremapRow> = r.rows.iter().filter(|x| x.alignment.is_none()).collect();
    let cats: Vec<String> = rows.iter().map(|x| show_size(x.folio_size)).collect();
    let refs: Vec<Reference> = match rows.iter().position(|x| x.folio_size == 64 << 10) {
        Some(at) if iterations == 10_000 => marks_at("mremap", at),
        _ => Vec::new(),
    };
    plots::bars(
        &Frame {
            title: &format!("mremap: loop time by folio size ({iterations} iterations)"),
            x_desc: "folio size",
            x: &cats,
            y_desc: "seconds per loop (median ± sd)",
        },
        &[Series {
            name: "loop time".into(),
            points: rows.iter().map(|x| Some(point(&x.secs))).collect(),
        }],
        &refs,
    )
}

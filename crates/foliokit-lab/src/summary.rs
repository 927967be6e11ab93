//! One line per seed experiment: what the seed measured, its figure (from
//! [`crate::seeds`]), ours on this machine in the same shape (ratio against
//! ratio), the share of this machine's limit where the run measured one,
//! and a verdict with the reason the data gives. Read from the typed
//! schema ([`Loaded`]), so a lab run and `compare` summarise the same way,
//! whether the results were just measured or written by an older version.

use serde::{Deserialize, Serialize};

use crate::measure::Stats;
use crate::schema::{Loaded, ResultRow};
use crate::seeds;
use crate::units::show_size;

const M2: u64 = 2 << 20;
const K64: u64 = 64 << 10;

#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub seed: String,
    pub what: String,
    /// The seed's figure, as the seed states it.
    pub seed_figure: String,
    pub seed_ratio: f64,
    /// Ours in the same shape (e.g. "2.10x: auto 12.1 vs per-page 5.8 GB/s").
    pub ours: String,
    pub ours_ratio: Option<f64>,
    /// The row's share of this machine's same-run limit, when measured.
    pub of_limit: Option<f64>,
    pub verdict: String,
}

impl Line {
    /// A line with the seed's side of summary entry `key` filled in.
    fn seed(key: &str, ours: String, ours_ratio: Option<f64>, of_limit: Option<f64>) -> Line {
        let s = seeds::summary(key);
        Line {
            seed: s.seed.clone(),
            what: s.what.clone(),
            seed_figure: seeds::expand(&s.figure),
            seed_ratio: seed_ratio(key),
            ours,
            ours_ratio,
            of_limit,
            verdict: String::new(),
        }
    }
}

/// The line of an experiment that ran without measuring the seed's shape
/// (relocation refused, a folio size the kernel would not give): said, with
/// the run's own reason, rather than left out of the summary.
fn not_measured(key: &str, why: String) -> Line {
    let mut l = Line::seed(key, "not measured here".into(), None, None);
    l.verdict = format!("not measured: {why}");
    l
}

/// The seed's ratio for summary entry `key`.
fn seed_ratio(key: &str) -> f64 {
    seeds::figure(&seeds::summary(key).ratio).number()
}

fn find<'a>(exps: &'a [Loaded], k: &str) -> Option<&'a Loaded> {
    exps.iter().find(|e| e.key() == k)
}

fn is(v: &Option<String>, want: &str) -> bool {
    v.as_deref() == Some(want)
}

/// Function `f`'s row at 2M folios on one channel: the seeds' shape.
fn at_2m<'a>(e: &'a Loaded, f: &str) -> Option<&'a ResultRow> {
    e.rows
        .iter()
        .find(|r| is(&r.function, f) && r.folio_size == Some(M2) && r.channels == Some(1))
}

/// A Stats field: the median (the statistic the tables and plots show),
/// the spread and the number of runs.
#[derive(Clone, Copy)]
struct Stat {
    mean: f64,
    sd: f64,
    runs: u64,
}

/// A figure with no median or spread (written as null) is no figure.
fn stat(s: Option<Stats>) -> Option<Stat> {
    let s = s.filter(|s| !s.median.is_nan() && !s.stdev.is_nan())?;
    Some(Stat {
        mean: s.median,
        sd: s.stdev,
        runs: s.runs as u64,
    })
}

/// Below this many runs a row's spread says nothing about the noise.
const MIN_RUNS: u64 = 3;

/// How two measurements differ.
#[derive(Clone, Copy, PartialEq)]
enum Diff {
    /// Their mean ± sd intervals do not overlap.
    Beyond,
    Within,
    /// Too few runs to tell.
    Unknown(u64),
}

/// `a / b` and how they differ.
fn ratio(a: Stat, b: Stat) -> (f64, Diff) {
    let diff = if a.runs.min(b.runs) < MIN_RUNS {
        Diff::Unknown(a.runs.min(b.runs))
    } else if (a.mean - b.mean).abs() > a.sd + b.sd {
        Diff::Beyond
    } else {
        Diff::Within
    };
    (a.mean / b.mean, diff)
}

fn verdict(ours: f64, diff: Diff, seed: f64, why_not: impl FnOnce() -> String) -> String {
    let same_direction = (ours > 1.0) == (seed > 1.0);
    if let Diff::Unknown(n) = diff {
        return format!(
            "no verdict: {n} run{} per row, too few to tell the effect from noise",
            if n == 1 { "" } else { "s" }
        );
    }
    let clear = diff == Diff::Beyond;
    // Half the seed's effect or more (on a log scale, so 2x and 0.5x weigh
    // alike) counts as reproduced; less is the same direction, smaller.
    let share = ours.ln() / seed.ln();
    if clear && same_direction && share >= 0.5 {
        "reproduced here (same direction, beyond the noise, at least half the seed's effect)".into()
    } else if clear && same_direction {
        format!(
            "partly: the seed's direction beyond the noise, but {ours:.2}x against its {seed:.2}x; {}",
            why_not()
        )
    } else if !clear {
        format!("not reproduced here: within the noise; {}", why_not())
    } else {
        format!("not reproduced here: the opposite direction; {}", why_not())
    }
}

/// Why an effect is smaller here, as far as the figures on the same page
/// tell: the row's share of the same-run limit, against the best share any
/// row of the experiment reaches in the same shape (folio size), on the
/// same channels and on more. Never a fixed sentence the page could
/// contradict.
fn limit_reason(e: &Loaded, row: &ResultRow) -> String {
    let Some(x) = row.of_limit else {
        return "this run measured no same-run limit, so the data does not say why".into();
    };
    let name = |r: &ResultRow| r.function.clone().unwrap_or_else(|| "?".into());
    let best_on = |pred: &dyn Fn(&ResultRow) -> bool| {
        e.rows
            .iter()
            .filter(|r| r.folio_size == row.folio_size && r.of_limit.is_some())
            .filter(|r| !is(&r.function, "auto") && pred(r))
            .max_by(|a, b| {
                a.of_limit
                    .unwrap_or(0.0)
                    .total_cmp(&b.of_limit.unwrap_or(0.0))
            })
    };
    let ch = row.channels.unwrap_or(1);
    if let Some(b) = best_on(&|r| r.channels == Some(ch)) {
        let y = b.of_limit.unwrap_or(0.0);
        if y > x + 0.10 {
            return format!(
                "{} reaches {:.0}% of the limit in the same shape where this row reaches {:.0}%: the gap is the method's, not the machine's",
                name(b),
                y * 100.0,
                x * 100.0
            );
        }
    }
    if x >= 0.8 {
        return format!(
            "the faster row already runs at {:.0}% of this machine's limit: the memory, not the method, bounds it",
            x * 100.0
        );
    }
    if let Some(b) = best_on(&|r| r.channels.unwrap_or(1) > ch) {
        let y = b.of_limit.unwrap_or(0.0);
        if y > x + 0.10 {
            return format!(
                "no row on {ch} channel{} gets past {:.0}% of the limit, while {} on {} channels reaches {:.0}%: one core does not drive this machine's memory here",
                if ch == 1 { "" } else { "s" },
                x * 100.0,
                name(b),
                b.channels.map_or("null".into(), |c| c.to_string()),
                y * 100.0
            );
        }
    }
    format!(
        "the faster row reaches {:.0}% of the limit and no row in this shape does much better: the data on this page does not say why",
        x * 100.0
    )
}

/// An A/A control as read back (the `aa_control` section of copy and clear).
#[derive(Debug, Clone, Deserialize)]
struct AaRead {
    a: Option<String>,
    b: Option<String>,
    ratio: Option<f64>,
    within_noise: Option<bool>,
    problem: Option<String>,
    folio_size: Option<u64>,
    channels: Option<u64>,
}

/// Why the experiment's run cannot give a verdict: an A/A control (the
/// same code timed twice) disagreed beyond the run's noise.
fn aa_failed(e: &Loaded) -> Option<String> {
    let controls: Vec<AaRead> = e.read_section("aa_control")?;
    let bad = controls
        .into_iter()
        .find(|c| c.within_noise == Some(false) || c.problem.is_some())?;
    Some(format!(
        "no verdict: this run's A/A control disagreed ({} vs {} came {:.3}x apart at {} x{}), so it cannot rank what differs by less",
        bad.a.as_deref().unwrap_or("?"),
        bad.b.as_deref().unwrap_or("?"),
        bad.ratio.unwrap_or(f64::NAN),
        bad.folio_size.map_or("?".into(), |b| show_size(b as usize)),
        bad.channels.map_or("null".into(), |c| c.to_string())
    ))
}

/// Summary line `key`: ours is `a` over `b`, said as the ratio and the two
/// figures named in `said` (in the order shown, with the unit and its
/// decimals); the verdict sets it against the seed's ratio, with `why_not`
/// for an effect smaller than the seed's.
fn ratio_line(
    key: &str,
    (a, b): (Stat, Stat),
    said: [(&str, Stat); 2],
    (unit, decimals): (&str, usize),
    of_limit: Option<f64>,
    why_not: impl FnOnce() -> String,
) -> Line {
    let (r, diff) = ratio(a, b);
    let [(x, xs), (y, ys)] = said;
    let ours = format!(
        "{r:.2}x: {x} {:.decimals$} vs {y} {:.decimals$} {unit}",
        xs.mean, ys.mean
    );
    let mut l = Line::seed(key, ours, Some(r), of_limit);
    l.verdict = verdict(r, diff, l.seed_ratio, why_not);
    l
}

const GBPS: (&str, usize) = ("GB/s", 2);

fn copy_line(exps: &[Loaded]) -> Option<Line> {
    let e = find(exps, "copy")?;
    let (auto, base) = (at_2m(e, "auto")?, at_2m(e, "per-page")?);
    let (a, b) = (stat(auto.gbps)?, stat(base.gbps)?);
    let ran = format!("auto ({})", auto.resolved.as_deref().unwrap_or("?"));
    Some(ratio_line(
        "copy",
        (a, b),
        [(&ran, a), ("per-page", b)],
        GBPS,
        auto.of_limit,
        || limit_reason(e, auto),
    ))
}

fn zen3_line(exps: &[Loaded]) -> Option<Line> {
    let e = find(exps, "copy")?;
    let (a, b) = (
        stat(at_2m(e, "unrolled")?.gbps)?,
        stat(at_2m(e, "movsq")?.gbps)?,
    );
    Some(ratio_line(
        "zen3",
        (a, b),
        [("unrolled", a), ("movsq", b)],
        GBPS,
        None,
        || {
            "rep movsq and the unrolled loop run alike on this CPU; the seed measured it on Zen 3"
                .into()
        },
    ))
}

fn clear_line(exps: &[Loaded]) -> Option<Line> {
    let e = find(exps, "clear")?;
    let (seq, bfly) = (at_2m(e, "per-page")?, at_2m(e, "butterfly")?);
    let (a, b) = (stat(seq.gbps)?, stat(bfly.gbps)?);
    Some(ratio_line(
        "clear",
        (a, b),
        [("sequential", a), ("butterfly", b)],
        GBPS,
        seq.of_limit,
        || limit_reason(e, seq),
    ))
}

fn init_line(exps: &[Loaded]) -> Option<Line> {
    let e = find(exps, "init")?;
    let row = |f: &str| e.rows.iter().find(|r| is(&r.function, f));
    let (nt, mc) = (row("template-nt")?, row("template-memcpy")?);
    // Lower is better: memcpy's time over nt's is nt's speedup.
    let (a, b) = (stat(mc.rebind_ms)?, stat(nt.rebind_ms)?);
    Some(ratio_line(
        "init",
        (a, b),
        [("template-nt", b), ("template-memcpy", a)],
        ("ms", 1),
        nt.of_limit,
        || limit_reason(e, nt),
    ))
}

fn migrate_line(exps: &[Loaded]) -> Option<Line> {
    let e = find(exps, "migrate")?;
    let nodes = e.params.nodes.as_ref().map_or(1, Vec::len);
    let table1 = |r: &&ResultRow, f: &str| {
        r.table == Some(1) && is(&r.function, f) && r.folio_size == Some(M2)
    };
    let best = e
        .rows
        .iter()
        .filter(|r| table1(r, "relocate"))
        .max_by_key(|r| r.channels.unwrap_or(0))?;
    let base = e.rows.iter().find(|r| table1(r, "baseline"))?;
    let ch = best.channels.unwrap_or(1);
    let (Some(a), Some(b)) = (stat(best.gbps), stat(base.gbps)) else {
        let why = [best, base].iter().find_map(|r| {
            r.other
                .get("note")
                .and_then(|n| n.as_str())
                .map(String::from)
        });
        return Some(not_measured(
            "migrate",
            why.unwrap_or_else(|| "the 2M table 1 rows have no figures".into()),
        ));
    };
    let on = format!(
        "relocation on {ch} channel{}",
        if ch == 1 { "" } else { "s" }
    );
    let mut l = ratio_line(
        "migrate",
        (a, b),
        [(&on, a), ("baseline", b)],
        GBPS,
        best.of_limit,
        || limit_reason(e, best),
    );
    if nodes < 2 {
        l.verdict += " (one NUMA node: pages were copied within the node)";
    }
    Some(l)
}

fn mremap_line(exps: &[Loaded]) -> Option<Line> {
    let e = find(exps, "mremap")?;
    let r64 = e
        .rows
        .iter()
        .find(|r| r.folio_size == Some(K64) && r.alignment.is_none());
    let Some(s) = r64.and_then(|r| r.speedup) else {
        let why = e.notes.iter().find(|n| n.starts_with("64K")).cloned();
        return Some(not_measured(
            "mremap",
            why.unwrap_or_else(|| "no 64K row in this run".into()),
        ));
    };
    let mut l = Line::seed(
        "mremap",
        format!("{s:.2}x: 64K folios against the 4K control, on this one kernel"),
        None,
        None,
    );
    l.verdict =
        "needs two kernels: run `foliokit lab` on each and `foliokit compare` the results".into();
    Some(l)
}

/// The summary of one run's experiments (those it has). A line from an
/// experiment whose A/A control disagreed gives no verdict.
pub fn lines(exps: &[Loaded]) -> Vec<Line> {
    let gated = |k: &str, l: Option<Line>| {
        l.map(|mut l| {
            if let Some(why) = find(exps, k).and_then(aa_failed) {
                l.verdict = why;
            }
            l
        })
    };
    [
        gated("copy", copy_line(exps)),
        gated("copy", zen3_line(exps)),
        gated("clear", clear_line(exps)),
        init_line(exps),
        migrate_line(exps),
        mremap_line(exps),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn row(f: &str, ch: u64, median: f64, of: f64) -> Value {
        json!({"function": f, "folio_size": M2, "channels": ch, "of_limit": of,
               "gbps": {"mean": median, "stdev": 0.1, "median": median, "runs": 5}})
    }

    fn clear(aa_ok: bool) -> Loaded {
        serde_json::from_value(json!({"experiment": "clear", "params": {}, "rows": [
            row("butterfly", 1, 9.0, 0.30), row("per-page", 1, 9.5, 0.32),
            row("clzero", 1, 27.0, 0.92), row("auto", 1, 27.0, 0.92)],
            "aa_control": [{"a": "auto", "b": "clzero", "ratio": if aa_ok { 1.0 } else { 1.3 },
                            "within_noise": aa_ok, "folio_size": M2, "channels": 1}]}))
        .expect("a report reads back")
    }

    #[test]
    fn an_experiment_that_ran_without_its_shape_says_why() {
        let mut e = clear(true);
        e.experiment = "mremap".into();
        e.rows.clear();
        e.notes = vec!["64K: skipped, changing mTHP settings needs root".into()];
        let l = mremap_line(&[e]).expect("a line, not a gap");
        assert_eq!(l.ours, "not measured here");
        assert!(l.verdict.contains("needs root"), "{}", l.verdict);
        assert_eq!(l.ours_ratio, None);
    }

    #[test]
    fn reasons_come_from_the_figures_on_the_page() {
        let e = clear(true);
        let l = clear_line(std::slice::from_ref(&e)).unwrap();
        // per-page at 32% while clzero reaches 92% on the same core: the
        // method, not the core, is what the page shows.
        assert!(l.verdict.contains("clzero reaches 92%"), "{}", l.verdict);
        assert!(!l.verdict.contains("latency-bound"), "{}", l.verdict);
        let r = limit_reason(&e, &e.rows[2]);
        assert!(r.contains("memory, not the method"), "{r}");
    }

    #[test]
    fn a_failed_aa_control_withholds_the_verdict() {
        let l = lines(&[clear(false)]);
        assert!(
            l[0].verdict
                .starts_with("no verdict: this run's A/A control disagreed"),
            "{}",
            l[0].verdict
        );
        let l = lines(&[clear(true)]);
        assert!(!l[0].verdict.contains("A/A"), "{}", l[0].verdict);
    }

    #[test]
    fn the_seed_side_comes_from_seeds_json() {
        let l = lines(&[clear(true)]);
        assert_eq!(l[0].seed, "002");
        assert_eq!(
            l[0].seed_figure,
            "11.76 -> 23.58 GB/s (2.00x) on demand faults, EPYC Genoa"
        );
        assert_eq!(l[0].seed_ratio, 2.0);
    }
}

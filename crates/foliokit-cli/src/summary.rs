//! One line per seed experiment: what the seed measured, its figure, ours
//! on this machine in the same shape (ratio against ratio), the share of
//! this machine's limit where the run measured one, and a verdict with the
//! reason the data gives. Read from the experiments' JSON, so a lab run and
//! `compare` summarise the same way.

use serde::Serialize;
use serde_json::Value;

const M2: u64 = 2 << 20;
const K64: u64 = 64 << 10;

#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub seed: &'static str,
    pub what: &'static str,
    /// The seed's figure, as the seed states it.
    pub seed_figure: &'static str,
    pub seed_ratio: f64,
    /// Ours in the same shape (e.g. "2.10x: auto 12.1 vs per-page 5.8 GB/s").
    pub ours: String,
    pub ours_ratio: Option<f64>,
    /// The row's share of this machine's same-run limit, when measured.
    pub of_limit: Option<f64>,
    pub verdict: String,
}

/// The experiment's key: its name, with the mc variant of copy apart.
pub fn key(exp: &Value) -> String {
    let name = exp["experiment"].as_str().unwrap_or("?");
    if name == "copy" && exp["params"]["mc"].as_bool() == Some(true) {
        "copy-mc".into()
    } else {
        name.into()
    }
}

fn find<'a>(exps: &'a [Value], k: &str) -> Option<&'a Value> {
    exps.iter().find(|e| key(e) == k)
}

fn rows(exp: &Value) -> &[Value] {
    exp["rows"].as_array().map_or(&[], Vec::as_slice)
}

/// The first row matching every (field, value) pair.
fn row<'a>(exp: &'a Value, want: &[(&str, Value)]) -> Option<&'a Value> {
    rows(exp)
        .iter()
        .find(|r| want.iter().all(|(f, v)| &r[*f] == v))
}

/// Function `f`'s row at 2M folios on one channel: the seeds' shape.
fn at_2m<'a>(e: &'a Value, f: &str) -> Option<&'a Value> {
    row(
        e,
        &[
            ("function", f.into()),
            ("folio_size", M2.into()),
            ("channels", 1.into()),
        ],
    )
}

/// A Stats field: mean, stdev and the number of runs.
#[derive(Clone, Copy)]
struct Stat {
    mean: f64,
    sd: f64,
    runs: u64,
}

fn stat(r: &Value, field: &str) -> Option<Stat> {
    let s = &r[field];
    // Medians: the statistic the tables and plots show.
    Some(Stat {
        mean: s["median"].as_f64().or_else(|| s["mean"].as_f64())?,
        sd: s["stdev"].as_f64()?,
        runs: s["runs"].as_u64().unwrap_or(1),
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

fn of_limit(r: &Value) -> Option<f64> {
    r["of_limit"].as_f64()
}

/// Why an effect is smaller here, as far as the figures on the same page
/// tell: the row's share of the same-run limit, against the best share any
/// row of the experiment reaches in the same shape (folio size), on the
/// same channels and on more. Never a fixed sentence the page could
/// contradict.
fn limit_reason(e: &Value, row: &Value) -> String {
    let Some(x) = of_limit(row) else {
        return "this run measured no same-run limit, so the data does not say why".into();
    };
    let name = |r: &Value| r["function"].as_str().unwrap_or("?").to_string();
    let same_shape = |r: &&Value| r["folio_size"] == row["folio_size"] && of_limit(r).is_some();
    let best_on = |pred: &dyn Fn(&Value) -> bool| {
        rows(e)
            .iter()
            .filter(same_shape)
            .filter(|r| r["function"] != "auto" && pred(r))
            .max_by(|a, b| {
                of_limit(a)
                    .unwrap_or(0.0)
                    .total_cmp(&of_limit(b).unwrap_or(0.0))
            })
    };
    let ch = row["channels"].as_u64().unwrap_or(1);
    if let Some(b) = best_on(&|r| r["channels"].as_u64() == Some(ch)) {
        let y = of_limit(b).unwrap_or(0.0);
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
    if let Some(b) = best_on(&|r| r["channels"].as_u64().unwrap_or(1) > ch) {
        let y = of_limit(b).unwrap_or(0.0);
        if y > x + 0.10 {
            return format!(
                "no row on {ch} channel{} gets past {:.0}% of the limit, while {} on {} channels reaches {:.0}%: one core does not drive this machine's memory here",
                if ch == 1 { "" } else { "s" },
                x * 100.0,
                name(b),
                b["channels"],
                y * 100.0
            );
        }
    }
    format!(
        "the faster row reaches {:.0}% of the limit and no row in this shape does much better: the data on this page does not say why",
        x * 100.0
    )
}

/// Why the experiment's run cannot give a verdict: an A/A control (the
/// same code timed twice) disagreed beyond the run's noise.
fn aa_failed(e: &Value) -> Option<String> {
    let bad = e["aa_control"]
        .as_array()?
        .iter()
        .find(|c| c["within_noise"] == false || !c["problem"].is_null())?;
    Some(format!(
        "no verdict: this run's A/A control disagreed ({} vs {} came {:.3}x apart at {} x{}), so it cannot rank what differs by less",
        bad["a"].as_str().unwrap_or("?"),
        bad["b"].as_str().unwrap_or("?"),
        bad["ratio"].as_f64().unwrap_or(f64::NAN),
        bad["folio_size"].as_u64().map_or("?".into(), |b| crate::args::show_size(b as usize)),
        bad["channels"]
    ))
}

fn copy_line(exps: &[Value]) -> Option<Line> {
    let e = find(exps, "copy")?;
    let at = |f: &str| at_2m(e, f);
    let (auto, base) = (at("auto")?, at("per-page")?);
    let (a, b) = (stat(auto, "gbps")?, stat(base, "gbps")?);
    let (r, diff) = ratio(a, b);
    Some(Line {
        seed: "000",
        what: "2M folio copy, source evicted: one bulk copy vs 512 page copies",
        seed_figure: "18.65 -> 38.03 GB/s (2.04x), EPYC 9655 Zen 5",
        seed_ratio: 2.04,
        ours: format!(
            "{r:.2}x: auto ({}) {:.2} vs per-page {:.2} GB/s",
            auto["resolved"].as_str().unwrap_or("?"),
            a.mean,
            b.mean
        ),
        ours_ratio: Some(r),
        of_limit: of_limit(auto),
        verdict: verdict(r, diff, 2.04, || limit_reason(e, auto)),
    })
}

fn zen3_line(exps: &[Value]) -> Option<Line> {
    let e = find(exps, "copy")?;
    let at = |f: &str| at_2m(e, f);
    let (a, b) = (stat(at("unrolled")?, "gbps")?, stat(at("movsq")?, "gbps")?);
    let (r, diff) = ratio(a, b);
    Some(Line {
        seed: "000",
        what: "the Zen 3 regression: unrolled loop (memcpy_orig) vs rep movsq, 2M",
        seed_figure: "13.03 -> 11.59 GB/s (0.89x), Zen 3",
        seed_ratio: 0.89,
        ours: format!(
            "{r:.2}x: unrolled {:.2} vs movsq {:.2} GB/s",
            a.mean, b.mean
        ),
        ours_ratio: Some(r),
        of_limit: None,
        verdict: verdict(r, diff, 0.89, || {
            "rep movsq and the unrolled loop run alike on this CPU; the seed measured it on Zen 3"
                .into()
        }),
    })
}

fn clear_line(exps: &[Value]) -> Option<Line> {
    let e = find(exps, "clear")?;
    let at = |f: &str| at_2m(e, f);
    let (seq, bfly) = (at("per-page")?, at("butterfly")?);
    let (a, b) = (stat(seq, "gbps")?, stat(bfly, "gbps")?);
    let (r, diff) = ratio(a, b);
    Some(Line {
        seed: "002",
        what: "clearing a 2M page: sequential vs butterfly order (4K clears each)",
        seed_figure: "11.76 -> 23.58 GB/s (2.00x) on demand faults, EPYC Genoa",
        seed_ratio: 2.0,
        ours: format!(
            "{r:.2}x: sequential {:.2} vs butterfly {:.2} GB/s",
            a.mean, b.mean
        ),
        ours_ratio: Some(r),
        of_limit: of_limit(seq),
        verdict: verdict(r, diff, 2.0, || limit_reason(e, seq)),
    })
}

fn init_line(exps: &[Value]) -> Option<Line> {
    let e = find(exps, "init")?;
    let nt = row(e, &[("function", "template-nt".into())])?;
    let mc = row(e, &[("function", "template-memcpy".into())])?;
    // Lower is better: memcpy's time over nt's is nt's speedup.
    let (a, b) = (stat(mc, "rebind_ms")?, stat(nt, "rebind_ms")?);
    let (r, diff) = ratio(a, b);
    Some(Line {
        seed: "003",
        what: "rebinding a memmap-like array: streaming template stores vs memcpy",
        seed_figure: "244.28 -> 96.79 ms per rebind (2.52x), Ice Lake VM",
        seed_ratio: 2.52,
        ours: format!(
            "{r:.2}x: template-nt {:.1} vs template-memcpy {:.1} ms",
            b.mean, a.mean
        ),
        ours_ratio: Some(r),
        of_limit: of_limit(nt),
        verdict: verdict(r, diff, 2.52, || limit_reason(e, nt)),
    })
}

fn migrate_line(exps: &[Value]) -> Option<Line> {
    let e = find(exps, "migrate")?;
    let nodes = e["params"]["nodes"].as_array().map_or(1, Vec::len);
    let t1: Vec<&Value> = rows(e)
        .iter()
        .filter(|r| r["table"] == 1 && r["function"] == "relocate" && r["folio_size"] == M2)
        .collect();
    let best = t1.iter().max_by(|a, b| {
        a["channels"]
            .as_u64()
            .unwrap_or(0)
            .cmp(&b["channels"].as_u64().unwrap_or(0))
    })?;
    let base = row(
        e,
        &[
            ("table", 1.into()),
            ("function", "baseline".into()),
            ("folio_size", M2.into()),
        ],
    )?;
    let (a, b) = (stat(best, "gbps")?, stat(base, "gbps")?);
    let (r, diff) = ratio(a, b);
    let ch = best["channels"].as_u64().unwrap_or(1);
    Some(Line {
        seed: "001",
        what: "migrating 2M folios: batch copy over N channels vs per-page baseline",
        seed_figure: "11.02 -> 12.65 GB/s with 1 DMA channel (1.15x), 65.23 with 16 (5.92x), Zen 3",
        seed_ratio: 1.15,
        ours: format!(
            "{r:.2}x: relocation on {ch} channel{} {:.2} vs baseline {:.2} GB/s",
            if ch == 1 { "" } else { "s" },
            a.mean,
            b.mean
        ),
        ours_ratio: Some(r),
        of_limit: of_limit(best),
        verdict: {
            let v = verdict(r, diff, 1.15, || limit_reason(e, best));
            if nodes < 2 {
                format!("{v} (one NUMA node: pages were copied within the node)")
            } else {
                v
            }
        },
    })
}

fn mremap_line(exps: &[Value]) -> Option<Line> {
    let e = find(exps, "mremap")?;
    let r64 = rows(e)
        .iter()
        .find(|r| r["folio_size"] == K64 && r["alignment"].is_null())?;
    let s = r64["speedup"].as_f64()?;
    Some(Line {
        seed: "004",
        what: "mremap of 64K folios: PTE batching (a kernel change)",
        seed_figure: "1.9 s -> 1.2 s per 10,000 iterations (1.58x), Apple M3",
        seed_ratio: 1.58,
        ours: format!("{s:.2}x: 64K folios against the 4K control, on this one kernel"),
        ours_ratio: None,
        of_limit: None,
        verdict: "needs two kernels: run `foliokit lab` on each and `foliokit compare` the results"
            .into(),
    })
}

/// The summary of one run's experiments (those it has). A line from an
/// experiment whose A/A control disagreed gives no verdict.
pub fn lines(exps: &[Value]) -> Vec<Line> {
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

/// The summary as terminal lines.
pub fn text(lines: &[Line]) -> String {
    let mut out = String::from("# summary: the seeds' figures and ours, in the same shape\n");
    for l in lines {
        let limit = l
            .of_limit
            .map(|x| format!("; {:.0}% of this machine's limit", x * 100.0))
            .unwrap_or_default();
        out += &format!(
            "#  seed {}: {}\n#    seed {}\n#    ours {}{limit}\n#    -> {}\n",
            l.seed, l.what, l.seed_figure, l.ours, l.verdict
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(f: &str, ch: u64, median: f64, of: f64) -> Value {
        json!({"function": f, "folio_size": M2, "channels": ch, "of_limit": of,
               "gbps": {"mean": median, "stdev": 0.1, "median": median, "runs": 5}})
    }

    fn clear(aa_ok: bool) -> Value {
        json!({"experiment": "clear", "params": {}, "rows": [
            row("butterfly", 1, 9.0, 0.30), row("per-page", 1, 9.5, 0.32),
            row("clzero", 1, 27.0, 0.92), row("auto", 1, 27.0, 0.92)],
            "aa_control": [{"a": "auto", "b": "clzero", "ratio": if aa_ok { 1.0 } else { 1.3 },
                            "within_noise": aa_ok, "folio_size": M2, "channels": 1}]})
    }

    #[test]
    fn reasons_come_from_the_figures_on_the_page() {
        let e = clear(true);
        let l = clear_line(std::slice::from_ref(&e)).unwrap();
        // per-page at 32% while clzero reaches 92% on the same core: the
        // method, not the core, is what the page shows.
        assert!(l.verdict.contains("clzero reaches 92%"), "{}", l.verdict);
        assert!(!l.verdict.contains("latency-bound"), "{}", l.verdict);
        let r = limit_reason(&e, &e["rows"][2]);
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
}

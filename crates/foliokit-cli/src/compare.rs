//! `foliokit compare A B [C…]`: rows of several runs (a lab's results.json
//! or a bench's JSON) matched by experiment, table, function, folio size,
//! channels and the other keys a row has; each later run's ratio to the
//! first, with a change called out only where the two rows' median ± sd
//! intervals do not overlap. Machine and kernel differences come first:
//! across machines or kernels a ratio compares them, not the code.

use clap::Args;
use foliokit_lab::schema::{LabResults, Loaded, MachineFacts, ResultRow};
use foliokit_lab::summary;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::args::Format;
use crate::plots::{self, Frame, Point, Series};
use crate::report::escape;
use crate::CliError;

/// The widest cell the comparison table prints, in characters.
const MAX_CELL: usize = 120;

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Two or more results: a lab's results.json or the JSON of a bench
    /// (`--format json`). The first is the reference.
    #[arg(required = true, num_args = 2.., value_name = "RESULTS")]
    pub files: Vec<PathBuf>,
    /// Also write index.html (side-by-side plots) and compare.json here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// One run: where it came from, its machine and its experiments.
struct Run {
    name: String,
    machine: MachineFacts,
    experiments: Vec<Loaded>,
}

/// What a results file holds: a lab's results.json or one bench's JSON.
#[derive(Deserialize)]
#[serde(untagged)]
enum ResultsFile {
    Lab(LabResults),
    Bench(Loaded),
}

fn load(given: &Path) -> Result<Run, CliError> {
    // A lab directory stands for its results.json.
    let path = &if given.is_dir() {
        given.join("results.json")
    } else {
        given.to_path_buf()
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // Not JSON at all is said as such; JSON of neither shape below.
    serde_json::from_str::<serde::de::IgnoredAny>(&text)
        .map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let (machine, experiments) = match serde_json::from_str::<ResultsFile>(&text) {
        Ok(ResultsFile::Lab(l)) => (l.machine, l.experiments),
        Ok(ResultsFile::Bench(b)) => (b.machine.clone(), vec![b]),
        Err(_) => {
            return Err(format!(
                "{} is neither a lab's results.json nor a bench's JSON (no \"experiments\" or \"experiment\")",
                path.display()
            )
            .into())
        }
    };
    if !experiments
        .iter()
        .any(|e| e.rows.iter().any(|r| r.metric().is_some()))
    {
        return Err(format!(
            "{} holds no rows with a measurement: nothing to compare",
            path.display()
        )
        .into());
    }
    // A lab file names its machine once; a file that does not takes its
    // first experiment's.
    let machine = if machine.is_known() {
        machine
    } else {
        experiments.first().map_or(machine, |e| e.machine.clone())
    };
    Ok(Run {
        name: path.display().to_string(),
        machine,
        experiments,
    })
}

/// A row's identity inside its experiment, e.g. "t1 relocate 2M ch2".
fn label(r: &ResultRow) -> String {
    r.identity()
        .into_iter()
        .map(|(k, v)| match k {
            "table" => format!("t{v}"),
            "channels" => format!("ch{v}"),
            "batch_pages" => format!("batch {v}"),
            "record_size" => format!("{v} records"),
            _ => v,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Measure {
    mean: f64,
    sd: f64,
    runs: u64,
}

/// The row's measurement: its median (as the tables, plots and summary
/// show), spread and runs, with the unit and which way is better.
fn measure(r: &ResultRow) -> Option<(&'static str, bool, Measure)> {
    let m = r.metric()?;
    Some((
        m.unit,
        m.higher_is_better,
        Measure {
            mean: m.stats.median,
            sd: m.stats.stdev,
            runs: m.stats.runs as u64,
        },
    ))
}

/// What a later run's row says against the reference's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Change {
    Better,
    Worse,
    WithinNoise,
    /// Fewer than 3 runs on a side: the spread says nothing.
    TooFewRuns,
}

fn judge(a: Measure, b: Measure, higher_better: bool) -> Change {
    if a.runs.min(b.runs) < 3 {
        return Change::TooFewRuns;
    }
    if (b.mean - a.mean).abs() <= a.sd + b.sd {
        return Change::WithinNoise;
    }
    if (b.mean > a.mean) == higher_better {
        Change::Better
    } else {
        Change::Worse
    }
}

#[derive(Debug, Clone, Serialize)]
struct Matched {
    experiment: String,
    row: String,
    unit: &'static str,
    higher_is_better: bool,
    /// One per run; `None` where that run lacks the row.
    values: Vec<Option<Measure>>,
    /// Each later run's mean over the reference's.
    ratios: Vec<Option<f64>>,
    changes: Vec<Option<Change>>,
}

/// Every row of the reference, matched in the other runs; then the rows
/// only later runs have.
fn matched(runs: &[Run]) -> Vec<Matched> {
    let mut out: Vec<Matched> = Vec::new();
    for run in runs {
        for e in &run.experiments {
            let exp = e.key();
            for r in &e.rows {
                let Some((unit, higher, _)) = measure(r) else {
                    continue;
                };
                let row = label(r);
                if out.iter().any(|m| m.experiment == exp && m.row == row) {
                    continue;
                }
                let values: Vec<Option<Measure>> = runs
                    .iter()
                    .map(|other| {
                        other
                            .experiments
                            .iter()
                            .filter(|o| o.key() == exp)
                            .flat_map(|o| &o.rows)
                            .find(|o| label(o) == row)
                            .and_then(measure)
                            .map(|m| m.2)
                    })
                    .collect();
                let (ratios, changes) = values[1..]
                    .iter()
                    .map(|b| match (values[0], b) {
                        (Some(a), Some(b)) => (Some(b.mean / a.mean), Some(judge(a, *b, higher))),
                        _ => (None, None),
                    })
                    .unzip();
                out.push(Matched {
                    experiment: exp.clone(),
                    row,
                    unit,
                    higher_is_better: higher,
                    values,
                    ratios,
                    changes,
                });
            }
        }
    }
    out
}

/// The machine facts that make a ratio compare machines rather than code.
fn machine_diffs(runs: &[Run]) -> Vec<String> {
    let facts: Vec<Vec<(&str, String)>> = runs.iter().map(|r| r.machine.facts()).collect();
    let mut out = Vec::new();
    for (i, (name, _)) in facts[0].iter().enumerate() {
        let vals: Vec<&str> = facts.iter().map(|f| f[i].1.as_str()).collect();
        if vals.iter().any(|v| v != &vals[0]) {
            out.push(format!("{name}: {}", vals.join(" | ")));
        }
    }
    out
}

/// A figure with about three significant digits, whatever its scale (a
/// 1 GiB mremap takes microseconds, a loop seconds).
fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.001 {
        format!("{v:.4}")
    } else {
        format!("{v:.2e}")
    }
}

fn show(m: &Option<Measure>) -> String {
    m.map_or("-".into(), |m| format!("{} ± {}", num(m.mean), num(m.sd)))
}

/// The median over rows of run `k`'s change, oriented so that above 1 is
/// better: when the code is the same, a shift of the whole run is the
/// machine's load, which per-row spreads do not capture.
fn median_shift(all: &[Matched], k: usize) -> Option<f64> {
    let mut v: Vec<f64> = all
        .iter()
        .filter_map(|m| m.ratios[k].map(|r| if m.higher_is_better { r } else { 1.0 / r }))
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn change_word(c: Option<Change>) -> &'static str {
    match c {
        Some(Change::Better) => "better",
        Some(Change::Worse) => "WORSE",
        Some(Change::WithinNoise) => "~ noise",
        Some(Change::TooFewRuns) => "? <3 runs",
        None => "missing",
    }
}

fn counts(all: &[Matched], k: usize) -> (usize, usize, usize, usize, usize) {
    let mut c = (0, 0, 0, 0, 0);
    for m in all {
        match m.changes[k] {
            Some(Change::Better) => c.0 += 1,
            Some(Change::Worse) => c.1 += 1,
            Some(Change::WithinNoise) => c.2 += 1,
            Some(Change::TooFewRuns) => c.3 += 1,
            None => c.4 += 1,
        }
    }
    c
}

fn text(runs: &[Run], all: &[Matched], diffs: &[String]) -> String {
    let mut out = String::new();
    for (i, r) in runs.iter().enumerate() {
        let _ = writeln!(out, "# {} = {}", (b'A' + i as u8) as char, r.name);
    }
    if diffs.is_empty() {
        out += "# machine and kernel: the same in every run\n";
    } else {
        out += "# machine or kernel differ (ratios compare them, not only the code):\n";
        for d in diffs {
            let _ = writeln!(out, "#   {d}");
        }
    }
    let names: Vec<char> = (0..runs.len()).map(|i| (b'A' + i as u8) as char).collect();
    let mut header = vec!["experiment".to_string(), "row".into(), "unit".into()];
    header.extend(names.iter().map(|n| format!("{n} median ± sd")));
    for n in &names[1..] {
        header.push(format!("{n}/A"));
        header.push(format!("{n} vs A"));
    }
    let mut table: Vec<Vec<String>> = vec![header];
    for m in all {
        let mut line = vec![m.experiment.clone(), m.row.clone(), m.unit.to_string()];
        line.extend(m.values.iter().map(show));
        for (r, c) in m.ratios.iter().zip(&m.changes) {
            line.push(r.map_or("-".into(), |r| format!("{r:.2}x")));
            line.push(change_word(*c).into());
        }
        table.push(line);
    }
    // A cell longer than a screen (a row name from a hand-edited report)
    // is cut: widths past 65535 are more than `format!` can pad.
    for l in table.iter_mut() {
        for v in l.iter_mut() {
            if v.chars().count() > MAX_CELL {
                *v = v.chars().take(MAX_CELL - 1).chain(['…']).collect();
            }
        }
    }
    let width: Vec<usize> = (0..table[0].len())
        .map(|i| {
            table
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for l in &table {
        let cells: Vec<String> = l
            .iter()
            .zip(&width)
            .enumerate()
            .map(|(i, (v, &w))| {
                if i < 2 {
                    format!("{v:<w$}")
                } else {
                    format!("{v:>w$}")
                }
            })
            .collect();
        out += cells.join("  ").trim_end();
        out += "\n";
    }
    for (k, n) in names[1..].iter().enumerate() {
        let (b, w, same, few, missing) = counts(all, k);
        let _ = writeln!(
            out,
            "# {n} vs A: {b} better, {w} worse beyond the noise (median ± sd intervals apart), {same} within it, {few} with fewer than 3 runs, {missing} rows missing on one side"
        );
        if let Some(m) = median_shift(all, k) {
            let _ = writeln!(
                out,
                "# {n} vs A: the median row is {m:.2}x as good; a shift of the whole run with the same code is the machine's load at that time, not a change"
            );
        }
    }
    out
}

fn csv(n: usize, all: &[Matched]) -> String {
    let mut head = vec!["experiment".to_string(), "row".into(), "unit".into()];
    for i in 0..n {
        let c = (b'a' + i as u8) as char;
        head.extend([
            format!("{c}_mean"),
            format!("{c}_stdev"),
            format!("{c}_runs"),
        ]);
    }
    for k in 1..n {
        let c = (b'a' + k as u8) as char;
        head.extend([format!("{c}_over_a"), format!("{c}_change")]);
    }
    let mut out = head.join(",") + "\n";
    for m in all {
        let mut l = vec![
            format!("\"{}\"", m.experiment),
            format!("\"{}\"", m.row),
            m.unit.into(),
        ];
        for v in &m.values {
            match v {
                Some(v) => l.extend([v.mean.to_string(), v.sd.to_string(), v.runs.to_string()]),
                None => l.extend([String::new(), String::new(), String::new()]),
            }
        }
        for (r, c) in m.ratios.iter().zip(&m.changes) {
            l.push(r.map_or(String::new(), |r| format!("{r:.4}")));
            l.push(change_word(*c).trim().to_string());
        }
        out += &(l.join(",") + "\n");
    }
    out
}

fn page(runs: &[Run], all: &[Matched], diffs: &[String]) -> String {
    let mut out = crate::html::head("foliokit compare");
    out += "<h1>foliokit compare</h1>";
    out += crate::html::SELFCHECK;
    out += "<p>Each run's rows matched to the first run (A). A change is called out only where the two rows' median ± sd intervals do not overlap; rows with fewer than 3 runs get no verdict.</p><ul>";
    for (i, r) in runs.iter().enumerate() {
        let _ = write!(
            out,
            "<li>{} = {}</li>",
            (b'A' + i as u8) as char,
            escape(&r.name)
        );
    }
    out += "</ul>";
    out += "<h2 id=\"summary\">Summary</h2><table class=\"summary data\"><thead><tr><th>run</th><th>better</th><th>worse</th><th>within noise</th><th>too few runs</th><th>missing</th><th>median row</th></tr></thead><tbody>";
    for k in 0..runs.len() - 1 {
        let (b, w, same, few, missing) = counts(all, k);
        let _ = write!(
            out,
            "<tr><td>{} vs A</td><td>{b}</td><td>{w}</td><td>{same}</td><td>{few}</td><td>{missing}</td><td>{}</td></tr>",
            (b'B' + k as u8) as char,
            median_shift(all, k).map_or("-".into(), |m| format!("{m:.2}x as good"))
        );
    }
    out += "</tbody></table><p class=\"note\">median row: the middle of every row's change, oriented so that above 1 is better. With the same code, a shift of the whole run is the machine's load at that time, not a change.</p>";
    if diffs.is_empty() {
        out += "<p class=\"note\">Machine and kernel: the same in every run.</p>";
    } else {
        out += "<p>Machine or kernel differ (ratios compare them, not only the code):</p><ul>";
        for d in diffs {
            let _ = write!(out, "<li>{}</li>", escape(d));
        }
        out += "</ul>";
    }
    let sums: Vec<Vec<summary::Line>> = runs
        .iter()
        .map(|r| summary::lines(&r.experiments))
        .collect();
    if let Some(first) = sums.iter().find(|s| !s.is_empty()) {
        out += "<h2 id=\"seeds\">The seeds' figures and each run's</h2><table class=\"data\"><thead><tr><th>seed</th><th>experiment</th><th>seed's figure</th>";
        for i in 0..runs.len() {
            let _ = write!(out, "<th>{}</th>", (b'A' + i as u8) as char);
        }
        out += "</tr></thead><tbody>";
        for l in first {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td>",
                l.seed,
                escape(&l.what),
                escape(&l.seed_figure)
            );
            for s in &sums {
                let ours = s.iter().find(|x| x.what == l.what);
                let _ = write!(
                    out,
                    "<td>{}</td>",
                    ours.map_or("-".into(), |x| escape(&format!(
                        "{} ({})",
                        x.ours, x.verdict
                    )))
                );
            }
            out += "</tr>";
        }
        out += "</tbody></table>";
    }
    let mut exps: Vec<String> = Vec::new();
    for m in all {
        if !exps.contains(&m.experiment) {
            exps.push(m.experiment.clone());
        }
    }
    out += "<nav>";
    for e in &exps {
        let _ = write!(out, "<a href=\"#{e}\">{e}</a>");
    }
    out += "</nav>";
    for e in &exps {
        let rows: Vec<&Matched> = all.iter().filter(|m| &m.experiment == e).collect();
        let _ = write!(out, "<h2 id=\"{e}\">{e}</h2>");
        // Plots of at most 16 rows each, so labels stay readable.
        for (n, chunk) in rows.chunks(16).enumerate() {
            let cats: Vec<String> = chunk.iter().map(|m| m.row.clone()).collect();
            let series: Vec<Series> = runs
                .iter()
                .enumerate()
                .map(|(i, _)| Series {
                    name: format!("{}", (b'A' + i as u8) as char),
                    points: chunk
                        .iter()
                        .map(|m| {
                            m.values[i].map(|v| Point {
                                center: v.mean,
                                sd: v.sd,
                            })
                        })
                        .collect(),
                })
                .collect();
            let title = format!(
                "{e}: each run's rows side by side{}",
                if rows.len() > 16 {
                    format!(" (part {})", n + 1)
                } else {
                    String::new()
                }
            );
            let y = format!("{} (median ± sd)", chunk[0].unit);
            let _ = write!(
                out,
                "<figure>{}</figure>",
                plots::bars(
                    &Frame {
                        title: &title,
                        x_desc: "row",
                        x: &cats,
                        y_desc: &y,
                    },
                    &series,
                    &[],
                )
            );
        }
        out += "<table class=\"data\"><thead><tr><th>experiment</th><th>row</th>";
        for i in 0..runs.len() {
            let _ = write!(out, "<th>{} median ± sd</th>", (b'A' + i as u8) as char);
        }
        for k in 1..runs.len() {
            let c = (b'A' + k as u8) as char;
            let _ = write!(out, "<th>{c}/A</th><th>{c} vs A</th>");
        }
        out += "</tr></thead><tbody>";
        for m in rows {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{} ({})</td>",
                escape(&m.experiment),
                escape(&m.row),
                m.unit
            );
            for v in &m.values {
                let _ = write!(out, "<td>{}</td>", show(v));
            }
            for (r, c) in m.ratios.iter().zip(&m.changes) {
                let _ = write!(
                    out,
                    "<td>{}</td><td>{}</td>",
                    r.map_or("-".into(), |r| format!("{r:.2}x")),
                    change_word(*c)
                );
            }
            out += "</tr>";
        }
        out += "</tbody></table>";
    }
    out += "</body></html>\n";
    out
}

pub fn run(a: CompareArgs) -> Result<(), CliError> {
    let runs: Vec<Run> = a.files.iter().map(|f| load(f)).collect::<Result<_, _>>()?;
    let all = matched(&runs);
    if all.is_empty() {
        return Err("no rows with a measurement in these results".into());
    }
    let diffs = machine_diffs(&runs);
    let json = json!({
        "runs": runs.iter().map(|r| &r.name).collect::<Vec<_>>(),
        "machine_differences": diffs,
        "median_shift": (1..runs.len()).map(|k| median_shift(&all, k - 1)).collect::<Vec<_>>(),
        "rows": all,
        "summaries": runs.iter().map(|r| summary::lines(&r.experiments)).collect::<Vec<_>>(),
    });
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&json)?),
        Format::Csv => print!("{}", csv(runs.len(), &all)),
        Format::Table => print!("{}", text(&runs, &all, &diffs)),
    }
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let write = |name: &str, body: String| -> Result<(), CliError> {
            let p = dir.join(name);
            std::fs::write(&p, body)
                .map_err(|e| format!("cannot write {}: {e}", p.display()).into())
        };
        write("compare.json", serde_json::to_string_pretty(&json)? + "\n")?;
        write("index.html", page(&runs, &all, &diffs))?;
        eprintln!(
            "# compare: {}/index.html, {}/compare.json",
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

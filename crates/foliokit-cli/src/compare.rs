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
use serde_json::{json, Value};
use std::collections::HashSet;
use std::fmt::{self, Write as _};
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
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Why runs cannot be compared; each says so in one line.
#[derive(Debug)]
enum CompareError {
    Read(PathBuf, std::io::Error),
    NotJson(PathBuf, serde_json::Error),
    NeitherShape(PathBuf),
    /// The file has a shape's key but a part of it is not of that shape:
    /// where (a JSON path, empty when not narrowed down) and serde's word.
    Malformed {
        path: PathBuf,
        shape: &'static str,
        at: String,
        why: String,
    },
    NoMeasuredRows(PathBuf),
    DuplicateRow {
        path: PathBuf,
        experiment: String,
        row: String,
    },
    NoRows,
    NothingInCommon {
        reference: String,
        other: String,
    },
    OutNotDir(PathBuf),
    CreateOut(PathBuf, std::io::Error),
    Write(PathBuf, std::io::Error),
}

impl fmt::Display for CompareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CompareError::*;
        match self {
            Read(p, e) => write!(f, "cannot read {}: {e}", p.display()),
            NotJson(p, e) => write!(f, "{} is not JSON: {e}", p.display()),
            NeitherShape(p) => write!(
                f,
                "{} is neither a lab's results.json nor a bench's JSON (no \"experiments\" or \"experiment\")",
                p.display()
            ),
            Malformed {
                path,
                shape,
                at,
                why,
            } if at.is_empty() => write!(f, "{} is not a valid {shape}: {why}", path.display()),
            Malformed {
                path,
                shape,
                at,
                why,
            } => write!(f, "{} is not a valid {shape}: {at}: {why}", path.display()),
            NoMeasuredRows(p) => write!(
                f,
                "{} holds no rows with a measurement: nothing to compare",
                p.display()
            ),
            DuplicateRow {
                path,
                experiment,
                row,
            } => write!(
                f,
                "{} has the row \"{row}\" of {experiment} more than once: which one to compare is ambiguous",
                path.display()
            ),
            NoRows => write!(f, "no rows with a measurement in these results"),
            NothingInCommon { reference, other } => write!(
                f,
                "{other} has no row in common with {reference} (no experiment and row label match): nothing to compare"
            ),
            OutNotDir(p) => write!(f, "--out {} exists and is not a directory", p.display()),
            CreateOut(p, e) => write!(f, "cannot create {}: {e}", p.display()),
            Write(p, e) => write!(f, "cannot write {}: {e}", p.display()),
        }
    }
}

impl std::error::Error for CompareError {}

/// One run: where it came from, its machine and its experiments.
struct Run {
    name: String,
    machine: MachineFacts,
    experiments: Vec<Loaded>,
}

/// The first part of `v` that does not read as `T`, as a JSON path below
/// `at`, with serde's word on it; `None` when `v` reads.
fn first_bad<T: serde::de::DeserializeOwned>(v: &Value, at: &str) -> Option<(String, String)> {
    T::deserialize(v)
        .err()
        .map(|e| (at.to_string(), e.to_string()))
}

/// Narrows a report that does not read down to its first bad row and, as
/// every row field is optional, to the first field that alone does not.
fn bad_in_report(e: &Value, at: &str) -> Option<(String, String)> {
    let whole = first_bad::<Loaded>(e, at)?;
    let rows = e.get("rows").and_then(Value::as_array);
    for (j, r) in rows.into_iter().flatten().enumerate() {
        let row_at = format!("{at}{}rows[{j}]", if at.is_empty() { "" } else { "." });
        let Some(bad) = first_bad::<ResultRow>(r, &row_at) else {
            continue;
        };
        let field = r.as_object().into_iter().flatten().find_map(|(k, v)| {
            let alone = Value::Object([(k.clone(), v.clone())].into_iter().collect());
            first_bad::<ResultRow>(&alone, &format!("{row_at}.{k}"))
        });
        return Some(field.unwrap_or(bad));
    }
    Some(whole)
}

/// Reads a file's JSON as the shape its keys name: a lab's results.json
/// has "experiments", a bench's JSON "experiment". Choosing by key, not by
/// which shape happens to read, keeps serde's word on what is wrong.
fn parse(path: &Path, text: &str) -> Result<(MachineFacts, Vec<Loaded>), CompareError> {
    let v: Value = serde_json::from_str(text).map_err(|e| CompareError::NotJson(path.into(), e))?;
    let has = |k: &str| v.as_object().is_some_and(|o| o.contains_key(k));
    let malformed = |shape, (at, why): (String, String)| CompareError::Malformed {
        path: path.into(),
        shape,
        at,
        why,
    };
    if has("experiments") {
        const SHAPE: &str = "lab results.json";
        return match LabResults::<Loaded>::deserialize(&v) {
            Ok(l) => Ok((l.machine, l.experiments)),
            Err(e) => {
                let exps = v["experiments"].as_array().into_iter().flatten();
                let bad = exps
                    .enumerate()
                    .find_map(|(i, x)| bad_in_report(x, &format!("experiments[{i}]")))
                    .or_else(|| first_bad::<MachineFacts>(v.get("machine")?, "machine"))
                    .unwrap_or((String::new(), e.to_string()));
                Err(malformed(SHAPE, bad))
            }
        };
    }
    if has("experiment") {
        const SHAPE: &str = "bench JSON";
        return match Loaded::deserialize(&v) {
            Ok(b) => Ok((b.machine.clone(), vec![b])),
            Err(e) => Err(malformed(
                SHAPE,
                bad_in_report(&v, "").unwrap_or((String::new(), e.to_string())),
            )),
        };
    }
    Err(CompareError::NeitherShape(path.into()))
}

fn load(given: &Path) -> Result<Run, CompareError> {
    // A lab directory stands for its results.json.
    let path = &if given.is_dir() {
        given.join("results.json")
    } else {
        given.to_path_buf()
    };
    let text = std::fs::read_to_string(path).map_err(|e| CompareError::Read(path.clone(), e))?;
    let (machine, experiments) = parse(path, &text)?;
    if !experiments
        .iter()
        .any(|e| e.rows.iter().any(|r| r.metric().is_some()))
    {
        return Err(CompareError::NoMeasuredRows(path.clone()));
    }
    // Rows are matched across runs by experiment and label: two measured
    // rows of one label would leave the match to whichever comes first.
    let mut seen = HashSet::new();
    for e in &experiments {
        for r in e.rows.iter().filter(|r| r.metric().is_some()) {
            let (experiment, row) = (e.key(), label(r));
            if seen.contains(&(experiment.clone(), row.clone())) {
                return Err(CompareError::DuplicateRow {
                    path: path.clone(),
                    experiment,
                    row,
                });
            }
            seen.insert((experiment, row));
        }
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
/// A migration's direction is part of it: table 3 repeats every other
/// key once per direction, and those rows must not read as duplicates.
fn label(r: &ResultRow) -> String {
    let direction = r.other.get("direction").and_then(Value::as_str);
    r.identity()
        .into_iter()
        .map(|(k, v)| match k {
            "table" => format!("t{v}"),
            "channels" => format!("ch{v}"),
            "batch_pages" => format!("batch {v}"),
            "record_size" => format!("{v} records"),
            _ => v,
        })
        .chain(direction.map(String::from))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The name of run `i` in tables and headers: A..Z, then AA, AB, ... as
/// spreadsheet columns, so any number of runs gets letters.
fn run_label(i: usize) -> String {
    let mut n = i + 1;
    let mut out = Vec::new();
    while n > 0 {
        n -= 1;
        out.push(b'A' + (n % 26) as u8);
        n /= 26;
    }
    out.iter().rev().map(|&b| b as char).collect()
}

/// An HTML id made of `[A-Za-z0-9_-]` alone, so a name from the file can
/// neither break out of the attribute nor the `href`.
fn html_id(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Measure {
    mean: f64,
    sd: f64,
    runs: u64,
}

impl Measure {
    /// Whether a ratio of this median means anything: a zero or negative
    /// median (a broken or hand-edited file) gives an infinite or negative
    /// ratio, never a change.
    fn comparable(&self) -> bool {
        self.mean.is_finite() && self.mean > 0.0
    }
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
    /// A side's median is not a positive figure: no ratio is taken.
    NotCompared,
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
                            .find_map(|o| if label(o) == row { measure(o) } else { None })
                            .map(|m| m.2)
                    })
                    .collect();
                let (ratios, changes) = values[1..]
                    .iter()
                    .map(|b| match (values[0], b) {
                        (Some(a), Some(b)) if a.comparable() && b.comparable() => {
                            (Some(b.mean / a.mean), Some(judge(a, *b, higher)))
                        }
                        (Some(_), Some(_)) => (None, Some(Change::NotCompared)),
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

/// One line per row whose median cannot be compared, naming the run's
/// file and the row: the table shows the figure but no ratio.
fn not_compared(runs: &[Run], all: &[Matched]) -> Vec<String> {
    let mut out = Vec::new();
    for m in all {
        for (run, v) in runs.iter().zip(&m.values) {
            if let Some(v) = v.filter(|v| !v.comparable()) {
                out.push(format!(
                    "{} {} in {}: median {} {} is not a positive figure, so the row is not compared",
                    m.experiment,
                    m.row,
                    run.name,
                    num(v.mean),
                    m.unit
                ));
            }
        }
    }
    out
}

/// Each later run that shares no row with the reference: its comparison
/// would be all "missing", which reads as a result but is none.
fn check_overlap(runs: &[Run], all: &[Matched]) -> Result<(), CompareError> {
    for (k, run) in runs.iter().enumerate().skip(1) {
        if !all
            .iter()
            .any(|m| m.values[0].is_some() && m.values[k].is_some())
        {
            return Err(CompareError::NothingInCommon {
                reference: runs[0].name.clone(),
                other: run.name.clone(),
            });
        }
    }
    Ok(())
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
        Some(Change::NotCompared) => "not compared",
        None => "missing",
    }
}

/// How many rows of a later run got each verdict.
#[derive(Default)]
struct Counts {
    better: usize,
    worse: usize,
    noise: usize,
    few: usize,
    not_compared: usize,
    missing: usize,
}

fn counts(all: &[Matched], k: usize) -> Counts {
    let mut c = Counts::default();
    for m in all {
        match m.changes[k] {
            Some(Change::Better) => c.better += 1,
            Some(Change::Worse) => c.worse += 1,
            Some(Change::WithinNoise) => c.noise += 1,
            Some(Change::TooFewRuns) => c.few += 1,
            Some(Change::NotCompared) => c.not_compared += 1,
            None => c.missing += 1,
        }
    }
    c
}

fn text(runs: &[Run], all: &[Matched], diffs: &[String], notes: &[String]) -> String {
    let mut out = String::new();
    for (i, r) in runs.iter().enumerate() {
        let _ = writeln!(out, "# {} = {}", run_label(i), r.name);
    }
    if diffs.is_empty() {
        out += "# machine and kernel: the same in every run\n";
    } else {
        out += "# machine or kernel differ (ratios compare them, not only the code):\n";
        for d in diffs {
            let _ = writeln!(out, "#   {d}");
        }
    }
    let names: Vec<String> = (0..runs.len()).map(run_label).collect();
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
        let c = counts(all, k);
        let not_compared = if c.not_compared > 0 {
            format!(", {} not compared (median not positive)", c.not_compared)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "# {n} vs A: {} better, {} worse beyond the noise (median ± sd intervals apart), {} within it, {} with fewer than 3 runs{not_compared}, {} rows missing on one side",
            c.better, c.worse, c.noise, c.few, c.missing
        );
        if let Some(m) = median_shift(all, k) {
            let _ = writeln!(
                out,
                "# {n} vs A: the median row is {m:.2}x as good; a shift of the whole run with the same code is the machine's load at that time, not a change"
            );
        }
    }
    for n in notes {
        let _ = writeln!(out, "# note: {n}");
    }
    out
}

fn csv(n: usize, all: &[Matched]) -> String {
    let mut head = vec!["experiment".to_string(), "row".into(), "unit".into()];
    for i in 0..n {
        let c = run_label(i).to_lowercase();
        head.extend([
            format!("{c}_mean"),
            format!("{c}_stdev"),
            format!("{c}_runs"),
        ]);
    }
    for k in 1..n {
        let c = run_label(k).to_lowercase();
        head.extend([format!("{c}_over_a"), format!("{c}_change")]);
    }
    let mut out = crate::report::csv_line(&head);
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
        out += &crate::report::csv_line(&l);
    }
    out
}

fn page(runs: &[Run], all: &[Matched], diffs: &[String], notes: &[String]) -> String {
    let mut out = crate::html::head("foliokit compare");
    out += "<h1>foliokit compare</h1>";
    out += crate::html::SELFCHECK;
    out += "<p>Each run's rows matched to the first run (A). A change is called out only where the two rows' median ± sd intervals do not overlap; rows with fewer than 3 runs get no verdict.</p><ul>";
    for (i, r) in runs.iter().enumerate() {
        let _ = write!(out, "<li>{} = {}</li>", run_label(i), escape(&r.name));
    }
    out += "</ul>";
    out += "<h2 id=\"summary\">Summary</h2><table class=\"summary data\"><thead><tr><th>run</th><th>better</th><th>worse</th><th>within noise</th><th>too few runs</th><th>not compared</th><th>missing</th><th>median row</th></tr></thead><tbody>";
    for k in 0..runs.len() - 1 {
        let c = counts(all, k);
        let _ = write!(
            out,
            "<tr><td>{} vs A</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            run_label(k + 1),
            c.better,
            c.worse,
            c.noise,
            c.few,
            c.not_compared,
            c.missing,
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
    if !notes.is_empty() {
        out += "<p>Not compared:</p><ul>";
        for n in notes {
            let _ = write!(out, "<li>{}</li>", escape(n));
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
            let _ = write!(out, "<th>{}</th>", run_label(i));
        }
        out += "</tr></thead><tbody>";
        for l in first {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td>",
                escape(&l.seed),
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
    // Each experiment with its anchor: a safe id, made unique against
    // the page's own ids and names that map to the same one.
    let mut exps: Vec<(String, String)> = Vec::new();
    for m in all {
        if !exps.iter().any(|(e, _)| e == &m.experiment) {
            let mut id = html_id(&m.experiment);
            if id.is_empty()
                || id == "summary"
                || id == "seeds"
                || exps.iter().any(|(_, other)| other == &id)
            {
                id = format!("{id}-{}", exps.len());
            }
            exps.push((m.experiment.clone(), id));
        }
    }
    out += "<nav>";
    for (e, id) in &exps {
        let _ = write!(out, "<a href=\"#{id}\">{}</a>", escape(e));
    }
    out += "</nav>";
    for (e, id) in &exps {
        let rows: Vec<&Matched> = all.iter().filter(|m| &m.experiment == e).collect();
        let _ = write!(out, "<h2 id=\"{id}\">{}</h2>", escape(e));
        // Plots of at most 16 rows each, so labels stay readable.
        for (n, chunk) in rows.chunks(16).enumerate() {
            let cats: Vec<String> = chunk.iter().map(|m| m.row.clone()).collect();
            let series: Vec<Series> = runs
                .iter()
                .enumerate()
                .map(|(i, _)| Series {
                    name: run_label(i),
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
            let _ = write!(out, "<th>{} median ± sd</th>", run_label(i));
        }
        for k in 1..runs.len() {
            let c = run_label(k);
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
        return Err(CompareError::NoRows.into());
    }
    check_overlap(&runs, &all)?;
    // The output directory before any output: a table followed by an
    // error reads as a result that was then lost.
    if let Some(dir) = &a.out {
        if dir.exists() && !dir.is_dir() {
            return Err(CompareError::OutNotDir(dir.clone()).into());
        }
        std::fs::create_dir_all(dir).map_err(|e| CompareError::CreateOut(dir.clone(), e))?;
    }
    let diffs = machine_diffs(&runs);
    let notes = not_compared(&runs, &all);
    let json = json!({
        "runs": runs.iter().map(|r| &r.name).collect::<Vec<_>>(),
        "machine_differences": diffs,
        "median_shift": (1..runs.len()).map(|k| median_shift(&all, k - 1)).collect::<Vec<_>>(),
        "rows": all,
        "notes": notes,
        "summaries": runs.iter().map(|r| summary::lines(&r.experiments)).collect::<Vec<_>>(),
    });
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&json)?),
        Format::Csv => {
            print!("{}", csv(runs.len(), &all));
            // CSV has no place for them: the rows say "not compared", and
            // why goes to stderr.
            for n in &notes {
                eprintln!("# note: {n}");
            }
        }
        Format::Table => print!("{}", text(&runs, &all, &diffs, &notes)),
    }
    if let Some(dir) = &a.out {
        let write = |name: &str, body: String| -> Result<(), CliError> {
            let p = dir.join(name);
            std::fs::write(&p, body).map_err(|e| CompareError::Write(p, e).into())
        };
        write("compare.json", serde_json::to_string_pretty(&json)? + "\n")?;
        write("index.html", page(&runs, &all, &diffs, &notes))?;
        eprintln!(
            "# compare: {}/index.html, {}/compare.json",
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

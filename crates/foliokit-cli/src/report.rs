//! One report per run, rendered as a table, JSON (DESIGN.md's schema) or
//! CSV. Every experiment uses this one renderer with its own row type.

use foliokit_lab::measure::Stats;
use serde::Serialize;
use serde_json::{Map, Value};
use std::fmt::Write as _;

use crate::args::{show_size, Format};
use crate::machine::{flags_line, machine, Machine};

/// A row type: its JSON is its serde form; tables and CSV use these.
pub trait TableRow: Serialize {
    /// Column titles, for the table and the CSV header.
    fn columns() -> &'static [&'static str];
    /// Human-formatted cells, in `columns()` order.
    fn cells(&self) -> Vec<String>;
    /// CSV column names; the table's by default.
    fn csv_columns() -> &'static [&'static str] {
        Self::columns()
    }
    /// Machine-readable cells (plain numbers); the table cells by default.
    fn csv(&self) -> Vec<String> {
        self.cells()
    }
    /// The row's main measurement, whose spread flags it as noisy.
    fn spread(&self) -> Option<&Stats> {
        None
    }
}

/// The coefficient of variation of `s` when it exceeds the noise threshold.
pub fn noisy(s: &Stats) -> Option<f64> {
    let cv = s.stdev / s.mean;
    (s.mean > 0.0 && cv > crate::plots::NOISY_CV).then_some(cv)
}

/// The footer line that explains the noisy-row mark.
fn noisy_legend() -> String {
    format!(
        "! = noisy: stdev above {:.0}% of the mean; rerun with more loops (-l) before reading a ratio from that row",
        crate::plots::NOISY_CV * 100.0
    )
}

#[derive(Debug, Clone, Serialize)]
pub struct Report<R> {
    pub experiment: String,
    #[serde(skip)]
    pub title: String,
    pub machine: Machine,
    pub params: Value,
    pub rows: Vec<R>,
    /// Experiment-specific sections (auto summaries, backing, sysfs...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    pub notes: Vec<String>,
    /// Table-only lines printed above the columns (after title and cpu).
    #[serde(skip)]
    pub header: Vec<String>,
    /// Table-only lines printed below the rows.
    #[serde(skip)]
    pub footer: Vec<String>,
}

impl<R: TableRow> Report<R> {
    pub fn new(experiment: &str, title: String, params: Value) -> Self {
        Report {
            experiment: experiment.into(),
            title,
            machine: machine(),
            params,
            rows: Vec::new(),
            extra: Map::new(),
            notes: Vec::new(),
            header: Vec::new(),
            footer: Vec::new(),
        }
    }

    /// Adds a JSON section.
    pub fn section(&mut self, key: &str, value: impl Serialize) {
        self.extra.insert(
            key.into(),
            serde_json::to_value(value).expect("sections serialise"),
        );
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("report serialises")
    }

    /// The rows as an HTML table (class "data"), with the footer and notes.
    pub fn html_table(&self) -> String {
        self.html(|_| true, true)
    }

    /// Only the rows `keep` selects, without the footer and notes.
    pub fn html_table_where(&self, keep: impl Fn(&R) -> bool) -> String {
        self.html(keep, false)
    }

    fn html(&self, keep: impl Fn(&R) -> bool, with_notes: bool) -> String {
        let mut out = String::from("<table class=\"data\"><thead><tr>");
        for c in R::columns() {
            let _ = write!(out, "<th>{}</th>", escape(c));
        }
        out += "</tr></thead><tbody>";
        let mut any_noisy = false;
        for r in self.rows.iter().filter(|r| keep(r)) {
            match r.spread().and_then(noisy) {
                Some(cv) => {
                    any_noisy = true;
                    let _ = write!(
                        out,
                        "<tr class=\"noisy\" title=\"noisy: stdev {:.0}% of the mean\">",
                        cv * 100.0
                    );
                }
                None => out += "<tr>",
            }
            for c in r.cells() {
                let _ = write!(out, "<td>{}</td>", escape(&c));
            }
            out += "</tr>";
        }
        out += "</tbody></table>";
        if any_noisy {
            let _ = write!(out, "<p class=\"note\">{}</p>", escape(&noisy_legend()));
        }
        if !with_notes {
            return out;
        }
        for line in self.header.iter().chain(&self.footer) {
            let _ = write!(out, "<p class=\"note\">{}</p>", escape(line));
        }
        for n in &self.notes {
            let _ = write!(out, "<p class=\"note\">note: {}</p>", escape(n));
        }
        out
    }

    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Json => serde_json::to_string_pretty(self).expect("report serialises") + "\n",
            Format::Csv => {
                let mut out = R::csv_columns().join(",") + "\n";
                for r in &self.rows {
                    out += &(r.csv().join(",") + "\n");
                }
                out
            }
            Format::Table => self.table(),
        }
    }

    fn table(&self) -> String {
        let c = &self.machine.cpu;
        let mut out = String::new();
        let _ = writeln!(out, "# {}", self.title);
        let _ = writeln!(
            out,
            "# cpu: {} | {} | LLC {}",
            c.model,
            flags_line(c),
            show_size(c.caches.llc)
        );
        if let Some(e) = &self.machine.emulated {
            let _ = writeln!(out, "# WARNING: {e}");
        }
        for h in &self.header {
            let _ = writeln!(out, "# {h}");
        }
        let cols = R::columns();
        let cells: Vec<Vec<String>> = self.rows.iter().map(R::cells).collect();
        let width: Vec<usize> = (0..cols.len())
            .map(|i| {
                cells
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([cols[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |vals: Vec<&str>| {
            let padded: Vec<String> = vals
                .iter()
                .zip(&width)
                .enumerate()
                // The first column (the name) reads best left-aligned.
                .map(|(i, (v, &w))| {
                    if i == 1 {
                        format!("{v:<w$}")
                    } else {
                        format!("{v:>w$}")
                    }
                })
                .collect();
            padded.join("  ").trim_end().to_string() + "\n"
        };
        out += &line(cols.to_vec());
        let mut any_noisy = false;
        for (r, c) in self.rows.iter().zip(&cells) {
            let mut l = line(c.iter().map(String::as_str).collect());
            if let Some(cv) = r.spread().and_then(noisy) {
                any_noisy = true;
                l.pop();
                let _ = writeln!(l, "  ! cv {:.0}%", cv * 100.0);
            }
            out += &l;
        }
        if any_noisy {
            let _ = writeln!(out, "# {}", noisy_legend());
        }
        for f in &self.footer {
            let _ = writeln!(out, "# {f}");
        }
        for n in &self.notes {
            let _ = writeln!(out, "# note: {n}");
        }
        out
    }
}

/// Escapes text for HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// "mean ± stdev" with `prec` decimals.
pub fn pm(s: &Stats, prec: usize) -> String {
    format!("{:.prec$} ± {:.prec$}", s.median, s.stdev)
}

/// One measured (function, folio size) pair of a copy or clear run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub function: String,
    /// The concrete strategy that ran (differs from `function` for auto).
    pub resolved: String,
    pub folio_size: usize,
    pub channels: usize,
    pub gbps: Stats,
    /// Median GB/s over the baseline's median GB/s for this folio size.
    pub speedup: f64,
    /// The same-run limit at this folio size and channel count (GB/s,
    /// median), when the run measured one.
    pub limit_gbps: Option<f64>,
    /// The row's median over `limit_gbps`.
    pub of_limit: Option<f64>,
    /// The row beat its limit beyond the run's noise: the limit missed
    /// something (tables print "missed" instead of a percentage).
    pub limit_missed: bool,
}

/// A row further above its limit than this (the A/A tolerance) means the
/// limit missed something; closer is noise.
pub fn over_limit(of: Option<f64>) -> bool {
    of.is_some_and(|x| x > 1.0 + foliokit_lab::measure::AA_TOLERANCE)
}

/// "62%" of a limit, or "-" without one.
pub fn pct(of: Option<f64>) -> String {
    of.map_or_else(|| "-".into(), |x| format!("{:.0}%", x * 100.0))
}

impl TableRow for Row {
    fn columns() -> &'static [&'static str] {
        &[
            "folio",
            "function",
            "ch",
            "ran",
            "GB/s median ± sd",
            "speedup",
            "% limit",
        ]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            show_size(self.folio_size),
            self.function.clone(),
            self.channels.to_string(),
            if self.resolved == self.function {
                String::new()
            } else {
                self.resolved.clone()
            },
            pm(&self.gbps, 2),
            format!("{:.2}x", self.speedup),
            if self.limit_missed {
                "missed".into()
            } else {
                pct(self.of_limit)
            },
        ]
    }

    fn csv_columns() -> &'static [&'static str] {
        &[
            "folio_size",
            "function",
            "resolved",
            "channels",
            "gbps_mean",
            "gbps_stdev",
            "gbps_median",
            "runs",
            "speedup",
            "limit_gbps",
            "of_limit",
        ]
    }

    fn csv(&self) -> Vec<String> {
        let g = &self.gbps;
        vec![
            self.folio_size.to_string(),
            self.function.clone(),
            self.resolved.clone(),
            self.channels.to_string(),
            format!("{:.3}", g.mean),
            format!("{:.3}", g.stdev),
            format!("{:.3}", g.median),
            g.runs.to_string(),
            format!("{:.3}", self.speedup),
            self.limit_gbps
                .map_or_else(String::new, |x| format!("{x:.3}")),
            self.of_limit
                .map_or_else(String::new, |x| format!("{x:.3}")),
        ]
    }

    fn spread(&self) -> Option<&Stats> {
        Some(&self.gbps)
    }
}

/// How `auto` fared against the others at one folio size.
#[derive(Debug, Clone, Serialize)]
pub struct AutoSummary {
    pub folio_size: usize,
    pub auto_resolved: String,
    pub auto_vs_baseline: f64,
    pub auto_vs_libc: Option<f64>,
    pub best_named: String,
    pub auto_vs_best_named: f64,
    pub channels: usize,
    /// auto's median over the same-run limit, when measured.
    pub auto_of_limit: Option<f64>,
    pub limit_gbps: Option<f64>,
}

/// The same-run limit of one (folio size, channels) group.
#[derive(Debug, Clone, Serialize)]
pub struct LimitNote {
    pub folio_size: usize,
    pub channels: usize,
    #[serde(flatten)]
    pub limits: foliokit_lab::measure::Limits,
}

impl LimitNote {
    /// The table's footer line.
    pub fn line(&self) -> String {
        let l = &self.limits;
        format!(
            "limit {} x{}{}: read {:.2}, write 0s {:.2}, write {:.2} -> {} limit {:.2} GB/s (medians), set by {}",
            show_size(self.folio_size),
            self.channels,
            match l.stores {
                foliokit_lab::measure::Stores::Streaming => "",
                foliokit_lab::measure::Stores::Cached => " (cache-resident, ordinary stores)",
            },
            l.read.median,
            l.write_zero.median,
            l.write.median,
            match l.op {
                foliokit_lab::measure::LimitOp::Copy => "copy",
                foliokit_lab::measure::LimitOp::Clear => "clear",
                foliokit_lab::measure::LimitOp::Init => "init",
                foliokit_lab::measure::LimitOp::Fault => "fault",
            },
            l.gbps(),
            l.set_by
        )
    }
}

/// The A/A control of one (folio size, channels) group.
#[derive(Debug, Clone, Serialize)]
pub struct AaNote {
    pub folio_size: usize,
    pub channels: usize,
    #[serde(flatten)]
    pub control: foliokit_lab::measure::AaControl,
}

impl AaNote {
    /// The table's footer line.
    pub fn line(&self) -> String {
        let at = format!(" {} x{}", show_size(self.folio_size), self.channels);
        self.control.line(&at)
    }
}

/// A cache-resident `--hot` group whose timed loops repeat the call.
#[derive(Debug, Clone, Serialize)]
pub struct HotRepeats {
    pub folio_size: usize,
    pub channels: usize,
    pub calls_per_loop: usize,
}

impl HotRepeats {
    /// The table's footer line.
    pub fn line(&self) -> String {
        format!(
            "{} x{}: cache-resident, so each timed loop repeats the call {} times back to back (at least {} per timing); GB/s is over the whole loop",
            show_size(self.folio_size),
            self.channels,
            self.calls_per_loop,
            show_size(foliokit_lab::measure::HOT_SAMPLE_BYTES)
        )
    }
}

/// A machine-check-safe variant's median over its plain twin's, same run.
#[derive(Debug, Clone, Serialize)]
pub struct McRatio {
    pub function: String,
    pub folio_size: usize,
    pub mc_over_plain: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub function: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct BackingNote {
    pub folio_size: usize,
    pub buffer: String,
    pub requested: String,
    pub obtained: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl BackingNote {
    pub fn of(folio_size: usize, buffer: &str, b: &foliokit::mem::Backing) -> Self {
        BackingNote {
            folio_size,
            buffer: buffer.into(),
            requested: b.requested.clone(),
            obtained: b.obtained.clone(),
            note: b.note.clone(),
        }
    }

    pub fn line(&self) -> String {
        format!(
            "backing {} {}: {}{}",
            show_size(self.folio_size),
            self.buffer,
            self.obtained,
            self.note
                .as_ref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        )
    }
}

//! One report per run, rendered as a table, JSON (DESIGN.md's schema) or
//! CSV. Every experiment uses this one renderer with its own row type.

use foliokit_lab::measure::Stats;
use serde::Serialize;
use serde_json::Value;
use std::fmt::Write as _;

use crate::args::{show_size, Format};
use crate::machine::{flags_line, Machine};

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
    (s.mean > 0.0 && cv > foliokit_lab::measure::NOISY_CV).then_some(cv)
}

/// The footer line that explains the noisy-row mark.
fn noisy_legend() -> String {
    format!(
        "! = noisy: stdev above {:.0}% of the mean; rerun with more loops (-l) before reading a ratio from that row",
        foliokit_lab::measure::NOISY_CV * 100.0
    )
}

/// An experiment's report, measured on this machine.
pub type Report<R> = foliokit_lab::schema::Report<R, Machine>;

/// The renderings of a report: JSON (the lab schema's own form), the
/// terminal table, CSV and HTML tables.
pub trait Render {
    type Row;
    fn to_json(&self) -> Value;
    /// The rows as an HTML table (class "data"), with the footer and notes.
    fn html_table(&self) -> String;
    /// Only the rows `keep` selects, without the footer and notes.
    fn html_table_where(&self, keep: impl Fn(&Self::Row) -> bool) -> String;
    fn html(&self, keep: impl Fn(&Self::Row) -> bool, with_notes: bool) -> String;
    fn render(&self, format: Format) -> String;
    fn table(&self) -> String;
}

impl<R: TableRow> Render for Report<R> {
    type Row = R;

    fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("report serialises")
    }

    /// The rows as an HTML table (class "data"), with the footer and notes.
    fn html_table(&self) -> String {
        self.html(|_| true, true)
    }

    /// Only the rows `keep` selects, without the footer and notes.
    fn html_table_where(&self, keep: impl Fn(&R) -> bool) -> String {
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

    fn render(&self, format: Format) -> String {
        match format {
            Format::Json => serde_json::to_string_pretty(self).expect("report serialises") + "\n",
            Format::Csv => {
                let mut out = csv_line(R::csv_columns());
                for r in &self.rows {
                    out += &csv_line(&r.csv());
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
/// A speedup as tables print it: `1.23x`, or `-` where there is none (the
/// baseline was not selected, so the ratio is NaN).
pub fn times(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}x")
    } else {
        "-".into()
    }
}

pub fn pm(s: &Stats, prec: usize) -> String {
    format!("{:.prec$} ± {:.prec$}", s.median, s.stdev)
}

pub use foliokit_lab::schema::pct;

/// One CSV record (RFC 4180): a field holding a comma, a quote or a line
/// break is quoted, its quotes doubled (notes and strategy lists hold
/// commas).
pub(crate) fn csv_line<S: AsRef<str>>(fields: &[S]) -> String {
    let mut out = String::new();
    for (i, f) in fields.iter().enumerate() {
        let f = f.as_ref();
        if i > 0 {
            out.push(',');
        }
        if f.contains([',', '"', '\n', '\r']) {
            out.push('"');
            out.push_str(&f.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(f);
        }
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod csv_tests {
    #[test]
    fn fields_with_commas_quotes_or_breaks_are_quoted() {
        assert_eq!(super::csv_line(&["a", "b c"]), "a,b c\n");
        assert_eq!(
            super::csv_line(&["x, y", "say \"hi\"", "1\n2"]),
            "\"x, y\",\"say \"\"hi\"\"\",\"1\n2\"\n"
        );
    }
}

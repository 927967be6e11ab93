//! One report per run, rendered as a table, JSON (DESIGN.md's schema) or CSV.

use foliokit::measure::Stats;
use serde::Serialize;
use std::fmt::Write as _;

use crate::args::{show_size, Format};
use crate::machine::{flags_line, Machine};

/// One measured (function, folio size) pair.
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

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub experiment: String,
    /// One line saying what was measured, for the table header.
    #[serde(skip)]
    pub title: String,
    pub machine: Machine,
    pub params: serde_json::Value,
    pub baseline: String,
    pub rows: Vec<Row>,
    pub auto: Vec<AutoSummary>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mc: Vec<McRatio>,
    pub backing: Vec<BackingNote>,
    pub skipped: Vec<Skipped>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Json => serde_json::to_string_pretty(self).expect("report serialises") + "\n",
            Format::Csv => self.csv(),
            Format::Table => self.table(),
        }
    }

    fn csv(&self) -> String {
        let mut out = String::from(
            "function,resolved,folio_size,channels,gbps_mean,gbps_stdev,gbps_median,runs,speedup\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{},{},{},{},{:.3},{:.3},{:.3},{},{:.3}",
                r.function,
                r.resolved,
                r.folio_size,
                r.channels,
                r.gbps.mean,
                r.gbps.stdev,
                r.gbps.median,
                r.gbps.runs,
                r.speedup
            );
        }
        out
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
        for b in &self.backing {
            let _ = writeln!(
                out,
                "# backing {} {}: {}{}",
                show_size(b.folio_size),
                b.buffer,
                b.obtained,
                b.note
                    .as_ref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            out,
            "{:>6}  {:<10} {:<9} {:>17}  {:>8}  {:>8}",
            "folio", "function", "ran", "GB/s mean ± sd", "median", "speedup"
        );
        for r in &self.rows {
            let ran = if r.resolved == r.function {
                ""
            } else {
                &r.resolved
            };
            let _ = writeln!(
                out,
                "{:>6}  {:<10} {:<9} {:>8.2} ± {:<6.2}  {:>8.2}  {:>7.2}x",
                show_size(r.folio_size),
                r.function,
                ran,
                r.gbps.mean,
                r.gbps.stdev,
                r.gbps.median,
                r.speedup
            );
        }
        let _ = writeln!(
            out,
            "# speedup: median over the median of '{}' at the same folio size",
            self.baseline
        );
        for a in &self.auto {
            let _ = writeln!(
                out,
                "# auto at {} ran {}: {:.2}x {}{}, {:.2}x the best named ({})",
                show_size(a.folio_size),
                a.auto_resolved,
                a.auto_vs_baseline,
                self.baseline,
                a.auto_vs_libc
                    .map(|x| format!(", {x:.2}x libc"))
                    .unwrap_or_default(),
                a.auto_vs_best_named,
                a.best_named
            );
        }
        for r in &self.mc {
            let _ = writeln!(
                out,
                "# {}-mc at {}: {:.2}x its plain variant",
                r.function,
                show_size(r.folio_size),
                r.mc_over_plain
            );
        }
        for s in &self.skipped {
            let _ = writeln!(out, "# skipped {}: {}", s.function, s.reason);
        }
        for n in &self.notes {
            let _ = writeln!(out, "# note: {n}");
        }
        out
    }
}

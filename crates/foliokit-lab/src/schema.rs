//! The one result schema: what `bench --format json` prints, what a lab
//! writes into results.json, and what the summary and `compare` read back.
//!
//! An experiment's report is [`Report`]: DESIGN.md's fields (`experiment`,
//! `machine`, `params`, `rows`) plus experiment-specific sections and
//! notes. Writers fill it with their own row type; readers load any
//! experiment's rows as [`ResultRow`], which names every field a row of any
//! experiment (of this version or an older one) may carry and keeps the
//! rest. Field names may grow; the ones DESIGN.md lists must stay.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::measure::{Limits, Stats};
use crate::units::show_size;

/// One run of one experiment. `M` is the machine description (the CLI's
/// typed one when writing, plain JSON when reading back) and `P` the
/// parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report<R, M = Value, P = Value> {
    pub experiment: String,
    /// The table's first line.
    #[serde(skip)]
    pub title: String,
    #[serde(default)]
    pub machine: M,
    #[serde(default)]
    pub params: P,
    #[serde(default)]
    pub rows: Vec<R>,
    /// Experiment-specific sections (auto summaries, backing, sysfs...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    #[serde(default)]
    pub notes: Vec<String>,
    /// Table-only lines printed above the columns (after title and cpu).
    #[serde(skip)]
    pub header: Vec<String>,
    /// Table-only lines printed below the rows.
    #[serde(skip)]
    pub footer: Vec<String>,
}

impl<R> Report<R> {
    /// A report whose machine is filled in by whoever shows it
    /// ([`Report::on`]): the experiments do not describe the machine.
    pub fn new(experiment: &str, title: String, params: Value) -> Self {
        Report {
            experiment: experiment.into(),
            title,
            machine: Value::Null,
            params,
            rows: Vec::new(),
            extra: Map::new(),
            notes: Vec::new(),
            header: Vec::new(),
            footer: Vec::new(),
        }
    }
}

impl<R, M, P> Report<R, M, P> {
    /// The same report, measured on `machine`.
    pub fn on<M2>(self, machine: M2) -> Report<R, M2, P> {
        Report {
            experiment: self.experiment,
            title: self.title,
            machine,
            params: self.params,
            rows: self.rows,
            extra: self.extra,
            notes: self.notes,
            header: self.header,
            footer: self.footer,
        }
    }

    /// Adds a JSON section.
    pub fn section(&mut self, key: &str, value: impl Serialize) {
        self.extra.insert(
            key.into(),
            serde_json::to_value(value).expect("sections serialise"),
        );
    }

    /// A section read back, when present and of that shape.
    pub fn read_section<T: serde::de::DeserializeOwned>(&self, key: &str) -> Option<T> {
        serde_json::from_value(self.extra.get(key)?.clone()).ok()
    }
}

/// A report as read back: any experiment's rows, the parameters the
/// summary keys on.
pub type Loaded = Report<ResultRow, MachineFacts, ResultParams>;

impl Loaded {
    /// The experiment's key: its name, with the mc variant of copy apart
    /// (a lab runs copy twice).
    pub fn key(&self) -> String {
        if self.experiment == "copy" && self.params.mc == Some(true) {
            "copy-mc".into()
        } else {
            self.experiment.clone()
        }
    }
}

/// The machine facts that make a ratio between two runs compare machines
/// rather than code, as read back (the writer's machine description holds
/// more; what is absent reads as unknown).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MachineFacts {
    #[serde(default)]
    pub cpu: CpuFacts,
    #[serde(default)]
    pub system: SystemFacts,
    #[serde(default)]
    pub guest: Option<GuestFacts>,
    #[serde(default)]
    pub profile: Option<ProfileFacts>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CpuFacts {
    pub model: Option<String>,
    pub logical_cpus: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SystemFacts {
    pub kernel: Option<String>,
    pub numa_nodes: Option<Vec<u32>>,
    #[serde(default)]
    pub thp: ThpFacts,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ThpFacts {
    pub enabled: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GuestFacts {
    pub accel: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProfileFacts {
    pub note: Option<String>,
}

impl MachineFacts {
    /// The facts compared across runs: (name, value or "?").
    pub fn facts(&self) -> Vec<(&'static str, String)> {
        let or_unknown = |v: Option<String>| v.unwrap_or_else(|| "?".into());
        vec![
            ("CPU", or_unknown(self.cpu.model.clone())),
            (
                "logical CPUs",
                or_unknown(self.cpu.logical_cpus.map(|n| n.to_string())),
            ),
            ("kernel", or_unknown(self.system.kernel.clone())),
            (
                "guest",
                or_unknown(self.guest.as_ref().and_then(|g| g.accel.clone())),
            ),
            (
                "NUMA nodes",
                or_unknown(
                    self.system
                        .numa_nodes
                        .as_ref()
                        .map(|n| serde_json::to_string(n).expect("numbers serialise")),
                ),
            ),
            ("THP", or_unknown(self.system.thp.enabled.clone())),
            (
                "calibration",
                or_unknown(self.profile.as_ref().and_then(|p| p.note.clone())),
            ),
        ]
    }

    /// Whether the file said anything about its machine.
    pub fn is_known(&self) -> bool {
        self.cpu.model.is_some() || self.system.kernel.is_some()
    }
}

/// The parameters a reader of any experiment may need; the rest is kept.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResultParams {
    /// copy: whether the machine-check-safe variants ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mc: Option<bool>,
    /// migrate: the online NUMA nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<u32>>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Median and 99th percentile (first-folio latency, stalls).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    #[serde(deserialize_with = "nan_if_null")]
    pub median: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p99: f64,
}

/// A figure JSON could not hold was written as null: it reads back as NaN.
pub(crate) fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl Latency {
    /// Sorts `v` and takes its median and 99th percentile; `None` if empty.
    pub fn of(v: &mut [f64]) -> Option<Latency> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some(Latency {
            median: at(0.5),
            p99: at(0.99),
        })
    }
}

/// A row of any experiment, read back. Every field is optional: each
/// experiment fills those of its shape.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResultRow {
    /// migrate: which of seed 001's tables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// copy/clear: what auto resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folio_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_pages: Option<u64>,
    /// init: bytes per record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_size: Option<u64>,
    /// mremap: PTE, PMD or PUD for the 1 GiB cases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alignment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbps: Option<Stats>,
    /// init: time per rebind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebind_ms: Option<Stats>,
    /// mremap: seconds per loop or per call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secs: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_folio_us: Option<Latency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup: Option<f64>,
    /// The row's share of the same-run limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of_limit: Option<f64>,
    /// Everything else the row carried.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// What a row measures, for comparing runs: the first of these it has.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Metric {
    pub unit: &'static str,
    pub higher_is_better: bool,
    pub stats: Stats,
}

impl ResultRow {
    /// The row's measurement, by preference: GB/s, then rebind time, loop
    /// time, total time.
    pub fn metric(&self) -> Option<Metric> {
        // A figure written as null (NaN) is no figure: the next one counts.
        let m = |s: &Option<Stats>, unit, higher_is_better| {
            s.filter(|s| !s.median.is_nan() && !s.stdev.is_nan())
                .map(|stats| Metric {
                    unit,
                    higher_is_better,
                    stats,
                })
        };
        m(&self.gbps, "GB/s", true)
            .or_else(|| m(&self.rebind_ms, "ms", false))
            .or_else(|| m(&self.secs, "s", false))
            .or_else(|| m(&self.total_ms, "ms", false))
    }

    /// The row's identity inside its experiment, in the order shown
    /// (table, function, folio size, channels, batch, record, alignment).
    pub fn identity(&self) -> Vec<(&'static str, String)> {
        let size = |v: Option<u64>| v.map(|b| show_size(b as usize));
        let num = |v: Option<u64>| v.map(|n| n.to_string());
        [
            ("table", num(self.table)),
            ("function", self.function.clone()),
            ("folio_size", size(self.folio_size)),
            ("channels", num(self.channels)),
            ("batch_pages", num(self.batch_pages)),
            ("record_size", size(self.record_size)),
            ("alignment", self.alignment.clone()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }
}

/// A lab's results.json: the run, its summary and every experiment's report.
/// `E` is the experiments' form (their JSON when writing, [`Loaded`] when
/// reading), `M` the machine and `S` the summary lines.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabResults<E = Loaded, M = MachineFacts, S = Value> {
    #[serde(default)]
    pub foliokit: String,
    #[serde(default)]
    pub scale: String,
    #[serde(default)]
    pub elapsed_secs: f64,
    #[serde(default)]
    pub machine: M,
    #[serde(default)]
    pub notes: Vec<String>,
    #[serde(default)]
    pub summary: Vec<S>,
    pub experiments: Vec<E>,
}

/// What one buffer of a row was backed by.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

    /// The table's header line.
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

/// The same-run limit of one (folio size, channels) group.
#[derive(Debug, Clone, Serialize)]
pub struct LimitNote {
    pub folio_size: usize,
    pub channels: usize,
    #[serde(flatten)]
    pub limits: Limits,
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
                crate::measure::Stores::Streaming => "",
                crate::measure::Stores::Cached => " (cache-resident, ordinary stores)",
            },
            l.read.median,
            l.write_zero.median,
            l.write.median,
            match l.op {
                crate::measure::LimitOp::Copy => "copy",
                crate::measure::LimitOp::Clear => "clear",
                crate::measure::LimitOp::Init => "init",
                crate::measure::LimitOp::Fault => "fault",
            },
            l.gbps(),
            l.set_by
        )
    }
}

/// A row's place against the same-run limit of its shape: the limit where
/// the run measured one, and the row's share of it. Flattened into the
/// rows of copy, clear, fault and init, so their JSON keeps the two fields.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LimitShare {
    /// The same-run limit at the row's size and threads (GB/s, median),
    /// when the run measured one.
    pub limit_gbps: Option<f64>,
    /// The row's median GB/s over `limit_gbps`.
    pub of_limit: Option<f64>,
}

impl LimitShare {
    /// The share of `limit` a row measured at a median of `gbps` has.
    pub fn of(gbps: f64, limit: Option<f64>) -> LimitShare {
        LimitShare {
            limit_gbps: limit,
            of_limit: limit.map(|l| gbps / l),
        }
    }
}

/// "62%" of a limit, or "-" without one.
pub fn pct(of: Option<f64>) -> String {
    of.map_or_else(|| "-".into(), |x| format!("{:.0}%", x * 100.0))
}

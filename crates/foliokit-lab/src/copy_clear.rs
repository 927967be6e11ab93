//! Seeds 000 and 002 in user space: copying and clearing folios with every
//! named strategy, side by side in one run. Copy and clear are one bench
//! over [`FolioOp`]: what differs is the buffers, the candidates, the
//! baseline and a few lines of the table; the runner, the rows, the
//! speedups against the baseline, the auto verdicts and the same-run
//! limits are written once.

use foliokit::strategy::{Selection, Strategy};
use foliokit::{ClearStrategy, CopyStrategy, Reuse};
use serde::Serialize;
use serde_json::{json, Value};

use crate::hugetlb::PooledRegion;
use crate::measure::{
    measure_clear, measure_copy, CacheMode, CopyCandidate, MeasureError, Measurement, Plan, Stats,
    Stores,
};
use crate::prepare::{check_shape, counted_backing, inline_note, with_mthp};
use crate::progress::Progress;
use crate::schema::{pct, BackingNote, LimitNote, LimitShare, Report};
use crate::units::show_size;
use crate::LabError;

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
    /// Against the limit at this folio size and channel count.
    #[serde(flatten)]
    pub limit: LimitShare,
    /// The row beat its limit beyond the run's noise: the limit missed
    /// something (tables print "missed" instead of a percentage).
    pub limit_missed: bool,
}

/// A row further above its limit than this (the A/A tolerance) means the
/// limit missed something; closer is noise.
pub fn over_limit(of: Option<f64>) -> bool {
    of.is_some_and(|x| x > 1.0 + crate::measure::AA_TOLERANCE)
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

/// The A/A control of one (folio size, channels) group.
#[derive(Debug, Clone, Serialize)]
pub struct AaNote {
    pub folio_size: usize,
    pub channels: usize,
    #[serde(flatten)]
    pub control: crate::measure::AaControl,
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
            show_size(crate::measure::HOT_SAMPLE_BYTES)
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

/// What copy and clear reports share beyond their rows: the baseline,
/// backing, auto and mc summaries, skipped strategies. Filled per folio
/// size, then written into the report.
struct StrategyTables {
    baseline: String,
    /// The baseline's median per folio size, from the first group that ran
    /// it (normally one channel), and that group's channel count: rows on N
    /// channels are compared with it too.
    base_by_folio: Vec<(usize, f64)>,
    base_channels: Option<usize>,
    auto: Vec<AutoSummary>,
    mc: Vec<McRatio>,
    backing: Vec<BackingNote>,
    skipped: Vec<Skipped>,
    limits: Vec<LimitNote>,
    reps: Vec<HotRepeats>,
    aa: Vec<AaNote>,
    order: Option<String>,
}

impl StrategyTables {
    /// Speedups are against `preferred` when it runs on some channel count
    /// (`runs`: the selected strategies that run on at least one), else
    /// against the first of `runs` (with a note saying so): a baseline that
    /// never ran would leave every speedup undefined.
    fn new<S: Strategy>(
        sel: &Selection<S>,
        runs: &[S],
        preferred: S,
        report: &mut Report<Row>,
    ) -> Self {
        let baseline = match runs.first() {
            _ if runs.contains(&preferred) => preferred.name().to_string(),
            Some(first) => {
                report.notes.push(format!(
                    "{} not run; speedups are against {}",
                    preferred.name(),
                    first.name()
                ));
                first.name().to_string()
            }
            // run() refuses a plan with nothing to run before this.
            None => preferred.name().to_string(),
        };
        StrategyTables {
            baseline,
            base_by_folio: Vec::new(),
            base_channels: None,
            auto: Vec::new(),
            mc: Vec::new(),
            backing: Vec::new(),
            skipped: sel
                .skipped
                .iter()
                .map(|(s, why)| Skipped {
                    function: s.name().into(),
                    reason: (*why).into(),
                })
                .collect(),
            limits: Vec::new(),
            reps: Vec::new(),
            aa: Vec::new(),
            order: None,
        }
    }

    fn backing(&mut self, folio: usize, buffer: &str, b: &foliokit::mem::Backing) {
        self.backing.push(BackingNote::of(folio, buffer, b));
    }

    /// Records the baseline's median at `folio` from the group on the
    /// fewest channels that ran it, once every channel count has run: with
    /// `-t 2,1` the one-channel figure comes second.
    fn set_base(&mut self, folio: usize, groups: &[(usize, Measurement)]) {
        let found = groups
            .iter()
            .filter_map(|(t, m)| {
                let row = m.rows.iter().find(|x| x.function == self.baseline)?;
                Some((*t, row.gbps.median))
            })
            .min_by_key(|&(t, _)| t);
        if let Some((t, median)) = found {
            self.base_by_folio.push((folio, median));
            self.base_channels.get_or_insert(t);
        }
    }

    /// Adds one folio size's measurements as rows, with speedups against
    /// the baseline, the auto summary and each `-mc` variant's ratio.
    fn add(
        &mut self,
        report: &mut Report<Row>,
        measured: &Measurement,
        folio: usize,
        channels: usize,
    ) {
        let m = &measured.rows;
        if measured.reps > 1 {
            self.reps.push(HotRepeats {
                folio_size: folio,
                channels,
                calls_per_loop: measured.reps,
            });
        }
        self.aa.extend(measured.aa.clone().map(|control| AaNote {
            folio_size: folio,
            channels,
            control,
        }));
        self.order.get_or_insert_with(|| measured.order.line());
        let limit = measured.limits.as_ref().map(|l| l.gbps());
        if let Some(l) = &measured.limits {
            self.limits.push(LimitNote {
                folio_size: folio,
                channels,
                limits: l.clone(),
            });
        }
        let median = |name: &str| m.iter().find(|x| x.function == name).map(|x| x.gbps.median);
        // set_base() ran first; the baseline is one that runs, so a miss
        // is a measurement that dropped it.
        let base = self
            .base_by_folio
            .iter()
            .find(|(f, _)| *f == folio)
            .map_or(f64::NAN, |b| b.1);
        report.rows.extend(m.iter().map(|x| {
            let share = LimitShare::of(x.gbps.median, limit);
            Row {
                function: x.function.clone(),
                resolved: x.resolved.clone(),
                folio_size: folio,
                channels,
                gbps: x.gbps,
                speedup: x.gbps.median / base,
                limit: share,
                limit_missed: over_limit(share.of_limit),
            }
        }));
        let best = m
            .iter()
            .filter(|x| x.function != "auto" && !x.function.ends_with("-mc"))
            .max_by(|a, b| a.gbps.median.total_cmp(&b.gbps.median));
        if let (Some(auto), Some(best)) = (m.iter().find(|x| x.function == "auto"), best) {
            self.auto.push(AutoSummary {
                folio_size: folio,
                auto_resolved: auto.resolved.clone(),
                auto_vs_baseline: auto.gbps.median / base,
                auto_vs_libc: median("libc").map(|l| auto.gbps.median / l),
                best_named: best.function.clone(),
                auto_vs_best_named: auto.gbps.median / best.gbps.median,
                channels,
                auto_of_limit: LimitShare::of(auto.gbps.median, limit).of_limit,
                limit_gbps: limit,
            });
        }
        self.mc.extend(m.iter().filter_map(|x| {
            let plain = x.function.strip_suffix("-mc")?;
            Some(McRatio {
                function: plain.to_string(),
                folio_size: folio,
                mc_over_plain: x.gbps.median / median(plain)?,
            })
        }));
    }

    /// Writes the sections (JSON) and the header/footer lines (table).
    fn finish(self, report: &mut Report<Row>) {
        report
            .header
            .extend(self.backing.iter().map(BackingNote::line));
        let on = match self.base_channels.unwrap_or(1) {
            1 => "one channel".to_string(),
            n => format!("{n} channels"),
        };
        report.footer.push(format!(
            "speedup: median over the median of '{}' on {on} at the same folio size",
            self.baseline
        ));
        report.footer.extend(self.order.iter().cloned());
        report.footer.extend(self.reps.iter().map(HotRepeats::line));
        for l in &self.limits {
            report.footer.push(l.line());
        }
        if let Some(l) = self.limits.first() {
            report.footer.push(format!(
                "% limit: median over the limit; {}",
                l.limits.formula
            ));
        }
        // Where more streams get less from memory than one, more channels
        // cannot be faster: say so next to the rows that show it.
        for l in self.limits.iter().filter(|l| l.channels > 1) {
            let one = self
                .limits
                .iter()
                .find(|o| o.channels == 1 && o.folio_size == l.folio_size);
            if let Some(one) = one {
                let (n, o) = (l.limits.gbps(), one.limits.gbps());
                if n < o * 0.95 {
                    report.footer.push(format!(
                        "{} x{}: {} streams got {n:.2} GB/s from {} against {o:.2} for one in this run ({:.2}x): rows on {} channels are bounded by that, not by how the batch was split",
                        show_size(l.folio_size),
                        l.channels,
                        l.channels,
                        match l.limits.stores {
                            Stores::Streaming => "memory",
                            Stores::Cached => "the cache",
                        },
                        n / o,
                        l.channels
                    ));
                }
            }
        }
        let missed: Vec<String> = report
            .rows
            .iter()
            .filter(|r| r.limit_missed)
            .map(|r| {
                format!(
                    "{} at {} x{}",
                    r.function,
                    show_size(r.folio_size),
                    r.channels
                )
            })
            .collect();
        if !missed.is_empty() {
            report.footer.push(format!(
                "limit missed: {} ran above the same-run limit beyond the noise (shown as 'missed'): the probes and primitives did not find what this machine can do there",
                missed.join(", ")
            ));
        }
        report.footer.extend(self.aa.iter().map(AaNote::line));
        let ranks = self.aa.iter().all(|a| a.control.agrees());
        if !ranks {
            report.footer.push(
                "this run cannot rank strategies: an A/A control disagreed (see above); the auto verdicts below are withheld"
                    .into(),
            );
        }
        for a in self.auto.iter().filter(|_| ranks) {
            report.footer.push(format!(
                "auto at {} x{} ran {}: {} of the limit, {:.2}x {}{}, {:.2}x the best named ({})",
                show_size(a.folio_size),
                a.channels,
                a.auto_resolved,
                pct(a.auto_of_limit),
                a.auto_vs_baseline,
                self.baseline,
                a.auto_vs_libc
                    .map(|x| format!(", {x:.2}x libc"))
                    .unwrap_or_default(),
                a.auto_vs_best_named,
                a.best_named
            ));
        }
        for r in &self.mc {
            report.footer.push(format!(
                "{}-mc at {}: {:.2}x its plain variant",
                r.function,
                show_size(r.folio_size),
                r.mc_over_plain
            ));
        }
        for s in &self.skipped {
            report
                .footer
                .push(format!("skipped {}: {}", s.function, s.reason));
        }
        report.section("baseline", &self.baseline);
        report.section("auto", &self.auto);
        if !self.mc.is_empty() {
            report.section("mc", &self.mc);
        }
        report.section("backing", &self.backing);
        report.section("skipped", &self.skipped);
        if !self.limits.is_empty() {
            report.section("limits", &self.limits);
        }
        if !self.reps.is_empty() {
            report.section("hot_repeats", &self.reps);
        }
        report.section("aa_control", &self.aa);
    }
}

/// The shape of a copy or clear run, whatever the operation.
#[derive(Debug, Clone)]
pub struct StrategyPlan<S> {
    /// The strategies to run (and those `all` skipped).
    pub selection: Selection<S>,
    /// Bytes per loop.
    pub size: usize,
    pub folio_sizes: Vec<usize>,
    /// Timed loops per strategy.
    pub loops: usize,
    /// Channel counts, one group of rows each.
    pub channels: Vec<usize>,
    pub reuse: Reuse,
    /// Run the same-run limit probes.
    pub limits: bool,
    pub cache: CacheMode,
}

/// What copy and clear do differently in the one bench: the buffers, the
/// candidates on a channel count, the baseline, and their own lines.
pub trait FolioOp {
    type S: Strategy;
    /// The regions one folio size's rows run on.
    type Buffers;
    /// "copy" or "clear".
    const OP: &'static str;
    /// The kernel's old way, which speedups are against.
    const BASELINE: Self::S;
    /// Buffers of `size` bytes the run needs (memory check).
    const BUFFERS: usize;
    /// Options the shape check does not cover.
    fn check(&self, _p: &StrategyPlan<Self::S>) -> Result<(), LabError> {
        Ok(())
    }
    fn title(&self, p: &StrategyPlan<Self::S>) -> String;
    fn params(&self, p: &StrategyPlan<Self::S>) -> Value;
    /// Notes known before anything runs.
    fn notes(&self, p: &StrategyPlan<Self::S>) -> Vec<String>;
    /// Allocates (and fills) the buffers for `folio`-sized rows.
    fn alloc(&self, size: usize, folio: usize) -> Result<Self::Buffers, LabError>;
    /// Each buffer's name and backing.
    fn backing(
        &self,
        b: &Self::Buffers,
        folio: usize,
    ) -> Vec<(&'static str, foliokit::mem::Backing)>;
    /// What is measured on one channel count (a strategy, or a copy
    /// strategy plain or mc).
    type Cand;
    /// The candidates of `selection` that run on `channels` channels.
    fn on(&self, selection: &Selection<Self::S>, channels: usize) -> Vec<Self::Cand>;
    /// Why strategy `s` does not run on `channels` channels, or `None`
    /// where it does (its plain variant, for copy).
    fn not_on(&self, _s: Self::S, _channels: usize) -> Option<&'static str> {
        None
    }
    /// Measures `cands` on `plan.channels` channels.
    fn measure(
        &self,
        b: &mut Self::Buffers,
        cands: &[Self::Cand],
        plan: &Plan,
        tick: &mut dyn FnMut(),
    ) -> Result<Measurement, MeasureError>;
    /// The operation's own lines, after the rows and before the shared
    /// footer.
    fn conclude(&self, _report: &mut Report<Row>, _p: &StrategyPlan<Self::S>) {}
    /// The seed's figure, quoted under the table.
    fn seed_line(&self) -> String;
}

/// Runs `op` over every folio size and channel count of `p`.
pub fn run<O: FolioOp>(
    op: &O,
    p: &StrategyPlan<O::S>,
    progress: &dyn Progress,
) -> Result<Report<Row>, LabError> {
    check_shape(p.size, &p.folio_sizes, O::BUFFERS)?;
    no_repeats("folio size", &p.folio_sizes, |&f| show_size(f))?;
    no_repeats("channel count", &p.channels, |t| t.to_string())?;
    op.check(p)?;
    let runs = runnable(op, &p.selection.run, &p.channels)?;
    let mut report = Report::<Row>::new(O::OP, op.title(p), op.params(p));
    let mut tables = StrategyTables::new(&p.selection, &runs, O::BASELINE, &mut report);
    report.notes.extend(op.notes(p));
    for &folio in &p.folio_sizes {
        let (mut bufs, note) = with_mthp(folio, || op.alloc(p.size, folio))?;
        report.notes.extend(note);
        for (name, b) in op.backing(&bufs, folio) {
            tables.backing(folio, name, &b);
        }
        let mut groups = Vec::with_capacity(p.channels.len());
        for &t in &p.channels {
            let plan = Plan {
                folio_size: folio,
                loops: p.loops,
                cache: p.cache,
                reuse: p.reuse,
                hint_page: 0,
                channels: t,
                limits: p.limits,
            };
            let cands = op.on(&p.selection, t);
            let steps = (cands.len() + 3 * usize::from(plan.limits)) * (plan.loops + 1);
            progress.begin(steps, &format!("{} {} x{t}", O::OP, show_size(folio)));
            let m = op.measure(&mut bufs, &cands, &plan, &mut || progress.tick())?;
            progress.end();
            groups.push((t, m));
        }
        tables.set_base(folio, &groups);
        for (t, m) in &groups {
            tables.add(&mut report, m, folio, *t);
        }
    }
    op.conclude(&mut report, p);
    tables.finish(&mut report);
    report.footer.push(op.seed_line());
    Ok(report)
}

/// Refuses a list that names a value twice: the rows would repeat with
/// different figures (and speedups) for one configuration.
pub fn no_repeats<T: PartialEq>(
    what: &str,
    list: &[T],
    show: impl Fn(&T) -> String,
) -> Result<(), LabError> {
    match list
        .iter()
        .enumerate()
        .find(|&(i, x)| list[..i].contains(x))
    {
        Some((_, x)) => Err(format!("{what} {} is listed twice", show(x)).into()),
        None => Ok(()),
    }
}

/// The selected strategies that run on at least one of `channels`, or
/// why a channel count would have nothing to run (an empty table).
fn runnable<O: FolioOp>(op: &O, run: &[O::S], channels: &[usize]) -> Result<Vec<O::S>, LabError> {
    for &t in channels {
        if run.iter().all(|&s| op.not_on(s, t).is_some()) {
            let mut why: Vec<String> = Vec::new();
            for &s in run {
                let w = format!("{} {}", s.name(), op.not_on(s, t).unwrap_or_default());
                if !why.contains(&w) {
                    why.push(w);
                }
            }
            return Err(format!(
                "nothing to {} on {t} channels: {}; add 1 to -t or another function to -f",
                O::OP,
                why.join("; ")
            )
            .into());
        }
    }
    Ok(run
        .iter()
        .copied()
        .filter(|&s| channels.iter().any(|&t| op.not_on(s, t).is_none()))
        .collect())
}

/// Seed 000: folio copies, plain and (with `mc`) machine-check-safe.
pub struct CopyBench {
    /// Also measure each strategy's `-mc` variant where one exists.
    pub mc: bool,
}

impl CopyBench {
    fn all_candidates(&self, selection: &Selection<CopyStrategy>) -> Vec<CopyCandidate> {
        let mut out = Vec::new();
        for &s in &selection.run {
            out.push(CopyCandidate::plain(s));
            if self.mc && s.has_mc() {
                out.push(CopyCandidate::mc(s));
            }
        }
        out
    }
}

impl FolioOp for CopyBench {
    type S = CopyStrategy;
    type Cand = CopyCandidate;
    type Buffers = (PooledRegion, PooledRegion);
    const OP: &'static str = "copy";
    const BASELINE: CopyStrategy = CopyStrategy::PerPage;
    const BUFFERS: usize = 2;

    /// The candidates on `channels` channels: mc variants keep their fault
    /// record per thread, so they run on one.
    fn on(&self, selection: &Selection<CopyStrategy>, channels: usize) -> Vec<CopyCandidate> {
        self.all_candidates(selection)
            .into_iter()
            .filter(|x| channels == 1 || !x.mc)
            .collect()
    }

    fn title(&self, p: &StrategyPlan<Self::S>) -> String {
        format!(
            "copy: {} per loop, {}, {} loops after a verified warm-up",
            show_size(p.size),
            match p.cache {
                CacheMode::Evict => "source evicted before each loop",
                CacheMode::Hot => "buffers left hot",
            },
            p.loops
        )
    }

    fn params(&self, p: &StrategyPlan<Self::S>) -> Value {
        json!({
            "size": p.size, "folio_sizes": p.folio_sizes, "loops": p.loops,
            "cache": p.cache, "reuse": p.reuse, "mc": self.mc, "channels": p.channels,
            "functions": p.selection.run.iter().map(|s| s.name()).collect::<Vec<_>>(),
        })
    }

    fn notes(&self, p: &StrategyPlan<Self::S>) -> Vec<String> {
        let mut notes = Vec::new();
        if self.mc && !p.channels.contains(&1) {
            notes.push("mc variants run on one channel only; add 1 to -t to measure them".into());
        }
        notes.extend(inline_note(p.size, &p.channels));
        if self.mc {
            for s in p.selection.run.iter().filter(|s| !s.has_mc()) {
                notes.push(format!("{} has no machine-check-safe variant", s.name()));
            }
        }
        notes
    }

    fn alloc(&self, size: usize, folio: usize) -> Result<Self::Buffers, LabError> {
        let mut src = PooledRegion::new(size, folio)?;
        let dst = PooledRegion::new(size, folio)?;
        src.as_mut_slice().fill(0x5A);
        Ok((src, dst))
    }

    fn backing(
        &self,
        b: &Self::Buffers,
        folio: usize,
    ) -> Vec<(&'static str, foliokit::mem::Backing)> {
        vec![
            ("src", counted_backing(&b.0, folio)),
            ("dst", counted_backing(&b.1, folio)),
        ]
    }

    fn measure(
        &self,
        b: &mut Self::Buffers,
        cands: &[Self::Cand],
        plan: &Plan,
        tick: &mut dyn FnMut(),
    ) -> Result<Measurement, MeasureError> {
        measure_copy(&b.0, &mut b.1, cands, plan, tick)
    }

    /// What spreading a batch across channels buys over the platform
    /// memcpy on one thread: the comparison a user deciding on channels
    /// wants.
    fn conclude(&self, report: &mut Report<Row>, p: &StrategyPlan<Self::S>) {
        let median = |f: &str, folio: usize, t: usize| {
            report
                .rows
                .iter()
                .find(|r| r.function == f && r.folio_size == folio && r.channels == t)
                .map(|r| r.gbps.median)
        };
        let most = p.channels.iter().copied().max().unwrap_or(1);
        if most <= 1 {
            return;
        }
        let mut lines = Vec::new();
        for &folio in &p.folio_sizes {
            if let (Some(auto), Some(libc), Some(pp)) = (
                median("auto", folio, most),
                median("libc", folio, 1),
                median("per-page", folio, 1),
            ) {
                lines.push(format!(
                    "auto on {most} channels at {}: {:.2}x libc and {:.2}x per-page on one",
                    show_size(folio),
                    auto / libc,
                    auto / pp
                ));
            }
        }
        report.footer.extend(lines);
    }

    fn seed_line(&self) -> String {
        crate::seeds::quote("copy")
    }
}

/// Seed 002 in user space: clearing folios, butterfly order and the rest.
pub struct ClearBench {
    /// Page index within each folio that butterfly converges on.
    pub hint_page: usize,
}

impl FolioOp for ClearBench {
    type S = ClearStrategy;
    type Cand = ClearStrategy;
    type Buffers = PooledRegion;
    const OP: &'static str = "clear";
    const BASELINE: ClearStrategy = ClearStrategy::Butterfly;
    const BUFFERS: usize = 1;

    fn on(&self, selection: &Selection<ClearStrategy>, channels: usize) -> Vec<ClearStrategy> {
        selection
            .run
            .iter()
            .copied()
            .filter(|&s| self.not_on(s, channels).is_none())
            .collect()
    }

    /// Butterfly clears page by page around its hint: it runs on one
    /// channel only.
    fn not_on(&self, s: ClearStrategy, channels: usize) -> Option<&'static str> {
        (channels > 1 && s == ClearStrategy::Butterfly)
            .then_some("clears page by page around its hint page, so it runs on one channel only")
    }

    fn check(&self, p: &StrategyPlan<Self::S>) -> Result<(), LabError> {
        let page = foliokit::batch::page_size();
        match p.folio_sizes.iter().find(|&&f| self.hint_page >= f / page) {
            Some(&folio) => Err(format!(
                "--hint-page {} is outside a {} folio of {} pages",
                self.hint_page,
                show_size(folio),
                folio / page
            )
            .into()),
            None => Ok(()),
        }
    }

    fn title(&self, p: &StrategyPlan<Self::S>) -> String {
        format!(
            "clear: {} per loop, {}, butterfly converges on page {}, {} loops after a verified warm-up",
            show_size(p.size),
            match p.cache {
                CacheMode::Evict => "destination evicted before each loop",
                CacheMode::Hot => "no eviction",
            },
            self.hint_page,
            p.loops
        )
    }

    fn params(&self, p: &StrategyPlan<Self::S>) -> Value {
        json!({
            "size": p.size, "folio_sizes": p.folio_sizes, "loops": p.loops,
            "cache": p.cache, "reuse": p.reuse, "hint_page": self.hint_page,
            "functions": p.selection.run.iter().map(|s| s.name()).collect::<Vec<_>>(),
        })
    }

    fn notes(&self, p: &StrategyPlan<Self::S>) -> Vec<String> {
        inline_note(p.size, &p.channels).into_iter().collect()
    }

    fn alloc(&self, size: usize, folio: usize) -> Result<Self::Buffers, LabError> {
        Ok(PooledRegion::new(size, folio)?)
    }

    fn backing(
        &self,
        b: &Self::Buffers,
        folio: usize,
    ) -> Vec<(&'static str, foliokit::mem::Backing)> {
        vec![("dst", counted_backing(b, folio))]
    }

    fn measure(
        &self,
        b: &mut Self::Buffers,
        cands: &[Self::Cand],
        plan: &Plan,
        tick: &mut dyn FnMut(),
    ) -> Result<Measurement, MeasureError> {
        let plan = Plan {
            hint_page: self.hint_page,
            ..*plan
        };
        measure_clear(b, cands, &plan, tick)
    }

    fn conclude(&self, report: &mut Report<Row>, p: &StrategyPlan<Self::S>) {
        if p.channels.iter().any(|&t| t > 1) && p.selection.run.contains(&ClearStrategy::Butterfly)
        {
            report.notes.push(
                "butterfly runs on one channel only: it clears page by page around a hint page"
                    .into(),
            );
        }
    }

    fn seed_line(&self) -> String {
        crate::seeds::quote("clear")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::{Measured, Order};

    fn clear_sel(run: &[ClearStrategy]) -> Selection<ClearStrategy> {
        Selection {
            run: run.to_vec(),
            skipped: Vec::new(),
        }
    }

    fn group(rows: &[(&str, f64)]) -> Measurement {
        Measurement {
            rows: rows
                .iter()
                .map(|&(f, g)| Measured {
                    function: f.into(),
                    resolved: f.into(),
                    gbps: Stats::of(&[g]).unwrap(),
                })
                .collect(),
            limits: None,
            reps: 1,
            aa: None,
            order: Order::new(rows.len(), 1),
        }
    }

    #[test]
    fn a_channel_count_with_nothing_to_run_is_refused() {
        use ClearStrategy::{Butterfly, Libc};
        let op = ClearBench { hint_page: 0 };
        let err = runnable(&op, &[Butterfly], &[2]).unwrap_err().to_string();
        assert!(err.contains("nothing to clear on 2 channels"), "{err}");
        assert!(err.contains("one channel only"), "{err}");
        assert_eq!(runnable(&op, &[Butterfly, Libc], &[2]).unwrap(), [Libc]);
        assert_eq!(
            runnable(&op, &[Butterfly, Libc], &[2, 1]).unwrap(),
            [Butterfly, Libc]
        );
    }

    #[test]
    fn the_baseline_is_one_that_runs() {
        use ClearStrategy::{Butterfly, Libc};
        let mut report = Report::<Row>::new("clear", String::new(), json!({}));
        let t = StrategyTables::new(
            &clear_sel(&[Butterfly, Libc]),
            &[Libc],
            Butterfly,
            &mut report,
        );
        assert_eq!(t.baseline, "libc");
        assert!(report.notes[0].contains("speedups are against libc"));
        let t = StrategyTables::new(
            &clear_sel(&[Butterfly, Libc]),
            &[Butterfly, Libc],
            Butterfly,
            &mut report,
        );
        assert_eq!(t.baseline, "butterfly");
    }

    #[test]
    fn speedups_use_the_baseline_measured_after_them() {
        use ClearStrategy::{Butterfly, Libc};
        let mut report = Report::<Row>::new("clear", String::new(), json!({}));
        let sel = clear_sel(&[Butterfly, Libc]);
        let mut t = StrategyTables::new(&sel, &sel.run, Butterfly, &mut report);
        // -t 2,1: butterfly only ran in the second group.
        let groups = [
            (2, group(&[("libc", 60.0)])),
            (1, group(&[("butterfly", 30.0), ("libc", 90.0)])),
        ];
        t.set_base(2 << 20, &groups);
        for (c, m) in &groups {
            t.add(&mut report, m, 2 << 20, *c);
        }
        let speedups: Vec<f64> = report.rows.iter().map(|r| r.speedup).collect();
        assert_eq!(speedups, [2.0, 1.0, 3.0]);
        t.finish(&mut report);
        assert!(report.footer[0].contains("'butterfly' on one channel"));
    }

    #[test]
    fn repeated_values_are_refused() {
        assert!(no_repeats("channel count", &[1, 2], |t: &usize| t.to_string()).is_ok());
        let err = no_repeats("channel count", &[1, 2, 1], |t: &usize| t.to_string()).unwrap_err();
        assert_eq!(err.to_string(), "channel count 1 is listed twice");
    }
}

//! `foliokit bench <op>`: shared plumbing for the experiments.

pub mod clear;
pub mod copy;
pub mod fault;
pub mod init;
pub mod migrate;
pub mod mover;
pub mod mremap;
pub mod restore;

use foliokit::strategy::{parse_list, Selection, Strategy};
use foliokit_lab::measure::{Measurement, Stores};
use std::fmt::Write as _;

use crate::args::{approx_size, show_size};
use crate::machine::mem_available;
use crate::report::{
    over_limit, pct, AaNote, AutoSummary, BackingNote, HotRepeats, LimitNote, McRatio, Report, Row,
    Skipped,
};
use crate::CliError;

/// Prints a report in `format`; nothing when the options only asked for help.
pub fn print<R: crate::report::TableRow>(
    r: Option<Report<R>>,
    format: crate::args::Format,
) -> Result<(), CliError> {
    if let Some(r) = r {
        print!("{}", r.render(format));
    }
    Ok(())
}

/// `-f help`: every strategy, whether this CPU has it, and what it does.
pub fn strategy_help<S: Strategy>() -> String {
    let mut out = format!("{} strategies (-f name[,name...] | all):\n", S::OP);
    for s in S::ALL {
        let avail = match s.unavailable() {
            None => "yes".to_string(),
            Some(why) => format!("no: {why}"),
        };
        let _ = writeln!(out, "  {:<10} [{avail}] {}", s.name(), s.description());
    }
    out
}

/// Parses `-f`, or prints the help and returns `None` for `-f help`.
pub fn select<S: Strategy>(spec: &str) -> Result<Option<Selection<S>>, CliError> {
    if spec.trim() == "help" {
        print!("{}", strategy_help::<S>());
        return Ok(None);
    }
    Ok(Some(parse_list::<S>(spec)?))
}

/// Rejects folio sizes no page-table level backs: a size must be the base
/// page, a THP size this kernel offers (PMD or mTHP), or 1G (hugetlb).
/// Without THP sysfs at all, powers of two up to 2M pass: the region then
/// says what backing it obtained.
fn check_folio_sizes(folios: &[usize], page: usize) -> Result<(), CliError> {
    const GIB: usize = 1 << 30;
    let thp = foliokit::mem::system::thp_state();
    let mut offered: Vec<usize> = thp.mthp.iter().map(|m| m.size).collect();
    offered.extend(thp.pmd_size);
    let no_thp_info = offered.is_empty();
    offered.extend([page, GIB]);
    offered.sort_unstable();
    offered.dedup();
    for &f in folios {
        let ok = offered.contains(&f)
            || (no_thp_info && f.is_power_of_two() && f >= page && f <= 2 << 20);
        if !ok {
            let list: Vec<String> = offered.iter().map(|&s| show_size(s)).collect();
            return Err(format!(
                "folio size {} has no THP order on this kernel; it offers {} (base page, THP sizes from sysfs, 1G hugetlb)",
                show_size(f),
                list.join(" ")
            )
            .into());
        }
    }
    Ok(())
}

/// The note for rows on several channels whose batch is too small for the
/// pool to wake its workers (it copies such a batch on the calling thread).
pub fn inline_note(size: usize, channels: &[u32]) -> Option<String> {
    let min = foliokit::tune::CHANNEL_MIN_BATCH_BYTES;
    (size < min && channels.iter().any(|&t| t > 1)).then(|| {
        format!(
            "rows on more than one channel ran on the calling thread: a batch under {} is not worth waking channel workers for (CHANNEL_MIN_BATCH_BYTES)",
            show_size(min)
        )
    })
}

/// Checks the folio sizes divide the size and the memory is there.
pub fn check_shape(size: usize, folios: &[usize], buffers: usize) -> Result<(), CliError> {
    let page = foliokit::batch::page_size();
    check_folio_sizes(folios, page)?;
    for &f in folios {
        if f % page != 0 {
            return Err(format!(
                "folio size {} is not a multiple of the {page}-byte page",
                show_size(f)
            )
            .into());
        }
        if size % f != 0 {
            return Err(format!(
                "size {} is not a whole number of {} folios",
                show_size(size),
                show_size(f)
            )
            .into());
        }
    }
    let need = size.saturating_mul(buffers);
    if let Some(avail) = mem_available() {
        if need > avail {
            return Err(format!(
                "this run needs {} of memory ({buffers} × {}) but only {} is available",
                show_size(need),
                show_size(size),
                approx_size(avail)
            )
            .into());
        }
    }
    Ok(())
}

/// What copy and clear reports share beyond their rows: the baseline,
/// backing, auto and mc summaries, skipped strategies. Filled per folio
/// size, then written into the report.
pub struct StrategyTables {
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
    /// Speedups are against `preferred` when it runs, else against the
    /// first strategy selected (with a note saying so).
    pub fn new<S: Strategy>(sel: &Selection<S>, preferred: S, report: &mut Report<Row>) -> Self {
        let baseline = if sel.run.contains(&preferred) {
            preferred.name().to_string()
        } else {
            let first = sel.run[0].name();
            report.notes.push(format!(
                "{} not run; speedups are against {first}",
                preferred.name()
            ));
            first.to_string()
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

    pub fn backing(&mut self, folio: usize, buffer: &str, b: &foliokit::mem::Backing) {
        self.backing.push(BackingNote::of(folio, buffer, b));
    }

    /// Adds one folio size's measurements as rows, with speedups against
    /// the baseline, the auto summary and each `-mc` variant's ratio.
    pub fn add(
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
        let stored = self
            .base_by_folio
            .iter()
            .find(|(f, _)| *f == folio)
            .map(|b| b.1);
        let base = match (stored, median(&self.baseline)) {
            (Some(b), _) => b,
            (None, Some(b)) => {
                self.base_by_folio.push((folio, b));
                self.base_channels.get_or_insert(channels);
                b
            }
            (None, None) => f64::NAN,
        };
        report.rows.extend(m.iter().map(|x| Row {
            function: x.function.clone(),
            resolved: x.resolved.clone(),
            folio_size: folio,
            channels,
            gbps: x.gbps,
            speedup: x.gbps.median / base,
            limit_gbps: limit,
            of_limit: limit.map(|l| x.gbps.median / l),
            limit_missed: over_limit(limit.map(|l| x.gbps.median / l)),
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
                auto_of_limit: limit.map(|l| auto.gbps.median / l),
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
    pub fn finish(self, report: &mut Report<Row>) {
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

/// Faults in the regions `alloc` makes for `folio`-sized rows with real mTHP
/// backing where that takes a sysfs change. For an mTHP size (above the base
/// page, below the PMD size) that sysfs does not already allow via madvise,
/// a root run sets that size's knob to `madvise` — so only ranges that ask
/// for huge pages, as our regions do, get it — while `alloc` faults the
/// regions in, then puts the knob back, also on error (the guard's drop)
/// and on Ctrl-C (the same handler as the mremap bench). Returns the
/// regions and a note saying what was done, or why not.
pub fn with_mthp<T>(
    folio: usize,
    alloc: impl FnOnce() -> Result<T, CliError>,
) -> Result<(T, Option<String>), CliError> {
    use foliokit::mem::system::{is_root, thp_state};
    use foliokit_lab::mthp::MthpSettings;
    let thp = thp_state();
    let pmd = thp.pmd_size.unwrap_or(2 << 20);
    let is_mthp = folio > foliokit::batch::page_size() && folio < pmd;
    if !is_mthp {
        return Ok((alloc()?, None));
    }
    let mut settings = MthpSettings::system();
    let sizes = settings.snapshot();
    if !sizes.contains_key(&folio) {
        let why = format!(
            "{}: this kernel offers no {} mTHP size; 4K pages used",
            show_size(folio),
            show_size(folio)
        );
        return Ok((alloc()?, Some(why)));
    }
    // The kernel gives a range the largest allowed size that fits, so
    // larger sizes must be off while our buffers fault in.
    let larger: Vec<usize> = sizes
        .keys()
        .copied()
        .filter(|&s| s > folio && thp.madvise_allows(s))
        .collect();
    let allowed = thp.madvise_allows(folio);
    if allowed && larger.is_empty() {
        return Ok((alloc()?, None));
    }
    let names = |v: &[usize]| {
        v.iter()
            .map(|&s| show_size(s))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if !is_root() {
        let why = if allowed {
            format!(
                "{}: sysfs also allows larger sizes ({}) and turning them off needs root: the buffers may hold those instead",
                show_size(folio),
                names(&larger)
            )
        } else {
            format!(
                "{}: sysfs does not allow {} mTHP via madvise and enabling it needs root; 4K pages used",
                show_size(folio),
                show_size(folio)
            )
        };
        return Ok((alloc()?, Some(why)));
    }
    let changed = (|| {
        if !allowed {
            settings.set(folio, "madvise")?;
            arm_interrupt_restore(&settings);
        }
        for &s in &larger {
            settings.set(s, "never")?;
            arm_interrupt_restore(&settings);
        }
        Ok::<_, foliokit_lab::mthp::MthpError>(())
    })();
    let made = match changed {
        Ok(()) => alloc(),
        Err(e) => Err(e.into()),
    };
    let restored = settings.restore();
    arm_interrupt_restore(&settings);
    let made = made?;
    restored?;
    let mut did = Vec::new();
    if !allowed {
        did.push(format!("{} set to madvise", show_size(folio)));
    }
    if !larger.is_empty() {
        did.push(format!("{} set to never", names(&larger)));
    }
    let note = format!(
        "{}: mTHP {} in sysfs while the buffers were faulted in, then restored",
        show_size(folio),
        did.join(", ")
    );
    Ok((made, Some(note)))
}

/// The backing of a region, with the folios counted from the kernel's page
/// flags when they can be (root; the first 32 MiB, which is enough to tell
/// mTHP from 4 KiB pages and fast to read).
pub fn counted_backing(
    region: &foliokit_lab::hugetlb::PooledRegion,
    folio: usize,
) -> foliokit::mem::Backing {
    let mut b = region.backing();
    let pmd = foliokit::mem::system::thp_state()
        .pmd_size
        .unwrap_or(2 << 20);
    if folio > foliokit::batch::page_size() && folio < pmd {
        let sample = region.len().min(32 << 20);
        if let Some(c) = foliokit_lab::census::census(region.as_ptr(), sample) {
            b.obtained = format!(
                "{} (census of the first {}: {})",
                if c.folios.keys().any(|&s| s == folio) {
                    format!("mTHP {}", show_size(folio))
                } else {
                    "no mTHP".to_string()
                },
                show_size(sample),
                c.summary()
            );
        }
    }
    b
}

/// The mTHP knobs to put back if the user interrupts a run that changed
/// them (read by the Ctrl-C handler).
static RESTORE_ON_INTERRUPT: std::sync::Mutex<Vec<(std::path::PathBuf, String)>> =
    std::sync::Mutex::new(Vec::new());

/// Makes Ctrl-C (and SIGTERM) restore what `settings` changed so far, then
/// exit; call again after every change.
pub fn arm_interrupt_restore(settings: &foliokit_lab::mthp::MthpSettings) {
    restore_on_interrupt(settings.saved());
}

/// Makes Ctrl-C (and SIGTERM) write each (path, value) in order, then
/// exit: how a run that changed system settings puts them back. An empty
/// list disarms it.
pub fn restore_on_interrupt(saved: Vec<(std::path::PathBuf, String)>) {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    *RESTORE_ON_INTERRUPT
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = saved;
    INSTALLED.get_or_init(|| {
        let _ = ctrlc::set_handler(|| {
            let saved = RESTORE_ON_INTERRUPT
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for (path, value) in saved.iter() {
                let _ = std::fs::write(path, value);
            }
            eprintln!("foliokit: interrupted; system settings restored");
            std::process::exit(130);
        });
    });
}

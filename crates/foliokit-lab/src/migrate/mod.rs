//! Seed 001's batched migration on this machine (`foliokit bench migrate`).
//!
//! (1) GB/s by folio size: the one-thread per-page-copy baseline vs N copy
//!     channels, through the relocation path (moves out and in included);
//! (2) batch size x channels -> GB/s | first-folio latency;
//! (3) the kernel path (move_pages) vs relocation, per direction (seed 000's
//!     move_pages table: DRAM0 -> DRAM1, DRAM -> memory-only node and back).
//!
//! Before every run the source is put on the direction's first node with
//! move_pages, outside the timing, so every run really moves every page.

//!
//! Table 4's mover is another process ([`mover`]).

pub mod mover;
pub mod phases;

use foliokit::mem::system::{is_root, memory_only_nodes, numa_nodes};
use foliokit::mem::Region;
use foliokit::migrate::{migrate, MigrateError, MigrateOptions, MigratePath, MigrateReport, Path};
use foliokit::CopyStrategy;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Duration;

use crate::census::census;
use crate::copy_clear::no_repeats;
use crate::hugetlb::PooledRegion;
use crate::measure::Stats;
use crate::mthp::{arm_interrupt_restore, MthpSettings};
use crate::prepare::check_shape;
use crate::progress::Progress;
use crate::schema::{Latency, Report};
use crate::units::show_size;
use crate::LabError;

const PAGE: usize = 4096;

/// The tables this bench has.
const TABLES: [u8; 4] = [1, 2, 3, 4];

/// Table 2's (and 3's) source folio size.
const TABLE2_FOLIO: usize = 2 << 20;

/// Refuses an empty list or a table number this bench does not have: it
/// would run nothing and still succeed.
fn check_tables(tables: &[u8]) -> Result<(), LabError> {
    let names = "1, 2, 3 and 4";
    match tables.iter().find(|t| !TABLES.contains(t)) {
        Some(t) => Err(format!("there is no table {t}: the tables are {names}").into()),
        None if tables.is_empty() => Err(format!("no table to run: the tables are {names}").into()),
        None => Ok(()),
    }
}

/// Table 2's batch sizes as they run, in the order asked: each clamped to
/// `lo..=hi` pages, repeats dropped (clamped sizes measure the same thing,
/// so they become one row instead of rows with the same label).
fn clamp_batches(asked: &[usize], lo: usize, hi: usize) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for &b in asked {
        let b = b.clamp(lo.min(hi), hi);
        if !out.contains(&b) {
            out.push(b);
        }
    }
    // Smallest first: table 2's speedups are over its smallest batch.
    out.sort_unstable();
    out
}

/// The tables to run and their shapes.
#[derive(Debug, Clone)]
pub struct MigratePlan {
    /// Bytes migrated per run.
    pub size: usize,
    /// Folio sizes for table 1.
    pub page: Vec<usize>,
    /// Copy channel counts.
    pub channels: Vec<usize>,
    /// Batch size in pages for tables 1 and 3.
    pub table_batch: usize,
    /// Batch sizes in pages for table 2.
    pub batch: Vec<usize>,
    /// Runs per configuration.
    pub loops: u32,
    /// Also let a first-folio latency budget pick the batch.
    pub latency_budget: Option<Duration>,
    /// Which tables: 1, 2, 3, 4.
    pub tables: Vec<u8>,
    /// Target NUMA node (default: the highest-numbered online node).
    pub node: Option<u32>,
    /// Node the source is put on before every run.
    pub from: Option<u32>,
    /// The path the relocation rows of tables 1-2 ask for.
    pub path: Path,
}

/// The row label of a path's rows.
pub fn path_label(p: Path) -> &'static str {
    match p {
        Path::Relocate => "relocate",
        Path::Auto => "auto",
        Path::Kernel => "kernel",
    }
}

/// Where the pages start and where they go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Direction {
    pub from: u32,
    pub to: u32,
}

impl Direction {
    /// "0 -> 1", with memory-only nodes marked (seed 000 says "CXL").
    fn label(self, memory_only: &[u32]) -> String {
        let name = |n: u32| {
            if memory_only.contains(&n) {
                format!("{n} (memory-only)")
            } else {
                n.to_string()
            }
        };
        format!("{} -> {}", name(self.from), name(self.to))
    }
}

/// Seed 000's directions on this machine's nodes: CPU node to CPU node,
/// CPU node to each memory-only node, and back; one direction when the
/// user named the target or there is only one node.
fn directions(
    nodes: &[u32],
    memory_only: &[u32],
    from: Option<u32>,
    to: Option<u32>,
    default: Direction,
) -> Vec<Direction> {
    if nodes.len() < 2 || to.is_some() {
        return vec![default];
    }
    let cpu: Vec<u32> = nodes
        .iter()
        .copied()
        .filter(|n| !memory_only.contains(n))
        .collect();
    let d = |from, to| Direction { from, to };
    let mut out = Vec::new();
    match (cpu.first(), cpu.get(1)) {
        (Some(&c0), Some(&c1)) => {
            out.push(d(c0, c1));
            out.extend(memory_only.iter().map(|&m| d(c0, m)));
            out.push(d(c1, c0));
            out.extend(memory_only.iter().map(|&m| d(m, c0)));
        }
        (Some(&c0), None) => {
            out.extend(memory_only.iter().map(|&m| d(c0, m)));
            out.extend(memory_only.iter().map(|&m| d(m, c0)));
        }
        _ => out.push(default),
    }
    if from.is_some() {
        out.retain(|x| Some(x.from) == from);
    }
    if out.is_empty() {
        out.push(default);
    }
    out
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MigrateRow {
    pub table: u8,
    /// Source node -> target node.
    pub direction: String,
    /// "baseline" (one thread, per-page copy), "relocate" or "kernel".
    pub function: String,
    pub folio_size: usize,
    pub channels: usize,
    /// Median pages per batch (for a latency budget: where it settled).
    pub batch_pages: usize,
    /// Median pages that changed node per run (kernel: pages not on the
    /// target before; relocation: pages now in new folios there).
    pub pages_moved: usize,
    pub gbps: Option<Stats>,
    pub first_folio_us: Option<Latency>,
    pub total_ms: Option<Stats>,
    pub speedup: Option<f64>,
    /// The same-run copy limit of these buffers on these channels (GB/s,
    /// median of `min(read, write)` probed beside every run).
    pub copy_limit_gbps: Option<f64>,
    /// The row's median GB/s over that limit: what the migration costs
    /// beyond copying its bytes is the rest.
    pub of_copy_limit: Option<f64>,
    /// Microseconds to copy one folio of this size at that limit: no
    /// batch's first folio can be usable again sooner, since relocation
    /// copies it before installing it.
    pub folio_copy_us: Option<f64>,
    /// Table 4: the target process's longest stall per run (µs, median and
    /// p99 over runs), timed by a thread in the target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_stall_us: Option<Latency>,
    /// Relocation: where a run's time went, per phase (absent in results
    /// written before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<phases::PhasesMs>,
    /// Folios behind the source, from kpageflags (root), or the backing;
    /// with what the last run left where that differs.
    pub obtained: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

struct Runs {
    gbps: Vec<f64>,
    first: Vec<f64>,
    total_ms: Vec<f64>,
    batch_pages: Vec<f64>,
    moved: Vec<f64>,
    notes: Vec<String>,
    nothing_to_move: bool,
    /// Why the path could not run here (the row says so instead of a figure).
    unavailable: Option<String>,
    /// The source's folios after the last run (census, root only): the
    /// kernel path may split THPs on a fragmented target node.
    backing_after: Option<String>,
    /// The copy limit probed before each run (GB/s).
    copy_limit: Vec<f64>,
    /// Each run's phases, summed over its batches.
    phases: Vec<foliokit::migrate::Phases>,
}

/// The copy limit of `src` and `scratch` on `channels` channels, probed
/// once: `min(read, write)` (a copy reads and writes every byte), as the
/// copy benches compute it.
fn copy_limit(
    src: &mut Region,
    scratch: &mut Region,
    channels: usize,
    folio: usize,
) -> Result<f64, LabError> {
    use crate::measure::{gbps, probe, Probe};
    let len = src.len().min(scratch.len());
    let time = |p: Probe, buf: &mut [u8]| -> Result<f64, LabError> {
        let t = std::time::Instant::now();
        probe(p, &mut buf[..len], channels, folio)?;
        Ok(gbps(len, t.elapsed().as_secs_f64()))
    };
    let read = time(Probe::Read, src.as_mut_slice())?;
    let write = time(Probe::Write, scratch.as_mut_slice())?;
    Ok(read.min(write))
}

/// Puts `src` on `node` with move_pages, outside any timing.
fn place(src: &mut Region, node: u32, channels: usize) -> Result<(), LabError> {
    let o = MigrateOptions::default()
        .path(Path::Kernel)
        .channels(channels);
    // SAFETY: the region is ours and nothing else uses it meanwhile.
    let rep = unsafe { migrate(src.as_mut_ptr(), src.len(), node, &o) }?;
    if !rep.failed.is_empty() {
        return Err(format!(
            "could not put the source on node {node} before the run: {} pages stayed (first errno {})",
            rep.failed.len(),
            rep.failed[0].1
        )
        .into());
    }
    Ok(())
}

/// Pages of a sample (one per 2 MiB, at most 4096) not on `node`.
fn off_node(src: &Region, node: u32) -> Result<usize, String> {
    let step = (src.len() / 4096).max(2 << 20).next_multiple_of(PAGE);
    let pages: Vec<usize> = (0..src.len())
        .step_by(step)
        .map(|o| src.as_ptr() as usize + o)
        .collect();
    let mut status = vec![0i32; pages.len()];
    foliokit::migrate::page_nodes(&pages, &mut status)
        .map_err(|e| format!("placement not checked: move_pages query failed: {e}"))?;
    // A negative status (page not present, say) is not "on the node" either.
    Ok(status.iter().filter(|&&s| s != node as i32).count())
}

/// Migrates `src` `loops` times with `o` in direction `dir`, checking the
/// bytes survive and the pages arrive.
fn runs(
    src: &mut Region,
    scratch: &mut Region,
    dir: Direction,
    o: &MigrateOptions,
    loops: u32,
    tick: &dyn Fn(),
) -> Result<Runs, LabError> {
    let node = dir.to;
    let mut r = Runs {
        gbps: Vec::new(),
        first: Vec::new(),
        total_ms: Vec::new(),
        batch_pages: Vec::new(),
        moved: Vec::new(),
        notes: Vec::new(),
        nothing_to_move: false,
        unavailable: None,
        backing_after: None,
        copy_limit: Vec::new(),
        phases: Vec::new(),
    };
    for l in 0..loops {
        if dir.from != dir.to {
            place(src, dir.from, o.channels)?;
        }
        // Beside every run, on the same buffers and channels, outside its
        // timing: the read probe leaves the source's bytes and placement.
        r.copy_limit
            .push(copy_limit(src, scratch, o.channels, o.folio_size)?);
        // SAFETY: the region is ours and nothing else uses it meanwhile.
        let rep: MigrateReport = match unsafe { migrate(src.as_mut_ptr(), src.len(), node, o) } {
            Ok(rep) => rep,
            // A kernel without UFFDIO_MOVE, a process without
            // /dev/userfaultfd access, or a sandbox: say so in the row.
            Err(e @ MigrateError::Refused { .. }) => {
                r.unavailable = Some(format!("relocation unavailable: {e}"));
                (l..loops).for_each(|_| tick());
                return Ok(r);
            }
            Err(e) => return Err(e.into()),
        };
        if l == 0 && !src.as_slice().iter().all(|&b| b == 0x5A) {
            return Err(format!("{} path changed the bytes it migrated", rep.path).into());
        }
        r.gbps.push(rep.gbps());
        r.first.extend(rep.batches.iter().map(|b| b.first_folio_us));
        r.total_ms.push(rep.secs * 1e3);
        r.phases.push(phases::of_run(&rep));
        r.batch_pages
            .extend(rep.batches.iter().map(|b| b.pages as f64));
        r.moved.push(match rep.path {
            MigratePath::Kernel => rep.pages_to_move - rep.failed.len().min(rep.pages_to_move),
            _ => rep.relocated_pages,
        } as f64);
        if dir.from != dir.to {
            let n = match off_node(src, node) {
                Ok(0) => None,
                Ok(off) => Some(format!(
                    "{off} sampled pages were not on node {node} afterwards"
                )),
                Err(e) => Some(e),
            };
            if let Some(n) = n.filter(|n| !r.notes.contains(n)) {
                r.notes.push(n);
            }
        }
        r.nothing_to_move |= rep.path == MigratePath::Kernel && rep.pages_to_move == 0;
        if o.path != Path::Kernel && rep.path == MigratePath::Kernel {
            r.notes
                .push("ran the kernel path: relocation was refused".into());
        }
        for n in rep.notes {
            if !r.notes.contains(&n) {
                r.notes.push(n);
            }
        }
        tick();
    }
    r.backing_after = census(src.as_ptr(), src.len()).map(|c| c.summary());
    Ok(r)
}

#[allow(clippy::too_many_arguments)]
fn row(
    table: u8,
    dir: &str,
    function: &str,
    folio: usize,
    o: &MigrateOptions,
    r: Runs,
    obtained: &str,
) -> MigrateRow {
    // A run that moved no page has no throughput: its time is a page walk
    // (seen: relocation leaving every 64K folio whole to move_pages, which
    // had nothing to move on one node, "ran" at 140% of the copy limit).
    let moved_none = !r.moved.is_empty() && r.moved.iter().all(|&m| m == 0.0);
    let nothing = r.nothing_to_move || moved_none;
    let hide = nothing || r.unavailable.is_some();
    let limit = Stats::of(&r.copy_limit).map(|s| s.median);
    let gbps = if hide { None } else { Stats::of(&r.gbps) };
    let first_folio_us = if hide {
        None
    } else {
        Latency::of(&mut r.first.clone())
    };
    let folio_copy_us = limit.map(|l| folio as f64 / (l * (1u64 << 30) as f64) * 1e6);
    // A first folio usable sooner than its copy could take is a
    // measurement bug, not a result: say so in the row.
    let below_floor = o.path != Path::Kernel
        && first_folio_us
            .zip(folio_copy_us)
            .is_some_and(|(f, c)| f.median < c);
    MigrateRow {
        table,
        direction: dir.into(),
        function: function.into(),
        folio_size: folio,
        channels: o.channels,
        batch_pages: Stats::of(&r.batch_pages).map_or(o.batch_pages, |s| s.median as usize),
        pages_moved: Stats::of(&r.moved).map_or(0, |s| s.median as usize),
        of_copy_limit: gbps.zip(limit).map(|(g, l)| g.median / l),
        gbps,
        first_folio_us,
        total_ms: Stats::of(&r.total_ms),
        speedup: None,
        copy_limit_gbps: limit,
        folio_copy_us,
        target_stall_us: None,
        phases: if hide {
            None
        } else {
            phases::median(&r.phases)
        },
        obtained: match &r.backing_after {
            Some(after) if after != obtained => format!("{obtained}; after the runs: {after}"),
            _ => obtained.into(),
        },
        note: r
            .unavailable
            .clone()
            .or_else(|| {
                nothing.then(|| {
                    let why = if numa_nodes().len() > 1 {
                        "already on the target node"
                    } else {
                        "one node"
                    };
                    match (r.nothing_to_move, r.notes.first()) {
                        (false, Some(n)) => format!("nothing moved ({why}): {n}"),
                        _ => format!("nothing to move ({why})"),
                    }
                })
            })
            .or_else(|| {
                below_floor.then(|| {
                    "first folio below the time to copy one folio: a measurement bug".into()
                })
            })
            .or_else(|| r.notes.first().cloned()),
    }
}

/// One table-4 row: `loops` moves of the target's buffer from `dir.from`
/// to `dir.to` on `threads` threads, the buffer put back on `dir.from`
/// before each, outside the timing.
#[allow(clippy::too_many_arguments)]
fn process_row(
    t: &mut mover::Running,
    dir: Direction,
    label: &str,
    folio: usize,
    threads: usize,
    loops: u32,
    tick: &dyn Fn(),
    obtained: &str,
) -> Result<MigrateRow, LabError> {
    let budget = foliokit::tune::PROCESS_MOVE_BUDGET;
    let (mut gbps, mut first, mut stall, mut batch, mut moved) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..loops {
        if dir.from != dir.to {
            t.move_to(dir.from, threads, budget)?;
        }
        t.stall_us()?; // forget the stalls of putting it back
        let (secs, n, f, b) = t.move_to(dir.to, threads, budget)?;
        stall.push(t.stall_us()?);
        moved.push(n as f64);
        if n > 0 {
            gbps.push((n * PAGE) as f64 / (1u64 << 30) as f64 / secs);
        }
        first.extend(f);
        batch.extend(b.map(|b| b as f64));
        tick();
    }
    let nothing = moved.iter().all(|&m| m == 0.0);
    Ok(MigrateRow {
        table: 4,
        direction: label.into(),
        function: "process".into(),
        folio_size: folio,
        channels: threads,
        batch_pages: Stats::of(&batch).map_or(0, |s| s.median as usize),
        pages_moved: Stats::of(&moved).map_or(0, |s| s.median as usize),
        gbps: Stats::of(&gbps),
        first_folio_us: Latency::of(&mut first),
        total_ms: None,
        speedup: None,
        copy_limit_gbps: None,
        of_copy_limit: None,
        folio_copy_us: None,
        target_stall_us: Latency::of(&mut stall),
        phases: None,
        obtained: obtained.into(),
        note: nothing.then(|| {
            if numa_nodes().len() > 1 {
                "nothing to move (already on the target node)".into()
            } else {
                "nothing to move (one node); target stall is its loop's own noise".into()
            }
        }),
    })
}

fn source(size: usize, folio: usize) -> Result<(PooledRegion, String), LabError> {
    let mut src = PooledRegion::new(size, folio)?;
    src.as_mut_slice().fill(0x5A);
    let obtained = census(src.as_ptr(), src.len())
        .map(|c| c.summary())
        .unwrap_or_else(|| src.backing().obtained.clone());
    Ok((src, obtained))
}

/// Runs the tables the plan names.
pub fn run(a: &MigratePlan, progress: &dyn Progress) -> Result<Report<MigrateRow>, LabError> {
    let nodes = numa_nodes();
    let node = a.node.unwrap_or(*nodes.last().unwrap_or(&0));
    if !nodes.contains(&node) {
        return Err(format!("NUMA node {node} does not exist (online: {nodes:?})").into());
    }
    let from = a
        .from
        .unwrap_or_else(|| nodes.iter().copied().find(|&n| n != node).unwrap_or(node));
    if !nodes.contains(&from) {
        return Err(format!("NUMA node {from} does not exist (online: {nodes:?})").into());
    }
    let memory_only = memory_only_nodes();
    let main_dir = Direction { from, to: node };
    let main_label = main_dir.label(&memory_only);
    let table3_dirs = directions(&nodes, &memory_only, a.from, a.node, main_dir);
    check_tables(&a.tables)?;
    check_shape(a.size, &a.page, 2)?;
    no_repeats("folio size", &a.page, |&f| show_size(f))?;
    no_repeats("channel count", &a.channels, |c| c.to_string())?;
    if a.batch.contains(&0) {
        return Err("batch sizes must be at least one page".into());
    }
    let channels = a.channels.clone();
    // A batch cannot exceed the run, and relocation ends batches on folio
    // boundaries (move_pages takes any count): sizes outside that measure
    // the same thing as its bound, so they become one row (and one note).
    let run_pages = (a.size / PAGE).max(1);
    let folio_pages = if a.path == Path::Kernel {
        1
    } else {
        TABLE2_FOLIO / PAGE
    };
    let batches = clamp_batches(&a.batch, folio_pages, run_pages);
    let clamped = a.batch.iter().any(|&b| b > run_pages);
    let raised = a.batch.iter().any(|&b| b < folio_pages.min(run_pages));
    let title = format!(
        "migrate: {} per run, node {main_label} (tables 1-2), {} runs per row; relocation = UFFDIO_MOVE out + channel copy + UFFDIO_MOVE in",
        show_size(a.size),
        a.loops
    );
    let params = json!({"size": a.size, "folio_sizes": a.page, "channels": channels, "batches": a.batch,
                        "loops": a.loops, "node": node, "from": from, "nodes": nodes,
                        "path": path_label(a.path),
                        "memory_only_nodes": memory_only, "tables": a.tables,
                        "latency_budget_us": a.latency_budget.map(|d| d.as_secs_f64() * 1e6)});
    let mut report = Report::<MigrateRow>::new("migrate", title, params);
    if nodes.len() == 1 {
        report.notes.push(format!(
            "one NUMA node: relocation still copies every populated page into new folios on node {node}; move_pages has nothing to move"
        ));
    }
    let t1 = if a.tables.contains(&1) {
        a.page.len() * (1 + channels.len())
    } else {
        0
    };
    let t2 = if a.tables.contains(&2) {
        batches.len() * channels.len() + usize::from(a.latency_budget.is_some()) * channels.len()
    } else {
        0
    };
    let t3 = if a.tables.contains(&3) {
        2 * channels.len() * table3_dirs.len()
    } else {
        0
    };
    let t4 = if a.tables.contains(&4) {
        2 * channels.len() * table3_dirs.len()
    } else {
        0
    };
    progress.begin((t1 + t2 + t3 + t4) * a.loops as usize, "migrate");
    // The write probe's buffer for the copy limit beside every run.
    let mut scratch = Region::new(a.size, 2 << 20)?;
    let tick = || progress.tick();
    // One row: `loops` runs of `o` on `src` in direction `dir`.
    let mut measure = |table: u8,
                       dir: Direction,
                       dir_label: &str,
                       function: &str,
                       folio: usize,
                       src: &mut Region,
                       obtained: &str,
                       o: &MigrateOptions|
     -> Result<MigrateRow, LabError> {
        let r = runs(src, &mut scratch, dir, o, a.loops, &tick)?;
        Ok(row(table, dir_label, function, folio, o, r, obtained))
    };
    // Tables 1 and 2: the main direction.
    let mut main_row = |table: u8,
                        function: &str,
                        folio: usize,
                        src: &mut Region,
                        obtained: &str,
                        o: &MigrateOptions| {
        measure(
            table,
            main_dir,
            &main_label,
            function,
            folio,
            src,
            obtained,
            o,
        )
    };
    let base = MigrateOptions::default().path(a.path);
    let label = path_label(a.path);

    if a.tables.contains(&1) {
        let mut settings = MthpSettings::system();
        for &folio in &a.page {
            let mthp = folio > PAGE && folio < (2 << 20);
            if mthp && is_root() {
                settings.only(Some(folio))?;
                arm_interrupt_restore(&settings);
            }
            let (mut src, obtained) = source(a.size, folio)?;
            let batch = (a.table_batch * PAGE).max(folio) / PAGE;
            let o = base
                .channels(1)
                .strategy(CopyStrategy::PerPage)
                .batch_pages(batch)
                .folio_size(folio);
            let baseline = main_row(1, "baseline", folio, &mut src, &obtained, &o)?;
            let bmed = baseline.gbps.map(|g| g.median);
            report.rows.push(MigrateRow {
                speedup: bmed.map(|_| 1.0),
                ..baseline
            });
            for &c in &channels {
                let o = base.channels(c).batch_pages(batch).folio_size(folio);
                let mut r = main_row(1, label, folio, &mut src, &obtained, &o)?;
                r.speedup = r.gbps.zip(bmed).map(|(g, b)| g.median / b);
                report.rows.push(r);
            }
            if mthp && is_root() {
                settings.restore()?;
                arm_interrupt_restore(&settings);
            }
        }
    }
    if a.tables.contains(&2) {
        let folio = TABLE2_FOLIO;
        let (mut src, obtained) = source(a.size, folio)?;
        for &c in &channels {
            let mut first_gbps = None;
            for &b in &batches {
                let o = base.channels(c).batch_pages(b);
                let mut r = main_row(2, label, folio, &mut src, &obtained, &o)?;
                first_gbps = first_gbps.or(r.gbps.map(|g| g.median));
                r.speedup = r.gbps.zip(first_gbps).map(|(g, f)| g.median / f);
                report.rows.push(r);
            }
            if let Some(budget) = a.latency_budget {
                let o = base
                    .channels(c)
                    .batch_pages(512)
                    .latency_budget(Some(budget));
                let mut r = main_row(2, "budget", folio, &mut src, &obtained, &o)?;
                r.note = Some(format!(
                    "budget {:.0} µs; batch settled at {} pages",
                    budget.as_secs_f64() * 1e6,
                    r.batch_pages
                ));
                report.rows.push(r);
            }
        }
    }
    if a.tables.contains(&3) {
        let folio = TABLE2_FOLIO;
        let (mut src, obtained) = source(a.size, folio)?;
        let batch_pages = a.table_batch;
        for &dir in &table3_dirs {
            let label = dir.label(&memory_only);
            for &c in &channels {
                let o = base.path(Path::Kernel).channels(c).batch_pages(batch_pages);
                let kernel = measure(3, dir, &label, "kernel", folio, &mut src, &obtained, &o)?;
                let kmed = kernel.gbps.map(|g| g.median);
                report.rows.push(MigrateRow {
                    speedup: kmed.map(|_| 1.0),
                    ..kernel
                });
                let o = base.channels(c).batch_pages(batch_pages);
                let mut r = measure(
                    3,
                    dir,
                    &label,
                    path_label(a.path),
                    folio,
                    &mut src,
                    &obtained,
                    &o,
                )?;
                r.speedup = r.gbps.zip(kmed).map(|(g, k)| g.median / k);
                report.rows.push(r);
            }
        }
    }
    if a.tables.contains(&4) {
        for folio in [2 << 20, PAGE] {
            let mut t = mover::Running::start(a.size, folio)?;
            let obtained = format!(
                "{} in another process",
                if folio == PAGE {
                    "4K pages"
                } else {
                    "THP asked"
                }
            );
            for &dir in &table3_dirs {
                let label = dir.label(&memory_only);
                for &c in &channels {
                    report.rows.push(process_row(
                        &mut t, dir, &label, folio, c, a.loops, &tick, &obtained,
                    )?);
                }
            }
        }
    }
    progress.end();
    let has = |t: u8| a.tables.contains(&t);
    let mut footer: Vec<String> = Vec::new();
    if has(1) {
        footer.push("table 1: speedup over the one-thread per-page baseline (relocation, moves out and in included) at the same folio size".into());
    }
    if has(2) {
        footer.push("table 2: speedup over the smallest batch with the same channels; first folio = from the batch's start (before any page is taken out) until its first folio is usable again: relocation copies the whole batch first".into());
        if clamped {
            footer.push(format!(
                "table 2: batch sizes above {run_pages} pages (the whole run of {}) were measured once, as {run_pages}",
                show_size(a.size)
            ));
        }
        if raised {
            footer.push(format!(
                "table 2: batch sizes below {} pages were measured as {}: relocation moves whole {} folios",
                folio_pages.min(run_pages),
                folio_pages.min(run_pages),
                show_size(TABLE2_FOLIO)
            ));
        }
    }
    if has(3) {
        footer.push("table 3: speedup of relocation over move_pages in the same direction with the same channels; moved = pages that changed node per run, placement checked on a sample".into());
    }
    if has(4) {
        footer.push(format!(
            "table 4: the mover is another process (foliokit's migrate_process, move_pages on its pid, calls kept under {} ms each); target stall = the longest gap in the target's own loop writing a byte per page, per run (p50 / p99 over runs)",
            foliokit::tune::PROCESS_MOVE_BUDGET.as_millis()
        ));
    }
    if has(1) || has(3) {
        footer.push(format!(
            "tables 1 and 3 use batches of {} pages (--table-batch); kernel = move_pages from N threads",
            a.table_batch
        ));
    }
    footer.push("before every run the source is put on the direction's first node with move_pages, outside the timing".into());
    footer.push("% copy limit: the row's median over the same-run copy limit of its buffers on its channels (min of a streaming read of the source and a streaming write of another buffer, probed beside every run); 1-folio copy µs: one folio at that limit, which no first folio can beat".into());
    if has(3) {
        footer.push(crate::seeds::quote("migrate.move_pages"));
    }
    if has(1) || has(2) {
        footer.push(crate::seeds::quote("migrate.channels"));
    }
    report.footer.extend(footer);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions_follow_seed_000() {
        let d = |from, to| Direction { from, to };
        let one = d(0, 0);
        assert_eq!(directions(&[0], &[], None, None, one), vec![one]);
        // Two CPU nodes and a memory-only one: 0->1, 0->2, 1->0, 2->0.
        assert_eq!(
            directions(&[0, 1, 2], &[2], None, None, d(0, 2)),
            vec![d(0, 1), d(0, 2), d(1, 0), d(2, 0)]
        );
        // --from keeps the directions that start there; --node names one.
        assert_eq!(
            directions(&[0, 1, 2], &[2], Some(0), None, d(0, 2)),
            vec![d(0, 1), d(0, 2)]
        );
        assert_eq!(
            directions(&[0, 1, 2], &[2], None, Some(1), d(0, 1)),
            vec![d(0, 1)]
        );
        assert_eq!(d(0, 2).label(&[2]), "0 -> 2 (memory-only)");
    }

    #[test]
    fn only_existing_tables() {
        assert!(check_tables(&[1, 2, 3, 4]).is_ok());
        assert_eq!(
            check_tables(&[1, 9]).unwrap_err().to_string(),
            "there is no table 9: the tables are 1, 2, 3 and 4"
        );
        assert!(check_tables(&[0]).is_err());
        assert!(check_tables(&[]).is_err());
    }

    #[test]
    fn batches_clamp_to_a_folio_and_the_run_without_repeats() {
        // -b 1,2,512 on 2M folios: one row, not three labelled 512.
        assert_eq!(clamp_batches(&[1, 2, 512], 512, 1024), [512]);
        assert_eq!(
            clamp_batches(&[512, 4096, 1024, 8192], 512, 1024),
            [512, 1024]
        );
        // The kernel path takes any count.
        assert_eq!(clamp_batches(&[1, 2, 512], 1, 1024), [1, 2, 512]);
        // A run smaller than a folio: the run bounds both ends.
        assert_eq!(clamp_batches(&[1, 4096], 512, 256), [256]);
        // Smallest first, whatever the order asked: table 2's base.
        assert_eq!(clamp_batches(&[4096, 512], 1, 8192), [512, 4096]);
    }

    #[test]
    fn a_row_written_before_phases_were_measured_still_loads() {
        let row = MigrateRow {
            table: 1,
            direction: "0 -> 0".into(),
            function: "relocate".into(),
            folio_size: 2 << 20,
            channels: 1,
            batch_pages: 8192,
            pages_moved: 131072,
            gbps: None,
            first_folio_us: None,
            total_ms: None,
            speedup: None,
            copy_limit_gbps: Some(9.0),
            of_copy_limit: Some(0.5),
            folio_copy_us: Some(200.0),
            target_stall_us: None,
            phases: Some(phases::PhasesMs {
                copy_ms: 70.0,
                ..Default::default()
            }),
            obtained: "2048K x256".into(),
            note: None,
        };
        let mut v = serde_json::to_value(&row).unwrap();
        assert_eq!(v["phases"]["copy_ms"], 70.0, "units in the field names");
        v.as_object_mut().unwrap().remove("phases");
        let old: MigrateRow = serde_json::from_value(v).unwrap();
        assert!(old.phases.is_none());
        assert_eq!(old.of_copy_limit, Some(0.5));
    }

    #[test]
    fn percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let l = Latency::of(&mut v).unwrap();
        assert_eq!((l.median, l.p99), (51.0, 99.0));
        assert!(Latency::of(&mut []).is_none());
    }
}

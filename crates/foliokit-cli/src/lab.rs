//! `foliokit lab`: every seed experiment on this machine, in one command,
//! with tables on the terminal and a directory holding results.json, a CSV
//! per table and a self-contained index.html with plots.

use clap::Args;
use foliokit::Strategy;
use foliokit_lab::copy_clear::{self, FolioOp, Row, StrategyPlan};
use foliokit_lab::runner::{self, Experiment, Scale, Step};
use foliokit_lab::schema::{LabResults, Loaded};
use foliokit_lab::summary::Line;
use foliokit_lab::units::mem_available;
use foliokit_lab::{fault, init, migrate, remap, restore, seeds};
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::args::Format;
use crate::bench::shown;
use crate::html::{self, Entry};
use crate::labplots;
use crate::machine::machine;
use crate::progress::Bars;
use crate::report::{Render, Report, TableRow};
use crate::summary;
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    /// Sizes that finish in about 3 minutes on 2 vCPUs (the default).
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,
    /// Sizes like the seeds' (1 GiB copies and migrations, a 64 GiB fault
    /// region, 30 init passes), scaled down where memory does not allow it.
    #[arg(long)]
    pub full: bool,
    /// Tiny sizes, seconds long: for testing the report itself.
    #[arg(long, hide = true, conflicts_with_all = ["quick", "full"])]
    pub smoke: bool,
    /// Directory for results.json, the CSVs and index.html.
    #[arg(long, default_value = "foliokit-lab")]
    pub out: PathBuf,
    #[command(flatten)]
    pub guest: crate::guest::GuestArgs,
}

fn entry<R: TableRow>(step: &Step, r: &Report<R>, plots: Vec<String>) -> Entry {
    print!("{}", r.render(Format::Table));
    println!();
    Entry {
        key: step.key,
        heading: step.heading.into(),
        seed: step.seed,
        json: r.to_json(),
        csv: r.render(Format::Csv),
        html_table: r.html_table(),
        key_table: None,
        rows: r.rows.len(),
        plots,
    }
}

/// An experiment's table with its one plot.
fn plotted<R: TableRow>(
    step: &Step,
    r: foliokit_lab::schema::Report<R>,
    plot: impl FnOnce(&Report<R>) -> String,
) -> Entry {
    let r = shown(r);
    let p = plot(&r);
    entry(step, &r, vec![p])
}

/// Copy or clear: the strategies' table, with the rows that matter and a
/// plot for the full runs (the mc run has neither).
fn strategies<O: FolioOp>(
    step: &Step,
    op: &O,
    plan: &StrategyPlan<O::S>,
    bars: &Bars,
) -> Result<Entry, CliError> {
    let r = shown(copy_clear::run(op, plan, bars)?);
    if step.key == "copy-mc" {
        return Ok(entry(step, &r, Vec::new()));
    }
    // Seed 002's clear figures are demand faults (clearing plus the
    // fault): they are drawn on the fault plot, not here.
    let (title, marks) = match O::OP {
        "copy" => ("copy (source evicted)", seeds::marks("copy")),
        _ => (O::OP, Vec::new()),
    };
    let marks: Vec<(usize, f64, String)> = marks
        .into_iter()
        .map(|(y, label)| (2 << 20, y, label))
        .collect();
    let plots = labplots::strategies(title, &r, &marks);
    let mut e = entry(step, &r, plots);
    e.key_table = Some(key_rows(&r, O::BASELINE.name()));
    Ok(e)
}

/// Copy and clear: the baseline, auto and the best named strategy at each
/// (folio size, channels) point.
fn key_rows(r: &Report<Row>, baseline: &str) -> String {
    let best = |x: &Row| {
        r.rows
            .iter()
            .filter(|y| {
                y.folio_size == x.folio_size && y.channels == x.channels && y.function != "auto"
            })
            .max_by(|a, b| a.gbps.median.total_cmp(&b.gbps.median))
            .is_some_and(|y| std::ptr::eq(y, x))
    };
    r.html_table_where(|x| x.function == baseline || x.function == "auto" || best(x))
}

pub fn run(a: LabArgs) -> Result<(), CliError> {
    if a.guest.kernel.is_some() {
        crate::guest::run(&a.guest, &a.out)?;
        println!("# the guest's results are in {}", a.out.display());
        return Ok(());
    }
    let scale = if a.smoke {
        Scale::Smoke
    } else if a.full {
        Scale::Full
    } else {
        Scale::Quick
    };
    writable(&a.out)?;
    let t0 = Instant::now();
    let mut notes: Vec<String> = Vec::new();
    let mut entries: Vec<Entry> = Vec::new();

    // Calibrate first when there is no profile, then put the new one in
    // force for the rest of the run.
    let status = foliokit::tune::profile_status_on_disk();
    if status.loaded {
        notes.push(format!(
            "auto used the calibration profile at {}",
            status.path.unwrap_or_default()
        ));
    } else if scale == Scale::Smoke {
        notes.push("smoke run: calibration skipped, auto used its built-in rules".into());
    } else {
        println!(
            "# calibrating (no profile yet: {}); the profile goes to {}, where every later `auto` reads it",
            status.note,
            foliokit::tune::profile_path()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|e| format!("nowhere ({e})"))
        );
        crate::calibrate::run(crate::calibrate::CalibrateArgs {
            stream_size: None,
            dry_run: false,
            format: Format::Table,
        })?;
        let used = foliokit::tune::use_default_file();
        notes.push(if used.loaded {
            "calibrated at the start of this run; auto used that profile".into()
        } else {
            format!(
                "calibrated at the start of this run, but auto could not use it: {}",
                used.note
            )
        });
    }
    println!();
    crate::info::run(crate::info::InfoArgs {
        format: Format::Table,
    })?;
    println!();

    let available = mem_available().unwrap_or(4 << 30);
    let bars = Bars::default();
    for step in runner::steps(scale, available, &mut notes)? {
        let e = match &step.experiment {
            Experiment::Copy(op, p) => strategies(&step, op, p, &bars)?,
            Experiment::Clear(op, p) => strategies(&step, op, p, &bars)?,
            Experiment::Fault(p) => plotted(&step, fault::run(p, &bars)?, labplots::fault),
            Experiment::Init(p) => plotted(&step, init::run(p, &bars)?, labplots::init),
            Experiment::Migrate(p) => plotted(&step, migrate::run(p, &bars)?, labplots::migrate),
            Experiment::Mremap(p) => plotted(&step, remap::run(p, &bars)?, |r| {
                labplots::mremap(r, p.iterations as usize)
            }),
            Experiment::Restore(p) => match restore::report(p, &bars) {
                Ok(r) => entry(&step, &shown(r), Vec::new()),
                // A kernel without a usable userfaultfd (or THP) skips the
                // table, it does not end the lab.
                Err(e) => {
                    notes.push(format!("restore table skipped: {e}"));
                    continue;
                }
            },
        };
        entries.push(e);
        save(&a.out, scale, t0.elapsed(), &notes, &entries)?;
    }

    let elapsed = t0.elapsed();
    let summary = save(&a.out, scale, elapsed, &notes, &entries)?;
    println!(
        "# lab ({}) finished in {:.0} s: {}/results.json, {} CSVs, {}/index.html",
        scale.name(),
        elapsed.as_secs_f64(),
        a.out.display(),
        entries.len(),
        a.out.display()
    );
    for n in &notes {
        println!("# note: {n}");
    }
    print!("{}", summary::text(&summary));
    Ok(())
}

/// Makes `out` (and its parents) and checks a file can be written there,
/// before anything is measured: a lab that cannot keep its results should
/// say so at once, not after minutes of work.
fn writable(out: &std::path::Path) -> Result<(), CliError> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let probe = out.join(".foliokit-write-check");
    std::fs::write(&probe, b"")
        .map_err(|e| format!("cannot write results into {}: {e}", out.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Writes results.json, a CSV per experiment and index.html for what has
/// finished so far: called after every experiment, so an interrupted or
/// failed lab keeps what it measured. Returns the summary lines.
fn save(
    out: &std::path::Path,
    scale: Scale,
    elapsed: Duration,
    notes: &[String],
    entries: &[Entry],
) -> Result<Vec<Line>, CliError> {
    let experiments: Vec<Value> = entries.iter().map(|e| e.json.clone()).collect();
    // The summary reads the experiments through the schema, as `compare`
    // reads them back from the file.
    let loaded = experiments
        .iter()
        .map(|e| serde_json::from_value::<Loaded>(e.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let summary = foliokit_lab::summary::lines(&loaded);
    let results = LabResults {
        foliokit: env!("CARGO_PKG_VERSION").into(),
        scale: scale.name().into(),
        elapsed_secs: elapsed.as_secs_f64(),
        machine: machine(),
        notes: notes.to_vec(),
        summary: summary.clone(),
        experiments,
    };
    let write = |name: &str, text: &str| -> Result<(), CliError> {
        let path = out.join(name);
        std::fs::write(&path, text)
            .map_err(|e| format!("cannot write {}: {e}", path.display()).into())
    };
    write(
        "results.json",
        &(serde_json::to_string_pretty(&results)? + "\n"),
    )?;
    for e in entries {
        write(&format!("{}.csv", e.key), &e.csv)?;
    }
    write(
        "index.html",
        &html::page(&machine(), notes, &summary, entries, scale.name(), elapsed),
    )?;
    Ok(summary)
}

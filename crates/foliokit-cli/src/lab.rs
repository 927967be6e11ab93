//! `foliokit lab`: every seed experiment on this machine, in one command,
//! with tables on the terminal and a directory holding results.json, a CSV
//! per table and a self-contained index.html with plots.

use clap::Args;
use foliokit_lab::schema::{LabResults, Loaded};
use foliokit_lab::summary::Line;
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::args::{show_size, BenchArgs, Format, ReuseArg};
use crate::bench::{fault, folio, init, migrate, mremap, restore};
use crate::html::{self, Entry};
use crate::labplots;
use crate::machine::machine;
use crate::report::{Render, Report, TableRow};
use crate::summary;
use crate::CliError;
use foliokit_lab::copy_clear::Row;
use foliokit_lab::units::mem_available;

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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scale {
    Smoke,
    Quick,
    Full,
}

fn entry<R: TableRow>(
    key: &'static str,
    heading: &str,
    seed: &'static str,
    r: &Report<R>,
    plots: Vec<String>,
) -> Entry {
    print!("{}", r.render(Format::Table));
    println!();
    Entry {
        key,
        heading: heading.into(),
        seed,
        json: r.to_json(),
        csv: r.render(Format::Csv),
        html_table: r.html_table(),
        key_table: None,
        rows: r.rows.len(),
        plots,
    }
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

fn bench(size: usize, pages: &[usize], function: &str, loops: u32, channels: &[u32]) -> BenchArgs {
    BenchArgs {
        size,
        page: pages.to_vec(),
        function: function.into(),
        loops,
        channels: channels.to_vec(),
        reuse: ReuseArg::Reread,
        no_limits: false,
        format: Format::Table,
    }
}

const K: usize = 1 << 10;
const M: usize = 1 << 20;
const G: usize = 1 << 30;

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

    // Experiment sizes per scale.
    let (copy_size, copy_pages, loops) = match scale {
        Scale::Smoke => (16 * M, vec![4 * K, 2 * M], 1),
        Scale::Quick => (256 * M, vec![4 * K, 64 * K, 2 * M], 3),
        Scale::Full => (G, vec![4 * K, 16 * K, 64 * K, 256 * K, M, 2 * M, G], 5),
    };

    let r = folio::copy_report(folio::CopyArgs {
        common: bench(copy_size, &copy_pages, "all", loops, &[1, 2]),
        evict: true,
        hot: false,
        mc: false,
    })?
    .ok_or("copy produced no report")?;
    let p = labplots::strategies(
        "copy (source evicted)",
        &r,
        &foliokit_lab::seeds::marks("copy")
            .into_iter()
            .map(|(y, label)| (2 * M, y, label))
            .collect::<Vec<_>>(),
    );
    let mut e = entry("copy", "Folio copy (seed 000)", "000", &r, p);
    e.key_table = Some(key_rows(&r, "per-page"));
    entries.push(e);
    save(&a.out, scale, t0.elapsed(), &notes, &entries)?;

    let r = folio::copy_report(folio::CopyArgs {
        common: bench(copy_size, &[2 * M], "movsb,avx2,nt,auto", loops, &[1]),
        evict: true,
        hot: false,
        mc: true,
    })?
    .ok_or("copy --mc produced no report")?;
    entries.push(entry(
        "copy-mc",
        "Machine-check-safe copy (seed 000)",
        "000",
        &r,
        vec![],
    ));
    save(&a.out, scale, t0.elapsed(), &notes, &entries)?;

    let r = folio::clear_report(folio::ClearArgs {
        common: bench(copy_size, &copy_pages, "all", loops, &[1, 2]),
        evict: false,
        hot: false,
        hint_page: 0,
    })?
    .ok_or("clear produced no report")?;
    // Seed 002's figures are demand faults (clearing plus the fault): they
    // are drawn on the fault plot, not here.
    let p = labplots::strategies("clear", &r, &[]);
    let mut e = entry("clear", "Huge-page clearing (seed 002)", "002", &r, p);
    e.key_table = Some(key_rows(&r, "butterfly"));
    entries.push(e);
    save(&a.out, scale, t0.elapsed(), &notes, &entries)?;

    let avail = mem_available().unwrap_or(4 * G);
    let fault_size = match scale {
        Scale::Smoke => 64 * M,
        Scale::Quick => G,
        Scale::Full => {
            let fit = (avail / 2 / G * G).max(G);
            if fit < 64 * G {
                notes.push(format!(
                    "fault: the seed's 64G region scaled down to {} ({} available)",
                    show_size(fit),
                    crate::args::approx_size(avail)
                ));
            }
            fit.min(64 * G)
        }
    };
    let r = fault::report(fault::FaultArgs {
        size: fault_size,
        page: if scale == Scale::Full {
            vec![4 * K, 2 * M, G]
        } else {
            vec![4 * K, 2 * M]
        },
        function: vec!["demand".into(), "populate".into()],
        loops,
        random: false,
        threads: vec![1, 2],
        no_limits: false,
        format: Format::Table,
    })?
    .ok_or("fault produced no report")?;
    let p = labplots::fault(&r);
    entries.push(entry(
        "fault",
        "Demand faults and prefault (seed 002)",
        "002",
        &r,
        vec![p],
    ));
    save(&a.out, scale, t0.elapsed(), &notes, &entries)?;

    let (init_size, init_loops) = match scale {
        Scale::Smoke => (16 * M, 2),
        Scale::Quick => (256 * M, 6),
        Scale::Full => (G, 30),
    };
    let r = init::report(init::InitArgs {
        size: init_size,
        record: 64,
        function: "all".into(),
        loops: init_loops,
        no_limits: false,
        format: Format::Table,
    })?
    .ok_or("init produced no report")?;
    let p = labplots::init(&r);
    entries.push(entry(
        "init",
        "Write-once initialisation (seed 003)",
        "003",
        &r,
        vec![p],
    ));
    save(&a.out, scale, t0.elapsed(), &notes, &entries)?;

    let (mig_size, mig_pages, batches, mig_loops) = match scale {
        Scale::Smoke => (16 * M, vec![2 * M], vec![512, 2048], 1),
        // Three runs: the fewest from which the summary judges noise.
        Scale::Quick => (
            256 * M,
            vec![4 * K, 64 * K, 2 * M],
            vec![512, 2048, 8192, 65536],
            3,
        ),
        Scale::Full => (
            G,
            vec![4 * K, 16 * K, 64 * K, 256 * K, M, 2 * M],
            vec![
                512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144,
            ],
            3,
        ),
    };
    let r = migrate::report(migrate::MigrateArgs {
        size: mig_size,
        page: mig_pages,
        table_batch: 8192,
        channels: vec![1, 2],
        batch: batches,
        loops: mig_loops,
        latency_budget: (scale != Scale::Smoke).then(|| Duration::from_millis(1)),
        tables: vec![1, 2, 3, 4],
        node: None,
        from: None,
        path: migrate::PathArg::Relocate,
        format: Format::Table,
        guest: Default::default(),
    })?
    .ok_or("migrate produced no report")?;
    let p = labplots::migrate(&r);
    entries.push(entry(
        "migrate",
        "Batched migration with copy channels (seed 001)",
        "001",
        &r,
        vec![p],
    ));
    save(&a.out, scale, t0.elapsed(), &notes, &entries)?;

    let (iters, mloops) = match scale {
        Scale::Smoke => (200, 1),
        Scale::Quick => (2000, 3),
        Scale::Full => (10_000, 5),
    };
    let r = mremap::report(mremap::MremapArgs {
        iterations: iters,
        loops: mloops,
        no_align: scale == Scale::Smoke,
        format: Format::Table,
    })?
    .ok_or("mremap produced no report")?;
    let p = labplots::mremap(&r, iters as usize);
    entries.push(entry(
        "mremap",
        "mremap of large folios (seed 004)",
        "004",
        &r,
        vec![p],
    ));

    save(&a.out, scale, t0.elapsed(), &notes, &entries)?;

    let (rs_size, rs_loops) = match scale {
        Scale::Smoke => (32 * M, 1),
        Scale::Quick => (256 * M, 8),
        Scale::Full => (4 * G, 8),
    };
    match restore::report(restore::RestoreArgs {
        size: rs_size,
        channels: 2,
        loops: rs_loops,
        budget_us: foliokit::tune::LAZY_LATENCY_BUDGET.as_micros() as u64,
        cold: false,
        serve_faults_during_batches: false,
        dir: std::env::temp_dir(),
        format: Format::Table,
    }) {
        Ok(Some(r)) => entries.push(entry(
            "restore",
            "Guest RAM restore: eager vs lazy (seed 001's latency/throughput trade-off)",
            "001",
            &r,
            Vec::new(),
        )),
        Ok(None) => {}
        // A kernel without a usable userfaultfd (or THP) skips the table,
        // it does not end the lab.
        Err(e) => notes.push(format!("restore table skipped: {e}")),
    }

    let elapsed = t0.elapsed();
    let summary = save(&a.out, scale, elapsed, &notes, &entries)?;
    println!(
        "# lab ({}) finished in {:.0} s: {}/results.json, {} CSVs, {}/index.html",
        scale_name(scale),
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
        scale: scale_name(scale).into(),
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
        &html::page(
            &machine(),
            notes,
            &summary,
            entries,
            scale_name(scale),
            elapsed,
        ),
    )?;
    Ok(summary)
}

fn scale_name(s: Scale) -> &'static str {
    match s {
        Scale::Smoke => "smoke",
        Scale::Quick => "quick",
        Scale::Full => "full",
    }
}

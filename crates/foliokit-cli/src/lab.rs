//! `foliokit lab`: every seed experiment on this machine, in one command,
//! with tables on the terminal and a directory holding results.json, a CSV
//! per table and a self-contained index.html with plots.

use clap::Args;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::args::{show_size, BenchArgs, Format, ReuseArg};
use crate::bench::{clear, copy, fault, init, migrate, mremap};
use crate::html;
use crate::machine::{machine, mem_available};
use crate::plots;
use crate::report::{Report, Row, TableRow};
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
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scale {
    Smoke,
    Quick,
    Full,
}

/// One experiment's outputs, whatever its row type.
pub struct Entry {
    pub key: &'static str,
    pub heading: String,
    pub seed: &'static str,
    pub json: Value,
    pub csv: String,
    pub html_table: String,
    pub plots: Vec<String>,
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
        plots,
    }
}

fn bench(size: usize, pages: &[usize], function: &str, loops: u32, channels: &[u32]) -> BenchArgs {
    BenchArgs {
        size,
        page: pages.to_vec(),
        function: function.into(),
        loops,
        channels: channels.to_vec(),
        reuse: ReuseArg::Reread,
        format: Format::Table,
    }
}

const K: usize = 1 << 10;
const M: usize = 1 << 20;
const G: usize = 1 << 30;

/// GB/s medians by folio size, one series per strategy (one channel).
fn strategy_plot(title: &str, r: &Report<Row>) -> String {
    let mut folios: Vec<usize> = r.rows.iter().map(|x| x.folio_size).collect();
    folios.dedup();
    let mut names: Vec<String> = Vec::new();
    for x in &r.rows {
        if !names.contains(&x.function) {
            names.push(x.function.clone());
        }
    }
    let series: Vec<(String, Vec<Option<f64>>)> = names
        .iter()
        .map(|n| {
            let ys = folios
                .iter()
                .map(|&f| {
                    r.rows
                        .iter()
                        .find(|x| &x.function == n && x.folio_size == f)
                        .map(|x| x.gbps.median)
                })
                .collect();
            (n.clone(), ys)
        })
        .collect();
    let x: Vec<String> = folios.iter().map(|&f| show_size(f)).collect();
    plots::lines(title, &x, "GB/s (median)", &series)
}

pub fn run(a: LabArgs) -> Result<(), CliError> {
    let scale = if a.smoke {
        Scale::Smoke
    } else if a.full {
        Scale::Full
    } else {
        Scale::Quick
    };
    std::fs::create_dir_all(&a.out)
        .map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    let t0 = Instant::now();
    let mut notes: Vec<String> = Vec::new();
    let mut entries: Vec<Entry> = Vec::new();

    // Calibrate before anything asks auto for a choice: auto reads the
    // profile once per process, on first use, so only peek at the file here.
    let status = foliokit::tune::profile_status_on_disk();
    if status.loaded {
        notes.push(format!(
            "auto used the calibration profile at {}",
            status.path.unwrap_or_default()
        ));
    } else if scale == Scale::Smoke {
        notes.push("smoke run: calibration skipped, auto used its built-in rules".into());
    } else {
        println!("# calibrating (no profile yet): {}", status.note);
        crate::calibrate::run(crate::calibrate::CalibrateArgs {
            stream_size: None,
            dry_run: false,
            format: Format::Table,
        })?;
        let used = foliokit::tune::profile_status();
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

    let r = copy::report(copy::CopyArgs {
        common: bench(copy_size, &copy_pages, "all", loops, &[1, 2]),
        evict: true,
        hot: false,
        mc: false,
    })?
    .ok_or("copy produced no report")?;
    let p = strategy_plot("copy GB/s by strategy and folio size (source evicted)", &r);
    entries.push(entry("copy", "Folio copy (seed 000)", "000", &r, vec![p]));

    let r = copy::report(copy::CopyArgs {
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

    let r = clear::report(clear::ClearArgs {
        common: bench(copy_size, &copy_pages, "all", loops, &[1, 2]),
        evict: false,
        hot: false,
        hint_page: 0,
    })?
    .ok_or("clear produced no report")?;
    let p = strategy_plot("clear GB/s by strategy and folio size", &r);
    entries.push(entry(
        "clear",
        "Huge-page clearing (seed 002)",
        "002",
        &r,
        vec![p],
    ));

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
        format: Format::Table,
    })?
    .ok_or("fault produced no report")?;
    let cats: Vec<String> = r
        .rows
        .iter()
        .map(|x| format!("{} {} x{}", show_size(x.folio_size), x.function, x.channels))
        .collect();
    let p = plots::bars(
        "page-fault GB/s: first touch vs steady state",
        &cats,
        "GB/s",
        &[
            (
                "first touch".into(),
                r.rows.iter().map(|x| x.first_touch_gbps).collect(),
            ),
            (
                "median".into(),
                r.rows.iter().map(|x| x.gbps.median).collect(),
            ),
        ],
    );
    entries.push(entry(
        "fault",
        "Demand faults and prefault (seed 002)",
        "002",
        &r,
        vec![p],
    ));

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
        format: Format::Table,
    })?
    .ok_or("init produced no report")?;
    let cats: Vec<String> = r.rows.iter().map(|x| x.function.clone()).collect();
    let p = plots::bars(
        "init pass time by variant",
        &cats,
        "ms",
        &[
            (
                "first pass".into(),
                r.rows.iter().map(|x| x.first_pass_ms).collect(),
            ),
            (
                "rebind (median)".into(),
                r.rows.iter().map(|x| x.rebind_ms.median).collect(),
            ),
        ],
    );
    entries.push(entry(
        "init",
        "Write-once initialisation (seed 003)",
        "003",
        &r,
        vec![p],
    ));

    let (mig_size, mig_pages, batches, mig_loops) = match scale {
        Scale::Smoke => (16 * M, vec![2 * M], vec![512, 2048], 1),
        Scale::Quick => (
            256 * M,
            vec![4 * K, 64 * K, 2 * M],
            vec![512, 2048, 8192, 65536],
            2,
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
        tables: vec![1, 2, 3],
        node: None,
        format: Format::Table,
    })?
    .ok_or("migrate produced no report")?;
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for x in r
        .rows
        .iter()
        .filter(|x| x.table == 2 && x.function == "relocate")
    {
        let (Some(g), Some(l)) = (x.gbps, x.first_folio_us) else {
            continue;
        };
        let name = format!(
            "{} channel{}",
            x.channels,
            if x.channels == 1 { "" } else { "s" }
        );
        match curves.iter_mut().find(|c| c.0 == name) {
            Some(c) => c.1.push((l.median, g.median)),
            None => curves.push((name, vec![(l.median, g.median)])),
        }
    }
    let p = plots::log_x_curves(
        "migration throughput vs first-folio latency (batch size grows along each curve)",
        "first-folio latency, µs (log)",
        "GB/s (median)",
        &curves,
    );
    entries.push(entry(
        "migrate",
        "Batched migration with copy channels (seed 001)",
        "001",
        &r,
        vec![p],
    ));

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
    let seed_rows: Vec<_> = r.rows.iter().filter(|x| x.alignment.is_none()).collect();
    let p = plots::bars(
        &format!("mremap loop time by folio size ({iters} iterations)"),
        &seed_rows
            .iter()
            .map(|x| show_size(x.folio_size))
            .collect::<Vec<_>>(),
        "seconds",
        &[(
            "mean".into(),
            seed_rows.iter().map(|x| x.secs.mean).collect(),
        )],
    );
    entries.push(entry(
        "mremap",
        "mremap of large folios (seed 004)",
        "004",
        &r,
        vec![p],
    ));

    let elapsed = t0.elapsed();
    let results = json!({
        "foliokit": env!("CARGO_PKG_VERSION"),
        "scale": format!("{scale:?}").to_lowercase(),
        "elapsed_secs": elapsed.as_secs_f64(),
        "machine": machine(),
        "notes": notes,
        "experiments": entries.iter().map(|e| e.json.clone()).collect::<Vec<_>>(),
    });
    let write = |name: &str, text: &str| -> Result<(), CliError> {
        let path = a.out.join(name);
        std::fs::write(&path, text)
            .map_err(|e| format!("cannot write {}: {e}", path.display()).into())
    };
    write(
        "results.json",
        &(serde_json::to_string_pretty(&results)? + "\n"),
    )?;
    for e in &entries {
        write(&format!("{}.csv", e.key), &e.csv)?;
    }
    write(
        "index.html",
        &html::page(&machine(), &notes, &entries, scale_name(scale), elapsed),
    )?;
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
    Ok(())
}

fn scale_name(s: Scale) -> &'static str {
    match s {
        Scale::Smoke => "smoke",
        Scale::Quick => "quick",
        Scale::Full => "full",
    }
}

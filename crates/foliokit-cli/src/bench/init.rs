//! `foliokit bench init`: seed 003's write-once initialisation of a
//! memmap-like array — field by field, template + memcpy, template +
//! streaming stores + one drain — first pass vs rebinds, and what each
//! variant costs whatever else was in the cache.

use clap::Args;
use foliokit::cpu::cpu;
use foliokit::measure::Stats;
use foliokit::mem::Region;
use foliokit::nt::{fill_from_template, fill_from_template_cached};
use serde::Serialize;
use serde_json::json;
use std::time::Instant;

use crate::args::{parse_size, show_size, Format};
use crate::progress::bar;
use crate::report::{pm, BackingNote, Report, TableRow};
use crate::CliError;

const VARIANTS: &[(&str, &str)] = &[
    (
        "field",
        "each 8-byte field stored separately (the kernel's __init_single_page)",
    ),
    (
        "template-memcpy",
        "update the template's per-record fields, memcpy it (cached stores)",
    ),
    (
        "template-nt",
        "update the template, stream it with movntdq, one sfence at the end (seed 003)",
    ),
];

#[derive(Debug, Clone, Args)]
pub struct InitArgs {
    /// Bytes of records initialised per pass.
    #[arg(short, long, default_value = "1G", value_parser = parse_size)]
    pub size: usize,
    /// Bytes per record: a multiple of 16 (64 is a struct page).
    #[arg(short = 'S', long, default_value = "64", value_parser = parse_size)]
    pub record: usize,
    /// Variants: field, template-memcpy, template-nt (comma-separated), all, or help.
    #[arg(short, long, default_value = "all")]
    pub function: String,
    /// Passes per variant: the first (fresh memory, faults included, like a
    /// first bind) and the rest (rebinds).
    #[arg(short, long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub loops: u32,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

#[derive(Debug, Clone, Serialize)]
pub struct InitRow {
    pub function: String,
    pub record_size: usize,
    pub records: usize,
    pub first_pass_ms: f64,
    pub rebind_ms: Stats,
    /// Record bytes per second in the rebinds (median), GB = 2^30.
    pub rebind_gbps: f64,
    /// Re-reading a victim working set of half the LLC right after a pass.
    pub victim_reread_us: Stats,
    /// template-memcpy's median rebind time over this variant's.
    pub speedup: f64,
}

impl TableRow for InitRow {
    fn columns() -> &'static [&'static str] {
        &[
            "record",
            "function",
            "first pass ms",
            "rebind ms mean ± sd",
            "GB/s",
            "victim re-read µs",
            "speedup",
        ]
    }

    fn spread(&self) -> Option<&Stats> {
        Some(&self.rebind_ms)
    }

    fn cells(&self) -> Vec<String> {
        vec![
            show_size(self.record_size),
            self.function.clone(),
            format!("{:.1}", self.first_pass_ms),
            pm(&self.rebind_ms, 1),
            format!("{:.2}", self.rebind_gbps),
            format!("{:.0}", self.victim_reread_us.median),
            format!("{:.2}x", self.speedup),
        ]
    }
}

/// The per-record fields: a pfn-like index and flags derived from it.
fn update(i: usize, t: &mut [u8]) {
    t[..8].copy_from_slice(&(i as u64).to_le_bytes());
    t[8..16].copy_from_slice(&(((i as u64) << 8) | 0x5).to_le_bytes());
}

/// Field-by-field: every 8-byte field a separate store, as the kernel's
/// `__init_single_page` sets fields through separate helpers.
fn init_fields(array: &mut [u8], template: &[u8]) {
    let record = template.len();
    let words: Vec<u64> = template
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect();
    for (i, rec) in array.chunks_exact_mut(record).enumerate() {
        let p = rec.as_mut_ptr().cast::<u64>();
        for (w, &base) in words.iter().enumerate() {
            let v = match w {
                0 => i as u64,
                1 => ((i as u64) << 8) | 0x5,
                _ => base,
            };
            // SAFETY: w < record / 8, so the store is inside `rec`, which is
            // 16-byte aligned (page-aligned array, record a multiple of 16).
            unsafe { p.add(w).write_volatile(v) };
        }
    }
}

fn read_sum(v: &[u8]) -> u64 {
    v.chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .fold(0u64, u64::wrapping_add)
}

/// A cheap fingerprint, to check every variant produced the same array.
fn fingerprint(v: &[u8]) -> u64 {
    v.chunks_exact(8).enumerate().fold(0u64, |h, (i, w)| {
        h ^ u64::from_le_bytes(w.try_into().expect("8 bytes")).rotate_left((i % 64) as u32)
    })
}

/// Prints the experiment's report (`-f help` prints the strategies instead).
pub fn run(a: InitArgs) -> Result<(), CliError> {
    let format = a.format;
    super::print(report(a)?, format)
}

/// Runs the experiment; `None` when the options only asked for help.
pub fn report(a: InitArgs) -> Result<Option<Report<InitRow>>, CliError> {
    if a.function.trim() == "help" {
        println!("init variants (-f name[,name...] | all):");
        for (n, d) in VARIANTS {
            println!("  {n:<16} {d}");
        }
        return Ok(None);
    }
    let chosen: Vec<&str> = if a.function.trim() == "all" {
        VARIANTS.iter().map(|v| v.0).collect()
    } else {
        let mut v = Vec::new();
        for name in a.function.split(',').map(str::trim) {
            let known = VARIANTS.iter().find(|x| x.0 == name).ok_or_else(|| {
                format!(
                    "unknown init variant '{name}' (known: field, template-memcpy, template-nt)"
                )
            })?;
            v.push(known.0);
        }
        v
    };
    if a.record == 0 || a.record % 16 != 0 {
        return Err(format!(
            "record size {} is not a non-zero multiple of 16 bytes",
            a.record
        )
        .into());
    }
    let len = a.size / a.record * a.record;
    if len == 0 {
        return Err(format!(
            "size {} holds no {}-byte record",
            show_size(a.size),
            a.record
        )
        .into());
    }
    super::check_shape(a.size, &[], 1)?;
    let victim_len = (cpu().caches.llc / 2).max(1 << 20);
    let mut victim = vec![1u8; victim_len];
    let template: Vec<u8> = (0..a.record).map(|i| (i * 7 + 3) as u8).collect();
    let title = format!(
        "init: {} records of {} B ({}), first pass on fresh memory then {} rebinds; victim set {}",
        len / a.record,
        a.record,
        show_size(len),
        a.loops - 1,
        show_size(victim_len)
    );
    let params = json!({"size": len, "record_size": a.record, "loops": a.loops, "victim_bytes": victim_len,
                        "functions": chosen});
    let mut report = Report::<InitRow>::new("init", title, params);
    let mut fingerprints = Vec::new();
    let mut results = Vec::new();
    for &name in &chosen {
        // 2 MiB backing, as the kernel's vmemmap is PMD-mapped.
        let mut region = Region::unpopulated(len, 2 << 20)?;
        let pb = bar(a.loops as usize, &format!("init {name}"));
        let (mut pass_ms, mut victim_us) = (Vec::new(), Vec::new());
        for _ in 0..a.loops {
            std::hint::black_box(read_sum(&victim));
            let array = &mut region.as_mut_slice()[..len];
            let mut t = template.clone();
            let t0 = Instant::now();
            match name {
                "field" => init_fields(array, &template),
                "template-memcpy" => fill_from_template_cached(array, &mut t, update)?,
                _ => fill_from_template(array, &mut t, update)?,
            }
            pass_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            let t1 = Instant::now();
            std::hint::black_box(read_sum(&victim));
            victim_us.push(t1.elapsed().as_secs_f64() * 1e6);
            pb.inc(1);
        }
        pb.finish_and_clear();
        region.observe_backing();
        report
            .header
            .push(BackingNote::of(2 << 20, name, region.backing()).line());
        fingerprints.push((name, fingerprint(&region.as_slice()[..len])));
        results.push((name, pass_ms, victim_us));
        victim[0] = victim[0].wrapping_add(1);
    }
    if let Some((first, fp)) = fingerprints.first() {
        if let Some((other, _)) = fingerprints.iter().find(|(_, f)| f != fp) {
            return Err(format!("{other} produced a different array than {first}").into());
        }
    }
    let rebind = |ms: &[f64]| Stats::of(&ms[1..]).expect("at least two passes");
    let memcpy_median = results
        .iter()
        .find(|r| r.0 == "template-memcpy")
        .map(|r| rebind(&r.1).median);
    for (name, ms, vus) in &results {
        let rb = rebind(ms);
        report.rows.push(InitRow {
            function: name.to_string(),
            record_size: a.record,
            records: len / a.record,
            first_pass_ms: ms[0],
            rebind_ms: rb,
            rebind_gbps: foliokit::measure::gbps(len, rb.median / 1e3),
            victim_reread_us: Stats::of(vus).expect("passes ran"),
            speedup: memcpy_median.map_or(f64::NAN, |m| m / rb.median),
        });
    }
    report
        .footer
        .push("speedup: template-memcpy's median rebind time over the variant's".into());
    report.footer.push(
        "seed 003 (Ice Lake VM, 100 GB nd_pmem): first bind 1456 -> 1272 ms, rebinds 244.28 -> 96.79 ms (2.52x) with memcpy_nt"
            .into(),
    );
    if a.record != 64 {
        report.notes.push(
            "seed 003 streams 64-byte struct pages; this run used another record size".into(),
        );
    }
    Ok(Some(report))
}

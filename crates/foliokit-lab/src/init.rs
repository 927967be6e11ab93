//! Seed 003's write-once initialisation of a memmap-like array — field by
//! field, template + memcpy, template + streaming stores + one drain, each
//! template form on a byte array and on a typed one — first pass vs
//! rebinds, and what each variant costs whatever else was in the cache.

use foliokit::cpu::cpu;
use foliokit::mem::Region;
use foliokit::nt::{
    fill_from_template, fill_from_template_cached, fill_records, fill_records_cached,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Instant;

use crate::measure::{probe, LimitOp, Limits, Order, Probe, Stats, Stores};
use crate::prepare::check_shape;
use crate::progress::Progress;
use crate::schema::{pct, BackingNote, LimitShare, Report};
use crate::units::show_size;
use crate::LabError;

/// The array, the variants and the passes.
#[derive(Debug, Clone)]
pub struct InitPlan {
    /// Bytes of records initialised per pass.
    pub size: usize,
    /// Bytes per record, a multiple of 16.
    pub record: usize,
    /// Variants: name[,name...] or all.
    pub function: String,
    /// Passes per variant: the first (fresh memory) and the rebinds.
    pub loops: usize,
    /// Run the same-run limit probes.
    pub limits: bool,
}

pub const VARIANTS: &[(&str, &str)] = &[
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
        "update the template, stream it with movntdq, one sfence at the end (seed 003; nt::fill_from_template, byte array)",
    ),
    (
        "typed-memcpy",
        "typed records ([u64; N]): copy the template, update, assign (cached stores; nt::fill_records_cached)",
    ),
    (
        "typed-nt",
        "typed records: the template kept in registers, whole records streamed, one sfence (nt::fill_records)",
    ),
];

/// Largest record the typed variants are built for (`[u64; 32]`).
pub const TYPED_MAX: usize = 256;

#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// `rebind_gbps` against the write limit of the array.
    #[serde(flatten)]
    pub limit: LimitShare,
}

/// The per-record fields: a pfn-like index and flags derived from it.
fn update(i: usize, t: &mut [u8]) {
    t[..8].copy_from_slice(&(i as u64).to_le_bytes());
    t[8..16].copy_from_slice(&(((i as u64) << 8) | 0x5).to_le_bytes());
}

/// The typed variants' per-record fields: the same bytes as [`update`].
#[inline(always)]
fn update_typed<const W: usize>(i: usize, r: &mut [u64; W]) {
    r[0] = i as u64;
    r[1] = ((i as u64) << 8) | 0x5;
}

/// Runs a typed variant on `array` viewed as `[u64; W]` records.
fn typed<const W: usize>(array: &mut [u8], template: &[u8], nt: bool) -> Result<(), LabError> {
    let size = 8 * W;
    if template.len() != size
        || array.len() % size != 0
        || array.as_ptr() as usize % std::mem::align_of::<u64>() != 0
    {
        return Err(format!("typed records of {size} B do not fit this array").into());
    }
    let mut t = [0u64; W];
    for (w, b) in t.iter_mut().zip(template.chunks_exact(8)) {
        *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
    }
    // SAFETY: the array is 8-byte aligned and a whole number of `[u64; W]`
    // records (checked above); every bit pattern is a valid u64; the slice
    // borrows `array` exclusively for its lifetime.
    let recs = unsafe {
        std::slice::from_raw_parts_mut(array.as_mut_ptr().cast::<[u64; W]>(), array.len() / size)
    };
    if nt {
        fill_records(recs, t, update_typed::<W>);
    } else {
        fill_records_cached(recs, t, update_typed::<W>);
    }
    Ok(())
}

/// The typed variant for `record`-byte records (a multiple of 8, 16..=256).
fn typed_fill(array: &mut [u8], template: &[u8], nt: bool) -> Result<(), LabError> {
    macro_rules! by_words {
        ($($w:literal)*) => {
            match template.len() / 8 {
                $($w => typed::<$w>(array, template, nt),)*
                _ => Err(format!("no typed variant for {}-byte records", template.len()).into()),
            }
        };
    }
    by_words!(2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32)
}

/// Runs variant `name` over `array` once.
fn run_variant(name: &str, array: &mut [u8], template: &[u8]) -> Result<(), LabError> {
    let mut t = template.to_vec();
    match name {
        "field" => init_fields(array, template),
        "template-memcpy" => fill_from_template_cached(array, &mut t, update)?,
        "template-nt" => fill_from_template(array, &mut t, update)?,
        "typed-memcpy" => typed_fill(array, template, false)?,
        "typed-nt" => typed_fill(array, template, true)?,
        other => return Err(format!("unknown init variant '{other}'").into()),
    }
    Ok(())
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

/// Runs the experiment.
pub fn run(a: &InitPlan, progress: &dyn Progress) -> Result<Report<InitRow>, LabError> {
    let typed_ok = a.record <= TYPED_MAX;
    let all = a.function.trim() == "all";
    let chosen: Vec<&str> = if all {
        VARIANTS
            .iter()
            .map(|v| v.0)
            .filter(|n| typed_ok || !n.starts_with("typed"))
            .collect()
    } else {
        let mut v = Vec::new();
        for name in a.function.split(',').map(str::trim) {
            let known = VARIANTS.iter().find(|x| x.0 == name).ok_or_else(|| {
                let names: Vec<&str> = VARIANTS.iter().map(|v| v.0).collect();
                format!(
                    "unknown init variant '{name}' (known: {})",
                    names.join(", ")
                )
            })?;
            if known.0.starts_with("typed") && !typed_ok {
                return Err(format!(
                    "{}: typed records are built for 16 to {TYPED_MAX} bytes, not {}",
                    known.0, a.record
                )
                .into());
            }
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
    // A shared array for the rebinds plus one fresh array at a time.
    check_shape(a.size, &[], 2)?;
    let victim_len = (cpu().caches.llc / 2).max(1 << 20);
    let mut victim = vec![1u8; victim_len];
    let template: Vec<u8> = (0..a.record).map(|i| (i * 7 + 3) as u8).collect();
    let title = format!(
        "init: {} records of {} B ({}), first pass on fresh memory then {} rebinds interleaved; victim set {}",
        len / a.record,
        a.record,
        show_size(len),
        a.loops - 1,
        show_size(victim_len)
    );
    let params = json!({"size": len, "record_size": a.record, "loops": a.loops, "victim_bytes": victim_len,
                        "functions": chosen});
    let mut report = Report::<InitRow>::new("init", title, params);
    if all && !typed_ok {
        report.notes.push(format!(
            "typed-memcpy and typed-nt skipped: typed records are built for 16 to {TYPED_MAX} bytes"
        ));
    }
    let nv = chosen.len();
    let probes = if !a.limits { 0 } else { Probe::ALL.len() };
    // Rebind passes: at least loops - 1, rounded up to whole designs.
    let order = Order::new(nv + probes, a.loops - 1);
    progress.begin(nv * (1 + order.passes), "init");

    // First binds: each variant on its own fresh array (faults included),
    // verified against the first variant's array.
    let mut first_ms = Vec::new();
    let mut victim_us: Vec<Vec<f64>> = vec![Vec::new(); chosen.len()];
    let mut reference: Option<(&str, u64)> = None;
    for (c, &name) in chosen.iter().enumerate() {
        // 2 MiB backing, as the kernel's vmemmap is PMD-mapped.
        let mut region = Region::unpopulated(len, 2 << 20)?;
        std::hint::black_box(read_sum(&victim));
        let array = &mut region.as_mut_slice()[..len];
        let t0 = Instant::now();
        run_variant(name, array, &template)?;
        first_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        let t1 = Instant::now();
        std::hint::black_box(read_sum(&victim));
        victim_us[c].push(t1.elapsed().as_secs_f64() * 1e6);
        region.observe_backing();
        report
            .header
            .push(BackingNote::of(2 << 20, name, region.backing()).line());
        let fp = fingerprint(&region.as_slice()[..len]);
        match reference {
            None => reference = Some((name, fp)),
            Some((first, want)) if want != fp => {
                return Err(format!("{name} produced a different array than {first}").into())
            }
            Some(_) => {}
        }
        victim[0] = victim[0].wrapping_add(1);
        progress.tick();
    }
    // Rebinds: every variant on one shared, already-faulted array,
    // interleaved pass by pass in a balanced (Williams) design, as
    // measure's runner does: a noisy minute slows them all alike, and each
    // follows every other equally often (a probe's streaming writes leave
    // the cache differently from a cached fill, so a fixed rotation would
    // give one variant the same predecessor every time).
    let mut shared = Region::new(len, 2 << 20)?;
    let mut rebind_ms: Vec<Vec<f64>> = vec![Vec::new(); nv];
    let mut probe_secs: Vec<Vec<f64>> = vec![Vec::new(); probes];
    for pass in 0..order.passes {
        for c in order.pass(pass) {
            std::hint::black_box(read_sum(&victim));
            let array = &mut shared.as_mut_slice()[..len];
            let t0 = Instant::now();
            if c >= nv {
                // The limit probes: the same array, one thread, as the fills.
                probe(Probe::ALL[c - nv], array, 1, len)?;
                probe_secs[c - nv].push(t0.elapsed().as_secs_f64());
                continue;
            }
            run_variant(chosen[c], array, &template)?;
            rebind_ms[c].push(t0.elapsed().as_secs_f64() * 1e3);
            let t1 = Instant::now();
            std::hint::black_box(read_sum(&victim));
            victim_us[c].push(t1.elapsed().as_secs_f64() * 1e6);
            victim[0] = victim[0].wrapping_add(1);
            progress.tick();
        }
    }
    // The probes overwrote the array: one more pass of the first variant
    // leaves what every variant must leave, checked below.
    if probes > 0 {
        run_variant(chosen[0], &mut shared.as_mut_slice()[..len], &template)?;
    }
    progress.end();
    if let Some((first, want)) = reference {
        if fingerprint(&shared.as_slice()[..len]) != want {
            return Err(format!("the rebinds left a different array than {first}'s").into());
        }
    }
    let stats = |ms: &[f64]| Stats::of(ms).expect("at least one rebind");
    let median_of = |name: &str| {
        chosen
            .iter()
            .position(|&n| n == name)
            .map(|c| stats(&rebind_ms[c]).median)
    };
    let memcpy_median = median_of("template-memcpy");
    let limits = Limits::from_secs(LimitOp::Init, Stores::Streaming, len, &probe_secs);
    let limit = limits.as_ref().map(Limits::gbps);
    for (c, &name) in chosen.iter().enumerate() {
        let rb = stats(&rebind_ms[c]);
        let rebind_gbps = crate::measure::gbps(len, rb.median / 1e3);
        report.rows.push(InitRow {
            function: name.to_string(),
            record_size: a.record,
            records: len / a.record,
            first_pass_ms: first_ms[c],
            rebind_ms: rb,
            rebind_gbps,
            victim_reread_us: Stats::of(&victim_us[c]).expect("passes ran"),
            speedup: memcpy_median.map_or(f64::NAN, |m| m / rb.median),
            limit: LimitShare::of(rebind_gbps, limit),
        });
    }
    if let Some(l) = &limits {
        report.footer.push(format!(
            "limit: read {:.2}, write 0s {:.2}, write {:.2} GB/s (medians, one thread, this array) -> init limit {:.2} GB/s ({})",
            l.read.median,
            l.write_zero.median,
            l.write.median,
            l.gbps(),
            l.formula
        ));
        report.section("limit_gbps", l.gbps());
        report.section("limits", l);
    }
    report
        .footer
        .push("speedup: template-memcpy's median rebind time over the variant's".into());
    report.footer.push(format!(
        "rebinds, with the limit probes as candidates: {}",
        order.line()
    ));
    report.section("order", &order);
    let ratio = |a: &str, b: &str| Some(median_of(b)? / median_of(a)?);
    for (nt, cached) in [
        ("template-nt", "template-memcpy"),
        ("typed-nt", "typed-memcpy"),
    ] {
        if let (Some(r), Some(m)) = (ratio(nt, cached), ratio(nt, "template-memcpy")) {
            let of = report
                .rows
                .iter()
                .find(|x| x.function == nt)
                .and_then(|x| x.limit.of_limit);
            report.footer.push(format!(
                "{nt}: {} of the write limit, {r:.2}x {cached}, {m:.2}x template-memcpy (median rebinds, same run)",
                pct(of)
            ));
        }
    }
    report.footer.push(crate::seeds::quote("init"));
    if a.record != 64 {
        report.notes.push(
            "seed 003 streams 64-byte struct pages; this run used another record size".into(),
        );
    }
    Ok(report)
}

//! Seed 002's demand-fault experiment, as `perf bench mem mmap` runs it:
//! map a region, fault every page in, unmap — by page size, fault method
//! and thread count, with the same-run write limit beside it.

use foliokit::mem::{populate_chunked, Region};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Instant;

use crate::copy_clear::no_repeats;
use crate::hugetlb::HugetlbGrant;
use crate::measure::{gbps, probe, LimitOp, Limits, Probe, Stats, Stores};
use crate::prepare::check_shape;
use crate::progress::Progress;
use crate::schema::{BackingNote, LimitNote, LimitShare, Report};
use crate::units::show_size;
use crate::LabError;

/// What to fault, how, and how often.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    /// Bytes mapped and faulted per loop.
    pub size: usize,
    /// Page sizes: 4K, 2M (THP), 1G (hugetlb).
    pub page: Vec<usize>,
    /// `demand` (touch one byte per page) and/or `populate`
    /// (MADV_POPULATE_WRITE per chunk).
    pub function: Vec<String>,
    /// Timed loops after the first-touch pass.
    pub loops: usize,
    /// Touch a random offset within each page instead of its first byte.
    pub random: bool,
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Run the same-run limit probes.
    pub limits: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultRow {
    pub function: String,
    pub folio_size: usize,
    pub channels: usize,
    /// The first pass, on memory this run had not faulted before: in a VM
    /// that can include the host backing the guest's pages for the first time.
    pub first_touch_gbps: f64,
    pub gbps: Stats,
    /// Median over the median of the same function and page with 1 thread.
    pub speedup: f64,
    /// Against the limit: a streaming write of zeros, same size and threads.
    #[serde(flatten)]
    pub limit: LimitShare,
}

/// Touches one byte per `page` in `[lo, hi)` of the region (a write fault).
fn touch(base: usize, lo: usize, hi: usize, page: usize, random: bool, seed: u64) {
    let mut x = seed | 1;
    let mut off = lo;
    while off < hi {
        let within = if random {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as usize) % page
        } else {
            0
        };
        // SAFETY: base + off + within lies inside the caller's mapping
        // (off < hi <= len, within < page, and len is a multiple of page).
        unsafe { ((base + off + within) as *mut u8).write_volatile(1) };
        off += page;
    }
}

/// Refuses page sizes other than the base page, the PMD THP size and 1G:
/// an mTHP size is not a fault unit a demand pass can step by (its rows
/// would touch one 4K page in 16 and report the rest as faulted).
fn check_pages(pages: &[usize], base: usize, pmd: usize) -> Result<(), LabError> {
    const GIB: usize = 1 << 30;
    match pages.iter().find(|&&p| p != base && p != pmd && p != GIB) {
        Some(&p) => Err(format!(
            "page size {} is not one fault runs on: {} (base page), {} (THP) or 1G (hugetlb)",
            show_size(p),
            show_size(base),
            show_size(pmd)
        )
        .into()),
        None => Ok(()),
    }
}

/// The stride of a demand pass over a region that asked for `page`: one
/// write per fault, so per page of the backing the region can have. A 1G
/// request hugetlb did not serve falls back to PMD THP, and a THP size
/// sysfs does not allow via madvise to base pages: stepping by the asked
/// size there would leave most of the region untouched.
fn touch_step(
    page: usize,
    base: usize,
    pmd: usize,
    hugetlb: bool,
    thp_allows: impl Fn(usize) -> bool,
) -> usize {
    if page == base || hugetlb {
        return page;
    }
    let want = page.min(pmd);
    if thp_allows(want) {
        want
    } else {
        base
    }
}

/// The `touch_step` of region `r`, mapped for `page`.
fn region_step(r: &Region, page: usize) -> usize {
    let thp = foliokit::mem::system::thp_state();
    touch_step(
        page,
        foliokit::batch::page_size(),
        thp.pmd_size.unwrap_or(2 << 20),
        r.backing().obtained.starts_with("hugetlb"),
        |s| thp.madvise_allows(s),
    )
}

/// One loop: map, fault in with `threads` threads, and time both; unmapping
/// happens after the clock stops. Returns the GB/s and the region's backing.
fn one_pass(
    a: &FaultPlan,
    page: usize,
    function: &str,
    threads: usize,
    seed: u64,
) -> Result<(f64, Region), LabError> {
    let t0 = Instant::now();
    let mut r = Region::unpopulated(a.size, page)?;
    let len = r.len();
    match function {
        "populate" => {
            // Chunks of at least one page of the mapping (1G pages fault whole).
            // SAFETY: the region is ours, mapped and writable.
            unsafe { populate_chunked(r.as_mut_ptr(), len, threads, page) }?;
        }
        _ => {
            let step = region_step(&r, page);
            let base = r.as_mut_ptr() as usize;
            let per = len.div_ceil(threads).next_multiple_of(step);
            std::thread::scope(|s| {
                for t in 1..threads {
                    let (lo, hi) = ((t * per).min(len), ((t + 1) * per).min(len));
                    s.spawn(move || touch(base, lo, hi, step, a.random, seed + t as u64));
                }
                touch(base, 0, per.min(len), step, a.random, seed);
            });
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((gbps(len, secs), r))
}

/// Sets each row's speedup over the 1-thread row of the same function
/// (all `rows` are of one page size); undefined without such a row.
fn speedups(rows: &mut [FaultRow]) {
    let single: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.channels == 1)
        .map(|r| (r.function.clone(), r.gbps.median))
        .collect();
    for r in rows.iter_mut() {
        let one = single.iter().find(|(f, _)| *f == r.function);
        r.speedup = one.map_or(f64::NAN, |(_, m)| r.gbps.median / m);
    }
}

/// Runs the experiment.
pub fn run(a: &FaultPlan, progress: &dyn Progress) -> Result<Report<FaultRow>, LabError> {
    for f in &a.function {
        if f != "demand" && f != "populate" {
            return Err(format!("unknown fault function '{f}' (known: demand, populate)").into());
        }
    }
    if a.loops == 0 || a.threads.contains(&0) {
        return Err("loops and thread counts must be at least 1".into());
    }
    let pmd = foliokit::mem::system::thp_state()
        .pmd_size
        .unwrap_or(2 << 20);
    check_pages(&a.page, foliokit::batch::page_size(), pmd)?;
    no_repeats("page size", &a.page, |&p| show_size(p))?;
    no_repeats("fault function", &a.function, |f: &String| format!("'{f}'"))?;
    no_repeats("thread count", &a.threads, |t: &usize| t.to_string())?;
    let limits_on = a.limits;
    // The probes need a faulted buffer of the same size beside the passes.
    check_shape(a.size, &a.page, 1 + usize::from(limits_on))?;
    let title = format!(
        "fault: map {} and fault every page in ({}), then unmap untimed; {} loops after a first-touch pass, methods interleaved",
        show_size(a.size),
        if a.random { "random offset per page" } else { "first byte of each page" },
        a.loops
    );
    let params = json!({"size": a.size, "pages": a.page, "functions": a.function, "loops": a.loops,
                        "random": a.random, "threads": a.threads});
    let mut report = Report::<FaultRow>::new("fault", title, params);
    let mut backing = Vec::new();
    let mut limit_notes = Vec::new();
    let probes = if limits_on { Probe::ALL.len() } else { 0 };
    let nf = a.function.len();
    let total = a.page.len() * a.threads.len() * (nf + (nf + probes) * a.loops);
    progress.begin(total, "fault");
    for &page in &a.page {
        // 1G pages come from the hugetlb pool: grow it once for the whole
        // run (when allowed), not inside the timed loops.
        let _grant = if page == 1 << 30 {
            let need = a.size.div_ceil(page);
            match HugetlbGrant::reserve(page, need) {
                Ok(g) => {
                    if g.is_some() {
                        report
                            .notes
                            .push(format!("1G: grew the hugetlb pool by {need} pages for this run; restored afterwards"));
                    }
                    g
                }
                Err(why) => {
                    report
                        .notes
                        .push(format!("1G: {why}; the region falls back to THP"));
                    None
                }
            }
        } else {
            None
        };
        // Probes write a faulted buffer of the same size, in pieces of at
        // least 2 MiB spread over the same number of threads.
        let mut probe_buf = if limits_on {
            Some(Region::new(a.size, page.min(2 << 20))?)
        } else {
            None
        };
        let piece = page.max(2 << 20);
        let first_row = report.rows.len();
        for &t in &a.threads {
            let mut first = Vec::new();
            for f in &a.function {
                let (g, mut r) = one_pass(a, page, f, t, 1)?;
                r.observe_backing();
                backing.push(BackingNote::of(page, &format!("{f} x{t}"), r.backing()));
                drop(r);
                first.push(g);
                progress.tick();
            }
            // Timed loops: methods and probes interleaved, rotated each loop.
            let mut rates: Vec<Vec<f64>> = vec![Vec::new(); nf];
            let mut probe_secs: Vec<Vec<f64>> = vec![Vec::new(); probes];
            for l in 0..a.loops {
                for k in 0..nf + probes {
                    let c = (l + k) % (nf + probes);
                    if c < nf {
                        let (g, r) = one_pass(a, page, &a.function[c], t, 2 + l as u64)?;
                        drop(r);
                        rates[c].push(g);
                    } else if let Some(buf) = probe_buf.as_mut() {
                        let t0 = Instant::now();
                        probe(Probe::ALL[c - nf], buf.as_mut_slice(), t, piece)?;
                        probe_secs[c - nf].push(t0.elapsed().as_secs_f64());
                    }
                    progress.tick();
                }
            }
            let lim = limits_on
                .then(|| Limits::from_secs(LimitOp::Fault, Stores::Streaming, a.size, &probe_secs))
                .flatten();
            let limit = lim.as_ref().map(Limits::gbps);
            if let Some(l) = lim {
                limit_notes.push(LimitNote {
                    folio_size: page,
                    channels: t,
                    limits: l,
                });
            }
            for (c, f) in a.function.iter().enumerate() {
                let Some(gbps) = Stats::of(&rates[c]) else {
                    continue;
                };
                report.rows.push(FaultRow {
                    function: f.clone(),
                    folio_size: page,
                    channels: t,
                    first_touch_gbps: first[c],
                    gbps,
                    speedup: f64::NAN,
                    limit: LimitShare::of(gbps.median, limit),
                });
            }
        }
        // Once every thread count has run: `-t 2,1` measures one thread last.
        speedups(&mut report.rows[first_row..]);
    }
    progress.end();
    // One backing line per page size and method is enough for the table.
    let mut seen = std::collections::BTreeSet::new();
    for b in &backing {
        if seen.insert((b.folio_size, b.obtained.clone())) {
            report.header.push(BackingNote::line(b));
        }
    }
    report.section("backing", &backing);
    report.notes.extend(crate::measure::fresh_memory_note());
    for l in &limit_notes {
        report
            .footer
            .push(format!("{} (threads = channels)", l.line()));
    }
    if let Some(l) = limit_notes.first() {
        report.footer.push(format!(
            "% limit: median over the limit; {}: what is left is the kernel's fault path",
            l.limits.formula
        ));
        report.section("limits", &limit_notes);
    }
    report
        .footer
        .push("speedup: median over the 1-thread median of the same function and page size".into());
    report.footer.push(crate::seeds::quote("fault"));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K4: usize = 4 << 10;
    const M2: usize = 2 << 20;
    const G1: usize = 1 << 30;

    #[test]
    fn only_base_thp_and_hugetlb_pages() {
        assert!(check_pages(&[K4, M2, G1], K4, M2).is_ok());
        let err = check_pages(&[K4, 64 << 10], K4, M2)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "page size 64K is not one fault runs on: 4K (base page), 2M (THP) or 1G (hugetlb)"
        );
    }

    #[test]
    fn demand_steps_by_the_backing_the_region_can_have() {
        let yes = |_| true;
        let no = |_| false;
        assert_eq!(touch_step(K4, K4, M2, false, no), K4);
        assert_eq!(touch_step(M2, K4, M2, false, yes), M2);
        // THP not allowed via madvise: base pages.
        assert_eq!(touch_step(M2, K4, M2, false, no), K4);
        // 1G from hugetlb, or fallen back to THP, or to base pages.
        assert_eq!(touch_step(G1, K4, M2, true, no), G1);
        assert_eq!(touch_step(G1, K4, M2, false, yes), M2);
        assert_eq!(touch_step(G1, K4, M2, false, no), K4);
    }

    #[test]
    fn speedups_are_over_the_one_thread_row_wherever_it_ran() {
        let row = |function: &str, channels, g| FaultRow {
            function: function.into(),
            folio_size: M2,
            channels,
            first_touch_gbps: 0.0,
            gbps: Stats::of(&[g]).unwrap(),
            speedup: f64::NAN,
            limit: LimitShare::of(g, None),
        };
        // -t 2,1 -f demand,populate: the 1-thread rows come last.
        let mut rows = vec![
            row("demand", 2, 6.0),
            row("populate", 2, 9.0),
            row("demand", 1, 4.0),
            row("populate", 1, 3.0),
        ];
        speedups(&mut rows);
        let s: Vec<f64> = rows.iter().map(|r| r.speedup).collect();
        assert_eq!(s, [1.5, 3.0, 1.0, 1.0]);
        let mut rows = vec![row("demand", 2, 6.0)];
        speedups(&mut rows);
        assert!(rows[0].speedup.is_nan());
    }
}

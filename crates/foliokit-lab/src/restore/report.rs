//! The restore bench's report: its rows, the same-run copy limit, the A/A
//! control and the targets each row is held to.

use serde_json::json;

use super::{run, RestorePlan, RestoreResult, RestoreRow, HANDLER_METHODS, METHODS, ZERO_METHODS};
use crate::progress::Progress;
use crate::schema::{pct, Report};
use crate::units::show_size;
use crate::LabError;
use foliokit::mem::system::is_root;

/// Runs the experiment and writes its report: the rows, the same-run copy
/// limit, the A/A control and the targets restore is held to.
pub fn report(plan: &RestorePlan, progress: &dyn Progress) -> Result<Report<RestoreRow>, LabError> {
    if plan.cold && !is_root() {
        return Err(
            "--cold drops the snapshot from the page cache before every restore: run as root"
                .into(),
        );
    }
    let zeros = plan.zero_fraction > 0.0;
    let methods = METHODS
        + if zeros { ZERO_METHODS } else { 0 }
        + match (&plan.vmm_exe, zeros) {
            (None, _) => 0,
            (Some(_), false) => HANDLER_METHODS,
            (Some(_), true) => HANDLER_METHODS + 1,
        };
    let order = crate::measure::Order::new(methods, plan.loops);
    progress.begin(methods * (order.passes + 1), "restore");
    let r = run(plan.clone(), || progress.tick())?;
    progress.end();
    let budget_us = plan.budget.as_micros() as u64;
    let title = format!(
        "restore: {} guest of 2 MiB {} from a snapshot in {}, {} channels, budget {} µs, faults {}",
        show_size(plan.size),
        if plan.hugetlb { "hugetlb pages" } else { "THP" },
        if plan.cold {
            "a cold file"
        } else {
            "the page cache"
        },
        plan.channels,
        budget_us,
        if plan.serve_during_batches {
            "served beside the batch in flight"
        } else {
            "cut the batch in flight short"
        }
    );
    let params = json!({"size": plan.size, "channels": plan.channels, "loops": plan.loops,
                        "budget_us": budget_us, "cold": plan.cold,
                        "serve_during_batches": plan.serve_during_batches,
                        "hugetlb": plan.hugetlb, "zero_fraction": plan.zero_fraction,
                        "dense_zeros": plan.dense_zeros, "handler_block": plan.handler_block});
    let mut report = Report::<RestoreRow>::new("restore", title, params);
    report.rows = r.rows.clone();
    report.notes.extend(r.notes.iter().cloned());
    let row = |f: &str| r.rows.iter().find(|x| x.function == f);
    if let Some(l) = &r.limits {
        report.footer.push(format!(
            "copy limit {:.2} GB/s ({}; set by {}); the foliokit rows ran mc {}",
            l.gbps(),
            l.formula,
            l.set_by,
            r.strategy
        ));
    }
    if let Some(aa) = &r.aa {
        report.footer.push(aa.line(" (eager foliokit)"));
    }
    if let (Some(e), Some(z), Some(rd)) = (row("foliokit"), row("lazy"), row("read(2)")) {
        let budget = budget_us as f64;
        let folio_us = r.limits.as_ref().map_or(f64::NAN, |l| {
            (2 << 20) as f64 / (l.gbps() * (1u64 << 30) as f64) * 1e6
        });
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        let start = z.start_secs.median / e.resident_secs.median;
        let total = z.resident_secs.median / e.resident_secs.median;
        let vs_read = e.gbps.median / rd.gbps.median;
        let p99 = z.touch_p99_us.unwrap_or(f64::NAN);
        let pooled = z.touch_p99_pooled_us.unwrap_or(f64::NAN);
        let prealloc = row("foliokit, prealloc").map_or(f64::NAN, |x| x.share);
        let waited = row("lazy + wait").map_or(f64::NAN, |x| x.share);
        report.footer.push(format!(
            "targets: lazy start {:.2}% of eager foliokit (≤1%: {}); lazy all-resident {:.2}x eager foliokit (≤1.25x: {}); eager foliokit {:.2}x read(2) (≥2x: {}) and {} of the limit (≥70%: {}; into preallocated guest RAM {}: {}; through the fill, lazy + wait, {}: {}); lazy touch p99 {:.0} µs (median of the passes') vs budget + one folio's copy {:.0} µs ({}; every pass's touches pooled: {:.0} µs, {})",
            start * 100.0,
            verdict(start <= 0.01),
            total,
            verdict(total <= 1.25),
            vs_read,
            verdict(vs_read >= 2.0),
            pct(Some(e.share)),
            verdict(e.share >= 0.7),
            pct(Some(prealloc)),
            verdict(prealloc >= 0.7),
            pct(Some(waited)),
            verdict(waited >= 0.7),
            p99,
            budget + folio_us,
            verdict(p99 <= budget + folio_us),
            pooled,
            verdict(pooled <= budget + folio_us),
        ));
        if let Some(f) = row("populate only") {
            let zeroing = format!(
                "fresh guest RAM: the kernel's huge-page faults alone (populate only, zeroing each 2 MiB page) take {:.0} ms of the eager foliokit's {:.0} ms",
                f.resident_secs.median * 1e3,
                e.resident_secs.median * 1e3,
            );
            report.footer.push(if plan.hugetlb {
                format!(
                    "{zeroing}; the lazy fill's UFFDIO_COPY installs each hugetlb page without zeroing it: all resident at {} of the limit",
                    pct(Some(z.share)),
                )
            } else {
                format!("{zeroing}; no restore into fresh anonymous THP avoids them")
            });
        }
    }
    if plan.zero_fraction > 0.0 {
        report
            .footer
            .push(zero_line(&r.rows, plan.zero_fraction, plan.dense_zeros));
    }
    if plan.vmm_exe.is_some() {
        report.footer.extend(handler_line(&r, plan));
    }
    report.footer.push(
        "vCPUs run after: eager rows when the copy ends, lazy when restore_lazy returns; touch: one random page of every folio, in random order, while the fill runs (each first touch of a folio not yet in waits for it); touch p50/p99: each pass's, the median over passes".into(),
    );
    report.footer.push(r.order.line());
    report.section("limits", &r.limits);
    report.section("aa", &r.aa);
    report.section("order", &r.order);
    Ok(report)
}

/// The zero-share target: each zero-share row's time until all resident
/// over its twin's from the none-zero snapshot, in the same run.
fn zero_line(rows: &[RestoreRow], f: f64, dense: bool) -> String {
    let row = |n: &str| rows.iter().find(|x| x.function == n);
    let ratios: Vec<String> = [
        ("foliokit", "foliokit, zero share", "eager foliokit"),
        ("lazy", "lazy, zero share", "lazy"),
        ("lazy + wait", "lazy + wait, zero share", "lazy + wait"),
        (
            "handler: foliokit, no touch",
            "handler: foliokit, no touch, zero share",
            "external handler",
        ),
    ]
    .iter()
    .filter_map(|&(a, b, label)| {
        let (a, b) = (row(a)?, row(b)?);
        let r = b.resident_secs.median / a.resident_secs.median;
        let zero = if b.touch_p50_us.is_some() || label != "eager foliokit" {
            format!(", {} zero pages", b.zero_pages)
        } else {
            String::new()
        };
        Some(format!(
            "{label} {r:.2}x ({}{zero})",
            if r <= 0.6 { "met" } else { "MISSED" }
        ))
    })
    .collect();
    format!(
        "zero pages: with {:.0}% of the snapshot's folios zero ({}), all resident in this share of the time of the same snapshot with none zero (≤0.6x): {}",
        f * 100.0,
        if dense { "written as zero bytes" } else { "holes" },
        ratios.join("; ")
    )
}

/// The external handler's targets: a hugetlb guest all in without a
/// touch at half the copy limit; the background fill's rate (no touch)
/// over one thread serving one fault at a time (a 4 KiB guest whose
/// vCPUs touch every page); the touch p99 of a guest touching its working
/// set against the budget and one folio's copy.
fn handler_line(r: &RestoreResult, plan: &RestorePlan) -> Option<String> {
    let row = |f: &str| r.rows.iter().find(|x| x.function == f);
    let (fill, still, one) = (
        row("handler: foliokit")?,
        row("handler: foliokit, no touch")?,
        row("handler: one fault at a time")?,
    );
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let rate = one.resident_secs.median / still.resident_secs.median;
    let folio_us = r.limits.as_ref().map_or(f64::NAN, |l| {
        (2 << 20) as f64 / (l.gbps() * (1u64 << 30) as f64) * 1e6
    });
    let bound = plan.budget.as_micros() as f64 + folio_us;
    let p99 = fill.touch_p99_us.unwrap_or(f64::NAN);
    let (huge, small) = match plan.hugetlb {
        true => ("", "the target is for 4 KiB guests; "),
        false => ("the target is for hugetlb guests; ", ""),
    };
    Some(format!(
        "handler targets: every page in without a touch at {} of the limit ({huge}≥50%: {}); the background fill {:.2}x the rate of one fault at a time with the vCPUs touching every page ({small}≥3x: {}); touch p99 {:.0} µs (handler block {}), vCPUs touching one page of every 2 MiB, vs budget + one folio's copy {:.0} µs ({})",
        pct(Some(still.share)),
        verdict(still.share >= 0.5),
        rate,
        verdict(rate >= 3.0),
        p99,
        if plan.hugetlb {
            "2M: the huge page".to_string()
        } else {
            crate::units::show_size(plan.handler_block)
        },
        bound,
        verdict(p99 <= bound),
    ))
}

//! `foliokit move`: another process's memory to a NUMA node, as a tiering
//! agent moves it.

use clap::Args;
use foliokit::migrate::process::{
    anon_mappings, migrate_process, ProcessError, ProcessOptions, ProcessReport, Ranges, Target,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::args::{approx_size, Format};
use crate::bench::migrate::parse_duration;
use crate::progress::bar;
use crate::CliError;

/// Exit status when the move finished but some pages stayed elsewhere.
pub const EXIT_PARTIAL: i32 = 3;
/// Exit status when the target exited during the move.
pub const EXIT_GONE: i32 = 4;
/// Exit status when `--cold` cannot run on this system (DAMON absent,
/// without virtual-address monitoring, in use, or not writable here).
pub const EXIT_NO_DAMON: i32 = 5;

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Exit status: 0 every present page is on the node (or nothing was to move); \
3 the move finished but some pages stayed elsewhere (pinned, shared, node full: see 'failed'); \
4 the process exited during the move (what was done is printed); 5 --cold cannot run on this system \
(no DAMON sysfs, a kernel without CONFIG_DAMON_VADDR, DAMON already in use, or not root): nothing \
moved and DAMON left as found; 1 any other error; 2 bad usage.\n\n\
Examples:\n  foliokit move --pid 4242 --to 1 --all-anon\n  \
foliokit move --pid 4242 --to 2 --range 7f0000000000-7f0040000000 --budget 5ms --format json\n  \
foliokit move --pid 4242 --to 1 --all-anon --dry-run"
)]
pub struct MoveArgs {
    /// The process whose memory moves (held by a pidfd for the whole call).
    #[arg(long)]
    pub pid: i32,
    /// The NUMA node to move it to.
    #[arg(long)]
    pub to: u32,
    /// An address range of the process, START-END in hex (as /proc/PID/maps
    /// prints it); repeat for several.
    #[arg(long = "range", value_parser = parse_range)]
    pub ranges: Vec<(usize, usize)>,
    /// Every private anonymous mapping (heap, anonymous mmaps); file
    /// mappings, shared memory and the stack are left alone and listed.
    #[arg(long, conflicts_with = "ranges")]
    pub all_anon: bool,
    /// With --all-anon, also the main thread's stack.
    #[arg(long, requires = "all_anon")]
    pub stack: bool,
    /// Largest time one move_pages call may stall the target (e.g. 5ms).
    #[arg(long, value_parser = parse_duration, default_value = "10ms")]
    pub budget: Duration,
    /// Threads issuing move_pages calls.
    #[arg(short = 't', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    /// Move only what DAMON sees idle for SECS seconds (needs root, DAMON
    /// sysfs that nothing else is using, and a kernel built with
    /// CONFIG_DAMON_VADDR; checked before anything is written: exit 5).
    #[arg(long, value_name = "SECS")]
    pub cold: Option<u64>,
    /// Show what would move; move nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Output format: table, or json (every figure).
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

/// Parses `START-END` in hex, with or without `0x`.
fn parse_range(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("'{s}' is not START-END (hex, as /proc/PID/maps prints it)"))?;
    let hex = |x: &str| {
        let x = x.trim();
        usize::from_str_radix(x.strip_prefix("0x").unwrap_or(x), 16)
            .map_err(|_| format!("'{x}' is not a hex address"))
    };
    let (a, b) = (hex(a)?, hex(b)?);
    if b <= a {
        return Err(format!("range {s} is empty or reversed"));
    }
    Ok((a, b))
}

/// Runs the command; returns the exit status.
pub fn run(a: MoveArgs) -> Result<i32, CliError> {
    if !a.all_anon && a.ranges.is_empty() && a.cold.is_none() {
        return Err(
            "say what to move: --range START-END (repeatable), --all-anon or --cold SECS".into(),
        );
    }
    if a.format == Format::Csv {
        return Err("move prints a table or JSON (--format table|json), not CSV".into());
    }
    let target = Target::open(a.pid)?;
    let mut report = ProcessReport {
        pid: a.pid,
        node: a.to,
        dry_run: a.dry_run,
        ..ProcessReport::default()
    };
    let mut ranges = a.ranges.clone();
    if a.all_anon || (ranges.is_empty() && a.cold.is_some()) {
        let (keep, skipped) = anon_mappings(&target, a.stack)?;
        ranges = keep;
        report.skipped = skipped;
    }
    if let Some(secs) = a.cold {
        ranges =
            crate::damon::cold_regions(a.pid, &ranges, Duration::from_secs(secs)).map_err(|e| {
                if e.is::<crate::damon::Unavailable>() {
                    crate::WithStatus {
                        status: EXIT_NO_DAMON,
                        error: e,
                    }
                    .into()
                } else {
                    e
                }
            })?;
        report
            .notes
            .push(format!("--cold {secs}: {} idle regions", ranges.len()));
    }
    let o = ProcessOptions::default()
        .threads(a.threads as usize)
        .budget(a.budget)
        .dry_run(a.dry_run);
    // One call per range as given: the library looks only at its mapped
    // pages, chunk by chunk, and reports it as one range.
    let total: usize = ranges.iter().map(|(s, e)| e - s).sum();
    let pb = bar(total / 4096, "moving pages");
    let mut status = 0;
    let mut batch = Vec::new();
    for &(s, e) in &ranges {
        match migrate_process(&target, &Ranges::Given(vec![(s, e)]), a.to, &o) {
            Ok(r) => {
                report.secs += r.secs;
                report.budget_us = r.budget_us;
                batch.extend(r.batch_pages_median);
                report.ranges.extend(r.ranges);
            }
            Err(ProcessError::Gone { partial, .. }) => {
                report.ranges.extend(partial.ranges);
                report.notes.push(format!(
                    "process {} exited during the move; what is shown was done before",
                    a.pid
                ));
                status = EXIT_GONE;
                break;
            }
            Err(e) if report.ranges.is_empty() => return Err(e.into()),
            Err(e) => {
                report.notes.push(format!("stopped: {e}"));
                status = 1;
                break;
            }
        }
        pb.inc(((e - s) / 4096) as u64);
    }
    pb.finish_and_clear();
    batch.sort_unstable();
    report.batch_pages_median = batch.get(batch.len() / 2).copied();
    let (_, _, _, failed) = report.totals();
    if status == 0 && failed > 0 && !a.dry_run {
        status = EXIT_PARTIAL;
    }
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        _ => print!("{}", table(&report)),
    }
    Ok(status)
}

/// The terminal rendering: per range, then from-node -> to-node totals.
fn table(r: &ProcessReport) -> String {
    let mut out = String::new();
    let _ =
        writeln!(
        out,
        "# move pid {} to node {}{}: {} ranges, budget {:.0} µs per call, batch {} pages (median)",
        r.pid,
        r.node,
        if r.dry_run { " (dry run: nothing moved)" } else { "" },
        r.ranges.len(),
        r.budget_us,
        r.batch_pages_median.map_or("-".into(), |b| b.to_string())
    );
    let _ = writeln!(
        out,
        "{:<29} {:>8} {:>8} {:>8} {:>8} {:>7} {:>15} {:>11} {:>13}",
        "range",
        "pages",
        "moved",
        "already",
        "absent",
        "failed",
        "huge KiB b/a",
        "first µs",
        "longest µs"
    );
    for x in &r.ranges {
        let failed: usize = x.failed.values().sum();
        let huge = match (x.huge_kib_before, x.huge_kib_after) {
            (Some(b), Some(a)) => format!("{b}/{a}"),
            _ => "-".into(),
        };
        let us = |v: Option<f64>| v.map_or("-".into(), |u| format!("{u:.0}"));
        let _ = writeln!(
            out,
            "{:<29} {:>8} {:>8} {:>8} {:>8} {:>7} {:>15} {:>11} {:>13}",
            format!("{:x}-{:x}", x.start, x.end),
            x.pages,
            x.moved,
            x.already,
            x.not_present,
            failed,
            huge,
            us(x.first_call_us),
            us(x.longest_call_us)
        );
    }
    // From node -> to node totals.
    let mut from: BTreeMap<u32, usize> = BTreeMap::new();
    let mut errs: BTreeMap<i32, usize> = BTreeMap::new();
    for x in &r.ranges {
        for (&n, &c) in &x.moved_from {
            *from.entry(n).or_default() += c;
        }
        for (&e, &c) in &x.failed {
            *errs.entry(e).or_default() += c;
        }
    }
    let (moved, already, absent, failed) = r.totals();
    let secs = r.secs.max(1e-9);
    for (n, c) in &from {
        let bytes = c * 4096;
        let _ = writeln!(
            out,
            "# {n} -> {}: {c} pages, {}, {:.2} GB/s",
            r.node,
            approx_size(bytes),
            bytes as f64 / (1u64 << 30) as f64 / secs
        );
    }
    let _ = writeln!(
        out,
        "# total: {moved} moved, {already} already on node {}, {absent} not present, {failed} failed, {:.3} s",
        r.node, r.secs
    );
    for (e, c) in &errs {
        let why = match *e {
            0 => "stayed elsewhere without an error (freed or moved again meanwhile)".to_string(),
            libc_e => std::io::Error::from_raw_os_error(libc_e).to_string(),
        };
        let _ = writeln!(out, "# failed: {c} pages: {why}");
    }
    // One line per (mapping, reason): a library maps itself four times.
    let mut groups: Vec<(&str, &str, usize, usize)> = Vec::new();
    for s in &r.skipped {
        match groups.iter_mut().find(|g| g.0 == s.what && g.1 == s.why) {
            Some(g) => {
                g.2 += 1;
                g.3 += s.end - s.start;
            }
            None => groups.push((&s.what, s.why, 1, s.end - s.start)),
        }
    }
    for (what, why, n, bytes) in groups {
        let _ = writeln!(
            out,
            "# skipped {what} ({n} mapping{}, {}): {why}",
            if n == 1 { "" } else { "s" },
            approx_size(bytes)
        );
    }
    for n in &r.notes {
        let _ = writeln!(out, "# note: {n}");
    }
    if moved == 0 && failed == 0 && !r.dry_run && already > 0 {
        let _ = writeln!(
            out,
            "# nothing to move: every present page was already on node {}",
            r.node
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_as_maps_prints_them() {
        assert_eq!(parse_range("7f00-7f10"), Ok((0x7f00, 0x7f10)));
        assert_eq!(parse_range("0x1000-0x3000"), Ok((0x1000, 0x3000)));
        assert!(parse_range("2000-1000").is_err());
        assert!(parse_range("xyz").is_err());
        assert!(parse_range("10-zz").is_err());
    }
}

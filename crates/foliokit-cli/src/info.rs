//! `foliokit info`: what this machine offers and what `auto` will do on it.

use clap::Args;
use foliokit::tune::{choose_clear, choose_copy, Shape};
use foliokit::{Reuse, Strategy};
use serde::Serialize;
use std::fmt::Write as _;

use crate::args::{show_size, Format};
use crate::machine::{flags_line, machine, Machine};
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct InfoArgs {
    /// Output format (csv prints the table form).
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

#[derive(Serialize)]
struct AutoPick {
    case: String,
    folio_size: usize,
    folios: usize,
    reuse: Reuse,
    channels: usize,
    copy: &'static str,
    clear: &'static str,
}

#[derive(Serialize)]
struct Info {
    machine: Machine,
    auto: Vec<AutoPick>,
}

fn picks() -> Vec<AutoPick> {
    let n = foliokit::cpu::cpu().logical_cpus.max(2);
    let cases = [
        ("one 4K folio", 4 << 10, 1, Reuse::Reread),
        ("one 2M folio", 2 << 20, 1, Reuse::Reread),
        ("small batch, 8 x 2M", 2 << 20, 8, Reuse::Reread),
        ("large batch, 512 x 2M", 2 << 20, 512, Reuse::Reread),
        ("large batch, 262144 x 4K", 4 << 10, 262_144, Reuse::Reread),
        ("one 2M folio, write-once", 2 << 20, 1, Reuse::Stream),
    ];
    // Each case on one channel and spread across one channel per CPU: the
    // profile has a cell per channel count.
    [1, n]
        .into_iter()
        .flat_map(|channels| {
            cases.into_iter().map(move |(case, folio, count, reuse)| {
                let shape = Shape::batch(folio, count, reuse).on_channels(channels);
                AutoPick {
                    case: case.into(),
                    folio_size: folio,
                    folios: count,
                    reuse,
                    channels,
                    copy: choose_copy(shape).name(),
                    clear: choose_clear(shape).name(),
                }
            })
        })
        .collect()
}

pub fn run(a: InfoArgs) -> Result<(), CliError> {
    let info = Info {
        machine: machine(),
        auto: picks(),
    };
    if a.format == Format::Json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    let m = &info.machine;
    let c = &m.cpu;
    let s = &m.system;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cpu       {} ({:?}, {}, {} logical CPUs)",
        c.model, c.vendor, c.arch, c.logical_cpus
    );
    let _ = writeln!(out, "flags     {}", flags_line(c));
    let _ = writeln!(
        out,
        "caches    L1d {}  L2 {}  LLC {}  (from {})",
        show_size(c.caches.l1d),
        show_size(c.caches.l2),
        show_size(c.caches.llc),
        c.caches.source
    );
    let _ = writeln!(
        out,
        "kernel    {}{}",
        s.kernel,
        if s.root { " (running as root)" } else { "" }
    );
    let _ = writeln!(out, "numa      nodes {:?}", s.numa_nodes);
    let _ = writeln!(
        out,
        "thp       enabled={} defrag={} pmd={}",
        s.thp.enabled.as_deref().unwrap_or("unsupported"),
        s.thp.defrag.as_deref().unwrap_or("-"),
        s.thp.pmd_size.map(show_size).unwrap_or_else(|| "-".into())
    );
    if !s.thp.mthp.is_empty() {
        let sizes: Vec<String> = s
            .thp
            .mthp
            .iter()
            .map(|m| format!("{}={}", show_size(m.size), m.enabled))
            .collect();
        let _ = writeln!(out, "mthp      {}", sizes.join(" "));
    }
    for p in &s.hugetlb {
        let _ = writeln!(
            out,
            "hugetlb   {} pool: {} pages, {} free ({} of them reserved)",
            show_size(p.size),
            p.total,
            p.free,
            p.reserved
        );
    }
    let _ = writeln!(
        out,
        "profile   {} ({})",
        m.profile.path.as_deref().unwrap_or("-"),
        m.profile.note
    );
    // Cells the last calibration could not settle follow the built-in
    // rules: say which and why, so nobody mistakes them for measured.
    let unsettled = foliokit::tune::profile_path()
        .ok()
        .and_then(|p| foliokit::tune::read_profile(&p).ok())
        .map(|p| p.unsettled)
        .unwrap_or_default();
    for u in &unsettled {
        let _ = writeln!(
            out,
            "unsettled {} {:?} {:?} x{}: {}",
            u.op, u.regime, u.class, u.channels, u.why
        );
    }
    let _ = writeln!(out, "\nauto picks");
    let _ = writeln!(
        out,
        "  {:<28} {:>3} {:<9} {:<9}",
        "case", "ch", "copy", "clear"
    );
    for p in &info.auto {
        let _ = writeln!(
            out,
            "  {:<28} {:>3} {:<9} {:<9}",
            p.case, p.channels, p.copy, p.clear
        );
    }
    print!("{out}");
    Ok(())
}

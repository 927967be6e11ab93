//! `foliokit calibrate`: measure the strategies and store the profile `auto` reads.

use clap::Args;
use foliokit::tune::save_profile;
use foliokit_lab::calibrate::{calibrate, total_ticks, CalibrateOptions};
use std::fmt::Write as _;

use crate::args::{parse_size, show_size, Format};
use crate::progress::bar;
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct CalibrateArgs {
    /// Batch size for the streaming cells, rounded up to 2M (default: 2 x
    /// LLC, at least 256M and at most 512M).
    #[arg(long, value_parser = parse_size)]
    pub stream_size: Option<usize>,
    /// Measure and print, but do not write the profile.
    #[arg(long)]
    pub dry_run: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

pub fn run(a: CalibrateArgs) -> Result<(), CliError> {
    let mut o = CalibrateOptions::default();
    // Checked before anything is measured: a size memory cannot hold
    // would otherwise fail after the resident cells' seconds.
    match a.stream_size {
        Some(s) => o = o.with_stream_size(s)?,
        None => o.check()?,
    }
    let pb = bar(total_ticks(&o), "calibrating");
    let (profile, cells) = calibrate(&o, |label| {
        pb.set_message(label.to_string());
        pb.inc(1);
    })?;
    pb.finish_and_clear();
    let saved = if a.dry_run {
        None
    } else {
        Some(save_profile(&profile)?)
    };
    if a.format == Format::Json {
        let v = serde_json::json!({"profile": profile, "cells": cells, "saved_to": saved});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mut out = String::new();
    for c in &cells {
        let mut ranked = c.results.clone();
        ranked.sort_by(|a, b| b.1.median.total_cmp(&a.1.median));
        let figures: Vec<String> = ranked
            .iter()
            .map(|(n, s)| format!("{n} {:.1}", s.median))
            .collect();
        let _ = writeln!(
            out,
            "{:<5} {:<8} {:>4} folios, {:>5}, {} ch: {}",
            c.op,
            format!("{:?}", c.regime).to_lowercase(),
            show_size(c.folio_size),
            show_size(c.bytes),
            c.channels,
            figures.join(", ")
        );
        let _ = writeln!(
            out,
            "      -> {}: {}{}",
            c.stored.as_deref().unwrap_or("built-in rule"),
            c.why,
            if c.rounds > 1 {
                format!(" ({} rounds)", c.rounds)
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(out, "(median GB/s, best first)");
    match saved {
        Some(p) => {
            let _ = writeln!(
                out,
                "profile written to {}; auto uses it from the next run",
                p.display()
            );
        }
        None => {
            let _ = writeln!(out, "dry run: profile not written");
        }
    }
    print!("{out}");
    Ok(())
}

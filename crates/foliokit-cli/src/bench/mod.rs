//! `foliokit bench <op>`: shared plumbing for the experiments.

pub mod fault;
pub mod folio;
pub mod init;
pub mod migrate;
pub mod mremap;
pub mod restore;

use foliokit::strategy::{parse_list, Selection, Strategy};
use std::fmt::Write as _;

use crate::machine::machine;
use crate::progress::Bars;
use crate::report::{Render, Report};
use crate::CliError;

/// Progress bars for one command's experiment.
pub fn bars() -> Bars {
    Bars::default()
}

/// An experiment's report from the lab, described with this machine.
pub fn shown<R>(r: foliokit_lab::schema::Report<R>) -> Report<R> {
    r.on(machine())
}

/// Prints the report an experiment made (with this machine) in `format`.
pub fn show<R: crate::report::TableRow>(
    r: foliokit_lab::schema::Report<R>,
    format: crate::args::Format,
) -> Result<(), CliError> {
    print!("{}", shown(r).render(format));
    Ok(())
}

/// `-f help`: every strategy, whether this CPU has it, and what it does.
pub fn strategy_help<S: Strategy>() -> String {
    let mut out = format!("{} strategies (-f name[,name...] | all):\n", S::OP);
    for s in S::ALL {
        let avail = match s.unavailable() {
            None => "yes".to_string(),
            Some(why) => format!("no: {why}"),
        };
        let _ = writeln!(out, "  {:<10} [{avail}] {}", s.name(), s.description());
    }
    out
}

/// Parses `-f`, or prints the help and returns `None` for `-f help`.
pub fn select<S: Strategy>(spec: &str) -> Result<Option<Selection<S>>, CliError> {
    if spec.trim() == "help" {
        print!("{}", strategy_help::<S>());
        return Ok(None);
    }
    Ok(Some(parse_list::<S>(spec)?))
}

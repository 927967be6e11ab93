//! Where a relocation run's time goes, phase by phase (from the library's
//! per-batch [`foliokit::migrate::Phases`]), so a row shows it without a
//! profiler.

use foliokit::migrate::{MigrateReport, Phases};
use serde::{Deserialize, Serialize};

use crate::measure::Stats;

/// Milliseconds per run in each phase of relocation, summed over the
/// run's batches; the median over the row's runs. The first six add up
/// to the batches' time on the relocating thread; `ahead_ms` ran beside
/// it, on a helper.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhasesMs {
    /// Reading pagemap and folios, mapping the staging areas and
    /// allocating the destination folios not prepared ahead.
    pub prepare_ms: f64,
    /// Registering, reading pagemap and folios again, the two looks at
    /// the threads.
    pub checks_ms: f64,
    /// Moving the pages out.
    pub out_ms: f64,
    /// Copying them (the copy channels).
    pub copy_ms: f64,
    /// Moving the new folios in.
    pub in_ms: f64,
    /// Unregistering, waiting for events in flight, unmapping (freeing
    /// the old pages).
    pub finish_ms: f64,
    /// Destination folios prepared ahead on a helper, beside the batches.
    pub ahead_ms: f64,
}

/// One run's phases: the sum over its batches.
pub fn of_run(rep: &MigrateReport) -> Phases {
    rep.batches.iter().fold(Phases::default(), |a, b| {
        let p = &b.phases;
        Phases {
            prepare: a.prepare + p.prepare,
            checks: a.checks + p.checks,
            out: a.out + p.out,
            copy: a.copy + p.copy,
            install: a.install + p.install,
            finish: a.finish + p.finish,
            prepared_ahead: a.prepared_ahead + p.prepared_ahead,
        }
    })
}

/// The median over runs of each phase, in ms; `None` with no run, or
/// where no run timed any phase (the kernel path).
pub fn median(runs: &[Phases]) -> Option<PhasesMs> {
    if runs
        .iter()
        .all(|p| p.sum().is_zero() && p.prepared_ahead.is_zero())
    {
        return None;
    }
    let m = |f: fn(&Phases) -> std::time::Duration| {
        let v: Vec<f64> = runs.iter().map(|p| f(p).as_secs_f64() * 1e3).collect();
        Stats::of(&v).map_or(0.0, |s| s.median)
    };
    Some(PhasesMs {
        prepare_ms: m(|p| p.prepare),
        checks_ms: m(|p| p.checks),
        out_ms: m(|p| p.out),
        copy_ms: m(|p| p.copy),
        in_ms: m(|p| p.install),
        finish_ms: m(|p| p.finish),
        ahead_ms: m(|p| p.prepared_ahead),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn medians_per_phase_and_none_without_timings() {
        let ms = Duration::from_millis;
        let run = |copy| Phases {
            prepare: ms(1),
            copy: ms(copy),
            prepared_ahead: ms(4),
            ..Phases::default()
        };
        let m = median(&[run(10), run(30), run(20)]).unwrap();
        assert_eq!((m.prepare_ms, m.copy_ms, m.ahead_ms), (1.0, 20.0, 4.0));
        assert_eq!(m.out_ms, 0.0);
        assert_eq!(median(&[Phases::default()]), None);
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn an_older_row_without_phases_still_reads() {
        let p: PhasesMs = serde_json::from_str(r#"{"copy_ms": 2.5}"#).unwrap();
        assert_eq!(p.copy_ms, 2.5);
    }
}

//! Calibration: measure every named strategy in each (regime, folio class)
//! cell that `auto` distinguishes, and record the fastest as a [`Profile`].
//!
//! Cells are measured exactly as `foliokit bench` measures, with the same
//! code: `Resident` with a 2 MiB batch left hot in cache, `Stream` with a
//! batch several times the LLC and the source evicted before every loop;
//! each on one channel and, where the machine has more CPUs, spread across
//! one channel per CPU (a cell per channel count).

use serde::Serialize;

use crate::measure::{
    measure_clear, measure_copy, CacheMode, CopyCandidate, MeasureError, Measurement, Plan, Stats,
};
use foliokit::batch::Reuse;
use foliokit::cpu::cpu;
use foliokit::mem::Region;
use foliokit::strategy::Strategy;
use foliokit::tune::{
    builtin_clear, builtin_copy, Choice, FolioClass, Profile, Regime, CALIBRATION_MARGIN,
    PROFILE_VERSION,
};
use foliokit::{ClearStrategy, CopyStrategy};

/// Batch bytes and loops per regime.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    pub resident_bytes: usize,
    pub resident_loops: usize,
    pub stream_bytes: usize,
    pub stream_loops: usize,
    /// Channel counts to measure (1 and the CPU count by default).
    pub channels: Vec<usize>,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        CalibrateOptions {
            resident_bytes: 2 << 20,
            // Where source and destination fit the LLC each loop repeats
            // the call to 256 MiB (measure::HOT_SAMPLE_BYTES) and 15 loops
            // settle the median; elsewhere a loop is one short call.
            resident_loops: if 2 * (2 << 20) <= cpu().caches.llc {
                15
            } else {
                60
            },
            // Four LLCs, so nothing survives in cache between loops.
            stream_bytes: (4 * cpu().caches.llc)
                .max(256 << 20)
                .next_multiple_of(2 << 20),
            stream_loops: 9,
            channels: if cpu().logical_cpus > 1 {
                vec![1, cpu().logical_cpus]
            } else {
                vec![1]
            },
        }
    }
}

/// One measured cell, every candidate's figures included.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub op: &'static str,
    pub regime: Regime,
    pub class: FolioClass,
    pub channels: usize,
    pub folio_size: usize,
    pub bytes: usize,
    pub results: Vec<(String, Stats)>,
}

impl Cell {
    /// The fastest strategy by median, unless the built-in choice is within
    /// [`CALIBRATION_MARGIN`] of it: then the built-in one stays.
    fn pick(&self, builtin: &str) -> Option<(String, f64)> {
        let best = self
            .results
            .iter()
            .max_by(|a, b| a.1.median.total_cmp(&b.1.median))?;
        let kept = self
            .results
            .iter()
            .find(|(n, s)| n == builtin && s.median >= best.1.median * (1.0 - CALIBRATION_MARGIN));
        let (name, stats) = kept.unwrap_or(best);
        Some((name.clone(), stats.median))
    }
}

fn named<S: Strategy>() -> Vec<S> {
    S::ALL
        .iter()
        .copied()
        .filter(|s| s.unavailable().is_none() && s.name() != "auto")
        .collect()
}

/// How many progress ticks [`calibrate`] will report.
pub fn total_ticks(o: &CalibrateOptions) -> usize {
    let per_class = (named::<CopyStrategy>().len() + named::<ClearStrategy>().len())
        * (o.resident_loops + 1 + o.stream_loops + 1);
    per_class * 3 * o.channels.len()
}

/// Measures every cell and returns the profile with the cells behind it.
/// `tick(label)` is called after every timed or warm-up call.
pub fn calibrate(
    o: &CalibrateOptions,
    mut tick: impl FnMut(&str),
) -> Result<(Profile, Vec<Cell>), MeasureError> {
    let copies: Vec<CopyCandidate> = named::<CopyStrategy>()
        .into_iter()
        .map(CopyCandidate::plain)
        .collect();
    let clears = named::<ClearStrategy>();
    let mut cells = Vec::new();
    for class in [FolioClass::Small, FolioClass::Medium, FolioClass::Large] {
        let folio = class.representative();
        for (regime, bytes, loops, cache) in [
            (
                Regime::Resident,
                o.resident_bytes,
                o.resident_loops,
                CacheMode::Hot,
            ),
            (
                Regime::Stream,
                o.stream_bytes,
                o.stream_loops,
                CacheMode::Evict,
            ),
        ] {
            let bytes = bytes.next_multiple_of(folio);
            let mut src = Region::new(bytes, folio)?;
            src.as_mut_slice().fill(0x5A);
            let mut dst = Region::new(bytes, folio)?;
            for &channels in &o.channels {
                let plan = Plan {
                    folio_size: folio,
                    loops,
                    cache,
                    reuse: Reuse::Reread,
                    hint_page: 0,
                    channels,
                    limits: false,
                };
                let label = format!("copy {regime:?} {}K x{channels}", folio >> 10);
                // The cell of `op` from a measurement on this shape.
                let cell = |op, m: Measurement| Cell {
                    op,
                    regime,
                    class,
                    channels,
                    folio_size: folio,
                    bytes,
                    results: m.rows.into_iter().map(|m| (m.resolved, m.gbps)).collect(),
                };
                let m = measure_copy(&src, &mut dst, &copies, &plan, || tick(&label))?;
                cells.push(cell("copy", m));
                // Butterfly clears page by page around a hint: one channel.
                let run: Vec<ClearStrategy> = clears
                    .iter()
                    .copied()
                    .filter(|&c| channels == 1 || c != ClearStrategy::Butterfly)
                    .collect();
                let label = format!("clear {regime:?} {}K x{channels}", folio >> 10);
                let m = measure_clear(&mut dst, &run, &plan, || tick(&label))?;
                cells.push(cell("clear", m));
            }
        }
    }
    let choices = cells
        .iter()
        .filter_map(|c| {
            let builtin = match c.op {
                "copy" => builtin_copy(c.regime, false).name(),
                _ => builtin_clear(c.regime).name(),
            };
            let (strategy, gbps) = c.pick(builtin)?;
            Some(Choice {
                op: c.op.into(),
                regime: c.regime,
                class: c.class,
                channels: c.channels,
                strategy,
                gbps,
            })
        })
        .collect();
    let profile = Profile {
        version: PROFILE_VERSION,
        cpu_model: cpu().model.clone(),
        choices,
    };
    Ok((profile, cells))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(results: &[(&str, f64)]) -> Cell {
        Cell {
            op: "clear",
            regime: Regime::Stream,
            class: FolioClass::Large,
            channels: 1,
            folio_size: 2 << 20,
            bytes: 1 << 30,
            results: results
                .iter()
                .map(|&(n, m)| (n.to_string(), Stats::of(&[m]).unwrap()))
                .collect(),
        }
    }

    #[test]
    fn the_builtin_choice_stays_unless_clearly_beaten() {
        let c = cell(&[("nt", 6.0), ("stosb", 5.9), ("libc", 5.0)]);
        assert_eq!(c.pick("stosb").unwrap().0, "stosb"); // 1.7% behind: noise
        assert_eq!(c.pick("libc").unwrap().0, "nt"); // 17% behind: replaced
        assert_eq!(c.pick("absent").unwrap().0, "nt");
        assert!(cell(&[]).pick("nt").is_none());
    }
}

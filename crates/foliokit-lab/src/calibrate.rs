//! Calibration: measure every named strategy in each (regime, folio class)
//! cell that `auto` distinguishes, and record the fastest as a [`Profile`].
//!
//! Cells are measured exactly as `foliokit bench` measures, with the same
//! code: `Resident` with a 2 MiB batch left hot in cache, `Stream` with a
//! batch several times the LLC and the source evicted before every loop;
//! each on one channel and, where the machine has more CPUs, spread across
//! one channel per CPU (a cell per channel count).

use serde::Serialize;

use crate::prepare::check_shape;
use crate::units::show_size;
use crate::LabError;

use crate::measure::{
    measure_clear, measure_copy, AaControl, CacheMode, CopyCandidate, MeasureError, Measurement,
    Order, Plan, Stats, AA_TOLERANCE,
};
use foliokit::batch::Reuse;
use foliokit::cpu::cpu;
use foliokit::mem::Region;
use foliokit::strategy::Strategy;
use foliokit::tune::{
    builtin_clear, builtin_copy, Choice, FolioClass, Profile, Regime, Unsettled, PROFILE_VERSION,
};
use foliokit::{ClearStrategy, CopyStrategy};

/// Calibration replaces the built-in choice for a cell only when another
/// strategy's median beats it by more than this fraction: differences
/// smaller than run-to-run noise on a shared machine must not flip `auto`.
pub const CALIBRATION_MARGIN: f64 = 0.03;

/// Times calibration measures a cell whose verdict is unclear (its A/A
/// control disagreed, or the best strategy's lead over the built-in choice
/// is inside the noise) before it leaves the cell to the built-in rules.
pub const CALIBRATION_ROUNDS: usize = 3;

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
            // Twice the LLC, so stores cannot stay in cache (both buffers
            // are flushed before every call anyway), at least 256 MiB and at
            // most 512 MiB: a guest reporting a 480 MiB LLC made 2 GiB cells
            // whose calibration ran for many minutes.
            stream_bytes: (2 * cpu().caches.llc)
                .clamp(256 << 20, 512 << 20)
                .next_multiple_of(2 << 20),
            // One balanced design (passes round up to whole designs: as
            // many as candidates, twice that for an odd count).
            stream_loops: 1,
            channels: if cpu().logical_cpus > 1 {
                vec![1, cpu().logical_cpus]
            } else {
                vec![1]
            },
        }
    }
}

impl CalibrateOptions {
    /// Streaming cells of `bytes` (rounded up to 2 MiB, the largest folio
    /// class), or why not: a size that overflows when rounded, or that the
    /// memory available cannot hold (checked before the resident cells
    /// spend seconds measuring).
    pub fn with_stream_size(mut self, bytes: usize) -> Result<Self, LabError> {
        self.stream_bytes = bytes
            .checked_next_multiple_of(2 << 20)
            .ok_or_else(|| format!("stream size {} is too large", show_size(bytes)))?;
        self.check()?;
        Ok(self)
    }

    /// Refuses cells whose source and destination do not fit in the memory
    /// available (the shape check the benches run, on base pages: every
    /// folio class fits them).
    pub fn check(&self) -> Result<(), LabError> {
        let page = foliokit::batch::page_size();
        for bytes in [self.resident_bytes, self.stream_bytes] {
            let bytes = bytes.checked_next_multiple_of(2 << 20).ok_or_else(|| {
                format!("a calibration cell of {} is too large", show_size(bytes))
            })?;
            check_shape(bytes, &[page], 2)?;
        }
        Ok(())
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
    /// The last round's A/A control (the first candidate timed twice).
    pub aa: Option<AaControl>,
    /// Rounds measured (more than one where the verdict was unclear).
    pub rounds: usize,
    /// The built-in rule's strategy for this cell.
    pub builtin: String,
    /// The strategy stored for the cell, or `None`: left to the built-in
    /// rule.
    pub stored: Option<String>,
    /// Why, in one line.
    pub why: String,
}

impl Cell {
    /// The verdict: `Ok((strategy, why))` to store, or `Err(why)` when this
    /// round cannot settle the cell. The built-in choice stays unless
    /// another strategy beats it beyond both [`CALIBRATION_MARGIN`] and the
    /// run's own noise (the A/A control's band); a round whose A/A control
    /// disagreed settles nothing.
    fn pick(&self, builtin: &str) -> Result<(String, String), String> {
        if let Some(aa) = self.aa.as_ref().filter(|a| !a.agrees()) {
            return Err(format!(
                "its A/A control disagreed ({} timed twice came {:.3}x apart, band ±{:.0}%): too noisy to rank",
                aa.a,
                aa.ratio,
                aa.tolerance * 100.0
            ));
        }
        let best = self
            .results
            .iter()
            .max_by(|a, b| a.1.median.total_cmp(&b.1.median))
            .ok_or_else(|| "nothing was measured".to_string())?;
        let noise = self
            .aa
            .as_ref()
            .map_or(AA_TOLERANCE, |a| a.tolerance)
            .max(CALIBRATION_MARGIN);
        let Some((_, b)) = self.results.iter().find(|(n, _)| n == builtin) else {
            return Ok((
                best.0.clone(),
                "the best measured (the built-in choice cannot run here)".into(),
            ));
        };
        if b.median >= best.1.median * (1.0 - CALIBRATION_MARGIN) {
            return Ok((
                builtin.to_string(),
                format!(
                    "the built-in {builtin} is within {:.0}% of the best",
                    CALIBRATION_MARGIN * 100.0
                ),
            ));
        }
        let lead = best.1.median / b.median;
        if lead > 1.0 + noise {
            return Ok((
                best.0.clone(),
                format!(
                    "{} beats the built-in {builtin} {lead:.2}x (noise ±{:.0}%)",
                    best.0,
                    noise * 100.0
                ),
            ));
        }
        Err(format!(
            "{} leads the built-in {builtin} by only {:.1}%, inside the run's noise (±{:.0}%)",
            best.0,
            (lead - 1.0) * 100.0,
            noise * 100.0
        ))
    }
}

fn named<S: Strategy>() -> Vec<S> {
    S::ALL
        .iter()
        .copied()
        .filter(|s| s.unavailable().is_none() && s.name() != "auto")
        .collect()
}

/// How many progress ticks [`calibrate`] reports when every cell settles
/// in one round (each measurement times its candidates and an A/A copy of
/// the first, in whole balanced designs).
pub fn total_ticks(o: &CalibrateOptions) -> usize {
    let per = |n: usize, loops: usize| (n + 1) * (Order::new(n + 1, loops).passes + 1);
    let (c, k) = (
        named::<CopyStrategy>().len(),
        named::<ClearStrategy>().len(),
    );
    let per_class = per(c, o.resident_loops)
        + per(c, o.stream_loops)
        + per(k, o.resident_loops)
        + per(k, o.stream_loops);
    per_class * 3 * o.channels.len()
}

/// Measures one cell with `measure` (given a label suffix for progress)
/// until its verdict is clear, at most [`CALIBRATION_ROUNDS`] times; an
/// unclear last round leaves the cell to the built-in rule, saying why.
fn settle(
    builtin: &str,
    mut measure: impl FnMut(&str) -> Result<Cell, MeasureError>,
) -> Result<Cell, MeasureError> {
    let mut round = 0;
    loop {
        round += 1;
        let suffix = if round > 1 {
            format!(" (round {round}: unclear before)")
        } else {
            String::new()
        };
        let mut c = measure(&suffix)?;
        c.rounds = round;
        c.builtin = builtin.to_string();
        match c.pick(builtin) {
            Ok((name, why)) => {
                c.stored = Some(name);
                c.why = why;
                return Ok(c);
            }
            Err(why) if round >= CALIBRATION_ROUNDS => {
                c.why = format!("kept the built-in rule after {round} rounds: {why}");
                return Ok(c);
            }
            Err(_) => {}
        }
    }
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
                // The cell of `op` from a measurement on this shape.
                let cell = |op, m: Measurement| Cell {
                    op,
                    regime,
                    class,
                    channels,
                    folio_size: folio,
                    bytes,
                    results: m.rows.into_iter().map(|m| (m.resolved, m.gbps)).collect(),
                    aa: m.aa,
                    rounds: 0,
                    builtin: String::new(),
                    stored: None,
                    why: String::new(),
                };
                let label = format!("copy {regime:?} {}K x{channels}", folio >> 10);
                cells.push(settle(builtin_copy(regime, false).name(), |t| {
                    let m = measure_copy(&src, &mut dst, &copies, &plan, || {
                        tick(&format!("{label}{t}"))
                    })?;
                    Ok(cell("copy", m))
                })?);
                // Butterfly clears page by page around a hint: one channel.
                let run: Vec<ClearStrategy> = clears
                    .iter()
                    .copied()
                    .filter(|&c| channels == 1 || c != ClearStrategy::Butterfly)
                    .collect();
                let label = format!("clear {regime:?} {}K x{channels}", folio >> 10);
                cells.push(settle(builtin_clear(regime).name(), |t| {
                    let m = measure_clear(&mut dst, &run, &plan, || tick(&format!("{label}{t}")))?;
                    Ok(cell("clear", m))
                })?);
            }
        }
    }
    let choices = cells
        .iter()
        .filter_map(|c| {
            Some(Choice {
                op: c.op.into(),
                regime: c.regime,
                class: c.class,
                channels: c.channels,
                strategy: c.stored.clone()?,
                gbps: c.results.iter().map(|r| r.1.median).fold(0.0, f64::max),
            })
        })
        .collect();
    let unsettled = cells
        .iter()
        .filter(|c| c.stored.is_none())
        .map(|c| Unsettled {
            op: c.op.into(),
            regime: c.regime,
            class: c.class,
            channels: c.channels,
            why: c.why.clone(),
        })
        .collect();
    let profile = Profile {
        version: PROFILE_VERSION,
        cpu_model: cpu().model.clone(),
        choices,
        unsettled,
    };
    Ok((profile, cells))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(results: &[(&str, f64)], aa_ratio: f64) -> Cell {
        let same = [0.01; 5];
        let other: Vec<f64> = same.iter().map(|t| t / aa_ratio).collect();
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
            aa: AaControl::of("nt", &other, "nt", &same, 1 << 30, true),
            rounds: 1,
            builtin: String::new(),
            stored: None,
            why: String::new(),
        }
    }

    #[test]
    fn a_stream_size_that_cannot_be_held_is_refused_up_front() {
        let o = CalibrateOptions::default();
        let err = o.clone().with_stream_size(usize::MAX).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
        // Without /proc/meminfo there is nothing to check against.
        if crate::units::mem_available().is_some() {
            let err = o.clone().with_stream_size(usize::MAX / 2).unwrap_err();
            assert!(err.to_string().contains("memory"), "{err}");
        }
        let o = o.with_stream_size(1).unwrap();
        assert_eq!(o.stream_bytes, 2 << 20);
    }

    #[test]
    fn the_builtin_choice_stays_unless_clearly_beaten() {
        let c = cell(&[("nt", 6.0), ("stosb", 5.9), ("libc", 5.0)], 1.0);
        assert_eq!(c.pick("stosb").unwrap().0, "stosb"); // 1.7% behind: noise
        assert_eq!(c.pick("libc").unwrap().0, "nt"); // 17% behind: replaced
        assert_eq!(c.pick("absent").unwrap().0, "nt");
        assert!(cell(&[], 1.0).pick("nt").is_err());
    }

    #[test]
    fn a_lead_inside_the_noise_or_a_failed_aa_control_settles_nothing() {
        // 4% ahead: beyond the 3% margin, inside the 5% A/A band.
        let c = cell(&[("nt", 5.2), ("stosb", 5.0)], 1.0);
        assert!(c
            .pick("stosb")
            .unwrap_err()
            .contains("inside the run's noise"));
        // A clear lead, but the same code timed twice came 20% apart.
        let c = cell(&[("nt", 8.0), ("stosb", 5.0)], 1.2);
        assert!(c
            .pick("stosb")
            .unwrap_err()
            .contains("A/A control disagreed"));
        // settle() measures again, then leaves the cell to the built-in rule.
        let mut rounds = 0;
        let settled = settle("stosb", |_| {
            rounds += 1;
            Ok(cell(&[("nt", 8.0), ("stosb", 5.0)], 1.2))
        })
        .unwrap();
        assert_eq!(
            (rounds, settled.rounds),
            (CALIBRATION_ROUNDS, CALIBRATION_ROUNDS)
        );
        assert!(settled.stored.is_none(), "never stored: {}", settled.why);
        // A clear round after a noisy one is stored.
        let mut n = 0;
        let settled = settle("stosb", |_| {
            n += 1;
            Ok(cell(
                &[("nt", 8.0), ("stosb", 5.0)],
                if n == 1 { 1.2 } else { 1.0 },
            ))
        })
        .unwrap();
        assert_eq!(settled.stored.as_deref(), Some("nt"));
        assert_eq!(settled.rounds, 2);
    }
}

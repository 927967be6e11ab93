//! Measuring strategies the same way everywhere (`bench`, `calibrate`).
//!
//! Candidates run interleaved, loop-major: loop 1 runs every candidate, then
//! loop 2, and so on, each loop in a rotated order. A noisy neighbour on a
//! shared machine then slows all candidates alike instead of whichever
//! happened to run during the noise, which keeps ratios from one run
//! meaningful.

mod limits;
mod ops;
mod stats;

pub use limits::{probe, LimitOp, Limits, Probe, Stores};
pub use ops::{
    measure_clear, measure_copy, CacheMode, CopyCandidate, MeasureError, Measured, Measurement,
    Plan,
};
pub use stats::{gbps, Stats};

use std::time::Instant;

/// Bytes one timed loop of a hot, cache-resident run moves at least: one
/// call over a cache-sized buffer lasts tens of microseconds, within the
/// scheduling noise of a shared machine, so the loop repeats the call (same
/// candidate, back to back) until it moves this much (~10 ms at 25 GB/s).
pub const HOT_SAMPLE_BYTES: usize = 256 << 20;

/// Runs `body(state, c)` for every candidate `c < candidates`: one untimed
/// warm-up pass, then `loops` timed passes. `prepare(state, c)` runs untimed
/// before each timed call (cache eviction). `tick` is called after every
/// call, for progress. Returns the seconds of each timed call, per candidate.
pub fn run_interleaved<T, E>(
    candidates: usize,
    loops: usize,
    state: &mut T,
    mut prepare: impl FnMut(&mut T, usize) -> Result<(), E>,
    mut body: impl FnMut(&mut T, usize) -> Result<(), E>,
    mut tick: impl FnMut(),
) -> Result<Vec<Vec<f64>>, E> {
    for c in 0..candidates {
        prepare(state, c)?;
        body(state, c)?;
        tick();
    }
    let mut secs = vec![Vec::with_capacity(loops); candidates];
    for l in 0..loops {
        // Rotate the order each loop so no candidate always runs right
        // after the same neighbour (whose cache footprint it would inherit).
        for k in 0..candidates {
            let c = (l + k) % candidates;
            prepare(state, c)?;
            let t = Instant::now();
            body(state, c)?;
            secs[c].push(t.elapsed().as_secs_f64());
            tick();
        }
    }
    Ok(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_candidate_runs_warm_up_plus_loops_in_rotated_order() {
        let mut order = Vec::new();
        let secs = run_interleaved::<_, ()>(
            3,
            2,
            &mut order,
            |_, _| Ok(()),
            |o, c| {
                o.push(c);
                Ok(())
            },
            || {},
        )
        .unwrap();
        assert_eq!(order, [0, 1, 2, 0, 1, 2, 1, 2, 0]);
        assert!(secs.iter().all(|s| s.len() == 2));
    }

    #[test]
    fn errors_stop_the_run() {
        let r = run_interleaved(
            2,
            3,
            &mut (),
            |_, _| Ok(()),
            |_, c| if c == 1 { Err("boom") } else { Ok(()) },
            || {},
        );
        assert_eq!(r, Err("boom"));
    }
}

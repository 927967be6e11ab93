//! Measuring strategies the same way everywhere (`bench`, `calibrate`).
//!
//! Candidates run interleaved, loop-major: loop 1 runs every candidate, then
//! loop 2, and so on. A noisy neighbour on a shared machine then slows all
//! candidates alike instead of whichever happened to run during the noise,
//! which keeps ratios from one run meaningful.

mod ops;
mod stats;

pub use ops::{measure_clear, measure_copy, CacheMode, MeasureError, Measured, Plan};
pub use stats::{gbps, Stats};

use std::time::Instant;

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
    for _ in 0..loops {
        for (c, out) in secs.iter_mut().enumerate() {
            prepare(state, c)?;
            let t = Instant::now();
            body(state, c)?;
            out.push(t.elapsed().as_secs_f64());
            tick();
        }
    }
    Ok(secs)
}

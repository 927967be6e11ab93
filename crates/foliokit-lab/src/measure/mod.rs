//! Measuring strategies the same way everywhere (`bench`, `calibrate`).
//!
//! Candidates run interleaved, pass-major: pass 1 runs every candidate,
//! then pass 2, and so on, each pass in an order from a balanced design
//! (see `order.rs`). A noisy neighbour on a shared machine then slows all
//! candidates alike instead of whichever happened to run during the noise,
//! and no candidate always inherits the same neighbour's cache state, which
//! keeps ratios from one run meaningful.

mod aa;
mod host;
mod limits;
mod ops;
mod order;
mod stats;

pub use aa::{AaControl, AA_TOLERANCE};
pub use host::fresh_memory_note;
pub use limits::{probe, LimitOp, Limits, Probe, Stores};
pub use ops::{
    measure_clear, measure_copy, CacheMode, CopyCandidate, MeasureError, Measured, Measurement,
    Plan,
};
pub use order::{williams, Order};
pub use stats::{gbps, Stats, NOISY_CV};

use std::time::Instant;

/// Bytes one timed loop of a hot, cache-resident run moves at least: one
/// call over a cache-sized buffer lasts tens of microseconds, within the
/// scheduling noise of a shared machine, so the loop repeats the call (same
/// candidate, back to back) until it moves this much (~10 ms at 25 GB/s).
pub const HOT_SAMPLE_BYTES: usize = 256 << 20;

/// Runs `body(state, c)` for every candidate `c < candidates`: one untimed
/// warm-up pass, then the timed passes of `order` (at least `loops`, each
/// in its balanced order). `prepare(state, c)` runs untimed before every
/// call (cache eviction, re-warming). `tick` is called after every call,
/// for progress. Returns the seconds of each timed call, per candidate, in
/// pass order.
pub fn run_interleaved<T, E>(
    order: &Order,
    state: &mut T,
    mut prepare: impl FnMut(&mut T, usize) -> Result<(), E>,
    mut body: impl FnMut(&mut T, usize) -> Result<(), E>,
    mut tick: impl FnMut(),
) -> Result<Vec<Vec<f64>>, E> {
    let candidates = order.candidates;
    for c in 0..candidates {
        prepare(state, c)?;
        body(state, c)?;
        tick();
    }
    let mut secs = vec![Vec::with_capacity(order.passes); candidates];
    for p in 0..order.passes {
        for c in order.pass(p) {
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
    fn every_candidate_runs_warm_up_plus_passes_in_balanced_order() {
        let mut order = Vec::new();
        let design = Order::new(3, 2);
        let secs = run_interleaved::<_, ()>(
            &design,
            &mut order,
            |_, _| Ok(()),
            |o, c| {
                o.push(c);
                Ok(())
            },
            || {},
        )
        .unwrap();
        let mut want = vec![0, 1, 2];
        (0..design.passes).for_each(|p| want.extend(design.pass(p)));
        assert_eq!(order, want);
        assert_eq!(design.passes, 6, "three candidates: a design of six orders");
        assert!(secs.iter().all(|s| s.len() == 6));
    }

    #[test]
    fn errors_stop_the_run() {
        let r = run_interleaved(
            &Order::new(2, 3),
            &mut (),
            |_, _| Ok(()),
            |_, c| if c == 1 { Err("boom") } else { Ok(()) },
            || {},
        );
        assert_eq!(r, Err("boom"));
    }
}

//! Measuring copy and clear strategies on a pair of regions.

use serde::Serialize;

use super::{gbps, run_interleaved, Stats};
use crate::batch::Reuse;
use crate::mem::Region;
use crate::strategy::Strategy;
use crate::{
    clear_folios, copy_folios, BatchError, ClearOptions, ClearStrategy, CopyOptions, CopyStrategy,
};

/// What the cache holds before each timed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// The source (for clear: the destination) is flushed before every loop,
    /// as seed 000 does.
    Evict,
    /// Nothing is flushed: buffers stay as warm as their size allows.
    Hot,
}

/// How to measure: the batch shape, cache state and number of timed loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub folio_size: usize,
    pub loops: usize,
    pub cache: CacheMode,
    pub reuse: Reuse,
    /// Page each folio's butterfly clear converges on.
    pub hint_page: usize,
}

/// One strategy's measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Measured<S> {
    pub strategy: S,
    /// What the strategy resolved to (differs from the name only for auto).
    pub resolved: &'static str,
    pub gbps: Stats,
}

#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Mem(#[from] crate::mem::MemError),
    #[error("{0} produced wrong bytes in its verification pass")]
    Wrong(&'static str),
}

/// Measures copying `src` into `dst` in `plan.folio_size` folios with each
/// strategy.
/// Each strategy's warm-up call is verified against the source first.
pub fn measure_copy(
    src: &Region,
    dst: &mut Region,
    strategies: &[CopyStrategy],
    plan: &Plan,
    mut tick: impl FnMut(),
) -> Result<Vec<Measured<CopyStrategy>>, MeasureError> {
    let len = src.len().min(dst.len());
    let mut resolved = vec![""; strategies.len()];
    let mut verified = vec![false; strategies.len()];
    let secs = run_interleaved(
        strategies.len(),
        plan.loops,
        dst,
        |_, _| match plan.cache {
            CacheMode::Evict => src.evict().map_err(MeasureError::from),
            CacheMode::Hot => Ok(()),
        },
        |dst, c| {
            let opts = CopyOptions {
                strategy: strategies[c],
                reuse: plan.reuse,
            };
            if !verified[c] {
                dst.as_mut_slice()[..len].fill(0);
            }
            let r = copy_folios(
                &mut dst.as_mut_slice()[..len],
                &src.as_slice()[..len],
                plan.folio_size,
                opts,
            )?;
            resolved[c] = r.strategy;
            if !verified[c] {
                if dst.as_slice()[..len] != src.as_slice()[..len] {
                    return Err(MeasureError::Wrong(strategies[c].name()));
                }
                verified[c] = true;
            }
            Ok(())
        },
        &mut tick,
    )?;
    Ok(collect(strategies, &resolved, &secs, len))
}

/// Measures zeroing `dst` in `plan.folio_size` folios with each strategy. Each warm-up call is verified.
pub fn measure_clear(
    dst: &mut Region,
    strategies: &[ClearStrategy],
    plan: &Plan,
    mut tick: impl FnMut(),
) -> Result<Vec<Measured<ClearStrategy>>, MeasureError> {
    let len = dst.len();
    let mut resolved = vec![""; strategies.len()];
    let mut verified = vec![false; strategies.len()];
    let secs = run_interleaved(
        strategies.len(),
        plan.loops,
        dst,
        |dst, _| match plan.cache {
            CacheMode::Evict => dst.evict().map_err(MeasureError::from),
            CacheMode::Hot => Ok(()),
        },
        |dst, c| {
            let opts = ClearOptions {
                strategy: strategies[c],
                reuse: plan.reuse,
                hint_page: plan.hint_page,
            };
            if !verified[c] {
                dst.as_mut_slice().fill(0xFF);
            }
            let r = clear_folios(dst.as_mut_slice(), plan.folio_size, opts)?;
            resolved[c] = r.strategy;
            if !verified[c] {
                if !is_zero(dst.as_slice()) {
                    return Err(MeasureError::Wrong(strategies[c].name()));
                }
                verified[c] = true;
            }
            Ok(())
        },
        &mut tick,
    )?;
    Ok(collect(strategies, &resolved, &secs, len))
}

fn is_zero(b: &[u8]) -> bool {
    const ZERO: [u8; 4096] = [0; 4096];
    b.chunks(ZERO.len()).all(|c| c == &ZERO[..c.len()])
}

fn collect<S: Strategy>(
    strategies: &[S],
    resolved: &[&'static str],
    secs: &[Vec<f64>],
    bytes: usize,
) -> Vec<Measured<S>> {
    strategies
        .iter()
        .zip(resolved)
        .zip(secs)
        .filter_map(|((&strategy, &resolved), s)| {
            let rates: Vec<f64> = s.iter().map(|&t| gbps(bytes, t)).collect();
            Some(Measured {
                strategy,
                resolved,
                gbps: Stats::of(&rates)?,
            })
        })
        .collect()
}

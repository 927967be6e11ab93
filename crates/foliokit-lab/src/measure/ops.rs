//! Measuring copy and clear strategies on a pair of regions.

use serde::Serialize;

use super::limits::{run_probe, LimitOp, Limits, Probe, Stores};
use super::{gbps, run_interleaved, Stats, HOT_SAMPLE_BYTES};
use foliokit::batch::{folio_starts, Reuse};
use foliokit::mc::copy_folios_mc;
use foliokit::mem::Region;
use foliokit::strategy::Strategy;
use foliokit::tune::Shape;
use foliokit::{
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
    /// Copy channels (persistent CPU workers) a copy batch is spread
    /// across; 1 copies on the calling thread.
    pub channels: usize,
    /// Also run the limit probes ([`Probe`]) on the same buffers and
    /// channels, interleaved with the strategies.
    pub limits: bool,
}

/// What a measurement gives: a row per candidate, and the same-run limit
/// when the plan asked for it.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub rows: Vec<Measured>,
    pub limits: Option<Limits>,
    /// Calls per timed loop: above 1 for cache-resident hot runs (see
    /// [`HOT_SAMPLE_BYTES`]); each figure is bytes moved over the loop's time.
    pub reps: usize,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// The strategy as named on the command line (`movsb`, `nt-mc`, `auto`).
    pub function: String,
    /// What actually ran (differs from `function` only for auto).
    pub resolved: String,
    pub gbps: Stats,
}

/// A copy to measure: a strategy, plain or machine-check-safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyCandidate {
    pub strategy: CopyStrategy,
    pub mc: bool,
}

impl CopyCandidate {
    pub fn plain(strategy: CopyStrategy) -> Self {
        CopyCandidate {
            strategy,
            mc: false,
        }
    }

    pub fn mc(strategy: CopyStrategy) -> Self {
        CopyCandidate { strategy, mc: true }
    }

    /// `movsb`, or `movsb-mc` for the machine-check-safe variant.
    pub fn name(&self) -> String {
        let n = self.strategy.name();
        if self.mc {
            format!("{n}-mc")
        } else {
            n.to_string()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Mem(#[from] foliokit::mem::MemError),
    #[error(transparent)]
    Mc(#[from] foliokit::mc::McError),
    #[error("{0} produced wrong bytes in its verification pass")]
    Wrong(String),
    #[error("{0} reported a fault copying healthy memory")]
    Faulted(String),
    #[error("{0}: machine-check-safe copies run on one channel (the fault record is per thread)")]
    McChannels(String),
    #[error(transparent)]
    Channel(#[from] foliokit::channels::ChannelError),
}

/// Whether a hot-mode loop should first re-run the candidate untimed: only
/// when the working set can be cache-resident at all. Interleaving would
/// otherwise let a streaming candidate evict the buffers of the next one.
fn rewarm(plan: &Plan, working_set: usize) -> bool {
    plan.cache == CacheMode::Hot && working_set <= foliokit::cpu::cpu().caches.llc
}

/// The limit probes' stores: a cache-resident run is compared with what the
/// cache does, not with memory.
fn stores(rewarm: bool) -> Stores {
    if rewarm {
        Stores::Cached
    } else {
        Stores::Streaming
    }
}

/// Calls per timed loop: one, unless the run is hot and cache-resident,
/// where a single call of `bytes` lasts microseconds and the loop repeats
/// it until it moves [`HOT_SAMPLE_BYTES`].
fn reps(rewarm: bool, bytes: usize) -> usize {
    if rewarm {
        HOT_SAMPLE_BYTES.div_ceil(bytes.max(1))
    } else {
        1
    }
}

/// Measures copying `src` into `dst` in `plan.folio_size` folios with each
/// candidate. Each candidate's warm-up call is verified against the source.
/// In hot mode, when both buffers fit the LLC, each timed loop follows an
/// untimed call of the same candidate (so it measures the candidate's own
/// steady state), repeats the call [`Measurement::reps`] times, and the
/// limit probes store into the cache ([`Stores::Cached`]).
pub fn measure_copy(
    src: &Region,
    dst: &mut Region,
    candidates: &[CopyCandidate],
    plan: &Plan,
    mut tick: impl FnMut(),
) -> Result<Measurement, MeasureError> {
    let len = src.len().min(dst.len());
    let pool = if plan.channels > 1 {
        if let Some(c) = candidates.iter().find(|c| c.mc) {
            return Err(MeasureError::McChannels(c.name()));
        }
        Some(foliokit::channels::shared(plan.channels)?)
    } else {
        None
    };
    // The channel path takes folio lists. Build them once: the buffers do
    // not move, and building them inside the timed call would bill only the
    // channel rows for it.
    let (dsts, srcs): (Vec<*mut u8>, Vec<*const u8>) = match pool {
        Some(_) => (
            folio_starts(dst.as_mut_ptr(), len, plan.folio_size),
            folio_starts(src.as_ptr().cast_mut(), len, plan.folio_size)
                .into_iter()
                .map(<*mut u8>::cast_const)
                .collect(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let run_once = |dst: &mut Region, c: usize| -> Result<String, MeasureError> {
        let cand = candidates[c];
        let opts = CopyOptions::default()
            .strategy(cand.strategy)
            .reuse(plan.reuse);
        let (d, s) = (&mut dst.as_mut_slice()[..len], &src.as_slice()[..len]);
        if let Some(pool) = &pool {
            let resolved = cand.strategy.resolve(
                Shape::batch(plan.folio_size, dsts.len(), plan.reuse).on_channels(plan.channels),
            );
            let f = resolved.function().map_err(BatchError::from)?;
            // SAFETY: the folios lie inside two live, disjoint regions that
            // nothing else touches until the pool returns.
            unsafe { pool.copy_folios(&dsts, &srcs, plan.folio_size, f) }?;
            return Ok(resolved.name().to_string());
        }
        if cand.mc {
            let r = copy_folios_mc(d, s, plan.folio_size, opts)?;
            if !r.faults.is_empty() {
                return Err(MeasureError::Faulted(cand.name()));
            }
            Ok(format!("{}-mc", r.strategy))
        } else {
            Ok(copy_folios(d, s, plan.folio_size, opts)?
                .strategy
                .to_string())
        }
    };
    let rewarm = rewarm(plan, 2 * len);
    let reps = reps(rewarm, len);
    let n = candidates.len();
    let probes = if plan.limits { Probe::ALL.len() } else { 0 };
    // Probes read the source and write the destination, on the same
    // channels and in the same folio pieces as the rows.
    let src_starts: Vec<*mut u8> = match pool {
        Some(_) => srcs.iter().map(|p| p.cast_mut()).collect(),
        None => Vec::new(),
    };
    let run_probe_once = |dst: &mut Region, k: usize| -> Result<(), MeasureError> {
        let p = Probe::ALL[k];
        let (ptr, starts) = match p {
            Probe::Read => (src.as_ptr().cast_mut(), &src_starts),
            _ => (dst.as_mut_ptr(), &dsts),
        };
        let pool = pool.as_ref().map(|p| (&**p, &starts[..], plan.folio_size));
        // SAFETY: the range is the first `len` bytes of a live region; the
        // read probe only reads the source (borrowed shared, never written
        // while we hold it); writes go to `dst`, borrowed exclusively.
        unsafe { run_probe(p, stores(rewarm), ptr, len, pool) }?;
        Ok(())
    };
    let mut resolved = vec![String::new(); n + probes];
    let secs = run_interleaved(
        n + probes,
        plan.loops,
        dst,
        |dst, c| match plan.cache {
            CacheMode::Evict => src.evict().map_err(MeasureError::from),
            CacheMode::Hot if rewarm && c >= n => run_probe_once(dst, c - n),
            CacheMode::Hot if rewarm => run_once(dst, c).map(drop),
            CacheMode::Hot => Ok(()),
        },
        |dst, c| {
            if c >= n {
                let run = |d: &mut Region| run_probe_once(d, c - n);
                return probe_call(Probe::ALL[c - n], dst, len, reps, &mut resolved[c], run);
            }
            if !resolved[c].is_empty() {
                return (0..reps).try_for_each(|_| run_once(dst, c).map(drop));
            }
            // The warm-up call: verify it copied every byte.
            dst.as_mut_slice()[..len].fill(0);
            let ran = run_once(dst, c)?;
            if dst.as_slice()[..len] != src.as_slice()[..len] {
                return Err(MeasureError::Wrong(candidates[c].name()));
            }
            resolved[c] = ran;
            Ok(())
        },
        &mut tick,
    )?;
    let names: Vec<String> = candidates.iter().map(CopyCandidate::name).collect();
    resolved.truncate(n);
    Ok(Measurement {
        rows: collect(&names, resolved, &secs[..n], len * reps),
        limits: plan
            .limits
            .then(|| Limits::from_secs(LimitOp::Copy, stores(rewarm), len * reps, &secs[n..]))
            .flatten(),
        reps,
    })
}

/// Measures zeroing `dst` in `plan.folio_size` folios with each strategy,
/// verifying each warm-up call; hot mode re-warms, repeats and probes the
/// cache as [`measure_copy`] does.
pub fn measure_clear(
    dst: &mut Region,
    strategies: &[ClearStrategy],
    plan: &Plan,
    mut tick: impl FnMut(),
) -> Result<Measurement, MeasureError> {
    let len = dst.len();
    let pool = if plan.channels > 1 {
        Some(foliokit::channels::shared(plan.channels)?)
    } else {
        None
    };
    // Built once, outside the timed calls, as in measure_copy.
    let dsts = match pool {
        Some(_) => folio_starts(dst.as_mut_ptr(), len, plan.folio_size),
        None => Vec::new(),
    };
    let run_once = |dst: &mut Region, c: usize| -> Result<String, MeasureError> {
        if let Some(pool) = &pool {
            let resolved = strategies[c].resolve(
                Shape::batch(plan.folio_size, dsts.len(), plan.reuse).on_channels(plan.channels),
            );
            let f = resolved.range_function().map_err(BatchError::from)?;
            // SAFETY: the folios lie inside the live region, which nothing
            // else touches until the pool returns.
            unsafe { pool.clear_folios(&dsts, plan.folio_size, f) }?;
            return Ok(resolved.name().to_string());
        }
        let opts = ClearOptions::default()
            .strategy(strategies[c])
            .reuse(plan.reuse)
            .hint_page(plan.hint_page);
        Ok(clear_folios(dst.as_mut_slice(), plan.folio_size, opts)?
            .strategy
            .to_string())
    };
    let rewarm = rewarm(plan, len);
    let reps = reps(rewarm, len);
    let n = strategies.len();
    let probes = if plan.limits { Probe::ALL.len() } else { 0 };
    let run_probe_once = |dst: &mut Region, k: usize| -> Result<(), MeasureError> {
        let pool = pool.as_ref().map(|p| (&**p, &dsts[..], plan.folio_size));
        // SAFETY: the whole live region, borrowed exclusively.
        unsafe { run_probe(Probe::ALL[k], stores(rewarm), dst.as_mut_ptr(), len, pool) }?;
        Ok(())
    };
    let mut resolved = vec![String::new(); n + probes];
    let secs = run_interleaved(
        n + probes,
        plan.loops,
        dst,
        |dst, c| match plan.cache {
            CacheMode::Evict => dst.evict().map_err(MeasureError::from),
            CacheMode::Hot if rewarm && c >= n => run_probe_once(dst, c - n),
            CacheMode::Hot if rewarm => run_once(dst, c).map(drop),
            CacheMode::Hot => Ok(()),
        },
        |dst, c| {
            if c >= n {
                let run = |d: &mut Region| run_probe_once(d, c - n);
                return probe_call(Probe::ALL[c - n], dst, len, reps, &mut resolved[c], run);
            }
            if !resolved[c].is_empty() {
                return (0..reps).try_for_each(|_| run_once(dst, c).map(drop));
            }
            dst.as_mut_slice().fill(0xFF);
            let ran = run_once(dst, c)?;
            if !is_zero(dst.as_slice()) {
                return Err(MeasureError::Wrong(strategies[c].name().to_string()));
            }
            resolved[c] = ran;
            Ok(())
        },
        &mut tick,
    )?;
    let names: Vec<String> = strategies.iter().map(|s| s.name().to_string()).collect();
    resolved.truncate(n);
    Ok(Measurement {
        rows: collect(&names, resolved, &secs[..n], len * reps),
        limits: plan
            .limits
            .then(|| Limits::from_secs(LimitOp::Clear, stores(rewarm), len * reps, &secs[n..]))
            .flatten(),
        reps,
    })
}

/// One call of a limit probe in the interleaved loop: the first (untimed
/// warm-up) runs it once and checks what it left in the first `len` bytes
/// of `dst`, recording its name in `verified`; later (timed) calls run it
/// `reps` times back to back.
fn probe_call(
    p: Probe,
    dst: &mut Region,
    len: usize,
    reps: usize,
    verified: &mut String,
    run: impl Fn(&mut Region) -> Result<(), MeasureError>,
) -> Result<(), MeasureError> {
    if !verified.is_empty() {
        return (0..reps).try_for_each(|_| run(dst));
    }
    run(dst)?;
    if !p.left(&dst.as_slice()[..len]) {
        return Err(MeasureError::Wrong(p.name().into()));
    }
    *verified = p.name().into();
    Ok(())
}

fn is_zero(b: &[u8]) -> bool {
    const ZERO: [u8; 4096] = [0; 4096];
    b.chunks(ZERO.len()).all(|c| c == &ZERO[..c.len()])
}

fn collect(
    names: &[String],
    resolved: Vec<String>,
    secs: &[Vec<f64>],
    bytes: usize,
) -> Vec<Measured> {
    names
        .iter()
        .zip(resolved)
        .zip(secs)
        .filter_map(|((function, resolved), s)| {
            let rates: Vec<f64> = s.iter().map(|&t| gbps(bytes, t)).collect();
            Some(Measured {
                function: function.clone(),
                resolved,
                gbps: Stats::of(&rates)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(channels: usize, limits: bool) -> Plan {
        Plan {
            folio_size: 4096,
            loops: 2,
            // Without a cache flush (other architectures) Evict is refused.
            cache: if foliokit::arch::CAN_FLUSH {
                CacheMode::Evict
            } else {
                CacheMode::Hot
            },
            reuse: Reuse::Stream,
            hint_page: 0,
            channels,
            limits,
        }
    }

    #[test]
    fn limits_run_beside_the_rows_on_every_channel_count() {
        for channels in [1, 2] {
            let mut src = Region::new(8 * 4096, 4096).unwrap();
            src.as_mut_slice().fill(3);
            let mut dst = Region::new(8 * 4096, 4096).unwrap();
            let cands = [CopyCandidate::plain(CopyStrategy::Libc)];
            let mut ticks = 0;
            let m =
                measure_copy(&src, &mut dst, &cands, &plan(channels, true), || ticks += 1).unwrap();
            assert_eq!(ticks, 4 * 3, "warm-up + 2 loops for a row and 3 probes");
            assert_eq!(m.rows.len(), 1);
            let l = m.limits.expect("limits measured");
            assert_eq!((l.op, l.read.runs, l.limit.runs), (LimitOp::Copy, 2, 2));
            assert!(
                src.as_slice().iter().all(|&b| b == 3),
                "the read probe wrote"
            );
            let m = measure_clear(
                &mut dst,
                &[ClearStrategy::Libc],
                &plan(channels, true),
                || {},
            )
            .unwrap();
            assert_eq!(m.limits.expect("limits measured").op, LimitOp::Clear);
            let m = measure_clear(
                &mut dst,
                &[ClearStrategy::Libc],
                &plan(channels, false),
                || {},
            )
            .unwrap();
            assert!(m.limits.is_none());
        }
    }

    #[test]
    fn hot_resident_runs_repeat_each_call_and_probe_the_cache() {
        let len = 8 * 4096;
        let mut src = Region::new(len, 4096).unwrap();
        src.as_mut_slice().fill(3);
        let mut dst = Region::new(len, 4096).unwrap();
        let hot = Plan {
            cache: CacheMode::Hot,
            ..plan(1, true)
        };
        let cands = [CopyCandidate::plain(CopyStrategy::Libc)];
        let mut ticks = 0;
        let m = measure_copy(&src, &mut dst, &cands, &hot, || ticks += 1).unwrap();
        assert_eq!(m.reps, HOT_SAMPLE_BYTES / len);
        assert_eq!(ticks, 4 * 3, "a tick per loop, not per repeated call");
        let l = m.limits.expect("limits measured");
        assert_eq!(l.stores, Stores::Cached);
        assert_eq!(l.formula, LimitOp::Copy.formula(Stores::Cached));
        assert_eq!(dst.as_slice(), src.as_slice());
        let m = measure_clear(&mut dst, &[ClearStrategy::Libc], &hot, || {}).unwrap();
        assert_eq!(m.reps, HOT_SAMPLE_BYTES / len);
        assert_eq!(m.limits.unwrap().stores, Stores::Cached);
        assert!(dst.as_slice().iter().all(|&b| b == 0));
        // A run that is not hot calls once per loop and probes memory.
        if foliokit::arch::CAN_FLUSH {
            let m = measure_copy(&src, &mut dst, &cands, &plan(1, true), || {}).unwrap();
            assert_eq!(m.reps, 1);
            assert_eq!(m.limits.unwrap().stores, Stores::Streaming);
        }
    }
}

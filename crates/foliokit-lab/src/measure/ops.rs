//! Measuring copy and clear strategies on a pair of regions.

use serde::Serialize;

use super::aa::AaControl;
use super::limits::{run_probe, LimitOp, Limits, Probe, Stores};
use super::order::Order;
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
    /// Two timings of the same code in this run, and whether they agree.
    pub aa: Option<AaControl>,
    /// The balanced order the passes ran in.
    pub order: Order,
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

/// What one interleaved slot times.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    /// Candidate `i` (the listed ones, then the A/A twin if one was added).
    Cand(usize),
    /// A limit probe with these stores.
    Probe(Probe, Stores),
}

/// The slots of one measurement: every candidate, the A/A twin where the
/// list lacks it, and the probes (a resident run probes both store kinds:
/// streaming stores can beat the cache by writing past it, and a limit
/// must bound every row).
struct Layout {
    slots: Vec<Slot>,
    /// (a, b, whether b was added): the candidates the A/A control compares.
    aa: Option<(usize, usize, bool)>,
}

impl Layout {
    /// `same(i, j)`: candidates `i` and `j` run the same code; `twin`: the
    /// index `auto` resolves to among the listed candidates, or `None` when
    /// the caller must append it (then it gets index `listed`).
    fn new(
        listed: usize,
        auto: Option<(usize, Option<usize>)>,
        plan: &Plan,
        rewarm: bool,
    ) -> Layout {
        let (aa, total) = match auto {
            Some((a, Some(b))) => (Some((a, b, false)), listed),
            Some((a, None)) => (Some((a, listed, true)), listed + 1),
            // No auto listed: the first candidate against a second copy.
            None if listed > 0 => (Some((0, listed, true)), listed + 1),
            None => (None, listed),
        };
        let mut slots: Vec<Slot> = (0..total).map(Slot::Cand).collect();
        if plan.limits {
            let kinds: &[Stores] = if rewarm {
                &[Stores::Cached, Stores::Streaming]
            } else {
                &[Stores::Streaming]
            };
            for &st in kinds {
                slots.extend(Probe::ALL.iter().map(|&p| Slot::Probe(p, st)));
            }
        }
        Layout { slots, aa }
    }
}

/// What the steps copy and clear share need of a candidate: a copy
/// candidate (a strategy, plain or machine-check-safe) or a clear strategy.
trait Candidate: Copy + PartialEq {
    /// As rows name it (`movsb`, `nt-mc`, `auto`).
    fn label(&self) -> String;
    /// Plain `auto`: the A/A control's first side.
    fn is_auto(&self) -> bool;
    /// What it runs as on `shape`: auto's resolution, the rest themselves.
    fn twin(&self, shape: Shape) -> Self;
    /// One primitive over the whole folio: whatever it reaches, the
    /// machine can do, so the limit is raised to it.
    fn primitive(&self) -> bool;
}

impl Candidate for CopyCandidate {
    fn label(&self) -> String {
        self.name()
    }

    fn is_auto(&self) -> bool {
        self.strategy == CopyStrategy::Auto && !self.mc
    }

    fn twin(&self, shape: Shape) -> Self {
        if self.is_auto() {
            CopyCandidate::plain(self.strategy.resolve(shape))
        } else {
            *self
        }
    }

    fn primitive(&self) -> bool {
        !self.mc && self.strategy.is_primitive()
    }
}

impl Candidate for ClearStrategy {
    fn label(&self) -> String {
        self.name().to_string()
    }

    fn is_auto(&self) -> bool {
        *self == ClearStrategy::Auto
    }

    fn twin(&self, shape: Shape) -> Self {
        self.resolve(shape)
    }

    fn primitive(&self) -> bool {
        self.is_primitive()
    }
}

/// What a measurement settles before anything runs.
struct Setup<C> {
    /// The channel pool, for plans on more than one channel.
    pool: Option<std::sync::Arc<foliokit::channels::ChannelPool>>,
    shape: Shape,
    /// Whether hot loops re-run the candidate untimed first ([`rewarm`]).
    rewarm: bool,
    /// The candidates, then the A/A twin where the list lacks it.
    cands: Vec<C>,
    layout: Layout,
    /// How many candidates were listed (rows are made for these).
    listed: usize,
}

/// The pool, the batch's shape, and the slots with the A/A control: auto
/// beside the named strategy it resolves to (added when not listed), or
/// without auto the first candidate beside a second copy of itself.
fn setup<C: Candidate>(
    candidates: &[C],
    plan: &Plan,
    len: usize,
    working_set: usize,
) -> Result<Setup<C>, MeasureError> {
    let pool = if plan.channels > 1 {
        Some(foliokit::channels::shared(plan.channels)?)
    } else {
        None
    };
    let shape = Shape::batch(plan.folio_size, len / plan.folio_size.max(1), plan.reuse)
        .on_channels(plan.channels);
    let mut cands = candidates.to_vec();
    let auto = cands.iter().position(C::is_auto).map(|a| {
        let twin = cands[a].twin(shape);
        (a, cands.iter().position(|c| *c == twin))
    });
    let rewarm = rewarm(plan, working_set);
    let layout = Layout::new(cands.len(), auto, plan, rewarm);
    let listed = cands.len();
    if let Some((a, _, true)) = layout.aa {
        cands.push(cands[a].twin(shape));
    }
    Ok(Setup {
        pool,
        shape,
        rewarm,
        cands,
        layout,
        listed,
    })
}

/// Builds the measurement from the slots' per-pass seconds: rows for the
/// listed candidates, the limit raised to every single-primitive row and
/// the other store kind's probes, and the A/A control.
#[allow(clippy::too_many_arguments)]
fn finish<C: Candidate>(
    op: LimitOp,
    layout: &Layout,
    cands: &[C],
    listed: usize,
    resolved: Vec<String>,
    secs: Vec<Vec<f64>>,
    bytes: usize,
    rewarm: bool,
    order: Order,
    reps: usize,
) -> Measurement {
    let names: Vec<String> = cands.iter().map(C::label).collect();
    let probe_secs = |st: Stores| -> Vec<Vec<f64>> {
        Probe::ALL
            .iter()
            .filter_map(|&p| {
                let k = layout.slots.iter().position(|&s| s == Slot::Probe(p, st))?;
                Some(secs[k].clone())
            })
            .collect()
    };
    let limits = (|| {
        let own = probe_secs(stores(rewarm));
        if own.len() != Probe::ALL.len() {
            return None;
        }
        let mut l = Limits::from_secs(op, stores(rewarm), bytes, &own)?;
        if rewarm {
            let other = probe_secs(Stores::Streaming);
            if other.len() == Probe::ALL.len() {
                let name = format!("probes ({})", Stores::Streaming.label());
                l = l.raise(&name, &Limits::probe_rates(op, bytes, &other));
            }
        }
        for i in (0..listed).filter(|&i| cands[i].primitive()) {
            let rates: Vec<f64> = secs[i].iter().map(|&t| gbps(bytes, t)).collect();
            l = l.raise(&names[i], &rates);
        }
        Some(l)
    })();
    let aa = layout.aa.and_then(|(a, b, added)| {
        let mut c = AaControl::of(&names[a], &secs[a], &names[b], &secs[b], bytes, added)?;
        if resolved[a] != resolved[b] {
            c.problem = Some(format!(
                "{} ran {} but the control timed {}",
                names[a], resolved[a], resolved[b]
            ));
        }
        Some(c)
    });
    Measurement {
        rows: collect(&names[..listed], resolved, &secs[..listed], bytes),
        limits,
        reps,
        aa,
        order,
    }
}

/// Measures copying `src` into `dst` in `plan.folio_size` folios with each
/// candidate. Each candidate's warm-up call is verified against the source.
/// In hot mode, when both buffers fit the LLC, each timed loop follows an
/// untimed call of the same candidate (so it measures the candidate's own
/// steady state), repeats the call [`Measurement::reps`] times, and the
/// limit probes store into the cache ([`Stores::Cached`]) as well as past
/// it. In evict mode both buffers are flushed before every call, so every
/// candidate starts from the same state whatever ran before it.
pub fn measure_copy(
    src: &Region,
    dst: &mut Region,
    candidates: &[CopyCandidate],
    plan: &Plan,
    mut tick: impl FnMut(),
) -> Result<Measurement, MeasureError> {
    let len = src.len().min(dst.len());
    if plan.channels > 1 {
        if let Some(c) = candidates.iter().find(|c| c.mc) {
            return Err(MeasureError::McChannels(c.name()));
        }
    }
    let set = setup(candidates, plan, len, 2 * len)?;
    let (pool, shape, rewarm, cands) = (&set.pool, set.shape, set.rewarm, &set.cands);
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
        let cand = cands[c];
        let opts = CopyOptions::default()
            .strategy(cand.strategy)
            .reuse(plan.reuse);
        let (d, s) = (&mut dst.as_mut_slice()[..len], &src.as_slice()[..len]);
        if let Some(pool) = &pool {
            let resolved = cand.strategy.resolve(shape);
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
    let reps = reps(rewarm, len);
    // Probes read the source and write the destination, on the same
    // channels and in the same folio pieces as the rows.
    let src_starts: Vec<*mut u8> = match pool {
        Some(_) => srcs.iter().map(|p| p.cast_mut()).collect(),
        None => Vec::new(),
    };
    let run_probe_once = |dst: &mut Region, p: Probe, st: Stores| -> Result<(), MeasureError> {
        let (ptr, starts) = match p {
            Probe::Read => (src.as_ptr().cast_mut(), &src_starts),
            _ => (dst.as_mut_ptr(), &dsts),
        };
        let pool = pool.as_ref().map(|p| (&**p, &starts[..], plan.folio_size));
        // SAFETY: the range is the first `len` bytes of a live region; the
        // read probe only reads the source (borrowed shared, never written
        // while we hold it); writes go to `dst`, borrowed exclusively.
        unsafe { run_probe(p, st, ptr, len, pool) }?;
        Ok(())
    };
    measured(
        LimitOp::Copy,
        &set,
        plan,
        reps,
        dst,
        |dst| {
            src.evict()?;
            dst.evict().map_err(MeasureError::from)
        },
        &run_once,
        &run_probe_once,
        |dst, c| {
            // The warm-up call: verify it copied every byte.
            dst.as_mut_slice()[..len].fill(0);
            let ran = run_once(dst, c)?;
            if dst.as_slice()[..len] != src.as_slice()[..len] {
                return Err(MeasureError::Wrong(cands[c].name()));
            }
            Ok(ran)
        },
        len,
        &mut tick,
    )
}

/// Measures zeroing `dst` in `plan.folio_size` folios with each strategy,
/// verifying each warm-up call; hot mode re-warms, repeats and probes the
/// cache as [`measure_copy`] does, evict mode flushes before every call.
pub fn measure_clear(
    dst: &mut Region,
    strategies: &[ClearStrategy],
    plan: &Plan,
    mut tick: impl FnMut(),
) -> Result<Measurement, MeasureError> {
    let len = dst.len();
    let set = setup(strategies, plan, len, len)?;
    let (pool, shape, rewarm, strategies) = (&set.pool, set.shape, set.rewarm, &set.cands);
    // Built once, outside the timed calls, as in measure_copy.
    let dsts = match pool {
        Some(_) => folio_starts(dst.as_mut_ptr(), len, plan.folio_size),
        None => Vec::new(),
    };
    let run_once = |dst: &mut Region, c: usize| -> Result<String, MeasureError> {
        if let Some(pool) = &pool {
            let resolved = strategies[c].resolve(shape);
            let f = resolved.function().map_err(BatchError::from)?;
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
    let reps = reps(rewarm, len);
    let run_probe_once = |dst: &mut Region, p: Probe, st: Stores| -> Result<(), MeasureError> {
        let pool = pool.as_ref().map(|p| (&**p, &dsts[..], plan.folio_size));
        // SAFETY: the whole live region, borrowed exclusively.
        unsafe { run_probe(p, st, dst.as_mut_ptr(), len, pool) }?;
        Ok(())
    };
    measured(
        LimitOp::Clear,
        &set,
        plan,
        reps,
        dst,
        |dst| dst.evict().map_err(MeasureError::from),
        &run_once,
        &run_probe_once,
        |dst, c| {
            // The warm-up call: verify it zeroed every byte.
            dst.as_mut_slice().fill(0xFF);
            let ran = run_once(dst, c)?;
            if !is_zero(dst.as_slice()) {
                return Err(MeasureError::Wrong(strategies[c].label()));
            }
            Ok(ran)
        },
        len,
        &mut tick,
    )
}

/// Runs every slot of `set` in a balanced order (see [`run_interleaved`])
/// and builds the measurement from the timings (see [`finish`]): before
/// each call, `evict` in evict mode, or the same call untimed in a
/// cache-resident hot run; a candidate's first (warm-up) call is `verified`
/// (it fills, runs and checks the buffer, returning what ran), its timed
/// calls repeat `run_once` `reps` times; probes go through [`probe_call`].
#[allow(clippy::too_many_arguments)]
fn measured<C: Candidate>(
    op: LimitOp,
    set: &Setup<C>,
    plan: &Plan,
    reps: usize,
    dst: &mut Region,
    evict: impl Fn(&mut Region) -> Result<(), MeasureError>,
    run_once: &dyn Fn(&mut Region, usize) -> Result<String, MeasureError>,
    run_probe_once: &dyn Fn(&mut Region, Probe, Stores) -> Result<(), MeasureError>,
    verified: impl Fn(&mut Region, usize) -> Result<String, MeasureError>,
    len: usize,
    tick: &mut impl FnMut(),
) -> Result<Measurement, MeasureError> {
    let order = Order::new(set.layout.slots.len(), plan.loops);
    let (slots, cache, rewarm) = (&set.layout.slots, plan.cache, set.rewarm);
    let mut resolved = vec![String::new(); slots.len()];
    let secs = run_interleaved(
        &order,
        dst,
        |dst, k| match (cache, slots[k]) {
            (CacheMode::Evict, _) => evict(dst),
            (CacheMode::Hot, Slot::Probe(p, st)) if rewarm => run_probe_once(dst, p, st),
            (CacheMode::Hot, Slot::Cand(c)) if rewarm => run_once(dst, c).map(drop),
            (CacheMode::Hot, _) => Ok(()),
        },
        |dst, k| match slots[k] {
            Slot::Probe(p, st) => {
                let run = |d: &mut Region| run_probe_once(d, p, st);
                probe_call(p, dst, len, reps, &mut resolved[k], run)
            }
            Slot::Cand(c) if !resolved[k].is_empty() => {
                (0..reps).try_for_each(|_| run_once(dst, c).map(drop))
            }
            Slot::Cand(c) => {
                resolved[k] = verified(dst, c)?;
                Ok(())
            }
        },
        tick,
    )?;
    resolved.truncate(set.cands.len());
    Ok(finish(
        op,
        &set.layout,
        &set.cands,
        set.listed,
        resolved,
        secs,
        len * reps,
        set.rewarm,
        order,
        reps,
    ))
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
            cache: if foliokit::internals::CAN_FLUSH {
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
            // A row, its A/A copy and 3 probes: five slots, a design of
            // ten orders (odd), so ten passes although two were asked.
            assert_eq!(m.order.candidates, 5);
            assert_eq!(m.order.passes, 10);
            assert_eq!(ticks, 5 * 11, "warm-up + every pass, a tick per call");
            assert_eq!(m.rows.len(), 1, "the A/A copy is not a row");
            let aa = m.aa.as_ref().expect("an A/A control in every run");
            assert!(aa.twin_added && aa.a == "libc" && aa.b == "libc");
            let l = m.limits.expect("limits measured");
            assert_eq!((l.op, l.read.runs, l.limit.runs), (LimitOp::Copy, 10, 10));
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
    fn auto_is_timed_beside_its_twin_and_the_limit_bounds_every_primitive() {
        let len = 16 * 4096;
        let mut dst = Region::new(len, 4096).unwrap();
        let named = ClearStrategy::Auto.resolve(Shape::batch(4096, 16, Reuse::Stream));
        // The twin is appended when the list lacks it, and reused when not.
        for list in [vec![ClearStrategy::Auto], vec![named, ClearStrategy::Auto]] {
            let m = measure_clear(&mut dst, &list, &plan(1, true), || {}).unwrap();
            let aa = m.aa.expect("A/A control");
            assert_eq!((aa.a.as_str(), aa.b.as_str()), ("auto", named.name()));
            assert_eq!(aa.twin_added, list.len() == 1);
            assert!(aa.problem.is_none(), "{aa:?}");
            assert_eq!(m.rows.len(), list.len());
            let l = m.limits.unwrap();
            for r in m
                .rows
                .iter()
                .filter(|r| ClearStrategy::from_name(&r.function).is_some_and(|p| p.is_primitive()))
            {
                assert!(
                    l.limit.median >= r.gbps.median,
                    "{} above {:?}",
                    r.function,
                    l
                );
            }
        }
        let src = Region::new(len, 4096).unwrap();
        let cands = [CopyCandidate::plain(CopyStrategy::Auto)];
        let m = measure_copy(&src, &mut dst, &cands, &plan(1, true), || {}).unwrap();
        let aa = m.aa.expect("A/A control");
        assert_eq!(
            aa.b,
            CopyStrategy::Auto
                .resolve(Shape::batch(4096, 16, Reuse::Stream))
                .name()
        );
        assert!(aa.problem.is_none(), "{aa:?}");
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
        // A row, its A/A copy, three probes with each store kind.
        assert_eq!(m.order.candidates, 8);
        assert_eq!(ticks, 8 * 9, "a tick per loop, not per repeated call");
        let l = m.limits.expect("limits measured");
        assert_eq!(l.stores, Stores::Cached);
        assert!(
            l.bounds.iter().any(|b| b.name.contains("streaming")),
            "a resident run also probes streaming stores: {:?}",
            l.bounds
        );
        assert_eq!(l.formula, LimitOp::Copy.formula(Stores::Cached));
        // (What the buffer holds afterwards depends on which slot ran
        // last; every candidate's warm-up call was verified.)
        let m = measure_clear(&mut dst, &[ClearStrategy::Libc], &hot, || {}).unwrap();
        assert_eq!(m.reps, HOT_SAMPLE_BYTES / len);
        assert_eq!(m.limits.unwrap().stores, Stores::Cached);
        // A run that is not hot calls once per loop and probes memory.
        if foliokit::internals::CAN_FLUSH {
            let m = measure_copy(&src, &mut dst, &cands, &plan(1, true), || {}).unwrap();
            assert_eq!(m.reps, 1);
            assert_eq!(m.limits.unwrap().stores, Stores::Streaming);
        }
    }
}

//! Same-run limits: what this machine's memory does for an operation,
//! measured on the operation's own buffers and channels, interleaved with
//! the strategies, so every row can be read as a share of it.
//!
//! Three probes: a plain sequential read, a streaming write of zeros and a
//! streaming write of other bytes (some CPUs stream zeros about twice as fast).
//! For a cache-resident buffer the writes use ordinary stores instead
//! ([`Stores::Cached`]): the limit is then the cache's, not memory's.
//! An operation's limit combines them (see [`LimitOp::formula`]):
//! - copy: every byte is read once and written once, so a copy cannot be
//!   faster than reading alone (`R`) or than writing alone (`W`, the non-zero
//!   write: copied data is not zero): limit `= min(R, W)`. (Had reads and
//!   writes to take turns on one bus, a GB would cost `1/R + 1/W` seconds,
//!   `R·W / (R + W)`; on the machines measured so far copies beat that, since
//!   one core's reads are bound by how many misses it keeps in flight, not
//!   by the bus, and writes overlap them. That figure is in the JSON as
//!   `serial_gbps`, for reference.)
//! - clear and fault: the zero write `W0` (a fault's cost beyond it is the
//!   kernel's);
//! - template init: the non-zero write `W` (records are not zero).
//!
//! The limit is computed per loop from that loop's three probes, then
//! summarised like any row.

use serde::Serialize;

use super::{gbps, Stats};
use crate::probe;
use foliokit::batch::folio_starts;
use foliokit::channels::{ChannelError, ChannelPool};
use foliokit::strategy::ClearFn;

/// One probe of what memory can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Probe {
    /// Sequential 16-byte loads of the buffer, nothing written.
    Read,
    /// Streaming stores of zeros, drained: `clzero` where the CPU has it,
    /// else `movntdq` (cached: `rep stosb` with ERMS, else `rep stosq`).
    WriteZero,
    /// Streaming stores of a non-zero byte, drained (cached: as above).
    Write,
}

impl Probe {
    pub const ALL: [Probe; 3] = [Probe::Read, Probe::WriteZero, Probe::Write];

    pub fn name(self) -> &'static str {
        match self {
            Probe::Read => "limit:read",
            Probe::WriteZero => "limit:write-0",
            Probe::Write => "limit:write",
        }
    }

    /// The primitive, with the clear signature so channels can spread it.
    pub(crate) fn function(self, stores: Stores) -> ClearFn {
        match (self, stores) {
            (Probe::Read, _) => probe::read_probe,
            (Probe::WriteZero, Stores::Streaming) => probe::write_zero_probe,
            (Probe::Write, Stores::Streaming) => probe::write_probe,
            (Probe::WriteZero, Stores::Cached) => probe::write_zero_cached_probe,
            (Probe::Write, Stores::Cached) => probe::write_cached_probe,
        }
    }

    /// Whether `buf` holds what this probe leaves (read leaves anything).
    pub(crate) fn left(self, buf: &[u8]) -> bool {
        match self {
            Probe::Read => true,
            Probe::WriteZero => buf.iter().all(|&b| b == 0),
            Probe::Write => buf.iter().all(|&b| b == probe::PATTERN),
        }
    }
}

/// How the write probes store: past the cache (the limit of memory), or
/// into it (the limit of a cache-resident buffer, which streaming stores
/// would push out to memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stores {
    Streaming,
    Cached,
}

impl Stores {
    /// The other kind: a resident run also probes streaming stores, which
    /// can beat the cache by writing past it.
    pub fn label(self) -> &'static str {
        match self {
            Stores::Streaming => "streaming stores",
            Stores::Cached => "ordinary stores",
        }
    }
}

/// The operation a limit is for: which probes it combines, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitOp {
    Copy,
    Clear,
    Init,
    Fault,
}

impl LimitOp {
    /// How the limit is computed from the probes, for reports.
    pub fn formula(self, stores: Stores) -> &'static str {
        match (self, stores) {
            (LimitOp::Copy, Stores::Streaming) => {
                "copy limit = min(read, write): a copy reads and writes every byte, so it is no faster than either alone (write = streaming write of non-zero bytes)"
            }
            (LimitOp::Copy, Stores::Cached) => {
                "copy limit = min(read, write) on cache-resident buffers: a copy reads and writes every byte, so it is no faster than either alone (write = ordinary stores of non-zero bytes, which keep the buffer in cache, or streaming stores where those are faster)"
            }
            (LimitOp::Clear | LimitOp::Fault, Stores::Streaming) => {
                "limit = streaming write of zeros"
            }
            (LimitOp::Clear | LimitOp::Fault, Stores::Cached) => {
                "limit = ordinary stores of zeros into the cache-resident buffer, or streaming stores of zeros where those are faster"
            }
            (LimitOp::Init, Stores::Streaming) => {
                "limit = streaming write of non-zero bytes over the array"
            }
            (LimitOp::Init, Stores::Cached) => {
                "limit = ordinary stores of non-zero bytes over the cache-resident array, or streaming stores where those are faster"
            }
        }
    }

    /// The limit in GB/s from one loop's probes (GB/s each).
    pub fn combine(self, read: f64, write_zero: f64, write: f64) -> f64 {
        match self {
            LimitOp::Copy => read.min(write),
            LimitOp::Clear | LimitOp::Fault => write_zero,
            LimitOp::Init => write,
        }
    }
}

/// The three probes of one run and the limit they give the operation.
#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    pub op: LimitOp,
    pub stores: Stores,
    pub read: Stats,
    pub write_zero: Stats,
    pub write: Stats,
    /// Per loop, `op.combine` of that loop's probes.
    pub limit: Stats,
    /// Per loop, `read*write / (read + write)`: what a copy would get if
    /// reads and writes took turns (a reference point, not the limit).
    pub serial_gbps: Stats,
    pub formula: &'static str,
    /// Every bound the limit is the per-pass maximum of, with its median
    /// GB/s: the probes, the other store kind's probes, and each
    /// single-primitive row of the run (what this machine was seen to do
    /// is what it can do).
    pub bounds: Vec<Bound>,
    /// The bound with the highest median: what set the limit.
    pub set_by: String,
    /// The limit per timed pass (the maximum of the bounds in that pass).
    #[serde(skip)]
    per_pass: Vec<f64>,
}

/// One lower bound on what the machine can do for the operation.
#[derive(Debug, Clone, Serialize)]
pub struct Bound {
    pub name: String,
    pub gbps: f64,
}

impl Limits {
    /// Summarises the probes' timed seconds (indexed like [`Probe::ALL`],
    /// one entry per loop) over `bytes` per call.
    pub fn from_secs(
        op: LimitOp,
        stores: Stores,
        bytes: usize,
        secs: &[Vec<f64>],
    ) -> Option<Limits> {
        let rates: Vec<Vec<f64>> = secs
            .iter()
            .map(|s| s.iter().map(|&t| gbps(bytes, t)).collect())
            .collect();
        // No probes ran (`--no-limits`): there is no limit to give.
        let [r, w0, w] = [rates.first()?, rates.get(1)?, rates.get(2)?];
        let per_loop: Vec<f64> = (0..r.len().min(w0.len()).min(w.len()))
            .map(|l| op.combine(r[l], w0[l], w[l]))
            .collect();
        let serial: Vec<f64> = (0..per_loop.len())
            .map(|l| r[l] * w[l] / (r[l] + w[l]))
            .collect();
        let limit = Stats::of(&per_loop)?;
        let name = format!("probes ({})", stores.label());
        Some(Limits {
            serial_gbps: Stats::of(&serial)?,
            op,
            stores,
            read: Stats::of(r)?,
            write_zero: Stats::of(w0)?,
            write: Stats::of(w)?,
            bounds: vec![Bound {
                name: name.clone(),
                gbps: limit.median,
            }],
            set_by: name,
            limit,
            formula: op.formula(stores),
            per_pass: per_loop,
        })
    }

    /// The same limit, raised per pass to another bound `name` reached
    /// (GB/s per pass, in the same pass order): a row or a probe set that
    /// went faster shows the probes missed something.
    pub fn raise(mut self, name: &str, rates: &[f64]) -> Limits {
        let Some(s) = Stats::of(rates) else {
            return self;
        };
        for (l, &r) in self.per_pass.iter_mut().zip(rates) {
            *l = l.max(r);
        }
        if s.median > self.bounds.iter().map(|b| b.gbps).fold(f64::MIN, f64::max) {
            self.set_by = name.to_string();
        }
        self.bounds.push(Bound {
            name: name.to_string(),
            gbps: s.median,
        });
        if let Some(l) = Stats::of(&self.per_pass) {
            self.limit = l;
        }
        self
    }

    /// The probes' own limit (before [`Limits::raise`]), per pass: what
    /// another probe set raises a limit by.
    pub fn probe_rates(op: LimitOp, bytes: usize, secs: &[Vec<f64>]) -> Vec<f64> {
        let rate = |k: usize, l: usize| gbps(bytes, secs[k][l]);
        let n = secs.iter().map(Vec::len).min().unwrap_or(0);
        (0..n)
            .map(|l| op.combine(rate(0, l), rate(1, l), rate(2, l)))
            .collect()
    }

    /// The limit's median, GB/s: what rows are compared with.
    pub fn gbps(&self) -> f64 {
        self.limit.median
    }
}

/// Runs `probe` over `[ptr, ptr + len)`: on the calling thread, or spread
/// over `pool` in `folio_size` pieces starting at `starts` (as the channel
/// rows spread their batches).
///
/// # Safety
/// The range must be valid for what the probe does (reads for
/// [`Probe::Read`], which never writes; writes otherwise) and written by
/// nobody else until this returns; `starts` must be the folio starts of
/// that range.
pub(crate) unsafe fn run_probe(
    probe: Probe,
    stores: Stores,
    ptr: *mut u8,
    len: usize,
    pool: Option<(&ChannelPool, &[*mut u8], usize)>,
) -> Result<(), ChannelError> {
    let f = probe.function(stores);
    match pool {
        // SAFETY: forwarded contract.
        Some((pool, starts, folio)) => unsafe { pool.clear_folios(starts, folio, f) }.map(drop),
        None => {
            // SAFETY: forwarded contract.
            unsafe { f(ptr, len) };
            Ok(())
        }
    }
}

/// Runs `probe` once over `buf` on `channels` channels (the shared pool),
/// in `folio_size` pieces, with streaming stores: for benches that
/// interleave probes with their own timed work on buffers past the cache.
pub fn probe(
    probe: Probe,
    buf: &mut [u8],
    channels: usize,
    folio_size: usize,
) -> Result<(), ChannelError> {
    let (ptr, len) = (buf.as_mut_ptr(), buf.len());
    if channels > 1 {
        let pool = foliokit::channels::shared(channels)?;
        let starts = folio_starts(ptr, len, folio_size);
        // SAFETY: `buf` is borrowed exclusively; the starts cover it.
        unsafe {
            run_probe(
                probe,
                Stores::Streaming,
                ptr,
                len,
                Some((&pool, &starts, folio_size)),
            )
        }
    } else {
        // SAFETY: as above.
        unsafe { run_probe(probe, Stores::Streaming, ptr, len, None) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_combine_as_stated() {
        assert_eq!(LimitOp::Copy.combine(30.0, 60.0, 20.0), 20.0);
        assert_eq!(LimitOp::Clear.combine(30.0, 60.0, 20.0), 60.0);
        assert_eq!(LimitOp::Fault.combine(30.0, 60.0, 20.0), 60.0);
        assert_eq!(LimitOp::Init.combine(30.0, 60.0, 20.0), 20.0);
        // 1 GiB in 1/30 s, 1/60 s, 1/20 s, two loops each.
        let secs = vec![
            vec![1.0 / 30.0; 2],
            vec![1.0 / 60.0; 2],
            vec![1.0 / 20.0; 2],
        ];
        let l = Limits::from_secs(LimitOp::Copy, Stores::Streaming, 1 << 30, &secs).unwrap();
        assert!((l.gbps() - 20.0).abs() < 1e-9);
        assert!((l.serial_gbps.median - 12.0).abs() < 1e-9);
        assert!((l.read.median - 30.0).abs() < 1e-9);
    }

    #[test]
    fn both_store_kinds_fill_odd_ranges_exactly() {
        for stores in [Stores::Streaming, Stores::Cached] {
            for probe in Probe::ALL {
                for (off, len) in [(0, 0), (1, 1), (3, 63), (5, 64 + 17), (15, 4096 + 5)] {
                    let mut buf = vec![7u8; len + off + 32];
                    // SAFETY: [off, off + len) lies inside `buf`.
                    unsafe { probe.function(stores)(buf.as_mut_ptr().add(off), len) };
                    let want = |b: &[u8]| match probe {
                        Probe::Read => b.iter().all(|&x| x == 7),
                        _ => probe.left(b),
                    };
                    assert!(
                        want(&buf[off..off + len]),
                        "{probe:?} {stores:?} {off}+{len}"
                    );
                    let outside = buf[..off].iter().chain(&buf[off + len..]);
                    assert!(
                        outside.into_iter().all(|&b| b == 7),
                        "{probe:?} {stores:?} wrote outside"
                    );
                }
            }
        }
    }

    #[test]
    fn probes_leave_what_they_write_and_read_touches_nothing() {
        for channels in [1, 2] {
            let mut buf = vec![7u8; 64 * 1024 + 3];
            probe(Probe::Read, &mut buf, 1, 4096).unwrap();
            assert!(buf.iter().all(|&b| b == 7));
            probe(Probe::Write, &mut buf, 1, 4096).unwrap();
            assert!(Probe::Write.left(&buf));
            probe(Probe::WriteZero, &mut buf, 1, 4096).unwrap();
            assert!(Probe::WriteZero.left(&buf));
            let mut paged = foliokit::mem::Region::new(16 * 4096, 4096).unwrap();
            paged.as_mut_slice().fill(7);
            probe(Probe::Read, paged.as_mut_slice(), channels, 4096).unwrap();
            assert!(paged.as_slice().iter().all(|&b| b == 7));
            probe(Probe::Write, paged.as_mut_slice(), channels, 4096).unwrap();
            assert!(Probe::Write.left(paged.as_slice()));
            probe(Probe::WriteZero, paged.as_mut_slice(), channels, 4096).unwrap();
            assert!(Probe::WriteZero.left(paged.as_slice()));
        }
    }
}

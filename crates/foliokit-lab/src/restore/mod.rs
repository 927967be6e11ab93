//! `bench restore`: restoring guest RAM from a snapshot file, eagerly three
//! ways and lazily, with the same-run copy limit.
//!
//! The guest is a THP-advised anonymous range (2 MiB folios), or with
//! `hugetlb` 2 MiB hugetlb pages (the pool grown for the run where it is
//! short, root only), fresh for every restore; the snapshot is a file of
//! the same size in the page cache (or, with `cold`, dropped from it
//! before every restore). Rows:
//!
//! - `read(2)`: one `pread` per 64 MiB straight into guest RAM (what a VMM
//!   does without help); the kernel copies on the calling thread;
//! - `mmap+memcpy`: the file mapped, `memcpy` into guest RAM on one thread;
//! - `foliokit`: the file mapped, machine-check-safe copies of 2 MiB folios
//!   spread over the copy channels (and its A/A twin, the named mc strategy
//!   `auto` resolved to);
//! - `lazy`: [`foliokit::lazy::fill_lazily`]; a simulated vCPU touches one
//!   random page of every folio, in random order, while the fill runs, and
//!   each touch is timed;
//! - `lazy + wait`: the same fill, waited for before the vCPUs run: an
//!   eager restore through the fill (into hugetlb guest RAM the kernel
//!   installs each page filled, without zeroing it first);
//! - `foliokit, prealloc`: the `foliokit` row into guest RAM faulted in
//!   beforehand, untimed (a VMM that preallocates guest RAM at start);
//! - `populate only`: no restore, just the kernel faulting fresh guest RAM
//!   in (`MADV_POPULATE_WRITE` on the copy channels): the share of every
//!   restore into fresh memory that is the kernel zeroing each huge page.
//!
//! With a zero share (`zero_fraction` > 0) a second snapshot is written
//! beside the first, the same bytes but that share of its folios zero and
//! left as holes (every folio whose index `i` has `floor((i + 1) F) >
//! floor(i F)`: spread evenly, as a guest's never-touched memory comes in
//! runs of whole folios), and three rows restore it: `foliokit, zero share`
//! (the `foliokit` row, all-hole folios neither read nor written: fresh
//! guest RAM reads zero there), `lazy, zero share` and `lazy + wait, zero
//! share` (holes installed as zero pages). Their times over their twins'
//! from the same run give the share of time zero pages cost.
//!
//! Every row that reads the file through a mapping maps it afresh for each
//! restore, as a VMM restoring a guest does: faulting its page tables in
//! is part of the cost.
//!
//! Candidates and the three limit probes run interleaved in a balanced
//! order (see `measure::order`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use foliokit::channels::ChannelError;
use foliokit::internals::anon_huge_bytes;
use foliokit::lazy::{fill_lazily, LazyError, LazyOptions, Segment, Source};
use foliokit::mem::{MemError, Region};
use foliokit::tune::Shape;
use foliokit::{CopyStrategy, McError, Reuse};
use serde::{Deserialize, Serialize};
use thiserror::Error;

mod external;
mod report;
mod snapshot;

use snapshot::{byte_at, check_disk, fd_path, write_snapshot, zero_folio};

pub use report::report;

use crate::hugetlb::HugetlbGrant;
use crate::measure::{
    probe, run_interleaved, AaControl, LimitOp, Limits, Order, Probe, Stats, Stores,
};

const FOLIO: usize = 2 << 20;
/// Bytes per `pread` of the read(2) row.
const READ_CHUNK: usize = 64 << 20;
/// The limit probes run over at most this much (a separate buffer).
const PROBE_MAX: usize = 1 << 30;
/// Rows and probes, interleaved (see `run`), without a zero share.
const METHODS: usize = 11;
/// The rows added with a zero share.
const ZERO_METHODS: usize = 3;
/// External-handler rows (one more, the zero share's, with a zero share).
const HANDLER_METHODS: usize = 3;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct RestorePlan {
    /// Guest RAM bytes (a multiple of 2 MiB).
    pub size: usize,
    /// Copy channels of the foliokit rows.
    pub channels: usize,
    /// Timed passes asked for.
    pub loops: usize,
    /// Drop the snapshot from the page cache before every restore.
    pub cold: bool,
    /// The lazy fill's latency budget.
    pub budget: Duration,
    /// Where the snapshot file goes.
    pub dir: PathBuf,
    /// The lazy fill serves faults while a background batch is in flight
    /// (see `LazyOptions::serve_during_batches`).
    pub serve_during_batches: bool,
    /// Guest RAM of 2 MiB hugetlb pages instead of THP.
    pub hugetlb: bool,
    /// Share of the snapshot's folios that are zero (holes): above 0, a
    /// second snapshot with that share zero and its three rows are added.
    pub zero_fraction: f64,
    /// The zero share's folios are written as zero bytes (a dense file),
    /// not holes.
    pub dense_zeros: bool,
    /// The program that plays the VMM for the external-handler rows
    /// (`foliokit`, whose hidden `__vmm` command runs [`crate::vmm`]);
    /// `None`: those rows are left out, and a note says so.
    pub vmm_exe: Option<PathBuf>,
    /// The longest an external-handler row waits for each of the VMM's
    /// steps (connecting; every page in; exiting afterwards) before it
    /// kills the VMM and fails; `None`: 60 s and 30 s per GiB of guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vmm_wait: Option<Duration>,
    /// The block the external handler installs around a fault in 4 KiB
    /// guest memory (`uffd-handler --block`; hugetlb: its page).
    pub handler_block: usize,
}

/// Why the bench could not run.
#[derive(Debug, Error)]
pub enum RestoreError {
    /// Guest RAM or the probe buffer could not be mapped.
    #[error("guest memory: {0}")]
    Mem(#[from] MemError),
    /// The snapshot file.
    #[error("snapshot file {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The mc copy.
    #[error("{0}")]
    Mc(#[from] McError),
    /// The channels.
    #[error("{0}")]
    Channel(#[from] ChannelError),
    /// The lazy fill could not start (its refusal says why).
    #[error("{0}")]
    Lazy(#[from] LazyError),
    /// A restore produced wrong bytes: the bench refuses to time it.
    #[error("{0} restored wrong bytes at guest offset {1:#x}")]
    Wrong(&'static str, usize),
    /// The kernel could not fault guest RAM in (`populate only`).
    #[error("{0}")]
    Populate(#[from] foliokit::mem::PopulateError),
    /// An external-handler row's VMM did not do its part in time (see
    /// [`RestorePlan::vmm_wait`]): it was killed, and the row fails
    /// rather than hang.
    #[error("external handler row: {what} within {waited:?}; the VMM was killed")]
    VmmStuck {
        /// What did not happen.
        what: &'static str,
        /// How long was waited.
        waited: Duration,
    },
    /// Bad options.
    #[error("{0}")]
    Plan(String),
}

/// One row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreRow {
    /// `read(2)`, `mmap+memcpy`, `foliokit`, `foliokit (<named>)`, `lazy`.
    pub function: String,
    /// Seconds until the vCPUs may run.
    pub start_secs: Stats,
    /// Seconds until every page is resident.
    pub resident_secs: Stats,
    /// Guest bytes over `resident_secs`, GB/s (2^30).
    pub gbps: Stats,
    /// `gbps` median over the same-run copy limit (NaN, written null, for
    /// `populate only`, which copies nothing).
    #[serde(deserialize_with = "crate::schema::nan_if_null")]
    pub share: f64,
    /// First-touch latency of the simulated vCPU during the fill (lazy):
    /// the median over passes of each pass's median, as every other column
    /// is a median over passes.
    pub touch_p50_us: Option<f64>,
    /// The median over passes of each pass's 99th percentile.
    pub touch_p99_us: Option<f64>,
    /// The 99th percentile of every touch of every pass together: a pass
    /// the host slowed (its memory backed again after free page
    /// reporting) weighs in full here.
    #[serde(default)]
    pub touch_p99_pooled_us: Option<f64>,
    /// Touches timed, over all passes.
    pub touches: usize,
    /// Pages installed to serve faults / by the background fill (lazy,
    /// last pass).
    pub faulted_pages: u64,
    /// See `faulted_pages`.
    pub filled_pages: u64,
    /// Faults served (last pass).
    pub faults: u64,
    /// Pages installed as zero pages (lazy, last pass).
    #[serde(default)]
    pub zero_pages: u64,
    /// Share of guest RAM mapped by THP after the restore (last pass).
    pub thp_share: f64,
    /// The longest background batch (lazy, last pass), microseconds.
    pub longest_batch_us: Option<f64>,
}

/// What the bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreResult {
    pub rows: Vec<RestoreRow>,
    pub limits: Option<Limits>,
    pub order: Order,
    pub aa: Option<AaControl>,
    /// The mc strategy `auto` ran.
    pub strategy: String,
    pub notes: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Method {
    Read,
    Memcpy,
    Foliokit,
    Named,
    Lazy,
    /// The lazy fill waited for before anything runs.
    LazyWait,
    Prealloc,
    Populate,
    /// The `Foliokit`, `Lazy` and `LazyWait` rows from the snapshot with
    /// zero folios.
    FoliokitZero,
    LazyZero,
    LazyWaitZero,
    /// Guest memory in a process playing Firecracker, served by this one
    /// (see `external.rs`): foliokit's fill with the VMM's vCPUs
    /// touching, the same touching nothing, one fault at a time with the
    /// vCPUs touching, and the fill of the zero-share snapshot.
    External,
    ExternalWait,
    ExternalOneAtATime,
    ExternalWaitZero,
    Probe(Probe),
}

impl Method {
    /// Whether it restores the snapshot with zero folios.
    fn zeros(self) -> bool {
        matches!(
            self,
            Method::FoliokitZero
                | Method::LazyZero
                | Method::LazyWaitZero
                | Method::ExternalWaitZero
        )
    }

    /// How an external-handler row serves and what its vCPUs touch.
    fn external(self) -> Option<(external::Server, external::Touch)> {
        use external::{Server, Touch};
        match self {
            Method::External => Some((Server::Foliokit, Touch::Sparse)),
            Method::ExternalWait | Method::ExternalWaitZero => {
                Some((Server::Foliokit, Touch::None))
            }
            Method::ExternalOneAtATime => Some((Server::OneAtATime, Touch::All)),
            _ => None,
        }
    }
}

#[derive(Default, Clone)]
pub(super) struct Sample {
    start: f64,
    resident: f64,
    lat: Vec<f64>,
    faulted: u64,
    filled: u64,
    faults: u64,
    zero: u64,
    thp: f64,
    longest: Option<f64>,
}

fn percentile(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    Some(v[i])
}

struct State {
    plan: RestorePlan,
    file: File,
    /// The snapshot with zero folios (a zero share asked for).
    zfile: Option<File>,
    /// Their paths (the external rows' VMM maps them to check).
    paths: (PathBuf, Option<PathBuf>),
    guest: Option<Region>,
    probe_buf: Region,
    named: CopyStrategy,
    samples: Vec<Vec<Sample>>,
    methods: Vec<Method>,
    seed: u64,
}

impl State {
    fn check(&self, what: &'static str, g: &Region, zeros: bool) -> Result<(), RestoreError> {
        let s = g.as_slice();
        let f = if zeros { self.plan.zero_fraction } else { 0.0 };
        let mut off = 0;
        while off < s.len() {
            let want = |o: usize| {
                if zero_folio(o / FOLIO, f) {
                    0
                } else {
                    byte_at(o)
                }
            };
            for k in [0, 4093, FOLIO - 1] {
                let o = (off + k).min(s.len() - 1);
                if s[o] != want(o) {
                    return Err(RestoreError::Wrong(what, o));
                }
            }
            off += FOLIO;
        }
        Ok(())
    }

    /// The snapshot mapped afresh, as a VMM restoring maps it: its page
    /// tables are part of every restore's cost.
    /// `zeros`: the snapshot with zero folios.
    fn map_snapshot(&self, zeros: bool) -> Result<Source, RestoreError> {
        let file = match (&self.zfile, zeros) {
            (Some(z), true) => z,
            _ => &self.file,
        };
        Source::map_file(file, self.plan.size).map_err(|source| RestoreError::Io {
            what: "map",
            source,
        })
    }

    /// Folios whose source reads all zero (holes, or zero bytes found
    /// by reading them until their first nonzero byte) are skipped: guest
    /// RAM is fresh (unpopulated anonymous or hugetlb memory), which reads
    /// zero.
    fn eager_mc(
        &self,
        g: &mut Region,
        strategy: CopyStrategy,
        zeros: bool,
    ) -> Result<(), RestoreError> {
        let map = self.map_snapshot(zeros)?;
        // SAFETY: the source maps the whole snapshot readable while `map`
        // lives; a page that faults counts as data (the copy reports it).
        let pieces = unsafe {
            map.holes()
                .zero_pieces(map.as_ptr(), 0, self.plan.size as u64, FOLIO as u64)
        };
        let data: Vec<usize> = pieces
            .iter()
            .filter(|p| !p.2)
            .flat_map(|&(s, n, _)| (s as usize / FOLIO)..((s + n) as usize).div_ceil(FOLIO))
            .collect();
        let n = data.len();
        if n == 0 {
            return Ok(());
        }
        let (_, f) = foliokit::mc::mc_routine(
            strategy,
            Shape::batch(FOLIO, n, Reuse::Stream).on_channels(self.plan.channels),
        )?;
        let pool = foliokit::channels::shared(self.plan.channels)?;
        let base = g.as_mut_ptr();
        let dsts: Vec<*mut u8> = data.iter().map(|&i| base.wrapping_add(i * FOLIO)).collect();
        let srcs: Vec<*const u8> = data
            .iter()
            .map(|&i| map.as_ptr().wrapping_add(i * FOLIO))
            .collect();
        // SAFETY: guest RAM is our fresh region, the source our mapping of
        // the snapshot (same size); folios are disjoint; a faulting source
        // page is reported, not fatal.
        let out = unsafe { pool.submit_copy_mc(&dsts, &srcs, FOLIO, f) }?.wait();
        if let Some(x) = out.failed.first() {
            return Err(RestoreError::Wrong(
                "foliokit (source fault)",
                data[x.folio] * FOLIO,
            ));
        }
        Ok(())
    }

    /// The lazy restore into `g`: with `touch`, a simulated vCPU touches
    /// guest RAM while the fill runs; without, the caller waits for the
    /// fill before anything runs (an eager restore through the fill).
    fn lazy(&mut self, g: &mut Region, touch: bool, zeros: bool) -> Result<Sample, RestoreError> {
        let size = self.plan.size;
        let t0 = Instant::now();
        let src = self.map_snapshot(zeros)?;
        let opts = LazyOptions {
            latency_budget: self.plan.budget,
            channels: self.plan.channels,
            serve_during_batches: self.plan.serve_during_batches,
            ..LazyOptions::default()
        };
        let seg = Segment {
            addr: g.as_mut_ptr() as usize,
            len: size,
            offset: 0,
        };
        // SAFETY: a fresh region of ours, untouched; nobody else uses it
        // until the fill ends (the vCPU thread below only reads it).
        let h = unsafe { fill_lazily(&[seg], src, &opts) }?;
        if !touch {
            let r = h.wait();
            let secs = t0.elapsed().as_secs_f64();
            return Ok(Sample {
                start: secs,
                resident: secs,
                faulted: r.progress.faulted_pages,
                filled: r.progress.filled_pages,
                faults: r.progress.faults,
                zero: r.progress.zero_pages,
                longest: Some(r.longest_batch_us),
                ..Sample::default()
            });
        }
        let start = t0.elapsed().as_secs_f64();
        let done = AtomicBool::new(false);
        let base = seg.addr;
        self.seed = self.seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let seed = self.seed;
        let (lat, r) = std::thread::scope(|s| {
            let vcpu = s.spawn(|| {
                let n = size / FOLIO;
                let mut order: Vec<usize> = (0..n).collect();
                let mut x = seed | 1;
                let mut next = || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                for i in (1..n).rev() {
                    order.swap(i, next() as usize % (i + 1));
                }
                let mut lat = Vec::with_capacity(n);
                for f in order {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    let at = base + f * FOLIO + (next() as usize % (FOLIO / 4096)) * 4096;
                    let t = Instant::now();
                    // SAFETY: inside guest RAM; a volatile read, as a vCPU
                    // would touch it (it waits for the fill there).
                    let v = unsafe { std::ptr::read_volatile(at as *const u8) };
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                    std::hint::black_box(v);
                }
                lat
            });
            let r = h.wait();
            done.store(true, Ordering::Relaxed);
            (vcpu.join().unwrap_or_default(), r)
        });
        let p = r.progress;
        Ok(Sample {
            start,
            resident: t0.elapsed().as_secs_f64(),
            lat,
            faulted: p.faulted_pages,
            filled: p.filled_pages,
            faults: p.faults,
            zero: p.zero_pages,
            thp: 0.0,
            longest: Some(r.longest_batch_us),
        })
    }

    fn body(&mut self, c: usize) -> Result<(), RestoreError> {
        let m = self.methods[c];
        if let Method::Probe(p) = m {
            probe(p, self.probe_buf.as_mut_slice(), self.plan.channels, FOLIO)?;
            return Ok(());
        }
        if let Some((server, touch)) = m.external() {
            let exe = self
                .plan
                .vmm_exe
                .clone()
                .expect("external rows only with a VMM program");
            let snap = match m.zeros() {
                true => self.paths.1.clone().expect("a zero-share snapshot"),
                false => self.paths.0.clone(),
            };
            let sample = external::sample(&self.plan, &exe, &snap, server, touch)?;
            self.samples[c].push(sample);
            return Ok(());
        }
        let mut g = self.guest.take().expect("prepared");
        let t0 = Instant::now();
        let mut sample = match m {
            Method::Read => {
                let mut at = 0;
                while at < self.plan.size {
                    let n = READ_CHUNK.min(self.plan.size - at);
                    // SAFETY: guest RAM is our own region, `n` bytes at `at`
                    // are inside it.
                    let buf = unsafe { std::slice::from_raw_parts_mut(g.as_mut_ptr().add(at), n) };
                    self.file
                        .read_exact_at(buf, at as u64)
                        .map_err(|source| RestoreError::Io {
                            what: "read",
                            source,
                        })?;
                    at += n;
                }
                Sample::default()
            }
            Method::Memcpy => {
                let map = self.map_snapshot(false)?;
                // SAFETY: the mapping and the region are disjoint and both
                // `size` bytes long; the file is not truncated meanwhile.
                unsafe { libc::memcpy(g.as_mut_ptr().cast(), map.as_ptr().cast(), self.plan.size) };
                Sample::default()
            }
            // The same copy; `prepare` faulted prealloc's guest RAM in.
            Method::Foliokit | Method::Prealloc | Method::FoliokitZero => {
                self.eager_mc(&mut g, CopyStrategy::Auto, m.zeros())?;
                Sample::default()
            }
            Method::Named => {
                self.eager_mc(&mut g, self.named, false)?;
                Sample::default()
            }
            Method::Lazy | Method::LazyZero => self.lazy(&mut g, true, m.zeros())?,
            Method::LazyWait | Method::LazyWaitZero => self.lazy(&mut g, false, m.zeros())?,
            Method::Populate => {
                foliokit::mem::populate(g.as_mut_slice(), self.plan.channels)?;
                Sample::default()
            }
            Method::Probe(_)
            | Method::External
            | Method::ExternalWait
            | Method::ExternalOneAtATime
            | Method::ExternalWaitZero => unreachable!("handled above"),
        };
        let secs = t0.elapsed().as_secs_f64();
        if !matches!(
            m,
            Method::Lazy | Method::LazyWait | Method::LazyZero | Method::LazyWaitZero
        ) {
            sample.start = secs;
            sample.resident = secs;
        }
        let start = g.as_ptr() as usize;
        // Unreadable smaps: no THP seen, as before. Hugetlb pages are
        // huge by construction (smaps counts them elsewhere).
        let huge = if self.plan.hugetlb {
            g.len()
        } else {
            anon_huge_bytes(None, start, start + g.len()).unwrap_or(0)
        };
        sample.thp = huge as f64 / g.len() as f64;
        if m != Method::Populate {
            self.check(name(m, self.named), &g, m.zeros())?;
        }
        self.samples[c].push(sample);
        drop(g);
        Ok(())
    }

    fn prepare(&mut self, c: usize) -> Result<(), RestoreError> {
        if let Method::Probe(_) = self.methods[c] {
            return Ok(());
        }
        self.guest = None;
        if self.plan.cold {
            // SAFETY: advice on our own descriptor; pages are clean (synced).
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        if self.methods[c].external().is_some() {
            // The guest is the VMM's (from the pool, on hugetlb).
            return Ok(());
        }
        let populate = self.methods[c] == Method::Prealloc;
        self.guest = Some(match (self.plan.hugetlb, populate) {
            (true, _) => Region::hugetlb(self.plan.size, FOLIO, populate)?,
            (false, true) => Region::new(self.plan.size, FOLIO)?,
            (false, false) => Region::unpopulated(self.plan.size, FOLIO)?,
        });
        Ok(())
    }
}

fn name(m: Method, named: CopyStrategy) -> &'static str {
    match m {
        Method::Read => "read(2)",
        Method::Memcpy => "mmap+memcpy",
        Method::Foliokit => "foliokit",
        Method::Named => match named {
            CopyStrategy::Movsb => "foliokit (movsb)",
            CopyStrategy::Avx2 => "foliokit (avx2)",
            CopyStrategy::Nt => "foliokit (nt)",
            _ => "foliokit (named)",
        },
        Method::Lazy => "lazy",
        Method::LazyWait => "lazy + wait",
        Method::Prealloc => "foliokit, prealloc",
        Method::Populate => "populate only",
        Method::FoliokitZero => "foliokit, zero share",
        Method::LazyZero => "lazy, zero share",
        Method::LazyWaitZero => "lazy + wait, zero share",
        Method::External => "handler: foliokit",
        Method::ExternalWait => "handler: foliokit, no touch",
        Method::ExternalOneAtATime => "handler: one fault at a time",
        Method::ExternalWaitZero => "handler: foliokit, no touch, zero share",
        Method::Probe(p) => p.name(),
    }
}

/// Runs the bench; `tick` after every timed call (progress).
pub fn run(plan: RestorePlan, mut tick: impl FnMut()) -> Result<RestoreResult, RestoreError> {
    if plan.size == 0 || plan.size % FOLIO != 0 {
        return Err(RestoreError::Plan(format!(
            "the guest size must be a non-zero multiple of 2 MiB, not {}",
            plan.size
        )));
    }
    // Guest RAM and the snapshot in the page cache (on hugetlb the guest
    // comes from the pool), and the file's room on disk: refused before
    // anything is written.
    crate::prepare::check_shape(plan.size, &[FOLIO], if plan.hugetlb { 1 } else { 2 })
        .map_err(|e| RestoreError::Plan(e.to_string()))?;
    // The second snapshot's data: its zero folios take no room.
    let zero_data = (plan.size as f64 * (1.0 - plan.zero_fraction)) as usize;
    check_disk(
        &plan.dir,
        plan.size
            + if plan.zero_fraction > 0.0 {
                if plan.dense_zeros {
                    plan.size
                } else {
                    zero_data
                }
            } else {
                0
            },
    )?;
    // Held for the run: every guest, one at a time, comes from the pool.
    let grant = if plan.hugetlb {
        HugetlbGrant::reserve(FOLIO, plan.size / FOLIO).map_err(RestoreError::Plan)?
    } else {
        None
    };
    let path = plan
        .dir
        .join(format!("foliokit-restore-{}.snap", std::process::id()));
    if !(0.0..1.0).contains(&plan.zero_fraction) {
        return Err(RestoreError::Plan(format!(
            "the zero share must be at least 0 and below 1, not {}",
            plan.zero_fraction
        )));
    }
    let file = write_snapshot(&path, plan.size, 0.0, false)?;
    let zpath = plan
        .dir
        .join(format!("foliokit-restore-{}-zero.snap", std::process::id()));
    let zfile = if plan.zero_fraction > 0.0 {
        Some(write_snapshot(
            &zpath,
            plan.size,
            plan.zero_fraction,
            plan.dense_zeros,
        )?)
    } else {
        None
    };
    let (named, _) = foliokit::mc::mc_routine(
        CopyStrategy::Auto,
        Shape::batch(FOLIO, plan.size / FOLIO, Reuse::Stream).on_channels(plan.channels),
    )?;
    let probe_len = plan.size.min(PROBE_MAX);
    let probe_buf = Region::new(probe_len, FOLIO)?;
    let mut methods: Vec<Method> = vec![
        Method::Read,
        Method::Memcpy,
        Method::Foliokit,
        Method::Named,
        Method::Lazy,
        Method::LazyWait,
        Method::Prealloc,
        Method::Populate,
        Method::Probe(Probe::Read),
        Method::Probe(Probe::WriteZero),
        Method::Probe(Probe::Write),
    ];
    if zfile.is_some() {
        methods.extend([Method::FoliokitZero, Method::LazyZero, Method::LazyWaitZero]);
    }
    if plan.vmm_exe.is_some() {
        methods.extend([
            Method::External,
            Method::ExternalWait,
            Method::ExternalOneAtATime,
        ]);
        if zfile.is_some() {
            methods.push(Method::ExternalWaitZero);
        }
    }
    let order = Order::new(methods.len(), plan.loops);
    let mut st = State {
        samples: vec![Vec::new(); methods.len()],
        methods: methods.clone(),
        plan: plan.clone(),
        // The files are unlinked once written: the VMM opens them
        // through this process's descriptors.
        paths: (fd_path(&file), zfile.as_ref().map(fd_path)),
        file,
        zfile,
        guest: None,
        probe_buf,
        named,
        seed: 0x5eed,
    };
    let secs = run_interleaved(&order, &mut st, State::prepare, State::body, &mut tick)?;
    let at = |m: Method| {
        methods
            .iter()
            .position(|&x| x == m)
            .expect("a method of the plan")
    };
    let size = plan.size;
    let limits = Limits::from_secs(
        LimitOp::Copy,
        Stores::Streaming,
        probe_len,
        &[
            secs[at(Method::Probe(Probe::Read))].clone(),
            secs[at(Method::Probe(Probe::WriteZero))].clone(),
            secs[at(Method::Probe(Probe::Write))].clone(),
        ],
    );
    // Timed passes only: the warm-up's sample is the first.
    let timed = |c: usize| -> Vec<Sample> { st.samples[c][1..].to_vec() };
    let gb = |s: &Sample| crate::measure::gbps(size, s.resident);
    let limits = limits.map(|l| {
        // Copies between mapped buffers, as the probes are: rows that
        // also fault guest RAM in cannot set it (they only miss it).
        [Method::Named, Method::Prealloc].iter().fold(l, |l, &m| {
            let c = at(m);
            let rates: Vec<f64> = timed(c).iter().map(gb).collect();
            l.raise(name(methods[c], named), &rates)
        })
    });
    let limit = limits.as_ref().map_or(f64::NAN, Limits::gbps);
    let mut rows = Vec::new();
    for (c, &m) in methods.iter().enumerate() {
        if let Method::Probe(_) = m {
            continue;
        }
        let s = timed(c);
        let last = s.last().cloned().unwrap_or_default();
        let mut lat: Vec<f64> = s.iter().flat_map(|x| x.lat.iter().copied()).collect();
        let touches = lat.len();
        // A pass's percentile, then the median of those over passes.
        let per_pass = |p: f64| {
            let each: Vec<f64> = s
                .iter()
                .filter_map(|x| percentile(&mut x.lat.clone(), p))
                .collect();
            Stats::of(&each).map(|st| st.median)
        };
        let g = Stats::of(&s.iter().map(gb).collect::<Vec<_>>());
        let stats = |f: &dyn Fn(&Sample) -> f64| Stats::of(&s.iter().map(f).collect::<Vec<_>>());
        let (Some(start), Some(resident), Some(gbps)) =
            (stats(&|x| x.start), stats(&|x| x.resident), g)
        else {
            continue;
        };
        rows.push(RestoreRow {
            function: name(m, named).into(),
            // A copy's limit says nothing of the kernel's faults alone.
            share: if m == Method::Populate {
                f64::NAN
            } else {
                gbps.median / limit
            },
            start_secs: start,
            resident_secs: resident,
            gbps,
            touch_p50_us: per_pass(0.5),
            touch_p99_us: per_pass(0.99),
            touch_p99_pooled_us: percentile(&mut lat, 0.99),
            touches,
            faulted_pages: last.faulted,
            filled_pages: last.filled,
            faults: last.faults,
            zero_pages: last.zero,
            thp_share: last.thp,
            longest_batch_us: last.longest,
        });
    }
    let aa = AaControl::of(
        "foliokit",
        &secs[at(Method::Foliokit)],
        name(Method::Named, named),
        &secs[at(Method::Named)],
        size,
        true,
    );
    let mut notes = Vec::new();
    notes.extend(crate::measure::fresh_memory_note());
    if plan.hugetlb {
        notes.push(match &grant {
            Some(g) => format!(
                "guest RAM: 2 MiB hugetlb pages; the pool was grown by {} pages for this run",
                g.added()
            ),
            None => "guest RAM: 2 MiB hugetlb pages from the pool".into(),
        });
    }
    drop(grant);
    if plan.cold {
        notes.push("cold: the snapshot was dropped from the page cache before every restore (posix_fadvise DONTNEED)".into());
    }
    Ok(RestoreResult {
        rows,
        limits,
        order,
        aa,
        strategy: foliokit::Strategy::name(named).into(),
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_restore_bench_runs_every_row_and_checks_bytes() {
        let plan = RestorePlan {
            size: 16 << 20,
            channels: 2,
            loops: 1,
            cold: false,
            budget: Duration::from_millis(1),
            dir: std::env::temp_dir(),
            serve_during_batches: false,
            hugetlb: false,
            zero_fraction: 0.5,
            dense_zeros: false,
            vmm_exe: None,
            vmm_wait: None,
            handler_block: FOLIO,
        };
        match run(plan, || {}) {
            Ok(r) => {
                assert_eq!(r.rows.len(), METHODS - 3 + ZERO_METHODS);
                let z = r
                    .rows
                    .iter()
                    .find(|x| x.function == "lazy + wait, zero share");
                // Half of 8 folios of 512 pages, as holes, none read.
                assert_eq!(z.unwrap().zero_pages, 4 * 512);
                assert!(r.limits.is_some());
                let lazy = r.rows.iter().find(|x| x.function == "lazy").unwrap();
                assert!(lazy.touches > 0);
            }
            Err(RestoreError::Lazy(LazyError::Refused(why))) => {
                eprintln!("SKIP: lazy restore unavailable here: {why}")
            }
            Err(RestoreError::Mem(e)) => eprintln!("SKIP: no THP guest here: {e}"),
            Err(e) => panic!("{e}"),
        }
    }
}

//! Lazy restore: the vCPUs run at once, guest RAM fills in on touch and in
//! the background ([`foliokit::lazy`] holds the mechanism and its
//! correctness argument).

use std::fs::File;
use std::marker::PhantomData;
use std::path::Path;
use std::time::Instant;

use foliokit::lazy::{fill_lazily, LazyFill, Segment};
pub use foliokit::lazy::{BadOutcome, LazyOptions, LazyProgress, LazyReport};
use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestMemoryRegion as _};

use crate::snapshot::lazy_plan;
use crate::{io_err, pieces, BadRange, Error, Result};

/// How to restore lazily.
#[derive(Debug, Clone, Default)]
pub struct LazyRestoreOptions {
    /// The fill's options (its `first` and `skip` are set from the
    /// snapshot and [`LazyRestoreOptions::first`]).
    pub fill: LazyOptions,
    /// Guest addresses whose folios are filled first, in this order (e.g.
    /// pages touched right after the last restore); the rest follows in
    /// address order.
    pub first: Vec<GuestAddress>,
}

/// A lazy restore in progress: the vCPUs may run. Borrows the guest
/// memory, which must stay mapped until the fill ends; dropping the handle
/// waits for it ([`LazyRestore::wait`]).
#[derive(Debug)]
pub struct LazyRestore<'m> {
    fill: LazyFill,
    /// (host address, guest address, length) of every restored region.
    map: Vec<(usize, u64, usize)>,
    bad_at_save: Vec<BadRange>,
    trailer_missing: bool,
    start_secs: f64,
    _mem: PhantomData<&'m ()>,
}

/// What a lazy restore did.
#[derive(Debug, Clone, PartialEq)]
pub struct LazyRestoreReport {
    /// The fill's report (host addresses).
    pub fill: LazyReport,
    /// Guest ranges whose snapshot bytes could not be read (truncated
    /// file, poison): never filled. What touching them gives is
    /// [`LazyReport::bad_outcome`] (SIGBUS `BUS_MCEERR_AR` where the kernel
    /// can install poison markers).
    pub bad: Vec<BadRange>,
    /// Guest ranges the snapshot recorded as unreadable at save: they read
    /// zeros (as the eager restore leaves them); their whole pages are
    /// never filled, a page they cover in part is filled from the snapshot
    /// (which holds zeros for them).
    pub bad_at_save: Vec<BadRange>,
    /// The snapshot's trailer could not be read (see
    /// [`crate::RestoreReport::trailer_missing`]).
    pub trailer_missing: bool,
    /// Seconds [`restore_lazy`] took before the vCPUs could run.
    pub start_secs: f64,
}

impl LazyRestore<'_> {
    /// Counts so far.
    pub fn progress(&self) -> LazyProgress {
        self.fill.progress()
    }

    /// Stops the background fill: what was filled stays, the rest faults
    /// in on touch or is filled by [`LazyRestore::wait`].
    pub fn cancel(&self) {
        self.fill.cancel()
    }

    /// Seconds [`restore_lazy`] took before returning.
    pub fn start_secs(&self) -> f64 {
        self.start_secs
    }

    /// Fills the rest, unregisters guest RAM (plain memory again) and
    /// reports, in guest addresses.
    pub fn wait(self) -> LazyRestoreReport {
        let LazyRestore {
            fill,
            map,
            bad_at_save,
            trailer_missing,
            start_secs,
            ..
        } = self;
        let report = fill.wait();
        // The fill merges bad ranges contiguous in host addresses, which may
        // run across adjacent mappings of distant guest regions: split them
        // per region, then list them in guest order as the eager restore.
        let mut parts: Vec<_> = report
            .bad
            .iter()
            .flat_map(|b| {
                split(&map, Side::Host, b.addr as u64, b.len as u64)
                    .map(move |(_, g, len)| (g, len as u64, b.kind))
            })
            .collect();
        parts.sort_by_key(|p| p.0);
        let mut bad = Vec::new();
        for (g, len, kind) in parts {
            crate::push_bad(&mut bad, g, len, kind);
        }
        LazyRestoreReport {
            fill: report,
            bad,
            bad_at_save,
            trailer_missing,
            start_secs,
        }
    }
}

/// Restores a snapshot from `file` into `mem` lazily and returns at once:
/// the VMM may start its vCPUs. Each first touch of a guest page (by a
/// vCPU, or by a device thread's `read(2)` into guest RAM) waits until its
/// folio is filled from the snapshot; the rest is filled in the background
/// within the latency budget; see [`foliokit::lazy`] for the guarantees.
///
/// Guest RAM the snapshot covers must be untouched (no page resident yet:
/// checked, [`Error::NotEmpty`]); every snapshot region must lie inside one
/// guest region ([`Error::Layout`]). The restored ranges are marked dirty in
/// the regions' bitmaps at once (except those bad at save). Where the
/// kernel or the process cannot do this, returns
/// [`Error::Lazy`] with [`foliokit::lazy::LazyError::Refused`] saying what
/// is missing, before anything is touched: restore eagerly
/// ([`crate::restore_from_file`]) then.
pub fn restore_lazy<'m, B: Bitmap>(
    mem: &'m GuestMemoryMmap<B>,
    file: &File,
    opts: &LazyRestoreOptions,
) -> Result<LazyRestore<'m>> {
    let t0 = Instant::now();
    let plan = lazy_plan(file)?;
    let mut segments = Vec::with_capacity(plan.regions.len());
    let mut map = Vec::with_capacity(plan.regions.len());
    let mut targets = Vec::new();
    for &(g, l, o) in &plan.regions {
        let layout = || Error::Layout {
            addr: GuestAddress(g),
            len: l,
        };
        let parts = pieces(mem, GuestAddress(g), l).map_err(|_| layout())?;
        if parts.len() > 1 {
            return Err(layout());
        }
        let Some(p) = parts.into_iter().next() else {
            continue;
        };
        let resident = foliokit::mem::resident_pages(p.host, p.len)
            .map_err(io_err("checking guest RAM is empty"))?;
        if resident != 0 {
            return Err(Error::NotEmpty {
                addr: GuestAddress(g),
                resident,
            });
        }
        segments.push(Segment {
            addr: p.host as usize,
            len: p.len,
            offset: o,
        });
        map.push((p.host as usize, g, p.len));
        targets.push(p);
    }
    let host_of = |a: GuestAddress| {
        map.iter()
            .find(|&&(_, g, l)| a.0 >= g && a.0 < g + l as u64)
            .map(|&(h, g, _)| h + (a.0 - g) as usize)
    };
    let mut fill = opts.fill.clone();
    fill.first = opts.first.iter().filter_map(|&a| host_of(a)).collect();
    // Each bad range as the eager restore reads it: its part in each
    // region (host addresses are contiguous only within one), rounded in to
    // whole pages, since the fill skips whole pages and the eager restore
    // writes every byte outside the range (the snapshot holds zeros for
    // the range's own bytes, so filling a partly bad page is what eager
    // leaves in fresh guest RAM).
    let page = foliokit::batch::page_size();
    fill.skip = plan
        .bad_at_save
        .iter()
        .flat_map(|b| split(&map, Side::Guest, b.addr.0, b.len))
        .filter_map(|(h, _, len)| {
            let lo = h.div_ceil(page) * page;
            let hi = (h + len) / page * page;
            (lo < hi).then(|| (lo, hi - lo))
        })
        .collect();
    // SAFETY: the segments are guest RAM regions borrowed for 'm (the
    // handle cannot outlive `mem`, and dropping it waits for the fill),
    // checked empty just above; vm-memory maps them private anonymous or
    // from a file/memfd the VMM chose, which a userfaultfd refuses at
    // registration if it cannot serve it. No reference to guest RAM is
    // held by this crate; guest RAM holds no futex or robust list of the
    // VMM. The source is a mapping the plan owns.
    let handle = unsafe { fill_lazily(&segments, plan.source, &fill) }.map_err(Error::Lazy)?;
    for p in &targets {
        let g = p.addr.0;
        let bitmap = p.region.bitmap();
        let mut at = g;
        let end = g + p.len as u64;
        for b in plan
            .bad_at_save
            .iter()
            .filter(|b| b.addr.0 < end && b.addr.0 + b.len > g)
        {
            if b.addr.0 > at {
                bitmap.mark_dirty(p.offset + (at - g) as usize, (b.addr.0 - at) as usize);
            }
            at = at.max(b.addr.0 + b.len);
        }
        if at < end {
            bitmap.mark_dirty(p.offset + (at - g) as usize, (end - at) as usize);
        }
    }
    Ok(LazyRestore {
        fill: handle,
        map,
        bad_at_save: plan.bad_at_save,
        trailer_missing: plan.trailer_missing,
        start_secs: t0.elapsed().as_secs_f64(),
        _mem: PhantomData,
    })
}

/// Which address space [`split`] is given a range in.
#[derive(Clone, Copy)]
enum Side {
    Host,
    Guest,
}

/// The parts of `[start, start + len)` (host or guest addresses, per
/// `side`) in each `(host, guest, length)` mapping of `map`, as
/// `(host, guest, length)`.
fn split(
    map: &[(usize, u64, usize)],
    side: Side,
    start: u64,
    len: u64,
) -> impl Iterator<Item = (usize, u64, usize)> + '_ {
    let end = start.saturating_add(len);
    map.iter().filter_map(move |&(h, g, l)| {
        let base = match side {
            Side::Host => h as u64,
            Side::Guest => g,
        };
        let (lo, hi) = (start.max(base), end.min(base + l as u64));
        (lo < hi).then(|| {
            let d = lo - base;
            (h + d as usize, g + d, (hi - lo) as usize)
        })
    })
}

/// [`restore_lazy`] from the file at `path` (the file may be closed once
/// this returns: the fill keeps its own mapping).
pub fn restore_lazy_from_path<'m, B: Bitmap>(
    mem: &'m GuestMemoryMmap<B>,
    path: impl AsRef<Path>,
    opts: &LazyRestoreOptions,
) -> Result<LazyRestore<'m>> {
    let file = File::open(path).map_err(io_err("opening the snapshot file"))?;
    restore_lazy(mem, &file, opts)
}

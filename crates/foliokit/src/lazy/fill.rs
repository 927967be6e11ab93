//! The fill thread: serves faults, fills in the background, ends by
//! unregistering. The ordering argument is in the module docs (mod.rs).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::map::Map;
use super::park::{Active, Parked};
use super::remap::Remaps;
use super::{
    BadOutcome, LazyBad, LazyError, LazyFill, LazyOptions, LazyRefusal, LazyReport, Segment,
    Shared, Source,
};
use crate::batch::page_size;
use crate::budget::BatchController;
use crate::channels::{BatchOutcome, ChannelPool, InFlight};
use crate::copy::CopyStrategy;
use crate::mc::{FaultKind, McCopyFn, McError};
use crate::sys::errno;
use crate::sys::maps::{self, MapLine};
use crate::sys::uffd::{self, Msg, Uffd};
use crate::tune::Shape;
use crate::uffd::child::{fill_child, Fill, Owed};

const EVENTS: u64 = uffd::FEATURE_EVENT_FORK
    | uffd::FEATURE_EVENT_REMAP
    | uffd::FEATURE_EVENT_REMOVE
    | uffd::FEATURE_EVENT_UNMAP;

/// One segment as the fill sees it.
#[derive(Debug)]
struct Seg {
    addr: usize,
    len: usize,
    offset: u64,
    /// Install unit: the base page, or the huge page size on hugetlb.
    unit: usize,
    /// Private anonymous memory `UFFDIO_MOVE` can fill folio by folio.
    movable: bool,
    /// Global index of its first base page.
    first_page: usize,
}

/// A folio-aligned window of one segment: what one fill installs.
#[derive(Debug, Clone, Copy)]
struct Block {
    start: usize,
    len: usize,
    seg: u32,
}

/// Whether work in a background batch should stop for a message: a fork
/// waits, or a message waits (on `watch`, the userfaultfd) and the batch
/// has run until `from` (its least run).
fn cut_due(watch: Option<&OwnedFd>, from: Instant) -> bool {
    crate::uffd::gate::fork_waits()
        || watch.is_some_and(|fd| {
            Instant::now() >= from
                && crate::sys::poll::readable([fd.as_raw_fd()], Some(Duration::ZERO))[0]
        })
}

/// What [`Filler::copy_parallel`] did with one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    /// Not offered (see [`Filler::offerable`]).
    NotOffered,
    /// Offered, but the runs stopped before it: a message or a fork
    /// waits, or a run's call failed.
    Unstarted,
    /// Installed whole by one call (bytes).
    Finished(usize),
    /// The call ended early (bytes installed before the error).
    Stopped(usize),
}

/// A bit per base page.
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 != 0
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn any(&self, i: usize, n: usize) -> bool {
        (i..i + n).any(|j| self.get(j))
    }
    fn all(&self, i: usize, n: usize) -> bool {
        (i..i + n).all(|j| self.get(j))
    }
}

/// The huge page size of the hugetlb mapping at `addr` (its smaps
/// `KernelPageSize`), or the base page.
fn kernel_page_size(addr: usize) -> usize {
    crate::sys::smaps::kernel_page_size(addr).map_or(page_size(), |size| size.max(page_size()))
}

/// Whether every mapping over `[addr, addr + len)` passes `ok` (from
/// /proc/self/maps, which walks no page tables).
fn every_mapping(addr: usize, len: usize, ok: impl Fn(&MapLine) -> bool) -> io::Result<bool> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    Ok(maps::parse(&text)
        .iter()
        .filter(|m| m.overlaps(addr, addr + len))
        .all(ok))
}

/// Whether every mapping over the range is private anonymous memory.
fn private_anon(addr: usize, len: usize) -> io::Result<bool> {
    every_mapping(addr, len, |m| m.private() && m.anon())
}

/// Whether every mapping over the range is private memory of the process
/// alone: anonymous, or private hugetlb (whose file is the kernel's).
/// What `MADV_DONTNEED` means there is "read zeros", as the fill assumes.
fn private_memory(addr: usize, len: usize) -> io::Result<bool> {
    every_mapping(addr, len, |m| {
        m.private() && (m.inode == 0 || m.path.starts_with("/anon_hugepage"))
    })
}

/// Opens the descriptor: all faults, the events, and MOVE and POISON where
/// the kernel has them. Returns it and the features granted.
fn open_uffd() -> Result<(Uffd, u64), LazyRefusal> {
    let o = Uffd::open_for(EVENTS, uffd::FEATURE_MOVE | uffd::FEATURE_POISON, false)?;
    Ok((o.uffd, o.features))
}

/// Checks, registers and starts the fill thread.
pub(super) fn start(
    segments: &[Segment],
    source: Source,
    opts: &LazyOptions,
) -> Result<LazyFill, LazyError> {
    let t0 = Instant::now();
    let page = page_size();
    // 0 and sizes below a page mean a page; 1 GiB is the largest folio
    // (PUD) a mapping has.
    if opts.folio_size > 1 << 30 || !opts.folio_size.max(1).is_power_of_two() {
        return Err(LazyError::BadSegment {
            addr: 0,
            len: opts.folio_size,
            why: "the folio size is not a power of two up to 1 GiB",
        });
    }
    let folio = opts.folio_size.max(page);
    let mut sorted: Vec<Segment> = segments.to_vec();
    sorted.sort_by_key(|s| s.addr);
    for (i, s) in sorted.iter().enumerate() {
        let bad = |why| LazyError::BadSegment {
            addr: s.addr,
            len: s.len,
            why,
        };
        if s.len == 0 || s.addr % page != 0 || s.len % page != 0 {
            return Err(bad("empty or not page-aligned"));
        }
        let end = s.addr.checked_add(s.len).ok_or_else(|| bad("wraps"))?;
        if sorted.get(i + 1).is_some_and(|n| n.addr < end) {
            return Err(bad("overlaps the next segment"));
        }
        let src_end = s.offset.checked_add(s.len as u64);
        if src_end.is_none_or(|e| e > source.len() as u64) {
            return Err(LazyError::SourceTooShort {
                addr: s.addr,
                end: src_end.unwrap_or(u64::MAX),
                mapped: source.len(),
            });
        }
    }
    let (copy_strategy, mc) = crate::mc::mc_routine(
        opts.strategy,
        Shape::batch(
            folio,
            crate::params::LAZY_MAX_BATCH_BYTES / folio,
            crate::Reuse::Stream,
        )
        .on_channels(opts.channels),
    )?;
    let pool = crate::channels::shared(opts.channels.max(1))?;
    // Counted as a fill thread before the first registration: a fork from
    // now on raises an event only the fill thread can read, so it must
    // wait in its prepare handler (before glibc takes the allocator's
    // locks) until that thread has started and parked; handed over to the
    // thread below, dropped on every error path.
    let active = Active::enter();
    let (uffd, features) = open_uffd()?;
    let mut segs = Vec::with_capacity(sorted.len());
    let mut blocks = Vec::new();
    let mut pages = 0;
    let mut any_movable = false;
    let mut unit_max = page;
    let mut poison = features & uffd::FEATURE_POISON != 0;
    for (i, s) in sorted.iter().enumerate() {
        if !opts.allow_shared_memory
            && !private_memory(s.addr, s.len).map_err(|source| LazyError::Sys {
                what: "read /proc/self/maps",
                source,
            })?
        {
            return Err(LazyRefusal::NotPrivate {
                addr: s.addr,
                len: s.len,
            }
            .into());
        }
        let ioctls =
            uffd.register_missing(s.addr, s.len)
                .map_err(|source| LazyRefusal::Register {
                    addr: s.addr,
                    len: s.len,
                    source,
                })?;
        poison &= ioctls & uffd::IOCTL_POISON != 0;
        uffd::require_ioctls(ioctls, uffd::IOCTL_COPY).map_err(LazyRefusal::from)?;
        // hugetlb ranges are offered the basic ioctls only (no
        // UFFDIO_ZEROPAGE); only then is smaps read (its page-table walk
        // over every mapping of the process costs milliseconds, while
        // the caller waits to start its vCPUs).
        let hugetlb = ioctls & uffd::IOCTL_ZEROPAGE == 0;
        let unit = if hugetlb {
            kernel_page_size(s.addr)
        } else {
            page
        };
        if s.addr % unit != 0 || s.len % unit != 0 {
            return Err(LazyError::BadSegment {
                addr: s.addr,
                len: s.len,
                why: "not aligned to its huge page size",
            });
        }
        unit_max = unit_max.max(unit);
        let movable = ioctls & uffd::IOCTL_MOVE != 0
            && folio > page
            && !hugetlb
            && private_anon(s.addr, s.len).map_err(|source| LazyError::Sys {
                what: "read /proc/self/maps",
                source,
            })?;
        any_movable |= movable;
        let block = folio.max(unit);
        let mut at = s.addr;
        while at < s.addr + s.len {
            let end = ((at / block + 1) * block).min(s.addr + s.len);
            blocks.push(Block {
                start: at,
                len: end - at,
                seg: i as u32,
            });
            at = end;
        }
        segs.push(Seg {
            addr: s.addr,
            len: s.len,
            offset: s.offset,
            unit,
            movable,
            first_page: pages,
        });
        pages += s.len / page;
    }
    let slots = (crate::params::LAZY_MAX_BATCH_BYTES / folio).max(1);
    let staging = if any_movable {
        // The batch slots, the fault slot, and room to align them.
        let m = Map::new((slots + 2) * folio, libc::PROT_READ | libc::PROT_WRITE).map_err(
            |source| LazyError::Sys {
                what: "mapping the staging area",
                source,
            },
        )?;
        // SAFETY: advice on our own mapping. DONTFORK: a forked child
        // needs none of it, and sharing its folios with a child would make
        // every later UFFDIO_MOVE out of it fail (-EBUSY: not exclusive),
        // sending the rest of the fill down the slower copy path.
        unsafe {
            libc::madvise(m.base as *mut libc::c_void, m.len, libc::MADV_HUGEPAGE);
            libc::madvise(m.base as *mut libc::c_void, m.len, libc::MADV_DONTFORK);
        }
        Some(m)
    } else {
        None
    };
    let watch = uffd.try_clone_fd().ok().map(Arc::new);
    let ended = crate::sys::event::Event::new().map_err(|source| LazyError::Sys {
        what: "making an eventfd",
        source,
    })?;
    let zero = Map::new(unit_max, libc::PROT_READ).map_err(|source| LazyError::Sys {
        what: "mapping the zero source",
        source,
    })?;
    let shared = Arc::new(Shared::default());
    shared.total.store(pages as u64, Ordering::Relaxed);
    shared
        .cancelled
        .store(opts.start_cancelled, Ordering::Relaxed);
    let nb = blocks.len();
    let mut f = Filler {
        uffd,
        poison,
        source: Arc::new(source),
        segs,
        state: vec![false; nb],
        pending: nb,
        removed: Bits::new(pages),
        bad_bits: Bits::new(pages),
        order: Vec::new(),
        cursor: 0,
        remaps: Remaps::default(),
        faults: VecDeque::new(),
        in_batch: false,
        serve_during: opts.serve_during_batches,
        ended,
        watch,
        least_run: opts
            .latency_budget
            .mul_f64(crate::params::LAZY_BATCH_LEAST_SHARE_OF_BUDGET),
        staging,
        slots,
        fault_slot_ready: false,
        zero,
        scratch: vec![0u8; unit_max],
        folio,
        page,
        pool,
        mc,
        strategy: copy_strategy,
        ctl: BatchController::new(
            opts.latency_budget
                .mul_f64(crate::params::LAZY_BATCH_SHARE_OF_BUDGET),
            crate::params::LAZY_START_BATCH_BYTES / page,
            folio / page,
            slots * folio / page,
        ),
        shared: shared.clone(),
        bad: Vec::new(),
        notes: Vec::new(),
        whole: 0,
        batches: 0,
        longest: Duration::ZERO,
        forks: 0,
        t0,
        blocks,
    };
    for &(a, l) in &opts.skip {
        f.discard(a, a.saturating_add(l), false);
    }
    let mut seen = vec![false; nb];
    for &a in &opts.first {
        if let Some(b) = f.block_of(a) {
            if !seen[b] {
                seen[b] = true;
                f.order.push(b as u32);
            }
        }
    }
    f.order
        .extend((0..nb as u32).filter(|&b| !seen[b as usize]));
    // Made before any fork can ask for it: parked, the fill thread must
    // not allocate (see `park`).
    let parked =
        Parked::new(crate::params::LAZY_PARKED_MESSAGES).map_err(|source| LazyError::Sys {
            what: "mapping room for messages read during a fork",
            source,
        })?;
    let thread = crate::worker::spawn_shielded("foliokit-lazy".into(), move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.run(active, parked)));
        if r.is_err() {
            // Registered ranges with nobody to serve them would hang
            // every thread that touches them; unregistering would
            // expose zeros. Neither is acceptable.
            eprintln!("foliokit: the lazy fill thread panicked; aborting");
            std::process::abort();
        }
    })
    .map_err(|source| LazyError::Sys {
        what: "starting the fill thread",
        source,
    })?;
    Ok(LazyFill {
        shared,
        thread: Some(thread),
        owner: std::process::id(),
    })
}

struct Filler {
    uffd: Uffd,
    poison: bool,
    source: Arc<Source>,
    segs: Vec<Seg>,
    blocks: Vec<Block>,
    /// Per block: done (filled, or nothing left to fill).
    state: Vec<bool>,
    pending: usize,
    /// Per base page: discarded, unmapped or skipped: never filled.
    removed: Bits,
    /// Per base page: the source could not be read.
    bad_bits: Bits,
    order: Vec<u32>,
    cursor: usize,
    remaps: Remaps,
    faults: VecDeque<usize>,
    /// A background batch is in flight (its slots and the channels busy).
    in_batch: bool,
    /// Serve faults outside a batch while it is in flight.
    serve_during: bool,
    /// Posted when a background batch ends: the fill thread waits for it
    /// and for the userfaultfd at once.
    ended: crate::sys::event::Event,
    /// How long a batch runs before a message may cut it short.
    least_run: Duration,
    /// The userfaultfd again, for the channels to poll between pieces
    /// (`None` where no descriptor was left for it). The only strong
    /// reference: batches hold weak ones.
    watch: Option<Arc<OwnedFd>>,
    staging: Option<Map>,
    slots: usize,
    /// The fault slot has its huge page already (see
    /// [`Filler::ready_fault_slot`]).
    fault_slot_ready: bool,
    zero: Map,
    scratch: Vec<u8>,
    folio: usize,
    page: usize,
    pool: Arc<ChannelPool>,
    mc: McCopyFn,
    strategy: CopyStrategy,
    ctl: BatchController,
    shared: Arc<Shared>,
    bad: Vec<LazyBad>,
    notes: Vec<String>,
    whole: u64,
    batches: u64,
    longest: Duration,
    forks: u64,
    t0: Instant,
}

impl Filler {
    fn seg_of(&self, addr: usize) -> Option<usize> {
        let i = self.segs.partition_point(|s| s.addr <= addr);
        let s = self.segs.get(i.checked_sub(1)?)?;
        (addr < s.addr + s.len).then_some(i - 1)
    }

    fn block_of(&self, addr: usize) -> Option<usize> {
        self.seg_of(addr)?;
        let i = self.blocks.partition_point(|b| b.start <= addr);
        Some(i - 1)
    }

    /// Global base-page index of an original address inside a segment.
    fn page_index(&self, seg: usize, addr: usize) -> usize {
        let s = &self.segs[seg];
        s.first_page + (addr - s.addr) / self.page
    }

    /// Where the source's bytes for original address `addr` are.
    fn src(&self, seg: usize, addr: usize) -> usize {
        self.source.as_ptr() as usize + self.src_offset(seg, addr)
    }

    /// The offset into the source of original address `addr`'s bytes.
    fn src_offset(&self, seg: usize, addr: usize) -> usize {
        let s = &self.segs[seg];
        s.offset as usize + (addr - s.addr)
    }

    fn mark_done(&mut self, b: usize) {
        if !self.state[b] {
            self.state[b] = true;
            self.pending -= 1;
        }
    }

    /// Marks the range `[start, end)` never to be filled (counted as
    /// skipped where it was still to fill): original addresses, or with
    /// `now_addresses` where its pages are now (an event's). Any range:
    /// only its part inside the segments is walked.
    fn discard(&mut self, start: usize, end: usize, now_addresses: bool) {
        let page = self.page;
        if now_addresses && !self.remaps.is_empty() {
            // Moved pages: each current address maps back on its own.
            let mut a = start / page * page;
            while a < end {
                if let Some(orig) = self.remaps.original(a) {
                    self.discard_page(orig);
                }
                let Some(next) = a.checked_add(page) else {
                    break;
                };
                a = next;
            }
            return;
        }
        let spans: Vec<(usize, usize)> = self
            .segs
            .iter()
            .map(|s| (start.max(s.addr) / page * page, end.min(s.addr + s.len)))
            .filter(|(lo, hi)| lo < hi)
            .collect();
        for (lo, hi) in spans {
            for a in (lo..hi).step_by(page) {
                self.discard_page(a);
            }
        }
    }

    /// [`Filler::discard`] of the page at original address `orig`.
    fn discard_page(&mut self, orig: usize) {
        let page = self.page;
        let Some(seg) = self.seg_of(orig) else { return };
        let i = self.page_index(seg, orig);
        let b = self.block_of(orig).expect("inside a segment");
        if !self.removed.get(i) {
            self.removed.set(i);
            if !self.state[b] {
                self.shared.skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
        let blk = self.blocks[b];
        let first = self.page_index(seg, blk.start);
        if !self.state[b] && self.removed.all(first, blk.len / page) {
            self.mark_done(b);
        }
    }

    /// Applies one message; faults are queued.
    fn apply(&mut self, m: Msg) {
        match m {
            Msg::Fault { addr } => self.faults.push_back(addr),
            Msg::Remove { start, end } | Msg::Unmap { start, end } => {
                self.discard(start, end, true)
            }
            Msg::Remap { from, to, len } => self.remaps.push(from, to, len),
            Msg::Fork(child) => self.fork(child),
        }
    }

    /// Reads and applies every waiting message.
    fn drain(&mut self) {
        match self.uffd.read_all() {
            Ok(msgs) => msgs.into_iter().for_each(|m| self.apply(m)),
            Err(e) => self.notes.push(format!("reading the userfaultfd: {e}")),
        }
    }

    /// A fork: fill the child's empty pages from the source.
    fn fork(&mut self, child: Uffd) {
        self.forks += 1;
        let page = self.page;
        let mut owed = Owed::default();
        let mut unit = page;
        // A wipe-on-fork child must see zeros there.
        let wipe: Vec<bool> = self
            .segs
            .iter()
            .map(|s| crate::sys::vma::wipes_on_fork(self.remaps.now(s.addr), s.len))
            .collect();
        for b in 0..self.blocks.len() {
            if self.state[b] {
                continue;
            }
            let blk = self.blocks[b];
            let seg = blk.seg as usize;
            if wipe[seg] {
                continue;
            }
            unit = unit.max(self.segs[seg].unit);
            let mut a = blk.start;
            while a < blk.start + blk.len {
                let i = self.page_index(seg, a);
                if !self.removed.get(i) {
                    let (dst, src) = (self.remaps.now(a), self.src(seg, a));
                    owed.push(dst, src, page, self.bad_bits.get(i));
                }
                a += page;
            }
        }
        let how = Fill {
            unit,
            poison: self.poison,
        };
        let keep = self.source.clone();
        let spawned = crate::worker::spawn_shielded("foliokit-lazy-child".into(), move || {
            fill_child(child, owed, how);
            drop(keep);
        });
        if let Err(e) = spawned {
            self.notes.push(format!(
                "could not fill a forked child ({e}); its unfilled pages read zeros"
            ));
        }
    }

    fn run(mut self, active: Active, mut parked: Parked) {
        loop {
            if active.fork_pending() {
                let u = &self.uffd;
                active.park(|| {
                    // No allocation here: a fork holds the allocator's
                    // locks until we read its event.
                    let _ = u.read_each(|m| parked.push(m));
                    u.poll(1);
                });
                let dropped = parked.take(|m| self.apply(m));
                if let Some((lo, hi)) = dropped {
                    // Where those threads wait: the addresses they faulted
                    // at, whatever was moved since (UFFDIO_WAKE needs no
                    // registration there).
                    let lo = lo / self.page * self.page;
                    let _ = self
                        .uffd
                        .wake(lo, hi / self.page * self.page + self.page - lo);
                }
            }
            self.drain();
            while let Some(addr) = self.faults.pop_front() {
                self.serve(addr);
            }
            if self.pending == 0 {
                break;
            }
            let cancelled = self.shared.cancelled.load(Ordering::Acquire)
                && !self.shared.finish.load(Ordering::Acquire);
            if cancelled {
                self.uffd.poll(10);
                continue;
            }
            self.batch();
        }
        self.finish();
        drop(active);
    }

    /// Serves a fault at (current) address `addr`.
    fn serve(&mut self, addr: usize) {
        self.shared.faults.fetch_add(1, Ordering::Relaxed);
        while !self.serve_once(addr) {}
    }

    /// One attempt at serving `addr`; false when events were read on the
    /// way (an mremap may have moved what lives there): decide again.
    fn serve_once(&mut self, addr: usize) -> bool {
        let at = addr / self.page * self.page;
        let Some((orig, b)) = self
            .remaps
            .original(addr)
            .and_then(|o| Some((o, self.block_of(o)?)))
        else {
            // Registered memory none of our pages lives in: the tail an
            // in-place growing mremap added, or (until its REMAP event is
            // read) where an mremap just moved some of ours; the zero
            // install then fails with -EAGAIN and we decide again.
            return self.zeros_outside(at);
        };
        let seg = self.blocks[b].seg as usize;
        let was_done = self.state[b];
        if !was_done {
            let n = self.fill_block(b, None);
            self.shared.faulted.fetch_add(n as u64, Ordering::Relaxed);
        }
        let unit = self.segs[seg].unit;
        let p = orig / unit * unit;
        let i = self.page_index(seg, p);
        if self.removed.get(i) || was_done && (!self.bad_bits.get(i) || !self.poison) {
            // Discarded: the guest expects zeros there, also where the
            // snapshot's page was bad (the discard dropped its marker; a
            // touch of a marker raises SIGBUS and never gets here).
            // Filled before this fault: usually still there (the fault
            // raced its install, and the kernel answers EEXIST), else
            // emptied by what raises no event (a hole punched in shared
            // memory): zeros, as the kernel gives there. Only waking would
            // send the thread to fault again until the fill ends. Never
            // over a bad unit's poison marker, which zeros would replace
            // (without UFFDIO_POISON its marker is zeros anyway).
            self.install_zeros(p, unit);
        }
        let now = self.remaps.now(p);
        if !(now..now + unit).contains(&at) {
            // The fault is not where this unit lives now: the old range
            // an mremap with MREMAP_DONTUNMAP left behind, still
            // registered and empty. Its pages read zeros, as the kernel
            // gives there; waking the unit's new home alone would leave
            // this thread faulting again forever.
            return self.zeros_outside(at);
        }
        // Whatever happened above (installed, found installed, an install
        // that failed for this very unit), the faulting thread is woken:
        // cheap, and harmless where the page is present. Without it a
        // thread whose unit could not be installed slept until the fill
        // ended.
        let _ = self.uffd.wake(now, unit);
        true
    }

    /// Zeros at `at`, registered memory outside every unit of ours (a
    /// base page, or the largest unit where the mapping is hugetlb), then
    /// the thread faulting there is woken. False when the kernel answered
    /// that events wait (an mremap or a discard in progress): they are
    /// read, and the caller decides again, since `at` may now be ours.
    fn zeros_outside(&mut self, at: usize) -> bool {
        let zero = self.zero.base;
        let mut unit = self.page;
        loop {
            let dst = at / unit * unit;
            let Err(p) = self.uffd.copy(dst, zero, unit) else {
                break;
            };
            match uffd::after(&p.error) {
                uffd::After::Retry => std::thread::sleep(crate::params::UFFD_ENOMEM_WAIT),
                uffd::After::ReadEvents => {
                    self.drain();
                    return false;
                }
                _ if errno(&p.error) == libc::EINVAL && unit < self.zero.len => {
                    unit = self.zero.len
                }
                _ => break,
            }
        }
        let _ = self.uffd.wake(at / unit * unit, unit);
        true
    }

    /// Installs zeros for the discarded unit at original address `orig`.
    fn install_zeros(&mut self, orig: usize, unit: usize) {
        let zero = self.zero.base;
        self.install(orig, unit, false, |uffd, dst| uffd.copy(dst, zero, unit));
    }

    /// Runs `op` (an install of `unit` bytes at the unit's current
    /// address) until it is done or cannot be: `-EAGAIN` (events waiting;
    /// read them: the address may have moved, the unit been discarded)
    /// and `-ENOMEM` are retried without limit, as a fault would be,
    /// since giving up would leave the page to read zeros. With
    /// `unless_discarded`, a unit found discarded once the events are read
    /// is left alone: installing there after its zap would bring back
    /// bytes the guest dropped. Returns whether `op` installed it;
    /// `-EEXIST` (someone got there first) wakes the waiters and returns
    /// false.
    fn install(
        &mut self,
        orig: usize,
        unit: usize,
        unless_discarded: bool,
        op: impl Fn(&Uffd, usize) -> Result<usize, uffd::Partial>,
    ) -> bool {
        let seg = self.seg_of(orig).expect("inside a segment");
        let (i, n) = (self.page_index(seg, orig), unit / self.page);
        let r = uffd::retrying(
            self,
            crate::params::UFFD_ENOMEM_WAIT,
            |f| {
                let owed = !unless_discarded || !f.removed.any(i, n);
                owed.then(|| op(&f.uffd, f.remaps.now(orig)))
            },
            Filler::drain,
        );
        match r {
            Some(Ok(_)) => true,
            Some(Err(p)) if uffd::after(&p.error) == uffd::After::Exists => {
                let _ = self.uffd.wake(self.remaps.now(orig), unit);
                false
            }
            _ => false,
        }
    }

    /// Faults the fault slot's huge page in now, while the channels copy a
    /// batch, so that serving the next fault does not: the first write
    /// into an empty slot makes the kernel zero the whole folio, and the
    /// channels splitting a fault's folio would wait for that one zeroing
    /// before they copy. On the dev machine the first-touch p99 fell by
    /// 0.1–0.2 ms (`foliokit bench restore -s 4G`, four A/B pairs); the
    /// zeroing itself is only moved, so the fill takes as long. Best
    /// effort: where the kernel lacks `MADV_POPULATE_WRITE` (5.14) the
    /// copy faults it in as before.
    fn ready_fault_slot(&mut self) {
        if self.fault_slot_ready || self.staging.is_none() {
            return;
        }
        let s = self.slot(self.slots);
        // SAFETY: advice on the fault slot, a folio of our private staging
        // mapping that nobody uses while a batch is in flight (faults then
        // copy on this thread, not now).
        let rc = unsafe {
            libc::madvise(
                s as *mut libc::c_void,
                self.folio,
                libc::MADV_POPULATE_WRITE,
            )
        };
        self.fault_slot_ready = rc == 0;
    }

    /// Whether block `b` can go in whole with `UFFDIO_MOVE`.
    fn movable(&self, b: usize) -> bool {
        let blk = self.blocks[b];
        self.segs[blk.seg as usize].movable
            && blk.len == self.folio
            && self.staging.is_some()
            && self.whole(b)
            && self.remaps.now(blk.start) % self.folio == 0
    }

    /// Whether block `b` can be installed whole: nothing in it discarded
    /// or bad, and in one piece where it lives now.
    fn whole(&self, b: usize) -> bool {
        let blk = self.blocks[b];
        let seg = blk.seg as usize;
        let i = self.page_index(seg, blk.start);
        let n = blk.len / self.page;
        let now = self.remaps.now(blk.start);
        !self.removed.any(i, n)
            && !self.bad_bits.any(i, n)
            && self.remaps.now(blk.start + blk.len - 1) == now + blk.len - 1
    }

    fn slot(&self, k: usize) -> usize {
        let base = self.staging.as_ref().expect("staging area").base;
        base.next_multiple_of(self.folio) + k * self.folio
    }

    /// Maps the page tables of block `b`'s source in one call before the
    /// kernel copies it with `UFFDIO_COPY` (see [`Source::prefault`]).
    fn prefault_source(&self, b: usize) {
        let blk = self.blocks[b];
        self.source
            .prefault(self.src_offset(blk.seg as usize, blk.start), blk.len);
    }

    /// Fills block `b` now; with `staged`, its bytes are already in that
    /// staging slot. Returns the base pages installed.
    fn fill_block(&mut self, b: usize, staged: Option<usize>) -> usize {
        if self.state[b] {
            return 0;
        }
        let movable = self.movable(b);
        // Only where the kernel copies a large block: a base page's copy
        // faults its source in once, and the call would only add to it.
        if !movable && self.blocks[b].len >= crate::params::LAZY_PARALLEL_COPY_LEAST_BYTES {
            self.prefault_source(b);
        }
        let n = if movable {
            let blk = self.blocks[b];
            let slot = match staged {
                Some(s) => Some(s),
                None if self.in_batch => {
                    // The channels are busy with the batch: copy on this
                    // thread into the fault slot (the batch's are in use).
                    let s = self.slot(self.slots);
                    let src = self.src(blk.seg as usize, blk.start);
                    // SAFETY: the fault slot is our private staging folio,
                    // used by no batch; the source is mapped for the
                    // segment's bytes (checked at start) and may fault,
                    // which the mc copy reports.
                    let r = unsafe {
                        crate::mc::copy_mc_raw(
                            s as *mut u8,
                            src as *const u8,
                            blk.len,
                            self.strategy,
                        )
                    };
                    r.is_ok().then_some(s)
                }
                None => {
                    // A faulting thread waits for this copy: the channels
                    // (and this thread) split the one folio between them,
                    // into the fault slot.
                    let s = self.slot(self.slots);
                    let src = self.src(blk.seg as usize, blk.start);
                    // SAFETY: the slot is our private staging mapping
                    // (blk.len == folio bytes from a folio-aligned slot),
                    // untouched by anyone else until the batch ends; the
                    // source is mapped for the segment's bytes (checked at
                    // start) and may fault, which the mc copy reports.
                    let r = unsafe {
                        self.pool.submit_copy_mc(
                            &[s as *mut u8],
                            &[src as *const u8],
                            blk.len,
                            self.mc,
                        )
                    };
                    r.ok()
                        .map(|b| {
                            b.help();
                            b.wait()
                        })
                        .filter(|o| o.failed.is_empty())
                        .map(|_| s)
                }
            };
            match slot {
                Some(s) => self.move_in(b, s),
                None => self.copy_block(b, 0),
            }
        } else {
            self.copy_block(b, 0)
        };
        self.mark_done(b);
        n
    }

    /// Finishes block `b`, whose first `from` bytes a call that ended
    /// early installed (its source already prefaulted). Returns the base
    /// pages installed.
    fn finish_block(&mut self, b: usize, from: usize) -> usize {
        if self.state[b] {
            return 0;
        }
        let n = self.copy_block(b, from);
        self.mark_done(b);
        n
    }

    /// Moves the staged folio into block `b`; what the move could not do
    /// is copied from the source.
    fn move_in(&mut self, b: usize, slot: usize) -> usize {
        let blk = self.blocks[b];
        let dst = self.remaps.now(blk.start);
        if slot == self.slot(self.slots) {
            self.fault_slot_ready = false;
        }
        match self.uffd.move_pages(dst, slot, blk.len) {
            Ok(_) => {
                self.whole += 1;
                blk.len / self.page
            }
            Err(p) => {
                if errno(&p.error) == libc::EAGAIN {
                    self.drain();
                }
                // The pages moved are there (and woken): the copy goes on
                // after them.
                p.done / self.page + self.copy_block(b, p.done)
            }
        }
    }

    /// Copies block `b` from the source with `UFFDIO_COPY`, unit by unit
    /// where needed, skipping discarded and bad pages and pages already
    /// there, from `from` bytes into it on (a call that ended early
    /// installed and woke what lies before). Returns the base pages
    /// installed.
    fn copy_block(&mut self, b: usize, from: usize) -> usize {
        let blk = self.blocks[b];
        let seg = blk.seg as usize;
        let unit = self.segs[seg].unit;
        let upages = unit / self.page;
        let end = blk.start + blk.len;
        let mut at = blk.start + from / unit * unit;
        let mut installed = 0;
        // Unit by unit from here: a run was refused whole.
        let mut single = false;
        let mut noted = false;
        while at < end {
            let i = self.page_index(seg, at);
            if self.removed.any(i, upages) || self.bad_bits.any(i, upages) {
                at += unit;
                continue;
            }
            let mut run_end = at + unit;
            if self.remaps.is_empty() && !single {
                while run_end < end {
                    let j = self.page_index(seg, run_end);
                    if self.removed.any(j, upages) || self.bad_bits.any(j, upages) {
                        break;
                    }
                    run_end += unit;
                }
            }
            let dst = self.remaps.now(at);
            let src = self.src(seg, at);
            let Err(p) = self.uffd.copy(dst, src, run_end - at) else {
                installed += (run_end - at) / self.page;
                at = run_end;
                continue;
            };
            let done = p.done / unit * unit;
            installed += done / self.page;
            at += done;
            match errno(&p.error) {
                libc::EEXIST => {
                    let _ = self.uffd.wake(self.remaps.now(at), unit);
                    at += unit;
                }
                libc::EFAULT => {
                    installed += self.bad_unit(seg, at, unit);
                    at += unit;
                }
                // Transient: events were waiting (now read) or the kernel
                // was short of memory. Never given up on, as a fault would
                // not: giving up made the page read zeros instead of its
                // snapshot bytes.
                libc::EAGAIN | libc::ENOMEM => {
                    if errno(&p.error) == libc::ENOMEM {
                        std::thread::sleep(crate::params::UFFD_ENOMEM_WAIT);
                    }
                    self.drain();
                }
                // A run over two mappings (mprotect, mlock or madvise split
                // the folio's range) is refused whole: the kernel fills
                // within one. Only a unit refused alone is not ours.
                libc::ENOENT | libc::EINVAL if run_end - at > unit => single = true,
                libc::ENOENT | libc::EINVAL => {
                    // Nothing of ours is mapped there any more (its
                    // neighbours may still be).
                    if !std::mem::replace(&mut noted, true) {
                        self.notes.push(format!(
                            "{:#x}: the mapping went away during the fill ({})",
                            self.remaps.now(at),
                            p.error
                        ));
                    }
                    self.discard(at, at + unit, false);
                    at += unit;
                }
                libc::ESRCH => {
                    // The process has no address space any more.
                    self.notes.push(format!(
                        "{:#x}..{end:#x}: the address space went away during the fill ({})",
                        self.remaps.now(at),
                        p.error
                    ));
                    self.discard(at, end, false);
                    at = end;
                }
                _ => {
                    self.notes.push(format!(
                        "{:#x}: could not be filled ({}); it reads zeros",
                        self.remaps.now(at),
                        p.error
                    ));
                    self.discard(at, at + unit, false);
                    at += unit;
                }
            }
        }
        installed
    }

    /// The kernel could not read the source for the unit at `at`: find out
    /// why, then poison it (or fill zeros where poison is unavailable).
    /// Returns the base pages installed (a retry that worked).
    fn bad_unit(&mut self, seg: usize, at: usize, unit: usize) -> usize {
        let src = self.src(seg, at);
        // SAFETY: `scratch` is ours and `unit` bytes long; the source is
        // mapped there and may fault, which the mc copy reports.
        let r = unsafe {
            crate::mc::copy_mc_raw(
                self.scratch.as_mut_ptr(),
                src as *const u8,
                unit,
                self.strategy,
            )
        };
        let kind = match r {
            Err(McError::Fault(f)) => f.kind,
            Ok(_) => {
                // Readable now (the file grew back, a transient error):
                // install what we read. An install that is interrupted
                // is retried, never taken for a bad page: an EAGAIN here
                // means a discard or a move is being reported, and
                // poisoning the page would turn the guest's zeros into
                // SIGBUS.
                let scratch = self.scratch.as_ptr() as usize;
                if self.install(at, unit, true, |uffd, dst| uffd.copy(dst, scratch, unit)) {
                    return unit / self.page;
                }
                // There already (the guest's write), or nothing of ours
                // mapped there any more: not a bad page either way.
                return 0;
            }
            Err(_) => FaultKind::Other(libc::EFAULT),
        };
        let i = self.page_index(seg, at);
        for j in i..i + unit / self.page {
            self.bad_bits.set(j);
        }
        self.shared
            .bad
            .fetch_add((unit / self.page) as u64, Ordering::Relaxed);
        match self.bad.last_mut() {
            Some(l) if l.kind == kind && l.addr + l.len == at => l.len += unit,
            _ => self.bad.push(LazyBad {
                addr: at,
                len: unit,
                kind,
            }),
        }
        // The marker (or, without UFFDIO_POISON, zeros the report names)
        // goes in unless the unit is discarded meanwhile: the guest then
        // expects plain zeros, which a later touch gets.
        if self.poison {
            self.install(at, unit, true, |uffd, dst| uffd.poison(dst, unit));
        } else {
            let zero = self.zero.base;
            self.install(at, unit, true, |uffd, dst| uffd.copy(dst, zero, unit));
        }
        0
    }

    /// One background batch: the next pending blocks in order, as many as
    /// the budget allows (blocks copied in place, which are cut one by
    /// one, up to the largest batch).
    fn batch(&mut self) {
        let want = self.ctl.pages() * self.page;
        let t = Instant::now();
        let mut take: Vec<usize> = Vec::new();
        // Blocks the batch gives back are taken again from here: the ones
        // before them in the order are all done, so the next batch skips
        // them.
        let start = self.cursor;
        let mut bytes = 0;
        let mut moving = 0;
        // Blocks copied in place are cut block by block (see
        // `copy_parallel`), so the budget does not size them: only the
        // largest batch bounds them, and a batch of them costs its
        // setup once.
        let mut in_place = 0;
        let mut in_place_at_selection = Vec::new();
        while self.cursor < self.order.len() {
            let b = self.order[self.cursor] as usize;
            if self.state[b] {
                self.cursor += 1;
                continue;
            }
            let len = self.blocks[b].len;
            if self.movable(b) {
                if moving == self.slots || bytes >= want {
                    break;
                }
                moving += 1;
                bytes += len;
            } else if self.offerable(b) {
                if in_place >= crate::params::LAZY_MAX_BATCH_BYTES {
                    break;
                }
                in_place += len;
                in_place_at_selection.push(b);
            } else {
                if bytes >= want {
                    break;
                }
                bytes += len;
            }
            take.push(b);
            self.cursor += 1;
        }
        if take.is_empty() {
            // Only blocks done out of order are left: the cursor passed
            // them all; pending must be 0 then, or a fault holds one.
            self.cursor = 0;
            return;
        }
        let movers: Vec<usize> = take.iter().copied().filter(|&b| self.movable(b)).collect();
        // Per mover: copied into its slot, its source faulted, or given
        // back unstarted (a message cut the batch short).
        let mut copied = vec![false; movers.len()];
        let mut failed = vec![false; movers.len()];
        // How long the batch ran on after this thread stopped waiting for
        // it (cut short, or ended).
        let mut tail = None;
        // A message cut the batch short: what it gave back, non-movers
        // included, waits for the next batch.
        let mut cut_short = false;
        if !movers.is_empty() {
            let dsts: Vec<*mut u8> = (0..movers.len()).map(|k| self.slot(k) as *mut u8).collect();
            let srcs: Vec<*const u8> = movers
                .iter()
                .map(|&b| {
                    let blk = self.blocks[b];
                    self.src(blk.seg as usize, blk.start) as *const u8
                })
                .collect();
            let pool = self.pool.clone();
            // The channels cut the batch short themselves when a message
            // waits and the least run is over: submitting wakes them, and
            // where they take every CPU this thread may not run again
            // until they stop. Serving faults during the batch, messages
            // do not cut it. A fork cuts it at once: the forking thread
            // waits for this one to park, which it does between batches.
            // Weak: a batch queued behind other work on a shared channel
            // must not keep the userfaultfd open after the fill ends.
            let watch = match &self.watch {
                Some(fd) if !self.serve_during => Arc::downgrade(fd),
                _ => Weak::new(),
            };
            let from = t + self.least_run;
            let due = move || cut_due(watch.upgrade().as_deref(), from);
            // SAFETY: the slots are distinct folios of our private staging
            // mapping, touched by nobody else until the batch ends (faults
            // served meanwhile use the fault slot); the sources are mapped
            // (checked at start) and only read, and a source page that
            // faults ends its piece short (mc copy).
            let r = unsafe { pool.submit_copy_mc_cut_when(&dsts, &srcs, self.folio, self.mc, due) };
            match r {
                Ok(mut batch) => {
                    self.ready_fault_slot();
                    // Serving during batches: while the channels copy,
                    // faults on folios outside the batch are served on
                    // this thread (a vCPU then waits for its own folio, not
                    // for the batch); faults inside it wait for the batch,
                    // which installs them.
                    let outcome = loop {
                        if let Some(o) = batch.try_wait() {
                            break o;
                        }
                        if !self.serve_during {
                            let (o, cut, wait) = self.await_batch(&mut batch, t);
                            cut_short = cut;
                            tail = Some(wait);
                            break o;
                        }
                        if self.uffd.poll_for(crate::params::LAZY_BATCH_POLL) {
                            self.in_batch = true;
                            self.drain();
                            let mut later = VecDeque::new();
                            while let Some(addr) = self.faults.pop_front() {
                                let orig = self.remaps.original(addr);
                                match orig.and_then(|o| self.block_of(o)) {
                                    Some(b) if take.contains(&b) => later.push_back(addr),
                                    _ => self.serve(addr),
                                }
                            }
                            self.faults = later;
                            self.in_batch = false;
                        }
                    };
                    for f in outcome.failed {
                        for j in f.folio..(f.folio + f.folios).min(failed.len()) {
                            failed[j] = true;
                        }
                    }
                    for (k, c) in copied.iter_mut().enumerate() {
                        *c = batch.folio_done(k);
                    }
                }
                Err(e) => {
                    self.notes.push(format!("copy channels: {e}"));
                    failed.iter_mut().for_each(|f| *f = true);
                }
            }
        }
        let post = Instant::now();
        let mut n = 0;
        for (k, &b) in movers.iter().enumerate() {
            if !copied[k] && !failed[k] {
                // Given back unstarted: taken again by the next batch.
                self.cursor = start;
                continue;
            }
            // An event read meanwhile may have made it unmovable (a
            // discard): then it is copied page by page instead.
            let staged = copied[k].then(|| self.slot(k));
            let staged = staged.filter(|_| self.movable(b));
            n += if let Some(s) = staged {
                let got = self.move_in(b, s);
                self.mark_done(b);
                got
            } else {
                let got = self.copy_block(b, 0);
                self.mark_done(b);
                got
            };
        }
        let rest: Vec<usize> = take
            .iter()
            .copied()
            .filter(|b| !movers.contains(b))
            .collect();
        let selected_in_place: Vec<bool> = rest
            .iter()
            .map(|b| in_place_at_selection.contains(b))
            .collect();
        let (tried, cut_at, in_place_took) = self.copy_parallel(&rest, t, !cut_short);
        cut_short |= tried.contains(&Tried::Unstarted);
        // What the runs installed whole is done before anything below reads
        // events: a discard read there must find those blocks done (their
        // pages counted once, as filled), not still to fill.
        for (&b, tried) in rest.iter().zip(&tried) {
            if let Tried::Finished(bytes) = *tried {
                self.mark_done(b);
                n += bytes / self.page;
            }
        }
        for (k, (&b, tried)) in rest.iter().zip(tried).enumerate() {
            n += match tried {
                Tried::Finished(_) => 0,
                // The rest is copied with every error handled.
                Tried::Stopped(bytes) => bytes / self.page + self.finish_block(b, bytes),
                // Not started, or no longer offered (events read since
                // made it so): the budget never sized it, so it is not
                // copied here uncut; the next batch takes it as it is.
                _ if cut_short || selected_in_place[k] => {
                    self.cursor = start;
                    0
                }
                _ => self.fill_block(b, None),
            };
        }
        self.shared.filled.fetch_add(n as u64, Ordering::Relaxed);
        let took = t.elapsed();
        self.batches += 1;
        self.longest = self.longest.max(took);
        // What a fault read during the batch waited for: the tail of a
        // batch it cut short (the folios in progress, from when the cut
        // began), then the moves and what this thread filled itself.
        // Serving faults during batches, the whole batch. Cut short while
        // copying in place: from the cut on; else the copy in place, which
        // the budget does not size, is left out.
        self.ctl.observe(match (cut_at, tail) {
            (Some(at), _) => at.elapsed(),
            (None, Some(w)) => (w + post.elapsed()).saturating_sub(in_place_took),
            (None, None) => took.saturating_sub(in_place_took),
        });
    }

    /// Copies the blocks `bs` of a background batch with `UFFDIO_COPY`, on
    /// this thread and up to a channel count less one helpers at once (on
    /// this thread alone with one channel, still cut block by block): the
    /// kernel copies on the calling thread, so one thread alone fills at a
    /// fraction of the memory's bandwidth. Only blocks one call can fill
    /// whole are offered ([`Filler::offerable`]). A run takes no further
    /// block once a message waits and the batch has run its least share
    /// of the budget, or a fork waits, or any run's call failed: the
    /// caller then copies the rest of that block with every error handled
    /// (`copy_block`, which also reads the events that made the kernel
    /// refuse, EAGAIN), and gives back the blocks no run started. Also
    /// returns when a run first saw a message or fork cut, if one did, and
    /// how long the copying took. With `offer` false (the batch was cut
    /// short before), it offers none.
    fn copy_parallel(
        &self,
        bs: &[usize],
        begun: Instant,
        offer: bool,
    ) -> (Vec<Tried>, Option<Instant>, Duration) {
        let offered: Vec<Option<(usize, usize, usize)>> = bs
            .iter()
            .map(|&b| {
                let blk = self.blocks[b];
                let seg = blk.seg as usize;
                (offer && self.offerable(b) && !self.state[b]).then(|| {
                    (
                        self.remaps.now(blk.start),
                        self.src_offset(seg, blk.start),
                        blk.len,
                    )
                })
            })
            .collect();
        let jobs: Vec<usize> = (0..bs.len()).filter(|&k| offered[k].is_some()).collect();
        if jobs.is_empty() {
            return (vec![Tried::NotOffered; bs.len()], None, Duration::ZERO);
        }
        let t = Instant::now();
        let extra = self.pool.len().saturating_sub(1).min(jobs.len() - 1);
        // 0: not started; else 1 + bytes installed, with FINISHED set
        // where the call installed the whole block.
        const FINISHED: usize = 1 << (usize::BITS - 1);
        let results: Vec<AtomicUsize> = (0..bs.len()).map(|_| AtomicUsize::new(0)).collect();
        let next = AtomicUsize::new(0);
        let cut_at = std::sync::OnceLock::new();
        let watch = self.watch.as_deref();
        let uffd = &self.uffd;
        let source = &*self.source;
        // Any error ends every run: the fill thread deals with that block
        // (events to read first, for EAGAIN), and the rest goes back to
        // the next batch rather than to this thread one by one, uncut.
        let failed = std::sync::atomic::AtomicBool::new(false);
        let from = begun + self.least_run;
        let due = || cut_due(watch, from);
        crate::helpers::fan_out(extra, &|| loop {
            if failed.load(Ordering::Relaxed) {
                break;
            }
            if due() {
                cut_at.get_or_init(Instant::now);
                break;
            }
            let Some(&k) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            let (dst, src_off, len) = offered[k].expect("offered");
            // The kernel faulting the source in as it copies cost the
            // fill about as much as the copy: map it in one call first.
            source.prefault(src_off, len);
            let src = source.as_ptr() as usize + src_off;
            let r = match uffd.copy(dst, src, len) {
                Ok(_) => FINISHED | (1 + len),
                Err(p) => {
                    failed.store(true, Ordering::Relaxed);
                    1 + p.done
                }
            };
            results[k].store(r, Ordering::Relaxed);
        });
        // fan_out returned: every run ended, and its stores are seen.
        let tried = results
            .iter()
            .enumerate()
            .map(|(k, r)| match r.load(Ordering::Relaxed) {
                _ if offered[k].is_none() => Tried::NotOffered,
                0 => Tried::Unstarted,
                v if v & FINISHED != 0 => Tried::Finished((v & !FINISHED) - 1),
                v => Tried::Stopped(v - 1),
            })
            .collect();
        (tried, cut_at.get().copied(), t.elapsed())
    }

    /// Whether block `b` is one `copy_parallel` offers: not movable, large
    /// enough, nothing in it discarded or bad, and in one piece where it
    /// lives now. Others count against the budget: the fill thread copies
    /// them unit by unit, uncut.
    fn offerable(&self, b: usize) -> bool {
        self.blocks[b].len >= crate::params::LAZY_PARALLEL_COPY_LEAST_BYTES
            && !self.movable(b)
            && self.whole(b)
    }

    /// Waits for background `batch`, begun at `begun`, sleeping until it
    /// ends or a message comes. A message cuts the batch short once it has
    /// run its least share of the budget (else faults coming one after the
    /// other would cut every batch before a channel began it): the pieces
    /// no channel has started go back, so a fault waits for the pieces in
    /// progress, not for the whole batch. The channels usually make that
    /// cut themselves (the batch's cut test) before this thread runs;
    /// this one covers a batch whose channels are all mid-piece. Returns
    /// the outcome, whether pieces went back, and how long it waited
    /// after the cut began (or it stopped sleeping).
    fn await_batch(
        &self,
        batch: &mut InFlight<'_>,
        begun: Instant,
    ) -> (BatchOutcome, bool, Duration) {
        self.ended.reset();
        match batch.notify(&self.ended) {
            Ok(false) => loop {
                if self.uffd.poll_or(&self.ended) {
                    let until = begun + self.least_run;
                    loop {
                        let now = Instant::now();
                        if now >= until || batch.try_wait().is_some() {
                            break;
                        }
                        self.ended.wait_for(until - now);
                        // A late post of the batch before may have woken
                        // it: look again.
                        self.ended.reset();
                    }
                    batch.cancel_unstarted();
                    break;
                }
                self.ended.reset();
                if batch.try_wait().is_some() {
                    break;
                }
            },
            Ok(true) => {}
            // No descriptor to spare for the event: as before it, this
            // thread runs what no channel started (the shared channels may
            // all be busy with a copy that faulted on this very fill), then
            // waits for the rest.
            Err(_) => batch.help(),
        }
        // A cut the channels made began before this thread woke to it.
        let stopped = batch
            .cut_by_channels_at()
            .map_or(Instant::now(), |at| at.min(Instant::now()));
        let o = batch.wait_in_place();
        (o, batch.was_cut(), stopped.elapsed())
    }

    /// Unregisters everything (where it is now), reads what is left, and
    /// publishes the report.
    fn finish(mut self) {
        for i in 0..self.segs.len() {
            let (a, l) = (self.segs[i].addr, self.segs[i].len);
            for (s, n) in self.remaps.image(a, l) {
                if let Err(e) = self.uffd.unregister(s, n) {
                    self.notes.push(format!(
                        "unregistering {s:#x} + {n:#x}: {e} (closing does it)"
                    ));
                }
            }
        }
        // Events raised before the unregistration: read them so their
        // threads go on (faults were woken by the unregistration).
        for _ in 0..3 {
            self.drain();
            self.faults.clear();
        }
        let report = LazyReport {
            progress: super::LazyProgress {
                done: true,
                ..self.shared.progress()
            },
            bad: self.bad.clone(),
            bad_outcome: if self.poison {
                BadOutcome::Poisoned
            } else {
                BadOutcome::Zeroed
            },
            whole_folios: self.whole,
            batches: self.batches,
            longest_batch_us: self.longest.as_secs_f64() * 1e6,
            secs: self.t0.elapsed().as_secs_f64(),
            forks: self.forks,
            strategy: Some(self.strategy),
            notes: std::mem::take(&mut self.notes),
        };
        *self.shared.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
        self.shared.done.store(true, Ordering::Release);
        drop(self);
    }
}

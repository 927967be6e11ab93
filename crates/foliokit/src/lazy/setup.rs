//! Starting a fill: the segments checked, registered and carved into
//! blocks, the staging area and the zero source mapped, the fill thread
//! spawned.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fill::{End, Filler, Tally};
use super::ledger::{Ledger, Seg};
use super::map::Map;
use super::park::{Active, Parked};
use super::{LazyError, LazyFill, LazyOptions, LazyRefusal, Segment, Shared, Source};
use crate::batch::page_size;
use crate::budget::BatchController;
use crate::copy::CopyStrategy;
use crate::mc::McCopyFn;
use crate::sys::maps::{self, MapLine};
use crate::sys::uffd::{self, Uffd};
use crate::tune::Shape;

const EVENTS: u64 = uffd::FEATURE_EVENT_FORK
    | uffd::FEATURE_EVENT_REMAP
    | uffd::FEATURE_EVENT_REMOVE
    | uffd::FEATURE_EVENT_UNMAP;

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

/// The segments sorted by address, each checked (page-aligned, not
/// empty, not wrapping, not overlapping the next, inside the source), and
/// the folio size the blocks take.
fn checked(
    segments: &[Segment],
    source: &Source,
    opts: &LazyOptions,
    page: usize,
) -> Result<(Vec<Segment>, usize), LazyError> {
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
    Ok((sorted, folio))
}

/// What registering the segments found.
struct Registered {
    ledger: Ledger,
    /// The largest install unit.
    unit_max: usize,
    /// Some segment can be filled folio by folio with `UFFDIO_MOVE`.
    any_movable: bool,
    /// Every segment offers `UFFDIO_POISON`.
    poison: bool,
}

/// Registers each segment (refusing shared memory unless allowed), learns
/// its install unit and whether it is movable, and carves it into blocks.
fn register(
    uffd: &Uffd,
    sorted: &[Segment],
    opts: &LazyOptions,
    folio: usize,
    page: usize,
) -> Result<Registered, LazyError> {
    let mut segs = Vec::with_capacity(sorted.len());
    let mut blocks = Vec::new();
    let mut pages = 0;
    let mut any_movable = false;
    let mut unit_max = page;
    let mut poison = true;
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
        Ledger::carve(s.addr, s.len, folio.max(unit), i as u32, &mut blocks);
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
    Ok(Registered {
        ledger: Ledger::new(segs, blocks, page),
        unit_max,
        any_movable,
        poison,
    })
}

/// The staging area movers are copied into: `slots` batch slots, the
/// fault slot, and room to align them to `folio`; none where nothing is
/// movable.
fn staging_area(any_movable: bool, slots: usize, folio: usize) -> Result<Option<Map>, LazyError> {
    if !any_movable {
        return Ok(None);
    }
    {
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
        Ok(Some(m))
    }
}

/// Checks, registers and starts the fill thread.
pub(super) fn start(
    segments: &[Segment],
    source: Source,
    opts: &LazyOptions,
) -> Result<LazyFill, LazyError> {
    let t0 = Instant::now();
    let page = page_size();
    let (sorted, folio) = checked(segments, &source, opts, page)?;
    let (copy_strategy, mc) = mc_for(opts, folio)?;
    let pool = crate::channels::shared(opts.channels.max(1))?;
    // Counted as a fill thread before the first registration: a fork from
    // now on raises an event only the fill thread can read, so it must
    // wait in its prepare handler (before glibc takes the allocator's
    // locks) until that thread has started and parked; handed over to the
    // thread below, dropped on every error path.
    let active = Active::enter();
    let (uffd, features) = open_uffd()?;
    let reg = register(&uffd, &sorted, opts, folio, page)?;
    let poison = reg.poison && features & uffd::FEATURE_POISON != 0;
    let begun = Begun {
        t0,
        uffd,
        poison,
        reg,
        folio,
        page,
        pool,
        mc,
        copy_strategy,
        end: End::Unregister,
        notes: Vec::new(),
    };
    spawn(begun, source, opts, Some(active))
}

/// Checks the segments of another process's memory, carves them and
/// starts the fill thread on its descriptor (see `external.rs`).
pub(super) fn start_external(
    ext: super::External,
    segments: &[super::ExternalSegment],
    source: Source,
    opts: &LazyOptions,
) -> Result<LazyFill, LazyError> {
    let t0 = Instant::now();
    let page = page_size();
    let plain: Vec<Segment> = segments.iter().map(|s| s.segment).collect();
    let (_, folio) = checked(&plain, &source, opts, page)?;
    let mut sorted = segments.to_vec();
    sorted.sort_by_key(|s| s.segment.addr);
    let mut segs = Vec::with_capacity(sorted.len());
    let mut blocks = Vec::new();
    let mut pages = 0;
    let mut unit_max = page;
    for (i, e) in sorted.iter().enumerate() {
        let (s, unit) = (e.segment, e.page_size);
        let bad = |why| LazyError::BadSegment {
            addr: s.addr,
            len: s.len,
            why,
        };
        if unit < page || !unit.is_power_of_two() || unit > 1 << 30 {
            return Err(bad(
                "its page size is not a power of two from the base page to 1 GiB",
            ));
        }
        if s.addr % unit != 0 || s.len % unit != 0 {
            return Err(bad("not aligned to its page size"));
        }
        unit_max = unit_max.max(unit);
        Ledger::carve(s.addr, s.len, folio.max(unit), i as u32, &mut blocks);
        segs.push(Seg {
            addr: s.addr,
            len: s.len,
            offset: s.offset,
            unit,
            movable: false,
            first_page: pages,
        });
        pages += s.len / page;
    }
    let mut notes = ext.costs();
    if let Some(pid) = ext.pid {
        check_page_sizes(pid, &sorted, &mut notes)?;
    }
    let (copy_strategy, mc) = mc_for(opts, folio)?;
    let pool = crate::channels::shared(opts.channels.max(1))?;
    let poison = ext.poison();
    let begun = Begun {
        t0,
        uffd: ext.uffd,
        poison,
        reg: Registered {
            ledger: Ledger::new(segs, blocks, page),
            unit_max,
            any_movable: false,
            poison,
        },
        folio,
        page,
        pool,
        mc,
        copy_strategy,
        end: End::ServeUntil(ext.gone),
        notes,
    };
    spawn(begun, source, opts, None)
}

/// Refuses a segment whose page size is not that of process `pid`'s
/// mapping there (an install of the wrong unit fails or splits a huge
/// page's contents), or where nothing is mapped; notes where its smaps
/// cannot be read.
fn check_page_sizes(
    pid: i32,
    segments: &[super::ExternalSegment],
    notes: &mut Vec<String>,
) -> Result<(), LazyError> {
    let starts: Vec<usize> = segments.iter().map(|s| s.segment.addr).collect();
    let Some(found) = crate::sys::smaps::kernel_page_sizes_of(pid, &starts) else {
        notes.push(format!(
            "page sizes not checked against process {pid}'s mappings (its smaps cannot be read here)"
        ));
        return Ok(());
    };
    for (e, k) in segments.iter().zip(found) {
        let why = match k {
            None => "nothing is mapped there in the process",
            Some(k) if k != e.page_size => "its page size is not the mapping's",
            Some(_) => continue,
        };
        return Err(LazyError::BadSegment {
            addr: e.segment.addr,
            len: e.segment.len,
            why,
        });
    }
    Ok(())
}

/// The mc copy routine for the fill's batches.
fn mc_for(opts: &LazyOptions, folio: usize) -> Result<(CopyStrategy, McCopyFn), LazyError> {
    Ok(crate::mc::mc_routine(
        opts.strategy,
        Shape::batch(
            folio,
            crate::params::LAZY_MAX_BATCH_BYTES / folio,
            crate::Reuse::Stream,
        )
        .on_channels(opts.channels),
    )?)
}

/// What both fronts have found and made before the fill thread starts.
struct Begun {
    t0: Instant,
    uffd: Uffd,
    poison: bool,
    reg: Registered,
    folio: usize,
    page: usize,
    pool: Arc<crate::channels::ChannelPool>,
    mc: McCopyFn,
    copy_strategy: CopyStrategy,
    end: End,
    notes: Vec<String>,
}

/// Maps the staging area and the zero source, builds the fill thread's
/// state and starts it.
fn spawn(
    b: Begun,
    source: Source,
    opts: &LazyOptions,
    active: Option<Active>,
) -> Result<LazyFill, LazyError> {
    let Begun {
        t0,
        uffd,
        poison,
        reg,
        folio,
        page,
        pool,
        mc,
        copy_strategy,
        end,
        notes,
    } = b;
    let (pages, unit_max) = (reg.ledger.pages(), reg.unit_max);
    let slots = (crate::params::LAZY_MAX_BATCH_BYTES / folio).max(1);
    let staging = staging_area(reg.any_movable, slots, folio)?;
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
    let mut f = Filler {
        uffd,
        poison,
        source: Arc::new(source),
        zero_blocks: (0..reg.ledger.blocks.len())
            .map(|_| std::sync::atomic::AtomicU8::new(0))
            .collect(),
        ledger: reg.ledger,
        order: Vec::new(),
        cursor: 0,
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
        end,
        abandoned: false,
        tally: Tally {
            bad: Vec::new(),
            notes,
            whole: 0,
            batches: 0,
            longest: Duration::ZERO,
            forks: 0,
            t0,
            resident: None,
        },
    };
    f.take_order(opts);
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

impl Filler {
    /// Discards what the caller skips, and orders the blocks: those
    /// holding the caller's first addresses, then the rest in address
    /// order.
    fn take_order(&mut self, opts: &LazyOptions) {
        let nb = self.ledger.blocks.len();
        for &(a, l) in &opts.skip {
            self.discard(a, a.saturating_add(l), false);
        }
        let mut seen = vec![false; nb];
        for &a in &opts.first {
            if let Some(b) = self.ledger.block_of(a) {
                if !seen[b] {
                    seen[b] = true;
                    self.order.push(b as u32);
                }
            }
        }
        self.order
            .extend((0..nb as u32).filter(|&b| !seen[b as usize]));
    }
}

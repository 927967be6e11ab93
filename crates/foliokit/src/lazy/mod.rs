//! A lazily filled range: memory whose bytes come from a source (a mapped
//! snapshot file) on first touch, and in the background until all are in.
//!
//! [`fill_lazily`] registers the ranges with a userfaultfd in missing mode
//! (with the REMOVE, UNMAP, REMAP and FORK events) and returns at once; one
//! fill thread then serves every fault from the source — the whole folio
//! around it where the range is THP-eligible anonymous memory — and fills
//! the rest in the background in batches copied by the copy channels with
//! machine-check-safe copies. A fault that comes while a batch is in
//! flight cuts the batch short once it has run a share of the latency
//! budget: the channels look for a waiting message before each folio and
//! stop there, the folios no channel has started go back, and the fill
//! thread serves the fault when the folios in progress end. The batch
//! size is chosen from that measured wait so that it stays within the
//! latency budget (seed 001's batch size vs first-folio latency
//! trade-off, applied to a restore). When every page is in, the ranges
//! are unregistered: plain memory again.
//!
//! # How a page gets in
//!
//! - THP-eligible private anonymous memory (and `UFFDIO_MOVE`, Linux 6.8):
//!   the folio's bytes are copied from the source into a private staging
//!   THP, then `UFFDIO_MOVE` moves that whole PMD into the empty guest
//!   PMD, so huge pages stay huge. (`UFFDIO_COPY` into anonymous memory
//!   allocates and installs base pages one by one: a 2 MiB `UFFDIO_COPY`
//!   gives 512 small pages, which only khugepaged or `MADV_COLLAPSE` could
//!   make huge again, by copying them a second time.)
//! - Otherwise (shared memory, hugetlb, older kernels, a folio partly
//!   discarded, a source page that faults): `UFFDIO_COPY` from the source
//!   mapping (into hugetlb memory without the kernel zeroing the page
//!   first). A background batch issues it for whole blocks (a hugetlb
//!   page, a shared-memory folio) on the fill thread and the helpers at
//!   once, as many as there are channels: the kernel copies on the
//!   calling thread. The kernel fills within one mapping only: a folio
//!   whose range `mprotect`, `mlock` or `madvise` split into two is
//!   filled unit by unit, and only a unit refused on its own (`-ENOENT`)
//!   is taken for unmapped.
//! - Zeros cost nothing: where the source is a hole of a sparse snapshot
//!   file ([`Source::holes`]) nothing is read nor copied. A base page
//!   gets the shared zero page (`UFFDIO_ZEROPAGE`, anonymous and shared
//!   memory): no memory is used until the guest writes there. In
//!   THP-eligible memory that holds for a whole folio of holes too (it is
//!   not moved in huge): the trade-off is memory and time now against a
//!   huge page later, since a guest write into such a folio gets a base
//!   page, not a huge one (khugepaged may collapse it once written). A
//!   folio partly hole is copied and moved in whole as any other, its
//!   holes read as zeros. hugetlb memory offers no `UFFDIO_ZEROPAGE`: an
//!   all-hole huge page is installed with `UFFDIO_COPY` from a zero
//!   mapping (the kernel writes the huge page from the zero page; no
//!   snapshot byte is read). [`LazyProgress::zero_pages`] counts them.
//!   A data page that is all zeros is copied as data: the source may
//!   raise SIGBUS, so it is read only by the copies, and detecting zeros
//!   would be a second read of every page (the snapshot writer,
//!   `foliokit-vm-memory`, leaves holes for them instead).
//!
//! # Why no byte is lost, resurrected or exposed
//!
//! - In a range registered in missing mode, an empty entry can only be
//!   filled by this fill thread: every other access to it (user or kernel
//!   mode, see below) waits on the userfaultfd. `UFFDIO_COPY`,
//!   `UFFDIO_MOVE` and `UFFDIO_POISON` only install into an empty entry
//!   (`-EEXIST` otherwise: someone got there first). So a page is filled
//!   at most once, before anyone could read or write it, and a write the
//!   guest made after its first touch can never be overwritten: the fill
//!   skips a page on `-EEXIST` and never retries it.
//! - A page discarded with `MADV_DONTNEED`/`MADV_REMOVE` (a balloon) is
//!   never brought back. madvise raises the userfaultfd's
//!   `mmap_changing` before it zaps and waits until its REMOVE event is
//!   read; meanwhile `UFFDIO_COPY`/`MOVE` fail with `-EAGAIN`, and the fill
//!   reads the events and marks those pages discarded before it retries.
//!   So a fill either completed before the discard began (and the zap
//!   then removes it), or the pages are known discarded before it is
//!   tried. A later touch of a discarded page faults (the range is still
//!   registered) and is answered with zeros, which is what the guest
//!   expects after `MADV_DONTNEED`; after the fill ends such pages fault
//!   in as zeros normally. The same holds for unmapped pages (UNMAP: never
//!   filled; the kernel refuses to fill where nothing of ours is mapped)
//!   and for ranges the caller asks to skip. A page a fault finds empty
//!   after its folio was filled (emptied by what raises no event, such as
//!   a hole punched in shared memory) gets zeros, as the kernel gives
//!   there; one that still holds its page gets `-EEXIST` and a wake.
//! - A faulting thread is woken by the fill that installs its page (or,
//!   for a page already there, by `UFFDIO_WAKE`), once, and retries its
//!   access, which then finds the page.
//! - Kernel-mode accesses (a device thread's `read(2)` into the range, a
//!   futex, GUP) wait like user faults: the descriptor is opened without
//!   `UFFD_USER_MODE_ONLY` (through `/dev/userfaultfd` or with
//!   privilege), else [`fill_lazily`] refuses.
//! - A source page that cannot be read (a snapshot file truncated under
//!   the mapping, page-cache poison) is never installed: the mc copy or
//!   the kernel's `UFFDIO_COPY` (`-EFAULT`) stops there, the page is
//!   reported in [`LazyReport::bad`] with its kind, and a poison marker is
//!   installed with `UFFDIO_POISON` (Linux 6.6): a thread touching it gets
//!   SIGBUS with `BUS_MCEERR_AR` at that address, as real poison would, so
//!   a VMM injects a memory error into its guest. Without
//!   `UFFDIO_POISON` the page is filled with zeros instead and the report
//!   says so ([`BadOutcome::Zeroed`]); the VMM must then act on the report.
//! - fork(): the child's copy of the range has empty entries where the
//!   fill had not got yet. With the FORK event the child's copy is
//!   registered with a new userfaultfd handed to us, and fork does not
//!   return until we read it; a thread then fills the child's empty pages
//!   from the source (not the discarded ones) and closes that descriptor.
//!   glibc's fork() takes the allocator's locks before the kernel waits
//!   for the event to be read, so the fill thread must read it without
//!   allocating: a `pthread_atfork` prepare handler (it runs before glibc
//!   takes those locks) parks every fill thread in a loop that only reads
//!   messages, until fork() returns. A fill thread parks between batches:
//!   the channels cut the batch in flight short as soon as a fork waits,
//!   so the fork waits for a folio per channel, not for the batch. The
//!   kernel hands out every waiting fault before the fork's event, so the
//!   room for them is mapped with mmap and grown with mremap, which take
//!   none of the allocator's locks; should even that fail, a fault is
//!   dropped and its thread woken after the fork to fault again (an event
//!   is never dropped).
//!   Wipe-on-fork ranges are left empty in the child (it must see zeros).
//!   Private hugetlb memory: the child's pages, and the parent's written
//!   after the fork (copy on write), come from the pool, which must have
//!   them spare; the kernel kills a process it cannot give one to.
//!
//! What a page being out means for code that cannot wait (the kernel does
//! not wait on a userfaultfd for an exiting task's `clear_child_tid`, for
//! robust or PI futexes, or remote GUP without `FOLL_UNLOCKABLE`): such
//! accesses to a page not yet in fail (`-EFAULT`) rather than wait. Guest
//! RAM holds none of these for the VMM; memory that does must not be
//! filled lazily. The fill thread never touches the range itself.
//!
//! The handle is not usable in a forked child (it has no fill thread
//! there); a child should only exec or exit.
//!
//! # What the caller must not do while a fill runs
//!
//! - Shared or file-backed memory is refused unless
//!   [`LazyOptions::allow_shared_memory`] is set, whose documentation
//!   lists what the caller then promises.
//! - Copy from or into the range through foliokit's shared copy channels
//!   on another thread: the fill's own copies may queue behind that copy,
//!   which waits for a page only the fill can install.

mod batch;
mod external;
mod fill;
#[cfg(feature = "serde")]
pub mod firecracker;
mod holes;
mod install;
mod ledger;
mod map;
mod park;
mod remap;
mod serve;
mod setup;
mod source;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::channels::ChannelError;
use crate::copy::CopyStrategy;
use crate::mc::{FaultKind, McError};

pub use external::{fill_external, External, ExternalSegment};
pub use holes::Holes;
pub use source::Source;

/// One range to fill: `len` bytes at host address `addr`, whose contents
/// are at `offset` in the source. Page-aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First host address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Where its bytes start in the source.
    pub offset: u64,
}

/// How to fill.
#[derive(Debug, Clone)]
pub struct LazyOptions {
    /// The longest a faulting thread may wait behind a background batch.
    /// A fault that comes while a batch is in flight cuts it short once
    /// the batch has run half the budget (so a stream of faults never
    /// stops the background fill): each channel looks for a waiting
    /// message before it starts a folio and stops there (so the fault is
    /// read even where the channels hold every CPU), the folios no channel
    /// has started go back, and the fault waits for the folios in progress
    /// (one per channel), the moves of what they copied and what the fill
    /// thread copies itself (memory that cannot be moved in whole). The
    /// batch size is kept so that this wait stays within half the budget;
    /// then the faulting thread's own folio is copied.
    pub latency_budget: Duration,
    /// Copy channels for the background batches: the background fill's
    /// parallelism (the fill thread sleeps while they copy; it serves
    /// faults, moves what they copied in, and copies memory that cannot be
    /// moved in whole itself). They share CPUs with the guest's running
    /// vCPUs: a channel preempted mid-piece holds up a fault that cut its
    /// batch short; on a host with no CPU to spare, fewer channels bound
    /// the wait better.
    pub channels: usize,
    /// The folio size of THP-eligible anonymous ranges (filled a folio at
    /// a time); base pages elsewhere, the huge page size on hugetlb. A
    /// power of two up to 1 GiB (below a page, a page), else
    /// [`LazyError::BadSegment`].
    pub folio_size: usize,
    /// mc copy strategy (`auto` picks).
    pub strategy: CopyStrategy,
    /// Host addresses whose folios are filled first, in this order (pages
    /// touched right after the last restore, or chosen by the VMM); the
    /// rest follows in address order.
    pub first: Vec<usize>,
    /// Host ranges `(addr, len)` never filled: they read as zeros (pages
    /// known unreadable when the snapshot was saved).
    pub skip: Vec<(usize, usize)>,
    /// Start with the background fill cancelled: only faults are served
    /// until [`LazyFill::wait`].
    pub start_cancelled: bool,
    /// Serve faults on folios outside a background batch while it is in
    /// flight (on the fill thread, one folio at a time): a faulting thread
    /// then waits for its own folio only, at the cost of a copy competing
    /// with the channels for CPUs; worth it with CPUs to spare beyond the
    /// channels. Off (the default): a fault cuts the batch short and
    /// waits for its folios in progress, and every copy runs on the
    /// channels.
    /// `foliokit bench restore --serve-faults-during-batches` measures it;
    /// on the 2-vCPU dev machine off gave the lower first-touch p99 and
    /// the shorter time to all resident.
    pub serve_during_batches: bool,
    /// Fill shared or file-backed memory too (a memfd guest RAM a
    /// vhost-user backend will share). Off by default, and then such a
    /// segment is refused with [`LazyRefusal::NotPrivate`], because there
    /// the fill cannot keep its promises alone. Setting it, the caller
    /// promises, for as long as the fill runs: not to map the memory a
    /// second time nor hand it to another process (accesses through
    /// another mapping do not wait on this userfaultfd, so a page created
    /// there first keeps the snapshot's bytes out of it); not to
    /// `MADV_DONTNEED` it (on shared memory that only drops the mapping,
    /// yet it raises the same event as a discard, so the page would read
    /// zeros instead of the snapshot: use `MADV_REMOVE`, a real discard);
    /// and not to punch holes in its file (`fallocate`), which raises no
    /// event at all, so the fill would put the snapshot's bytes back.
    pub allow_shared_memory: bool,
}

impl Default for LazyOptions {
    fn default() -> Self {
        LazyOptions {
            latency_budget: crate::params::LAZY_LATENCY_BUDGET,
            channels: crate::params::LAZY_CHANNELS,
            folio_size: 2 << 20,
            strategy: CopyStrategy::Auto,
            first: Vec::new(),
            skip: Vec::new(),
            start_cancelled: false,
            serve_during_batches: false,
            allow_shared_memory: false,
        }
    }
}

/// A source range that could not be read, in host addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LazyBad {
    /// First host address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Why: poison, vanished (truncated file), another SIGBUS code.
    pub kind: FaultKind,
}

/// What a thread touching a bad page gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadOutcome {
    /// SIGBUS `BUS_MCEERR_AR` at the address, as real poison
    /// (`UFFDIO_POISON`, Linux 6.6+).
    Poisoned,
    /// Zeros: this kernel cannot install poison; act on the report.
    Zeroed,
}

/// Counts so far, in base pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LazyProgress {
    /// Pages in all segments.
    pub total_pages: u64,
    /// Pages installed to serve a fault (the whole folio around it).
    pub faulted_pages: u64,
    /// Pages installed by the background fill.
    pub filled_pages: u64,
    /// Pages never filled: discarded, unmapped or skipped.
    pub skipped_pages: u64,
    /// Pages whose source could not be read.
    pub bad_pages: u64,
    /// Pages of the faulted and filled ones installed as zeros without
    /// reading the source: its holes ([`Source::holes`]). Base pages
    /// got the shared zero page (`UFFDIO_ZEROPAGE`; a later write there
    /// gets a base page of its own, also in THP-eligible memory, see the
    /// module docs); hugetlb pages a copy from zeros.
    pub zero_pages: u64,
    /// Faults served.
    pub faults: u64,
    /// The fill has ended and the ranges are unregistered.
    pub done: bool,
}

/// What a whole fill did.
#[derive(Debug, Clone, PartialEq)]
pub struct LazyReport {
    /// The final counts.
    pub progress: LazyProgress,
    /// Source ranges that could not be read.
    pub bad: Vec<LazyBad>,
    /// What touching them gives.
    pub bad_outcome: BadOutcome,
    /// Folios moved in whole with `UFFDIO_MOVE` (huge pages kept huge).
    pub whole_folios: u64,
    /// Background batches.
    pub batches: u64,
    /// The longest background batch, in microseconds, from its start to
    /// its last folio in (a fault waits for less: it cuts a batch short).
    pub longest_batch_us: f64,
    /// Seconds from [`fill_lazily`] until the fill ended.
    pub secs: f64,
    /// Forks during the fill whose child was filled.
    pub forks: u64,
    /// The mc strategy that copied.
    pub strategy: Option<CopyStrategy>,
    /// Anything unusual.
    pub notes: Vec<String>,
}

/// Why the lazy fill cannot run here: the caller should restore eagerly.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LazyRefusal {
    /// No userfaultfd with what the fill needs (all faults, the REMOVE,
    /// UNMAP, REMAP and FORK events) can be had here; the refusal names
    /// what is missing.
    #[error(transparent)]
    Userfaultfd(#[from] crate::sys::uffd::UffdRefusal),
    /// A segment is shared or file-backed memory, and
    /// [`LazyOptions::allow_shared_memory`] was not set: what the fill
    /// cannot see there could lose the snapshot's bytes (see that option).
    #[error("{addr:#x} + {len:#x} is shared or file-backed memory, which a lazy fill cannot guard (another mapping of it does not wait; MADV_DONTNEED there is not a discard): restore it eagerly, or opt in with allow_shared_memory")]
    NotPrivate {
        /// Start of the segment.
        addr: usize,
        /// Its length.
        len: usize,
    },
    /// A range could not be registered (already registered with another
    /// userfaultfd, not memory a userfaultfd can serve, not mapped).
    #[error("registering {addr:#x} + {len:#x}: {source}")]
    Register {
        /// Start of the range.
        addr: usize,
        /// Its length.
        len: usize,
        /// The kernel's answer.
        source: io::Error,
    },
}

/// Errors of [`fill_lazily`]. Nothing is registered when one is returned.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LazyError {
    /// The kernel or the process cannot do this; restore eagerly.
    #[error("lazy fill unavailable: {0}")]
    Refused(#[from] LazyRefusal),
    /// A segment is not page-aligned, is empty, wraps or overlaps another.
    #[error("segment {addr:#x} + {len:#x}: {why}")]
    BadSegment {
        /// Its start.
        addr: usize,
        /// Its length.
        len: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// A segment's bytes lie beyond the source's mapping.
    #[error("segment {addr:#x} wants source bytes up to {end:#x}, the source maps {mapped:#x}")]
    SourceTooShort {
        /// The segment's start.
        addr: usize,
        /// The end of its bytes in the source.
        end: u64,
        /// The source's mapped length.
        mapped: usize,
    },
    /// The mc copy cannot run (see [`McError`]).
    #[error("poison-safe copy unavailable: {0}")]
    Copy(#[from] McError),
    /// The copy channels could not start.
    #[error("copy channels: {0}")]
    Channel(#[from] ChannelError),
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

/// State shared between the handle and the fill thread.
#[derive(Debug, Default)]
struct Shared {
    faulted: AtomicU64,
    filled: AtomicU64,
    skipped: AtomicU64,
    bad: AtomicU64,
    zero: AtomicU64,
    faults: AtomicU64,
    total: AtomicU64,
    done: AtomicBool,
    /// Background fill paused (cancel).
    cancelled: AtomicBool,
    /// wait(): fill everything, then end.
    finish: AtomicBool,
    /// Set once the fill thread has stopped (its report is ready).
    report: Mutex<Option<LazyReport>>,
}

impl Shared {
    fn progress(&self) -> LazyProgress {
        LazyProgress {
            total_pages: self.total.load(Ordering::Relaxed),
            faulted_pages: self.faulted.load(Ordering::Relaxed),
            filled_pages: self.filled.load(Ordering::Relaxed),
            skipped_pages: self.skipped.load(Ordering::Relaxed),
            bad_pages: self.bad.load(Ordering::Relaxed),
            zero_pages: self.zero.load(Ordering::Relaxed),
            faults: self.faults.load(Ordering::Relaxed),
            done: self.done.load(Ordering::Acquire),
        }
    }
}

/// A fill in progress. Dropping it waits for the fill to end ([`wait`]):
/// the ranges must never stay registered with nobody serving them.
///
/// In a process forked from the one that started the fill, the handle is
/// a copy that controls nothing ([`LazyFill::in_forked_child`]): the fill
/// runs on in the parent, which fills the child's memory too, and the
/// copy's counts stay as they were at the fork. There `cancel` does
/// nothing, and `wait` and dropping return at once.
///
/// [`wait`]: LazyFill::wait
#[derive(Debug)]
pub struct LazyFill {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The process that started the fill (its thread lives there only).
    owner: u32,
}

impl LazyFill {
    /// Counts so far.
    pub fn progress(&self) -> LazyProgress {
        self.shared.progress()
    }

    /// Whether this handle is a copy in a process forked from the one that
    /// started the fill (see [`LazyFill`]).
    pub fn in_forked_child(&self) -> bool {
        std::process::id() != self.owner
    }

    /// Stops the background fill: what was filled stays, the rest is
    /// filled on touch (faults are still served) or by [`LazyFill::wait`].
    pub fn cancel(&self) {
        self.shared.cancelled.store(true, Ordering::Release);
    }

    /// Fills whatever is left (after a cancel too), unregisters the ranges
    /// and returns the report.
    pub fn wait(mut self) -> LazyReport {
        self.join()
    }

    fn join(&mut self) -> LazyReport {
        if self.in_forked_child() {
            // The fill thread is the parent's: neither joined nor detached
            // here, where it does not exist.
            std::mem::forget(self.thread.take());
            let mut r = self.no_report();
            r.notes = vec![
                "waited for in a forked child: the fill runs in the parent (which fills this process's memory too); these counts are as at the fork".into(),
            ];
            return r;
        }
        self.shared.finish.store(true, Ordering::Release);
        self.shared.cancelled.store(false, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // A panic in the fill thread was caught there (see fill.rs);
            // join only fails if it could not be.
            let _ = t.join();
        }
        self.shared
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| self.no_report())
    }

    /// The report where the fill thread left none: the counts alone.
    fn no_report(&self) -> LazyReport {
        LazyReport {
            progress: self.shared.progress(),
            bad: Vec::new(),
            bad_outcome: BadOutcome::Zeroed,
            whole_folios: 0,
            batches: 0,
            longest_batch_us: 0.0,
            secs: 0.0,
            forks: 0,
            strategy: None,
            notes: vec!["the fill thread ended without a report".into()],
        }
    }
}

impl Drop for LazyFill {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.join();
        }
    }
}

/// Registers `segments` for a lazy fill from `source` and returns at once.
///
/// Checks everything before registering anything; a [`LazyError`] means
/// nothing changed. [`LazyRefusal`] says what this kernel or process lacks
/// (no userfaultfd, a user-mode-only one, no fork events, no REMOVE
/// events): restore eagerly then.
///
/// # Safety
/// - Each segment is page-aligned private anonymous, shared memory or
///   hugetlb memory of the caller's whose pages are all empty (never
///   touched, or discarded): pages already there are kept, not filled.
/// - Until the fill ends the segments stay mapped (an unmap is seen and
///   its pages are never filled, but a new mapping the caller puts there
///   is not ours to fill), no code that cannot wait on a userfaultfd
///   (see the module docs) uses them, and no other userfaultfd registers
///   them.
/// - `source` stays as the caller promised when it was made.
pub unsafe fn fill_lazily(
    segments: &[Segment],
    source: Source,
    opts: &LazyOptions,
) -> Result<LazyFill, LazyError> {
    setup::start(segments, source, opts)
}

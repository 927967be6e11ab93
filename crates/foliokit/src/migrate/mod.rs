//! Migrating a range to a NUMA node, two ways.
//!
//! - **kernel** (the default): `move_pages(2)` in batches of N pages (the
//!   analogue of the kernel's `NR_MAX_BATCHED_MIGRATION`), optionally from
//!   several threads on disjoint sub-ranges, with per-page status. The
//!   kernel makes this safe for every kind of memory.
//! - **relocation** (opt-in, private anonymous read-write memory): per
//!   batch, the populated pages are taken out of the range with
//!   `UFFDIO_MOVE` (threads touching them wait on a userfaultfd), copied by
//!   the copy channels into folios allocated on the target node, and moved
//!   back in with `UFFDIO_MOVE`. The mapping itself is never replaced, so
//!   its protections, flags, advice, lock state and memory policy stay what
//!   they were; the ordering argument is in `relocate/mod.rs`.
//!
//! Both record per-batch latency until the batch's first folio is usable
//! again, and a latency budget can pick the batch size as it goes.

mod folios;
mod kernel;
mod prepare;
pub mod process;
mod relocate;
mod stage;
mod threads;
mod track;
pub(crate) mod vma;

pub(crate) use crate::budget::BatchController;
pub use crate::sys::numa::page_nodes;

use std::fmt;
use std::io;
use std::time::Duration;
use thiserror::Error;

use crate::batch::page_size;
use crate::channels::ChannelError;
use crate::copy::CopyStrategy;
use crate::mem::system::numa_nodes;
use crate::strategy::StrategyError;

/// Which way to migrate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Path {
    /// `move_pages(2)`: safe for every kind of memory.
    #[default]
    Kernel,
    /// Relocation where every precondition it can check holds for the
    /// range at call time, else the kernel path (and the report's notes say
    /// why). The caller still vouches for what no check can see (the
    /// `# Safety` section of [`migrate`]: vmsplice, PI and robust futexes,
    /// ptrace readers).
    Auto,
    /// Relocation, or a typed refusal with the memory untouched.
    Relocate,
}

/// The path a migration took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum MigratePath {
    /// `move_pages(2)`.
    Kernel,
    /// Relocation by userfaultfd and the copy channels.
    Relocate,
}

impl MigratePath {
    /// `"kernel"` or `"relocate"`, as JSON output spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            MigratePath::Kernel => "kernel",
            MigratePath::Relocate => "relocate",
        }
    }
}

impl fmt::Display for MigratePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to migrate: `MigrateOptions::default().channels(4)...`. Fields are
/// added in minor versions, so build it with the setters.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MigrateOptions {
    /// Kernel path (default), relocation, or `Auto`; see [`Path`].
    pub path: Path,
    /// Pages per batch (NR_MAX_BATCHED_MIGRATION is 512). With a latency
    /// budget, the starting size.
    pub batch_pages: usize,
    /// Copy channels (relocation) or threads (kernel path).
    pub channels: usize,
    /// The copy relocation uses; `auto` picks per batch.
    pub strategy: CopyStrategy,
    /// Largest first-folio latency to accept; adapts the batch size.
    pub latency_budget: Option<Duration>,
    /// Folio size relocation allocates on the target node (THP for 2 MiB,
    /// where the mapping allows THP).
    pub folio_size: usize,
    /// Relocation only: accept a userfaultfd that catches user-mode faults
    /// only, when no other can be had (no /dev/userfaultfd access, no
    /// CAP_SYS_PTRACE). Then a kernel-side access to a page in the batch
    /// being moved (read(2) into it, a futex, O_DIRECT, process_vm_*)
    /// fails with EFAULT instead of waiting. Off by default: without it,
    /// relocation is refused and `Auto` uses the kernel path. Note that
    /// relocation also needs fork events, which the kernel grants only with
    /// CAP_SYS_PTRACE; a process without it is refused either way.
    pub allow_user_mode_only: bool,
}

impl MigrateOptions {
    setters! {
        /// Sets the path.
        path: Path,
        /// Sets the pages per batch.
        batch_pages: usize,
        /// Sets the copy channels (relocation) or threads (kernel path).
        channels: usize,
        /// Sets the copy relocation uses.
        strategy: CopyStrategy,
        /// Sets the first-folio latency budget.
        latency_budget: Option<Duration>,
        /// Sets the folio size relocation allocates.
        folio_size: usize,
        /// Accepts a user-mode-only userfaultfd (see the field).
        allow_user_mode_only: bool,
    }
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            path: Path::Kernel,
            batch_pages: 512,
            channels: 1,
            strategy: CopyStrategy::Auto,
            latency_budget: None,
            folio_size: 2 << 20,
            allow_user_mode_only: false,
        }
    }
}

/// Why relocation will not run on a range (checked before anything is
/// touched).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Shared, file-backed or special memory: only private anonymous pages
    /// can be moved by `UFFDIO_MOVE`.
    #[error("relocation needs private anonymous memory, but this is {what}")]
    NotPrivateAnon {
        /// What the mapping is, e.g. its backing file.
        what: String,
    },
    /// The mapping is not readable and writable.
    #[error("the mapping is {perms}: relocation moves pages only between read-write mappings")]
    NotReadWrite {
        /// Its permissions as /proc/self/maps prints them, e.g. `"r-x"`.
        perms: String,
    },
    /// A VmFlag relocation cannot preserve or work under: shared, I/O or
    /// PFN mappings, hugetlb, shadow or grows-down stacks, sealed mappings,
    /// another userfaultfd already registered on the range.
    #[error("{meaning} (VmFlags '{flag}')")]
    Flag {
        /// The two-letter flag from /proc/self/smaps, e.g. `"sl"`.
        flag: &'static str,
        /// What it means, for the message.
        meaning: &'static str,
    },
    /// No userfaultfd with what relocation needs (`UFFDIO_MOVE`, the
    /// REMOVE, UNMAP, REMAP and FORK events; all faults unless
    /// [`MigrateOptions::allow_user_mode_only`]) can be had here, or a
    /// mapping lacks `UFFDIO_MOVE`; the refusal names what is missing.
    #[error(transparent)]
    Userfaultfd(#[from] crate::sys::uffd::UffdRefusal),
    /// The range holds the relocating thread's stack or allocator space it may
    /// touch while a batch is out.
    #[error("the range holds {what}: the migrating thread would wait on itself")]
    OwnMemory {
        /// What was found, e.g. "the relocating thread's stack".
        what: &'static str,
    },
    /// The mapping is mlocked and the staging area could not be locked too
    /// (`RLIMIT_MEMLOCK`).
    #[error("the mapping is mlocked and the staging area cannot be ({0})")]
    Mlock(io::Error),
    /// No helper thread could run the relocation (threads cannot be
    /// made here): it never runs on the calling thread, whose signal
    /// handlers may touch the range while a page is out.
    #[error(
        "no helper thread to relocate on (the calling thread's signal handlers could wait on it)"
    )]
    NoHelper,
    /// A thread of this process has no robust list, so relocation cannot
    /// tell where the kernel will write at its exit (its `clear_child_tid`
    /// word, its rseq area): a raw `clone`, or a C library that sets none.
    #[error(
        "thread {tid} has no robust list: relocation cannot locate the words the kernel \
         writes at its exit (clear_child_tid, rseq), and a lost write would hang pthread_join"
    )]
    UnknownThread {
        /// The thread's id.
        tid: i32,
    },
    /// `/proc` shows another pid namespace than the one this process's
    /// thread ids come from (a process in a new pid namespace that did not
    /// remount `/proc`): the threads' ids cannot be checked against it.
    #[error(
        "/proc belongs to another pid namespace than this process's ({levels} ids in NSpid): \
         relocation cannot check its threads; mount /proc in the process's own pid namespace"
    )]
    ForeignPidNamespace {
        /// How many namespaces `NSpid` spans (1 would be the same one).
        levels: usize,
    },
    /// mTHP sizes are enabled for the mapping, and which pages are in
    /// large folios cannot be read here (`/proc/kpageflags` and pagemap
    /// PFNs need CAP_SYS_ADMIN): `UFFDIO_MOVE` would split any PTE-mapped
    /// large folio, so the kernel path, which keeps them whole, must run.
    #[error(
        "mTHP is enabled for this mapping and its folio sizes cannot be read (no \
         CAP_SYS_ADMIN for /proc/kpageflags): relocation would split large folios"
    )]
    UnknownFolios,
    /// The kernel refused `UFFDIO_MOVE` on the range before anything was
    /// moved.
    #[error(
        "the kernel refused to move pages out of this mapping ({0}); e.g. soft-dirty \
         tracking (clear_refs) gives it protections a new mapping does not have"
    )]
    Incompatible(io::Error),
}

/// Why [`migrate`] failed. All but [`MigrateError::Sys`] and
/// [`MigrateError::Channel`] are returned before any page is moved.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// The range does not start on, or is not a whole number of, base pages.
    #[error("range {addr:#x} + {len} is not page-aligned and a whole number of pages")]
    Misaligned {
        /// Start of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// The range has length 0.
    #[error("empty range")]
    Empty,
    /// `addr + len` overflows.
    #[error("range {addr:#x} + {len} wraps around the address space")]
    Wraps {
        /// Start of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// Part of the range is not mapped.
    #[error("{addr:#x} is not mapped")]
    Unmapped {
        /// The first address no mapping covers.
        addr: usize,
    },
    /// The target node is not online.
    #[error("NUMA node {node} does not exist (online: {online:?})")]
    NoSuchNode {
        /// The node asked for.
        node: u32,
        /// The nodes that are online.
        online: Vec<u32>,
    },
    /// [`Path::Relocate`] cannot run on this range or in this process;
    /// nothing was touched. ([`Path::Auto`] takes the kernel path instead.)
    #[error("relocation refused at {addr:#x}: {why}")]
    Refused {
        /// Start of the mapping (or page) that caused the refusal.
        addr: usize,
        /// Why.
        why: Refusal,
    },
    /// `batch_pages` or `channels` is 0, or `folio_size` is not a power of
    /// two.
    #[error("batch size must be at least one page, channels at least one and the folio size a power of two")]
    ZeroBatch,
    /// More channels than foliokit runs (`params::MAX_CHANNELS`).
    #[error("{asked} channels asked for: at most {most}")]
    TooManyChannels {
        /// The count asked for.
        asked: usize,
        /// The most there may be.
        most: usize,
    },
    /// A system call failed mid-way; pages in earlier batches have moved.
    #[error("{what}: {source}")]
    Sys {
        /// The call, e.g. `"move_pages"`.
        what: &'static str,
        /// Its error.
        source: io::Error,
    },
    /// The copy channels could not start.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The copy strategy asked for cannot run here.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
}

/// One batch: its size, and when its first folio was usable again.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BatchStat {
    /// Base pages in the batch.
    pub pages: usize,
    /// First-folio latency: microseconds from the batch's start (before
    /// any page of it is taken out or unmapped) until its first folio is
    /// usable at its address again. Relocation: take-out, the copy of the
    /// whole batch and the first install; kernel path: the whole first
    /// `move_pages` call, since the kernel does not say sooner. The same
    /// definition holds in the JSON output and the C API.
    pub first_folio_us: f64,
    /// Microseconds for the whole batch.
    pub total_us: f64,
    /// Relocation: where the batch's time went (zero on the kernel path).
    pub phases: Phases,
}

/// Where one relocation batch's time went, phase by phase, on the thread
/// that runs the batch: the phases add up to the batch's time on that
/// thread, with nothing counted twice. Work done ahead on a helper while
/// the previous batch ran (its destination folios) is in `prepared_ahead`,
/// outside the sum.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Phases {
    /// Reading which pages are populated and which folios they belong to,
    /// mapping the staging areas, and whatever of the destination folios
    /// was not prepared ahead (before any page is registered).
    pub prepare: Duration,
    /// Registering the batch, reading pagemap and folios again and the
    /// two looks at the threads (with any repair of a lost exit).
    pub checks: Duration,
    /// Moving the pages out into the parking area.
    pub out: Duration,
    /// Copying them into the destination folios (the copy channels).
    pub copy: Duration,
    /// Moving the destination folios in.
    pub install: Duration,
    /// Unregistering, waiting until no event is in flight, waking and
    /// unmapping the staging areas (freeing the old pages).
    pub finish: Duration,
    /// Preparing this batch's destination folios ahead, on a helper while
    /// the previous batch ran (not on the batch's own time).
    pub prepared_ahead: Duration,
}

impl Phases {
    /// The phases on the batch's own thread, added up.
    pub fn sum(&self) -> Duration {
        self.prepare + self.checks + self.out + self.copy + self.install + self.finish
    }
}

/// What a migration did.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MigrateReport {
    /// The path that ran (with [`Path::Auto`], the one it settled on).
    pub path: MigratePath,
    /// Why the path differs from the one asked for, or what it could not do.
    pub notes: Vec<String>,
    /// Length of the range in bytes.
    pub bytes: usize,
    /// Wall time of the migration proper.
    pub secs: f64,
    /// Relocation: time spent allocating destination folios on the target
    /// node before each batch's pages were taken (inside `secs`, outside
    /// the time threads wait).
    pub pool_secs: f64,
    /// Every batch, in order.
    pub batches: Vec<BatchStat>,
    /// Kernel path: pages that were not on the target node before.
    /// Relocation: populated pages found in the range.
    pub pages_to_move: usize,
    /// Pages `move_pages` could not move: (page address, positive errno,
    /// e.g. `EBUSY` for a pinned page, `ENOMEM` for a full node). The data
    /// is intact; those pages just stayed where they were.
    pub failed: Vec<(usize, i32)>,
    /// The copy strategy relocation ran (`None` on the kernel path).
    pub strategy: Option<CopyStrategy>,
    /// Relocation: pages now in new folios on the target node.
    pub relocated_pages: usize,
    /// Relocation: pages it left where they were (pinned for DMA, shared
    /// with another process, swapped out, or their mapping changed under
    /// the batch); they were handed to move_pages.
    pub left_in_place: usize,
    /// Relocation: pages the application zapped or unmapped while their
    /// batch was in flight; left as the application made them.
    pub dropped_pages: usize,
    /// Relocation: of `left_in_place`, pages of large folios it could not
    /// move whole (mTHP and other PTE-mapped large folios, THPs cut by the
    /// range or pinned): left whole for `move_pages`, never split.
    pub left_whole_folio_pages: usize,
    /// Relocation: of `left_in_place`, pages holding a live thread's
    /// descriptor (the words the kernel writes at its exit) or rseq area.
    pub left_thread_pages: usize,
    /// Relocation: batches it registered with its userfaultfd. Only while
    /// one is registered does the application's own userfaultfd get EBUSY
    /// registering (or EINVAL unregistering) over it (see [`migrate`]).
    pub registered_batches: usize,
}

impl MigrateReport {
    fn new(path: MigratePath, bytes: usize) -> Self {
        MigrateReport {
            path,
            notes: Vec::new(),
            bytes,
            secs: 0.0,
            pool_secs: 0.0,
            batches: Vec::new(),
            pages_to_move: 0,
            failed: Vec::new(),
            strategy: None,
            relocated_pages: 0,
            left_in_place: 0,
            dropped_pages: 0,
            left_whole_folio_pages: 0,
            left_thread_pages: 0,
            registered_batches: 0,
        }
    }

    /// Bytes moved per second, in GB/s with GB = 2^30 bytes (as `perf
    /// bench` prints).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / (1u64 << 30) as f64 / self.secs
    }

    /// The median first-folio latency over the batches, in microseconds.
    pub fn first_folio_us(&self) -> Option<f64> {
        median(self.batches.iter().map(|b| b.first_folio_us).collect())
    }
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Wraps a failed system call's error with what was being done.
fn sys(what: &'static str) -> impl FnOnce(io::Error) -> MigrateError {
    move |source| MigrateError::Sys { what, source }
}

/// Checks everything that does not depend on the path.
fn validate(addr: usize, len: usize, node: u32, o: &MigrateOptions) -> Result<(), MigrateError> {
    if len == 0 {
        return Err(MigrateError::Empty);
    }
    let page = page_size();
    if addr % page != 0 || len % page != 0 {
        return Err(MigrateError::Misaligned { addr, len });
    }
    addr.checked_add(len)
        .ok_or(MigrateError::Wraps { addr, len })?;
    if o.batch_pages == 0 || o.channels == 0 || !o.folio_size.is_power_of_two() {
        return Err(MigrateError::ZeroBatch);
    }
    if o.channels > crate::params::MAX_CHANNELS {
        return Err(MigrateError::TooManyChannels {
            asked: o.channels,
            most: crate::params::MAX_CHANNELS,
        });
    }
    let online = numa_nodes();
    if !online.contains(&node) {
        return Err(MigrateError::NoSuchNode { node, online });
    }
    vma::covering(addr, len).map(drop)
}

/// Migrates the pages of `[ptr, ptr + len)` to NUMA node `node`.
///
/// The default path ([`Path::Kernel`]) is `move_pages(2)`: the kernel keeps
/// it safe for every kind of memory. [`Path::Relocate`] (and [`Path::Auto`]
/// where the range qualifies) copies with foliokit's channels instead; it
/// runs only on private anonymous read-write memory that no other
/// userfaultfd watches, with a userfaultfd that catches kernel-mode faults
/// and receives fork events (root, `/dev/userfaultfd` access or
/// CAP_SYS_PTRACE) and `UFFDIO_MOVE` (Linux 6.8); otherwise it refuses with
/// [`MigrateError::Refused`] before touching anything, and `Auto` takes the
/// kernel path and says why in the report's notes.
///
/// While relocation runs, other threads may keep using the range in every
/// ordinary way: read, write, `read(2)`/`recv(2)` into it, futex waits
/// (glibc's and Rust's default mutexes and condition variables),
/// `process_vm_readv(2)`, `madvise(DONTNEED/FREE)`, `munmap`, `mremap`, `mprotect`, `mlock`,
/// `fork`. (One exception for `mremap`: while a batch is registered it is
/// a mapping of its own, so a move whose source crosses its edge fails
/// with EFAULT, and on Linux 6.17+ a move of several mappings that meets
/// it after others returns EFAULT with those others already moved. An
/// application that moves ranges across mapping edges meanwhile must use
/// the kernel path.) A thread touching a page of the batch in flight waits
/// until the page is back (at most one batch); zaps and unmaps are
/// honoured (a zapped page reads zero, nothing is mapped where the
/// application unmapped); a child forked mid-batch sees the parent's
/// data. Pages pinned for DMA
/// (`FOLL_PIN`: O_DIRECT in flight, io_uring fixed buffers, VFIO, RDMA) or
/// shared with another process are left in place and handed to
/// `move_pages`. The mapping itself (protections, VmFlags and advice, lock
/// state, memory policy) is never replaced.
///
/// What relocation does so that no program can hang on it:
///
/// - **Signal handlers of the calling thread.** The batch loop (register,
///   take out, copy, install, event reading) runs on a helper thread that
///   blocks every asynchronous signal; the calling thread only waits. A
///   handler that runs on it meanwhile and touches a page that is out
///   waits for the helper to put the page back, and its stores land.
///   Where no helper thread can be made, relocation refuses
///   ([`Refusal::NoHelper`]).
/// - **Thread exit.** The kernel writes a thread's `clear_child_tid` word
///   (what `pthread_join` waits on) and walks its robust list at exit, and
///   does not wait on a userfaultfd for an exiting task: with that page
///   out the write and the wake are lost. Before taking a batch out,
///   relocation asks every thread of the process for its robust list head
///   (`get_robust_list`; glibc sets it to the head inside the thread's
///   descriptor, next to `tid`) and leaves in place the pages around each
///   descriptor (its `struct pthread`, and the rseq area at
///   `__rseq_offset`); it looks again once the batch is out and puts back
///   any such page before copying. A thread with no robust list (a raw
///   `clone`, a C library that sets none) cannot be placed: relocation
///   refuses ([`Refusal::UnknownThread`]), or stops and hands the rest to
///   `move_pages`. Ordering: a thread alive at the first look is never
///   affected; one created after a descriptor page went out cannot be
///   created or exit without first touching that page in user mode
///   (`pthread_create` writes the descriptor, `start_thread` reads and
///   writes it before the exit call), so it waits; one alive at the second
///   look gets its page back. What is left is a thread that starts after
///   the first look and exits before the second, its last user-mode touch
///   of its descriptor before the take-out and its exit after. Its task id
///   was allocated between the first look and the end of the take-out:
///   where an id allocated in the pid namespace meanwhile belongs to no
///   task any more (or that cannot be told), on x86_64 glibc relocation
///   searches the pages it took out for such descriptors (the TCB points
///   to itself), clears a dead thread's `tid` word as the kernel would
///   have and wakes its joiners once the page is back. On
///   other architectures or C libraries that window stays open: do not
///   relocate memory holding thread stacks there. A robust mutex in the
///   range is not supported (below).
/// - **The application's own userfaultfd.** Relocation holds one batch
///   registered at a time (counted in [`MigrateReport::registered_batches`]),
///   and never between calls. While one is, `UFFDIO_REGISTER` over it by
///   another userfaultfd fails with EBUSY, and (Linux 6.13+)
///   `UFFDIO_UNREGISTER` by another descriptor over a span containing it
///   fails with EINVAL; retry once `migrate` returns, or between batches.
///   A range already registered with another userfaultfd is refused before
///   anything is touched; where the application registers part of the
///   range mid-call, relocation cannot register the next batch (EBUSY),
///   stops and hands the rest to `move_pages`.
/// - **Large folios.** `UFFDIO_MOVE` moves a PMD-mapped THP whole, and
///   splits any other large folio it touches. Relocation reads the folio
///   of every page (`/proc/self/pagemap` PFNs and `/proc/kpageflags`,
///   CAP_SYS_ADMIN) and leaves in place, whole, every large folio that is
///   not one PMD-sized, PMD-aligned folio inside the batch (mTHP, a
///   PTE-mapped or partly mapped THP, a THP cut by the range), and a THP
///   the kernel refuses to move (pinned: EBUSY): `move_pages` then moves
///   it as one. The report counts them ([`MigrateReport::left_whole_folio_pages`])
///   and says so in its notes. Where folios cannot be read and an mTHP
///   size is enabled for the mapping, relocation refuses
///   ([`Refusal::UnknownFolios`]) and `Auto` takes the kernel path; with
///   no mTHP possible, a PMD block the batch cuts is left in place and a
///   whole one moves as one unit. Residual: without `/proc/kpageflags`, a
///   THP whose PMD was split but whose pages are all still mapped, in
///   order, is taken for base pages and split.
///
/// Relocation also refuses ([`Refusal::OwnMemory`]) a range holding what
/// its own threads touch while pages are out: the stack of the helper or
/// of any of foliokit's threads, the shared channel pools (the pool and
/// its channels, not every allocation they make), free heap space the
/// allocator could hand out, or a loaded object's `.data` or `.bss` (the
/// C library's state, malloc's main arena among it). Other heap memory is
/// not recognised: pass ranges that are whole allocations (mmap regions,
/// large buffers), not the malloc heap or its arenas.
///
/// # Safety
/// The range must be memory of this process. Relocation cannot see page
/// references taken without `FOLL_PIN` (`vmsplice(2)` of the range into a
/// pipe, drivers using plain `get_user_pages`): such a holder keeps reading
/// the old page while the application writes the new one, so do not
/// relocate memory that is vmspliced or handed to such drivers; the kernel
/// path refuses to move such pages instead.
///
/// Some kernel paths fault a page in without the right to wait, and a
/// userfaultfd can only fail them while the page is out (measured on 6.18):
/// priority-inheritance futexes (`FUTEX_LOCK_PI`/`UNLOCK_PI`: pthread
/// mutexes with `PTHREAD_PRIO_INHERIT`) and `FUTEX_WAKE_OP` get `EFAULT`
/// (glibc then aborts), the robust-futex walk at thread exit skips an
/// entry whose page is out (waiters never see `EOWNERDEAD`; a robust
/// mutex itself is not placed, only the list head in the descriptor is),
/// and `ptrace(2)` or `/proc/<pid>/mem` reads get `EIO`. Do not relocate
/// memory holding such futexes or read by a debugger or another process
/// through those files while `migrate` runs: use the kernel path. On
/// architectures other than x86_64, or with a C library other than glibc,
/// do not relocate memory holding thread stacks (the thread-exit window
/// above).
///
/// Relocation copies through foliokit's shared copy channels: while it
/// relocates a range, do not copy from or into that range through the same
/// shared pool on another thread ([`crate::channels::shared`], `copy_folios`
/// with several channels), since relocation's copy may queue behind that
/// one, which waits for a page relocation holds out. `migrate` is not
/// async-signal-safe: do not call it from a signal handler.
pub unsafe fn migrate(
    ptr: *mut u8,
    len: usize,
    node: u32,
    o: &MigrateOptions,
) -> Result<MigrateReport, MigrateError> {
    let addr = ptr as usize;
    validate(addr, len, node, o)?;
    match o.path {
        Path::Kernel => kernel::move_range(addr, len, node, o),
        Path::Relocate => relocate::relocate(addr, len, node, o),
        Path::Auto => match relocate::relocate(addr, len, node, o) {
            Err(e @ MigrateError::Refused { .. }) => {
                let mut r = kernel::move_range(addr, len, node, o)?;
                r.notes.insert(0, format!("kernel path: {e}"));
                Ok(r)
            }
            other => other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }
}

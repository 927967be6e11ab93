//! foliokit: the Linux kernel's large-folio memory techniques for user space.
//!
//! - [`copy`](mod@copy): named copy strategies and a batched folio copy whose `auto`
//!   strategy is chosen per batch from the CPU, the batch size and reuse;
//! - [`clear`](mod@clear): the same for zero-filling, including the kernel's butterfly
//!   order for comparison;
//! - [`mem`]: huge-page-backed regions, guard pages, cache eviction,
//!   populate, and the system's THP/hugetlb/NUMA state (read only: the
//!   library never changes system settings);
//! - [`tune`]: the thresholds and rules `auto` follows, and calibration
//!   profiles (the `foliokit-lab` crate measures one).
//! - [`mc`]: machine-check-safe copies; [`nt`]: streaming stores with a
//!   drain safe code cannot forget; [`channels`] and [`migrate`]: parallel
//!   copy workers and NUMA migration/relocation.
//!
//! Measuring them (the runner, same-run limits, calibration, the seeds'
//! loops, and the guards that change mTHP/hugetlb settings for a run) is
//! the `foliokit-lab` crate's job, not this one's.
//!
//! ```
//! use foliokit::mem::Region;
//! use foliokit::{copy_folios, clear_folios, ClearOptions, CopyOptions, CopyStrategy, Reuse};
//!
//! // 8 MiB in 2 MiB folios, backed by THP where the system allows it.
//! let mut src = Region::new(8 << 20, 2 << 20)?;
//! let mut dst = Region::new(8 << 20, 2 << 20)?;
//! src.as_mut_slice().fill(7);
//!
//! // One batch; auto picks the primitive for this CPU and batch size.
//! let done = copy_folios(dst.as_mut_slice(), src.as_slice(), 2 << 20, CopyOptions::default())?;
//! assert_eq!(done.bytes, 8 << 20);
//! assert!(dst.as_slice().iter().all(|&b| b == 7));
//!
//! // Any strategy by name, e.g. write-once data streamed past the cache.
//! let opts = CopyOptions::default().strategy(CopyStrategy::Nt).reuse(Reuse::Stream);
//! copy_folios(dst.as_mut_slice(), src.as_slice(), 2 << 20, opts)?;
//!
//! // A source page that faults (poison, truncated file) is reported, not fatal.
//! # #[cfg(target_arch = "x86_64")]
//! foliokit::copy_mc(dst.as_mut_slice(), src.as_slice(), CopyStrategy::Auto)?;
//!
//! clear_folios(dst.as_mut_slice(), 2 << 20, ClearOptions::default())?;
//! assert!(dst.as_slice().iter().all(|&b| b == 0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Adopting foliokit: which call for which job
//!
//! VMM authors: the `foliokit-vm-memory` crate does all of the below on
//! rust-vmm's `GuestMemoryMmap` in guest addresses (prefault, poison-safe
//! snapshot and restore, migration of guest ranges). What follows is the
//! library underneath, for VMMs with their own memory model, tiering
//! agents, databases and runtimes.
//!
//! Every operation has a safe entry point on slices and a `_raw` one on
//! pointers. Use the raw ones for memory a `&[u8]` cannot soundly describe:
//! guest RAM that vCPUs write meanwhile, or a source that may raise SIGBUS.
//! They form no references, check overlap and wrap-around before writing,
//! and their `# Safety` sections say what concurrent access is allowed.
//!
//! ## Start-up: `init(Config)`
//!
//! Nothing happens behind the application's back. Without [`init`] the
//! first call that needs something sets it up with the defaults (the CPU is
//! detected on first `auto`, the SIGBUS handler installed on the first mc
//! copy, channel workers started unpinned on first use), and no profile
//! file is ever read. Call [`init`] once, early, to do all of it at a time
//! you choose, before pinning or sandboxing your threads:
//!
//! - **profile**: [`ProfileChoice::BuiltIn`] (default) follows the rules
//!   in [`tune`]; a profile file (one `foliokit calibrate` wrote) is read
//!   only when you ask with [`ProfileChoice::File`] or
//!   [`ProfileChoice::DefaultFile`], or pass one you stored yourself with
//!   [`ProfileChoice::Given`]. After `init` the hot path never touches the
//!   filesystem.
//! - **SIGBUS handler**: installed by default, because machine-check-safe
//!   copies need it. It handles only faults inside foliokit's mc routines
//!   and passes every other SIGBUS to the handler that was there before,
//!   so install your own handler *before* `init`. `sigbus_handler(false)`
//!   refuses it; mc copies then return [`McError::Unavailable`].
//! - **channel CPUs**: workers are unpinned by default, so they never
//!   collide with vCPU threads you pinned; [`ChannelCpus::Cpus`] names the
//!   CPUs, [`ChannelCpus::Spread`] spreads them over the process's mask.
//!   `start_channels(n)` starts a pool of `n` copy workers, and the `n - 1`
//!   helper threads populate and the kernel migration path share, during
//!   `init`.
//!
//! ```
//! use foliokit::{init, ChannelCpus, Config};
//!
//! let started = init(
//!     Config::new()
//!         .channel_cpus(ChannelCpus::Cpus(vec![0]))
//!         .start_channels(2),
//! )?;
//! println!("{} ({})", started.cpu.model, started.profile.note);
//! assert!(!started.profile.loaded, "no profile file was asked for");
//! # Ok::<(), foliokit::InitError>(())
//! ```
//!
//! ## Prefaulting guest RAM or a big buffer
//!
//! [`mem::populate`] (or [`mem::populate_raw`] for memory others may be
//! using) faults a range in for writing from several threads, a 2 MiB chunk
//! at a time so THP stays THP, without changing its contents. The report
//! says how many threads ran and how many chunks `MADV_POPULATE_WRITE`
//! handled (the rest were touched page by page, on kernels before 5.14).
//! Pass [`mem::populate_chunked`] the page size for 1 GiB hugetlb memory.
//!
//! ```
//! use foliokit::mem::{populate, resident_pages, Region};
//!
//! let mut ram = Region::unpopulated(8 << 20, 2 << 20)?; // not faulted in
//! let rep = populate(ram.as_mut_slice(), 2)?;
//! assert_eq!(rep.bytes, 8 << 20);
//! let pages = ram.len() / foliokit::batch::page_size();
//! assert_eq!(resident_pages(ram.as_ptr(), ram.len())?, pages);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Snapshotting memory
//!
//! [`copy_folios`] copies a region as one batch of folios; tell it the
//! snapshot will not be read back soon with [`Reuse::Stream`], and `auto`
//! switches to streaming stores (or the string instruction that avoids the
//! cache on this CPU) once the batch outgrows the cache. The report names
//! the strategy that ran. For live guest RAM use [`copy_folios_raw`] or
//! [`copy_raw`]; to serialise into a buffer record by record with streaming
//! stores, see [`nt::NtWriter`] (it drains before the buffer can be read).
//!
//! ```
//! use foliokit::mem::Region;
//! use foliokit::{copy_folios, CopyOptions, Reuse};
//!
//! let mut ram = Region::new(4 << 20, 2 << 20)?;
//! let mut snap = Region::new(4 << 20, 2 << 20)?;
//! ram.as_mut_slice().fill(0x5a);
//! let opts = CopyOptions::default().reuse(Reuse::Stream);
//! let rep = copy_folios(snap.as_mut_slice(), ram.as_slice(), 2 << 20, opts)?;
//! println!("{} folios by {}", rep.folios, rep.strategy);
//! assert_eq!(snap.as_slice(), ram.as_slice());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Restoring from memory that may be poisoned or truncated
//!
//! Reading a hardware-poisoned page, or a file mapping past the end of a
//! file truncated under it, raises SIGBUS. The mc copies (x86_64) survive
//! it and report what was not copied, as the kernel's `copy_mc_to_kernel`
//! does:
//!
//! - [`copy_mc`] / [`copy_mc_raw`]: one range; on a fault,
//!   [`McError::Fault`] says how many bytes were not copied (everything
//!   before them was), which source page (`bad_page`, in base pages from
//!   the first) and why ([`mc::FaultKind`]: poison or vanished).
//! - [`copy_folios_mc`]: a batch; a folio whose source faults is skipped
//!   and listed in [`McReport::faults`] with its index, the rest is still
//!   copied, so a restore loses only the bad folios.
//!
//! Other faults (SIGSEGV: unmapped memory) are not caught. Check
//! [`handler_state`] if something else in the process installs SIGBUS
//! handlers: one installed after foliokit's makes mc copies refuse with
//! [`McError::HandlerReplaced`] rather than let their faults reach it.
//!
//! ```
//! # #[cfg(target_arch = "x86_64")]
//! # {
//! use foliokit::mem::Region;
//! use foliokit::{copy_folios_mc, CopyOptions};
//!
//! let image = Region::new(4 << 20, 2 << 20)?;
//! let mut ram = Region::new(4 << 20, 2 << 20)?;
//! let rep = copy_folios_mc(ram.as_mut_slice(), image.as_slice(), 2 << 20, CopyOptions::default())?;
//! for f in &rep.faults {
//!     eprintln!("folio {}: page {} {}", f.index, f.fault.bad_page, f.fault.kind);
//! }
//! assert_eq!(rep.copied, rep.folios);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Memory tiering: moving pages between NUMA nodes
//!
//! [`migrate::migrate`] moves a range to a node. The default,
//! [`migrate::Path::Kernel`], is `move_pages(2)` in batches from several
//! threads: safe for every kind of memory, and pages it cannot move (pinned,
//! target node full) are listed with their errno in the report.
//! [`migrate::page_nodes`] tells where pages are now.
//!
//! Relocation ([`migrate::Path::Relocate`], or [`migrate::Path::Auto`] to
//! fall back to the kernel path) is opt-in: it copies with the channels
//! into folios on the target node while other threads keep using the
//! range, for private anonymous read-write memory on Linux 6.8+ with a
//! userfaultfd that catches kernel-mode faults. It keeps the mapping
//! exactly as it was or refuses with [`migrate::MigrateError::Refused`]
//! before touching anything. What no check can see is in the `# Safety`
//! section of [`migrate::migrate`]: do not relocate memory that is
//! vmspliced or held by drivers without `FOLL_PIN`, holds
//! priority-inheritance or robust futexes, or is read through ptrace.
//!
//! ```
//! use foliokit::mem::Region;
//! use foliokit::migrate::{migrate, MigrateOptions, MigratePath};
//!
//! let mut buf = Region::new(4 << 20, 2 << 20)?;
//! buf.as_mut_slice().fill(1);
//! // Node 0 exists on every machine; the kernel path is the default.
//! // SAFETY: `buf` is this process's own memory.
//! let rep = unsafe { migrate(buf.as_mut_ptr(), buf.len(), 0, &MigrateOptions::default()) }?;
//! assert_eq!(rep.path, MigratePath::Kernel);
//! assert!(buf.as_slice().iter().all(|&b| b == 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Channels as a copy engine
//!
//! A [`channels::ChannelPool`] spreads a batch over persistent worker
//! threads (or any engine implementing [`channels::Channel`], such as a
//! DMA engine). [`channels::ChannelPool::submit_copy`] returns an
//! [`channels::InFlight`] handle at once: poll it, ask which folios are done
//! (`folio_done`, e.g. to let a vCPU resume on the first), or `wait`.
//! The memory must stay valid and untouched until the batch ends (dropping
//! the handle waits). [`channels::shared`] gives a process-wide pool.
//!
//! ```
//! use foliokit::batch::folio_starts;
//! use foliokit::channels::ChannelPool;
//! use foliokit::mem::Region;
//! use foliokit::tune::Shape;
//! use foliokit::{CopyStrategy, Reuse};
//!
//! let folio = 2 << 20;
//! let (mut src, mut dst) = (Region::new(8 << 20, folio)?, Region::new(8 << 20, folio)?);
//! src.as_mut_slice().fill(3);
//! let pool = ChannelPool::cpu(2)?;
//! let dsts = folio_starts(dst.as_mut_ptr(), dst.len(), folio);
//! let srcs: Vec<*const u8> = folio_starts(src.as_mut_ptr(), src.len(), folio)
//!     .into_iter()
//!     .map(|p| p.cast_const())
//!     .collect();
//! let shape = Shape::batch(folio, dsts.len(), Reuse::Reread).on_channels(pool.len());
//! let copy = CopyStrategy::Auto.resolve(shape).function()?;
//! // SAFETY: both regions outlive the batch (waited for below) and nothing
//! // else touches them until it ends.
//! let batch = unsafe { pool.submit_copy(&dsts, &srcs, folio, copy) }?;
//! let outcome = batch.wait();
//! assert!(outcome.failed.is_empty());
//! assert!(dst.as_slice().iter().all(|&b| b == 3));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Cargo features
//!
//! - `serde` (default): `Serialize` on reports and system descriptions,
//!   `Serialize`/`Deserialize` on strategies and calibration profiles, and
//!   the profile files (`tune::read_profile`, `tune::save_profile`,
//!   [`ProfileChoice::File`], [`ProfileChoice::DefaultFile`]). With
//!   `default-features = false` the library depends only on `libc` and
//!   `thiserror`; every operation is still there, the file choices stay in
//!   [`ProfileChoice`] (so code naming them builds either way), and [`init`]
//!   refuses them with [`tune::ProfileError::FilesNeedSerde`].

#![deny(missing_docs)]

// The instructions themselves: reached through the strategy tables, and
// by foliokit-lab's probes through `internals`.
/// Builder setters of an options type: `pub fn field(mut self, value: T)
/// -> Self` for each `field: T` listed, with the doc comment written
/// before it. Only for setters that just store their argument; anything
/// else is written out.
macro_rules! setters {
    ($( $(#[$doc:meta])* $field:ident: $ty:ty ),+ $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $field(mut self, value: $ty) -> Self {
                self.$field = value;
                self
            }
        )+
    };
}

mod arch;
pub mod batch;
// Batch sizes under a latency budget, for relocation and the lazy fill.
mod budget;
pub mod channels;
pub mod clear;
pub mod copy;
pub mod cpu;
mod helpers;
pub mod lazy;
pub mod mc;
pub mod mem;
pub mod migrate;
pub mod nt;
// Every tuning number, read by mechanism and policy alike.
mod params;
mod pidlock;
pub mod runtime;
pub mod strategy;
// Raw userfaultfd/NUMA/pagemap wrappers: the library's own plumbing, with
// invariants (uffd registration, event reading) only migrate/ keeps. Users
// get the safe operations; the one query tools need is
// `migrate::page_nodes`.
pub(crate) mod sys;
pub mod tune;
// The userfaultfd engine relocation and the lazy fill share.
mod uffd;
// foliokit's persistent threads (channel workers and helpers), written once.
mod worker;

#[cfg(feature = "unstable-internals")]
#[doc(hidden)]
pub mod internals;

pub use batch::{BatchError, BatchReport, Reuse};
pub use clear::{clear, clear_folios, clear_folios_raw, clear_raw, ClearOptions, ClearStrategy};
pub use copy::{copy, copy_folios, copy_folios_raw, copy_raw, CopyOptions, CopyStrategy};
pub use mc::{
    copy_folios_mc, copy_mc, copy_mc_raw, handler_state, HandlerState, McError, McFault, McReport,
};
pub use runtime::{init, ChannelCpus, Config, InitError, ProfileChoice};
pub use strategy::{Strategy, StrategyError};
pub use sys::uffd::UffdRefusal;

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

#![deny(missing_docs)]

pub mod arch;
pub mod batch;
pub mod channels;
pub mod clear;
pub mod copy;
pub mod cpu;
pub mod mc;
pub mod mem;
pub mod migrate;
pub mod nt;
pub mod runtime;
pub mod strategy;
// Raw userfaultfd/NUMA/pagemap wrappers: the library's own plumbing, with
// invariants (uffd registration, event reading) only migrate/ keeps. Users
// get the safe operations; the one query tools need is
// `migrate::page_nodes`.
pub(crate) mod sys;
pub mod tune;

pub use batch::{BatchError, BatchReport, Reuse};
pub use clear::{clear, clear_folios, clear_folios_raw, clear_raw, ClearOptions, ClearStrategy};
pub use copy::{copy, copy_folios, copy_folios_raw, copy_raw, CopyOptions, CopyStrategy};
pub use mc::{
    copy_folios_mc, copy_mc, copy_mc_raw, handler_state, HandlerState, McError, McFault, McReport,
};
pub use runtime::{init, ChannelCpus, Config, InitError, ProfileChoice};
pub use strategy::{Strategy, StrategyError};

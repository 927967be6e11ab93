//! foliokit: the Linux kernel's large-folio memory techniques for user space.
//!
//! - [`copy`]: named copy strategies and a batched folio copy whose `auto`
//!   strategy is chosen per batch from the CPU, the batch size and reuse;
//! - [`clear`]: the same for zero-filling, including the kernel's butterfly
//!   order for comparison;
//! - [`mem`]: huge-page-backed regions, guard pages, cache eviction and the
//!   system's THP/hugetlb/NUMA state;
//! - [`tune`]: the thresholds and rules `auto` follows, and calibration
//!   profiles; [`calibrate`] measures one.

pub mod arch;
pub mod batch;
pub mod calibrate;
pub mod channels;
pub mod clear;
pub mod copy;
pub mod cpu;
pub mod mc;
pub mod measure;
pub mod mem;
pub mod migrate;
pub mod nt;
pub mod strategy;
pub mod sys;
pub mod tune;

pub use batch::{BatchError, BatchReport, Reuse};
pub use clear::{clear, clear_folios, clear_folios_raw, ClearOptions, ClearStrategy};
pub use copy::{copy, copy_folios, copy_folios_raw, CopyOptions, CopyStrategy};
pub use mc::{copy_folios_mc, copy_mc, McError, McFault, McReport};
pub use strategy::{Strategy, StrategyError};

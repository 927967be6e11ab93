//! Migrating a range to a NUMA node, two ways.
//!
//! - **kernel**: `move_pages(2)` in batches of N pages (the analogue of the
//!   kernel's `NR_MAX_BATCHED_MIGRATION`), optionally from several threads
//!   on disjoint sub-ranges, with per-page status.
//! - **relocation**, for private anonymous memory: per batch, write-protect
//!   the source with userfaultfd (writers wait, readers carry on), copy into
//!   destination folios on the target node taken from a pool faulted in
//!   beforehand (so faulting and zeroing stay off the critical path), with
//!   streaming stores drained before publishing, `mremap(MREMAP_FIXED)` the
//!   destination over the source, and wake the waiting writers.
//!
//! Both record per-batch latency until the batch's first folio is usable
//! again, and a latency budget can pick the batch size as it goes.

mod budget;
mod kernel;
mod maps;
mod relocate;

pub use budget::BatchController;

use serde::Serialize;
use std::io;
use std::time::Duration;
use thiserror::Error;

use crate::batch::page_size;
use crate::channels::ChannelError;
use crate::copy::CopyStrategy;
use crate::mem::system::numa_nodes;
use crate::strategy::StrategyError;

/// Which way to migrate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// Relocation where the memory allows it, else the kernel path (and the
    /// report says why).
    Auto,
    Kernel,
    /// Relocation or a typed error.
    Relocate,
}

#[derive(Debug, Clone, Copy)]
pub struct MigrateOptions {
    pub path: Path,
    /// Pages per batch (NR_MAX_BATCHED_MIGRATION is 512). With a latency
    /// budget, the starting size.
    pub batch_pages: usize,
    /// Copy channels (relocation) or threads (kernel path).
    pub channels: usize,
    /// The copy relocation uses; `nt` streams (the default).
    pub strategy: CopyStrategy,
    /// Largest first-folio latency to accept; adapts the batch size.
    pub latency_budget: Option<Duration>,
    /// Folio size the destination pool is backed with (THP for 2 MiB).
    pub folio_size: usize,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            path: Path::Auto,
            batch_pages: 512,
            channels: 1,
            strategy: CopyStrategy::Nt,
            latency_budget: None,
            folio_size: 2 << 20,
        }
    }
}

#[derive(Debug, Error)]
pub enum MigrateError {
    #[error("range {addr:#x} + {len} is not page-aligned and a whole number of pages")]
    Misaligned { addr: usize, len: usize },
    #[error("empty range")]
    Empty,
    #[error("range {addr:#x} + {len} wraps around the address space")]
    Wraps { addr: usize, len: usize },
    #[error("{addr:#x} is not mapped")]
    Unmapped { addr: usize },
    #[error("NUMA node {node} does not exist (online: {online:?})")]
    NoSuchNode { node: u32, online: Vec<u32> },
    #[error("relocation needs private anonymous memory, but {addr:#x} is {what}")]
    NotPrivateAnon { addr: usize, what: String },
    #[error("userfaultfd write-protect is unavailable: {0}")]
    NoUffd(io::Error),
    #[error("batch size must be at least one page and channels at least one")]
    ZeroBatch,
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        source: io::Error,
    },
    #[error(transparent)]
    Channel(#[from] ChannelError),
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    #[error(transparent)]
    Mem(#[from] crate::mem::MemError),
    #[error(transparent)]
    Populate(#[from] crate::mem::PopulateError),
}

/// One batch: its size, and when its first folio was usable again.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BatchStat {
    pub pages: usize,
    pub first_folio_us: f64,
    pub total_us: f64,
}

/// What a migration did.
#[derive(Debug, Clone, Serialize)]
pub struct MigrateReport {
    /// "kernel" or "relocate".
    pub path: &'static str,
    /// Why the path differs from the one asked for, or what it could not do.
    pub notes: Vec<String>,
    pub bytes: usize,
    /// Wall time of the migration proper (excluding the destination pool).
    pub secs: f64,
    /// Faulting in the destination pool, off the critical path (relocation).
    pub pool_secs: f64,
    pub batches: Vec<BatchStat>,
    /// Kernel path: pages that were not on the target node before.
    pub pages_to_move: usize,
    /// Kernel path: pages move_pages could not move, with the errno.
    pub failed: Vec<(usize, i32)>,
    /// The copy strategy relocation ran.
    pub strategy: &'static str,
}

impl MigrateReport {
    pub fn gbps(&self) -> f64 {
        crate::measure::gbps(self.bytes, self.secs)
    }

    pub fn first_folio_us(&self) -> Option<f64> {
        let v: Vec<f64> = self.batches.iter().map(|b| b.first_folio_us).collect();
        crate::measure::Stats::of(&v).map(|s| s.median)
    }
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
    if o.batch_pages == 0 || o.channels == 0 {
        return Err(MigrateError::ZeroBatch);
    }
    let online = numa_nodes();
    if !online.contains(&node) {
        return Err(MigrateError::NoSuchNode { node, online });
    }
    maps::check_mapped(addr, len)
}

/// Migrates `[ptr, ptr + len)` to `node`.
///
/// # Safety
/// The range must be memory of this process. Other threads may read and
/// write it meanwhile (that is the point), but none may unmap, remap or
/// change its protection, and no device or `O_DIRECT` I/O may have its pages
/// pinned: relocation replaces the pages under the same addresses.
pub unsafe fn migrate(
    ptr: *mut u8,
    len: usize,
    node: u32,
    o: &MigrateOptions,
) -> Result<MigrateReport, MigrateError> {
    let addr = ptr as usize;
    validate(addr, len, node, o)?;
    let mut notes = Vec::new();
    let relocate = match o.path {
        Path::Kernel => false,
        Path::Relocate => {
            maps::check_private_anon(addr, len)?;
            true
        }
        Path::Auto => match maps::check_private_anon(addr, len) {
            Ok(()) => true,
            Err(e) => {
                notes.push(format!("kernel path: {e}"));
                false
            }
        },
    };
    if relocate {
        // SAFETY: forwarded contract; the range is private anonymous memory.
        match unsafe { relocate::relocate(addr, len, node, o) } {
            Err(MigrateError::NoUffd(e)) if o.path == Path::Auto => {
                notes.push(format!(
                    "kernel path: userfaultfd write-protect unavailable ({e})"
                ));
            }
            other => return other,
        }
    }
    let mut r = kernel::move_range(addr, len, node, o)?;
    r.notes.splice(0..0, notes);
    Ok(r)
}

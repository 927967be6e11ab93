//! foliokit for VMMs built on rust-vmm's [`vm_memory`]: prefault guest RAM
//! with parallel populate, snapshot and restore it with machine-check-safe
//! copies, and migrate guest ranges between NUMA nodes.
//!
//! Everything takes a [`GuestMemoryMmap`] (any dirty-bitmap type `B`) and
//! guest addresses, and reports in guest addresses:
//!
//! - [`prefault`] / [`prefault_range`]: fault guest RAM in for writing from
//!   several threads (`MADV_POPULATE_WRITE` per 2 MiB chunk), contents
//!   unchanged, so the guest's first touches do not fault;
//! - [`snapshot`] / [`snapshot_to_file`]: write every region to a `Write`
//!   (file, socket, buffer). A guest page that raises SIGBUS while it is
//!   read (hardware poison, a memory file truncated under the VMM) is
//!   reported as a [`BadRange`] and recorded in the snapshot instead of
//!   killing the VMM;
//! - [`restore_from_file`] / [`restore_from_bytes`] / [`restore_raw`]: copy
//!   a snapshot back with poison-safe copies. Snapshot pages that cannot be
//!   read (file truncated, page-cache poison) are reported as guest ranges
//!   with their kind; everything else is restored, and the regions' dirty
//!   bitmaps are marked for exactly the bytes written;
//! - [`restore_lazy`]: restore a snapshot file lazily: it returns at once
//!   (the vCPUs may run), every first touch waits for its folio to come
//!   from the snapshot, the rest fills in the background within a latency
//!   budget; unreadable snapshot pages become poison the guest can be told
//!   about, never garbage;
//! - [`migrate_range`]: move a guest range's pages to a NUMA node with the
//!   kernel's `move_pages(2)` ([`migrate_range_with`] opts into foliokit's
//!   relocation path, which has a contract).
//!
//! No `&[u8]` is ever formed over guest RAM: vCPUs may write it at any time
//! and a poisoned page is not readable, so every access goes through
//! foliokit's raw entry points ([`foliokit::copy_mc_raw`],
//! [`foliokit::mem::populate_raw`], [`foliokit::migrate::migrate`]).
//!
//! ```
//! use foliokit_vm_memory::{prefault, restore_from_bytes, snapshot};
//! use vm_memory::{bitmap::AtomicBitmap, Bytes, GuestAddress, GuestMemoryMmap};
//!
//! let ranges = [(GuestAddress(0), 4 << 20), (GuestAddress(1 << 32), 2 << 20)];
//! let vm = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&ranges)?;
//! prefault(&vm, 2)?;
//! vm.write_slice(b"hello", GuestAddress(1 << 32))?;
//!
//! let mut image = Vec::new();
//! let saved = snapshot(&vm, &mut image)?;
//! assert!(saved.bad.is_empty());
//!
//! let fresh = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&ranges)?;
//! let restored = restore_from_bytes(&fresh, &image)?;
//! assert!(restored.bad.is_empty());
//! let mut back = [0u8; 5];
//! fresh.read_slice(&mut back, GuestAddress(1 << 32))?;
//! assert_eq!(&back, b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod lazy;
mod migrate;
mod prefault;
mod save;
mod snapshot;
mod zeros;

use std::io;

use thiserror::Error;
use vm_memory::bitmap::Bitmap;
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};

pub use foliokit::mc::FaultKind;
pub use lazy::{
    restore_lazy, restore_lazy_from_path, BadOutcome, LazyOptions, LazyProgress, LazyReport,
    LazyRestore, LazyRestoreOptions, LazyRestoreReport,
};
pub use migrate::{migrate_range, migrate_range_with, GuestMigration};
pub use prefault::{prefault, prefault_range, PrefaultReport};
pub use save::{snapshot, snapshot_to_file, SnapshotReport};
pub use snapshot::{
    restore_from_bytes, restore_from_file, restore_from_path, restore_raw, RestoreReport,
};

/// A guest-physical range that could not be read, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadRange {
    /// First guest address of the range.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u64,
    /// Hardware poison, a vanished page (truncated file), or another
    /// SIGBUS code.
    pub kind: FaultKind,
}

/// Errors of this crate. Source pages that fault are not errors: they are
/// reported as [`BadRange`]s and the rest of the work is done.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// Part of the guest range is not backed by any region.
    #[error("guest range {:#x} + {len:#x} is not all guest memory: nothing at {:#x}", .addr.0, .missing.0)]
    NotGuestMemory {
        /// Start of the range asked for.
        addr: GuestAddress,
        /// Its length.
        len: u64,
        /// The first guest address in it that no region backs.
        missing: GuestAddress,
    },
    /// The guest range wraps around the 64-bit guest address space.
    #[error("guest range {:#x} + {len:#x} wraps around the guest address space", .addr.0)]
    Wraps {
        /// Start of the range.
        addr: GuestAddress,
        /// Its length.
        len: u64,
    },
    /// Prefault or restore writes, and this region is not mapped writable.
    /// Nothing was written.
    #[error("guest region at {:#x} is not mapped writable", .addr.0)]
    NotWritable {
        /// Start of the region.
        addr: GuestAddress,
    },
    /// Populating a guest range failed (e.g. out of memory).
    #[error("prefaulting guest {:#x} + {len:#x}: {source}", .addr.0)]
    Prefault {
        /// Start of the piece being populated.
        addr: GuestAddress,
        /// Its length.
        len: u64,
        /// What foliokit reported.
        source: foliokit::mem::PopulateError,
    },
    /// Migrating a guest range failed.
    #[error("migrating guest {:#x} + {len:#x}: {source}", .addr.0)]
    Migrate {
        /// Start of the piece being migrated.
        addr: GuestAddress,
        /// Its length.
        len: u64,
        /// What foliokit reported.
        source: foliokit::migrate::MigrateError,
    },
    /// [`migrate_range`] only takes the kernel path; relocation is opt-in
    /// through the `unsafe` [`migrate_range_with`].
    #[error("migrate_range takes the kernel path only; relocation is opt-in through the unsafe migrate_range_with")]
    RelocationNeedsUnsafe,
    /// The machine-check-safe copy could not run: no mc routines for this
    /// architecture, the SIGBUS handler could not be installed, or (for
    /// [`restore_raw`]) an image overlapping guest RAM.
    #[error("poison-safe copy could not run: {0}")]
    Copy(foliokit::McError),
    /// Writing guest RAM raised SIGBUS (a memory file truncated under the
    /// VMM, no huge page left in the pool, poison): the restore stopped
    /// there. Guest RAM before `addr` holds the snapshot's bytes.
    #[error("guest RAM at {:#x} raised SIGBUS while it was restored ({kind}): the restore stopped there", .addr.0)]
    GuestMemoryFault {
        /// The first guest address not written.
        addr: GuestAddress,
        /// What the kernel reported.
        kind: foliokit::mc::FaultKind,
    },
    /// Reading or writing the snapshot failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        source: io::Error,
    },
    /// The snapshot is not one this crate wrote, or its header is damaged.
    #[error("not a usable foliokit-vm-memory snapshot: {0}")]
    Format(String),
    /// Guest RAM a lazy restore would fill already has resident pages
    /// (a lazy restore only fills empty pages). Nothing was touched.
    #[error("guest RAM at {:#x} has {resident} resident pages; a lazy restore needs fresh guest memory", .addr.0)]
    NotEmpty {
        /// Start of the region.
        addr: GuestAddress,
        /// Pages found resident.
        resident: usize,
    },
    /// The lazy restore could not start; [`foliokit::lazy::LazyError::Refused`]
    /// says what this kernel or process lacks (restore eagerly then).
    #[error("lazy restore: {0}")]
    Lazy(foliokit::lazy::LazyError),
    /// A region of the snapshot does not lie inside one region of the guest
    /// memory it is restored into. Nothing was written.
    #[error("snapshot region {:#x} + {len:#x} does not fit inside one guest memory region", .addr.0)]
    Layout {
        /// Guest address of the snapshot region.
        addr: GuestAddress,
        /// Its length.
        len: u64,
    },
}

/// Shorthand for this crate's results.
pub type Result<T> = std::result::Result<T, Error>;

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Io { what, source }
}

/// One contiguous part of a guest range inside one region.
struct Piece<'a, B> {
    region: &'a GuestRegionMmap<B>,
    /// Guest address of the piece.
    addr: GuestAddress,
    /// Offset of the piece inside its region.
    offset: usize,
    len: usize,
    /// Host address of the piece's first byte.
    host: *mut u8,
}

/// Host address of a region's first byte (a `GuestRegionMmap` is one
/// contiguous host mapping).
fn region_host<B: Bitmap>(region: &GuestRegionMmap<B>) -> *mut u8 {
    let mapping: &vm_memory::MmapRegion<B> = region;
    mapping.as_ptr()
}

/// Splits `[addr, addr + len)` into per-region pieces, or says which guest
/// address no region backs.
fn pieces<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    addr: GuestAddress,
    len: u64,
) -> Result<Vec<Piece<'_, B>>> {
    addr.0.checked_add(len).ok_or(Error::Wraps { addr, len })?;
    let mut out = Vec::new();
    let mut cur = addr.0;
    let end = addr.0 + len;
    while cur < end {
        let region = mem
            .find_region(GuestAddress(cur))
            .ok_or(Error::NotGuestMemory {
                addr,
                len,
                missing: GuestAddress(cur),
            })?;
        let offset = cur - region.start_addr().0;
        let n = (region.len() - offset).min(end - cur);
        // Region offsets and lengths fit the host address space: the region
        // is mapped in it.
        let (offset, n_usize) = (offset as usize, n as usize);
        out.push(Piece {
            region,
            addr: GuestAddress(cur),
            offset,
            len: n_usize,
            host: region_host(region).wrapping_add(offset),
        });
        cur += n;
    }
    Ok(out)
}

/// Refuses pieces of a region not mapped writable, before anything writes
/// to them (a write would raise SIGSEGV, which nothing here catches).
fn check_writable<B: Bitmap>(parts: &[Piece<'_, B>]) -> Result<()> {
    match parts
        .iter()
        .find(|p| p.region.prot() & libc::PROT_WRITE == 0)
    {
        Some(p) => Err(Error::NotWritable {
            addr: p.region.start_addr(),
        }),
        None => Ok(()),
    }
}

/// Appends a bad range, merging it with the previous one when they touch
/// and share a kind.
fn push_bad(list: &mut Vec<BadRange>, addr: u64, len: u64, kind: FaultKind) {
    if len == 0 {
        return;
    }
    if let Some(last) = list.last_mut() {
        if last.kind == kind && last.addr.0 + last.len == addr {
            last.len += len;
            return;
        }
    }
    list.push(BadRange {
        addr: GuestAddress(addr),
        len,
        kind,
    });
}

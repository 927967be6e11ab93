//! Filling another process's memory: a userfaultfd that process made and
//! registered (a VMM's, handed over a socket as Firecracker hands it to
//! its page-fault handler), served by the same fill.
//!
//! What differs from a fill of the caller's own memory:
//! - Every page goes in with `UFFDIO_COPY` (or zeros, or poison): the
//!   kernel copies from this process's source into the other address
//!   space, on the fill thread and the channels' helpers at once.
//!   `UFFDIO_MOVE` moves pages within one address space only, so folios
//!   are not moved in whole; a hugetlb region's pages go in whole, one
//!   huge page per call.
//! - The descriptor's features are its maker's. Those the fill would have
//!   asked for and that are missing are named, with what each costs
//!   ([`External::costs`]).
//! - The registration is the other process's: the fill never unregisters.
//!   Once every page is in it keeps serving faults (a page the process
//!   discarded reads zeros) until the process has gone; a fill still
//!   running then stops. [`LazyFill::wait`] returns then.

use std::os::fd::OwnedFd;

use super::{LazyError, LazyFill, LazyOptions, LazyRefusal, Segment, Source};
use crate::sys::uffd::{self, Uffd};

/// A segment of another process's memory: where it is there, where its
/// bytes are in the source, and the page size it is mapped with (the base
/// page, or a hugetlb page size), which is the unit the fill installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExternalSegment {
    /// Addresses in the other process and source offset.
    pub segment: Segment,
    /// The mapping's page size in bytes.
    pub page_size: usize,
}

/// Another process's userfaultfd, adopted for [`fill_external`].
#[derive(Debug)]
pub struct External {
    pub(super) uffd: Uffd,
    features: u64,
    pub(super) gone: OwnedFd,
    pub(super) pid: Option<i32>,
}

/// What the fill would ask of a descriptor, and what missing it costs.
const WANTED: &[(u64, &str)] = &[
    (
        uffd::FEATURE_EVENT_REMOVE,
        "no REMOVE events: a range the process discards (MADV_DONTNEED or MADV_REMOVE, a balloon) is not seen, and the fill may put the snapshot's bytes back there",
    ),
    (
        uffd::FEATURE_EVENT_UNMAP,
        "no UNMAP events: a range the process unmaps is found when filling it fails, not before",
    ),
    (
        uffd::FEATURE_EVENT_REMAP,
        "no REMAP events: a range the process moves with mremap is unregistered by the kernel, and its pages not yet in read zeros",
    ),
    (
        uffd::FEATURE_EVENT_FORK,
        "no FORK events: a child the process forks reads zeros where the fill had not got yet",
    ),
];

impl External {
    /// Adopts `uffd`, a userfaultfd another process made, initialised and
    /// registered in missing mode over the memory to fill. `gone` becomes
    /// readable when that process has gone: its pidfd
    /// (`pidfd_open(2)` of the peer's pid, `SO_PEERCRED`), or the socket
    /// it connected on (closed when it exits).
    pub fn adopt(uffd: OwnedFd, gone: OwnedFd) -> Result<External, LazyError> {
        let (uffd, features) = Uffd::adopt(uffd)
            .map_err(|e| LazyRefusal::Userfaultfd(uffd::UffdRefusal::NoUffd(e)))?;
        Ok(External {
            uffd,
            features,
            gone,
            pid: None,
        })
    }

    /// The pid of the process whose memory this is: [`fill_external`]
    /// then checks each segment's page size against that process's
    /// mapping where it may read its smaps (a wrong one is refused), and
    /// notes in the report where it may not.
    pub fn with_pid(mut self, pid: i32) -> External {
        self.pid = Some(pid);
        self
    }

    /// The features its maker enabled (`UFFD_FEATURE_*` bits).
    pub fn features(&self) -> u64 {
        self.features
    }

    /// What the features its maker left out cost this fill, a line each
    /// (Firecracker asks for REMOVE events alone).
    pub fn costs(&self) -> Vec<String> {
        WANTED
            .iter()
            .filter(|(bit, _)| self.features & bit == 0)
            .map(|(_, cost)| cost.to_string())
            .collect()
    }

    /// Whether this kernel installs poison markers (`UFFDIO_POISON`,
    /// Linux 6.6) for snapshot pages that cannot be read; without, they
    /// are filled with zeros and reported.
    pub(super) fn poison(&self) -> bool {
        Uffd::supported_features().is_ok_and(|f| f & uffd::FEATURE_POISON != 0)
    }
}

/// Fills `segments` of another process's memory from `source` through
/// `ext`, its userfaultfd, and returns at once: faults are served first,
/// the rest filled in the background over the copy channels under
/// [`LazyOptions::latency_budget`]. `LazyOptions::folio_size` is the
/// block a fault installs around itself in base-page segments.
/// [`LazyOptions::allow_shared_memory`] is not consulted: what the other
/// process maps is its own contract (see the module docs of `lazy` for
/// what a fill assumes of the memory).
///
/// [`LazyFill::progress`]'s `done` turns true once every page is in;
/// [`LazyFill::wait`] returns once the process has gone (see
/// [`External::adopt`]), with `secs` the time until every page was in.
/// Checks every segment (aligned to its page size, inside the source)
/// before the first page goes in; a [`LazyError`] means nothing was
/// installed.
///
/// # Safety
/// The descriptor's address space is not this process's, or its
/// segments are memory this process does not use while the fill runs
/// (the fill writes into it as [`super::fill_lazily`] does). `source`
/// stays as the caller promised when it was made.
pub unsafe fn fill_external(
    ext: External,
    segments: &[ExternalSegment],
    source: Source,
    opts: &LazyOptions,
) -> Result<LazyFill, LazyError> {
    super::setup::start_external(ext, segments, source, opts)
}

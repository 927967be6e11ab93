//! Thin wrappers over the Linux interfaces foliokit needs that `libc` does
//! not wrap: userfaultfd, the NUMA syscalls, pagemap, maps and smaps, the fork
//! gates; and the page size and CPU affinity every layer asks about.

pub(crate) mod atfork;
pub(crate) mod event;
mod host;
pub(crate) mod maps;
pub mod numa;
pub mod pagemap;
pub(crate) mod poll;
// The Firecracker handoff's plumbing (lazy::firecracker, behind serde).
#[cfg(any(feature = "serde", test))]
pub(crate) mod scm;
pub mod smaps;
pub mod uffd;
pub(crate) mod vma;

pub(crate) use host::allowed_cpus;

/// The errno of a failed call (0 where it carries none).
pub(crate) fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}
pub use host::page_size;

//! Thin wrappers over the Linux interfaces foliokit needs that `libc` does
//! not wrap: userfaultfd, the NUMA syscalls, pagemap, smaps; and the page
//! size and CPU affinity every layer asks about.

mod host;
pub mod numa;
pub mod pagemap;
pub mod smaps;
pub mod uffd;

pub(crate) use host::allowed_cpus;
pub use host::page_size;

//! Thin wrappers over the Linux interfaces foliokit needs that `libc` does
//! not wrap: userfaultfd, the NUMA syscalls, pagemap, smaps.

pub mod numa;
pub mod pagemap;
pub mod smaps;
pub mod uffd;

//! Thin wrappers over the Linux interfaces foliokit needs that `libc` does
//! not wrap: userfaultfd, the NUMA syscalls, pagemap.

pub mod numa;
pub mod pagemap;
pub mod uffd;

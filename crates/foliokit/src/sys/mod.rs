//! Thin wrappers over the Linux calls foliokit needs that `libc` does not
//! wrap: userfaultfd's write-protect ioctls and the NUMA syscalls.

pub mod numa;
pub mod uffd;

//! UNSTABLE: the pieces of foliokit's inside that `foliokit-lab` measures
//! with (its bandwidth probes run the bare instructions; its guards change
//! the sysfs settings foliokit only reads), and that foliokit-vm-memory's
//! tests check with (smaps, as a dev-dependency). Behind the non-default
//! `unstable-internals` feature and hidden from the docs: anything here
//! may change or go in any release, minor ones included. Adopters use the
//! documented modules.

#[cfg(target_arch = "x86_64")]
pub use crate::arch::x86_64::{clear as x86_clear, copy as x86_copy, split_blocks};
pub use crate::arch::{sfence, CAN_FLUSH};
/// How much of a range the kernel maps with PMD THPs: the lab's restore
/// rows and foliokit-vm-memory's tests check it with the parser foliokit's
/// own reports use, not a copy of it.
pub use crate::sys::smaps::anon_huge_bytes;

/// The THP sysfs directory (`mem::system` reads it; the lab's mTHP guard
/// writes it).
pub const THP_DIR: &str = crate::mem::system::THP_DIR;

/// The sysfs directory of the hugetlb pool of `size`-byte pages.
pub fn hugetlb_dir(size: usize) -> String {
    crate::mem::system::hugetlb_dir(size)
}

/// The userfaultfd a VMM makes, registers and hands to its page-fault
/// handler: the lab's player of Firecracker's side opens it, and the
/// lab's one-fault-at-a-time handler serves it, with the wrapper foliokit
/// uses, not a second one.
pub use crate::sys::uffd::{Msg, Uffd, FEATURE_EVENT_REMOVE};

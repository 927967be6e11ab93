//! The userfaultfd engine: what relocation and the lazy fill share above
//! the descriptor (`sys::uffd`) and below their jobs.
//!
//! - [`gate`]: the one fork gate every thread that must answer a FORK
//!   event enters, so that glibc's fork() never waits on a thread that
//!   needs the allocator it holds;
//! - [`child`]: filling a forked child's copy of a registered range, with
//!   one policy: a page the child is owed is never given up on.

pub(crate) mod child;
pub(crate) mod gate;

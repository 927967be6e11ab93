//! The C ABI of foliokit: `include/foliokit.h` documents every function,
//! and `tests/header_agrees.rs` holds the header and these sources to the
//! same functions, structs and constants. Each entry point validates its
//! arguments, maps typed errors to negative errno-style codes (`error`)
//! and catches panics so none crosses into C.
//!
//! One module per area of the library, named like it; the pieces every
//! area shares are `error`, `args` and `ext` (extensible structs).

mod args;
mod batch;
mod error;
mod ext;
mod lazy;
mod mc;
mod mem;
mod migrate;
mod nt;
mod process;
mod runtime;

// The workspace's one test harness (guarded buffers, truncatable files,
// child processes), as the other crates' tests use it; it names the
// library `foliokit`, which this crate's own library is called.
#[cfg(test)]
extern crate fk as foliokit;
#[cfg(test)]
#[path = "../../foliokit/tests/common/mod.rs"]
mod common;
#[cfg(test)]
mod layout;
#[cfg(test)]
#[path = "../version.rs"]
mod version;

//! foliokit-lab: the experiments around the foliokit library.
//!
//! The library ([`foliokit`]) holds the operations and their types; this
//! crate holds every seed experiment and what only measuring needs, for
//! `foliokit bench`, `lab`, `compare` and `calibrate`. The CLI parses
//! arguments and renders; it measures nothing itself.
//!
//! One module per experiment, each with its plan, its loop and its row type:
//!
//! - [`copy_clear`]: seeds 000 and 002, folio copy and clear by strategy
//!   (one bench over both operations);
//! - [`fault`]: seed 002's demand faults (`perf bench mem mmap`);
//! - [`init`]: seed 003's write-once initialisation;
//! - [`migrate`]: seed 001's batched migration (and seed 000's move_pages
//!   table), with another process as the mover for table 4;
//! - [`remap`]: seed 004's mremap loop and the selftest's 1 GiB mremap;
//! - [`restore`]: restoring guest RAM from a snapshot, eager and lazy;
//! - [`vmm`]: a process playing Firecracker on snapshot load, for the
//!   external page-fault handler's tests and bench rows.
//!
//! Around them:
//!
//! - [`runner`]: the lab run, every step's plan at each scale;
//! - [`schema`]: the one result schema (reports, rows read back, a lab's
//!   results.json) that writers, the summary and `compare` share;
//! - [`seeds`]: the seeds' published figures, from `seeds.json`;
//! - [`summary`]: each seed's figure against ours, in the same shape;
//! - [`measure`]: the interleaved runner, statistics, same-run limits and
//!   the per-operation measurement of copy and clear strategies;
//! - [`prepare`]: shape checks, mTHP for a row, counted backing;
//! - [`progress`] and [`units`]: how experiments report progress, and the
//!   byte sizes they print;
//! - [`probe`]: the read / streaming-write kernels the limits run;
//! - [`calibrate`]: measures a calibration profile (the profile types, and
//!   how `auto` reads one, stay in [`foliokit::tune`]);
//! - [`census`]: the folio sizes that actually back a range (kpageflags);
//! - [`mthp`] and [`hugetlb`]: guards that change system settings for a run
//!   (mTHP sysfs knobs, the hugetlb pool) and put them back on drop or
//!   Ctrl-C. The library itself never changes them.

pub mod calibrate;
pub mod census;
pub mod copy_clear;
mod error;
pub mod fault;
pub mod hugetlb;
pub mod init;
pub mod measure;
pub mod migrate;
pub mod mthp;
pub mod prepare;
pub mod probe;
pub mod progress;
pub mod remap;
pub mod restore;
pub mod runner;
pub mod schema;
pub mod seeds;
pub mod summary;
pub mod units;
pub mod vmm;

pub use error::LabError;
pub use progress::Progress;

//! foliokit-lab: the experiments around the foliokit library.
//!
//! The library ([`foliokit`]) holds the operations and their types; this
//! crate holds what only measuring them needs, for `foliokit bench`, `lab`
//! and `calibrate`:
//!
//! - [`measure`]: the interleaved runner, statistics, same-run limits and
//!   the per-operation measurement of copy and clear strategies;
//! - [`probe`]: the read / streaming-write kernels the limits run;
//! - [`calibrate`]: measures a calibration profile (the profile types, and
//!   how `auto` reads one, stay in [`foliokit::tune`]);
//! - [`restore`]: restoring guest RAM from a snapshot, eager and lazy;
//! - [`remap`]: seed 004's mremap loop and the selftest's 1 GiB mremap;
//! - [`census`]: the folio sizes that actually back a range (kpageflags);
//! - [`mthp`] and [`hugetlb`]: guards that change system settings for a run
//!   (mTHP sysfs knobs, the hugetlb pool) and put them back on drop. The
//!   library itself never changes them.

pub mod calibrate;
pub mod census;
pub mod hugetlb;
pub mod measure;
pub mod mthp;
pub mod probe;
pub mod remap;
pub mod restore;

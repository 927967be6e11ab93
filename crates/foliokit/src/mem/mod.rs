//! Memory the operations run on: regions backed by the page size a folio
//! size asks for, guard pages for tests, cache eviction, and the system's
//! THP / hugetlb / NUMA state.

mod region;
mod sysfs;
pub mod system;

pub use region::{Backing, MemError, Region};

//! Memory the operations run on: regions backed by the page size a folio
//! size asks for, guard pages for tests, cache eviction, and the system's
//! THP / hugetlb / NUMA state.

pub mod mthp;
mod populate;
mod region;
pub mod remap;
mod sysfs;
pub mod system;

pub use populate::{
    populate, populate_chunked, populate_raw, resident_pages, PopulateError, PopulateReport,
};
pub use region::{Backing, HugetlbGrant, MemError, Region};

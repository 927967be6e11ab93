//! Memory the operations run on: regions backed by the page size a folio
//! size asks for, guard pages for tests, cache eviction, populate, and the
//! system's THP / hugetlb / NUMA state (read only: the library never
//! changes system settings).

mod populate;
mod region;
mod sysfs;
pub mod system;

pub use populate::{
    populate, populate_chunked, populate_raw, resident_pages, PopulateError, PopulateReport,
};
pub use region::{size_name, Backing, MemError, Region};

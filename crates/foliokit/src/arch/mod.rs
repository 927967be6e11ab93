//! Architecture primitives behind one interface.
//!
//! `crate::copy` and `crate::clear` own the strategy names; this module maps
//! the instruction-level ones onto the current architecture's code and says
//! why a strategy is missing when it is.

/// A copy primitive: copies exactly `len` bytes from `src` to `dst`.
/// Callers guarantee both ranges are valid and disjoint.
pub type CopyFn = unsafe fn(dst: *mut u8, src: *const u8, len: usize);

/// A clear primitive: zeroes exactly `len` bytes at `dst`.
/// Callers guarantee the range is valid for writes.
pub type ClearFn = unsafe fn(dst: *mut u8, len: usize);

#[cfg(target_arch = "x86_64")]
pub mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::{
    clear_nodrain, clear_primitive, copy_nodrain, copy_primitive, flush_range, page_clear,
    page_copy, sfence, stream_nodrain, stream_record_nodrain, stream_words_nodrain, CAN_FLUSH,
    HAS_STREAMING,
};

#[cfg(not(target_arch = "x86_64"))]
pub mod generic;
#[cfg(not(target_arch = "x86_64"))]
pub use self::generic::{
    clear_nodrain, clear_primitive, copy_nodrain, copy_primitive, flush_range, page_clear,
    page_copy, sfence, stream_nodrain, stream_record_nodrain, stream_words_nodrain, CAN_FLUSH,
    HAS_STREAMING,
};

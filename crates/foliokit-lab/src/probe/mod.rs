//! The kernels behind the limit probes ([`crate::measure::Probe`]): a plain
//! sequential read, a streaming write of zeros and a streaming write of
//! other bytes, and ordinary-store writes for cache-resident buffers. They share the clear primitives' signature so the channel
//! pool can spread them like any clear.
//!
//! They live here, not in the library's `arch`, because they are
//! measurement instruments: no operation calls them, and they are built
//! only from what the library already exports (`sfence`, the streaming and
//! `clzero` clear primitives, the CPU flags).

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::{
    read_probe, write_cached_probe, write_probe, write_zero_cached_probe, write_zero_probe, PATTERN,
};

#[cfg(not(target_arch = "x86_64"))]
mod generic;
#[cfg(not(target_arch = "x86_64"))]
pub use self::generic::{
    read_probe, write_cached_probe, write_probe, write_zero_cached_probe, write_zero_probe, PATTERN,
};

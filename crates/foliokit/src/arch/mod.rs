//! Architecture primitives: the instructions each strategy names, and the
//! fences, flushes and streaming stores the operations build on. This
//! layer knows no foliokit type; the strategy tables in `crate::strategy`
//! point at its functions, and the CPU checks happen there.

#[cfg(target_arch = "x86_64")]
pub mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::{
    flush_range, sfence, stream_nodrain, stream_record_nodrain, stream_words_nodrain, CAN_FLUSH,
    HAS_STREAMING,
};

#[cfg(not(target_arch = "x86_64"))]
pub mod generic;
#[cfg(not(target_arch = "x86_64"))]
pub use self::generic::{
    flush_range, sfence, stream_nodrain, stream_record_nodrain, stream_words_nodrain, CAN_FLUSH,
    HAS_STREAMING,
};

//! Streaming (non-temporal) stores as a safe API.
//!
//! Streaming stores bypass the cache and are weakly ordered: until this
//! thread executes `sfence`, another thread — or a release/acquire handoff
//! that Rust's memory model relies on — may not see them (rust-lang/rust
//! #114582). So safe code only gets them through:
//! - [`memcpy_nt`], which drains before returning;
//! - [`NtWriter`], which holds the destination exclusively and drains when
//!   finished or dropped (also on unwind), so nothing can read lines still in
//!   flight; it is `!Send`, because a fence on another thread would not order
//!   this thread's stores;
//! - [`fill_from_template`], seed 003's pattern: update the element-specific
//!   fields of a template, stream it out, repeat; drain once at the end.

use std::marker::PhantomData;
use thiserror::Error;

use crate::arch;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum NtError {
    #[error("destination is {dst} bytes but source is {src}")]
    LengthMismatch { dst: usize, src: usize },
    #[error("write of {len} bytes at offset {offset} overruns the {cap}-byte destination")]
    OutOfBounds {
        offset: usize,
        len: usize,
        cap: usize,
    },
    #[error("array of {len} bytes is not a whole number of {record}-byte records")]
    NotRecordMultiple { len: usize, record: usize },
    #[error(
        "template of {size} bytes at alignment {align} cannot be streamed: records must be a non-zero multiple of 16 bytes on a 16-byte-aligned array"
    )]
    MisalignedTemplate { size: usize, align: usize },
}

/// Orders every streaming store this thread issued before any later store:
/// after it, the data is visible to anyone who synchronises with us.
#[inline]
pub fn drain() {
    arch::sfence();
}

/// Copies `src` into `dst` with streaming stores and drains before
/// returning. For many small copies, use an [`NtWriter`] and drain once.
pub fn memcpy_nt(dst: &mut [u8], src: &[u8]) -> Result<(), NtError> {
    if src.len() != dst.len() {
        return Err(NtError::LengthMismatch {
            dst: dst.len(),
            src: src.len(),
        });
    }
    let mut w = NtWriter::new(dst);
    w.write_at(0, src)?;
    w.finish();
    Ok(())
}

/// Exclusive streaming access to a buffer; drains when finished or dropped.
///
/// ```
/// let mut buf = vec![0u8; 256];
/// let mut w = foliokit::nt::NtWriter::new(&mut buf);
/// w.write_at(64, &[7u8; 64]).unwrap();
/// let done = w.finish(); // drained: safe to read
/// assert_eq!(done[64], 7);
/// ```
///
/// A writer cannot cross threads, since the drain must run on the thread
/// that issued the stores:
///
/// ```compile_fail
/// let mut buf = vec![0u8; 64];
/// let w = foliokit::nt::NtWriter::new(&mut buf);
/// std::thread::scope(|s| { s.spawn(move || drop(w)); });
/// ```
pub struct NtWriter<'a> {
    dst: &'a mut [u8],
    // Raw-pointer marker: !Send and !Sync (see the module docs).
    _not_send: PhantomData<*const ()>,
}

impl<'a> NtWriter<'a> {
    pub fn new(dst: &'a mut [u8]) -> Self {
        NtWriter {
            dst,
            _not_send: PhantomData,
        }
    }

    pub fn capacity(&self) -> usize {
        self.dst.len()
    }

    /// Streams `src` to `offset..offset + src.len()`, without draining.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), NtError> {
        let cap = self.dst.len();
        let end =
            offset
                .checked_add(src.len())
                .filter(|&e| e <= cap)
                .ok_or(NtError::OutOfBounds {
                    offset,
                    len: src.len(),
                    cap,
                })?;
        let d = &mut self.dst[offset..end];
        // SAFETY: `d` and `src` are valid, equally long and disjoint (`&mut`
        // vs `&`). The destination cannot be read until `self` drains: it is
        // mutably borrowed by the writer, which drains on finish and drop.
        unsafe { arch::stream_nodrain(d.as_mut_ptr(), src.as_ptr(), src.len()) };
        Ok(())
    }

    /// Drains and gives the buffer back, readable.
    pub fn finish(self) -> &'a mut [u8] {
        drain();
        let mut this = std::mem::ManuallyDrop::new(self);
        // Drained above; the Drop impl (which would drain again) is skipped.
        std::mem::take(&mut this.dst)
    }
}

impl Drop for NtWriter<'_> {
    fn drop(&mut self) {
        drain();
    }
}

/// Checks that `template` records can be streamed onto `array`.
fn check_records(array: &[u8], record: usize) -> Result<usize, NtError> {
    if record == 0 || record % 16 != 0 || array.as_ptr() as usize % 16 != 0 {
        return Err(NtError::MisalignedTemplate {
            size: record,
            align: 1 << (array.as_ptr() as usize).trailing_zeros().min(12),
        });
    }
    if array.len() % record != 0 {
        return Err(NtError::NotRecordMultiple {
            len: array.len(),
            record,
        });
    }
    Ok(array.len() / record)
}

/// Seed 003's write-once initialisation: for each record `i` of `array`,
/// `update(i, template)` sets the element-specific fields, then the template
/// is streamed to record `i`. Drains before returning, so every record is
/// visible when this returns. Records are `template.len()` bytes, a multiple
/// of 16 on a 16-byte-aligned array.
pub fn fill_from_template(
    array: &mut [u8],
    template: &mut [u8],
    mut update: impl FnMut(usize, &mut [u8]),
) -> Result<(), NtError> {
    let record = template.len();
    let n = check_records(array, record)?;
    let mut w = NtWriter::new(array);
    for i in 0..n {
        update(i, template);
        w.write_at(i * record, template)?;
    }
    w.finish();
    Ok(())
}

/// The same fill with ordinary cached stores (`memcpy` per record), the
/// baseline seed 003 replaces. Same checks, same result.
pub fn fill_from_template_cached(
    array: &mut [u8],
    template: &mut [u8],
    mut update: impl FnMut(usize, &mut [u8]),
) -> Result<(), NtError> {
    let record = template.len();
    let n = check_records(array, record)?;
    for (i, rec) in array.chunks_exact_mut(record).enumerate().take(n) {
        update(i, template);
        rec.copy_from_slice(template);
    }
    Ok(())
}

/// Whether streaming stores are real on this build (else ordinary stores).
pub const STREAMING: bool = arch::HAS_STREAMING;

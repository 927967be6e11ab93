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
//! - [`fill_records`], seed 003's pattern on a typed array: copy the
//!   template, update the element-specific fields, stream the whole record,
//!   repeat; drain once at the end. The record is a local the compiler keeps
//!   in registers, so nothing is stored and re-loaded between records;
//! - [`fill_from_template`], the same on a byte array with a byte template
//!   (the template lives in memory; the shared core loads it 8 bytes at a
//!   time, so loads are forwarded from 8-byte field updates).

use std::marker::PhantomData;
use thiserror::Error;

use crate::arch;

/// Why a streaming write was refused. Every check happens before the
/// first store; all sizes are in bytes.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum NtError {
    /// [`memcpy_nt`] was given slices of different lengths.
    #[error("destination is {dst} bytes but source is {src}")]
    LengthMismatch {
        /// Destination length.
        dst: usize,
        /// Source length.
        src: usize,
    },
    /// [`NtWriter::write_at`] would write past the end of its buffer.
    #[error("write of {len} bytes at offset {offset} overruns the {cap}-byte destination")]
    OutOfBounds {
        /// Where the write would start.
        offset: usize,
        /// Its length.
        len: usize,
        /// The writer's capacity.
        cap: usize,
    },
    /// [`fill_from_template`]'s array is not a whole number of templates.
    #[error("array of {len} bytes is not a whole number of {record}-byte records")]
    NotRecordMultiple {
        /// The array's length.
        len: usize,
        /// The template's length.
        record: usize,
    },
    /// [`fill_from_template`] needs 16-byte records on a 16-byte-aligned
    /// array (the streaming instruction stores 16 bytes at a time).
    #[error(
        "template of {size} bytes at alignment {align} cannot be streamed: records must be a non-zero multiple of 16 bytes on a 16-byte-aligned array"
    )]
    MisalignedTemplate {
        /// The template's length.
        size: usize,
        /// The array's alignment: the largest power of two dividing its
        /// address (capped at 4096).
        align: usize,
    },
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
    NtWriter::with(dst, |w| w.write_at(0, src))
}

/// Exclusive streaming access to a buffer, lent to a closure: the stores
/// are drained when it returns (or unwinds), before the buffer can be read.
///
/// ```
/// let mut buf = vec![0u8; 256];
/// foliokit::nt::NtWriter::with(&mut buf, |w| w.write_at(64, &[7u8; 64])).unwrap();
/// assert_eq!(buf[64], 7); // drained: safe to read
/// ```
///
/// The writer is only ever lent (`&mut`), never owned by the caller: an
/// owned writer could be leaked (`std::mem::forget`), and the buffer read
/// by another thread with stores still in flight, from safe code. Nor can
/// it cross threads, since the drain must run on the thread that issued
/// the stores:
///
/// ```compile_fail
/// let mut buf = vec![0u8; 64];
/// foliokit::nt::NtWriter::with(&mut buf, |w| {
///     std::thread::scope(|s| { s.spawn(|| w.capacity()); });
/// });
/// ```
pub struct NtWriter<'a> {
    dst: &'a mut [u8],
    // Raw-pointer marker: !Send and !Sync (see the module docs).
    _not_send: PhantomData<*const ()>,
}

impl<'a> NtWriter<'a> {
    /// Lends a writer over `dst` to `f`, then drains (also when `f`
    /// unwinds), and returns what `f` returned.
    pub fn with<R>(dst: &'a mut [u8], f: impl FnOnce(&mut NtWriter<'a>) -> R) -> R {
        // Dropped at the end of this function on every way out: its Drop
        // drains.
        let mut w = NtWriter {
            dst,
            _not_send: PhantomData,
        };
        f(&mut w)
    }

    /// The buffer's length in bytes.
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
        // vs `&`). The destination cannot be read until the writer drains:
        // it is borrowed by the writer, which `with` drops (draining) before
        // the borrow ends.
        unsafe { arch::stream_nodrain(d.as_mut_ptr(), src.as_ptr(), src.len()) };
        Ok(())
    }
}

impl Drop for NtWriter<'_> {
    fn drop(&mut self) {
        drain();
    }
}

/// Drains when dropped: the fills stream through raw pointers and must drain
/// on every way out, unwinding from the caller's `update` included.
struct DrainOnDrop;

impl Drop for DrainOnDrop {
    fn drop(&mut self) {
        drain();
    }
}

/// A type whose every byte is initialised in every value: no padding, no
/// `MaybeUninit`, no unions with uninitialised parts. [`fill_records`] reads
/// records as integers (8 bytes at a time) to stream them, which is only
/// defined for such types.
///
/// Implemented for the integer and float primitives and arrays of
/// `Record`s. For a `#[repr(C)]` struct of such fields with no padding
/// (check `size_of` against the sum of the fields), implement it yourself:
///
/// ```
/// #[derive(Clone, Copy)]
/// #[repr(C, align(64))]
/// struct Page { flags: u64, index: u64, rest: [u64; 6] }
/// // SAFETY: eight u64 fields, 64 bytes, no padding.
/// unsafe impl foliokit::nt::Record for Page {}
/// ```
///
/// # Safety
/// Every byte of every value of the type must be initialised.
pub unsafe trait Record: Copy {}

macro_rules! plain_records {
    ($($t:ty),*) => { $(
        // SAFETY: primitive integers and floats have no padding or
        // uninitialised bytes.
        unsafe impl Record for $t {}
    )* };
}
plain_records!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64);

// SAFETY: an array has no padding between elements (size is a multiple of
// the alignment), so its bytes are exactly its elements' bytes.
unsafe impl<T: Record, const N: usize> Record for [T; N] {}

/// Seed 003's write-once initialisation of a typed array: record `i` becomes
/// `template` after `update(i, &mut record)`, written with streaming stores.
/// Drains once, before returning (or when `update` unwinds), so every record
/// is visible when this returns.
///
/// The record being built is a local: with `update` inlined, the compiler
/// keeps it in registers and streams whole records without touching the
/// cache. Any record size and array alignment work: when records are a
/// multiple of 16 bytes on a 16-byte-aligned array every byte is streamed;
/// otherwise the 16-byte-aligned chunks of each record are streamed and its
/// unaligned head and tail written with ordinary stores.
///
/// ```
/// let mut pages = vec![[0u64; 8]; 1000];
/// foliokit::nt::fill_records(&mut pages, [7u64; 8], |i, r| r[0] = i as u64);
/// assert_eq!(pages[999], [999, 7, 7, 7, 7, 7, 7, 7]);
/// ```
pub fn fill_records<T: Record>(
    array: &mut [T],
    template: T,
    mut update: impl FnMut(usize, &mut T),
) {
    if std::mem::size_of::<T>() == 0 {
        // Nothing to store; `update` still sees every index.
        for i in 0..array.len() {
            let mut rec = template;
            update(i, &mut rec);
        }
        return;
    }
    let _drain = DrainOnDrop;
    // SAFETY: the array is borrowed exclusively until we return, after
    // `_drain` has drained; it holds `len` records of `T`.
    unsafe {
        stream_records(array.as_mut_ptr().cast(), array.len(), |i| {
            let mut rec = template;
            update(i, &mut rec);
            rec
        })
    }
}

/// The core of both template fills: streams `n` records, record `i` being
/// `next(i)`, to `base`, without draining. The record is a local value, so
/// with `next` inlined it lives in registers between records. Records that
/// are a multiple of 16 bytes on a 16-byte-aligned `base` are streamed
/// whole; otherwise each record's 16-byte-aligned chunks are streamed and
/// its unaligned head and tail stored normally.
///
/// # Safety
/// `base` must be valid for writes of `n * size_of::<T>()` bytes that
/// nothing else accesses, and nothing may read them before this thread
/// drains.
#[inline(always)]
unsafe fn stream_records<T: Record>(base: *mut u8, n: usize, mut next: impl FnMut(usize) -> T) {
    let size = std::mem::size_of::<T>();
    if size % 16 == 0 && base as usize % 16 == 0 {
        for i in 0..n {
            let rec = next(i);
            // SAFETY: record i lies inside the caller's range (i < n) and
            // starts 16-byte aligned (base aligned, size a multiple of 16);
            // `rec` is a live local, every byte initialised (`Record`).
            unsafe {
                arch::stream_words_nodrain(base.add(i * size), (&raw const rec).cast(), size)
            };
        }
    } else {
        for i in 0..n {
            let rec = next(i);
            // SAFETY: as above; this routine needs no alignment.
            unsafe {
                arch::stream_record_nodrain(base.add(i * size), (&raw const rec).cast(), size)
            };
        }
    }
}

/// [`fill_records`] with ordinary cached stores: the baseline it replaces,
/// and its reference.
pub fn fill_records_cached<T: Copy>(
    array: &mut [T],
    template: T,
    mut update: impl FnMut(usize, &mut T),
) {
    for (i, r) in array.iter_mut().enumerate() {
        let mut rec = template;
        update(i, &mut rec);
        *r = rec;
    }
}

/// Checks that `template` records can be streamed onto `array`.
fn check_records(array: &[u8], record: usize) -> Result<usize, NtError> {
    // An empty array's pointer is dangling, so its alignment says nothing.
    let misaligned = !array.is_empty() && array.as_ptr() as usize % 16 != 0;
    if record == 0 || record % 16 != 0 || misaligned {
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
/// of 16 on a 16-byte-aligned array. The template stays in memory (`update`
/// gets it as bytes); prefer [`fill_records`], which keeps it in registers.
pub fn fill_from_template(
    array: &mut [u8],
    template: &mut [u8],
    mut update: impl FnMut(usize, &mut [u8]),
) -> Result<(), NtError> {
    let record = template.len();
    let n = check_records(array, record)?;
    let base = array.as_mut_ptr();
    let _drain = DrainOnDrop;
    // Records up to 256 bytes go through the typed core with a local copy of
    // the template (kept in registers when `update` is inlined) carried from
    // record to record, exactly as the template itself would be; it is
    // copied back at the end.
    macro_rules! by_size {
        ($($n:literal)*) => {
            match record {
                $($n => {
                    let mut cur = [0u8; $n];
                    cur.copy_from_slice(template);
                    // SAFETY: `array` holds n records of $n bytes (checked),
                    // is borrowed exclusively until we return, after
                    // `_drain` has drained.
                    unsafe {
                        stream_records(base, n, |i| {
                            update(i, &mut cur[..]);
                            cur
                        })
                    };
                    template.copy_from_slice(&cur);
                    return Ok(());
                })*
                _ => {}
            }
        };
    }
    by_size!(16 32 48 64 80 96 112 128 144 160 176 192 208 224 240 256);
    for i in 0..n {
        update(i, template);
        // SAFETY: record i lies inside `array` (n records checked above),
        // starts 16-byte aligned and is a multiple of 16 bytes long
        // (check_records); the template is a distinct, initialised byte
        // slice. The array stays borrowed until `_drain` has drained.
        unsafe { arch::stream_words_nodrain(base.add(i * record), template.as_ptr(), record) };
    }
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

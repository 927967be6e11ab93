//! Validation shared by the page-granular batch entry points.
//!
//! A batch is a list of equal-size folios. Every check happens before the
//! first byte is written, so a rejected batch leaves memory untouched.

use thiserror::Error;

use crate::strategy::StrategyError;

/// Whether the caller will read the data again soon. Decides, together with
/// the batch's size, between cache-filling and streaming stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Reuse {
    /// The data will be read again soon: keep it in cache if it fits.
    #[default]
    Reread,
    /// Write-once data: do not pollute the cache with it.
    Stream,
}

/// Why a batch was rejected. Every check runs before the first byte is
/// written, so memory is untouched when one of these is returned.
///
/// `what` fields name the offending side (`"destination"` or `"source"`);
/// `index` fields count folios (or pointers, for the raw entry points)
/// from 0; lengths and addresses are in bytes.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchError {
    /// The folio size (first field) is zero or not a multiple of the base
    /// page size (second field).
    #[error("folio size {0} is not a non-zero multiple of the {1}-byte page size")]
    BadFolioSize(usize, usize),
    /// A folio does not start on a base-page boundary.
    #[error("{what} {index} at {addr:#x} is not aligned to the {page}-byte page size")]
    Misaligned {
        /// `"destination"` or `"source"`.
        what: &'static str,
        /// The folio's index in the batch.
        index: usize,
        /// Its start address.
        addr: usize,
        /// The base page size it must be aligned to.
        page: usize,
    },
    /// A contiguous range does not divide into whole folios.
    #[error("{what} is {len} bytes, not a multiple of the {folio_size}-byte folio size")]
    NotFolioMultiple {
        /// `"destination"` or `"source"`.
        what: &'static str,
        /// The range's length.
        len: usize,
        /// The batch's folio size.
        folio_size: usize,
    },
    /// Destination and source of a contiguous copy differ in length.
    #[error("destination is {dst} bytes but source is {src}")]
    LengthMismatch {
        /// Destination length.
        dst: usize,
        /// Source length.
        src: usize,
    },
    /// One folio of a list batch has a different length from the others.
    #[error("{what} {index} is {len} bytes but the batch's folio size is {folio_size}")]
    UnequalFolio {
        /// `"destination"` or `"source"`.
        what: &'static str,
        /// The folio's index in the batch.
        index: usize,
        /// Its length.
        len: usize,
        /// The batch's folio size.
        folio_size: usize,
    },
    /// A list copy has a different number of destinations (first field)
    /// and sources (second field).
    #[error("{0} destinations but {1} sources")]
    CountMismatch(usize, usize),
    /// A destination folio overlaps another destination or a source; the
    /// result would depend on the order the folios are copied in.
    #[error("destination {index} overlaps {other}")]
    Overlap {
        /// The destination folio's index.
        index: usize,
        /// What it overlaps, e.g. `"source 3"`.
        other: String,
    },
    /// `addr + len` overflows: the range cannot be real memory.
    #[error("address range at {addr:#x} + {len} wraps around the address space")]
    Wraps {
        /// Start of the range.
        addr: usize,
        /// Its length.
        len: usize,
    },
    /// The butterfly clear's hint page lies outside the folio.
    #[error("hint page {hint} is outside a folio of {pages} pages")]
    HintOutOfRange {
        /// The hint, in base pages from the folio's start.
        hint: usize,
        /// The folio's length in base pages.
        pages: usize,
    },
    /// The strategy cannot run here (or `auto` was not resolved).
    #[error(transparent)]
    Strategy(#[from] StrategyError),
}

/// What a batch did: the strategy that ran (`S`: [`crate::CopyStrategy`]
/// or [`crate::ClearStrategy`], what `auto` resolved to) and the bytes it
/// completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BatchReport<S> {
    /// The concrete strategy that ran (what `auto` resolved to).
    pub strategy: S,
    /// Folios processed: the whole batch, since a batch that passes
    /// validation is never stopped part-way.
    pub folios: usize,
    /// Bytes copied or cleared.
    pub bytes: usize,
}

pub use crate::sys::page_size;

pub(crate) fn check_folio_size(folio_size: usize) -> Result<(), BatchError> {
    let page = page_size();
    if folio_size == 0 || folio_size % page != 0 {
        return Err(BatchError::BadFolioSize(folio_size, page));
    }
    Ok(())
}

/// Checks that a copy's destination and source are equally long.
pub(crate) fn check_lengths(dst: &[u8], src: &[u8]) -> Result<(), BatchError> {
    if dst.len() != src.len() {
        return Err(BatchError::LengthMismatch {
            dst: dst.len(),
            src: src.len(),
        });
    }
    Ok(())
}

/// Checks a contiguous copy batch — equal lengths, whole folios, aligned
/// bases — and returns its folio count.
pub(crate) fn check_contiguous_copy(
    dst: &[u8],
    src: &[u8],
    folio_size: usize,
) -> Result<usize, BatchError> {
    check_lengths(dst, src)?;
    let n = folio_count("destination", dst.len(), folio_size)?;
    check_bases(
        &[
            ("destination", dst.as_ptr() as usize),
            ("source", src.as_ptr() as usize),
        ],
        dst.len(),
    )?;
    Ok(n)
}

/// Checks the base addresses of a contiguous batch (nothing to check when it
/// is empty: an empty slice's pointer is dangling, not misaligned).
pub(crate) fn check_bases(bases: &[(&'static str, usize)], len: usize) -> Result<(), BatchError> {
    if len == 0 {
        return Ok(());
    }
    for &(what, addr) in bases {
        check_addrs(what, std::iter::once(addr), len)?;
    }
    Ok(())
}

/// Checks that each address is page-aligned and its folio does not wrap.
pub(crate) fn check_addrs(
    what: &'static str,
    addrs: impl Iterator<Item = usize>,
    folio_size: usize,
) -> Result<(), BatchError> {
    let page = page_size();
    for (index, addr) in addrs.enumerate() {
        if addr % page != 0 {
            return Err(BatchError::Misaligned {
                what,
                index,
                addr,
                page,
            });
        }
        if addr.checked_add(folio_size).is_none() {
            return Err(BatchError::Wraps {
                addr,
                len: folio_size,
            });
        }
    }
    Ok(())
}

/// Checks one byte-granular copy (the raw single-range entry points): the
/// ranges must not wrap around the address space or overlap each other.
pub(crate) fn check_raw_pair(dst: usize, src: usize, len: usize) -> Result<(), BatchError> {
    for addr in [dst, src] {
        if addr.checked_add(len).is_none() {
            return Err(BatchError::Wraps { addr, len });
        }
    }
    if len > 0 && dst < src + len && src < dst + len {
        return Err(BatchError::Overlap {
            index: 0,
            other: "the source".to_string(),
        });
    }
    Ok(())
}

/// Rejects a batch where any destination folio overlaps another destination
/// or any source folio. Sources may overlap each other (reading twice is
/// harmless). O(n log n).
pub(crate) fn check_overlap(
    dsts: &[usize],
    srcs: &[usize],
    folio_size: usize,
) -> Result<(), BatchError> {
    let mut sorted: Vec<(usize, usize)> = dsts.iter().copied().zip(0..).collect();
    sorted.sort_unstable();
    for pair in sorted.windows(2) {
        if pair[1].0 < pair[0].0 + folio_size {
            return Err(BatchError::Overlap {
                index: pair[1].1,
                other: format!("destination {}", pair[0].1),
            });
        }
    }
    for (si, &s) in srcs.iter().enumerate() {
        // The last destination starting before the source's end is the only
        // one that can overlap it, since destinations are disjoint.
        let after = sorted.partition_point(|&(d, _)| d < s + folio_size);
        if after > 0 {
            let (d, di) = sorted[after - 1];
            if d + folio_size > s {
                return Err(BatchError::Overlap {
                    index: di,
                    other: format!("source {si}"),
                });
            }
        }
    }
    Ok(())
}

/// The start of each `folio_size` folio of `[base, base + len)` (the
/// pointer lists the raw batch APIs and copy channels take). Computing the
/// addresses touches no memory.
pub fn folio_starts(base: *mut u8, len: usize, folio_size: usize) -> Vec<*mut u8> {
    // No folio of size 0: no list (not one entry per byte).
    if folio_size == 0 {
        return Vec::new();
    }
    (0..len / folio_size)
        .map(|i| base.wrapping_add(i * folio_size))
        .collect()
}

/// Splits a contiguous length into folios, checking it divides evenly.
pub(crate) fn folio_count(
    what: &'static str,
    len: usize,
    folio_size: usize,
) -> Result<usize, BatchError> {
    check_folio_size(folio_size)?;
    if len % folio_size != 0 {
        return Err(BatchError::NotFolioMultiple {
            what,
            len,
            folio_size,
        });
    }
    Ok(len / folio_size)
}

/// The batch loop copy and clear share: runs `apply(i, f)` for each of `n`
/// folios with the resolved function `f`, or with its `undrained` twin and
/// one fence after the last folio. A fence per folio waits for each
/// folio's streaming stores to drain before the next starts, which at
/// 4 KiB folios costs more than the stores (clzero ran at ~57% of the
/// zero-write limit that way).
///
/// # Safety
/// `apply(i, g)` must be sound for every `i < n` and for `g` either `f` or
/// the undrained twin (the same stores without their closing fence).
pub(crate) unsafe fn drive<F: Copy>(
    n: usize,
    f: F,
    undrained: Option<F>,
    mut apply: impl FnMut(usize, F),
) {
    let undrained = if n > 1 { undrained } else { None };
    for i in 0..n {
        apply(i, undrained.unwrap_or(f));
    }
    if undrained.is_some() {
        crate::arch::sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_rules() {
        let f = 4096;
        assert!(check_overlap(&[0, 8192], &[4096, 4096], f).is_ok());
        assert!(matches!(
            check_overlap(&[0, 2048], &[1 << 20, 1 << 21], f),
            Err(BatchError::Overlap { .. })
        ));
        assert!(matches!(
            check_overlap(&[8192], &[8192 + 4095], f),
            Err(BatchError::Overlap { .. })
        ));
        assert!(check_overlap(&[8192], &[4096], f).is_ok());
        assert!(check_overlap(&[8192], &[12288], f).is_ok());
    }
}

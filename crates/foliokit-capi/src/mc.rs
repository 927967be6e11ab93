//! `fk_copy_mc`: the machine-check-safe copy, and the code of each kind of
//! source fault.

use std::ffi::{c_char, c_int, c_void};

use fk::mc::{FaultKind, McError};
use fk::CopyStrategy;

use crate::args::{disjoint, strategy};
use crate::error::{batch_err, guard};

/// The code `fk_copy_mc` returns for a source page that faulted.
pub(crate) fn fault_code(kind: FaultKind) -> c_int {
    match kind {
        FaultKind::Poison => -libc::EHWPOISON,
        // What read(2) returns for a buffer in a truncated file mapping.
        FaultKind::Vanished => -libc::EFAULT,
        FaultKind::Other(_) => -libc::EIO,
    }
}

/// # Safety
/// See `fk_copy_mc` in foliokit.h.
#[no_mangle]
pub unsafe extern "C" fn fk_copy_mc(
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
    strategy_name: *const c_char,
    not_copied: *mut usize,
    bad_page: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: both ranges valid for `len` bytes (the caller's contract).
        let (d, s) = unsafe { disjoint(dst, src, len) }?;
        // SAFETY: the caller's contract.
        let st: CopyStrategy = unsafe { strategy(strategy_name) }?;
        match fk::copy_mc(d, s, st) {
            Ok(_) => Ok(0),
            Err(e @ (McError::Fault(f) | McError::DestinationFault(f))) => {
                // SAFETY: the out-pointers are NULL or valid (contract).
                unsafe {
                    if !not_copied.is_null() {
                        *not_copied = f.not_copied;
                    }
                    if !bad_page.is_null() {
                        *bad_page = f.bad_page;
                    }
                }
                Err(match e {
                    McError::DestinationFault(_) => -libc::ENXIO,
                    _ => fault_code(f.kind),
                })
            }
            Err(McError::NoVariant(_) | McError::Unavailable(_)) => Err(-libc::EOPNOTSUPP),
            // Another SIGBUS handler replaced foliokit's after it started.
            Err(McError::HandlerReplaced) => Err(-libc::EBUSY),
            Err(McError::Batch(e)) => Err(batch_err(&e)),
            Err(_) => Err(-libc::EINVAL),
        }
    })
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::error::{msg, INTERNAL};
    use fk::mc::FaultKind;
    use fk::mem::Region;
    use std::ffi::c_int;

    #[test]
    fn fault_kinds_have_distinct_codes_and_messages() {
        let codes = [
            fault_code(FaultKind::Poison),
            fault_code(FaultKind::Vanished),
            fault_code(FaultKind::Other(libc::BUS_OBJERR)),
        ];
        assert_eq!(codes, [-libc::EHWPOISON, -libc::EFAULT, -libc::EIO]);
        let mut all: Vec<&str> = codes.iter().map(|&c| msg(c)).collect();
        all.push(msg(INTERNAL));
        all.push(msg(-libc::E2BIG));
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 5, "{all:?}");
        assert!(!all.contains(&"unknown error"));
        assert_eq!(msg(c_int::MIN), "unknown error");
        assert_eq!(msg(12345), "unknown error");
    }

    #[test]
    fn copy_mc_reports_a_vanished_page_as_efault() {
        const PAGE: usize = 4096;
        let src = crate::common::TruncatedFile::new(4 * PAGE, 1, None);
        src.truncate(2 * PAGE);
        let mut dst = Region::new(4 * PAGE, PAGE).expect("region");
        let dst = dst.as_mut_ptr();
        let (mut not_copied, mut bad) = (0usize, 0usize);
        // SAFETY: both ranges are mapped for 4 pages (the source's last two
        // raise SIGBUS, which is what fk_copy_mc survives).
        let rc = unsafe {
            fk_copy_mc(
                dst.cast(),
                src.as_ptr().cast(),
                4 * PAGE,
                std::ptr::null(),
                &mut not_copied,
                &mut bad,
            )
        };
        drop(src);
        assert_eq!((rc, not_copied, bad), (-libc::EFAULT, 2 * PAGE, 2));
        // NULL pointers with length 0: installs the handler, copies nothing.
        // SAFETY: nothing is read or written.
        let rc = unsafe {
            fk_copy_mc(
                std::ptr::null_mut(),
                std::ptr::null(),
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, 0);
        // Overlapping ranges are refused before anything is copied.
        // SAFETY: both ranges lie in our mapping.
        let rc = unsafe {
            fk_copy_mc(
                dst.cast(),
                dst.add(PAGE).cast(),
                2 * PAGE,
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, -libc::EINVAL);
    }
}

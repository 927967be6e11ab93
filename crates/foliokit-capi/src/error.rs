//! Return codes: every entry point returns 0 (or a count) or a negative
//! errno value, never a panic. The typed errors of the library map to codes
//! here, once, and `fk_strerror` names each code.

use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use fk::{BatchError, StrategyError};

/// The code of an internal failure (a panic, or an error the C API cannot
/// name): distinct from every code the operations report.
pub(crate) const INTERNAL: c_int = -libc::ENOTRECOVERABLE;

/// Runs `f`, turning a panic into [`INTERNAL`].
pub(crate) fn guard(f: impl FnOnce() -> Result<c_int, c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => e,
        Err(_) => INTERNAL,
    }
}

/// The kernel's own code for a failed system call, or `otherwise` for an
/// I/O error that carries none.
pub(crate) fn os_code(e: &std::io::Error, otherwise: c_int) -> c_int {
    -e.raw_os_error().unwrap_or(otherwise)
}

pub(crate) fn strategy_err(e: &StrategyError) -> c_int {
    match e {
        StrategyError::Unknown { .. } | StrategyError::Empty { .. } => -libc::ENOENT,
        StrategyError::Unavailable { .. } => -libc::EOPNOTSUPP,
        StrategyError::Unresolved { .. } => -libc::EINVAL,
        // A newer error the C API does not know yet.
        _ => -libc::EINVAL,
    }
}

pub(crate) fn batch_err(e: &BatchError) -> c_int {
    match e {
        BatchError::Strategy(s) => strategy_err(s),
        _ => -libc::EINVAL,
    }
}

#[no_mangle]
pub extern "C" fn fk_strerror(code: c_int) -> *const c_char {
    // wrapping_neg: even c_int::MIN must not overflow (no panic here).
    let s: &'static CStr = match code.wrapping_neg() {
        0 => c"success",
        libc::EINVAL => c"invalid argument: size, alignment, overlap, option or struct size",
        libc::E2BIG => c"struct has fields set that this library version does not know",
        libc::ENOENT => c"unknown strategy name",
        libc::EOPNOTSUPP => c"not supported on this CPU or kernel",
        libc::EHWPOISON => c"source page has a hardware memory error (poison); see not_copied",
        libc::EFAULT => {
            c"address not mapped, or a source page vanished (file truncated under the mapping)"
        }
        libc::EIO => c"source page raised another SIGBUS; see not_copied",
        libc::ENODEV => c"no such NUMA node",
        libc::EPERM => c"relocation refused for this memory or this process, or a lazy fill needs privilege (/dev/userfaultfd, CAP_SYS_PTRACE)",
        libc::ENOSYS => c"no userfaultfd in this kernel or process",
        libc::ENOMEM => c"out of memory",
        libc::EBADF => c"bad file descriptor",
        libc::EACCES => c"permission denied (for fk_lazy_start: fd not open for reading)",
        libc::ENOTRECOVERABLE => c"internal error in foliokit",
        libc::EALREADY => c"foliokit was already initialised (fk_init must come first)",
        libc::EBUSY => c"another SIGBUS handler replaced foliokit's; install yours before fk_init",
        libc::ESRCH => c"no such process, or it exited during the call",
        libc::ENOSPC => c"the NUMA node has no memory",
        libc::ENXIO => c"a destination page raised SIGBUS (a file truncated under it, no huge page for it); see not_copied",
        libc::ECHILD => c"the lazy fill handle belongs to the process this one was forked from",
        _ => c"unknown error",
    };
    s.as_ptr()
}

/// `fk_strerror`'s message for `code`, as Rust sees it.
#[cfg(test)]
pub(crate) fn msg(code: c_int) -> &'static str {
    // SAFETY: fk_strerror returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(fk_strerror(code)) }
        .to_str()
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code the header documents has its own message.
    #[test]
    fn every_documented_code_has_a_message() {
        const NAMES: &[(&str, c_int)] = &[
            ("E2BIG", libc::E2BIG),
            ("EACCES", libc::EACCES),
            ("EALREADY", libc::EALREADY),
            ("EBADF", libc::EBADF),
            ("EBUSY", libc::EBUSY),
            ("ECHILD", libc::ECHILD),
            ("EFAULT", libc::EFAULT),
            ("EHWPOISON", libc::EHWPOISON),
            ("EINVAL", libc::EINVAL),
            ("EIO", libc::EIO),
            ("ENODEV", libc::ENODEV),
            ("ENOENT", libc::ENOENT),
            ("ENOMEM", libc::ENOMEM),
            ("ENOSPC", libc::ENOSPC),
            ("ENOSYS", libc::ENOSYS),
            ("ENOTRECOVERABLE", libc::ENOTRECOVERABLE),
            ("ENXIO", libc::ENXIO),
            ("EOPNOTSUPP", libc::EOPNOTSUPP),
            ("EPERM", libc::EPERM),
            ("ESRCH", libc::ESRCH),
        ];
        let header = include_str!("../include/foliokit.h");
        let mut seen = 0;
        for word in header.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
            let Some(name) = word.strip_prefix("-E") else {
                continue;
            };
            let name = format!("E{name}");
            let (_, v) = NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("-{name} in foliokit.h: add it to this table"));
            assert_ne!(msg(-v), "unknown error", "-{name} has no message");
            seen += 1;
        }
        assert!(seen > 10, "only {seen} codes found in the header");
    }

    #[test]
    fn a_panic_becomes_the_internal_code() {
        assert_eq!(guard(|| panic!("test panic")), INTERNAL);
        assert_eq!(guard(|| Ok(7)), 7);
    }
}

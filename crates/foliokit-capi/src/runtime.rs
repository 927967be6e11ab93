//! The library's state: its version, explicit start-up (`fk_init`), the
//! calibration profile in force and the worker threads started up front.

use std::ffi::{c_char, c_int, c_uint};

use crate::error::{guard, INTERNAL};

/// Parses a decimal version component at compile time.
const fn parse_u32(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut v = 0u32;
    let mut i = 0;
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "version components are decimal");
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
}

/// `FK_VERSION` of this build: MAJOR * 1000000 + MINOR * 1000 + PATCH
/// (build.rs checks the header's macros against the same crate version).
const VERSION: u32 = parse_u32(env!("CARGO_PKG_VERSION_MAJOR")) * 1_000_000
    + parse_u32(env!("CARGO_PKG_VERSION_MINOR")) * 1_000
    + parse_u32(env!("CARGO_PKG_VERSION_PATCH"));

#[no_mangle]
pub extern "C" fn fk_version() -> u32 {
    VERSION
}

/// `fk_init` flags.
pub(crate) const FK_INIT_NO_SIGBUS_HANDLER: c_uint = 1;
pub(crate) const FK_INIT_PROFILE_FILE: c_uint = 2;
pub(crate) const FK_INIT_SPREAD_CHANNELS: c_uint = 4;

/// Explicit start-up; see the header.
#[no_mangle]
pub extern "C" fn fk_init(flags: c_uint) -> c_int {
    guard(|| {
        let known = FK_INIT_NO_SIGBUS_HANDLER | FK_INIT_PROFILE_FILE | FK_INIT_SPREAD_CHANNELS;
        if flags & !known != 0 {
            return Err(-libc::EINVAL);
        }
        let mut c = fk::Config::new().sigbus_handler(flags & FK_INIT_NO_SIGBUS_HANDLER == 0);
        if flags & FK_INIT_PROFILE_FILE != 0 {
            c = c.profile(fk::ProfileChoice::DefaultFile);
        }
        if flags & FK_INIT_SPREAD_CHANNELS != 0 {
            c = c.channel_cpus(fk::ChannelCpus::Spread);
        }
        match fk::init(c) {
            Ok(_) => Ok(0),
            Err(fk::InitError::AlreadyInitialized) => Err(-libc::EALREADY),
            Err(fk::InitError::Sigbus(errno)) => Err(-errno),
            Err(_) => Err(-libc::EINVAL),
        }
    })
}

/// # Safety
/// See `fk_profile_status` in foliokit.h.
#[no_mangle]
pub unsafe extern "C" fn fk_profile_status(buf: *mut c_char, len: usize) -> c_int {
    guard(|| {
        let st = fk::tune::profile_status();
        if !buf.is_null() && len > 0 {
            // The note, cut to fit on a character boundary, then the NUL.
            let mut n = st.note.len().min(len - 1);
            while !st.note.is_char_boundary(n) {
                n -= 1;
            }
            // SAFETY: the caller gives `len` writable bytes at `buf`; we
            // write n + 1 <= len of them.
            unsafe {
                std::ptr::copy_nonoverlapping(st.note.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        Ok(c_int::from(st.loaded))
    })
}

/// Starts the shared pool of `n` channels and `n - 1` helpers now; see the
/// header.
#[no_mangle]
pub extern "C" fn fk_start_channels(n: c_uint) -> c_int {
    guard(|| match fk::channels::start_shared(n as usize) {
        Ok(_) => Ok(0),
        Err(fk::channels::ChannelError::Zero | fk::channels::ChannelError::TooMany { .. }) => {
            Err(-libc::EINVAL)
        }
        Err(_) => Err(INTERNAL),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn profile_status_writes_a_cut_nul_terminated_line_and_nothing_past_len() {
        let full = fk::tune::profile_status();
        let want = c_int::from(full.loaded);
        // SAFETY: NULL buffer: nothing is written.
        assert_eq!(unsafe { fk_profile_status(std::ptr::null_mut(), 8) }, want);
        let mut buf = [0x55 as c_char; 16];
        // SAFETY: len 0: nothing is written.
        assert_eq!(unsafe { fk_profile_status(buf.as_mut_ptr(), 0) }, want);
        assert!(buf.iter().all(|&b| b == 0x55));
        // SAFETY: 5 writable bytes of 16.
        assert_eq!(unsafe { fk_profile_status(buf.as_mut_ptr(), 5) }, want);
        // SAFETY: NUL-terminated within the 5 bytes just written.
        let got = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert_eq!(got, &full.note[..4]);
        assert!(buf[5..].iter().all(|&b| b == 0x55), "wrote past len");
    }

    #[test]
    fn a_channel_count_no_pool_can_have_is_refused() {
        let rc = fk_start_channels(c_uint::MAX);
        assert_eq!(rc, -libc::EINVAL);
    }

    #[test]
    fn header_version_matches_the_crate_and_fk_version() {
        let header = include_str!("../include/foliokit.h");
        let (major, minor, patch) =
            crate::version::header_version(header).expect("FK_VERSION_* macros");
        assert_eq!(major.to_string(), env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(minor.to_string(), env!("CARGO_PKG_VERSION_MINOR"));
        assert_eq!(patch.to_string(), env!("CARGO_PKG_VERSION_PATCH"));
        assert_eq!(fk_version(), major * 1_000_000 + minor * 1_000 + patch);
    }
}

//! userfaultfd in write-protect mode: just what relocation needs.
//!
//! Written here rather than taken from the `userfaultfd` crate because that
//! crate's -sys half runs bindgen (and so needs libclang) at build time for
//! five ioctls; the uAPI below is stable kernel ABI, checked in the tests.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;

/// `_IOC(dir, 0xAA, nr, size)` as the kernel encodes it on x86 and arm64.
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}
const READ: u64 = 2;
const RW: u64 = 3;

#[repr(C)]
#[derive(Default)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct WriteProtect {
    range: Range,
    mode: u64,
}

const UFFDIO_API: u64 = ioc(RW, 0x3F, std::mem::size_of::<Api>());
const UFFDIO_REGISTER: u64 = ioc(RW, 0x00, std::mem::size_of::<Register>());
const UFFDIO_UNREGISTER: u64 = ioc(READ, 0x01, std::mem::size_of::<Range>());
const UFFDIO_WAKE: u64 = ioc(READ, 0x02, std::mem::size_of::<Range>());
const UFFDIO_WRITEPROTECT: u64 = ioc(RW, 0x06, std::mem::size_of::<WriteProtect>());

/// A userfaultfd that write-protects ranges: writers to a protected page
/// sleep until the range is woken; readers carry on.
pub struct Uffd {
    fd: OwnedFd,
}

fn ioctl<T>(fd: &OwnedFd, req: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is the exact uAPI struct for `req` (sizes are part of
    // the request number) and lives for the duration of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Uffd {
    /// Opens a user-mode-only userfaultfd with write-protect support.
    pub fn new() -> io::Result<Uffd> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: the syscall takes flags only; a negative return is an error.
        let mut fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) };
        if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            // Kernels before 5.11 do not know UFFD_USER_MODE_ONLY.
            // SAFETY: as above.
            fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        }
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just gave us this descriptor; we own it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        let mut api = Api {
            api: UFFD_API,
            features: UFFD_FEATURE_PAGEFAULT_FLAG_WP,
            ioctls: 0,
        };
        ioctl(&fd, UFFDIO_API, &mut api)?;
        Ok(Uffd { fd })
    }

    fn range(start: usize, len: usize) -> Range {
        Range {
            start: start as u64,
            len: len as u64,
        }
    }

    /// Registers `[start, start + len)` for write-protect tracking.
    pub fn register_wp(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = Register {
            range: Self::range(start, len),
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        ioctl(&self.fd, UFFDIO_REGISTER, &mut r)
    }

    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = Self::range(start, len);
        ioctl(&self.fd, UFFDIO_UNREGISTER, &mut r)
    }

    /// Write-protects (`on`) or releases the range; releasing wakes waiters.
    pub fn write_protect(&self, start: usize, len: usize, on: bool) -> io::Result<()> {
        let mut w = WriteProtect {
            range: Self::range(start, len),
            mode: if on { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 },
        };
        ioctl(&self.fd, UFFDIO_WRITEPROTECT, &mut w)
    }

    /// Wakes threads sleeping on faults in the range (they retry the access).
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = Self::range(start, len);
        ioctl(&self.fd, UFFDIO_WAKE, &mut r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_uapi() {
        // Values printed by a C program including <linux/userfaultfd.h>.
        assert_eq!(UFFDIO_API, 0xc018aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020aa00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010aa01);
        assert_eq!(UFFDIO_WAKE, 0x8010aa02);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xc018aa06);
    }
}

//! An eventfd: one thread's wake-up that other threads can post and that
//! `poll` can wait on beside another descriptor.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A non-blocking eventfd, closed on exec.
#[derive(Debug)]
pub(crate) struct Event {
    fd: OwnedFd,
}

impl Event {
    pub(crate) fn new() -> io::Result<Event> {
        // SAFETY: no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Event { fd })
    }

    /// A second descriptor for the same event, owned by the caller.
    pub(crate) fn try_clone(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Posts a wake-up through a raw descriptor of an eventfd, open for
    /// the call (no allocation: safe from any thread).
    pub(crate) fn post_raw(fd: RawFd) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64; a full counter (EAGAIN)
        // already means "posted".
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }

    /// Waits up to `d` for a wake-up (without taking it).
    pub(crate) fn wait_for(&self, d: std::time::Duration) {
        if !d.is_zero() {
            super::poll::readable([self.fd.as_raw_fd()], Some(d));
        }
    }

    /// Takes every posted wake-up (never blocks).
    pub(crate) fn reset(&self) {
        let mut n = 0u64;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN when none.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

impl AsRawFd for Event {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

//! Waiting for a few descriptors to become readable (`ppoll`).

use std::os::fd::RawFd;
use std::time::Duration;

/// Waits until one of `fds` is readable or `timeout` passes (`None`: no
/// limit); which of them are readable (none after a timeout, or when the
/// call failed, e.g. interrupted by a signal). A descriptor whose peer hung
/// up or that is in error counts as readable: reading it no longer waits.
pub(crate) fn readable<const N: usize>(fds: [RawFd; N], timeout: Option<Duration>) -> [bool; N] {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: N valid pollfds and a valid (or null) timespec for the call;
    // no signal mask change.
    let n = unsafe { libc::ppoll(p.as_mut_ptr(), N as libc::nfds_t, tsp, std::ptr::null()) };
    p.map(|q| n > 0 && q.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
}

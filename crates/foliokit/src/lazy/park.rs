//! Parking fill threads while glibc's fork() holds the allocator's locks.
//!
//! fork() raises the FORK event and waits until the fill thread reads it;
//! glibc takes every malloc arena lock before the clone syscall, so a fill
//! thread that allocated meanwhile would never read it. The prepare
//! handler runs before those locks are taken: it waits until every fill
//! thread has parked, i.e. promised to do nothing but read messages into
//! room reserved beforehand until fork() returns (the parent handler).
//! The gate is `sys::atfork`'s, as `migrate/fork.rs`'s.

use std::io;
use std::mem::size_of;

use crate::sys::atfork::{ForkGate, Gated, Inside};
use crate::sys::uffd::Msg;

/// Fill threads running, process-wide.
static FILL_THREADS: ForkGate = ForkGate::new();

/// The gate fill threads enter.
pub(crate) struct FillThreads;

impl Gated for FillThreads {
    const GATE: &'static ForkGate = &FILL_THREADS;
}

/// Held by a fill thread for as long as it runs
/// ([`Inside::fork_pending`], [`Inside::park`]).
pub(crate) type Active = Inside<FillThreads>;

/// Messages read while parked. Its room is mapped with mmap(2) and grown
/// with mremap(2), neither of which takes the allocator's locks, so a fork
/// never waits on the room running out: each thread blocked in a fault or
/// an event has at most one message waiting, and every one of them can be
/// read on the way to the fork's own event (the kernel hands out faults
/// before events).
pub(super) struct Parked {
    ptr: *mut Msg,
    cap: usize,
    len: usize,
    /// The span of faults read but not kept (the room could not grow):
    /// their threads must be woken to fault again once the fork returns.
    /// Kept as addresses read, which is where those threads wait, wherever
    /// an mremap read meanwhile moved the memory.
    dropped: Option<(usize, usize)>,
}

// SAFETY: `Parked` owns its mapping and the messages in it, like a `Vec`.
unsafe impl Send for Parked {}

impl Parked {
    /// Room for `cap` messages (at least one).
    pub(super) fn new(cap: usize) -> io::Result<Parked> {
        let cap = cap.max(1);
        // SAFETY: a fresh private anonymous mapping; no address is given.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap * size_of::<Msg>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Parked {
            ptr: p.cast(),
            cap,
            len: 0,
            dropped: None,
        })
    }

    /// Doubles the room; false when the kernel has no memory for it.
    fn grow(&mut self) -> bool {
        let old = self.cap * size_of::<Msg>();
        // SAFETY: our own mapping of `old` bytes; MAYMOVE lets the kernel
        // move it, after which only the returned address is used. The
        // messages are plain bytes to move (no self-references).
        let p = unsafe { libc::mremap(self.ptr.cast(), old, old * 2, libc::MREMAP_MAYMOVE) };
        if p == libc::MAP_FAILED {
            return false;
        }
        self.ptr = p.cast();
        self.cap *= 2;
        true
    }

    /// Keeps `m`; allocates nothing. Where the room cannot grow, a fault is
    /// dropped (its thread is woken later and faults again) and an event,
    /// which cannot be read twice, waits until memory comes back.
    pub(super) fn push(&mut self, m: Msg) {
        while self.len == self.cap && !self.grow() {
            if let Msg::Fault { addr } = m {
                let (lo, hi) = self.dropped.unwrap_or((addr, addr));
                self.dropped = Some((lo.min(addr), hi.max(addr)));
                return;
            }
            // nanosleep: no allocation.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: `len < cap`: the slot is inside the mapping, unused.
        unsafe { self.ptr.add(self.len).write(m) };
        self.len += 1;
    }

    /// The messages kept, in the order read, and the lowest and highest
    /// address of the faults dropped (the threads waiting there must be
    /// woken). Empties it.
    pub(super) fn take(&mut self, mut each: impl FnMut(Msg)) -> Option<(usize, usize)> {
        let n = std::mem::take(&mut self.len);
        for i in 0..n {
            // SAFETY: slots below the old `len` hold messages written by
            // `push`; each is read out once (`len` is already 0).
            each(unsafe { self.ptr.add(i).read() });
        }
        self.dropped.take()
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.take(drop);
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(self.ptr.cast(), self.cap * size_of::<Msg>()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_messages_outgrow_the_first_room_and_come_back_in_order() {
        let mut p = Parked::new(4).expect("mmap");
        for i in 0..10_000 {
            p.push(Msg::Remove {
                start: i,
                end: i + 1,
            });
        }
        let mut next = 0;
        let dropped = p.take(|m| match m {
            Msg::Remove { start, .. } => {
                assert_eq!(start, next);
                next += 1;
            }
            other => panic!("unexpected {other:?}"),
        });
        assert_eq!(next, 10_000);
        assert_eq!(dropped, None);
        assert_eq!(p.take(|_| panic!("emptied")), None);
    }
}

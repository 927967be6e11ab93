//! Parking fill threads while glibc's fork() holds the allocator's locks.
//!
//! fork() raises the FORK event and waits until the fill thread reads it;
//! glibc takes every malloc arena lock before the clone syscall, so a fill
//! thread that allocated meanwhile would never read it. The prepare
//! handler runs before those locks are taken: it waits until every fill
//! thread has parked, i.e. promised to do nothing but read messages into
//! room reserved beforehand until fork() returns (the parent handler).
//! The gate is the one every thread answering userfaultfd events enters
//! (`uffd::gate`), a relocation batch's too.

use std::io;
use std::mem::size_of;

use super::map::Map;
use crate::sys::uffd::Msg;

/// Held by a fill thread for as long as it runs
/// ([`crate::uffd::gate::Inside::fork_pending`],
/// [`crate::uffd::gate::Inside::park`]).
pub(crate) type Active = crate::uffd::gate::Inside;

/// Messages read while parked. Its room is mapped with mmap(2) and grown
/// with mremap(2), neither of which takes the allocator's locks, so a fork
/// never waits on the room running out: each thread blocked in a fault or
/// an event has at most one message waiting, and every one of them can be
/// read on the way to the fork's own event (the kernel hands out faults
/// before events).
pub(super) struct Parked {
    room: Map,
    len: usize,
    /// The span of faults read but not kept (the room could not grow):
    /// their threads must be woken to fault again once the fork returns.
    /// Kept as addresses read, which is where those threads wait, wherever
    /// an mremap read meanwhile moved the memory.
    dropped: Option<(usize, usize)>,
}

impl Parked {
    /// Room for `cap` messages (at least one).
    pub(super) fn new(cap: usize) -> io::Result<Parked> {
        Ok(Parked {
            room: Map::new(
                cap.max(1) * size_of::<Msg>(),
                libc::PROT_READ | libc::PROT_WRITE,
            )?,
            len: 0,
            dropped: None,
        })
    }

    fn cap(&self) -> usize {
        self.room.len / size_of::<Msg>()
    }

    fn slot(&self, i: usize) -> *mut Msg {
        (self.room.base as *mut Msg).wrapping_add(i)
    }

    /// Keeps `m`; allocates nothing. Where the room cannot grow, a fault is
    /// dropped (its thread is woken later and faults again) and an event,
    /// which cannot be read twice, waits until memory comes back.
    pub(super) fn push(&mut self, m: Msg) {
        // Moving the messages with the mapping is moving their bytes,
        // which is all a move of a Rust value is.
        while self.len == self.cap() && !self.room.grow(self.room.len * 2) {
            if let Msg::Fault { addr } = m {
                let (lo, hi) = self.dropped.unwrap_or((addr, addr));
                self.dropped = Some((lo.min(addr), hi.max(addr)));
                return;
            }
            // nanosleep: no allocation.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: `len < cap`: the slot is inside the mapping (page
        // aligned, so aligned for `Msg`), unused.
        unsafe { self.slot(self.len).write(m) };
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
            each(unsafe { self.slot(i).read() });
        }
        self.dropped.take()
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        // The messages own descriptors; the room itself goes with `Map`.
        self.take(drop);
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

//! Firecracker's page-fault handler handoff: on snapshot load the VMM
//! connects to the handler's Unix socket and sends one message, a JSON
//! array of its guest memory regions, with its userfaultfd attached
//! (`SCM_RIGHTS`). Nothing more is said on the socket. Both sides are
//! here: [`receive`] for a handler, [`send`] for a VMM (or a test playing
//! one), and [`serve`], a handler's whole sequence from the connection to
//! the running fill.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{fill_external, External, ExternalSegment, LazyError, LazyFill, LazyOptions};
use super::{Segment, Source};
use crate::sys::scm;

/// The most a handoff message may be: a VMM has a handful of regions,
/// each about 130 bytes of JSON.
pub const MAX_MESSAGE: usize = 1 << 20;

/// How long a handler waits for the rest of a message that arrived in
/// part (a stream socket may split one send).
const REST_WAIT: Duration = Duration::from_secs(2);

/// How long [`receive`] should wait for a VMM's message by default: 30 s
/// from its connection, where Firecracker sends it at once.
pub const MESSAGE_WAIT: Duration = crate::params::HANDOFF_MESSAGE_WAIT;

/// The block a handler should install around a fault in 4 KiB guest
/// memory ([`LazyOptions::folio_size`]; hugetlb memory takes its huge
/// page): small enough that a touch waits little behind the background
/// fill, large enough for the fill to run at memory bandwidth.
pub const BLOCK: usize = crate::params::HANDOFF_BLOCK;

/// One guest memory region as Firecracker describes it: where the VMM
/// mapped it, how long, where its bytes start in the memory file, and its
/// page size (`page_size` in bytes; older versions send only
/// `page_size_kib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestRegion {
    /// Where the region is mapped in the VMM.
    pub base_host_virt_addr: u64,
    /// Its length in bytes.
    pub size: u64,
    /// Where its bytes start in the memory file.
    pub offset: u64,
    /// Its page size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// Its page size in KiB (deprecated by Firecracker, still sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size_kib: Option<u64>,
}

impl GuestRegion {
    /// A region as current Firecracker sends it (both page size fields).
    pub fn new(base_host_virt_addr: u64, size: u64, offset: u64, page_size: u64) -> GuestRegion {
        GuestRegion {
            base_host_virt_addr,
            size,
            offset,
            page_size: Some(page_size),
            page_size_kib: Some(page_size / 1024),
        }
    }

    /// Its page size in bytes, from either field; they must agree.
    pub fn page_size(&self) -> Result<u64, HandoffError> {
        let kib = self.page_size_kib.map(|k| k.saturating_mul(1024));
        match (self.page_size, kib) {
            (Some(b), Some(k)) if b != k => Err(self.bad("page_size and page_size_kib disagree")),
            (Some(b), _) | (None, Some(b)) => Ok(b),
            (None, None) => Err(self.bad("no page size (page_size or page_size_kib)")),
        }
    }

    fn bad(&self, why: &'static str) -> HandoffError {
        HandoffError::BadRegion {
            addr: self.base_host_virt_addr,
            size: self.size,
            why,
        }
    }
}

/// What a VMM handed over.
#[derive(Debug)]
pub struct Handoff {
    /// Its regions, as sent.
    pub regions: Vec<GuestRegion>,
    /// Its userfaultfd.
    pub uffd: OwnedFd,
    /// Its pid (`SO_PEERCRED`).
    pub pid: i32,
}

impl Handoff {
    /// The regions as segments of a fill whose source is a memory file of
    /// `file_len` bytes: every region checked (a page size that is a
    /// power of two from 4 KiB, an address and size aligned to it, its
    /// bytes inside the file) before any is taken.
    pub fn segments(&self, file_len: u64) -> Result<Vec<ExternalSegment>, HandoffError> {
        self.regions
            .iter()
            .map(|r| {
                let page = r.page_size()?;
                if page < 4096 || !page.is_power_of_two() {
                    return Err(r.bad("the page size is not a power of two from 4 KiB"));
                }
                if r.size == 0 || r.base_host_virt_addr % page != 0 || r.size % page != 0 {
                    return Err(r.bad("empty, or not aligned to its page size"));
                }
                let end = r.offset.checked_add(r.size).filter(|&e| e <= file_len);
                if end.is_none() || r.offset % 4096 != 0 {
                    return Err(HandoffError::OutsideFile {
                        addr: r.base_host_virt_addr,
                        offset: r.offset,
                        size: r.size,
                        file_len,
                    });
                }
                let as_usize = |v: u64| usize::try_from(v).map_err(|_| r.bad("too large"));
                Ok(ExternalSegment {
                    segment: Segment {
                        addr: as_usize(r.base_host_virt_addr)?,
                        len: as_usize(r.size)?,
                        offset: r.offset,
                    },
                    page_size: as_usize(page)?,
                })
            })
            .collect()
    }
}

/// Why a handoff could not be taken.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HandoffError {
    /// The socket failed.
    #[error("reading the VMM's message: {0}")]
    Io(#[from] io::Error),
    /// No whole message came within the wait [`receive`] was given.
    #[error(
        "no whole message from the VMM within {waited:?} of its connecting ({got} bytes came)"
    )]
    Timeout {
        /// Bytes received.
        got: usize,
        /// How long was waited.
        waited: Duration,
    },
    /// The VMM closed the connection before a whole message came.
    #[error("the VMM's message ended after {got} bytes, before its JSON did")]
    Short {
        /// Bytes received.
        got: usize,
    },
    /// The message is no JSON array of regions.
    #[error("the VMM's message is not a JSON array of guest regions: {0}")]
    Malformed(String),
    /// The message is longer than [`MAX_MESSAGE`].
    #[error("the VMM's message is over {MAX_MESSAGE} bytes")]
    TooLong,
    /// No userfaultfd came with the message, or more than one descriptor.
    #[error("the VMM's message carried {0} descriptors, not its userfaultfd alone")]
    Descriptors(usize),
    /// A region is not one a fill can take.
    #[error("guest region {addr:#x} + {size:#x}: {why}")]
    BadRegion {
        /// Its address in the VMM.
        addr: u64,
        /// Its size.
        size: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// A region's bytes lie outside the memory file.
    #[error("guest region {addr:#x} wants bytes {offset:#x} + {size:#x} of the memory file, which has {file_len:#x} (or its offset is not page-aligned)")]
    OutsideFile {
        /// Its address in the VMM.
        addr: u64,
        /// Its offset in the file.
        offset: u64,
        /// Its size.
        size: u64,
        /// The file's length.
        file_len: u64,
    },
}

/// Reads a VMM's handoff from `stream`, a connection it made: one
/// message, its JSON read to the end (the rest of a message the socket
/// split is waited for briefly), one descriptor with it, all within
/// `wait` of the call ([`MESSAGE_WAIT`] is what a handler should give):
/// a peer that sends nothing, or too little, gets
/// [`HandoffError::Timeout`], never a handler waiting forever.
pub fn receive(stream: &UnixStream, wait: Duration) -> Result<Handoff, HandoffError> {
    let pid = scm::peer_pid(stream.as_raw_fd())?;
    let deadline = Instant::now() + wait;
    let timeout = |got| HandoffError::Timeout { got, waited: wait };
    // What is left of the wait; none once it is over (a zero read
    // timeout would mean none at all).
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };
    stream.set_read_timeout(Some(left().ok_or_else(|| timeout(0))?))?;
    let mut buf = vec![0u8; 64 << 10];
    let (mut got, mut fds) = match scm::recv_with_fds(stream.as_raw_fd(), &mut buf) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(timeout(0)),
        Err(e) => return Err(e.into()),
    };
    let regions = loop {
        match serde_json::from_slice::<Vec<GuestRegion>>(&buf[..got]) {
            Ok(r) => break r,
            Err(e) if e.is_eof() => {}
            Err(e) => return Err(HandoffError::Malformed(e.to_string())),
        }
        if got == buf.len() {
            if buf.len() >= MAX_MESSAGE {
                return Err(HandoffError::TooLong);
            }
            buf.resize((buf.len() * 2).min(MAX_MESSAGE), 0);
        }
        let remaining = left().ok_or_else(|| timeout(got))?;
        stream.set_read_timeout(Some(remaining.min(REST_WAIT)))?;
        let n = match (&*stream).read(&mut buf[got..]) {
            Ok(n) => n,
            // The whole wait is over, not just the wait for the rest.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && remaining <= REST_WAIT => {
                return Err(timeout(got))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(HandoffError::Short { got });
        }
        got += n;
    };
    stream.set_read_timeout(None)?;
    if fds.len() != 1 {
        return Err(HandoffError::Descriptors(fds.len()));
    }
    Ok(Handoff {
        regions,
        uffd: fds.remove(0),
        pid,
    })
}

/// Sends `regions` and `uffd` as a VMM does: the JSON in one message with
/// the descriptor attached.
pub fn send(stream: &UnixStream, regions: &[GuestRegion], uffd: BorrowedFd<'_>) -> io::Result<()> {
    let body = serde_json::to_vec(regions).map_err(io::Error::other)?;
    send_raw(stream, &body, uffd)
}

/// Sends `bytes` with `uffd` attached (what the socket did not take in
/// that call follows plain): [`send`]'s wire, for any bytes (a test of a
/// handler's refusals sends malformed ones).
pub fn send_raw(stream: &UnixStream, bytes: &[u8], uffd: BorrowedFd<'_>) -> io::Result<()> {
    let n = scm::send_with_fd(stream.as_raw_fd(), bytes, uffd)?;
    io::Write::write_all(&mut &*stream, &bytes[n..])
}

/// A descriptor that becomes readable when the VMM at the other end of
/// `stream` has gone: its pidfd where the kernel has them (5.3), else
/// the stream itself (closed when the VMM exits).
pub fn gone_signal(stream: &UnixStream, pid: i32) -> io::Result<OwnedFd> {
    match scm::pidfd(pid) {
        Ok(fd) => Ok(fd),
        Err(_) => stream.as_fd().try_clone_to_owned(),
    }
}

/// A VMM's memory being served: what it handed over, what its
/// descriptor's missing features cost, and the running fill.
#[derive(Debug)]
pub struct Served {
    /// The VMM's pid (`SO_PEERCRED`).
    pub pid: i32,
    /// Its regions, as sent.
    pub regions: Vec<GuestRegion>,
    /// What the features its userfaultfd lacks cost the fill, a line
    /// each ([`External::costs`]).
    pub costs: Vec<String>,
    /// The fill: [`LazyFill::progress`]'s `done` once every page is in,
    /// [`LazyFill::wait`] returns once the VMM has gone.
    pub fill: LazyFill,
}

/// Why [`serve`] did not start a fill; nothing was installed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The handoff could not be taken, or its regions do not fit the
    /// memory file.
    #[error(transparent)]
    Handoff(#[from] HandoffError),
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The fill refused the VMM's descriptor or its regions.
    #[error(transparent)]
    Fill(#[from] LazyError),
}

/// A handler's sequence: takes the handoff of the VMM at the other end of
/// `stream` ([`receive`], within `message_wait`), checks its regions against `mem_file`
/// ([`Handoff::segments`]), and fills them from it ([`fill_external`],
/// with the VMM's pid to check its page sizes, until the VMM has gone,
/// watched as [`gone_signal`] says). Every check is made before the first
/// page goes in: a [`ServeError`] means nothing was installed.
///
/// `mem_file` is mapped as [`Source::map_file`] says: not to be written
/// while the fill runs; a page that can no longer be read (the file
/// truncated) is poisoned and reported, as in any fill.
///
/// # Safety
/// The userfaultfd that comes over `stream` registers another process's
/// memory, not this process's (see [`fill_external`]).
pub unsafe fn serve(
    stream: &UnixStream,
    mem_file: &File,
    message_wait: Duration,
    opts: &LazyOptions,
) -> Result<Served, ServeError> {
    let sys = |what| move |source| ServeError::Sys { what, source };
    let handoff = receive(stream, message_wait)?;
    let file_len = mem_file
        .metadata()
        .map_err(sys("reading the memory file's length"))?
        .len();
    let segments = handoff.segments(file_len)?;
    let source =
        Source::map_file(mem_file, file_len as usize).map_err(sys("mapping the memory file"))?;
    let gone = gone_signal(stream, handoff.pid).map_err(sys("watching for the VMM's exit"))?;
    let Handoff { regions, uffd, pid } = handoff;
    let ext = External::adopt(uffd, gone)?.with_pid(pid);
    let costs = ext.costs();
    // SAFETY: the caller promises the descriptor registers another
    // process's memory; the source is our own read-only mapping.
    let fill = unsafe { fill_external(ext, &segments, source, opts)? };
    Ok(Served {
        pid,
        regions,
        costs,
        fill,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handoff(regions: Vec<GuestRegion>) -> Handoff {
        let f = std::fs::File::open("/proc/self/stat").expect("a file");
        Handoff {
            regions,
            uffd: OwnedFd::from(f),
            pid: 1,
        }
    }

    #[test]
    fn old_and_new_page_size_fields_are_read_and_must_agree() {
        let both: Vec<GuestRegion> = serde_json::from_str(
            r#"[{"base_host_virt_addr":4096,"size":8192,"offset":0,"page_size":4096,"page_size_kib":4}]"#,
        )
        .expect("parses");
        assert_eq!(both[0].page_size().expect("agree"), 4096);
        let old: Vec<GuestRegion> = serde_json::from_str(
            r#"[{"base_host_virt_addr":4096,"size":8192,"offset":0,"page_size_kib":2048}]"#,
        )
        .expect("parses");
        assert_eq!(old[0].page_size().expect("kib alone"), 2 << 20);
        let mut r = GuestRegion::new(0, 4096, 0, 4096);
        r.page_size_kib = Some(2048);
        assert!(r.page_size().is_err());
        r.page_size = None;
        r.page_size_kib = None;
        assert!(r.page_size().is_err());
    }

    #[test]
    fn regions_outside_the_file_or_misaligned_are_refused_before_any_is_taken() {
        let ok = GuestRegion::new(0x10000, 0x4000, 0, 4096);
        let h = handoff(vec![ok, GuestRegion::new(0x40000, 0x4000, 0x4000, 4096)]);
        let segs = h.segments(0x8000).expect("inside");
        assert_eq!(segs[1].segment.offset, 0x4000);
        assert!(matches!(
            h.segments(0x7000),
            Err(HandoffError::OutsideFile { .. })
        ));
        let huge = handoff(vec![GuestRegion::new(0x10000, 2 << 20, 0, 2 << 20)]);
        assert!(matches!(
            huge.segments(4 << 20),
            Err(HandoffError::BadRegion { .. })
        ));
        let odd = handoff(vec![GuestRegion::new(0x10000, 0x4000, 0, 3000)]);
        assert!(odd.segments(1 << 20).is_err());
        let wraps = handoff(vec![GuestRegion::new(0x10000, 0x4000, u64::MAX - 10, 4096)]);
        assert!(matches!(
            wraps.segments(u64::MAX),
            Err(HandoffError::OutsideFile { .. })
        ));
    }

    #[test]
    fn a_split_message_is_read_whole_and_a_broken_one_refused() {
        let (vmm, handler) = UnixStream::pair().expect("a pair");
        let regions = vec![GuestRegion::new(0x200000, 0x200000, 0, 4096)];
        let f = std::fs::File::open("/proc/self/stat").expect("a file");
        let body = serde_json::to_vec(&regions).expect("json");
        let cut = 10;
        scm::send_with_fd(vmm.as_raw_fd(), &body[..cut], f.as_fd()).expect("first part");
        io::Write::write_all(&mut &vmm, &body[cut..]).expect("rest");
        let h = receive(&handler, MESSAGE_WAIT).expect("whole");
        assert_eq!(h.regions, regions);

        let (vmm, handler) = UnixStream::pair().expect("a pair");
        scm::send_with_fd(vmm.as_raw_fd(), &body[..cut], f.as_fd()).expect("part");
        drop(vmm);
        assert!(
            matches!(receive(&handler, MESSAGE_WAIT), Err(HandoffError::Short { got }) if got == cut)
        );

        let (vmm, handler) = UnixStream::pair().expect("a pair");
        scm::send_with_fd(vmm.as_raw_fd(), b"{\"not\":\"an array\"}", f.as_fd()).expect("sent");
        assert!(matches!(
            receive(&handler, MESSAGE_WAIT),
            Err(HandoffError::Malformed(_))
        ));

        let (vmm, handler) = UnixStream::pair().expect("a pair");
        io::Write::write_all(&mut &vmm, &body).expect("no descriptor");
        assert!(matches!(
            receive(&handler, MESSAGE_WAIT),
            Err(HandoffError::Descriptors(0))
        ));
    }

    #[test]
    fn a_silent_peer_or_one_that_stops_midway_is_given_up_on() {
        let wait = Duration::from_millis(50);
        let (_vmm, handler) = UnixStream::pair().expect("a pair");
        assert!(matches!(
            receive(&handler, wait),
            Err(HandoffError::Timeout { got: 0, waited }) if waited == wait
        ));

        let (vmm, handler) = UnixStream::pair().expect("a pair");
        let f = std::fs::File::open("/proc/self/stat").expect("a file");
        scm::send_with_fd(vmm.as_raw_fd(), b"[{\"base", f.as_fd()).expect("part");
        assert!(matches!(
            receive(&handler, wait),
            Err(HandoffError::Timeout { got: 7, .. })
        ));
    }
}

//! Where a lazy fill's bytes come from.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use super::holes::Holes;

/// The bytes a lazy fill copies from: a read-only mapping it owns (of a
/// snapshot file) or memory the caller vouches for.
///
/// Its pages may raise SIGBUS (a file truncated under the mapping,
/// page-cache poison): the fill reads it only with machine-check-safe
/// copies or the kernel's `UFFDIO_COPY`, which both report that instead
/// of dying.
#[derive(Debug)]
pub struct Source {
    ptr: *const u8,
    len: usize,
    owned: bool,
    /// The file's holes when it was mapped: zeros nobody need read.
    holes: Holes,
}

// SAFETY: the source is only read (through mc copies and the kernel), and
// the mapping it may own is freed once, on drop.
unsafe impl Send for Source {}
// SAFETY: as above; reads from several threads do not conflict.
unsafe impl Sync for Source {}

impl Source {
    /// Maps `len` bytes of `file` read-only (shared). `len` may exceed the
    /// file's size: pages past its end raise SIGBUS, reported as vanished.
    ///
    /// The file's holes (`SEEK_DATA`/`SEEK_HOLE`) are learned once, here:
    /// what lies in them is installed as zeros, never read. The file must
    /// not be written meanwhile (bytes written into a hole later are not
    /// seen).
    pub fn map_file(file: &File, len: usize) -> io::Result<Source> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty source"));
        }
        // SAFETY: a fresh read-only shared mapping of our own descriptor;
        // nothing else is mapped or replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut source = Source {
            ptr: p.cast(),
            len,
            owned: true,
            holes: Holes::none(),
        };
        // On error the drop of `source` unmaps it.
        source.holes = Holes::of_file(file, len as u64)?;
        Ok(source)
    }

    /// Memory the caller mapped (a memfd, pmem, a buffer).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` stays mapped readable until the fill ends (the
    /// handle is waited for or dropped) and does not overlap the ranges
    /// filled. Its pages may raise SIGBUS; no other fault is caught.
    pub unsafe fn from_raw(ptr: *const u8, len: usize) -> Source {
        Source {
            ptr,
            len,
            owned: false,
            holes: Holes::none(),
        }
    }

    /// The holes of the file mapped (none for memory from
    /// [`Source::from_raw`]), as offsets into the source.
    pub fn holes(&self) -> &Holes {
        &self.holes
    }

    /// Maps the page tables of `[off, off + len)` of the source in one
    /// call (`MADV_POPULATE_READ`, Linux 5.14), best effort, before the
    /// kernel copies from it with `UFFDIO_COPY`: faulting a fresh mapping
    /// of the page cache in from inside that copy cost a 4 GiB hugetlb
    /// fill about as much time as the copy itself. A page that cannot be
    /// read stops it silently: the copy that reads the page then reports
    /// it. (Copies in user space fault their source in on the threads that
    /// copy, in parallel; a prefault on one thread would serialise that.)
    pub(crate) fn prefault(&self, off: usize, len: usize) {
        let page = crate::batch::page_size();
        let end = off.saturating_add(len).min(self.len);
        if off >= end {
            return;
        }
        // Whole pages, by address: a caller's source need not start on one.
        let lo = (self.ptr as usize + off) / page * page;
        let hi = self.ptr as usize + end;
        // SAFETY: advice on the pages holding `[off, end)` of the source's
        // mapping (a page it starts in part of is mapped whole), which is
        // only read; MADV_POPULATE_READ faults pages in as a read would
        // and changes no data.
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_POPULATE_READ) };
    }

    /// `[off, off + len)` of the source cut into pieces `(start, len,
    /// zero)` of whole `unit`s (counted from `off`): zero where a unit is
    /// all hole or its bytes are all zero (see [`Holes::zero_pieces`]),
    /// else data. Data is prefaulted first (see [`Source::prefault`]):
    /// finding its zeros reads it, and the copy that follows then finds it
    /// mapped.
    pub(crate) fn pieces(&self, off: usize, len: usize, unit: usize) -> Vec<(usize, usize, bool)> {
        self.cut(off, len, unit, true)
    }

    /// Whether `[off, off + len)` of the source reads all zero: its holes
    /// are not read (reading one would fill the page cache, or a tmpfs
    /// file, with pages of zeros), its data is read until the first
    /// nonzero byte (not prefaulted: the read faults in what it needs). A
    /// range past the mapping does not.
    pub(crate) fn reads_zero(&self, off: usize, len: usize) -> bool {
        len > 0
            && off.saturating_add(len) <= self.len
            && self
                .holes
                .pieces(off as u64, len as u64, 1)
                .into_iter()
                .all(|(s, n, hole)| {
                    // SAFETY: `[s, s + n)` lies inside the source's
                    // mapping (checked above), readable while `self`
                    // lives; a page raising SIGBUS is survived (data).
                    hole || unsafe {
                        crate::mc::zero_units_raw(self.ptr.add(s as usize), n as usize, n as usize)
                    }
                    .is_ok_and(|z| z == [true])
                })
    }

    /// Whether the first bytes at `off` are data and not all zero (a
    /// quick look: false says nothing).
    pub(crate) fn starts_with_data(&self, off: usize) -> bool {
        const PROBE: usize = 64;
        off.saturating_add(PROBE) <= self.len
            && !self.holes.touches(off as u64, PROBE as u64)
            // SAFETY: `[off, off + PROBE)` lies inside the mapping,
            // readable while `self` lives; a SIGBUS is survived.
            && unsafe { crate::mc::zero_units_raw(self.ptr.add(off), PROBE, PROBE) }
                .is_ok_and(|z| z == [false])
    }

    /// Whether each `unit` of `[off, off + len)` reads zero (see
    /// [`Source::reads_zero`]); units past the mapping do not.
    pub(crate) fn zero_units(&self, off: usize, len: usize, unit: usize) -> Vec<bool> {
        let mut v = Vec::with_capacity(len.div_ceil(unit));
        for (_, n, z) in self.cut(off, len, unit, false) {
            v.extend(std::iter::repeat_n(z, n.div_ceil(unit)));
        }
        v.resize(len.div_ceil(unit), false);
        v
    }

    fn cut(
        &self,
        off: usize,
        len: usize,
        unit: usize,
        prefault: bool,
    ) -> Vec<(usize, usize, bool)> {
        let end = off.saturating_add(len).min(self.len);
        if off >= end {
            return Vec::new();
        }
        // SAFETY: `[off, end)` lies inside the source's mapping, which
        // stays readable while `self` lives; its pages may raise SIGBUS,
        // which the mc loads survive.
        let pieces = unsafe {
            self.holes.zero_pieces_with(
                self.ptr,
                off as u64,
                (end - off) as u64,
                unit as u64,
                |s, n| {
                    if prefault {
                        self.prefault(s as usize, n as usize);
                    }
                },
            )
        };
        pieces
            .into_iter()
            .map(|(s, n, z)| (s as usize, n as usize, z))
            .collect()
    }

    /// First byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: our own mapping; the fill that read it has ended.
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        }
    }
}

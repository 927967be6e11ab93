//! Snapshot and restore of guest RAM with machine-check-safe copies.
//!
//! File format (little-endian `u64` fields), every part page-aligned so
//! that snapshot pages map onto guest pages and a lost file page is exactly
//! one lost guest page:
//!
//! ```text
//! 0        "FKVMSNAP", version (1), page size P, region count N
//! 32       N x (guest address, length, file offset)      padded to P
//! ...      each region's bytes at its file offset        padded to P
//! end      "FKVMBAD\0", count M, M x (guest address, length, kind)
//! ```
//!
//! The trailer lists the guest ranges that could not be read while saving
//! (their bytes in the file are zeros); restore leaves them unwritten and
//! reports them. A snapshot cut short loses its trailer, which the restore
//! report says.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use foliokit::lazy::Holes;
use foliokit::{CopyStrategy, McError};
use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestMemoryRegion};

use crate::zeros::Zeros;
use crate::{check_writable, io_err, pieces, push_bad, BadRange, Error, FaultKind, Result};

const MAGIC: &[u8; 8] = b"FKVMSNAP";
pub(crate) const TRAILER_MAGIC: &[u8; 8] = b"FKVMBAD\0";
const VERSION: u64 = 1;
const HEADER_FIXED: u64 = 32;
const ENTRY: u64 = 24;
/// Bytes copied out of guest RAM per `write` call.
pub(crate) const CHUNK: usize = 1 << 20;
/// More regions than this is not a header we wrote (vm-memory VMs have a
/// handful; KVM allows 32k memory slots).
pub(crate) const MAX_REGIONS: u64 = 1 << 16;
/// Likewise for bad ranges in the trailer.
const MAX_BAD: u64 = 1 << 24;

/// What a restore did.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreReport {
    /// Guest bytes restored (and marked dirty), holes included.
    pub restored: u64,
    /// Of those, bytes in holes of a sparse snapshot (the zero pages
    /// [`crate::snapshot_to_file`] left out): neither read nor copied.
    /// Guest RAM that reads zero already (private anonymous memory never
    /// populated) is left alone there, not faulted in; the rest is
    /// cleared.
    pub zero_bytes: u64,
    /// Of `zero_bytes`, those that had to be cleared.
    pub cleared_bytes: u64,
    /// Guest ranges whose snapshot bytes could not be read now: pages past
    /// the end of a truncated snapshot ([`FaultKind::Vanished`]) or
    /// poisoned pages of it ([`FaultKind::Poison`]). Left as they were,
    /// not marked dirty.
    pub bad: Vec<BadRange>,
    /// Guest ranges the snapshot recorded as unreadable when it was saved.
    /// Left as they were, not marked dirty.
    pub bad_at_save: Vec<BadRange>,
    /// The snapshot's trailer (the list of ranges bad at save) could not be
    /// read, so `bad_at_save` may be incomplete; its ranges, if any, were
    /// saved as zeros and restored as such.
    pub trailer_missing: bool,
    /// Wall time, in seconds.
    pub secs: f64,
}

/// Where each region lies in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    page: u64,
    /// (guest address, length, file offset)
    pub(crate) regions: Vec<(u64, u64, u64)>,
    /// Offset of the trailer (the end of the last region's padded data).
    data_end: u64,
}

pub(crate) fn round_up(x: u64, page: u64) -> Option<u64> {
    x.checked_add(page - 1).map(|v| v / page * page)
}

impl Layout {
    /// Places `(guest address, length)` regions after the header.
    pub(crate) fn new(page: u64, regions: &[(u64, u64)]) -> Option<Layout> {
        let table = (regions.len() as u64).checked_mul(ENTRY)?;
        let mut at = round_up(HEADER_FIXED.checked_add(table)?, page)?;
        let mut out = Vec::with_capacity(regions.len());
        for &(g, l) in regions {
            out.push((g, l, at));
            at = round_up(at.checked_add(l)?, page)?;
        }
        Some(Layout {
            page,
            regions: out,
            data_end: at,
        })
    }

    pub(crate) fn header(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(self.regions[..].len() * ENTRY as usize + 32);
        h.extend_from_slice(MAGIC);
        for v in [VERSION, self.page, self.regions.len() as u64] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        for &(g, l, o) in &self.regions {
            for v in [g, l, o] {
                h.extend_from_slice(&v.to_le_bytes());
            }
        }
        let first = self.regions.first().map_or(self.data_end, |r| r.2);
        h.resize(first as usize, 0);
        h
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i * 8..i * 8 + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn bad_format(why: impl Into<String>) -> Error {
    Error::Format(why.into())
}

pub(crate) fn kind_code(k: FaultKind) -> u64 {
    match k {
        FaultKind::Poison => 1,
        FaultKind::Vanished => 2,
        FaultKind::Other(c) => 3 | (u64::from(c as u32) << 32),
    }
}

fn kind_from(code: u64) -> Option<FaultKind> {
    match code & 0xffff_ffff {
        1 => Some(FaultKind::Poison),
        2 => Some(FaultKind::Vanished),
        3 => Some(FaultKind::Other((code >> 32) as u32 as i32)),
        _ => None,
    }
}

/// Turns an mc error that is not a fault into this crate's error.
pub(crate) fn mc_unavailable(e: McError) -> Error {
    Error::Copy(e)
}

/// A snapshot image in memory: mapped at `ptr` for `mapped` bytes, of
/// which the first `known_end` are known to exist.
struct Image<'f> {
    ptr: *const u8,
    mapped: u64,
    known_end: u64,
    /// The file behind the mapping, asked for its size again when a page
    /// vanishes (a truncation then explains every later page at once).
    file: Option<&'f File>,
    /// The file's holes (offsets into the image): zeros not to be read.
    holes: Holes,
}

impl Image<'_> {
    /// Reads `buf.len()` bytes at `off` with an mc copy; `Ok(false)` if any
    /// of them is past the known end or faults.
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<bool> {
        let end = off.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.known_end.min(self.mapped)) {
            return Ok(false);
        }
        // SAFETY: [off, off + len) is inside the mapped image (the
        // constructor's contract), read with the mc routine, which reports
        // a SIGBUS; `buf` is ours and disjoint from the image.
        let r = unsafe {
            foliokit::copy_mc_raw(
                buf.as_mut_ptr(),
                self.ptr.wrapping_add(off as usize),
                buf.len(),
                CopyStrategy::Movsb,
            )
        };
        match r {
            Ok(_) => Ok(true),
            Err(McError::Fault(_)) => Ok(false),
            Err(e) => Err(mc_unavailable(e)),
        }
    }

    fn refresh_end(&mut self) {
        if let Some(f) = self.file {
            if let Ok(m) = f.metadata() {
                self.known_end = self.known_end.min(m.len());
            }
        }
    }
}

/// Parses and checks the header: magic, version, page size, region table.
fn read_layout(img: &Image<'_>) -> Result<Layout> {
    let mut fixed = [0u8; HEADER_FIXED as usize];
    if !img.read(0, &mut fixed)? {
        return Err(bad_format("the header is missing or unreadable"));
    }
    if &fixed[..8] != MAGIC {
        return Err(bad_format("wrong magic"));
    }
    let (version, page, n) = (u64_at(&fixed, 1), u64_at(&fixed, 2), u64_at(&fixed, 3));
    if version != VERSION {
        return Err(bad_format(format!("version {version}, expected {VERSION}")));
    }
    if !page.is_power_of_two() || !(512..=(1 << 30)).contains(&page) {
        return Err(bad_format(format!("page size {page}")));
    }
    if n > MAX_REGIONS {
        return Err(bad_format(format!("{n} regions")));
    }
    let mut table = vec![0u8; (n * ENTRY) as usize];
    if !img.read(HEADER_FIXED, &mut table)? {
        return Err(bad_format("the region table is missing or unreadable"));
    }
    let stored: Vec<(u64, u64, u64)> = (0..n as usize)
        .map(|i| {
            (
                u64_at(&table, 3 * i),
                u64_at(&table, 3 * i + 1),
                u64_at(&table, 3 * i + 2),
            )
        })
        .collect();
    if let Some(&(g, n, _)) = stored.iter().find(|r| r.0.checked_add(r.1).is_none()) {
        return Err(bad_format(format!(
            "region {g:#x} + {n:#x} runs past the guest address space"
        )));
    }
    let ranges: Vec<(u64, u64)> = stored.iter().map(|r| (r.0, r.1)).collect();
    let layout = Layout::new(page, &ranges).ok_or_else(|| bad_format("region table overflows"))?;
    if layout.regions != stored {
        return Err(bad_format(
            "region file offsets are not where this format puts them",
        ));
    }
    Ok(layout)
}

/// Reads the trailer of `layout`'s image; `None` if it is missing or
/// unreadable. A range outside the guest memory the layout lists is
/// refused (a damaged or hostile file), as one whose end wraps.
fn read_trailer(img: &Image<'_>, layout: &Layout) -> Result<Option<Vec<BadRange>>> {
    let at = layout.data_end;
    let mut head = [0u8; 16];
    if !img.read(at, &mut head)? || &head[..8] != TRAILER_MAGIC {
        return Ok(None);
    }
    let m = u64_at(&head, 1);
    if m > MAX_BAD {
        return Err(bad_format(format!("{m} bad ranges in the trailer")));
    }
    let mut body = vec![0u8; (m * 24) as usize];
    if !img.read(at + 16, &mut body)? {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(m as usize);
    for i in 0..m as usize {
        let (a, l, k) = (
            u64_at(&body, 3 * i),
            u64_at(&body, 3 * i + 1),
            u64_at(&body, 3 * i + 2),
        );
        let kind = kind_from(k).ok_or_else(|| bad_format(format!("bad range kind {k}")))?;
        let inside = a.checked_add(l).is_some_and(|end| {
            layout.regions.iter().any(|&(g, n, _)| a >= g && a < g + n)
                && layout
                    .regions
                    .iter()
                    .any(|&(g, n, _)| end > g && end <= g + n)
        });
        if !inside {
            return Err(bad_format(format!(
                "bad range {a:#x} + {l:#x} is not inside the snapshot's guest memory"
            )));
        }
        out.push(BadRange {
            addr: GuestAddress(a),
            len: l,
            kind,
        });
    }
    out.sort_by_key(|b| b.addr.0);
    Ok(Some(out))
}

/// The restore proper, once the image is in place.
fn restore_image<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    img: &mut Image<'_>,
    layout: Option<Layout>,
) -> Result<RestoreReport> {
    let t0 = Instant::now();
    let layout = match layout {
        Some(l) => l,
        None => read_layout(img)?,
    };
    // Check the whole layout before writing anything.
    let mut targets = Vec::with_capacity(layout.regions.len());
    for &(g, l, o) in &layout.regions {
        let parts = pieces(mem, GuestAddress(g), l).map_err(|_| Error::Layout {
            addr: GuestAddress(g),
            len: l,
        })?;
        if parts.len() > 1 {
            return Err(Error::Layout {
                addr: GuestAddress(g),
                len: l,
            });
        }
        check_writable(&parts)?;
        if let Some(p) = parts.into_iter().next() {
            targets.push((p, o));
        }
    }
    let trailer = read_trailer(img, &layout)?;
    let trailer_missing = trailer.is_none();
    let bad_at_save = trailer.unwrap_or_default();
    let host_page = foliokit::batch::page_size();
    let mut bad = Vec::new();
    let mut restored = 0u64;
    let (mut zero_bytes, mut cleared) = (0u64, 0u64);
    let zeros = Zeros::new().map_err(io_err("mapping zeros"))?;
    // The known end when the copies began, and the file offset every copy
    // so far reached (regions lie in the file in this order).
    let start_end = img.known_end;
    let mut copied_to = 0u64;
    let mut written = Vec::with_capacity(targets.len());
    for (p, o) in targets {
        let g = p.addr.0;
        let len = p.len as u64;
        let bitmap = p.region.bitmap();
        // This region's data minus the ranges that were bad at save.
        let mut segments = Vec::new();
        let mut at = g;
        for b in bad_at_save
            .iter()
            .filter(|b| b.addr.0 < g + len && b.addr.0 + b.len > g)
        {
            if b.addr.0 > at {
                segments.push((at - g, b.addr.0 - g));
            }
            at = at.max(b.addr.0 + b.len);
        }
        if at < g + len {
            segments.push((at - g, len));
        }
        // Holes of a sparse snapshot (not read) and zero pages of a dense
        // one (read until their first nonzero byte, not copied): written
        // only where guest RAM does not read zero already.
        let mut cut = Vec::with_capacity(segments.len());
        for (start, end) in segments {
            // Only whole pages the file is known to hold are looked at: the
            // page a cut file ends in reads zeros past the cut, which are
            // no snapshot bytes (the copy below reports them lost).
            let page = host_page as u64;
            let known = (img.known_end.min(img.mapped).saturating_sub(o)).clamp(start, end);
            let known = start + (known - start) / page * page;
            // SAFETY: `[o + start, o + known)` lies below the image's
            // known end and inside its mapping; a page poisoned (or cut
            // since) raises SIGBUS, which the mc loads survive (it is then
            // data, and the copy below reports it).
            let pieces = unsafe {
                img.holes
                    .zero_pieces(img.ptr, o + start, known - start, page)
            };
            for (s, n, hole) in pieces {
                cut.push((s - o, s - o + n, hole));
            }
            if known < end {
                cut.push((known, end, false));
            }
        }
        for (start, end, hole) in cut {
            if hole {
                let n = zero_piece(&p, start, end, host_page, &zeros)?;
                bitmap.mark_dirty(p.offset + start as usize, (end - start) as usize);
                restored += end - start;
                zero_bytes += end - start;
                cleared += n;
                // Taken as the file's bytes, as a copy is: a cut below
                // them later is a loss to report.
                copied_to = copied_to.max(o + end);
                continue;
            }
            let mut pos = start;
            while pos < end {
                let src_off = o + pos;
                if src_off >= img.known_end {
                    push_bad(&mut bad, g + pos, end - pos, FaultKind::Vanished);
                    break;
                }
                let n = (end - pos).min(img.known_end - src_off);
                let src = img.ptr.wrapping_add(src_off as usize);
                let dst = p.host.wrapping_add(pos as usize);
                // SAFETY: `src .. src + n` is inside the mapped image
                // (src_off + n <= known_end <= mapped, checked when the
                // image was made), read with the mc routine, which reports
                // a SIGBUS; `dst .. dst + n` is inside the guest region's
                // live writable host mapping (borrowed through `mem`),
                // which is not the image. vCPUs may run meanwhile: no
                // reference is formed over guest RAM.
                let r = unsafe { foliokit::copy_mc_raw(dst, src, n as usize, CopyStrategy::Auto) };
                match r {
                    Ok(_) => {
                        bitmap.mark_dirty(p.offset + pos as usize, n as usize);
                        restored += n;
                        pos += n;
                        copied_to = src_off + n;
                    }
                    Err(McError::Fault(f)) => {
                        let done = n - f.not_copied as u64;
                        if done > 0 {
                            bitmap.mark_dirty(p.offset + pos as usize, done as usize);
                            restored += done;
                            copied_to = src_off + done;
                        }
                        let fault_addr = src as usize + done as usize;
                        let next = (fault_addr / host_page + 1) * host_page;
                        let skip_to = (pos + (next - src as usize) as u64).min(end);
                        push_bad(&mut bad, g + pos + done, skip_to - pos - done, f.kind);
                        if f.kind == FaultKind::Vanished {
                            img.refresh_end();
                        }
                        pos = skip_to;
                    }
                    // Guest RAM itself faulted: nothing later can be written
                    // there either.
                    Err(McError::DestinationFault(f)) => {
                        let done = n - f.not_copied as u64;
                        bitmap.mark_dirty(p.offset + pos as usize, done as usize);
                        return Err(Error::GuestMemoryFault {
                            addr: GuestAddress(g + pos + done),
                            kind: f.kind,
                        });
                    }
                    Err(e) => return Err(mc_unavailable(e)),
                }
            }
        }
        written.push((g, len, o));
    }
    // A file cut mid-page while the copies ran: the part of that page past
    // the cut reads as zeros, not SIGBUS, so bytes copied past the end the
    // file now has may be zeros, not the snapshot's. Report them, as the
    // restore of a file already cut there would (a cut in the last page
    // copied raises no fault: ask the file once more).
    img.refresh_end();
    if img.known_end < start_end.min(copied_to) {
        let (lost_from, lost_to) = (img.known_end, copied_to);
        let mut lost = Vec::new();
        for &(g, len, o) in &written {
            let (lo, hi) = (lost_from.max(o), lost_to.min(o + len));
            if lo < hi {
                lost.push((g + (lo - o), g + (hi - o)));
            }
        }
        // Only bytes this restore wrote: not those bad at save nor those
        // already reported.
        for (mut at, end) in lost {
            let mut holes: Vec<(u64, u64)> = bad_at_save
                .iter()
                .chain(&bad)
                .map(|b| (b.addr.0, b.addr.0 + b.len))
                .filter(|&(a, e)| a < end && e > at)
                .collect();
            holes.sort_unstable();
            for (a, e) in holes.into_iter().chain([(end, end)]) {
                if a > at {
                    restored -= a.min(end) - at;
                    push_bad(&mut bad, at, a.min(end) - at, FaultKind::Vanished);
                }
                at = at.max(e);
            }
        }
        // Back to guest order, touching ranges of one kind merged.
        bad.sort_by_key(|b| b.addr.0);
        let mut merged = Vec::with_capacity(bad.len());
        for b in bad {
            push_bad(&mut merged, b.addr.0, b.len, b.kind);
        }
        bad = merged;
    }
    Ok(RestoreReport {
        restored,
        zero_bytes,
        cleared_bytes: cleared,
        bad,
        bad_at_save,
        trailer_missing,
        secs: t0.elapsed().as_secs_f64(),
    })
}

/// Reads and checks a snapshot file's header through read(2); returns its
/// layout and the file's size.
/// Makes `[start, end)` of guest piece `p` (offsets into it) read zero:
/// whole pages that read zero already are left alone, the rest cleared.
/// Returns the bytes cleared.
fn zero_piece<B: Bitmap>(
    p: &crate::Piece<'_, B>,
    start: u64,
    end: u64,
    page: usize,
    zeros: &Zeros,
) -> Result<u64> {
    let (lo, hi) = (
        p.host as usize + start as usize,
        p.host as usize + end as usize,
    );
    let (first, last) = (lo.div_ceil(page) * page, hi / page * page);
    let untouched = if first < last {
        zeros.untouched(p.region, first, (last - first) / page, page)
    } else {
        Vec::new()
    };
    let mut cleared = 0u64;
    let mut at = lo;
    while at < hi {
        let k = at.checked_sub(first).map(|d| d / page);
        let skip = at >= first && at < last && k.is_some_and(|k| untouched[k]);
        // The run of pages (or the partial page at either end) alike.
        let mut e = if at < first {
            first.min(hi)
        } else {
            (at / page + 1) * page
        };
        while e < last && e < hi && untouched[(e - first) / page] == skip {
            e += page;
        }
        let e = e.min(hi);
        if !skip {
            // SAFETY: inside the guest region's live writable host mapping
            // (checked before the restore began), not the zero mapping.
            unsafe { zeros.clear(at as *mut u8, e - at) }.map_err(|(done, err)| match err {
                McError::DestinationFault(f) => Error::GuestMemoryFault {
                    addr: GuestAddress(p.addr.0 + (at - p.host as usize + done) as u64),
                    kind: f.kind,
                },
                other => mc_unavailable(other),
            })?;
            cleared += (e - at) as u64;
        }
        at = e;
    }
    Ok(cleared)
}

fn file_layout(file: &File) -> Result<(Layout, u64)> {
    let size = file
        .metadata()
        .map_err(io_err("reading the snapshot's size"))?
        .len();
    // The header through read(2) first: its size says how much to map.
    let mut fixed = [0u8; HEADER_FIXED as usize];
    // A file too short for the header is not a snapshot; any other read
    // error (a directory, a write-only descriptor) is the file's, not the
    // format's.
    file.read_exact_at(&mut fixed, 0).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            bad_format("the header is missing")
        } else {
            io_err("reading the snapshot header")(e)
        }
    })?;
    let n = u64_at(&fixed, 3).min(MAX_REGIONS);
    let head_len = (HEADER_FIXED + n * ENTRY).min(size) as usize;
    let mut head = vec![0u8; head_len];
    file.read_exact_at(&mut head, 0)
        .map_err(io_err("reading the snapshot header"))?;
    let small = Image {
        ptr: head.as_ptr(),
        mapped: head_len as u64,
        known_end: head_len as u64,
        file: None,
        holes: Holes::none(),
    };
    let layout = read_layout(&small)?;
    Ok((layout, size))
}

/// What a lazy restore needs from a snapshot file: where each region's
/// bytes are (guest address, length, file offset), the ranges bad at save,
/// whether the trailer was missing, and the mapped file.
pub(crate) struct LazyPlan {
    pub regions: Vec<(u64, u64, u64)>,
    pub bad_at_save: Vec<BadRange>,
    pub trailer_missing: bool,
    pub source: foliokit::lazy::Source,
}

/// Reads a snapshot file's header and trailer and maps it for a lazy fill.
pub(crate) fn lazy_plan(file: &File) -> Result<LazyPlan> {
    let (layout, size) = file_layout(file)?;
    let map_len = usize::try_from(layout.data_end.max(size).max(1))
        .map_err(|_| bad_format("snapshot larger than the address space"))?;
    let source =
        foliokit::lazy::Source::map_file(file, map_len).map_err(io_err("mapping the snapshot"))?;
    // A file cut inside a page of region data: the mapping reads zeros past
    // the cut in that page, which the fill would install as the guest's
    // bytes. Make that page raise SIGBUS instead, so the fill reports and
    // poisons it as every page lost past the cut (the whole page: its
    // bytes before the cut are not installed either).
    let page = foliokit::batch::page_size() as u64;
    if size % page != 0
        && layout
            .regions
            .iter()
            .any(|&(_, l, o)| o <= size && size < o + l)
    {
        let at = source.as_ptr().wrapping_add((size / page * page) as usize);
        // SAFETY: the page holding `size` lies inside the mapping (map_len
        // >= data_end > size), which `source` owns and unmaps whole on
        // drop; no fill reads it yet.
        unsafe { vanish_page(at, page as usize) }
            .map_err(io_err("hiding the snapshot's cut page"))?;
    }
    let img = Image {
        ptr: source.as_ptr(),
        mapped: map_len as u64,
        known_end: size,
        file: Some(file),
        holes: Holes::none(),
    };
    let trailer = read_trailer(&img, &layout)?;
    Ok(LazyPlan {
        regions: layout.regions,
        trailer_missing: trailer.is_none(),
        bad_at_save: trailer.unwrap_or_default(),
        source,
    })
}

/// Replaces the `len`-byte page at `at` with a read-only shared mapping of
/// an empty memfd, so that reading it raises SIGBUS (`BUS_ADRERR`, read as
/// [`FaultKind::Vanished`]), as a page past the end of a file does.
///
/// # Safety
/// `[at, at + len)` must be page-aligned and inside a mapping the caller
/// owns, which nothing reads or references meanwhile.
unsafe fn vanish_page(at: *const u8, len: usize) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: a plain syscall with a static name.
    let fd = unsafe { libc::memfd_create(c"foliokit-vm-memory-cut".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just created, owned by nothing else; the mapping
    // keeps the memfd alive after it is closed.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: the caller guarantees [at, at + len) is its own unused mapping;
    // MAP_FIXED replaces just that range.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Restores a snapshot from `file` into `mem`, reading it through a
/// read-only mapping with machine-check-safe copies.
///
/// Every region of the snapshot must lie inside one region of `mem`, mapped
/// writable (checked before anything is written: [`Error::Layout`],
/// [`Error::NotWritable`]). Snapshot pages
/// that cannot be read — past the end of a file cut short, or raising
/// SIGBUS (a truncation while restoring, page-cache poison) — are reported
/// as guest ranges in [`RestoreReport::bad`] and left unwritten; the rest
/// is restored and marked dirty in the regions' bitmaps. vCPUs should be
/// paused; if they run, no undefined behaviour results, but their writes
/// and the restore's interleave.
///
/// Into fresh guest RAM, the kernel zeroes every page as this copy first
/// touches it. Where guest RAM is hugetlb, [`crate::restore_lazy`] followed
/// by [`crate::LazyRestore::wait`] avoids that (`UFFDIO_COPY` installs each
/// huge page already filled) and is the faster eager restore; its report
/// and its outcome for unreadable snapshot pages are the lazy restore's.
pub fn restore_from_file<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    file: &File,
) -> Result<RestoreReport> {
    let (layout, size) = file_layout(file)?;
    // Map the data and trailer as the header describes them, past the end
    // of a short file too: those pages raise SIGBUS, which the mc copies
    // report. The trailer's length is not known yet; map what the file has
    // beyond the data as well.
    let map_len = layout.data_end.max(size).max(1);
    let map_len_usize = usize::try_from(map_len)
        .map_err(|_| bad_format("snapshot larger than the address space"))?;
    // foliokit's read-only shared mapping of a snapshot file, the one its
    // lazy fill reads; unmapped when dropped, after the restore.
    let map =
        foliokit::lazy::Source::map_file(file, map_len_usize).map_err(|source| Error::Io {
            what: "mapping the snapshot",
            source,
        })?;
    let mut img = Image {
        ptr: map.as_ptr(),
        mapped: map_len,
        known_end: size,
        file: Some(file),
        holes: map.holes().clone(),
    };
    restore_image(mem, &mut img, Some(layout))
}

/// [`restore_from_file`] for a snapshot held in memory (e.g. the buffer
/// [`snapshot`] wrote into). A buffer shorter than the snapshot it starts
/// reports the missing guest ranges as [`FaultKind::Vanished`].
pub fn restore_from_bytes<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    image: &[u8],
) -> Result<RestoreReport> {
    // SAFETY: a slice is readable for its length and nothing writes it
    // while it is borrowed.
    unsafe { restore_raw(mem, image.as_ptr(), image.len()) }
}

/// [`restore_from_file`] for a snapshot image the caller has mapped at
/// `image` (a memfd, a DAX or pmem device, a file it mapped itself).
///
/// # Safety
/// `[image, image + len)` must be mapped readable for the whole call. Its
/// pages may raise SIGBUS (poison, a file truncated under the mapping):
/// that is reported as bad guest ranges, not a crash. Other faults
/// (unmapped or `PROT_NONE` pages) are not caught. The image may be written
/// concurrently (the restored bytes are then some interleaving), but no
/// `&mut` to it may be in use, and it must not overlap guest RAM.
pub unsafe fn restore_raw<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    image: *const u8,
    len: usize,
) -> Result<RestoreReport> {
    let mut img = Image {
        ptr: image,
        mapped: len as u64,
        known_end: len as u64,
        file: None,
        holes: Holes::none(),
    };
    restore_image(mem, &mut img, None)
}

/// [`restore_from_file`] on the file at `path`.
pub fn restore_from_path<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    path: impl AsRef<Path>,
) -> Result<RestoreReport> {
    let file = File::open(path).map_err(io_err("opening the snapshot file"))?;
    restore_from_file(mem, &file)
}

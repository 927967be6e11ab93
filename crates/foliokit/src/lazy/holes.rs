//! Where a sparse snapshot file has holes: a plain sorted set of byte
//! intervals, learned once with `SEEK_DATA`/`SEEK_HOLE`.
//!
//! A hole reads as zeros and costs nothing to keep so: the lazy fill
//! installs zero pages there without reading the file, and an eager
//! restore writes nothing there it need not. Only holes inside the file
//! count: bytes past its end are not a hole (reading them raises SIGBUS,
//! which the fill reports as a vanished page).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Sorted, disjoint, non-touching byte intervals `[start, end)` of a file
/// that are holes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holes(Vec<(u64, u64)>);

impl Holes {
    /// No holes (a source from memory, or a file without any).
    pub fn none() -> Holes {
        Holes(Vec::new())
    }

    /// From intervals in any order; empty ones dropped, overlapping or
    /// touching ones merged.
    pub fn from_intervals(mut v: Vec<(u64, u64)>) -> Holes {
        v.retain(|&(s, e)| s < e);
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match out.last_mut() {
                Some(l) if s <= l.1 => l.1 = l.1.max(e),
                _ => out.push((s, e)),
            }
        }
        Holes(out)
    }

    /// The holes of `[0, min(len, file size))` of `file`. A file system
    /// without `SEEK_HOLE` reports none (the whole file is data), as the
    /// kernel does for it.
    pub fn of_file(file: &File, len: u64) -> io::Result<Holes> {
        let size = file.metadata()?.len().min(len);
        let fd = file.as_raw_fd();
        let seek = |off: u64, whence: libc::c_int| -> io::Result<Option<u64>> {
            // SAFETY: lseek on our own descriptor moves only its offset,
            // which nothing else here relies on (reads use pread or maps).
            let r = unsafe { libc::lseek(fd, off as libc::off_t, whence) };
            if r >= 0 {
                return Ok(Some(r as u64));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // No data at or after `off`.
                Some(libc::ENXIO) => Ok(None),
                _ => Err(e),
            }
        };
        let mut v = Vec::new();
        let mut at = 0;
        while at < size {
            let data = match seek(at, libc::SEEK_DATA) {
                Ok(d) => d.unwrap_or(size).min(size),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(Holes::none()),
                Err(e) => return Err(e),
            };
            if data > at {
                v.push((at, data));
            }
            if data >= size {
                break;
            }
            at = seek(data, libc::SEEK_HOLE)?.unwrap_or(size).min(size);
        }
        Ok(Holes::from_intervals(v))
    }

    /// The intervals.
    pub fn intervals(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// Bytes in holes.
    pub fn bytes(&self) -> u64 {
        self.0.iter().map(|&(s, e)| e - s).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `[off, off + len)` is all hole (an empty range is not).
    pub fn covers(&self, off: u64, len: u64) -> bool {
        let i = self.0.partition_point(|&(_, e)| e <= off);
        len > 0
            && self
                .0
                .get(i)
                .is_some_and(|&(s, e)| s <= off && off + len <= e)
    }

    /// Whether any byte of `[off, off + len)` is in a hole.
    pub fn touches(&self, off: u64, len: u64) -> bool {
        let i = self.0.partition_point(|&(_, e)| e <= off);
        self.0.get(i).is_some_and(|&(s, _)| s < off + len)
    }

    /// `[off, off + len)` cut into alternating pieces `(start, len, hole)`,
    /// whose ends are rounded to `unit`-aligned offsets (relative to
    /// `off`): a piece is a hole only where every unit of it is all hole,
    /// so a unit partly data is data. In order, covering the range.
    pub fn pieces(&self, off: u64, len: u64, unit: u64) -> Vec<(u64, u64, bool)> {
        let mut out: Vec<(u64, u64, bool)> = Vec::new();
        let end = off + len;
        let mut push = |s: u64, e: u64, hole: bool| {
            if s >= e {
                return;
            }
            match out.last_mut() {
                Some(l) if l.2 == hole && l.0 + l.1 == s => l.1 += e - s,
                _ => out.push((s, e - s, hole)),
            }
        };
        let mut at = off;
        let first = self.0.partition_point(|&(_, e)| e <= off);
        for &(hs, he) in &self.0[first..] {
            if hs >= end {
                break;
            }
            // The whole units of this hole, counted from `off`.
            let lo = off + (hs.max(off) - off).div_ceil(unit) * unit;
            let hi = (off + (he.min(end) - off) / unit * unit).min(end);
            let hi = if he >= end { end } else { hi };
            if lo >= hi {
                continue;
            }
            push(at, lo, false);
            push(lo, hi, true);
            at = hi;
        }
        push(at, end, false);
        out
    }

    /// As [`Holes::pieces`], and data units found all zero where the file
    /// is mapped count as holes too (zeros nobody need copy; they are
    /// read once, until their first nonzero byte, with machine-check-safe
    /// loads). Where those loads are unavailable (not x86_64, SIGBUS
    /// blocked or the handler refused) data stays data.
    ///
    /// # Safety
    /// `base + o` maps the file's byte `o` readable for every `o` in
    /// `[off, off + len)` for the whole call; its pages may raise SIGBUS
    /// (a page that does is data: the copy that reads it reports it).
    pub unsafe fn zero_pieces(
        &self,
        base: *const u8,
        off: u64,
        len: u64,
        unit: u64,
    ) -> Vec<(u64, u64, bool)> {
        // SAFETY: forwarded contract.
        unsafe { self.zero_pieces_with(base, off, len, unit, |_, _| {}) }
    }

    /// [`Holes::zero_pieces`], calling `before(start, len)` on each data
    /// piece before it is read (to prefault it).
    ///
    /// # Safety
    /// As [`Holes::zero_pieces`].
    pub(crate) unsafe fn zero_pieces_with(
        &self,
        base: *const u8,
        off: u64,
        len: u64,
        unit: u64,
        mut before: impl FnMut(u64, u64),
    ) -> Vec<(u64, u64, bool)> {
        refine(self.pieces(off, len, unit), unit, |s, n| {
            before(s, n);
            // SAFETY: `[s, s + n)` lies in `[off, off + len)`, readable
            // by the caller's contract.
            unsafe { crate::mc::zero_units_raw(base.add(s as usize), n as usize, unit as usize) }
                .unwrap_or_default()
        })
    }
}

/// `pieces` (in order, covering a range, units counted from its start)
/// with each data piece cut where `scan(start, len)` says its units are all
/// zero (one flag per unit, the last possibly short; fewer flags: the rest
/// is data), neighbours of a kind merged.
pub(crate) fn refine(
    pieces: Vec<(u64, u64, bool)>,
    unit: u64,
    mut scan: impl FnMut(u64, u64) -> Vec<bool>,
) -> Vec<(u64, u64, bool)> {
    let unit = unit.max(1);
    let mut out: Vec<(u64, u64, bool)> = Vec::with_capacity(pieces.len());
    let mut push = |s: u64, n: u64, zero: bool| match out.last_mut() {
        Some(l) if l.2 == zero && l.0 + l.1 == s => l.1 += n,
        _ => out.push((s, n, zero)),
    };
    for (s, n, hole) in pieces {
        if hole {
            push(s, n, true);
            continue;
        }
        let flags = scan(s, n);
        let mut at = s;
        for z in flags.into_iter().chain(std::iter::repeat(false)) {
            if at >= s + n {
                break;
            }
            let u = unit.min(s + n - at);
            push(at, u, z);
            at += u;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    #[test]
    fn intervals_merge_and_answer() {
        let h = Holes::from_intervals(vec![(10, 20), (0, 0), (20, 30), (50, 60), (55, 58)]);
        assert_eq!(h.intervals(), &[(10, 30), (50, 60)]);
        assert_eq!(h.bytes(), 30);
        assert!(h.covers(10, 20) && h.covers(12, 3) && h.covers(50, 10));
        assert!(!h.covers(9, 2) && !h.covers(25, 30) && !h.covers(10, 0));
        assert!(!h.covers(30, 1) && !h.covers(60, 1));
        assert!(h.touches(0, 11) && h.touches(29, 100) && !h.touches(30, 20));
        assert!(!h.touches(0, 10) && !h.touches(60, 5));
        assert!(!Holes::none().covers(0, 1) && !Holes::none().touches(0, 1));
    }

    #[test]
    fn pieces_keep_partly_data_units_as_data() {
        let h = Holes::from_intervals(vec![(4, 12), (16, 24)]);
        // Units of 4 from 0: 0..4 data, 4..12 hole, 12..16 data, 16..24
        // hole, 24..28 data.
        assert_eq!(
            h.pieces(0, 28, 4),
            vec![
                (0, 4, false),
                (4, 8, true),
                (12, 4, false),
                (16, 8, true),
                (24, 4, false)
            ]
        );
        // Units of 8: only 16..24 is a whole hole unit.
        assert_eq!(
            h.pieces(0, 28, 8),
            vec![(0, 16, false), (16, 8, true), (24, 4, false)]
        );
        // A range inside one hole, and one with none.
        assert_eq!(h.pieces(5, 6, 1), vec![(5, 6, true)]);
        assert_eq!(h.pieces(12, 4, 4), vec![(12, 4, false)]);
        // Units count from `off`; the tail of the range may be a short
        // unit, a hole when the hole runs to its end.
        assert_eq!(
            h.pieces(2, 20, 4),
            vec![(2, 4, false), (6, 4, true), (10, 8, false), (18, 4, true)]
        );
        assert_eq!(Holes::none().pieces(3, 9, 4), vec![(3, 9, false)]);
    }

    #[test]
    fn refine_cuts_data_pieces_where_units_are_zero() {
        let h = Holes::from_intervals(vec![(8, 12)]);
        // Units of 4 from 0: data 0..8, hole 8..12, data 12..22 (units
        // 12..16, 16..20, 20..22).
        let mut asked = Vec::new();
        let got = refine(h.pieces(0, 22, 4), 4, |s, n| {
            asked.push((s, n));
            match s {
                0 => vec![false, true],
                _ => vec![true, false, true],
            }
        });
        assert_eq!(asked, vec![(0, 8), (12, 10)]);
        // The zero unit 4..8, the hole and the zero unit 12..16 merge.
        assert_eq!(
            got,
            vec![(0, 4, false), (4, 12, true), (16, 4, false), (20, 2, true)]
        );
        // A scan that says nothing (unavailable) leaves data as data.
        assert_eq!(
            refine(h.pieces(0, 8, 4), 4, |_, _| Vec::new()),
            vec![(0, 8, false)]
        );
    }

    #[test]
    fn a_sparse_file_reports_its_holes_and_not_past_its_end() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("foliokit-holes-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let mb = 1u64 << 20;
        // data 0..1M, hole 1M..3M, data 3M..4M, hole 4M..6M (the tail).
        f.write_all(&vec![1u8; mb as usize]).unwrap();
        f.seek(SeekFrom::Start(3 * mb)).unwrap();
        f.write_all(&vec![2u8; mb as usize]).unwrap();
        f.set_len(6 * mb).unwrap();
        let h = Holes::of_file(&f, 8 * mb).unwrap();
        if h.is_empty() {
            eprintln!("SKIP: {} reports no holes (no SEEK_HOLE)", dir.display());
            return;
        }
        // The file system may round holes to its blocks, never shrink
        // data: what it reports lies inside the holes we made.
        for &(s, e) in h.intervals() {
            assert!(
                (mb..3 * mb).contains(&s) && e <= 3 * mb
                    || (4 * mb..6 * mb).contains(&s) && e <= 6 * mb,
                "{s:#x}..{e:#x}"
            );
        }
        assert!(h.covers(mb, 2 * mb) && h.covers(4 * mb, 2 * mb));
        assert!(!h.touches(6 * mb, 2 * mb), "past the end is no hole");
        assert_eq!(
            Holes::of_file(&f, 5 * mb).unwrap().intervals().last(),
            Some(&(4 * mb, 5 * mb))
        );
    }
}

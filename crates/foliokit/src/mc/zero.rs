//! Which units of memory that may fault are all zero, read with the mc
//! routines: a snapshot's zero pages found without risking the SIGBUS of
//! a truncated or poisoned file.

use super::{mc_fn, resolve_mc, run_one, runs_here, McError};
use crate::copy::CopyStrategy;
use crate::tune::Shape;

/// Bytes read first from each unit: data pages nearly always show a
/// nonzero byte here, so a data unit costs one short read.
const PROBE: usize = 64;
/// Bytes read at a time after the probe (a stack buffer, in L1).
const CHUNK: usize = 4096;

/// Whether each `unit`-byte unit of `[src, src + len)` is all zero (the
/// last unit may be shorter). A unit whose read faults is not zero: the
/// copy that reads it later reports the fault. A unit is read only until
/// its first nonzero byte, and none is read after a page past the end of
/// its file (a truncated snapshot): what follows is past it too, and each
/// SIGBUS costs a signal. (An I/O error reading the file raises the same
/// SIGBUS: the units after it are then not looked at, only copied.)
///
/// # Safety
/// `src` is mapped readable for `len` bytes for the whole call; its pages
/// may raise SIGBUS (poison, a truncated file), which is survived as
/// with [`super::copy_mc_raw`]. Others may write it meanwhile (each byte
/// read is then an old or a new value).
pub(crate) unsafe fn zero_units_raw(
    src: *const u8,
    len: usize,
    unit: usize,
) -> Result<Vec<bool>, McError> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let unit = unit.max(1);
    let mut buf = Buf([0; CHUNK]);
    let dst = buf.0.as_mut_ptr();
    let s = resolve_mc(CopyStrategy::Auto, Shape::single(dst as usize, CHUNK))?;
    let f = mc_fn(s)?;
    runs_here()?;
    let mut out = Vec::with_capacity(len.div_ceil(unit));
    let mut at = 0;
    let mut past_end = false;
    while at < len && !past_end {
        let n = unit.min(len - at);
        let mut off = 0;
        let mut zero = true;
        while zero && off < n {
            let step = (if off == 0 { PROBE } else { CHUNK }).min(n - off);
            // SAFETY: `buf` is ours, CHUNK >= step bytes, and no reference
            // to it is live across the call; `src + at + off` lies in the
            // caller's readable range (off + step <= n, at + n <= len);
            // the handler mc_fn installed turns a SIGBUS into a short copy.
            let r = unsafe { run_one(f, dst, src.add(at + off), step) };
            past_end = matches!(&r, Err(McError::Fault(x)) if x.kind == super::FaultKind::Vanished);
            zero = r.is_ok() && all_zero(&buf.0[..step]);
            off += step;
        }
        out.push(zero);
        at += n;
    }
    out.resize(len.div_ceil(unit), false);
    Ok(out)
}

/// The read buffer, aligned as the copies like it.
#[repr(align(64))]
struct Buf([u8; CHUNK]);

fn all_zero(b: &[u8]) -> bool {
    let words = b.chunks_exact(8);
    let tail = words.remainder().iter().fold(0, |a, &x| a | x);
    tail == 0
        && words.fold(0, |a, w| {
            a | u64::from_ne_bytes(w.try_into().expect("8 bytes"))
        }) == 0
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn finds_zero_units_and_stops_at_data() {
        let page = 4096;
        let mut v = vec![0u8; 5 * page + 100];
        v[page + 4000] = 1; // a late byte: unit 1 read past its probe
        v[3 * page] = 7; // an early one
        v[5 * page + 99] = 3; // in the short tail unit
                              // SAFETY: our own vector, readable for its length.
        let z = unsafe { zero_units_raw(v.as_ptr(), v.len(), page) }.unwrap();
        assert_eq!(z, vec![true, false, true, false, true, false]);
        // SAFETY: as above.
        let z = unsafe { zero_units_raw(v.as_ptr(), 2 * page, 2 * page) }.unwrap();
        assert_eq!(z, vec![false]);
        // SAFETY: as above.
        let z = unsafe { zero_units_raw(v.as_ptr(), page, page) }.unwrap();
        assert_eq!(z, vec![true]);
        // Short units: a nonzero last byte, and a zero unit read after a
        // data one (what the buffer held before is not looked at).
        let mut w = [0u8; 13 + 13 + 13];
        w[12] = 1;
        w[13..26].fill(9);
        // SAFETY: our own array, readable for its length.
        let z = unsafe { zero_units_raw(w.as_ptr(), w.len(), 13) };
        assert_eq!(z.unwrap(), vec![false, false, true]);
    }

    #[test]
    fn a_unit_that_faults_is_not_zero() {
        use std::io::Write;
        let page = 4096;
        let mut f = tempfile_in_tmp();
        f.write_all(&vec![0u8; 2 * page]).unwrap();
        // SAFETY: a fresh read-only shared mapping of our own file, 3 pages
        // long: the third lies past its end (SIGBUS when read).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping is readable for 3 pages; the last faults,
        // which the mc read survives.
        let z = unsafe { zero_units_raw(p.cast(), 3 * page, page) }.unwrap();
        assert_eq!(z, vec![true, true, false]);
        // SAFETY: as above; the units after the first past the end are not
        // read, and not zero.
        let z = unsafe { zero_units_raw(p.cast::<u8>().add(page), 2 * page, page / 2) }.unwrap();
        assert_eq!(z, vec![true, true, false, false]);
        // SAFETY: our own mapping, unused after this.
        unsafe { libc::munmap(p, 3 * page) };
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("foliokit-zero-units-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }
}

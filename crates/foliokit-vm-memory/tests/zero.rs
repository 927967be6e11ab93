//! Zero pages cost nothing: a guest with zero pages interleaved with data
//! (single pages, a run in the middle of a 2 MiB folio, a whole folio, an
//! odd-sized region's tail) is saved as a sparse file, and restored
//! eagerly and lazily byte-exact, with the zero pages counted; a guest
//! write after a zero page was installed is kept. The same snapshot
//! written densely (its zero pages as bytes) has its zero pages found by
//! reading them, and installed as zero pages as well.
#![cfg(target_arch = "x86_64")]

#[path = "../../foliokit/tests/common/mod.rs"]
mod common;

use common::{missing, pattern, skip, temp_path, Need};
use foliokit::lazy::{fill_lazily, Holes, LazyError, LazyOptions, Segment, Source};
use foliokit_vm_memory::{
    restore_from_path, restore_lazy_from_path, snapshot_to_file, Error, LazyRestoreOptions,
};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

type Ram = GuestMemoryMmap<AtomicBitmap>;

const PAGE: usize = 4096;
const FOLIO: usize = 2 << 20;
/// Six folios and three pages: an odd size.
const A_LEN: usize = 6 * FOLIO + 3 * PAGE;
const B: u64 = 1 << 32;
const B_LEN: usize = FOLIO;

fn vm() -> Ram {
    let m = Ram::from_ranges(&[(GuestAddress(0), A_LEN), (GuestAddress(B), B_LEN)]).unwrap();
    for r in m.iter() {
        let h = m.get_host_address(r.start_addr()).unwrap();
        // SAFETY: advice on guest RAM we own.
        unsafe { libc::madvise(h.cast(), r.len() as usize, libc::MADV_HUGEPAGE) };
    }
    m
}

/// Region A's and B's bytes, and which of their pages are zero.
fn contents() -> (Vec<u8>, Vec<u8>, usize) {
    let mut a = pattern(A_LEN, 5);
    let mut b = pattern(B_LEN, 6);
    let zero = |v: &mut Vec<u8>, page: usize| v[page * PAGE..(page + 1) * PAGE].fill(0);
    let mut n = 0;
    // Folio 0: every third page.
    for p in (0..512).step_by(3) {
        zero(&mut a, p);
        n += 1;
    }
    // Folio 1: a run in its middle.
    for p in 512 + 200..512 + 300 {
        zero(&mut a, p);
        n += 1;
    }
    // Folios 2 to 4: all of them. Guest RAM is not 2 MiB-aligned in the
    // host, where the fill's folios are: this run holds two whole ones.
    for p in 1024..2560 {
        zero(&mut a, p);
        n += 1;
    }
    // The odd tail: its last two pages.
    for p in 3073..3075 {
        zero(&mut a, p);
        n += 1;
    }
    // Region B: its second half.
    for p in 256..512 {
        zero(&mut b, p);
        n += 1;
    }
    (a, b, n)
}

fn read(mem: &Ram, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
    v
}

/// Saves the guest; returns the snapshot's path, the bytes and the zero
/// pages, and whether its file system keeps holes.
fn saved(what: &str) -> (std::path::PathBuf, Vec<u8>, Vec<u8>, usize, bool) {
    let (a, b, n) = contents();
    let src = vm();
    src.write_slice(&a, GuestAddress(0)).unwrap();
    src.write_slice(&b, GuestAddress(B)).unwrap();
    let path = temp_path(what);
    let r = snapshot_to_file(&src, &path).unwrap();
    assert_eq!(r.zero_pages, n as u64);
    let f = std::fs::File::open(&path).unwrap();
    let holes = Holes::of_file(&f, u64::MAX).unwrap();
    let sparse = holes.bytes() > 0;
    if sparse {
        // The file system may keep fewer holes (whole blocks only), never
        // more than the zero pages.
        assert!(holes.bytes() <= (n * PAGE) as u64, "{}", holes.bytes());
    } else {
        skip("the temp file system keeps no holes: zero pages are read as data");
    }
    (path, a, b, n, sparse)
}

#[test]
fn a_sparse_snapshot_restores_eagerly_byte_exact_into_fresh_and_dirty_guest_ram() {
    let (path, a, b, n, sparse) = saved("zero-eager");
    let fresh = vm();
    let r = restore_from_path(&fresh, &path).unwrap();
    assert!(r.bad.is_empty());
    assert!(read(&fresh, 0, A_LEN) == a && read(&fresh, B, B_LEN) == b);
    if sparse {
        assert_eq!(r.zero_bytes, (n * PAGE) as u64);
        // Fresh private anonymous memory reads zero: the two host folios
        // inside the zero run are left alone (holes in a folio the data
        // copy faulted in as a huge page are cleared: populated now).
        assert!(r.cleared_bytes <= r.zero_bytes - 2 * FOLIO as u64, "{r:?}");
    }
    // Guest RAM holding other bytes: the holes must be cleared.
    let dirty = vm();
    dirty
        .write_slice(&vec![0xa5; A_LEN], GuestAddress(0))
        .unwrap();
    dirty
        .write_slice(&vec![0x5a; B_LEN], GuestAddress(B))
        .unwrap();
    let r = restore_from_path(&dirty, &path).unwrap();
    assert!(read(&dirty, 0, A_LEN) == a, "a stale byte survived in A");
    assert!(read(&dirty, B, B_LEN) == b, "a stale byte survived in B");
    assert_eq!(r.cleared_bytes, r.zero_bytes);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_sparse_snapshot_restores_lazily_byte_exact_and_a_write_after_a_zero_page_is_kept() {
    let (path, a, b, n, sparse) = saved("zero-lazy");
    let mem = vm();
    let mut o = LazyRestoreOptions::default();
    o.fill.start_cancelled = true;
    let h = match restore_lazy_from_path(&mem, &path, &o) {
        Ok(h) => h,
        Err(Error::Lazy(LazyError::Refused(why))) => {
            missing(Need::Uffd, &format!("lazy restore unavailable here: {why}"));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    // A touch of the all-zero folio gets zero pages; a write after it
    // lands on a page of its own and must survive the rest of the fill.
    let at = FOLIO as u64 * 3 + FOLIO as u64 / 2 + 5 * PAGE as u64;
    assert_eq!(read(&mem, at, 8), vec![0; 8]);
    mem.write_slice(b"written!", GuestAddress(at)).unwrap();
    let r = h.wait();
    assert!(r.bad.is_empty());
    let mut want = a.clone();
    want[at as usize..at as usize + 8].copy_from_slice(b"written!");
    assert!(read(&mem, 0, A_LEN) == want, "region A differs");
    assert!(read(&mem, B, B_LEN) == b, "region B differs");
    let z = r.fill.progress.zero_pages;
    if sparse {
        // The two whole host folios in the zero run at least (partly zero
        // folios are copied and moved in whole); never more than the
        // snapshot's zero pages.
        assert!(z >= 2 * 512 && z <= n as u64, "{z} zero pages of {n}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_bare_fill_of_base_pages_installs_every_hole_page_as_a_zero_page() {
    // Data, a hole mid-way, data, and a tail that is a hole (the file is
    // set longer than its last data).
    let len = 64 * PAGE;
    let data = pattern(len, 9);
    let path = temp_path("zero-bare");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let _ = std::fs::remove_file(&path);
    use std::os::unix::fs::FileExt;
    let mut want = vec![0u8; len];
    for (lo, hi) in [(0, 10), (20, 40)] {
        f.write_all_at(&data[lo * PAGE..hi * PAGE], (lo * PAGE) as u64)
            .unwrap();
        want[lo * PAGE..hi * PAGE].copy_from_slice(&data[lo * PAGE..hi * PAGE]);
    }
    f.set_len(len as u64).unwrap();
    let holes = Holes::of_file(&f, len as u64).unwrap().bytes() / PAGE as u64;
    if let Some(zero) = bare_fill(&f, &want) {
        assert_eq!(zero, holes);
    }
}

/// Fills fresh memory of `want.len()` bytes from `f` with a bare fill of
/// base pages; checks it ends byte-exact with every page in, and returns
/// the zero pages it installed (None: no userfaultfd here, said why).
fn bare_fill(f: &std::fs::File, want: &[u8]) -> Option<u64> {
    let len = want.len();
    let src = Source::map_file(f, len).unwrap();
    // SAFETY: a fresh private anonymous mapping of ours.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let seg = Segment {
        addr: p as usize,
        len,
        offset: 0,
    };
    let o = LazyOptions {
        folio_size: PAGE,
        ..LazyOptions::default()
    };
    // SAFETY: the range is ours and untouched until the fill ends.
    let zero = match unsafe { fill_lazily(&[seg], src, &o) } {
        Ok(h) => {
            let r = h.wait();
            assert_eq!(
                r.progress.filled_pages + r.progress.faulted_pages,
                (len / PAGE) as u64
            );
            // SAFETY: our mapping, plain memory again.
            let got = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
            assert!(got == want, "the fill differs");
            Some(r.progress.zero_pages)
        }
        Err(LazyError::Refused(why)) => {
            missing(Need::Uffd, &format!("lazy fill unavailable here: {why}"));
            None
        }
        Err(e) => panic!("{e}"),
    };
    // SAFETY: our mapping, no longer used.
    unsafe { libc::munmap(p, len) };
    zero
}

/// A dense copy of `path`: every zero page written as bytes.
fn dense(path: &std::path::Path, what: &str) -> std::path::PathBuf {
    let bytes = std::fs::read(path).unwrap();
    let out = temp_path(what);
    std::fs::write(&out, &bytes).unwrap();
    let f = std::fs::File::open(&out).unwrap();
    assert_eq!(
        Holes::of_file(&f, u64::MAX).unwrap().bytes(),
        0,
        "a hole in the dense copy"
    );
    out
}

#[test]
fn a_dense_snapshot_has_its_zero_pages_found_eagerly_and_lazily() {
    let (sparse_path, a, b, n, _) = saved("zero-dense-src");
    let path = dense(&sparse_path, "zero-dense");
    let _ = std::fs::remove_file(&sparse_path);
    let fresh = vm();
    let r = restore_from_path(&fresh, &path).unwrap();
    assert!(r.bad.is_empty());
    assert!(read(&fresh, 0, A_LEN) == a && read(&fresh, B, B_LEN) == b);
    assert_eq!(r.zero_bytes, (n * PAGE) as u64, "{r:?}");
    let dirty = vm();
    dirty
        .write_slice(&vec![0xa5; A_LEN], GuestAddress(0))
        .unwrap();
    dirty
        .write_slice(&vec![0x5a; B_LEN], GuestAddress(B))
        .unwrap();
    let r = restore_from_path(&dirty, &path).unwrap();
    assert!(read(&dirty, 0, A_LEN) == a, "a stale byte survived in A");
    assert!(read(&dirty, B, B_LEN) == b, "a stale byte survived in B");
    assert_eq!(r.cleared_bytes, r.zero_bytes);

    let mem = vm();
    let h = match restore_lazy_from_path(&mem, &path, &LazyRestoreOptions::default()) {
        Ok(h) => h,
        Err(Error::Lazy(LazyError::Refused(why))) => {
            missing(Need::Uffd, &format!("lazy restore unavailable here: {why}"));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let r = h.wait();
    assert!(r.bad.is_empty());
    assert!(read(&mem, 0, A_LEN) == a, "region A differs");
    assert!(read(&mem, B, B_LEN) == b, "region B differs");
    // The two whole host folios in the zero run at least, as from holes.
    let z = r.fill.progress.zero_pages;
    assert!(z >= 2 * 512 && z <= n as u64, "{z} zero pages of {n}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_bare_fill_of_base_pages_finds_the_zero_pages_of_a_dense_file() {
    let len = 64 * PAGE;
    let mut want = pattern(len, 11);
    // Zero pages: single ones, a run, one zero but for its last byte, and
    // the last page.
    for p in [3usize, 7, 20, 21, 22, 23, 40, 63] {
        want[p * PAGE..(p + 1) * PAGE].fill(0);
    }
    want[41 * PAGE..42 * PAGE - 1].fill(0);
    let path = temp_path("zero-dense-bare");
    std::fs::write(&path, &want).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    if let Some(zero) = bare_fill(&f, &want) {
        assert_eq!(zero, 8);
    }
}

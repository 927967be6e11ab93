//! foliokit-vm-memory against the real vm-memory crate: prefault, snapshot
//! and restore (including truncated snapshots and guest RAM that SIGBUSes),
//! dirty bitmaps, and migration.
#![cfg(target_arch = "x86_64")]

// The one shared harness of the workspace (patterns, truncatable files,
// skip reporting), not a copy.
#[path = "../../foliokit/tests/common/mod.rs"]
mod common;

use common::{pattern, temp_file, temp_path};
use foliokit::mem::resident_pages;
use foliokit::migrate::{MigrateOptions, Path};
use foliokit_vm_memory::{
    migrate_range, prefault, prefault_range, restore_from_bytes, restore_from_file,
    restore_lazy_from_path, restore_raw, snapshot, snapshot_to_file, BadRange, Error, FaultKind,
    LazyRestoreOptions, SnapshotReport,
};
use vm_memory::bitmap::{AtomicBitmap, Bitmap};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MmapRegion,
};

const PAGE: u64 = 4096;
const A: u64 = 0;
const A_LEN: u64 = 8 << 20;
const B: u64 = 1 << 32;
const B_LEN: u64 = 4 << 20;

fn ranges() -> [(GuestAddress, usize); 2] {
    [
        (GuestAddress(A), A_LEN as usize),
        (GuestAddress(B), B_LEN as usize),
    ]
}

fn vm() -> GuestMemoryMmap<AtomicBitmap> {
    GuestMemoryMmap::from_ranges(&ranges()).expect("guest memory")
}

/// Fills every region with a position-dependent pattern through vm-memory.
fn fill(mem: &GuestMemoryMmap<AtomicBitmap>, seed: u64) {
    for r in mem.iter() {
        let p = pattern(r.len() as usize, seed ^ r.start_addr().0);
        mem.write_slice(&p, r.start_addr()).expect("write guest");
    }
}

/// Guest RAM filled from `seed` ([`fill`]), its snapshot in memory, and
/// the snapshot's report.
fn snapshot_of(seed: u64) -> (GuestMemoryMmap<AtomicBitmap>, Vec<u8>, SnapshotReport) {
    let mem = vm();
    fill(&mem, seed);
    let mut image = Vec::new();
    let saved = snapshot(&mem, &mut image).expect("snapshot");
    (mem, image, saved)
}

fn read(mem: &GuestMemoryMmap<AtomicBitmap>, addr: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    mem.read_slice(&mut v, GuestAddress(addr))
        .expect("read guest");
    v
}

fn host(mem: &GuestMemoryMmap<AtomicBitmap>, addr: u64) -> *mut u8 {
    mem.get_host_address(GuestAddress(addr))
        .expect("host address")
}

/// Pages of the guest range marked dirty in its region's bitmap.
fn dirty_pages(mem: &GuestMemoryMmap<AtomicBitmap>, addr: u64, len: u64) -> Vec<u64> {
    let r = mem.find_region(GuestAddress(addr)).expect("region");
    let off = addr - r.start_addr().0;
    (0..len.div_ceil(PAGE))
        .filter(|i| r.bitmap().dirty_at((off + i * PAGE) as usize))
        .map(|i| addr + i * PAGE)
        .collect()
}

#[test]
fn prefault_makes_guest_pages_resident_and_keeps_contents() {
    let mem = vm();
    for (a, l) in [(A, A_LEN), (B, B_LEN)] {
        assert_eq!(
            resident_pages(host(&mem, a), l as usize).unwrap(),
            0,
            "fresh guest RAM at {a:#x} should not be resident yet"
        );
    }
    // Some bytes written before must survive the prefault.
    let probe = pattern(3 * PAGE as usize + 5, 9);
    mem.write_slice(&probe, GuestAddress(A + 5 * PAGE + 3))
        .unwrap();
    let r = prefault(&mem, 2).expect("prefault");
    assert_eq!(r.bytes, A_LEN + B_LEN);
    for (a, l) in [(A, A_LEN), (B, B_LEN)] {
        assert_eq!(
            resident_pages(host(&mem, a), l as usize).unwrap() as u64,
            l / PAGE,
            "guest RAM at {a:#x} not all resident after prefault"
        );
    }
    assert_eq!(read(&mem, A + 5 * PAGE + 3, probe.len() as u64), probe);
    assert!(read(&mem, B, B_LEN).iter().all(|&b| b == 0));
}

#[test]
fn prefault_range_spans_regions_and_refuses_holes_and_read_only_memory() {
    let mem = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&[
        (GuestAddress(0), 2 << 20),
        (GuestAddress(2 << 20), 2 << 20),
    ])
    .unwrap();
    // An unaligned range across the two regions: its pages become resident.
    let (start, len) = ((1 << 20) + 123, 2 << 20);
    prefault_range(&mem, GuestAddress(start), len, 2).expect("prefault range");
    let first = host(&mem, start);
    let second = host(&mem, 2 << 20);
    let in_first = (2 << 20) - start;
    // Every host page the range touches, the partial first one included.
    let spanned = |p: *mut u8, l: u64| (p as u64 + l).div_ceil(PAGE) - p as u64 / PAGE;
    assert_eq!(
        resident_pages(first, in_first as usize).unwrap() as u64,
        spanned(first, in_first)
    );
    assert_eq!(
        resident_pages(second, (len - in_first) as usize).unwrap() as u64,
        spanned(second, len - in_first)
    );
    // A hole.
    let e = prefault_range(&mem, GuestAddress(3 << 20), 2 << 20, 1).unwrap_err();
    assert!(
        matches!(e, Error::NotGuestMemory { missing, .. } if missing == GuestAddress(4 << 20)),
        "{e}"
    );
    // A wrapping range.
    let e = prefault_range(&mem, GuestAddress(u64::MAX - 10), 100, 1).unwrap_err();
    assert!(matches!(e, Error::Wraps { .. }), "{e}");
    // A read-only region is refused before anything is touched.
    let ro = MmapRegion::<()>::build(
        None,
        1 << 20,
        libc::PROT_READ,
        libc::MAP_ANONYMOUS | libc::MAP_PRIVATE | libc::MAP_NORESERVE,
    )
    .unwrap();
    let ro_mem =
        GuestMemoryMmap::from_regions(vec![GuestRegionMmap::new(ro, GuestAddress(0)).unwrap()])
            .unwrap();
    let e = prefault(&ro_mem, 1).unwrap_err();
    assert!(matches!(e, Error::NotWritable { .. }), "{e}");
}

#[test]
fn snapshot_restore_round_trip_is_exact_and_marks_everything_dirty() {
    let (mem, image, saved) = snapshot_of(1);
    assert!(saved.bad.is_empty());
    assert_eq!(saved.guest_bytes, A_LEN + B_LEN);
    assert_eq!(saved.bytes_written, image.len() as u64);

    let fresh = vm();
    let r = restore_from_bytes(&fresh, &image).expect("restore");
    assert_eq!(r.restored, A_LEN + B_LEN);
    assert!(r.bad.is_empty() && r.bad_at_save.is_empty() && !r.trailer_missing);
    for (a, l) in [(A, A_LEN), (B, B_LEN)] {
        assert!(read(&fresh, a, l) == read(&mem, a, l), "region {a:#x}");
        assert_eq!(dirty_pages(&fresh, a, l).len() as u64, l / PAGE);
    }

    // The same through a file.
    let path = temp_path("roundtrip");
    let saved_file = snapshot_to_file(&mem, &path).expect("snapshot to file");
    assert_eq!(saved_file.bytes_written, image.len() as u64);
    assert!(
        std::fs::read(&path).unwrap() == image,
        "file differs from buffer"
    );
    let fresh2 = vm();
    let r = restore_from_file(&fresh2, &std::fs::File::open(&path).unwrap()).expect("restore");
    assert_eq!(r.restored, A_LEN + B_LEN);
    for (a, l) in [(A, A_LEN), (B, B_LEN)] {
        assert!(read(&fresh2, a, l) == read(&mem, a, l), "region {a:#x}");
    }
    let _ = std::fs::remove_file(&path);
}

/// A fresh VM whose RAM holds 0xEE everywhere with clean bitmaps, so that
/// bytes a restore did not write and pages it did not mark are visible.
fn poisoned_canvas() -> GuestMemoryMmap<AtomicBitmap> {
    let m = vm();
    for r in m.iter() {
        m.write_slice(&vec![0xEE; r.len() as usize], r.start_addr())
            .unwrap();
        let mapping: &MmapRegion<AtomicBitmap> = r;
        mapping.bitmap().reset();
    }
    m
}

/// Checks a restore that lost exactly `lost` (in guest order): those bytes
/// untouched and clean, everything else equal to `mem` and dirty.
fn check_partial(
    mem: &GuestMemoryMmap<AtomicBitmap>,
    fresh: &GuestMemoryMmap<AtomicBitmap>,
    lost: &[(u64, u64)],
) {
    for (a, l) in [(A, A_LEN), (B, B_LEN)] {
        let want = read(mem, a, l);
        let got = read(fresh, a, l);
        let dirty = dirty_pages(fresh, a, l);
        for page in 0..l / PAGE {
            let g = a + page * PAGE;
            let i = (page * PAGE) as usize;
            let is_lost = lost.iter().any(|&(s, n)| g >= s && g < s + n);
            let bytes = &got[i..i + PAGE as usize];
            if is_lost {
                assert!(
                    bytes.iter().all(|&b| b == 0xEE),
                    "lost page {g:#x} was written"
                );
                assert!(!dirty.contains(&g), "lost page {g:#x} marked dirty");
            } else {
                assert!(bytes == &want[i..i + PAGE as usize], "page {g:#x} differs");
                assert!(dirty.contains(&g), "restored page {g:#x} not dirty");
            }
        }
    }
}

#[test]
fn a_snapshot_file_cut_short_by_n_pages_reports_exactly_those_guest_ranges() {
    let mem = vm();
    fill(&mem, 2);
    let path = temp_path("truncated");
    snapshot_to_file(&mem, &path).expect("snapshot");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // The data ends at a page boundary, followed by the trailer.
    let data_end = PAGE + A_LEN + B_LEN;
    for n in [1u64, 7, B_LEN / PAGE, B_LEN / PAGE + 3] {
        file.set_len(data_end - n * PAGE).unwrap();
        let fresh = poisoned_canvas();
        let r = restore_from_file(&fresh, &file).expect("restore");
        let expect: Vec<(u64, u64)> = if n * PAGE <= B_LEN {
            vec![(B + B_LEN - n * PAGE, n * PAGE)]
        } else {
            let in_a = n * PAGE - B_LEN;
            vec![(A + A_LEN - in_a, in_a), (B, B_LEN)]
        };
        let want: Vec<BadRange> = expect
            .iter()
            .map(|&(a, len)| BadRange {
                addr: GuestAddress(a),
                len,
                kind: FaultKind::Vanished,
            })
            .collect();
        assert_eq!(r.bad, want, "n = {n}");
        assert!(r.trailer_missing, "n = {n}: the trailer was cut off");
        assert_eq!(r.restored, A_LEN + B_LEN - n * PAGE, "n = {n}");
        check_partial(&mem, &fresh, &expect);
    }
    let _ = std::fs::remove_file(&path);
}

/// The snapshot vanishes under an existing mapping: the restore's copies
/// take SIGBUS (`BUS_ADRERR`) and report the pages instead of dying.
#[test]
fn pages_vanishing_under_a_mapped_snapshot_are_reported_through_sigbus() {
    let mem = vm();
    fill(&mem, 3);
    let path = temp_path("mapped");
    let saved = snapshot_to_file(&mem, &path).expect("snapshot");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let len = saved.bytes_written as usize;
    let map = foliokit::lazy::Source::map_file(&file, len).expect("map the snapshot");
    // Cut 5 pages of region A's data and everything after it.
    let cut = PAGE + A_LEN - 5 * PAGE;
    file.set_len(cut).unwrap();
    let fresh = poisoned_canvas();
    // SAFETY: the mapping covers `len` bytes for the whole call; the pages
    // past the new end raise SIGBUS, which restore_raw reports.
    let r = unsafe { restore_raw(&fresh, map.as_ptr(), len) }.expect("restore");
    drop(map);
    let expect = [(A + A_LEN - 5 * PAGE, 5 * PAGE), (B, B_LEN)];
    assert_eq!(
        r.bad,
        expect
            .iter()
            .map(|&(a, l)| BadRange {
                addr: GuestAddress(a),
                len: l,
                kind: FaultKind::Vanished
            })
            .collect::<Vec<_>>()
    );
    assert!(r.trailer_missing);
    check_partial(&mem, &fresh, &expect);
    let _ = std::fs::remove_file(&path);
}

/// Guest RAM backed by a file that is truncated under the VMM: reading it
/// raises SIGBUS. The snapshot survives, records the lost guest pages, and
/// the restore leaves them unwritten and reports them.
#[test]
fn guest_ram_that_sigbuses_is_recorded_in_the_snapshot_and_skipped_on_restore() {
    let (backing, path) = temp_file("guest-ram");
    backing.set_len(B_LEN).unwrap();
    let mem = GuestMemoryMmap::<AtomicBitmap>::from_ranges_with_files([
        (GuestAddress(A), A_LEN as usize, None),
        (
            GuestAddress(B),
            B_LEN as usize,
            Some(FileOffset::new(backing.try_clone().unwrap(), 0)),
        ),
    ])
    .unwrap();
    fill(&mem, 4);
    let want_a = read(&mem, A, A_LEN);
    let want_b = read(&mem, B, B_LEN);
    // Guest pages from B + 1 MiB + 3 pages on vanish.
    let keep = (1 << 20) + 3 * PAGE;
    backing.set_len(keep).unwrap();
    let mut image = Vec::new();
    let saved = snapshot(&mem, &mut image).expect("snapshot survives SIGBUS");
    let lost = BadRange {
        addr: GuestAddress(B + keep),
        len: B_LEN - keep,
        kind: FaultKind::Vanished,
    };
    assert_eq!(saved.bad, vec![lost]);

    let fresh = poisoned_canvas();
    let r = restore_from_bytes(&fresh, &image).expect("restore");
    assert!(r.bad.is_empty() && !r.trailer_missing);
    assert_eq!(r.bad_at_save, vec![lost]);
    assert_eq!(r.restored, A_LEN + keep);
    assert!(read(&fresh, A, A_LEN) == want_a);
    let got_b = read(&fresh, B, B_LEN);
    assert!(got_b[..keep as usize] == want_b[..keep as usize]);
    assert!(got_b[keep as usize..].iter().all(|&b| b == 0xEE));
    assert_eq!(
        dirty_pages(&fresh, B, B_LEN),
        (0..keep / PAGE).map(|i| B + i * PAGE).collect::<Vec<_>>()
    );
    drop(mem);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn restore_refuses_a_foreign_layout_or_a_damaged_header_untouched() {
    let (_mem, image, _) = snapshot_of(5);
    // Guest memory without region B.
    let other =
        GuestMemoryMmap::<AtomicBitmap>::from_ranges(&[(GuestAddress(A), A_LEN as usize)]).unwrap();
    let e = restore_from_bytes(&other, &image).unwrap_err();
    assert!(
        matches!(e, Error::Layout { addr, .. } if addr == GuestAddress(B)),
        "{e}"
    );
    assert!(
        read(&other, A, A_LEN).iter().all(|&b| b == 0),
        "wrote before refusing"
    );
    // Damaged headers.
    let mut bad = image.clone();
    bad[0] ^= 1;
    assert!(matches!(
        restore_from_bytes(&other, &bad),
        Err(Error::Format(_))
    ));
    let mut bad = image.clone();
    bad[32 + 16] ^= 1; // region A's file offset
    assert!(matches!(
        restore_from_bytes(&other, &bad),
        Err(Error::Format(_))
    ));
    assert!(matches!(
        restore_from_bytes(&other, &image[..20]),
        Err(Error::Format(_))
    ));
    assert!(matches!(
        restore_from_bytes(&other, &[]),
        Err(Error::Format(_))
    ));
    // A trailer's bad range that runs past the guest address space (a
    // damaged or hostile file): refused, not summed into a wrapped end.
    let n = image.len();
    assert_eq!(
        &image[n - 16..n - 8],
        b"FKVMBAD\0",
        "an empty trailer ends the image"
    );
    let mut bad = image.clone();
    bad[n - 8..].copy_from_slice(&1u64.to_le_bytes());
    for v in [A + 4096, u64::MAX - 4096, 2] {
        bad.extend_from_slice(&v.to_le_bytes());
    }
    let fresh = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&[
        (GuestAddress(A), A_LEN as usize),
        (GuestAddress(B), B_LEN as usize),
    ])
    .unwrap();
    let e = restore_from_bytes(&fresh, &bad).unwrap_err();
    assert!(matches!(e, Error::Format(_)), "{e}");
    assert!(
        read(&fresh, A, A_LEN).iter().all(|&b| b == 0),
        "wrote before refusing"
    );
}

#[test]
fn a_region_that_runs_past_the_address_space_is_refused_by_both_restores() {
    // One region whose guest end wraps (it passes the file-offset check),
    // and a trailer naming a range in it: the lazy restore read that
    // trailer, summing the wrapped end (a panic with overflow checks).
    let (g, len) = (u64::MAX - 4095, 8192u64);
    let mut img = b"FKVMSNAP".to_vec();
    for x in [1u64, 4096, 1, g, len, 4096] {
        img.extend_from_slice(&x.to_le_bytes());
    }
    img.resize(4096 + len as usize, 0x5a);
    img.extend_from_slice(b"FKVMBAD\0");
    for x in [1u64, g, 16, 1] {
        img.extend_from_slice(&x.to_le_bytes());
    }
    let mem =
        GuestMemoryMmap::<AtomicBitmap>::from_ranges(&[(GuestAddress(A), A_LEN as usize)]).unwrap();
    let e = restore_from_bytes(&mem, &img).unwrap_err();
    assert!(matches!(e, Error::Format(_)), "{e}");
    let path = temp_path("wrapping-region");
    std::fs::write(&path, &img).unwrap();
    let lazy = restore_lazy_from_path(&mem, &path, &LazyRestoreOptions::default());
    let _ = std::fs::remove_file(&path);
    assert!(matches!(lazy, Err(Error::Format(_))), "{:?}", lazy.err());
    assert!(
        read(&mem, A, A_LEN).iter().all(|&b| b == 0),
        "wrote before refusing"
    );
}

#[test]
fn migrate_a_guest_range_to_node_0() {
    let nodes = foliokit::mem::system::numa_nodes();
    if !nodes.contains(&0) {
        common::skip(&format!("no NUMA node 0 here (online: {nodes:?})"));
        return;
    }
    let mem = vm();
    fill(&mem, 6);
    let before = read(&mem, A, A_LEN);
    let opts = MigrateOptions::default();
    let out = match migrate_range(&mem, GuestAddress(A), A_LEN, 0, &opts) {
        Ok(out) => out,
        Err(Error::Migrate { source, .. })
            if matches!(&source, foliokit::migrate::MigrateError::Sys { source: io, .. }
                if matches!(io.raw_os_error(), Some(libc::ENOSYS | libc::EPERM))) =>
        {
            common::missing(
                common::Need::MovePages,
                &format!("move_pages unavailable: {source}"),
            );
            return;
        }
        Err(e) => panic!("migrate: {e}"),
    };
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].addr, out[0].len), (GuestAddress(A), A_LEN));
    assert!(
        out[0].report.failed.is_empty(),
        "{:?}",
        out[0].report.failed
    );
    assert_eq!(
        read(&mem, A, A_LEN),
        before,
        "migration changed guest bytes"
    );
    if nodes.len() == 1 {
        common::say("NOTE: one NUMA node: every page was already on node 0");
        assert_eq!(out[0].report.pages_to_move, 0);
    }
    // A single page at the end of a region.
    let out = migrate_range(&mem, GuestAddress(A + A_LEN - PAGE), PAGE, 0, &opts).unwrap();
    assert_eq!(out.len(), 1);
    // Relocation is opt-in through the unsafe entry point.
    let reloc = MigrateOptions::default().path(Path::Relocate);
    assert!(matches!(
        migrate_range(&mem, GuestAddress(A), A_LEN, 0, &reloc),
        Err(Error::RelocationNeedsUnsafe)
    ));
    // Misaligned ranges are a typed error.
    let e = migrate_range(&mem, GuestAddress(A + 1), PAGE, 0, &opts).unwrap_err();
    assert!(matches!(e, Error::Migrate { .. }), "{e}");
    // A node that does not exist.
    let e = migrate_range(&mem, GuestAddress(B), B_LEN, 4095, &opts).unwrap_err();
    assert!(matches!(e, Error::Migrate { .. }), "{e}");
}

/// A file cut in the middle of a page: the bytes before the cut are
/// restored, the rest of that page and everything after are reported,
/// byte-exact (the page's readable tail would read as zeros, not data).
#[test]
fn a_snapshot_cut_mid_page_loses_exactly_the_bytes_past_the_cut() {
    let (mem, image, _) = snapshot_of(7);
    let data_end = (PAGE + A_LEN + B_LEN) as usize;
    let cut = data_end - 2 * PAGE as usize - 100;
    let fresh = poisoned_canvas();
    let r = restore_from_bytes(&fresh, &image[..cut]).expect("restore");
    let lost_from = B + B_LEN - 2 * PAGE - 100;
    assert_eq!(
        r.bad,
        vec![BadRange {
            addr: GuestAddress(lost_from),
            len: 2 * PAGE + 100,
            kind: FaultKind::Vanished
        }]
    );
    let got = read(&fresh, B, B_LEN);
    let want = read(&mem, B, B_LEN);
    let k = (lost_from - B) as usize;
    assert!(got[..k] == want[..k]);
    assert!(got[k..].iter().all(|&b| b == 0xEE));
    // The partly restored page is dirty (bitmaps are page-granular); the
    // two lost whole pages are not.
    let dirty = dirty_pages(&fresh, B + B_LEN - 3 * PAGE, 3 * PAGE);
    assert_eq!(dirty, vec![B + B_LEN - 3 * PAGE]);
}

/// A one-region guest of `len` bytes mapped read-only.
fn read_only_vm(len: usize) -> GuestMemoryMmap<AtomicBitmap> {
    let ro = MmapRegion::<AtomicBitmap>::build(
        None,
        len,
        libc::PROT_READ,
        libc::MAP_ANONYMOUS | libc::MAP_PRIVATE | libc::MAP_NORESERVE,
    )
    .unwrap();
    GuestMemoryMmap::from_regions(vec![GuestRegionMmap::new(ro, GuestAddress(0)).unwrap()]).unwrap()
}

#[test]
fn restore_into_read_only_guest_memory_is_refused_before_writing() {
    let src = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    fill(&src, 3);
    let mut image = Vec::new();
    snapshot(&src, &mut image).expect("snapshot");
    let ro = read_only_vm(1 << 20);
    let e = restore_from_bytes(&ro, &image).unwrap_err();
    assert!(
        matches!(e, Error::NotWritable { addr } if addr == GuestAddress(0)),
        "{e}"
    );
    let path = temp_path("read-only");
    std::fs::write(&path, &image).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let e = restore_from_file(&ro, &f).unwrap_err();
    assert!(matches!(e, Error::NotWritable { .. }), "{e}");
    let _ = std::fs::remove_file(&path);
    assert!(read(&ro, 0, 1 << 20).iter().all(|&b| b == 0));
}

#[test]
fn unreadable_snapshot_files_are_io_errors_and_short_ones_format_errors() {
    let (_, image, _) = snapshot_of(4);
    let path = temp_path("io-errors");
    std::fs::write(&path, &image).unwrap();
    let mem = vm();
    // A descriptor open for writing only cannot be read.
    let wo = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let e = restore_from_file(&mem, &wo).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    // Nor can a directory.
    let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
    let e = restore_from_file(&mem, &dir).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    // A file shorter than the header is not a snapshot.
    std::fs::write(&path, &image[..10]).unwrap();
    let short = std::fs::File::open(&path).unwrap();
    let e = restore_from_file(&mem, &short).unwrap_err();
    assert!(matches!(e, Error::Format(_)), "{e}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn snapshot_refuses_more_regions_than_restore_takes_before_writing() {
    // One page each, a page apart: 65537 regions, one past the limit.
    let r: Vec<_> = (0..(1u64 << 16) + 1)
        .map(|i| (GuestAddress(i * 2 * PAGE), PAGE as usize))
        .collect();
    let mem = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&r).expect("guest memory");
    let mut image = Vec::new();
    let e = snapshot(&mem, &mut image).unwrap_err();
    assert!(matches!(e, Error::Format(_)), "{e}");
    assert!(image.is_empty(), "{} bytes written", image.len());
}

/// Registers the page at `at` with a new userfaultfd (missing faults), or
/// says why it cannot here and returns None.
fn uffd_page(at: *mut u8) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    const UFFD_USER_MODE_ONLY: libc::c_long = 1;
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
    let mut fd = -1;
    for flags in [
        libc::O_CLOEXEC as libc::c_long | UFFD_USER_MODE_ONLY,
        libc::O_CLOEXEC as libc::c_long,
    ] {
        // SAFETY: a plain syscall.
        fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
        if fd >= 0 {
            break;
        }
    }
    if fd < 0 {
        eprintln!(
            "SKIP: no userfaultfd here: {}",
            std::io::Error::last_os_error()
        );
        return None;
    }
    // SAFETY: a descriptor just created, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut api = [0xaau64, 0, 0];
    let mut reg = [at as u64, PAGE, 1, 0];
    // SAFETY: the ioctls' argument structs (uffdio_api, uffdio_register),
    // ours for the call.
    let ok = unsafe {
        libc::ioctl(fd.as_raw_fd(), UFFDIO_API, api.as_mut_ptr()) == 0
            && libc::ioctl(fd.as_raw_fd(), UFFDIO_REGISTER, reg.as_mut_ptr()) == 0
    };
    if !ok {
        eprintln!(
            "SKIP: userfaultfd refused: {}",
            std::io::Error::last_os_error()
        );
        return None;
    }
    Some(fd)
}

/// A snapshot file cut mid-page while the restore copies it, after the
/// copy passed the cut: the bytes copied past the cut (the cut page's
/// tail reads zeros) are reported, not counted restored.
#[test]
fn a_snapshot_cut_mid_page_during_the_restore_reports_the_bytes_past_the_cut() {
    use std::os::fd::AsRawFd;
    const UFFDIO_ZEROPAGE: libc::c_ulong = 0xc020_aa04;
    const LEN: u64 = 1 << 20;
    let r = [(GuestAddress(0), LEN as usize)];
    let src = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&r).unwrap();
    fill(&src, 8);
    let path = temp_path("cut-during-restore");
    snapshot_to_file(&src, &path).expect("snapshot");
    let file = std::fs::File::open(&path).unwrap();
    let fresh = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&r).unwrap();
    // The restore stops at guest page 0x11 until the file is cut 100 bytes
    // into guest page 0x10 (already copied; its data start one page in).
    let (cut_page, stop) = (0x10 * PAGE, 0x11 * PAGE);
    let Some(uffd) = uffd_page(host(&fresh, stop)) else {
        let _ = std::fs::remove_file(&path);
        return;
    };
    let at = host(&fresh, stop) as u64;
    let p2 = path.clone();
    let cutter = std::thread::spawn(move || {
        let mut msg = [0u8; 32];
        // SAFETY: reads one uffd_msg into our buffer.
        let n = unsafe { libc::read(uffd.as_raw_fd(), msg.as_mut_ptr().cast(), 32) };
        assert_eq!(n, 32, "{}", std::io::Error::last_os_error());
        let f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
        f.set_len(PAGE + cut_page + 100).unwrap();
        let mut zero = [at, PAGE, 0, 0];
        // SAFETY: uffdio_zeropage for the registered page, ours for the call.
        let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_ZEROPAGE, zero.as_mut_ptr()) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    });
    let rep = restore_from_file(&fresh, &file).expect("restore");
    cutter.join().unwrap();
    let lost = cut_page + 100;
    assert_eq!(
        rep.bad,
        vec![BadRange {
            addr: GuestAddress(lost),
            len: LEN - lost,
            kind: FaultKind::Vanished
        }]
    );
    assert_eq!(rep.restored, lost);
    assert!(read(&fresh, 0, lost) == read(&src, 0, lost));
    let _ = std::fs::remove_file(&path);
}

/// Guest RAM that faults while it is restored (a memory file truncated
/// under the VMM) stops the restore with the guest address it reached,
/// instead of being reported as a bad snapshot page.
#[test]
fn guest_ram_that_faults_while_restored_stops_the_restore_at_its_address() {
    use std::os::fd::FromRawFd;
    let len = 1usize << 20;
    let src = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&[(GuestAddress(0), len)]).unwrap();
    fill(&src, 5);
    let mut image = Vec::new();
    snapshot(&src, &mut image).expect("snapshot");
    // SAFETY: a plain syscall; the descriptor becomes the File's.
    let file = unsafe {
        let fd = libc::memfd_create(c"guest-ram".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        std::fs::File::from_raw_fd(fd)
    };
    file.set_len(len as u64).unwrap();
    let region = MmapRegion::<AtomicBitmap>::build(
        Some(FileOffset::new(file.try_clone().unwrap(), 0)),
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED,
    )
    .unwrap();
    let mem =
        GuestMemoryMmap::from_regions(vec![GuestRegionMmap::new(region, GuestAddress(0)).unwrap()])
            .unwrap();
    // The second half of guest RAM vanishes under the VMM.
    let half = len / 2;
    file.set_len(half as u64).unwrap();
    let e = restore_from_bytes(&mem, &image).unwrap_err();
    assert!(
        matches!(e, Error::GuestMemoryFault { addr, .. } if addr == GuestAddress(half as u64)),
        "{e}"
    );
    assert!(
        read(&mem, 0, half as u64) == read(&src, 0, half as u64),
        "the first half is restored"
    );
}

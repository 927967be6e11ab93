//! Lazy restore against the real vm-memory crate, with the guest running:
//! vCPU-like threads reading and writing during the fill, MADV_DONTNEED
//! during the fill, a device thread read(2)ing into guest RAM, a snapshot
//! truncated mid-fill, cancel then wait, a fork during the fill (also
//! while many threads wait on faults).
//!
//! Each test runs in a child process with a deadline (the shared harness's
//! `in_child`), so a hang is a failure. Where no userfaultfd that catches
//! kernel accesses can be had (no /dev/userfaultfd access, no privilege),
//! the tests say so and skip.
#![cfg(target_arch = "x86_64")]

#[path = "../../foliokit/tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{in_child, in_forked_child, missing, pattern, skip, temp_path, Need};
use foliokit::lazy::{
    fill_lazily, BadOutcome, LazyError, LazyFill, LazyOptions, LazyRefusal, Segment, Source,
};
use foliokit_vm_memory::{
    restore_lazy, restore_lazy_from_path, snapshot_to_file, Error, FaultKind, LazyRestore,
    LazyRestoreOptions,
};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

const PAGE: u64 = 4096;
const A_LEN: u64 = 16 << 20;
const B: u64 = 1 << 32;
const B_LEN: u64 = 8 << 20;
const LIMIT: Duration = Duration::from_secs(60);

type Ram = GuestMemoryMmap<AtomicBitmap>;

fn ranges() -> [(GuestAddress, usize); 2] {
    [
        (GuestAddress(0), A_LEN as usize),
        (GuestAddress(B), B_LEN as usize),
    ]
}

/// Fresh guest RAM, THP-eligible (what a VMM asks for its guest RAM).
fn vm() -> Ram {
    let m = Ram::from_ranges(&ranges()).expect("guest memory");
    for r in m.iter() {
        let h = m.get_host_address(r.start_addr()).unwrap();
        // SAFETY: advice on guest RAM we own.
        unsafe { libc::madvise(h.cast(), r.len() as usize, libc::MADV_HUGEPAGE) };
    }
    m
}

/// The guest's bytes before the snapshot: a pattern per region.
fn expected(addr: u64) -> Vec<u8> {
    let (base, len) = if addr >= B { (B, B_LEN) } else { (0, A_LEN) };
    pattern(len as usize, 77 ^ base)
}

/// A snapshot of a patterned guest, as a file; returns its path and the
/// expected bytes of each region.
fn snapshot_file(what: &str) -> (std::path::PathBuf, Vec<u8>, Vec<u8>) {
    let src = vm();
    let (a, b) = (expected(0), expected(B));
    src.write_slice(&a, GuestAddress(0)).unwrap();
    src.write_slice(&b, GuestAddress(B)).unwrap();
    let path = temp_path(what);
    let r = snapshot_to_file(&src, &path).expect("snapshot");
    assert!(r.bad.is_empty());
    (path, a, b)
}

/// Starts a lazy restore, or says why it cannot run here and returns None.
fn start<'m>(
    mem: &'m Ram,
    path: &std::path::Path,
    opts: &LazyRestoreOptions,
) -> Option<LazyRestore<'m>> {
    match restore_lazy_from_path(mem, path, opts) {
        Ok(h) => Some(h),
        Err(Error::Lazy(LazyError::Refused(why))) => {
            missing(Need::Uffd, &format!("lazy restore unavailable here: {why}"));
            None
        }
        Err(e) => panic!("restore_lazy: {e}"),
    }
}

/// Bytes of `[addr, addr + len)` (host) mapped by huge pages, from smaps.
fn thp_bytes(addr: usize, len: usize) -> u64 {
    let huge = foliokit::internals::anon_huge_bytes(None, addr, addr + len);
    huge.expect("/proc/self/smaps") as u64
}

/// A patterned guest's snapshot (its file, and each region's expected
/// bytes), being restored lazily into fresh guest RAM with `opts`.
struct Restoring {
    path: std::path::PathBuf,
    a: Vec<u8>,
    b: Vec<u8>,
}

impl Restoring {
    /// Cuts the snapshot file `keep` bytes into region B's data: the rest
    /// of B is gone (A lies before B in the file).
    fn cut_b(&self, keep: u64) {
        let size = std::fs::metadata(&self.path).unwrap().len();
        // B's bytes are last, before a 16-byte trailer (no bad ranges).
        let b_off = size - 16 - B_LEN;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .unwrap();
        f.set_len(b_off + keep).unwrap();
    }
}

/// Snapshots a patterned guest to a file (named after `what`), starts a
/// lazy restore of it into fresh guest RAM with `opts` (or says why it
/// cannot run here and returns), runs `body` with the RAM and the restore,
/// then removes the file.
fn while_restoring(
    what: &str,
    opts: &LazyRestoreOptions,
    body: impl FnOnce(&Restoring, &Ram, LazyRestore<'_>),
) {
    let (path, a, b) = snapshot_file(what);
    let snap = Restoring { path, a, b };
    let mem = vm();
    if let Some(h) = start(&mem, &snap.path, opts) {
        body(&snap, &mem, h);
    }
    let _ = std::fs::remove_file(&snap.path);
}

fn paused() -> LazyRestoreOptions {
    let mut o = LazyRestoreOptions::default();
    o.fill.start_cancelled = true;
    o
}

fn read(mem: &Ram, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
    v
}

fn host(mem: &Ram, addr: u64) -> *mut u8 {
    mem.get_host_address(GuestAddress(addr)).unwrap()
}

/// `pattern(len, seed)`, and a file holding it (already unlinked) open
/// for reading: a snapshot's bytes for a bare fill.
fn data_file(what: &str, len: usize, seed: u64) -> (Vec<u8>, std::fs::File) {
    let data = pattern(len, seed);
    let path = temp_path(what);
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    (data, file)
}

/// Starts foliokit's lazy fill of `[addr, addr + len)` from the first
/// `len` bytes of `file`, or says why it cannot run here and returns None.
///
/// # Safety
/// As [`fill_lazily`]: the range is ours, untouched until the fill ends.
unsafe fn start_fill(
    addr: usize,
    len: usize,
    file: &std::fs::File,
    o: &LazyOptions,
) -> Option<LazyFill> {
    let seg = Segment {
        addr,
        len,
        offset: 0,
    };
    let src = Source::map_file(file, len).unwrap();
    // SAFETY: forwarded contract.
    match unsafe { fill_lazily(&[seg], src, o) } {
        Ok(h) => Some(h),
        Err(LazyError::Refused(why)) => {
            missing(Need::Uffd, &format!("lazy fill unavailable here: {why}"));
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn vcpus_read_and_write_during_the_fill_and_nothing_is_lost() {
    in_child(
        "vcpus_read_and_write_during_the_fill_and_nothing_is_lost",
        LIMIT,
        || {
            let mut o = LazyRestoreOptions::default();
            // A small budget: many batches, so the vCPUs race the fill.
            o.fill.latency_budget = Duration::from_micros(300);
            // Faults beside batches in flight: the path with the most
            // concurrency (the other tests run the default).
            o.fill.serve_during_batches = true;
            o.first = vec![GuestAddress(B + (4 << 20))];
            while_restoring("vcpus", &o, |snap, mem, h| {
                let Restoring { a, b, .. } = snap;
                const VCPUS: u64 = 3;
                let stop = AtomicBool::new(false);
                let pages = (A_LEN + B_LEN) / PAGE;
                let page_addr = |i: u64| {
                    if i < A_LEN / PAGE {
                        i * PAGE
                    } else {
                        B + (i - A_LEN / PAGE) * PAGE
                    }
                };
                // Each vCPU owns the pages i with i % VCPUS == k: it writes
                // a stamp there (the last one must survive); any page it reads
                // holds the snapshot's byte or some vCPU's stamp.
                let written: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
                    let hs: Vec<_> = (0..VCPUS)
                        .map(|k| {
                            let (mem, stop, a, b) = (&mem, &stop, &a, &b);
                            s.spawn(move || {
                                let mut x = 0x9e37_79b9u64 ^ k;
                                let mut mine = Vec::new();
                                let mut n = 0;
                                while !stop.load(Ordering::Relaxed) || n < 2000 {
                                    x ^= x << 13;
                                    x ^= x >> 7;
                                    x ^= x << 17;
                                    let i = x % pages;
                                    // Past the stamp (the page's first 8 bytes).
                                    let at = page_addr(i) + 8 + (x >> 40) % (PAGE - 16);
                                    let v: u64 = mem.read_obj(GuestAddress(at)).unwrap();
                                    let off = (if at >= B { at - B } else { at }) as usize;
                                    let snap = if at >= B { b } else { a };
                                    let want =
                                        u64::from_le_bytes(snap[off..off + 8].try_into().unwrap());
                                    assert!(
                                        v == want || v >> 56 == 0xAB,
                                        "vCPU {k} read {v:#x} at {at:#x}, snapshot has {want:#x}"
                                    );
                                    if i % VCPUS == k {
                                        let p = page_addr(i);
                                        let stamp = 0xAB << 56 | (n as u64) << 8 | k;
                                        mem.write_obj(stamp, GuestAddress(p)).unwrap();
                                        mine.push((p, stamp));
                                    }
                                    n += 1;
                                }
                                mine
                            })
                        })
                        .collect();
                    let r = h.wait();
                    stop.store(true, Ordering::Relaxed);
                    assert!(r.bad.is_empty(), "{:?}", r.bad);
                    assert!(r.fill.progress.done);
                    let p = r.fill.progress;
                    assert_eq!(
                        p.faulted_pages + p.filled_pages + p.skipped_pages,
                        p.total_pages,
                        "{p:?}"
                    );
                    common::say(&format!(
                        "NOTE: {} faults, {} pages faulted in, {} filled, {} batches, {} whole folios",
                        p.faults, p.faulted_pages, p.filled_pages, r.fill.batches, r.fill.whole_folios
                    ));
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                });
                // Last stamp per page wins; everything else is the snapshot.
                let mut last = std::collections::HashMap::new();
                for w in &written {
                    for &(p, s) in w {
                        last.insert(p, s);
                    }
                }
                for i in 0..pages {
                    let p = page_addr(i);
                    let got = read(mem, p, PAGE as usize);
                    let off = (if p >= B { p - B } else { p }) as usize;
                    let snap = if p >= B { &b } else { &a };
                    let mut want = snap[off..off + PAGE as usize].to_vec();
                    if let Some(s) = last.get(&p) {
                        want[..8].copy_from_slice(&s.to_le_bytes());
                    }
                    assert!(got == want, "page {p:#x} differs after the fill");
                }
            });
        },
    );
}

#[test]
fn dontneed_during_the_fill_is_never_brought_back() {
    in_child(
        "dontneed_during_the_fill_is_never_brought_back",
        LIMIT,
        || {
            while_restoring("dontneed", &paused(), |snap, mem, h| {
                let Restoring { a, .. } = snap;
                // One page touched (filled with its folio), then discarded; a
                // range never touched, discarded before the fill gets there.
                let touched = 3 * PAGE;
                assert_eq!(read(mem, touched, 8), a[touched as usize..][..8]);
                let far = 6 << 20;
                for (at, len) in [(touched, PAGE), (far, 3 << 20)] {
                    // SAFETY: discarding guest RAM we own (a balloon would).
                    let rc = unsafe {
                        libc::madvise(host(mem, at).cast(), len as usize, libc::MADV_DONTNEED)
                    };
                    assert_eq!(rc, 0);
                }
                // A discarded page touched during the fill reads zeros.
                assert!(read(mem, far + PAGE, PAGE as usize).iter().all(|&x| x == 0));
                let r = h.wait();
                assert!(
                    r.fill.progress.skipped_pages >= (3 << 20) / PAGE,
                    "{:?}",
                    r.fill.progress
                );
                assert!(read(mem, touched, PAGE as usize).iter().all(|&x| x == 0));
                assert!(read(mem, far, 3 << 20).iter().all(|&x| x == 0));
                // Its neighbours came from the snapshot.
                assert_eq!(
                    read(mem, touched + PAGE, PAGE as usize),
                    a[(touched + PAGE) as usize..][..PAGE as usize]
                );
                assert_eq!(
                    read(mem, far - PAGE, PAGE as usize),
                    a[(far - PAGE) as usize..][..PAGE as usize]
                );
                assert_eq!(
                    read(mem, far + (3 << 20), PAGE as usize),
                    a[(far + (3 << 20)) as usize..][..PAGE as usize]
                );
            });
        },
    );
}

#[test]
fn a_device_thread_reading_into_guest_ram_waits_for_the_fill() {
    in_child(
        "a_device_thread_reading_into_guest_ram_waits_for_the_fill",
        LIMIT,
        || {
            while_restoring("device", &paused(), |snap, mem, h| {
                let Restoring { a, b, .. } = snap;
                // A "virtio block" read: 3 pages from a file into guest RAM
                // nobody touched yet, in the middle of a folio. The kernel's
                // copy_to_user waits on the userfaultfd instead of failing.
                let data = pattern(3 * PAGE as usize, 5);
                let dpath = temp_path("disk");
                std::fs::File::create(&dpath)
                    .unwrap()
                    .write_all(&data)
                    .unwrap();
                let disk = std::fs::File::open(&dpath).unwrap();
                let at = B + (2 << 20) + 5 * PAGE;
                let dst = host(mem, at) as usize;
                let n = std::thread::spawn(move || {
                    // SAFETY: reading into guest RAM we own, as a device would.
                    unsafe { libc::read(disk.as_raw_fd(), dst as *mut libc::c_void, data.len()) }
                })
                .join()
                .unwrap();
                assert_eq!(n, 3 * PAGE as isize, "read(2) into unfilled guest RAM");
                let r = h.wait();
                assert!(r.bad.is_empty());
                let data = pattern(3 * PAGE as usize, 5);
                assert_eq!(read(mem, at, data.len()), data);
                // Around it: the snapshot.
                let off = (at - B) as usize;
                assert_eq!(read(mem, B, off), b[..off]);
                assert_eq!(
                    read(mem, at + 3 * PAGE, PAGE as usize),
                    b[off + 3 * PAGE as usize..][..PAGE as usize]
                );
                assert_eq!(read(mem, 0, A_LEN as usize), *a);
                let _ = std::fs::remove_file(&dpath);
            });
        },
    );
}

#[test]
fn a_snapshot_truncated_mid_fill_poisons_exactly_the_lost_pages() {
    in_child(
        "a_snapshot_truncated_mid_fill_poisons_exactly_the_lost_pages",
        LIMIT,
        || {
            while_restoring("truncated", &paused(), |snap, mem, h| {
                let Restoring { a, b, .. } = snap;
                // Some of region A is in before the cut.
                let early = 2 * PAGE;
                assert_eq!(read(mem, early, 8), a[early as usize..][..8]);
                // Cut the file 1 MiB + 3 pages into region B's bytes: the
                // rest of B is gone (A lies before B in the file).
                let keep = (1 << 20) + 3 * PAGE;
                snap.cut_b(keep);
                let r = h.wait();
                assert_eq!(r.fill.bad_outcome, BadOutcome::Poisoned);
                let lost: u64 = r.bad.iter().map(|x| x.len).sum();
                assert_eq!(
                    r.bad.first().map(|x| x.addr),
                    Some(GuestAddress(B + keep)),
                    "{:?}",
                    r.bad
                );
                assert_eq!(lost, B_LEN - keep, "{:?}", r.bad);
                assert!(r.bad.iter().all(|x| x.kind == FaultKind::Vanished));
                // Region A and B's first part restored.
                assert_eq!(read(mem, 0, A_LEN as usize), *a);
                assert_eq!(read(mem, B, keep as usize), b[..keep as usize]);
                // A lost page holds a poison marker: a read gets SIGBUS there
                // (BUS_MCEERR_AR as for real poison where the kernel has
                // CONFIG_MEMORY_FAILURE; without it, x86 reports BUS_ADRERR).
                let mut buf = vec![0u8; PAGE as usize];
                // SAFETY: guest RAM we own, read with the mc copy.
                let e = unsafe {
                    foliokit::copy_mc_raw(
                        buf.as_mut_ptr(),
                        host(mem, B + keep + 7 * PAGE),
                        buf.len(),
                        foliokit::CopyStrategy::Auto,
                    )
                };
                match e {
                    Err(foliokit::McError::Fault(f)) => {
                        let memory_failure =
                            std::path::Path::new("/proc/sys/vm/memory_failure_early_kill").exists();
                        let want = if memory_failure {
                            FaultKind::Poison
                        } else {
                            FaultKind::Vanished
                        };
                        assert_eq!(f.kind, want, "memory failure handling: {memory_failure}");
                    }
                    other => panic!("a lost page read as {other:?}"),
                }
            });
        },
    );
}

/// Reads one page of guest RAM with the mc copy: its bytes, or the fault.
fn read_mc(mem: &Ram, addr: u64) -> Result<Vec<u8>, foliokit::McError> {
    let mut buf = vec![0u8; PAGE as usize];
    // SAFETY: guest RAM we own, read with the mc copy (a poisoned page
    // is reported, not fatal).
    unsafe {
        foliokit::copy_mc_raw(
            buf.as_mut_ptr(),
            host(mem, addr),
            buf.len(),
            foliokit::CopyStrategy::Auto,
        )
    }
    .map(|_| buf)
}

#[test]
fn a_lost_page_the_guest_discards_reads_zeros_not_sigbus() {
    in_child(
        "a_lost_page_the_guest_discards_reads_zeros_not_sigbus",
        LIMIT,
        || {
            // Paused: only faults are served, so every step below is the
            // fault path's, and a touch that is never answered hangs until
            // the deadline.
            while_restoring("discard-lost", &paused(), |snap, mem, h| {
                let Restoring { b, .. } = snap;
                let keep = 4 << 20;
                snap.cut_b(keep);
                let lost = B + keep + 5 * PAGE;
                // The first touch finds the snapshot page gone: poisoned.
                assert!(
                    matches!(read_mc(mem, lost), Err(foliokit::McError::Fault(_))),
                    "a lost snapshot page must not read as bytes"
                );
                // The guest discards it (a balloon): from now on it expects
                // zeros there, during the fill and after it.
                // SAFETY: discarding guest RAM we own.
                let rc = unsafe {
                    libc::madvise(host(mem, lost).cast(), PAGE as usize, libc::MADV_DONTNEED)
                };
                assert_eq!(rc, 0);
                assert_eq!(read_mc(mem, lost).ok(), Some(vec![0; PAGE as usize]));
                assert_eq!(read(mem, B, 8), b[..8]);
                let r = h.wait();
                assert_eq!(read(mem, lost, PAGE as usize), vec![0; PAGE as usize]);
                assert!(
                    r.bad
                        .iter()
                        .any(|x| x.addr.0 <= lost && lost < x.addr.0 + x.len),
                    "the lost page stays in the report: {:?}",
                    r.bad
                );
            });
        },
    );
}

#[test]
fn cancel_keeps_what_was_filled_and_wait_fills_the_rest() {
    in_child(
        "cancel_keeps_what_was_filled_and_wait_fills_the_rest",
        LIMIT,
        || {
            let mut o = LazyRestoreOptions::default();
            o.fill.latency_budget = Duration::from_micros(1);
            o.fill.channels = 1;
            while_restoring("cancel", &o, |snap, mem, h| {
                let Restoring { a, b, .. } = snap;
                // Cancel at once: how far the fill got by then depends on
                // scheduling (on an idle machine all 24 MiB can be in first).
                h.cancel();
                // The batch in flight at the cancel still lands (how long it
                // takes depends on the machine's load: seen over 20 ms while
                // builds ran beside the test), so wait for the count to
                // stand still; a fill that went on would never stand still
                // for long with a 1 µs budget, which cuts batches of one
                // folio or two.
                let deadline =
                    std::time::Instant::now() + Duration::from_secs(5) * common::slowdown();
                let mut p1 = h.progress();
                loop {
                    std::thread::sleep(Duration::from_millis(100));
                    let now = h.progress();
                    if now.filled_pages == p1.filled_pages {
                        break;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the fill went on after cancel: {} pages filled and counting",
                        now.filled_pages
                    );
                    p1 = now;
                }
                std::thread::sleep(Duration::from_millis(200));
                let p2 = h.progress();
                assert_eq!(
                    p1.filled_pages, p2.filled_pages,
                    "the fill went on after cancel"
                );
                if p2.done {
                    common::say(
                        "NOTE: the fill ended before the cancel was seen; only wait checked",
                    );
                }
                // Faults are still served while cancelled. The fill goes in
                // address order, so the last folio is the last to come: out
                // still unless a loaded machine let the fill reach it before
                // the cancel was seen.
                // (Address order is host address order: the region mapped
                // higher comes last.)
                let out = !p2.done && p2.filled_pages + p2.faulted_pages < p2.total_pages;
                if host(mem, B) > host(mem, 0) {
                    assert_eq!(
                        read(mem, B + B_LEN - PAGE, PAGE as usize),
                        b[(B_LEN - PAGE) as usize..]
                    );
                } else {
                    assert_eq!(
                        read(mem, A_LEN - PAGE, PAGE as usize),
                        a[(A_LEN - PAGE) as usize..]
                    );
                }
                if out {
                    // The counts follow the install (which wakes us) closely.
                    let t = std::time::Instant::now();
                    while h.progress().faulted_pages == p2.faulted_pages {
                        assert!(
                            t.elapsed() < Duration::from_secs(5),
                            "the fault was not counted: {p2:?} then {:?}",
                            h.progress()
                        );
                        std::thread::yield_now();
                    }
                } else {
                    common::say(
                        "NOTE: the fill was done before the cancel; fault while cancelled not checked",
                    );
                }
                assert_eq!(h.progress().filled_pages, p2.filled_pages);
                let r = h.wait();
                assert!(r.fill.progress.done);
                assert_eq!(read(mem, 0, A_LEN as usize), *a);
                // Huge pages stayed huge: every whole 2 MiB folio of guest RAM
                // went in as one (UFFDIO_MOVE of a staged THP).
                let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                    .unwrap_or_default();
                let ha = host(mem, 0) as usize;
                if thp.contains("[never]") {
                    missing(Need::Thp, "THP disabled: huge pages not checked");
                } else {
                    let whole =
                        ((ha + A_LEN as usize) / (2 << 20)).saturating_sub(ha.div_ceil(2 << 20));
                    // (smaps counts whole mappings; B's may be merged with A's.)
                    assert!(thp_bytes(ha, A_LEN as usize) >= (whole as u64) << 21);
                    assert!(r.fill.whole_folios >= whole as u64);
                }
                assert_eq!(read(mem, B, B_LEN as usize), *b);
            });
        },
    );
}

#[test]
fn a_child_forked_during_the_fill_sees_the_snapshot() {
    in_child(
        "a_child_forked_during_the_fill_sees_the_snapshot",
        LIMIT,
        || {
            while_restoring("fork", &paused(), |snap, mem, h| {
                let Restoring { a, b, .. } = snap;
                // Part in, part discarded, most still to come.
                assert_eq!(read(mem, PAGE, 8), a[PAGE as usize..][..8]);
                let gone = 8 << 20;
                // SAFETY: discarding guest RAM we own.
                let rc = unsafe {
                    libc::madvise(host(mem, gone).cast(), PAGE as usize, libc::MADV_DONTNEED)
                };
                assert_eq!(rc, 0);
                // The child only reads memory and exits.
                in_forked_child(|| {
                    read(mem, 0, gone as usize) == a[..gone as usize]
                        && read(mem, gone, PAGE as usize).iter().all(|&x| x == 0)
                        && read(mem, gone + PAGE, (A_LEN - gone - PAGE) as usize)
                            == a[(gone + PAGE) as usize..]
                        && read(mem, B, B_LEN as usize) == *b
                });
                let r = h.wait();
                assert!(r.fill.forks >= 1);
                assert_eq!(read(mem, B, B_LEN as usize), *b);
            });
        },
    );
}

#[test]
fn forks_while_many_threads_wait_on_faults_never_hang() {
    // More threads than the fill thread has room for at first while it is
    // parked for a fork: the room grows, nothing is lost, nobody hangs.
    const THREADS: u64 = 96;
    in_child(
        "forks_while_many_threads_wait_on_faults_never_hang",
        LIMIT,
        || {
            while_restoring("many-faults-fork", &paused(), |snap, mem, h| {
                let a = &snap.a;
                std::thread::scope(|s| {
                    for t in 0..THREADS {
                        s.spawn(move || {
                            let mut p = t;
                            while p < A_LEN / PAGE {
                                let at = p * PAGE + (p % 7) * 8;
                                assert_eq!(
                                    read(mem, at, 8),
                                    a[at as usize..][..8],
                                    "thread {t}, page {p}"
                                );
                                p += THREADS;
                            }
                        });
                    }
                    for _ in 0..20 {
                        in_forked_child(|| {
                            let at = A_LEN - PAGE;
                            read(mem, at, PAGE as usize) == a[at as usize..]
                        });
                    }
                });
                let r = h.wait();
                assert!(r.fill.forks >= 20);
                assert_eq!(read(mem, 0, A_LEN as usize), *a);
                assert_eq!(read(mem, B, B_LEN as usize), snap.b);
            });
        },
    );
}

#[test]
fn guest_ram_already_touched_is_refused() {
    let (path, _, _) = snapshot_file("touched");
    let mem = vm();
    mem.write_obj(1u64, GuestAddress(B)).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    match restore_lazy(&mem, &f, &LazyRestoreOptions::default()) {
        Err(Error::NotEmpty { addr, .. }) => assert_eq!(addr, GuestAddress(B)),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a touched guest was accepted"),
    }
    let _ = std::fs::remove_file(&path);
}

/// What the kernel does with each install: `UFFDIO_COPY` of a 2 MiB-aligned
/// range into THP-eligible anonymous memory installs 512 base pages (the
/// fill's copy path, forced here with a 4 KiB folio), while a staged THP
/// moved in with `UFFDIO_MOVE` stays one huge page (the default).
#[test]
fn uffdio_copy_installs_base_pages_and_the_staged_move_keeps_thp() {
    in_child(
        "uffdio_copy_installs_base_pages_and_the_staged_move_keeps_thp",
        LIMIT,
        || {
            let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                .unwrap_or_default();
            if thp.contains("[never]") {
                missing(Need::Thp, "THP disabled");
                return;
            }
            let len = 4usize << 20;
            let (data, file) = data_file("thp", len, 3);
            for (folio, want_huge) in [(4096usize, false), (2 << 20, true)] {
                let mut r = foliokit::mem::Region::unpopulated(len, 2 << 20).unwrap();
                let addr = r.as_mut_ptr() as usize;
                let o = LazyOptions {
                    folio_size: folio,
                    ..LazyOptions::default()
                };
                // SAFETY: a fresh region of ours, untouched until the
                // fill ends.
                let Some(h) = (unsafe { start_fill(addr, len, &file, &o) }) else {
                    return;
                };
                let rep = h.wait();
                assert!(r.as_slice() == &data[..], "folio {folio}: wrong bytes");
                let huge = thp_bytes(addr, len);
                if want_huge {
                    assert_eq!(huge, len as u64, "moved-in THPs were split");
                    assert_eq!(rep.whole_folios, 2);
                } else {
                    assert_eq!(huge, 0, "UFFDIO_COPY gave huge pages after all");
                    assert_eq!(rep.whole_folios, 0);
                }
            }
        },
    );
}

#[test]
fn shared_memory_is_refused_unless_the_caller_opts_in() {
    in_child(
        "shared_memory_is_refused_unless_the_caller_opts_in",
        LIMIT,
        || {
            let len = 2usize << 20;
            let (data, file) = data_file("shared", len, 9);
            // A memfd mapped shared: guest RAM a vhost-user backend shares.
            let (ram, _memfd) = shared_memfd(len);
            let seg = Segment {
                addr: ram as usize,
                len,
                offset: 0,
            };
            let src = || Source::map_file(&file, len).unwrap();
            // SAFETY: our own untouched mapping.
            match unsafe { fill_lazily(&[seg], src(), &LazyOptions::default()) } {
                Err(LazyError::Refused(LazyRefusal::NotPrivate { addr, len: l })) => {
                    assert_eq!((addr, l), (seg.addr, len))
                }
                Err(LazyError::Refused(why)) => {
                    missing(Need::Uffd, &format!("lazy fill unavailable here: {why}"));
                    return;
                }
                other => panic!("shared memory was not refused: {:?}", other.err()),
            }
            let o = LazyOptions {
                allow_shared_memory: true,
                ..LazyOptions::default()
            };
            // SAFETY: as above; it is mapped once and never discarded.
            let h = unsafe { fill_lazily(&[seg], src(), &o) }.expect("opted in");
            let rep = h.wait();
            // SAFETY: the fill has ended; the mapping is ours.
            let got = unsafe { std::slice::from_raw_parts(ram, len) };
            assert!(got == &data[..], "wrong bytes in shared memory");
            assert!(rep.bad.is_empty());
            // SAFETY: unmapping our own mapping, no longer used.
            unsafe { libc::munmap(ram.cast(), len) };
        },
    );
}

/// A shared memfd of `len` bytes mapped once, ours alone; returns the
/// mapping and the descriptor (kept open, for `fallocate`).
fn shared_memfd(len: usize) -> (*mut u8, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    // SAFETY: a fresh memfd, sized and mapped here; the descriptor is
    // handed to an OwnedFd at once.
    unsafe {
        let fd = libc::memfd_create(c"guest".as_ptr(), 0);
        assert!(fd >= 0);
        let fd = std::os::fd::OwnedFd::from_raw_fd(fd);
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        (p as *mut u8, fd)
    }
}

#[test]
fn a_filled_page_emptied_without_an_event_reads_zeros_and_never_spins() {
    in_child(
        "a_filled_page_emptied_without_an_event_reads_zeros_and_never_spins",
        LIMIT,
        || {
            let len = 2usize << 20;
            let (data, file) = data_file("hole", len, 12);
            let (ram, memfd) = shared_memfd(len);
            let o = LazyOptions {
                allow_shared_memory: true,
                start_cancelled: true,
                ..LazyOptions::default()
            };
            // SAFETY: our own untouched mapping, mapped once; the hole
            // punched below is the point of the test.
            let Some(h) = (unsafe { start_fill(ram as usize, len, &file, &o) }) else {
                return;
            };
            assert_eq!(read_host(ram, PAGE as usize), data[..PAGE as usize]);
            // A hole punched through the descriptor (as a vhost-user
            // backend or the VMM's balloon might) zaps the page with no
            // userfaultfd event: the fill still takes its folio for done.
            // SAFETY: a hole in our own memfd.
            let rc = unsafe {
                libc::fallocate(
                    memfd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    0,
                    PAGE as libc::off_t,
                )
            };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
            // The kernel gives a hole zeros; the fill must too, not wake the
            // thread to fault again and again until the fill ends (the fill
            // is paused here, so that was for ever).
            let (tx, rx) = std::sync::mpsc::channel();
            let at = ram as usize;
            std::thread::spawn(move || {
                let _ = tx.send(read_host(at as *const u8, PAGE as usize));
            });
            let got = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("a touch of the emptied page did not return");
            assert_eq!(got, vec![0; PAGE as usize]);
            let r = h.wait();
            assert!(r.bad.is_empty(), "{:?}", r.bad);
            assert_eq!(read_host(ram, PAGE as usize), vec![0; PAGE as usize]);
            assert_eq!(
                read_host(ram.wrapping_add(PAGE as usize), len - PAGE as usize),
                data[PAGE as usize..]
            );
            // SAFETY: unmapping our own mapping, no longer used.
            unsafe { libc::munmap(ram.cast(), len) };
        },
    );
}

#[test]
fn a_folio_split_across_mappings_keeps_its_snapshot_bytes() {
    in_child(
        "a_folio_split_across_mappings_keeps_its_snapshot_bytes",
        LIMIT,
        || {
            let len = 8usize << 20;
            let folio = 2usize << 20;
            let (data, file) = data_file("split", len, 21);
            let mut r = foliokit::mem::Region::unpopulated(len, folio).unwrap();
            let base = r.as_mut_ptr();
            // Before the fill: the first folio's range is two mappings (a
            // VMM leaving part of guest RAM out of core dumps).
            // SAFETY: advice on our own untouched mapping.
            let rc = unsafe { libc::madvise(base.cast(), folio / 2, libc::MADV_DONTDUMP) };
            assert_eq!(rc, 0);
            let o = LazyOptions {
                start_cancelled: true,
                ..LazyOptions::default()
            };
            // SAFETY: a fresh region of ours, untouched until the fill ends
            // but by the touches, mprotect and mlock below.
            let Some(h) = (unsafe { start_fill(base as usize, len, &file, &o) }) else {
                return;
            };
            // During it: one page of the second folio write-protected, and
            // pages of the third locked (which faults them in).
            // SAFETY: our own mapping, inside it.
            unsafe {
                assert_eq!(
                    libc::mprotect(
                        base.add(folio + folio / 2).cast(),
                        PAGE as usize,
                        libc::PROT_READ
                    ),
                    0
                );
                assert_eq!(
                    libc::mlock(base.add(2 * folio + folio / 2).cast(), 16 * PAGE as usize),
                    0
                );
            }
            // A run over two mappings is refused whole by the kernel, which
            // the fill took for "unmapped": these read zeros.
            for at in [
                0,
                folio / 2,
                folio + PAGE as usize,
                2 * folio + PAGE as usize,
            ] {
                let got = read_host(base.wrapping_add(at), PAGE as usize);
                assert!(got == data[at..at + PAGE as usize], "touch at {at:#x}");
            }
            let rep = h.wait();
            assert_eq!(rep.progress.skipped_pages, 0, "{:?}", rep.notes);
            assert!(r.as_slice() == &data[..], "wrong bytes after the fill");
        },
    );
}

#[test]
fn a_skip_range_past_the_address_space_is_clipped_to_the_segments() {
    in_child(
        "a_skip_range_past_the_address_space_is_clipped_to_the_segments",
        LIMIT,
        || {
            let len = 4usize << 20;
            let (data, file) = data_file("skipend", len, 44);
            let mut r = foliokit::mem::Region::unpopulated(len, 2 << 20).unwrap();
            let base = r.as_mut_ptr() as usize;
            let page = PAGE as usize;
            // Walked page by page, this one wrapped around and never ended.
            let o = LazyOptions {
                skip: vec![(base + len - page, usize::MAX), (0, base + page)],
                ..LazyOptions::default()
            };
            // SAFETY: a fresh region of ours, untouched until the fill ends.
            let Some(h) = (unsafe { start_fill(base, len, &file, &o) }) else {
                return;
            };
            let rep = h.wait();
            assert_eq!(rep.progress.skipped_pages, 2);
            let mut want = data;
            want[..page].fill(0);
            want[len - page..].fill(0);
            assert!(r.as_slice() == &want[..], "wrong bytes after the fill");
        },
    );
}

/// Reads `len` bytes at a host address (memory the test owns).
fn read_host(at: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: `at` is mapped for `len` bytes (the caller's mapping);
    // a volatile copy, since a fill thread may install pages meanwhile.
    (0..len)
        .map(|i| unsafe { std::ptr::read_volatile(at.add(i)) })
        .collect()
}

#[test]
fn mremap_dontunmap_during_the_fill_never_hangs_a_thread() {
    in_child(
        "mremap_dontunmap_during_the_fill_never_hangs_a_thread",
        LIMIT,
        || {
            while_restoring("mremap", &paused(), |snap, mem, h| {
                let Restoring { a, .. } = snap;
                let (off, len) = (4usize << 20, 2usize << 20);
                let old = host(mem, off as u64);
                // Move 2 MiB of guest RAM elsewhere and keep the old range
                // mapped (and empty): what a VMM taking a range out does.
                // SAFETY: moving guest RAM we own; nothing else uses it.
                let new = unsafe {
                    libc::mremap(
                        old.cast(),
                        len,
                        len,
                        libc::MREMAP_MAYMOVE | libc::MREMAP_DONTUNMAP,
                    )
                };
                let moved = (new != libc::MAP_FAILED).then_some(new as *const u8);
                match moved {
                    // The moved pages arrive where they went, with their bytes;
                    // the old range reads zeros, as the kernel gives there.
                    Some(new) => {
                        assert_eq!(read_host(new, len), a[off..off + len]);
                        assert_eq!(
                            read_host(old, 2 * PAGE as usize),
                            vec![0; 2 * PAGE as usize]
                        );
                    }
                    // Linux 6.18 refuses MREMAP_DONTUNMAP on a range registered
                    // with REMAP events; then nothing moved.
                    None => skip(&format!(
                        "mremap(MREMAP_DONTUNMAP) refused here ({}): that half is not tried",
                        std::io::Error::last_os_error()
                    )),
                }
                let r = h.wait();
                assert!(r.bad.is_empty(), "{:?}", r.bad);
                assert_eq!(read_host(moved.unwrap_or(old), len), a[off..off + len]);
            });
        },
    );
}

#[test]
fn a_range_grown_in_place_during_the_fill_reads_zeros_in_its_tail() {
    in_child(
        "a_range_grown_in_place_during_the_fill_reads_zeros_in_its_tail",
        LIMIT,
        || {
            let len = 2usize << 20;
            let (data, file) = data_file("grow", len, 5);
            // Room for twice the range, of which the range keeps the first
            // half; the second is held (PROT_NONE, so the fill's own
            // mappings cannot land there) until the range grows into it.
            // SAFETY: a fresh private mapping (no address given), ours
            // alone; its second half is inside it.
            let base = unsafe {
                let p = common::map_anonymous(
                    None,
                    2 * len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE,
                );
                libc::mprotect(p.add(len).cast(), len, libc::PROT_NONE);
                p
            };
            let o = LazyOptions {
                start_cancelled: true,
                ..LazyOptions::default()
            };
            // SAFETY: our own untouched mapping.
            let Some(h) = (unsafe { start_fill(base as usize, len, &file, &o) }) else {
                return;
            };
            // SAFETY: giving back the held half, then growing our own
            // mapping into it in place (no MAYMOVE).
            let g = unsafe {
                libc::munmap(base.add(len).cast(), len);
                libc::mremap(base.cast(), len, 2 * len, 0)
            };
            if g == libc::MAP_FAILED {
                skip("the room after the range was taken: nothing to test");
                drop(h.wait());
                return;
            }
            // The tail is registered with the fill's userfaultfd but holds
            // none of the snapshot: a touch gets zeros, as new memory does
            // (it used to be woken without a page, and fault again forever).
            assert_eq!(
                read_host(base.wrapping_add(len), PAGE as usize),
                vec![0; PAGE as usize]
            );
            assert_eq!(read_host(base, len), data);
            let r = h.wait();
            assert!(r.bad.is_empty(), "{:?}", r.bad);
            assert_eq!(read_host(base.wrapping_add(2 * len - 1), 1), vec![0]);
            // SAFETY: unmapping our own mapping, no longer used.
            unsafe { libc::munmap(base.cast(), 2 * len) };
        },
    );
}

/// A fill of hugetlb memory: the kernel's `UFFDIO_COPY` of whole huge
/// pages, on the fill thread and helpers at once.
mod hugetlb {
    use super::*;
    use common::Hugetlb;

    const HUGE: usize = 2 << 20;

    fn word(at: usize) -> u64 {
        // SAFETY: callers pass an 8-aligned address inside the hugetlb
        // mapping they hold; each word is touched by one thread only.
        unsafe { std::ptr::read_volatile(at as *const u64) }
    }

    fn data_word(data: &[u8], off: usize) -> u64 {
        u64::from_ne_bytes(data[off..off + 8].try_into().unwrap())
    }

    #[test]
    fn threads_writing_during_the_fill_keep_every_write_and_read_the_snapshot() {
        in_child(
            "hugetlb::threads_writing_during_the_fill_keep_every_write_and_read_the_snapshot",
            LIMIT,
            || {
                let len = 64 << 20;
                let Some(m) = Hugetlb::new(len) else { return };
                let (data, file) = data_file("hugetlb-writes", len, 31);
                // SAFETY: fresh hugetlb memory of ours; only the threads below
                // touch it until the fill ends.
                let Some(h) = (unsafe { start_fill(m.addr, len, &file, &LazyOptions::default()) })
                else {
                    return;
                };
                let page = PAGE as usize;
                // Each thread owns one word of every page (its own 8 bytes), so
                // what it reads there is the snapshot's or its own last write.
                let written: Vec<Vec<(usize, u64)>> = std::thread::scope(|s| {
                    let ts: Vec<_> = (0..4u64)
                        .map(|t| {
                            let data = &data;
                            let base = m.addr;
                            s.spawn(move || {
                                let mut mine = std::collections::HashMap::new();
                                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                                for i in 0..3000u64 {
                                    x ^= x << 13;
                                    x ^= x >> 7;
                                    x ^= x << 17;
                                    let off = (x as usize % (len / page)) * page + t as usize * 8;
                                    let want = mine
                                        .get(&off)
                                        .copied()
                                        .unwrap_or_else(|| data_word(data, off));
                                    assert_eq!(word(base + off), want, "thread {t} at {off:#x}");
                                    let v = (t << 56) | i;
                                    // SAFETY: as `word`.
                                    unsafe {
                                        std::ptr::write_volatile((base + off) as *mut u64, v)
                                    };
                                    mine.insert(off, v);
                                }
                                mine.into_iter().collect()
                            })
                        })
                        .collect();
                    ts.into_iter().map(|t| t.join().unwrap()).collect()
                });
                let rep = h.wait();
                assert!(rep.bad.is_empty(), "{:?}", rep.bad);
                let p = rep.progress;
                assert_eq!(
                    p.faulted_pages + p.filled_pages,
                    (len / page) as u64,
                    "every page installed once: {p:?}"
                );
                let mut want = data;
                for (off, v) in written.into_iter().flatten() {
                    want[off..off + 8].copy_from_slice(&v.to_ne_bytes());
                }
                // SAFETY: the fill ended; nobody else touches the mapping.
                let got = unsafe { std::slice::from_raw_parts(m.addr as *const u8, len) };
                let first = got.iter().zip(&want).position(|(a, b)| a != b);
                assert_eq!(first, None, "first wrong byte (of {len:#x})");
            },
        );
    }

    #[test]
    fn a_snapshot_cut_short_poisons_exactly_its_lost_huge_pages() {
        in_child(
            "hugetlb::a_snapshot_cut_short_poisons_exactly_its_lost_huge_pages",
            LIMIT,
            || {
                let len = 16 << 20;
                let Some(m) = Hugetlb::new(len) else { return };
                let data = pattern(len, 32);
                let path = temp_path("hugetlb-cut");
                std::fs::write(&path, &data).unwrap();
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap();
                let _ = std::fs::remove_file(&path);
                let o = LazyOptions {
                    start_cancelled: true,
                    ..LazyOptions::default()
                };
                // SAFETY: fresh hugetlb memory of ours, untouched until the
                // fill ends.
                let Some(h) = (unsafe { start_fill(m.addr, len, &file, &o) }) else {
                    return;
                };
                // The file now ends a page into the third huge page from the
                // end: that one and the two after it are lost whole (a huge
                // page is installed whole or not at all).
                let keep = len - 3 * HUGE + PAGE as usize;
                file.set_len(keep as u64).unwrap();
                let rep = h.wait();
                let lost: usize = rep.bad.iter().map(|b| b.len).sum();
                assert_eq!(lost, 3 * HUGE, "{:?}", rep.bad);
                assert_eq!(rep.bad[0].addr, m.addr + len - 3 * HUGE, "{:?}", rep.bad);
                // SAFETY: the fill ended; only the readable part is read.
                let got =
                    unsafe { std::slice::from_raw_parts(m.addr as *const u8, len - 3 * HUGE) };
                assert!(
                    got == &data[..len - 3 * HUGE],
                    "the kept part is the snapshot's"
                );
                if rep.bad_outcome == BadOutcome::Zeroed {
                    // SAFETY: as above; zeros were installed there.
                    let z = unsafe {
                        std::slice::from_raw_parts((m.addr + len - 3 * HUGE) as *const u8, 3 * HUGE)
                    };
                    assert!(z.iter().all(|&b| b == 0), "lost pages read zeros");
                }
            },
        );
    }

    #[test]
    fn huge_pages_discarded_during_the_fill_are_never_brought_back() {
        in_child(
            "hugetlb::huge_pages_discarded_during_the_fill_are_never_brought_back",
            LIMIT,
            || {
                let len = 16 << 20;
                let Some(m) = Hugetlb::new(len) else { return };
                let (data, file) = data_file("hugetlb-dontneed", len, 33);
                let o = LazyOptions {
                    start_cancelled: true,
                    ..LazyOptions::default()
                };
                // SAFETY: fresh hugetlb memory of ours; touched and discarded
                // below only.
                let Some(h) = (unsafe { start_fill(m.addr, len, &file, &o) }) else {
                    return;
                };
                // One huge page served, then discarded; one discarded before
                // anyone touched it.
                assert_eq!(word(m.addr + HUGE + 8), data_word(&data, HUGE + 8));
                for at in [HUGE, 5 * HUGE] {
                    // SAFETY: advice on our own mapping, whole huge pages.
                    let rc = unsafe {
                        libc::madvise(
                            (m.addr + at) as *mut libc::c_void,
                            HUGE,
                            libc::MADV_DONTNEED,
                        )
                    };
                    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
                }
                let rep = h.wait();
                let mut want = data;
                want[HUGE..2 * HUGE].fill(0);
                want[5 * HUGE..6 * HUGE].fill(0);
                // SAFETY: the fill ended; nobody else touches the mapping.
                let got = unsafe { std::slice::from_raw_parts(m.addr as *const u8, len) };
                let first = got.iter().zip(&want).position(|(a, b)| a != b);
                assert_eq!(first, None, "first wrong byte: {:?}", rep.notes);
            },
        );
    }
}

/// Moves the first huge page of a range being filled elsewhere with
/// mremap (MAYMOVE | FIXED), then waits: the moved part holds the snapshot
/// at its new home, the rest where it was. The kernel reports the move,
/// then the old range's unmapping: that old range once named the moved
/// pages, which were taken for discarded and read zeros.
fn moved_during_the_fill(shared: bool, cancelled: bool, channels: usize) {
    const HUGE: usize = 2 << 20;
    let len = 32 << 20;
    let (data, file) = data_file("moved", len, 43);
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: fresh mappings of ours (the memfd's descriptor lives until
    // the end); the destination is a reservation the move replaces.
    let (base, _fd, to) = unsafe {
        let (base, fd) = if shared {
            let (p, fd) = shared_memfd(len);
            (p as usize, Some(fd))
        } else {
            let r = common::map_anonymous(None, len + HUGE, rw, libc::MAP_PRIVATE) as usize;
            let base = r.next_multiple_of(HUGE);
            libc::madvise(base as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            (base, None)
        };
        let to = common::map_anonymous(None, 2 * HUGE, libc::PROT_NONE, libc::MAP_PRIVATE) as usize;
        (base, fd, to.next_multiple_of(HUGE))
    };
    let o = LazyOptions {
        allow_shared_memory: shared,
        start_cancelled: cancelled,
        channels,
        ..LazyOptions::default()
    };
    // SAFETY: fresh memory of ours; only the move below touches it.
    let Some(h) = (unsafe { start_fill(base, len, &file, &o) }) else {
        return;
    };
    // SAFETY: our own registered mapping, moved over our reservation.
    let r = unsafe {
        libc::mremap(
            base as *mut libc::c_void,
            HUGE,
            HUGE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to as *mut libc::c_void,
        )
    };
    assert_ne!(r, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    let rep = h.wait();
    let what = format!("shared {shared}, cancelled {cancelled}, {channels} channels");
    assert!(
        read_host(to as *const u8, HUGE) == data[..HUGE],
        "{what}: the moved huge page is not the snapshot's: {:?} {:?}",
        rep.progress,
        rep.notes
    );
    assert!(
        read_host((base + HUGE) as *const u8, len - HUGE) == data[HUGE..],
        "{what}: the rest is not the snapshot's"
    );
    assert_eq!(rep.progress.skipped_pages, 0, "{what}: {:?}", rep.notes);
}

#[test]
fn pages_moved_by_mremap_during_the_fill_keep_their_snapshot_bytes() {
    in_child(
        "pages_moved_by_mremap_during_the_fill_keep_their_snapshot_bytes",
        LIMIT,
        || {
            for (shared, cancelled, channels) in [
                (false, true, 2),
                (false, false, 2),
                (true, true, 2),
                (true, false, 1),
                (true, false, 2),
            ] {
                moved_during_the_fill(shared, cancelled, channels);
            }
        },
    );
}

#[test]
fn bad_ranges_over_adjacent_host_mappings_are_reported_at_their_guest_addresses() {
    in_child(
        "bad_ranges_over_adjacent_host_mappings_are_reported_at_their_guest_addresses",
        LIMIT,
        || {
            const LEN: usize = 2 << 20;
            let r = [(GuestAddress(0), LEN), (GuestAddress(B), LEN)];
            let src = Ram::from_ranges(&r).unwrap();
            src.write_slice(&pattern(LEN, 1), GuestAddress(0)).unwrap();
            src.write_slice(&pattern(LEN, 2), GuestAddress(B)).unwrap();
            let path = temp_path("adjacent");
            snapshot_to_file(&src, &path).expect("snapshot");
            // Every region's bytes are lost.
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(PAGE).unwrap();
            // One mapping, guest B in its first half and guest 0 in its
            // second: the host ranges touch, in the other order.
            // SAFETY: a fresh private anonymous mapping, unmapped below.
            let host = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    2 * LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            assert_ne!(host, libc::MAP_FAILED);
            let host = host.cast::<u8>();
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
            let region = |at: *mut u8, g: u64| {
                // SAFETY: `at .. at + LEN` lies in the mapping above, which
                // outlives the region (build_raw does not unmap it).
                let m = unsafe {
                    vm_memory::MmapRegion::<AtomicBitmap>::build_raw(
                        at,
                        LEN,
                        libc::PROT_READ | libc::PROT_WRITE,
                        flags,
                    )
                }
                .unwrap();
                vm_memory::GuestRegionMmap::new(m, GuestAddress(g)).unwrap()
            };
            let mem = Ram::from_regions(vec![region(host.wrapping_add(LEN), 0), region(host, B)])
                .unwrap();
            if let Some(h) = start(&mem, &path, &LazyRestoreOptions::default()) {
                let rep = h.wait();
                let eager =
                    foliokit_vm_memory::restore_from_path(&Ram::from_ranges(&r).unwrap(), &path)
                        .expect("eager restore");
                let want = vec![
                    foliokit_vm_memory::BadRange {
                        addr: GuestAddress(0),
                        len: LEN as u64,
                        kind: FaultKind::Vanished,
                    },
                    foliokit_vm_memory::BadRange {
                        addr: GuestAddress(B),
                        len: LEN as u64,
                        kind: FaultKind::Vanished,
                    },
                ];
                assert_eq!(eager.bad, want);
                assert_eq!(rep.bad, want);
            }
            drop(mem);
            // SAFETY: the mapping made above; its regions are dropped.
            unsafe { libc::munmap(host.cast(), 2 * LEN) };
            let _ = std::fs::remove_file(&path);
        },
    );
}

#[test]
fn an_unaligned_range_bad_at_save_leaves_the_rest_of_its_pages_restored() {
    in_child(
        "an_unaligned_range_bad_at_save_leaves_the_rest_of_its_pages_restored",
        LIMIT,
        || {
            const LEN: usize = 1 << 20;
            let r = [(GuestAddress(0), LEN)];
            let src = Ram::from_ranges(&r).unwrap();
            let data = pattern(LEN, 3);
            src.write_slice(&data, GuestAddress(0)).unwrap();
            // 16 bytes inside guest page 1 bad at save: saved as zeros and
            // listed in the trailer, as the snapshot writes them.
            let (bad_at, bad_len) = (PAGE + 0x10, 0x10u64);
            src.write_slice(&[0u8; 0x10], GuestAddress(bad_at)).unwrap();
            let mut image = Vec::new();
            foliokit_vm_memory::snapshot(&src, &mut image).expect("snapshot");
            image.truncate(image.len() - 16);
            image.extend_from_slice(b"FKVMBAD\0");
            for v in [1u64, bad_at, bad_len, 1] {
                image.extend_from_slice(&v.to_le_bytes());
            }
            let path = temp_path("unaligned-bad");
            std::fs::write(&path, &image).unwrap();
            let eager = Ram::from_ranges(&r).unwrap();
            let e = foliokit_vm_memory::restore_from_path(&eager, &path).expect("eager");
            let lazy = Ram::from_ranges(&r).unwrap();
            if let Some(h) = start(&lazy, &path, &LazyRestoreOptions::default()) {
                let l = h.wait();
                assert_eq!(l.bad_at_save, e.bad_at_save);
                assert_eq!(l.bad_at_save.len(), 1);
                let mut want = data.clone();
                want[bad_at as usize..][..bad_len as usize].fill(0);
                assert!(read(&eager, 0, LEN) == want);
                assert!(read(&lazy, 0, LEN) == want);
            }
            let _ = std::fs::remove_file(&path);
        },
    );
}

#[test]
fn a_snapshot_cut_mid_page_poisons_and_reports_that_page() {
    in_child(
        "a_snapshot_cut_mid_page_poisons_and_reports_that_page",
        LIMIT,
        || {
            const LEN: u64 = 1 << 20;
            let r = [(GuestAddress(0), LEN as usize)];
            let src = Ram::from_ranges(&r).unwrap();
            let data = pattern(LEN as usize, 5);
            src.write_slice(&data, GuestAddress(0)).unwrap();
            let path = temp_path("cut-mid-page");
            snapshot_to_file(&src, &path).expect("snapshot");
            // The region's bytes start one page in; cut 100 bytes into
            // guest page 0x10.
            let lost_page = 0x10 * PAGE;
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(PAGE + lost_page + 100).unwrap();
            let eager = Ram::from_ranges(&r).unwrap();
            let e = foliokit_vm_memory::restore_from_path(&eager, &path).expect("eager");
            assert_eq!(
                e.bad.first().map(|b| b.addr),
                Some(GuestAddress(lost_page + 100))
            );
            let lazy = Ram::from_ranges(&r).unwrap();
            if let Some(h) = start(&lazy, &path, &LazyRestoreOptions::default()) {
                let l = h.wait();
                // The whole page is lost (poisoned), so reported whole.
                assert_eq!(
                    l.bad,
                    vec![foliokit_vm_memory::BadRange {
                        addr: GuestAddress(lost_page),
                        len: LEN - lost_page,
                        kind: FaultKind::Vanished,
                    }]
                );
                assert_eq!(
                    read(&lazy, 0, lost_page as usize),
                    data[..lost_page as usize]
                );
                if l.fill.bad_outcome == BadOutcome::Poisoned {
                    assert!(
                        read_mc(&lazy, lost_page).is_err(),
                        "the cut page reads as data"
                    );
                }
            }
            let _ = std::fs::remove_file(&path);
        },
    );
}

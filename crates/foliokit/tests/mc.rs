//! Fault injection for the machine-check-safe copy: sources whose pages
//! vanish (a truncated file under a shared mapping) and, where the kernel
//! allows it, real hardware-poison injection.
#![cfg(target_arch = "x86_64")]

mod common;

use common::{pattern, TruncatedFile};
use foliokit::mc::{copy_folios_mc, copy_mc, copy_mc_raw, FaultKind, McError, McFault};
use foliokit::mem::Region;
use foliokit::{CopyOptions, CopyStrategy, Reuse, Strategy};

const PAGE: usize = 4096;
const FOLIO: usize = 2 << 20;

fn mc_strategies() -> Vec<CopyStrategy> {
    [
        CopyStrategy::Movsb,
        CopyStrategy::Avx2,
        CopyStrategy::Nt,
        CopyStrategy::Auto,
    ]
    .into_iter()
    .filter(|s| match s.unavailable() {
        None => true,
        Some(why) => {
            common::missing(common::Need::Cpu, &format!("mc {}: {why}", s.name()));
            false
        }
    })
    .collect()
}

fn fault(e: McError) -> McFault {
    match e {
        McError::Fault(f) => f,
        other => panic!("expected a fault, got {other}"),
    }
}

#[test]
fn every_page_of_a_2m_folio_vanishing_is_reported_exactly() {
    let want = pattern(FOLIO, 11);
    for s in mc_strategies() {
        let file = TruncatedFile::new(FOLIO, 11, None);
        let mut dst = Region::new(FOLIO, FOLIO).unwrap();
        // Shrink page by page: at step k, pages k.. are gone.
        for k in (0..FOLIO / PAGE).rev() {
            file.truncate(k * PAGE);
            dst.as_mut_slice().fill(0);
            let f = fault(copy_mc(dst.as_mut_slice(), file.as_slice(), s).unwrap_err());
            let ctx = format!("{} k={k}", s.name());
            assert_eq!(f.not_copied, FOLIO - k * PAGE, "{ctx}");
            assert_eq!(f.bad_page, k, "{ctx}");
            assert_eq!(f.kind, FaultKind::Vanished, "{ctx}");
            assert_eq!(f.addr, file.as_ptr() as usize + k * PAGE, "{ctx}");
            assert!(
                dst.as_slice()[..k * PAGE] == want[..k * PAGE],
                "{ctx}: copied prefix differs"
            );
        }
    }
}

/// Only the source may fault: a destination page that raises SIGBUS (a
/// shared file truncated under it) is reported as the destination's, with
/// its page counted from the destination, in a single copy and in a batch
/// (where it ends the batch, unlike a source fault). It used to be
/// reported as a bad source page.
#[test]
fn a_destination_fault_is_never_taken_for_a_source_fault() {
    use std::os::fd::AsRawFd;
    let len = 4 * PAGE;
    // Page-aligned: the batch wants whole pages.
    let mut src = Region::new(len, PAGE).unwrap();
    src.as_mut_slice().copy_from_slice(&pattern(len, 13));
    let src = src.as_slice();
    for s in mc_strategies() {
        let (file, path) = common::temp_file("mc-dst");
        let _ = std::fs::remove_file(path);
        file.set_len(len as u64).unwrap();
        // SAFETY: a shared read-write mapping of our own file.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        file.set_len(2 * PAGE as u64).unwrap();
        let dst = map.cast::<u8>();
        // SAFETY: dst is our mapping (its last two pages raise SIGBUS,
        // which is what is tested); src is a distinct vector.
        let e = unsafe { copy_mc_raw(dst, src.as_ptr(), len, s) }.unwrap_err();
        let ctx = s.name();
        let McError::DestinationFault(f) = e else {
            panic!("{ctx}: expected a destination fault, got {e}");
        };
        assert_eq!((f.not_copied, f.bad_page), (2 * PAGE, 2), "{ctx}");
        assert_eq!(f.kind, FaultKind::Vanished, "{ctx}");
        // SAFETY: the first two pages are still backed by the file.
        let head = unsafe { std::slice::from_raw_parts(dst, 2 * PAGE) };
        assert!(head == &src[..2 * PAGE], "{ctx}: the copied prefix differs");
        // SAFETY: as above; the batch is refused at its second folio.
        let dst_all = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        let o = CopyOptions::default().strategy(s);
        // Counted over the whole range, as the single copy above.
        match copy_folios_mc(dst_all, src, 2 * PAGE, o) {
            Err(McError::DestinationFault(f)) => {
                assert_eq!((f.not_copied, f.bad_page), (2 * PAGE, 2), "{ctx}: batch")
            }
            other => panic!("{ctx}: batch: {other:?}"),
        }
        // SAFETY: our mapping, unused from here on.
        unsafe { libc::munmap(map, len) };
    }
}

#[test]
fn bytes_around_the_boundary() {
    let want = pattern(4 * PAGE, 5);
    for s in mc_strategies() {
        let file = TruncatedFile::new(4 * PAGE, 5, None);
        file.truncate(2 * PAGE);
        let src = file.as_slice();
        let b = 2 * PAGE;
        let mut dst = Region::new(4 * PAGE, PAGE).unwrap();
        let name = s.name();
        // Ending exactly at the boundary: everything is copied.
        for len in [1, 63, 64, 129, PAGE + 7] {
            let d = &mut dst.as_mut_slice()[3..3 + len];
            copy_mc(d, &src[b - len..b], s).unwrap_or_else(|e| panic!("{name} len {len}: {e}"));
            assert!(
                dst.as_slice()[3..3 + len] == want[b - len..b],
                "{name} len {len}"
            );
        }
        // Starting just before: exactly the bytes before the boundary land.
        for (before, len) in [(1, 2), (1, 300), (17, 17 + PAGE), (64, 65), (200, 1000)] {
            dst.as_mut_slice().fill(0);
            let d = &mut dst.as_mut_slice()[5..5 + len];
            let f = fault(copy_mc(d, &src[b - before..b - before + len], s).unwrap_err());
            assert_eq!(f.not_copied, len - before, "{name} {before}+{len}");
            assert_eq!(f.bad_page, 1, "{name} {before}+{len}");
            assert!(
                dst.as_slice()[5..5 + before] == want[b - before..b],
                "{name} {before}+{len}"
            );
        }
        // Starting on the missing page: nothing is copied.
        let f = fault(copy_mc(&mut dst.as_mut_slice()[..10], &src[b..b + 10], s).unwrap_err());
        assert_eq!((f.not_copied, f.bad_page), (10, 0), "{name}");
    }
}

#[test]
fn a_bad_folio_does_not_stop_the_batch() {
    // Four 64 KiB folios; folio 1 is a file mapping that loses its second
    // half, the others are ordinary memory.
    const F: usize = 64 << 10;
    for s in mc_strategies() {
        let mut src = Region::new(4 * F, PAGE).unwrap();
        let p = pattern(4 * F, 21);
        src.as_mut_slice().copy_from_slice(&p);
        let hole_at = src.as_mut_ptr().wrapping_add(F);
        let file = TruncatedFile::new(F, 99, Some(hole_at));
        file.truncate(F / 2);
        let mut dst = Region::new(4 * F, PAGE).unwrap();
        let opts = CopyOptions::default().strategy(s).reuse(Reuse::Reread);
        let r = copy_folios_mc(dst.as_mut_slice(), src.as_slice(), F, opts).unwrap();
        let name = s.name();
        assert_eq!((r.folios, r.copied, r.faults.len()), (4, 3, 1), "{name}");
        let f = r.faults[0];
        assert_eq!(f.index, 1, "{name}");
        assert_eq!(f.fault.not_copied, F / 2, "{name}");
        assert_eq!(f.fault.bad_page, F / 2 / PAGE, "{name}");
        for i in [0, 2, 3] {
            assert!(
                dst.as_slice()[i * F..][..F] == p[i * F..][..F],
                "{name} folio {i}"
            );
        }
        let file_bytes = pattern(F, 99);
        assert!(
            dst.as_slice()[F..F + F / 2] == file_bytes[..F / 2],
            "{name} folio 1 prefix"
        );
    }
}

#[test]
fn threads_fault_and_recover_concurrently() {
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let len = 64 * PAGE;
                let want = pattern(len, t);
                let strategies = mc_strategies();
                for round in 0..40usize {
                    let s = strategies[round % strategies.len()];
                    let file = TruncatedFile::new(len, t, None);
                    let k = (round * 7 + t as usize * 13) % 64;
                    file.truncate(k * PAGE);
                    let mut dst = vec![0u8; len];
                    let f = fault(copy_mc(&mut dst, file.as_slice(), s).unwrap_err());
                    assert_eq!(f.not_copied, len - k * PAGE, "thread {t} round {round}");
                    assert_eq!(f.bad_page, k);
                    assert!(dst[..k * PAGE] == want[..k * PAGE]);
                    // And a copy of memory that does not fault succeeds.
                    let mut again = vec![0u8; k * PAGE];
                    copy_mc(&mut again, &file.as_slice()[..k * PAGE], s).unwrap();
                    assert!(again[..] == want[..k * PAGE]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("copier thread");
    }
}

#[test]
fn mc_copies_match_the_reference_when_nothing_faults() {
    for s in mc_strategies() {
        common::sweep_copy(&format!("mc {}", s.name()), &|d, src| {
            copy_mc(d, src, s).expect("mc copy");
        });
    }
}

#[test]
fn strategies_without_an_mc_variant_are_refused() {
    let (mut d, s) = ([0u8; 64], [1u8; 64]);
    for st in [
        CopyStrategy::PerPage,
        CopyStrategy::Movsq,
        CopyStrategy::Unrolled,
        CopyStrategy::Libc,
    ] {
        assert_eq!(copy_mc(&mut d, &s, st), Err(McError::NoVariant(st.name())));
    }
    assert_eq!(d, [0u8; 64]);
}

/// `copy_mc_raw` over a page that SIGBUSes, at odd source and destination
/// alignments and lengths: exactly the bytes before the vanished page land,
/// nothing after them is written, and the fault names the page and address.
#[test]
fn raw_mc_copy_over_a_vanished_page_at_odd_alignments() {
    use common::{Guarded, Place, CANARY};
    let want = pattern(4 * PAGE, 41);
    for s in mc_strategies() {
        let name = s.name();
        let file = TruncatedFile::new(4 * PAGE, 41, None);
        file.truncate(3 * PAGE); // page 3 vanishes
        let b = 3 * PAGE;
        for (before, len, doff) in [
            (1, 2, 1),
            (3, 4097, 7),
            (129, 130, 63),
            (PAGE + 5, PAGE + 6 + 999, 33),
            (2 * PAGE + 17, 2 * PAGE + 17 + PAGE, 0),
        ] {
            let mut dst = Guarded::new(len, Place::Start(doff));
            dst.buf().fill(CANARY);
            let src = file.as_ptr().wrapping_add(b - before);
            let d = dst.buf().as_mut_ptr();
            // SAFETY: `src` is a live read-only file mapping for these bytes
            // (the vanished page raises SIGBUS, which is reported); `d` is a
            // writable buffer of `len` bytes, disjoint from it.
            let r = unsafe { copy_mc_raw(d, src, len, s) };
            let f = fault(r.unwrap_err());
            let ctx = format!("{name} before {before} len {len} doff {doff}");
            assert_eq!(f.not_copied, len - before, "{ctx}");
            assert_eq!(f.kind, FaultKind::Vanished, "{ctx}");
            assert_eq!(f.addr, file.as_ptr() as usize + b, "{ctx}");
            assert_eq!(
                f.bad_page,
                (src as usize + before) / PAGE - src as usize / PAGE,
                "{ctx}"
            );
            assert!(dst.buf()[..before] == want[b - before..b], "{ctx}: prefix");
            assert!(
                dst.buf()[before..].iter().all(|&x| x == CANARY),
                "{ctx}: wrote past the fault"
            );
            dst.assert_canaries(&ctx);
        }
    }
}

#[test]
fn raw_mc_copies_match_the_reference_and_refuse_overlap() {
    for s in mc_strategies() {
        common::sweep_copy(&format!("mc raw {}", s.name()), &|d, src| {
            // SAFETY: both slices are valid for their equal lengths and
            // disjoint; neither faults.
            unsafe { copy_mc_raw(d.as_mut_ptr(), src.as_ptr(), d.len(), s) }.expect("mc copy");
        });
        let mut buf = pattern(300, 2);
        let want = buf.clone();
        let p = buf.as_mut_ptr();
        // SAFETY: both ranges are inside `buf`; refused before any access.
        let r = unsafe { copy_mc_raw(p.add(1), p, 200, s) };
        assert!(
            matches!(r, Err(McError::Batch(foliokit::BatchError::Overlap { .. }))),
            "{r:?}"
        );
        assert_eq!(buf, want);
        let dangling = std::ptr::NonNull::<u8>::dangling().as_ptr();
        // SAFETY: len 0: nothing is accessed.
        unsafe { copy_mc_raw(dangling, dangling, 0, s) }.expect("empty mc copy");
    }
}

/// A thread that blocks SIGBUS (one that takes signals through signalfd)
/// is refused before anything is copied: the kernel would kill the process
/// at a fault rather than run any handler, and unblocking it for the copy
/// would hand a SIGBUS pending for the application's signalfd to foliokit.
/// Its mask is left as it was.
#[test]
fn a_thread_that_blocks_sigbus_is_refused_before_copying() {
    std::thread::spawn(|| {
        // SAFETY: sigset_t is plain data; the calls change this thread's mask.
        let blocked = unsafe {
            let mut bus: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut bus);
            libc::sigaddset(&mut bus, libc::SIGBUS);
            libc::pthread_sigmask(libc::SIG_BLOCK, &bus, std::ptr::null_mut());
            move || {
                let mut now: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut now);
                libc::sigismember(&now, libc::SIGBUS) == 1
            }
        };
        let file = TruncatedFile::new(2 * PAGE, 17, None);
        file.truncate(PAGE);
        let mut dst = vec![0u8; 2 * PAGE];
        let e = copy_mc(&mut dst, file.as_slice(), CopyStrategy::Movsb).unwrap_err();
        assert!(matches!(e, McError::Unavailable(_)), "{e}");
        assert!(dst.iter().all(|&b| b == 0), "nothing is copied");
        assert!(blocked(), "the thread's mask was changed");
    })
    .join()
    .unwrap();
}

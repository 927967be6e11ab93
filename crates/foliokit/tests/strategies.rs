//! Every copy and clear strategy against the reference, on size and
//! alignment sweeps with guard pages and canaries.

mod common;

use common::{available, sweep_clear, sweep_copy, unavailable};
use foliokit::{ClearStrategy, CopyStrategy, Strategy};

#[test]
fn every_copy_strategy_matches_the_reference() {
    for s in available(CopyStrategy::ALL) {
        sweep_copy(s.name(), &|d, src| {
            foliokit::copy(d, src, s).expect("copy");
        });
    }
}

#[test]
fn every_clear_strategy_zeroes_exactly_its_range() {
    for s in available(ClearStrategy::ALL) {
        sweep_clear(s.name(), &|d| {
            foliokit::clear(d, s).expect("clear");
        });
    }
}

/// The raw entry points take pointers, not slices: the same sweeps through
/// them (the slice functions are thin wrappers, so this pins the contract
/// of the pointer form itself, odd lengths and alignments included).
#[test]
fn raw_entry_points_match_the_reference() {
    for s in available(&[
        CopyStrategy::Auto,
        CopyStrategy::PerPage,
        CopyStrategy::Movsb,
    ]) {
        sweep_copy(&format!("copy_raw {}", s.name()), &|d, src| {
            // SAFETY: both slices are valid for their equal lengths and
            // disjoint; no other reference to them is used during the call.
            unsafe { foliokit::copy_raw(d.as_mut_ptr(), src.as_ptr(), d.len(), s) }
                .expect("copy_raw");
        });
    }
    for s in available(&[
        ClearStrategy::Auto,
        ClearStrategy::Butterfly,
        ClearStrategy::Stosb,
    ]) {
        sweep_clear(&format!("clear_raw {}", s.name()), &|d| {
            // SAFETY: the slice is valid for writes of its length.
            unsafe { foliokit::clear_raw(d.as_mut_ptr(), d.len(), s) }.expect("clear_raw");
        });
    }
}

#[test]
fn raw_entry_points_refuse_overlap_and_wrapping_untouched() {
    use foliokit::BatchError;
    let mut buf = common::pattern(256, 3);
    let want = buf.clone();
    let p = buf.as_mut_ptr();
    for (d, s, len) in [
        (0, 10, 11),
        (10, 0, 11),
        (5, 5, 1),
        (0, 0, 256),
        (100, 37, 64),
    ] {
        // SAFETY: both ranges lie inside `buf`; the call refuses before
        // touching them.
        let r = unsafe { foliokit::copy_raw(p.add(d), p.add(s), len, CopyStrategy::Auto) };
        assert!(
            matches!(r, Err(BatchError::Overlap { .. })),
            "{d} {s} {len}: {r:?}"
        );
    }
    assert_eq!(buf, want, "a refused copy wrote");
    // Adjacent ranges do not overlap.
    // SAFETY: [0, 128) and [128, 256) are inside `buf` and disjoint.
    unsafe { foliokit::copy_raw(p, p.add(128), 128, CopyStrategy::Auto) }.expect("adjacent");
    assert_eq!(buf[..128], want[128..]);
    let top = usize::MAX - 10;
    // SAFETY: refused before any access (the ranges wrap).
    let r = unsafe { foliokit::copy_raw(top as *mut u8, p, 64, CopyStrategy::Auto) };
    assert!(matches!(r, Err(BatchError::Wraps { .. })), "{r:?}");
    // SAFETY: refused before any access (the range wraps).
    let r = unsafe { foliokit::clear_raw(top as *mut u8, 64, ClearStrategy::Auto) };
    assert!(matches!(r, Err(BatchError::Wraps { .. })), "{r:?}");
    // Zero bytes touch nothing, whatever the pointers.
    let dangling = std::ptr::NonNull::<u8>::dangling().as_ptr();
    // SAFETY: len 0: nothing is accessed.
    unsafe { foliokit::copy_raw(dangling, dangling.wrapping_add(4096), 0, CopyStrategy::Auto) }
        .expect("empty copy");
    // SAFETY: len 0: nothing is accessed.
    unsafe { foliokit::clear_raw(dangling, 0, ClearStrategy::Auto) }.expect("empty clear");
}

/// A writer keeps changing the source while `copy_raw` copies it (the VMM
/// case: vCPUs write guest RAM during a copy). No reference is formed, so
/// this is defined: every destination byte is the old or the new value.
#[test]
fn copy_raw_tolerates_a_concurrent_writer() {
    use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
    const LEN: usize = 64 << 10;
    let src: Vec<AtomicU8> = (0..LEN).map(|_| AtomicU8::new(0x11)).collect();
    let stop = AtomicBool::new(false);
    let strategies = available(&[CopyStrategy::Auto, CopyStrategy::Movsb, CopyStrategy::Nt]);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                src[i % LEN].store(0x22, Ordering::Relaxed);
                i = i.wrapping_add(4093);
            }
        });
        let mut dst = vec![0u8; LEN];
        for round in 0..50 {
            for &s in &strategies {
                // SAFETY: `src` is valid for reads of LEN bytes (AtomicU8 has
                // u8's layout) and written only atomically by the other
                // thread; `dst` is ours and disjoint from it.
                unsafe { foliokit::copy_raw(dst.as_mut_ptr(), src.as_ptr().cast(), LEN, s) }
                    .expect("copy_raw");
                assert!(
                    dst.iter().all(|&b| b == 0x11 || b == 0x22),
                    "round {round} {}: a byte that was never stored",
                    s.name()
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
}

#[test]
fn unavailable_strategies_are_refused_not_faked() {
    for s in unavailable::<CopyStrategy>() {
        let (mut d, src) = ([0u8; 64], [1u8; 64]);
        assert!(foliokit::copy(&mut d, &src, s).is_err(), "{s:?} ran");
        assert_eq!(d, [0u8; 64], "{s:?} wrote");
    }
    for s in unavailable::<ClearStrategy>() {
        let mut d = [1u8; 64];
        assert!(foliokit::clear(&mut d, s).is_err(), "{s:?} ran");
        assert_eq!(d, [1u8; 64], "{s:?} wrote");
    }
    // The composite strategies exist everywhere.
    for s in [
        CopyStrategy::PerPage,
        CopyStrategy::Libc,
        CopyStrategy::Auto,
    ] {
        assert_eq!(s.unavailable(), None);
    }
}

#[test]
fn butterfly_visits_every_page_once_and_ends_on_the_hint() {
    // The kernel's order for 8 pages, hint 2 and hint 6.
    let order = |pages, hint| {
        let mut v = Vec::new();
        foliokit::clear::butterfly_order(pages, hint, |i| v.push(i));
        v
    };
    assert_eq!(order(8, 2), [7, 6, 5, 4, 0, 3, 1, 2]);
    assert_eq!(order(8, 6), [0, 1, 2, 3, 4, 7, 5, 6]);
    for pages in [1, 2, 3, 512] {
        for hint in 0..pages {
            let mut v = order(pages, hint);
            assert_eq!(*v.last().unwrap(), hint);
            v.sort_unstable();
            assert_eq!(v, (0..pages).collect::<Vec<_>>());
        }
    }
}

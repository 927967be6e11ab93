//! The batch API: property tests over shapes and strategies, and a test for
//! every error, each checking that a rejected batch wrote nothing.

mod common;

use common::{filled_region, pattern, PAGE};
use foliokit::mem::Region;
use foliokit::{
    clear_folios, clear_folios_raw, copy_folios, copy_folios_raw, BatchError, ClearOptions,
    ClearStrategy, CopyOptions, CopyStrategy, Reuse, Strategy, StrategyError,
};
use proptest::prelude::*;

fn copy_strategy() -> impl proptest::strategy::Strategy<Value = CopyStrategy> {
    proptest::sample::select(common::available(CopyStrategy::ALL))
}

fn clear_strategy() -> impl proptest::strategy::Strategy<Value = ClearStrategy> {
    proptest::sample::select(common::available(ClearStrategy::ALL))
}

fn reuse() -> impl proptest::strategy::Strategy<Value = Reuse> {
    prop_oneof![Just(Reuse::Reread), Just(Reuse::Stream)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn contiguous_copy_copies_everything(s in copy_strategy(), pages in 1usize..5, n in 1usize..6,
                                         reuse in reuse(), seed in any::<u64>()) {
        let folio = pages * PAGE;
        let src = filled_region(folio, n, seed);
        let mut dst = Region::new(folio * n, PAGE).unwrap();
        let r = copy_folios(dst.as_mut_slice(), src.as_slice(), folio, CopyOptions::default().strategy(s).reuse(reuse)).unwrap();
        prop_assert_eq!(r.bytes, folio * n);
        prop_assert_eq!(r.folios, n);
        prop_assert!(dst.as_slice() == src.as_slice());
        if s != CopyStrategy::Auto {
            prop_assert_eq!(r.strategy, s);
        }
    }

    #[test]
    fn scattered_copy_pairs_each_folio(s in copy_strategy(), pages in 1usize..4, n in 1usize..8,
                                       seed in any::<u64>(), rot in 0usize..8) {
        // Destination folio i receives source folio (i + rot) % n.
        let folio = pages * PAGE;
        let src = filled_region(folio, n, seed);
        let mut dst = Region::new(folio * n, PAGE).unwrap();
        let d = dst.as_mut_ptr();
        let dsts: Vec<*mut u8> = (0..n).map(|i| d.wrapping_add(i * folio)).collect();
        let srcs: Vec<*const u8> = (0..n).map(|i| src.as_ptr().wrapping_add((i + rot) % n * folio)).collect();
        // SAFETY: every pointer is a folio inside a live region.
        unsafe { copy_folios_raw(&dsts, &srcs, folio, CopyOptions::default().strategy(s).reuse(Reuse::Reread)) }.unwrap();
        for i in 0..n {
            let j = (i + rot) % n;
            prop_assert!(dst.as_slice()[i * folio..][..folio] == src.as_slice()[j * folio..][..folio]);
        }
    }

    #[test]
    fn clear_zeroes_everything(s in clear_strategy(), pages in 1usize..5, n in 1usize..6,
                               hint in 0usize..5, reuse in reuse(), seed in any::<u64>()) {
        let folio = pages * PAGE;
        let mut dst = filled_region(folio, n, seed);
        let opts = ClearOptions::default().strategy(s).reuse(reuse).hint_page(hint % pages);
        let r = clear_folios(dst.as_mut_slice(), folio, opts).unwrap();
        prop_assert_eq!(r.bytes, folio * n);
        prop_assert!(dst.as_slice().iter().all(|&b| b == 0));
    }

    #[test]
    fn misaligned_batches_are_rejected_untouched(off in 1usize..PAGE, s in copy_strategy()) {
        let src = filled_region(2 * PAGE, 2, 1);
        let mut dst = Region::new(4 * PAGE, PAGE).unwrap();
        let before = dst.as_slice().to_vec();
        let e = copy_folios(&mut dst.as_mut_slice()[off..off + 2 * PAGE], &src.as_slice()[..2 * PAGE], PAGE,
                            CopyOptions::default().strategy(s).reuse(Reuse::Reread));
        let is_misaligned = matches!(e, Err(BatchError::Misaligned { .. }));
        prop_assert!(is_misaligned);
        prop_assert!(dst.as_slice() == &before[..]);
    }
}

/// A source and destination of `folios` pages, the destination all 0xEE so
/// any write shows.
fn pair(folios: usize) -> (Region, Region) {
    let src = filled_region(PAGE, folios, 3);
    let mut dst = Region::new(PAGE * folios, PAGE).unwrap();
    dst.as_mut_slice().fill(0xEE);
    (src, dst)
}

fn untouched(r: &Region) -> bool {
    r.as_slice().iter().all(|&b| b == 0xEE)
}

#[test]
fn bad_folio_sizes() {
    let (src, mut dst) = pair(4);
    let o = CopyOptions::default();
    for bad in [0, 1000, PAGE + 1] {
        let e = copy_folios(dst.as_mut_slice(), src.as_slice(), bad, o).unwrap_err();
        assert!(
            matches!(
                e,
                BatchError::BadFolioSize(..) | BatchError::NotFolioMultiple { .. }
            ),
            "{bad}: {e}"
        );
    }
    assert!(untouched(&dst));
    // 4 pages do not split into 3-page folios.
    let e = copy_folios(dst.as_mut_slice(), src.as_slice(), 3 * PAGE, o).unwrap_err();
    assert!(matches!(e, BatchError::NotFolioMultiple { .. }), "{e}");
    let e = clear_folios(dst.as_mut_slice(), 3 * PAGE, ClearOptions::default()).unwrap_err();
    assert!(matches!(e, BatchError::NotFolioMultiple { .. }), "{e}");
    assert!(untouched(&dst));
}

#[test]
fn length_and_count_mismatches() {
    let (src, mut dst) = pair(4);
    let e = copy_folios(
        dst.as_mut_slice(),
        &src.as_slice()[..2 * PAGE],
        PAGE,
        CopyOptions::default(),
    )
    .unwrap_err();
    assert_eq!(
        e,
        BatchError::LengthMismatch {
            dst: 4 * PAGE,
            src: 2 * PAGE
        }
    );
    let e = foliokit::copy(
        dst.as_mut_slice(),
        &src.as_slice()[..1],
        CopyStrategy::Movsb,
    )
    .unwrap_err();
    assert!(matches!(e, BatchError::LengthMismatch { .. }));
    let d = [dst.as_mut_ptr()];
    let s = [src.as_ptr(), src.as_ptr()];
    // SAFETY: rejected before any pointer is used.
    let e = unsafe { copy_folios_raw(&d, &s, PAGE, CopyOptions::default()) }.unwrap_err();
    assert_eq!(e, BatchError::CountMismatch(1, 2));
    assert!(untouched(&dst));
}

#[test]
fn overlaps_are_rejected() {
    let (src, mut dst) = pair(4);
    let d = dst.as_mut_ptr();
    let s = src.as_ptr();
    for (dsts, srcs) in [
        // Two destinations on the same folio.
        ([d, d], [s, s.wrapping_add(PAGE)]),
        // A destination that is also a source (of another pair).
        (
            [d, d.wrapping_add(PAGE)],
            [d.wrapping_add(PAGE).cast_const(), s],
        ),
    ] {
        // SAFETY: rejected before any pointer is used.
        let e = unsafe { copy_folios_raw(&dsts, &srcs, PAGE, CopyOptions::default()) }.unwrap_err();
        assert!(matches!(e, BatchError::Overlap { .. }), "{e}");
    }
    // Overlapping clear targets: 2-page folios one page apart.
    let e = unsafe {
        // SAFETY: as above.
        clear_folios_raw(
            &[d, d.wrapping_add(PAGE)],
            2 * PAGE,
            ClearOptions::default(),
        )
    }
    .unwrap_err();
    assert!(matches!(e, BatchError::Overlap { .. }), "{e}");
    assert!(untouched(&dst));
}

#[test]
fn misaligned_raw_pointers_and_wrapping_ranges() {
    let (src, mut dst) = pair(2);
    let o = CopyOptions::default();
    let d = dst.as_mut_ptr();
    let e = unsafe {
        // SAFETY: rejected before any pointer is used.
        copy_folios_raw(&[d.wrapping_add(8)], &[src.as_ptr()], PAGE, o)
    }
    .unwrap_err();
    assert!(
        matches!(
            e,
            BatchError::Misaligned {
                what: "destination",
                index: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = unsafe {
        // SAFETY: as above.
        copy_folios_raw(&[d], &[src.as_ptr().wrapping_add(1)], PAGE, o)
    }
    .unwrap_err();
    assert!(
        matches!(e, BatchError::Misaligned { what: "source", .. }),
        "{e}"
    );
    let top = (usize::MAX & !(PAGE - 1)) as *mut u8;
    let e = unsafe {
        // SAFETY: as above; the address is never dereferenced.
        clear_folios_raw(&[top], 2 * PAGE, ClearOptions::default())
    }
    .unwrap_err();
    assert!(matches!(e, BatchError::Wraps { .. }), "{e}");
    assert!(untouched(&dst));
}

#[test]
fn hint_outside_the_folio() {
    let mut dst = Region::new(4 * PAGE, PAGE).unwrap();
    dst.as_mut_slice().fill(0xEE);
    let o = ClearOptions::default()
        .strategy(ClearStrategy::Butterfly)
        .reuse(Reuse::Reread)
        .hint_page(2);
    let e = clear_folios(dst.as_mut_slice(), 2 * PAGE, o).unwrap_err();
    assert_eq!(e, BatchError::HintOutOfRange { hint: 2, pages: 2 });
    assert!(untouched(&dst));
}

#[test]
fn strategy_lists_parse_and_refuse() {
    use foliokit::strategy::parse_list;
    let sel = parse_list::<CopyStrategy>("movsb, nt,movsb").unwrap();
    assert_eq!(sel.run, [CopyStrategy::Movsb, CopyStrategy::Nt]);
    let all = parse_list::<ClearStrategy>("all").unwrap();
    assert_eq!(all.run.len() + all.skipped.len(), ClearStrategy::ALL.len());
    assert!(matches!(
        parse_list::<CopyStrategy>("memcpy"),
        Err(StrategyError::Unknown { .. })
    ));
    assert!(matches!(
        parse_list::<CopyStrategy>(" , "),
        Err(StrategyError::Empty { .. })
    ));
    for s in common::unavailable::<ClearStrategy>() {
        let e = parse_list::<ClearStrategy>(s.name()).unwrap_err();
        assert!(matches!(e, StrategyError::Unavailable { .. }));
        // And the batch API refuses it too, writing nothing.
        let mut dst = Region::new(PAGE, PAGE).unwrap();
        dst.as_mut_slice().fill(0xEE);
        let o = ClearOptions::default().strategy(s);
        assert!(matches!(
            clear_folios(dst.as_mut_slice(), PAGE, o),
            Err(BatchError::Strategy(_))
        ));
        assert!(untouched(&dst));
    }
}

#[test]
fn pattern_is_not_trivial() {
    let p = pattern(4096, 9);
    assert!(p.iter().any(|&b| b != p[0]));
}

#[test]
fn empty_batches_are_no_ops() {
    let r = copy_folios(&mut [], &[], PAGE, CopyOptions::default()).unwrap();
    assert_eq!((r.folios, r.bytes), (0, 0));
    let r = clear_folios(&mut [], PAGE, ClearOptions::default()).unwrap();
    assert_eq!((r.folios, r.bytes), (0, 0));
}

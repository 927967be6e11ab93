//! Every copy and clear strategy against the reference, on size and
//! alignment sweeps with guard pages and canaries.

mod common;

use common::{sweep_clear, sweep_copy};
use foliokit::{ClearStrategy, CopyStrategy, Strategy};

fn available<S: Strategy>() -> Vec<S> {
    S::ALL
        .iter()
        .copied()
        .filter(|s| match s.unavailable() {
            None => true,
            Some(why) => {
                common::skip(&format!("{} {}: {why}", S::OP, s.name()));
                false
            }
        })
        .collect()
}

#[test]
fn every_copy_strategy_matches_the_reference() {
    for s in available::<CopyStrategy>() {
        sweep_copy(s.name(), &|d, src| {
            foliokit::copy(d, src, s).expect("copy");
        });
    }
}

#[test]
fn every_clear_strategy_zeroes_exactly_its_range() {
    for s in available::<ClearStrategy>() {
        sweep_clear(s.name(), &|d| {
            foliokit::clear(d, s).expect("clear");
        });
    }
}

#[test]
fn unavailable_strategies_are_refused_not_faked() {
    for s in CopyStrategy::ALL
        .iter()
        .filter(|s| s.unavailable().is_some())
    {
        let (mut d, src) = ([0u8; 64], [1u8; 64]);
        assert!(foliokit::copy(&mut d, &src, *s).is_err(), "{s:?} ran");
        assert_eq!(d, [0u8; 64], "{s:?} wrote");
    }
    for s in ClearStrategy::ALL
        .iter()
        .filter(|s| s.unavailable().is_some())
    {
        let mut d = [1u8; 64];
        assert!(foliokit::clear(&mut d, *s).is_err(), "{s:?} ran");
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

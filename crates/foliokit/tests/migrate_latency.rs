//! First-folio latency means from the batch's start: a relocated batch's
//! first folio cannot be usable again before its bytes were copied.

mod common;

use foliokit::migrate::{migrate, MigrateOptions, Path};
use foliokit::{copy_folios, CopyOptions};
use std::time::Instant;

const FOLIO: usize = 2 << 20;

#[test]
fn a_relocated_folio_is_not_usable_before_it_was_copied() {
    if !common::relocation_available() {
        return;
    }
    let mut r = common::filled_region(FOLIO, 1, 7);
    let want = r.as_slice().to_vec();
    let o = MigrateOptions::default()
        .path(Path::Relocate)
        .channels(1)
        .batch_pages(FOLIO / 4096);
    let node = foliokit::mem::system::numa_nodes()[0];
    for round in 0..3 {
        // SAFETY: our own region; nothing else uses it meanwhile.
        let rep = unsafe { migrate(r.as_mut_ptr(), r.len(), node, &o) }.unwrap();
        assert_eq!(r.as_slice(), &want[..]);
        let strategy = rep.strategy.expect("relocation reports its copy");
        // The fastest this run copies one 2 MiB folio with that strategy,
        // hot, on the calling thread: the least any batch that copies one
        // can take.
        let mut dst = common::filled_region(FOLIO, 1, 9);
        let opts = CopyOptions::default().strategy(strategy);
        let copy_us = (0..5)
            .map(|_| {
                let t = Instant::now();
                copy_folios(dst.as_mut_slice(), r.as_slice(), FOLIO, opts).unwrap();
                t.elapsed().as_secs_f64() * 1e6
            })
            .fold(f64::INFINITY, f64::min);
        assert_eq!(rep.batches.len(), 1, "one batch of one folio");
        let first = rep.batches[0].first_folio_us;
        assert!(
            first >= copy_us,
            "round {round}: first folio usable after {first:.1} µs, but copying one 2 MiB folio takes at least {copy_us:.1} µs here"
        );
        assert!(first <= rep.batches[0].total_us);
    }
}

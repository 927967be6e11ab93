//! Copy channels: every byte lands (copies) or is zeroed (clears) whatever
//! the folio/channel ratio, the timings are ordered, and work a channel
//! refuses is finished on the CPU.

mod common;

use common::{filled_region, pattern};
use foliokit::arch::CopyFn;
use foliokit::channels::{Channel, ChannelError, ChannelPool, Completion, Op, Piece};
use foliokit::mem::Region;
use foliokit::CopyStrategy;
use std::sync::Arc;

const PAGE: usize = 4096;

fn copy_fn(s: CopyStrategy) -> CopyFn {
    s.function().expect("strategy available")
}

/// Copies `folios` folios of `folio` bytes with `pool`, checks every byte.
fn check(pool: &ChannelPool, folios: usize, folio: usize, s: CopyStrategy) {
    let src = filled_region(folio, folios, (folios * folio) as u64);
    let mut dst = Region::new(folio * folios, PAGE).unwrap();
    let d = dst.as_mut_ptr();
    // Reverse the pairing so a piece copied to the wrong place shows.
    let dsts: Vec<*mut u8> = (0..folios).map(|i| d.wrapping_add(i * folio)).collect();
    let srcs: Vec<*const u8> = (0..folios)
        .map(|i| src.as_ptr().wrapping_add((folios - 1 - i) * folio))
        .collect();
    // SAFETY: every folio is inside a live region; nothing else touches them.
    let t = unsafe { pool.copy_folios(&dsts, &srcs, folio, copy_fn(s)) };
    assert!(
        t.first_folio <= t.done,
        "first folio after the batch: {t:?}"
    );
    for i in 0..folios {
        let want = &src.as_slice()[(folios - 1 - i) * folio..][..folio];
        assert!(
            &dst.as_slice()[i * folio..][..folio] == want,
            "folio {i} of {folios} x {folio} ({s:?})"
        );
    }
}

#[test]
fn every_byte_lands_for_any_folio_to_channel_ratio() {
    for channels in [1, 2, 3, 5] {
        let pool = ChannelPool::cpu(channels).unwrap();
        assert_eq!(pool.len(), channels);
        // Fewer folios than channels (folios are split), equal, and more;
        // folio sizes that do and do not split into whole pages.
        for (folios, folio) in [
            (1, 64 * PAGE),
            (1, 3 * PAGE),
            (2, PAGE),
            (channels, 16 * PAGE),
            (7, 5 * PAGE),
        ] {
            for s in [CopyStrategy::Nt, CopyStrategy::Movsb] {
                check(&pool, folios, folio, s);
            }
        }
    }
    assert_eq!(ChannelPool::cpu(0).err(), Some(ChannelError::Zero));
}

/// Clears `folios` folios of `folio` bytes with `pool`; checks them and the
/// canary folio after the batch.
fn check_clear(pool: &ChannelPool, folios: usize, folio: usize) {
    let mut r = filled_region(folio, folios + 1, 9);
    let canary = r.as_slice()[folios * folio..].to_vec();
    let d = r.as_mut_ptr();
    let dsts: Vec<*mut u8> = (0..folios).map(|i| d.wrapping_add(i * folio)).collect();
    let clear = foliokit::ClearStrategy::Nt;
    let f = foliokit::arch::clear_primitive(clear, &foliokit::cpu::cpu().features)
        .unwrap_or(unsafe_zero);
    // SAFETY: every folio is inside the live region; nothing else touches it.
    let t = unsafe { pool.clear_folios(&dsts, folio, f) };
    assert!(t.first_folio <= t.done);
    assert!(
        r.as_slice()[..folios * folio].iter().all(|&b| b == 0),
        "{folios} x {folio} not zeroed"
    );
    assert!(
        r.as_slice()[folios * folio..] == canary[..],
        "cleared past the batch"
    );
}

/// A portable zero-fill for architectures without the x86 primitive.
fn unsafe_zero(p: *mut u8, n: usize) {
    // SAFETY: only called by the pool on a piece of a live region.
    unsafe { p.write_bytes(0, n) };
}

#[test]
fn clears_spread_across_channels_zero_exactly_the_batch() {
    for channels in [1, 2, 3] {
        let pool = ChannelPool::cpu(channels).unwrap();
        for (folios, folio) in [(1, 64 * PAGE), (1, 3 * PAGE), (5, 2 * PAGE)] {
            check_clear(&pool, folios, folio);
        }
    }
}

/// A channel that refuses all work, like a full hardware queue.
struct Refuses;

impl Channel for Refuses {
    fn name(&self) -> &str {
        "refuses"
    }

    fn submit(&self, _: Vec<Piece>, _: Op, _: Arc<Completion>) -> Result<(), ChannelError> {
        Err(ChannelError::Stopped("refuses".into()))
    }
}

#[test]
fn refused_work_is_finished_on_the_calling_thread() {
    let pool = ChannelPool::of(vec![
        Box::new(Refuses),
        Box::new(foliokit::channels::CpuChannel::new(0)),
        Box::new(Refuses),
    ])
    .unwrap();
    for (folios, folio) in [(1, 8 * PAGE), (6, 2 * PAGE)] {
        check(&pool, folios, folio, CopyStrategy::Nt);
    }
    assert!(ChannelPool::of(Vec::new()).is_err());
    // The pattern helper is what check() relies on to tell folios apart.
    assert_ne!(pattern(64, 1), pattern(64, 2));
}

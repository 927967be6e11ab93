//! Copy channels: every byte lands (copies) or is zeroed (clears) whatever
//! the folio/channel ratio, the timings are ordered, work a channel refuses
//! is finished on the CPU, bad batches are refused with typed errors before
//! any work, a piece counts once, and the shared pool survives `fork()`.

mod common;

use common::{filled_region, in_forked_child, pattern, PAGE};
use foliokit::channels::{shared, Channel, ChannelError, ChannelPool, Completion, Op, Piece};
use foliokit::mem::Region;
use foliokit::strategy::CopyFn;
use foliokit::tune::Shape;
use foliokit::{ClearStrategy, CopyStrategy, Reuse, StrategyError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn copy_fn(s: CopyStrategy) -> CopyFn {
    s.function().expect("strategy available")
}

/// The addresses of folio `i` of `folio` bytes from `base`, for each `i` of
/// `order` in turn.
fn folio_addrs(
    base: *const u8,
    order: impl IntoIterator<Item = usize>,
    folio: usize,
) -> Vec<*const u8> {
    order
        .into_iter()
        .map(|i| base.wrapping_add(i * folio))
        .collect()
}

/// [`folio_addrs`] of a destination.
fn folio_dsts(base: *mut u8, order: impl IntoIterator<Item = usize>, folio: usize) -> Vec<*mut u8> {
    folio_addrs(base, order, folio)
        .into_iter()
        .map(<*const u8>::cast_mut)
        .collect()
}

/// A test channel that handles its pieces one by one, in order, on the
/// submitting thread: [`Inline`] of it is the channel.
///
/// # Safety
/// Implementing it is the promise that `piece` keeps a channel's promises
/// for the one piece it is given ([`Channel::submit`]): it runs `op` on
/// that piece's ranges at most once, drains, and only then reports it.
unsafe trait OnCaller: Send + Sync {
    const NAME: &'static str;

    /// Handles piece `p` of a batch being submitted.
    ///
    /// # Safety
    /// [`Channel::submit`]'s contract for `p`.
    unsafe fn piece(&self, p: &Piece, op: Op, done: &Completion);
}

/// The channel of an [`OnCaller`].
struct Inline<T>(T);

// SAFETY: hands each piece once, in order, to `T::piece`, which keeps the
// promises (`OnCaller`'s contract) under the submit contract forwarded.
unsafe impl<T: OnCaller> Channel for Inline<T> {
    fn name(&self) -> &str {
        T::NAME
    }

    unsafe fn submit(
        &self,
        pieces: Vec<Piece>,
        op: Op,
        done: Arc<Completion>,
    ) -> Result<(), ChannelError> {
        for p in &pieces {
            // SAFETY: forwarded submit contract, for this piece.
            unsafe { self.0.piece(p, op, &done) };
        }
        Ok(())
    }
}

/// Copies `folios` folios of `folio` bytes with `pool`, checks every byte.
fn check(pool: &ChannelPool, folios: usize, folio: usize, s: CopyStrategy) {
    let src = filled_region(folio, folios, (folios * folio) as u64);
    let mut dst = Region::new(folio * folios, PAGE).unwrap();
    // Reverse the pairing so a piece copied to the wrong place shows.
    let dsts = folio_dsts(dst.as_mut_ptr(), 0..folios, folio);
    let srcs = folio_addrs(src.as_ptr(), (0..folios).rev(), folio);
    // SAFETY: every folio is inside a live region; nothing else touches them.
    let t = unsafe { pool.copy_folios(&dsts, &srcs, folio, copy_fn(s)) }.expect("copy batch");
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
    let dsts = folio_dsts(r.as_mut_ptr(), 0..folios, folio);
    let clear = foliokit::ClearStrategy::Nt;
    let f = clear.function().unwrap_or(unsafe_zero);
    // SAFETY: every folio is inside the live region; nothing else touches it.
    let t = unsafe { pool.clear_folios(&dsts, folio, f) }.expect("clear batch");
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

#[test]
fn refused_work_is_finished_on_the_calling_thread() {
    let pool = ChannelPool::of(vec![
        Box::new(Refuses::default()),
        Box::new(foliokit::channels::CpuChannel::new(0)),
        Box::new(Refuses::default()),
    ])
    .unwrap();
    for (folios, folio) in [(1, 8 * PAGE), (6, 2 * PAGE)] {
        check(&pool, folios, folio, CopyStrategy::Nt);
    }
    assert!(ChannelPool::of(Vec::new()).is_err());
    // The pattern helper is what check() relies on to tell folios apart.
    assert_ne!(pattern(64, 1), pattern(64, 2));
}

/// A piece a [`Recording`] ran: (dst, len, first folio, folios covered).
type Ran = (usize, usize, usize, usize);

/// A channel that runs its pieces on the submitting thread and records
/// them. Clones share the record.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<Ran>>>);

// SAFETY: runs the piece once, drains, then reports it.
unsafe impl OnCaller for Recording {
    const NAME: &'static str = "recording";

    unsafe fn piece(&self, p: &Piece, op: Op, done: &Completion) {
        // SAFETY: forwarded submit contract.
        unsafe { op.run(p) };
        foliokit::nt::drain();
        self.0
            .lock()
            .unwrap()
            .push((p.dst() as usize, p.len(), p.folio(), p.folios()));
        done.piece_done(p);
    }
}

#[test]
fn channels_get_contiguous_runs_with_the_first_folio_on_its_own() {
    let recs: Vec<Recording> = (0..3).map(|_| Recording::default()).collect();
    let pool = ChannelPool::of(
        recs.iter()
            .map(|r| Box::new(Inline(r.clone())) as Box<dyn Channel>)
            .collect(),
    )
    .unwrap();
    let (folios, folio) = (10, PAGE);
    let src = filled_region(folio, folios, 77);
    let mut dst = Region::new(folio * folios, PAGE).unwrap();
    let d = dst.as_mut_ptr();
    // Adjacent in both source and destination, except that folio 7's
    // destination is swapped with folio 8's: runs must break there.
    let mut order: Vec<usize> = (0..folios).collect();
    order.swap(7, 8);
    let dsts = folio_dsts(d, order.iter().copied(), folio);
    let srcs = folio_addrs(src.as_ptr(), 0..folios, folio);
    // SAFETY: every folio lies in a live region that nothing else touches.
    let t = unsafe { pool.copy_folios(&dsts, &srcs, folio, copy_fn(CopyStrategy::Movsb)) }.unwrap();
    assert!(t.first_folio <= t.done);
    for (f, &i) in order.iter().enumerate() {
        assert!(
            dst.as_slice()[i * folio..][..folio] == src.as_slice()[f * folio..][..folio],
            "folio {f}"
        );
    }
    // Shares 0..3, 3..6, 6..10: a single first folio, then merged runs.
    let got: Vec<Vec<(usize, usize)>> = recs
        .iter()
        .map(|r| {
            r.0.lock()
                .unwrap()
                .iter()
                .map(|&(_, _, f, n)| (f, n))
                .collect()
        })
        .collect();
    assert_eq!(got[0], [(0, 1), (1, 2)]);
    assert_eq!(got[1], [(3, 1), (4, 2)]);
    assert_eq!(got[2], [(6, 1), (7, 1), (8, 1), (9, 1)]);
    for r in &recs {
        for &(_, len, _, n) in r.0.lock().unwrap().iter() {
            assert_eq!(len, n * folio);
        }
    }
    // Clears merge too (their sources are null).
    let dsts = folio_dsts(d, 0..folios, folio);
    for r in &recs {
        r.0.lock().unwrap().clear();
    }
    // SAFETY: as above.
    unsafe { pool.clear_folios(&dsts, folio, unsafe_zero) }.unwrap();
    assert!(dst.as_slice().iter().all(|&b| b == 0));
    assert_eq!(recs[2].0.lock().unwrap().len(), 2, "6 alone, then 7..10");
}

/// A claiming channel that starts late: it sleeps before running what it
/// was offered, and counts the pieces it got to claim.
struct Late(Arc<AtomicUsize>);

// SAFETY: runs a piece only after claiming it, once, with the given op,
// drains, then reports it.
unsafe impl Channel for Late {
    fn name(&self) -> &str {
        "late"
    }

    fn claims_pieces(&self) -> bool {
        true
    }

    unsafe fn submit(
        &self,
        pieces: Vec<Piece>,
        op: Op,
        done: Arc<Completion>,
    ) -> Result<(), ChannelError> {
        let ran = self.0.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            for p in &pieces {
                if !done.claim(p) {
                    continue;
                }
                // SAFETY: forwarded submit contract; claimed, so ours alone.
                unsafe { op.run(p) };
                foliokit::nt::drain();
                ran.fetch_add(1, Ordering::Relaxed);
                done.piece_done(p);
            }
        });
        Ok(())
    }
}

#[test]
fn an_idle_channel_takes_over_a_late_ones_share() {
    let ran = Arc::new(AtomicUsize::new(0));
    let pool = ChannelPool::of(vec![
        Box::new(foliokit::channels::CpuChannel::new(0)),
        Box::new(Late(ran.clone())),
    ])
    .unwrap();
    // 64 folios paired in reverse, so none merge: 32 pieces per share.
    check(&pool, 64, PAGE, CopyStrategy::Movsb);
    assert!(
        ran.load(Ordering::Relaxed) < 32,
        "the CPU channel took none of the late channel's share"
    );
}

/// A channel that refuses all work, like a full hardware queue, and counts
/// the batches it was offered (a pool that reached it still finishes the
/// work on the CPU).
#[derive(Default)]
struct Refuses(Arc<AtomicUsize>);

// SAFETY: refuses every batch and touches no piece.
unsafe impl Channel for Refuses {
    fn name(&self) -> &str {
        "refuses"
    }

    unsafe fn submit(&self, _: Vec<Piece>, _: Op, _: Arc<Completion>) -> Result<(), ChannelError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Err(ChannelError::Stopped("refuses".into()))
    }
}

/// Bad batch shapes are refused with a typed error before any channel is
/// offered work, and leave the destination untouched.
#[test]
fn bad_batches_are_refused_before_any_work() {
    let offered = Arc::new(AtomicUsize::new(0));
    let spy = ChannelPool::of(vec![
        Box::new(Refuses(offered.clone())),
        Box::new(Refuses(offered.clone())),
    ])
    .unwrap();
    let cpu = ChannelPool::cpu(2).unwrap();
    let folio = 2 * PAGE;
    let src = filled_region(folio, 2, 1);
    let mut dst = filled_region(folio, 2, 2);
    let before = dst.as_slice().to_vec();
    let d = dst.as_mut_ptr();
    let dsts = [d, d.wrapping_add(folio)];
    let srcs = [src.as_ptr(), src.as_ptr().wrapping_add(folio)];
    let copy = copy_fn(CopyStrategy::Libc);
    let clear = foliokit::ClearStrategy::Libc.function().unwrap();
    for pool in [&spy, &cpu] {
        // SAFETY: every range named is inside a live region that nothing
        // else touches; the calls must refuse before touching any of it.
        unsafe {
            assert_eq!(
                pool.copy_folios(&dsts, &srcs, 0, copy),
                Err(ChannelError::ZeroFolio)
            );
            assert_eq!(
                pool.clear_folios(&dsts, 0, clear),
                Err(ChannelError::ZeroFolio)
            );
            // Empty lists with a zero folio size: refused, not a division.
            assert_eq!(
                pool.copy_folios(&[], &[], 0, copy),
                Err(ChannelError::ZeroFolio)
            );
            assert_eq!(
                pool.clear_folios(&[], 0, clear),
                Err(ChannelError::ZeroFolio)
            );
            assert_eq!(
                pool.copy_folios(&dsts, &srcs[..1], folio, copy),
                Err(ChannelError::LengthMismatch { dsts: 2, srcs: 1 })
            );
            assert_eq!(
                pool.copy_folios(&dsts[..1], &srcs, folio, copy),
                Err(ChannelError::LengthMismatch { dsts: 1, srcs: 2 })
            );
        }
    }
    assert_eq!(
        offered.load(Ordering::Relaxed),
        0,
        "a channel was offered work"
    );
    assert!(dst.as_slice() == &before[..], "a refused batch wrote");
    // An empty batch of a valid size is fine and does nothing.
    // SAFETY: no ranges.
    assert!(unsafe { cpu.copy_folios(&[], &[], folio, copy) }.is_ok());
}

/// `auto` is a choice per request shape, not a function: asking it for one
/// is a typed error (resolve it first), never a panic.
#[test]
fn auto_has_no_function_until_resolved() {
    assert_eq!(
        CopyStrategy::Auto.function().err(),
        Some(StrategyError::Unresolved { op: "copy" })
    );
    assert_eq!(
        ClearStrategy::Auto.function().err(),
        Some(StrategyError::Unresolved { op: "clear" })
    );
    let e = CopyStrategy::Auto.function().unwrap_err().to_string();
    assert!(e.contains("resolve()"), "{e}");
    let shape = Shape::batch(2 << 20, 4, Reuse::Reread);
    assert!(CopyStrategy::Auto.resolve(shape).function().is_ok());
    assert!(ClearStrategy::Auto.resolve(shape).function().is_ok());
    // Butterfly has no range function: refused, never replaced.
    assert!(matches!(
        ClearStrategy::Butterfly.function(),
        Err(StrategyError::Unavailable { .. })
    ));
}

/// What a channel's `piece_done` calls returned, in order.
type Reports = Arc<Mutex<Vec<bool>>>;

/// A channel that does its work, then reports every piece twice and a piece
/// it made up: only the first report of each real piece may count, or it
/// could end the batch while another channel is still writing.
struct ReportsTwice(Reports);

// SAFETY: runs the piece once and drains before reporting; the repeat
// report is what the test checks is ignored.
unsafe impl OnCaller for ReportsTwice {
    const NAME: &'static str = "reports-twice";

    unsafe fn piece(&self, p: &Piece, op: Op, done: &Completion) {
        let mut seen = self.0.lock().unwrap();
        // SAFETY: the pool's contract: the piece is valid until reported.
        unsafe { op.run(p) };
        foliokit::nt::drain();
        seen.push(done.piece_done(p));
        seen.push(done.piece_done(p));
        // SAFETY: this piece is never run or submitted.
        let forged = unsafe { Piece::new(p.dst(), p.src(), p.len(), p.folio()) };
        seen.push(done.piece_done(&forged));
    }
}

#[test]
fn pieces_count_once_and_only_for_their_own_batch() {
    let reports: Reports = Arc::default();
    let pool = ChannelPool::of(vec![
        Box::new(Inline(ReportsTwice(reports.clone()))),
        Box::new(foliokit::channels::CpuChannel::new(0)),
    ])
    .unwrap();
    for (folios, folio) in [(1, 8 * PAGE), (6, 2 * PAGE)] {
        check(&pool, folios, folio, CopyStrategy::Libc);
    }
    let seen = reports.lock().unwrap();
    assert!(!seen.is_empty());
    for r in seen.chunks(3) {
        assert_eq!(
            r,
            [true, false, false],
            "first report counts, repeats and forgeries do not"
        );
    }
}

/// Runs the fork test `name` in a fresh process, so that no other test's
/// threads are forked mid-lock, handing `body` a source of `folios` folios
/// of `folio` bytes filled from `seed` and a destination like it, for
/// [`copies_through`].
fn fork_test(
    name: &str,
    folio: usize,
    folios: usize,
    seed: u64,
    body: impl FnOnce(Region, Region),
) {
    common::in_child(name, Duration::from_secs(60), || {
        let src = filled_region(folio, folios, seed);
        let dst = Region::new(src.len(), folio).unwrap();
        body(src, dst)
    });
}

/// Copies `src` into `dst` (equal, whole folios) through `pool`, returning
/// whether every byte arrived. Used in a forked child: no panics, no output.
fn copies_through(pool: &ChannelPool, dst: &mut Region, src: &Region, folio: usize) -> bool {
    dst.as_mut_slice().fill(0);
    let n = src.len() / folio;
    let dsts = folio_dsts(dst.as_mut_ptr(), 0..n, folio);
    let srcs = folio_addrs(src.as_ptr(), 0..n, folio);
    let Ok(copy) = CopyStrategy::Libc.function() else {
        return false;
    };
    // SAFETY: the folios lie inside two live, disjoint regions that nothing
    // else touches until the pool returns.
    let ok = unsafe { pool.copy_folios(&dsts, &srcs, folio, copy) }.is_ok();
    ok && dst.as_slice() == src.as_slice()
}

/// A child forked after the shared pool was used gets a pool with live
/// workers; a pool inherited from the parent still finishes its batches
/// (on the calling thread) instead of queueing them for threads that do
/// not exist, and can be dropped there.
#[test]
fn shared_pool_works_after_fork() {
    let folio = 4 * PAGE;
    fork_test(
        "shared_pool_works_after_fork",
        folio,
        4,
        11,
        |src, mut dst| {
            let inherited = shared(2).unwrap();
            assert!(
                copies_through(&inherited, &mut dst, &src, folio),
                "parent copy"
            );
            let own = ChannelPool::cpu(2).unwrap();
            assert!(copies_through(&own, &mut dst, &src, folio), "parent copy");
            let (dst_ref, src_ref, inherited_ref) = (&mut dst, &src, &inherited);
            in_forked_child(move || {
                let Ok(fresh) = shared(2) else { return false };
                let ok = !Arc::ptr_eq(&fresh, inherited_ref)
                    && copies_through(&fresh, dst_ref, src_ref, folio)
                    && copies_through(inherited_ref, dst_ref, src_ref, folio)
                    && copies_through(&own, dst_ref, src_ref, folio);
                // Dropping a pool made before the fork must not join
                // workers that do not exist here.
                drop(own);
                ok
            });
            // The parent's pool is unaffected.
            assert!(Arc::ptr_eq(&shared(2).unwrap(), &inherited));
            assert!(
                copies_through(&inherited, &mut dst, &src, folio),
                "parent copy after fork"
            );
        },
    );
}

/// A thread forks while another holds the locks of the shared pools and of
/// the helpers: the child must not wait for a lock whose holder it does not
/// have, and gets pools and helpers of its own.
#[test]
fn fork_while_another_thread_holds_the_pool_lock() {
    let folio = 2 * PAGE;
    fork_test(
        "fork_while_another_thread_holds_the_pool_lock",
        folio,
        2,
        12,
        |src, mut dst| {
            assert!(copies_through(&shared(2).unwrap(), &mut dst, &src, folio));
            foliokit::channels::hold_shared_lock(|| {
                std::thread::scope(|s| {
                    s.spawn(|| {
                        in_forked_child(|| {
                            let Ok(mut r) = Region::unpopulated(4 << 20, PAGE) else {
                                return false;
                            };
                            shared(2).is_ok_and(|p| copies_through(&p, &mut dst, &src, folio))
                                && foliokit::mem::populate(r.as_mut_slice(), 3).is_ok()
                        })
                    })
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e))
                })
            });
        },
    );
}

/// A channel like a hardware engine that faults halfway through every
/// piece: it copies the first half, drains, and reports the piece failed.
struct FailsHalf;

// SAFETY: runs the first half of the piece once, drains, then reports it
// failed with that count.
unsafe impl OnCaller for FailsHalf {
    const NAME: &'static str = "fails-half";

    unsafe fn piece(&self, p: &Piece, op: Op, done: &Completion) {
        let half = p.len() / 2;
        // SAFETY: the first half of a piece we were given (submit
        // contract); run once, not touched after it is reported.
        unsafe {
            let part = Piece::new(p.dst(), p.src(), half, p.folio());
            op.run(&part);
        }
        foliokit::nt::drain();
        done.piece_failed(p, half);
    }
}

/// (source, destination, destination folio pointers, source pointers).
fn batch_buffers(folios: usize, folio: usize) -> (Region, Region, Vec<*mut u8>, Vec<*const u8>) {
    let src = filled_region(folio, folios, 99);
    let mut dst = Region::new(folio * folios, PAGE).unwrap();
    let dsts = folio_dsts(dst.as_mut_ptr(), 0..folios, folio);
    let srcs = folio_addrs(src.as_ptr(), 0..folios, folio);
    (src, dst, dsts, srcs)
}

#[test]
fn a_submitted_batch_reports_folios_as_they_finish_and_can_be_polled() {
    let pool = ChannelPool::cpu(2).unwrap();
    let (folios, folio) = (64, 64 * PAGE);
    let (src, dst, dsts, srcs) = batch_buffers(folios, folio);
    // SAFETY: live regions, disjoint folios; the handle is waited for
    // before the regions are read or dropped.
    let mut batch =
        unsafe { pool.submit_copy(&dsts, &srcs, folio, copy_fn(CopyStrategy::Movsb)) }.unwrap();
    assert_eq!(batch.folios(), folios);
    assert!(!batch.folio_done(folios), "out of range is never done");
    let outcome = loop {
        if let Some(o) = batch.try_wait() {
            break o;
        }
        std::thread::yield_now();
    };
    assert!(outcome.failed.is_empty());
    assert!(outcome.timing.first_folio <= outcome.timing.done);
    assert!((0..folios).all(|i| batch.folio_done(i)));
    assert_eq!(batch.try_wait(), Some(outcome.clone()), "the outcome stays");
    assert_eq!(batch.wait(), outcome);
    assert!(dst.as_slice() == src.as_slice());
}

#[test]
fn dropping_a_batch_waits_for_it() {
    let pool = ChannelPool::cpu(2).unwrap();
    let (folios, folio) = (32, 512 * PAGE);
    let (src, dst, dsts, srcs) = batch_buffers(folios, folio);
    // SAFETY: as above; the handle is dropped at once, which waits.
    // (Typed with the handle's old name, which code written against it
    // still uses.)
    let batch: foliokit::channels::Batch<'_> =
        unsafe { pool.submit_copy(&dsts, &srcs, folio, copy_fn(CopyStrategy::Movsb)) }.unwrap();
    drop(batch);
    assert!(
        dst.as_slice() == src.as_slice(),
        "every byte landed before drop returned"
    );
}

#[test]
fn a_failed_piece_is_reported_with_what_it_copied_and_the_blocking_call_finishes_it() {
    let pool = ChannelPool::of(vec![Box::new(Inline(FailsHalf))]).unwrap();
    let (folios, folio) = (4, 16 * PAGE);
    let (src, mut dst, dsts, srcs) = batch_buffers(folios, folio);
    // SAFETY: as above.
    let batch =
        unsafe { pool.submit_copy(&dsts, &srcs, folio, copy_fn(CopyStrategy::Movsb)) }.unwrap();
    let outcome = batch.wait();
    // One channel: the first folio on its own, the rest as one run.
    assert_eq!(outcome.failed.len(), 2, "{:?}", outcome.failed);
    assert_eq!((outcome.failed[0].folio, outcome.failed[0].folios), (0, 1));
    assert_eq!((outcome.failed[1].folio, outcome.failed[1].folios), (1, 3));
    let mut at = 0;
    for f in &outcome.failed {
        assert_eq!(f.copied, f.len / 2);
        let (s, d) = (
            &src.as_slice()[at..][..f.len],
            &dst.as_slice()[at..][..f.len],
        );
        assert!(d[..f.copied] == s[..f.copied], "the copied half landed");
        assert!(d[f.copied..].iter().all(|&b| b == 0), "nothing past it");
        at += f.len;
    }
    dst.as_mut_slice().fill(0);
    // The blocking call finishes the failed halves on this thread: every
    // byte copied exactly once (the channel's halves plus the rest), which
    // a counting copy function shows; re-running a whole piece would not.
    COUNTED.store(0, Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { pool.copy_folios(&dsts, &srcs, folio, counting_copy) }.unwrap();
    assert!(dst.as_slice() == src.as_slice());
    assert_eq!(
        COUNTED.load(Ordering::SeqCst),
        folios * folio,
        "bytes copied"
    );
}

/// Bytes [`counting_copy`] copied.
static COUNTED: AtomicUsize = AtomicUsize::new(0);

/// A copy that counts its bytes.
///
/// # Safety
/// As `ptr::copy_nonoverlapping`.
unsafe fn counting_copy(dst: *mut u8, src: *const u8, len: usize) {
    COUNTED.fetch_add(len, Ordering::SeqCst);
    // SAFETY: forwarded contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[test]
fn a_submitted_batch_with_lists_of_different_lengths_is_refused() {
    let pool = ChannelPool::cpu(1).unwrap();
    let (_src, _dst, dsts, srcs) = batch_buffers(2, PAGE);
    // SAFETY: refused before anything is touched.
    let r = unsafe { pool.submit_copy(&dsts, &srcs[..1], PAGE, copy_fn(CopyStrategy::Movsb)) };
    assert!(matches!(
        r.err(),
        Some(ChannelError::LengthMismatch { dsts: 2, srcs: 1 })
    ));
}

/// Threads that ran [`recording_copy`].
static RAN_ON: Mutex<Vec<std::thread::ThreadId>> = Mutex::new(Vec::new());

/// A copy that notes which thread ran it.
///
/// # Safety
/// As any copy: both ranges valid for `len` bytes and disjoint.
unsafe fn recording_copy(dst: *mut u8, src: *const u8, len: usize) {
    RAN_ON.lock().unwrap().push(std::thread::current().id());
    // SAFETY: forwarded contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[test]
fn small_blocking_batches_stay_on_the_calling_thread() {
    let min = foliokit::tune::CHANNEL_MIN_BATCH_BYTES;
    let pool = ChannelPool::cpu(2).unwrap();
    let me = std::thread::current().id();
    for (folios, inline) in [(min / PAGE - 1, true), (min / PAGE, false)] {
        let src = filled_region(PAGE, folios, folios as u64);
        let mut dst = Region::new(PAGE * folios, PAGE).unwrap();
        let dsts = folio_dsts(dst.as_mut_ptr(), 0..folios, PAGE);
        let srcs = folio_addrs(src.as_ptr(), 0..folios, PAGE);
        RAN_ON.lock().unwrap().clear();
        // SAFETY: every folio is inside a live region; nothing else touches them.
        let t = unsafe { pool.copy_folios(&dsts, &srcs, PAGE, recording_copy) }.unwrap();
        assert!(t.first_folio <= t.done);
        assert_eq!(dst.as_slice(), src.as_slice(), "{folios} folios");
        let ran = RAN_ON.lock().unwrap().clone();
        assert!(!ran.is_empty());
        if inline {
            assert!(
                ran.iter().all(|&t| t == me),
                "a small batch went to the workers"
            );
        } else {
            assert!(
                ran.iter().all(|&t| t != me),
                "a batch of {min} bytes stayed on the caller"
            );
        }
    }
}

/// The pool [`nesting_copy`] copies through again, and the threads it
/// ran on.
static NEST: Mutex<Option<(Arc<ChannelPool>, Vec<std::thread::ThreadId>)>> = Mutex::new(None);

/// A copy that copies its piece again through [`NEST`]'s pool: a caller's
/// copy function that itself uses channels.
///
/// # Safety
/// As any copy: both ranges valid for `len` bytes and disjoint.
unsafe fn nesting_copy(dst: *mut u8, src: *const u8, len: usize) {
    let pool = {
        let mut nest = NEST.lock().unwrap();
        let (pool, ran) = nest.as_mut().expect("set by the test");
        ran.push(std::thread::current().id());
        pool.clone()
    };
    // SAFETY: forwarded contract, for one folio of `len` bytes.
    unsafe { pool.copy_folios(&[dst], &[src], len, copy_fn(CopyStrategy::Libc)) }.unwrap();
}

#[test]
fn a_batch_started_on_a_channels_worker_runs_there_instead_of_waiting_for_it() {
    // One channel: the inner batch (big enough to go to the workers) could
    // only be queued to the very worker that waits for it.
    let pool = Arc::new(ChannelPool::cpu(1).unwrap());
    *NEST.lock().unwrap() = Some((pool.clone(), Vec::new()));
    let len = 2 * foliokit::tune::CHANNEL_MIN_BATCH_BYTES;
    let src = filled_region(len, 1, 7);
    let mut dst = Region::new(len, PAGE).unwrap();
    let (d, s) = (dst.as_mut_ptr() as usize, src.as_ptr() as usize);
    let (tx, rx) = std::sync::mpsc::channel();
    let p = pool.clone();
    std::thread::spawn(move || {
        // SAFETY: one folio inside live regions that outlive the wait
        // below (on a timeout the test fails with the thread still in it,
        // and the process ends).
        let r = unsafe { p.copy_folios(&[d as *mut u8], &[s as *const u8], len, nesting_copy) };
        let _ = tx.send(r.is_ok());
    });
    let ok = rx.recv_timeout(Duration::from_secs(60));
    assert_eq!(ok, Ok(true), "the nested batch waited for its own worker");
    assert_eq!(dst.as_slice(), src.as_slice());
    let ran = NEST.lock().unwrap().take().unwrap().1;
    assert_eq!(ran.len(), 1);
    assert_ne!(ran[0], std::thread::current().id(), "ran on the worker");
}

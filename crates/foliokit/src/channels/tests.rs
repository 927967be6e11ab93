//! The pool's batches end as their callers' policies say, with real CPU
//! channels: cut short by the caller or by the channels, posting their
//! end, and never waiting for a channel held up elsewhere.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{ChannelPool, InFlight, Policy};

/// Set while [`held_copy`] keeps its worker; set to false to let go.
static HOLD: AtomicBool = AtomicBool::new(false);
static HELD: AtomicBool = AtomicBool::new(false);
/// Taken by each test that holds a worker with [`held_copy`].
static HOLDING: Mutex<()> = Mutex::new(());

/// Holds `pool`'s one channel with a copy of `src` into `dst` until
/// [`HOLD`] is cleared.
fn hold<'p>(pool: &'p ChannelPool, dst: &mut [u8], src: &[u8]) -> InFlight<'p> {
    HELD.store(false, Ordering::SeqCst);
    HOLD.store(true, Ordering::SeqCst);
    // SAFETY: the caller keeps both buffers until the handle is waited
    // for.
    let other =
        unsafe { pool.submit_copy(&[dst.as_mut_ptr()], &[src.as_ptr()], src.len(), held_copy) }
            .unwrap();
    while !HELD.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    other
}

/// A copy that holds its thread until [`HOLD`] is cleared, as a copy
/// from a page relocation has out waits for relocation.
///
/// # Safety
/// As any copy: both ranges valid for `len` bytes and disjoint.
unsafe fn held_copy(dst: *mut u8, src: *const u8, len: usize) {
    HELD.store(true, Ordering::SeqCst);
    while HOLD.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: forwarded contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// # Safety
/// As any copy.
unsafe fn plain_copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[test]
fn a_caller_that_must_not_wait_runs_the_pieces_of_a_channel_held_up_elsewhere() {
    let _one = HOLDING.lock().unwrap_or_else(|p| p.into_inner());
    // One channel, held by another batch's copy: the caller's batch (big
    // enough for the workers) is queued behind it, and its policy (as
    // relocation's) says not to wait for a stalled channel.
    let pool = ChannelPool::cpu(1).unwrap();
    let len = 2 * crate::params::CHANNEL_MIN_BATCH_BYTES;
    let (a_src, mut a_dst) = (vec![1u8; PAGE_BYTES], vec![0u8; PAGE_BYTES]);
    let (src, mut dst) = (vec![7u8; len], vec![0u8; len]);
    let other = hold(&pool, &mut a_dst, &a_src);
    let (d, s) = (dst.as_mut_ptr() as usize, src.as_ptr() as usize);
    let (tx, rx) = std::sync::mpsc::channel();
    let ran = std::thread::scope(|scope| {
        let pool = &pool;
        scope.spawn(move || {
            let policy = Policy::default().run_unstarted_after(crate::params::CHANNEL_STALL);
            // SAFETY: one folio inside live vectors, untouched until the
            // scope ends.
            let ran = unsafe {
                pool.copy_folios_with(&[d as *mut u8], &[s as *const u8], len, plain_copy, policy)
            };
            let _ = tx.send(ran.is_ok());
        });
        // Without the caller's own run it would wait for the held channel:
        // let go after a while either way, so a failure ends.
        let ran = rx.recv_timeout(Duration::from_secs(30));
        HOLD.store(false, Ordering::SeqCst);
        ran
    });
    other.wait();
    assert_eq!(ran, Ok(true), "the caller waited for the held channel");
    assert!(dst == src && a_dst == a_src);
}

#[test]
fn a_batch_cut_short_gives_back_its_unstarted_pieces_and_posts_its_end() {
    use std::os::fd::AsRawFd;
    let _one = HOLDING.lock().unwrap_or_else(|p| p.into_inner());
    let pool = ChannelPool::cpu(1).unwrap();
    let (a_src, mut a_dst) = (vec![1u8; PAGE_BYTES], vec![0u8; PAGE_BYTES]);
    let other = hold(&pool, &mut a_dst, &a_src);
    // Lets the held copy go however this test ends (before `other` is
    // dropped, which waits for it): a failed check fails, never hangs.
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            HOLD.store(false, Ordering::SeqCst);
        }
    }
    let release = Release;
    // Queued behind the held copy: no piece of it can have started.
    let folio = 64 << 10;
    let src = vec![7u8; 4 * folio];
    let mut dst = vec![0u8; 4 * folio];
    let dsts: Vec<*mut u8> = (0..4).map(|i| dst[i * folio..].as_mut_ptr()).collect();
    let srcs: Vec<*const u8> = (0..4).map(|i| src[i * folio..].as_ptr()).collect();
    let ended = crate::sys::event::Event::new().unwrap();
    let policy = Policy::default().post_end(ended.try_clone().unwrap());
    // SAFETY: both vectors outlive the handle, waited for below; plain
    // memory, nothing can fault.
    let mut cut =
        unsafe { pool.submit_copy_mc_with(&dsts, &srcs, folio, counting_copy, policy) }.unwrap();
    assert!(cut.try_wait().is_none());
    assert!(cut.cut() > 0);
    assert!(cut.cut_at().is_some());
    // Ends without the held channel, which never runs a piece of it.
    let out = cut.wait_in_place();
    assert!(out.failed.is_empty());
    assert!((0..4).all(|i| !cut.folio_done(i)));
    let [posted] = crate::sys::poll::readable([ended.as_raw_fd()], Some(Duration::ZERO));
    assert!(posted, "the end was not posted");
    assert_eq!(cut.cut(), 0);
    drop(cut);
    drop(release);
    other.wait();
    assert!(dst.iter().all(|&b| b == 0), "a withdrawn piece ran");
    assert_eq!(a_dst, a_src);
}

#[test]
fn an_empty_batch_posts_its_end_at_once() {
    use std::os::fd::AsRawFd;
    let pool = ChannelPool::cpu(1).unwrap();
    let ended = crate::sys::event::Event::new().unwrap();
    let policy = Policy::default().post_end(ended.try_clone().unwrap());
    // SAFETY: no folios: nothing is touched.
    let mut b = unsafe { pool.submit_copy_mc_with(&[], &[], 4096, counting_copy, policy) }.unwrap();
    assert!(b.try_wait().is_some());
    let [posted] = crate::sys::poll::readable([ended.as_raw_fd()], Some(Duration::ZERO));
    assert!(posted, "an empty batch's end was not posted");
}

/// Set by [`cutting_copy`]: the cut test of the batch below reads it.
static CUT: AtomicBool = AtomicBool::new(false);

/// An mc copy (it returns the bytes it did not copy: none) that makes
/// the cut test answer yes.
///
/// # Safety
/// As any copy.
unsafe fn cutting_copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
    // SAFETY: forwarded contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    CUT.store(true, Ordering::SeqCst);
    0
}

#[test]
fn a_channel_whose_cut_test_says_so_stops_at_the_next_folio() {
    let _one = HOLDING.lock().unwrap_or_else(|p| p.into_inner());
    CUT.store(false, Ordering::SeqCst);
    // One channel: it runs the first folio's piece, whose copy makes
    // the test answer yes, and must start no other. Adjacent folios,
    // which an uncut batch would merge into one piece.
    let pool = ChannelPool::cpu(1).unwrap();
    let folio = 64 << 10;
    let src = vec![7u8; 4 * folio];
    let mut dst = vec![0u8; 4 * folio];
    let dsts: Vec<*mut u8> = (0..4).map(|i| dst[i * folio..].as_mut_ptr()).collect();
    let srcs: Vec<*const u8> = (0..4).map(|i| src[i * folio..].as_ptr()).collect();
    let policy = Policy::default().cut_when(|| CUT.load(Ordering::SeqCst));
    // SAFETY: both vectors outlive the handle, waited for below; the
    // sources are plain memory (nothing can fault).
    let mut b =
        unsafe { pool.submit_copy_mc_with(&dsts, &srcs, folio, cutting_copy, policy) }.unwrap();
    let out = b.wait_in_place();
    assert!(out.failed.is_empty());
    assert!(b.cut_at().is_some());
    assert!(b.folio_done(0));
    assert!(
        (1..4).all(|i| !b.folio_done(i)),
        "a piece ran after the cut"
    );
    drop(b);
    assert!(dst[..folio].iter().all(|&x| x == 7));
    assert!(
        dst[folio..].iter().all(|&x| x == 0),
        "a withdrawn piece ran"
    );
}

/// Pieces [`counting_copy`] ran; the cut test of the batch below
/// answers yes from [`CUT_AFTER`] of them on.
static RAN: AtomicUsize = AtomicUsize::new(0);
static CUT_AFTER: AtomicUsize = AtomicUsize::new(0);

/// An mc copy that counts its runs.
///
/// # Safety
/// As any copy.
unsafe fn counting_copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
    // SAFETY: forwarded contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    RAN.fetch_add(1, Ordering::SeqCst);
    0
}

#[test]
fn a_folio_is_done_exactly_when_copied_however_channels_and_caller_cut() {
    let _one = HOLDING.lock().unwrap_or_else(|p| p.into_inner());
    // Two channels cut by their test after k pieces while the caller
    // cuts too, at some point: whatever interleaving results, a folio
    // reported done holds every byte, and one not done holds none (a
    // withdrawn piece never ran, a started one finished).
    let pool = ChannelPool::cpu(2).unwrap();
    let (folio, n) = (crate::params::CHANNEL_CUT_PIECE_BYTES, 12);
    let src: Vec<u8> = (0..n * folio).map(|i| (i % 251) as u8 + 1).collect();
    let mut dst = vec![0u8; n * folio];
    for k in 0..n {
        RAN.store(0, Ordering::SeqCst);
        CUT_AFTER.store(k, Ordering::SeqCst);
        dst.fill(0);
        let dsts: Vec<*mut u8> = (0..n).map(|i| dst[i * folio..].as_mut_ptr()).collect();
        let srcs: Vec<*const u8> = (0..n).map(|i| src[i * folio..].as_ptr()).collect();
        let due = || RAN.load(Ordering::SeqCst) >= CUT_AFTER.load(Ordering::SeqCst);
        let policy = Policy::default().cut_when(due);
        // SAFETY: both vectors outlive the handle, waited for below;
        // plain memory, nothing can fault.
        let mut b = unsafe { pool.submit_copy_mc_with(&dsts, &srcs, folio, counting_copy, policy) }
            .unwrap();
        if k % 2 == 1 {
            while RAN.load(Ordering::SeqCst) < k / 2 && b.try_wait().is_none() {
                std::hint::spin_loop();
            }
            b.cut();
        }
        let out = b.wait_in_place();
        assert!(out.failed.is_empty());
        let done: Vec<bool> = (0..n).map(|i| b.folio_done(i)).collect();
        // One piece per folio at this size: each ran piece is a folio.
        assert_eq!(
            done.iter().filter(|&&d| d).count(),
            RAN.load(Ordering::SeqCst)
        );
        drop(b);
        for (i, d) in done.iter().enumerate() {
            let (got, want) = (&dst[i * folio..][..folio], &src[i * folio..][..folio]);
            if *d {
                assert!(got == want, "k={k}: folio {i} done but not copied");
            } else {
                assert!(
                    got.iter().all(|&x| x == 0),
                    "k={k}: folio {i} copied but not done"
                );
            }
        }
    }
}

const PAGE_BYTES: usize = 4096;

//! The application's `madvise` while migration runs, on both paths: advice
//! that frees, reclaims, collapses or populates pages of the batch in
//! flight (`docs/migration.md`, "advice during a relocation", has the
//! table these tests check).
//!
//! 1. `MADV_FREE` of runs (often the batch in flight), `MADV_PAGEOUT` of
//!    some freed runs, and re-writes of freed pages: every page ends with
//!    its last write, or reads zero only where it was freed and not
//!    written since;
//! 2. `MADV_COLD`/`MADV_PAGEOUT` of written (not freed) pages: no page
//!    changes;
//! 3. `MADV_POPULATE_READ`/`MADV_POPULATE_WRITE` over the batch in flight
//!    and over never-touched pages: they wait and succeed, nothing changes,
//!    the populated pages read zero;
//! 4. `MADV_COLLAPSE` aimed at the batch in flight: refused only with the
//!    errnos the contract names, and a retry once `migrate` returned
//!    collapses; no page changes.
//!
//! Each runs in its own process ([`common::in_child`]).

#[macro_use]
mod common;

use common::{fill_page, node, page_is, word, MIB, PAGE, RUN, THP};
use foliokit::mem::Region;
use foliokit::migrate::{migrate, MigrateOptions, MigratePath, MigrateReport, Path};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::thread;
use std::time::{Duration, Instant};

on_both_paths!(free_pageout_rewrite => relocate_free_pageout_rewrite, kernel_free_pageout_rewrite);
on_both_paths!(cold_and_pageout_keep_data => relocate_cold_and_pageout_keep_data, kernel_cold_and_pageout_keep_data);
on_both_paths!(populate_over_batches => relocate_populate_over_batches, kernel_populate_over_batches);
on_both_paths!(collapse_batch_in_flight => relocate_collapse_batch_in_flight, kernel_collapse_batch_in_flight);

// ---------------------------------------------------------------------------
// Shared pieces

const MADV_POPULATE_READ: libc::c_int = 22;
const MADV_POPULATE_WRITE: libc::c_int = 23;

fn opts(path: Path) -> MigrateOptions {
    common::opts(path, 512)
}

/// Migrates `[addr, addr + len)` once; panics unless it took `path` and
/// covered the range.
fn call(addr: usize, len: usize, path: Path) -> MigrateReport {
    // SAFETY: every caller passes a private anonymous mapping the test made
    // and keeps for the call; none of it is vmspliced or handed to a driver.
    let rep = unsafe { migrate(addr as *mut u8, len, node(), &opts(path)) }
        .unwrap_or_else(|e| panic!("migrate on the {path:?} path failed: {e} ({e:?})"));
    let want = match path {
        Path::Relocate => MigratePath::Relocate,
        _ => MigratePath::Kernel,
    };
    assert_eq!(rep.path, want, "migrate took another path: {:?}", rep.notes);
    rep
}

/// What the migrate loop saw.
#[derive(Debug, Default)]
struct Tally {
    calls: usize,
    relocated_pages: usize,
    dropped_pages: usize,
    /// Notes of calls whose relocation stopped early (each a symptom).
    stopped: Vec<String>,
}

impl Tally {
    fn add(&mut self, rep: &MigrateReport) {
        self.calls += 1;
        self.relocated_pages += rep.relocated_pages;
        self.dropped_pages += rep.dropped_pages;
        self.stopped.extend(
            rep.notes
                .iter()
                .filter(|n| n.contains("relocation stopped"))
                .cloned(),
        );
    }

    fn finish(&self, path: Path, what: &str) {
        println!(
            "NOTE: {what}: {} calls, {} pages relocated, {} dropped, {} stopped early",
            self.calls,
            self.relocated_pages,
            self.dropped_pages,
            self.stopped.len()
        );
        assert!(self.calls > 0, "{what}: no migration completed");
        if path == Path::Relocate {
            assert!(
                self.relocated_pages > 0,
                "{what}: relocation never relocated a page"
            );
            // Nothing the application does here is a reason to give up on
            // relocation: a stop means a move failed that should not have.
            assert!(
                self.stopped.is_empty(),
                "{what}: relocation stopped: {:?}",
                &self.stopped[..self.stopped.len().min(4)]
            );
        }
    }
}

/// Migrates the range back to back for `run` (or until another thread
/// panicked), then sets `stop`.
fn migrate_loop(addr: usize, len: usize, path: Path, stop: &AtomicBool, run: Duration) -> Tally {
    let _g = StopOnPanic(stop);
    let mut t = Tally::default();
    let t0 = Instant::now();
    while t0.elapsed() < run && !stop.load(Acquire) {
        t.add(&call(addr, len, path));
    }
    stop.store(true, Release);
    t
}

/// Sets the stop flag if its thread unwinds, so the other threads end and
/// the panic surfaces instead of a hang.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, Release);
        }
    }
}

fn advise(addr: usize, len: usize, advice: libc::c_int) -> Result<(), i32> {
    // SAFETY: advice on a sub-range of the test's own mapping; what it
    // does to the bytes is what the test checks.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// Deterministic pseudo-random numbers (xorshift64).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Pages of `[base, base + pages * PAGE)` that are not mapped now
/// (`mincore`): on the relocation path, mostly the batch in flight.
fn absent(base: usize, pages: usize) -> Vec<usize> {
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore writes one byte per page of the range into `vec`.
    let rc = unsafe { libc::mincore(base as *mut _, pages * PAGE, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    (0..pages).filter(|&i| vec[i] & 1 == 0).collect()
}

/// A page near the batch in flight (one that is not mapped now and that
/// the model says holds data), else a random page.
fn aim(rng: &mut Rng, base: usize, pages: usize, holds_data: impl Fn(usize) -> bool) -> usize {
    if rng.below(4) != 0 {
        let out: Vec<usize> = absent(base, pages)
            .into_iter()
            .filter(|&i| holds_data(i))
            .collect();
        if !out.is_empty() {
            return out[rng.below(out.len())];
        }
    }
    rng.below(pages)
}

// ---------------------------------------------------------------------------
// 1. MADV_FREE, MADV_PAGEOUT of freed runs, and re-writes

/// One page's model: its last generation written, and whether it was
/// freed since (then it may read that generation or zero).
#[derive(Clone, Copy, Default)]
struct Gen {
    last: u64,
    freed: bool,
}

fn free_pageout_rewrite(path: Path) {
    let len = 32 * MIB;
    let pages = len / PAGE;
    let mut r = Region::new(len, THP).expect("region");
    let base = r.as_mut_ptr() as usize;
    let mut model = vec![Gen::default(); pages];
    let mut gen = 0u64;
    for (i, m) in model.iter_mut().enumerate() {
        gen += 1;
        fill_page(base + i * PAGE, gen);
        m.last = gen;
    }
    let stop = AtomicBool::new(false);
    let rounds = AtomicUsize::new(0);
    let (model, tally) = thread::scope(|s| {
        let (stop, rounds) = (&stop, &rounds);
        let mutator = s.spawn(move || {
            let _g = StopOnPanic(stop);
            let mut rng = Rng::new(91);
            let (mut model, mut gen) = (model, gen);
            while !stop.load(Acquire) {
                let at = aim(&mut rng, base, pages, |i| !model[i].freed);
                // A short run around the page, or its whole 2 MiB block
                // (the batch in flight, as one THP).
                let (first, n) = if rng.below(4) == 0 {
                    (at / (THP / PAGE) * (THP / PAGE), THP / PAGE)
                } else {
                    let first = at.saturating_sub(rng.below(4));
                    (first, (1 + rng.below(16)).min(pages - first))
                };
                let run = base + first * PAGE;
                advise(run, n * PAGE, libc::MADV_FREE)
                    .unwrap_or_else(|e| panic!("madvise(FREE): errno {e}"));
                for m in &mut model[first..first + n] {
                    m.freed = true;
                }
                // Reclaim drops clean freed pages at once (no swap needed).
                if rng.below(2) == 0 {
                    advise(run, n * PAGE, libc::MADV_PAGEOUT)
                        .unwrap_or_else(|e| panic!("madvise(PAGEOUT): errno {e}"));
                }
                // Reads of freed pages (a page reclaim dropped reads as the
                // zero page, a dropped THP as the huge zero page).
                for (i, m) in model.iter().enumerate().skip(first).take(n) {
                    if rng.below(2) == 0 {
                        let v = word(base + i * PAGE).load(Relaxed);
                        assert!(
                            v == 0 || v == m.last,
                            "page {i}, freed, reads {v:#x}: neither zero nor its last write {:#x}",
                            m.last
                        );
                    }
                }
                if rng.below(3) != 0 {
                    thread::yield_now();
                }
                for (i, m) in model.iter_mut().enumerate().skip(first).take(n) {
                    if rng.below(4) != 0 {
                        gen += 1;
                        fill_page(base + i * PAGE, gen);
                        *m = Gen {
                            last: gen,
                            freed: false,
                        };
                    }
                }
                rounds.fetch_add(1, Relaxed);
            }
            model
        });
        let tally = migrate_loop(base, len, path, stop, RUN.mul_f64(2.0));
        (mutator.join().expect("mutator"), tally)
    });
    let wrong: Vec<String> = model
        .iter()
        .enumerate()
        .filter(|&(i, m)| {
            let at = base + i * PAGE;
            !(page_is(at, m.last) || (m.freed && page_is(at, 0)))
        })
        .map(|(i, m)| {
            let w0 = word(base + i * PAGE).load(Relaxed);
            format!(
                "page {i} was written (gen {}){} but reads {}",
                m.last,
                if m.freed { ", then freed," } else { "" },
                if page_is(base + i * PAGE, 0) {
                    "zero".to_string()
                } else {
                    format!("word 0 = {w0:#x}")
                }
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {pages} pages lost their last write: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
    println!("NOTE: {} free rounds", rounds.load(Relaxed));
    tally.finish(path, "free_pageout_rewrite");
}

// ---------------------------------------------------------------------------
// 2. MADV_COLD and MADV_PAGEOUT of pages that hold data

fn cold_and_pageout_keep_data(path: Path) {
    let len = 16 * MIB;
    let pages = len / PAGE;
    let mut r = Region::new(len, THP).expect("region");
    let base = r.as_mut_ptr() as usize;
    for i in 0..pages {
        fill_page(base + i * PAGE, 1 + i as u64);
    }
    let stop = AtomicBool::new(false);
    let tally = thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || {
            let _g = StopOnPanic(stop);
            let mut rng = Rng::new(92);
            while !stop.load(Acquire) {
                let at = aim(&mut rng, base, pages, |_| true);
                let first = at.saturating_sub(rng.below(8));
                let n = (1 + rng.below(64)).min(pages - first);
                let advice = [libc::MADV_COLD, libc::MADV_PAGEOUT][rng.below(2)];
                advise(base + first * PAGE, n * PAGE, advice)
                    .unwrap_or_else(|e| panic!("madvise({advice}): errno {e}"));
            }
        });
        migrate_loop(base, len, path, stop, RUN)
    });
    for i in 0..pages {
        assert!(
            page_is(base + i * PAGE, 1 + i as u64),
            "page {i} changed under COLD/PAGEOUT"
        );
    }
    tally.finish(path, "cold_and_pageout_keep_data");
}

// ---------------------------------------------------------------------------
// 3. MADV_POPULATE_READ/WRITE over batches in flight and never-touched pages

fn populate_over_batches(path: Path) {
    let len = 16 * MIB;
    let pages = len / PAGE;
    let mut r = Region::unpopulated(len, THP).expect("region");
    let base = r.as_mut_ptr() as usize;
    // Even 2 MiB blocks hold data, odd ones are never touched by the test
    // except through POPULATE (which must leave them reading zero).
    let data = |i: usize| (i * PAGE / THP) % 2 == 0;
    for i in (0..pages).filter(|&i| data(i)) {
        fill_page(base + i * PAGE, 1 + i as u64);
    }
    let stop = AtomicBool::new(false);
    let tally = thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || {
            let _g = StopOnPanic(stop);
            let mut rng = Rng::new(93);
            while !stop.load(Acquire) {
                let at = aim(&mut rng, base, pages, |_| true);
                let first = at.saturating_sub(rng.below(8));
                let n = (1 + rng.below(64)).min(pages - first);
                let advice = [MADV_POPULATE_READ, MADV_POPULATE_WRITE][rng.below(2)];
                match advise(base + first * PAGE, n * PAGE, advice) {
                    Ok(()) => {}
                    Err(libc::EINVAL) => return, // before Linux 5.14
                    Err(e) => panic!("madvise(POPULATE {advice}): errno {e}"),
                }
            }
        });
        migrate_loop(base, len, path, stop, RUN)
    });
    for i in 0..pages {
        let want = if data(i) { 1 + i as u64 } else { 0 };
        assert!(
            page_is(base + i * PAGE, want),
            "page {i} does not read {want:#x} after POPULATE"
        );
    }
    tally.finish(path, "populate_over_batches");
}

// ---------------------------------------------------------------------------
// 4. MADV_COLLAPSE aimed at the batch in flight

fn collapse_batch_in_flight(path: Path) {
    let len = 32 * MIB;
    let pages = len / PAGE;
    let mut r = Region::new(len, THP).expect("region");
    let base = r.as_mut_ptr() as usize;
    for i in 0..pages {
        fill_page(base + i * PAGE, 1 + i as u64);
    }
    // Split every PMD into PTEs (keeping the bytes) so there is something to
    // collapse: a one-page MADV_FREE splits the THP, a write undoes the free.
    for b in 0..len / THP {
        let at = base + b * THP;
        advise(at, PAGE, libc::MADV_FREE).expect("MADV_FREE");
        fill_page(at, 1 + (b * THP / PAGE) as u64);
    }
    let stop = AtomicBool::new(false);
    let errnos: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());
    let (tally, tries) = thread::scope(|s| {
        let (stop, errnos) = (&stop, &errnos);
        let collapser = s.spawn(move || {
            let _g = StopOnPanic(stop);
            let mut rng = Rng::new(94);
            let mut tries = 0usize;
            while !stop.load(Acquire) {
                let at = aim(&mut rng, base, pages, |_| true);
                let block = base + at * PAGE / THP * THP;
                tries += 1;
                match advise(block, THP, libc::MADV_COLLAPSE) {
                    Ok(()) => {}
                    Err(e) => errnos.lock().unwrap().push(e),
                }
                // Split it again for the next try.
                advise(block, PAGE, libc::MADV_FREE).expect("MADV_FREE");
                fill_page(block, 1 + ((block - base) / PAGE) as u64);
            }
            tries
        });
        let tally = migrate_loop(base, len, path, stop, RUN);
        (tally, collapser.join().expect("collapser"))
    });
    for i in 0..pages {
        assert!(
            page_is(base + i * PAGE, 1 + i as u64),
            "page {i} changed under MADV_COLLAPSE"
        );
    }
    let errnos = errnos.into_inner().unwrap();
    let mut by: std::collections::BTreeMap<i32, usize> = Default::default();
    for e in &errnos {
        *by.entry(*e).or_default() += 1;
    }
    println!("NOTE: {tries} collapses, refused by errno: {by:?}");
    // The contract (docs/migration.md): the kernel sees a batch in flight
    // as empty entries, EINVAL where a whole block is out, EBUSY where part
    // of it is; EAGAIN and ENOMEM as without migration. Nothing else.
    let other: Vec<_> = by
        .keys()
        .filter(|e| ![libc::EINVAL, libc::EBUSY, libc::EAGAIN, libc::ENOMEM].contains(e))
        .collect();
    assert!(other.is_empty(), "MADV_COLLAPSE refused with {other:?}");
    // Once migrate returned, the same call collapses.
    let block = base;
    match advise(block, THP, libc::MADV_COLLAPSE) {
        Ok(()) => {}
        Err(e) => panic!("MADV_COLLAPSE after migrate returned: errno {e}"),
    }
    tally.finish(path, "collapse_batch_in_flight");
}

//! Migration while other threads change the range under it, on both paths:
//! zaps and re-writes, munmap (and a new mapping in the hole), mprotect,
//! kernel-side writes (read/pread/pipe/recv, O_DIRECT), futex mutexes inside
//! the range, fork, and first writes to never-touched pages. The plain
//! writers/readers stress lives in `migrate.rs`.
//!
//! Every scenario is written once, parameterised by the path, and run as
//! two tests (`relocate_*`, `kernel_*`), each in its own process
//! ([`in_child`]): a crash or a hang is that test's failure. Relocation
//! tests print why they skip where relocation is unavailable.

#[macro_use]
mod common;

use common::{
    fill_page, in_child, maps_overlapping, missing, node, page_is, pattern, word, Need, LIMIT, MIB,
    PAGE, RUN, THP,
};
use foliokit::mem::Region;
use foliokit::migrate::{migrate, MigrateError, MigrateOptions, MigratePath, MigrateReport, Path};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize};
use std::thread;
use std::time::{Duration, Instant};

on_both_paths!(dontneed_and_rewrite => relocate_dontneed_and_rewrite, kernel_dontneed_and_rewrite);
on_both_paths!(|path| hole_cycles(path, false) => relocate_munmap_hole, kernel_munmap_hole);
on_both_paths!(|path| hole_cycles(path, true) => relocate_munmap_hole_then_new_mapping, kernel_munmap_hole_then_new_mapping);
on_both_paths!(mprotect_toggle => relocate_mprotect_toggle, kernel_mprotect_toggle);
on_both_paths!(syscall_writes => relocate_syscall_writes, kernel_syscall_writes);
on_both_paths!(o_direct_reads => relocate_o_direct_reads, kernel_o_direct_reads);
on_both_paths!(|path| mutex_scenario(path, libc::PTHREAD_PRIO_NONE) => relocate_futex_mutex, kernel_futex_mutex);

scenario_test!(
    /// Relocation cannot keep a priority-inheritance futex working (see
    /// [`pi_futex_cannot_wait_on_a_userfaultfd`]): its contract excludes
    /// such memory, so only the kernel path runs this scenario.
    kernel_pi_mutex => mutex_scenario(Path::Kernel, libc::PTHREAD_PRIO_INHERIT)
);
on_both_paths!(fork_mid_migration => relocate_fork_mid_migration, kernel_fork_mid_migration);
on_both_paths!(|path| first_touch(path, PAGE) => relocate_first_touch_4k, kernel_first_touch_4k);
on_both_paths!(|path| first_touch(path, THP) => relocate_first_touch_thp, kernel_first_touch_thp);

// ---------------------------------------------------------------------------
// Shared pieces

fn opts(path: Path) -> MigrateOptions {
    common::opts(path, 512)
}

/// One migration of `[addr, addr + len)`.
fn call(addr: usize, len: usize, path: Path) -> Result<MigrateReport, MigrateError> {
    // SAFETY: every caller passes (part of) a private anonymous mapping the
    // test made and keeps for the call (or a range with a hole it unmapped
    // on purpose, to see the error); none of it is vmspliced or handed to
    // a driver.
    unsafe { migrate(addr as *mut u8, len, node(), &opts(path)) }
}

/// `[addr, addr + len)` as bytes.
fn bytes<'a>(addr: usize, len: usize) -> &'a [u8] {
    // SAFETY: callers pass a mapped, readable range they keep while the
    // slice lives, that no thread writes meanwhile.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

fn errno() -> io::Error {
    io::Error::last_os_error()
}

/// Panics unless `got == want`, naming the first difference.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if got != want {
        let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!(
            "{what}: {bad} bytes differ, the first at +{i:#x} (page {}): {:#04x}, want {:#04x}",
            i / PAGE,
            got[i],
            want[i]
        );
    }
}

/// Deterministic pseudo-random numbers (xorshift64).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// Sets the stop flag if its thread unwinds, so the other threads of a
/// scenario end and the panic surfaces instead of a hang.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, SeqCst);
        }
    }
}

/// What the migrate loop saw.
#[derive(Debug, Default)]
struct Tally {
    calls: usize,
    ok: usize,
    relocated_pages: usize,
    left_in_place: usize,
    dropped_pages: usize,
    refused: usize,
    unmapped: usize,
}

impl Tally {
    /// A successful call: it took the path asked for and covered the range.
    fn ok(&mut self, rep: &MigrateReport, path: Path, len: usize) {
        let want = match path {
            Path::Relocate => MigratePath::Relocate,
            _ => MigratePath::Kernel,
        };
        assert_eq!(rep.path, want, "migrate took another path: {:?}", rep.notes);
        assert_eq!(rep.bytes, len);
        self.calls += 1;
        self.ok += 1;
        self.relocated_pages += rep.relocated_pages;
        self.left_in_place += rep.left_in_place;
        self.dropped_pages += rep.dropped_pages;
    }

    fn expect_ok(&mut self, res: Result<MigrateReport, MigrateError>, path: Path, len: usize) {
        match res {
            Ok(rep) => self.ok(&rep, path, len),
            Err(e) => panic!("migrate on the {path:?} path failed: {e} ({e:?})"),
        }
    }

    /// Prints what ran (shown by the parent) and checks that migration
    /// really ran: at least one call completed, and relocation moved pages.
    fn finish(&self, path: Path, what: &str) {
        println!("NOTE: {what}: {self:?}");
        assert!(self.ok > 0, "{what}: no migration completed: {self:?}");
        if path == Path::Relocate {
            assert!(
                self.relocated_pages > 0,
                "{what}: relocation never relocated a page: {self:?}"
            );
        }
    }
}

/// Migrates `[addr, addr + len)` over and over, every call succeeding,
/// for at least [`RUN`] and while `more()` says so (unless another thread
/// panicked); then tells the other threads to stop.
fn migrate_while(
    addr: usize,
    len: usize,
    path: Path,
    stop: &AtomicBool,
    mut more: impl FnMut() -> bool,
) -> Tally {
    let _g = StopOnPanic(stop);
    let mut t = Tally::default();
    let t0 = Instant::now();
    while (t0.elapsed() < RUN || more()) && !stop.load(Acquire) {
        t.expect_ok(call(addr, len, path), path, len);
    }
    stop.store(true, Release);
    t
}

/// [`migrate_while`] for the run, then what each of `workers` (threads
/// that end once `stop` is set) returned; `what` names them in a panic.
fn migrate_then_join<T>(
    addr: usize,
    len: usize,
    path: Path,
    stop: &AtomicBool,
    workers: Vec<thread::ScopedJoinHandle<'_, T>>,
    what: &str,
) -> (Tally, Vec<T>) {
    let tally = migrate_while(addr, len, path, stop, || false);
    let done = workers.into_iter().map(|w| w.join().expect(what)).collect();
    (tally, done)
}

/// Panics unless `[start, end)` is mapped throughout with `perms`.
fn assert_mapped(start: usize, end: usize, perms: &str, what: &str) {
    let maps: Vec<(usize, usize, String)> = maps_overlapping(start, end)
        .into_iter()
        .map(|m| (m.start, m.end, m.perms))
        .collect();
    let mut at = start;
    for (a, b, p) in &maps {
        assert!(
            *a <= at,
            "{what}: {at:#x}..{a:#x} is not mapped ({maps:x?})"
        );
        assert_eq!(p, perms, "{what}: {a:#x}-{b:#x} is {p}, want {perms}");
        at = *b;
    }
    assert!(
        at >= end,
        "{what}: {at:#x}..{end:#x} is not mapped ({maps:x?})"
    );
}

/// A `len`-byte THP region whose first `data_len` bytes hold
/// `pattern(data_len, seed)` (returned too) and whose rest is the slots of
/// a sweep writer, 512 bytes apart, initialised.
fn data_then_slots(len: usize, data_len: usize, seed: u64) -> (Region, Vec<u8>, Slots) {
    let mut r = Region::new(len, THP).expect("region");
    let want = pattern(data_len, seed);
    r.as_mut_slice()[..data_len].copy_from_slice(&want);
    let slots = Slots {
        at: r.as_mut_ptr() as usize + data_len,
        n: (len - data_len) / 512,
        stride: 512,
    };
    slots.init();
    (r, want, slots)
}

/// Slots of a sweep writer: `n` u64 words `stride` bytes apart from `at`,
/// in a part of the range that is otherwise zero.
#[derive(Clone, Copy)]
struct Slots {
    at: usize,
    n: usize,
    stride: usize,
}

impl Slots {
    /// Every slot 1 (the rest of the part is zero already).
    fn init(&self) {
        for i in 0..self.n {
            word(self.at + i * self.stride).store(1, Relaxed);
        }
    }

    /// Stores increasing numbers into every slot, sweep after sweep, until
    /// `stop`; returns each slot's last value.
    fn write_until(&self, stop: &AtomicBool) -> Vec<u64> {
        let _g = StopOnPanic(stop);
        let mut last = vec![1u64; self.n];
        let mut seq = 1;
        while !stop.load(Relaxed) {
            seq += 1;
            for (i, l) in last.iter_mut().enumerate() {
                word(self.at + i * self.stride).store(seq, Relaxed);
                *l = seq;
            }
            thread::sleep(Duration::from_micros(50));
        }
        last
    }

    fn read(&self) -> Vec<u64> {
        (0..self.n)
            .map(|i| word(self.at + i * self.stride).load(Relaxed))
            .collect()
    }

    /// Panics unless every slot holds its last write and every other word
    /// of the part is still zero.
    fn check(&self, last: &[u64], what: &str) {
        for (i, &v) in last.iter().enumerate() {
            let got = word(self.at + i * self.stride).load(Relaxed);
            assert_eq!(
                got,
                v,
                "{what}: slot {i} at {:#x} lost its last write",
                self.at + i * self.stride
            );
        }
        for off in (0..self.n * self.stride).step_by(8) {
            if off % self.stride != 0 {
                let got = word(self.at + off).load(Relaxed);
                assert_eq!(got, 0, "{what}: word at {:#x} changed", self.at + off);
            }
        }
    }
}

/// A file the test removes when done.
struct TempFile {
    path: std::path::PathBuf,
}

impl TempFile {
    fn new(dir: &std::path::Path, tag: &str, content: &[u8]) -> io::Result<TempFile> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Relaxed);
        let path = dir.join(format!("foliokit-{tag}-{}-{n}", std::process::id()));
        std::fs::write(&path, content)?;
        Ok(TempFile { path })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs a syscall again while it fails with EINTR.
fn retry(mut f: impl FnMut() -> isize) -> isize {
    loop {
        let rc = f();
        if rc >= 0 || errno().raw_os_error() != Some(libc::EINTR) {
            return rc;
        }
    }
}

/// Panics unless a transfer of `want` bytes succeeded completely.
fn transferred(what: &str, rc: isize, want: usize) {
    assert!(rc >= 0, "{what} of {want} bytes failed: {}", errno());
    assert_eq!(rc as usize, want, "{what}: short transfer");
}

// ---------------------------------------------------------------------------
// 1. MADV_DONTNEED on random sub-ranges, then re-writes of some of their pages

fn dontneed_and_rewrite(path: Path) {
    let len = 16 * MIB;
    let pages = len / PAGE;
    let mut r = Region::new(len, THP).expect("region");
    let base = r.as_mut_ptr() as usize;
    let mut seq = 0u64;
    let mut expect = vec![0u64; pages];
    for (i, e) in expect.iter_mut().enumerate() {
        seq += 1;
        fill_page(base + i * PAGE, seq);
        *e = seq;
    }
    // Per page: every value below `floor` was zapped after it was written
    // (so must never be read again); zaps begun and done.
    let counters = || (0..pages).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
    let (floor, begun, done) = (counters(), counters(), counters());
    let stop = AtomicBool::new(false);
    // Progress of both sides: migration goes on until each has done some
    // work (under emulation a thread can start late), within a bound.
    let (zapped, checked) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let (floor, begun, done, stop) = (&floor, &begun, &done, &stop);
    let (zapped, checked) = (&zapped, &checked);
    let (expect, zaps, reads, tally) = thread::scope(|s| {
        let mutator = s.spawn(move || {
            let _g = StopOnPanic(stop);
            let mut rng = Rng::new(1);
            let (mut expect, mut seq, mut zaps) = (expect, seq, 0usize);
            while !stop.load(Relaxed) {
                let first = rng.below(pages);
                let n = (1 + rng.below(64)).min(pages - first);
                for b in &begun[first..first + n] {
                    b.fetch_add(1, SeqCst);
                }
                // SAFETY: a sub-range of our own region; the model below
                // records that its pages read zero from now on.
                let rc = unsafe {
                    libc::madvise(
                        (base + first * PAGE) as *mut libc::c_void,
                        n * PAGE,
                        libc::MADV_DONTNEED,
                    )
                };
                assert_eq!(rc, 0, "madvise(DONTNEED): {}", errno());
                for i in first..first + n {
                    floor[i].store(seq + 1, Release);
                    done[i].fetch_add(1, SeqCst);
                    expect[i] = 0;
                }
                for (i, e) in expect.iter_mut().enumerate().skip(first).take(n) {
                    if rng.below(2) == 0 {
                        seq += 1;
                        fill_page(base + i * PAGE, seq);
                        *e = seq;
                    }
                }
                zaps += 1;
                zapped.fetch_add(1, Relaxed);
                thread::sleep(Duration::from_micros(200));
            }
            (expect, zaps)
        });
        let reader = s.spawn(move || {
            let _g = StopOnPanic(stop);
            let mut rng = Rng::new(2);
            let mut last = vec![0u64; pages];
            // The zaps begun when a non-zero value was read with no zap of
            // the page in flight: a later zero needs a zap begun since.
            let mut clean: Vec<Option<u64>> = vec![None; pages];
            let mut reads = 0usize;
            while !stop.load(Relaxed) {
                let i = rng.below(pages);
                let b0 = begun[i].load(SeqCst);
                let d0 = done[i].load(SeqCst);
                let f = floor[i].load(Acquire);
                let v = word(base + i * PAGE).load(Acquire);
                fence(SeqCst);
                if v != 0 {
                    assert!(
                        v >= f,
                        "page {i}: read {v:#x}, but every value below {f:#x} was zapped: \
                         a zapped page came back (resurrection)"
                    );
                    assert!(
                        v >= last[i],
                        "page {i}: went back from {:#x} to {v:#x}: a write was lost",
                        last[i]
                    );
                    last[i] = v;
                    clean[i] = (b0 == d0).then_some(b0);
                } else {
                    if let Some(c) = clean[i] {
                        assert_ne!(
                            begun[i].load(SeqCst),
                            c,
                            "page {i}: reads zero but no zap of it began since it read {:#x}: \
                             a write was lost",
                            last[i]
                        );
                    }
                    clean[i] = None;
                }
                reads += 1;
                checked.fetch_add(1, Relaxed);
            }
            reads
        });
        let t0 = Instant::now();
        let tally = migrate_while(base, len, path, stop, || {
            (zapped.load(Relaxed) < 16 || checked.load(Relaxed) < 1024)
                && t0.elapsed() < Duration::from_secs(120)
        });
        let (expect, zaps) = mutator.join().expect("mutator");
        let reads = reader.join().expect("reader");
        (expect, zaps, reads, tally)
    });
    let wrong: Vec<(usize, u64, u64)> = expect
        .iter()
        .enumerate()
        .filter(|&(i, &v)| !page_is(base + i * PAGE, v))
        .map(|(i, &v)| (i, v, word(base + i * PAGE).load(Relaxed)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {pages} pages do not hold their last write or zap \
         (page, want version, word 0): {:x?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
    println!("NOTE: {zaps} zaps, {reads} checked reads");
    assert!(zaps > 0 && reads > 0);
    tally.finish(path, "dontneed_and_rewrite");
}

// ---------------------------------------------------------------------------
// 2. munmap of a sub-range while migrate loops (and a new mapping there)

/// Cycles of: a fresh 8 MiB region (4 KiB and THP in turn), migrated over
/// and over as a whole and in its two parts while another thread unmaps a
/// hole of 1..31 pages in its middle at a random moment (and, with
/// `refill`, maps a new anonymous mapping there with MAP_FIXED_NOREPLACE
/// and fills it). The hole stays below the 128 KiB at which malloc would
/// use mmap, and far below the staging areas. What else of this process
/// can land in a freed hole is a new thread's signal stack (a PROT_NONE
/// page and two rw pages, std's guard + SIGSTKSZ): the persistent copy
/// channels are made before the first hole, and the refill retries while
/// a short-lived move_pages thread of the kernel path holds the spot.
fn hole_cycles(path: Path, refill: bool) {
    let len = 8 * MIB;
    let want = pattern(len, 21);
    let fresh = pattern(31 * PAGE, 22);
    let mut rng = Rng::new(if refill { 23 } else { 24 });
    let mut tally = Tally::default();
    // Warm up on a range as long as the cycles' so every helper and
    // channel thread the calls use is started before the first hole: a
    // thread started later maps its signal stack where the kernel finds
    // room, which may be the hole (seen in a 6.12 guest: a guard page and
    // two pages, inside the hole, after a two-share `move_pages` call
    // started its first helper).
    {
        let mut warm = Region::new(len, PAGE).expect("region");
        tally.expect_ok(
            call(warm.as_mut_ptr() as usize, warm.len(), path),
            path,
            warm.len(),
        );
    }
    let retries = AtomicUsize::new(0);
    let t0 = Instant::now();
    let mut cycles = 0;
    while t0.elapsed() < RUN || cycles < 4 {
        let folio = if cycles % 2 == 0 { PAGE } else { THP };
        let mut r = Region::new(len, folio).expect("region");
        r.as_mut_slice().copy_from_slice(&want);
        let base = r.as_mut_ptr() as usize;
        let end = base + len;
        let hole_len = (1 + rng.below(31)) * PAGE;
        let hole = base + len / 4 + rng.below(len / 2 / PAGE) * PAGE;
        let hole_end = hole + hole_len;
        let delay = Duration::from_micros(rng.below(20_000) as u64);
        let made = AtomicBool::new(false);
        let stop = AtomicBool::new(false);
        let ctx = format!("cycle {cycles} ({folio:#x} folios, hole {hole:#x}+{hole_len:#x})");
        thread::scope(|s| {
            let (made, stop, fresh, retries) = (&made, &stop, &fresh, &retries);
            s.spawn(move || {
                let _g = StopOnPanic(stop);
                thread::sleep(delay);
                // SAFETY: part of our own region; nothing in this test
                // touches it again unless it is mapped anew below.
                let rc = unsafe { libc::munmap(hole as *mut libc::c_void, hole_len) };
                assert_eq!(rc, 0, "munmap: {}", errno());
                if refill {
                    let t = Instant::now();
                    let p = loop {
                        // SAFETY: NOREPLACE maps only where nothing is mapped.
                        let p = unsafe {
                            libc::mmap(
                                hole as *mut libc::c_void,
                                hole_len,
                                libc::PROT_READ | libc::PROT_WRITE,
                                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                                -1,
                                0,
                            )
                        };
                        let busy = errno().raw_os_error() == Some(libc::EEXIST);
                        if p as usize == hole || !busy || t.elapsed() > Duration::from_secs(1) {
                            break p;
                        }
                        retries.fetch_add(1, Relaxed);
                        thread::sleep(Duration::from_micros(200));
                    };
                    assert_eq!(
                        p as usize,
                        hole,
                        "mmap(MAP_FIXED_NOREPLACE) into the hole just unmapped: {} ({:x?})",
                        errno(),
                        maps_overlapping(hole, hole_end)
                    );
                    // SAFETY: the new mapping is ours, `fresh` is long enough.
                    unsafe {
                        std::ptr::copy_nonoverlapping(fresh.as_ptr(), hole as *mut u8, hole_len)
                    };
                }
                made.store(true, Release);
            });
            let _g = StopOnPanic(stop);
            let mut after = 0;
            while after < 3 && !stop.load(Acquire) {
                if made.load(Acquire) {
                    after += 1;
                }
                for (a, l) in [(base, len), (base, hole - base), (hole_end, end - hole_end)] {
                    match call(a, l, path) {
                        Ok(rep) => tally.ok(&rep, path, l),
                        Err(MigrateError::Unmapped { addr }) if a == base => {
                            assert_eq!(addr, hole, "{ctx}: Unmapped names another address");
                            tally.calls += 1;
                            tally.unmapped += 1;
                        }
                        Err(e) => panic!("{ctx}: migrate {a:#x}+{l:#x} on {path:?}: {e} ({e:?})"),
                    }
                }
            }
        });
        assert_same(
            bytes(base, hole - base),
            &want[..hole - base],
            &format!("{ctx}: the part before the hole"),
        );
        assert_same(
            bytes(hole_end, end - hole_end),
            &want[hole_end - base..],
            &format!("{ctx}: the part after the hole"),
        );
        assert_mapped(base, hole, "rw-p", &ctx);
        assert_mapped(hole_end, end, "rw-p", &ctx);
        if refill {
            assert_mapped(hole, hole_end, "rw-p", &format!("{ctx}: the new mapping"));
            assert_same(
                bytes(hole, hole_len),
                &fresh[..hole_len],
                &format!("{ctx}: the new mapping in the hole"),
            );
        } else {
            let there: Vec<(usize, usize, String)> = maps_overlapping(hole, hole_end)
                .into_iter()
                .map(|m| (m.start, m.end, m.perms))
                .collect();
            if !there.is_empty() {
                // Say whether what is there holds the old data.
                let old: Vec<usize> = there
                    .iter()
                    .filter(|m| m.2.starts_with('r'))
                    .flat_map(|m| (m.0.max(hole)..m.1.min(hole_end)).step_by(PAGE))
                    .filter(|&a| bytes(a, PAGE) == &want[a - base..a - base + PAGE])
                    .collect();
                panic!(
                    "{ctx}: something is mapped where the application unmapped: {there:x?}; \
                     pages there holding the old data: {old:x?}"
                );
            }
            // SAFETY: NOREPLACE maps only where nothing is mapped; the
            // probe is unmapped again at once.
            let p = unsafe {
                libc::mmap(
                    hole as *mut libc::c_void,
                    hole_len,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            assert_eq!(p as usize, hole, "{ctx}: the hole is not free: {}", errno());
            // SAFETY: the probe mapping we just made.
            unsafe { libc::munmap(p, hole_len) };
        }
        drop(r);
        cycles += 1;
    }
    println!(
        "NOTE: {cycles} cycles, {} NOREPLACE retries",
        retries.load(Relaxed)
    );
    tally.finish(path, if refill { "hole + new mapping" } else { "hole" });
}

// ---------------------------------------------------------------------------
// 3. mprotect of sub-ranges to read-only and back

fn mprotect_toggle(path: Path) {
    let len = 16 * MIB;
    let data_len = 14 * MIB;
    let data_pages = data_len / PAGE;
    let (mut r, want, slots) = data_then_slots(len, data_len, 3);
    let base = r.as_mut_ptr() as usize;
    let stop = AtomicBool::new(false);
    let (stop, want_ref) = (&stop, &want);
    let mut refusals: Vec<String> = Vec::new();
    let (tally, toggles, reads, last) = thread::scope(|s| {
        let toggler = s.spawn(move || {
            let _g = StopOnPanic(stop);
            let mut rng = Rng::new(31);
            let mut toggles = 0usize;
            while !stop.load(Relaxed) {
                let first = rng.below(data_pages - 1);
                let n = 1 + rng.below(256.min(data_pages - first));
                let (at, l) = ((base + first * PAGE) as *mut libc::c_void, n * PAGE);
                // SAFETY: a sub-range of our own region; only the reader
                // touches it, and only to read.
                let rc = unsafe { libc::mprotect(at, l, libc::PROT_READ) };
                assert_eq!(rc, 0, "mprotect(READ): {}", errno());
                thread::sleep(Duration::from_micros(rng.below(1000) as u64));
                // SAFETY: as above.
                let rc = unsafe { libc::mprotect(at, l, libc::PROT_READ | libc::PROT_WRITE) };
                assert_eq!(rc, 0, "mprotect(READ|WRITE): {}", errno());
                toggles += 1;
                thread::sleep(Duration::from_micros(rng.below(2000) as u64));
            }
            toggles
        });
        let reader = s.spawn(move || {
            let _g = StopOnPanic(stop);
            let mut rng = Rng::new(32);
            let mut reads = 0usize;
            while !stop.load(Relaxed) {
                let p = rng.below(data_pages);
                let got = bytes(base + p * PAGE, PAGE);
                assert!(
                    got == &want_ref[p * PAGE..(p + 1) * PAGE],
                    "page {p} changed while it was being migrated"
                );
                reads += 1;
            }
            reads
        });
        let writer = s.spawn(move || slots.write_until(stop));
        let _g = StopOnPanic(stop);
        let mut tally = Tally::default();
        let t0 = Instant::now();
        // Relocation refuses while part of the range is read-only; run
        // until at least one call went through.
        while (t0.elapsed() < RUN || tally.ok == 0) && t0.elapsed() < 6 * RUN && !stop.load(Acquire)
        {
            match call(base, len, path) {
                Ok(rep) => tally.ok(&rep, path, len),
                Err(MigrateError::Refused { why, .. }) if path == Path::Relocate => {
                    tally.calls += 1;
                    tally.refused += 1;
                    let w = why.to_string();
                    if !refusals.contains(&w) {
                        refusals.push(w);
                    }
                }
                Err(e) => panic!("migrate on the {path:?} path failed: {e} ({e:?})"),
            }
        }
        stop.store(true, Release);
        (
            tally,
            toggler.join().expect("toggler"),
            reader.join().expect("reader"),
            writer.join().expect("writer"),
        )
    });
    assert_mapped(base, base + len, "rw-p", "after the toggles");
    assert_same(&r.as_slice()[..data_len], &want, "data after the toggles");
    slots.check(&last, "writer part");
    println!("NOTE: {toggles} toggles, {reads} page reads; refusals seen: {refusals:?}");
    assert!(toggles > 0 && reads > 0);
    tally.finish(path, "mprotect_toggle");
}

// ---------------------------------------------------------------------------
// 4. Kernel-side writes into the range: pread, read, pipe read, recv

fn syscall_writes(path: Path) {
    let len = 16 * MIB;
    let half = len / 2;
    let mut r = Region::new(len, PAGE).expect("region");
    let init = pattern(len, 4);
    r.as_mut_slice().copy_from_slice(&init);
    let base = r.as_mut_ptr() as usize;
    let fpat = pattern(MIB, 40);
    let file = TempFile::new(&std::env::temp_dir(), "syscall", &fpat).expect("temp file");
    let src = pattern(MIB, 41);
    let stop = AtomicBool::new(false);
    let (tally, done) = thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|k| {
                let shadow = init[k * half..(k + 1) * half].to_vec();
                let (stop, fpat, src, file) = (&stop, &fpat, &src, &file);
                s.spawn(move || {
                    io_loop(
                        k as u64,
                        base + k * half,
                        shadow,
                        &file.path,
                        fpat,
                        src,
                        stop,
                    )
                })
            })
            .collect();
        migrate_then_join(base, len, path, &stop, workers, "io thread")
    });
    let mut counts = [0usize; 4];
    for (k, (shadow, c)) in done.iter().enumerate() {
        assert_same(
            &r.as_slice()[k * half..(k + 1) * half],
            shadow,
            &format!("half {k} after the kernel-side writes"),
        );
        for (a, b) in counts.iter_mut().zip(c) {
            *a += b;
        }
    }
    println!(
        "NOTE: pread {}, read {}, pipe {}, recv {}",
        counts[0], counts[1], counts[2], counts[3]
    );
    assert!(
        counts.iter().all(|&c| c > 0),
        "every kind of write ran: {counts:?}"
    );
    tally.finish(path, "syscall_writes");
}

/// Kernel-side writes into `[lo, lo + shadow.len())`, one after another,
/// each checked right after its call; `shadow` follows what the range
/// must hold. Returns it, and how many of each kind ran.
fn io_loop(
    seed: u64,
    lo: usize,
    mut shadow: Vec<u8>,
    file: &std::path::Path,
    fpat: &[u8],
    src: &[u8],
    stop: &AtomicBool,
) -> (Vec<u8>, [usize; 4]) {
    let _g = StopOnPanic(stop);
    let n = shadow.len();
    let f = std::fs::File::open(file).expect("open temp file");
    let fd = f.as_raw_fd();
    let mut p = [0i32; 2];
    // SAFETY: p has room for two descriptors.
    let rc = unsafe { libc::pipe(p.as_mut_ptr()) };
    assert_eq!(rc, 0, "pipe: {}", errno());
    let mut sv = [0i32; 2];
    // SAFETY: sv has room for two descriptors.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, sv.as_mut_ptr()) };
    assert_eq!(rc, 0, "socketpair: {}", errno());
    let mut rng = Rng::new(100 + seed);
    let mut counts = [0usize; 4];
    let mut op = 0;
    while !stop.load(Relaxed) {
        let len = 1 + rng.below(60_000);
        let off = rng.below(n - len);
        let dst = (lo + off) as *mut libc::c_void;
        let fo = rng.below(fpat.len() - len);
        let so = rng.below(src.len() - len);
        let (what, want) = match op % 4 {
            0 => {
                // SAFETY: dst..dst+len lies in our range, written only here.
                let rc = retry(|| unsafe { libc::pread(fd, dst, len, fo as libc::off_t) });
                transferred("pread", rc, len);
                ("pread", &fpat[fo..fo + len])
            }
            1 => {
                // SAFETY: seeks our own descriptor.
                let at = unsafe { libc::lseek(fd, fo as libc::off_t, libc::SEEK_SET) };
                assert_eq!(at, fo as libc::off_t, "lseek: {}", errno());
                // SAFETY: as for pread.
                let rc = retry(|| unsafe { libc::read(fd, dst, len) });
                transferred("read", rc, len);
                ("read", &fpat[fo..fo + len])
            }
            2 => {
                // SAFETY: reads len bytes of src; the pipe holds 64 KiB, so
                // this write completes without a reader.
                let rc = retry(|| unsafe { libc::write(p[1], src[so..].as_ptr().cast(), len) });
                transferred("write to the pipe", rc, len);
                let mut got = 0;
                while got < len {
                    // SAFETY: as for pread.
                    let rc = retry(|| unsafe {
                        libc::read(p[0], dst.cast::<u8>().add(got).cast(), len - got)
                    });
                    assert!(rc > 0, "read from the pipe into the range: {}", errno());
                    got += rc as usize;
                }
                ("pipe read", &src[so..so + len])
            }
            _ => {
                // SAFETY: reads len bytes of src.
                let rc = retry(|| unsafe { libc::send(sv[0], src[so..].as_ptr().cast(), len, 0) });
                transferred("send", rc, len);
                // SAFETY: as for pread.
                let rc = retry(|| unsafe { libc::recv(sv[1], dst, len, 0) });
                transferred("recv", rc, len);
                ("recv", &src[so..so + len])
            }
        };
        assert_same(
            bytes(dst as usize, len),
            want,
            &format!("{what} of {len} bytes into {dst:?}"),
        );
        shadow[off..off + len].copy_from_slice(want);
        counts[op % 4] += 1;
        op += 1;
    }
    for d in [p[0], p[1], sv[0], sv[1]] {
        // SAFETY: our own descriptors.
        unsafe { libc::close(d) };
    }
    (shadow, counts)
}

// ---------------------------------------------------------------------------
// 5. O_DIRECT reads into the range

fn open_direct(path: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// A file holding `content` on a filesystem that takes O_DIRECT reads
/// (the temp dir, /var/tmp, or the current dir), or why none does.
fn direct_file(content: &[u8]) -> Result<TempFile, String> {
    let mut why = Vec::new();
    let dirs = [
        std::env::temp_dir(),
        "/var/tmp".into(),
        std::env::current_dir().unwrap_or_else(|_| ".".into()),
    ];
    for dir in dirs {
        let f = match TempFile::new(&dir, "odirect", content) {
            Ok(f) => f,
            Err(e) => {
                why.push(format!("{}: {e}", dir.display()));
                continue;
            }
        };
        let probe = open_direct(&f.path).map_err(|e| format!("open(O_DIRECT): {e}"));
        let probe = probe.and_then(|d| {
            let mut buf = Region::new(PAGE, PAGE).expect("region");
            // SAFETY: reads one page into our own page-aligned buffer.
            let rc = unsafe { libc::pread(d.as_raw_fd(), buf.as_mut_ptr().cast(), PAGE, 0) };
            match rc {
                rc if rc == PAGE as isize => Ok(()),
                rc if rc < 0 => Err(format!("O_DIRECT pread: {}", errno())),
                rc => Err(format!("O_DIRECT pread: {rc} bytes of {PAGE}")),
            }
        });
        match probe {
            Ok(()) => return Ok(f),
            Err(e) => why.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(why.join("; "))
}

fn o_direct_reads(path: Path) {
    let len = 16 * MIB;
    let half = len / 2;
    let fpat = pattern(4 * MIB, 50);
    let file = match direct_file(&fpat) {
        Ok(f) => f,
        Err(why) => {
            return missing(
                Need::ODirect,
                &format!("no filesystem here takes O_DIRECT reads: {why}"),
            )
        }
    };
    let mut r = Region::new(len, PAGE).expect("region");
    let init = pattern(len, 5);
    r.as_mut_slice().copy_from_slice(&init);
    let base = r.as_mut_ptr() as usize;
    let stop = AtomicBool::new(false);
    let (tally, done) = thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|k| {
                let mut shadow = init[k * half..(k + 1) * half].to_vec();
                let (stop, fpat, file) = (&stop, &fpat, &file);
                let lo = base + k * half;
                s.spawn(move || {
                    let _g = StopOnPanic(stop);
                    let d = open_direct(&file.path).expect("open(O_DIRECT)");
                    let mut rng = Rng::new(200 + k as u64);
                    let mut reads = 0usize;
                    while !stop.load(Relaxed) {
                        let pages = 1 + rng.below(32);
                        let n = pages * PAGE;
                        let off = rng.below(half / PAGE - pages) * PAGE;
                        let fo = rng.below(fpat.len() / PAGE - pages) * PAGE;
                        let dst = (lo + off) as *mut libc::c_void;
                        // SAFETY: page-aligned pages of our range, written
                        // only by this thread.
                        let rc = retry(|| unsafe {
                            libc::pread(d.as_raw_fd(), dst, n, fo as libc::off_t)
                        });
                        transferred("O_DIRECT pread", rc, n);
                        let want = &fpat[fo..fo + n];
                        assert_same(
                            bytes(lo + off, n),
                            want,
                            &format!("O_DIRECT read of {n:#x} bytes into {dst:?}"),
                        );
                        shadow[off..off + n].copy_from_slice(want);
                        reads += 1;
                    }
                    (shadow, reads)
                })
            })
            .collect();
        migrate_then_join(base, len, path, &stop, workers, "O_DIRECT thread")
    });
    for (k, (shadow, reads)) in done.iter().enumerate() {
        assert!(*reads > 0);
        assert_same(
            &r.as_slice()[k * half..(k + 1) * half],
            shadow,
            &format!("half {k} after the O_DIRECT reads"),
        );
    }
    println!(
        "NOTE: O_DIRECT reads from {}: {:?}",
        file.path.parent().unwrap_or(&file.path).display(),
        done.iter().map(|d| d.1).collect::<Vec<_>>()
    );
    tally.finish(path, "o_direct_reads");
}

// ---------------------------------------------------------------------------
// 6. Mutexes inside the range, contended: plain futex mutexes (FUTEX_WAIT /
// FUTEX_WAKE, which wait on a userfaultfd like any kernel access) on both
// paths, priority-inheritance ones on the kernel path only.

fn mutex_scenario(path: Path, protocol: libc::c_int) {
    const LOCKS: usize = 4;
    let len = 16 * MIB;
    let mut r = Region::new(len, PAGE).expect("region");
    let base = r.as_mut_ptr() as usize;
    let stride = len / LOCKS;
    // Lock j: the mutex at the start of a page, a counter in the same page
    // and another one a megabyte further.
    let mutex = |j: usize| (base + j * stride + 3 * PAGE) as *mut libc::pthread_mutex_t;
    let counters = |j: usize| [mutex(j) as usize + 2048, base + j * stride + MIB + 8];
    // SAFETY: an all-zero attribute object is only storage; init fills it.
    let mut attr: libc::pthread_mutexattr_t = unsafe { std::mem::zeroed() };
    // SAFETY: attr is ours; each mutex lies 8-aligned inside our region and
    // is initialised before any thread uses it.
    unsafe {
        assert_eq!(libc::pthread_mutexattr_init(&mut attr), 0);
        assert_eq!(libc::pthread_mutexattr_setprotocol(&mut attr, protocol), 0);
        assert_eq!(
            libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_PRIVATE),
            0
        );
        for j in 0..LOCKS {
            assert_eq!(libc::pthread_mutex_init(mutex(j), &attr), 0);
        }
        libc::pthread_mutexattr_destroy(&mut attr);
    }
    let stop = AtomicBool::new(false);
    let (tally, mine) = thread::scope(|s| {
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || {
                    let _g = StopOnPanic(stop);
                    let mut rng = Rng::new(60 + t);
                    let mut mine = [0u64; LOCKS];
                    while !stop.load(Relaxed) {
                        let j = rng.below(LOCKS);
                        // SAFETY: an initialised mutex in our region, alive
                        // until after the threads are joined.
                        let rc = unsafe { libc::pthread_mutex_lock(mutex(j)) };
                        assert_eq!(
                            rc,
                            0,
                            "pthread_mutex_lock (lock {j}): {}",
                            io::Error::from_raw_os_error(rc)
                        );
                        for c in counters(j) {
                            let v = word(c).load(Relaxed);
                            word(c).store(v + 1, Relaxed);
                        }
                        // Now and then yield while holding it, so the other
                        // thread finds it held and goes to the kernel
                        // (FUTEX_WAIT/WAKE, or FUTEX_LOCK_PI/UNLOCK_PI).
                        if mine[j] % 16 == 0 {
                            thread::yield_now();
                        }
                        // SAFETY: as above; this thread holds it.
                        let rc = unsafe { libc::pthread_mutex_unlock(mutex(j)) };
                        assert_eq!(
                            rc,
                            0,
                            "pthread_mutex_unlock (lock {j}): {}",
                            io::Error::from_raw_os_error(rc)
                        );
                        mine[j] += 1;
                    }
                    mine
                })
            })
            .collect();
        migrate_then_join(base, len, path, &stop, workers, "locking thread")
    });
    for (j, (a, b)) in mine[0].iter().zip(&mine[1]).enumerate() {
        let want = a + b;
        for c in counters(j) {
            assert_eq!(
                word(c).load(Relaxed),
                want,
                "lock {j}: the counter at {c:#x} is not the number of increments"
            );
        }
        // SAFETY: an initialised mutex nobody holds any more.
        let rc = unsafe { libc::pthread_mutex_destroy(mutex(j)) };
        assert_eq!(rc, 0, "pthread_mutex_destroy (lock {j}): still locked?");
    }
    println!("NOTE: increments per lock and thread: {mine:?}");
    assert!(mine.iter().all(|m| m.iter().sum::<u64>() > 0));
    drop(r);
    tally.finish(path, "mutex");
}

/// Why relocation's contract excludes priority-inheritance and robust
/// futexes: the kernel's PI futex code (like `FUTEX_WAKE_OP` and the robust
/// list walk at thread exit) faults a page in without the right to wait
/// (`fixup_user_fault` with no retry), so a userfaultfd can only fail it:
/// `FUTEX_LOCK_PI` on a page out of place returns `EFAULT` at once, and
/// glibc aborts. Ordinary futex waits do wait. If a kernel ever makes the
/// PI path wait, this test fails and the contract can be widened.
#[test]
fn pi_futex_cannot_wait_on_a_userfaultfd() {
    in_child("pi_futex_cannot_wait_on_a_userfaultfd", LIMIT, || {
        println!();
        let Some(uffd) = kernel_mode_uffd() else {
            return;
        };
        // Never touched: the page is missing, as a page of the batch in
        // flight is.
        let mut r = Region::unpopulated(2 * PAGE, PAGE).expect("region");
        let at = r.as_mut_ptr();
        #[repr(C)]
        struct Register {
            start: u64,
            len: u64,
            mode: u64,
            ioctls: u64,
        }
        let mut reg = Register {
            start: at as u64,
            len: (2 * PAGE) as u64,
            mode: 1, // UFFDIO_REGISTER_MODE_MISSING
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER (_IOWR(0xAA, 0x00, 32 bytes)) on our
        // descriptor with a struct of the kernel's layout, over our mapping.
        let rc = unsafe { libc::ioctl(uffd, 0xc020_aa00, &mut reg) };
        assert_eq!(rc, 0, "UFFDIO_REGISTER: {}", errno());
        // SAFETY: a futex call on a word of our (empty, registered) mapping.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_futex,
                at as *mut u32,
                libc::FUTEX_LOCK_PI | libc::FUTEX_PRIVATE_FLAG,
                0,
                std::ptr::null::<libc::timespec>(),
            )
        };
        let e = errno();
        assert_eq!(
            (rc, e.raw_os_error()),
            (-1, Some(libc::EFAULT)),
            "FUTEX_LOCK_PI on a missing page of a userfaultfd range: {rc} ({e}); \
             if it now waits, relocation could accept PI futexes"
        );
        println!("NOTE: FUTEX_LOCK_PI on a page out of place: {e}");
        // SAFETY: our descriptor, closed once (which unregisters the range).
        unsafe { libc::close(uffd) };
        drop(r);
    })
}

/// A userfaultfd that also handles kernel-mode faults, from
/// `/dev/userfaultfd`; `None` (with the reason printed) where this process
/// cannot have one.
fn kernel_mode_uffd() -> Option<libc::c_int> {
    let dev = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        Ok(f) => f,
        Err(e) => {
            missing(Need::Uffd, &format!("/dev/userfaultfd: {e}"));
            return None;
        }
    };
    // SAFETY: USERFAULTFD_IOC_NEW (_IO(0xAA, 0x00)) on the device we opened.
    let uffd = unsafe { libc::ioctl(dev.as_raw_fd(), 0xaa00, libc::O_CLOEXEC) };
    if uffd < 0 {
        missing(Need::Uffd, &format!("USERFAULTFD_IOC_NEW: {}", errno()));
        return None;
    }
    // UFFD_API, features, ioctls.
    let mut api = [0xaa_u64, 0, 0];
    // SAFETY: UFFDIO_API (_IOWR(0xAA, 0x3F, 24 bytes)) with a struct of the
    // kernel's layout, on the descriptor just made.
    let rc = unsafe { libc::ioctl(uffd, 0xc018_aa3f, api.as_mut_ptr()) };
    assert_eq!(rc, 0, "UFFDIO_API: {}", errno());
    Some(uffd)
}

// ---------------------------------------------------------------------------
// 7. fork() while another thread migrates

fn fork_mid_migration(path: Path) {
    const FORKS: usize = 6;
    let len = 16 * MIB;
    let data_len = 12 * MIB;
    let (mut r, want, slots) = data_then_slots(len, data_len, 7);
    let base = r.as_mut_ptr() as usize;
    let stop = AtomicBool::new(false);
    let forked = AtomicBool::new(false);
    // Milliseconds since `t0` (+1) at which a fork() began, 0 when none is
    // in flight; the thread ids the watchdog reports on.
    let t0 = Instant::now();
    let fork_began = AtomicU64::new(0);
    let forker = std::sync::atomic::AtomicI32::new(0);
    let migrator_tid = std::sync::atomic::AtomicI32::new(0);
    let (tally, last, slowest) = thread::scope(|s| {
        let (stop, forked) = (&stop, &forked);
        let (fork_began, forker, migrator_tid) = (&fork_began, &forker, &migrator_tid);
        let migrator = s.spawn(move || {
            // SAFETY: gettid has no preconditions.
            migrator_tid.store(unsafe { libc::gettid() }, Relaxed);
            migrate_while(base, len, path, stop, || !forked.load(Acquire))
        });
        let writer = s.spawn(move || slots.write_until(stop));
        s.spawn(move || fork_watchdog(t0, fork_began, forker, migrator_tid, stop));
        let _g = StopOnPanic(stop);
        // SAFETY: gettid has no preconditions.
        forker.store(unsafe { libc::gettid() }, Relaxed);
        let mut rng = Rng::new(70);
        let (mut slowest, mut slowest_child) = (Duration::ZERO, Duration::ZERO);
        thread::sleep(Duration::from_millis(100));
        for k in 0..FORKS {
            if stop.load(Acquire) {
                break;
            }
            let t = Instant::now();
            fork_began.store(t0.elapsed().as_millis() as u64 + 1, SeqCst);
            // SAFETY: the child runs only `forked_child`, which ends in
            // _exit and never returns into the test harness.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                forked_child(base, len, &want, slots, path);
            }
            fork_began.store(0, SeqCst);
            slowest = slowest.max(t.elapsed());
            assert!(pid > 0, "fork: {}", errno());
            let tw = Instant::now();
            let status = wait_child(pid, Duration::from_secs(10) * common::slowdown());
            slowest_child = slowest_child.max(tw.elapsed());
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "forked child {k} failed (wait status {status:#x}); its message is above"
            );
            thread::sleep(Duration::from_millis(50 + rng.below(200) as u64));
        }
        forked.store(true, Release);
        let tally = migrator.join().expect("migrator");
        println!(
            "NOTE: slowest child took {slowest_child:?}, forks done after {:?}",
            t0.elapsed()
        );
        (tally, writer.join().expect("writer"), slowest)
    });
    assert_same(
        &r.as_slice()[..data_len],
        &want,
        "parent's data after the forks",
    );
    slots.check(&last, "parent's writer part after the forks");
    println!("NOTE: slowest fork() in the parent took {slowest:?}");
    tally.finish(path, "fork_mid_migration");
}

/// How long a fork() may take before the watchdog declares it stuck.
const FORK_LIMIT: Duration = Duration::from_secs(10);

/// Ends the process, saying where the forking and the migrating threads
/// are, if a fork() has not returned within [`FORK_LIMIT`]. It must not
/// allocate or take a lock: a stuck fork() holds glibc's malloc locks.
fn fork_watchdog(
    t0: Instant,
    fork_began: &AtomicU64,
    forker: &std::sync::atomic::AtomicI32,
    migrator: &std::sync::atomic::AtomicI32,
    stop: &AtomicBool,
) {
    while !stop.load(Relaxed) {
        thread::sleep(Duration::from_millis(50));
        let began = fork_began.load(SeqCst);
        if began == 0 || t0.elapsed().as_millis() as u64 + 1 - began < FORK_LIMIT.as_millis() as u64
        {
            continue;
        }
        raw_err(b"fork() in the parent has not returned for 10 s while another thread migrates the range; aborting\n");
        for (who, tid) in [
            (&b"forking thread"[..], forker.load(Relaxed)),
            (&b"migrating thread"[..], migrator.load(Relaxed)),
        ] {
            for file in ["wchan", "syscall", "stack"] {
                let mut path = [0u8; 64];
                let mut w = &mut path[..];
                let _ =
                    io::Write::write_fmt(&mut w, format_args!("/proc/self/task/{tid}/{file}\0"));
                let mut buf = [0u8; 512];
                // SAFETY: a NUL-terminated path and a buffer of ours.
                let n = unsafe {
                    let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY);
                    let n = if fd >= 0 {
                        libc::read(fd, buf.as_mut_ptr().cast(), buf.len())
                    } else {
                        0
                    };
                    libc::close(fd);
                    n.max(0) as usize
                };
                raw_err(who);
                raw_err(b" ");
                raw_err(file.as_bytes());
                raw_err(b": ");
                raw_err(&buf[..n]);
                raw_err(b"\n");
            }
        }
        // SAFETY: ends the process without running anything that could
        // need the locks the stuck fork() holds.
        unsafe { libc::_exit(3) };
    }
}

/// Writes to stderr without allocating or locking.
fn raw_err(b: &[u8]) {
    // SAFETY: writes our own bytes to fd 2.
    unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
}

/// The forked child: checks it sees the parent's data, migrates the range
/// itself, checks again, and exits (never returns).
fn forked_child(base: usize, len: usize, want: &[u8], slots: Slots, path: Path) -> ! {
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        forked_checks(base, len, want, slots, path)
    }));
    let msg = match res {
        Ok(Ok(())) => None,
        Ok(Err(m)) => Some(m),
        Err(_) => Some("panicked".to_owned()),
    };
    if let Some(m) = &msg {
        raw_err(format!("forked child ({path:?}): {m}\n").as_bytes());
    }
    // SAFETY: ends this child at once, running nothing of the parent's.
    unsafe { libc::_exit(i32::from(msg.is_some())) }
}

fn forked_checks(
    base: usize,
    len: usize,
    want: &[u8],
    slots: Slots,
    path: Path,
) -> Result<(), String> {
    let first_diff = |got: &[u8]| {
        (got != want)
            .then(|| got.iter().zip(want).position(|(a, b)| a != b))
            .flatten()
    };
    if let Some(i) = first_diff(bytes(base, want.len())) {
        return Err(format!(
            "the parent's data differs in the child at +{i:#x} (page {}): {:#04x}, want {:#04x}",
            i / PAGE,
            bytes(base + i, 1)[0],
            want[i]
        ));
    }
    let seen = slots.read();
    if let Some(i) = seen.iter().position(|&v| v == 0) {
        return Err(format!(
            "writer slot {i} at {:#x} reads zero in the child: a page of the parent is missing",
            slots.at + i * slots.stride
        ));
    }
    let rep = call(base, len, path).map_err(|e| {
        // Say whether the child's range stays registered with a
        // userfaultfd it does not own, or how long until it is not.
        let t = Instant::now();
        while uffd_registered(base, len) && t.elapsed() < Duration::from_secs(3) {
            thread::sleep(Duration::from_millis(1));
        }
        let after = if uffd_registered(base, len) {
            "still registered (VmFlags um/uw/ui) after 3 s".to_owned()
        } else {
            format!(
                "the userfaultfd registration was gone {:?} later",
                t.elapsed()
            )
        };
        format!("migrate in the child right after fork() returned: {e} ({e:?}); {after}")
    })?;
    let want_path = match path {
        Path::Relocate => MigratePath::Relocate,
        _ => MigratePath::Kernel,
    };
    if rep.path != want_path {
        return Err(format!("migrate in the child took the {} path", rep.path));
    }
    if let Some(i) = first_diff(bytes(base, want.len())) {
        return Err(format!("migrate in the child changed its data at +{i:#x}"));
    }
    if slots.read() != seen {
        return Err("migrate in the child changed the writer part".to_owned());
    }
    Ok(())
}

/// Whether a mapping overlapping `[addr, addr + len)` is registered with
/// a userfaultfd (VmFlags um, uw or ui).
fn uffd_registered(addr: usize, len: usize) -> bool {
    let text = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut inside = false;
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if inside
                && flags
                    .split_whitespace()
                    .any(|f| matches!(f, "um" | "uw" | "ui"))
            {
                return true;
            }
            continue;
        }
        let range = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'));
        if let Some((a, b)) = range {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = b > addr && a < addr + len;
            }
        }
    }
    false
}

/// Waits for a child; kills it and panics if it runs longer than `limit`.
fn wait_child(pid: libc::pid_t, limit: Duration) -> i32 {
    common::wait_for_child(pid, limit).unwrap_or_else(|was| {
        panic!("forked child {pid} hung for {limit:?} and was killed; it was in {was}")
    })
}

// ---------------------------------------------------------------------------
// 8. First writes to never-touched pages

/// A sparse 32 MiB range (every fourth 4 KiB page, or every third 2 MiB
/// chunk, written before; the rest never touched) where a writer stores
/// one unique value into each never-touched page, in random order spread
/// over the run, while migrate loops; a reader re-checks pages already
/// stored to. Every stored value must be there at the end.
fn first_touch(path: Path, folio: usize) {
    let len = 32 * MIB;
    let pages = len / PAGE;
    let mut r = Region::unpopulated(len, folio).expect("region");
    let base = r.as_mut_ptr() as usize;
    let populated = |i: usize| {
        if folio == PAGE {
            i % 4 == 0
        } else {
            (i * PAGE / THP) % 3 == 0
        }
    };
    for i in (0..pages).filter(|&i| populated(i)) {
        fill_page(base + i * PAGE, 1_000_000 + i as u64);
    }
    let mut todo: Vec<usize> = (0..pages).filter(|&i| !populated(i)).collect();
    Rng::new(80).shuffle(&mut todo);
    let spot = |i: usize| base + i * PAGE + (i * 37 % (PAGE / 8)) * 8;
    let value = |i: usize| 0xF1F0_0000_0000_0000 | i as u64;
    let written = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tally, checks) = thread::scope(|s| {
        let (written, stop, todo) = (&written, &stop, &todo);
        s.spawn(move || {
            let _g = StopOnPanic(stop);
            let span = RUN.mul_f64(0.8).as_secs_f64();
            let t0 = Instant::now();
            let mut k = 0;
            while k < todo.len() && !stop.load(Relaxed) {
                let due = (t0.elapsed().as_secs_f64() / span * todo.len() as f64) as usize;
                while k < due.max(k + 1).min(todo.len()) {
                    word(spot(todo[k])).store(value(todo[k]), Relaxed);
                    k += 1;
                    written.store(k, Release);
                }
                thread::sleep(Duration::from_micros(100));
            }
        });
        let reader = s.spawn(move || {
            let _g = StopOnPanic(stop);
            let mut rng = Rng::new(81);
            let mut checks = 0usize;
            while !stop.load(Relaxed) {
                let n = written.load(Acquire);
                if n == 0 {
                    thread::yield_now();
                    continue;
                }
                let i = todo[rng.below(n)];
                let v = word(spot(i)).load(Acquire);
                assert_eq!(
                    v,
                    value(i),
                    "page {i}: its first-touch store is gone while migration runs"
                );
                checks += 1;
            }
            checks
        });
        let tally = migrate_while(base, len, path, stop, || written.load(Acquire) < todo.len());
        (tally, reader.join().expect("reader"))
    });
    assert_eq!(written.load(Acquire), todo.len(), "the writer finished");
    let lost: Vec<usize> = todo
        .iter()
        .copied()
        .filter(|&i| word(spot(i)).load(Relaxed) != value(i))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} first-touch stores were lost (first pages: {:?})",
        lost.len(),
        todo.len(),
        &lost[..lost.len().min(8)]
    );
    for i in 0..pages {
        let at = base + i * PAGE;
        if populated(i) {
            assert!(
                page_is(at, 1_000_000 + i as u64),
                "page {i}, written before, changed"
            );
        } else {
            for k in 0..PAGE / 8 {
                let (a, got) = (at + k * 8, word(at + k * 8).load(Relaxed));
                let want = if a == spot(i) { value(i) } else { 0 };
                assert_eq!(got, want, "page {i} word {k}: stray bytes");
            }
        }
    }
    r.observe_backing();
    println!(
        "NOTE: {} first-touch stores, {checks} re-checks, backing {}",
        todo.len(),
        r.backing().obtained
    );
    tally.finish(
        path,
        if folio == PAGE {
            "first_touch_4k"
        } else {
            "first_touch_thp"
        },
    );
}

//! Moving another process's pages (`migrate::process`), the way a tiering
//! agent does: the target is this test binary started again as a separate
//! process (`target_process`), which writes its memory while it is moved
//! and checks at the end that no write was lost. On one node every call
//! says there is nothing to move, with the counts; in the guests (three
//! nodes, one memory-only) the pages really move there and back.

mod common;

use common::PAGE;

use foliokit::mem::system::{memory_only_nodes, numa_nodes};
use foliokit::migrate::page_nodes;
use foliokit::migrate::process::{
    anon_mappings, migrate_process, ProcessError, ProcessOptions, Ranges, Target,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TARGET_ENV: &str = "FOLIOKIT_PROCESS_TARGET";
const T: Duration = Duration::from_secs(120);

/// The target process: maps `MiB` of private anonymous memory (THP where
/// allowed), fills it, prints `ADDR <start> <len>`, then keeps storing an
/// increasing sequence number into the first word of every page until its
/// stdin closes; then checks every page holds the last number it stored
/// there and exits 0 (lost write: 1). With `fork`, it forks first (the
/// child sleeps on the same stdin), so its pages are shared.
#[test]
#[ignore = "the target process the other tests start (runs only with FOLIOKIT_PROCESS_TARGET)"]
fn target_process() {
    let Ok(spec) = std::env::var(TARGET_ENV) else {
        return;
    };
    let mut parts = spec.split(',');
    let mib: usize = parts.next().and_then(|m| m.parse().ok()).unwrap_or(16);
    let fork = parts.next() == Some("fork");
    let len = mib << 20;
    // SAFETY: a fresh private mapping (no address given), never unmapped.
    let p = unsafe {
        common::map_anonymous(
            None,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
        )
    };
    // SAFETY: our mapping; advice only.
    unsafe { libc::madvise(p.cast(), len, libc::MADV_HUGEPAGE) };
    // An address, so the writer thread may take it (the mapping outlives
    // the scope below).
    let words = p as usize;
    let stride = PAGE / 8;
    let word = |i: usize| (words as *mut u64).wrapping_add(i * stride);
    let pages = len / PAGE;
    for i in 0..pages {
        // SAFETY: inside the mapping.
        unsafe { word(i).write_volatile(0) };
    }
    if fork {
        // SAFETY: this process has one thread (the test harness runs the
        // target alone); the child only reads stdin and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let _ = std::io::stdin().read_line(&mut String::new());
            // SAFETY: ends the child without running destructors.
            unsafe { libc::_exit(0) };
        }
    }
    println!("ADDR {} {len}", p as usize);
    std::io::stdout().flush().unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let last = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let mut seq = 0u64;
            let mut last = vec![0u64; pages];
            // The longest gap between two steps of 16 pages: what a move
            // stalled this thread by at most.
            let (mut t, mut longest) = (std::time::Instant::now(), Duration::ZERO);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for (i, l) in last.iter_mut().enumerate() {
                    seq += 1;
                    // SAFETY: inside the mapping; only this thread writes.
                    unsafe { word(i).write_volatile(seq) };
                    *l = seq;
                    if i % 16 == 15 {
                        longest = longest.max(t.elapsed());
                        t = std::time::Instant::now();
                    }
                }
            }
            (last, longest)
        });
        let _ = std::io::stdin().read_line(&mut String::new());
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        w.join().unwrap()
    });
    let (last, longest) = last;
    for (i, &want) in last.iter().enumerate() {
        // SAFETY: inside the mapping.
        let got = unsafe { word(i).read_volatile() };
        if got != want {
            println!("LOST page {i}: holds {got}, last write {want}");
            std::process::exit(1);
        }
    }
    println!("OK STALL {:.0}", longest.as_secs_f64() * 1e6);
    std::io::stdout().flush().unwrap();
}

/// A running target and the range it writes.
struct Running {
    child: Child,
    start: usize,
    len: usize,
}

impl Running {
    /// [`Running::start`], and the target opened for moving.
    fn start_opened(mib: usize, mode: &str) -> (Running, Target) {
        let t = Running::start(mib, mode);
        let target = Target::open(t.pid()).unwrap();
        (t, target)
    }

    // The child is handed to `Running`, whose Drop kills and reaps it.
    #[allow(clippy::zombie_processes)]
    fn start(mib: usize, mode: &str) -> Running {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args(["target_process", "--exact", "--ignored", "--nocapture"])
            .env(TARGET_ENV, format!("{mib},{mode}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = child.kill();
                let status = child.wait();
                panic!("the target ended before printing its range: {status:?}");
            }
            if let Some(rest) = line.strip_prefix("ADDR ") {
                let v: Vec<usize> = rest
                    .split_whitespace()
                    .map(|x| x.parse().unwrap())
                    .collect();
                child.stdout = Some(out.into_inner());
                return Running {
                    child,
                    start: v[0],
                    len: v[1],
                };
            }
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Stops the writer; returns whether the target found every write.
    fn finish(self) -> bool {
        self.finish_with_stall().is_some()
    }

    /// Stops the writer; returns the target's longest stall (µs) if it
    /// found every write.
    fn finish_with_stall(mut self) -> Option<f64> {
        drop(self.child.stdin.take());
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut out);
        let ok = self.child.wait().unwrap().success();
        assert!(ok, "target: {out}");
        out.lines()
            .find_map(|l| l.strip_prefix("OK STALL "))
            .and_then(|v| v.trim().parse().ok())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Free memory of `node` in MiB (0 where sysfs does not say).
fn free_mib(node: u32) -> usize {
    std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/meminfo"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.contains("MemFree:"))
                .and_then(|l| l.split_whitespace().rev().nth(1)?.parse::<usize>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// A kernel knob set for the length of a test and put back as found.
struct Knob {
    path: &'static str,
    was: Option<String>,
}

impl Knob {
    /// Sets `path` to `value` where it exists and differs; says so where
    /// it cannot be set (the test then runs with the kernel's own setting).
    fn set(path: &'static str, value: &str, why: &str) -> Knob {
        let was = std::fs::read_to_string(path).ok();
        match &was {
            Some(v) if v.trim() != value => {
                if std::fs::write(path, value).is_err() {
                    common::say(&format!("NOTE: cannot set {path} here: {why}"));
                    return Knob { path, was: None };
                }
                Knob { path, was }
            }
            _ => Knob { path, was: None },
        }
    }
}

impl Drop for Knob {
    fn drop(&mut self) {
        if let Some(v) = &self.was {
            let _ = std::fs::write(self.path, v.trim());
        }
    }
}

/// The kernel's own page movers held still while a test checks where
/// pages are: NUMA balancing pulls written pages toward the CPU writing
/// them, and khugepaged, collapsing the target's small pages into a THP,
/// allocates it on a node of its own choosing (seen in both guests: pages
/// moved to node 2, busy or absent during a collapse, then found on node 0).
fn kernel_movers_still() -> [Knob; 2] {
    let k = [
        Knob::set(
            "/proc/sys/kernel/numa_balancing",
            "0",
            "NUMA balancing may move written pages back",
        ),
        Knob::set(
            "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs",
            "3600000",
            "khugepaged may collapse pages onto another node",
        ),
    ];
    // A scan already under way finishes its batch first.
    std::thread::sleep(std::time::Duration::from_millis(200));
    k
}

/// Each page's node in the target, by a status query.
fn nodes_of(target: &Target, start: usize, len: usize) -> Vec<i32> {
    let pages: Vec<usize> = (start..start + len).step_by(PAGE).collect();
    let mut status = vec![0i32; pages.len()];
    for (p, s) in pages.chunks(16384).zip(status.chunks_mut(16384)) {
        target.page_nodes(p, s).unwrap();
    }
    status
}

#[test]
fn a_writing_target_is_moved_there_and_back_and_loses_nothing() {
    common::in_child(
        "a_writing_target_is_moved_there_and_back_and_loses_nothing",
        T,
        || {
            let nodes = numa_nodes();
            // A tiering agent's size where the far node has room for it
            // (the 3-node guest gives its memory-only node 2 GiB).
            let far = *memory_only_nodes().last().unwrap_or(nodes.last().unwrap());
            let mib = if nodes.len() > 1 && free_mib(far) > 1300 {
                1024
            } else {
                64
            };
            let (t, target) = Running::start_opened(mib, "write");
            let range = Ranges::Given(vec![(t.start, t.start + t.len)]);
            let o = ProcessOptions::default().threads(2);
            if nodes.len() < 2 {
                let r = migrate_process(&target, &range, nodes[0], &o).unwrap();
                let (moved, already, absent, failed) = r.totals();
                assert_eq!((moved, failed), (0, 0), "one node: nothing to move: {r:?}");
                assert_eq!(already + absent, t.len / PAGE, "every page counted");
                assert!(already > 0, "the target wrote its pages: {r:?}");
                common::missing(
                    common::Need::Numa,
                    "one NUMA node: the pages were counted, not moved (the guests move them)",
                );
                assert!(t.finish());
                return;
            }
            // The kernel's own tiering and collapsing, not a lost move,
            // would put pages elsewhere: held still where we may.
            let _quiet = kernel_movers_still();
            for to in [far, nodes[0]] {
                // The contract for pages a move reports failed with a
                // transient errno (busy, or invisible to move_pages until
                // touched: -EFAULT for a THP on 6.1): the target touches
                // them (it writes all the time), the caller calls again.
                let mut attempt = 1;
                let r = loop {
                    let r = migrate_process(&target, &range, to, &o).unwrap();
                    let off = nodes_of(&target, t.start, t.len)
                        .iter()
                        .filter(|&&n| n >= 0 && n != to as i32)
                        .count();
                    let transient = r.ranges.iter().all(|x| {
                        x.failed
                            .keys()
                            .all(|e| [libc::EBUSY, libc::EFAULT, libc::ENOENT].contains(e))
                    });
                    if off == 0 || attempt == 3 || !transient {
                        break r;
                    }
                    common::say(&format!(
                        "NOTE: attempt {attempt}: {off} pages not yet on node {to}, failed {:?}: calling again",
                        r.ranges[0].failed
                    ));
                    attempt += 1;
                };
                let (moved, already, _, failed) = r.totals();
                let on: Vec<i32> = nodes_of(&target, t.start, t.len);
                let off = on.iter().filter(|&&n| n >= 0 && n != to as i32).count();
                assert_eq!(
                    off, 0,
                    "{off} pages not on node {to} after {attempt} moves (moved {moved}, already {already}, failed {failed:?}): {r:?}"
                );
                assert!(r.ranges[0].longest_call_us.is_some() || moved == 0);
                common::say(&format!(
                    "NOTE: {mib} MiB: moved {moved} pages to node {to} in {:.1} s, every page there, longest call {:.0} µs",
                    r.secs,
                    r.ranges[0].longest_call_us.unwrap_or(0.0)
                ));
            }
            let stall = t
                .finish_with_stall()
                .expect("the target saw every write it made");
            common::say(&format!(
                "NOTE: nothing lost; the target's longest stall over both moves: {stall:.0} µs"
            ));
        },
    );
}

#[test]
fn all_anon_leaves_files_shared_memory_and_the_stack_alone() {
    common::in_child(
        "all_anon_leaves_files_shared_memory_and_the_stack_alone",
        T,
        || {
            let (t, target) = Running::start_opened(8, "write");
            let (keep, skipped) = anon_mappings(&target, false).unwrap();
            assert!(
                keep.iter()
                    .any(|&(s, e)| s <= t.start && t.start + t.len <= e),
                "the target's buffer is moved"
            );
            let why = |what: &str| {
                skipped
                    .iter()
                    .find(|s| s.what.contains(what))
                    .map(|s| s.why)
            };
            assert!(why("[stack]").is_some_and(|w| w.contains("stack")));
            // The test binary itself is mapped from its file.
            let exe = std::env::current_exe().unwrap();
            let exe = exe.file_name().unwrap().to_string_lossy().to_string();
            assert!(
                why(&exe).is_some_and(|w| w.starts_with("file-backed")),
                "{skipped:?}"
            );
            let (keep, _) = anon_mappings(&target, true).unwrap();
            let stack = skipped.iter().find(|s| s.what == "[stack]").unwrap();
            assert!(
                keep.contains(&(stack.start, stack.end)),
                "asked: the stack moves too"
            );
            // A dry run moves nothing and counts the same pages.
            let node = numa_nodes()[0];
            let o = ProcessOptions::default().dry_run(true);
            let r = migrate_process(&target, &Ranges::AllAnon { stack: false }, node, &o).unwrap();
            assert!(r.dry_run && r.totals().0 == 0);
            assert!(t.finish());
        },
    );
}

#[test]
fn a_target_that_exits_or_whose_pid_was_reused_is_a_typed_error() {
    common::in_child(
        "a_target_that_exits_or_whose_pid_was_reused_is_a_typed_error",
        T,
        || {
            let node = numa_nodes()[0];
            // Exits mid-move: a thread ends it while the calls run.
            let (t, target) = Running::start_opened(256, "write");
            let range = Ranges::Given(
                (0..t.len)
                    .step_by(1 << 20)
                    .map(|o| (t.start + o, t.start + o + (1 << 20)))
                    .collect(),
            );
            let pid = t.pid();
            let far = *numa_nodes().last().unwrap();
            let killer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                // SAFETY: signals our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            });
            let r = migrate_process(&target, &range, far, &ProcessOptions::default());
            killer.join().unwrap();
            match r {
                Err(ProcessError::Gone { partial, .. }) => {
                    assert!(
                        partial.ranges.len() < 256,
                        "stopped early: {} ranges",
                        partial.ranges.len()
                    )
                }
                // The whole move finished within 30 ms (one node: nothing
                // to move): every range is reported.
                Ok(r) => assert_eq!(r.ranges.len(), 256),
                Err(e) => panic!("a target exiting mid-move must be Gone, not {e}"),
            }
            drop(t); // kills (already dead) and reaps: its pid may now be reused
                     // The pidfd still names the dead process, never a new one.
            assert!(!target.alive());
            let r = migrate_process(
                &target,
                &Ranges::AllAnon { stack: false },
                node,
                &ProcessOptions::default(),
            );
            assert!(
                matches!(
                    r,
                    Err(ProcessError::NoProcess { .. }) | Err(ProcessError::Gone { .. })
                ),
                "{r:?}"
            );
            assert!(matches!(
                Target::open(i32::MAX),
                Err(ProcessError::NoProcess { .. })
            ));
        },
    );
}

#[test]
fn a_forked_target_keeps_its_shared_pages_and_loses_nothing() {
    common::in_child(
        "a_forked_target_keeps_its_shared_pages_and_loses_nothing",
        T,
        || {
            let (t, target) = Running::start_opened(16, "fork");
            let range = Ranges::Given(vec![(t.start, t.start + t.len)]);
            let to = *numa_nodes().last().unwrap();
            let r = migrate_process(&target, &range, to, &ProcessOptions::default()).unwrap();
            let (moved, already, absent, failed) = r.totals();
            assert_eq!(moved + already + absent + failed, t.len / PAGE, "{r:?}");
            // Pages still shared with the forked child cannot move with
            // MPOL_MF_MOVE: they stay, reported (EACCES, or 0 where the
            // kernel just leaves them), never lost; ENOENT is a page the
            // target's copy-on-write had in hand at that instant.
            for &errno in r.ranges[0].failed.keys() {
                assert!(
                    [libc::EACCES, libc::EBUSY, libc::ENOENT, 0].contains(&errno),
                    "{r:?}"
                );
            }
            assert!(t.finish());
        },
    );
}

#[test]
fn a_mover_without_rights_gets_a_typed_permission_error() {
    common::in_child(
        "a_mover_without_rights_gets_a_typed_permission_error",
        T,
        || {
            if !foliokit::mem::system::is_root() {
                common::missing(common::Need::Root, "needs root to run the mover as another user (nobody) against this user's target");
                return;
            }
            let t = Running::start(4, "write");
            let (pid, start, len) = (t.pid(), t.start, t.len);
            let node = numa_nodes()[0];
            common::in_forked_child(move || {
                // SAFETY: drops to nobody in this forked child only.
                if unsafe { libc::setgid(65534) } != 0 || unsafe { libc::setuid(65534) } != 0 {
                    return false;
                }
                let Ok(target) = Target::open(pid) else {
                    return false;
                };
                let given = Ranges::Given(vec![(start, start + len)]);
                let o = ProcessOptions::default();
                let a = migrate_process(&target, &given, node, &o);
                let b = migrate_process(&target, &Ranges::AllAnon { stack: false }, node, &o);
                matches!(a, Err(ProcessError::Permission { .. }))
                    && matches!(b, Err(ProcessError::Permission { .. }))
            });
            assert!(t.finish());
        },
    );
}

#[test]
fn bad_nodes_and_ranges_are_refused_before_anything_moves() {
    let here = Target::open(std::process::id() as i32).unwrap();
    let r = migrate_process(
        &here,
        &Ranges::Given(vec![(0x1000, 0x3000)]),
        4096,
        &ProcessOptions::default(),
    );
    assert!(matches!(r, Err(ProcessError::NoSuchNode { .. })), "{r:?}");
    let node = numa_nodes()[0];
    for (s, e) in [(0x1001, 0x3000), (0x3000, 0x1000), (0x1000, 0x1000)] {
        let r = migrate_process(
            &here,
            &Ranges::Given(vec![(s, e)]),
            node,
            &ProcessOptions::default(),
        );
        assert!(
            matches!(r, Err(ProcessError::BadRange { .. })),
            "{s:#x}-{e:#x}: {r:?}"
        );
    }
    // Our own buffer: every page accounted for, the bytes kept.
    let _quiet = kernel_movers_still();
    let mut buf = common::filled_region(2 << 20, 2, 3);
    let want = buf.as_slice().to_vec();
    let start = buf.as_mut_ptr() as usize;
    let r = migrate_process(
        &here,
        &Ranges::Given(vec![(start, start + buf.len())]),
        node,
        &ProcessOptions::default(),
    )
    .unwrap();
    let (moved, already, absent, failed) = r.totals();
    assert_eq!(moved + already + absent + failed, buf.len() / PAGE);
    assert_eq!(buf.as_slice(), &want[..]);
    let mut status = vec![0i32; buf.len() / PAGE];
    let pages: Vec<usize> = (start..start + buf.len()).step_by(PAGE).collect();
    // Pages NUMA balancing marked read as absent to the query until touched.
    common::touch_pages(buf.as_slice());
    page_nodes(&pages, &mut status).unwrap();
    assert!(status.iter().all(|&n| n == node as i32));
}

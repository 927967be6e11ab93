//! A child made with a raw clone(2) while relocation runs: no atfork
//! handler holds it back, so it may be forked with pages of a batch parked
//! (empty entries in its page tables). It must read its parent's bytes
//! there, filled through its own userfaultfd, never zeros.

mod common;

use common::{in_child, node, one_at_a_time, pattern, relocation_available, say, MIB};
use foliokit::migrate::{migrate, MigratePath, Path};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

/// clone(2) without CLONE_VM and without glibc: the child gets a copy of
/// the address space (and only this thread) as fork() would, but no atfork
/// handler runs. The child runs `check` and `_exit`s with its answer; it
/// must not allocate or lock (another thread may hold the allocator's
/// locks). Returns the child's pid.
fn raw_clone(check: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: clone with SIGCHLD only and no new stack is fork without
    // glibc's handlers; the child runs `check` and `_exit`s, never
    // returning into the test harness.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0) };
    if pid == 0 {
        let code = check();
        // SAFETY: ends the child without running the parent's handlers.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "clone: {}", std::io::Error::last_os_error());
    pid as libc::pid_t
}

#[test]
fn a_child_cloned_raw_during_relocation_reads_its_parents_bytes() {
    in_child(
        "a_child_cloned_raw_during_relocation_reads_its_parents_bytes",
        T,
        || {
            if !relocation_available() {
                return;
            }
            one_at_a_time();
            let len = 16 * MIB;
            let want = pattern(len, 41);
            let mut mem = want.clone();
            let at = mem.as_mut_ptr() as usize;
            let stop = AtomicBool::new(false);
            let runs = AtomicUsize::new(0);
            let moved = AtomicUsize::new(0);
            let mut children = 0;
            let mut bad = Vec::new();
            std::thread::scope(|s| {
                let relocator = s.spawn(|| {
                    // One channel: a CPU is left for the cloning thread
                    // while a batch's pages are out (on two CPUs, a copy
                    // over two channels kept it off until they were back).
                    let o = common::opts(Path::Relocate, 512).channels(1);
                    // The page-aligned part of the vector.
                    let start = at.next_multiple_of(4096);
                    let n = (at + len - start) / 4096 * 4096;
                    while !stop.load(Ordering::Relaxed) {
                        // SAFETY: our own memory; the main thread only
                        // clones meanwhile.
                        let r = unsafe { migrate(start as *mut u8, n, node(), &o) }
                            .unwrap_or_else(|e| panic!("relocation failed: {e}"));
                        assert_eq!(r.path, MigratePath::Relocate);
                        assert_eq!(r.dropped_pages, 0, "{r:?}");
                        runs.fetch_add(1, Ordering::Relaxed);
                        moved.fetch_add(r.relocated_pages, Ordering::Relaxed);
                    }
                });
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(1500) && !relocator.is_finished() {
                    let (have, want) = (at as *const u8, &want);
                    let pid = raw_clone(|| {
                        // SAFETY: our copy of the parent's vector, `len`
                        // bytes; a parked page waits on its fill.
                        let got = unsafe { std::slice::from_raw_parts(have, len) };
                        i32::from(got != &want[..])
                    });
                    children += 1;
                    match common::wait_for_child(pid, Duration::from_secs(20) * common::slowdown())
                    {
                        Ok(st) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 => {}
                        Ok(st) => bad.push(format!("wait status {st:#x}")),
                        Err(blocked) => bad.push(format!("hung: {blocked}")),
                    }
                    // The same bytes again: a page the child shared is no
                    // longer this process's alone, and UFFDIO_MOVE leaves
                    // such pages in place (EBUSY) until a write copies them.
                    // SAFETY: our own vector; relocation lets the
                    // application write at any time.
                    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), at as *mut u8, len) };
                }
                stop.store(true, Ordering::Relaxed);
                relocator.join().expect("relocator");
            });
            say(&format!(
                "NOTE: {children} raw clones during {} relocations ({} pages relocated)",
                runs.load(Ordering::Relaxed),
                moved.load(Ordering::Relaxed)
            ));
            assert!(children > 0 && runs.load(Ordering::Relaxed) > 0);
            assert!(bad.is_empty(), "children read the wrong bytes: {bad:?}");
            assert!(mem == want, "the parent's bytes changed");
        },
    );
}

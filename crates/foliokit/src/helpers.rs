//! Persistent helper threads for the work that is not a copy channel's:
//! populate's chunks, the kernel path's `move_pages` shares and
//! relocation's batch loop. They are workers in the helper role
//! ([`crate::worker`], which also says why they are not the channels'
//! threads and why no wait among them can close a circle); this module is
//! the role: how callers offer their loops and how helpers take them.
//!
//! A call hands its work loop to [`fan_out`], which runs it on the calling
//! thread and offers it to up to `extra` helpers at once. The loop takes
//! its items from a shared counter, so it is complete however many threads
//! run it, one included. That is what keeps callers independent: a caller
//! never waits for a helper to *start* on its loop. When its own run
//! returns, the offer is withdrawn; it waits only for helpers already
//! inside the loop, which finish the items they took. A helper busy with
//! another caller's work costs this caller parallelism, never latency.
//!
//! A helper runs a caller's loop as the caller's own thread would: with
//! its CPU affinity and its NUMA memory policy, which decide where the
//! pages populate faults in are allocated (threads made per call used to
//! inherit both from the caller). It blocks every signal (faults it
//! causes are still raised on it), so the application's handlers never
//! run on it.
//!
//! The helpers live as long as the process, or until
//! [`crate::channels::release_shared`]; they start on first use, or up
//! front with [`crate::channels::start_shared`]. A forked child gets its
//! own. A helper that cannot be started is not tried again: its share of
//! each call runs on the calling thread.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::params::MAX_HELPERS;
use crate::pidlock::PidLock;
use crate::worker::{self, Crew, Placement, Queue, Role};

/// One caller's offer of its loop.
struct Call {
    /// The caller's loop with its lifetime erased. Dereferenced only by a
    /// helper that counted itself in `state.running` while `state.open`:
    /// the caller does not return (so the loop outlives every run) until
    /// it has closed the offer and seen `running` reach 0.
    job: *const (dyn Fn() + Sync + 'static),
    /// Where the caller's thread runs and allocates: where its loop runs.
    placement: Placement,
    state: Mutex<CallState>,
    finished: Condvar,
}

struct CallState {
    /// Helpers may still join.
    open: bool,
    /// Helpers inside the loop now.
    running: usize,
    /// Helpers that joined at all.
    joined: usize,
    /// The first panic a helper's run raised, for the caller to resume.
    panic: Option<Box<dyn Any + Send>>,
    /// A helper could not take on the caller's attributes and left the
    /// loop alone (only [`on_helper`]'s caller waits for this).
    declined: bool,
}

// SAFETY: `job` points to a `Sync` closure, run from other threads only
// under the protocol above; the rest is Send + Sync.
unsafe impl Send for Call {}
// SAFETY: as for Send.
unsafe impl Sync for Call {}

impl Call {
    /// An open offer of `job` to the helpers, run under the caller's
    /// `placement`.
    ///
    /// # Safety
    /// The caller must not return (so `job` must outlive every run) until
    /// it has closed the offer and seen `state.running` back at 0 (see
    /// `job`): only the lifetime is erased here.
    unsafe fn offer(job: &(dyn Fn() + Sync + '_), placement: Placement) -> Arc<Call> {
        let erased: *const (dyn Fn() + Sync + '_) = job;
        // SAFETY: only the lifetime changes; the caller's contract keeps
        // the closure alive for every run.
        let job: *const (dyn Fn() + Sync + 'static) = unsafe { std::mem::transmute(erased) };
        Arc::new(Call {
            job,
            placement,
            state: Mutex::new(CallState {
                open: true,
                running: 0,
                joined: 0,
                panic: None,
                declined: false,
            }),
            finished: Condvar::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, CallState> {
        // A run's panic is caught outside the lock: nothing poisons it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A helper's part: become the caller's likeness, then run the loop
    /// once, unless the caller closed the offer meanwhile.
    fn serve(&self) {
        // Stale offers (most of them, once callers are done) cost a lock.
        if !self.state().open {
            return;
        }
        if !self.placement.apply() {
            self.state().declined = true;
            self.finished.notify_all();
            return;
        }
        {
            let mut s = self.state();
            if !s.open {
                return;
            }
            s.running += 1;
            s.joined += 1;
        }
        // SAFETY: counted in `running` while open: the closure is alive
        // until `running` drops back (see `job`).
        let ran = catch_unwind(AssertUnwindSafe(|| unsafe { (*self.job)() }));
        let mut s = self.state();
        if let Err(p) = ran {
            s.panic.get_or_insert(p);
        }
        s.running -= 1;
        if s.running == 0 {
            self.finished.notify_all();
        }
    }

    /// The caller's part: withdraw the offer, wait for the helpers inside.
    /// Afterwards the state is final.
    fn close(&self) {
        let mut s = self.state();
        s.open = false;
        while s.running > 0 {
            s = self.finished.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Closes a call when the caller's own run ends, by return or by unwind.
struct Closer<'a>(&'a Call);

impl Drop for Closer<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// This process's helpers: workers in the helper role, taking callers'
/// offers from one queue.
struct Helpers {
    crew: Crew<Arc<Call>>,
    /// Helpers asked for so far: never asked for again, even if some could
    /// not start (a seccomp filter may kill the process on a new `clone`).
    attempted: usize,
    /// Of those, how many could not be started.
    failed: usize,
}

impl Helpers {
    /// Helpers running or being started by some caller now.
    fn count(&self) -> usize {
        self.attempted - self.failed
    }
}

static HELPERS: PidLock<Option<Helpers>> = PidLock::new();

/// The queue of this process's helpers and how many there are (counting
/// those another caller is starting now): at least `want` (capped at
/// [`MAX_HELPERS`]) unless some could not be started.
/// Threads are made outside the lock, which other callers spin on.
fn queue(want: usize) -> (Arc<Queue<Arc<Call>>>, usize) {
    let want = want.min(MAX_HELPERS);
    let (queue, more) = {
        let mut guard = HELPERS.lock();
        let h = guard
            .get_or_insert_with(|| None)
            .get_or_insert_with(|| Helpers {
                crew: Crew::new(),
                attempted: 0,
                failed: 0,
            });
        let more = want.saturating_sub(h.attempted);
        h.attempted += more;
        if more == 0 {
            return (h.crew.queue().clone(), h.count());
        }
        (h.crew.queue().clone(), more)
    };
    let mut made = Vec::new();
    for _ in 0..more {
        match worker::spawn(Role::Helper, "foliokit-helper".into(), &queue, |c| {
            c.serve()
        }) {
            Some(t) => made.push(t),
            // Out of threads: callers do the work themselves.
            None => break,
        }
    }
    let mut guard = HELPERS.lock();
    match guard.get_or_insert_with(|| None) {
        Some(h) if Arc::ptr_eq(h.crew.queue(), &queue) => {
            h.failed += more - made.len();
            h.crew.hire(made);
            (queue, h.count())
        }
        // Released meanwhile: the queue is closed, so the new threads end
        // at once.
        _ => (queue, 0),
    }
}

/// The helpers' queue and how many serve it, starting none: for a caller
/// that must not create a thread (see [`beside`]).
fn queue_existing() -> Option<(Arc<Queue<Arc<Call>>>, usize)> {
    let mut guard = HELPERS.lock();
    guard
        .get_or_insert_with(|| None)
        .as_ref()
        .map(|h| (h.crew.queue().clone(), h.count()))
}

/// Whether `q` is still the helpers' queue and some helper serves it (or
/// is being started for it). A released queue is never the helpers' any
/// more: [`release`] takes it out of the registry before closing it.
fn serving(q: &Arc<Queue<Arc<Call>>>) -> bool {
    let mut guard = HELPERS.lock();
    matches!(guard.get_or_insert_with(|| None), Some(h) if Arc::ptr_eq(h.crew.queue(), q) && h.count() > 0)
}

/// Starts helpers until `n` are running (as [`fan_out`] would); returns
/// how many are running or being started.
pub(crate) fn start(n: usize) -> usize {
    queue(n).1
}

/// Ends this process's helpers and waits for them (for those inside a
/// call, until they finish their part of it); the next [`fan_out`] starts
/// new ones.
pub(crate) fn release() {
    let Some(h) = HELPERS.lock().get_or_insert_with(|| None).take() else {
        return;
    };
    // An offer no helper will take: an [`on_helper`] caller waiting for it
    // learns it was declined ([`fan_out`] callers run their loops anyway).
    for c in h.crew.withdraw() {
        c.state().declined = true;
        c.finished.notify_all();
    }
    // Waits for the helpers, except the calling thread if it is one (a
    // helper's own call, inside some caller's loop, ends when that run
    // returns).
    drop(h);
}

/// Holds the helpers' registry lock until dropped (for
/// [`crate::channels::hold_shared_lock`]).
pub(crate) fn hold_lock() -> impl Drop {
    HELPERS.lock()
}

/// Runs `job` on the calling thread and on up to `extra` helpers at once,
/// and returns when no run is left. `job` must take its work from shared
/// state so that it finishes everything when run once, by the caller
/// alone, and does nothing wrong when run several times at once. Returns
/// how many helpers joined. A panic in any run is resumed here, after
/// every run has ended.
pub(crate) fn fan_out(extra: usize, job: &(dyn Fn() + Sync)) -> usize {
    let Some(placement) = (extra > 0).then(Placement::of_this_thread).flatten() else {
        job();
        return 0;
    };
    let (q, helpers) = queue(extra);
    if helpers == 0 {
        job();
        return 0;
    }
    // SAFETY: this function closes the offer and waits until no helper
    // runs `job` before it returns, by return or unwind (`Closer` below).
    let call = unsafe { Call::offer(job, placement) };
    // An offer per helper at most: more would only be discarded. (Refused
    // if the helpers were released meanwhile: the caller runs it alone.)
    q.push(std::iter::repeat_n(call.clone(), extra.min(helpers)));
    {
        let _close = Closer(&call);
        job();
    }
    // Closed (by `_close`) and final: nothing runs the loop any more.
    let (joined, panic) = {
        let mut s = call.state();
        (s.joined, s.panic.take())
    };
    if let Some(p) = panic {
        resume_unwind(p);
    }
    joined
}

/// Runs `mine` on the calling thread while offering `spare` to one
/// helper, which runs it if it takes the offer before `mine` returns;
/// `spare` never runs on the calling thread. Returns `mine`'s result, and
/// `spare`'s if it ran, once no helper runs it any more. For work worth
/// doing beside the caller's but never in its way: relocation prepares
/// the next batch's destination folios while a batch is out, and does it
/// itself, later, where no helper was free.
pub(crate) fn beside<A, B: Send>(
    mine: impl FnOnce() -> A,
    spare: impl FnOnce() -> B + Send,
) -> (A, Option<B>) {
    let spare = Mutex::new(Some(spare));
    let out: Mutex<Option<B>> = Mutex::new(None);
    let run = || {
        let f = spare.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = f {
            let r = f();
            *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        }
    };
    // One helper besides this thread, which may be a helper itself.
    let want = 1 + usize::from(worker::on_helper());
    let Some(placement) = Placement::of_this_thread() else {
        return (mine(), None);
    };
    // Never a new thread here: the caller may be mid-batch (relocation
    // registers its range before this), and a thread started now may get
    // the cached stack of one that exited, inside that range, and wait on
    // it. Nor anywhere on its behalf: foliokit's threads are the ones
    // `start_shared` started (the C API promises no thread after it), so
    // the work goes beside only where a second helper exists already.
    let Some((q, helpers)) = queue_existing() else {
        return (mine(), None);
    };
    if helpers < want {
        return (mine(), None);
    }
    // SAFETY: this function closes the offer and waits until no helper
    // runs `run` before it returns, by return or unwind (`Closer` below).
    let call = unsafe { Call::offer(&run, placement) };
    // Refused if the helpers were released meanwhile: then nobody runs it.
    q.push([call.clone()]);
    let a = {
        let _close = Closer(&call);
        mine()
    };
    let panic = call.state().panic.take();
    if let Some(p) = panic {
        resume_unwind(p);
    }
    let b = out.lock().unwrap_or_else(|p| p.into_inner()).take();
    (a, b)
}

/// Runs `job` once on a helper, never on the calling thread, and waits
/// for it; `None` (and `job` not run) where no helper can be started or
/// the one offered could not take on the caller's CPU affinity and memory
/// policy.
///
/// For work that must not depend on the calling thread: relocation puts
/// back pages that the caller's own signal handlers may be waiting for,
/// so the caller only waits (its handlers run, and their stores land once
/// the helper puts the page back), while the helper, which blocks every
/// asynchronous signal, runs nothing of the application's. Unlike
/// [`fan_out`], the caller waits for a helper to start (behind another
/// caller's loop at worst, which ends).
pub(crate) fn on_helper<R: Send>(job: impl FnOnce() -> R + Send) -> Option<R> {
    // On a helper already: run it right there, rather than wait for
    // another helper that may be this one (see `crate::worker`).
    if worker::on_helper() {
        return Some(job());
    }
    let placement = Placement::of_this_thread()?;
    let (q, helpers) = queue(1);
    if helpers == 0 {
        return None;
    }
    let job = Mutex::new(Some(job));
    let out: Mutex<Option<R>> = Mutex::new(None);
    let run = || {
        let f = job.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = f {
            let r = f();
            *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        }
    };
    // SAFETY: this function does not return until the offer is closed and
    // no helper runs the closure (the wait below).
    let call = unsafe { Call::offer(&run, placement) };
    // Checked under the queue's lock: a release that drained the queue
    // before this push would leave the offer where no helper will look.
    if !q.push([call.clone()]) {
        return None;
    }
    let panic = {
        let mut s = call.state();
        let done = |s: &CallState| s.declined || (s.joined > 0 && s.running == 0);
        while !done(&s) {
            let (g, t) = call
                .finished
                .wait_timeout(s, crate::params::HELPER_OFFER_POLL)
                .unwrap_or_else(|p| p.into_inner());
            s = g;
            if t.timed_out() && s.joined == 0 && !done(&s) {
                // A helper another caller was starting may have failed to
                // start, or the helpers were released: then nobody will
                // take the offer, so withdraw it (closing it under this
                // lock stops a helper that pops it late from running it).
                drop(s);
                let alive = serving(&q);
                s = call.state();
                if !alive && s.joined == 0 {
                    s.declined = true;
                }
            }
        }
        s.open = false;
        s.panic.take()
    };
    if let Some(p) = panic {
        resume_unwind(p);
    }
    let r = out.lock().unwrap_or_else(|p| p.into_inner()).take();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::numa::NodeMask;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Barrier;

    #[test]
    fn on_helper_runs_off_the_caller_and_nests() {
        if start(1) == 0 {
            eprintln!("SKIP: no helper thread could be started here");
            return;
        }
        let caller = std::thread::current().id();
        let (outer, inner) = on_helper(|| {
            let outer = std::thread::current().id();
            // From a helper: runs right there instead of waiting for one.
            let inner = on_helper(|| std::thread::current().id());
            (outer, inner)
        })
        .expect("a helper ran it");
        assert_ne!(outer, caller, "never on the calling thread");
        assert_eq!(inner, Some(outer), "nested: on the same helper");
    }

    #[test]
    fn beside_runs_the_spare_only_off_the_caller() {
        if start(2) < 2 {
            eprintln!("SKIP: two helper threads could not be started here");
            return;
        }
        let done = AtomicBool::new(false);
        // The caller's part waits (boundedly) for the spare to start, so
        // that a free helper takes it; from a helper too (nested).
        let run = || {
            let me = std::thread::current().id();
            let (mine, spare) = beside(
                || {
                    let t = std::time::Instant::now();
                    while !done.load(Ordering::SeqCst) && t.elapsed().as_secs() < 5 {
                        std::thread::yield_now();
                    }
                    std::thread::current().id()
                },
                || {
                    done.store(true, Ordering::SeqCst);
                    std::thread::current().id()
                },
            );
            assert_eq!(mine, me, "the caller's part runs on the caller");
            if let Some(s) = spare {
                assert_ne!(s, me, "the spare never runs on the caller");
            }
            done.store(false, Ordering::SeqCst);
        };
        run();
        on_helper(run).expect("a helper ran it");
    }

    #[test]
    fn every_item_is_taken_once_whatever_the_helpers_do() {
        for extra in [0, 1, 3, 200] {
            let next = AtomicUsize::new(0);
            let seen: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
            fan_out(extra, &|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= seen.len() {
                    break;
                }
                seen[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
        }
    }

    /// Runs `job` through `fan_out(1, ..)`, making sure one helper joins:
    /// the caller's own run waits for a helper's to start first. `None`,
    /// with the reason printed, where no helper can be started.
    fn with_one_helper<R: Send>(job: impl Fn(bool) -> Option<R> + Sync) -> Option<R> {
        if start(1) == 0 {
            eprintln!("SKIP: no helper thread could be started here");
            return None;
        }
        let caller = std::thread::current().id();
        let entered = AtomicBool::new(false);
        let got = Mutex::new(None);
        let joined = fan_out(1, &|| {
            let mine = std::thread::current().id() == caller;
            if mine {
                while !entered.load(Ordering::SeqCst) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            } else {
                entered.store(true, Ordering::SeqCst);
            }
            if let Some(r) = job(mine) {
                *got.lock().unwrap() = Some(r);
            }
        });
        assert_eq!(joined, 1);
        got.into_inner().unwrap()
    }

    #[test]
    fn helpers_join_and_run_at_the_same_time() {
        // Two runs meet at a barrier: only possible if a helper runs the
        // loop alongside the caller.
        let barrier = Barrier::new(2);
        with_one_helper(|_| {
            barrier.wait();
            Some(())
        });
    }

    #[test]
    fn a_helper_runs_with_the_callers_cpus_and_memory_policy() {
        // The caller narrows itself to one CPU and binds its allocations to
        // the first node; the helper must run its loop the same way.
        let Some(before) = Placement::of_this_thread() else {
            eprintln!("SKIP: this thread's attributes cannot be read here");
            return;
        };
        if before.policy.is_none() {
            eprintln!("SKIP: the kernel has no NUMA policies (ENOSYS)");
            return;
        }
        // The first online node, read here: the test needs nothing else
        // of mem/ (which runs its populate on these helpers).
        let node0 = std::fs::read_to_string("/sys/devices/system/node/online")
            .ok()
            .and_then(|t| t.split([',', '-']).next()?.trim().parse().ok())
            .unwrap_or(0usize);
        let first_cpu = crate::sys::allowed_cpus()[0];
        let mut narrow = Placement {
            cpus: before.cpus,
            policy: None,
        };
        // SAFETY: plain bit operations on our own cpu_set_t.
        unsafe {
            libc::CPU_ZERO(&mut narrow.cpus);
            libc::CPU_SET(first_cpu, &mut narrow.cpus);
        }
        let mut nodes = NodeMask::default();
        nodes[node0 / 64] |= 1 << (node0 % 64);
        narrow.policy = Some((libc::MPOL_BIND, nodes));
        if !narrow.apply() {
            // E.g. a cpuset whose memory nodes exclude the first node.
            assert!(before.apply());
            eprintln!("SKIP: cannot bind this thread to node {node0} on CPU {first_cpu} here");
            return;
        }
        let seen = with_one_helper(|mine| (!mine).then(Placement::of_this_thread).flatten());
        // Back to what the test thread had.
        assert!(before.apply());
        let Some(seen) = seen else { return };
        // SAFETY: reads our own cpu_set_t.
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &seen.cpus) })
            .collect();
        assert_eq!(cpus, vec![first_cpu]);
        assert_eq!(seen.policy, Some((libc::MPOL_BIND, nodes)));
    }

    #[test]
    fn a_caller_does_not_wait_for_a_busy_helper() {
        // Every helper is held inside another call's loop until this
        // caller is done: it must finish alone instead of waiting.
        let n = start(MAX_HELPERS);
        if n == 0 {
            eprintln!("SKIP: no helper thread could be started here");
            return;
        }
        let hold = AtomicBool::new(true);
        let entered = AtomicUsize::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                fan_out(n, &|| {
                    entered.fetch_add(1, Ordering::SeqCst);
                    while hold.load(Ordering::SeqCst) {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                })
            });
            while entered.load(Ordering::SeqCst) < n + 1 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let done = AtomicUsize::new(0);
            let joined = fan_out(1, &|| {
                done.fetch_add(1, Ordering::SeqCst);
            });
            hold.store(false, Ordering::SeqCst);
            assert_eq!((joined, done.load(Ordering::SeqCst)), (0, 1));
        });
    }

    #[test]
    fn a_helper_panic_reaches_the_caller_after_the_helpers_run_ended() {
        // Only the helper panics, and it unwinds through a guard that
        // counts: fan_out must resume its panic, after that guard ran.
        struct Ended<'a>(&'a AtomicUsize);
        impl Drop for Ended<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let ended = AtomicUsize::new(0);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            with_one_helper(|mine| {
                if !mine {
                    let _counted = Ended(&ended);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    panic!("from the helper");
                }
                Some(())
            })
        }));
        let p = match caught {
            Err(p) => p,
            Ok(None) => return, // skipped, saying why
            Ok(Some(())) => panic!("the helper's panic was lost"),
        };
        assert_eq!(p.downcast_ref::<&str>(), Some(&"from the helper"));
        assert_eq!(ended.load(Ordering::SeqCst), 1);
    }
}

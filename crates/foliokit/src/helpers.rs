//! Persistent helper threads for the work that is not a copy channel's:
//! populate's chunks and the kernel path's `move_pages` shares.
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
//! The helpers live as long as the process (or until
//! [`crate::channels::release_shared`]); they start on first use, or up
//! front with [`crate::Config::start_channels`]. A forked child gets its
//! own.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::pidlock::PidLock;
use crate::tune::MAX_HELPERS;

/// One caller's offer of its loop.
struct Call {
    /// The caller's loop with its lifetime erased. Dereferenced only by a
    /// helper that counted itself in `state.running` while `state.open`:
    /// the caller does not return (so the loop outlives every run) until
    /// it has closed the offer and seen `running` reach 0.
    job: *const (dyn Fn() + Sync + 'static),
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
}

// SAFETY: `job` points to a `Sync` closure, run from other threads only
// under the protocol above; the rest is Send + Sync.
unsafe impl Send for Call {}
// SAFETY: as for Send.
unsafe impl Sync for Call {}

impl Call {
    fn state(&self) -> MutexGuard<'_, CallState> {
        // A run's panic is caught outside the lock: nothing poisons it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A helper's part: run the loop once, unless the caller closed it.
    fn serve(&self) {
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

/// The offers waiting for a helper.
struct Queue {
    calls: Mutex<Offers>,
    more: Condvar,
}

struct Offers {
    calls: VecDeque<Arc<Call>>,
    /// Set by [`release`]: helpers end.
    released: bool,
}

impl Queue {
    fn offers(&self) -> MutexGuard<'_, Offers> {
        // Nothing panics while holding it.
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// This process's helpers.
struct Helpers {
    queue: Arc<Queue>,
    started: usize,
}

static HELPERS: PidLock<Option<Helpers>> = PidLock::new();

fn helper(queue: Arc<Queue>) {
    loop {
        let call = {
            let mut o = queue.offers();
            loop {
                if o.released {
                    return;
                }
                if let Some(c) = o.calls.pop_front() {
                    break c;
                }
                o = queue.more.wait(o).unwrap_or_else(|p| p.into_inner());
            }
        };
        call.serve();
    }
}

/// The queue of this process's helpers and how many there are: at least
/// `want` (capped at [`MAX_HELPERS`]), fewer if threads cannot be made.
/// A helper starts with the CPU affinity of the thread that made it: start
/// them from an unpinned thread ([`crate::Config::start_channels`]) if
/// callers pin themselves.
fn queue(want: usize) -> (Arc<Queue>, usize) {
    let want = want.min(MAX_HELPERS);
    let mut guard = HELPERS.lock();
    let h = guard
        .get_or_insert_with(|| None)
        .get_or_insert_with(|| Helpers {
            queue: Arc::new(Queue {
                calls: Mutex::new(Offers {
                    calls: VecDeque::new(),
                    released: false,
                }),
                more: Condvar::new(),
            }),
            started: 0,
        });
    while h.started < want {
        let q = h.queue.clone();
        let spawned = std::thread::Builder::new()
            .name("foliokit-helper".into())
            .spawn(move || helper(q));
        if spawned.is_err() {
            // Out of threads: the callers do the work themselves.
            break;
        }
        h.started += 1;
    }
    (h.queue.clone(), h.started)
}

/// Starts `n` helpers now, so that later calls (after a seccomp filter
/// forbids `clone`, say) make no threads. Returns how many are running.
pub(crate) fn start(n: usize) -> usize {
    queue(n);
    let mut guard = HELPERS.lock();
    guard
        .get_or_insert_with(|| None)
        .as_ref()
        .map_or(0, |h| h.started)
}

/// Ends this process's helpers once they finish the runs they are in; the
/// next [`fan_out`] starts new ones.
pub(crate) fn release() {
    let released = HELPERS.lock().get_or_insert_with(|| None).take();
    if let Some(h) = released {
        h.queue.offers().released = true;
        h.queue.more.notify_all();
    }
}

/// Runs `job` on the calling thread and on up to `extra` helpers at once,
/// and returns when no run is left. `job` must take its work from shared
/// state so that it finishes everything when run once, by the caller
/// alone, and does nothing wrong when run several times at once. Returns
/// how many helpers joined. A panic in any run is resumed here, after
/// every run has ended.
pub(crate) fn fan_out(extra: usize, job: &(dyn Fn() + Sync)) -> usize {
    if extra == 0 {
        job();
        return 0;
    }
    let (q, helpers) = queue(extra);
    let erased: *const (dyn Fn() + Sync + '_) = job;
    // SAFETY: only the lifetime is changed; see `Call::job` for why no
    // helper runs the closure after this call returns.
    let erased: *const (dyn Fn() + Sync + 'static) = unsafe { std::mem::transmute(erased) };
    let call = Arc::new(Call {
        job: erased,
        state: Mutex::new(CallState {
            open: true,
            running: 0,
            joined: 0,
            panic: None,
        }),
        finished: Condvar::new(),
    });
    {
        let mut o = q.offers();
        // An offer per helper at most: more would only be discarded.
        for _ in 0..extra.min(helpers) {
            o.calls.push_back(call.clone());
        }
    }
    q.more.notify_all();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Barrier;

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

    #[test]
    fn helpers_join_and_run_at_the_same_time() {
        // Two runs meet at a barrier: only possible if a helper runs the
        // loop alongside the caller. The first run in waits for the other.
        let barrier = Barrier::new(2);
        let met = AtomicUsize::new(0);
        let joined = fan_out(1, &|| {
            if met.fetch_add(1, Ordering::SeqCst) < 2 {
                barrier.wait();
            }
        });
        assert_eq!(joined, 1);
        assert_eq!(met.load(Ordering::SeqCst), 2);
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
    fn a_helper_panic_reaches_the_caller_after_every_run_ended() {
        let runs = AtomicUsize::new(0);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            fan_out(1, &|| {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    // Whoever is first waits for the second, then panics.
                    while runs.load(Ordering::SeqCst) < 2 {
                        std::thread::yield_now();
                    }
                    panic!("from a run");
                }
            })
        }));
        assert!(caught.is_err());
    }
}

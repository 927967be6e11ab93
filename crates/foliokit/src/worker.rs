//! foliokit's persistent threads, written once.
//!
//! Every thread foliokit starts is a *worker*: made by [`spawn`], it waits
//! on a [`Queue`] for jobs, runs each, and ends when its queue is closed.
//! Workers belong to a [`Crew`] (the queue and the threads serving it),
//! which releases them and knows what to do after `fork()`. Two roles are
//! built on it:
//!
//! - [`Role::Channel`]: a copy channel's worker
//!   ([`crate::channels::CpuChannel`]), a crew of one with a queue of its
//!   own, pinned where the application placed channels. It runs pieces of
//!   copy and clear batches and nothing else.
//! - [`Role::Helper`]: the helpers (`crate::helpers`), one crew for the
//!   process, whose threads take turns at callers' loops (populate's
//!   chunks, `move_pages` shares, relocation's batch loop), each run with
//!   the caller's CPU affinity and NUMA policy ([`Placement`]).
//!
//! # Why two roles, and why nothing waits in a circle
//!
//! The roles keep separate threads on purpose. Relocation runs its batch
//! loop on a helper, and that loop submits copies to a channel pool and
//! waits for them. Were channels and helpers one set of threads, enough
//! such loops would occupy every thread, and the copies they wait for
//! would never run. With two roles, each edge of "who waits for whom"
//! ends at work that finishes, so no circle (and no hang) can form:
//!
//! - an application thread may wait for helpers (`on_helper`, or the
//!   helpers already inside its `fan_out` loop), for channels, and, on a
//!   page relocation has out, for the helper running that relocation;
//! - a helper waits for a helper only once that helper is inside a loop
//!   it offered (the items it took are syscalls and page touches), never
//!   for one to *start*: `on_helper` called on a helper runs the job
//!   right there, and `fan_out` never waits for one;
//! - a helper waits for a channel only while the channel runs a piece
//!   of the helper's own batch: relocation's pieces copy its staging
//!   memory to the new folios, which nobody else touches, so they finish.
//!   A piece no channel has started is run by the helper itself once the
//!   channels have finished none for a while (relocation's batches are
//!   submitted with `channels::Policy::run_unstarted_after`): a
//!   channel's worker may be held up by another batch whose copy waits for
//!   a page this very relocation has out;
//! - a channel's worker waits for nothing but its queue and the memory of
//!   the pieces it runs: a batch submitted from a channel's worker (a
//!   caller's copy function that copies again) runs on that thread instead
//!   of being queued ([`current_role`]).
//!
//! Capacity follows from the same split: each channel has its own thread
//! (a pool of `n` channels has `n`), which no helper job can occupy.
//!
//! A channel's worker blocks every asynchronous signal, so no application
//! handler runs on it: a handler that touched a page relocation has taken
//! out would wait for the helper that puts it back, which waits for this
//! channel's copy. The signals a fault raises stay unblocked there: a
//! machine-check-safe copy recovers from its SIGBUS on this very thread.
//! A helper blocks every signal but SIGBUS: it runs only foliokit's own
//! loops, and some read a source that may raise SIGBUS with
//! machine-check-safe loads (a lazy fill looking for zero pages), which
//! recover on the thread they run on.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::sys::numa::{self, NodeMask};

/// What a worker is for; fixed when it is spawned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A copy channel's worker, pinned to `cpu` if there is one.
    Channel {
        /// The CPU it is pinned to; `None`: wherever the scheduler puts it.
        cpu: Option<usize>,
    },
    /// A helper: runs callers' loops, each under its caller's
    /// [`Placement`].
    Helper,
}

impl Role {
    /// The signal mask a worker of this role keeps for its whole life.
    fn mask(self) -> libc::sigset_t {
        let mut set = every_signal();
        // SAFETY: edits our own, initialised sigset_t.
        unsafe { libc::sigdelset(&mut set, libc::SIGBUS) };
        if let Role::Channel { .. } = self {
            // Raised by the instruction that faults, on this thread:
            // blocked, the kernel would kill the process instead of
            // running the handler (mc's recovery included).
            for sig in [
                libc::SIGBUS,
                libc::SIGSEGV,
                libc::SIGILL,
                libc::SIGFPE,
                libc::SIGTRAP,
                libc::SIGSYS,
            ] {
                // SAFETY: edits our own, initialised sigset_t.
                unsafe { libc::sigdelset(&mut set, sig) };
            }
        }
        set
    }
}

/// A set of every signal.
fn every_signal() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, filled by libc on our local copy.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        set
    }
}

thread_local! {
    /// The role of this thread if foliokit spawned it.
    static ROLE: Cell<Option<Role>> = const { Cell::new(None) };
}

/// The role of the calling thread: `None` for the application's threads.
pub(crate) fn current_role() -> Option<Role> {
    ROLE.with(Cell::get)
}

/// Whether the calling thread is a copy channel's worker.
pub(crate) fn on_channel() -> bool {
    matches!(current_role(), Some(Role::Channel { .. }))
}

/// Whether the calling thread is a helper.
pub(crate) fn on_helper() -> bool {
    current_role() == Some(Role::Helper)
}

/// Where a thread runs and allocates: its CPU affinity and its NUMA memory
/// policy. A helper takes on its caller's for the time it runs the
/// caller's loop (they decide where populate's faults allocate pages); a
/// channel's worker is pinned to one CPU once.
pub(crate) struct Placement {
    pub(crate) cpus: libc::cpu_set_t,
    /// Mode (with its flags) and nodes; `None`: left as it is (a kernel
    /// without NUMA).
    pub(crate) policy: Option<(libc::c_int, NodeMask)>,
}

impl Placement {
    /// The calling thread's; `None` if they cannot be read (more CPUs than
    /// a `cpu_set_t` holds, a seccomp filter).
    pub(crate) fn of_this_thread() -> Option<Placement> {
        // SAFETY: cpu_set_t is plain data; the call writes only `cpus`.
        let cpus = unsafe {
            let mut cpus: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of_val(&cpus), &mut cpus) != 0 {
                return None;
            }
            cpus
        };
        let policy = numa::get_mempolicy().ok()?;
        Some(Placement { cpus, policy })
    }

    /// Only CPU `cpu` (below `CPU_SETSIZE`), the memory policy left alone.
    fn pinned(cpu: usize) -> Placement {
        // SAFETY: cpu_set_t is plain data; `cpu` is below CPU_SETSIZE.
        let cpus = unsafe {
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut one);
            one
        };
        Placement { cpus, policy: None }
    }

    /// Makes them this thread's; `false` if the kernel refused.
    pub(crate) fn apply(&self) -> bool {
        // SAFETY: reads `cpus`, a whole cpu_set_t.
        let pinned = unsafe {
            libc::sched_setaffinity(0, std::mem::size_of_val(&self.cpus), &self.cpus) == 0
        };
        pinned
            && self
                .policy
                .as_ref()
                .is_none_or(|(mode, nodes)| numa::set_mempolicy(*mode, nodes).is_ok())
    }
}

/// Jobs waiting for the workers of one crew.
pub(crate) struct Queue<J> {
    /// The process whose workers serve it. In a forked child nobody does,
    /// and a parent thread may have held its lock at the fork: there it is
    /// never locked.
    pid: u32,
    jobs: Mutex<Jobs<J>>,
    more: Condvar,
}

struct Jobs<J> {
    waiting: VecDeque<J>,
    /// No more jobs are taken; workers end once `waiting` is empty.
    closed: bool,
}

impl<J> Queue<J> {
    fn new() -> Self {
        Queue {
            pid: std::process::id(),
            jobs: Mutex::new(Jobs {
                waiting: VecDeque::new(),
                closed: false,
            }),
            more: Condvar::new(),
        }
    }

    /// Whether this process is the one whose workers serve the queue.
    fn here(&self) -> bool {
        std::process::id() == self.pid
    }

    fn jobs(&self) -> MutexGuard<'_, Jobs<J>> {
        // Jobs run outside the lock, and nothing in it panics.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `jobs` to the workers, all of them or none: `false`, with the
    /// jobs dropped unrun, where the queue is closed or belongs to the
    /// parent of this forked process (nobody would run them).
    pub(crate) fn push(&self, jobs: impl IntoIterator<Item = J>) -> bool {
        if !self.here() {
            return false;
        }
        {
            let mut j = self.jobs();
            if j.closed {
                return false;
            }
            j.waiting.extend(jobs);
        }
        self.more.notify_all();
        true
    }

    /// A worker's wait for its next job: `None` once the queue is closed
    /// and empty.
    fn next(&self) -> Option<J> {
        let mut j = self.jobs();
        loop {
            if let Some(job) = j.waiting.pop_front() {
                return Some(job);
            }
            if j.closed {
                return None;
            }
            j = self.more.wait(j).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A queue and the workers that serve it.
///
/// Dropped, it closes the queue (its workers finish the jobs queued, then
/// end) and waits for them. In a forked child it leaks them instead: the
/// parent's threads do not exist there, so joining would hang, and the
/// queue's lock may have been held by one of them at the fork.
pub(crate) struct Crew<J> {
    queue: Arc<Queue<J>>,
    workers: Vec<JoinHandle<()>>,
}

impl<J: Send + 'static> Crew<J> {
    /// A crew with no workers yet.
    pub(crate) fn new() -> Self {
        Crew {
            queue: Arc::new(Queue::new()),
            workers: Vec::new(),
        }
    }

    /// Its queue, to push jobs to and to [`spawn`] workers on.
    pub(crate) fn queue(&self) -> &Arc<Queue<J>> {
        &self.queue
    }

    /// Takes on workers spawned on its queue.
    pub(crate) fn hire(&mut self, workers: Vec<JoinHandle<()>>) {
        self.workers.extend(workers);
    }

    /// Closes the queue at once and hands back the jobs no worker took:
    /// the workers end as soon as they finish the job they are in.
    pub(crate) fn withdraw(&self) -> Vec<J> {
        if !self.queue.here() {
            return Vec::new();
        }
        let mut j = self.queue.jobs();
        j.closed = true;
        let left = j.waiting.drain(..).collect();
        drop(j);
        self.queue.more.notify_all();
        left
    }
}

impl<J> Drop for Crew<J> {
    fn drop(&mut self) {
        let workers = std::mem::take(&mut self.workers);
        if !self.queue.here() {
            // Forked child: neither join nor detach threads that are not
            // here, and never free the queue (an extra count keeps the
            // field's drop from it).
            std::mem::forget(workers);
            std::mem::forget(self.queue.clone());
            return;
        }
        self.queue.jobs().closed = true;
        self.queue.more.notify_all();
        let me = std::thread::current().id();
        for w in workers {
            // A worker that drops its own crew (a helper releasing the
            // helpers from inside a caller's loop) cannot wait for itself:
            // it ends when that job returns.
            if w.thread().id() != me {
                let _ = w.join();
            }
        }
    }
}

/// Starts a worker named `name` in role `role`, serving `queue`: `serve`
/// runs each job it takes, until the queue is closed and empty. `None` if
/// the thread cannot be made (out of threads, a seccomp filter): the
/// role's callers then do the work themselves.
///
/// No signal can reach the worker before it has its role's mask: this
/// thread blocks every signal around the spawn (the new thread inherits
/// that, and this thread's own mask is put back after), and the worker's
/// first act is to set its role's. Then it takes on its role's placement:
/// a channel is pinned (failing that, which a cgroup's CPU set can cause,
/// it stays unpinned, still correct), a helper takes each caller's as it
/// runs the caller's loop.
pub(crate) fn spawn<J: Send + 'static>(
    role: Role,
    name: String,
    queue: &Arc<Queue<J>>,
    mut serve: impl FnMut(J) + Send + 'static,
) -> Option<JoinHandle<()>> {
    let queue = queue.clone();
    spawn_masked(role.mask(), name, move || {
        ROLE.with(|r| r.set(Some(role)));
        if let Role::Channel { cpu: Some(cpu) } = role {
            // A performance hint: see above.
            let _ = Placement::pinned(cpu).apply();
        }
        while let Some(job) = queue.next() {
            serve(job);
        }
    })
    .ok()
}

/// Starts a thread of foliokit's own that is no worker (a lazy fill's),
/// with a channel's signal mask from its first instruction: no
/// asynchronous signal (an application's handler run there could touch
/// memory only this thread fills in, and wait for itself), while the
/// signals a faulting instruction raises still reach it, so a
/// machine-check-safe copy recovers there.
pub(crate) fn spawn_shielded(
    name: String,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    spawn_masked(Role::Channel { cpu: None }.mask(), name, f)
}

/// The stacks of foliokit's own threads while they run (this process's:
/// a forked child has none of them). Relocation refuses a range holding
/// one: a channel or fill thread touching a page of its stack that is out
/// would wait for the very copy it was to run.
static STACKS: crate::pidlock::PidLock<Vec<(usize, usize)>> = crate::pidlock::PidLock::new();

/// This thread's stack, `[lo, hi)`, while it runs.
struct OwnStack(Option<(usize, usize)>);

impl OwnStack {
    fn register() -> OwnStack {
        let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
        let (mut lo, mut size) = (std::ptr::null_mut(), 0usize);
        // SAFETY: glibc fills `attr` for this thread (checked), then reads
        // its stack from it; the attr is destroyed after.
        let got = unsafe {
            libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) == 0 && {
                let ok = libc::pthread_attr_getstack(attr.as_ptr(), &mut lo, &mut size) == 0;
                libc::pthread_attr_destroy(attr.as_mut_ptr());
                ok
            }
        };
        let range = got.then(|| (lo as usize, lo as usize + size));
        if let Some(r) = range {
            STACKS.lock().get_or_insert_with(Vec::new).push(r);
        }
        OwnStack(range)
    }
}

impl Drop for OwnStack {
    fn drop(&mut self) {
        if let Some(r) = self.0 {
            let mut g = STACKS.lock();
            let v = g.get_or_insert_with(Vec::new);
            if let Some(i) = v.iter().position(|&x| x == r) {
                v.swap_remove(i);
            }
        }
    }
}

/// The stacks of foliokit's running threads, `[lo, hi)` each.
pub(crate) fn own_stacks() -> Vec<(usize, usize)> {
    STACKS.lock().get_or_insert_with(Vec::new).clone()
}

/// Spawns `f` on a thread named `name` that runs with `mask` from the
/// start: this thread blocks every signal around the spawn (the new thread
/// inherits that, and this thread's own mask is put back after), and the
/// new thread's first act is to set `mask`.
fn spawn_masked(
    mask: libc::sigset_t,
    name: String,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    let all = every_signal();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: `all` is a whole sigset_t; the old mask is written to `old`,
    // which pthread_sigmask fills on success (checked below). SIG_BLOCK
    // only adds signals: nothing blocked here is let through meanwhile.
    let masked = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &all, old.as_mut_ptr()) } == 0;
    let made = std::thread::Builder::new().name(name).spawn(move || {
        // SAFETY: `mask` is a whole sigset_t of our own.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut()) };
        let _stack = OwnStack::register();
        f()
    });
    if masked {
        // SAFETY: `old` was filled by the successful call above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut()) };
    }
    made
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// The calling thread's signal mask.
    fn this_mask() -> libc::sigset_t {
        // SAFETY: sigset_t is plain data; the call only writes `now`.
        unsafe {
            let mut now: libc::sigset_t = std::mem::zeroed();
            assert_eq!(
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut now),
                0
            );
            now
        }
    }

    fn blocked(set: &libc::sigset_t, sig: libc::c_int) -> bool {
        // SAFETY: reads our own sigset_t.
        unsafe { libc::sigismember(set, sig) == 1 }
    }

    #[test]
    fn each_role_runs_its_jobs_with_its_signal_mask_and_knows_its_role() {
        let before = this_mask();
        for role in [Role::Channel { cpu: None }, Role::Helper] {
            let mut crew = Crew::new();
            let (tx, rx) = mpsc::channel();
            let t = spawn(role, "foliokit-test".into(), crew.queue(), move |()| {
                let _ = tx.send((this_mask(), current_role()));
            });
            let Some(t) = t else {
                eprintln!("SKIP: no thread could be started here");
                return;
            };
            crew.hire(vec![t]);
            assert!(crew.queue().push([()]));
            let (mask, seen) = rx.recv().unwrap();
            assert_eq!(seen, Some(role));
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGCHLD] {
                assert!(blocked(&mask, sig), "{role:?}: signal {sig} reaches it");
            }
            // A machine-check-safe read recovers on either; a helper
            // leaves the other fault signals blocked.
            assert!(!blocked(&mask, libc::SIGBUS), "{role:?}: SIGBUS blocked");
            assert_eq!(
                blocked(&mask, libc::SIGSEGV),
                role == Role::Helper,
                "{role:?}: SIGSEGV"
            );
        }
        assert_eq!(current_role(), None);
        let after = this_mask();
        for sig in 1..libc::SIGRTMIN() {
            assert_eq!(
                blocked(&before, sig),
                blocked(&after, sig),
                "spawner's mask"
            );
        }
    }

    #[test]
    fn a_shielded_thread_takes_no_application_signal_but_its_own_faults() {
        let before = this_mask();
        let t = spawn_shielded("foliokit-test".into(), || {
            let mask = this_mask();
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGCHLD] {
                assert!(blocked(&mask, sig), "signal {sig} reaches it");
            }
            for sig in [libc::SIGBUS, libc::SIGSEGV] {
                assert!(!blocked(&mask, sig), "signal {sig} is blocked");
            }
        });
        match t {
            Ok(t) => t.join().expect("the mask checks passed"),
            Err(e) => eprintln!("SKIP: no thread could be started here: {e}"),
        }
        let after = this_mask();
        for sig in [libc::SIGINT, libc::SIGUSR1, libc::SIGBUS] {
            assert_eq!(
                blocked(&before, sig),
                blocked(&after, sig),
                "caller's {sig}"
            );
        }
    }

    #[test]
    fn a_dropped_crew_finishes_its_queue_and_a_withdrawn_one_hands_it_back() {
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for withdraw in [false, true] {
            let gate = Arc::new(std::sync::Barrier::new(2));
            let mut crew: Crew<usize> = Crew::new();
            let (g, d) = (gate.clone(), done.clone());
            let Some(t) = spawn(
                Role::Helper,
                "foliokit-test".into(),
                crew.queue(),
                move |i| {
                    if i == 0 {
                        // In: the test may now withdraw; then let go.
                        g.wait();
                        g.wait();
                    }
                    d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                },
            ) else {
                eprintln!("SKIP: no thread could be started here");
                return;
            };
            crew.hire(vec![t]);
            done.store(0, std::sync::atomic::Ordering::SeqCst);
            // Job 0 holds the worker until the rest was handed back.
            assert!(crew.queue().push(0..4));
            gate.wait();
            let left = if withdraw {
                crew.withdraw()
            } else {
                Vec::new()
            };
            assert_eq!(!crew.queue().push([]), withdraw, "closed");
            gate.wait();
            let q = crew.queue().clone();
            drop(crew);
            assert!(!q.push([9]));
            let ran = done.load(std::sync::atomic::Ordering::SeqCst);
            if withdraw {
                assert_eq!((ran, left), (1, vec![1, 2, 3]));
            } else {
                assert_eq!(ran, 4);
            }
        }
    }
}

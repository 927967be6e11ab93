//! A channel backed by one persistent worker thread, pinned as the
//! application chose at start-up (unpinned by default).

use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{Channel, ChannelError, Completion, Op, Piece};
use crate::arch::sfence;
use std::sync::OnceLock;

struct Work {
    pieces: Vec<Piece>,
    op: Op,
    done: Arc<Completion>,
}

/// One worker thread. After `fork()` the child has the channel's memory but
/// not its thread: there the channel refuses work (so a pool runs it on the
/// calling thread) and, dropped, leaks the worker's handle and queue
/// instead of joining a thread that does not exist.
pub struct CpuChannel {
    name: String,
    /// The process whose thread `thread` is.
    pid: u32,
    tx: Option<Sender<Work>>,
    thread: Option<JoinHandle<()>>,
}

/// Where copy channel workers run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelCpus {
    /// Not pinned: the scheduler places them (the default; nothing collides
    /// with threads the application pinned).
    #[default]
    Unpinned,
    /// Channel `i` pinned to the `i`-th CPU of the process's affinity mask
    /// (wrapping): steady placement for measurements.
    Spread,
    /// Channel `i` pinned to `cpus[i % len]`.
    Cpus(Vec<usize>),
}

/// Where channel workers run: what [`crate::init`] passed down, or the
/// default (unpinned) once the first pool asked before any `init`.
static PLACEMENT: OnceLock<ChannelCpus> = OnceLock::new();

/// Sets the placement; false when a pool (or an earlier `init`) fixed it.
pub(crate) fn fix_placement(cpus: ChannelCpus) -> bool {
    PLACEMENT.set(cpus).is_ok()
}

/// Whether the placement is fixed (a pool was made, or `init` ran).
pub(crate) fn placement_fixed() -> bool {
    PLACEMENT.get().is_some()
}

/// The CPU channel `index` runs on, as [`ChannelCpus`] says: none, or the
/// `index`-th of the list (wrapping). Read on the thread that makes the
/// pool, so the placement is fixed before any worker starts.
fn target(index: usize) -> Option<usize> {
    let cpu = match PLACEMENT.get_or_init(ChannelCpus::default) {
        // `init` turns Spread into the list of CPUs allowed when it ran,
        // and the defaults are Unpinned: Spread never reaches here.
        ChannelCpus::Unpinned | ChannelCpus::Spread => return None,
        ChannelCpus::Cpus(list) if list.is_empty() => return None,
        ChannelCpus::Cpus(list) => list[index % list.len()],
    };
    (cpu < libc::CPU_SETSIZE as usize).then_some(cpu)
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; `cpu` is below CPU_SETSIZE; the
    // call reads only `one`.
    unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        // Pinning is a performance hint: failure (a CPU outside the
        // cgroup's set) leaves the worker unpinned, which is still correct.
        let _ = libc::sched_setaffinity(0, std::mem::size_of_val(&one), &one);
    }
}

impl CpuChannel {
    /// Starts the worker thread of channel `index` (named `cpu<index>`),
    /// pinned as [`crate::Config::channel_cpus`] says. If the thread cannot
    /// be spawned the channel refuses every batch, and its pool does the
    /// work on the calling thread.
    pub fn new(index: usize) -> Self {
        let (tx, rx) = channel::<Work>();
        let name = format!("cpu{index}");
        let cpu = target(index);
        let thread = std::thread::Builder::new()
            .name(format!("foliokit-{name}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    pin(cpu);
                }
                while let Ok(w) = rx.recv() {
                    for p in &w.pieces {
                        // Offered pieces may be other channels' too: run
                        // only those this worker takes.
                        if !w.done.claim(p) {
                            continue;
                        }
                        // A copy function that panics (a caller's own `Op`)
                        // would end this thread with the piece claimed and
                        // never reported: the batch would wait forever, or
                        // its caller would free memory still in use. Stop.
                        let ran = std::panic::catch_unwind(|| {
                            // SAFETY: the submitter guarantees the piece's
                            // ranges stay valid and unaliased until it is
                            // reported done just below; the claim makes this
                            // its only run, and it is not touched after.
                            unsafe { w.op.run_partial(p) }
                        });
                        let Ok(did) = ran else {
                            eprintln!("foliokit: a copy channel's operation panicked; aborting");
                            std::process::abort();
                        };
                        // Streaming stores are only ordered by a fence on the
                        // thread that issued them: drain before reporting.
                        sfence();
                        if did < p.len() {
                            // An mc copy's source faulted: the rest of the
                            // piece is untouched, and reported so.
                            w.done.piece_failed(p, did);
                        } else {
                            w.done.piece_done(p);
                        }
                    }
                }
            })
            .ok();
        CpuChannel {
            name,
            pid: std::process::id(),
            tx: thread.as_ref().map(|_| tx),
            thread,
        }
    }

    /// Whether this process is the one whose thread serves the channel.
    fn worker_here(&self) -> bool {
        std::process::id() == self.pid
    }
}

// SAFETY: the worker runs each piece only after claiming it, with the
// batch's op, on the piece's own ranges, drains, then reports it; a
// refused submit hands the work back unrun.
unsafe impl Channel for CpuChannel {
    fn name(&self) -> &str {
        &self.name
    }

    /// Workers claim each piece before running it (see the loop in `new`).
    fn claims_pieces(&self) -> bool {
        true
    }

    /// # Safety
    /// As [`Channel::submit`].
    unsafe fn submit(
        &self,
        pieces: Vec<Piece>,
        op: Op,
        done: Arc<Completion>,
    ) -> Result<(), ChannelError> {
        let stopped = || ChannelError::Stopped(self.name.clone());
        // In a forked child the queue is still open but nobody reads it.
        if !self.worker_here() {
            return Err(stopped());
        }
        // On failure the queue hands the work back unrun (dropped here).
        self.tx
            .as_ref()
            .ok_or_else(stopped)?
            .send(Work { pieces, op, done })
            .map_err(|_| stopped())
    }
}

impl Drop for CpuChannel {
    fn drop(&mut self) {
        if !self.worker_here() {
            // Forked child: the worker does not exist here, so joining it
            // would hang; and its queue's internal locks may have been held
            // by a parent thread at the fork, so do not even close it.
            std::mem::forget(self.tx.take());
            std::mem::forget(self.thread.take());
            return;
        }
        // Closing the queue ends the worker's loop.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

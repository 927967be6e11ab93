//! A channel backed by one persistent worker ([`crate::worker`], in the
//! channel role), pinned as the application chose at start-up (unpinned
//! by default).

use std::sync::Arc;
use std::sync::OnceLock;

use super::{Channel, ChannelError, Completion, Op, Piece};
use crate::worker::{self, Crew, Role};

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
    /// A crew of one; `None` where its thread could not be made.
    crew: Option<Crew<Work>>,
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

impl CpuChannel {
    /// Starts the worker thread of channel `index` (named `cpu<index>`),
    /// pinned as [`crate::Config::channel_cpus`] says. If the thread cannot
    /// be spawned the channel refuses every batch, and its pool does the
    /// work on the calling thread.
    pub fn new(index: usize) -> Self {
        let name = format!("cpu{index}");
        let mut crew = Crew::new();
        let role = Role::Channel { cpu: target(index) };
        let crew = worker::spawn(role, format!("foliokit-{name}"), crew.queue(), run).map(|t| {
            crew.hire(vec![t]);
            crew
        });
        CpuChannel { name, crew }
    }
}

/// The worker's part: runs the pieces of `w` it claims, drains, reports;
/// withdraws those not started yet once the batch is cut short.
fn run(w: Work) {
    for p in &w.pieces {
        // Offered pieces may be other channels' too, of channels that
        // claim pieces: this worker runs or withdraws only those free.
        // SAFETY: the submitter guarantees the piece's ranges stay valid
        // and unaliased until it is reported done.
        unsafe { w.done.start_or_withdraw(w.op, p) };
    }
}

// SAFETY: the worker runs each piece only after claiming it, with the
// batch's op, on the piece's own ranges, drains, then reports it; a piece
// it withdraws (a batch cut short) is claimed first, so nobody runs it,
// and counted down without finishing its folios; a refused submit hands
// the work back unrun.
unsafe impl Channel for CpuChannel {
    fn name(&self) -> &str {
        &self.name
    }

    /// Workers claim each piece before running it (see `run`).
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
        // A queue that takes nothing (no thread, or a forked child, where
        // nobody reads it) hands the work back unrun (dropped here).
        let taken = self
            .crew
            .as_ref()
            .is_some_and(|c| c.queue().push([Work { pieces, op, done }]));
        if taken {
            Ok(())
        } else {
            Err(ChannelError::Stopped(self.name.clone()))
        }
    }
}

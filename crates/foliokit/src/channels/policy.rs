//! The submitter's rules for one batch, handed in with it: when to cut it
//! short, what to post when it ends, and whether waiting for it runs the
//! pieces stalled channels have not started. The channels ask and post;
//! what the answers mean is the caller's.

use std::os::fd::OwnedFd;
use std::time::Duration;

/// A test a channel runs before it starts a piece: `true` cuts the batch
/// short there.
pub(super) type CutRule = Box<dyn Fn() -> bool + Send + Sync>;

/// How a batch is to run, as its caller decides
/// ([`super::ChannelPool::submit_copy_mc_with`],
/// [`super::ChannelPool::copy_folios_with`]). The default: never cut short,
/// post nothing, and wait for the channels however long they take.
#[derive(Default)]
pub(crate) struct Policy {
    pub(super) cut: Option<CutRule>,
    pub(super) ended: Option<OwnedFd>,
    pub(super) stall: Option<Duration>,
}

impl Policy {
    /// Before a channel starts each piece it asks `due`; once it answers
    /// `true` that piece and every later unstarted one are taken back, as
    /// by [`super::InFlight::cut`]. The channels then stop at their next
    /// piece and free their CPUs, even where the caller has no CPU to run
    /// on and cut the batch itself. `due` is in place before any channel
    /// starts: a caller preempted by the very channels it woke is covered
    /// from the first piece. Pieces are merged only up to
    /// [`crate::params::CHANNEL_CUT_PIECE_BYTES`], which bounds what a cut
    /// waits for. `due` runs on the channels' threads, once per piece, so
    /// it must be cheap and must not block.
    pub(crate) fn cut_when(mut self, due: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        self.cut = Some(Box::new(due));
        self
    }

    /// Posts eventfd `fd` once the batch ends (at once for an empty one),
    /// for a caller that waits on it beside other descriptors. The batch
    /// owns `fd` (a duplicate of the caller's), so posting after the caller
    /// saw the end and closed its own never writes to a reused number.
    pub(crate) fn post_end(mut self, fd: OwnedFd) -> Self {
        self.ended = Some(fd);
        self
    }

    /// While the caller waits for the batch, whenever its channels finish
    /// no piece for `stall` it runs the pieces no channel has started (of
    /// channels that claim pieces; others may run any piece they were
    /// given). For a caller that must not wait for a channel to start: one
    /// whose own work a channel's worker may be waiting for (see
    /// `crate::worker`).
    pub(crate) fn run_unstarted_after(mut self, stall: Duration) -> Self {
        self.stall = Some(stall);
        self
    }

    /// The most bytes the batch merges into one piece: less when it can be
    /// cut short, since a cut waits for the pieces in progress.
    pub(super) fn piece_bytes(&self) -> usize {
        if self.cut.is_some() {
            crate::params::CHANNEL_CUT_PIECE_BYTES
        } else {
            crate::params::CHANNEL_PIECE_BYTES
        }
    }
}

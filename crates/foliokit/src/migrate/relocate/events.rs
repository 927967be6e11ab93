//! The userfaultfd's events during a batch: reading them into the batch's
//! ledger (a zap, an unmap, a remap, a fork), and ending the batch with
//! none in flight.

use super::{Outcome, Run};
use crate::migrate::stage::Stage;
use crate::migrate::track::{PageLedger, State};
use crate::sys::uffd::Msg;
use crate::uffd::child::{fill_child, Fill, Owed};

/// How many rounds [`quiesce`] waits for in-flight events before it gives
/// up (each round reads them; none can start once nothing is registered).
const QUIESCE_ROUNDS: usize = 100_000;

/// Unregisters the batch and waits until no event is in flight, handling
/// every one that arrives meanwhile (a remap read late moves a registered
/// range, which is unregistered in turn).
pub(super) fn quiesce(run: &Run, b: &mut PageLedger, parking: &Stage, out: &mut Outcome) {
    for _ in 0..QUIESCE_ROUNDS {
        drain(run, b, parking, out);
        for &(s, e) in &b.registered {
            // Fails where no mapping of ours is left there: nothing to do.
            let _ = run.uffd.unregister(s, e - s);
        }
        match run.probe.borrow_mut().quiet(run.uffd) {
            Ok(true) => return,
            Ok(false) => std::thread::yield_now(),
            Err(e) => {
                out.notes.push(format!("event probe failed: {e}"));
                return;
            }
        }
    }
    out.notes
        .push("events kept arriving after the batch was unregistered".into());
}

/// Reads every waiting message and applies it to the batch; returns
/// once none is left.
pub(super) fn drain(run: &Run, b: &mut PageLedger, parking: &Stage, out: &mut Outcome) {
    let msgs = match run.uffd.read_all() {
        Ok(m) => m,
        Err(e) => {
            out.notes
                .push(format!("reading userfaultfd events failed: {e}"));
            return;
        }
    };
    for m in msgs {
        match m {
            Msg::Fault { .. } => {} // woken by the install or unregistration
            Msg::Remove { start: s, end: e } => b.zap(s, e, false),
            Msg::Unmap { start: s, end: e } => b.zap(s, e, true),
            Msg::Remap { from, to, len: l } => b.remap(from, to, l),
            Msg::Fork(child) => {
                // A wipe-on-fork child must see zeros there, never the
                // parent's bytes.
                let wipe = crate::sys::vma::wipes_on_fork(b.base, b.len() * run.page);
                let mut owed = Owed::default();
                for i in (0..b.len()).filter(|&i| {
                    !wipe && b.in_stage[i] && !matches!(b.state[i], State::In | State::Dropped)
                }) {
                    owed.push(b.addr[i], parking.base + i * run.page, run.page, false);
                }
                let how = Fill {
                    unit: run.page,
                    poison: false,
                };
                fill_child(child, owed, how);
            }
        }
    }
}

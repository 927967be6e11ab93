//! A channel backed by one persistent worker thread pinned to a CPU.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::{Channel, ChannelError, Completion, Op, Piece};
use crate::arch::sfence;

struct Work {
    pieces: Vec<Piece>,
    op: Op,
    done: Arc<Completion>,
}

pub struct CpuChannel {
    name: String,
    tx: Mutex<Option<Sender<Work>>>,
    thread: Option<JoinHandle<()>>,
}

/// Pins the calling thread to the `index`-th CPU it is allowed to run on.
fn pin(index: usize) {
    // SAFETY: cpu_set_t is plain data; the calls read/write only `set`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) != 0 {
            return;
        }
        let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        if allowed.is_empty() {
            return;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(allowed[index % allowed.len()], &mut one);
        // Pinning is a performance hint: failure (e.g. in a restricted
        // cgroup) leaves the worker unpinned, which is still correct.
        let _ = libc::sched_setaffinity(0, std::mem::size_of_val(&one), &one);
    }
}

impl CpuChannel {
    pub fn new(index: usize) -> Self {
        let (tx, rx) = channel::<Work>();
        let name = format!("cpu{index}");
        let thread = std::thread::Builder::new()
            .name(format!("foliokit-{name}"))
            .spawn(move || {
                pin(index);
                while let Ok(w) = rx.recv() {
                    for p in &w.pieces {
                        // SAFETY: the submitter guarantees the piece's ranges
                        // stay valid and unaliased until completion.
                        unsafe { w.op.run(p) };
                        // Streaming stores are only ordered by a fence on the
                        // thread that issued them: drain before reporting.
                        sfence();
                        w.done.piece_done(p.folio);
                    }
                }
            })
            .ok();
        CpuChannel {
            name,
            tx: Mutex::new(thread.as_ref().map(|_| tx)),
            thread,
        }
    }
}

impl Channel for CpuChannel {
    fn name(&self) -> &str {
        &self.name
    }

    fn submit(
        &self,
        pieces: Vec<Piece>,
        op: Op,
        done: Arc<Completion>,
    ) -> Result<(), ChannelError> {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        tx.as_ref()
            .ok_or_else(|| ChannelError::Stopped(self.name.clone()))?
            .send(Work { pieces, op, done })
            .map_err(|_| ChannelError::Stopped(self.name.clone()))
    }
}

impl Drop for CpuChannel {
    fn drop(&mut self) {
        // Closing the queue ends the worker's loop.
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

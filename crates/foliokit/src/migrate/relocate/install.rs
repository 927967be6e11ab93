//! Putting pages back: copying parked pages into the destination folios
//! and installing those (steps 6 and 7), or moving parked pages back
//! unchanged where a batch cannot finish them.

use std::io;
use std::time::Instant;

use super::events::drain;
use super::{Outcome, Run};
use crate::channels::Policy;
use crate::migrate::stage::Stage;
use crate::migrate::track::{PageLedger, State};
use crate::sys::errno;
use crate::sys::uffd;

/// Step 6: copies parked pages into the destination folios, in pieces
/// that never cross a folio boundary, through the channels.
pub(super) fn copy_in_stage(
    run: &Run,
    b: &PageLedger,
    parking: &Stage,
    dest: &Stage,
    start: usize,
) -> Result<(), crate::channels::ChannelError> {
    let page = run.page;
    let mut pieces: Vec<(usize, usize)> = Vec::new(); // (first index, pages)
    for (i, k) in runs_by_index(b) {
        let mut j = i;
        while j < i + k {
            let to_boundary = (run.folio - (start + j * page) % run.folio) / page;
            let m = to_boundary.min(i + k - j);
            pieces.push((j, m));
            j += m;
        }
    }
    pieces.sort_by_key(|&(_, m)| m);
    for group in pieces.chunk_by(|a, b| a.1 == b.1) {
        let size = group[0].1 * page;
        let dsts: Vec<*mut u8> = group
            .iter()
            .map(|&(j, _)| (dest.base + j * page) as *mut u8)
            .collect();
        let srcs: Vec<*const u8> = group
            .iter()
            .map(|&(j, _)| (parking.base + j * page) as *const u8)
            .collect();
        // Never wait for a channel to start: its worker may wait for a page
        // this relocation has out (see `crate::worker`).
        let policy = Policy::default().run_unstarted_after(crate::params::CHANNEL_STALL);
        // SAFETY: both areas are our own mappings, private to this call;
        // every parked page is present (moved there), every destination
        // page allocated; pieces are disjoint.
        unsafe {
            run.pool
                .copy_folios_with(&dsts, &srcs, size, run.copy, policy)
        }?;
    }
    Ok(())
}

/// Moves parked pages back where they came from (their bytes unchanged).
pub(super) fn restore(run: &Run, b: &mut PageLedger, parking: &Stage, out: &mut Outcome) {
    put_back(run, b, parking, out, |_, _| true);
}

/// Moves the parked pages `pick` chooses back where they came from, their
/// bytes unchanged, each with its whole PMD unit (a THP goes back as the
/// PMD it came out as); they become `Left`, for the kernel path. Returns
/// how many pages went back.
pub(super) fn put_back(
    run: &Run,
    b: &mut PageLedger,
    parking: &Stage,
    out: &mut Outcome,
    pick: impl Fn(&PageLedger, usize) -> bool,
) -> usize {
    let mut back = 0;
    let mut i = 0;
    while i < b.len() {
        let (f, m) = b.unit_of(i);
        let unit = f..f + m;
        let chosen = unit.clone().any(|j| b.state[j] == State::Out && pick(b, j));
        if !chosen {
            i = f + m;
            continue;
        }
        let whole = m > 1 && move_back(run, b, parking, out, f, m, false).is_ok();
        for j in unit {
            if b.state[j] != State::Out {
                continue; // zapped or unmapped meanwhile (an event said so)
            }
            let res = if whole {
                Ok(())
            } else {
                move_back(run, b, parking, out, j, 1, false)
                    .or_else(|_| move_back(run, b, parking, out, j, 1, true))
            };
            match res {
                Ok(()) => {
                    b.state[j] = State::Left;
                    b.in_stage[j] = false;
                    back += 1;
                }
                Err(e) => {
                    // No mapping of ours there any more (unmapped,
                    // replaced): as in `install`.
                    out.notes.push(format!(
                        "page {:#x} could not be put back ({e}); its mapping changed under the batch",
                        b.addr[j]
                    ));
                    b.state[j] = State::Dropped;
                }
            }
        }
        i = f + m;
    }
    back
}

/// Moves (or, with `by_copy`, copies) parked pages `f .. f + m` back to
/// their application addresses, reading events and retrying while one is
/// unread (EAGAIN) and waiting while the kernel is short of memory. Fails
/// where a page of the unit is no longer out (an event dropped it) or the
/// kernel refuses for good.
fn move_back(
    run: &Run,
    b: &mut PageLedger,
    parking: &Stage,
    out: &mut Outcome,
    f: usize,
    m: usize,
    by_copy: bool,
) -> io::Result<()> {
    let page = run.page;
    // EAGAIN means events were waiting and are now read: progress, never
    // counted. ENOMEM waits for memory as a fault would: giving up would
    // drop the page's bytes.
    loop {
        if (f..f + m).any(|j| b.state[j] != State::Out)
            || (f..f + m).any(|j| b.addr[j] != b.addr[f] + (j - f) * page)
        {
            return Err(io::Error::other("the unit changed under the batch"));
        }
        let (dst, src) = (b.addr[f], parking.base + f * page);
        let res = if by_copy {
            run.uffd.copy(dst, src, m * page)
        } else {
            run.uffd.move_pages(dst, src, m * page)
        };
        let p = match res {
            Ok(_) => return Ok(()),
            Err(p) => p,
        };
        match uffd::after(&p.error) {
            uffd::After::ReadEvents => drain(run, b, parking, out),
            uffd::After::Retry => std::thread::sleep(crate::params::RELOCATE_ENOMEM_WAIT),
            _ => return Err(p.error),
        }
    }
}

/// Runs of parked pages by index (the staging areas are indexed by page,
/// so the application's addresses do not matter here).
fn runs_by_index(b: &PageLedger) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for i in (0..b.len()).filter(|&i| b.in_stage[i]) {
        match out.last_mut() {
            Some((f, k)) if *f + *k == i => *k += 1,
            _ => out.push((i, 1)),
        }
    }
    out
}

/// Step 7: installs the destination folios where their pages are now.
/// Returns the moment the first one became usable.
pub(super) fn install(
    run: &Run,
    b: &mut PageLedger,
    parking: &Stage,
    dest: &Stage,
    out: &mut Outcome,
) -> Option<Instant> {
    let page = run.page;
    let mut first = None;
    drain(run, b, parking, out);
    loop {
        let runs = b.runs(State::Out);
        if runs.is_empty() {
            return first;
        }
        for (i, k) in runs {
            let res = run
                .uffd
                .move_pages(b.addr[i], dest.base + i * page, k * page);
            let done = match &res {
                Ok(_) => k,
                Err(p) => p.done / page,
            };
            for j in i..i + done {
                b.state[j] = State::In;
            }
            if done > 0 && first.is_none() {
                first = Some(Instant::now());
            }
            let Err(p) = res else { continue };
            let at = i + done;
            if errno(&p.error) == libc::EAGAIN {
                drain(run, b, parking, out);
                break;
            }
            // The mapping changed under the batch (mprotect, munlock) or
            // the folio could not be moved: put the bytes back by copy.
            match run.uffd.copy(b.addr[at], dest.base + at * page, page) {
                Ok(_) => b.state[at] = State::In,
                Err(c) => match errno(&c.error) {
                    libc::EAGAIN => {
                        drain(run, b, parking, out);
                        break;
                    }
                    // Short of memory for a page table or the page: wait
                    // and try again, as a fault would; dropping it would
                    // lose its bytes.
                    libc::ENOMEM => {
                        std::thread::sleep(crate::params::RELOCATE_ENOMEM_WAIT);
                        break;
                    }
                    _ => {
                        // ENOENT/EINVAL: no mapping of ours there any more
                        // (unmapped, replaced); EEXIST: something is there.
                        out.notes.push(format!(
                            "page {:#x} could not be put back ({}); its mapping changed under the batch",
                            b.addr[at], c.error
                        ));
                        b.state[at] = State::Dropped;
                    }
                },
            }
        }
    }
}

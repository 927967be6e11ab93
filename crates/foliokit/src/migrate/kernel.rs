//! The kernel path: move_pages(2) in batches, from one or more threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::{
    sys, BatchController, BatchStat, MigrateError, MigrateOptions, MigratePath, MigrateReport,
};
use crate::batch::page_size;
use crate::sys::numa;
use crate::sys::pagemap::{page_states, populated, PageState};

/// What one thread's share of the range did.
struct Share {
    stats: Vec<BatchStat>,
    /// (page address, errno) for pages move_pages could not move.
    failed: Vec<(usize, i32)>,
}

/// Moves the pages of one thread's share of process `pid` (0: this one),
/// batch by batch.
fn worker(
    pid: libc::pid_t,
    pages: &[usize],
    node: u32,
    o: &MigrateOptions,
) -> Result<Share, MigrateError> {
    let mut ctl = o
        .latency_budget
        .map(|b| BatchController::new(b, o.batch_pages, 1, pages.len().max(1)));
    let mut stats = Vec::new();
    let mut failed = Vec::new();
    let mut at = 0;
    while at < pages.len() {
        let n = ctl
            .as_ref()
            .map_or(o.batch_pages, BatchController::pages)
            .min(pages.len() - at);
        let chunk = &pages[at..at + n];
        let mut status = vec![0i32; n];
        let t = Instant::now();
        numa::move_pages_of(pid, chunk, node, &mut status).map_err(sys("move_pages"))?;
        // The kernel does not say when the first folio of a call finished;
        // the call's return is when it certainly had.
        let lat = t.elapsed();
        let bad: Vec<usize> = (0..n).filter(|&i| status[i] < 0).collect();
        if !bad.is_empty() {
            // Moving a THP, the kernel can report -EBUSY for one subpage
            // although the whole folio moved (seen on 6.12): a page counts
            // as failed only if a status query still finds it elsewhere.
            let addrs: Vec<usize> = bad.iter().map(|&i| chunk[i]).collect();
            let mut now = vec![0i32; addrs.len()];
            numa::page_nodes_of(pid, &addrs, &mut now).map_err(sys("move_pages (status query)"))?;
            failed.extend(
                bad.iter()
                    .zip(&now)
                    .filter(|(_, &q)| q != node as i32)
                    .map(|(&i, _)| (chunk[i], -status[i])),
            );
        }
        stats.push(BatchStat {
            pages: n,
            first_folio_us: lat.as_secs_f64() * 1e6,
            total_us: lat.as_secs_f64() * 1e6,
            phases: super::Phases::default(),
        });
        if let Some(c) = ctl.as_mut() {
            c.observe(lat);
        }
        at += n;
    }
    Ok(Share { stats, failed })
}

/// Cuts `pages` (ascending addresses) into about `n` shares of equal size
/// whose boundaries never fall inside a PMD-sized block. Two threads
/// moving parts of one huge folio at once race: one moves the folio and
/// the other finds its subpages under migration entries (`-ENOENT`, seen
/// on 6.12 with 3 shares of a THP range) and reports them failed although
/// they arrive a moment later.
fn shares(pages: &[usize], n: usize) -> Vec<&[usize]> {
    let page = page_size();
    // A PMD maps one page table's worth of pages (8-byte entries).
    let pmd = page * (page / 8);
    let per = pages.len().div_ceil(n).max(1);
    let mut out = Vec::with_capacity(n.min(pages.len()));
    let mut rest = pages;
    while !rest.is_empty() {
        let mut end = per.min(rest.len());
        while end < rest.len() && rest[end] / pmd == rest[end - 1] / pmd {
            end += 1;
        }
        let (share, tail) = rest.split_at(end);
        out.push(share);
        rest = tail;
    }
    out
}

/// Batch timings, and the pages that failed with their errno.
type Moved = (Vec<BatchStat>, Vec<(usize, i32)>);

/// Moves `pages` (page addresses of this process) to `node`: see
/// [`move_list_of`].
pub fn move_list(pages: &[usize], node: u32, o: &MigrateOptions) -> Result<Moved, MigrateError> {
    move_list_of(0, pages, node, o)
}

/// Moves `pages` (page addresses of process `pid`, 0: this one) to `node`
/// in `o.channels` disjoint shares, run by the calling thread and up to
/// `o.channels - 1` helpers (`crate::helpers`: persistent, never a thread
/// per call); returns the batch timings and the pages that failed. A share
/// whose call fails stops there (the others run to their end or their own
/// failure), so a target that exits ends every share at its next call.
pub fn move_list_of(
    pid: libc::pid_t,
    pages: &[usize],
    node: u32,
    o: &MigrateOptions,
) -> Result<Moved, MigrateError> {
    if pages.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let shares = shares(pages, o.channels.max(1));
    let results: Vec<Mutex<Option<Result<Share, MigrateError>>>> =
        shares.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    crate::helpers::fan_out(shares.len() - 1, &|| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(share) = shares.get(i) else {
            break;
        };
        let r = worker(pid, share, node, o);
        *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
    });
    let (mut stats, mut failed) = (Vec::new(), Vec::new());
    for res in results {
        // Every share was taken and finished before fan_out returned.
        let share =
            res.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .ok_or(MigrateError::Sys {
                    what: "move_pages worker",
                    source: std::io::Error::other("a share was not run"),
                })??;
        stats.extend(share.stats);
        failed.extend(share.failed);
    }
    Ok((stats, failed))
}

/// [`move_range`] of one chunk, `[addr, addr + len)`, adding to `f`.
fn move_chunk(
    addr: usize,
    len: usize,
    node: u32,
    o: &MigrateOptions,
    f: &mut Found,
) -> Result<(), MigrateError> {
    let page = page_size();
    let all: Vec<usize> = (addr..addr + len).step_by(page).collect();
    let mut before = vec![0i32; all.len()];
    numa::page_nodes(&all, &mut before).map_err(sys("move_pages (query)"))?;
    // -ENOENT is "no page" to the query, but also a mapped page the kernel
    // cannot see there: seen on 6.1 for pages NUMA balancing had marked for
    // a hinting fault (until next touched; its huge pages read -EFAULT),
    // and swapped pages. pagemap tells them from holes without touching
    // them; without it (no /proc) -ENOENT counts as a hole.
    let states = before
        .contains(&-libc::ENOENT)
        .then(|| page_states(addr, all.len(), page).ok())
        .flatten();
    let state = |i: usize| states.as_ref().map(|s| s[i]);
    // Pages the query could not locate (-EFAULT for a PROT_NONE mapping or
    // a THP under another migration, or a mapped page read as -ENOENT)
    // are moved like the rest; what happened to them is in `failed`.
    let mut pages = Vec::with_capacity(all.len());
    for (i, (&p, &n)) in all.iter().zip(&before).enumerate() {
        if n >= 0 {
            f.to_move += usize::from(n != node as i32);
        } else if n == -libc::ENOENT && state(i) == Some(PageState::Swapped) {
            f.swapped += 1;
            continue;
        } else if n == -libc::ENOENT && state(i) != Some(PageState::Present) {
            f.holes += 1;
            continue;
        } else {
            f.unknown += 1;
            f.first_unlocated.get_or_insert(n);
        }
        pages.push(p);
    }
    let t0 = Instant::now();
    let (batches, failed) = move_list(&pages, node, o)?;
    f.moving += t0.elapsed();
    f.batches.extend(batches);
    f.failed.extend(failed);
    Ok(())
}

/// What the chunks of one range found and did, summed.
#[derive(Default)]
struct Found {
    holes: usize,
    swapped: usize,
    /// Pages the query could not locate, and the first one's status.
    unknown: usize,
    first_unlocated: Option<i32>,
    to_move: usize,
    batches: Vec<BatchStat>,
    failed: Vec<(usize, i32)>,
    /// Time in move_pages calls (the queries left out).
    moving: std::time::Duration,
}

pub fn move_range(
    addr: usize,
    len: usize,
    node: u32,
    o: &MigrateOptions,
) -> Result<MigrateReport, MigrateError> {
    let page = page_size();
    let mut f = Found::default();
    // Only the populated extents, where the kernel can say which they are:
    // a range may be a reservation of terabytes that is mostly empty, and
    // the status query costs as much per page of a hole as of a page.
    let extents = match populated(addr, len) {
        Ok(Some(ext)) => {
            let have: usize = ext.iter().map(|(s, e)| e - s).sum();
            f.holes += (len - have) / page;
            ext
        }
        _ => vec![(addr, addr + len)],
    };
    // Chunk by chunk: the lists take about 20 bytes a page.
    let chunk = crate::params::MIGRATE_CHUNK_PAGES * page;
    for (start, end) in extents {
        let mut at = start;
        while at < end {
            let n = chunk.min(end - at);
            move_chunk(at, n, node, o, &mut f)?;
            at += n;
        }
    }
    let Found {
        holes,
        swapped,
        unknown,
        first_unlocated,
        to_move,
        batches,
        failed,
        moving,
    } = f;
    let mut r = MigrateReport::new(MigratePath::Kernel, len);
    r.secs = moving.as_secs_f64();
    r.batches = batches;
    r.failed = failed;
    r.pages_to_move = to_move;
    if holes > 0 {
        r.notes.push(format!(
            "{holes} pages had never been populated and were left empty"
        ));
    }
    if swapped > 0 {
        r.notes.push(format!(
            "{swapped} pages are swapped out (on no node) and were left there"
        ));
    }
    if let Some(first) = first_unlocated {
        r.notes.push(format!(
            "{unknown} pages could not be located before the move (first status {first}: e.g. PROT_NONE, a page another migration held at that instant, or, on older kernels such as 6.1, pages NUMA balancing had marked for a hinting fault, until next touched)"
        ));
    }
    if to_move == 0 && unknown == 0 {
        r.notes.push(format!(
            "every page was already on node {node}: move_pages had nothing to move (the time is its page walk alone)"
        ));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_page_once_and_never_split_a_pmd() {
        let page = page_size();
        let pmd = page * (page / 8);
        let base = 64 * pmd;
        // A whole range, a range starting mid-PMD, and a sparse one.
        let whole: Vec<usize> = (0..2048).map(|i| base + i * page).collect();
        let offset: Vec<usize> = (100..1900).map(|i| base + i * page).collect();
        let sparse: Vec<usize> = (0..4096).step_by(7).map(|i| base + i * page).collect();
        for pages in [&whole, &offset, &sparse] {
            for n in 1..=8 {
                let shares = shares(pages, n);
                assert_eq!(shares.concat(), *pages, "every page once, in order");
                assert!(shares.len() <= n, "{} shares for {n}", shares.len());
                for w in shares.windows(2) {
                    let (a, b) = (w[0].last().unwrap(), w[1][0]);
                    assert_ne!(a / pmd, b / pmd, "a PMD block split between shares");
                }
            }
        }
        assert!(shares(&[], 3).is_empty());
    }
}

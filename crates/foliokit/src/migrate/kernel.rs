//! The kernel path: move_pages(2) in batches, from one or more threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::{
    sys, BatchController, BatchStat, MigrateError, MigrateOptions, MigratePath, MigrateReport,
};
use crate::batch::page_size;
use crate::sys::numa;

/// What one thread's share of the range did.
struct Share {
    stats: Vec<BatchStat>,
    /// (page address, errno) for pages move_pages could not move.
    failed: Vec<(usize, i32)>,
}

/// Moves the pages of one thread's share, batch by batch.
fn worker(pages: &[usize], node: u32, o: &MigrateOptions) -> Result<Share, MigrateError> {
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
        numa::move_pages(chunk, node, &mut status).map_err(sys("move_pages"))?;
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
            numa::page_nodes(&addrs, &mut now).map_err(sys("move_pages (status query)"))?;
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
        });
        if let Some(c) = ctl.as_mut() {
            c.observe(lat);
        }
        at += n;
    }
    Ok(Share { stats, failed })
}

/// Batch timings, and the pages that failed with their errno.
type Moved = (Vec<BatchStat>, Vec<(usize, i32)>);

/// Moves `pages` (page addresses) to `node` in `o.channels` disjoint
/// shares, run by the calling thread and up to `o.channels - 1` helpers
/// (`crate::helpers`: persistent, never a thread per call); returns the
/// batch timings and the pages that failed.
pub fn move_list(pages: &[usize], node: u32, o: &MigrateOptions) -> Result<Moved, MigrateError> {
    if pages.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let per = pages.len().div_ceil(o.channels.max(1));
    let shares: Vec<&[usize]> = pages.chunks(per).collect();
    let results: Vec<Mutex<Option<Result<Share, MigrateError>>>> =
        shares.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    crate::helpers::fan_out(shares.len() - 1, &|| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(share) = shares.get(i) else {
            break;
        };
        let r = worker(share, node, o);
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

pub fn move_range(
    addr: usize,
    len: usize,
    node: u32,
    o: &MigrateOptions,
) -> Result<MigrateReport, MigrateError> {
    let page = page_size();
    let all: Vec<usize> = (addr..addr + len).step_by(page).collect();
    let mut before = vec![0i32; all.len()];
    numa::page_nodes(&all, &mut before).map_err(sys("move_pages (query)"))?;
    // Holes (never touched or zapped) stay holes: -ENOENT is "no page".
    let holes = before.iter().filter(|&&n| n == -libc::ENOENT).count();
    // Other errors: pages the query could not locate (-EFAULT for a
    // PROT_NONE mapping, or for a THP under another migration at that
    // instant). They are moved like the rest; what happened to them is in
    // `failed`.
    let mut unlocated = before.iter().filter(|&&n| n < 0 && n != -libc::ENOENT);
    let first_unlocated = unlocated.next().copied();
    let unknown = first_unlocated.map_or(0, |_| 1 + unlocated.count());
    let to_move = before
        .iter()
        .filter(|&&n| n >= 0 && n != node as i32)
        .count();
    let pages: Vec<usize> = all
        .iter()
        .zip(&before)
        .filter(|(_, &n)| n != -libc::ENOENT)
        .map(|(&p, _)| p)
        .collect();
    let t0 = Instant::now();
    let (batches, failed) = move_list(&pages, node, o)?;
    let mut r = MigrateReport::new(MigratePath::Kernel, len);
    r.secs = t0.elapsed().as_secs_f64();
    r.batches = batches;
    r.failed = failed;
    r.pages_to_move = to_move;
    if holes > 0 {
        r.notes.push(format!(
            "{holes} pages had never been populated and were left empty"
        ));
    }
    if let Some(first) = first_unlocated {
        r.notes.push(format!(
            "{unknown} pages could not be located before the move (first status {first}: e.g. PROT_NONE, or a page another migration held at that instant)"
        ));
    }
    if to_move == 0 && unknown == 0 {
        r.notes.push(format!(
            "every page was already on node {node}: move_pages had nothing to move (the time is its page walk alone)"
        ));
    }
    Ok(r)
}

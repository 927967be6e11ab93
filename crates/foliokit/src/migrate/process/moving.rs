//! Moving one call's ranges: chunk by chunk, each page looked up before
//! and after the move and judged by where it ended.

use std::collections::BTreeMap;
use std::io;
use std::time::Instant;

use super::{ProcessError, RangeReport, Spans, Target};
use crate::migrate::kernel::move_list_of;
use crate::migrate::{MigrateError, MigrateOptions};
use crate::sys::numa::page_nodes_of;

/// Pages queried per `move_pages` status call.
const QUERY_CHUNK: usize = 16384;
/// What stays the same for every range of one [`super::migrate_process`]
/// call.
pub(super) struct Call<'a> {
    pub(super) target: &'a Target,
    pub(super) node: u32,
    pub(super) page: usize,
    pub(super) dry_run: bool,
    pub(super) mo: MigrateOptions,
    /// Where the target has memory, for given ranges.
    pub(super) mapped: Option<Spans>,
}

impl Call<'_> {
    /// Moves (or, in a dry run, counts) the pages of `[start, end)`, chunk
    /// by chunk: its lists take about 20 bytes a page, and a mapped range
    /// may be a reservation of terabytes. [`ProcessError::Gone`] (its
    /// partial report empty) where the target went away.
    pub(super) fn range(
        &self,
        start: usize,
        end: usize,
        batch_sizes: &mut Vec<usize>,
        notes: &mut Vec<String>,
    ) -> Result<RangeReport, ProcessError> {
        let pid = self.target.pid;
        let tr = Instant::now();
        let huge_kib_before =
            crate::sys::smaps::anon_huge_bytes(Some(pid), start, end).map(|b| b >> 10);
        let mut r = RangeReport {
            start,
            end,
            huge_kib_before,
            ..RangeReport::default()
        };
        let mut would_move = 0;
        let chunk = crate::params::MIGRATE_CHUNK_PAGES * self.page;
        let mut at = start;
        while at < end {
            let (cs, ce) = (at, end.min(at.saturating_add(chunk)));
            at = ce;
            let pages = self.pages_in(cs, ce);
            if !pages.is_empty() {
                would_move += self.chunk(&pages, &mut r, batch_sizes)?;
            }
        }
        if self.dry_run {
            r.nodes_after = r.nodes_before.clone();
            r.huge_kib_after = huge_kib_before;
            notes.push(format!(
                "dry run: {would_move} pages of {start:#x}-{end:#x} would move"
            ));
        } else {
            r.huge_kib_after =
                crate::sys::smaps::anon_huge_bytes(Some(pid), start, end).map(|b| b >> 10);
        }
        r.secs = tr.elapsed().as_secs_f64();
        Ok(r)
    }

    /// The pages of `[cs, ce)` to look up: where the target has memory,
    /// for given ranges.
    fn pages_in(&self, cs: usize, ce: usize) -> Vec<usize> {
        let page = self.page;
        match &self.mapped {
            Some(maps) => maps
                .iter()
                .filter(|&&(s, e)| s < ce && e > cs)
                .flat_map(|&(s, e)| (s.max(cs)..e.min(ce)).step_by(page))
                .collect(),
            None => (cs..ce).step_by(page).collect(),
        }
    }

    /// Moves the chunk's `pages` that are elsewhere and judges each by
    /// where it is afterwards, into `r`; in a dry run only counts them.
    /// Returns how many pages a dry run would move.
    fn chunk(
        &self,
        pages: &[usize],
        r: &mut RangeReport,
        batch_sizes: &mut Vec<usize>,
    ) -> Result<usize, ProcessError> {
        let (target, node) = (self.target, self.node);
        let before = query(target, pages)?;
        r.pages += pages.len();
        add_counts(&mut r.nodes_before, histogram(&before));
        // Pages the query could not locate are handed to move_pages
        // too: a THP under a hinting fault or another migration reads
        // -ENOENT or -EFAULT for a moment (seen in the 6.12 guest: one
        // THP of a written 1 GiB target), and move_pages on a page that
        // is really absent just reports it again. Where each ended
        // decides below.
        let to_move: Vec<usize> = pages
            .iter()
            .zip(&before)
            .filter(|&(_, &s)| s != node as i32)
            .map(|(&p, _)| p)
            .collect();
        r.already += pages.len() - to_move.len();
        if self.dry_run {
            r.not_present += before.iter().filter(|&&s| s < 0).count();
            return Ok(to_move.len());
        }
        let (stats, failed) = move_list_of(target.pid, &to_move, node, &self.mo)
            .map_err(|e| move_error(target, e))?;
        if !target.alive() {
            return Err(gone_now(target));
        }
        r.calls += stats.len();
        if r.first_call_us.is_none() {
            r.first_call_us = stats.first().map(|b| b.total_us);
        }
        r.longest_call_us = stats
            .iter()
            .map(|b| b.total_us)
            .chain(r.longest_call_us)
            .reduce(f64::max);
        batch_sizes.extend(stats.iter().map(|b| b.pages));
        let after = query(target, pages)?;
        add_counts(&mut r.nodes_after, histogram(&after));
        judge(pages, &before, &after, failed, node, r);
        Ok(0)
    }
}

/// Every page that was elsewhere is judged once, by where it is now: on
/// the node it moved (even if a call reported a transient error for it
/// first); elsewhere it failed, with the call's errno where one was
/// reported, else 0 (moved back or freed meanwhile).
fn judge(
    pages: &[usize],
    before: &[i32],
    after: &[i32],
    failed: Vec<(usize, i32)>,
    node: u32,
    r: &mut RangeReport,
) {
    let errno: std::collections::HashMap<usize, i32> = failed.into_iter().collect();
    for ((&p, &s), &b) in pages.iter().zip(after).zip(before) {
        if b == node as i32 {
            continue;
        }
        if s == node as i32 {
            r.moved += 1;
            if b >= 0 {
                *r.moved_from.entry(b as u32).or_default() += 1;
            }
        } else if s < 0 && b < 0 {
            r.not_present += 1;
        } else {
            *r.failed
                .entry(errno.get(&p).copied().unwrap_or(0))
                .or_default() += 1;
        }
    }
}

/// The target went away (the caller adds the partial report).
fn gone_now(target: &Target) -> ProcessError {
    ProcessError::Gone {
        pid: target.pid,
        partial: Box::default(),
    }
}

/// What a failed `move_pages` means for the call: the target went away,
/// or the call may not or cannot move its pages.
fn move_error(target: &Target, e: MigrateError) -> ProcessError {
    if target.gone() {
        return gone_now(target);
    }
    match e {
        MigrateError::Sys { source, .. } if source.raw_os_error() == Some(libc::EPERM) => {
            ProcessError::Permission {
                pid: target.pid,
                source,
            }
        }
        MigrateError::Sys { what, source } => ProcessError::Sys { what, source },
        other => ProcessError::Sys {
            what: "move_pages",
            source: io::Error::other(other.to_string()),
        },
    }
}

/// Each page's node (or negative errno), in chunks.
fn query(target: &Target, pages: &[usize]) -> Result<Vec<i32>, ProcessError> {
    let mut status = vec![0i32; pages.len()];
    for (p, s) in pages
        .chunks(QUERY_CHUNK)
        .zip(status.chunks_mut(QUERY_CHUNK))
    {
        if let Err(e) = page_nodes_of(target.pid, p, s) {
            // A process that exited has no mm: the kernel says EINVAL or
            // ESRCH depending on how far its exit got.
            if target.gone() {
                return Err(ProcessError::Gone {
                    pid: target.pid,
                    partial: Box::default(),
                });
            }
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) => ProcessError::Permission {
                    pid: target.pid,
                    source: e,
                },
                Some(libc::ESRCH) => ProcessError::Gone {
                    pid: target.pid,
                    partial: Box::default(),
                },
                _ => ProcessError::Sys {
                    what: "move_pages (status query)",
                    source: e,
                },
            });
        }
    }
    Ok(status)
}

/// Adds the counts of `more` to `into`.
fn add_counts(into: &mut BTreeMap<u32, usize>, more: BTreeMap<u32, usize>) {
    for (k, v) in more {
        *into.entry(k).or_default() += v;
    }
}

fn histogram(status: &[i32]) -> BTreeMap<u32, usize> {
    let mut h = BTreeMap::new();
    for &s in status.iter().filter(|&&s| s >= 0) {
        *h.entry(s as u32).or_default() += 1;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_count_present_pages_per_node() {
        let h = histogram(&[0, 0, 1, -libc::ENOENT, 2, -libc::EFAULT]);
        assert_eq!(h, BTreeMap::from([(0, 2), (1, 1), (2, 1)]));
    }
}

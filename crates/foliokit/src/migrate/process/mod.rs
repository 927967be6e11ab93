//! Moving another process's pages to a node: what a memory-tiering agent
//! does, with `move_pages(2)` on the target's pid.
//!
//! The target is held by a pidfd from the start. `move_pages` itself takes
//! a pid, so before every range and after every batch the pidfd says
//! whether the process still exists; a pid can only name another process
//! once the target has exited *and* been reaped *and* the kernel's pid
//! counter has wrapped around to it, and a move that finds the target gone
//! stops with [`ProcessError::Gone`] and what was done so far. Batches
//! follow a per-call latency budget (the target's threads stall on pages
//! under migration and on its mmap lock while a call runs), spread over
//! the helper threads in shares that never split a PMD-sized block.

mod moving;

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::MigrateOptions;
use crate::batch::page_size;
use crate::mem::system::{memory_nodes, numa_nodes};
use crate::sys::maps::{self, MapLine};
use crate::sys::numa::page_nodes_of;
use moving::Call;

/// A process to move pages of, held by a pidfd so that its pid cannot
/// silently come to mean another process.
#[derive(Debug)]
pub struct Target {
    pid: libc::pid_t,
    pidfd: OwnedFd,
}

impl Target {
    /// Opens process `pid`.
    pub fn open(pid: i32) -> Result<Target, ProcessError> {
        if pid <= 0 {
            return Err(ProcessError::NoProcess { pid });
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or
        // -1; it touches no memory of ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ESRCH) => ProcessError::NoProcess { pid },
                _ => ProcessError::Sys {
                    what: "pidfd_open",
                    source: e,
                },
            });
        }
        // SAFETY: the call returned a new descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Target { pid, pidfd })
    }

    /// The pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The node of each of the process's `pages` (addresses in it), or a
    /// negative errno (`-ENOENT`: not present, `-EFAULT`: not mapped):
    /// `move_pages(2)`'s status query. `status` has one entry per page.
    pub fn page_nodes(&self, pages: &[usize], status: &mut [i32]) -> io::Result<()> {
        if pages.len() != status.len() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        page_nodes_of(self.pid, pages, status)
    }

    /// Whether the process still runs (a zombie counts as gone: its memory
    /// is already released).
    pub fn alive(&self) -> bool {
        // SAFETY: signal 0 through our own pidfd only checks existence and
        // permission; no memory is passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            // A zombie still takes signal 0: its maps are empty.
            return std::fs::read_to_string(format!("/proc/{}/status", self.pid))
                .map(|s| {
                    !s.lines()
                        .any(|l| l.starts_with("State:") && l.contains('Z'))
                })
                .unwrap_or(false);
        }
        // EPERM: it exists, we may just not signal it.
        io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }

    /// Whether the process is gone or on its way out: not alive, or its
    /// leader marked exiting (`PF_EXITING` in /proc/PID/stat), when its
    /// memory may already be released while signal 0 still succeeds. Used
    /// to read a failed call: the kernel says EINVAL or ESRCH for a
    /// process whose mm is gone.
    fn gone(&self) -> bool {
        const PF_EXITING: u64 = 0x4;
        if !self.alive() {
            return true;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return true;
        };
        // Fields after the command's closing parenthesis: state, ppid,
        // pgrp, session, tty_nr, tpgid, flags, ...
        let rest = stat.rsplit_once(')').map_or("", |r| r.1);
        rest.split_whitespace()
            .nth(6)
            .and_then(|f| f.parse::<u64>().ok())
            .is_some_and(|flags| flags & PF_EXITING != 0)
    }
}

/// Which pages of the target to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ranges {
    /// These `[start, end)` address ranges of the target (page-aligned).
    Given(Vec<(usize, usize)>),
    /// Every private anonymous mapping (heap and anonymous mmaps), read
    /// from `/proc/PID/maps`; file mappings, shared memory, inaccessible
    /// mappings, the kernel's special mappings and, unless `stack` is set,
    /// the main thread's stack are skipped, each with the reason.
    AllAnon {
        /// Also move the main thread's stack (`[stack]`).
        stack: bool,
    },
}

/// How to move: `ProcessOptions::default().threads(2)...`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ProcessOptions {
    /// Threads issuing `move_pages` calls (the caller and helpers).
    pub threads: usize,
    /// Largest time one `move_pages` call may take: the batch grows while
    /// calls take under half of it and halves when one takes longer.
    pub budget: Duration,
    /// Report what would move without moving anything.
    pub dry_run: bool,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        ProcessOptions {
            threads: 1,
            budget: crate::params::PROCESS_MOVE_BUDGET,
            dry_run: false,
        }
    }
}

impl ProcessOptions {
    setters! {
        /// Sets the threads.
        threads: usize,
        /// Sets the per-call latency budget.
        budget: Duration,
        /// Sets dry-run.
        dry_run: bool,
    }
}

/// A mapping `Ranges::AllAnon` left alone, and why.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SkippedMapping {
    /// Start of the mapping.
    pub start: usize,
    /// Its end (exclusive).
    pub end: usize,
    /// The mapping as `/proc/PID/maps` names it (path or `[stack]`).
    pub what: String,
    /// Why it was left alone.
    pub why: &'static str,
}

/// What happened to one range.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RangeReport {
    /// Start of the range.
    pub start: usize,
    /// Its end (exclusive).
    pub end: usize,
    /// Base pages of the range the target had mapped when the call began
    /// (unmapped space is not looked at).
    pub pages: usize,
    /// Present pages that were elsewhere and are now on the node.
    pub moved: usize,
    /// Present pages already on the node before the call.
    pub already: usize,
    /// Mapped pages not present (never touched, swapped, or unmapped
    /// during the call).
    pub not_present: usize,
    /// Moved pages by the node they came from (a page the first query
    /// could not locate but that arrived counts in `moved` only).
    pub moved_from: BTreeMap<u32, usize>,
    /// Pages that stayed elsewhere, by positive errno (`EBUSY`: pinned or
    /// under I/O; `EACCES`: mapped by several processes; `ENOMEM`: the
    /// node is full), or by the node they stayed on (`errno` 0).
    pub failed: BTreeMap<i32, usize>,
    /// `AnonHugePages` of the mappings over the range before the move
    /// (KiB).
    pub huge_kib_before: Option<usize>,
    /// The same after: a drop means huge pages were split.
    pub huge_kib_after: Option<usize>,
    /// Present pages per node before the move.
    pub nodes_before: BTreeMap<u32, usize>,
    /// Present pages per node after it.
    pub nodes_after: BTreeMap<u32, usize>,
    /// `move_pages` calls made.
    pub calls: usize,
    /// The first call's time in µs (the first batch's latency, from its
    /// start until the call returned).
    pub first_call_us: Option<f64>,
    /// The longest call.
    pub longest_call_us: Option<f64>,
    /// Wall time for the range, queries included.
    pub secs: f64,
}

/// What `migrate_process` did.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ProcessReport {
    /// The target.
    pub pid: i32,
    /// The node pages were moved to.
    pub node: u32,
    /// Nothing was moved: the counts say what would have.
    pub dry_run: bool,
    /// Every range, in order.
    pub ranges: Vec<RangeReport>,
    /// Mappings `Ranges::AllAnon` left alone.
    pub skipped: Vec<SkippedMapping>,
    /// The per-call budget in µs.
    pub budget_us: f64,
    /// The median batch (pages per call) the budget settled on.
    pub batch_pages_median: Option<usize>,
    /// Wall time.
    pub secs: f64,
    /// What else the caller should know.
    pub notes: Vec<String>,
}

impl ProcessReport {
    /// Totals over the ranges: (moved, already, not present, failed).
    pub fn totals(&self) -> (usize, usize, usize, usize) {
        self.ranges.iter().fold((0, 0, 0, 0), |t, r| {
            (
                t.0 + r.moved,
                t.1 + r.already,
                t.2 + r.not_present,
                t.3 + r.failed.values().sum::<usize>(),
            )
        })
    }
}

/// Why `migrate_process` failed. Nothing was moved unless the variant
/// says so.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// No such process (or it had already exited).
    #[error("no process {pid}")]
    NoProcess {
        /// The pid asked for.
        pid: i32,
    },
    /// The kernel refused: moving another process's pages needs ptrace
    /// read access to it (`PTRACE_MODE_READ_REALCREDS`: the same user, or
    /// `CAP_SYS_PTRACE`), and a security module may refuse more.
    #[error("not permitted to move the pages of process {pid} ({source}): run as its user, or with CAP_SYS_PTRACE (root)")]
    Permission {
        /// The target.
        pid: i32,
        /// The kernel's error.
        source: io::Error,
    },
    /// The process exited during the call; the report holds what was done
    /// before (earlier ranges complete, the current one not).
    #[error("process {pid} exited during the move ({} ranges done)", partial.ranges.len())]
    Gone {
        /// The target.
        pid: i32,
        /// What was done before it exited.
        partial: Box<ProcessReport>,
    },
    /// The target node is not online.
    #[error("NUMA node {node} does not exist (online: {online:?})")]
    NoSuchNode {
        /// The node asked for.
        node: u32,
        /// The nodes that are online.
        online: Vec<u32>,
    },
    /// The node is online but has no memory to take pages.
    #[error("NUMA node {node} has no memory (nodes with memory: {with_memory:?})")]
    NoMemory {
        /// The node asked for.
        node: u32,
        /// The nodes that have memory.
        with_memory: Vec<u32>,
    },
    /// More threads than foliokit runs (`params::MAX_CHANNELS`).
    #[error("{asked} threads asked for: at most {most}")]
    TooManyThreads {
        /// The count asked for.
        asked: usize,
        /// The most there may be.
        most: usize,
    },
    /// A given range is empty, unaligned or wraps.
    #[error("range {start:#x}-{end:#x}: {why}")]
    BadRange {
        /// Start of the range.
        start: usize,
        /// Its end.
        end: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// The call.
        what: &'static str,
        /// Its error.
        source: io::Error,
    },
}

/// Moves the pages of `target` in `ranges` to `node`.
///
/// Safe for the target in every way `move_pages(2)` is: the kernel keeps
/// its memory intact and its threads wait (briefly: see the budget) for
/// pages under migration. Pages mapped by several processes are left
/// (`EACCES`), pinned ones too (`EBUSY`).
pub fn migrate_process(
    target: &Target,
    ranges: &Ranges,
    node: u32,
    o: &ProcessOptions,
) -> Result<ProcessReport, ProcessError> {
    check_request(node, o)?;
    let page = page_size();
    let mut report = ProcessReport {
        pid: target.pid,
        node,
        dry_run: o.dry_run,
        budget_us: o.budget.as_secs_f64() * 1e6,
        ..ProcessReport::default()
    };
    let (list, mapped) = ranges_to_move(target, ranges, page, &mut report)?;
    let call = Call {
        target,
        node,
        page,
        dry_run: o.dry_run,
        mo: MigrateOptions::default()
            .channels(o.threads.max(1))
            .batch_pages(crate::params::PROCESS_MOVE_START_PAGES)
            .latency_budget(Some(o.budget)),
        mapped,
    };
    let gone = |report: ProcessReport| ProcessError::Gone {
        pid: target.pid,
        partial: Box::new(report),
    };
    let t0 = Instant::now();
    let mut batch_sizes = Vec::new();
    for (start, end) in list {
        if !target.alive() {
            return Err(gone(report));
        }
        // A target found gone partway through a range has the ranges
        // done before it as its partial report.
        match call.range(start, end, &mut batch_sizes, &mut report.notes) {
            Ok(r) => report.ranges.push(r),
            Err(ProcessError::Gone { .. }) => return Err(gone(report)),
            Err(e) => return Err(e),
        }
    }
    batch_sizes.sort_unstable();
    report.batch_pages_median = batch_sizes.get(batch_sizes.len() / 2).copied();
    report.secs = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// Refuses a call whose thread count or node cannot be served.
fn check_request(node: u32, o: &ProcessOptions) -> Result<(), ProcessError> {
    if o.threads > crate::params::MAX_CHANNELS {
        return Err(ProcessError::TooManyThreads {
            asked: o.threads,
            most: crate::params::MAX_CHANNELS,
        });
    }
    let online = numa_nodes();
    if !online.contains(&node) {
        return Err(ProcessError::NoSuchNode { node, online });
    }
    let with_memory = memory_nodes();
    if !with_memory.contains(&node) {
        return Err(ProcessError::NoMemory { node, with_memory });
    }
    Ok(())
}

/// The `[start, end)` ranges to move, and for given ranges where the
/// target has memory: their pages are looked up only there (a range may
/// span unmapped space, up to the whole address space: a list of every
/// page of it would not fit in memory). The mappings all-anon leaves alone
/// go to `report`.
fn ranges_to_move(
    target: &Target,
    ranges: &Ranges,
    page: usize,
    report: &mut ProcessReport,
) -> Result<(Spans, Option<Spans>), ProcessError> {
    match ranges {
        Ranges::Given(v) => {
            for &(start, end) in v {
                let why = if end <= start {
                    Some("empty or reversed")
                } else if start % page != 0 || end % page != 0 {
                    Some("not page-aligned")
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(ProcessError::BadRange { start, end, why });
                }
            }
            let mapped = read_maps(target)?
                .iter()
                .map(|m| (m.start, m.end))
                .collect();
            Ok((v.clone(), Some(mapped)))
        }
        Ranges::AllAnon { stack } => {
            let (keep, skipped) = anon_mappings(target, *stack)?;
            report.skipped = skipped;
            Ok((keep, None))
        }
    }
}

/// `[start, end)` address ranges.
type Spans = Vec<(usize, usize)>;

/// The `[start, end)` ranges to move, and the mappings left alone.
pub type AnonMappings = (Vec<(usize, usize)>, Vec<SkippedMapping>);

/// The target's private anonymous mappings (what [`Ranges::AllAnon`]
/// moves) and the mappings it leaves alone, with the reason for each.
pub fn anon_mappings(target: &Target, stack: bool) -> Result<AnonMappings, ProcessError> {
    Ok(anon_ranges(&read_maps(target)?, stack))
}
/// The target's mappings, read while it is known to be the same process.
fn read_maps(target: &Target) -> Result<Vec<MapLine>, ProcessError> {
    let text =
        std::fs::read_to_string(format!("/proc/{}/maps", target.pid)).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => ProcessError::Permission {
                    pid: target.pid,
                    source: e,
                },
                _ if target.gone() => ProcessError::NoProcess { pid: target.pid },
                _ => ProcessError::Sys {
                    what: "read /proc/PID/maps",
                    source: e,
                },
            }
        })?;
    // Read before the check: the text is of this process if it was alive
    // after reading (a pid cannot be reused while the pidfd's process runs).
    if !target.alive() {
        return Err(ProcessError::NoProcess { pid: target.pid });
    }
    Ok(maps::parse(&text))
}

/// Splits mappings into the private anonymous ranges to move and the rest
/// with the reason each is left alone.
pub(crate) fn anon_ranges(maps: &[MapLine], stack: bool) -> AnonMappings {
    let (mut keep, mut skipped) = (Vec::new(), Vec::new());
    for m in maps {
        let ours = m.path.starts_with("[heap")
            || m.path.starts_with("[anon")
            || (stack && m.path == "[stack]");
        let special = m.path.starts_with('[') && !ours;
        let why = if m.perms.as_bytes().get(3) == Some(&b's') {
            Some("shared: pages other processes map")
        } else if m.inode != 0 || (m.path.starts_with('/') && !m.path.starts_with("/memfd")) {
            Some("file-backed: its page cache is the file's, not the process's")
        } else if m.path.starts_with("/memfd") {
            Some("memfd: shared memory")
        } else if m.path == "[stack]" && !stack {
            Some("the main thread's stack (pass the stack option to move it)")
        } else if special {
            Some("a kernel-provided mapping")
        } else if m.perms.starts_with("---") {
            Some("no access: a guard or reserved range, nothing populated")
        } else {
            None
        };
        match why {
            Some(why) => skipped.push(SkippedMapping {
                start: m.start,
                end: m.end,
                what: if m.path.is_empty() {
                    "anonymous".into()
                } else {
                    m.path.clone()
                },
                why,
            }),
            None => keep.push((m.start, m.end)),
        }
    }
    (keep, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0040000000 rw-p 00000000 00:00 0 
7f0040000000-7f0040001000 ---p 00000000 00:00 0 
7f1000000000-7f1000100000 r--p 00000000 08:01 1234                       /usr/lib/libc.so.6
7f2000000000-7f2000100000 rw-s 00000000 00:01 99                         /dev/zero (deleted)
7f3000000000-7f3000100000 rw-p 00000000 00:01 77                         /memfd:guest (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn all_anon_keeps_private_anonymous_memory_and_says_why_not_the_rest() {
        let maps = maps::parse(MAPS);
        assert_eq!(maps.len(), 8);
        let (keep, skipped) = anon_ranges(&maps, false);
        assert_eq!(
            keep,
            vec![
                (0x55d0c0a00000, 0x55d0c0a21000),
                (0x7f0000000000, 0x7f0040000000)
            ]
        );
        let why = |what: &str| {
            skipped
                .iter()
                .find(|s| s.what.starts_with(what))
                .map(|s| s.why)
                .unwrap_or("kept")
        };
        assert!(why("/usr/lib").starts_with("file-backed"));
        assert!(why("/dev/zero").starts_with("shared"));
        assert!(why("[stack]").contains("stack"));
        assert!(why("[vdso]").contains("kernel"));
        assert!(why("anonymous").starts_with("no access"));
        assert_eq!(skipped.len(), 6);
        let (keep, _) = anon_ranges(&maps, true);
        assert!(keep.contains(&(0x7ffd00000000, 0x7ffd00021000)));
    }
}

//! Seed 001's table 4 (`bench migrate`): the mover is another process, as a tiering
//! agent is. The target is this binary started again (`foliokit
//! __target`): it maps the buffer, fills it, and a thread keeps writing one
//! byte of every page, timing its own loop; the longest gap between two of
//! its steps is the target's stall, which the row shows beside the
//! throughput.

use foliokit::migrate::process::{migrate_process, ProcessOptions, Ranges, Target};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::LabError;

/// Pages the target's loop writes between two clock reads: a step is
/// short enough that a stall stands out, long enough that reading the
/// clock costs little.
const STEP_PAGES: usize = 16;

/// The target process: prints `ADDR <start> <len>`, then on each stdin
/// line `S` prints `STALL <longest step in µs since the last S>`; exits on
/// EOF.
/// `hot` bounds the bytes at the start of the buffer the loop writes (the
/// rest is written once and left idle).
pub fn target(size: usize, folio: usize, hot: Option<usize>) -> Result<(), LabError> {
    let len = size.next_multiple_of(2 << 20);
    // A region asks for the folio size (THP for 2M, none for 4K) as the
    // other tables' buffers do.
    let mut region = foliokit::mem::Region::new(len, folio.max(4096))?;
    region.as_mut_slice().fill(0x5A);
    let base = region.as_mut_ptr() as usize;
    println!("ADDR {base} {len}");
    std::io::stdout().flush()?;
    let done = AtomicBool::new(false);
    let longest_ns = AtomicU64::new(0);
    // When the last step ended (ns since `t0`): a step still running at
    // an `S` counts up to then, so a stall in progress is not missed.
    let t0 = Instant::now();
    let last_ns = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let pages = (hot.unwrap_or(len).min(len) / 4096).max(1);
            let mut t = Instant::now();
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                for _ in 0..STEP_PAGES {
                    let b = (base + (i % pages) * 4096) as *mut u8;
                    // SAFETY: inside `region`, which outlives this scope;
                    // only this thread touches it meanwhile.
                    unsafe { b.write_volatile(b.read_volatile().wrapping_add(1)) };
                    i += 1;
                }
                let now = Instant::now();
                longest_ns.fetch_max((now - t).as_nanos() as u64, Ordering::Relaxed);
                last_ns.store((now - t0).as_nanos() as u64, Ordering::Relaxed);
                t = now;
            }
        });
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim() == "S" {
                let running = (t0.elapsed().as_nanos() as u64)
                    .saturating_sub(last_ns.load(Ordering::Relaxed));
                let ns = longest_ns.swap(0, Ordering::Relaxed).max(running);
                println!("STALL {:.1}", ns as f64 / 1e3);
                let _ = std::io::stdout().flush();
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    drop(region);
    Ok(())
}

/// A running target seen from the mover.
pub struct Running {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    pub target: Target,
    pub start: usize,
    pub len: usize,
}

impl Running {
    /// Starts a target of `size` bytes in `folio`-sized folios.
    #[allow(clippy::zombie_processes)] // reaped by Drop
    pub fn start(size: usize, folio: usize) -> Result<Running, LabError> {
        // This program again, as its target: a binary replaced on disk since
        // it started (a rebuild) is gone from /proc/self/exe's path.
        let exe = std::env::current_exe()?;
        let mut child = Command::new(&exe)
            .args([
                "__target",
                "--size",
                &size.to_string(),
                "--folio",
                &folio.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the target process ({}): {e}", exe.display()))?;
        let mut out = BufReader::new(child.stdout.take().ok_or("target stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        let v: Vec<usize> = line
            .strip_prefix("ADDR ")
            .map(|r| {
                r.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let target = Target::open(child.id() as i32)?;
        let (start, len) = match v[..] {
            [s, l] => (s, l),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the target process printed '{}'", line.trim()).into());
            }
        };
        Ok(Running {
            child,
            out,
            target,
            start,
            len,
        })
    }

    /// The target's longest step since the last call (µs).
    pub fn stall_us(&mut self) -> Result<f64, LabError> {
        let stdin = self.child.stdin.as_mut().ok_or("target stdin")?;
        writeln!(stdin, "S")?;
        stdin.flush()?;
        let mut line = String::new();
        self.out.read_line(&mut line)?;
        line.strip_prefix("STALL ")
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("the target answered '{}'", line.trim()).into())
    }

    /// Moves the whole buffer to `node` on `threads` threads: seconds,
    /// pages moved, the first call's µs and the median batch.
    pub fn move_to(
        &self,
        node: u32,
        threads: usize,
        budget: Duration,
    ) -> Result<(f64, usize, Option<f64>, Option<usize>), LabError> {
        let o = ProcessOptions::default().threads(threads).budget(budget);
        let r = migrate_process(
            &self.target,
            &Ranges::Given(vec![(self.start, self.start + self.len)]),
            node,
            &o,
        )?;
        let moved = r.totals().0;
        let first = r.ranges.first().and_then(|x| x.first_call_us);
        Ok((r.secs, moved, first, r.batch_pages_median))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! The external-handler rows: guest memory in another process that plays
//! Firecracker (`__vmm`, see [`crate::vmm`]), served from the snapshot by
//! this process, the way Firecracker's page-fault handler serves it:
//! foliokit's fill ([`foliokit::lazy::fill_external`]), or one thread
//! serving one fault at a time with `UFFDIO_COPY` of a page (the way
//! Firecracker's example handlers do).

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use foliokit::internals::Uffd;
use foliokit::lazy::firecracker::{self, Handoff, Served};
use foliokit::lazy::{LazyOptions, Source};

use super::{RestoreError, RestorePlan, Sample};
use crate::vmm::VmmResult;

/// What the VMM's two vCPU threads touch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Touch {
    /// Nothing: the row times the fill until every page is in.
    None,
    /// One random page of every 2 MiB.
    Sparse,
    /// Every page.
    All,
}

/// Who serves the VMM's faults.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Server {
    /// foliokit's fill: faults first, the rest in the background.
    Foliokit,
    /// One thread, one fault at a time, a page per `UFFDIO_COPY`.
    OneAtATime,
}

fn plan_err(e: impl std::fmt::Display) -> RestoreError {
    RestoreError::Plan(format!("external handler row: {e}"))
}

/// How long an external-handler row waits for each of the VMM's steps
/// (connecting; every page in; exiting once every page is in) unless the
/// plan says ([`RestorePlan::vmm_wait`]): a guard against a hang, far
/// beyond what each takes (one fault at a time on a busy 2-vCPU machine
/// brings a GiB in within seconds), not a timing.
const VMM_WAIT: Duration = Duration::from_secs(60);
/// What [`VMM_WAIT`] grows by per GiB of guest.
const VMM_WAIT_PER_GIB: Duration = Duration::from_secs(30);

/// The longest each of the VMM's steps may take in this row.
fn vmm_wait(plan: &RestorePlan) -> Duration {
    plan.vmm_wait.unwrap_or_else(|| {
        VMM_WAIT + VMM_WAIT_PER_GIB.mul_f64(plan.size as f64 / (1u64 << 30) as f64)
    })
}

/// The VMM process, killed if the row fails before it exits; what it
/// prints is read as it comes (its report outgrows a pipe's buffer before
/// it exits, and a VMM blocked writing would never exit).
struct Vmm {
    child: Option<Child>,
    out: Option<std::thread::JoinHandle<Vec<u8>>>,
    err: Option<std::thread::JoinHandle<Vec<u8>>>,
}

/// Reads `from` to its end on a thread of its own.
fn drain(mut from: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = from.read_to_end(&mut v);
        v
    })
}

/// What a drain thread read.
fn drained(t: Option<std::thread::JoinHandle<Vec<u8>>>) -> Vec<u8> {
    t.map(|t| t.join().unwrap_or_default()).unwrap_or_default()
}

impl Vmm {
    fn start(
        exe: &Path,
        plan: &RestorePlan,
        sock: &Path,
        snap: &Path,
        touch: Touch,
    ) -> Result<Vmm, RestoreError> {
        let mut c = Command::new(exe);
        c.arg("__vmm")
            .arg("--socket")
            .arg(sock)
            .arg("--mem-file")
            .arg(snap)
            .args(["--size", &plan.size.to_string(), "--vcpus", "2"])
            .args(["--backing", if plan.hugetlb { "hugetlb" } else { "anon" }]);
        match touch {
            // A guest touching its working set while the rest fills: one
            // random page of every 2 MiB, as the lazy row's vCPU.
            Touch::Sparse => c.args(["--touch-every", "512"]),
            // Every page: what brings a guest all in through its faults.
            Touch::All => c.args(["--touch-every", "1"]),
            Touch::None => c.arg("--no-touch"),
        };
        Vmm::spawn(c).map_err(|e| plan_err(format!("starting {} __vmm: {e}", exe.display())))
    }

    /// Starts `c` as the VMM, its output read as it comes.
    fn spawn(mut c: Command) -> std::io::Result<Vmm> {
        let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let out = child.stdout.take().map(drain);
        let err = child.stderr.take().map(drain);
        Ok(Vmm {
            child: Some(child),
            out,
            err,
        })
    }

    /// Accepts the VMM's connection within `wait`, or says why it never
    /// came (the VMM failed first, or was killed for taking too long).
    fn connect(
        &mut self,
        listener: &UnixListener,
        wait: Duration,
    ) -> Result<UnixStream, RestoreError> {
        listener.set_nonblocking(true).map_err(plan_err)?;
        let t = Instant::now();
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).map_err(plan_err)?;
                    return Ok(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(plan_err(e)),
            }
            let child = self.child.as_mut().expect("running");
            if child.try_wait().map_err(plan_err)?.is_some() {
                let err = drained(self.err.take());
                return Err(plan_err(format!(
                    "the VMM exited before connecting: {}",
                    String::from_utf8_lossy(&err).trim()
                )));
            }
            if t.elapsed() >= wait {
                return Err(self.kill("the VMM did not connect", wait));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The error to fail the row with if the VMM has failed already
    /// (before every page was in): what it said on stderr. One that
    /// exited well has read every page (the fill's `done` may trail its
    /// last read), and is reaped as usual.
    fn exited_early(&mut self) -> Option<RestoreError> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) if status.success() => None,
            Ok(Some(status)) => {
                let err = drained(self.err.take());
                Some(plan_err(format!(
                    "the VMM failed ({status}) before every page was in: {}",
                    String::from_utf8_lossy(&err).trim()
                )))
            }
            Err(e) => Some(plan_err(e)),
        }
    }

    /// Kills the VMM (and reaps it): the row fails saying `what` did not
    /// happen within `waited`.
    fn kill(&mut self, what: &'static str, waited: Duration) -> RestoreError {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        RestoreError::VmmStuck { what, waited }
    }

    /// Waits up to `wait` for the VMM to exit; past it, kills it and fails
    /// (a fill serving it then ends: it serves until the VMM has gone).
    fn exit_within(&mut self, wait: Duration) -> Result<(), RestoreError> {
        let t = Instant::now();
        let child = self.child.as_mut().expect("running");
        while child.try_wait().map_err(plan_err)?.is_none() {
            if t.elapsed() >= wait {
                return Err(self.kill("every page was in, but the VMM did not exit", wait));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// What the VMM reported, once it has exited within `wait`.
    fn result(mut self, wait: Duration) -> Result<VmmResult, RestoreError> {
        self.exit_within(wait)?;
        let status = self
            .child
            .take()
            .expect("running")
            .wait()
            .map_err(plan_err)?;
        let stdout = drained(self.out.take());
        if !status.success() {
            let err = drained(self.err.take());
            return Err(plan_err(format!(
                "the VMM failed: {}",
                String::from_utf8_lossy(&err).trim()
            )));
        }
        serde_json::from_slice(&stdout).map_err(plan_err)
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One restore of the snapshot at `snap` into a VMM's guest memory by
/// `server`, its vCPUs touching as `touch` says (the latencies are
/// theirs); the time is until every page is in.
///
/// Nothing here waits on the VMM without a deadline ([`vmm_wait`] for
/// each step: its connection, every page in, its exit afterwards; its
/// message, [`firecracker::MESSAGE_WAIT`]): past one the VMM is killed
/// and the row fails with [`RestoreError::VmmStuck`].
pub(super) fn sample(
    plan: &RestorePlan,
    exe: &Path,
    snap: &Path,
    server: Server,
    touch: Touch,
) -> Result<Sample, RestoreError> {
    let wait = vmm_wait(plan);
    let sock: PathBuf = plan
        .dir
        .join(format!("foliokit-restore-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).map_err(plan_err)?;
    let mut vmm = Vmm::start(exe, plan, &sock, snap, touch)?;
    let stream = vmm.connect(&listener, wait)?;
    let _ = std::fs::remove_file(&sock);
    let file = std::fs::File::open(snap).map_err(plan_err)?;
    let t0 = Instant::now();
    let mut s = match server {
        Server::Foliokit => {
            let opts = LazyOptions {
                latency_budget: plan.budget,
                channels: plan.channels,
                folio_size: plan.handler_block,
                ..LazyOptions::default()
            };
            // SAFETY: the descriptor is the VMM's, another process's
            // address space.
            let Served { fill, .. } =
                unsafe { firecracker::serve(&stream, &file, firecracker::MESSAGE_WAIT, &opts) }
                    .map_err(|e| match e {
                        firecracker::ServeError::Fill(e) => RestoreError::Lazy(e),
                        e => plan_err(e),
                    })?;
            // From here the fill serves until the VMM has gone: dropping
            // it before the VMM is gone waits for that, so every way out
            // kills the VMM first (`Vmm::kill`, `exit_within`).
            while !fill.progress().done {
                if t0.elapsed() >= wait {
                    return Err(vmm.kill("not every page was in", wait));
                }
                if let Some(e) = vmm.exited_early() {
                    return Err(e);
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            let resident = t0.elapsed().as_secs_f64();
            // The VMM that touches nothing waits for us to hang up.
            drop(stream);
            vmm.exit_within(wait)?;
            let r = fill.wait();
            let p = r.progress;
            Sample {
                resident,
                faulted: p.faulted_pages,
                filled: p.filled_pages,
                faults: p.faults,
                zero: p.zero_pages,
                longest: Some(r.longest_batch_us),
                ..Sample::default()
            }
        }
        Server::OneAtATime => {
            let handoff =
                firecracker::receive(&stream, firecracker::MESSAGE_WAIT).map_err(plan_err)?;
            let len = file.metadata().map_err(plan_err)?.len();
            let segments = handoff.segments(len).map_err(plan_err)?;
            let source = Source::map_file(&file, len as usize).map_err(plan_err)?;
            let until = t0 + wait;
            let (faults, resident) =
                match one_at_a_time(&handoff, &stream, &source, &segments, t0, until)? {
                    Some(done) => done,
                    None => return Err(vmm.kill("not every page was in", wait)),
                };
            drop(stream);
            Sample {
                resident,
                faulted: (plan.size / 4096) as u64,
                faults,
                ..Sample::default()
            }
        }
    };
    let v = vmm.result(wait)?;
    if v.wrong_count > 0 {
        return Err(plan_err(format!("the VMM read wrong bytes: {:?}", v.wrong)));
    }
    if touch == Touch::None && v.resident_pages != plan.size / 4096 {
        return Err(plan_err(format!(
            "{} of {} guest pages resident after the fill",
            v.resident_pages,
            plan.size / 4096
        )));
    }
    s.start = 0.0;
    // UFFDIO_COPY installs base pages into anonymous memory; hugetlb
    // pages are huge by construction.
    s.thp = if plan.hugetlb { 1.0 } else { 0.0 };
    if touch != Touch::None {
        s.lat = v.lat_us.clone();
    }
    Ok(s)
}

/// The examples' handler: one thread reads a fault, copies that one page
/// (a huge page on hugetlb) with `UFFDIO_COPY`, and reads the next, until
/// every page is in (then the VMM, which touched them all, exits). Returns
/// the faults served and the seconds until every page was in; `None`
/// where `until` came first.
fn one_at_a_time(
    h: &Handoff,
    stream: &UnixStream,
    source: &Source,
    segments: &[foliokit::lazy::ExternalSegment],
    t0: Instant,
    until: Instant,
) -> Result<Option<(u64, f64)>, RestoreError> {
    let (uffd, _) = Uffd::adopt(h.uffd.try_clone().map_err(plan_err)?).map_err(plan_err)?;
    let total: usize = segments.iter().map(|s| s.segment.len / s.page_size).sum();
    let mut installed = 0usize;
    let mut faults = 0u64;
    let gone = stream.as_raw_fd();
    while installed < total {
        let mut p = libc::pollfd {
            fd: gone,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        if unsafe { libc::poll(&mut p, 1, 0) } > 0 {
            return Err(plan_err("the VMM went away before every page was in"));
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        uffd.poll(100);
        for m in uffd.read_all().map_err(plan_err)? {
            let foliokit::internals::Msg::Fault { addr } = m else {
                continue;
            };
            faults += 1;
            let Some(seg) = segments
                .iter()
                .find(|s| (s.segment.addr..s.segment.addr + s.segment.len).contains(&addr))
            else {
                continue;
            };
            let page = seg.page_size;
            let at = addr / page * page;
            let src =
                source.as_ptr() as usize + seg.segment.offset as usize + (at - seg.segment.addr);
            let mut r = uffd.copy(at, src, page);
            // A hugetlb page the last guest freed may still be on its way
            // back to the pool: short of memory is retried, as the kernel
            // retries a fault.
            let t = Instant::now();
            while matches!(&r, Err(e) if e.error.raw_os_error() == Some(libc::ENOMEM))
                && t.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(1));
                r = uffd.copy(at, src, page);
            }
            match r {
                Ok(_) => installed += 1,
                // Raced another fault on the same page: it is in.
                Err(e) if e.error.raw_os_error() == Some(libc::EEXIST) => {
                    let _ = uffd.wake(at, page);
                }
                Err(e) => return Err(plan_err(format!("UFFDIO_COPY at {at:#x}: {}", e.error))),
            }
        }
    }
    Ok(Some((faults, t0.elapsed().as_secs_f64())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VMM that does nothing for ten minutes (`sleep`): one that never
    /// connects, never exits.
    fn stuck() -> Vmm {
        let mut c = Command::new("sleep");
        c.arg("600");
        Vmm::spawn(c).expect("sleep runs")
    }

    fn gone(v: &mut Vmm) -> bool {
        v.child
            .as_mut()
            .is_none_or(|c| c.try_wait().expect("wait").is_some())
    }

    #[test]
    fn a_vmm_that_never_exits_is_killed_and_the_row_fails() {
        let mut v = stuck();
        let e = v
            .exit_within(Duration::from_millis(50))
            .expect_err("it never exits");
        assert!(
            matches!(e, RestoreError::VmmStuck { what, .. } if what.contains("did not exit")),
            "{e}"
        );
        assert!(gone(&mut v), "the VMM was not killed");
        let v = stuck();
        assert!(matches!(
            v.result(Duration::from_millis(50)),
            Err(RestoreError::VmmStuck { .. })
        ));
    }

    #[test]
    fn a_vmm_that_never_connects_is_killed_and_the_row_fails() {
        let sock = std::env::temp_dir().join(format!(
            "foliokit-external-test-{}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).expect("bind");
        let mut v = stuck();
        let e = v
            .connect(&listener, Duration::from_millis(50))
            .expect_err("it never connects");
        let _ = std::fs::remove_file(&sock);
        assert!(
            matches!(e, RestoreError::VmmStuck { what, .. } if what.contains("connect")),
            "{e}"
        );
        assert!(gone(&mut v), "the VMM was not killed");
    }
}

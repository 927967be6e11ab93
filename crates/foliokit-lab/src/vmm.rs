//! A process playing a VMM exactly as Firecracker does on snapshot load
//! with an external page-fault handler: it maps guest memory privately
//! (4 KiB anonymous pages, or 2 MiB hugetlb pages), makes a userfaultfd
//! (non-blocking, REMOVE events only), registers every region in missing
//! mode, connects to the handler's socket and sends one message: the JSON
//! regions with the descriptor. Then vCPU threads touch the guest's pages
//! and a balloon thread may discard ranges, as a guest would; every byte
//! read is checked against the memory file.
//!
//! What a touch must find: the file's bytes, or what a vCPU wrote after
//! its first touch (a write the fill lost would show as the file's bytes
//! or zeros), or zeros where the balloon discarded the page (never the
//! file's bytes). `foliokit __vmm` runs it; the handler's tests and the
//! external-handler rows of `bench restore` start that.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use foliokit::internals::{Uffd, FEATURE_EVENT_REMOVE};
use foliokit::lazy::firecracker::{self, GuestRegion};
use foliokit::lazy::Source;
use serde::{Deserialize, Serialize};

/// The guest's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backing {
    /// Private anonymous 4 KiB pages (Firecracker's default).
    Anon,
    /// Private hugetlb 2 MiB pages (a snapshot with huge pages).
    Hugetlb,
}

/// What the player does.
#[derive(Debug, Clone)]
pub struct VmmPlan {
    /// The handler's socket.
    pub socket: PathBuf,
    /// The memory file the handler serves from (checked against here).
    pub mem_file: PathBuf,
    /// Guest bytes, split into `regions` equal regions.
    pub size: usize,
    /// Regions (Firecracker has one per memory slot).
    pub regions: usize,
    /// What backs the guest.
    pub backing: Backing,
    /// vCPU threads touching pages.
    pub vcpus: usize,
    /// Every n-th page a vCPU touches it also writes (0: none).
    pub write_every: usize,
    /// The vCPUs touch one page, chosen at random, of every run of this
    /// many (1: every page; 512: one of every 2 MiB, as a guest touching
    /// its working set while the rest fills). Every page is checked at
    /// the end regardless.
    pub touch_every: usize,
    /// Pages the balloon discards while the handler fills, a run every
    /// `balloon_every` pages (0: no balloon).
    pub balloon_every: usize,
    /// Exit (as a VMM killed mid-restore) after touching this many pages.
    pub exit_after: Option<usize>,
    /// Send these bytes instead of the regions' JSON (with the
    /// descriptor): a malformed message for the handler's tests.
    pub message: Option<Vec<u8>>,
    /// Give the handler this long to fill before the vCPUs start touching
    /// (time to all resident without a touch).
    pub idle: Duration,
    /// Claim this page size for every region instead of the mapping's.
    pub claim_page_size: Option<usize>,
    /// Touch nothing: wait (up to 10 s) for the handler to close the
    /// connection, then count the guest's resident pages (a handler that
    /// refused must have installed none).
    pub no_touch: bool,
    /// Where the memory file is cut short during the fill (guest bytes
    /// from the start; a test truncates the file there): the vCPUs touch
    /// and check only pages below it; the first, middle and last page
    /// from it are probed, each read by a forked child, whose SIGBUS says
    /// the handler poisoned it (see [`VmmResult::probes`]).
    pub cut: Option<usize>,
    /// After the idle, wait (at most [`GO_WAIT`]) until this file exists
    /// before the vCPUs start: a test says "go" once the handler has
    /// said every page is in, whatever the machine's speed.
    pub go_file: Option<std::path::PathBuf>,
}

/// The longest [`VmmPlan::go_file`] is waited for.
pub const GO_WAIT: Duration = Duration::from_secs(600);

/// What the player saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VmmResult {
    /// Pages checked.
    pub pages: usize,
    /// Pages that held what they must not (the first few, described).
    pub wrong: Vec<String>,
    /// How many were wrong.
    pub wrong_count: usize,
    /// Pages the balloon discarded.
    pub ballooned: usize,
    /// First-touch latency percentiles, microseconds (p50, p99, max).
    pub touch_us: [f64; 3],
    /// Every first touch's latency, microseconds, in touch order per vCPU.
    #[serde(default)]
    pub lat_us: Vec<f64>,
    /// Seconds from the handoff until the vCPUs had touched every page.
    pub secs: f64,
    /// With `no_touch`: guest pages resident once the handler hung up.
    pub resident_pages: usize,
    /// Where the guest's memory starts (its first region's address).
    #[serde(default)]
    pub base: u64,
    /// With `cut`: each probed page's guest offset and what reading it
    /// gave: "sigbus" (poisoned), "zeros", or "data".
    #[serde(default)]
    pub probes: Vec<(usize, String)>,
}

/// Reads the page at `at` in a forked child: what a vCPU touching it
/// would get, told without risking this process (a poisoned page raises
/// SIGBUS). The child's copy of the page is the parent's: a poison
/// marker is copied on fork; an empty page reads zeros there (the
/// child's memory is registered with no userfaultfd).
fn probe(at: usize) -> Result<String, VmmError> {
    // SAFETY: the child only reads our mapping and leaves with _exit,
    // running no code that could need a lock another thread held.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(sys("fork")(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: a page of our guest mapping, copied into the child.
        let page = unsafe { std::slice::from_raw_parts(at as *const u8, 4096) };
        let zero = page.iter().all(|&b| std::hint::black_box(b) == 0);
        // SAFETY: leaving the child without running the parent's exit
        // handlers.
        unsafe { libc::_exit(if zero { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return Err(sys("waitpid")(std::io::Error::last_os_error()));
    }
    Ok(match () {
        _ if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS => "sigbus",
        _ if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 => "zeros",
        _ if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 1 => "data",
        _ => "the child died otherwise",
    }
    .to_string())
}

/// Why the player stopped.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The plan cannot run.
    #[error("{0}")]
    Plan(String),
}

fn sys(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmmError {
    let what = what.into();
    move |source| VmmError::Sys { what, source }
}

/// A well-mixed number for `b` (which page of a run a vCPU touches).
fn mix(b: usize) -> usize {
    let mut x = (b as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as usize
}

/// A stamp a vCPU writes into page `i`: not the file's bytes, not zeros.
fn stamp(i: usize) -> u64 {
    0x5EED_0000_0000_0000 | i as u64
}

/// The guest's memory, unmapped on drop.
struct Guest {
    base: usize,
    len: usize,
}

impl Guest {
    /// Maps `len` bytes aligned to 2 MiB (Firecracker's guest memory is:
    /// a region's page size may be a huge page's on any kernel).
    fn map(len: usize, backing: Backing) -> Result<Guest, VmmError> {
        const ALIGN: usize = 2 << 20;
        let huge = match backing {
            Backing::Anon => 0,
            Backing::Hugetlb => libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT),
        };
        // Room to align anonymous memory (hugetlb mappings are aligned).
        let extra = if huge == 0 { ALIGN } else { 0 };
        // SAFETY: a fresh private mapping nobody else refers to.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + extra,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | huge,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys("mapping guest memory")(std::io::Error::last_os_error()));
        }
        let start = p as usize;
        let base = start.next_multiple_of(if extra > 0 { ALIGN } else { 1 });
        // SAFETY: unmapping the unaligned head and tail of our own fresh
        // mapping, outside [base, base + len).
        unsafe {
            if base > start {
                libc::munmap(p, base - start);
            }
            let tail = start + len + extra - (base + len);
            if tail > 0 {
                libc::munmap((base + len) as *mut libc::c_void, tail);
            }
        }
        Ok(Guest { base, len })
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// The memory file, mapped read-only for checking.
struct FileMap(Source);

impl FileMap {
    fn open(path: &PathBuf, len: usize) -> Result<FileMap, VmmError> {
        let f = std::fs::File::open(path).map_err(sys(format!("opening {}", path.display())))?;
        Ok(FileMap(
            Source::map_file(&f, len).map_err(sys("mapping the memory file"))?,
        ))
    }

    fn page(&self, off: usize, len: usize) -> &[u8] {
        // SAFETY: inside the mapping (the plan's size is the file's),
        // which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().add(off), len) }
    }
}

/// What page `i` must hold now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    File,
    Stamped,
    Zero,
}

struct Checker {
    wrong: std::sync::Mutex<Vec<String>>,
    count: AtomicUsize,
}

impl Checker {
    fn check(&self, i: usize, got: &[u8], file: &[u8], want: Want) {
        let ok = match want {
            Want::File => got == file,
            Want::Zero => got.iter().all(|&b| b == 0),
            Want::Stamped => got[..8] == stamp(i).to_ne_bytes() && got[8..] == file[8..],
        };
        if !ok {
            let n = self.count.fetch_add(1, Ordering::Relaxed);
            if n < 8 {
                let what = match want {
                    Want::File => "the memory file's bytes",
                    Want::Zero => "zeros (the balloon discarded it)",
                    Want::Stamped => "a vCPU's write",
                };
                let first = got.iter().zip(file).position(|(a, b)| a != b).unwrap_or(0);
                self.wrong
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("page {i} should hold {what}; byte {first} differs"));
            }
        }
    }
}

/// Makes the descriptor as Firecracker does and registers the guest.
fn handoff_uffd(guest: &Guest) -> Result<Uffd, VmmError> {
    let (uffd, _) = Uffd::open(FEATURE_EVENT_REMOVE, false).map_err(sys("making a userfaultfd"))?;
    uffd.register_missing(guest.base, guest.len)
        .map_err(sys("registering guest memory"))?;
    Ok(uffd)
}

/// Waits (up to 10 s) for the handler to close the connection, then
/// counts the guest's resident pages (`mincore`, which faults nothing in).
fn after_hangup(stream: &UnixStream, guest: &Guest) -> Result<usize, VmmError> {
    use std::io::Read;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(sys("setting a timeout"))?;
    let _ = (&*stream).read(&mut [0u8; 16]);
    let mut vec = vec![0u8; guest.len / 4096];
    // SAFETY: mincore writes one byte per page of our mapping into `vec`,
    // which has room for every page.
    let rc = unsafe { libc::mincore(guest.base as *mut libc::c_void, guest.len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(sys("mincore")(std::io::Error::last_os_error()));
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count())
}

/// Plays the VMM: hands the guest to the handler at `plan.socket`, then
/// touches, writes and discards as planned, and checks every page.
pub fn play(plan: &VmmPlan) -> Result<VmmResult, VmmError> {
    let page = match plan.backing {
        Backing::Anon => 4096,
        Backing::Hugetlb => 2 << 20,
    };
    let regions = plan.regions.max(1);
    if plan.size == 0 || plan.size % (page * regions) != 0 {
        return Err(VmmError::Plan(format!(
            "the guest size must be a multiple of {regions} x {page} bytes"
        )));
    }
    let guest = Guest::map(plan.size, plan.backing)?;
    let file = FileMap::open(&plan.mem_file, plan.size)?;
    let uffd = handoff_uffd(&guest)?;
    let stream = UnixStream::connect(&plan.socket)
        .map_err(sys(format!("connecting to {}", plan.socket.display())))?;
    let per = plan.size / regions;
    let table: Vec<GuestRegion> = (0..regions)
        .map(|r| {
            GuestRegion::new(
                (guest.base + r * per) as u64,
                per as u64,
                (r * per) as u64,
                page as u64,
            )
        })
        .collect();
    let table: Vec<GuestRegion> = match plan.claim_page_size {
        Some(p) => table
            .into_iter()
            .map(|r| GuestRegion::new(r.base_host_virt_addr, r.size, r.offset, p as u64))
            .collect(),
        None => table,
    };
    let t0 = Instant::now();
    let sent = match &plan.message {
        Some(bytes) => firecracker::send_raw(&stream, bytes, uffd.as_fd()),
        None => firecracker::send(&stream, &table, uffd.as_fd()),
    };
    if plan.no_touch || plan.message.is_some() {
        // A handler that refuses may hang up before it has read it all.
        if let Err(e) = sent {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                return Err(sys("sending the handoff")(e));
            }
        }
        return Ok(VmmResult {
            resident_pages: after_hangup(&stream, &guest)?,
            ..VmmResult::default()
        });
    }
    sent.map_err(sys("sending the handoff"))?;
    std::thread::sleep(plan.idle);
    if let Some(go) = &plan.go_file {
        let t = Instant::now();
        while !go.exists() {
            if t.elapsed() > GO_WAIT {
                return Err(VmmError::Plan(format!(
                    "{} did not appear within {GO_WAIT:?}",
                    go.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // Pages the vCPUs touch and the check reads: those below the cut.
    let pages = plan.cut.map_or(plan.size, |c| c.min(plan.size)) / 4096;
    let per_unit = page / 4096;
    // Units (a page of the mapping: 4 KiB, or a whole huge page) the
    // balloon discards, and every 4 KiB page inside them.
    let balloon: Vec<usize> = match plan.balloon_every {
        0 => Vec::new(),
        n => {
            let k = (n / per_unit).max(2);
            (0..pages / per_unit).filter(|u| u % k == k / 2).collect()
        }
    };
    let ballooned: Vec<AtomicBool> = (0..pages).map(|_| AtomicBool::new(false)).collect();
    for &u in &balloon {
        for b in &ballooned[u * per_unit..(u + 1) * per_unit] {
            b.store(true, Ordering::Relaxed);
        }
    }
    let checker = Checker {
        wrong: std::sync::Mutex::new(Vec::new()),
        count: AtomicUsize::new(0),
    };
    let touched = AtomicUsize::new(0);
    let vcpus = plan.vcpus.max(1);
    let start = Barrier::new(vcpus + 2);
    let lat = std::thread::scope(|s| {
        let balloon_thread = s.spawn(|| {
            start.wait();
            // Discards whole pages of the mapping (a hugetlb page at once).
            for &u in &balloon {
                let at = guest.base + u * page;
                // SAFETY: discarding part of our own guest mapping; no
                // vCPU touches a ballooned page until this is done.
                unsafe { libc::madvise(at as *mut libc::c_void, page, libc::MADV_DONTNEED) };
            }
        });
        let workers: Vec<_> = (0..vcpus)
            .map(|v| {
                let (guest, file, checker, touched, start, ballooned) =
                    (&guest, &file, &checker, &touched, &start, &ballooned);
                s.spawn(move || {
                    let mut lat = Vec::new();
                    start.wait();
                    // Touch this vCPU's pages in a scattered order.
                    let every = plan.touch_every.max(1);
                    let mine: Vec<usize> = (0..pages.div_ceil(every))
                        .filter(|b| b % vcpus == v)
                        .map(|b| (b * every + mix(b) % every).min(pages - 1))
                        .collect();
                    let n = mine.len();
                    for k in 0..n {
                        let i = mine[(k * 7919) % n];
                        if ballooned[i].load(Ordering::Relaxed) {
                            continue;
                        }
                        if plan
                            .exit_after
                            .is_some_and(|e| touched.load(Ordering::Relaxed) >= e)
                        {
                            // A VMM killed mid-restore: no destructor runs.
                            std::process::exit(0);
                        }
                        let at = guest.base + i * 4096;
                        let t = Instant::now();
                        // SAFETY: a page of our mapping; the read faults
                        // into the handler and returns once it is in.
                        let got = unsafe { std::slice::from_raw_parts(at as *const u8, 4096) };
                        let _ = std::hint::black_box(got[0]);
                        lat.push(t.elapsed());
                        checker.check(i, got, file.page(i * 4096, 4096), Want::File);
                        if plan.write_every > 0 && i % plan.write_every == 0 {
                            // SAFETY: our page, written by this vCPU alone.
                            unsafe { (at as *mut u64).write_volatile(stamp(i)) };
                        }
                        touched.fetch_add(1, Ordering::Relaxed);
                    }
                    lat
                })
            })
            .collect();
        start.wait();
        let _ = balloon_thread.join();
        let mut all: Vec<Duration> = Vec::new();
        for w in workers {
            all.extend(w.join().unwrap_or_default());
        }
        all
    });
    let secs = t0.elapsed().as_secs_f64();
    // Everything once more, now that the balloon and the fill are done.
    for (i, b) in ballooned.iter().enumerate() {
        // SAFETY: a page of our mapping.
        let got = unsafe { std::slice::from_raw_parts((guest.base + i * 4096) as *const u8, 4096) };
        let want = if b.load(Ordering::Relaxed) {
            Want::Zero
        } else if plan.write_every > 0 && i % plan.write_every == 0 {
            Want::Stamped
        } else {
            Want::File
        };
        checker.check(i, got, file.page(i * 4096, 4096), want);
    }
    let mut probes = Vec::new();
    if let Some(cut) = plan.cut.filter(|&c| c < plan.size) {
        let (first, last) = (cut / 4096, plan.size / 4096 - 1);
        for i in [first, (first + last) / 2, last] {
            probes.push((i * 4096, probe(guest.base + i * 4096)?));
        }
    }
    let lat_us: Vec<f64> = lat.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    let mut us = lat_us.clone();
    us.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        us.get(((us.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok(VmmResult {
        pages,
        wrong: checker
            .wrong
            .into_inner()
            .unwrap_or_else(|p| p.into_inner()),
        wrong_count: checker.count.load(Ordering::Relaxed),
        ballooned: balloon.len() * per_unit,
        touch_us: [pct(0.5), pct(0.99), us.last().copied().unwrap_or(0.0)],
        secs,
        resident_pages: 0,
        base: guest.base as u64,
        probes,
        lat_us,
    })
}

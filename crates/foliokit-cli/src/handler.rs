//! `foliokit uffd-handler SOCKET MEM_FILE`: the page-fault handler
//! Firecracker starts for a snapshot restored with the `Uffd` memory
//! backend, and `foliokit __vmm`, a process playing Firecracker's side.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use foliokit::lazy::firecracker::{self, Served};
use foliokit::lazy::{LazyOptions, LazyReport};
use serde::Serialize;

use crate::args::parse_size;
use crate::bench::migrate::parse_duration;
use crate::CliError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// Lines on stderr.
    Text,
    /// The report as one JSON object on stdout (progress stays on stderr).
    Json,
}

/// Serve a Firecracker VM's guest memory from its snapshot memory file,
/// as the page-fault handler Firecracker starts (same arguments, same
/// protocol as its example handlers).
///
/// Binds SOCKET, accepts Firecracker's one connection and takes its
/// message: the guest memory regions (JSON) with its userfaultfd. Each
/// fault is served first, with the block around it (a huge page whole on
/// hugetlb guest memory); the rest is filled in the background over the
/// copy channels, in batches kept within the latency budget. Pages the
/// guest's balloon discards read zeros afterwards, never the snapshot's
/// bytes. Snapshot pages that cannot be read are poisoned (the vCPU
/// touching one gets SIGBUS, as with real poison) and reported.
///
/// Once every page is in, the handler stays to serve faults in what the
/// balloon discards, until Firecracker exits; then it prints its report
/// and exits 0. A message that is not Firecracker's (malformed, cut short,
/// over 1 MiB, without its descriptor, or not there within
/// --message-timeout of connecting), a region outside MEM_FILE or not
/// aligned to its page size, or a page size that is not the mapping's:
/// one line on stderr, exit 1, nothing installed.
///
/// Example (Firecracker's snapshot load with "mem_backend":
/// {"backend_type": "Uffd", "backend_path": "/run/fc/uffd.sock"}):
///
///   foliokit uffd-handler /run/fc/uffd.sock /snapshots/vm1/mem &
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct HandlerArgs {
    /// The socket to bind (Firecracker's `backend_path`); must not exist.
    pub socket: PathBuf,
    /// The snapshot's memory file: the regions' bytes back to back.
    pub mem_file: PathBuf,
    /// Copy channels for the background fill.
    #[arg(long, default_value_t = LazyOptions::default().channels)]
    pub channels: usize,
    /// The longest a faulting vCPU waits behind a background batch.
    #[arg(long, value_parser = parse_duration, default_value = "1ms")]
    pub latency_budget: Duration,
    /// The block a fault installs around itself in 4 KiB guest memory
    /// (hugetlb guest memory: its huge page), and the unit the background
    /// fill is cut between: smaller, a touch waits less behind the fill;
    /// larger, the fill runs a little faster (docs/firecracker.md).
    #[arg(long, value_parser = parse_size, default_value = crate::args::HANDLER_BLOCK)]
    pub block: usize,
    /// The longest to wait, once Firecracker has connected, for its
    /// message (it sends it at once): a peer that says nothing gets one
    /// line on stderr and exit 1.
    #[arg(long, value_parser = parse_wait, default_value_t = Wait(firecracker::MESSAGE_WAIT))]
    pub message_timeout: Wait,
    /// How the final report is written.
    #[arg(long, value_enum, default_value = "text")]
    pub format: ReportFormat,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
}

/// A wait on the command line (`parse_duration`'s units), shown in
/// seconds.
#[derive(Debug, Clone, Copy)]
pub struct Wait(pub Duration);

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}s", self.0.as_secs_f64())
    }
}

fn parse_wait(t: &str) -> Result<Wait, String> {
    parse_duration(t).map(Wait)
}

/// The socket file, removed when the handler ends.
struct Bound(PathBuf);

impl Drop for Bound {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The report's JSON.
#[derive(Serialize)]
struct Summary<'a> {
    vmm_pid: i32,
    regions: usize,
    total_bytes: u64,
    resident_secs: f64,
    resident_gbps: f64,
    faults: u64,
    faulted_pages: u64,
    filled_pages: u64,
    discarded_pages: u64,
    zero_pages: u64,
    bad_pages: u64,
    bad: Vec<(String, usize, String)>,
    bad_outcome: String,
    batches: u64,
    longest_batch_us: f64,
    strategy: Option<String>,
    notes: &'a [String],
}

fn summary<'r>(vmm_pid: i32, regions: usize, r: &'r LazyReport) -> Summary<'r> {
    let p = &r.progress;
    let bytes = p.total_pages * foliokit::batch::page_size() as u64;
    Summary {
        vmm_pid,
        regions,
        total_bytes: bytes,
        resident_secs: r.secs,
        resident_gbps: if r.secs > 0.0 {
            bytes as f64 / r.secs / 1e9
        } else {
            0.0
        },
        faults: p.faults,
        faulted_pages: p.faulted_pages,
        filled_pages: p.filled_pages,
        discarded_pages: p.skipped_pages,
        zero_pages: p.zero_pages,
        bad_pages: p.bad_pages,
        bad: r
            .bad
            .iter()
            .map(|b| (format!("{:#x}", b.addr), b.len, format!("{:?}", b.kind)))
            .collect(),
        bad_outcome: format!("{:?}", r.bad_outcome),
        batches: r.batches,
        longest_batch_us: r.longest_batch_us,
        strategy: r.strategy.map(|s| s.to_string()),
        notes: &r.notes,
    }
}

/// Whether process `pid` still runs (not gone, not a zombie).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        st.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X'))
    })
}

fn bind(path: &Path) -> Result<(UnixListener, Bound), CliError> {
    let l = UnixListener::bind(path).map_err(|e| {
        format!(
            "binding {}: {e}{}",
            path.display(),
            if path.exists() {
                " (remove a stale socket first)"
            } else {
                ""
            }
        )
    })?;
    Ok((l, Bound(path.to_path_buf())))
}

pub fn run(a: HandlerArgs) -> Result<(), CliError> {
    let file = std::fs::File::open(&a.mem_file)
        .map_err(|e| format!("opening {}: {e}", a.mem_file.display()))?;
    let file_len = file.metadata()?.len();
    if file_len == 0 {
        return Err(format!("{} is empty", a.mem_file.display()).into());
    }
    let (listener, bound) = bind(&a.socket)?;
    let (stream, _) = listener.accept()?;
    // One VMM per handler: nobody else may connect (and be served, or
    // wait for a handler that serves another) once it has.
    drop((listener, bound));
    let opts = LazyOptions {
        channels: a.channels.max(1),
        latency_budget: a.latency_budget,
        folio_size: a.block,
        ..LazyOptions::default()
    };
    // SAFETY: the descriptor is the VMM's (another process's address
    // space).
    let Served {
        pid,
        regions,
        costs,
        fill,
    } = unsafe { firecracker::serve(&stream, &file, a.message_timeout.0, &opts)? };
    if !a.quiet {
        for c in costs {
            eprintln!("foliokit: the VMM's userfaultfd has {c}");
        }
    }
    let t0 = Instant::now();
    let mut last = Instant::now();
    loop {
        let p = fill.progress();
        if p.done {
            break;
        }
        if !a.quiet && last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            let inn = p.faulted_pages + p.filled_pages + p.skipped_pages + p.bad_pages;
            eprintln!(
                "foliokit: {:5.1}% in ({} faults served) after {:.1} s",
                100.0 * inn as f64 / p.total_pages.max(1) as f64,
                p.faults,
                t0.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !a.quiet {
        if running(pid) {
            eprintln!(
                "foliokit: every page in after {:.3} s; serving the balloon's discards until the VMM exits",
                t0.elapsed().as_secs_f64()
            );
        } else {
            eprintln!("foliokit: the VMM went away before every page was in");
        }
    }
    let report = fill.wait();
    let s = summary(pid, regions.len(), &report);
    match a.format {
        ReportFormat::Json => println!("{}", serde_json::to_string(&s)?),
        ReportFormat::Text => {
            eprintln!(
                "foliokit: VMM {} gone; {} in {} region(s): resident in {:.3} s ({:.2} GB/s); {} faults served ({} pages), {} pages filled in the background in {} batches (longest {:.0} us), {} discarded, {} bad ({:?})",
                s.vmm_pid,
                crate::args::show_size(s.total_bytes as usize),
                s.regions,
                s.resident_secs,
                s.resident_gbps,
                s.faults,
                s.faulted_pages,
                s.filled_pages,
                s.batches,
                s.longest_batch_us,
                s.discarded_pages,
                s.bad_pages,
                report.bad_outcome,
            );
            for n in &report.notes {
                eprintln!("foliokit: note: {n}");
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackingArg {
    /// 4 KiB anonymous pages.
    Anon,
    /// 2 MiB hugetlb pages.
    Hugetlb,
}

/// (internal) A process playing Firecracker: see `foliokit_lab::vmm`.
#[derive(Debug, Args)]
pub struct VmmArgs {
    #[arg(long)]
    pub socket: PathBuf,
    #[arg(long)]
    pub mem_file: PathBuf,
    #[arg(long, value_parser = parse_size)]
    pub size: usize,
    #[arg(long, default_value_t = 1)]
    pub regions: usize,
    #[arg(long, value_enum, default_value = "anon")]
    pub backing: BackingArg,
    #[arg(long, default_value_t = 2)]
    pub vcpus: usize,
    #[arg(long, default_value_t = 0)]
    pub write_every: usize,
    #[arg(long, default_value_t = 1)]
    pub touch_every: usize,
    #[arg(long, default_value_t = 0)]
    pub balloon_every: usize,
    #[arg(long)]
    pub exit_after: Option<usize>,
    /// A file whose bytes are sent instead of the regions' JSON.
    #[arg(long)]
    pub message: Option<PathBuf>,
    #[arg(long, value_parser = parse_duration)]
    pub idle: Option<Duration>,
    #[arg(long, value_parser = parse_size)]
    pub claim_page_size: Option<usize>,
    #[arg(long)]
    pub no_touch: bool,
    #[arg(long, value_parser = parse_size)]
    pub cut: Option<usize>,
    #[arg(long)]
    pub go_file: Option<PathBuf>,
}

pub fn vmm(a: VmmArgs) -> Result<(), CliError> {
    use foliokit_lab::vmm::{play, Backing, VmmPlan};
    let message = a.message.map(std::fs::read).transpose()?;
    let plan = VmmPlan {
        socket: a.socket,
        mem_file: a.mem_file,
        size: a.size,
        regions: a.regions,
        backing: match a.backing {
            BackingArg::Anon => Backing::Anon,
            BackingArg::Hugetlb => Backing::Hugetlb,
        },
        vcpus: a.vcpus,
        write_every: a.write_every,
        touch_every: a.touch_every,
        balloon_every: a.balloon_every,
        exit_after: a.exit_after,
        message,
        idle: a.idle.unwrap_or(Duration::ZERO),
        claim_page_size: a.claim_page_size,
        no_touch: a.no_touch,
        cut: a.cut,
        go_file: a.go_file,
    };
    let r = play(&plan)?;
    println!("{}", serde_json::to_string(&r)?);
    if r.wrong_count > 0 {
        return Err(format!("{} pages held what they must not", r.wrong_count).into());
    }
    Ok(())
}

//! `foliokit`: inspect, calibrate and benchmark large-folio memory operations.

mod args;
mod bench;
mod calibrate;
mod compare;
mod damon;
mod guest;
mod handler;
mod html;
mod info;
mod lab;
mod labplots;
mod machine;
mod moves;
mod plots;
mod progress;
mod report;
mod summary;

use clap::{Parser, Subcommand};

/// Any error a subcommand reports; printed as one line.
pub type CliError = Box<dyn std::error::Error>;

/// An error that ends the run with an exit status of its own, which the
/// command's `--help` documents for scripts (1 is every other error).
#[derive(Debug)]
pub struct WithStatus {
    pub status: i32,
    pub error: CliError,
}

impl std::fmt::Display for WithStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for WithStatus {}

#[derive(Parser)]
#[command(
    name = "foliokit",
    version,
    about = "Large-folio memory operations for user space, measured on this machine",
    long_about = "foliokit copies, clears and moves memory in whole large folios, the way recent \
Linux kernels do, and reproduces the kernel patch postings' experiments on this machine.\n\n\
Start with `foliokit lab` (every experiment, with an HTML report), or \
`foliokit info` (what this CPU offers and what auto picks), then `foliokit bench <op> -f help`. \
`foliokit calibrate` measures the strategies here and stores a profile auto follows."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every seed experiment on this machine: tables, results.json, CSVs and an HTML report.
    Lab(lab::LabArgs),
    /// CPU flags, caches, NUMA, THP/hugetlb state, and what auto picks.
    Info(info::InfoArgs),
    /// Measure the named strategies here and store the profile auto reads.
    Calibrate(calibrate::CalibrateArgs),
    /// Run an experiment; `foliokit bench <op> -f help` lists its strategies.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Match the rows of two or more runs (lab results.json or bench JSON) and show each
    /// run's ratio to the first, called a change only beyond both rows' spread.
    /// Example: compare before/results.json after/results.json --out cmp
    Compare(compare::CompareArgs),
    /// Move another process's memory to a NUMA node (what a tiering agent does), in
    /// move_pages calls kept under a latency budget. Example: move --pid 4242 --to 1 --all-anon
    Move(moves::MoveArgs),
    /// The page-fault handler Firecracker starts for a snapshot: serve its guest memory from
    /// MEM_FILE at memory bandwidth. Example: uffd-handler /run/fc/uffd.sock /snapshots/vm1/mem
    #[command(name = "uffd-handler")]
    UffdHandler(handler::HandlerArgs),
    /// (internal) A process playing Firecracker's side of the handler's protocol.
    #[command(name = "__vmm", hide = true)]
    Vmm(handler::VmmArgs),
    /// (internal) The target process of `bench migrate` table 4.
    #[command(name = "__target", hide = true)]
    Target(bench::migrate::TargetArgs),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Folio copy GB/s by strategy (seed 000). Example: bench copy -s 1G -p 2M -f all --evict
    Copy(bench::folio::CopyArgs),
    /// Folio clear GB/s by strategy (seed 002). Example: bench clear -s 1G -p 2M -f all
    Clear(bench::folio::ClearArgs),
    /// Page-fault GB/s by page size, method and threads (perf bench mem mmap; seed 002).
    Fault(bench::fault::FaultArgs),
    /// Batched migration: channels, batch size vs first-folio latency, kernel vs relocation (seed 001).
    Migrate(bench::migrate::MigrateArgs),
    /// mremap of large folios by mTHP size (seed 004) and 1G at PTE/PMD/PUD alignment.
    Mremap(bench::mremap::MremapArgs),
    /// Write-once array init: field stores vs template memcpy vs streaming (seed 003).
    Init(bench::init::InitArgs),
    /// Guest RAM restore from a snapshot: eager read(2), mmap+memcpy, foliokit, and lazy (userfaultfd). Example: bench restore -s 4G
    Restore(bench::restore::RestoreArgs),
}

/// What a panic of `print!` says when stdout is closed or full.
const PRINT_FAILED: &str = "failed printing to stdout";

/// A closed pipe (`foliokit ... | head`) or a full disk under stdout ends
/// the run with one line, or none for the pipe, as other tools do; the
/// panic `print!` raises still unwinds, so every guard that restores a
/// system setting runs. Other panics keep the default report.
fn quiet_print_failures() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        match msg.strip_prefix(PRINT_FAILED) {
            Some(rest) if rest.contains("Broken pipe") => {}
            Some(rest) => eprintln!("foliokit: error: writing the output{rest}"),
            None => default(info),
        }
    }));
}

fn main() {
    quiet_print_failures();
    let cli = Cli::parse();
    // The CLI asks for what a library must not assume: the profile
    // `foliokit calibrate` wrote, and channels spread over the CPUs so
    // measurements place them the same way every run.
    let config = foliokit::Config::new()
        .profile(foliokit::ProfileChoice::DefaultFile)
        .channel_cpus(foliokit::ChannelCpus::Spread);
    if let Err(e) = foliokit::init(config) {
        eprintln!("foliokit: error: {e}");
        std::process::exit(1);
    }
    let run = std::panic::catch_unwind(|| dispatch(cli.cmd));
    let result = match run {
        Ok(r) => r,
        // Said by the hook; the guards ran as it unwound.
        Err(_) => std::process::exit(1),
    };
    if let Err(e) = result {
        eprintln!("foliokit: error: {e}");
        std::process::exit(e.downcast_ref::<WithStatus>().map_or(1, |w| w.status));
    }
}

/// Runs the command.
fn dispatch(cmd: Cmd) -> Result<(), CliError> {
    match cmd {
        Cmd::Lab(a) => lab::run(a),
        Cmd::Compare(a) => compare::run(a),
        Cmd::Info(a) => info::run(a),
        Cmd::Calibrate(a) => calibrate::run(a),
        Cmd::Bench(BenchCmd::Copy(a)) => bench::folio::copy(a),
        Cmd::Bench(BenchCmd::Clear(a)) => bench::folio::clear(a),
        Cmd::Bench(BenchCmd::Init(a)) => bench::init::run(a),
        Cmd::Bench(BenchCmd::Fault(a)) => bench::fault::run(a),
        Cmd::Bench(BenchCmd::Mremap(a)) => bench::mremap::run(a),
        Cmd::Bench(BenchCmd::Migrate(a)) => bench::migrate::run(a),
        Cmd::Bench(BenchCmd::Restore(a)) => bench::restore::run(a),
        Cmd::Target(a) => bench::migrate::target(a),
        Cmd::UffdHandler(a) => handler::run(a),
        Cmd::Vmm(a) => handler::vmm(a),
        Cmd::Move(a) => match moves::run(a) {
            Ok(0) => Ok(()),
            Ok(code) => std::process::exit(code),
            Err(e) => Err(e),
        },
    }
}

//! `cargo xtask install-capi --prefix DIR`: installs the C library (header,
//! versioned shared library and links, static library, foliokit.pc).
//!
//! `cargo xtask public-api` and `cargo xtask layers`: the checks that keep
//! the public surface deliberate and the modules layered (see api.rs,
//! layers.rs).
//!
//! `cargo xtask test-unprivileged`: the tests as the user nobody.
//!
//! `cargo xtask vm-test`: foliokit's tests inside guest kernels, for what
//! this host cannot show (several NUMA nodes, a memory-only tier, real
//! hardware poison, an older kernel). QEMU's software emulation boots each
//! guest with virtme-ng, which shares the host's filesystem read-only with
//! it, so the test binaries built here run there unchanged; the launcher is
//! foliokit-guest, the one `foliokit lab --kernel` uses. Timings in a
//! guest mean nothing: the guests are for correctness only.

mod api;
mod guest;
mod install;
mod layers;
mod setup;
mod testbins;
mod unprivileged;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::Command;

pub type Error = Box<dyn std::error::Error>;

#[derive(Parser)]
#[command(about = "foliokit project automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the test binaries and run them in guest kernels: 6.12 with
    /// three NUMA nodes (two with CPUs, one memory-only) and 6.1 with two.
    /// Installs QEMU, busybox, kmod and virtme-ng when missing; caches the
    /// kernels under target/vm-cache.
    VmTest {
        /// Only these guests (6.12, 6.1).
        #[arg(long, value_delimiter = ',')]
        guest: Vec<String>,
        /// Only test binaries whose name contains this.
        #[arg(long)]
        filter: Option<String>,
    },
    /// Install what guests need (QEMU, busybox, kmod, virtme-ng) and fetch
    /// the kernels, then print the paths `foliokit lab --kernel` takes.
    VmSetup {
        /// Kernel series to fetch (6.12, 6.1).
        #[arg(long, value_delimiter = ',', default_value = "6.12,6.1")]
        kernel: Vec<String>,
    },
    /// Build libfoliokit (release) and install foliokit.h, libfoliokit.so
    /// with its versioned name and links, libfoliokit.a and foliokit.pc.
    InstallCapi {
        /// Installation prefix, e.g. /usr/local or target/capi-prefix.
        #[arg(long)]
        prefix: PathBuf,
        /// Library directory, relative to the prefix unless absolute.
        #[arg(long, default_value = "lib")]
        libdir: PathBuf,
        /// Stage the files under this directory (packaging); foliokit.pc
        /// still names the prefix.
        #[arg(long)]
        destdir: Option<PathBuf>,
        /// Install libfoliokit.a as cargo built it (with debug info and
        /// libstd's LLVM bitcode) instead of stripping them.
        #[arg(long)]
        no_strip: bool,
    },
    /// Compare the foliokit crate's public items (rustdoc's list) with the
    /// committed crates/foliokit/public-api.txt; fails on any difference.
    PublicApi {
        /// Rewrite the list to what the code exports now.
        #[arg(long)]
        bless: bool,
    },
    /// Check that the top-level modules of each crate import each other in
    /// no loop (neither a pair nor a longer ring).
    Layers,
    /// Run the workspace's tests as the user nobody (no groups, no
    /// capabilities; needs root to switch): each must pass or skip with its
    /// reason, and the skips are listed.
    TestUnprivileged,
}

/// Runs `c`, failing with its command line when it does not succeed.
pub fn run(c: &mut Command) -> Result<(), Error> {
    let s = c.status().map_err(|e| format!("{c:?}: {e}"))?;
    if s.success() {
        Ok(())
    } else {
        Err(format!("{c:?} failed: {s}").into())
    }
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::VmTest { guest, filter } => guest::vm_test(&workspace(), &guest, filter.as_deref()),
        Cmd::VmSetup { kernel } => guest::vm_setup(&workspace(), &kernel),
        Cmd::InstallCapi {
            prefix,
            libdir,
            destdir,
            no_strip,
        } => {
            let dirs = install::Dirs {
                prefix,
                libdir,
                destdir,
            };
            install::install_capi(&workspace(), &dirs, !no_strip).map(|()| true)
        }
        Cmd::PublicApi { bless } => api::public_api(&workspace(), bless),
        Cmd::Layers => layers::layers(&workspace()),
        Cmd::TestUnprivileged => unprivileged::test_unprivileged(&workspace()),
    };
    match result {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("xtask: error: {e}");
            std::process::exit(2);
        }
    }
}

//! `--kernel`: run a foliokit command inside another kernel.
//!
//! The guest is booted by `foliokit_guest`, the launcher `cargo xtask
//! vm-test` uses too: it shares this machine's filesystem with the guest,
//! so the same foliokit binary runs there unchanged; only the output
//! directory is made writable. This module holds the options and what the
//! guest runs: this command again, without them. The guest reports itself through
//! `FOLIOKIT_GUEST`, which every report then carries, so a result always
//! says which kernel produced it and whether its timings mean anything.

use clap::Args;
use foliokit_guest::{quote, Guest, Session};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub use foliokit_guest::Accel;

use crate::args::show_size;
use crate::CliError;

#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Guest kernel")]
pub struct GuestArgs {
    /// Boot this kernel (a vmlinuz/bzImage, or a kernel build tree) in a
    /// virtme-ng guest and run there instead of here: how to compare a
    /// patched and an unpatched kernel on one machine (then `foliokit
    /// compare` the two output directories). `cargo xtask vm-setup` in a
    /// foliokit checkout fetches Debian's 6.12 and 6.1 kernels and vng.
    #[arg(long, value_name = "VMLINUZ")]
    pub kernel: Option<PathBuf>,
    /// A guest NUMA node, SIZE[,cpus=LIST]; repeat for each node. A node
    /// without cpus is memory-only (a CXL-like tier). Default: a 2G node
    /// per guest CPU, at most two (2G,cpus=0 and 2G,cpus=1 for 2 CPUs).
    #[arg(long, value_name = "SPEC", requires = "kernel")]
    pub numa: Vec<String>,
    /// Guest CPUs.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64), requires = "kernel")]
    pub guest_cpus: u32,
    /// kvm, tcg (software emulation: correctness only), or auto.
    #[arg(long, value_enum, default_value = "auto", requires = "kernel")]
    pub accel: Accel,
    /// virtme-ng's launcher (default: `vng` on PATH, then
    /// target/vm-cache/venv/bin/vng where `cargo xtask vm-setup` puts it).
    #[arg(long, value_name = "PATH", requires = "kernel")]
    pub vng: Option<PathBuf>,
}

/// What a report run in a guest says about it (JSON in `FOLIOKIT_GUEST`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GuestInfo {
    /// The image the host booted.
    pub kernel_image: String,
    pub accel: Accel,
    /// The `--numa` layout the guest was given.
    pub numa: Vec<String>,
}

impl GuestInfo {
    /// Set in a process the host started through [`run`].
    pub fn from_env() -> Option<GuestInfo> {
        serde_json::from_str(&std::env::var("FOLIOKIT_GUEST").ok()?).ok()
    }
}

/// The options that belong to the host's side; the guest gets the rest.
const HOST_ONLY: &[&str] = &["--kernel", "--numa", "--guest-cpus", "--accel", "--vng"];

/// The command line without the guest options.
fn guest_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_value = false;
    let mut rest = false;
    for a in args {
        if rest {
            out.push(a.clone());
            continue;
        }
        if skip_value {
            skip_value = false;
            continue;
        }
        if a == "--" {
            // Everything after `--` is an argument, never an option.
            rest = true;
            out.push(a.clone());
            continue;
        }
        // `--numa 1G` takes the next word; `--numa=1G` does not. A longer
        // option that merely starts with one of these names is not one.
        if HOST_ONLY.contains(&a.as_str()) {
            skip_value = true;
            continue;
        }
        if HOST_ONLY
            .iter()
            .any(|f| a.strip_prefix(f).is_some_and(|r| r.starts_with('=')))
        {
            continue;
        }
        out.push(a.clone());
    }
    out
}

/// Boots `g.kernel` and runs this binary there with the same arguments
/// minus the guest options; `writable` is the one host directory the guest
/// may write (where the command puts its results).
pub fn run(g: &GuestArgs, writable: &Path) -> Result<(), CliError> {
    let kernel = g.kernel.clone().ok_or("no --kernel given")?;
    // Default: one 2G node per guest CPU, up to two nodes (CPUs beyond
    // the second go to the last node).
    let numa: Vec<String> = if g.numa.is_empty() {
        match g.guest_cpus {
            0 | 1 => vec!["2G,cpus=0".into()],
            2 => vec!["2G,cpus=0".into(), "2G,cpus=1".into()],
            n => vec!["2G,cpus=0".into(), format!("2G,cpus=1-{}", n - 1)],
        }
    } else {
        g.numa.clone()
    };
    let guest = Guest {
        vng: foliokit_guest::find_vng(g.vng.as_deref())?,
        kernel,
        numa,
        cpus: g.guest_cpus,
        accel: g.accel,
    };
    let mut this = Rerun {
        exe: std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?,
        cwd: std::env::current_dir().map_err(|e| format!("no current directory: {e}"))?,
        args: guest_args(&std::env::args().skip(1).collect::<Vec<_>>()),
    };
    if guest.run(writable, None, &mut this)?.status.success() {
        Ok(())
    } else {
        Err("the command failed in the guest (its output is above)".into())
    }
}

/// This program, run again in the guest.
struct Rerun {
    exe: PathBuf,
    cwd: PathBuf,
    args: Vec<String>,
}

impl Session for Rerun {
    /// Say where it runs, then run the command where it was given, its
    /// reports told which guest they come from.
    fn script(&mut self, g: &Guest, accel: Accel, rwdir: &Path) -> String {
        let mut s = String::from(
            "echo \"# guest kernel $(uname -r); nodes: $(cat /sys/devices/system/node/online)\"\n",
        );
        s += &format!("cd {} || exit 1\n", quote(&self.cwd.display().to_string()));
        // The calibration profile goes with the results, not into the
        // read-only home directory the guest sees.
        s += &format!(
            "export XDG_CACHE_HOME={}\n",
            quote(&format!("{}/.cache", rwdir.display()))
        );
        let info = GuestInfo {
            kernel_image: g.kernel.display().to_string(),
            accel,
            numa: g.numa.clone(),
        };
        // Serialising three plain fields cannot fail.
        let info = serde_json::to_string(&info).unwrap_or_default();
        s += &format!("export FOLIOKIT_GUEST={}\n", quote(&info));
        let mut cmd = quote(&self.exe.display().to_string());
        for a in &self.args {
            cmd += " ";
            cmd += &quote(a);
        }
        s += &format!("{cmd} 2>&1\n");
        s
    }

    fn booting(&mut self, g: &Guest, accel: Accel) {
        println!(
            "# booting {} in a guest: {} node(s) {}, {} CPUs, {}, {}",
            g.kernel.display(),
            g.numa.len(),
            g.numa.join(" "),
            g.cpus,
            show_size(g.memory().unwrap_or(0)),
            match accel {
                Accel::Kvm => "KVM",
                _ => "QEMU software emulation (timings not meaningful)",
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_guest_gets_every_option_but_the_guest_ones() {
        assert_eq!(
            guest_args(&v("lab --quick --kernel /k --numa 1G,cpus=0 --numa=1G --accel tcg --out d --guest-cpus 2 --vng=/v")),
            v("lab --quick --out d")
        );
        // An option that only starts with a host option's name is kept,
        // and nothing after `--` is taken for an option.
        assert_eq!(
            guest_args(&v("bench migrate --numa-policy x -- --kernel k")),
            v("bench migrate --numa-policy x -- --kernel k")
        );
    }
}

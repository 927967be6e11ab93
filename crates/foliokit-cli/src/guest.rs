//! `--kernel`: run a foliokit command inside another kernel.
//!
//! virtme-ng boots the kernel image with this machine's filesystem as the
//! guest's root, so the same foliokit binary runs there unchanged; only
//! the output directory is made writable. The guest reports itself through
//! `FOLIOKIT_GUEST`, which every report then carries, so a result always
//! says which kernel produced it and whether its timings mean anything.

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::args::{parse_size, show_size};
use crate::CliError;

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// KVM when /dev/kvm can be opened, emulation when a KVM boot fails.
    #[default]
    Auto,
    /// Hardware virtualisation: timings are meaningful (with a VM's noise).
    Kvm,
    /// QEMU's software emulation (TCG): correctness only, timings are not.
    Tcg,
}

#[derive(Debug, Clone, Default, Args)]
pub struct GuestArgs {
    /// Boot this kernel (a vmlinuz/bzImage, or a kernel build tree) in a
    /// virtme-ng guest and run there instead of here: how to compare a
    /// patched and an unpatched kernel on one machine (then `foliokit
    /// compare` the two output directories). `cargo xtask vm-setup` in a
    /// foliokit checkout fetches Debian's 6.12 and 6.1 kernels and vng.
    #[arg(long, value_name = "VMLINUZ", help_heading = "Guest kernel")]
    pub kernel: Option<PathBuf>,
    /// A guest NUMA node, SIZE[,cpus=LIST]; repeat for each node. A node
    /// without cpus is memory-only (a CXL-like tier). Default: a 2G node
    /// per guest CPU, at most two (2G,cpus=0 and 2G,cpus=1 for 2 CPUs).
    #[arg(
        long,
        value_name = "SPEC",
        requires = "kernel",
        help_heading = "Guest kernel"
    )]
    pub numa: Vec<String>,
    /// Guest CPUs.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64), help_heading = "Guest kernel")]
    pub guest_cpus: u32,
    /// kvm, tcg (software emulation: correctness only), or auto.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        help_heading = "Guest kernel"
    )]
    pub accel: Accel,
    /// virtme-ng's launcher (default: `vng` on PATH, then
    /// target/vm-cache/venv/bin/vng where `cargo xtask vm-setup` puts it).
    #[arg(
        long,
        value_name = "PATH",
        requires = "kernel",
        help_heading = "Guest kernel"
    )]
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

/// Bytes of one `--numa` spec ("1536M,cpus=0" -> 1.5 GiB).
fn node_bytes(spec: &str) -> Result<usize, CliError> {
    let size = spec.split(',').next().unwrap_or("");
    parse_size(size).map_err(|e| format!("--numa {spec}: {e}").into())
}

fn find_vng(given: Option<&Path>) -> Result<PathBuf, CliError> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("vng"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let cached = PathBuf::from("target/vm-cache/venv/bin/vng");
    on_path
        .into_iter()
        .chain([cached])
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "virtme-ng (vng) not found: `pip install virtme-ng` and install qemu-system-x86, \
             or run `cargo xtask vm-setup` in a foliokit checkout, or pass --vng PATH"
                .into()
        })
}

fn kvm_usable() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// Boots `g.kernel` and runs this binary there with the same arguments
/// minus the guest options; `writable` is the one host directory the guest
/// may write (where the command puts its results).
pub fn run(g: &GuestArgs, writable: &Path) -> Result<(), CliError> {
    let kernel = g.kernel.as_deref().ok_or("no --kernel given")?;
    if !kernel.exists() {
        return Err(format!("kernel image {} does not exist", kernel.display()).into());
    }
    let vng = find_vng(g.vng.as_deref())?;
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
    let mut memory = 0;
    for n in &numa {
        memory += node_bytes(n)?;
    }
    std::fs::create_dir_all(writable)
        .map_err(|e| format!("cannot create {}: {e}", writable.display()))?;
    let writable = writable
        .canonicalize()
        .map_err(|e| format!("{}: {e}", writable.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let cwd = std::env::current_dir().map_err(|e| format!("no current directory: {e}"))?;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let first = match g.accel {
        Accel::Auto if kvm_usable() => Accel::Kvm,
        Accel::Auto => Accel::Tcg,
        a => a,
    };
    let started = writable.join(".guest-started");
    let mut accel = first;
    loop {
        let _ = std::fs::remove_file(&started);
        let info = GuestInfo {
            kernel_image: kernel.display().to_string(),
            accel,
            numa: numa.clone(),
        };
        let script = script(&exe, &cwd, &guest_args(&argv), &info, &started)?;
        let script_path = writable.join(".guest-run.sh");
        std::fs::write(&script_path, script)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&script_path, std::fs::Permissions::from_mode(0o755))
            })
            .map_err(|e| format!("{}: {e}", script_path.display()))?;
        println!(
            "# booting {} in a guest: {} node(s) {}, {} CPUs, {}, {}",
            kernel.display(),
            numa.len(),
            numa.join(" "),
            g.guest_cpus,
            show_size(memory),
            match accel {
                Accel::Kvm => "KVM",
                _ => "QEMU software emulation (timings not meaningful)",
            }
        );
        let status = boot(
            &vng,
            kernel,
            &numa,
            memory,
            g.guest_cpus,
            accel,
            &writable,
            &script_path,
        )?;
        let ran = started.exists();
        let _ = std::fs::remove_file(&started);
        let _ = std::fs::remove_file(&script_path);
        if ran {
            return if status {
                Ok(())
            } else {
                Err("the command failed in the guest (its output is above)".into())
            };
        }
        if accel == Accel::Kvm && g.accel != Accel::Kvm {
            println!("# the KVM boot did not reach the command; booting again under emulation");
            accel = Accel::Tcg;
            continue;
        }
        return Err("the guest did not reach the command (vng's output is above); a kernel needs 9p and virtio built in, or its modules under /lib/modules/<version>".into());
    }
}

/// The guest's script: mark the start, say where it runs, run the command.
fn script(
    exe: &Path,
    cwd: &Path,
    args: &[String],
    info: &GuestInfo,
    started: &Path,
) -> Result<String, CliError> {
    let q = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let info = serde_json::to_string(info).map_err(|e| e.to_string())?;
    let mut s = String::from("#!/bin/sh\n");
    // Without the mark the host would boot again; a guest that cannot
    // write it must not run the command either.
    s += &format!("touch {} || exit 97\n", q(&started.display().to_string()));
    s += "echo \"# guest kernel $(uname -r); nodes: $(cat /sys/devices/system/node/online)\"\n";
    s += &format!("cd {} || exit 1\n", q(&cwd.display().to_string()));
    // The calibration profile goes with the results, not into the
    // read-only home directory the guest sees.
    s += &format!(
        "export XDG_CACHE_HOME={}\n",
        q(&format!(
            "{}/.cache",
            started.parent().unwrap_or(cwd).display()
        ))
    );
    s += &format!("export FOLIOKIT_GUEST={}\n", q(&info));
    let mut cmd = q(&exe.display().to_string());
    for a in args {
        cmd += " ";
        cmd += &q(a);
    }
    s += &format!("{cmd} 2>&1\n");
    Ok(s)
}

#[allow(clippy::too_many_arguments)]
fn boot(
    vng: &Path,
    kernel: &Path,
    numa: &[String],
    memory: usize,
    cpus: u32,
    accel: Accel,
    writable: &Path,
    script: &Path,
) -> Result<bool, CliError> {
    let mut cmd = Command::new(vng);
    cmd.arg("--run").arg(kernel);
    if accel != Accel::Kvm {
        cmd.arg("--disable-kvm");
    }
    cmd.args(["--force-9p", "-m"])
        .arg(format!("{}M", memory.div_ceil(1 << 20)))
        .arg("--cpus")
        .arg(cpus.to_string())
        .arg("--rwdir")
        .arg(writable);
    for n in numa {
        cmd.args(["--numa", n]);
    }
    // vng finds qemu and busybox on PATH; its own directory first.
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(dir) = vng.parent() {
        let mut p = dir.as_os_str().to_owned();
        p.push(":");
        p.push(&path);
        path = p;
    }
    cmd.arg("--exec")
        .arg(script)
        .env("PATH", path)
        .stdout(Stdio::piped())
        // Piped: vng reopens /dev/stderr, which truncates a log file.
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", vng.display()))?;
    let errors = child.stderr.take().map(|err| {
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if !l.trim().is_empty() {
                    eprintln!("vng: {}", l.trim_end());
                }
            }
        })
    });
    if let Some(out) = child.stdout.take() {
        let mut stdout = std::io::stdout().lock();
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            // The console pads lines and ends them with carriage returns.
            let _ = writeln!(stdout, "{}", l.trim_start_matches('\r').trim_end());
        }
    }
    let status = child.wait().map_err(|e| format!("vng: {e}"))?;
    // vng's last words (why a boot failed) come after its exit.
    if let Some(t) = errors {
        let _ = t.join();
    }
    Ok(status.success())
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

    #[test]
    fn node_sizes_add_up_and_bad_ones_are_errors() {
        assert_eq!(node_bytes("1536M,cpus=0").unwrap(), 1536 << 20);
        assert_eq!(node_bytes("1G").unwrap(), 1 << 30);
        assert!(node_bytes("lots,cpus=0").is_err());
    }
}

//! What the guests need, installed when missing and cached between runs:
//! QEMU (without recommends), busybox and kmod from Debian; virtme-ng in a
//! venv under the cache; the guest kernels fetched with `apt-get download`
//! through a private apt configuration (the system's sources, lists and
//! cache are left alone) and unpacked with `dpkg-deb -x` (no postinst,
//! /boot untouched).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{run, Error};

/// virtme-ng release the rig was built and tested with.
const VIRTME_NG: &str = "virtme-ng==1.42";

/// Debian packages the host needs, and a command each provides.
const HOST_PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "qemu-system-x86_64"),
    ("kmod", "depmod"),
    ("busybox-static", "busybox"),
    // virtme-ng-init finds the script's I/O ports (/dev/virtio-ports/*)
    // through udev links; without systemd-udevd on the host (whose root
    // the guest shares) the script's output never reaches vm-test.
    ("udev", "/lib/systemd/systemd-udevd"),
];

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Installs the Debian packages that are missing.
pub fn host_packages() -> Result<(), Error> {
    let missing: Vec<&str> = HOST_PACKAGES
        .iter()
        .filter(|(_, cmd)| !have(cmd))
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        return Err(format!(
            "missing {} and not root: install them (apt-get install --no-install-recommends {})",
            missing.join(", "),
            missing.join(" ")
        )
        .into());
    }
    println!("# installing {} (no recommends)", missing.join(", "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// virtme-ng in a venv under `cache`, where `foliokit --kernel` looks for
/// it too; returns its `vng`.
pub fn virtme_ng(cache: &Path) -> Result<PathBuf, Error> {
    let vng = foliokit_guest::cached_vng(cache);
    if vng.is_file() {
        return Ok(vng);
    }
    let venv = vng
        .parent()
        .and_then(Path::parent)
        .ok_or("the venv's place has no parent")?;
    println!("# installing {VIRTME_NG} into {}", venv.display());
    run(Command::new("python3").arg("-m").arg("venv").arg(venv))?;
    run(Command::new(vng.with_file_name("pip")).args(["install", "-q", VIRTME_NG]))?;
    Ok(vng)
}

/// A guest kernel: which Debian package family, and where it was unpacked.
pub struct Kernel {
    /// The unpacked package's root.
    pub root: PathBuf,
    /// `uname -r` of the kernel.
    pub version: String,
}

impl Kernel {
    pub fn image(&self) -> PathBuf {
        self.root
            .join("boot")
            .join(format!("vmlinuz-{}", self.version))
    }
}

fn apt_options(cache: &Path) -> Result<Vec<String>, Error> {
    let apt = cache.join("apt");
    for d in ["lists/partial", "archives/partial", "sources"] {
        std::fs::create_dir_all(apt.join(d))?;
    }
    // Bookworm with backports (Linux 6.12) and its own 6.1.
    std::fs::write(
        apt.join("sources/guest-kernels.sources"),
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-backports bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
    )?;
    let d = |k: &str, p: PathBuf| format!("-o{k}={}", p.display());
    Ok(vec![
        "-oDir::Etc::SourceList=/dev/null".into(),
        d("Dir::Etc::SourceParts", apt.join("sources")),
        d("Dir::State::Lists", apt.join("lists")),
        d("Dir::Cache::Archives", apt.join("archives")),
    ])
}

/// The entries of `dir` whose names start with `prefix`.
fn named(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, Error> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect())
}

/// The newest `linux-image-<series>…-amd64` (not -cloud, -rt or debug:
/// those lack MEMORY_FAILURE or 9p), fetched and unpacked under `cache`
/// once; its modules linked under /lib/modules where virtme-ng looks.
pub fn kernel(cache: &Path, series: &str) -> Result<Kernel, Error> {
    let unpacked = cache.join("kernels");
    std::fs::create_dir_all(&unpacked)?;
    let found = named(&unpacked, &format!("linux-image-{series}"))?
        .into_iter()
        .max();
    let root = match found {
        Some(r) => r,
        None => fetch(cache, &unpacked, series)?,
    };
    let modules = root.join("lib/modules");
    let version = std::fs::read_dir(&modules)?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .next()
        .ok_or_else(|| format!("{} holds no modules", modules.display()))?;
    let link = PathBuf::from("/lib/modules").join(&version);
    let ours = modules.join(&version);
    // A real directory there is an installed kernel of that version: use
    // it. A link is ours if it points at this checkout's cache; one left
    // by another checkout (perhaps deleted since: dangling) is replaced.
    let current = std::fs::symlink_metadata(&link).ok();
    let is_ours = match &current {
        Some(m) if m.file_type().is_symlink() => {
            std::fs::read_link(&link).ok() == Some(ours.clone())
        }
        Some(_) => true,
        None => false,
    };
    if !is_ours {
        if !is_root() {
            return Err(format!(
                "virtme-ng reads the guest's modules from {}: link {} there (needs root)",
                link.display(),
                ours.display()
            )
            .into());
        }
        std::fs::create_dir_all("/lib/modules")?;
        if current.is_some() {
            std::fs::remove_file(&link)?;
        }
        std::os::unix::fs::symlink(&ours, &link)?;
        run(Command::new("depmod").arg(&version))?;
    }
    Ok(Kernel { root, version })
}

fn fetch(cache: &Path, unpacked: &Path, series: &str) -> Result<PathBuf, Error> {
    let opts = apt_options(cache)?;
    println!("# fetching the newest Debian linux-image-{series} (private apt configuration)");
    run(Command::new("apt-get").args(&opts).args(["update", "-qq"]))?;
    let list = Command::new("apt-cache")
        .args(&opts)
        .args(["search", "--names-only", &format!("^linux-image-{series}")])
        .output()?;
    let pattern = |name: &str| {
        name.ends_with("-amd64")
            && !name.contains("cloud")
            && !name.contains("-rt-")
            && !name.contains("dbg")
            && !name.contains("unsigned")
            && name[format!("linux-image-{series}").len()..].starts_with(['.', '-'])
    };
    let mut names: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| pattern(n))
        .map(str::to_string)
        .collect();
    // Newest by version order of the name's numbers.
    names.sort_by_key(|n| {
        n.split(|c: char| !c.is_ascii_digit())
            .filter_map(|x| x.parse::<u64>().ok())
            .collect::<Vec<_>>()
    });
    let name = names
        .pop()
        .ok_or_else(|| format!("no linux-image-{series}*-amd64 in Debian bookworm(-backports)"))?;
    let debs = cache.join("apt/debs");
    std::fs::create_dir_all(&debs)?;
    run(Command::new("apt-get")
        .args(&opts)
        .args(["download", "-qq", &name])
        .current_dir(&debs))?;
    let deb = named(&debs, &format!("{name}_"))?
        .into_iter()
        .next()
        .ok_or_else(|| format!("apt-get download left no {name} package"))?;
    let root = unpacked.join(&name);
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    Ok(root)
}

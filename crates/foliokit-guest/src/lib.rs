//! The one guest-kernel launcher, shared by `foliokit lab --kernel` (and
//! `bench migrate --kernel`) and `cargo xtask vm-test`.
//!
//! virtme-ng boots a kernel image with this machine's filesystem as the
//! guest's root, read-only over 9p, so programs built here run there
//! unchanged. The caller writes the shell commands the guest runs; the
//! launcher puts them behind a start mark in the one host directory the
//! guest may write, boots, hands back the console line by line, and knows
//! whether the commands were reached: that is how a KVM boot that never
//! gets there is told from a command that failed, and retried under
//! emulation when the caller left the choice of accelerator to it.
//!
//! Nothing here knows foliokit: the crate sits beneath the CLI and xtask so
//! that xtask boots guests without building the library.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where `cargo xtask vm-setup` keeps what guests need (virtme-ng's venv,
/// the kernels, apt's state), relative to a foliokit checkout.
pub const CACHE: &str = "target/vm-cache";

/// virtme-ng's launcher as `cargo xtask vm-setup` installs it in `cache`.
pub fn cached_vng(cache: &Path) -> PathBuf {
    cache.join("venv").join("bin").join("vng")
}

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum Accel {
    /// KVM when /dev/kvm can be opened, emulation when a KVM boot fails.
    #[default]
    Auto,
    /// Hardware virtualisation: timings are meaningful (with a VM's noise).
    Kvm,
    /// QEMU's software emulation (TCG): correctness only, timings are not.
    Tcg,
}

impl Accel {
    /// What `Auto` means on this machine: KVM when /dev/kvm opens for
    /// reading and writing (what QEMU needs), emulation otherwise.
    pub fn resolve(self) -> Accel {
        let kvm = || {
            let mut rw = std::fs::OpenOptions::new();
            rw.read(true).write(true).open("/dev/kvm").is_ok()
        };
        match self {
            Accel::Auto if kvm() => Accel::Kvm,
            Accel::Auto => Accel::Tcg,
            a => a,
        }
    }
}

/// `s` quoted for the guest's shell.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// virtme-ng's launcher: `given`, else `vng` on PATH, else the one
/// `cargo xtask vm-setup` installs under [`CACHE`] (relative to the current
/// directory, which is a foliokit checkout when that is where it was run).
pub fn find_vng(given: Option<&Path>) -> io::Result<PathBuf> {
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
    on_path
        .into_iter()
        .chain([cached_vng(Path::new(CACHE))])
        .find(|p| p.is_file())
        .ok_or_else(|| {
            io::Error::other(
                "virtme-ng (vng) not found: `pip install virtme-ng` and install qemu-system-x86, \
                 or run `cargo xtask vm-setup` in a foliokit checkout, or pass --vng PATH",
            )
        })
}

/// Bytes of one `--numa` node, SIZE[,cpus=LIST] ("1536M,cpus=0" is
/// 1.5 GiB), with the suffixes QEMU's sizes take: B, K, M, G, T (powers
/// of 1024).
pub fn node_bytes(spec: &str) -> io::Result<usize> {
    let size = spec.split(',').next().unwrap_or("");
    let (n, unit) = size.split_at(
        size.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(size.len()),
    );
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => Some(0),
        "K" => Some(10),
        "M" => Some(20),
        "G" => Some(30),
        "T" => Some(40),
        _ => None,
    };
    shift
        .zip(n.parse::<usize>().ok())
        .and_then(|(shift, n)| n.checked_mul(1 << shift))
        .filter(|&b| b > 0)
        .ok_or_else(|| {
            io::Error::other(format!(
                "--numa {spec}: '{size}' is not a size (examples: 512M, 2G)"
            ))
        })
}

/// The machine to boot. Where it may write and how long it may take
/// belong to each [`Guest::run`].
#[derive(Debug, Clone)]
pub struct Guest {
    /// virtme-ng's launcher. Its directory goes first on PATH, because vng
    /// finds QEMU and busybox there and a venv keeps its helpers beside it.
    pub vng: PathBuf,
    /// A vmlinuz/bzImage, or a kernel build tree.
    pub kernel: PathBuf,
    /// One QEMU NUMA node each, SIZE[,cpus=LIST]; a node without CPUs is
    /// memory-only. The guest's RAM is their sum, because QEMU refuses
    /// nodes that do not add up to it.
    pub numa: Vec<String>,
    /// Guest CPUs (the nodes' `cpus=` lists name them from 0).
    pub cpus: u32,
    /// `Auto` tries KVM first and falls back to emulation (see [`Guest::run`]).
    pub accel: Accel,
}

/// What the caller does around a boot.
pub trait Session {
    /// The shell commands `guest` runs once it is up, for this
    /// accelerator; `rwdir` is the one the guest may write, absolute.
    fn script(&mut self, guest: &Guest, accel: Accel, rwdir: &Path) -> String;
    /// Called before each boot (a KVM boot that does not reach the script
    /// is followed by an emulated one when the accelerator was `Auto`).
    fn booting(&mut self, _guest: &Guest, _accel: Accel) {}
    /// One line of the guest's console, the script's output among it. The
    /// console pads lines and ends them with carriage returns: both are
    /// gone; blank lines are kept (a table's layout may need them).
    fn line(&mut self, line: &str) {
        // A closed stdout (`| head`) must not stop the guest's run.
        let _ = writeln!(std::io::stdout().lock(), "{line}");
    }
    /// One non-blank line virtme-ng wrote to its stderr (why a boot failed).
    fn vng(&mut self, line: &str) {
        eprintln!("vng: {line}");
    }
}

/// How a boot ended.
#[derive(Debug)]
pub struct Boot {
    /// vng's exit status: the script's, when it was reached.
    pub status: ExitStatus,
    /// Killed after the run's limit.
    pub hung: bool,
    /// The last boot's time from start to exit.
    pub elapsed: Duration,
}

impl Guest {
    /// The guest's RAM: its nodes' sizes added up.
    pub fn memory(&self) -> io::Result<usize> {
        self.numa.iter().map(|n| node_bytes(n)).sum()
    }

    /// Boots the kernel and runs `s`'s script there. `rwdir` is the one
    /// host directory the guest may write (created when missing); the
    /// script and its start mark live there during the run. A guest still
    /// running after `limit` has hung and is killed. `Ok` once the script
    /// was reached (or the guest hung), whatever it returned: the caller
    /// reads [`Boot::status`]. A guest that never reached the script is an
    /// error, after one more boot under emulation when the accelerator was
    /// `Auto` and KVM was tried first.
    pub fn run(
        &self,
        rwdir: &Path,
        limit: Option<Duration>,
        s: &mut impl Session,
    ) -> io::Result<Boot> {
        if !self.kernel.exists() {
            let e = format!("kernel image {} does not exist", self.kernel.display());
            return Err(io::Error::other(e));
        }
        let memory = self.memory()?;
        let rwdir = std::fs::create_dir_all(rwdir)
            .and_then(|()| rwdir.canonicalize())
            .map_err(|e| io::Error::other(format!("{}: {e}", rwdir.display())))?;
        let mark = rwdir.join(".guest-started");
        let script = rwdir.join(".guest-run.sh");
        let mut accel = self.accel.resolve();
        loop {
            let _ = std::fs::remove_file(&mark);
            let mut text = String::from("#!/bin/sh\n");
            // Without the mark the host would boot again; a guest that
            // cannot write it must not run the commands either.
            text += &format!("touch {} || exit 97\n", quote(&mark.display().to_string()));
            if accel == Accel::Tcg {
                // Tests stretch their deadlines (never their figures) when
                // they see this.
                text += "export FOLIOKIT_EMULATED=1\n";
            }
            text += &s.script(self, accel, &rwdir);
            std::fs::write(&script, text)
                .and_then(|()| {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
                })
                .map_err(|e| io::Error::other(format!("{}: {e}", script.display())))?;
            s.booting(self, accel);
            let booted = self.boot(accel, memory, &rwdir, &script, limit, s);
            let reached = mark.exists();
            let _ = std::fs::remove_file(&mark);
            let _ = std::fs::remove_file(&script);
            let booted = booted?;
            if reached || booted.hung {
                return Ok(booted);
            }
            if accel == Accel::Kvm && self.accel != Accel::Kvm {
                println!("# the KVM boot did not reach the command; booting again under emulation");
                accel = Accel::Tcg;
                continue;
            }
            return Err(io::Error::other("the guest did not reach the command (vng's output is above); a kernel needs 9p and virtio built in, or its modules under /lib/modules/<version>"));
        }
    }

    /// One boot.
    fn boot(
        &self,
        accel: Accel,
        memory: usize,
        rwdir: &Path,
        script: &Path,
        limit: Option<Duration>,
        s: &mut impl Session,
    ) -> io::Result<Boot> {
        let mut cmd = Command::new(&self.vng);
        cmd.arg("--run").arg(&self.kernel);
        if accel != Accel::Kvm {
            cmd.arg("--disable-kvm");
        }
        cmd.args(["--force-9p", "-m"])
            .arg(format!("{}M", memory.div_ceil(1 << 20)))
            .arg("--cpus")
            .arg(self.cpus.to_string())
            .arg("--rwdir")
            .arg(rwdir);
        for n in &self.numa {
            cmd.args(["--numa", n]);
        }
        let mut path = std::env::var_os("PATH").unwrap_or_default();
        if let Some(dir) = self.vng.parent() {
            let mut p = dir.as_os_str().to_owned();
            p.push(":");
            p.push(&path);
            path = p;
        }
        cmd.arg("--exec")
            .arg(script)
            .env("PATH", path)
            .stdout(Stdio::piped())
            // Piped, not inherited: virtme-ng reopens /dev/stderr for
            // writing, which truncates a log file that our stderr may be.
            .stderr(Stdio::piped());
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| io::Error::other(format!("cannot run {}: {e}", self.vng.display())))?;
        // Both streams come to this thread through one channel, so the
        // session needs no locking and a silent hang is noticed by the
        // wait for the next line running out.
        let (tx, rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            forward(out, false, tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            forward(err, true, tx);
        }
        let deadline = limit.map(|l| start + l);
        let mut hung = false;
        loop {
            let next = match deadline {
                Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
                None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            };
            match next {
                Ok((from_vng, raw)) => {
                    let text = String::from_utf8_lossy(&raw);
                    if from_vng {
                        let l = text.trim();
                        if !l.is_empty() {
                            s.vng(l);
                        }
                    } else {
                        s.line(text.trim_start_matches('\r').trim_end());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    // What the hung guest still holds open is not waited
                    // for: the readers end with the pipes.
                    hung = true;
                    let _ = child.kill();
                    break;
                }
                // Both pipes closed: vng's last words (why a boot failed)
                // are in, and it has exited or is about to.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child
            .wait()
            .map_err(|e| io::Error::other(format!("vng: {e}")))?;
        Ok(Boot {
            status,
            hung,
            elapsed: start.elapsed(),
        })
    }
}

/// Sends each line of `r` down `tx`, tagged with where it came from. By
/// bytes, not `lines()`: one byte of console noise that is not UTF-8 must
/// not end the run's output.
fn forward(r: impl Read + Send + 'static, from_vng: bool, tx: mpsc::Sender<(bool, Vec<u8>)>) {
    std::thread::spawn(move || {
        for l in BufReader::new(r).split(b'\n').map_while(Result::ok) {
            if tx.send((from_vng, l)).is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_sizes_add_up_and_bad_ones_are_errors() {
        assert_eq!(node_bytes("1536M,cpus=0").unwrap(), 1536 << 20);
        assert_eq!(node_bytes("1G").unwrap(), 1 << 30);
        assert!(node_bytes("lots,cpus=0").is_err());
        assert!(node_bytes("0M").is_err());
        assert!(node_bytes("1Q").is_err());
        let g = Guest {
            vng: "vng".into(),
            kernel: "k".into(),
            numa: vec!["2G,cpus=0".into(), "1536M,cpus=1".into(), "2G".into()],
            cpus: 2,
            accel: Accel::Tcg,
        };
        assert_eq!(g.memory().unwrap(), 5632 << 20);
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    /// A directory of its own for each test (the "kernel", which only has
    /// to exist), with a stand-in for vng:
    /// `body` runs with the arguments vng got in `$args` and the script in
    /// `$script`, the way the guest would run it (on this host, so the
    /// launcher's side is tested without QEMU).
    fn fake(name: &str, body: &str) -> Guest {
        let dir =
            std::env::temp_dir().join(format!("foliokit-guest-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let vng = dir.join("vng");
        let text = format!(
            "#!/bin/sh\nargs=\"$*\"\nwhile [ $# -gt 0 ]; do [ \"$1\" = --exec ] && script=$2; shift; done\n{body}\n"
        );
        std::fs::write(&vng, text).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&vng, std::fs::Permissions::from_mode(0o755)).unwrap();
        Guest {
            vng,
            kernel: dir.clone(),
            numa: vec!["1G,cpus=0".into(), "512M".into()],
            cpus: 1,
            accel: Accel::Tcg,
        }
    }

    /// One fake guest at a time: a stand-in written while another test
    /// forks could be inherited open for writing by the child, and
    /// executing it would then fail (ETXTBSY).
    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        LOCK.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps what the launcher hands over.
    #[derive(Default)]
    struct Seen {
        lines: Vec<String>,
        boots: Vec<Accel>,
    }

    impl Session for Seen {
        fn script(&mut self, _: &Guest, accel: Accel, rwdir: &Path) -> String {
            format!(
                "echo \"{accel:?} $FOLIOKIT_EMULATED {}\"\n",
                rwdir.display()
            )
        }
        fn booting(&mut self, _: &Guest, accel: Accel) {
            self.boots.push(accel);
        }
        fn line(&mut self, line: &str) {
            self.lines.push(line.into());
        }
    }

    #[test]
    fn the_script_runs_behind_its_mark_and_its_console_comes_back_clean() {
        let _one = one_at_a_time();
        let g = fake(
            "runs",
            "printf '\\r  padded  \\r\\n\\n'; echo \"$args\"; \"$script\"",
        );
        let mut seen = Seen::default();
        let out = g.kernel.join("out");
        let boot = g.run(&out, None, &mut seen).unwrap();
        assert!(boot.status.success() && !boot.hung);
        assert_eq!(seen.boots, [Accel::Tcg]);
        let rw = out.canonicalize().unwrap();
        let vng_args = format!(
            "--run {} --disable-kvm --force-9p -m 1536M --cpus 1 --rwdir {} --numa 1G,cpus=0 --numa 512M --exec {}",
            g.kernel.display(),
            rw.display(),
            rw.join(".guest-run.sh").display()
        );
        // Padding before a line is the caller's business (tables keep
        // theirs); carriage returns and what trails are not.
        assert_eq!(
            seen.lines,
            [
                "  padded",
                "",
                &vng_args,
                &format!("Tcg 1 {}", rw.display())
            ]
        );
        // Nothing of the launcher's is left in the caller's directory.
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&g.kernel);
    }

    #[test]
    fn a_guest_that_never_reaches_the_script_is_an_error() {
        let _one = one_at_a_time();
        let mut g = fake("unreached", "echo 'no 9p' >&2; exit 1");
        g.accel = Accel::Kvm;
        let e = g
            .run(&g.kernel.join("out"), None, &mut Seen::default())
            .unwrap_err();
        assert!(e.to_string().contains("did not reach the command"), "{e}");
        let _ = std::fs::remove_dir_all(&g.kernel);
    }

    #[test]
    fn a_guest_past_its_limit_is_killed() {
        let _one = one_at_a_time();
        let g = fake("hangs", "\"$script\"; exec sleep 60");
        let limit = Some(Duration::from_millis(500));
        let boot = g
            .run(&g.kernel.join("out"), limit, &mut Seen::default())
            .unwrap();
        assert!(boot.hung && !boot.status.success());
        assert!(boot.elapsed < Duration::from_secs(30), "{:?}", boot.elapsed);
        let _ = std::fs::remove_dir_all(&g.kernel);
    }
}

//! `foliokit move` from the shell, against a separate target process
//! (`foliokit __target`): one-line errors, the counts on one node, and
//! `--cold`, which must leave the system's DAMON exactly as it found it,
//! also when interrupted. Run on the host and, through `cargo xtask
//! vm-test`, in the guests (the 6.12 guest has DAMON sysfs and no kdamond
//! of its own, so `--cold` really runs there).

mod common;

use common::{foliokit, missing, refused, say, Need};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const NR: &str = "/sys/kernel/mm/damon/admin/kdamonds/nr_kdamonds";

/// The part of the target's 64 MiB its loop keeps writing; the rest is
/// written once and then idle.
const HOT: usize = 32 << 20;

/// A target of 64 MiB of 4K pages whose first `hot` bytes its loop keeps
/// writing; killed and reaped on drop.
struct Target {
    child: Child,
    start: usize,
    len: usize,
}

impl Target {
    #[allow(clippy::zombie_processes)] // reaped by Drop
    fn start(hot: usize) -> Target {
        let mut child = foliokit()
            .args([
                "__target",
                "--size",
                &(64usize << 20).to_string(),
                "--folio",
                "4096",
            ])
            .args(["--hot", &hot.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: Vec<usize> = line
            .trim()
            .strip_prefix("ADDR ")
            .unwrap_or_else(|| panic!("target said {line}"))
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        Target {
            child,
            start: v[0],
            len: v[1],
        }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// `foliokit move` of this target's memory to `node`; what to move
    /// and how is the caller's.
    fn move_to(&self, node: &str) -> Command {
        let mut c = foliokit();
        c.args(["move", "--pid", &self.pid(), "--to", node]);
        c
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many bytes of the reported `ranges` lie inside `[lo, hi)`.
fn bytes_within(ranges: &[Value], lo: usize, hi: usize) -> u64 {
    ranges
        .iter()
        .map(|r| {
            let (s, e) = (
                r["start"].as_u64().unwrap() as usize,
                r["end"].as_u64().unwrap() as usize,
            );
            e.min(hi).saturating_sub(s.max(lo)) as u64
        })
        .sum()
}

fn damon_state() -> Option<String> {
    std::fs::read_to_string(NR).ok()
}

/// What this machine's DAMON offers `--cold`, found by the test itself
/// (foliokit's own check is what is under test).
#[derive(Debug)]
#[allow(dead_code)] // the fields are read through Debug, in the skip line
enum Damon {
    NoSysfs,
    NotRoot,
    InUse(String),
    /// DAMON without virtual-address operations: what it offers instead.
    NoVaddr(String),
    Ready,
}

/// Probes DAMON the authoritative way: a context lists the operations
/// this kernel has in `avail_operations`. The kdamond made to read it is
/// removed again at once.
fn probe_damon() -> Damon {
    let kd = std::path::Path::new(NR).parent().unwrap();
    if !kd.exists() {
        return Damon::NoSysfs;
    }
    // Its files are root's alone (mode 0600): not even readable otherwise.
    if !foliokit::mem::system::is_root() {
        return Damon::NotRoot;
    }
    let nr = damon_state().expect("nr_kdamonds readable as root");
    if nr.trim() != "0" {
        return Damon::InUse(nr.trim().to_string());
    }
    std::fs::write(NR, "1").expect("make a kdamond to read avail_operations");
    let avail = std::fs::write(kd.join("0/contexts/nr_contexts"), "1")
        .and_then(|_| std::fs::read_to_string(kd.join("0/contexts/0/avail_operations")));
    std::fs::write(NR, "0").expect("remove the probe's kdamond");
    let avail = avail.expect("avail_operations");
    if avail.split_whitespace().any(|o| o == "vaddr") {
        Damon::Ready
    } else {
        Damon::NoVaddr(avail.split_whitespace().collect::<Vec<_>>().join(" "))
    }
}

#[test]
fn move_counts_what_it_finds_and_refuses_bad_input_in_one_line() {
    let t = Target::start(1 << 20);
    let node = foliokit::mem::system::numa_nodes()[0].to_string();
    let range = format!("{:x}-{:x}", t.start, t.start + t.len);
    // Exit 3 (some pages stayed elsewhere) is an outcome too: the target
    // keeps writing half of its pages, and a page written while the
    // kernel migrates it can fail the move (seen in the TCG guests). The
    // counts must add up either way.
    let out = t
        .move_to(&node)
        .args(["--range", &range])
        .args(["--format", "json"])
        .output()
        .unwrap();
    let code = out.status.code();
    assert!(
        matches!(code, Some(0 | 3)),
        "move failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    if code == Some(3) {
        say(&format!(
            "NOTE: some pages stayed elsewhere: {}",
            v["ranges"][0]["failed"]
        ));
    }
    let r = &v["ranges"][0];
    let total = r["moved"].as_u64().unwrap()
        + r["already"].as_u64().unwrap()
        + r["not_present"].as_u64().unwrap()
        + r["failed"]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_u64().unwrap())
            .sum::<u64>();
    assert_eq!(total as usize, t.len / 4096, "every page counted: {r}");
    // Bad input: one line each, exit 1 (2 for usage), nothing moved.
    for (args, want) in [
        (vec!["--to", "4096", "--all-anon"], "does not exist"),
        (vec!["--to", &node], "say what to move"),
    ] {
        let code = refused(
            foliokit().args(["move", "--pid", &t.pid()]).args(&args),
            want,
        );
        assert_eq!(code, Some(1), "{args:?}");
    }
    refused(
        foliokit().args(["move", "--pid", "2147483647", "--to", &node, "--all-anon"]),
        "no process",
    );
    let out = t
        .move_to(&node)
        .args(["--range", "zz-10"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "usage error");
}

#[test]
fn cold_leaves_damon_as_it_found_it() {
    let before = damon_state();
    let damon = probe_damon();
    if !matches!(damon, Damon::Ready) {
        // Refused before anything is written, in one line naming what is
        // missing, with the exit status scripts read; DAMON as it was.
        let t = Target::start(1 << 20);
        let want = match &damon {
            Damon::NoSysfs => "CONFIG_DAMON_SYSFS",
            Damon::NotRoot => "run as root",
            Damon::InUse(_) => "leaves it alone",
            Damon::NoVaddr(_) => "CONFIG_DAMON_VADDR",
            Damon::Ready => unreachable!(),
        };
        let code = refused(t.move_to("0").args(["--all-anon", "--cold", "1"]), want);
        assert_eq!(code, Some(5), "--cold unavailable: exit 5");
        assert_eq!(damon_state(), before, "DAMON left as found");
        let need = if matches!(damon, Damon::NotRoot) {
            Need::Root
        } else {
            Need::DamonVaddr
        };
        missing(
            need,
            &format!(
                "--cold refused as it should ({damon:?}); the real run needs DAMON with vaddr"
            ),
        );
        return;
    }
    let before = before.expect("DAMON sysfs");
    let node = foliokit::mem::system::numa_nodes()[0].to_string();
    // Under emulation DAMON samples far less often than the clock says.
    let window = if std::env::var_os("FOLIOKIT_EMULATED").is_some() {
        12
    } else {
        3
    };
    let t = Target::start(HOT);
    let out = t
        .move_to(&node)
        .args(["--all-anon", "--cold", &window.to_string()])
        .args(["--format", "json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        damon_state(),
        Some(before.clone()),
        "DAMON put back as found"
    );
    assert!(out.status.success(), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ranges = v["ranges"].as_array().unwrap();
    // What DAMON saw idle lies in the target's cold part or elsewhere in
    // its anonymous memory; the loop's half stays out of it mostly (DAMON
    // samples; regions are approximate).
    let hot_bytes = bytes_within(ranges, t.start, t.start + HOT);
    let cold_bytes = bytes_within(ranges, t.start + HOT, t.start + t.len);
    say(&format!(
        "NOTE: --cold {window} found {} regions: {} MiB of the 32 MiB cold part, {} KiB of the 32 MiB hot part",
        ranges.len(),
        cold_bytes >> 20,
        hot_bytes >> 10
    ));
    // How much of the written half DAMON also called idle depends on how
    // often the target's writer ran between DAMON's samples, which under
    // emulation on a loaded host is anything (1.4 MiB in one run, all 32
    // MiB in another): reported above, not asserted. The idle half is
    // never touched, so finding it is.
    assert!(
        cold_bytes >= 16 << 20,
        "DAMON saw at least half of the 32 MiB cold part idle for the window: {cold_bytes} bytes"
    );
    // Interrupted mid-window: DAMON is put back all the same.
    let mut c = t
        .move_to(&node)
        .args(["--all-anon", "--cold", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-window: once its kdamond exists (the checks before it read the
    // kernel's symbol list, which takes seconds under emulation).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while damon_state().is_some_and(|n| n.trim() == "0") {
        assert!(
            std::time::Instant::now() < deadline,
            "--cold never set up its kdamond"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    Command::new("kill")
        .args(["-INT", &c.id().to_string()])
        .status()
        .unwrap();
    let status = c.wait().unwrap();
    assert_eq!(status.code(), Some(130), "interrupted");
    assert_eq!(damon_state(), Some(before), "DAMON put back after Ctrl-C");
}

//! The guests, the test binaries they run, and the tally.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use foliokit_guest::{self as vm, quote, Accel, Session};

use crate::setup;
use crate::testbins::{self, result_line};
use crate::Error;

struct Guest {
    name: &'static str,
    /// Debian package series (`linux-image-<series>…`).
    series: &'static str,
    /// virtme-ng `--numa` arguments: size and CPUs per node; a node
    /// without CPUs is a memory-only tier. The guest's RAM is their sum.
    numa: &'static [&'static str],
    what: &'static str,
    /// What the guest provides, as `FOLIOKIT_REQUIRE` names it: a test
    /// that skips for one of these fails there.
    provides: &'static str,
}

const GUESTS: &[Guest] = &[
    Guest {
        name: "6.12",
        series: "6.12",
        // Node 0 and the memory-only node take a 1 GiB process with room
        // to spare: the tiering test moves one there and back.
        numa: &["2G,cpus=0", "1536M,cpus=1", "2G"],
        what:
            "three nodes (two with a CPU each, one memory-only), MEMORY_FAILURE, mTHP, UFFDIO_MOVE",
        provides: "root,relocation,numa,memory-only-node,hwpoison,damon-vaddr,mthp",
    },
    Guest {
        name: "6.1",
        series: "6.1.0",
        numa: &["2G,cpus=0", "2G,cpus=1"],
        what: "two nodes; no mTHP, no UFFDIO_MOVE (relocation must refuse), MEMORY_FAILURE",
        provides: "root,numa,hwpoison",
    },
];

/// Test binaries that exercise the kernel: NUMA, userfaultfd, poison, THP
/// (the library's), and mTHP backing of the benches and Firecracker's
/// page-fault handler (the CLI's). The CPU sweeps (strategies, mc's fault
/// injection by truncated files) run on the host only: under emulation
/// they take many minutes and test nothing the guest kernel changes.
const BINARIES: &[&str] = &[
    "guest_mthp",
    "guest_move",
    "guest_numa",
    "guest_poison",
    "migrate",
    "migrate_attributes",
    "migrate_concurrent",
    "migrate_contract",
    "migrate_latency",
    "nt_populate",
    "process",
    "uffd_handler",
];

/// A guest run longer than this has hung.
const GUEST_LIMIT: Duration = Duration::from_secs(30 * 60);

/// Builds the test binaries, returning (name, path) for [`BINARIES`].
fn build(ws: &Path) -> Result<Vec<(String, PathBuf)>, Error> {
    println!("# building the test binaries on the host");
    Ok(
        testbins::build(ws, &["-p", "foliokit", "-p", "foliokit-cli"])?
            .into_iter()
            .filter(|b| b.integration && BINARIES.contains(&b.name.as_str()))
            .map(|b| (b.name, b.exe))
            .collect(),
    )
}

/// The commands the guest runs: its kernel and node layout, then each
/// test binary, one test at a time, with markers the tally reads. (The
/// launcher exports FOLIOKIT_EMULATED=1 under emulation: tests stretch
/// their deadlines, never their figures, when they see it.)
fn script(ws: &Path, bins: &[(String, PathBuf)]) -> String {
    let mut s = String::from("echo \"@@kernel $(uname -r)\"\n");
    s += "for n in /sys/devices/system/node/node[0-9]*; do echo \"@@node $(basename $n): cpus [$(cat $n/cpulist)], $(awk '/MemTotal/ {print $4\" kB\"}' $n/meminfo)\"; done\n";
    s += "echo \"@@thp $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo none); mTHP sizes: $(ls /sys/kernel/mm/transparent_hugepage 2>/dev/null | grep -c hugepages-)\"\n";
    s += &format!("cd {}\n", quote(&ws.display().to_string()));
    for (name, exe) in bins {
        s += &format!(
            "echo \"@@binary {name}\"\n{} --test-threads=1 2>&1\necho \"@@exit $?\"\n",
            quote(&exe.display().to_string())
        );
    }
    s
}

/// The tests' script, and what their output has said so far.
#[derive(Default)]
struct Tally {
    script: String,
    /// The guest running now, what it provides, the binary running in it,
    /// and that binary's last `test result:` line.
    guest: &'static str,
    provides: &'static str,
    binary: String,
    last: Option<(usize, usize)>,
    passed: usize,
    failed: usize,
    failures: Vec<String>,
}

impl Session for Tally {
    fn script(&mut self, _: &vm::Guest, _: Accel, _: &Path) -> String {
        format!(
            "export FOLIOKIT_REQUIRE={}\n{}",
            quote(self.provides),
            self.script
        )
    }

    fn line(&mut self, line: &str) {
        // The markers follow whatever padding the console adds.
        let line = line.trim_start_matches([' ', '\r']);
        if line.is_empty() {
            return;
        }
        if let Some(k) = line.strip_prefix("@@kernel ") {
            println!("  guest kernel {k}");
        } else if let Some(n) = line.strip_prefix("@@node ") {
            println!("  {n}");
        } else if let Some(x) = line.strip_prefix("@@thp ") {
            println!("  THP {x}");
        } else if let Some(b) = line.strip_prefix("@@binary ") {
            self.binary = b.to_string();
            self.last = None;
            println!("  -- {}", self.binary);
        } else if let Some(code) = line.strip_prefix("@@exit ") {
            if let Some((p, f)) = self.last.take() {
                self.passed += p;
                self.failed += f;
                println!("     {}: {p} passed, {f} failed", self.binary);
            } else if code.trim() != "0" {
                self.failed += 1;
                self.failures.push(format!(
                    "{} {}: exited {code} without a result",
                    self.guest, self.binary
                ));
                println!("  !! {} exited {code} without a test result", self.binary);
            }
        } else if let Some(r) = result_line(line) {
            // A failing in_child test quotes its child's result line too:
            // the binary's own summary is the last one before @@exit.
            self.last = Some(r);
        } else if !line.starts_with("running ") {
            // Everything else the tests print: results, skips, notes and a
            // failure's whole story.
            if line.contains("FAILED") && line.starts_with("test ") {
                self.failures
                    .push(format!("{} {}: {line}", self.guest, self.binary));
            }
            println!("     {line}");
        }
    }

    fn vng(&mut self, line: &str) {
        eprintln!("  vng: {line}");
    }
}

/// Runs the tests in each selected guest; `Ok(true)` when all passed.
pub fn vm_test(ws: &Path, only: &[String], filter: Option<&str>) -> Result<bool, Error> {
    let t0 = Instant::now();
    let cache = ws.join(vm::CACHE);
    std::fs::create_dir_all(&cache)?;
    setup::host_packages()?;
    let vng = setup::virtme_ng(&cache)?;
    let bins: Vec<(String, PathBuf)> = build(ws)?
        .into_iter()
        .filter(|(n, _)| filter.is_none_or(|f| n.contains(f)))
        .collect();
    if bins.is_empty() {
        return Err("no test binary matches".into());
    }
    let mut t = Tally {
        script: script(ws, &bins),
        ..Tally::default()
    };
    for g in GUESTS
        .iter()
        .filter(|g| only.is_empty() || only.iter().any(|o| o == g.name))
    {
        let kernel = setup::kernel(&cache, g.series)?;
        println!(
            "# guest {} ({}): {}; QEMU software emulation (TCG): timings here mean nothing; \
             a skip for any of {} fails",
            g.name, kernel.version, g.what, g.provides
        );
        let guest = vm::Guest {
            vng: vng.clone(),
            kernel: kernel.image(),
            numa: g.numa.iter().map(|n| n.to_string()).collect(),
            cpus: 2,
            accel: Accel::Tcg,
        };
        t.guest = g.name;
        t.provides = g.provides;
        // The writable directory only holds the launcher's script and its
        // start mark: the tests write nothing on the host.
        let booted = guest.run(&cache.join("guest"), Some(GUEST_LIMIT), &mut t)?;
        println!(
            "  guest {} finished in {:.0} s ({})",
            g.name,
            booted.elapsed.as_secs_f64(),
            booted.status
        );
        if booted.hung {
            t.failed += 1;
            t.failures
                .push(format!("{}: the guest hung and was killed", g.name));
        }
    }
    for f in &t.failures {
        println!("# failed: {f}");
    }
    println!(
        "# vm-test: {} passed, {} failed ({:.0} s)",
        t.passed,
        t.failed,
        t0.elapsed().as_secs_f64()
    );
    Ok(t.failed == 0 && t.passed > 0)
}

/// Installs the guest tooling and kernels and prints where they are.
pub fn vm_setup(ws: &Path, series: &[String]) -> Result<bool, Error> {
    let cache = ws.join(vm::CACHE);
    std::fs::create_dir_all(&cache)?;
    setup::host_packages()?;
    let vng = setup::virtme_ng(&cache)?;
    println!("vng: {}", vng.display());
    for s in series {
        let series = GUESTS
            .iter()
            .find(|g| g.name == s)
            .map(|g| g.series)
            .ok_or_else(|| format!("unknown kernel series {s} (have 6.12, 6.1)"))?;
        let k = setup::kernel(&cache, series)?;
        println!("kernel {s}: {}", k.image().display());
    }
    println!(
        "e.g.: foliokit lab --kernel <kernel> --vng {} --numa 2G,cpus=0 --numa 2G,cpus=1 --numa 1G",
        vng.display()
    );
    Ok(true)
}

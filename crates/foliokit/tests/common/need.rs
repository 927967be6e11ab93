//! What a test needs from the machine, and what its absence means.
//!
//! A test that cannot run here says why and checks nothing ([`missing`]).
//! On a developer's machine that is a skip. Where CI runs, the machine is
//! known: `.ci/run` (and `cargo xtask vm-test`, per guest) lists what it
//! provides in `FOLIOKIT_REQUIRE`, and a skip for one of those is a
//! failure: a runner that lost `/dev/userfaultfd` must not turn every
//! relocation test green.

use std::fmt;

/// The variable that lists what this machine provides, comma-separated
/// names of [`Need`] (`all` for every one).
pub const REQUIRE_ENV: &str = "FOLIOKIT_REQUIRE";

/// Something of the machine a test needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Running as root (CAP_SYS_ADMIN: sysfs knobs, PFNs, other users).
    Root,
    /// A userfaultfd this process may open (`/dev/userfaultfd` or the
    /// syscall), with the features the lazy fill asks for.
    Uffd,
    /// Relocation: userfaultfd with `UFFDIO_MOVE` (Linux 6.8).
    Relocation,
    /// Transparent huge pages at the PMD size, allowed under `madvise`.
    Thp,
    /// mTHP sizes in sysfs, and the right to enable one.
    Mthp,
    /// A 2 MiB hugetlb pool this test can use or grow.
    Hugetlb,
    /// At least two NUMA nodes.
    Numa,
    /// A NUMA node with memory and no CPU (a slow tier).
    MemoryOnlyNode,
    /// Real poison: `MADV_HWPOISON` (CONFIG_MEMORY_FAILURE, root).
    Hwpoison,
    /// DAMON's sysfs with virtual-address operations (CONFIG_DAMON_VADDR).
    DamonVaddr,
    /// `move_pages(2)` (CONFIG_MIGRATION, NUMA).
    MovePages,
    /// io_uring, to pin a page the way a DMA user does.
    IoUring,
    /// A filesystem under the temporary directory that takes O_DIRECT.
    ODirect,
    /// A CPU instruction or strategy this CPU lacks (never required: CI's
    /// CPU changes from run to run).
    Cpu,
    /// Chromium on PATH, for the lab page's browser test.
    Browser,
}

impl Need {
    /// Every need, for parsing and for the error that lists them.
    pub const ALL: [Need; 15] = [
        Need::Root,
        Need::Uffd,
        Need::Relocation,
        Need::Thp,
        Need::Mthp,
        Need::Hugetlb,
        Need::Numa,
        Need::MemoryOnlyNode,
        Need::Hwpoison,
        Need::DamonVaddr,
        Need::MovePages,
        Need::IoUring,
        Need::ODirect,
        Need::Cpu,
        Need::Browser,
    ];

    /// Its name in `FOLIOKIT_REQUIRE`.
    pub fn name(self) -> &'static str {
        match self {
            Need::Root => "root",
            Need::Uffd => "uffd",
            Need::Relocation => "relocation",
            Need::Thp => "thp",
            Need::Mthp => "mthp",
            Need::Hugetlb => "hugetlb",
            Need::Numa => "numa",
            Need::MemoryOnlyNode => "memory-only-node",
            Need::Hwpoison => "hwpoison",
            Need::DamonVaddr => "damon-vaddr",
            Need::MovePages => "move-pages",
            Need::IoUring => "io-uring",
            Need::ODirect => "o-direct",
            Need::Cpu => "cpu",
            Need::Browser => "browser",
        }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The needs `list` names; an unknown name is an error naming the known
/// ones (a typo in CI's list must not quietly require nothing).
pub fn parse_required(list: &str) -> Result<Vec<Need>, String> {
    let mut out = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        if word == "all" {
            return Ok(Need::ALL.to_vec());
        }
        match Need::ALL.iter().find(|n| n.name() == word) {
            Some(&n) => out.push(n),
            None => {
                let known: Vec<&str> = Need::ALL.iter().map(|n| n.name()).collect();
                return Err(format!(
                    "{REQUIRE_ENV} names '{word}', which is none of: all, {}",
                    known.join(", ")
                ));
            }
        }
    }
    Ok(out)
}

/// Whether this machine is declared to provide `need`.
pub fn required(need: Need) -> bool {
    let list = std::env::var(REQUIRE_ENV).unwrap_or_default();
    parse_required(&list)
        .unwrap_or_else(|e| panic!("{e}"))
        .contains(&need)
}

/// The test checks nothing here because `need` is missing: a skip, said on
/// stderr with the reason, or a failure where the machine is declared to
/// provide it.
pub fn missing(need: Need, why: &str) {
    if required(need) {
        panic!("{need} is missing, and {REQUIRE_ENV} says this machine provides it: {why}");
    }
    let _ = {
        use std::io::Write;
        writeln!(std::io::stderr(), "SKIP ({need}): {why}")
    };
}

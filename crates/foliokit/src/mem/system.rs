//! The system's huge-page and NUMA state, as `info` reports it and as
//! regions consult it before asking for a page size.

use super::sysfs;

/// Where the kernel keeps the THP and mTHP knobs.
pub(crate) const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";
const HUGETLB: &str = "/sys/kernel/mm/hugepages";

/// One multi-size THP (mTHP) size and its sysfs setting.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MthpSize {
    /// Folio size in bytes (e.g. 65536).
    pub size: usize,
    /// Its `enabled` setting: `always`, `madvise`, `inherit` or `never`.
    pub enabled: String,
}

/// Transparent huge page settings, as read from `/sys/kernel/mm/transparent_hugepage`. Every field is
/// `None`/empty when the kernel lacks THP or sysfs is not mounted.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ThpState {
    /// Top-level mode: always, madvise or never (None: no THP support).
    pub enabled: Option<String>,
    /// Fault-time compaction mode (`always`, `defer`, `madvise`, ...).
    pub defrag: Option<String>,
    /// The PMD-mapped THP size in bytes (2 MiB on x86_64).
    pub pmd_size: Option<usize>,
    /// Multi-size THP knobs, smallest first (empty before Linux 6.8).
    pub mthp: Vec<MthpSize>,
}

/// One hugetlb pool's page counts (pages of `size` bytes, not bytes).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HugetlbPool {
    /// Page size in bytes (2 MiB, 1 GiB).
    pub size: usize,
    /// Pages in the pool (`nr_hugepages`).
    pub total: usize,
    /// Pages not yet mapped by anyone (`free_hugepages`).
    pub free: usize,
    /// Of those, pages mappings already made have reserved
    /// (`resv_hugepages`: a private mapping reserves its pages when it is
    /// made and takes them on first touch).
    pub reserved: usize,
}

impl HugetlbPool {
    /// Pages a new mapping can have: free and not reserved.
    pub fn available(&self) -> usize {
        self.free.saturating_sub(self.reserved)
    }
}

/// A snapshot of the system settings that decide what backing memory gets
/// (what `foliokit info` prints).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SystemInfo {
    /// Kernel release (`uname -r`), or `"unknown"`.
    pub kernel: String,
    /// Online NUMA nodes ([`numa_nodes`]).
    pub numa_nodes: Vec<u32>,
    /// THP and mTHP settings.
    pub thp: ThpState,
    /// Every hugetlb pool the kernel offers, smallest page first.
    pub hugetlb: Vec<HugetlbPool>,
    /// Whether the effective user is root (some benches need it to change
    /// settings; the library never does).
    pub root: bool,
}

/// Reads the THP settings now (not cached: an administrator may change
/// them at any time).
pub fn thp_state() -> ThpState {
    let choice = |f: &str| {
        sysfs::read(format!("{THP_DIR}/{f}")).and_then(|t| sysfs::selected(&t).map(str::to_string))
    };
    let mthp = read_mthp(std::path::Path::new(THP_DIR));
    ThpState {
        enabled: choice("enabled"),
        defrag: choice("defrag"),
        pmd_size: sysfs::read_usize(format!("{THP_DIR}/hpage_pmd_size")),
        mthp,
    }
}

impl ThpState {
    /// Whether `madvise(MADV_HUGEPAGE)` can give folios of `size` bytes.
    pub fn madvise_allows(&self, size: usize) -> bool {
        let top = matches!(self.enabled.as_deref(), Some("always" | "madvise"));
        match self.mthp.iter().find(|m| m.size == size) {
            Some(m) => match m.enabled.as_str() {
                "always" | "madvise" => true,
                "inherit" => top,
                _ => false,
            },
            // Kernels before mTHP only know the PMD size.
            None => top && Some(size) == self.pmd_size,
        }
    }
}

/// The `hugepages-<size>kB` directories under `dir`, as (bytes, path),
/// smallest first: the layout both the THP and the hugetlb trees use.
fn size_dirs(dir: &std::path::Path) -> Vec<(usize, std::path::PathBuf)> {
    let mut v: Vec<(usize, std::path::PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kb: usize = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some((kb << 10, e.path()))
        })
        .collect();
    v.sort_by_key(|d| d.0);
    v
}

/// Every mTHP `enabled` knob under `dir` (`/sys/kernel/mm/transparent_hugepage`, or a directory laid
/// out like it), smallest first, with its setting (the bracketed word, or
/// the whole text of a knob that has no brackets, as a fake sysfs in tests
/// holds it). Reads only.
pub fn read_mthp(dir: &std::path::Path) -> Vec<MthpSize> {
    size_dirs(dir)
        .into_iter()
        .filter_map(|(size, path)| {
            let text = sysfs::read(path.join("enabled"))?;
            Some(MthpSize {
                size,
                enabled: sysfs::selected(&text).unwrap_or(text.trim()).to_string(),
            })
        })
        .collect()
}

/// Every hugetlb pool the kernel offers, smallest page size first.
pub fn hugetlb_pools() -> Vec<HugetlbPool> {
    size_dirs(std::path::Path::new(HUGETLB))
        .into_iter()
        .filter_map(|(size, path)| read_pool(size, &path))
        .collect()
}

/// The `size` hugetlb pool's page counts, if this kernel has that pool.
pub fn hugetlb_pool(size: usize) -> Option<HugetlbPool> {
    read_pool(size, std::path::Path::new(&hugetlb_dir(size)))
}

/// The counts in one pool's sysfs directory (no reservations counted
/// where the kernel does not say).
fn read_pool(size: usize, dir: &std::path::Path) -> Option<HugetlbPool> {
    Some(HugetlbPool {
        size,
        total: sysfs::read_usize(dir.join("nr_hugepages"))?,
        free: sysfs::read_usize(dir.join("free_hugepages"))?,
        reserved: sysfs::read_usize(dir.join("resv_hugepages")).unwrap_or(0),
    })
}

/// The sysfs directory of the `size` hugetlb pool (`nr_hugepages`,
/// `free_hugepages`, ...). foliokit only reads it; growing a pool is a
/// system setting left to the administrator (or an explicit guard such as
/// `foliokit_lab::hugetlb::HugetlbGrant`).
pub(crate) fn hugetlb_dir(size: usize) -> String {
    format!("{HUGETLB}/hugepages-{}kB", size >> 10)
}

/// Parses a sysfs CPU/node list such as "0", "0-1,3".
pub(crate) fn parse_list(text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

/// Online NUMA node ids, ascending; `[0]` when sysfs does not say (a
/// kernel without NUMA has one node, 0).
pub fn numa_nodes() -> Vec<u32> {
    sysfs::read("/sys/devices/system/node/online")
        .map(|t| parse_list(&t))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec![0])
}

/// Online nodes that have memory (`has_memory`): a node without any cannot
/// take pages. Every online node when sysfs does not say.
pub fn memory_nodes() -> Vec<u32> {
    sysfs::read("/sys/devices/system/node/has_memory")
        .map(|t| parse_list(&t))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(numa_nodes)
}

/// Online nodes without CPUs: memory-only tiers such as CXL memory
/// expanders (or a NUMA emulation's CPU-less node).
pub fn memory_only_nodes() -> Vec<u32> {
    numa_nodes()
        .into_iter()
        .filter(|n| {
            sysfs::read(format!("/sys/devices/system/node/node{n}/cpulist"))
                .is_some_and(|t| parse_list(&t).is_empty())
        })
        .collect()
}

/// Whether the effective user id is 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Reads everything in [`SystemInfo`] now.
pub fn system() -> SystemInfo {
    SystemInfo {
        kernel: sysfs::read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
        numa_nodes: numa_nodes(),
        thp: thp_state(),
        hugetlb: hugetlb_pools(),
        root: is_root(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists() {
        assert_eq!(parse_list("0\n"), vec![0]);
        assert_eq!(parse_list("0-2,5"), vec![0, 1, 2, 5]);
        assert_eq!(parse_list(""), Vec::<u32>::new());
    }

    #[test]
    fn madvise_rules() {
        let t = ThpState {
            enabled: Some("madvise".into()),
            defrag: None,
            pmd_size: Some(2 << 20),
            mthp: vec![
                MthpSize {
                    size: 64 << 10,
                    enabled: "never".into(),
                },
                MthpSize {
                    size: 16 << 10,
                    enabled: "inherit".into(),
                },
            ],
        };
        assert!(t.madvise_allows(2 << 20));
        assert!(t.madvise_allows(16 << 10));
        assert!(!t.madvise_allows(64 << 10));
        assert!(!t.madvise_allows(1 << 30));
    }
}

//! What the CPU offers, detected once per process.
//!
//! Feature bits come from CPUID (and the OS's XSAVE state for the vector
//! extensions, via `is_x86_feature_detected!`). Cache sizes come from sysfs
//! first, because CPUID cache leaves are often zero or invented inside VMs,
//! and fall back to the defaults in `tune` (`DEFAULT_LLC` and kin) when neither answers.

use std::sync::OnceLock;

use crate::params;

/// CPU vendor, as far as the strategy rules care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Vendor {
    /// GenuineIntel.
    Intel,
    /// AuthenticAMD (and Hygon, which the rules treat alike).
    Amd,
    /// Any other vendor, or not x86_64.
    Other,
}

/// The feature flags that decide which primitives exist and which are fast.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Features {
    /// Linux's synthetic "rep string ops are good" flag (`copy_page` uses `rep movsq`).
    pub rep_good: bool,
    /// Enhanced REP MOVSB/STOSB.
    pub erms: bool,
    /// Fast short REP MOVSB.
    pub fsrm: bool,
    /// AVX2, with the OS saving the YMM state (enables the `avx2` copy).
    pub avx2: bool,
    /// AVX-512 Foundation, with the OS saving the ZMM state (enables the
    /// `avx512` copy).
    pub avx512f: bool,
    /// AMD's zero-a-cache-line instruction.
    pub clzero: bool,
    /// CLFLUSHOPT: faster cache eviction for `--evict` and
    /// [`crate::mem::Region::evict`].
    pub clflushopt: bool,
    /// SSE2 non-temporal stores (always present on x86_64).
    pub sse2: bool,
}

/// Cache sizes in bytes (per instance as the OS reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Caches {
    /// Level-1 data cache.
    pub l1d: usize,
    /// Level-2 (unified) cache.
    pub l2: usize,
    /// Last-level cache size (L3 where present, else L2).
    pub llc: usize,
    /// Where the sizes came from: "sysfs" or "default".
    pub source: &'static str,
}

/// Everything foliokit knows about the CPU it runs on.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CpuInfo {
    /// `std::env::consts::ARCH`, e.g. `"x86_64"`.
    pub arch: &'static str,
    /// The vendor the rules for `auto` distinguish.
    pub vendor: Vendor,
    /// `model name` from /proc/cpuinfo, or `"unknown"`.
    pub model: String,
    /// Flags that decide which strategies exist and which are fast.
    pub features: Features,
    /// Cache sizes `auto` compares batch sizes against.
    pub caches: Caches,
    /// CPUs this process may run on (`available_parallelism`), at least 1.
    pub logical_cpus: usize,
}

/// The CPU description, detected on first use and cached.
pub fn cpu() -> &'static CpuInfo {
    static CPU: OnceLock<CpuInfo> = OnceLock::new();
    CPU.get_or_init(detect)
}

fn detect() -> CpuInfo {
    let proc_flags = proc_cpuinfo_field("flags").unwrap_or_default();
    let (vendor, mut features) = arch_features();
    // rep_good is a kernel judgement, not a CPUID bit; trust the kernel when
    // it says, otherwise assume ERMS implies good string operations.
    features.rep_good = if proc_flags.is_empty() {
        features.erms
    } else {
        proc_flags.split_whitespace().any(|f| f == "rep_good")
    };
    CpuInfo {
        arch: std::env::consts::ARCH,
        vendor,
        model: proc_cpuinfo_field("model name").unwrap_or_else(|| "unknown".into()),
        features,
        caches: sysfs_caches().unwrap_or(Caches {
            l1d: params::DEFAULT_L1D,
            l2: params::DEFAULT_L2,
            llc: params::DEFAULT_LLC,
            source: "default",
        }),
        logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

#[cfg(target_arch = "x86_64")]
fn arch_features() -> (Vendor, Features) {
    use core::arch::x86_64::__cpuid_count;

    let leaf0 = __cpuid_count(0, 0);
    let mut vendor_bytes = [0u8; 12];
    vendor_bytes[0..4].copy_from_slice(&leaf0.ebx.to_le_bytes());
    vendor_bytes[4..8].copy_from_slice(&leaf0.edx.to_le_bytes());
    vendor_bytes[8..12].copy_from_slice(&leaf0.ecx.to_le_bytes());
    let vendor = match &vendor_bytes {
        b"GenuineIntel" => Vendor::Intel,
        b"AuthenticAMD" | b"HygonGenuine" => Vendor::Amd,
        _ => Vendor::Other,
    };
    let (ebx7, edx7) = if leaf0.eax >= 7 {
        let l7 = __cpuid_count(7, 0);
        (l7.ebx, l7.edx)
    } else {
        (0, 0)
    };
    let ext_max = __cpuid_count(0x8000_0000, 0).eax;
    let ext8_ebx = if ext_max >= 0x8000_0008 {
        __cpuid_count(0x8000_0008, 0).ebx
    } else {
        0
    };
    let features = Features {
        rep_good: false,
        erms: ebx7 & (1 << 9) != 0,
        fsrm: edx7 & (1 << 4) != 0,
        // These two need OS-enabled register state as well as the CPUID bit.
        avx2: std::is_x86_feature_detected!("avx2"),
        avx512f: std::is_x86_feature_detected!("avx512f"),
        clzero: vendor == Vendor::Amd && ext8_ebx & 1 != 0,
        clflushopt: ebx7 & (1 << 23) != 0,
        sse2: true,
    };
    (vendor, features)
}

#[cfg(not(target_arch = "x86_64"))]
fn arch_features() -> (Vendor, Features) {
    (Vendor::Other, Features::default())
}

fn proc_cpuinfo_field(name: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim().to_string())
    })
}

/// Parses sysfs sizes such as "48K", "2048K" or "32M".
pub(crate) fn parse_sysfs_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, mult) = match t.as_bytes().last()? {
        b'K' => (&t[..t.len() - 1], 1 << 10),
        b'M' => (&t[..t.len() - 1], 1 << 20),
        b'G' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits.parse::<usize>().ok().map(|n| n * mult)
}

fn sysfs_caches() -> Option<Caches> {
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let (mut l1d, mut l2, mut l3) = (0, 0, 0);
    for entry in std::fs::read_dir(base).ok()?.flatten() {
        let dir = entry.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let size = parse_sysfs_size(&size).unwrap_or(0);
        match (level.trim(), kind.trim()) {
            ("1", "Data") => l1d = size,
            ("2", "Unified") => l2 = size,
            ("3", "Unified") => l3 = size,
            _ => {}
        }
    }
    let llc = if l3 > 0 { l3 } else { l2 };
    // A VM that reports nothing (or zeros) gets the defaults, not a zero LLC.
    (llc > 0).then_some(Caches {
        l1d: if l1d > 0 { l1d } else { params::DEFAULT_L1D },
        l2: if l2 > 0 { l2 } else { params::DEFAULT_L2 },
        llc,
        source: "sysfs",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_sizes_parse() {
        assert_eq!(parse_sysfs_size("48K\n"), Some(48 << 10));
        assert_eq!(parse_sysfs_size("32M"), Some(32 << 20));
        assert_eq!(parse_sysfs_size("512"), Some(512));
        assert_eq!(parse_sysfs_size("x"), None);
        assert_eq!(parse_sysfs_size(""), None);
    }

    #[test]
    fn detection_is_consistent() {
        let c = cpu();
        assert!(c.caches.llc > 0 && c.caches.l2 > 0 && c.caches.l1d > 0);
        assert!(c.logical_cpus >= 1);
        if c.features.avx512f {
            // Every AVX-512 CPU we dispatch on also has AVX2.
            assert!(c.features.avx2);
        }
    }
}

//! The machine description every report carries.

use foliokit::cpu::{cpu, CpuInfo};
use foliokit::mem::system::{system, SystemInfo};
use foliokit::tune::{profile_status, ProfileStatus};
use serde::Serialize;

use crate::guest::{Accel, GuestInfo};

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: CpuInfo,
    pub system: SystemInfo,
    pub profile: ProfileStatus,
    /// Set when the CPU is emulated (QEMU TCG): then timings mean nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emulated: Option<String>,
    /// Set when `--kernel` ran this report in a guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest: Option<GuestInfo>,
}

pub fn machine() -> Machine {
    let cpu = cpu().clone();
    let guest = GuestInfo::from_env();
    // The host knows when it asked for emulation even if the guest's CPU
    // model does not say so.
    let emulated = emulation(&cpu.model).or_else(|| {
        guest
            .as_ref()
            .filter(|g| g.accel == Accel::Tcg)
            .and_then(|_| emulation("QEMU TCG (foliokit --kernel --accel tcg)"))
    });
    Machine {
        emulated,
        guest,
        cpu,
        system: system(),
        profile: profile_status(),
    }
}

/// The warning every report carries when its CPU is QEMU's software
/// emulation (as in `cargo xtask vm-test`'s guests): correctness only.
pub fn emulation(model: &str) -> Option<String> {
    model.contains("QEMU TCG").then(|| {
        format!(
            "measured under CPU emulation ({model}): timings and ratios are not meaningful; use this run for correctness only"
        )
    })
}

/// "erms avx2 ... (no fsrm clzero)": the flags that matter, present first.
pub fn flags_line(c: &CpuInfo) -> String {
    let f = &c.features;
    let all = [
        ("rep_good", f.rep_good),
        ("erms", f.erms),
        ("fsrm", f.fsrm),
        ("avx2", f.avx2),
        ("avx512f", f.avx512f),
        ("clzero", f.clzero),
        ("clflushopt", f.clflushopt),
    ];
    let has: Vec<_> = all.iter().filter(|f| f.1).map(|f| f.0).collect();
    let lacks: Vec<_> = all.iter().filter(|f| !f.1).map(|f| f.0).collect();
    if lacks.is_empty() {
        has.join(" ")
    } else {
        format!("{} (no {})", has.join(" "), lacks.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::emulation;

    #[test]
    fn qemu_software_emulation_is_flagged_and_real_cpus_are_not() {
        assert!(emulation("QEMU TCG CPU version 2.5+").is_some());
        assert!(emulation("AMD EPYC").is_none());
        assert!(emulation("Intel(R) Xeon(R) Processor @ 2.50GHz").is_none());
    }
}

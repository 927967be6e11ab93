//! Tuning: every threshold `auto` uses, the rules it follows, and the
//! calibration profile that refines them on a given machine.
//!
//! The rules decide two things per batch:
//! 1. the *regime*: will the data still be in cache when someone reads it?
//!    A batch whose working set exceeds a fraction of the last-level cache
//!    (a 1 GiB batch of 2 MiB folios), or that the caller marked write-once,
//!    is `Stream`; everything else is `Resident`;
//! 2. the primitive for that regime, from CPU flags, or from the profile
//!    `foliokit calibrate` measured on this machine when one exists.

use crate::batch::Reuse;
use crate::cpu::{cpu, Vendor};
use crate::strategy::clear::ClearStrategy;
use crate::strategy::copy::CopyStrategy;

mod dispatch;
mod profile;

pub use dispatch::{profile_status, use_profile};
#[cfg(feature = "serde")]
pub use dispatch::{profile_status_on_disk, use_default_file};
pub(crate) use profile::check;
#[cfg(feature = "serde")]
pub use profile::{profile_path, read_profile, save_profile};
pub use profile::{Choice, Profile, ProfileError, ProfileStatus, Unsettled};

// The numbers the rules use live in `params` (a leaf every layer can
// read); those adopters see are re-exported here, where they always were.
pub use crate::params::{
    CHANNEL_MIN_BATCH_BYTES, LAZY_LATENCY_BUDGET, PROCESS_MOVE_BUDGET, PROFILE_VERSION,
};
use crate::params::{MEDIUM_FOLIO_MAX, SMALL_FOLIO_MAX, STREAM_MIN_BYTES};

/// The shape of a request, which is what `auto` decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Bytes per folio (for a single request, its length).
    pub folio_size: usize,
    /// Destination bytes in the whole batch.
    pub total: usize,
    /// The caller's reuse hint.
    pub reuse: Reuse,
    /// Destination not 64-byte aligned (string ops are slow there on AMD).
    pub misaligned: bool,
    /// Copy channels the batch is spread across (1: the calling thread).
    pub channels: usize,
}

impl Shape {
    /// A batch of `n` page-aligned folios.
    pub fn batch(folio_size: usize, n: usize, reuse: Reuse) -> Shape {
        Shape {
            folio_size,
            total: folio_size.saturating_mul(n),
            reuse,
            misaligned: false,
            channels: 1,
        }
    }

    /// The same batch spread across `channels` copy channels: the profile
    /// has a cell per channel count, since what wins on one core need not
    /// win when several share the memory.
    pub fn on_channels(self, channels: usize) -> Shape {
        Shape {
            channels: channels.max(1),
            ..self
        }
    }

    /// One byte-granular request.
    pub fn single(dst: usize, len: usize) -> Shape {
        Shape {
            folio_size: len,
            total: len,
            reuse: Reuse::Reread,
            misaligned: dst % 64 != 0,
            channels: 1,
        }
    }
}

/// Whether the data will be cache-resident afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Regime {
    /// The working set fits in the cache and will be read again: temporal
    /// stores.
    Resident,
    /// It will not survive in cache (too big, or marked write-once):
    /// streaming stores, or string instructions that avoid the
    /// write-allocate read.
    Stream,
}

/// Folio-size class, the other axis of the profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum FolioClass {
    /// Up to 16 KiB (4 KiB and 16 KiB folios).
    Small,
    /// Up to 1 MiB (mTHP sizes).
    Medium,
    /// Larger: PMD-size THP and hugetlb pages.
    Large,
}

impl FolioClass {
    /// The class of a folio of `folio_size` bytes.
    pub fn of(folio_size: usize) -> FolioClass {
        if folio_size <= SMALL_FOLIO_MAX {
            FolioClass::Small
        } else if folio_size <= MEDIUM_FOLIO_MAX {
            FolioClass::Medium
        } else {
            FolioClass::Large
        }
    }

    /// The folio size calibration measures for this class.
    pub fn representative(self) -> usize {
        match self {
            FolioClass::Small => 4 << 10,
            FolioClass::Medium => 64 << 10,
            FolioClass::Large => 2 << 20,
        }
    }
}

/// The regime for a batch whose caches see `working_set` bytes.
pub fn regime(working_set: usize, total: usize, reuse: Reuse) -> Regime {
    let spills = working_set > dispatch::table().stream_above;
    let write_once = reuse == Reuse::Stream && total >= STREAM_MIN_BYTES;
    if spills || write_once {
        Regime::Stream
    } else {
        Regime::Resident
    }
}

/// The copy strategy `auto` uses for `shape`.
pub fn choose_copy(shape: Shape) -> CopyStrategy {
    // Source and destination both pass through the cache.
    let r = regime(shape.total.saturating_mul(2), shape.total, shape.reuse);
    dispatch::table().copy(
        r,
        FolioClass::of(shape.folio_size),
        shape.channels,
        shape.misaligned,
    )
}

/// The built-in copy rules, used without a profile (resolved once into
/// the table `auto` reads; call this to see them, not on a hot path).
pub fn builtin_copy(r: Regime, misaligned: bool) -> CopyStrategy {
    let c = cpu();
    let f = &c.features;
    if !cfg!(target_arch = "x86_64") {
        return CopyStrategy::Libc;
    }
    match r {
        // Intel's fast-string `rep movsb` already skips the write-allocate
        // read on large extents; elsewhere streaming stores are what skip it.
        Regime::Stream if c.vendor == Vendor::Intel && f.erms => CopyStrategy::Movsb,
        Regime::Stream => CopyStrategy::Nt,
        Regime::Resident => {
            // `rep movsb` is the best resident copy where the microcode is
            // fast (Intel ERMS). AMD's is slow on misaligned destinations and
            // without FSRM (the seed-000 Zen 3 regression), and even with
            // FSRM an AVX2 loop matched or beat it on cache-resident copies
            // of 4K-2M folios (0-10%, median ~3%, Zen 3-class EPYC), which is
            // also why glibc keeps vectors on AMD: AVX2 first there.
            let movsb_good = match c.vendor {
                Vendor::Amd => f.fsrm && !misaligned && !f.avx2,
                _ => f.erms,
            };
            if movsb_good {
                CopyStrategy::Movsb
            } else if f.avx2 {
                CopyStrategy::Avx2
            } else if f.rep_good {
                CopyStrategy::Movsq
            } else {
                CopyStrategy::Unrolled
            }
        }
    }
}

/// The clear strategy `auto` uses for `shape`.
pub fn choose_clear(shape: Shape) -> ClearStrategy {
    let r = regime(shape.total, shape.total, shape.reuse);
    dispatch::table().clear(r, FolioClass::of(shape.folio_size), shape.channels)
}

/// The built-in clear rules, used without a profile.
pub fn builtin_clear(r: Regime) -> ClearStrategy {
    let c = cpu();
    let f = &c.features;
    if !cfg!(target_arch = "x86_64") {
        return ClearStrategy::Libc;
    }
    match r {
        Regime::Stream if f.clzero => ClearStrategy::Clzero,
        // As for copies: Intel's `rep stosb` avoids the RFO by itself.
        Regime::Stream if c.vendor == Vendor::Intel && f.erms => ClearStrategy::Stosb,
        Regime::Stream => ClearStrategy::Nt,
        Regime::Resident if f.erms => ClearStrategy::Stosb,
        Regime::Resident => ClearStrategy::Stosq,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::Strategy;

    #[test]
    fn regimes_follow_size_and_reuse() {
        let llc = cpu().caches.llc;
        assert_eq!(regime(4096, 4096, Reuse::Reread), Regime::Resident);
        assert_eq!(regime(4 * llc, 2 * llc, Reuse::Reread), Regime::Stream);
        assert_eq!(regime(8192, 4096, Reuse::Stream), Regime::Stream);
        assert_eq!(regime(64, 64, Reuse::Stream), Regime::Resident);
    }

    #[test]
    fn builtin_choices_are_available() {
        for r in [Regime::Resident, Regime::Stream] {
            for m in [false, true] {
                assert_eq!(builtin_copy(r, m).unavailable(), None);
            }
            assert_eq!(builtin_clear(r).unavailable(), None);
        }
    }

    #[test]
    fn folio_classes() {
        assert_eq!(FolioClass::of(4096), FolioClass::Small);
        assert_eq!(FolioClass::of(64 << 10), FolioClass::Medium);
        assert_eq!(FolioClass::of(2 << 20), FolioClass::Large);
        for c in [FolioClass::Small, FolioClass::Medium, FolioClass::Large] {
            assert_eq!(FolioClass::of(c.representative()), c);
        }
    }

    #[test]
    fn profile_cells_naming_missing_strategies_are_ignored() {
        let p = Profile {
            version: PROFILE_VERSION,
            cpu_model: "x".into(),
            choices: vec![Choice {
                op: "copy".into(),
                regime: Regime::Stream,
                class: FolioClass::Large,
                channels: 1,
                strategy: "no-such".into(),
                gbps: 1.0,
            }],
            unsettled: Vec::new(),
        };
        assert_eq!(
            p.lookup::<CopyStrategy>(Regime::Stream, FolioClass::Large, 1),
            None
        );
    }

    #[test]
    fn profile_cells_are_per_channel_count() {
        let cell = |channels, strategy: &str| Choice {
            op: "copy".into(),
            regime: Regime::Stream,
            class: FolioClass::Large,
            channels,
            strategy: strategy.into(),
            gbps: 1.0,
        };
        let p = Profile {
            version: PROFILE_VERSION,
            cpu_model: "x".into(),
            choices: vec![cell(1, "nt"), cell(2, "movsq")],
            unsettled: Vec::new(),
        };
        let at = |n| p.lookup::<CopyStrategy>(Regime::Stream, FolioClass::Large, n);
        assert_eq!(at(1), Some(CopyStrategy::Nt));
        assert_eq!(at(2), Some(CopyStrategy::Movsq));
        assert_eq!(at(3), None, "an unmeasured count falls back to the rules");
        // A profile written before channel counts reads as one-channel cells.
        #[cfg(feature = "serde")]
        {
            let old: Choice = serde_json::from_str(
                r#"{"op":"copy","regime":"stream","class":"large","strategy":"nt","gbps":1.0}"#,
            )
            .unwrap();
            assert_eq!(old.channels, 1);
        }
        assert_eq!(
            Shape::batch(4096, 4, Reuse::Reread).on_channels(0).channels,
            1
        );
    }
}

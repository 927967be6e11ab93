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

use std::path::PathBuf;
use std::sync::RwLock;
use thiserror::Error;

use crate::batch::Reuse;
use crate::cpu::{cpu, Vendor};
use crate::strategy::clear::ClearStrategy;
use crate::strategy::copy::CopyStrategy;
use crate::strategy::Strategy;

// The numbers the rules use live in `params` (a leaf every layer can
// read); those adopters see are re-exported here, where they always were.
pub use crate::params::{
    CALIBRATION_MARGIN, CALIBRATION_ROUNDS, CHANNEL_MIN_BATCH_BYTES, DEFAULT_LLC, LAZY_CHANNELS,
    LAZY_LATENCY_BUDGET, MEDIUM_FOLIO_MAX, POPULATE_CHUNK, PROCESS_MOVE_BUDGET, PROFILE_VERSION,
    SMALL_FOLIO_MAX, YIELD_REQUESTED,
};
use crate::params::{STREAM_DEN, STREAM_MIN_BYTES, STREAM_NUM};

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
    /// Up to [`SMALL_FOLIO_MAX`] (4 KiB and 16 KiB folios).
    Small,
    /// Up to [`MEDIUM_FOLIO_MAX`] (mTHP sizes).
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
    let llc = cpu().caches.llc;
    let spills = working_set > llc / STREAM_DEN * STREAM_NUM;
    let write_once = reuse == Reuse::Stream && total >= STREAM_MIN_BYTES;
    if spills || write_once {
        Regime::Stream
    } else {
        Regime::Resident
    }
}

/// One measured decision: the best strategy for an (op, regime, class,
/// channels) cell.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Choice {
    /// `"copy"` or `"clear"` ([`Strategy::OP`]).
    pub op: String,
    /// The cell's regime.
    pub regime: Regime,
    /// The cell's folio-size class.
    pub class: FolioClass,
    /// Channels the cell was measured on (profiles written before channel
    /// counts were measured hold one-channel cells).
    #[cfg_attr(feature = "serde", serde(default = "one_channel"))]
    pub channels: usize,
    /// The winning strategy's name. A name this CPU cannot run (a profile
    /// copied from elsewhere) is ignored and the built-in rule applies.
    pub strategy: String,
    /// The best strategy's median GB/s in calibration, for `info`.
    pub gbps: f64,
}

#[cfg(feature = "serde")]
fn one_channel() -> usize {
    1
}

/// A calibration profile, stored as JSON in the user's cache directory.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Profile {
    /// Format version; anything but [`PROFILE_VERSION`] is refused as stale.
    pub version: u32,
    /// The CPU's model name it was measured on; another CPU's is refused.
    pub cpu_model: String,
    /// The measured cells; a cell not listed follows the built-in rules.
    pub choices: Vec<Choice>,
    /// Cells calibration measured but could not settle (its A/A control
    /// disagreed, or no strategy beat the built-in choice beyond the run's
    /// noise): they follow the built-in rules, and this says why.
    #[cfg_attr(feature = "serde", serde(default))]
    pub unsettled: Vec<Unsettled>,
}

/// A cell calibration left to the built-in rules, and why.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Unsettled {
    /// `"copy"` or `"clear"`.
    pub op: String,
    /// The cell's regime.
    pub regime: Regime,
    /// The cell's folio-size class.
    pub class: FolioClass,
    /// Channels the cell was measured on.
    pub channels: usize,
    /// Why, in one line.
    pub why: String,
}

/// Why a profile cannot be read, used or written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// Neither `FOLIOKIT_PROFILE` nor a cache directory (`XDG_CACHE_HOME`,
    /// `HOME`) is set, so there is no default profile path.
    #[error("no cache directory (set FOLIOKIT_PROFILE or XDG_CACHE_HOME)")]
    NoCacheDir,
    /// The file could not be read (missing, permissions).
    #[error("cannot read profile {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not profile JSON.
    #[error("profile {path} is not a foliokit profile: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the JSON parser said.
        reason: String,
    },
    /// The profile was written by a build with another format.
    #[error("profile version {found} is stale (this build reads version {expected}): recalibrate")]
    Stale {
        /// Its version.
        found: u32,
        /// [`PROFILE_VERSION`].
        expected: u32,
    },
    /// The profile was measured on another CPU model.
    #[error("profile is for '{profile}', this CPU is '{cpu}': recalibrate here")]
    OtherCpu {
        /// The profile's CPU model.
        profile: String,
        /// This CPU's model.
        cpu: String,
    },
    /// Saving failed (directory not creatable, disk full, permissions).
    #[error("cannot write profile {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A profile file was asked for ([`crate::ProfileChoice::File`] or
    /// [`crate::ProfileChoice::DefaultFile`]) by a build without the
    /// `serde` feature, which is what reads and writes profile files.
    #[error("profile files need foliokit's `serde` cargo feature, which this build left out")]
    FilesNeedSerde,
}

impl Profile {
    /// The measured choice for the cell, if calibration measured it. A
    /// channel count calibration did not measure has no cell: `auto` then
    /// follows the built-in rules rather than another count's winner.
    fn lookup<S: Strategy>(&self, regime: Regime, class: FolioClass, channels: usize) -> Option<S> {
        let c = self.choices.iter().find(|c| {
            c.op == S::OP && c.regime == regime && c.class == class && c.channels == channels
        })?;
        // A profile from another machine (or an older build) may name a
        // strategy this CPU lacks: ignore that cell rather than fail.
        S::from_name(&c.strategy).filter(|s| s.unavailable().is_none() && s.name() != "auto")
    }
}

/// Where the profile lives: `$FOLIOKIT_PROFILE`, else
/// `$XDG_CACHE_HOME/foliokit/profile.json` (or `~/.cache/foliokit/...`).
/// Needs the `serde` feature.
#[cfg(feature = "serde")]
pub fn profile_path() -> Result<PathBuf, ProfileError> {
    if let Some(p) = std::env::var_os("FOLIOKIT_PROFILE") {
        return Ok(PathBuf::from(p));
    }
    dirs::cache_dir()
        .map(|d| d.join("foliokit").join("profile.json"))
        .ok_or(ProfileError::NoCacheDir)
}

/// What `auto` found when it looked for a profile, for `info` to report.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ProfileStatus {
    /// Where the profile came from: a file path, `"given by the
    /// application"`, or `None` for the built-in rules.
    pub path: Option<String>,
    /// Whether a profile is in force (else the built-in rules).
    pub loaded: bool,
    /// One line for humans: why this profile, or why none.
    pub note: String,
}

struct Tuning {
    profile: Option<Profile>,
    status: ProfileStatus,
}

/// The profile in force; `None` until an application asks for one (then
/// `auto` follows the built-in rules). A lock, not a once-cell: the CLI's
/// lab calibrates, then switches to the profile it just measured.
static TUNING: RwLock<Option<Tuning>> = RwLock::new(None);

fn builtin_status() -> ProfileStatus {
    ProfileStatus {
        path: None,
        loaded: false,
        note: "built-in rules (no profile requested)".into(),
    }
}

/// Checks that `p` suits this build and CPU.
pub(crate) fn check(p: &Profile) -> Result<(), ProfileError> {
    if p.version != PROFILE_VERSION {
        return Err(ProfileError::Stale {
            found: p.version,
            expected: PROFILE_VERSION,
        });
    }
    if p.cpu_model != cpu().model {
        return Err(ProfileError::OtherCpu {
            profile: p.cpu_model.clone(),
            cpu: cpu().model.clone(),
        });
    }
    Ok(())
}

/// Reads a profile file (it is not put in force: see [`use_profile`]).
/// Needs the `serde` feature.
#[cfg(feature = "serde")]
pub fn read_profile(path: &std::path::Path) -> Result<Profile, ProfileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ProfileError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Puts `profile` in force for `auto` from now on (`None`: the built-in
/// rules); `from` says where it came from, for [`profile_status`]. A profile
/// for another CPU or build is refused and changes nothing.
pub fn use_profile(profile: Option<Profile>, from: &str) -> Result<ProfileStatus, ProfileError> {
    if let Some(p) = &profile {
        check(p)?;
    }
    let status = match &profile {
        Some(_) => ProfileStatus {
            path: Some(from.to_string()),
            loaded: true,
            note: "calibrated profile in use".into(),
        },
        None => builtin_status(),
    };
    set(Tuning {
        profile,
        status: status.clone(),
    });
    Ok(status)
}

fn set(t: Tuning) {
    // A poisoned lock only means a panic elsewhere mid-write of a plain
    // value: the value is whole, so keep using it.
    *TUNING.write().unwrap_or_else(|e| e.into_inner()) = Some(t);
}

/// Puts the profile at [`profile_path`] in force when it exists and suits
/// this CPU; otherwise the built-in rules, with the reason in
/// [`profile_status`]. What the CLI does. Needs the `serde` feature.
#[cfg(feature = "serde")]
pub fn use_default_file() -> ProfileStatus {
    let t = load_default_file();
    let status = t.status.clone();
    set(t);
    status
}

#[cfg(feature = "serde")]
fn load_default_file() -> Tuning {
    let path = match profile_path() {
        Ok(p) => p,
        Err(e) => {
            return Tuning {
                profile: None,
                status: ProfileStatus {
                    path: None,
                    loaded: false,
                    note: e.to_string(),
                },
            }
        }
    };
    let shown = path.display().to_string();
    let (profile, note) = match read_profile(&path) {
        Err(ProfileError::Read { .. }) => (
            None,
            "no profile; built-in rules (run `foliokit calibrate`)".into(),
        ),
        Err(e) => (None, format!("{e}; built-in rules")),
        Ok(p) => match check(&p) {
            Err(e) => (None, format!("{e}; built-in rules")),
            Ok(()) => (Some(p), "calibrated profile in use".into()),
        },
    };
    Tuning {
        status: ProfileStatus {
            path: Some(shown),
            loaded: profile.is_some(),
            note,
        },
        profile,
    }
}

/// How `auto` is configured in this process now.
pub fn profile_status() -> ProfileStatus {
    TUNING
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or_else(builtin_status, |t| t.status.clone())
}

/// What the default profile file holds now, read afresh; nothing changes.
/// Needs the `serde` feature.
#[cfg(feature = "serde")]
pub fn profile_status_on_disk() -> ProfileStatus {
    load_default_file().status
}

/// The profile's measured choice for a cell, if a profile is in force.
fn profiled<S: Strategy>(r: Regime, class: FolioClass, channels: usize) -> Option<S> {
    let t = TUNING.read().unwrap_or_else(|e| e.into_inner());
    t.as_ref()?.profile.as_ref()?.lookup(r, class, channels)
}

/// Writes `profile` where [`profile_path`] says. It is not put in force:
/// processes that ask for the default file read it at `init`; this one
/// can call [`use_default_file`] or [`use_profile`]. Needs the `serde`
/// feature.
#[cfg(feature = "serde")]
pub fn save_profile(profile: &Profile) -> Result<PathBuf, ProfileError> {
    let path = profile_path()?;
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(profile).map_err(std::io::Error::other)?;
        // Write then rename so a concurrent reader never sees half a file.
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|source| ProfileError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// The copy strategy `auto` uses for `shape`.
pub fn choose_copy(shape: Shape) -> CopyStrategy {
    // Source and destination both pass through the cache.
    let r = regime(shape.total.saturating_mul(2), shape.total, shape.reuse);
    if !shape.misaligned {
        if let Some(s) = profiled(r, FolioClass::of(shape.folio_size), shape.channels) {
            return s;
        }
    }
    builtin_copy(r, shape.misaligned)
}

/// The built-in copy rules, used without a profile.
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
    if let Some(s) = profiled(r, FolioClass::of(shape.folio_size), shape.channels) {
        return s;
    }
    builtin_clear(r)
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

//! Calibration profiles: what `foliokit calibrate` measured, as data, and
//! the files it is kept in. Which profile is in force is `dispatch`'s.

use std::path::PathBuf;
use thiserror::Error;

use super::{FolioClass, Regime};
use crate::cpu::cpu;
use crate::params::PROFILE_VERSION;
use crate::strategy::Strategy;

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
    pub(crate) fn lookup<S: Strategy>(
        &self,
        regime: Regime,
        class: FolioClass,
        channels: usize,
    ) -> Option<S> {
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

pub(crate) fn builtin_status() -> ProfileStatus {
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

/// Reads a profile file (it is not put in force: see
/// [`use_profile`](super::use_profile)).
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

/// Writes `profile` where [`profile_path`] says. It is not put in force:
/// processes that ask for the default file read it at `init`; this one
/// can call [`use_default_file`](super::use_default_file) or
/// [`use_profile`](super::use_profile). Needs the `serde`
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

#[cfg(feature = "serde")]
pub(crate) fn load_default_file() -> (Option<Profile>, ProfileStatus) {
    let path = match profile_path() {
        Ok(p) => p,
        Err(e) => {
            return (
                None,
                ProfileStatus {
                    path: None,
                    loaded: false,
                    note: e.to_string(),
                },
            )
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
    let status = ProfileStatus {
        path: Some(shown),
        loaded: profile.is_some(),
        note,
    };
    (profile, status)
}

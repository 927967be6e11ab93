//! Explicit start-up: everything foliokit does to the process, done once,
//! when and how the application says.
//!
//! [`init`] detects the CPU, takes (or refuses) a calibration profile,
//! installs the SIGBUS handler machine-check-safe copies need, and starts
//! copy channels on the CPUs the caller chooses. After it, no copy, clear
//! or `auto` decision touches the filesystem, so the hot path can run
//! under a seccomp filter, on pinned vCPU threads.
//!
//! Without `init`, the first call that needs a fact finds it then: the
//! CPU on first `auto`, the SIGBUS handler on first mc copy, channels on
//! first use (unpinned), and no profile is read at all — `auto` follows
//! its built-in rules. A profile file is read only when the application
//! asks ([`ProfileChoice::File`] or [`ProfileChoice::DefaultFile`]).

use std::path::PathBuf;
use std::sync::OnceLock;
use thiserror::Error;

use crate::channels::{self, ChannelError};
use crate::tune::{self, Profile, ProfileError, ProfileStatus};

/// Which calibration profile `auto` follows.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub enum ProfileChoice {
    /// None: the built-in rules, from CPU flags and cache sizes.
    #[default]
    BuiltIn,
    /// This profile (e.g. one the application stores itself).
    Given(Profile),
    /// The profile in this file; an unreadable or foreign file is an error.
    ///
    /// Needs the `serde` feature: without it [`init`] refuses this choice
    /// with [`ProfileError::FilesNeedSerde`] before doing anything.
    File(PathBuf),
    /// The file `foliokit calibrate` writes (`tune::profile_path`), if it
    /// exists and suits this CPU; otherwise the built-in rules. The CLI's
    /// choice.
    ///
    /// Needs the `serde` feature, as [`ProfileChoice::File`] does.
    DefaultFile,
}

/// Where copy channel workers run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelCpus {
    /// Not pinned: the scheduler places them (the default; nothing collides
    /// with threads the application pinned).
    #[default]
    Unpinned,
    /// Channel `i` pinned to the `i`-th CPU of the process's affinity mask
    /// (wrapping): steady placement for measurements.
    Spread,
    /// Channel `i` pinned to `cpus[i % len]`.
    Cpus(Vec<usize>),
}

/// How [`init`] sets foliokit up. Build with [`Config::new`] and the
/// setters; fields are added in minor versions.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// The calibration profile `auto` follows.
    pub profile: ProfileChoice,
    /// Install the SIGBUS handler now. `false` refuses it: machine-check-
    /// safe copies then fail with [`crate::McError::Unavailable`].
    pub sigbus_handler: bool,
    /// Where channel workers run.
    pub channel_cpus: ChannelCpus,
    /// Channel pools to start now (channel counts), so their threads exist
    /// before the application's own threads are pinned or sandboxed.
    pub start_channels: Vec<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            profile: ProfileChoice::BuiltIn,
            sigbus_handler: true,
            channel_cpus: ChannelCpus::Unpinned,
            start_channels: Vec::new(),
        }
    }
}

impl Config {
    /// Built-in rules, the SIGBUS handler, unpinned channels started lazily.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the profile `auto` follows.
    pub fn profile(mut self, p: ProfileChoice) -> Self {
        self.profile = p;
        self
    }

    /// Installs (`true`) or refuses (`false`) the SIGBUS handler.
    pub fn sigbus_handler(mut self, install: bool) -> Self {
        self.sigbus_handler = install;
        self
    }

    /// Sets where channel workers run.
    pub fn channel_cpus(mut self, c: ChannelCpus) -> Self {
        self.channel_cpus = c;
        self
    }

    /// Starts a pool of `n` channels during [`init`].
    pub fn start_channels(mut self, n: usize) -> Self {
        self.start_channels.push(n);
        self
    }
}

/// Why [`init`] failed. Nothing it did before the failure is undone, except
/// that a refused profile leaves the built-in rules in force.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum InitError {
    /// `init` ran before, or a call that depends on the configuration (a
    /// channel pool, a machine-check-safe copy) already ran with the
    /// defaults; the settings in force are unchanged.
    #[error("foliokit is already initialised (init must come before any other foliokit call)")]
    AlreadyInitialized,
    /// The profile could not be used.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// `sigaction` failed with this errno.
    #[error("cannot install the SIGBUS handler: errno {0}")]
    Sigbus(i32),
    /// A channel pool could not start.
    #[error(transparent)]
    Channels(#[from] ChannelError),
}

/// What [`init`] set up.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Started {
    /// The CPU foliokit detected.
    pub cpu: &'static crate::cpu::CpuInfo,
    /// The profile `auto` follows, and why.
    pub profile: ProfileStatus,
    /// Whether the SIGBUS handler is installed.
    pub sigbus_handler: bool,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The configuration in force: [`init`]'s, or the defaults from the first
/// call that needed one.
pub(crate) fn config() -> &'static Config {
    CONFIG.get_or_init(Config::default)
}

/// Sets foliokit up for this process; call it once, before any other
/// foliokit call (plain copies and clears before it are harmless; a channel
/// pool or an mc copy fixes the defaults). See the [module docs](self).
pub fn init(config: Config) -> Result<Started, InitError> {
    // The file variants exist in every build, so code choosing them
    // compiles either way; a build that cannot read profile files says so
    // before anything is set up, and the application may call init again.
    // (A second init is still AlreadyInitialized, whatever it asks for.)
    #[cfg(not(feature = "serde"))]
    if CONFIG.get().is_none()
        && matches!(
            config.profile,
            ProfileChoice::File(_) | ProfileChoice::DefaultFile
        )
    {
        return Err(ProfileError::FilesNeedSerde.into());
    }
    CONFIG
        .set(config)
        .map_err(|_| InitError::AlreadyInitialized)?;
    let c = self::config();
    let cpu = crate::cpu::cpu();
    match &c.profile {
        ProfileChoice::BuiltIn => {}
        ProfileChoice::Given(p) => {
            tune::use_profile(Some(p.clone()), "given by the application")?;
        }
        #[cfg(feature = "serde")]
        ProfileChoice::File(path) => {
            tune::use_profile(Some(tune::read_profile(path)?), &path.display().to_string())?;
        }
        #[cfg(feature = "serde")]
        ProfileChoice::DefaultFile => {
            tune::use_default_file();
        }
        // Refused above, before the configuration was taken.
        #[cfg(not(feature = "serde"))]
        ProfileChoice::File(_) | ProfileChoice::DefaultFile => {}
    }
    if c.sigbus_handler {
        crate::mc::install_handler().map_err(InitError::Sigbus)?;
    }
    for &n in &c.start_channels {
        channels::shared(n)?;
    }
    Ok(Started {
        cpu,
        profile: tune::profile_status(),
        sigbus_handler: c.sigbus_handler,
    })
}

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

pub use crate::channels::ChannelCpus;
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
    /// before the application's own threads are pinned or sandboxed; see
    /// [`crate::channels::start_shared`], which also starts helper threads
    /// for populate and the kernel migration path.
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

    setters! {
        /// Sets the profile `auto` follows.
        profile: ProfileChoice,
        /// Installs (`true`) or refuses (`false`) the SIGBUS handler.
        sigbus_handler: bool,
        /// Sets where channel workers run.
        channel_cpus: ChannelCpus,
    }

    /// Starts a pool of `n` channels (and `n - 1` helpers) during [`init`].
    pub fn start_channels(mut self, n: usize) -> Self {
        self.start_channels.push(n);
        self
    }
}

/// Why [`init`] failed. A refused profile, a zero channel count or a build
/// without the `serde` feature asked for a file is reported before
/// anything is set up: init may be called again. A failure after that
/// (sigaction, starting a pool) leaves the configuration taken.
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

/// Sets foliokit up for this process; call it once, before any other
/// foliokit call (plain copies and clears before it are harmless; a channel
/// pool or an mc copy fixes the defaults). See the [module docs](self).
pub fn init(mut config: Config) -> Result<Started, InitError> {
    // Everything that can fail without side effects is checked before the
    // configuration is taken, so a refused init changes nothing and may be
    // called again with other choices. (A second init after a successful
    // one is AlreadyInitialized, whatever it asks for.)
    // The layers below hold their own part of the configuration (channel
    // placement, the SIGBUS policy); a pool or an mc copy that ran before
    // `init` fixed theirs to the defaults. (A thread starting the first
    // pool while another runs `init` can still fix one of them in between:
    // init then reports AlreadyInitialized with the other one set.)
    if CONFIG.get().is_some() || channels::placement_fixed() || crate::mc::handler_policy_fixed() {
        return Err(InitError::AlreadyInitialized);
    }
    if config.start_channels.contains(&0) {
        return Err(ChannelError::Zero.into());
    }
    let cpu = crate::cpu::cpu();
    // The profile to put in force, read and checked now: (profile, where
    // it came from), or `None` for the default file's own status logic.
    let profile: Option<(Profile, String)> = match &config.profile {
        ProfileChoice::BuiltIn | ProfileChoice::DefaultFile => None,
        ProfileChoice::Given(p) => {
            tune::check(p)?;
            Some((p.clone(), "given by the application".into()))
        }
        #[cfg(feature = "serde")]
        ProfileChoice::File(path) => {
            let p = tune::read_profile(path)?;
            tune::check(&p)?;
            Some((p, path.display().to_string()))
        }
        #[cfg(not(feature = "serde"))]
        ProfileChoice::File(_) => return Err(ProfileError::FilesNeedSerde.into()),
    };
    #[cfg(not(feature = "serde"))]
    if config.profile == ProfileChoice::DefaultFile {
        return Err(ProfileError::FilesNeedSerde.into());
    }
    // "Spread" means the CPUs the application may use now, on the thread
    // that starts foliokit: fixed here, not on whichever (perhaps pinned)
    // thread later makes a pool.
    if config.channel_cpus == ChannelCpus::Spread {
        let allowed = crate::sys::allowed_cpus();
        config.channel_cpus = if allowed.is_empty() {
            ChannelCpus::Unpinned
        } else {
            ChannelCpus::Cpus(allowed)
        };
    }
    CONFIG
        .set(config)
        .map_err(|_| InitError::AlreadyInitialized)?;
    let c = CONFIG.get().expect("set above");
    // Passed down once: nothing below this module reads the configuration.
    if !channels::fix_placement(c.channel_cpus.clone())
        || !crate::mc::fix_handler_policy(c.sigbus_handler)
    {
        return Err(InitError::AlreadyInitialized);
    }
    match profile {
        Some((p, from)) => {
            tune::use_profile(Some(p), &from)?;
        }
        #[cfg(feature = "serde")]
        None if c.profile == ProfileChoice::DefaultFile => {
            tune::use_default_file();
        }
        None => {}
    }
    if c.sigbus_handler {
        crate::mc::install_handler().map_err(InitError::Sigbus)?;
    }
    for &n in &c.start_channels {
        channels::start_shared(n)?;
    }
    Ok(Started {
        cpu,
        profile: tune::profile_status(),
        sigbus_handler: c.sigbus_handler,
    })
}

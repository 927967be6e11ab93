//! The table `auto` reads: the built-in rules and the profile in force,
//! resolved into strategies once (at first use, and again whenever a
//! profile is put in force) and published through one atomic pointer, so
//! choosing a strategy takes no lock and parses no name.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

use super::profile::{builtin_status, check, Profile, ProfileError, ProfileStatus};
use super::{builtin_clear, builtin_copy, FolioClass, Regime};
use crate::cpu::cpu;
use crate::params::{STREAM_DEN, STREAM_NUM};
use crate::strategy::clear::ClearStrategy;
use crate::strategy::copy::CopyStrategy;
use crate::strategy::Strategy;

/// One profile cell, resolved: the strategy `auto` runs for it.
struct Cell<S> {
    regime: Regime,
    class: FolioClass,
    channels: usize,
    strategy: S,
}

/// Everything `auto` decides on, resolved.
pub(super) struct Table {
    /// A working set above this many bytes streams (a fraction of the LLC).
    pub(super) stream_above: usize,
    /// The built-in copy choice by [regime][misaligned].
    builtin_copy: [[CopyStrategy; 2]; 2],
    /// The built-in clear choice by [regime].
    builtin_clear: [ClearStrategy; 2],
    copy: Vec<Cell<CopyStrategy>>,
    clear: Vec<Cell<ClearStrategy>>,
    status: ProfileStatus,
}

fn slot(r: Regime) -> usize {
    match r {
        Regime::Resident => 0,
        Regime::Stream => 1,
    }
}

/// The cells of `p` this CPU can run, resolved once.
fn cells<S: Strategy>(p: Option<&Profile>) -> Vec<Cell<S>> {
    let Some(p) = p else { return Vec::new() };
    p.choices
        .iter()
        .filter_map(|c| {
            Some(Cell {
                regime: c.regime,
                class: c.class,
                channels: c.channels,
                strategy: p.lookup::<S>(c.regime, c.class, c.channels)?,
            })
        })
        .collect()
}

impl Table {
    fn new(profile: Option<&Profile>, status: ProfileStatus) -> Table {
        let both = [Regime::Resident, Regime::Stream];
        Table {
            stream_above: cpu().caches.llc / STREAM_DEN * STREAM_NUM,
            builtin_copy: both.map(|r| [builtin_copy(r, false), builtin_copy(r, true)]),
            builtin_clear: both.map(builtin_clear),
            copy: cells(profile),
            clear: cells(profile),
            status,
        }
    }

    pub(super) fn copy(
        &self,
        r: Regime,
        class: FolioClass,
        channels: usize,
        misaligned: bool,
    ) -> CopyStrategy {
        // A profile cell is measured on aligned folios: a misaligned
        // request follows the rules, which know what misalignment costs.
        let cell = (!misaligned)
            .then(|| find(&self.copy, r, class, channels))
            .flatten();
        cell.unwrap_or(self.builtin_copy[slot(r)][usize::from(misaligned)])
    }

    pub(super) fn clear(&self, r: Regime, class: FolioClass, channels: usize) -> ClearStrategy {
        find(&self.clear, r, class, channels).unwrap_or(self.builtin_clear[slot(r)])
    }
}

/// A channel count calibration did not measure has no cell: `auto` then
/// follows the built-in rules rather than another count's winner.
fn find<S: Copy>(cells: &[Cell<S>], r: Regime, class: FolioClass, channels: usize) -> Option<S> {
    cells
        .iter()
        .find(|c| c.regime == r && c.class == class && c.channels == channels)
        .map(|c| c.strategy)
}

/// The table in force; null until first use. Replaced tables are leaked,
/// never freed: a reader may still hold one, and profiles change a handful
/// of times in a process (the lab calibrates, then switches once).
static TABLE: AtomicPtr<Table> = AtomicPtr::new(std::ptr::null_mut());

/// Serialises replacements, so the last `use_profile` wins whole.
static WRITER: Mutex<()> = Mutex::new(());

/// The table in force, made from the built-in rules on first use.
pub(super) fn table() -> &'static Table {
    let p = TABLE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published table is never freed or written again.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(Table::new(None, builtin_status())));
    match TABLE.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: just published; never freed (see TABLE).
        Ok(_) => unsafe { &*fresh },
        Err(won) => {
            // SAFETY: `fresh` was never published, so this is its only
            // owner; `won` is published and never freed.
            unsafe {
                drop(Box::from_raw(fresh));
                &*won
            }
        }
    }
}

fn set(profile: Option<&Profile>, status: ProfileStatus) {
    let _one_writer = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let fresh = Box::into_raw(Box::new(Table::new(profile, status)));
    // The old table is leaked on purpose (see TABLE).
    TABLE.store(fresh, Ordering::Release);
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
    set(profile.as_ref(), status.clone());
    Ok(status)
}

/// Puts the profile at [`profile_path`](super::profile_path) in force when it exists and suits
/// this CPU; otherwise the built-in rules, with the reason in
/// [`profile_status`]. What the CLI does. Needs the `serde` feature.
#[cfg(feature = "serde")]
pub fn use_default_file() -> ProfileStatus {
    let (profile, status) = super::profile::load_default_file();
    set(profile.as_ref(), status.clone());
    status
}

/// How `auto` is configured in this process now.
pub fn profile_status() -> ProfileStatus {
    table().status.clone()
}

/// What the default profile file holds now, read afresh; nothing changes.
/// Needs the `serde` feature.
#[cfg(feature = "serde")]
pub fn profile_status_on_disk() -> ProfileStatus {
    super::profile::load_default_file().1
}

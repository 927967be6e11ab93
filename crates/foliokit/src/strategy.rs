//! What copy and clear strategies have in common: a name, a one-line
//! description, availability on this CPU, and parsing of `-f` lists.

use thiserror::Error;

/// A named, always-callable way of doing one operation.
pub trait Strategy: Copy + Eq + std::fmt::Debug + 'static {
    /// The operation, for messages: "copy" or "clear".
    const OP: &'static str;
    /// Every strategy, in the order tables list them.
    const ALL: &'static [Self];

    /// The name `-f` lists, the C API and JSON output use (`"movsb"`,
    /// `"per-page"`, `"auto"`).
    fn name(self) -> &'static str;
    /// One line on what the strategy does, for `-f help`.
    fn description(self) -> &'static str;
    /// `Some(reason)` when this CPU or architecture cannot run it.
    fn unavailable(self) -> Option<&'static str>;

    /// The strategy called `name` (exact match), available here or not.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| s.name() == name)
    }
}

/// Why a strategy cannot be used. `op` is always [`Strategy::OP`]
/// (`"copy"` or `"clear"`).
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum StrategyError {
    /// A name matched no strategy of this operation.
    #[error("unknown {op} strategy '{name}' (known: {known}; '-f help' describes them)")]
    Unknown {
        /// `"copy"` or `"clear"`.
        op: &'static str,
        /// The name as given.
        name: String,
        /// The valid names, comma-separated.
        known: String,
    },
    /// The strategy exists but this CPU or architecture lacks what it
    /// needs (never emulated: callers choose another or `auto`).
    #[error("{op} strategy '{name}' is not available here: {reason}")]
    Unavailable {
        /// `"copy"` or `"clear"`.
        op: &'static str,
        /// The strategy's name.
        name: &'static str,
        /// What is missing, e.g. a CPU flag.
        reason: &'static str,
    },
    /// A `-f` list held no names.
    #[error("no {op} strategy given")]
    Empty {
        /// `"copy"` or `"clear"`.
        op: &'static str,
    },
    /// `auto` was asked for its function before being resolved for a
    /// batch shape (`CopyStrategy::resolve` / `ClearStrategy::resolve`).
    #[error("{op} strategy 'auto' must be resolved for a batch shape first; call resolve()")]
    Unresolved {
        /// `"copy"` or `"clear"`.
        op: &'static str,
    },
}

/// Returns `s` if it can run here, or why not.
pub fn require<S: Strategy>(s: S) -> Result<S, StrategyError> {
    match s.unavailable() {
        None => Ok(s),
        Some(reason) => Err(StrategyError::Unavailable {
            op: S::OP,
            name: s.name(),
            reason,
        }),
    }
}

/// The strategies a `-f` list selects, and those `all` had to skip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection<S> {
    /// The strategies to run, in list order, without duplicates.
    pub run: Vec<S>,
    /// For `all` only: strategies this CPU lacks, with the reason.
    pub skipped: Vec<(S, &'static str)>,
}

/// Parses `name[,name...]` or `all`. Names given explicitly must be
/// available; `all` runs what is available and lists what it skipped.
pub fn parse_list<S: Strategy>(spec: &str) -> Result<Selection<S>, StrategyError> {
    let spec = spec.trim();
    if spec == "all" {
        let (run, skipped): (Vec<S>, Vec<S>) =
            S::ALL.iter().partition(|s| s.unavailable().is_none());
        return Ok(Selection {
            run,
            skipped: skipped
                .into_iter()
                .map(|s| (s, s.unavailable().unwrap_or_default()))
                .collect(),
        });
    }
    let mut run = Vec::new();
    for name in spec.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let s = S::from_name(name).ok_or_else(|| StrategyError::Unknown {
            op: S::OP,
            name: name.to_string(),
            known: S::ALL
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        let s = require(s)?;
        if !run.contains(&s) {
            run.push(s);
        }
    }
    if run.is_empty() {
        return Err(StrategyError::Empty { op: S::OP });
    }
    Ok(Selection {
        run,
        skipped: Vec::new(),
    })
}

//! The strategy tables: every copy and clear strategy is one row of data
//! (name, description, CPU requirement, function, undrained function,
//! machine-check-safe twin),
//! declared with [`strategies!`](crate::strategy) in `copy.rs` and
//! `clear.rs` beside the composite functions it names; the assembly is in
//! `crate::arch`. Adding a strategy is one row there and its assembly.
//! Here: what the two operations share — the [`Strategy`] trait, the row
//! type, availability, and parsing of `-f` lists.

use thiserror::Error;

use crate::cpu::{cpu, Features};

pub mod clear;
pub mod copy;

/// A copy primitive: copies exactly `len` bytes from `src` to `dst`.
/// Callers guarantee both ranges are valid and disjoint.
pub type CopyFn = unsafe fn(dst: *mut u8, src: *const u8, len: usize);

/// A clear primitive: zeroes exactly `len` bytes at `dst`.
/// Callers guarantee the range is valid for writes.
pub type ClearFn = unsafe fn(dst: *mut u8, len: usize);

/// A machine-check-safe copy routine `(dst, src, len) -> bytes not copied`,
/// as the copy channels run it ([`crate::channels::Op::CopyMc`]).
///
/// # Safety (of calling it)
/// As [`crate::mc::copy_mc_raw`]: `src` mapped readable (its pages may
/// raise SIGBUS, which ends the copy short), `dst` valid for writes and not
/// faulting, the two disjoint; the SIGBUS handler installed.
pub type McCopyFn = unsafe fn(*mut u8, *const u8, usize) -> usize;

/// What a row needs from the CPU beyond its architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    Nothing,
    Avx2,
    Avx512f,
    Clzero,
}

impl Need {
    fn missing(self, f: &Features) -> Option<&'static str> {
        match self {
            Need::Nothing => None,
            Need::Avx2 if !f.avx2 => Some("CPU or OS lacks AVX2"),
            Need::Avx512f if !f.avx512f => Some("CPU or OS lacks AVX-512F"),
            Need::Clzero if !f.clzero => Some("CLZERO is an AMD instruction this CPU lacks"),
            _ => None,
        }
    }
}

/// How a row runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body<F> {
    /// One primitive over the whole range (a string instruction or one
    /// vector loop); `None` where this architecture has no such
    /// instruction (see [`on_x86!`]).
    Range(Option<F>),
    /// A range function built from others or from the platform (the
    /// per-page loop, libc): callable, but what it reaches says nothing
    /// about what the machine can do.
    Composite(F),
    /// Page by page around a hint page (`butterfly`): no range function.
    Paged,
    /// Chosen per request by the policy in [`crate::tune`].
    Auto,
}

/// One strategy, as data.
#[derive(Debug)]
pub(crate) struct Row<F: 'static> {
    pub name: &'static str,
    pub description: &'static str,
    pub needs: Need,
    pub body: Body<F>,
    /// The same stores without the closing fence, for a batch that fences
    /// once after its last folio; `None` where the stores are ordinary.
    pub undrained: Option<F>,
    /// Its machine-check-safe twin (copy rows only): the same loop with
    /// every faulting instruction in the fault table.
    pub mc: Option<McCopyFn>,
}

/// The `auto` row, the same for every operation: chosen per request.
pub(crate) const fn auto_row<F>() -> Row<F> {
    Row {
        name: "auto",
        description: "picks per batch from CPU flags, cache sizes, batch size, reuse and the calibration profile",
        needs: Need::Nothing,
        body: Body::Auto,
        undrained: None,
        mc: None,
    }
}

const NOT_HERE: &str = "x86_64 instruction; not available on this architecture";

impl<F: Copy> Row<F> {
    /// Why this CPU cannot run the row, if it cannot.
    pub(crate) fn unavailable(&self) -> Option<&'static str> {
        match self.body {
            Body::Range(None) => Some(NOT_HERE),
            _ => self.needs.missing(&cpu().features),
        }
    }

    /// The range function of an available, concrete row.
    pub(crate) fn function(&self, op: &'static str) -> Result<F, StrategyError> {
        if let Some(reason) = self.unavailable() {
            return Err(StrategyError::Unavailable {
                op,
                name: self.name,
                reason,
            });
        }
        match self.body {
            Body::Range(Some(f)) | Body::Composite(f) => Ok(f),
            Body::Range(None) => unreachable!("refused above as unavailable"),
            Body::Paged => Err(StrategyError::Unavailable {
                op,
                name: self.name,
                reason: "it clears page by page around a hint page, not as a range",
            }),
            Body::Auto => Err(StrategyError::Unresolved { op }),
        }
    }
}

/// `Some(path)` on x86_64, `None` elsewhere: a row's instruction-level
/// function, which other architectures do not build.
#[cfg(target_arch = "x86_64")]
macro_rules! on_x86 {
    ($f:path) => {
        Some($f)
    };
}
#[cfg(not(target_arch = "x86_64"))]
macro_rules! on_x86 {
    ($f:path) => {
        None
    };
}
pub(crate) use on_x86;

/// Declares a strategy enum from its table: one variant per row, with the
/// row beside it. Generates the enum (serde names are the row names, kebab
/// case), its [`Strategy`] impl, `Display`, and `row()`.
macro_rules! strategies {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $op:literal, $fnty:ty {
            $( $(#[$vmeta:meta])* $variant:ident => $row:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        #[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// This strategy's row of the table.
            pub(crate) fn row(self) -> &'static $crate::strategy::Row<$fnty> {
                match self {
                    $( Self::$variant => {
                        static ROW: $crate::strategy::Row<$fnty> = $row;
                        &ROW
                    } )+
                }
            }
        }

        impl $crate::strategy::Strategy for $name {
            const OP: &'static str = $op;
            const ALL: &'static [Self] = &[ $( Self::$variant, )+ ];
            fn name(self) -> &'static str {
                self.row().name
            }
            fn description(self) -> &'static str {
                self.row().description
            }
            fn unavailable(self) -> Option<&'static str> {
                self.row().unavailable()
            }
            fn is_primitive(self) -> bool {
                matches!(self.row().body, $crate::strategy::Body::Range(_))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.row().name)
            }
        }
    };
}
pub(crate) use strategies;

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

    /// Whether it is one primitive over the whole range (a string
    /// instruction or one vector loop), so that what it reaches the machine
    /// can do: a bandwidth limit is at least the best of these. Composites
    /// (`per-page`, `libc`, `butterfly`) and `auto` are not.
    fn is_primitive(self) -> bool {
        false
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    // A macro, not a generic fn: the serde check needs the concrete type.
    macro_rules! names_are_unique_and_match {
        ($s:ty) => {{
            let mut seen = std::collections::HashSet::new();
            for &s in <$s>::ALL {
                assert!(seen.insert(s.name()), "{} listed twice", s.name());
                assert_eq!(<$s>::from_name(s.name()), Some(s));
                #[cfg(feature = "serde")]
                assert_eq!(
                    serde_json::to_string(&s).unwrap(),
                    format!("\"{}\"", s.name()),
                    "the serde name is the row's name"
                );
            }
        }};
    }

    #[test]
    fn every_row_has_one_name_everywhere() {
        names_are_unique_and_match!(copy::CopyStrategy);
        names_are_unique_and_match!(clear::ClearStrategy);
    }

    #[test]
    fn only_auto_is_unresolved_and_only_butterfly_is_paged() {
        for &s in copy::CopyStrategy::ALL {
            let unresolved = matches!(s.function(), Err(StrategyError::Unresolved { .. }));
            assert_eq!(unresolved, s == copy::CopyStrategy::Auto, "{s}");
        }
        for &s in clear::ClearStrategy::ALL {
            let paged = matches!(s.row().body, Body::Paged);
            assert_eq!(paged, s == clear::ClearStrategy::Butterfly, "{s}");
        }
    }

    #[test]
    fn every_row_but_the_composites_is_a_primitive() {
        // The composites are written in this module's files; every other
        // row is one instruction sequence from `arch`, and counts towards
        // the lab's limit by being there.
        for &s in copy::CopyStrategy::ALL {
            let composite = ["per-page", "libc", "auto"].contains(&s.name());
            assert_eq!(s.is_primitive(), !composite, "{s}");
        }
        for &s in clear::ClearStrategy::ALL {
            let composite = ["butterfly", "per-page", "libc", "auto"].contains(&s.name());
            assert_eq!(s.is_primitive(), !composite, "{s}");
        }
    }
}

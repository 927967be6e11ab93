//! The error every experiment returns: the typed errors of the layers it
//! drives, or a sentence about the plan it was given (a size that is not a
//! whole number of folios, a variant this CPU lacks). Printed as one line.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LabError {
    /// The plan cannot run here; the sentence says why.
    #[error("{0}")]
    Plan(String),
    #[error(transparent)]
    Mem(#[from] foliokit::mem::MemError),
    #[error(transparent)]
    Measure(#[from] crate::measure::MeasureError),
    #[error(transparent)]
    Mthp(#[from] crate::mthp::MthpError),
    #[error(transparent)]
    Remap(#[from] crate::remap::RemapError),
    #[error(transparent)]
    Restore(#[from] crate::restore::RestoreError),
    #[error(transparent)]
    Migrate(#[from] foliokit::migrate::MigrateError),
    #[error(transparent)]
    Nt(#[from] foliokit::nt::NtError),
    #[error(transparent)]
    Strategy(#[from] foliokit::StrategyError),
    #[error(transparent)]
    Populate(#[from] foliokit::mem::PopulateError),
    #[error(transparent)]
    Channel(#[from] foliokit::channels::ChannelError),
    #[error(transparent)]
    Process(#[from] foliokit::migrate::process::ProcessError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl From<String> for LabError {
    fn from(s: String) -> Self {
        LabError::Plan(s)
    }
}

impl From<&str> for LabError {
    fn from(s: &str) -> Self {
        LabError::Plan(s.into())
    }
}

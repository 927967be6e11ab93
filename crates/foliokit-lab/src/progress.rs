//! How an experiment reports progress without knowing who shows it: the
//! CLI draws bars, tests and library callers pass `&()`.

/// A progress sink. An experiment announces a phase with its number of
/// steps, ticks once per step, and ends the phase.
pub trait Progress {
    /// A new phase of `total` steps called `label`.
    fn begin(&self, total: usize, label: &str);
    /// One step of the current phase done.
    fn tick(&self);
    /// The current phase is over.
    fn end(&self);
}

/// No progress shown.
impl Progress for () {
    fn begin(&self, _: usize, _: &str) {}
    fn tick(&self) {}
    fn end(&self) {}
}

//! Calibration: measure the named strategies in each (regime, folio class)
//! cell `auto` distinguishes, and record the fastest as a [`Profile`].

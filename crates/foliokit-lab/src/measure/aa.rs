//! The A/A control: the same code timed twice in one run.
//!
//! `auto` is timed beside the named strategy it resolves to (or, where a
//! bench runs no `auto`, its first candidate beside a second copy of
//! itself). Both run the same instructions on the same buffers in the same
//! balanced order, so any difference between them is the run's own
//! error: where it exceeds the tolerance, the run cannot rank strategies
//! that differ by less, and reports say so instead of giving a verdict.

use serde::Serialize;

/// Two timings of the same code agree when their median per-pass ratio is
/// within this fraction of 1, or within twice the ratio's standard error
/// where the run is noisier than that.
pub const AA_TOLERANCE: f64 = 0.05;

/// How far two timings of the same code came apart.
#[derive(Debug, Clone, Serialize)]
pub struct AaControl {
    /// The candidate as listed (`auto`, or the first candidate).
    pub a: String,
    /// Its twin: the named strategy `auto` ran, timed as itself.
    pub b: String,
    /// Median GB/s of each.
    pub a_gbps: f64,
    pub b_gbps: f64,
    /// Median over passes of `a`'s rate over `b`'s in the same pass.
    pub ratio: f64,
    /// Robust per-pass spread of that ratio (1.4826 × MAD).
    pub noise: f64,
    /// The agreement band this run allows: `AA_TOLERANCE`, widened to two
    /// standard errors of the median ratio on a noisier run.
    pub tolerance: f64,
    pub within_noise: bool,
    /// Whether the twin was timed only for the control (not listed).
    pub twin_added: bool,
    /// Set when the control could not compare like with like (auto ran
    /// something other than the twin): the run then ranks nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl AaControl {
    /// Compares `a` and `b` from their per-pass seconds (the same pass
    /// order for both, as `run_interleaved` returns them).
    pub fn of(
        a: &str,
        a_secs: &[f64],
        b: &str,
        b_secs: &[f64],
        bytes: usize,
        twin_added: bool,
    ) -> Option<AaControl> {
        let n = a_secs.len().min(b_secs.len());
        if n == 0 {
            return None;
        }
        let mut ratios: Vec<f64> = (0..n).map(|p| b_secs[p] / a_secs[p]).collect();
        let ratio = median(&mut ratios);
        let mut dev: Vec<f64> = ratios.iter().map(|r| (r - ratio).abs()).collect();
        let noise = 1.4826 * median(&mut dev);
        // The median's standard error is about 1.25 sd / sqrt(n).
        let tolerance = AA_TOLERANCE.max(2.0 * 1.25 * noise / (n as f64).sqrt());
        let rate = |s: &[f64]| {
            let mut r: Vec<f64> = s.iter().map(|&t| super::gbps(bytes, t)).collect();
            median(&mut r)
        };
        Some(AaControl {
            a: a.into(),
            b: b.into(),
            a_gbps: rate(a_secs),
            b_gbps: rate(b_secs),
            ratio,
            noise,
            tolerance,
            within_noise: (ratio - 1.0).abs() <= tolerance,
            twin_added,
            problem: None,
        })
    }

    /// Whether the run may rank its candidates.
    pub fn agrees(&self) -> bool {
        self.within_noise && self.problem.is_none()
    }

    /// One line for a report's footer.
    pub fn line(&self, context: &str) -> String {
        let twin = if self.twin_added {
            format!("{} (timed for the control)", self.b)
        } else {
            self.b.clone()
        };
        let verdict = match (&self.problem, self.within_noise) {
            (Some(p), _) => format!("INVALID: {p}; this run cannot rank strategies"),
            (None, true) => format!("agree within ±{:.0}%", self.tolerance * 100.0),
            (None, false) => format!(
                "DISAGREE beyond ±{:.0}%: this run's own error is larger than that, so it cannot rank strategies that differ by less; run it again on a quieter machine",
                self.tolerance * 100.0
            ),
        };
        format!(
            "A/A control{context}: {} {:.2} vs {twin} {:.2} GB/s, ratio {:.3} (per-pass spread ±{:.1}%): {verdict}",
            self.a,
            self.a_gbps,
            self.b_gbps,
            self.ratio,
            self.noise * 100.0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_timings_agree_and_a_gap_does_not() {
        let s = [0.010, 0.011, 0.009, 0.010, 0.010];
        let c = AaControl::of("auto", &s, "nt", &s, 1 << 30, false).unwrap();
        assert_eq!((c.ratio, c.noise), (1.0, 0.0));
        assert!(c.agrees());
        let slow: Vec<f64> = s.iter().map(|t| t * 1.3).collect();
        let c = AaControl::of("auto", &slow, "nt", &s, 1 << 30, true).unwrap();
        assert!((c.ratio - 1.0 / 1.3).abs() < 1e-9);
        assert!(!c.agrees());
        assert!(c.line("").contains("DISAGREE"));
        assert!(AaControl::of("a", &[], "b", &[], 1, false).is_none());
    }

    #[test]
    fn a_noisy_run_widens_the_band() {
        let a = [1.0, 1.3, 0.8, 1.2, 0.9, 1.1];
        let b = [1.0; 6];
        let c = AaControl::of("auto", &a, "x", &b, 1 << 30, false).unwrap();
        assert!(c.tolerance > AA_TOLERANCE);
    }
}

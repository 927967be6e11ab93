//! Summary statistics for repeated measurements.

use serde::{Deserialize, Serialize};

/// Mean ± sample standard deviation, plus the median the tables rank by
/// (robust against one noisy neighbour run on a shared machine).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(from = "StatsRead")]
pub struct Stats {
    pub mean: f64,
    pub stdev: f64,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

/// Stats as read back: files written by hand or by older versions may lack
/// the median (then the mean stands for it) or the run count (then one);
/// a figure JSON could not hold (NaN, infinite: written as null) reads as
/// NaN, which readers take as no figure.
#[derive(Deserialize)]
struct StatsRead {
    mean: Option<f64>,
    stdev: Option<f64>,
    median: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    runs: Option<usize>,
}

impl From<StatsRead> for Stats {
    fn from(s: StatsRead) -> Self {
        let centre = s.median.or(s.mean).unwrap_or(f64::NAN);
        Stats {
            mean: s.mean.unwrap_or(centre),
            stdev: s.stdev.unwrap_or(f64::NAN),
            median: centre,
            min: s.min.unwrap_or(centre),
            max: s.max.unwrap_or(centre),
            runs: s.runs.unwrap_or(1),
        }
    }
}

impl Stats {
    /// Summarises `samples`; `None` when there are none.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        let n = samples.len();
        if n == 0 {
            return None;
        }
        let mean = samples.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Stats {
            mean,
            stdev: var.sqrt(),
            median,
            min: sorted[0],
            max: sorted[n - 1],
            runs: n,
        })
    }
}

/// A row whose stdev exceeds this share of its mean is noisy: the tables,
/// the plots (hollow markers) and the lab page all mark it by this one rule.
pub const NOISY_CV: f64 = 0.10;

/// GB/s with GB = 2^30 bytes, as `perf bench` prints.
pub fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / secs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_known_samples() {
        let s = Stats::of(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(s.mean, 2.5);
        assert_eq!(s.median, 2.5);
        assert!((s.stdev - 1.2909944).abs() < 1e-6);
        assert_eq!((s.min, s.max, s.runs), (1.0, 4.0, 4));
        assert_eq!(Stats::of(&[7.0]).unwrap().stdev, 0.0);
        assert!(Stats::of(&[]).is_none());
        assert_eq!(gbps(1 << 30, 0.5), 2.0);
    }
}

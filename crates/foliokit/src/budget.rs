//! Choosing the batch size from measured latency: relocation's batches,
//! the kernel path's `move_pages` batches, the lazy fill's background
//! batches. A mechanism: each caller says what it measures and feeds it
//! back.

use std::time::Duration;

/// Doubles the batch while its first-folio latency stays under half the
/// budget, halves it when a batch exceeds the budget: bigger batches buy
/// throughput with latency (seed 001's trade-off), and this keeps the
/// largest that fits the budget on this machine, adapting as load changes.
#[derive(Debug, Clone)]
pub struct BatchController {
    budget: Duration,
    pages: usize,
    min: usize,
    max: usize,
}

impl BatchController {
    /// Starts at `start` pages, kept within `min..=max` (`min` at least 1).
    pub fn new(budget: Duration, start: usize, min: usize, max: usize) -> Self {
        let min = min.max(1);
        BatchController {
            budget,
            pages: start.clamp(min, max.max(min)),
            min,
            max: max.max(min),
        }
    }

    /// The batch size to use next.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Feeds back the latency the budget bounds, measured on the batch
    /// just done (relocation: its first folio; a lazy fill: what a fault
    /// read during it waited for).
    pub fn observe(&mut self, first_folio: Duration) {
        if first_folio > self.budget {
            self.pages = (self.pages / 2).max(self.min);
        } else if first_folio * 2 < self.budget {
            self.pages = (self.pages * 2).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_under_budget_and_shrinks_over_it() {
        let ms = Duration::from_millis;
        let mut c = BatchController::new(ms(1), 512, 512, 8192);
        // Latency proportional to batch size: 0.1 ms per 512 pages.
        for _ in 0..10 {
            let lat = Duration::from_micros(100 * (c.pages() / 512) as u64);
            c.observe(lat);
        }
        // 4096 pages = 0.8 ms fits; 8192 = 1.6 ms would not.
        assert_eq!(c.pages(), 4096);
        c.observe(ms(5));
        assert_eq!(c.pages(), 2048);
        let mut c = BatchController::new(ms(1), 1 << 20, 512, 8192);
        assert_eq!(c.pages(), 8192);
        for _ in 0..20 {
            c.observe(ms(9));
        }
        assert_eq!(c.pages(), 512);
    }
}

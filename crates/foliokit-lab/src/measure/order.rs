//! The order candidates run in within each timed pass.
//!
//! A candidate inherits its predecessor's cache and write-combining state
//! (dirty lines to write back, a warm or flushed LLC), so a fixed rotation,
//! where every candidate always follows the same neighbour, biases the
//! ranking: the same code measured 0.71x or 1.28x itself depending on its
//! place in the list. A Williams design (a balanced Latin square) gives
//! every candidate every other candidate as its immediate predecessor
//! equally often: once over `n` passes for an even count, twice over `2n`
//! for an odd count (the square and its mirror). Passes are therefore
//! rounded up to whole designs, so the balance holds over every run.

use serde::Serialize;

/// The design a measurement ran: how many candidates, how many distinct
/// orders, and how many timed passes (each candidate once per pass).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Order {
    /// Always `"williams"`: balanced for immediate predecessors.
    pub design: &'static str,
    pub candidates: usize,
    /// Distinct orders in the design (`n`, or `2n` for odd `n`).
    pub orders: usize,
    /// Timed passes the caller asked for.
    pub loops_asked: usize,
    /// Timed passes run: `loops_asked` rounded up to whole designs.
    pub passes: usize,
}

impl Order {
    /// The design for `candidates` and at least `loops` timed passes.
    pub fn new(candidates: usize, loops: usize) -> Order {
        let orders = williams(candidates).len().max(1);
        Order {
            design: "williams",
            candidates,
            orders,
            loops_asked: loops,
            passes: loops.max(1).next_multiple_of(orders),
        }
    }

    /// The candidates in pass `pass`'s order.
    pub fn pass(&self, pass: usize) -> Vec<usize> {
        let rows = williams(self.candidates);
        rows.get(pass % rows.len().max(1))
            .cloned()
            .unwrap_or_default()
    }

    /// One line for a report's footer.
    pub fn line(&self) -> String {
        let runs = if self.passes == self.loops_asked {
            format!("{} passes", self.passes)
        } else {
            format!(
                "{} passes ({} asked, rounded up to whole designs)",
                self.passes, self.loops_asked
            )
        };
        format!(
            "order: {} candidates in a balanced (Williams) design of {} orders, {runs}: each candidate follows every other equally often",
            self.candidates, self.orders
        )
    }
}

/// The rows of a Williams design for `n` treatments: row 0 is
/// `0, 1, n-1, 2, n-2, …`, row `r` adds `r` (mod `n`); for odd `n` the
/// mirrored rows follow, since one square cannot balance an odd count.
pub fn williams(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return Vec::new();
    }
    let first: Vec<usize> = (0..n)
        .map(|j| {
            if j % 2 == 1 {
                j.div_ceil(2)
            } else {
                (n - j / 2) % n
            }
        })
        .collect();
    let mut rows: Vec<Vec<usize>> = (0..n)
        .map(|r| first.iter().map(|&c| (c + r) % n).collect())
        .collect();
    if n % 2 == 1 && n > 1 {
        let mirrored: Vec<Vec<usize>> = rows
            .iter()
            .map(|row| row.iter().rev().copied().collect())
            .collect();
        rows.extend(mirrored);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How often each ordered pair (predecessor, candidate) occurs within
    /// the passes of a run.
    fn pair_counts(passes: &[Vec<usize>], n: usize) -> Vec<Vec<usize>> {
        let mut m = vec![vec![0; n]; n];
        for p in passes {
            for w in p.windows(2) {
                m[w[0]][w[1]] += 1;
            }
        }
        m
    }

    /// Every candidate has every other as predecessor equally often.
    fn balanced(passes: &[Vec<usize>], n: usize) -> bool {
        let m = pair_counts(passes, n);
        let want = m[0].get(1).copied().unwrap_or(0);
        (0..n).all(|a| (0..n).all(|b| a == b || m[a][b] == want))
    }

    #[test]
    fn every_pass_runs_every_candidate_once() {
        for n in 1..=17 {
            for row in williams(n) {
                let mut s = row.clone();
                s.sort_unstable();
                assert_eq!(s, (0..n).collect::<Vec<_>>(), "n={n}");
            }
        }
    }

    #[test]
    fn predecessors_are_balanced_over_a_run() {
        for n in 2..=17 {
            for loops in [1, 5, 12, 40] {
                let o = Order::new(n, loops);
                assert!(o.passes >= loops && o.passes % o.orders == 0);
                let passes: Vec<Vec<usize>> = (0..o.passes).map(|p| o.pass(p)).collect();
                assert!(balanced(&passes, n), "n={n} loops={loops}");
            }
        }
    }

    #[test]
    fn the_cyclic_rotation_fails_the_same_count() {
        // What the measurement used to do: pass l runs (l + k) % n.
        for n in 3..=12 {
            let passes: Vec<Vec<usize>> = (0..2 * n)
                .map(|l| (0..n).map(|k| (l + k) % n).collect())
                .collect();
            assert!(!balanced(&passes, n), "n={n}");
            // Every candidate always follows the same neighbour.
            let m = pair_counts(&passes, n);
            assert_eq!(m[0][1], 2 * n - 2);
            assert_eq!(m[1][0], 0);
        }
    }

    #[test]
    fn the_design_is_named_in_one_line() {
        let o = Order::new(3, 5);
        assert_eq!((o.orders, o.passes), (6, 6));
        assert!(o.line().contains("6 passes (5 asked"));
        assert_eq!(Order::new(1, 5).passes, 5);
    }
}

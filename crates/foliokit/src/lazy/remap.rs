//! Where pages are now, after the application moved some with mremap.
//!
//! The fill keeps its state by original address; a REMAP event moves
//! `[from, from + len)` to `to`. Rare for guest RAM, so a list walked in
//! order is enough.

#[derive(Debug, Default)]
pub struct Remaps(Vec<(usize, usize, usize)>);

impl Remaps {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn push(&mut self, from: usize, to: usize, len: usize) {
        self.0.push((from, to, len));
    }

    /// Where the page originally at `a` is now.
    pub fn now(&self, mut a: usize) -> usize {
        for &(from, to, len) in &self.0 {
            if a >= from && a < from + len {
                a = a - from + to;
            }
        }
        a
    }

    /// The original address of the page now at `a`; `None` where a move
    /// vacated `a` and nothing of ours moved there since (the old range
    /// of an mremap: its UNMAP event, or a touch of what MREMAP_DONTUNMAP
    /// left, concerns no page of ours).
    pub fn original(&self, mut a: usize) -> Option<usize> {
        for &(from, to, len) in self.0.iter().rev() {
            if a >= to && a < to + len {
                a = a - to + from;
            } else if a >= from && a < from + len {
                return None;
            }
        }
        Some(a)
    }

    /// Where the original range `[start, start + len)` is now, in pieces.
    pub fn image(&self, start: usize, len: usize) -> Vec<(usize, usize)> {
        let mut parts = vec![(start, len)];
        for &(from, to, l) in &self.0 {
            let mut next = Vec::with_capacity(parts.len() + 2);
            for (s, n) in parts {
                let (e, fe) = (s + n, from + l);
                let (lo, hi) = (s.max(from), e.min(fe));
                if lo >= hi {
                    next.push((s, n));
                    continue;
                }
                if s < lo {
                    next.push((s, lo - s));
                }
                next.push((lo - from + to, hi - lo));
                if hi < e {
                    next.push((hi, e - hi));
                }
            }
            parts = next;
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_there_and_back() {
        let mut r = Remaps::default();
        r.push(0x1000, 0x9000, 0x2000);
        assert_eq!(r.now(0x1000), 0x9000);
        assert_eq!(r.now(0x2fff), 0xafff);
        assert_eq!(r.now(0x3000), 0x3000);
        assert_eq!(r.original(0x9000), Some(0x1000));
        // Vacated by the move: no page of ours is there.
        assert_eq!(r.original(0x1000), None);
        assert_eq!(r.original(0x3000), Some(0x3000));
        assert_eq!(
            r.image(0, 0x4000),
            vec![(0, 0x1000), (0x9000, 0x2000), (0x3000, 0x1000)]
        );
        r.push(0x9000, 0x20000, 0x1000);
        assert_eq!(r.now(0x1000), 0x20000);
        assert_eq!(r.original(0x20000), Some(0x1000));
        assert_eq!(r.original(0x9000), None);
        // Moved back where it came from: ours again.
        r.push(0x20000, 0x1000, 0x1000);
        assert_eq!(r.original(0x1000), Some(0x1000));
        assert_eq!(r.original(0x20000), None);
    }
}

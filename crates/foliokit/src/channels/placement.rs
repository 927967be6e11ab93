//! Where the pieces of a batch go: a pure function of the batch's shape and
//! its folios' addresses, kept apart from handing the pieces to channels.
//!
//! With at least as many folios as channels, each channel gets a contiguous
//! share of the folios (channel `c` folios `c*n/ch .. (c+1)*n/ch`), so it
//! streams through memory instead of hopping from folio to folio. Its first
//! folio is a piece of its own: the batch's first folio then completes at
//! its true time (the earliest folio to finish is some channel's first).
//! The rest of the share goes in as few pieces as the memory allows: folios
//! adjacent in both source and destination are merged into runs of up to
//! [`Shape::piece_bytes`]. With fewer folios than channels, each folio is
//! split so every channel gets work, whole pages per piece where possible.
//!
//! Channels that claim pieces are offered the others' shares too, after
//! their own (from the far end), so one whose CPU is busy elsewhere holds
//! the batch up by one piece at most; a caller that runs pieces itself
//! takes the claimable ones from the batch's end, where channels take last.

/// What placement needs to know of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    /// Folios in the batch.
    pub(super) folios: usize,
    /// Bytes per folio (not 0).
    pub(super) folio_size: usize,
    /// Channels to spread it across (not 0).
    pub(super) channels: usize,
    /// The most bytes a run of adjacent folios is merged into.
    pub(super) piece_bytes: usize,
    /// The page size: split folios are cut at whole pages where possible.
    pub(super) page: usize,
}

/// One piece as placed: whose share it is and what of the batch it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placed {
    /// The channel whose share the piece is.
    pub(super) channel: usize,
    /// Its (first) folio.
    pub(super) folio: usize,
    /// Folios it covers whole from `folio` on (1 for a folio or a part).
    pub(super) folios: usize,
    /// Where it starts within folio `folio`.
    pub(super) offset: usize,
    /// Its bytes.
    pub(super) len: usize,
}

/// A batch's pieces, by number (the order they were placed in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Placement {
    /// Every piece, by number.
    pub(super) pieces: Vec<Placed>,
    /// How many pieces finish each folio (every folio has as many).
    pub(super) per_folio: usize,
}

/// Places a batch of `s.folios` folios. `at(f)` is folio `f`'s destination
/// and source address (source 0: a clear, which reads none); it decides
/// only which folios merge.
pub(super) fn place(s: Shape, at: impl Fn(usize) -> (usize, usize)) -> Placement {
    let (n, ch) = (s.folios, s.channels.max(1));
    if n == 0 {
        return Placement {
            pieces: Vec::new(),
            per_folio: 1,
        };
    }
    if n >= ch {
        shares(s, ch, at)
    } else {
        split(s, ch)
    }
}

/// Whole folios in contiguous shares, adjacent ones merged after each
/// share's first.
fn shares(s: Shape, ch: usize, at: impl Fn(usize) -> (usize, usize)) -> Placement {
    let (n, size) = (s.folios, s.folio_size);
    let most = (s.piece_bytes / size).max(1);
    let mut pieces = Vec::new();
    for c in 0..ch {
        let (lo, hi) = (c * n / ch, (c + 1) * n / ch);
        let mut f = lo;
        while f < hi {
            let (dst, src) = at(f);
            let mut end = f + 1;
            if f != lo {
                while end < hi && end - f < most {
                    let (d, sr) = at(end);
                    let step = (end - f) * size;
                    let adjacent = d == dst.wrapping_add(step)
                        && (src == 0 && sr == 0 || src != 0 && sr == src.wrapping_add(step));
                    if !adjacent {
                        break;
                    }
                    end += 1;
                }
            }
            pieces.push(Placed {
                channel: c,
                folio: f,
                folios: end - f,
                offset: 0,
                len: (end - f) * size,
            });
            f = end;
        }
    }
    Placement {
        pieces,
        per_folio: 1,
    }
}

/// Fewer folios than channels: each folio cut into about `ch / n` pieces
/// of whole pages, dealt to the channels in turn.
fn split(s: Shape, ch: usize) -> Placement {
    let (n, size) = (s.folios, s.folio_size);
    let parts = ch.div_ceil(n);
    let piece = size
        .div_ceil(parts)
        .checked_next_multiple_of(s.page.max(1))
        .unwrap_or(size)
        .min(size);
    let per_folio = size.div_ceil(piece);
    let pieces = (0..n * per_folio)
        .map(|k| {
            let offset = (k % per_folio) * piece;
            Placed {
                channel: k % ch,
                folio: k / per_folio,
                folios: 1,
                offset,
                len: piece.min(size - offset),
            }
        })
        .collect();
    Placement { pieces, per_folio }
}

impl Placement {
    /// Each of `channels` channels' own pieces, in order, by number.
    pub(super) fn shares(&self, channels: usize) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); channels];
        for (seq, p) in self.pieces.iter().enumerate() {
            out[p.channel].push(seq);
        }
        out
    }

    /// What each channel is offered, by piece number: its own share, then,
    /// for a channel that claims pieces (`claims[c]`), the shares of the
    /// other claiming channels, each from its far end.
    pub(super) fn offers(&self, claims: &[bool]) -> Vec<Vec<usize>> {
        let own = self.shares(claims.len());
        (0..claims.len())
            .map(|c| {
                let mut list = own[c].clone();
                if claims[c] {
                    for o in (0..claims.len()).filter(|&o| o != c && claims[o]) {
                        list.extend(own[o].iter().rev());
                    }
                }
                list
            })
            .collect()
    }

    /// The pieces a caller may run itself, by number, in the order it takes
    /// them: those of channels that claim pieces (a channel that does not
    /// may run any piece it was given, so nobody else may), from the
    /// batch's end, where the channels take last.
    pub(super) fn for_caller(&self, claims: &[bool]) -> Vec<usize> {
        (0..self.pieces.len())
            .rev()
            .filter(|&seq| claims[self.pieces[seq].channel])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    fn shape(folios: usize, folio_size: usize, channels: usize, piece_bytes: usize) -> Shape {
        Shape {
            folios,
            folio_size,
            channels,
            piece_bytes,
            page: PAGE,
        }
    }

    /// Folio `f` at `f * size` in both ranges (source from `src`, 0 for a
    /// clear): every folio adjacent to the one before it.
    fn contiguous(size: usize, src: usize) -> impl Fn(usize) -> (usize, usize) {
        move |f| {
            (
                (1 << 40) | (f * size),
                if src == 0 { 0 } else { src + f * size },
            )
        }
    }

    /// Every byte of every folio is in exactly one piece, and pieces stay
    /// inside their folios.
    fn covers_once(p: &Placement, s: Shape) {
        let mut seen = vec![0u8; s.folios * s.folio_size];
        for q in &p.pieces {
            assert!(q.channel < s.channels);
            let start = q.folio * s.folio_size + q.offset;
            if p.per_folio == 1 {
                // Whole folios: a piece is its folios' bytes.
                assert_eq!((q.offset, q.len), (0, q.folios * s.folio_size));
            } else {
                assert!(q.folios == 1 && q.len > 0);
            }
            assert!(q.offset + q.len <= q.folios * s.folio_size);
            for b in &mut seen[start..start + q.len] {
                *b += 1;
            }
        }
        assert!(seen.iter().all(|&b| b == 1), "{s:?}: not covered once");
        // Each folio is finished by `per_folio` pieces.
        for f in 0..s.folios {
            let touching = p
                .pieces
                .iter()
                .filter(|q| (q.folio..q.folio + q.folios).contains(&f))
                .count();
            assert_eq!(touching, p.per_folio, "{s:?}: folio {f}");
        }
    }

    #[test]
    fn an_empty_batch_has_no_pieces() {
        let p = place(shape(0, PAGE, 4, 1 << 20), |_| unreachable!());
        assert!(p.pieces.is_empty());
    }

    #[test]
    fn scattered_folios_are_one_piece_each_in_contiguous_shares() {
        let s = shape(10, 2 << 20, 3, 4 << 20);
        // Every other folio: nothing is adjacent.
        let p = place(s, |f| {
            (2 * f * (2 << 20) + (1 << 40), 2 * f * (2 << 20) + (1 << 41))
        });
        covers_once(&p, s);
        assert_eq!(p.pieces.len(), 10);
        let channels: Vec<usize> = p.pieces.iter().map(|q| q.channel).collect();
        // Channel c gets folios c*10/3 .. (c+1)*10/3: 0..3, 3..6, 6..10.
        assert_eq!(channels, [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]);
        assert!(p.pieces.iter().enumerate().all(|(i, q)| q.folio == i));
    }

    #[test]
    fn adjacent_folios_merge_after_each_shares_first_up_to_the_piece_bytes() {
        let size = 64 << 10;
        let s = shape(12, size, 2, 4 * size);
        let p = place(s, contiguous(size, 1 << 41));
        covers_once(&p, s);
        let runs: Vec<(usize, usize, usize)> = p
            .pieces
            .iter()
            .map(|q| (q.channel, q.folio, q.folios))
            .collect();
        // Share 0..6: its first alone, then runs of at most 4; likewise 6..12.
        assert_eq!(
            runs,
            [
                (0, 0, 1),
                (0, 1, 4),
                (0, 5, 1),
                (1, 6, 1),
                (1, 7, 4),
                (1, 11, 1)
            ]
        );
        // A piece's bytes are its folios'.
        assert!(p.pieces.iter().all(|q| q.len == q.folios * size));
    }

    #[test]
    fn a_gap_in_either_range_ends_a_run() {
        let size = PAGE;
        let s = shape(6, size, 1, 1 << 20);
        // Destinations contiguous; the source jumps before folio 3.
        let p = place(s, |f| {
            let src = (1 << 41) + f * size + if f >= 3 { size } else { 0 };
            ((1 << 40) + f * size, src)
        });
        covers_once(&p, s);
        let runs: Vec<(usize, usize)> = p.pieces.iter().map(|q| (q.folio, q.folios)).collect();
        assert_eq!(runs, [(0, 1), (1, 2), (3, 3)]);
        // The destination jumps instead.
        let p = place(s, |f| {
            ((1 << 40) + f * size + if f >= 4 { size } else { 0 }, 0)
        });
        let runs: Vec<(usize, usize)> = p.pieces.iter().map(|q| (q.folio, q.folios)).collect();
        assert_eq!(runs, [(0, 1), (1, 3), (4, 2)]);
    }

    #[test]
    fn clears_merge_on_their_destinations_alone() {
        let size = PAGE;
        let s = shape(5, size, 1, 1 << 20);
        let p = place(s, contiguous(size, 0));
        let runs: Vec<(usize, usize)> = p.pieces.iter().map(|q| (q.folio, q.folios)).collect();
        assert_eq!(runs, [(0, 1), (1, 4)]);
    }

    #[test]
    fn a_smaller_piece_size_cuts_runs_shorter() {
        let size = 2 << 20;
        let s = shape(8, size, 1, 2 << 20);
        let p = place(s, contiguous(size, 1 << 42));
        covers_once(&p, s);
        // One folio per piece: the piece size is one folio.
        assert_eq!(p.pieces.len(), 8);
        // Below one folio still makes whole folios.
        let p = place(shape(8, size, 1, PAGE), contiguous(size, 1 << 42));
        assert_eq!(p.pieces.len(), 8);
    }

    #[test]
    fn fewer_folios_than_channels_split_each_folio_into_whole_pages() {
        let size = 2 << 20;
        let s = shape(1, size, 4, 4 << 20);
        let p = place(s, contiguous(size, 1 << 41));
        covers_once(&p, s);
        assert_eq!(p.per_folio, 4);
        let got: Vec<(usize, usize, usize)> = p
            .pieces
            .iter()
            .map(|q| (q.channel, q.offset, q.len))
            .collect();
        let q = size / 4;
        assert_eq!(got, [(0, 0, q), (1, q, q), (2, 2 * q, q), (3, 3 * q, q)]);
        // Two folios, three channels: two pieces each, dealt in turn.
        let s = shape(2, 3 * PAGE, 3, 4 << 20);
        let p = place(s, contiguous(3 * PAGE, 1 << 41));
        covers_once(&p, s);
        let got: Vec<(usize, usize, usize, usize)> = p
            .pieces
            .iter()
            .map(|q| (q.channel, q.folio, q.offset, q.len))
            .collect();
        assert_eq!(
            got,
            [
                (0, 0, 0, 2 * PAGE),
                (1, 0, 2 * PAGE, PAGE),
                (2, 1, 0, 2 * PAGE),
                (0, 1, 2 * PAGE, PAGE),
            ]
        );
    }

    #[test]
    fn a_folio_under_a_page_is_not_split() {
        let s = shape(1, 100, 4, 4 << 20);
        let p = place(s, contiguous(100, 1 << 41));
        covers_once(&p, s);
        assert_eq!(p.pieces.len(), 1);
    }

    #[test]
    fn every_shape_covers_each_byte_once() {
        for folios in 1..=9 {
            for channels in 1..=5 {
                for size in [100, PAGE, 3 * PAGE, 5 * PAGE + 7] {
                    for piece_bytes in [1, 2 * size, 1 << 20] {
                        let s = shape(folios, size, channels, piece_bytes);
                        covers_once(&place(s, contiguous(size, 1 << 41)), s);
                        covers_once(&place(s, contiguous(size, 0)), s);
                    }
                }
            }
        }
    }

    #[test]
    fn claiming_channels_are_offered_the_others_shares_from_the_far_end() {
        let s = shape(6, PAGE, 3, PAGE);
        let p = place(s, |f| (f * 2 * PAGE + (1 << 40), 0));
        // Shares: 0: [0, 1], 1: [2, 3], 2: [4, 5].
        assert_eq!(p.shares(3), [vec![0, 1], vec![2, 3], vec![4, 5]]);
        let offers = p.offers(&[true, false, true]);
        assert_eq!(offers[0], [0, 1, 5, 4]);
        // A channel that does not claim runs its own share only, and its
        // pieces are offered to nobody else.
        assert_eq!(offers[1], [2, 3]);
        assert_eq!(offers[2], [4, 5, 1, 0]);
    }

    #[test]
    fn a_caller_takes_claimable_pieces_from_the_batch_end() {
        let s = shape(6, PAGE, 3, PAGE);
        let p = place(s, |f| (f * 2 * PAGE + (1 << 40), 0));
        assert_eq!(p.for_caller(&[true, false, true]), [5, 4, 1, 0]);
        assert_eq!(p.for_caller(&[false; 3]), Vec::<usize>::new());
    }
}

//! The seeds' published figures, kept once in `seeds.json` (beside this
//! crate's Cargo.toml) and read at first use: each figure with its seed,
//! what it measures, the machine, its unit and its value as the posting
//! prints it. The lines quoted under each table, the summary's lines and
//! the plots' reference marks name figures as `{id}` and are expanded
//! here, so a figure cannot be corrected in one place and stale in another.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// One published figure.
#[derive(Debug, Clone, Deserialize)]
pub struct Figure {
    /// `000.copy.bulk`: the seed, then what it is.
    pub id: String,
    /// "000" .. "004".
    pub seed: String,
    pub measures: String,
    pub machine: String,
    /// GB/s, ms, s, µs, x (a ratio) or % (a change).
    pub unit: String,
    /// As printed in the posting (its precision is kept: "7.20").
    pub value: String,
}

impl Figure {
    /// The value as a number (a leading `+` is allowed).
    pub fn number(&self) -> f64 {
        self.value
            .trim_start_matches('+')
            .parse()
            .unwrap_or_else(|_| panic!("seeds.json: figure {} is not a number", self.id))
    }
}

/// A summary line's seed side: which figure it sets ours against.
#[derive(Debug, Clone, Deserialize)]
pub struct SummaryFigure {
    /// The summary line it belongs to (copy, zen3, clear, init, migrate, mremap).
    pub key: String,
    pub seed: String,
    pub what: String,
    /// The seed's figure as a sentence, with `{id}` placeholders.
    pub figure: String,
    /// The id of the seed's ratio (after over before, better = above 1).
    pub ratio: String,
}

/// A reference mark on a plot.
#[derive(Debug, Clone, Deserialize)]
struct MarkData {
    figure: String,
    label: String,
}

#[derive(Debug, Deserialize)]
struct SeedData {
    figures: Vec<Figure>,
    quotes: BTreeMap<String, String>,
    summary: Vec<SummaryFigure>,
    marks: BTreeMap<String, Vec<MarkData>>,
}

fn data() -> &'static SeedData {
    static DATA: OnceLock<SeedData> = OnceLock::new();
    // The file is part of the source: a mistake in it is a build-time bug,
    // caught by this module's tests, not a runtime condition.
    DATA.get_or_init(|| {
        serde_json::from_str(include_str!("../seeds.json")).expect("seeds.json parses")
    })
}

/// Every figure.
pub fn figures() -> &'static [Figure] {
    &data().figures
}

/// The figure `id`. Panics on an unknown id (a typo in the code, caught by
/// the tests that expand every template).
pub fn figure(id: &str) -> &'static Figure {
    figures()
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("seeds.json has no figure {id}"))
}

/// `text` with every `{id}` replaced by that figure's value.
pub fn expand(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .map(|c| open + c)
            .unwrap_or_else(|| panic!("seeds.json: unclosed '{{' in {text}"));
        out += &rest[..open];
        out += &figure(&rest[open + 1..close]).value;
        rest = &rest[close + 1..];
    }
    out + rest
}

/// The line quoted under experiment `key`'s table (copy, clear, fault,
/// init, migrate.move_pages, migrate.channels, mremap).
pub fn quote(key: &str) -> String {
    expand(
        data()
            .quotes
            .get(key)
            .unwrap_or_else(|| panic!("seeds.json has no quote {key}")),
    )
}

/// The summary's seed side for line `key`.
pub fn summary(key: &str) -> &'static SummaryFigure {
    data()
        .summary
        .iter()
        .find(|s| s.key == key)
        .unwrap_or_else(|| panic!("seeds.json has no summary line {key}"))
}

/// The reference marks for plot `key`: value and label.
pub fn marks(key: &str) -> Vec<(f64, String)> {
    data().marks.get(key).map_or_else(Vec::new, |m| {
        m.iter()
            .map(|m| (figure(&m.figure).number(), expand(&m.label)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_names_known_figures() {
        for f in figures() {
            assert!(f.number().is_finite(), "{}", f.id);
            assert!(["000", "001", "002", "003", "004"].contains(&f.seed.as_str()));
            assert!(f.id.starts_with(&f.seed), "{}", f.id);
        }
        for k in data().quotes.keys() {
            assert!(!quote(k).contains('{'), "{k}");
        }
        for s in &data().summary {
            assert!(!expand(&s.figure).contains('{'));
            assert!(figure(&s.ratio).unit == "x", "{}", s.ratio);
        }
        for k in data().marks.keys() {
            assert!(!marks(k).is_empty());
        }
        let ids: std::collections::BTreeSet<_> = figures().iter().map(|f| &f.id).collect();
        assert_eq!(ids.len(), figures().len(), "figure ids are unique");
    }

    #[test]
    fn quotes_read_as_the_seeds_print_them() {
        assert_eq!(
            quote("mremap"),
            "seed 004 (Apple M3, arm64): 64K folios 1.9 s -> 1.2 s per 10,000 iterations with PTE batching (-37%)"
        );
        assert_eq!(figure("000.move.dram.before").value, "7.20");
        assert_eq!(
            marks("copy")[1],
            (38.03, "seed 000 (Zen 5), 2M one bulk copy: 38.03".into())
        );
    }
}

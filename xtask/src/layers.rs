//! `cargo xtask layers`: the top-level modules of a crate import each
//! other in no loop. A module is a file or directory directly under
//! `src/`; it imports another when its code (comments left out) names
//! `crate::other`, directly or inside `crate::{...}`. A loop (a pair that
//! names each other, or a longer ring) means one of them belongs lower, or
//! the piece they share belongs in a module all of them can use.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::Error;

/// The crates checked.
const CRATES: &[&str] = &[
    "crates/foliokit",
    "crates/foliokit-lab",
    "crates/foliokit-cli",
    "crates/foliokit-capi",
    "crates/foliokit-vm-memory",
    "crates/foliokit-guest",
    "xtask",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            rust_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// The text without `//` comments (doc comments name modules in links).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.split_once("//").map_or(l, |(c, _)| c))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module names `text` refers to as `crate::name` or in
/// `crate::{name, ...}`.
pub fn referenced(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let before = text[..i].chars().last();
        // `$crate::` and `foliokit_crate::` are not this crate's paths.
        if before.is_some_and(|c| c == '$' || c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            for part in group.split(',') {
                out.insert(ident(part.trim()));
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.remove("");
    out
}

/// The import graph of the crate at `dir`: module -> the modules it names.
fn imports(dir: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, Error> {
    let src = dir.join("src");
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for e in std::fs::read_dir(&src)? {
        let p = e?.path();
        let stem = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        if p.is_dir() {
            let mut files = Vec::new();
            rust_files(&p, &mut files)?;
            modules.entry(stem).or_default().extend(files);
        } else if p.extension().is_some_and(|x| x == "rs") && stem != "lib" && stem != "main" {
            modules.entry(stem).or_default().push(p);
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, files) in &modules {
        let out = graph.entry(m.clone()).or_default();
        for f in files {
            let text = code(&std::fs::read_to_string(f)?);
            for r in referenced(&text) {
                if &r != m && modules.contains_key(&r) {
                    out.insert(r);
                }
            }
        }
    }
    Ok(graph)
}

/// Every loop of imports in `graph`, as the sorted modules of each
/// strongly connected component with more than one module: a pair that
/// names each other, or a longer ring (a -> b -> c -> a), which layers
/// no better than a pair does.
pub fn loops(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for n in graph.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in graph.keys() {
        if done.contains(m) {
            continue;
        }
        // m's component: m and every module that m reaches and that reaches m.
        let ring: Vec<String> = std::iter::once(m.clone())
            .chain(
                reached[m]
                    .iter()
                    .filter(|n| *n != m && reached[n].contains(m))
                    .cloned(),
            )
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        done.extend(ring.iter().cloned());
        if ring.len() > 1 {
            out.push(ring);
        }
    }
    out
}

pub fn layers(root: &Path) -> Result<bool, Error> {
    let mut ok = true;
    for c in CRATES {
        let rings = loops(&imports(&root.join(c))?);
        for ring in &rings {
            println!("{c}: a loop of imports among {}", ring.join(", "));
        }
        ok &= rings.is_empty();
    }
    if ok {
        println!(
            "layers: no loop of imports among the modules of a crate ({} crates)",
            CRATES.len()
        );
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_plain_grouped_and_skips_comments_and_macros() {
        let t = code(
            "use crate::a::X;\nuse crate::{b, c::Y};\n// crate::d\nlet x = $crate::e::f;\nfoo_crate::g",
        );
        let r: Vec<String> = referenced(&t).into_iter().collect();
        assert_eq!(r, ["a", "b", "c"]);
    }

    #[test]
    fn finds_pairs_and_longer_rings_but_not_layers() {
        let g = |edges: &[(&str, &str)]| {
            let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in edges {
                g.entry(a.to_string()).or_default().insert(b.to_string());
                g.entry(b.to_string()).or_default();
            }
            g
        };
        assert!(loops(&g(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
        assert_eq!(
            loops(&g(&[("a", "b"), ("b", "a"), ("c", "a")])),
            [["a", "b"]]
        );
        assert_eq!(
            loops(&g(&[("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")])),
            [["a", "b", "c"]]
        );
    }
}

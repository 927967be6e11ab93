//! `cargo xtask layers`: no two top-level modules of a crate import each
//! other. A module is a file or directory directly under `src/`; it
//! imports another when its code (comments left out) names
//! `crate::other`, directly or inside `crate::{...}`. A pair that names
//! each other is a cycle: one of them belongs lower, or the piece they
//! share belongs in a third module both can use.

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

/// Pairs of modules of the crate at `dir` that import each other.
pub fn cycles(dir: &Path) -> Result<Vec<(String, String)>, Error> {
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
    let mut edges = BTreeSet::new();
    for (m, files) in &modules {
        for f in files {
            let text = code(&std::fs::read_to_string(f)?);
            for r in referenced(&text) {
                if &r != m && modules.contains_key(&r) {
                    edges.insert((m.clone(), r));
                }
            }
        }
    }
    Ok(edges
        .iter()
        .filter(|(a, b)| a < b && edges.contains(&(b.clone(), a.clone())))
        .cloned()
        .collect())
}

pub fn layers(root: &Path) -> Result<bool, Error> {
    let mut ok = true;
    for c in CRATES {
        let pairs = cycles(&root.join(c))?;
        for (a, b) in &pairs {
            println!("{c}: `{a}` and `{b}` import each other");
        }
        ok &= pairs.is_empty();
    }
    if ok {
        println!(
            "layers: no two modules of a crate import each other ({} crates)",
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
}

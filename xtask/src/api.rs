//! `cargo xtask public-api [--bless]`: the foliokit crate's public items,
//! as rustdoc lists them (`target/doc/foliokit/all.html`), against the
//! committed list `crates/foliokit/public-api.txt`. Any difference fails
//! until the list is blessed in the same change, so a change to the
//! surface adopters build on is always deliberate and reviewed.

use std::path::Path;
use std::process::Command;

use crate::{run, Error};

const LIST: &str = "crates/foliokit/public-api.txt";

/// The item paths in an `all.html` page, sorted (`copy::copy_folios`).
pub fn items(all_html: &str) -> Vec<String> {
    let mut out: Vec<String> = all_html
        .split("<li><a href=\"")
        .skip(1)
        .filter_map(|rest| {
            let (href, rest) = rest.split_once("\">")?;
            // Section links of the sidebar (`#structs`) are not items.
            if href.starts_with('#') {
                return None;
            }
            let (name, _) = rest.split_once("</a></li>")?;
            // The kind is in the file name (`fn.copy.html`): keep it, so a
            // function that becomes a macro of the same name is a change.
            let kind = href.rsplit('/').next()?.split('.').next()?;
            Some(format!("{kind} {name}"))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Builds the docs, compares, and with `bless` rewrites the list.
pub fn public_api(root: &Path, bless: bool) -> Result<bool, Error> {
    run(Command::new(env!("CARGO"))
        .args(["doc", "-p", "foliokit", "--no-deps", "--locked"])
        .current_dir(root))?;
    // Where cargo put the docs: CARGO_TARGET_DIR when set (relative to
    // the workspace, as cargo resolves it from there), else `target/`.
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |d| root.join(d));
    let page = target.join("doc/foliokit/all.html");
    let html = std::fs::read_to_string(&page).map_err(|e| format!("{}: {e}", page.display()))?;
    let now = items(&html);
    let list = root.join(LIST);
    if bless {
        std::fs::write(&list, now.join("\n") + "\n")?;
        println!("public-api: wrote {} items to {LIST}", now.len());
        return Ok(true);
    }
    let kept = std::fs::read_to_string(&list).unwrap_or_default();
    let kept: Vec<&str> = kept.lines().filter(|l| !l.is_empty()).collect();
    let added: Vec<&String> = now.iter().filter(|i| !kept.contains(&i.as_str())).collect();
    let removed: Vec<&&str> = kept
        .iter()
        .filter(|i| !now.contains(&i.to_string()))
        .collect();
    for i in &added {
        println!("+ {i}");
    }
    for i in &removed {
        println!("- {i}");
    }
    if added.is_empty() && removed.is_empty() {
        println!("public-api: {} items, as listed in {LIST}", now.len());
        Ok(true)
    } else {
        println!(
            "public-api: {} added, {} removed against {LIST}: if the change is meant, \
             run `cargo xtask public-api --bless` and commit the list with it",
            added.len(),
            removed.len()
        );
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_items_with_their_kind() {
        let html = r##"<li><a href="#structs" title="Structs">Structs</a></li><ul><li><a href="copy/fn.copy_folios.html">copy::copy_folios</a></li><li><a href="struct.Region.html">Region</a></li></ul>"##;
        assert_eq!(items(html), ["fn copy::copy_folios", "struct Region"]);
    }
}

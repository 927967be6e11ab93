//! `include/foliokit.h` is written by hand, for its documentation; this
//! test keeps it a true view of the library: the functions the sources
//! export, the structs they mirror (with their fields, in order) and the
//! constants they define are exactly those the header declares, so none can
//! be added to one side and forgotten on the other. It reads both as text
//! (no compiler, no build of the library); `.ci/run` also compares the
//! header with the symbols the built libfoliokit.so exports, and
//! `header_layout_matches_rust` compiles the header to compare offsets.

use std::collections::BTreeMap;
use std::path::Path;

const HEADER: &str = include_str!("../include/foliokit.h");

/// What one side declares: functions, structs with their fields (empty for
/// an opaque struct), and integer constants.
#[derive(Debug, Default, PartialEq)]
struct Api {
    functions: Vec<String>,
    structs: BTreeMap<String, Vec<String>>,
    constants: BTreeMap<String, u64>,
}

/// `text` without its `/* */` and `//` comments.
fn strip_c_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out += &rest[..i];
        rest = rest[i + 2..]
            .split_once("*/")
            .map_or("", |(_, after)| after);
        out.push(' ');
    }
    out += rest;
    out.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every identifier in `text` that starts with `prefix`, with the text
/// before it and after it.
fn idents<'a>(text: &'a str, prefix: &str) -> Vec<(&'a str, &'a str, &'a str)> {
    text.match_indices(prefix)
        .filter(|&(i, _)| !text[..i].ends_with(is_ident))
        .map(|(i, _)| {
            let end = text[i..]
                .find(|c| !is_ident(c))
                .map_or(text.len(), |n| i + n);
            (&text[..i], &text[i..end], &text[end..])
        })
        .collect()
}

fn number(s: &str) -> Option<u64> {
    s.trim().trim_end_matches(['u', 'U']).parse().ok()
}

fn header_api(header: &str) -> Api {
    let code = strip_c_comments(header);
    let mut api = Api::default();
    for (before, name, after) in idents(&code, "fk_") {
        if after.trim_start().starts_with('(') {
            api.functions.push(name.to_string());
        }
        let before = before.trim_end();
        if !before.ends_with("struct") || before[..before.len() - 6].ends_with(is_ident) {
            continue;
        }
        let fields = match after.trim_start().strip_prefix('{') {
            Some(body) => body
                .split('}')
                .next()
                .unwrap()
                .split(';')
                .filter_map(|decl| decl.rsplit(|c| !is_ident(c)).find(|w| !w.is_empty()))
                .map(str::to_string)
                .collect(),
            None => Vec::new(),
        };
        // Declared once with its body, named elsewhere without.
        let known = api.structs.entry(name.to_string()).or_default();
        if known.is_empty() {
            *known = fields;
        }
    }
    // `#define FK_X 1u` and enum members `FK_X = 1`.
    for (before, name, after) in idents(&code, "FK_") {
        let value = if before.trim_end().ends_with("#define") {
            after.lines().next()
        } else {
            after.trim_start().strip_prefix('=')
        };
        let value = value.and_then(|v| number(v.split([',', '}', '\n']).next().unwrap()));
        // The version macros are build.rs's to check (against the crate).
        if let (Some(v), false) = (value, name.starts_with("FK_VERSION")) {
            api.constants.insert(name.to_string(), v);
        }
    }
    api.functions.sort();
    api.functions.dedup();
    api
}

/// `FkMigrateOpts` -> `fk_migrate_opts`.
fn snake(camel: &str) -> String {
    let mut s = String::new();
    for c in camel.chars() {
        if c.is_ascii_uppercase() && !s.is_empty() {
            s.push('_');
        }
        s.push(c.to_ascii_lowercase());
    }
    s
}

/// The Rust side, from the crate's sources: `#[no_mangle] extern "C" fn
/// fk_*`, `pub struct Fk*` (fields of a struct of the crate without the
/// prefix spelled out in place, as C declares them; `size` first for one
/// declared by `extensible!`), and `const FK_*`.
fn rust_api(files: &[(String, String)]) -> (Api, Vec<String>) {
    let mut api = Api::default();
    let mut problems = Vec::new();
    let mut all_structs: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut extensible = Vec::new();
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, line) in lines.iter().enumerate() {
            if let Some((_, rest)) = line.split_once("extern \"C\" fn fk_") {
                let name = format!("fk_{}", &rest[..rest.find('(').unwrap_or(rest.len())]);
                let mut attrs = lines[..i]
                    .iter()
                    .rev()
                    .take_while(|l| l.starts_with("#[") || l.starts_with("//"));
                if !attrs.any(|l| l.contains("no_mangle")) {
                    problems.push(format!("{path}: {name} lacks #[no_mangle]: not exported"));
                }
                api.functions.push(name);
            }
            if let Some(rest) = line.strip_prefix("pub struct ") {
                let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
                let mut fields = Vec::new();
                if rest.trim_end().ends_with('{') {
                    for l in &lines[i + 1..] {
                        if l.starts_with('}') {
                            break;
                        }
                        if let Some((f, ty)) =
                            l.strip_prefix("pub ").and_then(|l| l.split_once(':'))
                        {
                            fields
                                .push((f.to_string(), ty.trim().trim_end_matches(',').to_string()));
                        }
                    }
                }
                let before = lines[..i]
                    .iter()
                    .rev()
                    .find(|l| !l.starts_with("#[") && !l.starts_with("//"));
                if before.is_some_and(|l| l.starts_with("extensible!")) {
                    extensible.push(name.clone());
                }
                all_structs.insert(name, fields);
            }
            if let Some((_, rest)) = line.split_once("const FK_") {
                if let Some((name, value)) = rest
                    .split_once(':')
                    .zip(rest.split_once('='))
                    .map(|((n, _), (_, v))| (format!("FK_{n}"), v.trim().trim_end_matches(';')))
                {
                    match number(value) {
                        Some(v) => {
                            api.constants.insert(name, v);
                        }
                        None => problems.push(format!("{path}: {name} is not a plain number")),
                    }
                }
            }
        }
    }
    for (name, fields) in all_structs.iter().filter(|(n, _)| n.starts_with("Fk")) {
        let mut flat: Vec<String> = Vec::new();
        if extensible.contains(name) {
            flat.push("size".to_string());
        }
        for (f, ty) in fields {
            match all_structs.get(ty) {
                Some(inner) if !ty.starts_with("Fk") => {
                    flat.extend(inner.iter().map(|(f, _)| f.clone()));
                }
                _ => flat.push(f.clone()),
            }
        }
        api.structs.insert(snake(name), flat);
    }
    api.functions.sort();
    api.functions.dedup();
    (api, problems)
}

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            let name = path.strip_prefix(crate_dir).unwrap_or(&path);
            out.push((name.display().to_string(), text));
        }
    }
}

/// The differences between the two sides, one line each.
fn differences(header: &Api, rust: &Api) -> Vec<String> {
    let mut d = Vec::new();
    for f in &header.functions {
        if !rust.functions.contains(f) {
            d.push(format!(
                "{f}: declared in the header, not exported by the library"
            ));
        }
    }
    for f in &rust.functions {
        if !header.functions.contains(f) {
            d.push(format!(
                "{f}: exported by the library, not declared in the header"
            ));
        }
    }
    for (s, fields) in &header.structs {
        match rust.structs.get(s) {
            None => d.push(format!("struct {s}: in the header, no Rust mirror")),
            Some(r) if r != fields => d.push(format!(
                "struct {s}: fields differ: header {fields:?}, Rust {r:?}"
            )),
            Some(_) => {}
        }
    }
    for s in rust.structs.keys() {
        if !header.structs.contains_key(s) {
            d.push(format!("struct {s}: mirrored in Rust, not in the header"));
        }
    }
    for (c, v) in &header.constants {
        match rust.constants.get(c) {
            None => d.push(format!("{c}: in the header, no Rust const of that name")),
            Some(r) if r != v => d.push(format!("{c}: {v} in the header, {r} in Rust")),
            Some(_) => {}
        }
    }
    for c in rust.constants.keys() {
        if !header.constants.contains_key(c) {
            d.push(format!("{c}: a Rust const, not in the header"));
        }
    }
    d
}

#[test]
fn the_header_and_the_sources_declare_the_same_api() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let header = header_api(HEADER);
    let (rust, mut problems) = rust_api(&files);
    // The parsers found something: an empty side would agree vacuously.
    for api in [&header, &rust] {
        assert!(api.functions.len() > 10 && api.structs.len() > 5 && api.constants.len() > 5);
    }
    problems.extend(differences(&header, &rust));
    assert!(
        problems.is_empty(),
        "include/foliokit.h and the library disagree:\n  {}",
        problems.join("\n  ")
    );
}

/// The check itself: each kind of drift is reported.
#[test]
fn a_difference_on_either_side_is_reported() {
    let h = "/* fk_gone(void) in a comment */\nint fk_a(int x);\nint fk_b(void);\n\
             struct fk_s { size_t size; uint64_t x; };\nstruct fk_o;\n\
             #define FK_FLAG 2u\nenum fk_e { FK_E0 = 0, };\n#define FK_VERSION_MAJOR 9\n";
    let rs = "#[no_mangle]\npub extern \"C\" fn fk_a(x: c_int) -> c_int {}\n\
              /// Doc.\n#[no_mangle]\npub unsafe extern \"C\" fn fk_c() {}\n\
              pub extern \"C\" fn fk_b() {}\n\
              extensible! {\n    pub struct FkS {\n        pub x: Inner,\n    }\n}\n\
              pub struct Inner {\n    pub y: u64,\n}\npub struct FkO(u8);\n\
              const FK_FLAG: c_uint = 4;\nconst FK_E0: c_int = 0;\nconst FK_NEW: c_uint = 1;\n";
    let (rust, problems) = rust_api(&[("lib.rs".to_string(), rs.to_string())]);
    let header = header_api(h);
    assert_eq!(header.functions, ["fk_a", "fk_b"]);
    assert_eq!(rust.structs["fk_s"], ["size", "y"]);
    assert_eq!(problems, ["lib.rs: fk_b lacks #[no_mangle]: not exported"]);
    assert_eq!(
        differences(&header, &rust),
        [
            "fk_c: exported by the library, not declared in the header",
            "struct fk_s: fields differ: header [\"size\", \"x\"], Rust [\"size\", \"y\"]",
            "FK_FLAG: 2 in the header, 4 in Rust",
            "FK_NEW: a Rust const, not in the header",
        ]
    );
}

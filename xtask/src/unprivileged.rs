//! `cargo xtask test-unprivileged`: the workspace's tests as a user with no
//! privilege, the way most developers and many CI runners run them.
//!
//! The test binaries are built here as they are for `cargo test`, then each
//! runs under `setpriv` as `nobody` (no groups, no capabilities, a home and
//! temporary directory of its own) from its package's directory, as cargo
//! would run it. Every test must pass or skip with its reason; the skips
//! are listed at the end, so what an unprivileged machine cannot check is
//! on the record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

/// The unprivileged user and group (`nobody`/`nogroup` on Debian).
const UID: u32 = 65534;
const GID: u32 = 65534;

/// One test binary: its target name, its file, and the package directory
/// cargo runs it from.
struct Binary {
    name: String,
    exe: PathBuf,
    dir: PathBuf,
}

/// Builds every test binary of the default members; lists them.
fn build(ws: &Path) -> Result<Vec<Binary>, Error> {
    println!("# building the test binaries");
    let out = Command::new(env!("CARGO"))
        .args(["test", "--no-run", "--locked", "--message-format=json"])
        .current_dir(ws)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err("cargo test --no-run failed".into());
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(name), Some(exe), Some(manifest)) = (
            v["target"]["name"].as_str(),
            v["executable"].as_str(),
            v["manifest_path"].as_str(),
        ) else {
            continue;
        };
        if v["profile"]["test"].as_bool() != Some(true) {
            continue;
        }
        let dir = Path::new(manifest).parent().unwrap_or(ws).to_path_buf();
        found.push(Binary {
            name: name.to_string(),
            exe: PathBuf::from(exe),
            dir,
        });
    }
    found.sort_by(|a, b| a.exe.cmp(&b.exe));
    Ok(found)
}

/// Reads a `test result:` line: (passed, failed).
fn tally(line: &str) -> Option<(usize, usize)> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let num = |word: &str| {
        rest.split(';')
            .find(|p| p.trim().ends_with(word))
            .and_then(|p| p.split_whitespace().rev().nth(1))
            .and_then(|n| n.parse::<usize>().ok())
    };
    Some((num("passed")?, num("failed")?))
}

/// Runs the tests as `nobody`; `Ok(false)` when any failed.
pub fn test_unprivileged(ws: &Path) -> Result<bool, Error> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "test-unprivileged switches to the user nobody, which needs root; as another user, \
             plain `cargo test` already runs unprivileged"
                .into(),
        );
    }
    let bins = build(ws)?;
    let home = std::env::temp_dir().join(format!("foliokit-unprivileged-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home)?;
    crate::run(Command::new("chown").arg(format!("{UID}:{GID}")).arg(&home))?;
    let (mut passed, mut failed) = (0, 0);
    let mut skips: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failures = Vec::new();
    for b in &bins {
        println!("# {} ({})", b.name, b.exe.display());
        let out = Command::new("setpriv")
            .args([
                &format!("--reuid={UID}"),
                &format!("--regid={GID}"),
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ])
            .arg(&b.exe)
            .current_dir(&b.dir)
            .env("HOME", &home)
            .env("TMPDIR", &home)
            .env_remove("FOLIOKIT_REQUIRE")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("setpriv (util-linux): {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut counted = false;
        for line in text.lines() {
            if let Some((p, f)) = tally(line) {
                passed += p;
                failed += f;
                counted = true;
            }
            if let Some(i) = line.find("SKIP") {
                skips
                    .entry(b.name.clone())
                    .or_default()
                    .push(line[i..].to_string());
            }
        }
        if !out.status.success() || !counted {
            print!("{text}");
            failures.push(b.name.clone());
            if !counted {
                failed += 1;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&home);
    println!("# skipped as nobody, by test binary:");
    for (bin, lines) in &skips {
        for l in lines {
            println!("  {bin}: {l}");
        }
    }
    println!(
        "# test-unprivileged: {passed} passed, {failed} failed, {} skip lines{}",
        skips.values().map(Vec::len).sum::<usize>(),
        if failures.is_empty() {
            String::new()
        } else {
            format!(" (failing binaries: {})", failures.join(", "))
        }
    );
    Ok(failures.is_empty())
}

#[cfg(test)]
mod tests {
    use super::tally;

    #[test]
    fn reads_libtest_result_lines() {
        assert_eq!(
            tally("test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out"),
            Some((12, 0))
        );
        assert_eq!(
            tally("test result: FAILED. 3 passed; 2 failed; 0 ignored"),
            Some((3, 2))
        );
        assert_eq!(tally("running 3 tests"), None);
    }
}

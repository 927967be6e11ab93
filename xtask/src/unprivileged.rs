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
use std::path::Path;
use std::process::{Command, Stdio};

use crate::testbins::{self, result_line};
use crate::Error;

/// The unprivileged user and group (`nobody`/`nogroup` on Debian).
const UID: u32 = 65534;
const GID: u32 = 65534;

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
    println!("# building the test binaries");
    let bins = testbins::build(ws, &[])?;
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
            if let Some((p, f)) = result_line(line) {
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

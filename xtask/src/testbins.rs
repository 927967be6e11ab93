//! The test binaries cargo builds, and what libtest says about a run of
//! one: shared by the guests (`vm-test`) and `test-unprivileged`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

/// One test binary.
pub struct Binary {
    /// The target's name (`migrate`, `foliokit_lab`, ...).
    pub name: String,
    pub exe: PathBuf,
    /// Its package's directory, where cargo runs it.
    pub dir: PathBuf,
    /// An integration test (`tests/*.rs`), not a crate's unit tests.
    pub integration: bool,
}

/// Builds the test binaries of `packages` (`-p NAME` arguments; none: the
/// default members) as `cargo test` would, and lists them.
pub fn build(ws: &Path, packages: &[&str]) -> Result<Vec<Binary>, Error> {
    let out = Command::new(env!("CARGO"))
        .args(["test", "--no-run", "--locked", "--message-format=json"])
        .args(packages)
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
        found.push(Binary {
            name: name.to_string(),
            exe: PathBuf::from(exe),
            dir: Path::new(manifest).parent().unwrap_or(ws).to_path_buf(),
            integration: v["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|x| x == "test")),
        });
    }
    found.sort_by(|a, b| (&a.name, &a.exe).cmp(&(&b.name, &b.exe)));
    Ok(found)
}

/// Reads one `test result:` line: (passed, failed).
pub fn result_line(l: &str) -> Option<(usize, usize)> {
    let rest = l.trim().strip_prefix("test result: ")?;
    let num = |word: &str| {
        rest.split(';')
            .find(|p| p.trim().ends_with(word))
            .and_then(|p| p.split_whitespace().rev().nth(1))
            .and_then(|n| n.parse::<usize>().ok())
    };
    Some((num("passed")?, num("failed")?))
}

#[cfg(test)]
mod tests {
    use super::result_line;

    #[test]
    fn reads_libtest_result_lines() {
        assert_eq!(
            result_line(
                "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out"
            ),
            Some((12, 0))
        );
        assert_eq!(
            result_line("test result: FAILED. 3 passed; 2 failed; 0 ignored"),
            Some((3, 2))
        );
        assert_eq!(result_line("running 3 tests"), None);
    }
}

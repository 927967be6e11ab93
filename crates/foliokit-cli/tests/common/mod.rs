//! The one harness the CLI's integration tests share: the binary, its JSON
//! answers, its one-line refusals, a scratch directory of a test's own, and
//! notes that reach the log.

#![allow(dead_code)] // each test binary uses a different part of the harness

use serde_json::Value;

#[path = "../../../foliokit/tests/common/need.rs"]
mod need;
// Each test binary uses a different part of the harness.
#[allow(unused_imports)]
pub use need::{missing, Need};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `foliokit` binary this package builds.
pub fn foliokit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_foliokit"))
}

/// Runs `cmd`, which must succeed; a failure shows what it said on stderr.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run foliokit");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `cmd`, which must succeed, and reads what it printed as JSON.
pub fn json(cmd: &mut Command) -> Value {
    serde_json::from_slice(&run_ok(cmd).stdout).expect("JSON on stdout")
}

/// Runs `cmd`, which must be refused in one line that says `want`, and
/// returns its exit code: the CLI's errors are one clear line, never a
/// panic or a backtrace.
pub fn refused(cmd: &mut Command, want: &str) -> Option<i32> {
    let out = cmd.output().expect("run foliokit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{cmd:?} was not refused: {err}");
    assert!(
        err.contains(want) && err.trim().lines().count() == 1,
        "{cmd:?}: wanted one line saying {want:?}, got: {err}"
    );
    out.status.code()
}

/// An empty directory of the test's own under the system's temp directory
/// (the process id keeps concurrent runs apart); whatever was left there
/// by an earlier run is removed first.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("foliokit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A [`fresh_dir`] removed again when the test ends, passed or not.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        Scratch(fresh_dir(name))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A note straight to the process's stderr, named after the test binary:
/// libtest captures `println!` and `eprintln!` of a passing test, and the
/// guest's log should show what was checked or skipped.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{}: {line}", env!("CARGO_CRATE_NAME"));
}

/// Says why a test checks nothing here.
pub fn skip(why: &str) {
    say(&format!("SKIP: {why}"));
}

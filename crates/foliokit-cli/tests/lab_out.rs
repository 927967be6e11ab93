//! `foliokit lab --out DIR` refuses a directory it cannot write into at
//! once, in one line, before measuring anything.

mod common;

use common::{foliokit, skip, Scratch};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn an_unwritable_out_directory_fails_before_any_measurement() {
    let scratch = Scratch::new("lab-ro");
    let dir = scratch.path();
    let root = foliokit::mem::system::is_root();
    let mounted = root
        && Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro", "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
    if !mounted {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
        if std::fs::write(dir.join("x"), b"").is_ok() {
            skip("cannot make a read-only directory here (root without mount)");
            return;
        }
    }
    let t = Instant::now();
    let out = foliokit()
        .args(["lab", "--quick", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    let took = t.elapsed();
    if mounted {
        let _ = Command::new("umount").arg(dir).status();
    }
    // Writable again, so that the scratch directory can be removed.
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot write results into"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(out.stdout.is_empty(), "nothing measured or printed first");
    // Calibration alone takes tens of seconds: this must not have started.
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

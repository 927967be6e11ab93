//! `bench restore`'s external-handler rows against a VMM that never
//! exits: the row must kill it and fail in a line saying so, never hang.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::{missing, say, Need, Scratch};
use foliokit::lazy::LazyError;
use foliokit_lab::restore::{run, RestoreError, RestorePlan};

#[test]
fn a_vmm_that_lingers_is_killed_and_its_row_fails() {
    let dir = Scratch::new("restore-linger");
    // The VMM player, told to idle ten minutes before its vCPUs touch
    // anything (the one-at-a-time row then never gets every page in; the
    // foliokit rows do, and the VMM never exits).
    let vmm = dir.join("lingering-vmm");
    std::fs::write(
        &vmm,
        format!(
            "#!/bin/sh\nexec '{}' \"$@\" --idle 600s\n",
            env!("CARGO_BIN_EXE_foliokit")
        ),
    )
    .expect("the wrapper");
    std::fs::set_permissions(&vmm, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let plan = RestorePlan {
        size: 16 << 20,
        channels: 2,
        loops: 1,
        cold: false,
        budget: Duration::from_millis(1),
        dir: dir.path().to_path_buf(),
        serve_during_batches: false,
        hugetlb: false,
        zero_fraction: 0.0,
        dense_zeros: false,
        vmm_exe: Some(vmm),
        vmm_wait: Some(Duration::from_secs(3)),
        handler_block: 2 << 20,
    };
    let t = Instant::now();
    match run(plan, || {}) {
        Err(e @ RestoreError::VmmStuck { .. }) => {
            let line = e.to_string();
            assert!(line.contains("the VMM was killed"), "{line}");
            say(&format!(
                "{line} (after {:.1} s)",
                t.elapsed().as_secs_f64()
            ));
        }
        Err(RestoreError::Lazy(LazyError::Refused(why))) => {
            missing(Need::Uffd, &format!("no lazy fill here: {why}"))
        }
        Err(RestoreError::Plan(m)) if m.contains("making a userfaultfd") => {
            missing(Need::Uffd, &format!("the VMM player: {m}"))
        }
        Err(RestoreError::Mem(e)) => missing(Need::Thp, &format!("no THP guest here: {e}")),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a VMM that never exits did not fail its row"),
    }
}

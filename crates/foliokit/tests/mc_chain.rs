//! foliokit never swallows a SIGBUS that is not its own. A binary of its
//! own, because signal dispositions are per process.
#![cfg(target_arch = "x86_64")]

mod common;

use common::{TruncatedFile, PAGE};
use foliokit::mc::{copy_mc, FaultKind, McError};
use foliokit::CopyStrategy;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

static HIT: AtomicBool = AtomicBool::new(false);
static FD: AtomicI32 = AtomicI32::new(-1);
static LEN: AtomicUsize = AtomicUsize::new(0);

/// The application's own handler: repairs the fault by giving the file its
/// length back, so the faulting read succeeds when retried.
extern "C" fn apps_handler(
    _sig: libc::c_int,
    _info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    HIT.store(true, Ordering::SeqCst);
    // SAFETY: ftruncate is async-signal-safe; FD is our open file.
    unsafe {
        libc::ftruncate(
            FD.load(Ordering::SeqCst),
            LEN.load(Ordering::SeqCst) as libc::off_t,
        )
    };
}

#[test]
fn a_foreign_fault_reaches_the_handler_installed_before_foliokit() {
    let len = 2 * PAGE;
    let file = TruncatedFile::new(len, 1, None);
    FD.store(file.fd(), Ordering::SeqCst);
    LEN.store(len, Ordering::SeqCst);
    // SAFETY: installing a handler whose body is async-signal-safe.
    unsafe {
        common::set_handler(
            libc::SIGBUS,
            apps_handler as *const () as usize,
            libc::SA_SIGINFO,
        );
    }
    // foliokit installs its handler on first use, on top of the app's.
    let mut d = [0u8; 8];
    copy_mc(&mut d, &[1u8; 8], CopyStrategy::Movsb).unwrap();

    // A fault in foliokit's copy is foliokit's: reported, app not called.
    file.truncate(PAGE);
    let mut dst = vec![0u8; len];
    match copy_mc(&mut dst, file.as_slice(), CopyStrategy::Movsb) {
        Err(McError::Fault(f)) => assert_eq!(
            (f.not_copied, f.bad_page, f.kind),
            (PAGE, 1, FaultKind::Vanished)
        ),
        other => panic!("expected a fault, got {other:?}"),
    }
    assert!(
        !HIT.load(Ordering::SeqCst),
        "foliokit's own fault reached the app's handler"
    );

    // A fault in the application's own code is passed on to the app.
    // SAFETY: page 1 of the mapping is gone; the app's handler restores it,
    // after which the read is retried and sees the zero-filled page.
    let v = unsafe { file.as_ptr().add(PAGE).read_volatile() };
    assert!(
        HIT.load(Ordering::SeqCst),
        "the app's handler never saw its fault"
    );
    assert_eq!(v, 0);
}

/// Run by the test below in a child process: installs foliokit's handler,
/// then faults outside any foliokit routine with no handler before it.
#[test]
#[ignore = "run in a child process by a_foreign_fault_with_no_prior_handler_still_kills"]
fn child_faults_outside_foliokit() {
    let mut d = [0u8; 8];
    copy_mc(&mut d, &[1u8; 8], CopyStrategy::Movsb).unwrap();
    let file = TruncatedFile::new(2 * PAGE, 2, None);
    file.truncate(0);
    // SAFETY: deliberately reads a vanished page; the process must die.
    let v = unsafe { file.as_ptr().read_volatile() };
    println!("survived a foreign SIGBUS and read {v}");
}

#[test]
fn a_foreign_fault_with_no_prior_handler_still_kills() {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_faults_outside_foliokit",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("survived"),
        "the foreign fault was swallowed: {stdout}"
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "child ended with {:?}",
        out.status
    );
}

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
    if std::env::var_os(IGNORE_FIRST).is_some() {
        // SAFETY: setting a disposition, before any handler of foliokit's.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_IGN) };
    }
    let mut d = [0u8; 8];
    copy_mc(&mut d, &[1u8; 8], CopyStrategy::Movsb).unwrap();
    let file = TruncatedFile::new(2 * PAGE, 2, None);
    file.truncate(0);
    // SAFETY: deliberately reads a vanished page; the process must die.
    let v = unsafe { file.as_ptr().read_volatile() };
    println!("survived a foreign SIGBUS and read {v}");
}

/// Set for the child: SIGBUS ignored before foliokit installs its handler.
const IGNORE_FIRST: &str = "FOLIOKIT_TEST_IGNORE_SIGBUS";

/// Runs the child (with SIGBUS ignored first, or not) and checks that the
/// foreign fault killed it, within a deadline: a handler that returns from
/// a fault it does not fix runs the faulting read again, forever.
fn foreign_fault_kills(ignore_first: bool) {
    use std::os::unix::process::ExitStatusExt;
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_faults_outside_foliokit",
        "--exact",
        "--ignored",
        "--nocapture",
    ])
    .stdout(std::process::Stdio::piped());
    if ignore_first {
        cmd.env(IGNORE_FIRST, "1");
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child spun on its fault (SIGBUS ignored first: {ignore_first})");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(
        !stdout.contains("survived"),
        "the foreign fault was swallowed: {stdout}"
    );
    assert_eq!(
        status.signal(),
        Some(libc::SIGBUS),
        "child ended with {status:?}"
    );
}

#[test]
fn a_foreign_fault_with_no_prior_handler_still_kills() {
    foreign_fault_kills(false);
}

/// The kernel cannot ignore a SIGBUS it raises for a fault: it delivers it
/// with the default action. foliokit's handler, installed over the
/// ignoring disposition, must do the same.
#[test]
fn a_foreign_fault_kills_where_sigbus_was_ignored() {
    foreign_fault_kills(true);
}

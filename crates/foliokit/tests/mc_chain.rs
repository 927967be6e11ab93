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

/// Runs the ignored test `name` of this binary in a child process, with
/// `env` set, and returns how it ended and its stdout; a child that runs
/// past the deadline (spinning on a fault, say) is killed and fails.
fn run_child(name: &str, env: Option<&str>) -> (std::process::ExitStatus, String) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--ignored", "--nocapture"])
        .stdout(std::process::Stdio::piped());
    if let Some(k) = env {
        cmd.env(k, "1");
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
            panic!("{name} (env {env:?}) ran past its deadline: spinning on its fault?");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    (status, stdout)
}

/// Checks that the foreign fault killed the child (SIGBUS ignored first,
/// or not): a handler that returns from a fault it does not fix runs the
/// faulting read again, forever.
fn foreign_fault_kills(ignore_first: bool) {
    use std::os::unix::process::ExitStatusExt;
    let (status, stdout) = run_child(
        "child_faults_outside_foliokit",
        ignore_first.then_some(IGNORE_FIRST),
    );
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

static SEEN: AtomicUsize = AtomicUsize::new(0);

extern "C" fn counting_handler(
    _sig: libc::c_int,
    _info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    SEEN.fetch_add(1, Ordering::SeqCst);
}

/// Run in a child: a SIGBUS another thread sends (pthread_kill) while an
/// mc copy runs is the application's, never a fault of the copy.
#[test]
#[ignore = "run in a child process by a_sent_sigbus_is_never_a_fault_of_the_copy"]
fn child_sends_sigbus_during_copies() {
    // SAFETY: a handler whose body is one atomic add.
    unsafe {
        common::set_handler(
            libc::SIGBUS,
            counting_handler as *const () as usize,
            libc::SA_SIGINFO,
        );
    }
    let mut d = [0u8; 8];
    copy_mc(&mut d, &[1u8; 8], CopyStrategy::Movsb).unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = stop.clone();
    let copier = std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        let src = vec![7u8; 4 << 20];
        let mut dst = vec![0u8; 4 << 20];
        let (mut copies, mut failed) = (0, 0);
        while !s2.load(Ordering::SeqCst) {
            copies += 1;
            if copy_mc(&mut dst, &src, CopyStrategy::Movsb).is_err() {
                failed += 1;
            }
        }
        (copies, failed)
    });
    let t = rx.recv().unwrap();
    let mut sent = 0;
    for _ in 0..200 {
        // SAFETY: the copier thread lives until `stop` is set below.
        unsafe { libc::pthread_kill(t, libc::SIGBUS) };
        sent += 1;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    stop.store(true, Ordering::SeqCst);
    let (copies, failed) = copier.join().unwrap();
    let seen = SEEN.load(Ordering::SeqCst);
    println!("copies {copies}, failed {failed}, sent {sent}, the app saw {seen}");
    assert_eq!(failed, 0, "a sent SIGBUS failed a healthy copy");
    // Signals sent while one is pending merge: the app sees at most as
    // many as were sent, and at least one.
    assert!(seen >= 1 && seen <= sent, "the app saw {seen} of {sent}");
}

#[test]
fn a_sent_sigbus_is_never_a_fault_of_the_copy() {
    let (status, stdout) = run_child("child_sends_sigbus_during_copies", None);
    assert!(status.success(), "{status:?}: {stdout}");
}

/// Run in a child: SIGBUS ignored with SA_SIGINFO set (a value, not a
/// function) stays ignored for a sent signal after foliokit installs.
#[test]
#[ignore = "run in a child process by an_ignored_sigbus_with_sa_siginfo_stays_ignored"]
fn child_raises_sigbus_ignored_with_siginfo() {
    // SAFETY: setting a disposition before foliokit's handler.
    unsafe { common::set_handler(libc::SIGBUS, libc::SIG_IGN, libc::SA_SIGINFO) };
    let mut d = [0u8; 8];
    copy_mc(&mut d, &[1u8; 8], CopyStrategy::Movsb).unwrap();
    // SAFETY: raising a signal the process ignores.
    unsafe { libc::raise(libc::SIGBUS) };
    println!("survived the raise");
}

#[test]
fn an_ignored_sigbus_with_sa_siginfo_stays_ignored() {
    let (status, stdout) = run_child("child_raises_sigbus_ignored_with_siginfo", None);
    assert!(
        status.success() && stdout.contains("survived"),
        "{status:?}: {stdout}"
    );
}

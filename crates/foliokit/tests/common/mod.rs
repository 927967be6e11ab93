//! The one test harness every strategy and API test shares.
//!
//! Buffers live in guarded regions (a PROT_NONE page on each side) and are
//! placed either flush against the trailing guard page, so a single byte of
//! overrun faults, or at a chosen offset from the leading page. Everything
//! around the buffer inside the region is a canary that must survive.

#![allow(dead_code)] // each test binary uses a different part of the harness

use foliokit::mem::Region;

pub mod need;
// Each test binary uses a different part of the harness.
#[allow(unused_imports)]
pub use need::{missing, Need};

pub const CANARY: u8 = 0xA5;

/// The base page, a MiB, and a PMD-sized huge page (x86_64's 2 MiB).
pub const PAGE: usize = 4096;
pub const MIB: usize = 1 << 20;
pub const THP: usize = 2 << 20;

/// How long each concurrent migration scenario keeps migrating.
pub const RUN: std::time::Duration = std::time::Duration::from_millis(1500);
/// A migration scenario's test child running longer than this has hung.
pub const LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Deterministic, position-dependent bytes (never all equal, never zero-only).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Where a buffer sits inside its guarded region.
#[derive(Debug, Clone, Copy)]
pub enum Place {
    /// `offset` bytes after the leading guard page.
    Start(usize),
    /// Ending exactly at the trailing guard page.
    End,
}

/// A guarded region filled with canaries, holding one buffer.
pub struct Guarded {
    region: Region,
    start: usize,
    len: usize,
}

impl Guarded {
    pub fn new(len: usize, place: Place) -> Guarded {
        let slack = match place {
            Place::Start(off) => off,
            Place::End => 0,
        };
        let mut region = Region::guarded(len + slack).expect("guarded region");
        region.as_mut_slice().fill(CANARY);
        let start = match place {
            Place::Start(off) => off,
            Place::End => region.len() - len,
        };
        Guarded { region, start, len }
    }

    pub fn buf(&mut self) -> &mut [u8] {
        let (s, l) = (self.start, self.len);
        &mut self.region.as_mut_slice()[s..s + l]
    }

    /// Panics unless every byte outside the buffer is still a canary.
    pub fn assert_canaries(&self, what: &str) {
        let all = self.region.as_slice();
        let before = &all[..self.start];
        let after = &all[self.start + self.len..];
        assert!(
            before.iter().all(|&b| b == CANARY) && after.iter().all(|&b| b == CANARY),
            "{what}: wrote outside the buffer"
        );
    }
}

/// The strategies of `list` this machine can run; says why each other one
/// is left out (as a skip).
pub fn available<S: foliokit::Strategy>(list: &[S]) -> Vec<S> {
    list.iter()
        .copied()
        .filter(|s| match s.unavailable() {
            None => true,
            Some(why) => {
                missing(Need::Cpu, &format!("{} {}: {why}", S::OP, s.name()));
                false
            }
        })
        .collect()
}

/// The strategies this machine cannot run (they must be refused).
pub fn unavailable<S: foliokit::Strategy>() -> Vec<S> {
    S::ALL
        .iter()
        .copied()
        .filter(|s| s.unavailable().is_some())
        .collect()
}

/// Lengths for the sweeps: every small size, and the edges around vector
/// widths, lines, pages and a huge page.
pub fn sweep_lengths() -> Vec<usize> {
    let mut v: Vec<usize> = (0..=300).collect();
    v.extend([
        511,
        512,
        513,
        1023,
        1024,
        1025,
        4095,
        4096,
        4097,
        8192 + 71,
        65536,
        65536 + 129,
    ]);
    v
}

/// Offsets for the sweeps (fewer for big lengths, to keep the suite quick).
pub fn sweep_offsets(len: usize) -> &'static [usize] {
    if len > 4096 {
        &[0, 1, 63]
    } else {
        &[0, 1, 7, 8, 15, 16, 31, 33, 63]
    }
}

/// Checks `copy` against the reference (the source bytes) over all sweep
/// lengths, source/destination offsets, and both placements.
pub fn sweep_copy(what: &str, copy: &dyn Fn(&mut [u8], &[u8])) {
    for len in sweep_lengths() {
        let want = pattern(len, len as u64);
        let offs = sweep_offsets(len);
        let places = offs
            .iter()
            .flat_map(|&s| {
                offs.iter()
                    .map(move |&d| (Place::Start(s), Place::Start(d)))
            })
            .chain([
                (Place::End, Place::End),
                (Place::Start(0), Place::End),
                (Place::End, Place::Start(1)),
            ]);
        for (sp, dp) in places {
            let mut src = Guarded::new(len, sp);
            src.buf().copy_from_slice(&want);
            let mut dst = Guarded::new(len, dp);
            copy(dst.buf(), src.buf());
            let ctx = format!("{what}: len {len} src {sp:?} dst {dp:?}");
            assert!(dst.buf() == &want[..], "{ctx}: wrong bytes");
            assert!(src.buf() == &want[..], "{ctx}: source modified");
            dst.assert_canaries(&ctx);
        }
    }
}

/// Checks `clear` zeroes exactly the buffer over all lengths and placements.
pub fn sweep_clear(what: &str, clear: &dyn Fn(&mut [u8])) {
    for len in sweep_lengths() {
        let places = sweep_offsets(len)
            .iter()
            .map(|&o| Place::Start(o))
            .chain([Place::End]);
        for p in places {
            let mut dst = Guarded::new(len, p);
            let fill = pattern(len, 7);
            dst.buf().copy_from_slice(&fill);
            clear(dst.buf());
            let ctx = format!("{what}: len {len} {p:?}");
            assert!(dst.buf().iter().all(|&b| b == 0), "{ctx}: not zeroed");
            dst.assert_canaries(&ctx);
        }
    }
}

/// A fresh anonymous mapping of `len` bytes with `prot` and `flags`
/// (`MAP_ANONYMOUS` is added, and `MAP_FIXED` with `at`); panics if mmap
/// fails. For what [`Region`] does not make: shared or reserved memory,
/// mappings at a chosen place, memory that is never unmapped.
///
/// # Safety
/// With `at`, `[at, at + len)` is memory the caller owns and gives up.
pub unsafe fn map_anonymous(
    at: Option<usize>,
    len: usize,
    prot: libc::c_int,
    flags: libc::c_int,
) -> *mut u8 {
    let fixed = if at.is_some() { libc::MAP_FIXED } else { 0 };
    // SAFETY: a fresh anonymous mapping; with `at`, over memory the caller
    // gives up (this function's contract).
    let p = unsafe {
        libc::mmap(
            at.unwrap_or(0) as *mut libc::c_void,
            len,
            prot,
            flags | libc::MAP_ANONYMOUS | fixed,
            -1,
            0,
        )
    };
    assert_ne!(
        p,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    p.cast()
}

/// A huge-page-friendly region of `folios` folios of `folio_size`, filled
/// with a pattern, for batch tests.
pub fn filled_region(folio_size: usize, folios: usize, seed: u64) -> Region {
    let mut r = Region::new(folio_size * folios, folio_size).expect("region");
    let p = pattern(r.len(), seed);
    r.as_mut_slice().copy_from_slice(&p);
    r
}

/// A path in the temporary directory no other call (of any test process)
/// returns: `foliokit-test-{what}-{pid}-{n}`.
pub fn temp_path(what: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("foliokit-test-{what}-{}-{n}", std::process::id()))
}

/// A new, empty file at [`temp_path`]`(what)`, open for reading and
/// writing; the caller removes it.
pub fn temp_file(what: &str) -> (std::fs::File, std::path::PathBuf) {
    let path = temp_path(what);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("temp file");
    (file, path)
}

/// A shared file mapping whose file can be truncated underneath it, so that
/// reading the pages past the new end raises SIGBUS (`BUS_ADRERR`) — the
/// portable, unprivileged way to make source pages vanish.
pub struct TruncatedFile {
    file: std::fs::File,
    map: *mut u8,
    len: usize,
}

impl TruncatedFile {
    /// A `len`-byte file filled with `pattern(len, seed)`, mapped read-only,
    /// at `at` when given (MAP_FIXED over memory the caller owns).
    pub fn new(len: usize, seed: u64, at: Option<*mut u8>) -> TruncatedFile {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let (mut file, path) = temp_file("truncated");
        // Unlinked at once: the descriptor is all the tests use, and a
        // test process that dies (or a child that exits without
        // unwinding) leaves nothing behind.
        let _ = std::fs::remove_file(&path);
        file.write_all(&pattern(len, seed))
            .expect("write temp file");
        let flags = libc::MAP_SHARED | if at.is_some() { libc::MAP_FIXED } else { 0 };
        // SAFETY: maps our own file; with MAP_FIXED the caller passes memory
        // it owns and gives up.
        let map = unsafe {
            libc::mmap(
                at.unwrap_or(std::ptr::null_mut()).cast(),
                len,
                libc::PROT_READ,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap temp file");
        TruncatedFile {
            file,
            map: map.cast(),
            len,
        }
    }

    /// Cuts the file to `keep` bytes: mapped pages from there on vanish.
    pub fn truncate(&self, keep: usize) {
        self.file.set_len(keep as u64).expect("truncate");
    }

    /// Restores the full length (the restored pages read as zeros).
    pub fn restore(&self) {
        self.file.set_len(self.len as u64).expect("extend");
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live for &self. Reading a vanished page
        // faults; the tests only hand this slice to mc copies.
        unsafe { std::slice::from_raw_parts(self.map, self.len) }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.map
    }

    /// The file's descriptor, for a signal handler that repairs the file.
    pub fn fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.file.as_raw_fd()
    }
}

impl Drop for TruncatedFile {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.map.cast(), self.len) };
    }
}

/// Installs `handler` (an `extern "C"` function, as `usize`) for signal
/// `sig` in this process, with `flags`; nothing but `sig` itself is
/// blocked while it runs. Panics if sigaction fails.
///
/// # Safety
/// `handler` has the signature `flags` selects (three arguments with
/// `SA_SIGINFO`, else one), is async-signal-safe, and is right for every
/// `sig` this process raises from now on.
pub unsafe fn set_handler(sig: libc::c_int, handler: usize, flags: libc::c_int) {
    // SAFETY: a zeroed, then filled, sigaction; the handler is the
    // caller's to vouch for (this function's contract).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = flags;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

/// Set in a child process started by [`in_child`] to the test it runs.
pub const CHILD_ENV: &str = "FOLIOKIT_TEST_CHILD";

/// Runs a test's body in a fresh process (this test binary, re-executed
/// with only that test selected), so a crash, a signal or a hang is this
/// test's failure rather than the end of the whole runner. Forking the
/// runner itself would inherit other test threads' locks.
///
/// `name` must be the test function's name (`module::name` inside a
/// module); a name that matches no test fails. The child may print a line
/// `SKIP: <reason>` (see [`skip`]); the parent repeats it. Panics if the
/// child fails, is killed, or runs longer than `timeout` (3x that under
/// emulation, see [`slowdown`]).
pub fn in_child(name: &str, timeout: std::time::Duration, body: impl FnOnce()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        return;
    }
    // Under emulation, tests took up to a third of their deadline in the
    // vm-test log (16-20 s of 60): stretch it 3x there, so a busy host
    // does not turn slowness into a failure; a hang still ends the test.
    let timeout = timeout * slowdown().min(3);
    use std::io::Read;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn test child");
    // Drain both pipes while waiting, so a chatty child cannot block.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for test child") {
            break Some(s);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let (out, err) = (
        t_out.join().unwrap_or_default(),
        t_err.join().unwrap_or_default(),
    );
    for line in out.lines().chain(err.lines()) {
        if line.starts_with("SKIP") || line.starts_with("NOTE:") {
            say(&format!("{name}: {line}"));
        }
    }
    let tail = |s: &str| {
        s.lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    };
    // How close a passing test came to its deadline: a flaky timeout
    // shows in the log before it happens.
    let took = start.elapsed();
    if status.is_some() && took > timeout / 4 {
        say(&format!(
            "{name}: NOTE: took {:.1} s of its {:.0} s limit",
            took.as_secs_f64(),
            timeout.as_secs_f64()
        ));
    }
    match status {
        None => panic!(
            "{name}: child hung for {timeout:?} and was killed\nstdout:\n{}\nstderr:\n{}",
            tail(&out),
            tail(&err)
        ),
        Some(s) if !s.success() => panic!(
            "{name}: child failed ({s})\nstdout:\n{}\nstderr:\n{}",
            tail(&out),
            tail(&err)
        ),
        // A name that is not the test's own runs nothing, and passes.
        Some(_) if !out.contains("running 1 test") => {
            panic!("{name}: the child ran no test of that name (in a module, the name is its path)")
        }
        Some(_) => {}
    }
}

/// Forks; the child runs `child` and exits 0 if it returns true, 1 if it
/// returns false or panics. The parent waits up to ~20 s (times
/// [`slowdown`]), then kills it.
/// The child must not print or take locks other threads may hold: run it
/// inside [`in_child`], where the test is the only thread.
pub fn in_forked_child(child: impl FnOnce() -> bool) {
    // SAFETY: the child only allocates, spawns threads, copies and
    // `_exit`s; it never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(false);
        // SAFETY: ends the child without running the parent's atexit
        // handlers or destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    match wait_for_child(pid, std::time::Duration::from_secs(20) * slowdown()) {
        Ok(status) => assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child failed: status {status:#x}"
        ),
        Err(_) => panic!("forked child hung: killed after ~{} s", 20 * slowdown()),
    }
}

/// Waits up to `limit` for our child `pid` to end and returns its wait
/// status; if it runs longer, kills and reaps it and returns what it was
/// blocked in ([`blocked_in`]).
pub fn wait_for_child(pid: libc::pid_t, limit: std::time::Duration) -> Result<i32, String> {
    let t0 = std::time::Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if r == pid {
            return Ok(status);
        }
        if t0.elapsed() > limit {
            let was = blocked_in(pid);
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Err(was);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Reads a byte of every 4 KiB page of `mem`: resolves the hinting faults
/// NUMA balancing set up there (and changes nothing).
pub fn touch_pages(mem: &[u8]) {
    let sum = mem.iter().step_by(4096).fold(0u8, |a, &b| a ^ b);
    std::hint::black_box(sum);
}

/// Threads of this process now (entries of /proc/self/task).
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .expect("/proc/self/task")
}

/// What a [`seccomp_filter`] does to a forbidden call.
#[derive(Clone, Copy)]
pub enum SeccompAction {
    /// Kill the process (SIGSYS): the call must never happen.
    KillProcess,
    /// Fail the call with this errno: code must cope without it.
    Errno(u16),
}

/// Installs, on every thread of the process (TSYNC), a seccomp filter that
/// applies `action` to the system calls `forbidden` and allows the rest.
/// x86_64 only (other architectures' calls would be killed).
#[cfg(target_arch = "x86_64")]
pub fn seccomp_filter(forbidden: &[i64], action: SeccompAction) {
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const SECCOMP_SET_MODE_FILTER: libc::c_long = 1;
    const SECCOMP_FILTER_FLAG_TSYNC: libc::c_long = 1;
    let deny = match action {
        SeccompAction::KillProcess => RET_KILL_PROCESS,
        SeccompAction::Errno(e) => RET_ERRNO | u32::from(e),
    };
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let n = forbidden.len();
    assert!(n < 250, "one jump must reach the end");
    // 0: arch; 1: not x86_64 -> kill (the last instruction); 2: nr;
    // 3..3+n: forbidden -> deny; then allow; then deny; then kill.
    let mut prog = vec![
        stmt(load, 4), // seccomp_data.arch
        jeq(AUDIT_ARCH_X86_64, 0, (n + 3) as u8),
        stmt(load, 0), // seccomp_data.nr
    ];
    for (i, &f) in forbidden.iter().enumerate() {
        prog.push(jeq(f as u32, (n - i) as u8, 0));
    }
    prog.push(stmt(ret, RET_ALLOW));
    prog.push(stmt(ret, deny));
    prog.push(stmt(ret, RET_KILL_PROCESS));
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: no_new_privs, then a filter program that lives until the
    // call returns (the kernel copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        let rc = libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            SECCOMP_FILTER_FLAG_TSYNC,
            &fprog as *const libc::sock_fprog,
        );
        assert_eq!(rc, 0, "seccomp: {}", std::io::Error::last_os_error());
    }
}

/// From here on no thread or process can be made (`clone`, `clone3`,
/// `fork`, `vfork` fail with EPERM), and this is checked: for tests of
/// "makes no thread". x86_64 only.
#[cfg(target_arch = "x86_64")]
pub fn refuse_new_threads() {
    seccomp_filter(
        &[
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_fork,
            libc::SYS_vfork,
        ],
        SeccompAction::Errno(libc::EPERM as u16),
    );
    assert!(
        std::thread::Builder::new().spawn(|| {}).is_err(),
        "the filter must refuse a new thread"
    );
}

/// Says why a test is skipped (in the output the parent shows).
pub fn skip(reason: &str) {
    say(&format!("SKIP: {reason}"));
}

/// Whether relocation can run in this process (on 4 KiB pages); prints
/// why not.
pub fn relocation_available() -> bool {
    relocation_available_on(4096)
}

/// Whether relocation can run in this process on a 2 MiB region of
/// `folio`-sized folios; prints why not.
pub fn relocation_available_on(folio: usize) -> bool {
    use foliokit::migrate::{migrate, MigrateError, MigrateOptions, Path};
    let mut r = Region::new(2 << 20, folio).expect("region");
    r.as_mut_slice().fill(1);
    let o = MigrateOptions::default().path(Path::Relocate);
    // SAFETY: our own region, nobody else uses it.
    match unsafe { migrate(r.as_mut_ptr(), r.len(), node(), &o) } {
        Ok(_) => true,
        Err(e @ MigrateError::Refused { .. }) => {
            missing(
                Need::Relocation,
                &format!("relocation unavailable here: {e}"),
            );
            false
        }
        Err(e) => panic!("relocation probe failed: {e}"),
    }
}

/// Writes a line to the process's stderr directly: libtest captures
/// `print!`/`eprint!` of a passing test, and a skip must be seen in the
/// output of a plain `cargo test`.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Set by `cargo xtask vm-test` in its guests, which run under QEMU's
/// software emulation (tens of times slower than the host).
pub const EMULATED_ENV: &str = "FOLIOKIT_EMULATED";

/// How much longer than on the host a wait may take here: 10 under
/// emulation, else 1. For deadlines only, never for a figure.
pub fn slowdown() -> u32 {
    if std::env::var_os(EMULATED_ENV).is_some() {
        10
    } else {
        1
    }
}

/// What a process is blocked in (`wchan`, `syscall`, `stack` from /proc;
/// the stack needs root): for a message about a process that hangs.
pub fn blocked_in(pid: i32) -> String {
    ["wchan", "syscall", "stack"]
        .iter()
        .map(|f| {
            let v = std::fs::read_to_string(format!("/proc/{pid}/{f}"))
                .unwrap_or_else(|e| format!("({e})"));
            format!("{f}: {}", v.trim())
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Makes migration scenarios run one at a time across the test binaries
/// that call it (an exclusive lock held until this test child exits):
/// each is built for this machine's two CPUs, since the races it provokes
/// need the migration and the application's threads to run in parallel,
/// which a second scenario's threads would prevent; some change sysfs.
pub fn one_at_a_time() {
    std::mem::forget(exclusive_lock("foliokit-migrate-concurrent.lock"));
}

/// Takes an exclusive lock on the file `name` in the temporary directory,
/// held until the returned descriptor is closed (or the process exits):
/// test processes that change shared state take turns with it.
fn exclusive_lock(name: &str) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let path = std::env::temp_dir().join(name);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .expect("open the lock file");
    // SAFETY: flock on our own descriptor.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
    f
}

/// The first NUMA node (every machine has it): where the migration tests
/// move pages when any node will do.
pub fn node() -> u32 {
    foliokit::mem::system::numa_nodes()[0]
}

/// Migration options for the scenarios: `path`, batches of `batch_pages`,
/// and two channels (the scenarios are built for two CPUs, see
/// [`one_at_a_time`]).
pub fn opts(
    path: foliokit::migrate::Path,
    batch_pages: usize,
) -> foliokit::migrate::MigrateOptions {
    foliokit::migrate::MigrateOptions::default()
        .path(path)
        .channels(2)
        .batch_pages(batch_pages)
}

/// A migration scenario's test `$test`: `$body` runs in a child process
/// (limit [`LIMIT`]), one at a time with the other scenarios.
#[allow(unused_macros)]
macro_rules! scenario_test {
    ($(#[$attr:meta])* $test:ident => $body:expr) => {
        $(#[$attr])*
        #[test]
        fn $test() {
            crate::common::in_child(stringify!($test), crate::common::LIMIT, || {
                // End libtest's "test NAME ... " line, so that the lines
                // below start with SKIP:/NOTE: and the parent shows them.
                println!();
                crate::common::one_at_a_time();
                $body
            })
        }
    };
}

/// Two tests per scenario `fn(foliokit::migrate::Path)` (a function or a
/// closure): relocation (skipped, saying why, where it is unavailable) and
/// the kernel path, each a [`scenario_test`].
#[allow(unused_macros)]
macro_rules! on_both_paths {
    ($scenario:expr => $relocate:ident, $kernel:ident) => {
        scenario_test!($relocate => {
            if crate::common::relocation_available() {
                ($scenario)(foliokit::migrate::Path::Relocate)
            }
        });
        scenario_test!($kernel => ($scenario)(foliokit::migrate::Path::Kernel));
    };
}

const HUGETLB_2M_NR: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

/// A private anonymous mapping of 2 MiB hugetlb pages, the pool grown for
/// it where it was short (root only) and shrunk by as much on drop.
pub struct Hugetlb {
    pub addr: usize,
    pub len: usize,
    added: usize,
}

impl Hugetlb {
    /// `len` bytes (whole 2 MiB pages) of hugetlb memory, untouched; or
    /// says why there is none here and returns `None`. Holds, until this
    /// test process exits, a lock the other processes using this function
    /// take too, so no two of them grow or shrink the pool at once. A
    /// test child killed (it hung) leaves the pool as grown: a setting,
    /// the next test's growth counts from it.
    pub fn new(len: usize) -> Option<Hugetlb> {
        assert_eq!(len % THP, 0, "whole 2 MiB pages");
        hugetlb_lock();
        let need = len / THP;
        let nr = HUGETLB_2M_NR;
        let Some(pool) = foliokit::mem::system::hugetlb_pool(THP) else {
            missing(Need::Hugetlb, "this kernel has no 2 MiB hugetlb pool");
            return None;
        };
        let mut added = 0;
        if pool.available() < need {
            if !foliokit::mem::system::is_root() {
                missing(
                    Need::Root,
                    &format!(
                    "the 2 MiB hugetlb pool has {} of {need} pages free, and growing it needs root",
                    pool.available()
                ),
                );
                return None;
            }
            // As foliokit_lab::hugetlb::HugetlbGrant grows it (the
            // library's own tests cannot use the lab).
            let want = pool.total + need - pool.available();
            let _ = std::fs::write(nr, want.to_string());
            let got = foliokit::mem::system::hugetlb_pool(THP).map_or(0, |p| p.total);
            added = got.saturating_sub(pool.total);
            if got < want {
                shrink_pool(nr, added);
                missing(
                    Need::Hugetlb,
                    &format!("the kernel found {added} of {need} free 2 MiB pages"),
                );
                return None;
            }
        }
        // SAFETY: a new private mapping; nothing else is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            shrink_pool(nr, added);
            missing(
                Need::Hugetlb,
                &format!("mmap(MAP_HUGETLB): {}", std::io::Error::last_os_error()),
            );
            return None;
        }
        Some(Hugetlb {
            addr: p as usize,
            len,
            added,
        })
    }
}

/// Takes the pool lock for this process, once (a second `Hugetlb` in the
/// same process must not wait for the first).
fn hugetlb_lock() {
    static LOCK: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    LOCK.get_or_init(|| exclusive_lock("foliokit-hugetlb.lock"));
}

fn shrink_pool(nr: &str, by: usize) {
    if by == 0 {
        return;
    }
    if let Some(now) = std::fs::read_to_string(nr)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
    {
        let _ = std::fs::write(nr, now.saturating_sub(by).to_string());
    }
}

impl Drop for Hugetlb {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unused from here on.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
        shrink_pool(HUGETLB_2M_NR, self.added);
    }
}

/// One line of /proc/self/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsLine {
    pub start: usize,
    pub end: usize,
    /// `rw-p` and the like.
    pub perms: String,
    pub inode: u64,
    /// The path or `[name]`, if the line has one (with a ` (deleted)`
    /// suffix where the file was deleted).
    pub path: Option<String>,
}

/// This process's mappings (/proc/self/maps, which walks no page tables).
pub fn maps() -> Vec<MapsLine> {
    let text = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (a, b) = f.next()?.split_once('-')?;
            let perms = f.next()?.to_owned();
            let _offset = f.next()?;
            let _dev = f.next()?;
            let inode = f.next()?.parse().ok()?;
            let path = f.collect::<Vec<_>>().join(" ");
            let path = (!path.is_empty()).then_some(path);
            Some(MapsLine {
                start: usize::from_str_radix(a, 16).ok()?,
                end: usize::from_str_radix(b, 16).ok()?,
                perms,
                inode,
                path,
            })
        })
        .collect()
}

/// The mappings overlapping `[start, end)`.
pub fn maps_overlapping(start: usize, end: usize) -> Vec<MapsLine> {
    maps()
        .into_iter()
        .filter(|m| m.end > start && m.start < end)
        .collect()
}

/// The 8-byte word at `addr`, shared with other threads.
pub fn word<'a>(addr: usize) -> &'a std::sync::atomic::AtomicU64 {
    // SAFETY: callers pass 8-aligned addresses inside a mapping they keep
    // while they use the reference; while threads share a word, every
    // user-space access to it is atomic.
    unsafe { std::sync::atomic::AtomicU64::from_ptr(addr as *mut u64) }
}

/// Word `k` of a page whose version is `v` (word 0 is `v` itself).
pub fn page_word(v: u64, k: usize) -> u64 {
    if k == 0 {
        v
    } else {
        v ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// Writes version `v` of the page at `addr`, word 0 last (with release),
/// so a reader that sees `v` in word 0 sees the whole version.
pub fn fill_page(addr: usize, v: u64) {
    use std::sync::atomic::Ordering::{Relaxed, Release};
    for k in (1..PAGE / 8).rev() {
        word(addr + k * 8).store(page_word(v, k), Relaxed);
    }
    word(addr).store(v, Release);
}

/// Whether the page at `addr` holds version `v` exactly (0: all zero).
pub fn page_is(addr: usize, v: u64) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    (0..PAGE / 8).all(|k| {
        let want = if v == 0 { 0 } else { page_word(v, k) };
        word(addr + k * 8).load(Relaxed) == want
    })
}

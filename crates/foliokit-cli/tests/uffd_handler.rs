//! `foliokit uffd-handler` against a process speaking Firecracker's side
//! of the protocol (`foliokit __vmm`, see `foliokit_lab::vmm`): guest
//! memory of 4 KiB anonymous and 2 MiB hugetlb pages, vCPU threads
//! reading and writing (every read the file's byte or a newer write), a
//! balloon discarding ranges during the fill (zeros there afterwards,
//! never file bytes), the memory file cut short mid-fill (the pages past
//! the cut poisoned and reported), the VMM exiting mid-fill, and VMMs
//! that misbehave (or connect and say nothing).

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{foliokit, missing, say, Need, Scratch};
use serde_json::Value;

/// A memory file of `size` bytes: every 8-byte word names its offset, so
/// no page equals another, and none is zeros.
fn mem_file(path: &Path, size: usize) {
    let mut bytes = Vec::with_capacity(size);
    for w in 0..size / 8 {
        bytes.extend_from_slice(&((w as u64) ^ 0xA5A5_0000_0000_0000).to_ne_bytes());
    }
    std::fs::write(path, bytes).expect("writing the memory file");
}

/// Waits (20 s at most) for the handler to bind `sock`.
fn wait_for_socket(sock: &Path) {
    let t = Instant::now();
    while !sock.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the handler never bound its socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts the handler on `dir/sock` serving `mem`, and waits for its
/// socket.
fn handler(dir: &Scratch, mem: &Path, extra: &[&str]) -> Child {
    let sock = dir.join("sock");
    let child = foliokit()
        .arg("uffd-handler")
        .arg(&sock)
        .arg(mem)
        .args(["--format", "json", "--quiet"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the handler");
    wait_for_socket(&sock);
    child
}

/// Runs the VMM player against `dir/sock` for a guest of `size` bytes.
fn vmm(dir: &Scratch, mem: &Path, size: &str, args: &[&str]) -> Output {
    foliokit()
        .arg("__vmm")
        .arg("--socket")
        .arg(dir.join("sock"))
        .arg("--mem-file")
        .arg(mem)
        .args(["--size", size])
        .args(args)
        .output()
        .expect("run the VMM")
}

/// Waits for the handler to end (60 s at most: it must exit once the VMM
/// has gone), and returns what it said.
fn finish(mut h: Child) -> Output {
    let t = Instant::now();
    while h.try_wait().expect("wait").is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            let _ = h.kill();
            panic!("the handler did not exit after the VMM had gone");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    h.wait_with_output().expect("its output")
}

/// Whether the VMM could not make its userfaultfd here (then the test is
/// skipped with the reason, and the handler, which still waits for a
/// connection that will never come, is stopped).
fn no_uffd(out: &Output, h: &mut Child) -> bool {
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("making a userfaultfd") {
        let _ = h.kill();
        let _ = h.wait();
        missing(Need::Uffd, &format!("the VMM player: {}", err.trim()));
        return true;
    }
    false
}

fn vmm_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "the VMM failed ({}): {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the VMM's JSON")
}

fn handler_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "the handler failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the handler's JSON")
}

/// Runs a guest against the handler and checks both sides' reports.
fn guest(name: &str, size: usize, vmm_args: &[&str]) -> Option<(Value, Value)> {
    let dir = Scratch::new(name);
    let mem = dir.join("mem");
    mem_file(&mem, size);
    let mut h = handler(&dir, &mem, &[]);
    let v = vmm(&dir, &mem, &size.to_string(), vmm_args);
    if no_uffd(&v, &mut h) {
        return None;
    }
    let vj = vmm_json(&v);
    let hj = handler_json(&finish(h));
    say(&format!("{name}: vmm {vj}\n  handler {hj}"));
    assert_eq!(vj["wrong_count"], 0, "{vj}");
    assert_eq!(vj["pages"].as_u64(), Some(size as u64 / 4096));
    assert_eq!(hj["total_bytes"].as_u64(), Some(size as u64));
    assert_eq!(hj["bad_pages"], 0);
    Some((vj, hj))
}

#[test]
fn anonymous_guest_reads_the_file_or_newer_writes_and_zeros_where_ballooned() {
    let Some((vj, hj)) = guest(
        "fc-anon",
        48 << 20,
        &[
            "--vcpus",
            "3",
            "--regions",
            "3",
            "--write-every",
            "3",
            "--balloon-every",
            "40",
        ],
    ) else {
        return;
    };
    assert!(vj["ballooned"].as_u64() > Some(0));
    assert!(hj["faults"].as_u64() > Some(0), "{hj}");
}

#[test]
fn zero_pages_of_a_dense_memory_file_go_in_as_zero_pages() {
    use std::os::unix::fs::FileExt;
    let dir = Scratch::new("fc-zero");
    let mem = dir.join("mem");
    let size = 64usize << 20;
    let chunk = 2usize << 20;
    mem_file(&mem, size);
    // Every other 2 MiB all zero, and three single pages in a data chunk,
    // written as bytes: a dense file, as Firecracker writes it.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&mem)
        .expect("the memory file");
    for i in (0..size / chunk).step_by(2) {
        f.write_all_at(&vec![0u8; chunk], (i * chunk) as u64)
            .expect("zeros");
    }
    for p in [512 + 7, 512 + 100, 512 + 511] {
        f.write_all_at(&[0u8; 4096], (p * 4096) as u64)
            .expect("a zero page");
    }
    drop(f);
    // Both copy threads take blocks: zeros are found on each.
    let mut h = handler(&dir, &mem, &["--channels", "2"]);
    let v = vmm(&dir, &mem, &size.to_string(), &["--no-touch"]);
    if no_uffd(&v, &mut h) {
        return;
    }
    let vj = vmm_json(&v);
    let hj = handler_json(&finish(h));
    say(&format!("fc-zero: vmm {vj}\n  handler {hj}"));
    assert_eq!(vj["wrong_count"], 0, "{vj}");
    let zero = (size / chunk / 2 * 512 + 3) as u64;
    assert_eq!(hj["zero_pages"].as_u64(), Some(zero), "{hj}");
}

#[test]
fn hugetlb_guest_is_filled_a_huge_page_at_a_time() {
    let size = 32usize << 20;
    let grant = match foliokit_lab::hugetlb::HugetlbGrant::reserve(2 << 20, size / (2 << 20) + 4) {
        Ok(g) => g,
        Err(why) => {
            missing(
                Need::Hugetlb,
                &format!("no 2 MiB hugetlb pages for the guest: {why}"),
            );
            return;
        }
    };
    let r = guest(
        "fc-hugetlb",
        size,
        &[
            "--backing",
            "hugetlb",
            "--vcpus",
            "2",
            "--write-every",
            "5",
            "--balloon-every",
            "2048",
        ],
    );
    drop(grant);
    let Some((vj, _)) = r else { return };
    assert!(
        vj["ballooned"].as_u64() >= Some(512),
        "whole huge pages discarded: {vj}"
    );
}

#[test]
fn the_handler_exits_cleanly_when_the_vmm_dies_mid_fill() {
    let dir = Scratch::new("fc-exit");
    let mem = dir.join("mem");
    let size = 256usize << 20;
    mem_file(&mem, size);
    // A small budget and one channel keep the fill running when it dies.
    let mut h = handler(
        &dir,
        &mem,
        &["--channels", "1", "--latency-budget", "200us"],
    );
    let v = vmm(&dir, &mem, &size.to_string(), &["--exit-after", "64"]);
    if no_uffd(&v, &mut h) {
        return;
    }
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    let hj = handler_json(&finish(h));
    say(&format!("after the VMM died: {hj}"));
    // 64 touches take far less than a 256 MiB fill on one channel.
    let notes = hj["notes"].to_string();
    assert!(
        notes.contains("went away before every page was in"),
        "the fill was not cut short: {hj}"
    );
}

/// Runs a VMM that sends `message` (or, with `None`, its regions with
/// `vmm_args`) to a handler serving a file of `file_size` bytes: the
/// handler must refuse in one line saying `want` and exit 1, with no
/// guest page installed.
fn refused(name: &str, file_size: usize, message: Option<&[u8]>, vmm_args: &[&str], want: &str) {
    let dir = Scratch::new(name);
    let mem = dir.join("mem");
    mem_file(&mem, file_size);
    let mut h = handler(&dir, &mem, &[]);
    let msg = dir.join("message");
    let mut args: Vec<String> = vmm_args.iter().map(|s| s.to_string()).collect();
    args.push("--no-touch".into());
    if let Some(m) = message {
        std::fs::write(&msg, m).expect("the message");
        args.push("--message".into());
        args.push(msg.display().to_string());
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = vmm(&dir, &mem, "16M", &argv);
    if no_uffd(&v, &mut h) {
        return;
    }
    let vj = vmm_json(&v);
    let out = finish(h);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{name}: {err}");
    assert!(
        err.contains(want) && err.trim().lines().count() == 1,
        "{name}: wanted one line saying {want:?}, got: {err}"
    );
    assert_eq!(
        vj["resident_pages"], 0,
        "{name}: the handler installed pages: {vj}"
    );
    say(&format!("{name}: {}", err.trim()));
}

#[test]
fn a_malformed_message_is_refused_with_nothing_installed() {
    refused(
        "fc-malformed",
        16 << 20,
        Some(br#"{"base_host_virt_addr": 1}"#),
        &[],
        "not a JSON array of guest regions",
    );
}

#[test]
fn a_short_message_is_refused_with_nothing_installed() {
    refused(
        "fc-short",
        16 << 20,
        Some(br#"[{"base_host_virt_addr": 4096, "si"#),
        &[],
        "ended after",
    );
}

#[test]
fn an_oversized_message_is_refused_with_nothing_installed() {
    let mut m = vec![b'['];
    m.extend(std::iter::repeat_n(b' ', 2 << 20));
    refused("fc-oversized", 16 << 20, Some(&m), &[], "is over");
}

#[test]
fn a_memory_file_shorter_than_the_regions_is_refused() {
    refused(
        "fc-short-file",
        8 << 20,
        None,
        &["--regions", "2"],
        "of the memory file",
    );
}

#[test]
fn a_page_size_that_is_not_the_mappings_is_refused() {
    refused(
        "fc-page-size",
        16 << 20,
        None,
        &["--claim-page-size", "2M"],
        "its page size is not the mapping's",
    );
}

#[test]
fn a_socket_that_exists_is_refused_in_one_line() {
    let dir = Scratch::new("fc-bound");
    let mem = dir.join("mem");
    mem_file(&mem, 1 << 20);
    std::fs::write(dir.join("sock"), b"").expect("a file in the way");
    let out = Command::new(env!("CARGO_BIN_EXE_foliokit"))
        .arg("uffd-handler")
        .arg(dir.join("sock"))
        .arg(&mem)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("remove a stale socket first") && err.trim().lines().count() == 1,
        "{err}"
    );
}

#[test]
fn a_peer_that_connects_and_says_nothing_is_given_up_on() {
    let dir = Scratch::new("fc-silent");
    let mem = dir.join("mem");
    mem_file(&mem, 1 << 20);
    let h = handler(&dir, &mem, &["--message-timeout", "300ms"]);
    // Connects as Firecracker would, and sends nothing.
    let peer = std::os::unix::net::UnixStream::connect(dir.join("sock")).expect("connect");
    let t = Instant::now();
    let out = finish(h);
    drop(peer);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no whole message from the VMM within 300ms")
            && err.trim().lines().count() == 1,
        "wanted one line saying the message never came, got: {err}"
    );
    say(&format!(
        "fc-silent: {} (after {:.1} s)",
        err.trim(),
        t.elapsed().as_secs_f64()
    ));
}

/// The handler, not quiet (its first line, the descriptor's costs, comes
/// once the fill has started), its stderr read on a thread that says
/// when that line came.
fn loud_handler(
    dir: &Scratch,
    mem: &Path,
    extra: &[&str],
) -> (
    Child,
    std::sync::mpsc::Receiver<&'static str>,
    std::thread::JoinHandle<String>,
) {
    use std::io::BufRead;
    let sock = dir.join("sock");
    let mut child = foliokit()
        .arg("uffd-handler")
        .arg(&sock)
        .arg(mem)
        .args(["--format", "json"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the handler");
    let err = child.stderr.take().expect("its stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("the VMM's userfaultfd has") {
                let _ = tx.send("started");
            }
            if line.contains("every page in after") {
                let _ = tx.send("all in");
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    wait_for_socket(&sock);
    (child, rx, lines)
}

#[test]
fn snapshot_pages_cut_off_mid_fill_are_poisoned_and_reported() {
    let dir = Scratch::new("fc-cut");
    let mem = dir.join("mem");
    let size = 256usize << 20;
    let cut = size / 4 * 3;
    mem_file(&mem, size);
    // One channel and a small budget: the fill takes a while to reach
    // the cut, which comes as soon as it has started.
    let (mut h, started, lines) = loud_handler(
        &dir,
        &mem,
        &["--channels", "1", "--latency-budget", "200us"],
    );
    // The VMM waits while the fill runs (until told every page is in),
    // then its vCPUs touch and check the pages below the cut, and it
    // probes those from the cut: the test is of what the fill left, not
    // of faults (a probe's forked child would read zeros where the fill
    // had not got yet: no FORK events).
    let go = dir.join("go");
    let mut v = foliokit()
        .arg("__vmm")
        .arg("--socket")
        .arg(dir.join("sock"))
        .arg("--mem-file")
        .arg(&mem)
        .args(["--size", &size.to_string(), "--cut", &cut.to_string()])
        .arg("--go-file")
        .arg(&go)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the VMM");
    let t = Instant::now();
    loop {
        if started.try_recv() == Ok("started") {
            break;
        }
        if v.try_wait().expect("wait").is_some() || t.elapsed() > Duration::from_secs(30) {
            let _ = v.kill();
            let out = v.wait_with_output().expect("its output");
            if no_uffd(&out, &mut h) {
                return;
            }
            let _ = h.kill();
            panic!(
                "the fill never started: vmm {} {}; handler {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                lines.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // The fill has started: the memory file loses its last quarter.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&mem)
        .expect("open the memory file")
        .set_len(cut as u64)
        .expect("truncate");
    // Every page in (or poisoned): the VMM may look.
    let t = Instant::now();
    loop {
        match started.try_recv() {
            Ok("all in") => break,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                panic!("the handler ended before every page was in")
            }
            _ => {}
        }
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "the handler never said every page was in"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(&go, b"go").expect("the go file");
    let vj = vmm_json(&v.wait_with_output().expect("the VMM's output"));
    let out = finish(h);
    let said = lines.join().unwrap_or_default();
    assert!(out.status.success(), "the handler failed: {said}");
    let hj: Value = serde_json::from_slice(&out.stdout).expect("the handler's JSON");
    say(&format!(
        "fc-cut: vmm probes {}\n  handler {hj}",
        vj["probes"]
    ));
    // Below the cut: every page the file's bytes (the VMM checked each).
    assert_eq!(vj["wrong_count"], 0, "{vj}");
    assert_eq!(vj["pages"].as_u64(), Some(cut as u64 / 4096));
    let p = |k: &str| hj[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(
        p("faulted_pages") + p("filled_pages"),
        cut as u64 / 4096,
        "{hj}"
    );
    // From the cut: every page bad, in one range, reported as vanished.
    assert_eq!(p("bad_pages"), (size - cut) as u64 / 4096, "{hj}");
    let base = vj["base"].as_u64().expect("the guest's base");
    assert_eq!(
        hj["bad"],
        serde_json::json!([[format!("{:#x}", base + cut as u64), size - cut, "Vanished"]]),
        "{hj}"
    );
    // What a vCPU touching one gets: SIGBUS where the kernel installs
    // poison (UFFDIO_POISON, 6.6), else zeros, as the report says.
    let want = match hj["bad_outcome"].as_str() {
        Some("Poisoned") => "sigbus",
        Some("Zeroed") => "zeros",
        o => panic!("bad_outcome {o:?}"),
    };
    let probes = vj["probes"].as_array().expect("probes");
    assert_eq!(probes.len(), 3, "{vj}");
    for pr in probes {
        assert_eq!(pr[1], want, "page at guest offset {}: {vj}", pr[0]);
    }
}

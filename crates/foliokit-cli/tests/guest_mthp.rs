//! mTHP rows of `bench copy` and `bench clear` are backed by the folio size
//! they name (kpageflags census), where the kernel has mTHP; where it has
//! none (Linux 6.1), asking for those sizes is refused with the sizes the
//! kernel offers. Run on the
//! host and, through `cargo xtask vm-test`, in the 6.12 and 6.1 guests.

mod common;

use common::{foliokit, json, missing, say, Need};
use serde_json::Value;
use std::process::Command;

const SIZES: [(usize, &str); 2] = [(16 << 10, "16K"), (64 << 10, "64K")];

fn is_root() -> bool {
    foliokit::mem::system::is_root()
}

fn has_mthp() -> bool {
    std::path::Path::new("/sys/kernel/mm/transparent_hugepage/hugepages-16kB").exists()
}

/// `bench copy` or `bench clear` of the mTHP sizes, as JSON.
fn bench(op: &str) -> Command {
    let mut c = foliokit();
    c.args([
        "bench",
        op,
        "-s",
        "8M",
        "-p",
        "16K,64K",
        "-f",
        if op == "copy" { "movsb" } else { "stosb" },
        "-l",
        "1",
        "--no-limits",
        "--format",
        "json",
    ]);
    c
}

/// The share of the bytes a census line ("… census of the first 8M: 16K
/// x500, 4K x48") counts in folios of `size`.
fn share_of(obtained: &str, size: usize) -> f64 {
    let Some((_, census)) = obtained.rsplit_once(": ") else {
        return 0.0;
    };
    let (mut want, mut all) = (0usize, 0usize);
    for part in census.trim_end_matches(')').split(", ") {
        let Some((k, n)) = part.split_once("K x") else {
            continue;
        };
        let (Ok(k), Ok(n)) = (k.trim().parse::<usize>(), n.trim().parse::<usize>()) else {
            continue;
        };
        all += k * n;
        if k << 10 == size {
            want += k * n;
        }
    }
    if all == 0 {
        0.0
    } else {
        want as f64 / all as f64
    }
}

#[test]
fn census_shares_are_read_by_bytes() {
    let line = "mTHP 16K (census of the first 8M: 16K x500, 4K x48)";
    assert!((share_of(line, 16 << 10) - 8000.0 / 8192.0).abs() < 1e-9);
    assert_eq!(share_of("4K pages", 16 << 10), 0.0);
}

#[test]
fn mthp_rows_are_backed_by_their_folio_size_or_say_why_not() {
    if !is_root() {
        missing(
            Need::Root,
            "needs root: enabling an mTHP size and reading /proc/kpageflags for the census",
        );
        return;
    }
    if std::fs::metadata("/sys/kernel/mm/transparent_hugepage/enabled").is_err() {
        missing(Need::Thp, "this kernel has no THP at all");
        return;
    }
    for op in ["copy", "clear"] {
        if !has_mthp() {
            // Linux 6.1: no mTHP sizes. Asking for one is refused up front,
            // with the sizes this kernel does offer, before any memory is
            // touched or any sysfs knob changed.
            let out = bench(op).output().expect("run foliokit");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "bench {op} -p 16K ran without mTHP");
            assert!(
                err.contains("folio size 16K has no THP order on this kernel; it offers"),
                "bench {op}: unexpected error: {err}"
            );
            say(&format!(
                "bench {op} without mTHP degrades as documented: {}",
                err.trim()
            ));
            continue;
        }
        let r = json(&mut bench(op));
        let backing = r["backing"].as_array().expect("backing list");
        for (size, name) in SIZES {
            let rows: Vec<&Value> = backing
                .iter()
                .filter(|b| b["folio_size"].as_u64() == Some(size as u64))
                .collect();
            assert!(
                !rows.is_empty(),
                "bench {op}: no backing for {name}: {backing:?}"
            );
            for b in rows {
                let got = b["obtained"].as_str().unwrap_or_default();
                let share = share_of(got, size);
                assert!(
                    share >= 0.9,
                    "bench {op} {name} {}: only {:.0}% of the census in {name} folios: {got}",
                    b["buffer"],
                    share * 100.0
                );
                say(&format!("bench {op} {name} {}: {got}", b["buffer"]));
            }
        }
    }
}

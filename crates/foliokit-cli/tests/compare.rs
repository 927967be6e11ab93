//! `foliokit compare` on hand-made results whose verdicts are known: a
//! change beyond both spreads either way, one inside them, too few runs,
//! a lower-is-better metric, rows on one side only, a kernel difference.

mod common;

use common::{foliokit, json, refused, run_ok, Scratch};
use serde_json::{json, Value};

fn stats(mean: f64, sd: f64, runs: u64) -> Value {
    json!({"mean": mean, "stdev": sd, "median": mean, "min": mean - sd, "max": mean + sd, "runs": runs})
}

fn copy_row(f: &str, mean: f64, sd: f64, runs: u64) -> Value {
    json!({"function": f, "resolved": f, "folio_size": 2097152, "channels": 1,
           "gbps": stats(mean, sd, runs), "speedup": 1.0})
}

fn machine(kernel: &str) -> Value {
    json!({"cpu": {"model": "test CPU", "logical_cpus": 2},
           "system": {"kernel": kernel, "numa_nodes": [0], "thp": {"enabled": "madvise"}}})
}

fn lab(kernel: &str, copy: Vec<Value>, init: Vec<Value>) -> Value {
    json!({
        "machine": machine(kernel),
        "experiments": [
            {"experiment": "copy", "params": {"mc": false}, "machine": machine(kernel), "rows": copy},
            {"experiment": "init", "params": {}, "machine": machine(kernel), "rows": init},
        ]
    })
}

#[test]
fn compare_calls_changes_only_beyond_the_spread() {
    let dir = Scratch::new("compare");
    // Each copy row's mean on side A and on side B (a side without one
    // lacks the row), its stdev and runs: the verdict reads off one line.
    let copy = [
        ("up", Some(10.0), Some(12.0), 0.5, 5),
        ("down", Some(10.0), Some(8.0), 0.5, 5),
        ("noisy", Some(10.0), Some(11.0), 2.0, 5),
        ("once", Some(10.0), Some(20.0), 0.0, 1),
        ("only-a", Some(10.0), None, 0.5, 5),
        ("only-b", None, Some(10.0), 0.5, 5),
    ];
    let side = |kernel: &str, on_b: bool, rebind_ms: f64| {
        let rows = copy
            .iter()
            .filter_map(|&(f, a, b, sd, runs)| {
                Some(copy_row(f, if on_b { b } else { a }?, sd, runs))
            })
            .collect();
        let init = json!({"function": "template-nt", "record_size": 64, "rebind_ms": stats(rebind_ms, 5.0, 5)});
        lab(kernel, rows, vec![init])
    };
    let (a, b) = (side("6.1.0", false, 100.0), side("6.12.0", true, 80.0));
    let (pa, pb) = (dir.join("a.json"), dir.join("b.json"));
    std::fs::write(&pa, a.to_string()).unwrap();
    std::fs::write(&pb, b.to_string()).unwrap();
    let v = json(
        foliokit()
            .args(["compare", "--format", "json"])
            .args([&pa, &pb]),
    );
    let change = |row: &str| -> Value {
        let r = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["row"].as_str().unwrap().starts_with(row))
            .unwrap_or_else(|| panic!("no row {row}: {v}"));
        r["changes"][0].clone()
    };
    assert_eq!(change("up "), "better");
    assert_eq!(change("down "), "worse");
    assert_eq!(change("noisy "), "within_noise");
    assert_eq!(change("once "), "too_few_runs");
    assert_eq!(change("only-a "), Value::Null);
    assert_eq!(change("only-b "), Value::Null);
    // Lower is better for a time: 100 ms -> 80 ms is better.
    assert_eq!(change("template-nt "), "better");
    let ratio = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["row"].as_str().unwrap().starts_with("up "))
        .unwrap()["ratios"][0]
        .as_f64()
        .unwrap();
    assert!((ratio - 1.2).abs() < 1e-9, "ratio {ratio}");
    let diffs = v["machine_differences"].to_string();
    assert!(
        diffs.contains("kernel: 6.1.0 | 6.12.0"),
        "kernel difference not reported: {diffs}"
    );

    // A row name longer than `format!` can pad (65535) is cut in the
    // table; it used to panic there.
    let long = "x".repeat(70_000);
    let c = lab("6.12.0", vec![copy_row(&long, 10.0, 0.1, 5)], vec![]);
    let pc = dir.join("long.json");
    std::fs::write(&pc, c.to_string()).unwrap();
    let out = run_ok(foliokit().arg("compare").args([&pa, &pc]));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("xxx…"),
        "the long name is not cut: {table:.300}"
    );

    // Bad input is one clear line, not a panic.
    std::fs::write(dir.join("bad.json"), "{\"x\": 1}").unwrap();
    refused(
        foliokit().arg("compare").args([pa, dir.join("bad.json")]),
        "neither a lab's results.json nor a bench's JSON",
    );
}

#[test]
fn compare_takes_lab_directories_and_refuses_results_without_rows() {
    let dir = Scratch::new("compare-dirs");
    let (a, b) = (dir.join("a"), dir.join("b"));
    for (d, mean) in [(&a, 10.0), (&b, 12.0)] {
        std::fs::create_dir_all(d).unwrap();
        let r = lab("6.12.0", vec![copy_row("movsb", mean, 0.1, 5)], vec![]);
        std::fs::write(d.join("results.json"), r.to_string()).unwrap();
    }
    let v = json(
        foliokit()
            .args(["compare", "--format", "json"])
            .args([&a, &b]),
    );
    assert_eq!(v["rows"].as_array().unwrap().len(), 1);
    // A results file with no measured rows is refused with one line.
    let empty = dir.join("empty.json");
    std::fs::write(&empty, lab("6.12.0", vec![], vec![]).to_string()).unwrap();
    refused(
        foliokit().arg("compare").args([&a, &empty]),
        "no rows with a measurement",
    );
}

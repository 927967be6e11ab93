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
    let c = lab(
        "6.12.0",
        vec![copy_row(&long, 10.0, 0.1, 5), copy_row("up", 10.0, 0.5, 5)],
        vec![],
    );
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

/// Writes `v` as `name` in `dir` and gives its path.
fn put(dir: &Scratch, name: &str, v: &Value) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

#[test]
fn compare_escapes_experiment_names_in_the_page() {
    let dir = Scratch::new("compare-escape");
    let evil = "<script>alert(1)</script>";
    let bench = json!({"experiment": evil, "machine": machine("6.12.0"),
                       "rows": [copy_row("<b>f</b>", 10.0, 0.1, 5)]});
    let p = put(&dir, "a.json", &bench);
    let out = dir.join("out");
    run_ok(
        foliokit()
            .arg("compare")
            .args([&p, &p])
            .arg("--out")
            .arg(&out),
    );
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(
        !html.contains("<script>alert") && !html.contains("<b>f"),
        "unescaped name in the page"
    );
    assert!(html.contains("<a href=\"#_script_alert_1___script_\">&lt;script&gt;"));
    assert!(html.contains("<h2 id=\"_script_alert_1___script_\">&lt;script&gt;"));
}

#[test]
fn compare_names_the_wrongly_typed_field() {
    let dir = Scratch::new("compare-typed");
    let good = put(
        &dir,
        "good.json",
        &lab("6.12.0", vec![copy_row("f", 10.0, 0.1, 5)], vec![]),
    );
    let mut channels = copy_row("f", 10.0, 0.1, 5);
    channels["channels"] = json!("2");
    let bench = json!({"experiment": "copy", "rows": [channels]});
    let mut size = copy_row("f", 10.0, 0.1, 5);
    size["folio_size"] = json!(-1);
    let mut runs = copy_row("f", 10.0, 0.1, 5);
    runs["gbps"]["runs"] = json!(-3);
    for (file, want) in [
        (
            put(&dir, "channels.json", &bench),
            "channels.json is not a valid bench JSON: rows[0].channels: invalid type: string \"2\", expected u64",
        ),
        (
            put(&dir, "size.json", &lab("6.12.0", vec![copy_row("g", 1.0, 0.1, 5), size], vec![])),
            "size.json is not a valid lab results.json: experiments[0].rows[1].folio_size: invalid value: integer `-1`",
        ),
        (
            put(&dir, "runs.json", &lab("6.12.0", vec![], vec![runs])),
            "runs.json is not a valid lab results.json: experiments[1].rows[0].gbps: invalid value: integer `-3`",
        ),
    ] {
        refused(foliokit().arg("compare").args([&good, &file]), want);
    }
}

#[test]
fn compare_labels_more_than_26_runs_like_spreadsheet_columns() {
    let dir = Scratch::new("compare-labels");
    let p = put(
        &dir,
        "a.json",
        &lab("6.12.0", vec![copy_row("f", 10.0, 0.1, 5)], vec![]),
    );
    let files = vec![&p; 28];
    let out = run_ok(foliokit().arg("compare").args(&files));
    let table = String::from_utf8_lossy(&out.stdout);
    for want in ["# Z = ", "# AA = ", "# AB = ", "AB/A", "# AB vs A: "] {
        assert!(table.contains(want), "no {want:?} in: {table}");
    }
    assert!(!table.contains("# [ = "), "past Z: {table}");
    let out = run_ok(foliokit().args(["compare", "--format", "csv"]).args(&files));
    let head = String::from_utf8_lossy(&out.stdout);
    let head = head.lines().next().unwrap();
    assert!(
        head.contains(",aa_mean,") && head.ends_with(",ab_over_a,ab_change"),
        "{head}"
    );
}

#[test]
fn compare_takes_no_ratio_of_a_median_that_is_not_positive() {
    let dir = Scratch::new("compare-invalid");
    let a = lab(
        "6.12.0",
        vec![
            copy_row("neg", -3.0, 0.1, 5),
            copy_row("zero", 0.0, 0.1, 5),
            copy_row("ok", 10.0, 0.1, 5),
        ],
        vec![],
    );
    let b = lab(
        "6.12.0",
        vec![
            copy_row("neg", 1.0, 0.1, 5),
            copy_row("zero", 5.0, 0.1, 5),
            copy_row("ok", 12.0, 0.1, 5),
        ],
        vec![],
    );
    let (pa, pb) = (put(&dir, "a.json", &a), put(&dir, "b.json", &b));
    let v = json(
        foliokit()
            .args(["compare", "--format", "json"])
            .args([&pa, &pb]),
    );
    for r in v["rows"].as_array().unwrap() {
        let ok = r["row"].as_str().unwrap().starts_with("ok ");
        assert_eq!(r["ratios"][0].is_null(), !ok, "{r}");
        assert_eq!(r["changes"][0] == "not_compared", !ok, "{r}");
    }
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("copy neg 2M ch1 in ") && notes.contains("copy zero 2M ch1 in "),
        "{notes}"
    );
    let out = run_ok(foliokit().arg("compare").args([&pa, &pb]));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        !table.contains("infx") && !table.contains("-0.33x"),
        "{table}"
    );
    assert!(
        table.contains("# note: copy neg 2M ch1 in ") && table.contains("is not a positive figure"),
        "{table}"
    );
}

#[test]
fn compare_refuses_an_out_that_is_a_file_before_printing() {
    let dir = Scratch::new("compare-out-file");
    let p = put(
        &dir,
        "a.json",
        &lab("6.12.0", vec![copy_row("f", 10.0, 0.1, 5)], vec![]),
    );
    let file = put(&dir, "taken", &json!({}));
    let out = foliokit()
        .arg("compare")
        .args([&p, &p])
        .arg("--out")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "printed before failing: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    refused(
        foliokit()
            .arg("compare")
            .args([&p, &p])
            .arg("--out")
            .arg(&file),
        "exists and is not a directory",
    );
}

#[test]
fn compare_refuses_runs_with_no_row_in_common() {
    let dir = Scratch::new("compare-unrelated");
    let a = put(
        &dir,
        "a.json",
        &lab("6.12.0", vec![copy_row("f", 10.0, 0.1, 5)], vec![]),
    );
    let b = put(
        &dir,
        "b.json",
        &lab("6.12.0", vec![copy_row("g", 10.0, 0.1, 5)], vec![]),
    );
    refused(
        foliokit().arg("compare").args([&a, &b]),
        "b.json has no row in common with",
    );
}

#[test]
fn compare_refuses_a_row_label_twice_in_one_run() {
    let dir = Scratch::new("compare-duplicate");
    let a = put(
        &dir,
        "a.json",
        &lab("6.12.0", vec![copy_row("f", 10.0, 0.1, 5)], vec![]),
    );
    let twice = lab(
        "6.12.0",
        vec![copy_row("f", 10.0, 0.1, 5), copy_row("f", 20.0, 0.1, 5)],
        vec![],
    );
    let b = put(&dir, "b.json", &twice);
    refused(
        foliokit().arg("compare").args([&a, &b]),
        "b.json has the row \"f 2M ch1\" of copy more than once",
    );
    // Migration rows differing only in direction (table 3, one per
    // direction) are distinct rows, not duplicates.
    let dir_row = |d: &str| {
        let mut r = copy_row("f", 10.0, 0.1, 5);
        r["direction"] = json!(d);
        r
    };
    let c = put(
        &dir,
        "c.json",
        &lab("6.12.0", vec![dir_row("0->1"), dir_row("1->0")], vec![]),
    );
    let v = json(
        foliokit()
            .args(["compare", "--format", "json"])
            .args([&c, &c]),
    );
    assert_eq!(v["rows"][1]["row"], "f 2M ch1 1->0", "{v}");
}

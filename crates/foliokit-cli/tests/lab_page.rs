//! The lab's report page, rendered in a real browser: headless Chromium
//! (Debian's package; .ci/run installs it) loads index.html and the page's
//! self-check must report every plot drawn, every table filled, no errors.

mod common;

use common::{foliokit, fresh_dir, missing, run_ok, Need};
use std::path::{Path, PathBuf};
use std::process::Command;

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// Chromium flags for a sandboxed, offline machine (no network, root).
fn headless(browser: &Path, profile: &Path) -> Command {
    let mut c = Command::new(browser);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=10000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

fn attr(dom: &str, name: &str) -> Option<usize> {
    let key = format!("data-{name}=\"");
    let at = dom.find(&key)? + key.len();
    dom[at..].split('"').next()?.parse().ok()
}

#[test]
fn the_lab_page_renders_every_plot_and_table_in_headless_chromium() {
    // Kept afterwards: the screenshot is there to look at.
    let out = fresh_dir("lab-page");
    let run = run_ok(foliokit().args(["lab", "--smoke", "--out"]).arg(&out));

    // The files the lab promises.
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let experiments = results["experiments"].as_array().unwrap();
    // The restore table needs a userfaultfd the lab may use (root or
    // /dev/userfaultfd access); without one the lab notes why and skips it.
    let names: Vec<&str> = experiments
        .iter()
        .filter_map(|e| e["experiment"].as_str())
        .collect();
    let restore = names.contains(&"restore");
    assert_eq!(experiments.len(), 7 + usize::from(restore), "{names:?}");
    for e in experiments {
        let name = e["experiment"].as_str().unwrap();
        assert!(
            !e["rows"].as_array().unwrap().is_empty(),
            "{name} has no rows"
        );
        assert!(e["machine"]["cpu"]["model"].is_string());
    }
    let csvs = [
        "copy", "copy-mc", "clear", "fault", "init", "migrate", "mremap", "restore",
    ];
    for csv in csvs.iter().take(7 + usize::from(restore)) {
        let text = std::fs::read_to_string(out.join(format!("{csv}.csv"))).unwrap();
        assert!(text.lines().count() >= 2, "{csv}.csv has no rows");
    }
    // The summary: one line per seed experiment, each with a verdict.
    let summary = results["summary"]
        .as_array()
        .expect("results.json has a summary");
    assert!(summary.len() >= 5, "summary lines: {}", summary.len());
    for l in summary {
        for f in ["seed", "what", "seed_figure", "ours", "verdict"] {
            assert!(
                l[f].as_str().is_some_and(|s| !s.is_empty()),
                "summary line without {f}: {l}"
            );
        }
    }
    let terminal = String::from_utf8_lossy(&run.stdout);
    assert!(
        terminal.contains("# summary: the seeds' figures and ours"),
        "the terminal output ends without the summary"
    );
    let page = out.join("index.html");
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing is loaded from anywhere (SVG's xmlns is a
    // name, not a fetch).
    for load in ["src=\"http", "href=\"http", "url(http", "@import"] {
        assert!(!html.contains(load), "the page loads a resource: {load}");
    }

    let Some(browser) = chromium() else {
        missing(
            Need::Browser,
            "the browser half: no chromium on PATH (.ci/run installs Debian's package)",
        );
        return;
    };
    let url = format!("file://{}", page.display());
    let dom = headless(&browser, &out.join("profile"))
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    assert!(
        dom_text.contains("data-status=\"ok\""),
        "the page's self-check did not pass: {}",
        dom_text
            .lines()
            .find(|l| l.contains("selfcheck"))
            .unwrap_or("(no self-check element)")
    );
    assert!(
        attr(&dom_text, "plots").unwrap_or(0) >= 5,
        "fewer plots than expected"
    );
    assert!(
        attr(&dom_text, "tables").unwrap_or(0) >= 7,
        "fewer tables than expected"
    );
    assert_eq!(attr(&dom_text, "errors"), Some(0));
    assert_eq!(
        attr(&dom_text, "unlabelled"),
        Some(0),
        "a plot lacks an axis title"
    );
    assert_eq!(
        attr(&dom_text, "nobars"),
        Some(0),
        "a point with a spread lacks its error bar"
    );
    assert!(
        attr(&dom_text, "summary").unwrap_or(0) >= 5,
        "the summary table is short"
    );

    // compare: the run against itself, page rendered the same way.
    let cmp = out.join("compare");
    let results_json = out.join("results.json");
    let c = run_ok(
        foliokit()
            .arg("compare")
            .args([&results_json, &results_json])
            .arg("--out")
            .arg(&cmp),
    );
    let text = String::from_utf8_lossy(&c.stdout);
    assert!(
        text.contains("# B vs A: 0 better, 0 worse"),
        "a run compared with itself shows a change:\n{text}"
    );
    let cdom = headless(&browser, &out.join("profile"))
        .arg("--dump-dom")
        .arg(format!("file://{}", cmp.join("index.html").display()))
        .output()
        .unwrap();
    let cdom = String::from_utf8_lossy(&cdom.stdout);
    assert!(
        cdom.contains("data-status=\"ok\""),
        "the compare page's self-check did not pass: {}",
        cdom.lines()
            .find(|l| l.contains("selfcheck"))
            .unwrap_or("(none)")
    );
    assert!(
        attr(&cdom, "plots").unwrap_or(0) >= 5,
        "compare drew too few plots"
    );

    let shot = out.join("index.png");
    let s = headless(&browser, &out.join("profile"))
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1280,3000")
        .arg(&url)
        .output()
        .unwrap();
    assert!(s.status.success());
    assert!(
        std::fs::metadata(&shot)
            .map(|m| m.len() > 20_000)
            .unwrap_or(false),
        "screenshot missing or blank"
    );
    eprintln!("lab page rendered; screenshot at {}", shot.display());
}

//! `--no-limits` skips the same-run limit probes: every bench that takes it
//! still measures, prints its rows, and gives no limit (it used to panic
//! in `bench init` on the missing probe figures).

mod common;

use common::{foliokit, json};

#[test]
fn benches_without_limits_measure_and_give_no_limit() {
    for args in [
        "bench init -s 1M -l 2 -f field,template-memcpy",
        "bench fault -s 8M -l 2 -p 4K",
        "bench copy -s 4M -p 2M -l 2 -f movsb,libc",
        "bench clear -s 4M -p 2M -l 2 -f per-page,libc",
    ] {
        let args: Vec<&str> = args.split_whitespace().collect();
        let v = json(
            foliokit()
                .args(&args)
                .args(["--no-limits", "--format", "json"]),
        );
        let rows = v["rows"].as_array().expect("rows");
        assert!(!rows.is_empty(), "{args:?}: no rows");
        for r in rows {
            assert!(
                r["of_limit"].is_null(),
                "{args:?}: a limit without probes: {r}"
            );
        }
    }
}

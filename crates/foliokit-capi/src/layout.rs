//! The header's struct layouts and constants, as a C compiler sees them,
//! equal the Rust mirrors'. Needs `cc`; skips with the reason otherwise.
//! (Which structs, fields and constants exist on each side is checked
//! without a compiler by `tests/header_agrees.rs`.)

use std::ffi::c_int;
use std::mem::{offset_of, size_of, size_of_val};
use std::process::Command;

use crate::lazy::*;
use crate::migrate::*;
use crate::process::*;
use crate::runtime::*;

/// A C struct: its name, size, and each field's C name, offset and size
/// as Rust lays out the mirror.
struct Layout {
    c: &'static str,
    size: usize,
    fields: Vec<(String, usize, usize)>,
}

/// `layout!(fk_x: FkX { a, b.c })`: the field `b.c` of the Rust mirror is
/// the C field `c` (a field of a nested struct that C declares flat).
macro_rules! layout {
    ($c:ident: $t:ty { $($f:ident $(. $g:ident)*),* $(,)? }) => {{
        let v = <$t>::default();
        Layout {
            c: stringify!($c),
            size: size_of::<$t>(),
            fields: vec![$((
                stringify!($f $(. $g)*).rsplit('.').next().unwrap().trim().to_string(),
                offset_of!($t, $f $(. $g)*),
                size_of_val(&v.$f $(. $g)*),
            )),*],
        }
    }};
}

#[test]
fn header_layout_matches_rust() {
    let layouts = [
        layout!(fk_migrate_opts: FkMigrateOpts { size, path, channels, batch_pages, latency_budget_us }),
        layout!(fk_migrate_result: FkMigrateResult {
            size, gbps, first_folio_us, pages_to_move, relocated, batches
        }),
        layout!(fk_range: FkRange { start, end }),
        layout!(fk_process_opts: FkProcessOpts { size, threads, flags, budget_us }),
        layout!(fk_process_result: FkProcessResult {
            size, moved, already, not_present, failed, secs, longest_call_us
        }),
        layout!(fk_lazy_range: FkLazyRange { addr, len, offset }),
        layout!(fk_lazy_opts: FkLazyOpts { size, channels, flags, budget_us, folio_size }),
        layout!(fk_lazy_progress: FkLazyProgress {
            size, counts.total_pages, counts.faulted_pages, counts.filled_pages,
            counts.skipped_pages, counts.bad_pages, counts.faults, done
        }),
        layout!(fk_lazy_report: FkLazyReport {
            size, counts.total_pages, counts.faulted_pages, counts.filled_pages,
            counts.skipped_pages, counts.bad_pages, counts.faults, whole_folios, batches,
            longest_batch_us, secs, poisoned, bad_ranges
        }),
        layout!(fk_lazy_bad: FkLazyBad { addr, len, kind }),
    ];
    let consts: [(&str, i64); 11] = [
        ("FK_PATH_KERNEL", FK_PATH_KERNEL.into()),
        ("FK_PATH_AUTO", FK_PATH_AUTO.into()),
        ("FK_PATH_RELOCATE", FK_PATH_RELOCATE.into()),
        ("FK_PROCESS_DRY_RUN", FK_PROCESS_DRY_RUN.into()),
        ("FK_PROCESS_WITH_STACK", FK_PROCESS_WITH_STACK.into()),
        ("FK_LAZY_START_CANCELLED", FK_LAZY_START_CANCELLED.into()),
        (
            "FK_LAZY_SERVE_DURING_BATCHES",
            FK_LAZY_SERVE_DURING_BATCHES.into(),
        ),
        (
            "FK_INIT_NO_SIGBUS_HANDLER",
            FK_INIT_NO_SIGBUS_HANDLER.into(),
        ),
        ("FK_INIT_PROFILE_FILE", FK_INIT_PROFILE_FILE.into()),
        ("FK_INIT_SPREAD_CHANNELS", FK_INIT_SPREAD_CHANNELS.into()),
        ("sizeof(enum fk_path)", size_of::<c_int>() as i64),
    ];

    // One line per struct: each field's offset and size, the struct's size
    // and, for an extensible one, the `size` its FK_..._INIT sets.
    let mut program = String::from(
        "#include <stdio.h>\n#include \"foliokit.h\"\n\
         #define F(s, f) printf(\"%zu %zu \", offsetof(struct s, f), sizeof(((struct s *)0)->f))\n\
         int main(void) {\n",
    );
    let mut want = String::new();
    for l in &layouts {
        for (f, offset, size) in &l.fields {
            program += &format!("    F({}, {f});\n", l.c);
            want += &format!("{offset} {size} ");
        }
        program += &format!("    printf(\"%zu\", sizeof(struct {}));\n", l.c);
        want += &l.size.to_string();
        if l.fields[0].0 == "size" {
            let init = l.c.to_uppercase() + "_INIT";
            program += &format!(
                "    {{ struct {} x = {init}; printf(\" %zu\", x.size); }}\n",
                l.c
            );
            want += &format!(" {}", l.size);
        }
        program += "    printf(\"\\n\");\n";
        want += "\n";
    }
    for (name, value) in consts {
        program += &format!("    printf(\"%lld\\n\", (long long)({name}));\n");
        want += &format!("{value}\n");
    }
    program += "    return 0;\n}\n";

    let dir = std::env::temp_dir().join(format!("fk_capi_layout_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join("layout.c");
    std::fs::write(&c, program).unwrap();
    let exe = dir.join("layout");
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/include");
    let built = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-I", include])
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .status();
    match built {
        Err(e) => {
            println!("SKIP: header_layout_matches_rust: no C compiler (cc: {e})");
            return;
        }
        Ok(s) => assert!(s.success(), "cc failed on the header"),
    }
    let out = Command::new(&exe).output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);
}

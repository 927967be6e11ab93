//! Gives libfoliokit.so its versioned SONAME and checks that the header's
//! FK_VERSION_* macros match the crate version.
//!
//! A few lines here instead of cargo-c: cargo-c must itself be compiled on
//! a fresh CI machine (many minutes on 2 vCPUs), while all it would add for
//! us is this link argument, the install step (`cargo xtask install-capi`)
//! and the .pc file (written by that step).

#[path = "version.rs"]
mod version;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=version.rs");
    println!("cargo:rerun-if-changed=include/foliokit.h");

    let num = |var: &str| -> u32 {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("cargo did not set {var}"))
    };
    let crate_version = (
        num("CARGO_PKG_VERSION_MAJOR"),
        num("CARGO_PKG_VERSION_MINOR"),
        num("CARGO_PKG_VERSION_PATCH"),
    );
    let header = std::fs::read_to_string("include/foliokit.h")
        .unwrap_or_else(|e| panic!("reading include/foliokit.h: {e}"));
    match version::header_version(&header) {
        Some(v) if v == crate_version => {}
        Some((a, b, c)) => panic!(
            "include/foliokit.h says FK_VERSION {a}.{b}.{c} but the crate is {}.{}.{}: \
             update FK_VERSION_MAJOR/MINOR/PATCH in the header",
            crate_version.0, crate_version.1, crate_version.2
        ),
        None => panic!("include/foliokit.h lacks FK_VERSION_MAJOR/MINOR/PATCH"),
    }

    // ELF shared libraries name their ABI in DT_SONAME; programs linked
    // against libfoliokit.so record that name and the loader looks for it.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,-soname,{}",
            version::soname(crate_version.0, crate_version.1)
        );
    }
}

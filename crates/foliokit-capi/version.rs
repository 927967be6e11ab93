//! The C library's version rules in one place, shared by `build.rs` (the
//! SONAME, the header check), the crate's tests and `cargo xtask
//! install-capi` (the installed file names and foliokit.pc).
//!
//! `include/foliokit.h` carries the version as `FK_VERSION_MAJOR`, `_MINOR`
//! and `_PATCH`; `build.rs` refuses to build when they differ from the
//! crate's version, so every other user may take the header's.

#![allow(dead_code)] // each includer uses a different part

/// The library's base name; `-lfoliokit` finds `libfoliokit.so`/`.a`.
pub const LIB: &str = "foliokit";

/// `FK_VERSION_MAJOR`, `_MINOR` and `_PATCH` as the header defines them.
pub fn header_version(header: &str) -> Option<(u32, u32, u32)> {
    let find = |name: &str| {
        header.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next(), words.next()) {
                (Some("#define"), Some(n), Some(v), None) if n == name => v.parse().ok(),
                _ => None,
            }
        })
    };
    Some((
        find("FK_VERSION_MAJOR")?,
        find("FK_VERSION_MINOR")?,
        find("FK_VERSION_PATCH")?,
    ))
}

/// The ABI version in the SONAME: the major version from 1.0 on, and
/// `0.MINOR` before, because a 0.x minor release may break compatibility
/// (semver as Cargo reads it; cargo-c names 0.x libraries the same way).
pub fn abi(major: u32, minor: u32) -> String {
    if major == 0 {
        format!("0.{minor}")
    } else {
        major.to_string()
    }
}

/// `libfoliokit.so.0.1` for 0.1.z: what `readelf -d` shows as SONAME and
/// the name the dynamic loader looks for at run time.
pub fn soname(major: u32, minor: u32) -> String {
    format!("lib{LIB}.so.{}", abi(major, minor))
}

/// `libfoliokit.so.0.1.0`: the installed file the SONAME link points to.
pub fn real_name(major: u32, minor: u32, patch: u32) -> String {
    format!("lib{LIB}.so.{major}.{minor}.{patch}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_macros() {
        let h = "#define FK_VERSION_MAJOR 1\n#define  FK_VERSION_MINOR 22\n\
                 #define FK_VERSION_PATCH 333\n#define FK_VERSION_MAJORX 9\n";
        assert_eq!(header_version(h), Some((1, 22, 333)));
        assert_eq!(header_version("#define FK_VERSION_MAJOR 1\n"), None);
    }

    #[test]
    fn soname_follows_semver() {
        assert_eq!(soname(0, 1), "libfoliokit.so.0.1");
        assert_eq!(soname(2, 5), "libfoliokit.so.2");
        assert_eq!(real_name(0, 1, 0), "libfoliokit.so.0.1.0");
    }
}

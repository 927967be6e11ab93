//! `cargo xtask install-capi --prefix DIR`: installs the C library the way
//! a distribution expects it, without cargo-c:
//!
//! ```text
//! DIR/include/foliokit.h
//! DIR/lib/libfoliokit.so.0.1.0            the shared library (SONAME libfoliokit.so.0.1)
//! DIR/lib/libfoliokit.so.0.1 -> libfoliokit.so.0.1.0   what the loader looks for
//! DIR/lib/libfoliokit.so     -> libfoliokit.so.0.1     what `-lfoliokit` finds
//! DIR/lib/libfoliokit.a                   debug info and LLVM bitcode stripped
//! DIR/lib/pkgconfig/foliokit.pc
//! ```
//!
//! The version comes from the header's FK_VERSION_* macros, which the capi
//! crate's build script checks against the crate version; the file names
//! follow `crates/foliokit-capi/version.rs`, as the SONAME does.

#[path = "../../crates/foliokit-capi/version.rs"]
mod version;

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

/// The system libraries a program linking libfoliokit.a statically also
/// needs: what `rustc --print native-static-libs` reports for the crate on
/// x86_64/aarch64 Linux with glibc (libstd's dependencies).
const NATIVE_STATIC_LIBS: &str = "-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc";

pub struct Dirs {
    pub prefix: PathBuf,
    /// Relative to the prefix unless absolute.
    pub libdir: PathBuf,
    /// Prepended to every path written, not to those in foliokit.pc
    /// (for packaging into a staging directory).
    pub destdir: Option<PathBuf>,
}

pub fn install_capi(ws: &Path, dirs: &Dirs, strip: bool) -> Result<(), Error> {
    let header_src = ws.join("crates/foliokit-capi/include/foliokit.h");
    let header =
        fs::read_to_string(&header_src).map_err(|e| format!("{}: {e}", header_src.display()))?;
    let (major, minor, patch) =
        version::header_version(&header).ok_or("foliokit.h lacks FK_VERSION_MAJOR/MINOR/PATCH")?;
    let (so, a) = build(ws)?;

    let prefix = std::path::absolute(&dirs.prefix)?;
    let libdir = prefix.join(&dirs.libdir);
    let includedir = prefix.join("include");
    let pcdir = libdir.join("pkgconfig");
    let staged = |p: &Path| match &dirs.destdir {
        // `join` would drop the destdir for an absolute path.
        Some(d) => d.join(p.strip_prefix("/").unwrap_or(p)),
        None => p.to_path_buf(),
    };
    for d in [&includedir, &libdir, &pcdir] {
        fs::create_dir_all(staged(d)).map_err(|e| format!("{}: {e}", staged(d).display()))?;
    }

    let real = version::real_name(major, minor, patch);
    let soname = version::soname(major, minor);
    let dev = format!("lib{}.so", version::LIB);
    let lib = staged(&libdir);
    put(
        &header_src,
        &staged(&includedir).join("foliokit.h"),
        0o644,
        None,
    )?;
    put(&so, &lib.join(&real), 0o755, None)?;
    link(&real, &lib.join(&soname))?;
    link(&soname, &lib.join(&dev))?;
    let archive = lib.join(format!("lib{}.a", version::LIB));
    put(
        &a,
        &archive,
        0o644,
        if strip { Some(strip_archive) } else { None },
    )?;
    let pc = pc_file(&prefix, &dirs.libdir, &format!("{major}.{minor}.{patch}"));
    let pc_path = staged(&pcdir).join("foliokit.pc");
    fs::write(&pc_path, pc).map_err(|e| format!("{}: {e}", pc_path.display()))?;

    println!(
        "installed foliokit {major}.{minor}.{patch} into {}:",
        staged(&prefix).display()
    );
    for p in [
        staged(&includedir).join("foliokit.h"),
        lib.join(&real),
        lib.join(&soname),
        lib.join(&dev),
        archive,
        pc_path,
    ] {
        let size = fs::symlink_metadata(&p).map(|m| m.len()).unwrap_or(0);
        match fs::read_link(&p) {
            Ok(t) => println!("  {} -> {}", p.display(), t.display()),
            Err(_) => println!("  {} ({size} bytes)", p.display()),
        }
    }
    println!(
        "link with: PKG_CONFIG_PATH={} pkg-config --cflags --libs foliokit",
        pcdir.display()
    );
    Ok(())
}

/// Builds libfoliokit.so and .a in release mode; returns their paths as
/// cargo reports them (so CARGO_TARGET_DIR is honoured).
fn build(ws: &Path) -> Result<(PathBuf, PathBuf), Error> {
    println!("# building libfoliokit (cargo build --release -p foliokit-capi)");
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "foliokit-capi",
            "--message-format=json",
        ])
        .current_dir(ws)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err("cargo build -p foliokit-capi failed".into());
    }
    let (mut so, mut a) = (None, None);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["target"]["name"] != version::LIB {
            continue;
        }
        for f in v["filenames"].as_array().into_iter().flatten() {
            let Some(f) = f.as_str() else { continue };
            if f.ends_with(".so") {
                so = Some(PathBuf::from(f));
            } else if f.ends_with(".a") {
                a = Some(PathBuf::from(f));
            }
        }
    }
    match (so, a) {
        (Some(so), Some(a)) => Ok((so, a)),
        _ => Err("cargo did not report libfoliokit.so and libfoliokit.a".into()),
    }
}

/// Rewrites an installed file in place (see [`strip_archive`]).
type Fix = fn(&Path) -> Result<(), Error>;

/// Copies `from` to `to` through a temporary file renamed into place, so a
/// program running the old library keeps its (unlinked) copy intact;
/// `fix` may rewrite the temporary file first.
fn put(from: &Path, to: &Path, mode: u32, fix: Option<Fix>) -> Result<(), Error> {
    let name = to.file_name().ok_or("install target has no file name")?;
    let tmp = to.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    fs::copy(from, &tmp).map_err(|e| format!("{} -> {}: {e}", from.display(), tmp.display()))?;
    if let Some(fix) = fix {
        if let Err(e) = fix(&tmp) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    }
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))?;
    fs::rename(&tmp, to).map_err(|e| format!("{}: {e}", to.display()))?;
    Ok(())
}

/// Makes `at` a symlink to `target`, replacing what was there.
fn link(target: &str, at: &Path) -> Result<(), Error> {
    match fs::remove_file(at) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", at.display()).into()),
    }
    symlink(target, at).map_err(|e| format!("{}: {e}", at.display()))?;
    Ok(())
}

/// Removes from the static library what a C program never links: debug
/// info (~half of it, most of it libstd's) and the LLVM bitcode libstd
/// embeds for Rust's LTO (~5 MB). Without objcopy it stays as built.
fn strip_archive(a: &Path) -> Result<(), Error> {
    let r = Command::new("objcopy")
        .args([
            "--strip-debug",
            "--remove-section=.llvmbc",
            "--remove-section=.llvmcmd",
        ])
        .arg(a)
        .status();
    match r {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("objcopy on {} failed: {s}", a.display()).into()),
        Err(e) => {
            println!("# objcopy not found ({e}): libfoliokit.a installed unstripped");
            Ok(())
        }
    }
}

/// foliokit.pc for `prefix`; `libdir` relative to it unless absolute.
fn pc_file(prefix: &Path, libdir: &Path, version: &str) -> String {
    let libdir = if libdir.is_absolute() {
        libdir.display().to_string()
    } else {
        format!("${{exec_prefix}}/{}", libdir.display())
    };
    format!(
        "prefix={}\n\
         exec_prefix=${{prefix}}\n\
         libdir={libdir}\n\
         includedir=${{prefix}}/include\n\
         \n\
         Name: foliokit\n\
         Description: Large-folio memory operations: folio copy and clear, machine-check-safe copy, streaming stores, populate, NUMA migration\n\
         Version: {version}\n\
         Libs: -L${{libdir}} -l{}\n\
         Libs.private: {NATIVE_STATIC_LIBS}\n\
         Cflags: -I${{includedir}}\n",
        prefix.display(),
        version::LIB,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pc_file_for_relative_and_absolute_libdir() {
        let pc = pc_file(Path::new("/opt/fk"), Path::new("lib"), "0.1.0");
        assert!(pc.starts_with("prefix=/opt/fk\n"));
        assert!(pc.contains("\nlibdir=${exec_prefix}/lib\n"));
        assert!(pc.contains("\nVersion: 0.1.0\n"));
        assert!(pc.contains("\nLibs: -L${libdir} -lfoliokit\n"));
        assert!(pc.contains("\nCflags: -I${includedir}\n"));
        let pc = pc_file(
            Path::new("/usr"),
            Path::new("/usr/lib/x86_64-linux-gnu"),
            "1.2.3",
        );
        assert!(pc.contains("\nlibdir=/usr/lib/x86_64-linux-gnu\n"));
    }
}

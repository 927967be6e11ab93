//! The bench's snapshot files: their bytes (a word of each page names its
//! offset), the folios a zero share leaves as holes, written once and
//! unlinked, and the disk room they need.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use std::os::unix::fs::FileExt;

use super::{RestoreError, FOLIO};

/// The byte at offset `off` of the snapshot.
pub(super) fn byte_at(off: usize) -> u8 {
    let w = (off as u64 / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (w >> ((off % 8) * 8)) as u8
}

/// Whether folio `i` of the snapshot with zero share `f` is zero.
pub(super) fn zero_folio(i: usize, f: f64) -> bool {
    f > 0.0 && ((i + 1) as f64 * f).floor() > (i as f64 * f).floor()
}

/// Writes the snapshot file at `path` and returns it open, already
/// unlinked: a run interrupted while writing (or killed later) leaves no
/// file of `size` bytes behind. With zero share `zero`, the zero folios
/// are holes, or with `dense` bytes of zeros.
pub(super) fn write_snapshot(
    path: &std::path::Path,
    size: usize,
    zero: f64,
    dense: bool,
) -> Result<File, RestoreError> {
    // Errors name the file: `--dir` is the user's.
    let io = |what| {
        move |e: std::io::Error| RestoreError::Io {
            what,
            source: std::io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        }
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io("create"))?;
    std::fs::remove_file(path).map_err(io("unlink"))?;
    let mut buf = vec![0u8; FOLIO];
    let mut at = 0;
    while at < size {
        let n = buf.len().min(size - at);
        if !zero_folio(at / FOLIO, zero) {
            for (i, w) in buf[..n].chunks_exact_mut(8).enumerate() {
                let v = ((at / 8 + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                w.copy_from_slice(&v.to_le_bytes());
            }
            f.write_all_at(&buf[..n], at as u64).map_err(io("write"))?;
        } else if dense {
            f.write_all_at(&vec![0u8; n], at as u64)
                .map_err(io("write"))?;
        }
        at += n;
    }
    f.set_len(size as u64).map_err(io("set_len"))?;
    f.sync_all().map_err(io("sync"))?;
    Ok(f)
}

/// Refuses a run whose snapshot file `dir` has no room for, before a byte
/// is written.
pub(super) fn check_disk(dir: &std::path::Path, size: usize) -> Result<(), RestoreError> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| RestoreError::Plan(format!("{}: not a usable path", dir.display())))?;
    // SAFETY: statvfs is plain integers, for which all zeros is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a struct the call fills.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(RestoreError::Plan(format!(
            "snapshot directory {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        )));
    }
    let free = (st.f_bavail as u128) * (st.f_frsize as u128);
    if (size as u128) > free {
        return Err(RestoreError::Plan(format!(
            "the snapshot needs {} in {} but only {} is free there (--dir)",
            crate::units::show_size(size),
            dir.display(),
            crate::units::approx_size(free.min(usize::MAX as u128) as usize)
        )));
    }
    Ok(())
}

/// A path another process of this user opens `f` by, unlinked or not.
pub(super) fn fd_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), f.as_raw_fd()))
}

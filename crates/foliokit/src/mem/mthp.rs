//! mTHP sysfs settings that restore themselves, and a census of the folio
//! sizes that actually back a range.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use thiserror::Error;

use super::sysfs;
use crate::batch::page_size;

/// Where the kernel keeps the THP knobs.
pub const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

#[derive(Debug, Error)]
pub enum MthpError {
    #[error("cannot read {0}")]
    Read(PathBuf),
    #[error("cannot set {path} to {value}: {source} (changing mTHP settings needs root)")]
    Write {
        path: PathBuf,
        value: String,
        source: io::Error,
    },
}

/// The value a knob holds: the bracketed word of a choice list, or the
/// whole text (as a fake sysfs in tests holds it).
fn current(text: &str) -> String {
    sysfs::selected(text).unwrap_or(text.trim()).to_string()
}

/// Changes mTHP `enabled` knobs and puts every one it touched back as it
/// was when dropped — on success, on error, and when unwinding.
pub struct MthpSettings {
    dir: PathBuf,
    /// Size in bytes → original setting, for every knob changed so far.
    saved: BTreeMap<usize, String>,
}

impl MthpSettings {
    /// Settings under the kernel's THP directory.
    pub fn system() -> Self {
        Self::at(THP_DIR)
    }

    /// Settings under another directory laid out like the kernel's (tests).
    pub fn at(dir: impl AsRef<Path>) -> Self {
        MthpSettings {
            dir: dir.as_ref().to_path_buf(),
            saved: BTreeMap::new(),
        }
    }

    fn knob(&self, size: usize) -> PathBuf {
        self.dir
            .join(format!("hugepages-{}kB", size >> 10))
            .join("enabled")
    }

    /// Every mTHP size the directory offers, with its current setting.
    pub fn snapshot(&self) -> BTreeMap<usize, String> {
        super::system::read_mthp(&self.dir)
            .into_iter()
            .map(|m| (m.size, m.enabled))
            .collect()
    }

    /// Sets `size`'s knob to `value` (always, madvise, inherit, never),
    /// remembering the original the first time it is changed.
    pub fn set(&mut self, size: usize, value: &str) -> Result<(), MthpError> {
        let path = self.knob(size);
        let old = sysfs::read(&path).ok_or_else(|| MthpError::Read(path.clone()))?;
        sysfs::write(&path, value).map_err(|source| MthpError::Write {
            path: path.clone(),
            value: value.into(),
            source,
        })?;
        self.saved.entry(size).or_insert_with(|| current(&old));
        Ok(())
    }

    /// Enables exactly `size` with `always` (every other size `never`), or
    /// no mTHP at all for `None`: the condition one experiment row needs.
    pub fn only(&mut self, size: Option<usize>) -> Result<(), MthpError> {
        for s in self.snapshot().into_keys() {
            self.set(s, if Some(s) == size { "always" } else { "never" })?;
        }
        Ok(())
    }

    /// Puts every changed knob back; returns the first failure, if any.
    pub fn restore(&mut self) -> Result<(), MthpError> {
        let mut first = None;
        for (size, value) in std::mem::take(&mut self.saved) {
            let path = self.knob(size);
            if let Err(source) = sysfs::write(&path, &value) {
                first.get_or_insert(MthpError::Write {
                    path,
                    value,
                    source,
                });
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The originals of the knobs changed so far (for a signal handler that
    /// must restore them from outside this value).
    pub fn saved(&self) -> Vec<(PathBuf, String)> {
        self.saved
            .iter()
            .map(|(&s, v)| (self.knob(s), v.clone()))
            .collect()
    }
}

impl Drop for MthpSettings {
    fn drop(&mut self) {
        let _ = self.restore();
    }
}

/// The folio sizes backing a range, from the kernel's page flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Census {
    /// Folio size in bytes → number of such folios (mapped pages only).
    pub folios: BTreeMap<usize, usize>,
    /// Pages with no physical page behind them.
    pub unmapped_pages: usize,
}

impl Census {
    /// "64K x16" style summary, largest first.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .folios
            .iter()
            .rev()
            .map(|(&size, &n)| format!("{}K x{n}", size >> 10))
            .collect();
        if self.unmapped_pages > 0 {
            parts.push(format!("{} pages unmapped", self.unmapped_pages));
        }
        parts.join(", ")
    }
}

const KPF_COMPOUND_HEAD: u64 = 1 << 15;
const KPF_COMPOUND_TAIL: u64 = 1 << 16;
const PM_PRESENT: u64 = 1 << 63;
const PM_PFN_MASK: u64 = (1 << 55) - 1;

/// Counts the folios behind `[ptr, ptr + len)` by reading
/// `/proc/self/pagemap` and `/proc/kpageflags`. `None` where the kernel
/// hides PFNs (needs CAP_SYS_ADMIN) or the files are missing. Folios that
/// extend beyond the range are counted by the part inside it.
pub fn census(ptr: *const u8, len: usize) -> Option<Census> {
    let page = page_size();
    let pages = len / page;
    let mut pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut flags = std::fs::File::open("/proc/kpageflags").ok()?;
    let mut entries = vec![0u8; pages * 8];
    pagemap
        .seek(SeekFrom::Start((ptr as usize / page * 8) as u64))
        .ok()?;
    pagemap.read_exact(&mut entries).ok()?;
    let mut c = Census {
        folios: BTreeMap::new(),
        unmapped_pages: 0,
    };
    let mut run = 0usize; // pages in the folio being counted
    let mut saw_pfn = false;
    let flush = |run: &mut usize, c: &mut Census| {
        if *run > 0 {
            *c.folios.entry(*run * page).or_default() += 1;
            *run = 0;
        }
    };
    for e in entries.chunks_exact(8) {
        let e = u64::from_le_bytes(e.try_into().ok()?);
        let pfn = e & PM_PFN_MASK;
        if e & PM_PRESENT == 0 {
            flush(&mut run, &mut c);
            c.unmapped_pages += 1;
            continue;
        }
        saw_pfn |= pfn != 0;
        let mut f = [0u8; 8];
        flags.seek(SeekFrom::Start(pfn * 8)).ok()?;
        flags.read_exact(&mut f).ok()?;
        let f = u64::from_le_bytes(f);
        // A tail continues the current folio; anything else starts one.
        if f & KPF_COMPOUND_TAIL == 0 || run == 0 {
            flush(&mut run, &mut c);
        }
        run += 1;
        if f & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL) == 0 {
            flush(&mut run, &mut c);
        }
    }
    flush(&mut run, &mut c);
    saw_pfn.then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sysfs() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "foliokit-fake-thp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        for (kb, v) in [
            (16, "always inherit madvise [never]"),
            (64, "always [inherit] madvise never"),
            (2048, "[always] inherit madvise never"),
        ] {
            let d = dir.join(format!("hugepages-{kb}kB"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("enabled"), v).unwrap();
        }
        dir
    }

    #[test]
    fn settings_are_restored_after_a_failing_run() {
        let dir = fake_sysfs();
        let before = MthpSettings::at(&dir).snapshot();
        assert_eq!(before[&(64 << 10)], "inherit");
        let run = |s: &mut MthpSettings| -> Result<(), MthpError> {
            s.only(Some(64 << 10))?;
            assert_eq!(s.snapshot()[&(64 << 10)], "always");
            assert_eq!(s.snapshot()[&(16 << 10)], "never");
            Err(MthpError::Read("the experiment failed".into()))
        };
        {
            let mut s = MthpSettings::at(&dir);
            assert!(run(&mut s).is_err());
        } // dropped on the error path
        assert_eq!(MthpSettings::at(&dir).snapshot(), before);
        // And when a panic unwinds through it.
        let d2 = dir.clone();
        let r = std::panic::catch_unwind(move || {
            let mut s = MthpSettings::at(&d2);
            s.only(None).unwrap();
            panic!("experiment panicked");
        });
        assert!(r.is_err());
        assert_eq!(MthpSettings::at(&dir).snapshot(), before);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn unknown_sizes_are_errors_not_panics() {
        let dir = fake_sysfs();
        let mut s = MthpSettings::at(&dir);
        assert!(matches!(s.set(32 << 10, "always"), Err(MthpError::Read(_))));
        drop(s);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

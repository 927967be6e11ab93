//! mTHP sysfs settings that restore themselves: the condition one
//! experiment row needs, changed explicitly and put back on drop.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use thiserror::Error;

use foliokit::internals::THP_DIR;
use foliokit::mem::system::read_mthp;

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
        read_mthp(&self.dir)
            .into_iter()
            .map(|m| (m.size, m.enabled))
            .collect()
    }

    /// Sets `size`'s knob to `value` (always, madvise, inherit, never),
    /// remembering the original the first time it is changed.
    pub fn set(&mut self, size: usize, value: &str) -> Result<(), MthpError> {
        let path = self.knob(size);
        // The knob's current word (the bracketed one of a choice list, or
        // the whole text, as a fake sysfs in tests holds it).
        let old = self
            .snapshot()
            .remove(&size)
            .ok_or_else(|| MthpError::Read(path.clone()))?;
        std::fs::write(&path, value).map_err(|source| MthpError::Write {
            path: path.clone(),
            value: value.into(),
            source,
        })?;
        self.saved.entry(size).or_insert(old);
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
            if let Err(source) = std::fs::write(&path, &value) {
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

/// The mTHP knobs to put back if the user interrupts a run that changed
/// them (read by the Ctrl-C handler).
static RESTORE_ON_INTERRUPT: std::sync::Mutex<Vec<(std::path::PathBuf, String)>> =
    std::sync::Mutex::new(Vec::new());

/// Makes Ctrl-C (and SIGTERM) restore what `settings` changed so far, then
/// exit; call again after every change.
pub fn arm_interrupt_restore(settings: &MthpSettings) {
    restore_on_interrupt(settings.saved());
}

/// Hugetlb pools grown for a run: (grant id, nr_hugepages path, pages
/// added), shrunk again by the Ctrl-C handler.
static POOLS_ON_INTERRUPT: std::sync::Mutex<Vec<(u64, std::path::PathBuf, usize)>> =
    std::sync::Mutex::new(Vec::new());

/// Makes Ctrl-C, SIGTERM and SIGHUP write each (path, value) in order,
/// shrink the pools [`shrink_pool_on_interrupt`] registered, then exit:
/// how a run that changed system settings puts them back. An empty list
/// disarms the writes.
pub fn restore_on_interrupt(saved: Vec<(std::path::PathBuf, String)>) {
    *RESTORE_ON_INTERRUPT
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = saved;
    arm();
}

/// Makes an interrupt shrink the hugetlb pool at `nr_hugepages` by the
/// `added` pages of grant `id` (by what was added, not to a remembered
/// total: other grants may be live); `added` 0 forgets the grant.
pub fn shrink_pool_on_interrupt(id: u64, nr_hugepages: std::path::PathBuf, added: usize) {
    let mut pools = POOLS_ON_INTERRUPT.lock().unwrap_or_else(|p| p.into_inner());
    pools.retain(|(g, ..)| *g != id);
    if added > 0 {
        pools.push((id, nr_hugepages, added));
    }
    drop(pools);
    arm();
}

/// Installs the interrupt handler, once.
fn arm() {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        // The `termination` feature: SIGTERM and SIGHUP too; but a SIGHUP
        // the process ignores (nohup) stays ignored.
        // SAFETY: reading the current disposition into a zeroed struct.
        let hup_ignored = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        };
        let _ = ctrlc::set_handler(|| {
            let saved = RESTORE_ON_INTERRUPT
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for (path, value) in saved.iter() {
                let _ = std::fs::write(path, value);
            }
            let pools = POOLS_ON_INTERRUPT.lock().unwrap_or_else(|p| p.into_inner());
            for (_, path, added) in pools.iter() {
                let now = std::fs::read_to_string(path)
                    .ok()
                    .and_then(|s| s.trim().parse::<usize>().ok());
                if let Some(now) = now {
                    let _ = std::fs::write(path, now.saturating_sub(*added).to_string());
                }
            }
            eprintln!("foliokit: interrupted; system settings restored");
            std::process::exit(130);
        });
        if hup_ignored {
            // SAFETY: setting SIGHUP back to ignored, as nohup left it.
            unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        }
    });
}

/// Runs `shrink` for grant `id` with the interrupt handler held off, and
/// forgets the grant: an interrupt then either waits and finds it gone
/// (shrunk here) or came first and shrank it, never both or neither.
pub fn release_pool(id: u64, shrink: impl FnOnce()) {
    let mut pools = POOLS_ON_INTERRUPT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = pools.iter().position(|(g, ..)| *g == id) {
        pools.remove(i);
        shrink();
    }
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

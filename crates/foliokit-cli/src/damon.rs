//! `foliokit move --cold SECS`: the regions of a process DAMON saw idle.
//!
//! DAMON's sysfs interface (`/sys/kernel/mm/damon/admin`) has one set of
//! kdamonds for the whole system, and writing `nr_kdamonds` rebuilds it.
//! So foliokit uses DAMON only where nobody else does (no kdamond
//! configured): it sets up one kdamond watching the target's virtual
//! address space with a `stat` scheme for regions with no access for the
//! whole window, runs it for SECS, reads the regions the scheme matched,
//! and puts `nr_kdamonds` back to 0, also on error (a guard) and on Ctrl-C
//! (the CLI's restore-on-interrupt list).
//!
//! Before writing anything it checks what this kernel's DAMON offers
//! ([`check`]): the sysfs interface, permission to write it, the `vaddr`
//! operations (a kernel built without `CONFIG_DAMON_VADDR` has DAMON and its
//! sysfs but can watch physical addresses only; turning a `vaddr` kdamond on
//! there is EINVAL), and that nobody else's kdamond is set up. Each missing
//! piece is one [`Unavailable`] line, and the command's own exit status.

use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::CliError;

const ADMIN: &str = "/sys/kernel/mm/damon/admin";
/// DAMON's aggregation interval we set: an access count covers this long.
const AGGR_US: u64 = 100_000;
const SAMPLE_US: u64 = 5_000;
/// Where the kernel lists its symbols (readable without privilege): DAMON's
/// virtual-address operations are functions named `damon_va_*`, its
/// physical-address ones `damon_pa_*`.
const KALLSYMS: &str = "/proc/kallsyms";

/// Why `--cold` cannot run on this system; nothing was written to sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// No `/sys/kernel/mm/damon/admin`.
    NoSysfs,
    /// DAMON is there without virtual-address monitoring.
    NoVaddr {
        /// What the kernel offers instead (e.g. `paddr`), if known.
        offers: Option<String>,
    },
    /// Writing DAMON's sysfs files is not allowed to this user.
    NoPermission(String),
    /// Somebody else's kdamonds are set up.
    InUse {
        kdamonds: usize,
        running: Vec<usize>,
    },
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NoSysfs => write!(
                f,
                "--cold needs DAMON's sysfs interface ({ADMIN}), which this kernel lacks \
                 (CONFIG_DAMON_SYSFS): nothing moved"
            ),
            Unavailable::NoVaddr { offers } => write!(
                f,
                "--cold needs DAMON to watch a process's virtual addresses, and this kernel was \
                 built without CONFIG_DAMON_VADDR{}: nothing moved, DAMON left as found",
                offers
                    .as_ref()
                    .map(|o| format!(" (its DAMON offers: {o})"))
                    .unwrap_or_default()
            ),
            Unavailable::NoPermission(why) => write!(
                f,
                "--cold needs to set up a kdamond, and {why} (run as root): nothing moved"
            ),
            Unavailable::InUse { kdamonds, running } => write!(
                f,
                "--cold: DAMON is already set up on this system ({kdamonds} kdamond{}{}); using it \
                 would rebuild that setup, so foliokit leaves it alone: nothing moved",
                if *kdamonds == 1 { "" } else { "s" },
                if running.is_empty() {
                    String::new()
                } else {
                    let ids: Vec<String> = running.iter().map(ToString::to_string).collect();
                    format!(", running: {}", ids.join(" "))
                }
            ),
        }
    }
}

impl std::error::Error for Unavailable {}

/// Whether this kernel's DAMON has virtual-address operations, from the
/// lines of its symbol list (it stops at the first `damon_va_` symbol):
/// `None` where the list says nothing about DAMON (no DAMON symbols
/// visible), so only the sysfs context can tell.
fn vaddr_in_symbols<S: AsRef<str>>(lines: impl IntoIterator<Item = S>) -> Option<bool> {
    let mut any = false;
    for line in lines {
        let Some(name) = line.as_ref().split_whitespace().nth(2) else {
            continue;
        };
        if name.starts_with("damon_va_") {
            return Some(true);
        }
        any |= name.starts_with("damon_");
    }
    any.then_some(false)
}

/// [`vaddr_in_symbols`] of this kernel, read line by line (the list is
/// megabytes).
fn vaddr_in_kallsyms() -> Option<bool> {
    use std::io::BufRead;
    let f = std::fs::File::open(KALLSYMS).ok()?;
    vaddr_in_symbols(std::io::BufReader::new(f).lines().map_while(Result::ok))
}

/// What this kernel's DAMON offers for `--cold`, read without writing
/// anything: `Err` names the first missing piece.
pub fn check() -> Result<(), Unavailable> {
    let kd = Path::new(ADMIN).join("kdamonds");
    if !kd.exists() {
        return Err(Unavailable::NoSysfs);
    }
    let nr_file = kd.join("nr_kdamonds");
    // Opening a sysfs attribute for writing runs no store: this asks the
    // permission question without changing anything.
    if let Err(e) = std::fs::OpenOptions::new().write(true).open(&nr_file) {
        return Err(Unavailable::NoPermission(match e.kind() {
            ErrorKind::PermissionDenied => format!("{} is not writable here", nr_file.display()),
            _ => format!("{} cannot be opened for writing: {e}", nr_file.display()),
        }));
    }
    if vaddr_in_kallsyms() == Some(false) {
        return Err(Unavailable::NoVaddr { offers: None });
    }
    let nr: usize = std::fs::read_to_string(&nr_file)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if nr > 0 {
        let running = (0..nr)
            .filter(|i| read(&kd.join(format!("{i}/state"))).is_ok_and(|s| s == "on"))
            .collect();
        return Err(Unavailable::InUse {
            kdamonds: nr,
            running,
        });
    }
    Ok(())
}

fn write(p: &Path, v: &str) -> Result<(), CliError> {
    std::fs::write(p, v)
        .map_err(|e| format!("DAMON: cannot write '{v}' to {}: {e}", p.display()).into())
}

fn read(p: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("DAMON: cannot read {}: {e}", p.display()).into())
}

/// Puts DAMON back as found (no kdamond) when dropped.
struct Restore {
    kdamonds: PathBuf,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(self.kdamonds.join("0/state"), "off");
        let _ = std::fs::write(self.kdamonds.join("nr_kdamonds"), "0");
        foliokit_lab::mthp::restore_on_interrupt(Vec::new());
    }
}

/// Regions of process `pid` inside `within` that had no access for
/// `window`, page-aligned, in address order.
pub fn cold_regions(
    pid: i32,
    within: &[(usize, usize)],
    window: Duration,
) -> Result<Vec<(usize, usize)>, CliError> {
    if window.is_zero() {
        return Err("--cold needs a window of at least one second".into());
    }
    check()?;
    let kd = Path::new(ADMIN).join("kdamonds");
    // From here DAMON is ours until the guard drops.
    foliokit_lab::mthp::restore_on_interrupt(vec![
        (kd.join("0/state"), "off".into()),
        (kd.join("nr_kdamonds"), "0".into()),
    ]);
    write(&kd.join("nr_kdamonds"), "1")?;
    let _restore = Restore {
        kdamonds: kd.clone(),
    };
    let k = kd.join("0");
    let c = k.join("contexts/0");
    write(&k.join("contexts/nr_contexts"), "1")?;
    // The kernel's own word, where the symbol list could not say (the
    // guard puts the kdamond we just made back).
    let offers = read(&c.join("avail_operations")).unwrap_or_default();
    if !offers.is_empty() && !offers.split_whitespace().any(|o| o == "vaddr") {
        return Err(Unavailable::NoVaddr {
            offers: Some(offers.split_whitespace().collect::<Vec<_>>().join(" ")),
        }
        .into());
    }
    write(&c.join("operations"), "vaddr")?;
    let a = c.join("monitoring_attrs");
    write(&a.join("intervals/sample_us"), &SAMPLE_US.to_string())?;
    write(&a.join("intervals/aggr_us"), &AGGR_US.to_string())?;
    // Finer regions than the default minimum of 10 over the whole address
    // space, so a hot part of a buffer is told from the cold rest.
    write(&a.join("nr_regions/min"), "100")?;
    write(&a.join("nr_regions/max"), "2000")?;
    write(&c.join("targets/nr_targets"), "1")?;
    write(&c.join("targets/0/pid_target"), &pid.to_string())?;
    write(&c.join("schemes/nr_schemes"), "1")?;
    let s = c.join("schemes/0");
    write(&s.join("action"), "stat")?;
    let ap = s.join("access_pattern");
    // Every size: the sysfs default is 0-0, which matches nothing. 1 PiB
    // is above any region.
    write(&ap.join("sz/min"), "0")?;
    write(&ap.join("sz/max"), "1125899906842624")?;
    write(&ap.join("nr_accesses/min"), "0")?;
    write(&ap.join("nr_accesses/max"), "0")?;
    // Idle for at least a quarter of the window, in aggregation intervals:
    // a region's age restarts when its access count changes as DAMON
    // splits and merges regions, and a busy or emulated machine runs fewer
    // sampling rounds than the clock allows (intervals are counted in
    // samples), so the whole window would match nothing there.
    let age = (window.as_micros() as u64 / AGGR_US / 4).max(1);
    write(&ap.join("age/min"), &age.to_string())?;
    write(&ap.join("age/max"), &u32::MAX.to_string())?;
    write(&k.join("state"), "on")?;
    std::thread::sleep(window);
    write(&k.join("state"), "update_schemes_tried_regions")?;
    let tried = s.join("tried_regions");
    let mut regions = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&tried)
        .map_err(|e| format!("DAMON: cannot list {}: {e}", tried.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().parse::<u32>().is_ok())
        })
        .collect();
    entries.sort();
    for e in entries {
        let (Ok(st), Ok(en)) = (read(&e.join("start")), read(&e.join("end"))) else {
            continue;
        };
        if let (Ok(st), Ok(en)) = (st.parse::<usize>(), en.parse::<usize>()) {
            regions.push((st, en));
        }
    }
    Ok(intersect(&regions, within, 4096))
}

/// The parts of `regions` inside `within`, shrunk to whole pages.
fn intersect(
    regions: &[(usize, usize)],
    within: &[(usize, usize)],
    page: usize,
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &(a, b) in regions {
        for &(c, d) in within {
            let (s, e) = (a.max(c).next_multiple_of(page), b.min(d) / page * page);
            if s < e {
                out.push((s, e));
            }
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_regions_are_cut_to_the_mappings_and_to_pages() {
        let r = intersect(
            &[(0x1000, 0x9000), (0x20_0100, 0x30_0000)],
            &[(0x0, 0x4000), (0x20_0000, 0x28_0000)],
            4096,
        );
        assert_eq!(r, vec![(0x1000, 0x4000), (0x20_1000, 0x28_0000)]);
        assert!(intersect(&[(0x1000, 0x1800)], &[(0, 0x10000)], 4096).is_empty());
    }

    #[test]
    fn vaddr_is_read_from_the_symbol_list() {
        let paddr_only =
            "ffffffff816a5270 t damon_pa_scheme_score\nffffffff816a52d0 t damon_pa_batch_lock\n";
        assert_eq!(vaddr_in_symbols(paddr_only.lines()), Some(false));
        let both =
            "0000000000000000 t damon_pa_apply_scheme\n0000000000000000 t damon_va_apply_scheme\n";
        assert_eq!(vaddr_in_symbols(both.lines()), Some(true));
        assert_eq!(vaddr_in_symbols(["0000000000000000 T do_sys_open"]), None);
        assert_eq!(vaddr_in_symbols([""; 0]), None);
    }

    #[test]
    fn each_refusal_is_one_line_that_names_what_is_missing() {
        let cases = [
            (Unavailable::NoSysfs, "CONFIG_DAMON_SYSFS"),
            (Unavailable::NoVaddr { offers: None }, "CONFIG_DAMON_VADDR"),
            (
                Unavailable::NoVaddr {
                    offers: Some("paddr".into()),
                },
                "offers: paddr",
            ),
            (
                Unavailable::NoPermission("x is not writable here".into()),
                "root",
            ),
            (
                Unavailable::InUse {
                    kdamonds: 2,
                    running: vec![1],
                },
                "2 kdamonds, running: 1",
            ),
        ];
        for (u, want) in cases {
            let line = u.to_string();
            assert!(line.contains(want) && !line.contains('\n'), "{line}");
        }
    }
}

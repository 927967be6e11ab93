//! `foliokit move --cold SECS`: the regions of a process DAMON saw idle.
//!
//! DAMON's sysfs interface (`/sys/kernel/mm/damon/admin`) has one set of
//! kdamonds for the whole system, and writing `nr_kdamonds` rebuilds it.
//! So foliokit uses DAMON only where nobody else does (no kdamond
//! configured): it sets up one kdamond watching the target's virtual
//! address space with a `stat` scheme for regions with no access for the
//! whole window, runs it for SECS, reads the regions the scheme matched,
//! and puts `nr_kdamonds` back to 0, also on error (a guard) and on Ctrl-C
//! (the CLI's restore-on-interrupt list). Elsewhere it says why and does
//! nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::CliError;

const ADMIN: &str = "/sys/kernel/mm/damon/admin";
/// DAMON's aggregation interval we set: an access count covers this long.
const AGGR_US: u64 = 100_000;
const SAMPLE_US: u64 = 5_000;

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
    let admin = Path::new(ADMIN);
    if !admin.exists() {
        return Err(format!(
            "--cold needs DAMON's sysfs interface ({ADMIN}), which this kernel lacks: nothing moved"
        )
        .into());
    }
    if window.is_zero() {
        return Err("--cold needs a window of at least one second".into());
    }
    let kd = admin.join("kdamonds");
    let nr: usize = read(&kd.join("nr_kdamonds"))?.parse().unwrap_or(0);
    if nr > 0 {
        let on: Vec<String> = (0..nr)
            .filter(|i| read(&kd.join(format!("{i}/state"))).is_ok_and(|s| s == "on"))
            .map(|i| i.to_string())
            .collect();
        return Err(format!(
            "--cold: DAMON is already set up on this system ({nr} kdamond{}{}); using it would rebuild that setup, so foliokit leaves it alone: nothing moved",
            if nr == 1 { "" } else { "s" },
            if on.is_empty() {
                String::new()
            } else {
                format!(", running: {}", on.join(" "))
            }
        )
        .into());
    }
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
}

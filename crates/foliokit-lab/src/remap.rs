//! Seed 004: mremap of large folios. The seed's test program once per mTHP
//! size (and the 4 KiB control), plus the kernel selftest's 1 GiB move at
//! PTE, PMD and PUD alignment.

use std::io;
use std::time::Instant;
use thiserror::Error;

use foliokit::batch::page_size;
use foliokit::mem::system::{is_root, thp_state};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;

use crate::census::census;
use crate::measure::Stats;
use crate::mthp::{arm_interrupt_restore, MthpSettings};
use crate::progress::Progress;
use crate::schema::Report;
use crate::units::show_size;
use crate::LabError;

/// Seed 004's region size and mmap hint.
pub const REGION: usize = 1 << 20;
pub const HINT: usize = 1 << 30;
const GIB: usize = 1 << 30;

#[derive(Debug, Error)]
pub enum RemapError {
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        source: io::Error,
    },
}

fn sys(what: &'static str) -> RemapError {
    RemapError::Sys {
        what,
        source: io::Error::last_os_error(),
    }
}

/// Seed 004's program: `n` times mmap 1 MiB at [`HINT`], memset it, mremap
/// it to +1 MiB (MAYMOVE|FIXED), munmap. With `want_census`, also counts the
/// folios behind the first mapping (root only). Returns the seconds for all
/// `n` iterations, and the census summary.
pub fn seed004_loop(n: u32, want_census: bool) -> Result<(f64, Option<String>), RemapError> {
    let mut seen = None;
    let t0 = Instant::now();
    for i in 0..n {
        // SAFETY: an anonymous mapping at a hint (not MAP_FIXED): the kernel
        // picks another address if the hint is taken.
        let addr = unsafe {
            libc::mmap(
                HINT as *mut libc::c_void,
                REGION,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(sys("mmap 1M"));
        }
        // SAFETY: addr is our fresh 1 MiB read-write mapping.
        unsafe { libc::memset(addr, 0xAA, REGION) };
        if i == 0 && want_census {
            seen = census(addr as *const u8, REGION).map(|c| c.summary());
        }
        let target = (addr as usize + REGION) as *mut libc::c_void;
        // SAFETY: moves our own mapping onto the 1 MiB right after it, which
        // MREMAP_FIXED replaces (as the seed's program does).
        let new = unsafe {
            libc::mremap(
                addr,
                REGION,
                REGION,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                target,
            )
        };
        if new != target {
            let e = sys("mremap 1M");
            // SAFETY: unmapping our own mapping on the error path.
            unsafe { libc::munmap(addr, REGION) };
            return Err(e);
        }
        // SAFETY: `new` is our mapping.
        unsafe { libc::munmap(new, REGION) };
    }
    Ok((t0.elapsed().as_secs_f64(), seen))
}

/// Where source and destination sit in the selftest's 1 GiB move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alignment {
    /// Different offsets within a PMD: every PTE moves on its own.
    Pte,
    /// Both 2 MiB-aligned (not 1 GiB): PMD entries move.
    Pmd,
    /// Both 1 GiB-aligned: one PUD entry moves.
    Pud,
}

/// A populated 1 GiB region (4 KiB pages) moved by one mremap; returns the
/// seconds the mremap call alone took.
pub fn mremap_1g(align: Alignment) -> Result<f64, RemapError> {
    let page = page_size();
    // The aligned base can sit up to 1 GiB into the reservation and the
    // destination ends up to 3 GiB + 2 pages past the base: 5 GiB covers it,
    // so MAP_FIXED/MREMAP_FIXED never touch memory that is not ours.
    let reserve_len = 5 * GIB;
    // SAFETY: an inaccessible reservation of address space we own.
    let reserve = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            reserve_len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if reserve == libc::MAP_FAILED {
        return Err(sys("reserving 5G of address space"));
    }
    let base = (reserve as usize).next_multiple_of(GIB);
    let (src, dst) = match align {
        Alignment::Pte => (base + page, base + 2 * GIB + 2 * page),
        Alignment::Pmd => (base + (2 << 20), base + 2 * GIB + (2 << 20)),
        Alignment::Pud => (base, base + 2 * GIB),
    };
    debug_assert!(dst + GIB <= reserve as usize + reserve_len);
    let result = (|| {
        // SAFETY: src..src+1G lies inside our reservation, which MAP_FIXED
        // replaces with a read-write mapping.
        let m = unsafe {
            libc::mmap(
                src as *mut libc::c_void,
                GIB,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if m == libc::MAP_FAILED {
            return Err(sys("mmap 1G"));
        }
        // SAFETY: our mapping; 4 KiB pages, so every case has PTE tables.
        unsafe { libc::madvise(m, GIB, libc::MADV_NOHUGEPAGE) };
        // SAFETY: as above.
        if unsafe { libc::madvise(m, GIB, libc::MADV_POPULATE_WRITE) } != 0 {
            return Err(sys("populating 1G"));
        }
        let t0 = Instant::now();
        // SAFETY: moves our mapping onto dst..dst+1G inside our reservation.
        let new = unsafe {
            libc::mremap(
                m,
                GIB,
                GIB,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                dst as *mut libc::c_void,
            )
        };
        let secs = t0.elapsed().as_secs_f64();
        if new as usize != dst {
            return Err(sys("mremap 1G"));
        }
        Ok(secs)
    })();
    // SAFETY: drops the whole reservation, including what was mapped in it.
    unsafe { libc::munmap(reserve, reserve_len) };
    result
}

/// Seed 004's experiment: how many iterations per loop, how many loops.
#[derive(Debug, Clone)]
pub struct RemapPlan {
    /// Iterations of mmap, memset, mremap, munmap per timed loop.
    pub iterations: u32,
    /// Timed loops per folio size (and per alignment case).
    pub loops: usize,
    /// Also run the 1 GiB PTE/PMD/PUD mremap cases.
    pub align: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MremapRow {
    /// "seed004" (the 1 MiB loop) or "mremap-1g" (the selftest cases).
    pub function: String,
    /// mTHP size under test (4096 for the control); 0 for the alignment cases.
    pub folio_size: usize,
    /// PTE, PMD or PUD for the alignment cases.
    pub alignment: Option<String>,
    /// Folios the kernel actually used, from /proc/kpageflags (root only).
    pub obtained: String,
    /// Seconds per timed loop (all iterations), or per mremap call.
    pub secs: Stats,
    /// The baseline's mean over this row's mean (4K for seed004, PTE for 1 GiB).
    pub speedup: f64,
}

/// Runs seed 004's experiment: its loop per mTHP size (sizes changed in
/// sysfs when root, and put back), then the 1 GiB cases.
pub fn run(a: &RemapPlan, progress: &dyn Progress) -> Result<Report<MremapRow>, LabError> {
    let mut settings = MthpSettings::system();
    let before = settings.snapshot();
    let root = is_root();
    let top = thp_state().enabled.unwrap_or_default();
    // The sizes the test can use: mTHP sizes that fit in the 1 MiB region.
    let mut sizes: Vec<Option<usize>> = vec![None];
    sizes.extend(before.keys().copied().filter(|&s| s <= REGION).map(Some));
    let title = format!(
        "mremap: seed 004's loop ({} x mmap 1M at {:#x}, memset, mremap +1M, munmap) per mTHP size, {} loops",
        a.iterations,
        HINT,
        a.loops
    );
    let params = json!({"iterations": a.iterations, "loops": a.loops, "region": REGION,
                        "hint": HINT});
    let mut report = Report::<MremapRow>::new("mremap", title, params);
    let effective = |v: &str| if v == "inherit" { top.as_str() } else { v }.to_string();
    let runnable: Vec<Option<usize>> = if root {
        sizes
    } else {
        // Without root, use only what the current settings already give.
        let always: Vec<usize> = before
            .iter()
            .filter(|(_, v)| effective(v) == "always")
            .map(|(&s, _)| s)
            .collect();
        let (ok, skip): (Vec<_>, Vec<_>) = sizes.into_iter().partition(|s| match s {
            None => always.is_empty(),
            Some(s) => always == [*s],
        });
        for s in skip {
            report.notes.push(format!(
                "{}: skipped, changing mTHP settings needs root",
                s.map_or("4K control".into(), show_size)
            ));
        }
        ok
    };
    if !root {
        report.notes.push(
            "without root, mTHP settings cannot be read back per page (no kpageflags)".into(),
        );
    }
    let cases = if a.align { 3 } else { 0 };
    progress.begin(runnable.len() * a.loops + cases * a.loops, "mremap");
    let mut control = f64::NAN;
    for size in runnable {
        if root {
            settings.only(size)?;
            arm_interrupt_restore(&settings);
        }
        let (_, obtained) = seed004_loop(1, true)?; // warm-up, and the census
        let mut secs = Vec::new();
        for _ in 0..a.loops {
            secs.push(seed004_loop(a.iterations, false)?.0);
            progress.tick();
        }
        let s = Stats::of(&secs).expect("loops >= 1");
        if size.is_none() {
            control = s.mean;
        }
        report.rows.push(MremapRow {
            function: "seed004".into(),
            folio_size: size.unwrap_or(foliokit::batch::page_size()),
            alignment: None,
            obtained: obtained.unwrap_or_else(|| "unknown (needs root)".into()),
            secs: s,
            speedup: control / s.mean,
        });
    }
    settings.restore()?;
    arm_interrupt_restore(&settings);
    let after = settings.snapshot();
    let mut pte = f64::NAN;
    for align in [Alignment::Pte, Alignment::Pmd, Alignment::Pud]
        .into_iter()
        .take(cases)
    {
        let mut secs = Vec::new();
        for _ in 0..a.loops {
            secs.push(mremap_1g(align)?);
            progress.tick();
        }
        let s = Stats::of(&secs).expect("loops >= 1");
        if align == Alignment::Pte {
            pte = s.mean;
        }
        report.rows.push(MremapRow {
            function: "mremap-1g".into(),
            folio_size: 0,
            alignment: Some(format!("{align:?}").to_uppercase()),
            obtained: "4K pages".into(),
            secs: s,
            speedup: pte / s.mean,
        });
    }
    progress.end();
    let fmt = |m: &BTreeMap<usize, String>| {
        m.iter()
            .map(|(s, v)| format!("{}={v}", show_size(*s)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    report.header.push(format!("mTHP before: {}", fmt(&before)));
    report.footer.push(format!(
        "mTHP after:  {} ({})",
        fmt(&after),
        if after == before {
            "restored"
        } else {
            "DIFFERENT"
        }
    ));
    report.footer.push("speedup: the 4K control's mean over the row's (seed004); the PTE case's mean over the row's (1G)".into());
    report.footer.push(crate::seeds::quote("mremap"));
    report.section("sysfs_before", &before);
    report.section("sysfs_after", &after);
    report.section("sysfs_restored", after == before);
    if after != before {
        return Err("mTHP settings differ from before the run".into());
    }
    Ok(report)
}

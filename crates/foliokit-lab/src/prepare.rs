//! Preparing an experiment's buffers: the shape checks every experiment
//! shares (folio sizes this kernel backs, sizes that divide, memory that is
//! there), mTHP made real for a row's folio size, and the backing counted
//! from the kernel's page flags.

use crate::mthp::{arm_interrupt_restore, MthpError, MthpSettings};
use crate::units::{approx_size, mem_available, show_size};
use crate::LabError;

/// Rejects folio sizes no page-table level backs: a size must be the base
/// page, a THP size this kernel offers (PMD or mTHP), or 1G (hugetlb).
/// Without THP sysfs at all, powers of two up to 2M pass: the region then
/// says what backing it obtained.
fn check_folio_sizes(folios: &[usize], page: usize) -> Result<(), LabError> {
    const GIB: usize = 1 << 30;
    let thp = foliokit::mem::system::thp_state();
    let mut offered: Vec<usize> = thp.mthp.iter().map(|m| m.size).collect();
    offered.extend(thp.pmd_size);
    let no_thp_info = offered.is_empty();
    offered.extend([page, GIB]);
    offered.sort_unstable();
    offered.dedup();
    for &f in folios {
        let ok = offered.contains(&f)
            || (no_thp_info && f.is_power_of_two() && f >= page && f <= 2 << 20);
        if !ok {
            let list: Vec<String> = offered.iter().map(|&s| show_size(s)).collect();
            return Err(format!(
                "folio size {} has no THP order on this kernel; it offers {} (base page, THP sizes from sysfs, 1G hugetlb)",
                show_size(f),
                list.join(" ")
            )
            .into());
        }
    }
    Ok(())
}

/// The note for rows on several channels whose batch is too small for the
/// pool to wake its workers (it copies such a batch on the calling thread).
pub fn inline_note(size: usize, channels: &[usize]) -> Option<String> {
    let min = foliokit::tune::CHANNEL_MIN_BATCH_BYTES;
    (size < min && channels.iter().any(|&t| t > 1)).then(|| {
        format!(
            "rows on more than one channel ran on the calling thread: a batch under {} is not worth waking channel workers for (CHANNEL_MIN_BATCH_BYTES)",
            show_size(min)
        )
    })
}

/// Checks the folio sizes divide the size and the memory is there.
pub fn check_shape(size: usize, folios: &[usize], buffers: usize) -> Result<(), LabError> {
    let page = foliokit::batch::page_size();
    check_folio_sizes(folios, page)?;
    for &f in folios {
        if f % page != 0 {
            return Err(format!(
                "folio size {} is not a multiple of the {page}-byte page",
                show_size(f)
            )
            .into());
        }
        if size % f != 0 {
            return Err(format!(
                "size {} is not a whole number of {} folios",
                show_size(size),
                show_size(f)
            )
            .into());
        }
    }
    let need = size.saturating_mul(buffers);
    if let Some(avail) = mem_available() {
        if need > avail {
            return Err(format!(
                "this run needs {} of memory ({buffers} × {}) but only {} is available",
                show_size(need),
                show_size(size),
                approx_size(avail)
            )
            .into());
        }
    }
    Ok(())
}

/// Faults in the regions `alloc` makes for `folio`-sized rows with real mTHP
/// backing where that takes a sysfs change. For an mTHP size (above the base
/// page, below the PMD size) that sysfs does not already allow via madvise,
/// a root run sets that size's knob to `madvise` — so only ranges that ask
/// for huge pages, as our regions do, get it — while `alloc` faults the
/// regions in, then puts the knob back, also on error (the guard's drop)
/// and on Ctrl-C (the same handler as the mremap bench). Returns the
/// regions and a note saying what was done, or why not.
pub fn with_mthp<T>(
    folio: usize,
    alloc: impl FnOnce() -> Result<T, LabError>,
) -> Result<(T, Option<String>), LabError> {
    use foliokit::mem::system::{is_root, thp_state};
    let thp = thp_state();
    let pmd = thp.pmd_size.unwrap_or(2 << 20);
    let is_mthp = folio > foliokit::batch::page_size() && folio < pmd;
    if !is_mthp {
        return Ok((alloc()?, None));
    }
    let mut settings = MthpSettings::system();
    let sizes = settings.snapshot();
    if !sizes.contains_key(&folio) {
        let why = format!(
            "{}: this kernel offers no {} mTHP size; 4K pages used",
            show_size(folio),
            show_size(folio)
        );
        return Ok((alloc()?, Some(why)));
    }
    // The kernel gives a range the largest allowed size that fits, so
    // larger sizes must be off while our buffers fault in.
    let larger: Vec<usize> = sizes
        .keys()
        .copied()
        .filter(|&s| s > folio && thp.madvise_allows(s))
        .collect();
    let allowed = thp.madvise_allows(folio);
    if allowed && larger.is_empty() {
        return Ok((alloc()?, None));
    }
    let names = |v: &[usize]| {
        v.iter()
            .map(|&s| show_size(s))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if !is_root() {
        let why = if allowed {
            format!(
                "{}: sysfs also allows larger sizes ({}) and turning them off needs root: the buffers may hold those instead",
                show_size(folio),
                names(&larger)
            )
        } else {
            format!(
                "{}: sysfs does not allow {} mTHP via madvise and enabling it needs root; 4K pages used",
                show_size(folio),
                show_size(folio)
            )
        };
        return Ok((alloc()?, Some(why)));
    }
    let changed = (|| {
        if !allowed {
            settings.set(folio, "madvise")?;
            arm_interrupt_restore(&settings);
        }
        for &s in &larger {
            settings.set(s, "never")?;
            arm_interrupt_restore(&settings);
        }
        Ok::<_, MthpError>(())
    })();
    let made = match changed {
        Ok(()) => alloc(),
        Err(e) => Err(e.into()),
    };
    let restored = settings.restore();
    arm_interrupt_restore(&settings);
    let made = made?;
    restored?;
    let mut did = Vec::new();
    if !allowed {
        did.push(format!("{} set to madvise", show_size(folio)));
    }
    if !larger.is_empty() {
        did.push(format!("{} set to never", names(&larger)));
    }
    let note = format!(
        "{}: mTHP {} in sysfs while the buffers were faulted in, then restored",
        show_size(folio),
        did.join(", ")
    );
    Ok((made, Some(note)))
}

/// The backing of a region, with the folios counted from the kernel's page
/// flags when they can be (root; the first 32 MiB, which is enough to tell
/// mTHP from 4 KiB pages and fast to read).
pub fn counted_backing(
    region: &crate::hugetlb::PooledRegion,
    folio: usize,
) -> foliokit::mem::Backing {
    let mut b = region.backing();
    let pmd = foliokit::mem::system::thp_state()
        .pmd_size
        .unwrap_or(2 << 20);
    if folio > foliokit::batch::page_size() && folio < pmd {
        let sample = region.len().min(32 << 20);
        if let Some(c) = crate::census::census(region.as_ptr(), sample) {
            b.obtained = format!(
                "{} (census of the first {}: {})",
                if c.folios.keys().any(|&s| s == folio) {
                    format!("mTHP {}", show_size(folio))
                } else {
                    "no mTHP".to_string()
                },
                show_size(sample),
                c.summary()
            );
        }
    }
    b
}

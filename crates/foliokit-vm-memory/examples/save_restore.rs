//! A VMM's save/restore flow with foliokit-vm-memory:
//!
//! 1. source VM: allocate guest RAM (vm-memory), prefault it in parallel,
//!    let the "guest" write to it;
//! 2. pause the vCPUs and snapshot guest RAM to a file; guest pages that
//!    raise SIGBUS would be reported and recorded instead of killing us;
//! 3. destination VM: allocate and prefault guest RAM, restore the
//!    snapshot with poison-safe copies, check the bad ranges (none here),
//!    and read the dirty bitmap the restore marked;
//! 4. what a damaged snapshot looks like: the same file cut short by three
//!    pages restores everything else and names the lost guest ranges;
//! 5. move a guest range to the VM's NUMA node (the kernel path).
//!
//! Run: `cargo run -p foliokit-vm-memory --example save_restore`

use std::error::Error;

use foliokit::migrate::MigrateOptions;
use foliokit_vm_memory::{
    migrate_range, prefault, restore_from_path, snapshot_to_file, RestoreReport,
};
use vm_memory::bitmap::{AtomicBitmap, Bitmap};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Low RAM below the PCI hole, and high RAM above 4 GiB, as x86 VMMs lay
/// guest memory out.
const LAYOUT: [(GuestAddress, usize); 2] = [
    (GuestAddress(0), 32 << 20),
    (GuestAddress(1 << 32), 16 << 20),
];

type Ram = GuestMemoryMmap<AtomicBitmap>;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// What the "guest" writes: a recognisable value every 4 KiB.
fn run_guest(ram: &Ram) -> Result<(), Box<dyn Error>> {
    for region in ram.iter() {
        let base = region.start_addr().0;
        for off in (0..region.len()).step_by(4096) {
            ram.write_obj(base ^ off ^ 0x5eed, GuestAddress(base + off))?;
        }
    }
    Ok(())
}

fn check_guest(ram: &Ram, skip: &RestoreReport) -> Result<u64, Box<dyn Error>> {
    let mut checked = 0;
    for region in ram.iter() {
        let base = region.start_addr().0;
        for off in (0..region.len()).step_by(4096) {
            let at = base + off;
            let lost = skip
                .bad
                .iter()
                .chain(&skip.bad_at_save)
                .any(|b| at >= b.addr.0 && at < b.addr.0 + b.len);
            if lost {
                continue;
            }
            let v: u64 = ram.read_obj(GuestAddress(at))?;
            if v != base ^ off ^ 0x5eed {
                return Err(format!("guest page {at:#x} restored wrong: {v:#x}").into());
            }
            checked += 1;
        }
    }
    Ok(checked)
}

fn dirty_pages(ram: &Ram) -> usize {
    ram.iter()
        .map(|r| {
            (0..r.len() as usize)
                .step_by(4096)
                .filter(|&o| r.bitmap().dirty_at(o))
                .count()
        })
        .sum()
}

fn report_restore(what: &str, r: &RestoreReport) {
    println!(
        "{what}: {} guest pages ({:.1} MiB) restored in {:.3} s, {} bad range(s), {} bad at save{}",
        r.restored / 4096,
        mib(r.restored),
        r.secs,
        r.bad.len(),
        r.bad_at_save.len(),
        if r.trailer_missing {
            " (snapshot trailer missing: it was cut short)"
        } else {
            ""
        }
    );
    for b in r.bad.iter().chain(&r.bad_at_save) {
        println!(
            "  guest {:#x}..{:#x} ({} pages): {} -> a VMM would inject a memory error for it or refuse to resume",
            b.addr.0,
            b.addr.0 + b.len,
            b.len / 4096,
            b.kind
        );
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir();
    let snap = dir.join(format!("foliokit-save-restore-{}.snap", std::process::id()));
    let cut = dir.join(format!("foliokit-save-restore-{}.cut", std::process::id()));

    // 1. Source VM.
    let src = Ram::from_ranges(&LAYOUT)?;
    let p = prefault(&src, 2)?;
    println!(
        "source: prefaulted {:.1} MiB in {} chunks on up to {} threads ({} by MADV_POPULATE_WRITE)",
        mib(p.bytes),
        p.chunks,
        p.channels,
        p.madvised_chunks
    );
    run_guest(&src)?;

    // 2. vCPUs paused (a real VMM stops them here): save guest RAM.
    let s = snapshot_to_file(&src, &snap)?;
    println!(
        "snapshot: {:.1} MiB of guest RAM -> {} ({:.1} MiB) in {:.3} s, {} bad range(s), copy {}",
        mib(s.guest_bytes),
        snap.display(),
        mib(s.bytes_written),
        s.secs,
        s.bad.len(),
        s.strategy
            .map_or_else(|| "none".to_string(), |c| c.to_string())
    );

    // 3. Destination VM.
    let dst = Ram::from_ranges(&LAYOUT)?;
    prefault(&dst, 2)?;
    let r = restore_from_path(&dst, &snap)?;
    report_restore("restore", &r);
    if !r.bad.is_empty() || !r.bad_at_save.is_empty() {
        return Err("an intact snapshot restored with bad ranges".into());
    }
    let pages = check_guest(&dst, &r)?;
    println!(
        "restore: {pages} guest pages checked, {} marked dirty (what live migration would send next)",
        dirty_pages(&dst)
    );

    // 4. A damaged snapshot: three pages short (the trailer goes too).
    std::fs::copy(&snap, &cut)?;
    let file = std::fs::OpenOptions::new().write(true).open(&cut)?;
    let header = 4096;
    let data_end = header + LAYOUT.iter().map(|r| r.1 as u64).sum::<u64>();
    file.set_len(data_end - 3 * 4096)?;
    let damaged = Ram::from_ranges(&LAYOUT)?;
    let r = restore_from_path(&damaged, &cut)?;
    report_restore("restore from the cut file", &r);
    let pages = check_guest(&damaged, &r)?;
    println!(
        "restore from the cut file: {pages} guest pages intact, {} dirty",
        dirty_pages(&damaged)
    );

    // 5. Place low RAM on the VM's node (the first online node here).
    let node = foliokit::mem::system::numa_nodes()[0];
    let moved = migrate_range(
        &dst,
        LAYOUT[0].0,
        LAYOUT[0].1 as u64,
        node,
        &MigrateOptions::default(),
    )?;
    for m in &moved {
        println!(
            "migrate: guest {:#x} + {:.1} MiB to node {node}: {} pages to move, {} failed{}",
            m.addr.0,
            mib(m.len),
            m.report.pages_to_move,
            m.report.failed.len(),
            m.report
                .notes
                .iter()
                .map(|n| format!("; {n}"))
                .collect::<String>()
        );
    }

    let _ = std::fs::remove_file(&snap);
    let _ = std::fs::remove_file(&cut);
    Ok(())
}

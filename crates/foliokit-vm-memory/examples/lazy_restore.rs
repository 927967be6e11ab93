//! A VMM's lazy restore with foliokit-vm-memory:
//!
//! 1. source VM: guest RAM (vm-memory, THP-advised), the "guest" writes a
//!    recognisable value every 4 KiB, snapshot to a file;
//! 2. destination VM: fresh guest RAM, `restore_lazy` returns at once and
//!    the vCPUs start: here two threads touching random guest pages (each
//!    first touch waits for its folio) while the fill runs in the
//!    background;
//! 3. `wait`: every page resident, guest RAM unregistered (plain memory),
//!    the report (faults served, folios moved in whole, bad ranges) and a
//!    check of every page;
//! 4. where the kernel refuses (no /dev/userfaultfd access, no privilege),
//!    the typed error says why and the VMM restores eagerly instead.
//!
//! Run: `cargo run --release -p foliokit-vm-memory --example lazy_restore`
//! (as root or with access to /dev/userfaultfd).

use std::error::Error;
use std::time::Instant;

use foliokit_vm_memory::{
    restore_from_path, restore_lazy_from_path, snapshot_to_file, Error as VmError,
    LazyRestoreOptions,
};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

const LAYOUT: [(GuestAddress, usize); 2] = [
    (GuestAddress(0), 256 << 20),
    (GuestAddress(1 << 32), 128 << 20),
];

type Ram = GuestMemoryMmap<AtomicBitmap>;

fn guest_ram() -> Result<Ram, Box<dyn Error>> {
    let ram = Ram::from_ranges(&LAYOUT)?;
    for r in ram.iter() {
        let h = ram.get_host_address(r.start_addr())?;
        // SAFETY: advice on guest RAM we own: THP, as VMMs ask for it.
        unsafe { libc::madvise(h.cast(), r.len() as usize, libc::MADV_HUGEPAGE) };
    }
    Ok(ram)
}

fn value(at: u64) -> u64 {
    at ^ 0x5eed_f00d
}

fn main() -> Result<(), Box<dyn Error>> {
    let src = guest_ram()?;
    for r in src.iter() {
        let base = r.start_addr().0;
        for off in (0..r.len()).step_by(4096) {
            src.write_obj(value(base + off), GuestAddress(base + off))?;
        }
    }
    let path = std::env::temp_dir().join(format!("lazy-restore-{}.snap", std::process::id()));
    let saved = snapshot_to_file(&src, &path)?;
    println!(
        "saved {} MiB of guest RAM to {}",
        saved.guest_bytes >> 20,
        path.display()
    );
    drop(src);

    let dst = guest_ram()?;
    let t0 = Instant::now();
    let handle = match restore_lazy_from_path(&dst, &path, &LazyRestoreOptions::default()) {
        Ok(h) => h,
        Err(e @ VmError::Lazy(_)) => {
            println!("lazy restore refused ({e}); restoring eagerly");
            let r = restore_from_path(&dst, &path)?;
            println!("eager restore: {:.1} ms", r.secs * 1e3);
            let _ = std::fs::remove_file(&path);
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!(
        "restore_lazy returned after {:.3} ms: vCPUs start now",
        handle.start_secs() * 1e3
    );
    // Two "vCPUs" touching random pages while the fill runs.
    let pages: Vec<u64> = dst
        .iter()
        .flat_map(|r| {
            let b = r.start_addr().0;
            (0..r.len() / 4096).map(move |i| b + i * 4096)
        })
        .collect();
    let slowest = std::thread::scope(|s| {
        let vcpus: Vec<_> = (0..2u64)
            .map(|k| {
                let (dst, pages) = (&dst, &pages);
                s.spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ k;
                    let mut worst = 0f64;
                    for _ in 0..2000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let at = pages[(x % pages.len() as u64) as usize];
                        let t = Instant::now();
                        let v: u64 = dst.read_obj(GuestAddress(at)).expect("guest read");
                        worst = worst.max(t.elapsed().as_secs_f64());
                        assert_eq!(v, value(at), "guest page {at:#x}");
                    }
                    worst
                })
            })
            .collect();
        vcpus
            .into_iter()
            .map(|v| v.join().expect("vCPU"))
            .fold(0f64, f64::max)
    });
    let p = handle.progress();
    println!(
        "vCPUs done: slowest touch {:.0} µs; so far {} pages faulted in, {} filled of {}",
        slowest * 1e6,
        p.faulted_pages,
        p.filled_pages,
        p.total_pages
    );
    let r = handle.wait();
    println!(
        "every page resident after {:.1} ms: {} faults, {} folios moved in whole, {} batches (longest {:.0} µs), bad ranges {:?}",
        t0.elapsed().as_secs_f64() * 1e3,
        r.fill.progress.faults,
        r.fill.whole_folios,
        r.fill.batches,
        r.fill.longest_batch_us,
        r.bad
    );
    for &at in &pages {
        let v: u64 = dst.read_obj(GuestAddress(at))?;
        assert_eq!(v, value(at), "guest page {at:#x} after the fill");
    }
    println!("all {} guest pages checked", pages.len());
    let _ = std::fs::remove_file(&path);
    Ok(())
}

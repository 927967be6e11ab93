//! mremap experiments: seed 004's loop and the kernel selftest's 1 GiB
//! move at PTE, PMD and PUD alignment.

use std::io;
use std::time::Instant;
use thiserror::Error;

use crate::census::census;
use foliokit::batch::page_size;

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

//! Real hardware poison (`MADV_HWPOISON`) under `copy_mc` and
//! `copy_folios_mc`. Needs CONFIG_MEMORY_FAILURE and CAP_SYS_ADMIN: it runs
//! in the guest kernels of `cargo xtask vm-test` and says why it skips
//! elsewhere. Each test runs in its own process: poisoned pages are gone for
//! good, and a mistake here kills a process.

mod common;

use common::{in_child, missing, pattern, Need, PAGE};
use foliokit::mc::{copy_folios_mc, copy_mc, FaultKind, McError};
use foliokit::mem::Region;
use foliokit::{CopyOptions, CopyStrategy, Reuse, Strategy};
use std::sync::atomic::{AtomicI32, Ordering::SeqCst};
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

/// si_code of the SIGBUS the injection itself raised (Linux 6.12 signals
/// `BUS_MCEERR_AR` from inside `madvise`; 6.1 only on the later access).
static INJECTION_SIGBUS: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_injection(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    INJECTION_SIGBUS.store(unsafe { (*info).si_code }, SeqCst);
}

/// Poisons the page at `at`, with a handler armed first so the SIGBUS some
/// kernels raise at once is recorded instead of killing the process. `None`
/// (with the reason printed) where the kernel refuses.
fn poison(at: *mut u8) -> Option<i32> {
    // SAFETY: our three-argument SA_SIGINFO handler, installed for
    // SIGBUS in this test process only; foliokit's own handler, installed
    // later, chains faults that are not its own to this one.
    unsafe {
        common::set_handler(
            libc::SIGBUS,
            on_injection as *const () as usize,
            libc::SA_SIGINFO,
        );
    }
    // SAFETY: `at` is a page of the caller's own region; poisoning takes it
    // away for good, which is what the test wants.
    let rc = unsafe { libc::madvise(at.cast(), PAGE, libc::MADV_HWPOISON) };
    if rc != 0 {
        missing(Need::Hwpoison, &format!(
            "MADV_HWPOISON refused ({}): it needs CONFIG_MEMORY_FAILURE and CAP_SYS_ADMIN (cargo xtask vm-test runs this in a guest kernel that has them)",
            std::io::Error::last_os_error()
        ));
        return None;
    }
    Some(INJECTION_SIGBUS.swap(0, SeqCst))
}

#[test]
fn copy_mc_stops_at_a_really_poisoned_page() {
    in_child("copy_mc_stops_at_a_really_poisoned_page", T, || {
        let mut r = Region::new(3 * PAGE, PAGE).unwrap();
        let want = pattern(3 * PAGE, 5);
        r.as_mut_slice().copy_from_slice(&want);
        let Some(code) = poison(r.as_mut_ptr().wrapping_add(PAGE)) else {
            return;
        };
        println!(
            "NOTE: si_code raised by the injection itself: {code} (BUS_MCEERR_AR = {})",
            libc::BUS_MCEERR_AR
        );
        for s in [
            CopyStrategy::Movsb,
            CopyStrategy::Nt,
            CopyStrategy::Avx2,
            CopyStrategy::Auto,
        ] {
            if let Some(why) = s.unavailable() {
                missing(Need::Cpu, &format!("{}: {why}", s.name()));
                continue;
            }
            let mut dst = vec![0u8; 3 * PAGE];
            let f = match copy_mc(&mut dst, r.as_slice(), s) {
                Err(McError::Fault(f)) => f,
                other => panic!("{}: expected a poison fault, got {other:?}", s.name()),
            };
            assert_eq!(f.kind, FaultKind::Poison, "{}", s.name());
            assert_eq!(f.not_copied, 2 * PAGE, "{}", s.name());
            assert_eq!(f.bad_page, 1, "{}", s.name());
            assert_eq!(f.addr & !(PAGE - 1), r.as_ptr() as usize + PAGE);
            assert!(dst[..PAGE] == want[..PAGE], "{}: prefix", s.name());
        }
    })
}

#[test]
fn a_poisoned_page_in_the_middle_of_a_batch() {
    in_child("a_poisoned_page_in_the_middle_of_a_batch", T, || {
        // Four 16 KiB folios; the third page of folio 2 is poisoned.
        const F: usize = 4 * PAGE;
        let mut src = Region::new(4 * F, PAGE).unwrap();
        let p = pattern(4 * F, 9);
        src.as_mut_slice().copy_from_slice(&p);
        if poison(src.as_mut_ptr().wrapping_add(2 * F + 2 * PAGE)).is_none() {
            return;
        }
        let mut dst = Region::new(4 * F, PAGE).unwrap();
        let opts = CopyOptions::default()
            .strategy(CopyStrategy::Movsb)
            .reuse(Reuse::Reread);
        let r = copy_folios_mc(dst.as_mut_slice(), src.as_slice(), F, opts).unwrap();
        assert_eq!((r.folios, r.copied, r.faults.len()), (4, 3, 1));
        let f = r.faults[0];
        assert_eq!(f.index, 2);
        assert_eq!(f.fault.kind, FaultKind::Poison);
        assert_eq!((f.fault.not_copied, f.fault.bad_page), (2 * PAGE, 2));
        for i in [0, 1, 3] {
            assert!(dst.as_slice()[i * F..][..F] == p[i * F..][..F], "folio {i}");
        }
        assert!(dst.as_slice()[2 * F..][..2 * PAGE] == p[2 * F..][..2 * PAGE]);
    })
}

#[test]
fn a_lazy_fill_from_a_really_poisoned_snapshot_page() {
    in_child(
        "a_lazy_fill_from_a_really_poisoned_snapshot_page",
        T,
        || {
            use foliokit::lazy::{
                fill_lazily, BadOutcome, LazyError, LazyOptions, Segment, Source,
            };
            use std::os::fd::FromRawFd;
            // The snapshot lives in shmem (a memfd): a poisoned shmem page
            // stays poisoned, where a clean page of a disk file would be
            // dropped and read back from the disk on the next access.
            let len = 8 * PAGE;
            let want = pattern(len, 21);
            // SAFETY: a fresh memfd, ours alone, sized and filled here.
            let file = unsafe {
                let fd = libc::memfd_create(c"snapshot".as_ptr(), 0);
                assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
                std::fs::File::from_raw_fd(fd)
            };
            std::io::Write::write_all(&mut &file, &want).unwrap();
            let cache = Source::map_file(&file, len).unwrap();
            // Page 3 of the snapshot's page cache goes bad.
            if poison(cache.as_ptr().wrapping_add(3 * PAGE).cast_mut()).is_none() {
                return;
            }
            let mut ram = Region::unpopulated(len, PAGE).unwrap();
            let seg = Segment {
                addr: ram.as_mut_ptr() as usize,
                len,
                offset: 0,
            };
            let opts = LazyOptions {
                start_cancelled: true,
                ..LazyOptions::default()
            };
            let src = Source::map_file(&file, len).unwrap();
            // SAFETY: a fresh region of ours, touched only below.
            let h = match unsafe { fill_lazily(&[seg], src, &opts) } {
                Ok(h) => h,
                Err(LazyError::Refused(why)) => {
                    missing(Need::Uffd, &format!("lazy fill unavailable here: {why}"));
                    return;
                }
                Err(e) => panic!("{e}"),
            };
            // A touch of the bad page gets what real poison gives: a
            // machine-check SIGBUS at that address (the mc copy reports it),
            // where the kernel can install a poison marker (UFFDIO_POISON,
            // 6.6); before that (the 6.1 guest) the page is zeros and the
            // report says so.
            let mut buf = vec![0xaau8; PAGE];
            let bad_at = ram.as_ptr().wrapping_add(3 * PAGE);
            // SAFETY: our region, read with the mc copy.
            let r = unsafe {
                foliokit::copy_mc_raw(buf.as_mut_ptr(), bad_at, PAGE, CopyStrategy::Auto)
            };
            let rep = h.wait();
            match (r, rep.bad_outcome) {
                (Err(McError::Fault(f)), BadOutcome::Poisoned) => {
                    assert_eq!(f.kind, FaultKind::Poison, "{f:?}");
                    assert_eq!(f.addr & !(PAGE - 1), bad_at as usize);
                }
                (Ok(_), BadOutcome::Zeroed) => {
                    assert!(
                        buf.iter().all(|&b| b == 0),
                        "a bad page without poison must read zeros"
                    );
                    println!("NOTE: this kernel has no UFFDIO_POISON: the bad page reads zeros, and the report names it");
                }
                (other, outcome) => {
                    panic!(
                        "a really poisoned snapshot page read as {other:?} (outcome {outcome:?})"
                    )
                }
            }
            assert_eq!(rep.bad.len(), 1, "{:?}", rep.bad);
            let b = rep.bad[0];
            assert_eq!(
                (b.addr, b.len, b.kind),
                (bad_at as usize, PAGE, FaultKind::Poison)
            );
            // Every other page holds the snapshot's bytes.
            for i in (0..8).filter(|&i| i != 3) {
                assert!(
                    ram.as_slice()[i * PAGE..][..PAGE] == want[i * PAGE..][..PAGE],
                    "page {i}"
                );
            }
            drop(cache);
        },
    )
}

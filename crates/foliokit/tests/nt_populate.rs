//! Streaming stores (memcpy_nt, NtWriter, template fills) and parallel
//! populate: contents, drain-before-publish, residency, bad input.

mod common;

use common::{in_child, in_forked_child, pattern, sweep_copy, thread_count, Guarded, Place, PAGE};
use foliokit::mem::{populate, populate_raw, resident_pages, system, PopulateError, Region};
use foliokit::nt::{
    fill_from_template, fill_from_template_cached, fill_records, fill_records_cached, memcpy_nt,
    NtError, NtWriter, Record,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[test]
fn memcpy_nt_matches_the_reference() {
    sweep_copy("memcpy_nt", &|d, s| memcpy_nt(d, s).expect("memcpy_nt"));
}

#[test]
fn memcpy_nt_rejects_mismatched_lengths_untouched() {
    let mut d = [9u8; 32];
    assert_eq!(
        memcpy_nt(&mut d, &[1u8; 31]),
        Err(NtError::LengthMismatch { dst: 32, src: 31 })
    );
    assert_eq!(d, [9u8; 32]);
}

#[test]
fn writer_bounds_and_drain_on_every_way_out() {
    let mut buf = vec![0u8; 1024];
    NtWriter::with(&mut buf, |w| {
        assert_eq!(
            w.write_at(1000, &[1u8; 25]),
            Err(NtError::OutOfBounds {
                offset: 1000,
                len: 25,
                cap: 1024
            })
        );
        assert!(w.write_at(usize::MAX, &[1u8; 2]).is_err());
        w.write_at(512, &[3u8; 512]).unwrap();
    });
    assert!(buf[..512].iter().all(|&b| b == 0) && buf[512..].iter().all(|&b| b == 3));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        NtWriter::with(&mut buf, |w| {
            w.write_at(0, &[5u8; 64]).unwrap();
            panic!("unwinding through a writer");
        })
    }));
    assert!(r.is_err());
    assert!(buf[..64].iter().all(|&b| b == 5));
}

#[test]
fn drained_data_is_visible_to_a_thread_that_synchronises() {
    // The publication pattern the writer exists for: stream, drain (the end
    // of `with`), then release; the acquirer must see every byte.
    let mut region = Region::new(8 << 20, PAGE).unwrap();
    let ready = AtomicBool::new(false);
    let want = pattern(region.len(), 4);
    let ptr = region.as_mut_ptr() as usize;
    let len = region.len();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !ready.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            // SAFETY: the writer finished before the release; nothing writes now.
            let seen = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            assert!(seen == &want[..], "reader saw stale lines");
        });
        NtWriter::with(region.as_mut_slice(), |w| {
            for (i, chunk) in want.chunks(64).enumerate() {
                w.write_at(i * 64, chunk).unwrap();
            }
        });
        ready.store(true, Ordering::Release);
    });
}

#[test]
fn template_updates_reach_every_record() {
    for record in [16usize, 48, 64, 128, 4096 + 16] {
        let n = 1000;
        let mut nt = Region::new(record * n, PAGE).unwrap();
        let mut cached = Region::new(record * n, PAGE).unwrap();
        let base = pattern(record, record as u64);
        let update = |i: usize, t: &mut [u8]| {
            t[..8].copy_from_slice(&(i as u64).to_le_bytes());
            t[record - 1] = i as u8;
        };
        let len = record * n;
        let mut t = base.clone();
        fill_from_template(&mut nt.as_mut_slice()[..len], &mut t, update).unwrap();
        let mut t = base.clone();
        fill_from_template_cached(&mut cached.as_mut_slice()[..len], &mut t, update).unwrap();
        for (i, rec) in nt.as_slice()[..len].chunks_exact(record).enumerate() {
            assert_eq!(rec[..8], (i as u64).to_le_bytes(), "record {i} of {record}");
            assert_eq!(rec[record - 1], i as u8);
            assert_eq!(rec[8..record - 1], base[8..record - 1]);
        }
        assert!(nt.as_slice() == cached.as_slice(), "record size {record}");
    }
}

#[test]
fn template_carries_over_between_records_and_ends_as_the_last_record() {
    // The byte form hands `update` the same template every time (records up
    // to 256 B through a register copy, bigger ones in place): changes
    // persist into later records, and the template ends as the last record.
    for record in (16..=272).step_by(16).chain([4096]) {
        let n = 37;
        let mut nt = Region::new(record * n, PAGE).unwrap();
        let mut cached = Region::new(record * n, PAGE).unwrap();
        let update = |i: usize, t: &mut [u8]| {
            let r = t.len();
            t[i % r] = t[i % r].wrapping_add(i as u8 | 1); // persists
            t[r - 1] = i as u8;
        };
        let (mut a, mut b) = (pattern(record, 3), pattern(record, 3));
        let len = record * n;
        fill_from_template(&mut nt.as_mut_slice()[..len], &mut a, update).unwrap();
        fill_from_template_cached(&mut cached.as_mut_slice()[..len], &mut b, update).unwrap();
        assert!(nt.as_slice() == cached.as_slice(), "record size {record}");
        assert_eq!(a, b, "record size {record}: template afterwards");
        assert_eq!(a[..], nt.as_slice()[len - record..len]);
    }
}

/// Bytes of a `Record` (every byte initialised by the trait's contract).
fn bytes_of<T: Record>(r: &mut T) -> &mut [u8] {
    // SAFETY: `T: Record` has no uninitialised bytes; the slice borrows `r`.
    unsafe { std::slice::from_raw_parts_mut((r as *mut T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// The per-record update the typed tests use: first, middle and last byte
/// depend on the index.
fn touch<T: Record>(i: usize, r: &mut T) {
    let b = bytes_of(r);
    let last = b.len() - 1;
    b[0] ^= i as u8;
    b[last / 2] = (i >> 3) as u8;
    b[last] = (i as u8).wrapping_mul(7);
}

/// Fills `n` records of `T` placed at every `T`-aligned offset of a line
/// (and flush against a guard page) and checks each record is the template
/// plus its update, nothing outside the array written, and the cached twin
/// agrees.
fn check_records<T: Record + PartialEq + std::fmt::Debug>(what: &str) {
    let size = std::mem::size_of::<T>();
    let align = std::mem::align_of::<T>();
    let mut tbytes = pattern(size, size as u64);
    // SAFETY: `tbytes` holds size_of::<T>() bytes and every `T` tested here
    // is an integer array, valid for any bytes.
    let template: T = unsafe { tbytes.as_mut_ptr().cast::<T>().read_unaligned() };
    for n in [0usize, 1, 2, 3, 5, 64, 517] {
        let places = (0..64).step_by(align).map(Place::Start).chain([Place::End]);
        for place in places {
            let mut g = Guarded::new(n * size, place);
            let buf = g.buf();
            // SAFETY: the buffer is n * size bytes at a `T`-aligned address
            // (offsets step by the alignment; End leaves a multiple of size
            // before a page boundary); integers accept any bytes.
            let arr = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<T>(), n) };
            fill_records(arr, template, touch);
            let mut reference = arr.to_vec();
            fill_records_cached(&mut reference, template, touch);
            for (i, got) in arr.iter().enumerate() {
                let mut want = template;
                touch(i, &mut want);
                assert_eq!(*got, want, "{what}: record {i} of {n} at {place:?}");
            }
            assert_eq!(arr, &reference[..], "{what}: cached twin");
            g.assert_canaries(&format!("{what}: {n} records at {place:?}"));
        }
    }
}

#[test]
fn typed_records_of_every_shape_equal_template_plus_update() {
    check_records::<[u8; 16]>("[u8; 16]");
    check_records::<[u8; 17]>("[u8; 17]");
    check_records::<[u8; 24]>("[u8; 24]");
    check_records::<[u8; 33]>("[u8; 33]");
    check_records::<[u8; 48]>("[u8; 48]");
    check_records::<[u8; 63]>("[u8; 63]");
    check_records::<[u8; 64]>("[u8; 64]");
    check_records::<[u8; 100]>("[u8; 100]");
    check_records::<[u8; 129]>("[u8; 129]");
    check_records::<[u8; 256]>("[u8; 256]");
    check_records::<[u16; 9]>("[u16; 9]");
    check_records::<[u32; 5]>("[u32; 5]");
    check_records::<[u64; 2]>("[u64; 2]");
    check_records::<[u64; 3]>("[u64; 3]");
    check_records::<[u64; 8]>("[u64; 8]");
    check_records::<[u64; 20]>("[u64; 20]");
    check_records::<[u64; 32]>("[u64; 32]");
    check_records::<[u128; 3]>("[u128; 3]");
    check_records::<u64>("u64");
    check_records::<u8>("u8");
}

#[test]
fn typed_fill_of_zero_sized_records_runs_every_update() {
    let mut seen = Vec::new();
    #[derive(Clone, Copy)]
    struct Empty;
    // SAFETY: a zero-sized type has no bytes at all.
    unsafe impl Record for Empty {}
    let mut e = [Empty; 5];
    fill_records(&mut e, Empty, |i, _| seen.push(i));
    assert_eq!(seen, [0, 1, 2, 3, 4]);
}

#[test]
fn typed_fill_is_drained_for_a_thread_that_synchronises() {
    let n = (8 << 20) / 64;
    let mut region = Region::new(n * 64, PAGE).unwrap();
    let ready = AtomicBool::new(false);
    let ptr = region.as_mut_ptr() as usize;
    std::thread::scope(|s| {
        s.spawn(|| {
            while !ready.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            // SAFETY: the fill returned (drained) before the release; nothing
            // writes now; the region holds n records of [u64; 8].
            let seen = unsafe { std::slice::from_raw_parts(ptr as *const [u64; 8], n) };
            for (i, r) in seen.iter().enumerate() {
                assert_eq!(*r, [i as u64, 9, 9, 9, 9, 9, 9, !(i as u64)], "record {i}");
            }
        });
        // SAFETY: the region is page-aligned and n * 64 bytes; any bytes are
        // valid u64s.
        let arr =
            unsafe { std::slice::from_raw_parts_mut(region.as_mut_ptr().cast::<[u64; 8]>(), n) };
        fill_records(arr, [9u64; 8], |i, r| {
            r[0] = i as u64;
            r[7] = !(i as u64);
        });
        ready.store(true, Ordering::Release);
    });
}

#[test]
fn typed_fill_drains_when_update_unwinds() {
    let mut arr = vec![[0u64; 4]; 100];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fill_records(&mut arr, [3u64; 4], |i, r| {
            if i == 60 {
                panic!("update failed at record 60");
            }
            r[1] = i as u64;
        })
    }));
    assert!(r.is_err());
    for (i, rec) in arr.iter().enumerate() {
        let want = if i < 60 { [3, i as u64, 3, 3] } else { [0; 4] };
        assert_eq!(*rec, want, "record {i}");
    }
}

#[test]
fn template_bad_input_writes_nothing() {
    let mut r = Region::new(PAGE, PAGE).unwrap();
    r.as_mut_slice().fill(0xEE);
    let untouched = |r: &Region| r.as_slice().iter().all(|&b| b == 0xEE);
    for size in [0usize, 8, 24, 65] {
        let mut t = vec![1u8; size];
        let e = fill_from_template(r.as_mut_slice(), &mut t, |_, _| {}).unwrap_err();
        assert!(
            matches!(e, NtError::MisalignedTemplate { .. }),
            "{size}: {e}"
        );
    }
    let mut t = vec![1u8; 64];
    let e = fill_from_template(&mut r.as_mut_slice()[8..8 + 128], &mut t, |_, _| {}).unwrap_err();
    assert!(matches!(e, NtError::MisalignedTemplate { .. }), "{e}");
    let e = fill_from_template(&mut r.as_mut_slice()[..100], &mut t, |_, _| {}).unwrap_err();
    assert_eq!(
        e,
        NtError::NotRecordMultiple {
            len: 100,
            record: 64
        }
    );
    assert!(untouched(&r));
}

#[test]
fn populate_makes_every_page_resident_and_keeps_contents() {
    for channels in [1, 2, 3] {
        let len = 16 << 20;
        let mut r = Region::unpopulated(len + 3 * PAGE, PAGE).unwrap();
        assert_eq!(resident_pages(r.as_ptr(), r.len()).unwrap(), 0);
        let rep = populate(r.as_mut_slice(), channels).unwrap();
        assert_eq!(resident_pages(r.as_ptr(), r.len()).unwrap(), r.len() / PAGE);
        assert_eq!(rep.bytes, r.len());
        // 2 MiB-aligned chunks: 8 whole and a partial one if the mapping
        // starts on a boundary, partial ones at both ends if not (where
        // mmap puts it depends on what else the process has mapped).
        let chunk = 2 << 20;
        let start = r.as_ptr() as usize;
        let blocks = (start + r.len()).div_ceil(chunk) - start / chunk;
        assert_eq!(rep.chunks, blocks, "one chunk per 2 MiB block touched");
        assert!((9..=10).contains(&blocks));
        assert!((1..=channels).contains(&rep.channels), "{rep:?}");
    }
    let mut r = Region::new(4 << 20, PAGE).unwrap();
    let p = pattern(r.len(), 8);
    r.as_mut_slice().copy_from_slice(&p);
    populate(r.as_mut_slice(), 2).unwrap();
    assert!(r.as_slice() == &p[..]);
}

/// Populate's threads are persistent helpers: once started, calls with up
/// to that many channels make no thread. Checked under a seccomp filter
/// that refuses every new thread: a thread per call would fail the call.
#[cfg(target_arch = "x86_64")]
#[test]
fn populate_makes_no_thread_once_helpers_are_started() {
    let name = "populate_makes_no_thread_once_helpers_are_started";
    in_child(name, Duration::from_secs(60), || {
        foliokit::channels::start_shared(3).unwrap();
        common::refuse_new_threads();
        for channels in [1, 2, 3, 3] {
            let mut r = Region::unpopulated(16 << 20, PAGE).unwrap();
            let rep = populate(r.as_mut_slice(), channels).unwrap();
            assert_eq!(resident_pages(r.as_ptr(), r.len()).unwrap(), r.len() / PAGE);
            assert!((1..=channels).contains(&rep.channels), "{rep:?}");
        }
    });
}

/// A child forked while another thread is mid-populate (helpers busy, the
/// registry's lock or the queue's possibly held) does not use its parent's
/// helpers, which it does not have: it starts its own and finishes.
#[test]
fn populate_in_a_child_forked_mid_populate_has_helpers_of_its_own() {
    let name = "populate_in_a_child_forked_mid_populate_has_helpers_of_its_own";
    in_child(name, Duration::from_secs(60), || {
        let fault_in = |channels: usize| {
            let mut r = Region::unpopulated(16 << 20, PAGE).unwrap();
            populate(r.as_mut_slice(), channels).unwrap();
            assert_eq!(resident_pages(r.as_ptr(), r.len()).unwrap(), r.len() / PAGE);
        };
        fault_in(3);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let _stop = StopOnDrop(&stop);
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    fault_in(3);
                }
            });
            for _ in 0..5 {
                in_forked_child(|| {
                    let Ok(mut r) = Region::unpopulated(8 << 20, PAGE) else {
                        return false;
                    };
                    // The forking thread is the child's only one: after a
                    // populate with 3 channels, its 2 helpers exist too.
                    populate(r.as_mut_slice(), 3).is_ok_and(|rep| {
                        (1..=3).contains(&rep.channels)
                            && resident_pages(r.as_ptr(), r.len()).ok() == Some(r.len() / PAGE)
                    }) && thread_count() == 3
                });
            }
        });
    });
}

/// Sets the flag when dropped, also by a panic: a thread looping on it
/// then ends, and the scope that waits for it can unwind.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn populate_keeps_thp_ranges_thp() {
    let thp = system::thp_state();
    let Some(pmd) = thp.pmd_size.filter(|&p| thp.madvise_allows(p)) else {
        common::missing(common::Need::Thp, "THP via madvise is not enabled here");
        return;
    };
    let mut r = Region::unpopulated(8 * pmd, pmd).unwrap();
    populate(r.as_mut_slice(), 2).unwrap();
    r.observe_backing();
    assert_eq!(r.backing().obtained, format!("THP {}M", pmd >> 20));
}

#[test]
fn populate_bad_input() {
    let mut r = Region::new(2 * PAGE, PAGE).unwrap();
    assert!(matches!(
        populate(r.as_mut_slice(), 0),
        Err(PopulateError::ZeroChannels)
    ));
    // SAFETY: rejected before any access.
    let e = unsafe { populate_raw(r.as_mut_ptr().add(1), PAGE, 1) }.unwrap_err();
    assert!(matches!(e, PopulateError::Misaligned(_)));
    // SAFETY: as above.
    let e =
        unsafe { populate_raw((usize::MAX & !(PAGE - 1)) as *mut u8, 2 * PAGE, 1) }.unwrap_err();
    assert!(matches!(e, PopulateError::Wraps { .. }));
    // An unmapped range is a typed error too, not a crash. In a process of
    // its own: beside other tests' threads, one of their mappings could
    // take the hole between the unmap and the call.
    in_child("populate_bad_input", Duration::from_secs(60), || {
        let mut r = Region::new(2 * PAGE, PAGE).unwrap();
        let hole = r.as_mut_ptr();
        drop(r);
        // SAFETY: the range is unmapped now; populate must report, not
        // fault.
        let e = unsafe { populate_raw(hole, 2 * PAGE, 1) }.unwrap_err();
        assert!(matches!(e, PopulateError::Fault { .. }), "{e}");
        // So is memory that is not writable: refused, never touched (a
        // touch would raise SIGSEGV).
        for prot in [libc::PROT_NONE, libc::PROT_READ] {
            let g = Region::new(2 * PAGE, PAGE).unwrap();
            // SAFETY: our own mapping, made unwritable for the check.
            let rc = unsafe { libc::mprotect(g.as_ptr() as *mut _, PAGE, prot) };
            assert_eq!(rc, 0);
            // SAFETY: mapped; populate must report, not fault.
            let e = unsafe { populate_raw(g.as_ptr() as *mut u8, 2 * PAGE, 1) }.unwrap_err();
            assert!(matches!(e, PopulateError::Fault { .. }), "{e}");
        }
    });
}

/// Empty inputs are no work, not errors: an empty array's dangling pointer
/// has no alignment to check, an empty range holds no resident page, and
/// a zero folio size lists no folio.
#[test]
fn empty_inputs_are_no_work() {
    let mut none: Vec<u8> = Vec::new();
    let mut t = [0u8; 16];
    assert_eq!(
        foliokit::nt::fill_from_template(&mut none, &mut t, |_, _| {}),
        Ok(())
    );
    assert_eq!(
        foliokit::nt::fill_from_template_cached(&mut none, &mut t, |_, _| {}),
        Ok(())
    );
    let r = foliokit::mem::Region::new(2 * 4096, 4096).unwrap();
    // SAFETY: a pointer inside our region; no byte is read.
    let p = unsafe { r.as_ptr().add(1) };
    assert_eq!(foliokit::mem::resident_pages(p, 0).unwrap(), 0);
    let starts = foliokit::batch::folio_starts(r.as_ptr().cast_mut(), 1 << 20, 0);
    assert!(starts.is_empty());
}

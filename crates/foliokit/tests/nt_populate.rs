//! Streaming stores (memcpy_nt, NtWriter, template fills) and parallel
//! populate: contents, drain-before-publish, residency, bad input.

mod common;

use common::{pattern, sweep_copy};
use foliokit::mem::{populate, populate_raw, resident_pages, system, PopulateError, Region};
use foliokit::nt::{fill_from_template, fill_from_template_cached, memcpy_nt, NtError, NtWriter};
use std::sync::atomic::{AtomicBool, Ordering};

const PAGE: usize = 4096;

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
fn writer_bounds_finish_and_drop() {
    let mut buf = vec![0u8; 1024];
    {
        let mut w = NtWriter::new(&mut buf);
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
        // Dropped here without finish: the drop drains.
    }
    assert!(buf[..512].iter().all(|&b| b == 0) && buf[512..].iter().all(|&b| b == 3));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut w = NtWriter::new(&mut buf);
        w.write_at(0, &[5u8; 64]).unwrap();
        panic!("unwinding through a writer");
    }));
    assert!(r.is_err());
    assert!(buf[..64].iter().all(|&b| b == 5));
}

#[test]
fn drained_data_is_visible_to_a_thread_that_synchronises() {
    // The publication pattern the writer exists for: stream, finish (drain),
    // then release; the acquirer must see every byte.
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
        let mut w = NtWriter::new(region.as_mut_slice());
        for (i, chunk) in want.chunks(64).enumerate() {
            w.write_at(i * 64, chunk).unwrap();
        }
        w.finish();
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
        assert_eq!(rep.chunks, 9, "8 aligned chunks and a partial one");
        assert!(rep.channels <= channels);
    }
    let mut r = Region::new(4 << 20, PAGE).unwrap();
    let p = pattern(r.len(), 8);
    r.as_mut_slice().copy_from_slice(&p);
    populate(r.as_mut_slice(), 2).unwrap();
    assert!(r.as_slice() == &p[..]);
}

#[test]
fn populate_keeps_thp_ranges_thp() {
    let thp = system::thp_state();
    let Some(pmd) = thp.pmd_size.filter(|&p| thp.madvise_allows(p)) else {
        common::skip("THP via madvise is not enabled here");
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
    // An unmapped range is a typed error too, not a crash.
    let hole = r.as_mut_ptr();
    drop(r);
    // SAFETY: the range is unmapped now; populate must report, not fault.
    let e = unsafe { populate_raw(hole, 2 * PAGE, 1) }.unwrap_err();
    assert!(matches!(e, PopulateError::Fault { .. }), "{e}");
}

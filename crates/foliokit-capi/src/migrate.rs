//! `fk_migrate`: a range of this process to a NUMA node, by the kernel's
//! path or by relocation.

use std::ffi::{c_int, c_uint, c_void};
use std::time::Duration;

use fk::migrate::{MigrateError, MigrateOptions, Path};

use crate::error::{guard, os_code, strategy_err, INTERNAL};
use crate::ext::{extensible, out_size, read_ext, write_ext};

/// `enum fk_path` values.
pub(crate) const FK_PATH_KERNEL: c_int = 0;
pub(crate) const FK_PATH_AUTO: c_int = 1;
pub(crate) const FK_PATH_RELOCATE: c_int = 2;

extensible! {
    /// Mirrors `struct fk_migrate_opts`.
    pub struct FkMigrateOpts {
        /// `enum fk_path`, read as an int: C may pass any value.
        pub path: c_int,
        pub channels: c_uint,
        pub batch_pages: usize,
        pub latency_budget_us: u64,
    }
}

extensible! {
    /// Mirrors `struct fk_migrate_result`.
    pub struct FkMigrateResult {
        pub gbps: f64,
        pub first_folio_us: f64,
        pub pages_to_move: usize,
        pub relocated: c_int,
        pub batches: c_uint,
    }
}

fn migrate_options(c: Option<FkMigrateOpts>) -> Result<MigrateOptions, c_int> {
    let mut o = MigrateOptions::default();
    let Some(c) = c else { return Ok(o) };
    o.path = match c.path {
        FK_PATH_KERNEL => Path::Kernel,
        FK_PATH_AUTO => Path::Auto,
        FK_PATH_RELOCATE => Path::Relocate,
        _ => return Err(-libc::EINVAL),
    };
    if c.batch_pages > 0 {
        o.batch_pages = c.batch_pages;
    }
    if c.channels > 0 {
        o.channels = c.channels as usize;
    }
    if c.latency_budget_us > 0 {
        o.latency_budget = Some(Duration::from_micros(c.latency_budget_us));
    }
    Ok(o)
}

fn migrate_err(e: MigrateError) -> c_int {
    match e {
        MigrateError::Misaligned { .. }
        | MigrateError::Empty
        | MigrateError::Wraps { .. }
        | MigrateError::ZeroBatch
        | MigrateError::TooManyChannels { .. } => -libc::EINVAL,
        MigrateError::Unmapped { .. } => -libc::EFAULT,
        MigrateError::NoSuchNode { .. } => -libc::ENODEV,
        MigrateError::Refused { .. } => -libc::EPERM,
        MigrateError::Sys { source, .. } => os_code(&source, libc::EIO),
        MigrateError::Strategy(s) => strategy_err(&s),
        MigrateError::Channel(fk::channels::ChannelError::TooMany { .. }) => -libc::EINVAL,
        _ => INTERNAL,
    }
}

/// # Safety
/// See `fk_migrate` in foliokit.h.
#[no_mangle]
pub unsafe extern "C" fn fk_migrate(
    addr: *mut c_void,
    len: usize,
    node: c_uint,
    opts: *const FkMigrateOpts,
    out: *mut FkMigrateResult,
) -> c_int {
    guard(|| {
        // SAFETY: opts is NULL or a valid struct of its `size` (contract).
        let o = migrate_options(unsafe { read_ext(opts) }?)?;
        // SAFETY: out is NULL or a valid struct of its `size` (contract).
        let n = unsafe { out_size(out) }?;
        // SAFETY: the caller's contract (see the header).
        let r = unsafe { fk::migrate::migrate(addr.cast(), len, node, &o) }.map_err(migrate_err)?;
        let result = FkMigrateResult {
            size: n,
            gbps: r.gbps(),
            first_folio_us: r.first_folio_us().unwrap_or(0.0),
            pages_to_move: r.pages_to_move,
            relocated: c_int::from(r.path == fk::migrate::MigratePath::Relocate),
            batches: c_uint::try_from(r.batches.len()).unwrap_or(c_uint::MAX),
        };
        // SAFETY: out is NULL or has `n` writable bytes (checked by out_size).
        unsafe { write_ext(out, result, n) };
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::msg;
    use fk::mem::Region;
    use std::mem::size_of;

    #[test]
    fn migrate_checks_its_structs_before_moving_anything() {
        let mut m = Region::new(1 << 21, 4096).expect("region");
        m.as_mut_slice().fill(0x5a);
        let (p, len) = (m.as_mut_ptr(), m.len());
        let opts = |path| FkMigrateOpts {
            size: size_of::<FkMigrateOpts>(),
            path,
            ..Default::default()
        };
        let mut out = FkMigrateResult {
            size: size_of::<FkMigrateResult>(),
            ..Default::default()
        };
        // SAFETY: for all calls, valid memory (m, 2 MiB of ours) and structs.
        unsafe {
            assert_eq!(
                fk_migrate(p.cast(), len, 0, &opts(7), &mut out),
                -libc::EINVAL
            );
            assert_eq!(
                fk_migrate(p.cast(), len, 0, &opts(-1), &mut out),
                -libc::EINVAL
            );
            let mut small = FkMigrateResult { size: 8, ..out };
            let rc = fk_migrate(p.cast(), len, 0, &opts(FK_PATH_KERNEL), &mut small);
            assert_eq!(rc, -libc::EINVAL);
            assert_eq!(small.size, 8, "nothing written on error");
            // Node 0 always exists: the kernel path succeeds and fills `out`.
            let rc = fk_migrate(p.cast(), len, 0, &opts(FK_PATH_KERNEL), &mut out);
            assert_eq!(rc, 0, "{}", msg(rc));
            assert_eq!(out.size, size_of::<FkMigrateResult>());
            assert_eq!(out.relocated, 0);
            assert!(out.batches >= 1);
            assert_eq!(
                fk_migrate(p.cast(), len, 0, std::ptr::null(), std::ptr::null_mut()),
                0
            );
        }
        assert!(m.as_slice().iter().all(|&x| x == 0x5a));
    }
}

// The extensible-struct rules, shown on the migrate structs (here, so
// ext.rs needs nothing of the areas that use it).
#[cfg(test)]
mod ext_rules {
    use super::{FkMigrateOpts, FkMigrateResult, FK_PATH_AUTO};
    use crate::ext::*;
    use std::mem::offset_of;

    /// An aligned buffer standing in for a caller's struct of any size.
    #[repr(C, align(8))]
    struct Buf([u8; 64]);

    impl Buf {
        fn new(fill: u8, size: usize) -> Buf {
            let mut b = Buf([fill; 64]);
            b.0[..size_of::<usize>()].copy_from_slice(&size.to_ne_bytes());
            b
        }
        fn opts(&self) -> *const FkMigrateOpts {
            self.0.as_ptr().cast()
        }
    }

    #[test]
    fn extensible_input_struct_rules() {
        let ours = size_of::<FkMigrateOpts>();
        // SAFETY: for all calls below, each pointer is NULL or a 64-byte,
        // 8-aligned buffer, and every size used is at most 64 or refused
        // before reading.
        unsafe {
            assert_eq!(read_ext::<FkMigrateOpts>(std::ptr::null()), Ok(None));
            // Too small for the first version.
            let b = Buf::new(0, ours - 1);
            assert_eq!(read_ext(b.opts()), Err(-libc::EINVAL));
            // Exactly ours: every field read.
            let want = FkMigrateOpts {
                size: ours,
                path: FK_PATH_AUTO,
                channels: 3,
                batch_pages: 64,
                latency_budget_us: 1000,
            };
            let mut b = Buf::new(0xaa, 0);
            std::ptr::copy_nonoverlapping((&raw const want).cast::<u8>(), b.0.as_mut_ptr(), ours);
            assert_eq!(read_ext(b.opts()), Ok(Some(want)));
            // A newer caller: larger size, unknown bytes zero -> accepted.
            let mut b2 = Buf::new(0, 0);
            b2.0[..ours].copy_from_slice(&b.0[..ours]);
            b2.0[..size_of::<usize>()].copy_from_slice(&64usize.to_ne_bytes());
            let got = read_ext(b2.opts()).unwrap().unwrap();
            assert_eq!(
                (got.path, got.channels, got.batch_pages),
                (FK_PATH_AUTO, 3, 64)
            );
            // ... an unknown byte set -> E2BIG, wherever it is.
            for i in [ours, 40, 63] {
                let mut b3 = Buf::new(0, 64);
                b3.0[i] = 1;
                assert_eq!(read_ext(b3.opts()), Err(-libc::E2BIG), "byte {i}");
            }
            // Garbage sizes are refused without being read.
            let b = Buf::new(0, STRUCT_SIZE_MAX + 1);
            assert_eq!(read_ext(b.opts()), Err(-libc::E2BIG));
        }
    }

    #[test]
    fn extensible_output_struct_rules() {
        let ours = size_of::<FkMigrateResult>();
        let v = FkMigrateResult {
            size: 0,
            gbps: 1.5,
            first_folio_us: 2.5,
            pages_to_move: 7,
            relocated: 1,
            batches: 9,
        };
        // SAFETY: for all calls below, 64-byte, 8-aligned buffers, sizes <= 64.
        unsafe {
            let mut b = Buf::new(0xaa, ours - 1);
            assert_eq!(
                out_size(b.0.as_mut_ptr().cast::<FkMigrateResult>()),
                Err(-libc::EINVAL)
            );
            // A newer caller's larger struct: ours filled, the rest untouched.
            let mut b = Buf::new(0xaa, 64);
            let p = b.0.as_mut_ptr().cast::<FkMigrateResult>();
            let n = out_size(p).unwrap();
            assert_eq!(n, ours);
            write_ext(p, v, n);
            assert_eq!(p.read(), FkMigrateResult { size: ours, ..v });
            assert!(b.0[ours..].iter().all(|&x| x == 0xaa));
            // An older caller (fewer fields): only what fits is written.
            let mut b = Buf::new(0xaa, 64);
            let p = b.0.as_mut_ptr().cast::<FkMigrateResult>();
            write_ext(p, v, offset_of!(FkMigrateResult, pages_to_move));
            assert_eq!((*p).gbps, 1.5);
            assert_eq!((*p).size, offset_of!(FkMigrateResult, pages_to_move));
            assert!(b.0[offset_of!(FkMigrateResult, pages_to_move)..]
                .iter()
                .all(|&x| x == 0xaa));
        }
    }
}

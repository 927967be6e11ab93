//! Moving guest RAM between NUMA nodes.

use foliokit::migrate::{MigrateOptions, MigrateReport, Path};
use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::{pieces, Error, Result};

/// What migrating one per-region piece of a guest range did.
#[derive(Debug, Clone)]
pub struct GuestMigration {
    /// Guest address of the piece.
    pub addr: GuestAddress,
    /// Its length in bytes.
    pub len: u64,
    /// foliokit's report for it (pages to move, pages that failed, batch
    /// latencies, notes).
    pub report: MigrateReport,
}

/// Moves the pages of the guest range `[addr, addr + len)` to NUMA node
/// `node` with the kernel's `move_pages(2)` ([`Path::Kernel`]), which is
/// safe for every kind of memory and while vCPUs run. `opts` sets the batch
/// size and thread count; its `path` must be [`Path::Kernel`] (the default)
/// or this returns [`Error::RelocationNeedsUnsafe`].
///
/// The range must be page-aligned (guest regions start on host pages, so
/// page-aligned guest addresses are) and may span regions: each piece is
/// migrated in turn and reported. Pages the kernel could not move are in
/// each report's `failed` list; they are not an error.
pub fn migrate_range<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    addr: GuestAddress,
    len: u64,
    node: u32,
    opts: &MigrateOptions,
) -> Result<Vec<GuestMigration>> {
    if opts.path != Path::Kernel {
        return Err(Error::RelocationNeedsUnsafe);
    }
    // SAFETY: the kernel path needs only that the range be memory of this
    // process, which the borrowed guest regions are.
    unsafe { migrate_range_with(mem, addr, len, node, opts) }
}

/// [`migrate_range`] with any [`Path`], including foliokit's opt-in
/// relocation (userfaultfd + copy channels + `UFFDIO_MOVE`), which either
/// keeps the mapping exactly as it was or refuses with a typed error before
/// touching anything.
///
/// # Safety
/// The contract of [`foliokit::migrate::migrate`] applies to every piece.
/// For guest RAM that means, with [`Path::Relocate`] or [`Path::Auto`]:
/// no part of the range may be spliced into a pipe (`vmsplice(2)`) or held
/// by a driver through plain `get_user_pages` (without `FOLL_PIN`), since
/// such a holder would keep reading the old page; and no thread may use
/// priority-inheritance futexes in it, nor a debugger or another process
/// read it through `ptrace`/`/proc/<pid>/mem`, while the call runs. Guest
/// memory shared with another process (vhost-user, a `MAP_SHARED` memory
/// file) is refused by relocation, and pages pinned for DMA (VFIO) are left
/// in place and handed to `move_pages`. With [`Path::Kernel`] there is no
/// further requirement.
pub unsafe fn migrate_range_with<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    addr: GuestAddress,
    len: u64,
    node: u32,
    opts: &MigrateOptions,
) -> Result<Vec<GuestMigration>> {
    let mut out = Vec::new();
    for p in pieces(mem, addr, len)? {
        // SAFETY: the piece is inside a live guest region of this process
        // (borrowed through `mem`); the path-specific contract is the
        // caller's.
        let report =
            unsafe { foliokit::migrate::migrate(p.host, p.len, node, opts) }.map_err(|source| {
                Error::Migrate {
                    addr: p.addr,
                    len: p.len as u64,
                    source,
                }
            })?;
        out.push(GuestMigration {
            addr: p.addr,
            len: p.len as u64,
            report,
        });
    }
    Ok(out)
}

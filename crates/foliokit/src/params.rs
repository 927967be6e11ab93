//! Every tuning number foliokit uses, in one place, importing nothing:
//! the mechanism modules (channels, helpers, relocation, the lazy fill)
//! read their numbers here, and so does the policy in [`crate::tune`],
//! which re-exports the ones adopters set or report.

use std::sync::atomic::AtomicBool;

/// L1 data cache size in bytes assumed when sysfs does not tell (VMs can
/// report 0): a typical 32 KiB.
pub const DEFAULT_L1D: usize = 32 << 10;
/// L2 size in bytes assumed when sysfs does not tell.
pub const DEFAULT_L2: usize = 1 << 20;
/// Last-level cache size in bytes assumed when sysfs does not tell; it sets
/// where `auto` switches to streaming stores, and calibration corrects it.
pub const DEFAULT_LLC: usize = 8 << 20;

/// A working set above `STREAM_NUM/STREAM_DEN` of the LLC will not survive
/// in cache, so temporal stores only add write-allocate traffic (glibc uses
/// 3/4 of the shared cache for the same decision).
pub const STREAM_NUM: usize = 3;
/// Denominator of the LLC fraction; see [`STREAM_NUM`].
pub const STREAM_DEN: usize = 4;

/// Write-once requests smaller than this use temporal stores anyway: the
/// fence costs more than the pollution saved.
pub const STREAM_MIN_BYTES: usize = 4096;

/// Folio-size class bounds used by the profile: small ≤ 16 KiB < medium ≤
/// 1 MiB < large.
pub const SMALL_FOLIO_MAX: usize = 16 << 10;
/// Upper bound (inclusive, bytes) of the medium folio class; see
/// [`SMALL_FOLIO_MAX`].
pub const MEDIUM_FOLIO_MAX: usize = 1 << 20;

/// `populate` faults memory in chunks of this size, aligned to it, so each
/// chunk is one PMD and THP stays THP.
pub const POPULATE_CHUNK: usize = 2 << 20;

/// Copy channels take a batch in pieces of about this many bytes (adjacent
/// folios merged up to it; a bigger folio stays whole). Each channel starts
/// on its own contiguous share, then takes the pieces others have not
/// started: a channel whose CPU is busy with something else then holds up
/// the batch by at most one piece, instead of by its whole share.
pub const CHANNEL_PIECE_BYTES: usize = 4 << 20;

/// The pieces of a batch that can be cut short
/// (`Policy::cut_when`) are merged up to this many
/// bytes only: a cut waits for the piece each channel is running, so this
/// bounds it (one 2 MiB folio, 0.2–0.4 ms per channel into fresh memory on
/// the dev machine) while small folios still go in pieces worth a wake-up.
pub const CHANNEL_CUT_PIECE_BYTES: usize = 2 << 20;

/// A blocking batch on a pool of CPU channels smaller than this runs on the
/// calling thread: waking the workers costs more than they save. Measured
/// on a 2-vCPU AMD EPYC guest, 4 KiB folios, 2 channels over 1: 0.29x
/// (hot) and 0.60x (evicted) at 256 KiB, 0.88-1.05x at 1 MiB, 1.06-1.13x
/// at 4 MiB. Kept below one 2 MiB folio, whose copy split over channels
/// still halves its latency.
pub const CHANNEL_MIN_BATCH_BYTES: usize = 1 << 20;

/// Most copy channels a pool may have (each is a thread): far more than
/// any machine's memory channels or cores can use, and low enough that a
/// huge `channels` argument is refused instead of spawning threads until
/// the process runs out of memory.
pub const MAX_CHANNELS: usize = 1024;

/// Most helper threads ([`crate::mem::populate`], the kernel migration
/// path) a process keeps: more channels than this are served by these.
/// Their work is syscalls that fault or move pages, which scale to a
/// socket's cores at most; the cap keeps a huge `channels` argument from
/// making a thread per unit of it.
pub const MAX_HELPERS: usize = 64;

/// Bytes either side of a thread's pointer that relocation treats as its
/// descriptor and leaves in place (migrate/threads.rs): glibc's `struct
/// pthread` (2304 bytes on x86_64 in 2.35-2.41) with the `tid` word the
/// kernel clears at exit and the robust list head, with room to spare.
/// The rseq area is added exactly from `__rseq_offset`/`__rseq_size`.
pub const THREAD_DESCRIPTOR_SPAN: usize = 4096;

/// The most task ids allocated in the pid namespace while one relocation
/// batch is out that relocation checks one by one for a thread that lived
/// only while the batch was out (migrate/threads.rs, `Births`); beyond it
/// it searches the parked pages for thread descriptors instead. Each
/// costs a /proc lookup; a quiet machine allocates none per batch.
pub const PID_WINDOW_MAX: u32 = 256;

/// How many times relocation reads the state of a thread that is on a
/// CPU (yielding in between) before it gives up telling whether that
/// thread is creating another (migrate/threads.rs, `Births`).
pub const THREAD_STATE_TRIES: usize = 20;

/// How long relocation keeps asking for the robust list head of a thread
/// that has none (a glibc thread sets it in its first instructions, once
/// first scheduled; an exiting one drops it just before it goes) before
/// treating the thread as one it cannot place. 1000 polls without sleeping
/// were seen to fall short on a busy 2-vCPU machine.
pub const THREAD_HEAD_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Set to make per-page loops yield at their yield points (the analogue of
/// the kernel's need_resched flag). Nothing in foliokit sets it.
pub static YIELD_REQUESTED: AtomicBool = AtomicBool::new(false);

/// Default per-call latency budget when moving another process's pages
/// (`migrate::process`): the target's threads wait on pages under
/// migration and on its mmap lock while a `move_pages` call runs, so calls
/// are kept short; katalyst-core chunks its calls to about 20 ms after
/// stalls of minutes.
pub const PROCESS_MOVE_BUDGET: std::time::Duration = std::time::Duration::from_millis(10);

/// Pages in the first `move_pages` call of such a move; the budget grows or
/// shrinks it from there.
pub const PROCESS_MOVE_START_PAGES: usize = 512;

/// Pages the kernel path queries and moves per chunk of a range: its
/// lists take about 20 bytes a page (5 MiB here), where those of a whole
/// reservation of terabytes would not fit in memory.
pub const MIGRATE_CHUNK_PAGES: usize = 1 << 18;

/// How often a caller waiting for a helper to take its offer checks that
/// some helper can still take it (one another caller was starting may have
/// failed to start): the offer is then withdrawn instead of waited on.
pub const HELPER_OFFER_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// How long relocation's loop, waiting for its channel copies
/// (`Policy::run_unstarted_after`), lets the channels go without finishing
/// a piece before it runs the pieces none has started itself: a channel's
/// worker may be held up by another batch whose copy waits for a page
/// relocation has out.
pub const CHANNEL_STALL: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a fill through a userfaultfd (a lazy fill's, a forked
/// child's) waits before it tries an install again that the kernel was
/// short of memory for (ENOMEM), as a fault would wait.
pub const UFFD_ENOMEM_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// How long relocation waits before trying again to put a page back when
/// the kernel is short of memory for it (ENOMEM): it waits as a fault
/// would, however long that takes, since giving up would lose the page's
/// bytes.
pub const RELOCATE_ENOMEM_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// The default latency budget of a lazy fill: how long a faulting thread
/// may wait behind a background batch (its least run, then the folios in
/// progress of the batch it cut short, one per channel, and the moves of
/// what was copied). At the ~5–10 GB/s
/// one channel's mc copy into fresh memory reaches on the dev machine, a
/// 2 MiB folio takes 0.2–0.4 ms.
pub const LAZY_LATENCY_BUDGET: std::time::Duration = std::time::Duration::from_millis(2);

/// The share of the latency budget a fault may wait after the cut (or the
/// end) of a background batch: the folios in progress, the moves, and what
/// the fill thread copies itself. Its controller halves the batch when
/// that wait took longer, doubles it when it took under half. The rest of
/// the budget is the batch's least run
/// ([`LAZY_BATCH_LEAST_SHARE_OF_BUDGET`]); the faulting thread's own folio
/// is copied after both.
pub const LAZY_BATCH_SHARE_OF_BUDGET: f64 = 0.5;

/// The share of the latency budget a lazy fill's background batch runs
/// before a fault may cut it short: without it, faults coming one after
/// the other (a vCPU touching page after page) cut every batch before a
/// channel began it, and the background fill stopped. The rest of the
/// budget covers the folios in progress and the moves; the faulting
/// folio's own copy comes after. Against a vCPU that faults as soon as it
/// is woken, this share is the background's share of the time: on the dev
/// machine (2 vCPUs, `foliokit bench restore -s 4G`, the p99 of passes
/// the host did not slow) a quarter gave a
/// first-touch p99 of 1.3 ms and all-resident 1.46x the eager restore,
/// half gave 1.7–1.8 ms and 1.29x, 0.65 gave 2.1–2.3 ms and no faster
/// fill.
pub const LAZY_BATCH_LEAST_SHARE_OF_BUDGET: f64 = 0.5;

/// Copy channels of a lazy fill's background batches by default.
pub const LAZY_CHANNELS: usize = 2;

/// Bytes in a lazy fill's first background batch; the budget grows or
/// shrinks it from there.
pub const LAZY_START_BATCH_BYTES: usize = 4 << 20;

/// The largest background batch of a lazy fill: its staging area
/// (mapped once per fill) for folios moved in, and the bytes of blocks
/// copied in place one batch may take.
pub const LAZY_MAX_BATCH_BYTES: usize = 64 << 20;

/// The least block a lazy fill's background batch copies with
/// `UFFDIO_COPY` on several threads at once (hugetlb pages, shared-memory
/// folios): the kernel copies on the calling thread, so one thread fills
/// at a fraction of the memory's bandwidth; smaller blocks stay on the
/// fill thread, where waking a helper would cost more than the copy.
pub const LAZY_PARALLEL_COPY_LEAST_BYTES: usize = 256 << 10;

/// How long a lazy fill thread waits for a fault at a time while a
/// background batch is in flight, before it looks whether the batch ended:
/// a batch's end is seen at most this late.
pub const LAZY_BATCH_POLL: std::time::Duration = std::time::Duration::from_micros(50);

/// Messages a lazy fill thread has room for, at first, while parked for a
/// fork; the room grows (by mremap, never the allocator) as needed.
pub const LAZY_PARKED_MESSAGES: usize = 64;

/// How long a Firecracker page-fault handler waits, from the VMM's
/// connection, for its one message (Firecracker sends it as soon as it
/// has connected): a peer that connects and says nothing must not hold
/// the handler, and the socket it no longer listens on, forever.
#[cfg(feature = "serde")]
pub const HANDOFF_MESSAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The block a Firecracker page-fault handler installs around a fault in
/// 4 KiB guest memory, and the unit its background batches are cut
/// between. `UFFDIO_COPY` installs base pages there whatever the block,
/// so a larger one buys no huge page: with 2 MiB a touch waited behind
/// ~0.5 ms copies (touch p99 3.8 ms on a 2 ms budget, `foliokit bench
/// restore -s 1G`), with 256 KiB 1.5 ms, the fill 15% slower (225 ms
/// against 259 ms all in). Large
/// enough to be copied in place on several threads
/// ([`LAZY_PARALLEL_COPY_LEAST_BYTES`]).
#[cfg(feature = "serde")]
pub const HANDOFF_BLOCK: usize = 256 << 10;

/// Bump when the profile format or the meaning of its cells changes.
pub const PROFILE_VERSION: u32 = 1;

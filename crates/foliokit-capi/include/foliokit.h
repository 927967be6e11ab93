/*
 * foliokit.h - C API of foliokit: large-folio memory operations.
 *
 * Linking. `cargo xtask install-capi --prefix DIR` installs this header,
 * libfoliokit.so (with its versioned name and links), libfoliokit.a and
 * foliokit.pc; then
 *     cc prog.c $(PKG_CONFIG_PATH=DIR/lib/pkgconfig pkg-config --cflags --libs foliokit)
 * The static library also needs the libraries `pkg-config --static --libs
 * foliokit` lists (-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc).
 *
 * Return codes. Every function returns 0 (or a non-negative count) on
 * success and a negative errno value on failure; fk_strerror() names it.
 * No Rust panic ever crosses into C: an internal failure (a bug in
 * foliokit) is reported as -ENOTRECOVERABLE. Strategy names are those
 * `foliokit bench copy -f help` and `foliokit bench clear -f help` list;
 * NULL means "auto".
 *
 * Thread safety. Every function may be called from any thread, also
 * concurrently, as long as no two calls (or a call and another thread's
 * plain accesses) write the same bytes at once - the rule memcpy has.
 * fk_migrate is the exception: other threads may keep reading and writing
 * the range it migrates. The library's state (detected CPU features, the
 * tuning profile, the copy worker pool, the SIGBUS handler) is created by
 * fk_init, or else once, on first use, safely under concurrent first calls. fk_drain orders
 * the calling thread's streaming stores only. fk_populate and fk_migrate
 * with several channels run part of the work on foliokit's worker threads
 * and return after all of it is done. The relocation path of fk_migrate
 * registers pthread_atfork handlers once: a fork() in another thread waits
 * while a relocation batch is in flight. The SIGBUS handler (fk_copy_mc)
 * and those fork handlers point into the library, so do not dlclose() it
 * after using either.
 *
 * Extensible structs. A struct whose first field is `size_t size` may gain
 * fields in later versions without breaking old callers:
 *  - set `size` to sizeof(the struct) as your header declares it, and
 *    zero everything you do not set (use the FK_..._INIT initialisers or
 *    memset);
 *  - fields are only ever appended, and each version is larger than the
 *    one before (no field is added into trailing padding);
 *  - for a struct the library reads: fields past `size` (a caller built
 *    against an older header) take their zero default; if `size` is larger
 *    than the library knows (a caller built against a newer header run
 *    with an older library), the bytes it does not know must be zero, else
 *    the call fails with -E2BIG before doing anything;
 *  - for a struct the library fills: it writes only the fields that fit in
 *    `size` and sets `size` to the number of bytes it filled;
 *  - `size` smaller than the struct's first version is -EINVAL.
 */
#ifndef FOLIOKIT_H
#define FOLIOKIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header. The build checks that it matches the
 * library's crate version. */
#define FK_VERSION_MAJOR 0
#define FK_VERSION_MINOR 1
#define FK_VERSION_PATCH 0
/* One number: MAJOR * 1000000 + MINOR * 1000 + PATCH. */
#define FK_VERSION \
    (FK_VERSION_MAJOR * 1000000 + FK_VERSION_MINOR * 1000 + FK_VERSION_PATCH)

/* The version of the library loaded at run time, encoded as FK_VERSION.
 * Before 1.0 a program needs the same MAJOR and MINOR it was built with
 * (the SONAME, libfoliokit.so.0.MINOR, says so too); from 1.0 on the same
 * MAJOR and at least its MINOR. */
uint32_t fk_version(void);

/* Copies len bytes from src to dst as a batch of folio_size folios
 * (len a multiple of folio_size; dst, src and folio_size page-aligned;
 * len 0 does nothing, whatever the pointers).
 * write_once != 0 tells auto the data will not be re-read soon (streams).
 * Errors: -EINVAL bad sizes/alignment/overlap (a range that wraps the
 * address space or is over SSIZE_MAX bytes too), -EOPNOTSUPP strategy
 * this CPU lacks, -ENOENT unknown strategy name. */
int fk_copy_folios(void *dst, const void *src, size_t len, size_t folio_size,
                   const char *strategy, int write_once);

/* Zeroes len bytes at dst as a batch of folio_size folios. Errors as
 * fk_copy_folios. */
int fk_clear_folios(void *dst, size_t len, size_t folio_size,
                    const char *strategy, int write_once);

/* Machine-check-safe copy of len bytes (any alignment): survives a source
 * page that raises SIGBUS. strategy: "movsb", "avx2", "nt" or NULL (auto).
 * Returns 0, or, when a source page faulted, one of
 *   -EHWPOISON  the page has a hardware memory error (BUS_MCEERR_*),
 *   -EFAULT     the page vanished: a file truncated under the mapping
 *               (BUS_ADRERR),
 *   -EIO        another SIGBUS (e.g. BUS_OBJERR),
 * each with *not_copied set to the bytes not copied (counted from the end,
 * like the kernel's copy_mc_to_kernel) and *bad_page to the index of the
 * first bad page, counted from the page holding src. not_copied and
 * bad_page may be NULL. dst must not fault: if a dst page raises SIGBUS
 * anyway (a file truncated under it, no huge page left for it), -ENXIO,
 * with *bad_page counted from the page holding dst. Other errors:
 * -EINVAL (overlap), -ENOENT, -EOPNOTSUPP (no such strategy, no mc
 * routines on this CPU, or SIGBUS blocked on the calling thread, where the
 * kernel would kill the process at a fault).
 *
 * The SIGBUS handler. fk_init (or, without it, the first fk_copy_mc
 * call) installs a process-wide SIGBUS handler (SA_SIGINFO | SA_ONSTACK)
 * once. It recovers only faults whose instruction lies inside foliokit's
 * mc copy routines; every other SIGBUS goes to the handler that was
 * installed before it, or gets the default action (the process dies, as
 * without foliokit). So:
 *  - install a handler of your own BEFORE fk_init: it keeps working, and
 *    foliokit passes it every fault that is not its own;
 *  - a handler installed AFTER foliokit's would receive the copy's faults
 *    itself, so fk_copy_mc then refuses to run and returns -EBUSY (the
 *    check is one sigaction query per call; if the query itself is
 *    refused, e.g. by a seccomp filter, the copy runs as before);
 *  - SIGBUS must not be blocked in a thread that calls fk_copy_mc (the
 *    kernel kills a process whose blocked synchronous signal fires).
 * Other errors: -EBUSY (handler replaced, see above), -EOPNOTSUPP also
 * when fk_init was told FK_INIT_NO_SIGBUS_HANDLER. */
int fk_copy_mc(void *dst, const void *src, size_t len, const char *strategy,
               size_t *not_copied, size_t *bad_page);

/* Copies len bytes with streaming (non-temporal) stores and drains them
 * before returning. */
int fk_memcpy_nt(void *dst, const void *src, size_t len);

/* Orders every streaming store this thread issued (sfence). */
void fk_drain(void);

/* Faults [addr, addr + len) in for writing from `channels` threads, in
 * 2 MiB-aligned chunks (THP stays THP); contents are preserved.
 * Errors: -EINVAL (zero channels, misaligned, wrapping; or, from the
 * kernel, memory that is not writable), -EFAULT/-ENOMEM from the kernel. */
int fk_populate(void *addr, size_t len, unsigned channels);

/* fk_migrate paths. */
enum fk_path {
    FK_PATH_KERNEL = 0,   /* move_pages(2): safe for every kind of memory */
    FK_PATH_AUTO = 1,     /* relocation where it can be checked to be safe */
    FK_PATH_RELOCATE = 2, /* relocation or -EPERM; see fk_migrate */
};

/* Options of fk_migrate; extensible (see the top of this file). Zero in a
 * field means its default. */
struct fk_migrate_opts {
    size_t size;                /* sizeof(struct fk_migrate_opts) */
    enum fk_path path;          /* default FK_PATH_KERNEL */
    unsigned channels;          /* default 1 */
    size_t batch_pages;         /* default 512 */
    uint64_t latency_budget_us; /* default none */
};
#define FK_MIGRATE_OPTS_INIT { sizeof(struct fk_migrate_opts), FK_PATH_KERNEL, 0, 0, 0 }

/* What fk_migrate did; extensible (see the top of this file). */
struct fk_migrate_result {
    size_t size;           /* in: sizeof(struct fk_migrate_result);
                              out: bytes the library filled */
    double gbps;           /* bytes per second / 2^30 */
    double first_folio_us; /* median over batches of the time from a
                              batch's start (before any page of it is
                              taken out) until its first folio is usable
                              again: relocation's copy included */
    size_t pages_to_move;  /* kernel path: populated pages not yet on the
                              node; relocation: populated pages found */
    int relocated;         /* 1 if the relocation path ran */
    unsigned batches;      /* batches run */
};
#define FK_MIGRATE_RESULT_INIT { sizeof(struct fk_migrate_result), 0, 0, 0, 0, 0 }

/* Migrates [addr, addr + len) to NUMA node `node`. Other threads may keep
 * using the range meanwhile, including madvise, munmap, mremap, mprotect
 * and fork. FK_PATH_RELOCATE runs only on private anonymous read-write
 * memory no other userfaultfd watches, with /dev/userfaultfd access (or
 * CAP_SYS_PTRACE) and Linux 6.8+; it leaves DMA-pinned pages to the
 * kernel path, and must not be used on memory vmspliced into a pipe or
 * holding priority-inheritance or robust futexes (the kernel fails those
 * futex calls with EFAULT while a page is out), nor while a debugger or
 * /proc/<pid>/mem reads it, nor while the application mremaps ranges
 * across mapping edges (EFAULT, or on 6.17+ a half-done move). Pass whole
 * allocations (mmap regions, large buffers), not the malloc heap: what
 * foliokit's own threads use is refused only where it can be recognised
 * (see foliokit::migrate::migrate for the whole contract). FK_PATH_AUTO
 * relocates where the checkable part of that holds, else takes the
 * kernel path; the caller vouches for the rest.
 * opts (NULL: all defaults) and out may be NULL. Errors: -EINVAL
 * (misaligned/empty, unknown path, a struct's size too small), -E2BIG
 * (a struct has fields set this library does not know), -EFAULT
 * (unmapped), -ENODEV (no such node), -EPERM (FK_PATH_RELOCATE refused
 * for this memory or this process; nothing was touched). */
int fk_migrate(void *addr, size_t len, unsigned node,
               const struct fk_migrate_opts *opts, struct fk_migrate_result *out);

/* One [start, end) address range of another process. */
struct fk_range {
    uintptr_t start;
    uintptr_t end;
};

/* fk_process_opts.flags */
#define FK_PROCESS_DRY_RUN 1u     /* count what would move; move nothing */
#define FK_PROCESS_WITH_STACK 2u  /* every-anonymous-mapping mode: also the
                                     stack (-EINVAL with ranges given) */

/* Options of fk_migrate_process; extensible (see the top of this file).
 * Zero in a field means its default. */
struct fk_process_opts {
    size_t size;        /* sizeof(struct fk_process_opts) */
    unsigned threads;   /* threads issuing move_pages calls; default 1 */
    unsigned flags;     /* FK_PROCESS_* */
    uint64_t budget_us; /* longest one move_pages call may stall the
                           target; default 10000 */
};
#define FK_PROCESS_OPTS_INIT { sizeof(struct fk_process_opts), 0, 0, 0 }

/* What fk_migrate_process did, summed over its ranges; extensible. */
struct fk_process_result {
    size_t size;            /* in: sizeof(struct fk_process_result);
                               out: bytes the library filled */
    size_t moved;           /* present pages now on the node */
    size_t already;         /* present pages that were on it before */
    size_t not_present;     /* mapped but never touched or swapped (space
                               not mapped is not counted) */
    size_t failed;          /* pages that stayed elsewhere (pinned, shared
                               with other processes, node full) */
    double secs;            /* wall time */
    double longest_call_us; /* the longest move_pages call: what the
                               target stalled at most */
};
#define FK_PROCESS_RESULT_INIT { sizeof(struct fk_process_result), 0, 0, 0, 0, 0, 0 }

/* Moves the pages of process `pid` in ranges[0..n) (page-aligned; n == 0
 * and ranges NULL: every private anonymous mapping, leaving file, shared
 * and special mappings and, unless FK_PROCESS_WITH_STACK, the stack) to
 * NUMA node `node`, with move_pages(2) in calls kept under the budget. The
 * process is held by a pidfd for the whole call. Needs ptrace read access
 * to it (its user, or CAP_SYS_PTRACE). opts and out may be NULL.
 * Errors: -ESRCH (no such process, or it exited during the call: out then
 * holds what was done before), -EPERM (not permitted), -ENODEV (no such
 * node), -ENOSPC (the node has no memory), -EINVAL (a bad range, n > 0
 * with ranges NULL, a struct's size too small), -E2BIG (unknown fields
 * set), other -errno from the kernel. */
int fk_migrate_process(int pid, const struct fk_range *ranges, size_t n, unsigned node,
                       const struct fk_process_opts *opts, struct fk_process_result *out);

/* Lazy fill (restore a snapshot on demand): `len` bytes at `addr` whose
 * contents are at `offset` in the source file. addr and len page-aligned
 * (hugetlb: huge-page-aligned). */
struct fk_lazy_range {
    uintptr_t addr;
    size_t len;
    uint64_t offset;
};

/* fk_lazy_opts.flags */
#define FK_LAZY_START_CANCELLED 1u /* serve faults only until fk_lazy_wait */
#define FK_LAZY_SERVE_DURING_BATCHES 2u /* serve faults beside a background
                                           batch in flight, not after it
                                           (needs CPUs beyond the channels) */
#define FK_LAZY_ALLOW_SHARED_MEMORY 4u /* fill shared or file-backed ranges
                                          too (refused otherwise, -EOPNOTSUPP);
                                          the caller then must not map them
                                          twice, MADV_DONTNEED them or punch
                                          holes in their file during the fill */

/* Options of fk_lazy_start; extensible. Zero in a field means its default. */
struct fk_lazy_opts {
    size_t size;         /* sizeof(struct fk_lazy_opts) */
    unsigned channels;   /* copy channels of the background fill; default 2 */
    unsigned flags;      /* FK_LAZY_* */
    uint64_t budget_us;  /* the longest a faulting thread waits behind one
                            background batch; default 2000 */
    uint64_t folio_size; /* folio of THP-eligible anonymous ranges (filled
                            whole, kept huge); default 2 MiB; a power of
                            two up to 1 GiB, else -EINVAL */
};
#define FK_LAZY_OPTS_INIT { sizeof(struct fk_lazy_opts), 0, 0, 0, 0 }

/* Counts so far, in base pages; extensible (the library fills it). */
struct fk_lazy_progress {
    size_t size;            /* in: sizeof(struct fk_lazy_progress);
                               out: bytes the library filled */
    uint64_t total_pages;
    uint64_t faulted_pages; /* installed to serve a fault (its whole folio) */
    uint64_t filled_pages;  /* installed by the background fill */
    uint64_t skipped_pages; /* never filled: discarded (MADV_DONTNEED/
                               REMOVE) or unmapped during the fill */
    uint64_t bad_pages;     /* source unreadable: see fk_lazy_wait */
    uint64_t faults;        /* faults served */
    uint64_t done;          /* 1 once the fill ended */
};
#define FK_LAZY_PROGRESS_INIT { sizeof(struct fk_lazy_progress), 0, 0, 0, 0, 0, 0, 0 }

/* What a whole fill did; extensible (the library fills it). */
struct fk_lazy_report {
    size_t size;            /* in: sizeof(struct fk_lazy_report);
                               out: bytes the library filled */
    uint64_t total_pages;   /* the counts, as in fk_lazy_progress */
    uint64_t faulted_pages;
    uint64_t filled_pages;
    uint64_t skipped_pages;
    uint64_t bad_pages;
    uint64_t faults;
    uint64_t whole_folios;  /* folios moved in whole (huge pages kept huge) */
    uint64_t batches;       /* background batches */
    double longest_batch_us; /* the longest background batch (a fault
                                cuts a batch short: it waits less) */
    double secs;            /* from fk_lazy_start to the end of the fill */
    uint64_t poisoned;      /* 1: bad pages hold poison markers (a touch gets
                               SIGBUS, BUS_MCEERR_AR with CONFIG_MEMORY_FAILURE);
                               0: this kernel (< 6.6) cannot, they read zeros */
    uint64_t bad_ranges;    /* ranges whose source could not be read */
};
#define FK_LAZY_REPORT_INIT { sizeof(struct fk_lazy_report), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/* One range whose source could not be read. kind: 1 hardware poison,
 * 2 vanished (file truncated), 3 another SIGBUS code. */
struct fk_lazy_bad {
    uintptr_t addr;
    size_t len;
    uint64_t kind;
};

/* The fill in progress (opaque). */
struct fk_lazy;

/* Registers ranges[0..n) with a userfaultfd and returns at once in *out:
 * threads may use the ranges now. Each first touch (also a kernel access,
 * e.g. read(2) into the range) waits until its folio is copied from file
 * `fd` (mapped by the library; fd may be closed afterwards); the rest is
 * filled in the background within the latency budget. Pages already
 * present are kept; a page discarded during the fill (MADV_DONTNEED) is
 * never filled and reads zeros; a forked child sees the file's bytes. The
 * ranges must stay mapped until fk_lazy_wait and hold no futex, robust
 * list or other memory the kernel cannot wait on.
 * Errors (nothing registered): -EINVAL bad ranges or options (also a
 * range past the end of the file, or a file that cannot be mapped),
 * -EBADF fd is not open, -EACCES fd is not open for reading, -ENOSYS no
 * userfaultfd, -EPERM only a user-mode-only userfaultfd, or no fork
 * events, without privilege (needs /dev/userfaultfd or CAP_SYS_PTRACE),
 * -EOPNOTSUPP kernel lacks an event or feature, -EBUSY a range is
 * registered with another userfaultfd, other -errno. On any of them,
 * restore eagerly instead. */
int fk_lazy_start(const struct fk_lazy_range *ranges, size_t n, int fd,
                  const struct fk_lazy_opts *opts, struct fk_lazy **out);

/* In a process forked from the one that called fk_lazy_start, h is the
 * parent's: fk_lazy_progress, fk_lazy_cancel and fk_lazy_wait return
 * -ECHILD there and free nothing (the parent's fill fills the child's
 * memory too). */

/* Counts so far (out may be NULL). */
int fk_lazy_progress(const struct fk_lazy *h, struct fk_lazy_progress *out);

/* Stops the background fill: what was filled stays; faults are still
 * served, and fk_lazy_wait fills the rest. */
int fk_lazy_cancel(const struct fk_lazy *h);

/* Fills the rest, unregisters the ranges (plain memory again), writes the
 * report (out may be NULL) and up to n_bad bad ranges, and frees h.
 * Returns the number of bad ranges (may exceed n_bad), or -EINVAL (h
 * NULL, bad NULL with n_bad > 0, or an out->size this library cannot
 * write) or -ECHILD (a forked child), in which case nothing was done and
 * h is still live. */
int fk_lazy_wait(struct fk_lazy *h, struct fk_lazy_report *out, struct fk_lazy_bad *bad,
                 size_t n_bad);

/* Explicit start-up, once, before any other call but fk_version (optional:
 * without it each piece of state is created on first use, and no
 * calibration profile is read). It detects the CPU, installs the SIGBUS
 * handler fk_copy_mc needs (unless FK_INIT_NO_SIGBUS_HANDLER: fk_copy_mc
 * then fails with -EOPNOTSUPP), reads the profile `foliokit calibrate`
 * wrote if FK_INIT_PROFILE_FILE asks, and pins copy workers round-robin on
 * the allowed CPUs if FK_INIT_SPREAD_CHANNELS asks (else unpinned). After
 * it no copy or clear call opens a file. A SIGBUS handler of your own must
 * be installed before fk_init; one installed after it makes fk_copy_mc
 * return -EBUSY rather than run.
 * Errors: -EALREADY (fk_init ran, or a call already set things up with the
 * defaults), -EINVAL unknown flags, -errno if sigaction failed. */
#define FK_INIT_NO_SIGBUS_HANDLER 1u
#define FK_INIT_PROFILE_FILE 2u
#define FK_INIT_SPREAD_CHANNELS 4u
int fk_init(unsigned flags);

/* Whether `auto` follows a calibration profile: 1 if one is in force
 * (FK_INIT_PROFILE_FILE found a usable one), 0 for the built-in rules. If
 * `buf` is not NULL, also writes one line saying why (which file, or why
 * none was used: missing, another CPU, another version), cut to `len - 1`
 * bytes and NUL-terminated. */
int fk_profile_status(char *buf, size_t len);

/* Starts foliokit's threads for `n` channels now (after fk_init, whose
 * FK_INIT_SPREAD_CHANNELS decides where the copy workers run): the shared
 * pool of `n` copy workers, and `n - 1` helper threads that fk_populate
 * and fk_migrate's kernel path (move_pages) share. Afterwards, calls with
 * `channels <= n` create no thread: for a process about to install a
 * seccomp filter. Helpers are shared by every caller and never waited
 * for: a call whose helpers are busy does their share on its own thread.
 * A helper works for a call with the calling thread's CPU affinity and
 * NUMA memory policy (where populated pages are allocated), and blocks
 * asynchronous signals.
 * A second call with the same `n` does nothing; another `n` starts
 * another copy pool (and more helpers if `n` is larger). If a thread
 * cannot start, its share of each call runs on the calling thread.
 * Errors: -EINVAL (n == 0, or more than 1024). */
int fk_start_channels(unsigned n);

/* A static, human-readable name for a code returned above. */
const char *fk_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif /* FOLIOKIT_H */

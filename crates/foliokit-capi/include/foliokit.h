/*
 * foliokit.h - C API of foliokit: large-folio memory operations.
 *
 * Link with -lfoliokit (libfoliokit.so or libfoliokit.a; the static library
 * also needs -lpthread -ldl -lm).
 *
 * Every function returns 0 (or a non-negative count) on success and a
 * negative errno-style code on failure; fk_strerror() names the code.
 * No function ever lets a Rust panic cross into C: an internal failure is
 * reported as -EIO. Strategy names are those `foliokit bench copy -f help`
 * and `foliokit bench clear -f help` list; NULL means "auto".
 */
#ifndef FOLIOKIT_H
#define FOLIOKIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Copies len bytes from src to dst as a batch of folio_size folios
 * (len a multiple of folio_size; dst, src and folio_size page-aligned).
 * write_once != 0 tells auto the data will not be re-read soon (streams).
 * Errors: -EINVAL bad sizes/alignment/overlap, -EOPNOTSUPP strategy this
 * CPU lacks, -ENOENT unknown strategy name. */
int fk_copy_folios(void *dst, const void *src, size_t len, size_t folio_size,
                   const char *strategy, int write_once);

/* Zeroes len bytes at dst as a batch of folio_size folios. Errors as
 * fk_copy_folios. */
int fk_clear_folios(void *dst, size_t len, size_t folio_size,
                    const char *strategy, int write_once);

/* Machine-check-safe copy of len bytes (any alignment): survives a source
 * page that raises SIGBUS (hardware poison, truncated file). Returns 0, or
 * -EHWPOISON with *not_copied set to the bytes not copied (counted from
 * the end, like the kernel's copy_mc_to_kernel) and *bad_page to the index
 * of the first bad page. strategy: "movsb", "avx2", "nt" or NULL (auto).
 * not_copied and bad_page may be NULL. */
int fk_copy_mc(void *dst, const void *src, size_t len, const char *strategy,
               size_t *not_copied, size_t *bad_page);

/* Copies len bytes with streaming (non-temporal) stores and drains them
 * before returning. */
int fk_memcpy_nt(void *dst, const void *src, size_t len);

/* Orders every streaming store this thread issued (sfence). */
void fk_drain(void);

/* Faults [addr, addr + len) in for writing from `channels` threads, in
 * 2 MiB-aligned chunks (THP stays THP); contents are preserved.
 * Errors: -EINVAL (zero channels, misaligned, wrapping), -EFAULT/-ENOMEM
 * from the kernel. */
int fk_populate(void *addr, size_t len, unsigned channels);

/* fk_migrate paths. A zeroed struct fk_migrate_opts means the kernel path
 * (move_pages), which is safe for every kind of memory. */
enum fk_path { FK_PATH_KERNEL = 0, FK_PATH_AUTO = 1, FK_PATH_RELOCATE = 2 };

struct fk_migrate_opts {
    int path;              /* enum fk_path */
    size_t batch_pages;    /* 0: 512 */
    unsigned channels;     /* 0: 1 */
    uint64_t latency_budget_us; /* 0: none */
};

struct fk_migrate_result {
    double gbps;           /* bytes per second / 2^30 */
    double first_folio_us; /* median over batches */
    size_t pages_to_move;  /* kernel path: populated pages not yet on the
                              node; relocation: populated pages found */
    int relocated;         /* 1 if the relocation path ran */
};

/* Migrates [addr, addr + len) to NUMA node `node`. Other threads may keep
 * using the range meanwhile, including madvise, munmap, mremap, mprotect
 * and fork. FK_PATH_RELOCATE runs only on private anonymous read-write
 * memory no other userfaultfd watches, with /dev/userfaultfd access (or
 * CAP_SYS_PTRACE) and Linux 6.8+; it leaves DMA-pinned pages to the
 * kernel path, and must not be used on memory vmspliced into a pipe or
 * holding priority-inheritance or robust futexes (the kernel fails those
 * futex calls with EFAULT while a page is out), nor while a debugger or
 * /proc/<pid>/mem reads it (see foliokit::migrate::migrate for the whole
 * contract). FK_PATH_AUTO relocates where the checkable part of that
 * holds, else takes the kernel path; the caller vouches for the rest.
 * opts and out may be NULL. Errors: -EINVAL (misaligned/empty),
 * -EFAULT (unmapped), -ENODEV (no such node), -EPERM (FK_PATH_RELOCATE
 * refused for this memory or this process; nothing was touched). */
int fk_migrate(void *addr, size_t len, unsigned node,
               const struct fk_migrate_opts *opts, struct fk_migrate_result *out);

/* A static, human-readable name for a code returned above. */
const char *fk_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif /* FOLIOKIT_H */

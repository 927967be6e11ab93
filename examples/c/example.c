/* foliokit C API example: every function once, with checked results.
 * Built and run by .ci/run twice: against the static library in
 * target/release, and through pkg-config against an installed prefix:
 *   cargo xtask install-capi --prefix target/capi-prefix
 *   export PKG_CONFIG_PATH=target/capi-prefix/lib/pkgconfig
 *   cc -Wall -Werror examples/c/example.c $(pkg-config --cflags --libs foliokit) \
 *      -o target/fk_example && LD_LIBRARY_PATH=target/capi-prefix/lib target/fk_example
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "foliokit.h"

#define MIB (1024UL * 1024UL)
#define FOLIO (2 * MIB)
#define LEN (16 * MIB)

static int passes, failures;

static void check(int cond, const char *what)
{
    printf("%-52s %s\n", what, cond ? "ok" : "FAILED");
    if (cond)
        passes++;
    else
        failures++;
}

static void *map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return p;
}

/* Threads of this process, from /proc/self/task. */
static int threads(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

int main(void)
{
    unsigned char *src = map(LEN), *dst = map(LEN);
    int rc;

    /* The library loaded at run time is the one this was compiled for. */
    check(fk_version() == FK_VERSION, "fk_version() == FK_VERSION of the header");
    printf("    (foliokit %u.%u.%u)\n", fk_version() / 1000000, fk_version() / 1000 % 1000,
           fk_version() % 1000);

    /* Start-up, explicitly: unknown flags are refused and change nothing,
     * then the defaults (SIGBUS handler now, no profile file, unpinned
     * workers); a second fk_init is refused. */
    check(fk_init(1u << 30) == -EINVAL, "fk_init with an unknown flag is -EINVAL");
    check(fk_init(0) == 0, "fk_init(0)");
    check(fk_init(0) == -EALREADY, "a second fk_init is -EALREADY");
    char why[160];
    check(fk_profile_status(why, sizeof why) == 0, "no profile asked for: built-in rules");
    printf("    (profile: %s)\n", why);

    /* Threads up front, as a process about to sandbox itself would: the
     * pool's two copy workers and one helper exist from here on, and no
     * call below with 2 channels makes another. */
    int before = threads();
    check(fk_start_channels(0) == -EINVAL, "fk_start_channels(0) is -EINVAL");
    check(fk_start_channels(2) == 0 && fk_start_channels(2) == 0, "fk_start_channels(2), twice");
    int started = threads();
    check(started == before + 3, "two copy workers and one helper started, once");

    /* Fault the destination in from two threads, then fill the source. */
    rc = fk_populate(dst, LEN, 2);
    check(rc == 0, "fk_populate 16 MiB with 2 channels");
    for (size_t i = 0; i < LEN; i++)
        src[i] = (unsigned char)(i * 7 + 3);

    rc = fk_copy_folios(dst, src, LEN, FOLIO, NULL, 0);
    check(rc == 0 && memcmp(dst, src, LEN) == 0, "fk_copy_folios auto, 2 MiB folios");
    rc = fk_copy_folios(dst, src, LEN, FOLIO, "movsb", 1);
    check(rc == 0 && memcmp(dst, src, LEN) == 0, "fk_copy_folios movsb, write-once");
    rc = fk_copy_folios(dst + 1, src, FOLIO, FOLIO, NULL, 0);
    check(rc == -EINVAL, "misaligned destination is -EINVAL");
    rc = fk_copy_folios(dst, src, LEN, FOLIO, "no-such", 0);
    check(rc == -ENOENT, "unknown strategy is -ENOENT");
    printf("    (fk_strerror(%d) = \"%s\")\n", rc, fk_strerror(rc));

    rc = fk_clear_folios(dst, LEN, FOLIO, "stosb", 0);
    int zero = 1;
    for (size_t i = 0; i < LEN; i++)
        zero &= dst[i] == 0;
    check(rc == 0 && zero, "fk_clear_folios stosb");

    rc = fk_memcpy_nt(dst + 3, src + 5, 1000);
    check(rc == 0 && memcmp(dst + 3, src + 5, 1000) == 0, "fk_memcpy_nt unaligned 1000 bytes");
    fk_drain();

    size_t not_copied = 123, bad = 123;
    rc = fk_copy_mc(dst + 1, src + 2, 5000, "nt", &not_copied, &bad);
    check(rc == 0 && memcmp(dst + 1, src + 2, 5000) == 0, "fk_copy_mc nt, nothing faults");

    /* A source page that vanishes: a truncated file mapping. */
    char path[] = "/tmp/fk_example_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0 && ftruncate(fd, 4 * 4096) == 0) {
        unsigned char *f = mmap(NULL, 4 * 4096, PROT_READ, MAP_SHARED, fd, 0);
        if (f != MAP_FAILED) {
            if (ftruncate(fd, 2 * 4096) != 0)
                perror("ftruncate");
            rc = fk_copy_mc(dst, f, 4 * 4096, NULL, &not_copied, &bad);
            check(rc == -EFAULT && not_copied == 2 * 4096 && bad == 2,
                  "fk_copy_mc: vanished page is -EFAULT, exact count");
            printf("    (fk_strerror(%d) = \"%s\")\n", rc, fk_strerror(rc));
            munmap(f, 4 * 4096);
        }
        close(fd);
        unlink(path);
    }

    struct fk_migrate_opts o = FK_MIGRATE_OPTS_INIT;
    struct fk_migrate_result r = FK_MIGRATE_RESULT_INIT;
    o.path = FK_PATH_AUTO;
    o.batch_pages = 512;
    o.channels = 2;
    memcpy(dst, src, LEN);
    rc = fk_migrate(dst, LEN, 0, &o, &r);
    check(rc == 0 && memcmp(dst, src, LEN) == 0, "fk_migrate 16 MiB to node 0, contents kept");
    check(r.size == sizeof(r), "fk_migrate filled the whole result struct");
    if (rc == 0)
        printf("    (%s path, %u batches, %.2f GB/s, first folio %.0f us)\n",
               r.relocated ? "relocation" : "kernel", r.batches, r.gbps, r.first_folio_us);
    o.path = FK_PATH_KERNEL;
    rc = fk_migrate(dst, LEN, 0, &o, &r);
    check(rc == 0 && memcmp(dst, src, LEN) == 0, "fk_migrate kernel path, 2 channels, contents kept");
    check(threads() == started, "thread count unchanged by populate, copies and migrations");
    rc = fk_migrate(dst, LEN, 9999, &o, &r);
    check(rc == -ENODEV, "fk_migrate to a missing node is -ENODEV");

    /* Extensible structs: a caller built against a newer header whose
     * extra field is set gets -E2BIG; an unset size is -EINVAL. */
    struct {
        struct fk_migrate_opts o;
        uint64_t newer_field;
    } newer = { FK_MIGRATE_OPTS_INIT, 1 };
    newer.o.size = sizeof(newer);
    rc = fk_migrate(dst, LEN, 0, (const struct fk_migrate_opts *)&newer, NULL);
    check(rc == -E2BIG, "unknown field set in a newer struct is -E2BIG");
    newer.newer_field = 0;
    rc = fk_migrate(dst, LEN, 0, (const struct fk_migrate_opts *)&newer, NULL);
    check(rc == 0, "the same struct with that field zero works");
    struct fk_migrate_opts unsized_opts = { 0 };
    rc = fk_migrate(dst, LEN, 0, &unsized_opts, NULL);
    check(rc == -EINVAL, "size 0 is -EINVAL");

    /* A tiering agent's call, here on this very process: its range moved
     * to node 0 (on one node: every page is already there). */
    struct fk_range range = { (uintptr_t)dst, (uintptr_t)dst + LEN };
    struct fk_process_opts po = FK_PROCESS_OPTS_INIT;
    struct fk_process_result pr = FK_PROCESS_RESULT_INIT;
    po.budget_us = 5000;
    rc = fk_migrate_process(getpid(), &range, 1, 0, &po, &pr);
    check(rc == 0 && pr.moved + pr.already + pr.failed == LEN / 4096 && memcmp(dst, src, LEN) == 0,
          "fk_migrate_process: every page of the range accounted for, contents kept");
    if (rc == 0)
        printf("    (%zu moved, %zu already there, longest call %.0f us)\n", pr.moved, pr.already,
               pr.longest_call_us);
    rc = fk_migrate_process(getpid(), NULL, 1, 0, NULL, NULL);
    check(rc == -EINVAL, "fk_migrate_process with n > 0 and no ranges is -EINVAL");

    munmap(src, LEN);
    munmap(dst, LEN);
    printf("%d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}

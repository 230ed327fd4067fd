/*
 * Reader throughput: every file under $DSRT_BENCH_FOLDER (recursively) read
 * with pread and with io_uring at depths 1, 4, 16 and 64, first through a
 * warm page cache, then with O_DIRECT (which bypasses the cache, so it
 * measures the storage). Prints files/s and MB/s per configuration, the
 * median of $DSRT_BENCH_REPEAT runs (default 3). Exits 77 when the folder is
 * not given. $DSRT_BENCH_MAX_FILES caps the number of files.
 */
#include <dsrt/datastore.h>
#include <errno.h>
#include <ftw.h>
#include <sys/stat.h>
#include <time.h>

#include "core/internal.h"
#include "task.h"

#define MAX_DEPTH 64

typedef struct {
    char **paths;
    size_t n, cap;
    size_t max_files;
    uint64_t bytes;
    size_t max_size;
} file_list;

static file_list files; /* nftw's callback takes no argument */

static int add_file(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)ftw;
    if (flag != FTW_F || !S_ISREG(st->st_mode) || st->st_size == 0) return 0;
    if (files.max_files && files.n == files.max_files) return 1;
    if (files.n == files.cap) {
        files.cap = files.cap ? files.cap * 2 : 1024;
        files.paths = realloc(files.paths, files.cap * sizeof *files.paths);
        REQUIRE(files.paths);
    }
    files.paths[files.n] = strdup(path);
    REQUIRE(files.paths[files.n]);
    files.n++;
    files.bytes += (uint64_t)st->st_size;
    if ((size_t)st->st_size > files.max_size) files.max_size = (size_t)st->st_size;
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    double seconds;
    uint64_t bytes;
    size_t failed;
    uint64_t refused;
} run_result;

/* Reads every file once through a reader of this kind; keeps it full. */
static int run_once(dsrt_io io, unsigned depth, int direct, uint8_t **bufs, size_t cap,
                    run_result *out) {
    dsrt_reader_options o = dsrt_reader_defaults();
    o.io = io;
    o.depth = depth;
    o.direct = direct;
    dsrt_reader *r;
    int rc = dsrt_reader_create(&r, &o);
    if (rc != 0) return rc;
    unsigned free_bufs[MAX_DEPTH], n_free = depth;
    for (unsigned i = 0; i < depth; i++) free_bufs[i] = i;

    memset(out, 0, sizeof *out);
    double t0 = now();
    size_t next = 0, done = 0;
    while (done < files.n) {
        while (next < files.n && n_free > 0) {
            unsigned b = free_bufs[--n_free];
            rc = dsrt_reader_submit(r, files.paths[next], bufs[b], cap, b);
            REQUIRE(rc == 0);
            next++;
        }
        dsrt_read_result res;
        rc = dsrt_reader_collect(r, &res, 1);
        REQUIRE(rc == 1);
        free_bufs[n_free++] = (unsigned)res.tag;
        if (res.status != 0) {
            if (out->failed++ < 3) fprintf(stderr, "%s\n", dsrt_last_error());
        } else {
            out->bytes += res.size;
        }
        done++;
    }
    out->seconds = now() - t0;
    out->refused = dsrt_reader_direct_refused(r);
    dsrt_reader_destroy(r);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench(dsrt_io io, unsigned depth, int direct, uint8_t **bufs, size_t cap, int repeat) {
    double secs[16];
    run_result rr = {0};
    for (int k = 0; k < repeat; k++) {
        int rc = run_once(io, depth, direct, bufs, cap, &rr);
        if (rc != 0) {
            printf("%-9s %5u %6s   failed: %s\n", dsrt_io_name(io), depth, direct ? "yes" : "no",
                   dsrt_last_error());
            return;
        }
        secs[k] = rr.seconds;
        CHECK_EQ(rr.failed, 0);
    }
    qsort(secs, (size_t)repeat, sizeof *secs, cmp_double);
    double s = secs[repeat / 2];
    printf("%-9s %5u %6s %10.0f %9.1f %9.3f %7zu %8" PRIu64 "\n", dsrt_io_name(io), depth,
           direct ? "yes" : "no", (double)files.n / s, (double)rr.bytes / s / 1e6, s, rr.failed,
           rr.refused);
    fflush(stdout);
}

int main(void) {
    const char *folder = getenv("DSRT_BENCH_FOLDER");
    if (!folder || !*folder) {
        fprintf(stderr, "DSRT_BENCH_FOLDER is not set: nothing to read, skipped\n");
        return TEST_SKIP;
    }
    const char *mf = getenv("DSRT_BENCH_MAX_FILES");
    files.max_files = mf ? (size_t)strtoull(mf, NULL, 10) : 0;
    const char *rp = getenv("DSRT_BENCH_REPEAT");
    int repeat = rp ? atoi(rp) : 3;
    repeat = DSRT_MAX(1, DSRT_MIN(repeat, 16));

    if (nftw(folder, add_file, 64, FTW_PHYS) < 0) {
        fprintf(stderr, "%s: %s\n", folder, strerror(errno));
        return 1;
    }
    if (files.n == 0) {
        fprintf(stderr, "%s: no non-empty file\n", folder);
        return TEST_SKIP;
    }
    size_t cap = (files.max_size + DSRT_DIRECT_ALIGN - 1) / DSRT_DIRECT_ALIGN * DSRT_DIRECT_ALIGN;
    uint8_t *bufs[MAX_DEPTH];
    for (int i = 0; i < MAX_DEPTH; i++)
        REQUIRE(posix_memalign((void **)&bufs[i], DSRT_DIRECT_ALIGN, cap) == 0);

    dsrt_reader *probe;
    REQUIRE(dsrt_reader_create(&probe, NULL) == 0);
    int uring = dsrt_reader_io(probe) == DSRT_IO_URING;
    printf("%zu files, %.1f MB, largest %zu bytes; io_uring: %s\n", files.n,
           (double)files.bytes / 1e6, files.max_size,
           uring ? "available" : dsrt_reader_fallback_reason(probe));
    dsrt_reader_destroy(probe);

    /* Warm the page cache. */
    run_result rr;
    REQUIRE(run_once(DSRT_IO_PREAD, 1, 0, bufs, cap, &rr) == 0);

    static const unsigned depths[] = {1, 4, 16, 64};
    printf("%-9s %5s %6s %10s %9s %9s %7s %8s\n", "io", "depth", "direct", "files/s", "MB/s",
           "seconds", "failed", "refused");
    for (int direct = 0; direct <= 1; direct++) {
        bench(DSRT_IO_PREAD, 1, direct, bufs, cap, repeat);
        for (size_t d = 0; uring && d < DSRT_ARRAY_SIZE(depths); d++)
            bench(DSRT_IO_URING, depths[d], direct, bufs, cap, repeat);
    }

    for (int i = 0; i < MAX_DEPTH; i++) free(bufs[i]);
    for (size_t i = 0; i < files.n; i++) free(files.paths[i]);
    free(files.paths);
    return TEST_RESULT();
}

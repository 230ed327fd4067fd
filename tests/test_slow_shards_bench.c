/*
 * Benchmark (label slow): how long a shard set takes to open.
 *
 *   test_slow_shards_bench [SAMPLES [SHARDS]]     (default 1000000 1000)
 *
 * 1. From dsrt's index: an index of SAMPLES samples over SHARDS shards is
 *    written beside sparse files of the recorded sizes (opening reads no
 *    shard, only their sizes), then the set is opened five times; the median
 *    is printed against the 1 s target.
 * 2. By a scan, without the index: real shards of small members (200 000
 *    samples in 50 shards by default, a tenth of SAMPLES) written with
 *    dsrt_shards_write, the index removed, the set opened three times, warm.
 *
 * Prints figures only; exits 1 only when something fails to open.
 */
#include "datastore/sources/shards/shards.h"
#include "task.h"
#include "testimg.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of `times` opens of path; the sample count in *n. */
static double time_open(const char *path, int times, size_t *n) {
    double t[8];
    for (int k = 0; k < times; k++) {
        double t0 = now_s();
        dsrt_datastore *ds;
        int rc = dsrt_datastore_open(&ds, path, NULL);
        t[k] = now_s() - t0;
        if (rc != 0) {
            fprintf(stderr, "open %s: %s\n", path, dsrt_last_error());
            exit(1);
        }
        *n = dsrt_datastore_count(ds);
        dsrt_datastore_close(ds);
    }
    qsort(t, (size_t)times, sizeof *t, cmp_d);
    return t[times / 2];
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
    size_t ns = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000;
    if (n == 0 || ns == 0 || ns > n) {
        fprintf(stderr, "usage: %s [SAMPLES [SHARDS]]\n", argv[0]);
        return 2;
    }
    char root[4096], dir[4200], p[4400];
    REQUIRE(timg_tmpdir("shards_bench", root, sizeof root) == 0);

    /* 1. The index. */
    snprintf(dir, sizeof dir, "%s/indexed", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    size_t per = n / ns;
    n = per * ns;
    dsrt_shard_index x = {.nshards = ns, .n = n, .nclasses = 1000};
    x.shard_names = calloc(ns, sizeof *x.shard_names);
    x.shard_size = calloc(ns, sizeof *x.shard_size);
    x.shard_count = calloc(ns, sizeof *x.shard_count);
    x.offset = calloc(n, sizeof *x.offset);
    x.size = calloc(n, sizeof *x.size);
    x.label = calloc(n, sizeof *x.label);
    x.member = calloc(n, sizeof *x.member);
    x.classes = calloc(1000, sizeof *x.classes);
    char *names = calloc(ns, 32), *members = calloc(n, 40), *classes = calloc(1000, 16);
    REQUIRE(x.shard_names && x.shard_size && x.shard_count && x.offset && x.size && x.label &&
            x.member && x.classes && names && members && classes);
    for (size_t c = 0; c < 1000; c++) {
        snprintf(classes + 16 * c, 16, "n%08zu", c);
        x.classes[c] = classes + 16 * c;
    }
    for (size_t k = 0; k < ns; k++) {
        snprintf(names + 32 * k, 32, "shard-%06zu.tar", k);
        x.shard_names[k] = names + 32 * k;
        x.shard_count[k] = (uint32_t)per;
        x.shard_size[k] = per * 112640 + 1024; /* ImageNet-like: 110 KB a sample */
        snprintf(p, sizeof p, "%s/%s", dir, x.shard_names[k]);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        REQUIRE(fd >= 0 && ftruncate(fd, (off_t)x.shard_size[k]) == 0);
        close(fd);
        for (size_t j = 0; j < per; j++) {
            size_t i = k * per + j;
            x.offset[i] = j * 112640 + 1536;
            x.size[i] = 110000;
            x.label[i] = (int32_t)(i % 1000);
            snprintf(members + 40 * i, 40, "%07zu_n%08zu_%zu.jpg", i, i % 1000, i);
            x.member[i] = members + 40 * i;
        }
    }
    snprintf(p, sizeof p, "%s/" DSRT_SHARD_INDEX_NAME, dir);
    REQUIRE(dsrt__shard_index_write(p, &x) == 0);
    size_t got;
    double t = time_open(dir, 5, &got);
    REQUIRE(got == n);
    printf("open from the index: %zu samples in %zu shards: %.3f s (median of 5; target < 1 s)\n",
           n, ns, t);

    /* 2. A scan, without the index. */
    size_t m = DSRT_MAX(n / 5, (size_t)1000), ms = DSRT_MAX(ns / 20, (size_t)1);
    snprintf(dir, sizeof dir, "%s/scanned", root);
    x.nshards = ms;
    x.n = m;
    for (size_t k = 0; k < ms; k++) {
        x.shard_count[k] = (uint32_t)(m / ms);
        x.shard_size[k] = (m / ms) * 2048 + 1024;
    }
    /* Real tar files of m tiny samples: one 512-byte image and its label. */
    REQUIRE(timg_mkdirs(dir) == 0);
    uint8_t hdr[DSRT_TAR_BLOCK], body[DSRT_TAR_BLOCK] = {0xff, 0xd8};
    for (size_t k = 0; k < ms; k++) {
        snprintf(p, sizeof p, "%s/shard-%06zu.tar", dir, k);
        FILE *f = fopen(p, "wb");
        REQUIRE(f);
        for (size_t j = 0; j < m / ms; j++) {
            char name[64];
            size_t i = k * (m / ms) + j;
            snprintf(name, sizeof name, "%07zu.cls", i);
            REQUIRE(dsrt__tar_header_make(hdr, name, 3, 0) == 0);
            char cls[DSRT_TAR_BLOCK] = {0};
            snprintf(cls, sizeof cls, "%zu", i % 1000);
            fwrite(hdr, 1, sizeof hdr, f);
            fwrite(cls, 1, sizeof cls, f);
            snprintf(name, sizeof name, "%07zu.jpg", i);
            REQUIRE(dsrt__tar_header_make(hdr, name, sizeof body, 0) == 0);
            fwrite(hdr, 1, sizeof hdr, f);
            fwrite(body, 1, sizeof body, f);
        }
        static const uint8_t end[2 * DSRT_TAR_BLOCK];
        fwrite(end, 1, sizeof end, f);
        REQUIRE(fclose(f) == 0);
    }
    t = time_open(dir, 3, &got);
    REQUIRE(got == (m / ms) * ms);
    printf("open by a scan (no index, page cache warm): %zu samples in %zu shards: %.3f s "
           "(%.0f samples/s)\n",
           got, ms, t, (double)got / t);
    free(x.shard_names);
    free(x.shard_size);
    free(x.shard_count);
    free(x.offset);
    free(x.size);
    free(x.label);
    free(x.member);
    free(x.classes);
    free(names);
    free(members);
    free(classes);
    return 0;
}

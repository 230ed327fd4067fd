/*
 * Pipeline benchmark (label "slow"): images/s of the 227, 32 and decode-only
 * (native) pipelines with one worker and with one per core, on generated
 * photo-sized JPEGs (500 x 375 and similar, 4:2:0, quality 85), and the
 * scaling efficiency between the two. The batches of both runs must hash the
 * same. Prints a table; fails only on a mismatch or an error, never on speed
 * (the machine may be shared).
 *
 *   DSRT_BENCH_IMAGES=N   images to generate (default 600)
 */
#include <dsrt/pipeline.h>
#include <time.h>

#include "core/internal.h"
#include "task.h"
#include "testimg.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* Images/s of epochs 1.. (epoch 0 warms up), and a hash of the batches' ids
 * and labels plus a sample of their bytes. */
static double run(const dsrt_datastore *ds, const dsrt_augment_options *a, int native,
                  unsigned threads, unsigned epochs, uint64_t *hash) {
    dsrt_pipeline_options o = dsrt_pipeline_defaults();
    o.threads = threads;
    o.epochs = epochs;
    o.native = native;
    o.batch = native ? 1 : 128;
    o.seed = 3;
    dsrt_pipeline *p;
    int rc = dsrt_pipeline_open(&p, ds, a, &o);
    if (rc != 0) fprintf(stderr, "open: %s\n", dsrt_last_error());
    REQUIRE(rc == 0);
    uint64_t h = 0xcbf29ce484222325ULL, images = 0;
    double t0 = 0;
    dsrt_batch *b;
    while ((rc = dsrt_pipeline_next(p, &b)) == 0) {
        if (b->epoch == 1 && b->index == 0) t0 = now_s();
        if (b->epoch >= 1) images += b->count;
        h = fnv(h, b->ids, b->count * sizeof *b->ids);
        h = fnv(h, b->labels, b->count * sizeof *b->labels);
        h = fnv(h, b->data, 256); /* the first bytes of the first sample */
        CHECK_OK(dsrt_batch_release(p, b));
    }
    CHECK_EQ(rc, DSRT_EEOF);
    double rate = images / (now_s() - t0);
    dsrt_pipeline_close(p);
    *hash = h;
    return rate;
}

int main(void) {
    const char *env = getenv("DSRT_BENCH_IMAGES");
    size_t n = env ? (size_t)strtoul(env, NULL, 10) : 600;
    char dir[4096];
    REQUIRE(timg_tmpdir("pipeline_bench", dir, sizeof dir) == 0);
    static const int sizes[][2] = {{500, 375}, {375, 500}, {500, 333}, {640, 480}, {400, 400}};
    for (size_t i = 0; i < n; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/c%zu", dir, i % 10);
        REQUIRE(timg_mkdirs(path) == 0);
        int w = sizes[i % 5][0], h = sizes[i % 5][1];
        uint8_t *px = malloc((size_t)w * h * 3);
        timg_pattern(px, w, h, 3, (uint32_t)i);
        size_t len;
        uint8_t *jpg = timg_jpeg(px, w, h, TJPF_RGB, TJSAMP_420, 85, 0, &len);
        REQUIRE(jpg);
        snprintf(path, sizeof path, "%s/c%zu/%05zu.jpg", dir, i % 10, i);
        REQUIRE(timg_write_file(path, jpg, len) == 0);
        free(px);
        free(jpg);
    }
    dsrt_datastore *ds;
    REQUIRE(dsrt_datastore_open(&ds, dir, NULL) == 0);

    /* The cores the pipeline uses by default. */
    dsrt_pipeline *p;
    dsrt_pipeline_options o = dsrt_pipeline_defaults();
    o.batch = 1;
    o.prefetch = 1;
    REQUIRE(dsrt_pipeline_open(&p, ds, NULL, &o) == 0);
    dsrt_pipeline_statistics s;
    dsrt_pipeline_stats(p, &s);
    unsigned cores = s.threads;
    dsrt_pipeline_close(p);

    printf("%zu images, %u cores\n%-8s %12s %12s %10s\n", n, cores, "pipeline", "1 thread",
           "all cores", "efficiency");
    const char *names[] = {"227", "32", "none"};
    for (int k = 0; k < 3; k++) {
        dsrt_augment_options a;
        if (k == 0) dsrt_augment_preset_227(&a);
        if (k == 1) dsrt_augment_preset_32(&a);
        if (k == 2) a = dsrt_augment_defaults();
        uint64_t h1, hn;
        double r1 = run(ds, &a, k == 2, 1, 3, &h1);
        double rn = run(ds, &a, k == 2, cores, 3, &hn);
        CHECK_EQ(h1, hn);
        printf("%-8s %12.1f %12.1f %9.0f%%\n", names[k], r1, rn, 100.0 * rn / (cores * r1));
    }
    dsrt_datastore_close(ds);
    return TEST_RESULT();
}

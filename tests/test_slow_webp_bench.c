/*
 * WebP decode throughput against JPEG of the same pixels, and the figures
 * scripts/bench-webp.sh sets beside Pillow's on the same files.
 *
 * DSRT_BENCH_WEBP names a folder holding sets of the same photos in
 * sub-folders, one a format (scripts/bench-webp.sh makes them: jpeg/ at
 * quality 90, webp/ lossy at quality 90, webp-lossless/); every file of a
 * set is read into memory once, then each set is decoded whole to RGB with
 * dsrt_decode (DSRT_BENCH_PASSES passes, default 3, sets interleaved within
 * each pass so that a change in the machine's load hits them alike):
 *
 *   one core   one thread, images per second of its CPU time (unmoved by
 *              other work on the machine), best pass
 *   2 threads  two threads, each with its own decoder, taking files from
 *              one counter: images per second of wall time, best pass
 *
 * One line a set: "SET: one core N images/s (M MP/s), 2 threads N images/s".
 * Exit 77 (skip) when DSRT_BENCH_WEBP is unset.
 */
#include "datastore/index/index.h"
#include "task.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>

typedef struct {
    uint8_t **data;
    size_t *size;
    size_t n, cap;
    double megapixels;
} set;

static double clock_of(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Every file below dir, in memory. */
static void collect(set *s, const char *dir) {
    DIR *d = opendir(dir);
    REQUIRE(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        REQUIRE(stat(path, &st) == 0);
        if (S_ISDIR(st.st_mode)) {
            collect(s, path);
            continue;
        }
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 256;
            s->data = realloc(s->data, s->cap * sizeof *s->data);
            s->size = realloc(s->size, s->cap * sizeof *s->size);
            REQUIRE(s->data && s->size);
        }
        REQUIRE(dsrt__read_whole_file(path, (size_t)64 << 20, &s->data[s->n], &s->size[s->n]) == 0);
        s->n++;
    }
    closedir(d);
}

typedef struct {
    const set *s;
    atomic_size_t *next;
    dsrt_decoder *d;
    uint8_t *rgb;
    size_t cap;
    int failed;
} worker;

/* Decodes files from the shared counter until none is left. */
static void *work(void *arg) {
    worker *w = arg;
    for (size_t i; (i = atomic_fetch_add(w->next, 1)) < w->s->n;) {
        dsrt_decode_request r = {.channels = 3, .dst = w->rgb, .dst_cap = w->cap};
        dsrt_image img;
        if (dsrt_decode(w->d, w->s->data[i], w->s->size[i], &r, &img) != 0) w->failed++;
    }
    return NULL;
}

/* One pass over s with `threads` workers: wall seconds; *cpu the CPU
 * seconds of the calling thread (with one worker: the whole pass's). */
static double pass(const set *s, worker *w, int threads, double *cpu) {
    atomic_size_t next = 0;
    pthread_t t[2];
    double t0 = clock_of(CLOCK_MONOTONIC), c0 = clock_of(CLOCK_THREAD_CPUTIME_ID);
    for (int k = 0; k < threads; k++) {
        w[k].s = s;
        w[k].next = &next;
        if (k > 0) REQUIRE(pthread_create(&t[k], NULL, work, &w[k]) == 0);
    }
    work(&w[0]);
    for (int k = 1; k < threads; k++) pthread_join(t[k], NULL);
    *cpu = clock_of(CLOCK_THREAD_CPUTIME_ID) - c0;
    return clock_of(CLOCK_MONOTONIC) - t0;
}

int main(void) {
    const char *root = getenv("DSRT_BENCH_WEBP");
    if (!root || !*root) {
        printf("DSRT_BENCH_WEBP is unset: skipped\n");
        return TEST_SKIP;
    }
    const char *p = getenv("DSRT_BENCH_PASSES");
    int passes = p ? atoi(p) : 3;
    if (passes < 1) passes = 1;
    static const char *const names[] = {"jpeg", "webp", "webp-lossless"};
    enum { SETS = 3 };
    set sets[SETS] = {{0}};
    worker w[2] = {{0}};
    size_t biggest = 0;
    for (int k = 0; k < 2; k++) REQUIRE(dsrt_decoder_create(&w[k].d, NULL) == 0);
    for (int k = 0; k < SETS; k++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", root, names[k]);
        collect(&sets[k], dir);
        REQUIRE(sets[k].n > 0);
        for (size_t i = 0; i < sets[k].n; i++) {
            dsrt_image_info info;
            REQUIRE(dsrt_decoder_info(w[0].d, sets[k].data[i], sets[k].size[i], &info) == 0);
            size_t px = (size_t)info.width * info.height;
            sets[k].megapixels += (double)px / 1e6;
            if (px > biggest) biggest = px;
        }
    }
    for (int k = 0; k < 2; k++) {
        w[k].cap = biggest * 3;
        REQUIRE((w[k].rgb = malloc(w[k].cap)));
    }
    double best1[SETS] = {0}, best2[SETS] = {0};
    for (int r = 0; r < passes; r++)
        for (int k = 0; k < SETS; k++) {
            double cpu, wall = pass(&sets[k], w, 2, &cpu);
            if (r == 0 || wall < best2[k]) best2[k] = wall;
            pass(&sets[k], w, 1, &cpu);
            if (r == 0 || cpu < best1[k]) best1[k] = cpu;
        }
    for (int k = 0; k < SETS; k++)
        printf("%s: %zu files, one core %.1f images/s (%.1f MP/s), 2 threads %.1f images/s\n",
               names[k], sets[k].n, (double)sets[k].n / best1[k], sets[k].megapixels / best1[k],
               (double)sets[k].n / best2[k]);
    CHECK_EQ(w[0].failed + w[1].failed, 0);
    for (int k = 0; k < 2; k++) {
        dsrt_decoder_destroy(w[k].d);
        free(w[k].rgb);
    }
    for (int k = 0; k < SETS; k++) {
        for (size_t i = 0; i < sets[k].n; i++) free(sets[k].data[i]);
        free(sets[k].data);
        free(sets[k].size);
    }
    return TEST_RESULT();
}

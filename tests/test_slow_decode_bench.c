/*
 * Decode throughput on real photos, one thread.
 *
 * DSRT_BENCH_PHOTOS names a folder of JPEGs (class sub-folders; every
 * .jpg/.jpeg below it is taken). Every file is read into memory once, then
 * each mode decodes all of them, several passes (DSRT_BENCH_PASSES, default
 * 3; DSRT_BENCH_MAX_FILES caps the files), and prints the best pass as
 * images/s and megapixels/s (of the files' full size, and of what was
 * produced):
 *
 *   turbojpeg      tjDecompress2 to RGB at full size, called directly: the
 *                  baseline, what the decoder cannot beat at full size
 *   rgb full       dsrt_decode, 3 channels, full size
 *   gray full      dsrt_decode, 1 channel, full size
 *   rgb min256     dsrt_decode with min 256x256 (DCT-scaled)
 *   rgb min32      dsrt_decode with min 32x32 (DCT-scaled, mostly 1/8)
 *
 * Exit 77 (skip) when DSRT_BENCH_PHOTOS is unset.
 */
#include "datastore/internal.h"
#include "task.h"

#include <dirent.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <turbojpeg.h>

typedef struct {
    uint8_t *data;
    size_t size;
    int width, height;
} photo;

typedef struct {
    photo *v;
    size_t n, cap, max;
    uint64_t bytes;
} photo_list;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int is_jpeg_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0);
}

/* Reads every JPEG below dir into the list, in sorted order per folder. */
static void collect(photo_list *l, const char *dir) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    if (n < 0) {
        fprintf(stderr, "%s: %s\n", dir, strerror(errno));
        return;
    }
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        char path[4096];
        struct stat st;
        if (name[0] == '.' || l->n >= l->max) goto next;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (stat(path, &st) != 0) goto next;
        if (S_ISDIR(st.st_mode)) {
            collect(l, path);
        } else if (S_ISREG(st.st_mode) && is_jpeg_name(name)) {
            photo p = {0};
            if (dsrt__read_whole_file(path, (size_t)1 << 28, &p.data, &p.size) != 0) {
                fprintf(stderr, "%s\n", dsrt_last_error());
                goto next;
            }
            if (l->n == l->cap) {
                l->cap = l->cap ? 2 * l->cap : 1024;
                l->v = realloc(l->v, l->cap * sizeof *l->v);
                REQUIRE(l->v);
            }
            l->v[l->n++] = p;
            l->bytes += p.size;
        }
    next:
        free(names[i]);
    }
    free(names);
}

typedef struct {
    const char *name;
    int channels, min; /* min < 0: TurboJPEG directly */
} mode;

int main(void) {
    const char *dir = getenv("DSRT_BENCH_PHOTOS");
    if (!dir || !dir[0]) {
        fprintf(stderr, "DSRT_BENCH_PHOTOS is not set: skipped\n");
        return TEST_SKIP;
    }
    int passes = getenv("DSRT_BENCH_PASSES") ? atoi(getenv("DSRT_BENCH_PASSES")) : 3;
    if (passes < 1) passes = 1;
    photo_list l = {0};
    l.max =
        getenv("DSRT_BENCH_MAX_FILES") ? (size_t)atoll(getenv("DSRT_BENCH_MAX_FILES")) : (size_t)-1;
    collect(&l, dir);
    if (l.n == 0) {
        fprintf(stderr, "%s: no JPEG files\n", dir);
        return 1;
    }

    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    tjhandle tj = tjInitDecompress();
    REQUIRE(tj);
    double source_mp = 0;
    size_t bad = 0, max_px = 0;
    for (size_t i = 0; i < l.n; i++) {
        dsrt_image_info info;
        if (dsrt_decoder_info(d, l.v[i].data, l.v[i].size, &info) != 0) {
            bad++;
            continue;
        }
        l.v[i].width = info.width;
        l.v[i].height = info.height;
        source_mp += (double)info.width * info.height / 1e6;
        size_t px = (size_t)info.width * info.height;
        if (px > max_px) max_px = px;
    }
    printf("%zu JPEGs (%.1f MB, %.1f megapixels, %zu unreadable) from %s, %d passes, 1 thread\n",
           l.n, (double)l.bytes / 1e6, source_mp, bad, dir, passes);
    uint8_t *rgb = malloc(max_px * 4 + 1);
    REQUIRE(rgb);

    /* The first mode is the baseline. */
    static const mode modes[] = {
        {"turbojpeg", 3, -1},   {"rgb full", 3, 0},   {"gray full", 1, 0},
        {"rgb min256", 3, 256}, {"rgb min32", 3, 32},
    };
    enum { MODES = DSRT_ARRAY_SIZE(modes) };
    double best[MODES], out_mp[MODES];
    size_t failed[MODES];
    for (size_t m = 0; m < MODES; m++) best[m] = 1e300;
    /* Passes outside, modes inside: a change in the machine's load hits
     * every mode alike rather than one. */
    for (int pass = 0; pass < passes; pass++) {
        for (size_t m = 0; m < MODES; m++) {
            double t0 = now(), produced = 0;
            failed[m] = 0;
            for (size_t i = 0; i < l.n; i++) {
                if (!l.v[i].width) continue;
                if (modes[m].min < 0) {
                    if (tjDecompress2(tj, l.v[i].data, (unsigned long)l.v[i].size, rgb,
                                      l.v[i].width, 0, l.v[i].height, TJPF_RGB, 0) != 0) {
                        /* A failed handle misbehaves on its next call: replace it. */
                        failed[m] += tjGetErrorCode(tj) == TJERR_FATAL;
                        tjDestroy(tj);
                        tj = tjInitDecompress();
                        REQUIRE(tj);
                    }
                    produced += (double)l.v[i].width * l.v[i].height;
                } else {
                    dsrt_decode_request r = {modes[m].channels, modes[m].min, modes[m].min, NULL,
                                             0};
                    dsrt_image img;
                    if (dsrt_decode(d, l.v[i].data, l.v[i].size, &r, &img) != 0) {
                        failed[m]++;
                        continue;
                    }
                    produced += (double)img.width * img.height;
                }
            }
            double t = now() - t0;
            if (t < best[m]) {
                best[m] = t;
                out_mp[m] = produced / 1e6;
            }
        }
    }
    double base_rate = (double)(l.n - bad) / best[0];
    for (size_t m = 0; m < MODES; m++) {
        double rate = (double)(l.n - bad) / best[m];
        printf("%-12s %9.1f images/s %8.1f MP/s of files %8.1f MP/s produced", modes[m].name, rate,
               source_mp / best[m], out_mp[m] / best[m]);
        if (m > 0) printf("  (%.2fx turbojpeg)", rate / base_rate);
        if (failed[m]) printf("  %zu failed", failed[m]);
        printf("\n");
    }
    free(rgb);
    tjDestroy(tj);
    dsrt_decoder_destroy(d);
    for (size_t i = 0; i < l.n; i++) free(l.v[i].data);
    free(l.v);
    return 0;
}

/*
 * Decode and augment throughput on real photos, one thread, against the
 * limit: what libjpeg-turbo alone decodes.
 *
 * DSRT_BENCH_PHOTOS names a folder of JPEGs (class sub-folders; every
 * .jpg/.jpeg below it is taken). Every file is read into memory once, then
 * each mode goes over all of them, several passes (DSRT_BENCH_PASSES,
 * default 3; DSRT_BENCH_MAX_FILES caps the files), modes interleaved within
 * each pass so that a change in the machine's load hits every mode alike.
 * Each mode's best pass is printed as images per second of this thread's
 * CPU time (on a shared machine wall time would count the time the thread
 * waited for a core), with megapixels/s of the files' full size and of what
 * was produced, and its rate over the limit's.
 *
 *   limit          tjDecompress2 at full size, RGB, fast DCT: TurboJPEG and
 *                  nothing else (the figure dsbench --limit measures)
 *   limit islow    the same with the accurate DCT dsrt decodes with
 *   rgb full       dsrt_decode, 3 channels, full size
 *   gray full      dsrt_decode, 1 channel, full size
 *   rgb min256     dsrt_decode with min 256x256 (DCT-scaled)
 *   rgb min32      dsrt_decode with min 32x32 (DCT-scaled, mostly 1/8)
 *   P L whole      a pipeline's sample work for preset P (227 or 32) and
 *                  layout L (f32: float NCHW, u8: uint8 NHWC) the way a
 *                  loader without region decoding does it: the header, a
 *                  decode of the whole image at the smallest scale, then
 *                  dsrt_augment_apply
 *   P L region     what dsrt's pipeline does: dsrt_decode_begin,
 *                  dsrt_augment_decode_request, dsrt_decode_finish of the
 *                  sample's region, dsrt_augment_apply_window; also split
 *                  into its decode and augment time
 *
 * The samples go to consecutive places of a 128-sample batch, as in the
 * pipeline. The bytes of "whole" and "region" must be equal (checked on the
 * first pass; the program fails when they are not). Exit 77 (skip) when
 * DSRT_BENCH_PHOTOS is unset.
 */
#include <dsrt/augment.h>

#include "datastore/index/index.h"
#include "task.h"

#include <dirent.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <turbojpeg.h>

#define BATCH 128

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

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
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

enum { KIND_TJ, KIND_DECODE, KIND_WHOLE, KIND_REGION };

typedef struct {
    const char *name;
    int kind;
    int tj_flags;        /* KIND_TJ */
    int channels, min;   /* KIND_DECODE */
    int preset, u8;      /* KIND_WHOLE, KIND_REGION: 227 or 32, uint8 NHWC */
    double best, out_mp; /* best pass: seconds, megapixels produced */
    double dec_s, aug_s; /* the best pass's split (KIND_REGION) */
    size_t failed;
} mode;

typedef struct {
    dsrt_decoder *dec;
    dsrt_augmenter *aug;
    tjhandle tj;
    uint8_t *rgb;   /* full-size pixels for TurboJPEG */
    uint8_t *batch; /* BATCH samples */
    uint8_t *check; /* the first pass's samples of the matching "whole" mode */
    size_t check_cap;
} bench;

static void options_for(const mode *m, dsrt_augment_options *o) {
    if (m->preset == 227)
        dsrt_augment_preset_227(o);
    else
        dsrt_augment_preset_32(o);
    if (m->u8) {
        o->layout = DSRT_AUGMENT_U8_NHWC;
        o->norm = DSRT_AUGMENT_NORM_NONE;
    }
}

/* One pass of mode m over the photos: seconds of CPU time. */
static double pass(bench *b, const photo_list *l, mode *m, double *produced, int first,
                   size_t *mismatches) {
    dsrt_augment_options o;
    size_t bytes = 0;
    if (m->kind >= KIND_WHOLE) {
        options_for(m, &o);
        bytes = dsrt_augment_sample_bytes(&o);
    }
    double dec = 0, aug = 0, t0 = cpu_now();
    *produced = 0;
    m->failed = 0;
    for (size_t i = 0; i < l->n; i++) {
        const photo *p = &l->v[i];
        if (!p->width) continue;
        uint8_t *dst = b->batch + (i % BATCH) * bytes;
        if (m->kind == KIND_TJ) {
            if (tjDecompress2(b->tj, p->data, (unsigned long)p->size, b->rgb, p->width, 0,
                              p->height, TJPF_RGB, m->tj_flags) != 0) {
                /* A failed handle misbehaves on its next call: replace it. */
                m->failed += tjGetErrorCode(b->tj) == TJERR_FATAL;
                tjDestroy(b->tj);
                b->tj = tjInitDecompress();
                REQUIRE(b->tj);
            }
            *produced += (double)p->width * p->height;
        } else if (m->kind == KIND_DECODE) {
            dsrt_decode_request r = {
                .channels = m->channels, .min_width = m->min, .min_height = m->min};
            dsrt_image img;
            if (dsrt_decode(b->dec, p->data, p->size, &r, &img) != 0) {
                m->failed++;
                continue;
            }
            *produced += (double)img.width * img.height;
        } else if (m->kind == KIND_WHOLE) {
            dsrt_image_info info;
            dsrt_image img;
            dsrt_decode_request r = {.channels = o.output_channels};
            if (dsrt_decoder_info(b->dec, p->data, p->size, &info) != 0) {
                m->failed++;
                continue;
            }
            dsrt_augment_decode_size(&o, info.width, info.height, &r.min_width, &r.min_height);
            if (dsrt_decode(b->dec, p->data, p->size, &r, &img) != 0 ||
                dsrt_augment_apply(b->aug, &o, &img, info.width, info.height, 1, 0, i, dst) != 0) {
                m->failed++;
                continue;
            }
            *produced += (double)img.width * img.height;
            if (first) memcpy(b->check + i * bytes, dst, bytes);
        } else {
            double ta = cpu_now();
            dsrt_image_info info;
            dsrt_image img;
            dsrt_window win;
            dsrt_decode_request r;
            if (dsrt_decode_begin(b->dec, p->data, p->size, &info) != 0 ||
                dsrt_augment_decode_request(b->aug, &o, &info, 1, 0, i, &r) != 0 ||
                dsrt_decode_finish(b->dec, &r, &img, &win) != 0) {
                m->failed++;
                continue;
            }
            double tb = cpu_now();
            if (dsrt_augment_apply_window(b->aug, &o, &img, &win, info.width, info.height, 1, 0, i,
                                          dst) != 0) {
                m->failed++;
                continue;
            }
            double tc = cpu_now();
            dec += tb - ta;
            aug += tc - tb;
            *produced += (double)img.width * img.height;
            if (first && memcmp(b->check + i * bytes, dst, bytes) != 0) ++*mismatches;
        }
    }
    double t = cpu_now() - t0;
    if (t < m->best) {
        m->dec_s = dec;
        m->aug_s = aug;
    }
    return t;
}

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

    bench b = {0};
    REQUIRE(dsrt_decoder_create(&b.dec, NULL) == 0);
    REQUIRE(dsrt_augmenter_create(&b.aug) == 0);
    b.tj = tjInitDecompress();
    REQUIRE(b.tj);
    double source_mp = 0;
    size_t bad = 0, max_px = 0;
    for (size_t i = 0; i < l.n; i++) {
        dsrt_image_info info;
        if (dsrt_decoder_info(b.dec, l.v[i].data, l.v[i].size, &info) != 0) {
            bad++;
            continue;
        }
        l.v[i].width = info.width;
        l.v[i].height = info.height;
        source_mp += (double)info.width * info.height / 1e6;
        size_t px = (size_t)info.width * info.height;
        if (px > max_px) max_px = px;
    }
    printf("%zu JPEGs (%.1f MB, %.1f megapixels, %zu unreadable) from %s, %d passes, 1 thread, "
           "images/s of CPU time\n",
           l.n, (double)l.bytes / 1e6, source_mp, bad, dir, passes);
    size_t sample_max = (size_t)227 * 227 * 3 * sizeof(float);
    b.rgb = malloc(max_px * 4 + 1);
    b.batch = malloc(BATCH * sample_max);
    b.check = malloc(l.n * sample_max);
    REQUIRE(b.rgb && b.batch && b.check);

    /* The first mode is the limit; each "whole" mode comes before its
     * "region" one, which compares with it. */
    mode modes[] = {
        {.name = "limit", .kind = KIND_TJ, .tj_flags = TJFLAG_FASTDCT},
        {.name = "limit islow", .kind = KIND_TJ},
        {.name = "rgb full", .kind = KIND_DECODE, .channels = 3},
        {.name = "gray full", .kind = KIND_DECODE, .channels = 1},
        {.name = "rgb min256", .kind = KIND_DECODE, .channels = 3, .min = 256},
        {.name = "rgb min32", .kind = KIND_DECODE, .channels = 3, .min = 32},
        {.name = "227 f32 whole", .kind = KIND_WHOLE, .preset = 227},
        {.name = "227 f32 region", .kind = KIND_REGION, .preset = 227},
        {.name = "227 u8 whole", .kind = KIND_WHOLE, .preset = 227, .u8 = 1},
        {.name = "227 u8 region", .kind = KIND_REGION, .preset = 227, .u8 = 1},
        {.name = "32 f32 whole", .kind = KIND_WHOLE, .preset = 32},
        {.name = "32 f32 region", .kind = KIND_REGION, .preset = 32},
        {.name = "32 u8 whole", .kind = KIND_WHOLE, .preset = 32, .u8 = 1},
        {.name = "32 u8 region", .kind = KIND_REGION, .preset = 32, .u8 = 1},
    };
    enum { MODES = DSRT_ARRAY_SIZE(modes) };
    size_t mismatches[MODES] = {0};
    for (size_t m = 0; m < MODES; m++) modes[m].best = 1e300;
    for (int p = 0; p < passes; p++) {
        for (size_t m = 0; m < MODES; m++) {
            double produced;
            double t = pass(&b, &l, &modes[m], &produced, p == 0, &mismatches[m]);
            if (t < modes[m].best) {
                modes[m].best = t;
                modes[m].out_mp = produced / 1e6;
            }
        }
    }
    size_t good = l.n - bad;
    double limit = (double)good / modes[0].best;
    int failures = 0;
    for (size_t m = 0; m < MODES; m++) {
        const mode *md = &modes[m];
        double rate = (double)good / md->best;
        printf("%-15s %8.1f images/s %7.1f MP/s of files %7.1f MP/s produced", md->name, rate,
               source_mp / md->best, md->out_mp / md->best);
        if (m > 0) printf("  %5.1f%% of the limit", 100.0 * rate / limit);
        if (md->kind == KIND_REGION)
            printf("  (decode %.3f ms, augment %.3f ms)", 1e3 * md->dec_s / good,
                   1e3 * md->aug_s / good);
        if (md->failed) printf("  %zu failed", md->failed);
        if (mismatches[m]) {
            printf("  %zu samples differ from the whole decode's", mismatches[m]);
            failures++;
        }
        printf("\n");
    }
    free(b.rgb);
    free(b.batch);
    free(b.check);
    tjDestroy(b.tj);
    dsrt_augmenter_destroy(b.aug);
    dsrt_decoder_destroy(b.dec);
    for (size_t i = 0; i < l.n; i++) free(l.v[i].data);
    free(l.v);
    return failures ? 1 : 0;
}

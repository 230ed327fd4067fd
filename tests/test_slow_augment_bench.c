/*
 * Speed of augmentation on one thread, for every instruction set this CPU
 * has (scalar, AVX2, AVX-512, side by side): the 227 and 32 presets on
 * synthetic 500 x 375 RGB images (and on the sizes a JPEG's DCT scaling
 * would hand each: 6/8 and 1/4), float NCHW and uint8 NHWC, the normalising float
 * write alone (a 227 x 227 uint8 HWC image to float CHW in [0, 1], no
 * resampling), and a rotation for comparison. Prints microseconds of thread
 * CPU time per image for each case and kernel set (the best of five rounds,
 * the kernel sets taking turns within each round so that a change in the
 * machine's load hits them alike), and checks that they wrote the same
 * bytes; exits 0 unless a call fails or the bytes differ.
 *
 * DSRT_BENCH_SECONDS sets the time per case and kernel set (default 1).
 */
#include <dsrt/augment.h>
#include <time.h>

#include "augment/internal.h"
#include "core/internal.h"
#include "task.h"

#define BATCH 64

static const char *const isas[] = {"scalar", "avx2", "avx512"};
enum { ISAS = 3 };

/* CPU time of this thread: on a machine shared with other work, wall time
 * would count the time the thread waited for a core. */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static dsrt_image make_image(int w, int h, uint64_t key) {
    uint8_t *buf = malloc((size_t)w * h * 3);
    REQUIRE(buf);
    for (size_t i = 0; i < (size_t)w * h * 3; i++)
        buf[i] = (uint8_t)(dsrt__mix64(key * 7919 + i) >> 56);
    return (dsrt_image){buf, w, h, 3, (size_t)w * 3};
}

/* Images per second of dsrt_augment_apply on the kernels a has, over
 * seconds, writing consecutive samples of a batch; n counts the samples
 * made so far (the next one's id). */
static double rounds(dsrt_augmenter *a, const char *name, const dsrt_augment_options *o,
                     const dsrt_image *img, int fw, int fh, double seconds, uint8_t *batch,
                     uint64_t *n) {
    size_t bytes = dsrt_augment_sample_bytes(o);
    uint64_t n0 = *n;
    double t0 = now(), t;
    do {
        for (int i = 0; i < 16; i++, ++*n) {
            int rc = dsrt_augment_apply(a, o, img, fw, fh, 1, 0, *n, batch + (*n % BATCH) * bytes);
            if (rc) {
                fprintf(stderr, "%s: %s\n", name, dsrt_last_error());
                exit(1);
            }
        }
        t = now() - t0;
    } while (t < seconds);
    return (double)(*n - n0) / t;
}

/* One case for every kernel set: a row of microseconds per image. */
static void bench(const char *name, const dsrt_augment_options *o, const dsrt_image *img, int fw,
                  int fh, double seconds) {
    dsrt_augmenter *a[ISAS];
    uint8_t *batch[ISAS];
    uint64_t n[ISAS] = {0};
    double best[ISAS] = {0};
    size_t bytes = dsrt_augment_sample_bytes(o);
    for (int k = 0; k < ISAS; k++) {
        REQUIRE(dsrt_augmenter_create(&a[k]) == 0);
        batch[k] = NULL;
        if (dsrt__augmenter_set_isa(a[k], isas[k]) != 0) continue;
        batch[k] = malloc(BATCH * bytes);
        REQUIRE(batch[k]);
        for (int i = 0; i < 8; i++, n[k]++) /* warm up: scratch grown, caches filled */
            REQUIRE(dsrt_augment_apply(a[k], o, img, fw, fh, 1, 0, n[k],
                                       batch[k] + (n[k] % BATCH) * bytes) == 0);
    }
    /* The same samples, the same bytes. */
    for (int k = 1; k < ISAS; k++)
        if (batch[k]) CHECK_EQ(memcmp(batch[0], batch[k], 8 * bytes), 0);
    for (int round = 0; round < 5; round++)
        for (int k = 0; k < ISAS; k++)
            if (batch[k])
                best[k] = DSRT_MAX(
                    best[k], rounds(a[k], name, o, img, fw, fh, seconds / 5, batch[k], &n[k]));
    printf("%-48s", name);
    for (int k = 0; k < ISAS; k++) {
        if (best[k] > 0)
            printf("  %8.1f", 1e6 / best[k]);
        else
            printf("  %8s", "-");
    }
    if (best[0] > 0 && best[ISAS - 1] > 0) printf("  %5.2fx", best[ISAS - 1] / best[0]);
    printf("\n");
    for (int k = 0; k < ISAS; k++) {
        free(batch[k]);
        dsrt_augmenter_destroy(a[k]);
    }
}

int main(void) {
    const char *env = getenv("DSRT_BENCH_SECONDS");
    double seconds = env ? atof(env) : 1.0;
    if (!(seconds > 0)) seconds = 1.0;
    dsrt_image full = make_image(500, 375, 1);
    dsrt_augment_options o;
    int mw, mh;

    printf("microseconds of CPU time per image, one thread (- : not on this CPU)\n");
    printf("%-48s  %8s  %8s  %8s  %s\n", "", "scalar", "avx2", "avx512", "avx512 speedup");
    dsrt_augment_preset_227(&o);
    dsrt_augment_decode_size(&o, 500, 375, &mw, &mh);
    printf("preset 227: decode at least %d x %d of 500 x 375\n", mw, mh);
    bench("preset 227, 500x375 -> 3x227x227 f32", &o, &full, 500, 375, seconds);
    /* What the pipeline hands it: TurboJPEG's 6/8 scaling meets that size. */
    dsrt_image scaled = make_image(375, 282, 4);
    bench("preset 227, 375x282 (DCT 6/8) -> 3x227x227 f32", &o, &scaled, 500, 375, seconds);
    o.layout = DSRT_AUGMENT_U8_NHWC, o.norm = DSRT_AUGMENT_NORM_NONE;
    bench("preset 227, 500x375 -> 227x227x3 u8", &o, &full, 500, 375, seconds);

    dsrt_augment_preset_32(&o);
    dsrt_augment_decode_size(&o, 500, 375, &mw, &mh);
    printf("preset 32: decode at least %d x %d of 500 x 375 (a JPEG gives 63 x 47)\n", mw, mh);
    bench("preset 32, 500x375 -> 3x32x32 f32", &o, &full, 500, 375, seconds);
    dsrt_image quarter = make_image(125, 94, 2);
    bench("preset 32, 125x94 (DCT 1/4) -> 3x32x32 f32", &o, &quarter, 500, 375, seconds);
    o.layout = DSRT_AUGMENT_U8_NHWC, o.norm = DSRT_AUGMENT_NORM_NONE;
    bench("preset 32, 125x94 (DCT 1/4) -> 32x32x3 u8", &o, &quarter, 500, 375, seconds);

    /* The write alone: the map is the identity, so the sample is the source
     * converted and normalised, without resampling. */
    dsrt_image same = make_image(227, 227, 3);
    o = dsrt_augment_defaults();
    o.output_width = o.output_height = 227;
    bench("float write alone, 227x227x3 u8 -> f32 CHW", &o, &same, 227, 227, seconds);
    o.rand_x_reflection = 1;
    o.reflection_probability = 1;
    bench("float write, reflected", &o, &same, 227, 227, seconds);

    o = dsrt_augment_defaults();
    o.output_width = o.output_height = 227;
    o.resize_shorter = 256;
    o.size_mode = DSRT_AUGMENT_CENTERCROP;
    o.rand_rotation[0] = -15, o.rand_rotation[1] = 15;
    bench("rotation +-15, 500x375 -> 3x227x227 f32", &o, &full, 500, 375, seconds);

    free(full.data);
    free(quarter.data);
    free(scaled.data);
    free(same.data);
    return TEST_RESULT();
}

/*
 * Tests of the arithmetic every nn backend shares (nn/arith.h), on the CPU:
 * the dropout mask of an element against the CPU backend's sequential
 * generation (one draw a pair of elements), the input normalisation against
 * the CPU backend's input layer (bit for bit), the bfloat16 conversions
 * (round to nearest even, NaN and infinity), and the premise of the GPU
 * input stage: for whole-pixel augmentations the pipeline's uint8 output
 * divided by 255 is its float output, bit for bit.
 */
#include "nn/arith.h"
#include "nnref.h"
#include "task.h"

#include <dsrt.h>
#include <math.h>
#include <string.h>

/* Exact unless the compiler may fuse a multiply and an add (-march=native
 * with FMA), which the CPU backend's loops may then do and these not. */
#ifdef __FMA__
#define FUSED_TOL 1e-6
#else
#define FUSED_TOL 0.0
#endif

static void test_dropout_mask(void) {
    enum { N = 4097 };
    static float ref[N];
    const float ps[] = {0.0f, 0.1f, 0.5f, 0.7f, 0.999f};
    for (size_t pi = 0; pi < DSRT_ARRAY_SIZE(ps); pi++)
        for (uint64_t seed = 0; seed < 3; seed++) {
            float p = ps[pi];
            uint64_t iter = 17 * seed + 5, layer = 2 + seed;
            ref_dropout_mask(ref, N, seed, iter, layer, p);
            dsrt_rng rng = dsrt_dropout_rng(seed, iter, layer);
            uint32_t t = dsrt_dropout_threshold(p);
            float s = dsrt_dropout_scale(p);
            int differ = 0;
            size_t kept = 0;
            for (size_t j = 0; j < N; j++) {
                float m = dsrt_dropout_mask(&rng, j, t, s);
                differ += memcmp(&m, &ref[j], sizeof m) != 0;
                kept += m != 0.0f;
            }
            CHECK_EQ(differ, 0);
            /* About 1 - p kept (binomial: 5 standard deviations). */
            double expect = (1.0 - p) * N, sd = sqrt(N * p * (1.0 - p));
            CHECK_NEAR((double)kept, expect, 5 * sd + 1);
        }
    /* The key words matter. */
    dsrt_rng a = dsrt_dropout_rng(1, 2, 3), b = dsrt_dropout_rng(1, 2, 4);
    int same = 0;
    for (size_t j = 0; j < 64; j++)
        same += dsrt_dropout_mask(&a, j, dsrt_dropout_threshold(0.5f), 2.0f) ==
                dsrt_dropout_mask(&b, j, dsrt_dropout_threshold(0.5f), 2.0f);
    CHECK_LT(same, 64);
}

/* The input layer of the CPU backend against dsrt_input_affine/apply. */
static void test_input_affine(void) {
    static const char *norms[] = {"zerocenter", "zscore", "rescale", "rescale-symmetric"};
    enum { N = 2, C = 3, H = 4, W = 5, CNT = N * C * H * W };
    float x[CNT], y[CNT];
    dsrt_rng r = dsrt_rng_init(7, 0, 0, 0);
    for (int i = 0; i < CNT; i++) x[i] = (float)(dsrt_rng_uniform(&r) * 300.0 - 20.0);
    const float mean[C] = {120.5f, 3.25f, -7.0f}, sd[C] = {57.3f, 0.7f, 255.0f};
    const float mn[C] = {0.0f, -3.5f, 10.0f}, mx[C] = {255.0f, 17.25f, 11.0f};
    for (int k = 0; k < 4; k++) {
        char desc[160];
        snprintf(desc, sizeof desc,
                 "input size=%dx%dx%d normalization=%s\nfc outputs=classes\nsoftmax\n", H, W, C,
                 norms[k]);
        dsrt_net *net = NULL;
        CHECK_OK(dsrt_net_create(&net, desc, 0, 0, 0, 2, NULL));
        REQUIRE(net);
        CHECK_OK(dsrt_net_set_input_stats(net, mean, sd, mn, mx));
        CHECK_OK(dsrt_net_predict(net, x, N, NULL, NULL, NULL, NULL));
        CHECK_OK(dsrt__net_layer_output(net, 0, y, 0));
        const dsrt_layer *l = &net->layers[0];
        int bad = 0;
        for (int i = 0; i < CNT; i++) {
            int ch = (i / (H * W)) % C;
            float a, o;
            dsrt_input_affine(l->o.norm, net->state + l->s_off, C, ch, &a, &o);
            float want = dsrt_input_apply(a, o, x[i]);
            if (!(fabs(y[i] - want) <= FUSED_TOL * fabs(want))) {
                if (bad++ < 3)
                    fprintf(stderr, "%s: element %d: backend %.9g, arith.h %.9g\n", norms[k], i,
                            y[i], want);
            }
        }
        CHECK_EQ(bad, 0);
        dsrt_net_destroy(net);
    }
    /* No normalisation: y = x. */
    float a, o;
    dsrt_input_affine(DSRT_NORM_NONE, mean, C, 0, &a, &o);
    CHECK(a == 1.0f && o == 0.0f);
}

static uint32_t bits(float f) {
    return dsrt_f32_bits(f);
}

static void test_bf16(void) {
    CHECK_EQ(dsrt_bf16_from_f32(1.0f), 0x3f80);
    CHECK_EQ(dsrt_bf16_from_f32(-2.0f), 0xc000);
    /* Ties go to even; above the tie rounds up. */
    CHECK_EQ(dsrt_bf16_from_f32(dsrt_f32_from_bits(0x3f808000u)), 0x3f80);
    CHECK_EQ(dsrt_bf16_from_f32(dsrt_f32_from_bits(0x3f818000u)), 0x3f82);
    CHECK_EQ(dsrt_bf16_from_f32(dsrt_f32_from_bits(0x3f808001u)), 0x3f81);
    CHECK_EQ(dsrt_bf16_from_f32(dsrt_f32_from_bits(0x3f807fffu)), 0x3f80);
    /* Overflow to infinity, infinities and NaN kept. */
    CHECK_EQ(dsrt_bf16_from_f32(dsrt_f32_from_bits(0x7f7fffffu)), 0x7f80);
    CHECK_EQ(dsrt_bf16_from_f32(INFINITY), 0x7f80);
    CHECK_EQ(dsrt_bf16_from_f32(-INFINITY), 0xff80);
    CHECK(isnan(dsrt_f32_from_bf16(dsrt_bf16_from_f32(NAN))));
    CHECK(isnan(dsrt_f32_from_bf16(dsrt_bf16_from_f32(dsrt_f32_from_bits(0x7f800001u)))));
    CHECK_EQ(bits(dsrt_f32_from_bf16(dsrt_bf16_from_f32(-0.0f))), 0x80000000u);
    /* Every bfloat16 converts to float and back unchanged. */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = dsrt_f32_from_bf16((uint16_t)h);
        if (isnan(f)) continue;
        bad += dsrt_bf16_from_f32(f) != h;
    }
    CHECK_EQ(bad, 0);
    /* Against the nearest bfloat16 computed in double. */
    dsrt_rng r = dsrt_rng_init(3, 0, 0, 0);
    for (int i = 0; i < 100000; i++) {
        float f =
            (float)((dsrt_rng_uniform(&r) - 0.5) * ldexp(1.0, (int)dsrt_rng_below(&r, 60) - 30));
        uint16_t h = dsrt_bf16_from_f32(f);
        double lo = dsrt_f32_from_bf16(h), e = fabs((double)f - lo);
        double up = dsrt_f32_from_bf16((uint16_t)(h + 1)),
               dn = dsrt_f32_from_bf16((uint16_t)(h - 1));
        if (e > fabs((double)f - up) || e > fabs((double)f - dn)) bad++;
    }
    CHECK_EQ(bad, 0);
}

/* For whole-pixel transforms (reflections, integer translations, no
 * resize) the pipeline's float output is its uint8 output through the
 * float path's per-byte division ((x - mean) / std, x / 255): what the GPU
 * input stage computes from uint8 batches. The cases of test_gpu_kernels. */
static void test_u8_premise(void) {
    enum { H = 23, W = 31, C = 3 };
    static uint8_t px[H * W * C], u8[H * W * C];
    static float f32[C * H * W];
    dsrt_rng r = dsrt_rng_init(11, 0, 0, 0);
    for (int i = 0; i < H * W * C; i++) px[i] = (uint8_t)dsrt_rng_below(&r, 256);
    dsrt_image img = {.data = px, .width = W, .height = H, .channels = C, .stride = W * C};
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_height = H, o.output_width = W, o.output_channels = C;
    o.fill_value[0] = 17, o.fill_value[1] = 0, o.fill_value[2] = 255;
    o.mean[0] = 120, o.mean[1] = 110.5f, o.mean[2] = 100;
    o.std[0] = 60, o.std[1] = 50, o.std[2] = 41.7f;
    dsrt_augmenter *a = NULL;
    CHECK_OK(dsrt_augmenter_create(&a));
    for (int b = 0; b < 3; b++)
        for (int zscore = 0; zscore < 2; zscore++) {
            dsrt_augment_params p;
            memset(&p, 0, sizeof p);
            p.x_scale = p.y_scale = 1.0;
            p.x_reflect = b & 1, p.y_reflect = b == 2;
            p.x_translation = 3 * b - 2, p.y_translation = 2 - b;
            o.layout = DSRT_AUGMENT_F32_NCHW;
            o.norm = zscore ? DSRT_AUGMENT_NORM_ZSCORE : DSRT_AUGMENT_NORM_RESCALE;
            CHECK_OK(dsrt_augment_apply_params(a, &o, &img, W, H, &p, f32));
            o.layout = DSRT_AUGMENT_U8_NHWC, o.norm = DSRT_AUGMENT_NORM_NONE;
            CHECK_OK(dsrt_augment_apply_params(a, &o, &img, W, H, &p, u8));
            int bad = 0, filled = 0;
            for (int c = 0; c < C; c++)
                for (int i = 0; i < H * W; i++) {
                    float x = (float)u8[i * C + c];
                    float want = zscore ? (x - o.mean[c]) / o.std[c] : x / 255.0f;
                    bad += bits(f32[c * H * W + i]) != bits(want);
                }
            /* The rows the downward translations uncover hold the fill. */
            for (int i = 0; i < W * C; i += C) filled += u8[i] == 17;
            CHECK_EQ(bad, 0);
            if (b < 2) CHECK_EQ(filled, W);
        }
    dsrt_augmenter_destroy(a);
}

int main(void) {
    RUN(test_dropout_mask);
    RUN(test_input_affine);
    RUN(test_bf16);
    RUN(test_u8_premise);
    return TEST_RESULT();
}

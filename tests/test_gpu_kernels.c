/*
 * Tests of the GPU backend's kernels (nn/kernels.h) against plain C
 * references, on a CUDA device; exits 77 (skipped) where none is visible,
 * or fails then if DSRT_REQUIRE_GPU is set (the device kit sets it).
 *
 * Tolerances: bit for bit for the input stage (against the pipeline's own
 * float output), padding, ReLU, the bias, dropout (against the CPU
 * backend's sequential masks), the softmax gradient and the conversions;
 * softmax probabilities and loss within 1e-6 relative (exp in double on
 * either side), bfloat16 logits and gradients bit for bit against the
 * float results of the rounded values; bias gradients within 1e-5 of the
 * column's absolute sum (float sums in another order), the gradient masked
 * by the folded ReLU bit for bit; pooling (max exactly, average and every
 * backward within 1e-6) and LRN (1e-6) against plain references in both
 * layouts; the step's scalars read from device memory giving what the
 * launch arguments give; the optimizer against nn/optim.c through
 * dsrt_optimizer_step, bit for bit without norm clipping and within 1e-5
 * relative with it (optim.c sums squares in float lanes, the GPU in
 * double); synchronised batchnorm's sums within 1e-6 of the absolute
 * sums, its statistics and input gradient from given sums bit for bit or
 * within 1e-6 (test_bn_sync); the activations against tests/actref.h's
 * double references, float32 within 4e-6 relative plus 2e-7 max(1, |x|)
 * (the device's expf, erfcf, tanhf), bfloat16 within 2^-8 relative plus the
 * same. Where the C compiler may fuse multiplies and adds (__FMA__), the
 * bit-for-bit checks allow 1e-6 relative.
 */
#include "actref.h"
#include "gpu.h"
#include "kernelcheck.h"
#include "nn/arith.h"
#include "nn/kernels.h"
#include "nn/layers/batchnorm_kernels.h"
#include "nn/layers/conv_kernels.h"
#include "nn/layers/dropout_kernels.h"
#include "nn/layers/eltwise_kernels.h"
#include "nn/layers/input_kernels.h"
#include "nn/layers/layernorm_kernels.h"
#include "nn/layers/lrn_kernels.h"
#include "nn/layers/mul_kernels.h"
#include "nn/layers/pool_kernels.h"
#include "nn/layers/softmax_kernels.h"
#include "nn/layers/stochastic_depth_kernels.h"
#include "nnref.h"

#include <dsrt.h>
#include <math.h>
#include <string.h>

static cudaStream_t S;

/* A launcher, then the stream: errors of the launch and of the run. */
#define LAUNCH(call)                                                                               \
    do {                                                                                           \
        CU(call);                                                                                  \
        CU(cudaStreamSynchronize(S));                                                              \
    } while (0)

static void *dalloc(size_t bytes) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    CU(cudaMemset(p, 0, bytes ? bytes : 1));
    return p;
}

static void *dcopy(const void *host, size_t bytes) {
    void *p = dalloc(bytes);
    CU(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void put(void *dev, const void *host, size_t bytes) {
    CU(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
}

static void get(void *host, const void *dev, size_t bytes) {
    CU(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

static void *hmalloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    REQUIRE(p);
    return p;
}

static int mismatches16(const char *what, const dsrt_bf16 *got, const float *want, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        dsrt_bf16 w = dsrt_bf16_from_f32(want[i]);
        int ok = got[i] == w || (isnan(want[i]) && isnan(dsrt_f32_from_bf16(got[i])));
        if (!ok && bad++ < 5)
            fprintf(stderr, "  %s[%zu]: got 0x%04x, want 0x%04x (%.9g)\n", what, i, got[i], w,
                    want[i]);
    }
    return bad;
}

static size_t count_of(const dsrt_k_desc *d) {
    return (size_t)d->n * d->c * d->h * d->w;
}

static size_t bytes_of(const dsrt_k_desc *d) {
    return count_of(d) * (d->type == DSRT_K_BF16 ? 2 : 4);
}

/* want (NCHW) rearranged into d's layout. */
static void to_layout(const dsrt_k_desc *d, const float *nchw, float *out) {
    dsrt_k_desc plain = *d;
    plain.nhwc = 0;
    for (int b = 0; b < d->n; b++)
        for (int c = 0; c < d->c; c++)
            for (int h = 0; h < d->h; h++)
                for (int w = 0; w < d->w; w++)
                    out[at(d, b, c, h, w)] = nchw[at(&plain, b, c, h, w)];
}

/* Checks a device tensor of desc d against want (in d's layout, float). */
static int check_tensor(const char *what, const dsrt_k_desc *d, const void *dev, const float *want,
                        double rel) {
    size_t n = count_of(d);
    int bad;
    if (d->type == DSRT_K_BF16) {
        dsrt_bf16 *h = hmalloc(n * sizeof *h);
        get(h, dev, n * sizeof *h);
        bad = mismatches16(what, h, want, n);
        free(h);
    } else {
        float *h = hmalloc(n * sizeof *h);
        get(h, dev, n * sizeof *h);
        bad = mismatches(what, h, want, n, rel, 0);
        free(h);
    }
    return bad;
}

// ----------------------------------------------------------------------------
// Input

/* Three images through the augmenter with whole-pixel transforms, as uint8
 * NHWC and as float NCHW: the kernel on the bytes gives the floats. */
static void test_input_u8(void) {
    enum { N = 3, H = 23, W = 31, C = 3, PLANE = H * W * C };
    uint8_t *px = hmalloc(N * PLANE), *u8 = hmalloc(N * PLANE);
    float *f32 = hmalloc(N * PLANE * sizeof(float)), *fz = hmalloc(N * PLANE * sizeof(float));
    float *want = hmalloc(N * PLANE * sizeof(float));
    dsrt_rng r = dsrt_rng_init(21, 0, 0, 0);
    for (int i = 0; i < N * PLANE; i++) px[i] = (uint8_t)dsrt_rng_below(&r, 256);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_height = H, o.output_width = W, o.output_channels = C;
    o.fill_value[0] = 17, o.fill_value[1] = 0, o.fill_value[2] = 255;
    o.mean[0] = 120, o.mean[1] = 110.5f, o.mean[2] = 100;
    o.std[0] = 60, o.std[1] = 50, o.std[2] = 41.7f;
    dsrt_augmenter *a = NULL;
    CHECK_OK(dsrt_augmenter_create(&a));
    for (int b = 0; b < N; b++) {
        dsrt_image img = {px + b * PLANE, W, H, C, W * C};
        dsrt_augment_params p;
        memset(&p, 0, sizeof p);
        p.x_scale = p.y_scale = 1.0;
        p.x_reflect = b & 1, p.y_reflect = b == 2;
        p.x_translation = 3 * b - 2, p.y_translation = 2 - b;
        o.layout = DSRT_AUGMENT_F32_NCHW, o.norm = DSRT_AUGMENT_NORM_RESCALE;
        CHECK_OK(dsrt_augment_apply_params(a, &o, &img, W, H, &p, f32 + b * PLANE));
        o.norm = DSRT_AUGMENT_NORM_ZSCORE;
        CHECK_OK(dsrt_augment_apply_params(a, &o, &img, W, H, &p, fz + b * PLANE));
        o.layout = DSRT_AUGMENT_U8_NHWC, o.norm = DSRT_AUGMENT_NORM_NONE;
        CHECK_OK(dsrt_augment_apply_params(a, &o, &img, W, H, &p, u8 + b * PLANE));
    }
    dsrt_augmenter_destroy(a);

    uint8_t *dx = dcopy(u8, N * PLANE);
    void *dy = dalloc(N * PLANE * sizeof(float));
    dsrt_k_pixel unit = {{0, 0, 0, 0}, {255, 255, 255, 255}};
    dsrt_k_pixel z = {{o.mean[0], o.mean[1], o.mean[2], 0}, {o.std[0], o.std[1], o.std[2], 1}};
    for (int nhwc = 0; nhwc < 2; nhwc++)
        for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++) {
            dsrt_k_desc d = {N, C, H, W, nhwc, (dsrt_k_type)t};
            LAUNCH(dsrt_k_input_u8(dx, &unit, DSRT_NORM_NONE, NULL, &d, dy, S));
            to_layout(&d, f32, want);
            CHECK_EQ(check_tensor("x/255", &d, dy, want, 0), 0);
            LAUNCH(dsrt_k_input_u8(dx, &z, DSRT_NORM_NONE, NULL, &d, dy, S));
            to_layout(&d, fz, want);
            CHECK_EQ(check_tensor("(x-mean)/std", &d, dy, want, 0), 0);
        }

    /* Then the input layer's own normalisation, from its state. */
    const float stats[4 * C] = {0.5f, 0.45f, 0.4f, 0.25f, 0.2f, 0.3f, 0, 0.1f, 0, 1, 0.9f, 1};
    float *ds = dcopy(stats, sizeof stats);
    for (int norm = DSRT_NORM_ZEROCENTER; norm <= DSRT_NORM_RESCALE_SYMMETRIC; norm++) {
        dsrt_k_desc d = {N, C, H, W, norm & 1, DSRT_K_F32};
        float *ref = hmalloc(N * PLANE * sizeof(float));
        for (int i = 0; i < N * PLANE; i++) {
            float aa, oo;
            dsrt_input_affine(norm, stats, C, (i / (H * W)) % C, &aa, &oo);
            ref[i] = dsrt_input_apply(aa, oo, f32[i]);
        }
        to_layout(&d, ref, want);
        LAUNCH(dsrt_k_input_u8(dx, &unit, norm, ds, &d, dy, S));
        CHECK_EQ(check_tensor("normalised", &d, dy, want, FUSED_TOL), 0);
        free(ref);
    }
    /* Refused: more channels than pixel statistics, no state. */
    dsrt_k_desc wide = {1, 5, 2, 2, 0, DSRT_K_F32};
    CHECK_EQ(dsrt_k_input_u8(dx, &unit, DSRT_NORM_NONE, NULL, &wide, dy, S), cudaErrorInvalidValue);
    dsrt_k_desc d3 = {1, 3, 2, 2, 0, DSRT_K_F32};
    CHECK_EQ(dsrt_k_input_u8(dx, &unit, DSRT_NORM_ZSCORE, NULL, &d3, dy, S), cudaErrorInvalidValue);
    CU(cudaFree(ds));
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    free(px), free(u8), free(f32), free(fz), free(want);
}

static void test_input_f32(void) {
    enum { N = 2, C = 5, H = 3, W = 7, CNT = N * C * H * W };
    float x[CNT], ref[CNT], want[CNT], stats[4 * C];
    dsrt_rng r = dsrt_rng_init(22, 0, 0, 0);
    for (int i = 0; i < CNT; i++) x[i] = uniform(&r, -3, 300);
    for (int c = 0; c < C; c++) {
        stats[c] = uniform(&r, 0, 200);
        stats[C + c] = uniform(&r, 0.5f, 80);
        stats[2 * C + c] = uniform(&r, -10, 10);
        stats[3 * C + c] = stats[2 * C + c] + uniform(&r, 1, 300);
    }
    float *dx = dcopy(x, sizeof x), *ds = dcopy(stats, sizeof stats);
    void *dy = dalloc(sizeof x);
    for (int norm = DSRT_NORM_NONE; norm <= DSRT_NORM_RESCALE_SYMMETRIC; norm++) {
        for (int i = 0; i < CNT; i++) {
            float a, o;
            dsrt_input_affine(norm, stats, C, (i / (H * W)) % C, &a, &o);
            ref[i] = norm == DSRT_NORM_NONE ? x[i] : dsrt_input_apply(a, o, x[i]);
        }
        for (int nhwc = 0; nhwc < 2; nhwc++)
            for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++) {
                dsrt_k_desc d = {N, C, H, W, nhwc, (dsrt_k_type)t};
                to_layout(&d, ref, want);
                LAUNCH(dsrt_k_input_f32(dx, norm, norm ? ds : NULL, &d, dy, S));
                CHECK_EQ(check_tensor("input f32", &d, dy, want, FUSED_TOL), 0);
            }
    }
    CU(cudaFree(dx));
    CU(cudaFree(ds));
    CU(cudaFree(dy));
}

// ----------------------------------------------------------------------------
// Padding and cropping

/* The reference: want (yd's layout) from x (xd's layout, as floats). */
static void ref_pad(const dsrt_k_desc *xd, const float *x, const dsrt_k_desc *yd, float *y, int top,
                    int left, float fill, int accumulate) {
    for (int b = 0; b < yd->n; b++)
        for (int c = 0; c < yd->c; c++)
            for (int h = 0; h < yd->h; h++)
                for (int w = 0; w < yd->w; w++) {
                    int sh = h - top, sw = w - left;
                    float v = fill;
                    if (sh >= 0 && sh < xd->h && sw >= 0 && sw < xd->w) v = x[at(xd, b, c, sh, sw)];
                    size_t i = at(yd, b, c, h, w);
                    y[i] = accumulate ? y[i] + v : v;
                }
}

/* Host floats of a tensor as its type stores them. */
static void *as_type(const dsrt_k_desc *d, const float *v) {
    size_t n = count_of(d);
    if (d->type == DSRT_K_F32) {
        float *p = hmalloc(n * sizeof *p);
        memcpy(p, v, n * sizeof *p);
        return p;
    }
    dsrt_bf16 *p = hmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = dsrt_bf16_from_f32(v[i]);
    return p;
}

/* The floats a tensor of d's type holds for v. */
static void round_to_type(const dsrt_k_desc *d, float *v) {
    if (d->type == DSRT_K_BF16)
        for (size_t i = 0; i < count_of(d); i++)
            v[i] = dsrt_f32_from_bf16(dsrt_bf16_from_f32(v[i]));
}

static void pad_case(dsrt_k_desc xd, dsrt_k_desc yd, int top, int left, float fill,
                     int accumulate) {
    size_t nx = count_of(&xd), ny = count_of(&yd);
    float *x = hmalloc(nx * sizeof *x), *y = hmalloc(ny * sizeof *y);
    dsrt_rng r = dsrt_rng_init(23, (uint64_t)top + 100, (uint64_t)left + 100, accumulate);
    for (size_t i = 0; i < nx; i++) x[i] = uniform(&r, -2, 2);
    for (size_t i = 0; i < ny; i++) y[i] = uniform(&r, -2, 2);
    round_to_type(&xd, x);
    round_to_type(&yd, y);
    void *hx = as_type(&xd, x), *hy = as_type(&yd, y);
    void *dx = dcopy(hx, bytes_of(&xd)), *dy = dcopy(hy, bytes_of(&yd));
    LAUNCH(dsrt_k_pad(&xd, dx, &yd, dy, top, left, fill, accumulate, S));
    ref_pad(&xd, x, &yd, y, top, left, fill, accumulate);
    char what[96];
    snprintf(what, sizeof what, "pad %dx%d%s->%dx%d%s at (%d,%d)%s", xd.h, xd.w,
             xd.nhwc ? " nhwc" : "", yd.h, yd.w, yd.nhwc ? " nhwc" : "", top, left,
             accumulate ? " +=" : "");
    CHECK_EQ(check_tensor(what, &yd, dy, y, 0), 0);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    free(hx), free(hy), free(x), free(y);
}

static void test_pad(void) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(PAD_CASES); k++)
        pad_case(PAD_CASES[k].x, PAD_CASES[k].y, PAD_CASES[k].top, PAD_CASES[k].left,
                 PAD_CASES[k].fill, PAD_CASES[k].accumulate);
    CHECK_EQ(dsrt_k_pad(&PAD_BAD_X, NULL, &PAD_BAD_Y, NULL, 0, 0, 0, 0, S), cudaErrorInvalidValue);
}

// ----------------------------------------------------------------------------
// ReLU and the fully connected bias

static void test_relu(void) {
    enum { N = 1031 };
    float x[N], dy[N], y[N], dx[N];
    dsrt_rng r = dsrt_rng_init(24, 0, 0, 0);
    for (int i = 0; i < N; i++) x[i] = uniform(&r, -4, 4), dy[i] = uniform(&r, -1, 1);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = INFINITY, x[3] = -INFINITY, x[4] = 1e-30f, x[5] = -1e-30f;
    const float leaks[] = {0.0f, 0.1f, 0.01f};
    for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++) {
        dsrt_k_desc d = {1, 1, 1, N, 0, (dsrt_k_type)t};
        float xs[N], dys[N];
        memcpy(xs, x, sizeof x), memcpy(dys, dy, sizeof dy);
        round_to_type(&d, xs), round_to_type(&d, dys);
        void *hx = as_type(&d, xs), *hdy = as_type(&d, dys);
        void *dxx = dcopy(hx, bytes_of(&d)), *ddy = dcopy(hdy, bytes_of(&d));
        void *dyy = dalloc(bytes_of(&d)), *ddx = dalloc(bytes_of(&d));
        for (size_t k = 0; k < DSRT_ARRAY_SIZE(leaks); k++) {
            float leak = leaks[k];
            for (int i = 0; i < N; i++) y[i] = xs[i] > 0 ? xs[i] : xs[i] * leak;
            LAUNCH(dsrt_k_relu_fwd(d.type, dxx, dyy, N, leak, S));
            CHECK_EQ(check_tensor("relu", &d, dyy, y, 0), 0);
            round_to_type(&d, y);
            for (int i = 0; i < N; i++) dx[i] = y[i] > 0 ? dys[i] : dys[i] * leak;
            LAUNCH(dsrt_k_relu_bwd(d.type, dyy, ddy, ddx, N, leak, S));
            CHECK_EQ(check_tensor("relu backward", &d, ddx, dx, 0), 0);
        }
        /* In place. */
        for (int i = 0; i < N; i++) y[i] = xs[i] > 0 ? xs[i] : xs[i] * 0.2f;
        LAUNCH(dsrt_k_relu_fwd(d.type, dxx, dxx, N, 0.2f, S));
        CHECK_EQ(check_tensor("relu in place", &d, dxx, y, 0), 0);
        CU(cudaFree(dxx));
        CU(cudaFree(ddy));
        CU(cudaFree(dyy));
        CU(cudaFree(ddx));
        free(hx), free(hdy);
    }
}

/* The activation kernels (clip, sigmoid, hardsigmoid, hardswish, SiLU,
 * GELU), both types, against tests/actref.h's references: PyTorch's
 * gradients at the kinks, float32 within a few units of the last place
 * (the device's expf, erfcf and tanhf), bfloat16 within half its unit;
 * in place; an unknown function refused. */
static int dev_act_fwd(void *ctx, dsrt_k_type t, const dsrt_k_act *a, const void *x, void *y,
                       size_t n) {
    size_t bytes = n * act_type_size(t);
    void *dx = dcopy(x, bytes), *dy = dalloc(bytes);
    cudaError_t e = dsrt_k_act_fwd(t, a, dx, dy, n, S);
    if (e == cudaSuccess) e = cudaStreamSynchronize(S);
    get(y, dy, bytes);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    return e != cudaSuccess;
}

static int dev_act_bwd(void *ctx, dsrt_k_type t, const dsrt_k_act *a, const void *x, const void *y,
                       const void *dy, void *dx, size_t n) {
    size_t bytes = n * act_type_size(t);
    void *ax = dcopy(x, bytes), *ay = dcopy(y, bytes), *ady = dcopy(dy, bytes),
         *adx = dalloc(bytes);
    cudaError_t e = dsrt_k_act_bwd(t, a, ax, ay, ady, adx, n, S);
    if (e == cudaSuccess) e = cudaStreamSynchronize(S);
    get(dx, adx, bytes);
    CU(cudaFree(ax));
    CU(cudaFree(ay));
    CU(cudaFree(ady));
    CU(cudaFree(adx));
    return e != cudaSuccess;
}

static void test_activations(void) {
    const act_runner r = {dev_act_fwd, dev_act_bwd, NULL};
    CHECK_EQ(act_kernel_check(&r, 100003), 0);
    enum { N = 1031 };
    float x[N], y[N], z[N];
    dsrt_rng rng = dsrt_rng_init(43, 0, 0, 0);
    for (int i = 0; i < N; i++) x[i] = uniform(&rng, -5, 5);
    const dsrt_k_act silu = {DSRT_K_ACT_SILU, 0, 0}, bad = {DSRT_K_ACT_COUNT, 0, 0};
    CHECK_OK(dev_act_fwd(NULL, DSRT_K_F32, &silu, x, y, N));
    void *d = dcopy(x, sizeof x);
    LAUNCH(dsrt_k_act_fwd(DSRT_K_F32, &silu, d, d, N, S));
    get(z, d, sizeof z);
    CHECK_EQ(mismatches("silu in place", z, y, N, 0, 0), 0);
    CHECK_EQ(dsrt_k_act_fwd(DSRT_K_F32, &bad, d, d, N, S), cudaErrorInvalidValue);
    CHECK_EQ(dsrt_k_act_bwd((dsrt_k_type)7, &silu, d, d, d, d, N, S), cudaErrorInvalidValue);
    CU(cudaFree(d));
}

/* The bias and ReLU of a fully connected layer (n, out) and of a
 * convolution (NHWC, both types); the bias gradient over NHWC with and
 * without the ReLU's backward folded in: the masked gradient bit for bit,
 * the sums within 1e-5 of the column's absolute sum (float sums in another
 * order), the same bits run to run. */
static void test_bias(void) {
    const int shapes[][4] = {
        {7, 1, 1, 45}, {300, 1, 1, 70}, {1, 1, 1, 1}, {4, 13, 11, 33}, {3, 120, 100, 5}};
    for (size_t sh = 0; sh < DSRT_ARRAY_SIZE(shapes); sh++)
        for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++) {
            int n = shapes[sh][0], h = shapes[sh][1], w = shapes[sh][2], out = shapes[sh][3];
            dsrt_k_desc d = {n, out, h, w, 1, (dsrt_k_type)t};
            size_t cnt = count_of(&d), rows = (size_t)n * h * w;
            float *x = hmalloc(cnt * 4), *y = hmalloc(cnt * 4), *b = hmalloc(out * 4);
            float *dy = hmalloc(cnt * 4), *db = hmalloc(out * 4), *db2 = hmalloc(out * 4);
            dsrt_rng r = dsrt_rng_init(25, sh, t, 0);
            for (size_t i = 0; i < cnt; i++) x[i] = uniform(&r, -3, 3), dy[i] = uniform(&r, -1, 1);
            for (int o = 0; o < out; o++) b[o] = uniform(&r, -1, 1);
            round_to_type(&d, x), round_to_type(&d, dy);
            void *hx = as_type(&d, x), *hdy = as_type(&d, dy);
            void *dx = dcopy(hx, bytes_of(&d)), *dout = dalloc(bytes_of(&d));
            float *dbias = dcopy(b, out * 4), *ddb = dalloc(out * 4);
            for (int relu = 0; relu < 2; relu++) {
                for (size_t i = 0; i < cnt; i++) {
                    float v = x[i] + b[i % out];
                    if (relu && v < 0) v *= 0.25f;
                    y[i] = v;
                }
                const dsrt_k_act act = {relu ? DSRT_K_ACT_RELU : DSRT_K_ACT_IDENTITY, 0.25f, 0};
                LAUNCH(dsrt_k_bias_act(&d, dx, dbias, dout, &act, S));
                CHECK_EQ(check_tensor("bias", &d, dout, y, FUSED_TOL), 0);
                /* With a residual (dy's values) added, then a ReLU. */
                const dsrt_k_act post = {DSRT_K_ACT_RELU, 0.0f, 0};
                void *dres = dcopy(hdy, bytes_of(&d));
                for (size_t i = 0; i < cnt; i++) {
                    float v = y[i] + dy[i];
                    y[i] = v > 0 ? v : v * 0.0f; /* -0 as the leaky form gives */
                }
                LAUNCH(dsrt_k_bias_act_sum(&d, dx, dbias, &act, dres, &post, dout, S));
                CHECK_EQ(check_tensor("bias and residual", &d, dout, y, FUSED_TOL), 0);
                CU(cudaFree(dres));
            }
            /* The gradient behind a leaky ReLU whose output is x. */
            void *work = dalloc(dsrt_k_bias_grad_work(&d));
            for (int fold = 0; fold < 2; fold++) {
                void *ddy = dcopy(hdy, bytes_of(&d));
                float *want = hmalloc(cnt * 4);
                for (size_t i = 0; i < cnt; i++)
                    want[i] = fold && !(x[i] > 0) ? dy[i] * 0.1f : dy[i];
                round_to_type(&d, want);
                LAUNCH(dsrt_k_bias_grad(&d, ddy, fold ? dx : NULL, 0.1f, ddb, work, S));
                CHECK_EQ(check_tensor("masked gradient", &d, ddy, want, 0), 0);
                get(db, ddb, out * 4);
                int bad = 0;
                for (int o = 0; o < out; o++) {
                    double sum = 0, abs = 0;
                    for (size_t k = 0; k < rows; k++)
                        sum += want[k * out + o], abs += fabs(want[k * out + o]);
                    if (!(fabs(db[o] - sum) <= 1e-5 * abs + 1e-30) && bad++ < 5)
                        fprintf(stderr, "  bias grad[%d]: got %.9g, want %.9g\n", o, db[o], sum);
                }
                CHECK_EQ(bad, 0);
                put(ddy, hdy, bytes_of(&d));
                LAUNCH(dsrt_k_bias_grad(&d, ddy, fold ? dx : NULL, 0.1f, ddb, work, S));
                get(db2, ddb, out * 4);
                CHECK_EQ(memcmp(db, db2, out * 4), 0); /* run to run identical */
                CU(cudaFree(ddy));
                free(want);
            }
            dsrt_k_desc nchw = d;
            nchw.nhwc = 0;
            nchw.h = 2;
            CHECK_EQ(dsrt_k_bias_grad(&nchw, dx, NULL, 0, ddb, work, S), cudaErrorInvalidValue);
            CU(cudaFree(work));
            CU(cudaFree(dx));
            CU(cudaFree(dbias));
            CU(cudaFree(dout));
            CU(cudaFree(ddb));
            free(x), free(y), free(b), free(dy), free(db), free(db2), free(hx), free(hdy);
        }
}

// ----------------------------------------------------------------------------
// Pooling and local response normalisation

/* Pooling forward against a plain loop (max exactly, average within
 * 1e-6), backward against tests/nnref.h's reference (1e-6), in both
 * layouts; bfloat16 forward exactly as the float result rounded (max) or
 * within bf16 rounding (average). */
static void test_pool(void) {
    static const int cases[][9] = {
        /* kh kw sh sw pt pl max pb pr */
        {3, 3, 2, 2, 1, 1, 1, 1, 1}, {2, 2, 1, 1, 0, 0, 1, 0, 0}, {3, 3, 2, 2, 1, 0, 0, 0, 1},
        {3, 3, 2, 2, 0, 1, 1, 1, 0}, {9, 8, 1, 1, 0, 0, 0, 0, 0},
    };
    enum { N = 2, C = 5, H = 9, W = 8, CNT = N * C * H * W };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        const int *cs = cases[k];
        int oh = (H + cs[4] + cs[7] - cs[0]) / cs[2] + 1;
        int ow = (W + cs[5] + cs[8] - cs[1]) / cs[3] + 1;
        int ocnt = N * C * oh * ow;
        float x[CNT], dy[CNT], out[CNT], dxr[CNT];
        dsrt_rng r = dsrt_rng_init(41, k, 0, 0);
        for (int i = 0; i < CNT; i++) x[i] = uniform(&r, -2, 2), dy[i] = uniform(&r, -1, 1);
        for (int b = 0; b < N; b++)
            for (int c = 0; c < C; c++)
                for (int y = 0; y < oh; y++)
                    for (int z = 0; z < ow; z++) {
                        float best = -INFINITY, sum = 0;
                        for (int rr = 0; rr < cs[0]; rr++)
                            for (int q = 0; q < cs[1]; q++) {
                                int ih = y * cs[2] - cs[4] + rr, iw = z * cs[3] - cs[5] + q;
                                if (ih < 0 || iw < 0 || ih >= H || iw >= W) continue;
                                float v = x[(((size_t)b * C + c) * H + ih) * W + iw];
                                best = v > best ? v : best;
                                sum += v;
                            }
                        out[(((size_t)b * C + c) * oh + y) * ow + z] =
                            cs[6] ? best : sum / (float)(cs[0] * cs[1]);
                    }
        ref_pool_bwd(x, dy, dxr, N, C, H, W, oh, ow, cs[0], cs[1], cs[2], cs[3], cs[4], cs[5],
                     cs[6]);
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            dsrt_k_pool p = {{N, C, H, W, nhwc, DSRT_K_F32},
                             {N, C, oh, ow, nhwc, DSRT_K_F32},
                             cs[0],
                             cs[1],
                             cs[2],
                             cs[3],
                             cs[4],
                             cs[5],
                             cs[6] ? DSRT_K_POOL_MAX : DSRT_K_POOL_AVG,
                             0,
                             0};
            float xl[CNT], dyl[CNT], want[CNT];
            to_layout(&p.xd, x, xl);
            to_layout(&p.yd, dy, dyl);
            float *dxx = dcopy(xl, CNT * 4), *dyy = dalloc(ocnt * 4), *ddy = dcopy(dyl, ocnt * 4);
            float *ddx = dalloc(CNT * 4);
            /* Max pooling keeps its winners for the backward (one byte an
             * output); the backward without them finds them again. */
            uint8_t *darg = cs[6] ? dalloc(ocnt) : NULL;
            LAUNCH(dsrt_k_pool_fwd(&p, dxx, dyy, darg, S));
            to_layout(&p.yd, out, want);
            CHECK_EQ(check_tensor("pooling", &p.yd, dyy, want, cs[6] ? 0 : 1e-6), 0);
            float *got = hmalloc(CNT * 4);
            to_layout(&p.xd, dxr, want);
            for (int kept = 0; kept <= (darg != NULL); kept++) {
                LAUNCH(dsrt_k_pool_bwd(&p, kept ? NULL : dxx, kept ? darg : NULL, ddy, ddx, S));
                get(got, ddx, CNT * 4);
                CHECK_EQ(mismatches(kept ? "pooling backward, winners kept" : "pooling backward",
                                    got, want, CNT, 1e-6, 1e-7),
                         0);
            }
            CU(cudaFree(dxx));
            CU(cudaFree(dyy));
            CU(cudaFree(ddy));
            CU(cudaFree(ddx));
            if (darg) CU(cudaFree(darg));
            free(got);
        }
    }
    dsrt_k_pool bad = {{1, 1, 2, 2, 1, DSRT_K_F32},
                       {1, 1, 1, 1, 0, DSRT_K_F32},
                       2,
                       2,
                       1,
                       1,
                       0,
                       0,
                       DSRT_K_POOL_MAX,
                       0,
                       0};
    CHECK_EQ(dsrt_k_pool_fwd(&bad, NULL, NULL, NULL, S), cudaErrorInvalidValue);
}

/* The direct convolution (the fallback where cuDNN has no algorithm) on the
 * device against its own bodies run on the host (the CPU stand-in's tests
 * check those against the CPU backend), in both layouts and types: a 3x2
 * window dilated by 2, strides 2x1, one channel a group, padding. */
static void test_conv(void) {
    enum { N = 2, C = 3, H = 9, W = 8, K = 6 };
    for (int nhwc = 0; nhwc < 2; nhwc++)
        for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++) {
            dsrt_k_conv p = {{N, C, H, W, nhwc, (dsrt_k_type)t},
                             {N, K, 4, 8, nhwc, (dsrt_k_type)t},
                             3,
                             2,
                             2,
                             1,
                             2,
                             2,
                             2,
                             1,
                             3};
            size_t nx = dsrt_kb_count(&p.xd), ny = dsrt_kb_count(&p.yd);
            size_t nw = dsrt_kb_conv_w_count(&p), el = t == DSRT_K_BF16 ? 2 : 4;
            float *xf = hmalloc(nx * 4), *wf = hmalloc(nw * 4), *gf = hmalloc(ny * 4);
            dsrt_rng r = dsrt_rng_init(77, (uint64_t)nhwc, (uint64_t)t, 0);
            for (size_t i = 0; i < nx; i++) xf[i] = uniform(&r, -2, 2);
            for (size_t i = 0; i < nw; i++) wf[i] = uniform(&r, -1, 1);
            for (size_t i = 0; i < ny; i++) gf[i] = uniform(&r, -1, 1);
            /* The same values in the tensors' type. */
            void *x = hmalloc(nx * el), *w = hmalloc(nw * el), *g = hmalloc(ny * el);
            for (size_t i = 0; i < nx; i++) dsrt_kb_store(x, p.xd.type, i, xf[i]);
            for (size_t i = 0; i < nw; i++) dsrt_kb_store(w, p.xd.type, i, wf[i]);
            for (size_t i = 0; i < ny; i++) dsrt_kb_store(g, p.yd.type, i, gf[i]);
            /* The references: the same bodies on the host (outputs in the
             * tensors' type, the filter gradient in float). */
            float *y = hmalloc(ny * 4), *dx = hmalloc(nx * 4), *dw = hmalloc(nw * 4);
            for (size_t i = 0; i < ny; i++) dsrt_kb_conv_fwd(&p, x, w, (void *)y, i);
            for (size_t i = 0; i < nx; i++) dsrt_kb_conv_bwd_data(&p, w, g, (void *)dx, i);
            for (size_t i = 0; i < nw; i++) dsrt_kb_conv_bwd_filter(&p, x, g, dw, DSRT_K_F32, i);
            void *dxx = dcopy(x, nx * el), *dww = dcopy(w, nw * el), *dgg = dcopy(g, ny * el);
            void *dy = dalloc(ny * el), *ddx = dalloc(nx * el);
            float *ddw = dalloc(nw * 4);
            LAUNCH(dsrt_k_conv_fwd(&p, dxx, dww, dy, S));
            LAUNCH(dsrt_k_conv_bwd_data(&p, dww, dgg, ddx, S));
            LAUNCH(dsrt_k_conv_bwd_filter(&p, dxx, dgg, ddw, DSRT_K_F32, S));
            void *hy = hmalloc(ny * el), *hdx = hmalloc(nx * el);
            float *hdw = hmalloc(nw * 4);
            get(hy, dy, ny * el);
            get(hdx, ddx, nx * el);
            get(hdw, ddw, nw * 4);
            float *gy = hmalloc(ny * 4), *gdx = hmalloc(nx * 4), *wy = hmalloc(ny * 4),
                  *wdx = hmalloc(nx * 4);
            for (size_t i = 0; i < ny; i++) gy[i] = dsrt_kb_load(hy, p.yd.type, i);
            for (size_t i = 0; i < nx; i++) gdx[i] = dsrt_kb_load(hdx, p.xd.type, i);
            for (size_t i = 0; i < ny; i++) wy[i] = dsrt_kb_load(y, p.yd.type, i);
            for (size_t i = 0; i < nx; i++) wdx[i] = dsrt_kb_load(dx, p.xd.type, i);
            CHECK_EQ(mismatches("direct convolution", gy, wy, ny, 1e-6, 1e-6), 0);
            CHECK_EQ(mismatches("direct convolution, input gradient", gdx, wdx, nx, 1e-6, 1e-6), 0);
            CHECK_EQ(mismatches("direct convolution, filter gradient", hdw, dw, nw, 1e-6, 1e-6), 0);
            CU(cudaFree(dxx));
            CU(cudaFree(dww));
            CU(cudaFree(dgg));
            CU(cudaFree(dy));
            CU(cudaFree(ddx));
            CU(cudaFree(ddw));
            free(xf), free(wf), free(gf), free(x), free(w), free(g), free(y), free(dx), free(dw);
            free(hy), free(hdx), free(hdw), free(gy), free(gdx), free(wy), free(wdx);
        }
    dsrt_k_conv bad = {
        {1, 3, 4, 4, 1, DSRT_K_F32}, {1, 4, 2, 2, 1, DSRT_K_F32}, 3, 3, 1, 1, 1, 1, 0, 0, 2};
    CHECK_EQ(dsrt_k_conv_fwd(&bad, NULL, NULL, NULL, S), cudaErrorInvalidValue);
}

static void test_lrn(void) {
    enum { N = 2, C = 9, H = 5, W = 4, HW = H * W, CNT = N * C * HW };
    const dsrt_k_lrn l = {5, 1e-1f, 0.75f, 1.0f};
    float x[CNT], dy[CNT], y[CNT], dxr[CNT];
    dsrt_rng r = dsrt_rng_init(42, 0, 0, 0);
    for (int i = 0; i < CNT; i++) x[i] = uniform(&r, -3, 3), dy[i] = uniform(&r, -1, 1);
    for (size_t b = 0; b < N; b++)
        for (int c = 0; c < C; c++)
            for (int k = 0; k < HW; k++) {
                size_t i = (b * C + c) * HW + k;
                y[i] = (float)(x[i] * pow(ref_lrn_scale(x, C, HW, b, c, k, l.size, l.alpha, l.k),
                                          -(double)l.beta));
            }
    ref_lrn_bwd(x, y, dy, dxr, N, C, HW, l.size, l.alpha, l.beta, l.k);
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        dsrt_k_desc d = {N, C, H, W, nhwc, DSRT_K_F32};
        float xl[CNT], dyl[CNT], yl[CNT], want[CNT];
        to_layout(&d, x, xl), to_layout(&d, dy, dyl), to_layout(&d, y, yl);
        float *dxx = dcopy(xl, CNT * 4), *dyy = dalloc(CNT * 4), *ddy = dcopy(dyl, CNT * 4);
        float *ddx = dalloc(CNT * 4), *dscale = dalloc(CNT * 4);
        LAUNCH(dsrt_k_lrn_fwd(&d, &l, dxx, dyy, dscale, S));
        CHECK_EQ(check_tensor("lrn", &d, dyy, yl, 1e-5), 0);
        put(dyy, yl, CNT * 4);
        to_layout(&d, dxr, want);
        /* In float: within 1e-5 of the double reference, or 1e-6 where
         * its two terms cancel. */
        float got[CNT];
        for (int kept = 0; kept < 2; kept++) {
            LAUNCH(dsrt_k_lrn_bwd(&d, &l, dxx, dyy, ddy, kept ? dscale : NULL, ddx, S));
            get(got, ddx, CNT * 4);
            CHECK_EQ(mismatches(kept ? "lrn backward, scales kept" : "lrn backward", got, want, CNT,
                                1e-5, 1e-6),
                     0);
        }
        CU(cudaFree(dscale));
        CU(cudaFree(dxx));
        CU(cudaFree(dyy));
        CU(cudaFree(ddy));
        CU(cudaFree(ddx));
    }
}

// ----------------------------------------------------------------------------
// Synchronised batch normalisation

/* Doubles that differ by more than rel * scale[i] (scale NULL: |want|);
 * prints the first few. */
static int dmismatches(const char *what, const double *got, const double *want, const double *scale,
                       size_t n, double rel) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= rel * (scale ? scale[i] : fabs(want[i]))) && bad++ < 5)
            fprintf(stderr, "  %s[%zu]: got %.17g, want %.17g\n", what, i, got[i], want[i]);
    return bad;
}

/* Against the C references of the CPU backend's steps (tests/nnref.h): the
 * sums within 1e-6 of the sums of absolute values (float tiles summed in another
 * order), identical run to run; the statistics and the input gradient from
 * the same sums bit for bit (FUSED_TOL where the C side may fuse), the
 * float parameter gradients within 1e-6 relative of the sums' rounding. */
static void test_bn_sync(void) {
    const int shapes[][3] = {{8, 5, 36}, {16, 7, 143}, {1, 3, 1}, {3, 1, 1000}, {32, 2, 300}};
    for (size_t sh = 0; sh < DSRT_ARRAY_SIZE(shapes); sh++) {
        int n = shapes[sh][0], c = shapes[sh][1], hw = shapes[sh][2];
        size_t cnt = (size_t)n * c * hw;
        dsrt_rng r = dsrt_rng_init(61, sh, 0, 0);
        float *x = hmalloc(cnt * 4), *dy = hmalloc(cnt * 4), *want = hmalloc(cnt * 4);
        float *got = hmalloc(cnt * 4);
        for (size_t i = 0; i < cnt; i++) x[i] = uniform(&r, -2, 3), dy[i] = uniform(&r, -1, 1);
        double *sums = hmalloc((2 * c + 1) * 8), *ref = hmalloc((2 * c + 1) * 8);
        double *mag = hmalloc((2 * c + 1) * 8), *again = hmalloc((2 * c + 1) * 8);
        float *dx_ = dcopy(x, cnt * 4), *ddy = dcopy(dy, cnt * 4), *ddx = dalloc(cnt * 4);
        double *dsums = dalloc((2 * c + 1) * 8), *dbs = dalloc(2 * c * 8);
        const dsrt_k_desc xd = {n, c, 1, hw, 0, DSRT_K_F32};
        float *dwork = dalloc(dsrt_kb_bn_work(&xd) * 4);

        /* Forward sums. */
        LAUNCH(dsrt_k_bn_sums(&xd, dx_, dsums, dwork, S));
        get(sums, dsums, (2 * c + 1) * 8);
        ref_bn_sums(x, n, c, hw, ref);
        float *ax = hmalloc(cnt * 4), *ady = hmalloc(cnt * 4), *zero = hmalloc(c * 4);
        for (size_t i = 0; i < cnt; i++) ax[i] = fabsf(x[i]);
        ref_bn_sums(ax, n, c, hw, mag);
        CHECK_EQ(dmismatches("bn sums", sums, ref, mag, 2 * (size_t)c + 1, 1e-6), 0);
        CHECK(sums[2 * c] == (double)n * hw);
        LAUNCH(dsrt_k_bn_sums(&xd, dx_, dsums, dwork, S));
        get(again, dsums, (2 * c + 1) * 8);
        CHECK_EQ(memcmp(sums, again, (2 * c + 1) * 8), 0);

        /* Statistics and running averages, as if two workers held the batch. */
        for (int k = 0; k <= 2 * c; k++) sums[k] *= 2;
        put(dsums, sums, (2 * c + 1) * 8);
        float *st = hmalloc(5 * c * 4), *st_want = hmalloc(5 * c * 4);
        for (int k = 0; k < 2 * c; k++) st[3 * c + k] = st_want[3 * c + k] = uniform(&r, 0, 1);
        float *dst = dcopy(st, 5 * c * 4);
        LAUNCH(dsrt_k_bn_stats(dsums, c, 1e-3f, 0.3f, dst, dst + c, dst + 2 * c, dst + 3 * c,
                               dst + 4 * c, S));
        get(st, dst, 5 * c * 4);
        ref_bn_stats(sums, c, 1e-3f, 0.3f, st_want, st_want + c, st_want + 2 * c, st_want + 3 * c,
                     st_want + 4 * c);
        CHECK_EQ(mismatches("bn statistics", st, st_want, 3 * (size_t)c, 0, 0), 0);
        CHECK_EQ(mismatches("bn running statistics", st + 3 * c, st_want + 3 * c, 2 * (size_t)c,
                            FUSED_TOL, 0),
                 0);

        /* Backward sums and parameter gradients. */
        float *dpar = dalloc(2 * c * 4), *par = hmalloc(2 * c * 4);
        LAUNCH(dsrt_k_bn_bwd_sums(&xd, dx_, ddy, NULL, 0.0f, dst, dst + 2 * c, dbs, dpar, dpar + c,
                                  dwork, S));
        double *bs = hmalloc(2 * c * 8), *bref = hmalloc(2 * c * 8), *babs = hmalloc(2 * c * 8);
        float *pref = hmalloc(2 * c * 4);
        get(bs, dbs, 2 * c * 8);
        get(par, dpar, 2 * c * 4);
        ref_bn_bwd_sums(x, dy, st, st + 2 * c, n, c, hw, bref, pref, pref + c);
        for (size_t i = 0; i < cnt; i++) ady[i] = fabsf(dy[i]);
        for (int b = 0; b < n; b++)
            for (int ch = 0; ch < c; ch++)
                for (int k = 0; k < hw; k++) {
                    size_t i = ((size_t)b * c + ch) * hw + k;
                    ax[i] = fabsf(x[i] - st[ch]);
                }
        ref_bn_bwd_sums(ax, ady, zero, st + 2 * c, n, c, hw, babs, NULL, NULL);
        CHECK_EQ(dmismatches("bn backward sums", bs, bref, babs, 2 * (size_t)c, 1e-6), 0);
        CHECK_EQ(mismatches("bn parameter gradients", par, pref, 2 * (size_t)c, 1e-6, 1e-7), 0);

        /* Input gradient with the global terms, from the same sums. */
        float *scale = hmalloc(c * 4);
        for (int k = 0; k < c; k++) scale[k] = uniform(&r, 0.5f, 1.5f);
        float *dscale = dcopy(scale, c * 4);
        put(dbs, bref, 2 * c * 8);
        LAUNCH(dsrt_k_bn_bwd_dx(&xd, dx_, ddy, NULL, 0.0f, dst, dst + 2 * c, dscale, dbs,
                                dsums + 2 * c, ddx, S));
        get(got, ddx, cnt * 4);
        ref_bn_bwd_dx(x, dy, st, st + 2 * c, scale, bref, sums[2 * c], n, c, hw, want);
        CHECK_EQ(mismatches("bn input gradient", got, want, cnt, 1e-6, 1e-7), 0);

        /* The normalised output (leaky ReLU after it), from the batch's
         * statistics and, at inference, from a variance. */
        float *shift = hmalloc(c * 4);
        for (int k = 0; k < c; k++) shift[k] = uniform(&r, -0.5f, 0.5f);
        float *dshift = dcopy(shift, c * 4);
        for (int pass = 0; pass < 2; pass++) {
            for (int b = 0; b < n; b++)
                for (int ch = 0; ch < c; ch++)
                    for (int k = 0; k < hw; k++) {
                        size_t i = ((size_t)b * c + ch) * hw + k;
                        double is =
                            pass ? 1.0 / sqrt((double)st[4 * c + ch] + 1e-3) : st[2 * c + ch];
                        float v = (float)(((double)x[i] - st[ch]) * is * scale[ch] + shift[ch]);
                        want[i] = v < 0 ? v * 0.1f : v;
                    }
            LAUNCH(dsrt_k_bn_apply(&xd, dx_, dst, pass ? NULL : dst + 2 * c,
                                   pass ? dst + 4 * c : NULL, 1e-3f, dscale, dshift, 1, 0.1f, ddx,
                                   S));
            get(got, ddx, cnt * 4);
            CHECK_EQ(mismatches("bn output", got, want, cnt, 1e-6, 1e-7), 0);
        }
        CU(cudaFree(dshift));
        free(shift);

        /* A count that is not positive: NaN statistics, running ones kept. */
        double zero_count = 0;
        put(dsums + 2 * c, &zero_count, 8);
        float *keep = hmalloc(2 * c * 4);
        get(keep, dst + 3 * c, 2 * c * 4);
        LAUNCH(dsrt_k_bn_stats(dsums, c, 1e-3f, 0.3f, dst, dst + c, dst + 2 * c, dst + 3 * c,
                               dst + 4 * c, S));
        get(st, dst, 5 * c * 4);
        int nans = 0;
        for (int k = 0; k < 3 * c; k++) nans += isnan(st[k]) != 0;
        CHECK_EQ(nans, 3 * c);
        CHECK_EQ(memcmp(st + 3 * c, keep, 2 * c * 4), 0);
        /* Nothing to do is no launch. */
        const dsrt_k_desc none = {n, 0, 1, hw, 0, DSRT_K_F32}, empty = {0, c, 1, hw, 0, DSRT_K_F32};
        CHECK_EQ(dsrt_k_bn_sums(&none, dx_, dsums, dwork, S), cudaSuccess);
        CHECK_EQ(dsrt_k_bn_bwd_dx(&empty, dx_, ddy, NULL, 0, dst, dst, dscale, dbs, dsums, ddx, S),
                 cudaSuccess);

        void *dev[] = {dx_, ddy, ddx, dsums, dbs, dst, dpar, dscale, dwork};
        for (size_t k = 0; k < DSRT_ARRAY_SIZE(dev); k++) CU(cudaFree(dev[k]));
        void *host[] = {x,   dy, want, got,  sums, ref, mag, again, st,    st_want,
                        par, bs, bref, babs, pref, ax,  ady, zero,  scale, keep};
        for (size_t k = 0; k < DSRT_ARRAY_SIZE(host); k++) free(host[k]);
    }
}

// ----------------------------------------------------------------------------
// Dropout

static void test_dropout(void) {
    enum { N = 3, C = 5, H = 7, W = 9, CNT = N * C * H * W };
    float x[CNT], m[CNT], ref[CNT], want[CNT];
    dsrt_rng r = dsrt_rng_init(26, 0, 0, 0);
    for (int i = 0; i < CNT; i++) x[i] = uniform(&r, -2, 2);
    const float ps[] = {0.0f, 0.3f, 0.5f};
    const uint64_t seeds[] = {0, 42, 0x123456789abcdefULL};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(ps); k++)
        for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++)
            for (int nhwc = 0; nhwc < 2; nhwc++) {
                float p = ps[k];
                uint64_t seed = seeds[k], iter = 5000000000ULL + k;
                int layer = 3 + (int)k;
                dsrt_k_desc d = {N, C, H, W, nhwc, (dsrt_k_type)t}, plain = d;
                plain.nhwc = 0;
                float xs[CNT];
                memcpy(xs, x, sizeof x);
                round_to_type(&plain, xs);
                ref_dropout_mask(m, CNT, seed, iter, (uint64_t)layer, p);
                for (int i = 0; i < CNT; i++) ref[i] = xs[i] * m[i];
                float xl[CNT];
                to_layout(&d, xs, xl);
                void *hx = as_type(&d, xl), *dx = dcopy(hx, bytes_of(&d)),
                     *dy = dalloc(bytes_of(&d));
                LAUNCH(dsrt_k_dropout(&d, dx, dy, seed, iter, NULL, layer, p, S));
                to_layout(&d, ref, want);
                CHECK_EQ(check_tensor("dropout", &d, dy, want, 0), 0);
                /* The step read from device memory: the same masks. */
                uint64_t *dit = dcopy(&iter, sizeof iter);
                LAUNCH(dsrt_k_dropout(&d, dx, dy, seed, 0, dit, layer, p, S));
                CHECK_EQ(check_tensor("dropout, step on the device", &d, dy, want, 0), 0);
                CU(cudaFree(dit));
                /* In place (the backward on dy uses the same call). */
                LAUNCH(dsrt_k_dropout(&d, dx, dx, seed, iter, NULL, layer, p, S));
                CHECK_EQ(check_tensor("dropout in place", &d, dx, want, 0), 0);
                CU(cudaFree(dx));
                CU(cudaFree(dy));
                free(hx);
            }
    /* The mask itself: x = 1. */
    float ones[CNT];
    for (int i = 0; i < CNT; i++) ones[i] = 1.0f;
    dsrt_k_desc d = {N, C, H, W, 0, DSRT_K_F32};
    float *dx = dcopy(ones, sizeof ones);
    LAUNCH(dsrt_k_dropout(&d, dx, dx, 9, 10, NULL, 11, 0.25f, S));
    ref_dropout_mask(m, CNT, 9, 10, 11, 0.25f);
    CHECK_EQ(check_tensor("mask", &d, dx, m, 0), 0);
    CHECK_EQ(dsrt_k_dropout(&d, dx, dx, 9, 10, NULL, 11, 1.0f, S), cudaErrorInvalidValue);
    CU(cudaFree(dx));
}

// ----------------------------------------------------------------------------
// Softmax and cross-entropy

static void softmax_case(const char *what, const float *z, const int32_t *labels, int n, int k,
                         int expect_nan) {
    size_t cnt = (size_t)n * k;
    float *probs = hmalloc(cnt * 4), *got = hmalloc(cnt * 4), *dz = hmalloc(cnt * 4);
    double loss, gl, gl2;
    int correct;
    int32_t gc, gc2;
    ref_softmax_xent(z, labels, n, k, probs, &loss, &correct);
    float *dzz = dcopy(z, cnt * 4), *dp = dalloc(cnt * 4), *ddz = dalloc(cnt * 4);
    int32_t *dl = dcopy(labels, n * 4), *dc = dalloc(4);
    double *dloss = dalloc(8);
    void *work = dalloc(dsrt_k_softmax_xent_work(n));
    LAUNCH(dsrt_k_softmax_xent_fwd(dzz, DSRT_K_F32, dl, NULL, n, k, dp, dloss, dc, work, S));
    get(got, dp, cnt * 4), get(&gl, dloss, 8), get(&gc, dc, 4);
    fprintf(stderr, "  %s: loss %.17g (C %.17g), correct %d (C %d)\n", what, gl, loss, gc, correct);
    CHECK_EQ(mismatches(what, got, probs, cnt, 1e-6, 1e-30), 0);
    CHECK_EQ(gc, correct);
    if (expect_nan) {
        CHECK(isnan(gl) && isnan(loss));
    } else {
        CHECK(isfinite(loss));
        CHECK_NEAR(gl, loss, 1e-6 * fabs(loss));
    }
    /* Run to run identical. */
    LAUNCH(dsrt_k_softmax_xent_fwd(dzz, DSRT_K_F32, dl, NULL, n, k, dp, dloss, dc, work, S));
    get(&gl2, dloss, 8), get(&gc2, dc, 4);
    CHECK(memcmp(&gl, &gl2, 8) == 0 && gc == gc2);
    /* Backward from the GPU's probabilities, as the CPU rounds it. */
    float scale = 1.0f / n;
    for (size_t i = 0; i < cnt; i++) dz[i] = got[i] * scale;
    for (int b = 0; b < n; b++) dz[(size_t)b * k + labels[b]] -= scale;
    LAUNCH(dsrt_k_softmax_xent_bwd(dp, dl, NULL, NULL, n, k, scale, NULL, ddz, DSRT_K_F32, S));
    float *gdz = hmalloc(cnt * 4);
    get(gdz, ddz, cnt * 4);
    CHECK_EQ(mismatches("softmax backward", gdz, dz, cnt, FUSED_TOL, 0), 0);
    /* bfloat16 logits and gradient, the scale read from the device: the
     * float results of the rounded logits, the gradient rounded once. */
    dsrt_k_desc bd = {1, 1, 1, (int)cnt, 0, DSRT_K_BF16};
    float *zr = hmalloc(cnt * 4), *pr = hmalloc(cnt * 4), *dzr = hmalloc(cnt * 4);
    memcpy(zr, z, cnt * 4);
    round_to_type(&bd, zr);
    void *hz16 = as_type(&bd, zr), *dz16 = dcopy(hz16, cnt * 2), *ddz16 = dalloc(cnt * 2);
    float *dsc = dcopy(&scale, 4);
    put(dzz, zr, cnt * 4);
    LAUNCH(dsrt_k_softmax_xent_fwd(dzz, DSRT_K_F32, dl, NULL, n, k, dp, dloss, dc, work, S));
    get(pr, dp, cnt * 4);
    LAUNCH(dsrt_k_softmax_xent_fwd(dz16, DSRT_K_BF16, dl, NULL, n, k, dp, dloss, dc, work, S));
    CHECK_EQ(check_tensor("softmax, bf16 logits", &(dsrt_k_desc){1, 1, 1, (int)cnt, 0, DSRT_K_F32},
                          dp, pr, 0),
             0);
    for (size_t i = 0; i < cnt; i++) dzr[i] = pr[i] * scale;
    for (int b = 0; b < n; b++) dzr[(size_t)b * k + labels[b]] -= scale;
    LAUNCH(dsrt_k_softmax_xent_bwd(dp, dl, NULL, NULL, n, k, 0.0f, dsc, ddz16, DSRT_K_BF16, S));
    CHECK_EQ(check_tensor("softmax backward, bf16", &bd, ddz16, dzr, 0), 0);
    put(dzz, z, cnt * 4);
    /* Soft targets (smoothed, mixed with the next row's label): the loss
     * and the gradient as the CPU backend computes them. */
    float *t = hmalloc(cnt * 4), *dzs = hmalloc(cnt * 4);
    double sloss = 0.0;
    for (int b = 0; b < n; b++) {
        float *tb = t + (size_t)b * k;
        const float *zb = z + (size_t)b * k;
        double ts = 0.0, sum = 0.0;
        for (int j = 0; j < k; j++) {
            tb[j] = 0.05f / k + (j == labels[b] ? 0.6f : 0.0f) +
                    (j == labels[(b + 1) % n] ? 0.35f : 0.0f);
            ts += tb[j];
        }
        float mx = zb[0];
        for (int j = 1; j < k; j++)
            if (zb[j] > mx) mx = zb[j];
        for (int j = 0; j < k; j++) sum += exp((double)zb[j] - mx);
        double lse = log(sum);
        for (int j = 0; j < k; j++)
            if (tb[j] != 0) sloss += (double)tb[j] * (lse - ((double)zb[j] - mx));
        for (int j = 0; j < k; j++)
            dzs[(size_t)b * k + j] = (float)((got[(size_t)b * k + j] * ts - tb[j]) * scale);
    }
    sloss /= n;
    float *dt = dcopy(t, cnt * 4);
    LAUNCH(dsrt_k_softmax_xent_fwd(dzz, DSRT_K_F32, dl, dt, n, k, dp, dloss, dc, work, S));
    get(&gl2, dloss, 8), get(&gc2, dc, 4);
    fprintf(stderr, "  %s, soft targets: loss %.17g (C %.17g)\n", what, gl2, sloss);
    if (expect_nan)
        CHECK(isnan(gl2));
    else
        CHECK_NEAR(gl2, sloss, 1e-6 * fabs(sloss));
    CHECK_EQ(gc2, correct);
    LAUNCH(dsrt_k_softmax_xent_bwd(dp, dl, dt, work, n, k, scale, NULL, ddz, DSRT_K_F32, S));
    get(gdz, ddz, cnt * 4);
    CHECK_EQ(mismatches("softmax backward, soft targets", gdz, dzs, cnt, FUSED_TOL, 0), 0);
    /* Soft targets without labels, or without the forward's work: refused. */
    CHECK_EQ(dsrt_k_softmax_xent_fwd(dzz, DSRT_K_F32, NULL, dt, n, k, dp, dloss, dc, work, S),
             cudaErrorInvalidValue);
    CHECK_EQ(dsrt_k_softmax_xent_bwd(dp, dl, dt, NULL, n, k, scale, NULL, ddz, DSRT_K_F32, S),
             cudaErrorInvalidValue);
    CU(cudaFree(dt));
    free(t), free(dzs);
    CU(cudaFree(dz16));
    CU(cudaFree(ddz16));
    CU(cudaFree(dsc));
    free(zr), free(pr), free(dzr), free(hz16);
    /* Without labels: probabilities only, the scalars untouched. */
    CU(cudaMemset(dloss, 0, 8));
    LAUNCH(dsrt_k_softmax_xent_fwd(dzz, DSRT_K_F32, NULL, NULL, n, k, dp, dloss, dc, work, S));
    get(&gl2, dloss, 8);
    CHECK(gl2 == 0.0);
    get(got, dp, cnt * 4);
    CHECK_EQ(mismatches(what, got, probs, cnt, 1e-6, 1e-30), 0);
    CU(cudaFree(dzz));
    CU(cudaFree(dp));
    CU(cudaFree(ddz));
    CU(cudaFree(dl));
    CU(cudaFree(dc));
    CU(cudaFree(dloss));
    CU(cudaFree(work));
    free(probs), free(got), free(dz), free(gdz);
}

static void test_softmax(void) {
    const int shapes[][2] = {{37, 10}, {5, 1000}, {256, 33}, {1, 1}};
    for (size_t s = 0; s < DSRT_ARRAY_SIZE(shapes); s++) {
        int n = shapes[s][0], k = shapes[s][1];
        float *z = hmalloc((size_t)n * k * 4);
        int32_t *labels = hmalloc(n * 4);
        dsrt_rng r = dsrt_rng_init(27, s, 0, 0);
        for (size_t i = 0; i < (size_t)n * k; i++) z[i] = uniform(&r, -8, 8);
        for (int b = 0; b < n; b++) {
            labels[b] = (int32_t)dsrt_rng_below(&r, (uint64_t)k);
            /* Ties: the first maximum counts. */
            if (k > 7 && b % 3 == 0) z[(size_t)b * k + 7] = z[(size_t)b * k + 3] = 20.0f;
            if (k > 7 && b % 3 == 0) labels[b] = b % 2 ? 3 : 7;
        }
        char what[64];
        snprintf(what, sizeof what, "softmax %dx%d", n, k);
        softmax_case(what, z, labels, n, k, 0);
        free(z), free(labels);
    }
    /* Non-finite logits: NaN first (the CPU keeps it as the maximum), NaN
     * later, +inf, -inf everywhere. */
    float z[4 * 3] = {NAN, 1, 2, 1, NAN, 3, 0, INFINITY, 1, -INFINITY, -INFINITY, -INFINITY};
    int32_t labels[4] = {0, 2, 1, 0};
    for (int row = 0; row < 4; row++) {
        char what[64];
        snprintf(what, sizeof what, "softmax non-finite row %d", row);
        softmax_case(what, z + 3 * row, labels + row, 1, 3, 1);
    }
    softmax_case("softmax batch with a NaN row", z, labels, 4, 3, 1);
}

// ----------------------------------------------------------------------------
// The optimizer

typedef struct {
    float *w, *g, *m, *v;
    dsrt_bf16 *w16;
} gpu_state;

static void optim_case(dsrt_solver solver, int clip, double threshold) {
    dsrt_net *net = NULL;
    CHECK_OK(dsrt_net_create(&net, OPT_NET, 0, 0, 0, 3, NULL));
    REQUIRE(net);
    size_t np = net->n_params, bytes = np * sizeof(float);
    dsrt_k_segment seg[16];
    int n_seg = dsrt_kb_net_segments(net, seg);
    dsrt_optimizer_options o = dsrt_optimizer_defaults(solver);
    o.l2 = 1e-3;
    o.schedule = DSRT_LR_PIECEWISE, o.drop_period = 1, o.drop_factor = 0.5;
    if (clip >= 0) o.clip = (dsrt_grad_clip)clip, o.grad_threshold = threshold;
    dsrt_optimizer *opt = NULL;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    REQUIRE(opt);

    uint32_t blocks;
    size_t work_bytes = dsrt_k_optim_layout(seg, n_seg, &blocks);
    dsrt_k_optim ko = {dcopy(seg, n_seg * sizeof *seg), n_seg, blocks, dalloc(work_bytes)};
    /* Two device copies of the state, run alike: run to run identical. */
    gpu_state gs[2];
    for (int c = 0; c < 2; c++) {
        gs[c].w = dcopy(net->params, bytes);
        gs[c].g = dalloc(bytes), gs[c].m = dalloc(bytes), gs[c].v = dalloc(bytes);
        gs[c].w16 = dalloc(np * sizeof(dsrt_bf16));
    }
    float *g = hmalloc(bytes), *hw = hmalloc(bytes), *hg = hmalloc(bytes), *hm = hmalloc(bytes);
    float *hw2 = hmalloc(bytes);
    dsrt_bf16 *h16 = hmalloc(np * sizeof(dsrt_bf16));
    int norm = clip == DSRT_CLIP_L2NORM || clip == DSRT_CLIP_GLOBAL_L2NORM;
    double rel = norm ? 1e-5 : FUSED_TOL, abs = norm ? 1e-8 : 0;
    char what[96];
    snprintf(what, sizeof what, "solver %d clip %d threshold %g", (int)solver, clip, threshold);
    float *init = hmalloc(bytes);
    memcpy(init, net->params, bytes);
    for (int step = 0; step < 3; step++) {
        make_grads(g, np, seg, n_seg, 28, step);
        memcpy(net->grads, g, bytes);
        int epoch = step;
        double lr = dsrt_optimizer_learn_rate(opt, epoch);
        CHECK_OK(dsrt_optimizer_step(opt, net, epoch));
        dsrt_k_step st;
        dsrt_k_optim_step_params(&st, &o, lr, step + 1);
        /* The second copy reads the step's scalars from the device. */
        dsrt_k_consts *kc = dalloc(sizeof *kc);
        LAUNCH(dsrt_k_set_consts(kc, &(dsrt_k_consts){st, 0, 0, 0}, S));
        for (int c = 0; c < 2; c++) {
            put(gs[c].g, g, bytes);
            LAUNCH(dsrt_k_optim_update(&ko, &st, c ? &kc->step : NULL, gs[c].w, gs[c].g, gs[c].m,
                                       solver == DSRT_SOLVER_ADAM ? gs[c].v : NULL, gs[c].w16, S));
        }
        CU(cudaFree(kc));
        get(hw, gs[0].w, bytes), get(hg, gs[0].g, bytes), get(h16, gs[0].w16, np * 2);
        /* Clipping changed the gradients of some segments (all for a global
         * scale), or of none when it is off or not reached. */
        int clipped = 0;
        for (int k = 0; k < n_seg; k++)
            clipped += memcmp(net->grads + seg[k].off, g + seg[k].off, seg[k].n * 4) != 0;
        if (step == 0) fprintf(stderr, "  %s: %d of %d segments clipped\n", what, clipped, n_seg);
        if (clip < 0 || threshold > 1e3)
            CHECK_EQ(clipped, 0);
        else if (clip == DSRT_CLIP_GLOBAL_L2NORM)
            CHECK_EQ(clipped, n_seg);
        else
            CHECK(clipped > 0 && clipped < n_seg);
        CHECK_EQ(mismatches("weights", hw, net->params, np, rel, abs), 0);
        CHECK_EQ(mismatches("clipped gradients", hg, net->grads, np, rel, abs), 0);
        for (int b = 0; b < dsrt__optimizer_n_buffers(opt); b++) {
            get(hm, b ? gs[0].v : gs[0].m, bytes);
            CHECK_EQ(mismatches("state", hm, dsrt__optimizer_buffer(opt, b), np, rel, abs), 0);
        }
        int bad16 = 0;
        for (int k = 0; k < n_seg; k++)
            bad16 += mismatches16("bf16 weights", h16 + seg[k].off, hw + seg[k].off, seg[k].n);
        CHECK_EQ(bad16, 0);
        get(hw2, gs[1].w, bytes);
        CHECK_EQ(memcmp(hw, hw2, bytes), 0);
    }
    /* The frozen layer (weights and bias) did not move; the others did. */
    int frozen = 0;
    for (int k = 0; k < n_seg; k++) {
        int same = !memcmp(hw + seg[k].off, init + seg[k].off, seg[k].n * sizeof(float));
        CHECK_EQ(same, seg[k].lr == 0.0f);
        frozen += seg[k].lr == 0.0f;
    }
    CHECK_EQ(frozen, 2);
    for (int c = 0; c < 2; c++) {
        CU(cudaFree(gs[c].w));
        CU(cudaFree(gs[c].g));
        CU(cudaFree(gs[c].m));
        CU(cudaFree(gs[c].v));
        CU(cudaFree(gs[c].w16));
    }
    CU(cudaFree((void *)ko.seg));
    CU(cudaFree(ko.work));
    free(g), free(hw), free(hg), free(hm), free(hw2), free(h16), free(init);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

static void test_optimizer(void) {
    for (size_t s = 0; s < DSRT_ARRAY_SIZE(OPT_SOLVERS); s++)
        for (size_t k = 0; k < DSRT_ARRAY_SIZE(OPT_CLIPS); k++)
            optim_case(OPT_SOLVERS[s], OPT_CLIPS[k].clip, OPT_CLIPS[k].threshold);
}

// ----------------------------------------------------------------------------
// Conversions and helpers

static void test_convert(void) {
    enum { N = 65536 };
    dsrt_bf16 *h = hmalloc(N * 2), *h2 = hmalloc(N * 2);
    float *f = hmalloc(N * 4), *want = hmalloc(N * 4);
    for (int i = 0; i < N; i++) h[i] = (dsrt_bf16)i, want[i] = dsrt_f32_from_bf16((dsrt_bf16)i);
    dsrt_bf16 *dh = dcopy(h, N * 2);
    float *df = dalloc(N * 4);
    LAUNCH(dsrt_k_bf16_to_f32(dh, df, N, S));
    get(f, df, N * 4);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += dsrt_f32_bits(f[i]) != dsrt_f32_bits(want[i]);
    CHECK_EQ(bad, 0);
    dsrt_rng r = dsrt_rng_init(29, 0, 0, 0);
    for (int i = 0; i < N; i++)
        f[i] = dsrt_f32_from_bits((uint32_t)dsrt_rng_u64(&r)); /* any bits, NaNs too */
    f[0] = INFINITY, f[1] = -0.0f, f[2] = dsrt_f32_from_bits(0x3f808000u);
    put(df, f, N * 4);
    LAUNCH(dsrt_k_f32_to_bf16(df, dh, N, S));
    get(h2, dh, N * 2);
    CHECK_EQ(mismatches16("to bf16", h2, f, N), 0);
    LAUNCH(dsrt_k_fill(df, N, -1.5f, S));
    for (int i = 0; i < N; i++) want[i] = -1.5f;
    CHECK_EQ(check_tensor("fill", &(dsrt_k_desc){1, 1, 1, N, 0, DSRT_K_F32}, df, want, 0), 0);
    for (int i = 0; i < N; i++) f[i] = uniform(&r, -100, 100), want[i] = 0.125f * f[i];
    put(df, f, N * 4);
    LAUNCH(dsrt_k_scale(df, df, N, 0.125f, S));
    CHECK_EQ(check_tensor("scale", &(dsrt_k_desc){1, 1, 1, N, 0, DSRT_K_F32}, df, want, 0), 0);
    /* Nothing to do is no launch. */
    CHECK_EQ(dsrt_k_fill(df, 0, 0.0f, S), cudaSuccess);
    CU(cudaFree(dh));
    CU(cudaFree(df));
    free(h), free(h2), free(f), free(want);
}

// ----------------------------------------------------------------------------
// Products, layer normalisation, stochastic depth, partial pooling windows

/* Fills n floats in [lo, hi). */
static void fill_uniform(float *v, size_t n, uint64_t seed, float lo, float hi) {
    dsrt_rng r = dsrt_rng_init(seed, 7, 0, 0);
    for (size_t i = 0; i < n; i++) v[i] = uniform(&r, lo, hi);
}

/* A device tensor of d holding the NCHW values v (rounded to its type). */
static void *dtensor(const dsrt_k_desc *d, const float *v) {
    float *l = hmalloc(count_of(d) * 4);
    to_layout(d, v, l);
    void *h = as_type(d, l), *dev = dcopy(h, bytes_of(d));
    free(l), free(h);
    return dev;
}

/* mul's product (same shape, a gate, float32 factors a channel) bit for bit
 * against the float product of the values the tensors hold, in both
 * layouts and types; the gate's gradient and the channel sums (of a scale
 * layer, and of layernorm's gamma and beta over per-pixel statistics)
 * against sums in double: within 1e-6 (the gate's, in double on the
 * device) and 1e-5 of the sum of magnitudes (the channels', compensated
 * float tiles). */
static void test_products(void) {
    enum { N = 3, C = 37, H = 20, W = 23, CNT = N * C * H * W, ROWS = N * H * W };
    float *a = hmalloc(CNT * 4), *b = hmalloc(CNT * 4), *dy = hmalloc(CNT * 4), gate[N * C], fac[C];
    float *want = hmalloc(CNT * 4), *ar = hmalloc(CNT * 4), *br = hmalloc(CNT * 4);
    float mean[ROWS], rstd[ROWS];
    fill_uniform(a, CNT, 1, -2, 2);
    fill_uniform(b, CNT, 2, -2, 2);
    fill_uniform(dy, CNT, 3, -1, 1);
    fill_uniform(gate, N * C, 4, 0, 1);
    fill_uniform(fac, C, 5, -1, 1);
    fill_uniform(mean, ROWS, 6, -0.5f, 0.5f);
    fill_uniform(rstd, ROWS, 7, 0.5f, 2);
    size_t hw = (size_t)H * W;
    for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++)
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            dsrt_k_desc ad = {N, C, H, W, nhwc, (dsrt_k_type)t}, plain = ad;
            plain.nhwc = 0;
            dsrt_k_desc bds[3] = {
                ad, {N, C, 1, 1, nhwc, (dsrt_k_type)t}, {1, C, 1, 1, 1, DSRT_K_F32}};
            const float *bs[3] = {b, gate, fac};
            memcpy(ar, a, CNT * 4);
            round_to_type(&plain, ar);
            void *da = dtensor(&ad, a), *dy_ = dtensor(&ad, dy), *dout = dalloc(CNT * 4);
            for (int k = 0; k < 3; k++) {
                dsrt_k_desc bp = bds[k];
                bp.nhwc = 0;
                memcpy(br, bs[k], count_of(&bp) * 4);
                round_to_type(&bp, br);
                for (size_t i = 0; i < CNT; i++)
                    want[i] = ar[i] * br[k == 0 ? i : k == 1 ? i / hw : i / hw % C];
                float *wl = hmalloc(CNT * 4);
                to_layout(&ad, want, wl);
                void *db = dtensor(&bds[k], bs[k]);
                LAUNCH(dsrt_k_mul(&ad, da, &bds[k], db, dout, S));
                CHECK_EQ(check_tensor("mul", &ad, dout, wl, 0), 0);
                CU(cudaFree(db));
                free(wl);
            }
            /* The gate's gradient. */
            float *dyr = hmalloc(CNT * 4), gw[N * C];
            memcpy(dyr, dy, CNT * 4);
            round_to_type(&plain, dyr);
            for (int q = 0; q < N * C; q++) {
                double sum = 0;
                for (size_t k = 0; k < hw; k++) sum += (double)dyr[q * hw + k] * ar[q * hw + k];
                gw[q] = (float)sum;
            }
            void *dg = dalloc(N * C * 4);
            LAUNCH(dsrt_k_mul_grad(&ad, dy_, da, &bds[1], dg, S));
            if (t == DSRT_K_F32) {
                float got[N * C];
                get(got, dg, sizeof got);
                CHECK_EQ(mismatches("gate gradient", got, gw, N * C, 1e-6, 1e-7), 0);
            }
            /* The channel sums, over x and over (x - mean) rstd. */
            float *work = dalloc(dsrt_kb_bn_work(&ad) * 4), *ds = dalloc(C * 4),
                  *dh = dalloc(C * 4);
            float *dmean = dcopy(mean, sizeof mean), *drstd = dcopy(rstd, sizeof rstd);
            for (int stats = 0; stats < 2; stats++) {
                LAUNCH(dsrt_k_chan_grads(&ad, da, dy_, stats ? dmean : NULL, stats ? drstd : NULL,
                                         ds, dh, work, S));
                float gs[C], gh[C];
                get(gs, ds, sizeof gs);
                get(gh, dh, sizeof gh);
                int bad = 0;
                for (int c = 0; c < C; c++) {
                    double s1 = 0, s2 = 0, a1 = 0, a2 = 0;
                    for (int r = 0; r < ROWS; r++) {
                        size_t i = ((size_t)(r / hw) * C + c) * hw + r % hw;
                        double v = stats ? ((double)ar[i] - mean[r]) * rstd[r] : ar[i];
                        s1 += dyr[i], a1 += fabs(dyr[i]);
                        s2 += dyr[i] * v, a2 += fabs(dyr[i] * v);
                    }
                    bad += fabs(gh[c] - s1) > 1e-5 * a1 || fabs(gs[c] - s2) > 1e-5 * a2;
                }
                CHECK_EQ(bad, 0);
            }
            CU(cudaFree(da));
            CU(cudaFree(dy_));
            CU(cudaFree(dout));
            CU(cudaFree(dg));
            CU(cudaFree(work));
            CU(cudaFree(ds));
            CU(cudaFree(dh));
            CU(cudaFree(dmean));
            CU(cudaFree(drstd));
            free(dyr);
        }
    dsrt_k_desc ad = {N, C, H, W, 1, DSRT_K_F32}, bad = {N, C + 1, 1, 1, 1, DSRT_K_F32};
    CHECK_EQ(dsrt_k_mul(&ad, NULL, &bad, NULL, NULL, S), cudaErrorInvalidValue);
    CHECK_EQ(dsrt_k_chan_grads(&ad, NULL, NULL, mean, NULL, NULL, NULL, NULL, S),
             cudaErrorInvalidValue);
    free(a), free(b), free(dy), free(want), free(ar), free(br);
}

/* Layer normalisation over 40 channels (two lanes' worth and more) of each
 * pixel, both layouts: the output, the kept statistics and the input
 * gradient against the formulas in double (1e-5). */
static void test_layernorm(void) {
    enum { N = 2, C = 40, H = 3, W = 5, CNT = N * C * H * W, ROWS = N * H * W };
    float x[CNT], dy[CNT], gamma[C], beta[C], y[CNT], dx[CNT], mean[ROWS], rstd[ROWS];
    fill_uniform(x, CNT, 8, -3, 3);
    fill_uniform(dy, CNT, 9, -1, 1);
    fill_uniform(gamma, C, 10, 0.5f, 1.5f);
    fill_uniform(beta, C, 11, -0.5f, 0.5f);
    const double eps = 1e-3;
    size_t hw = (size_t)H * W;
    for (int r = 0; r < ROWS; r++) {
        size_t q = (size_t)r / hw, k = (size_t)r % hw;
        double m = 0, v = 0, sg = 0, sgx = 0;
        for (int c = 0; c < C; c++) m += x[(q * C + c) * hw + k];
        m /= C;
        for (int c = 0; c < C; c++) v += pow(x[(q * C + c) * hw + k] - m, 2);
        double rs = 1 / sqrt(v / C + eps);
        mean[r] = (float)m, rstd[r] = (float)rs;
        for (int c = 0; c < C; c++) {
            size_t i = (q * C + c) * hw + k;
            y[i] = (float)((x[i] - m) * rs * gamma[c] + beta[c]);
            double g = (double)dy[i] * gamma[c];
            sg += g, sgx += g * (x[i] - m) * rs;
        }
        for (int c = 0; c < C; c++) {
            size_t i = (q * C + c) * hw + k;
            double g = (double)dy[i] * gamma[c];
            dx[i] = (float)(rs * (g - sg / C - (x[i] - m) * rs * sgx / C));
        }
    }
    float *dg = dcopy(gamma, sizeof gamma), *db = dcopy(beta, sizeof beta);
    float *dm = dalloc(sizeof mean), *dr = dalloc(sizeof rstd);
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        dsrt_k_desc d = {N, C, H, W, nhwc, DSRT_K_F32};
        void *dxx = dtensor(&d, x), *ddy = dtensor(&d, dy), *dout = dalloc(CNT * 4),
             *ddx = dalloc(CNT * 4);
        float wl[CNT], got[ROWS];
        LAUNCH(dsrt_k_ln_fwd(&d, dxx, dg, db, (float)eps, dout, dm, dr, S));
        to_layout(&d, y, wl);
        CHECK_EQ(check_tensor("layernorm", &d, dout, wl, 1e-5), 0);
        get(got, dr, sizeof got);
        CHECK_EQ(mismatches("layernorm rstd", got, rstd, ROWS, 1e-6, 0), 0);
        LAUNCH(dsrt_k_ln_bwd(&d, dxx, ddy, dg, dm, dr, ddx, S));
        to_layout(&d, dx, wl);
        CHECK_EQ(check_tensor("layernorm backward", &d, ddx, wl, 1e-4), 0);
        CU(cudaFree(dxx));
        CU(cudaFree(ddy));
        CU(cudaFree(dout));
        CU(cudaFree(ddx));
    }
    dsrt_k_desc d = {N, C, H, W, 1, DSRT_K_F32};
    CHECK_EQ(dsrt_k_ln_fwd(&d, NULL, dg, NULL, 1e-3f, NULL, NULL, NULL, S), cudaErrorInvalidValue);
    CHECK_EQ(dsrt_k_ln_bwd(&d, NULL, NULL, dg, NULL, dr, NULL, S), cudaErrorInvalidValue);
    CU(cudaFree(dg));
    CU(cudaFree(db));
    CU(cudaFree(dm));
    CU(cudaFree(dr));
}

/* Stochastic depth: every value of an image times the reference draw of
 * its factor, bit for bit, in either layout and type, the step also read
 * from device memory. */
static void test_drop_path(void) {
    enum { N = 11, C = 3, H = 4, W = 5, PER = C * H * W, CNT = N * PER };
    float x[CNT], m[N], want[CNT], wl[CNT];
    fill_uniform(x, CNT, 12, -2, 2);
    uint64_t iter = 7000000000ULL;
    ref_drop_path_mask(m, N, 99, iter, 4, 0.35f);
    for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++)
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            dsrt_k_desc d = {N, C, H, W, nhwc, (dsrt_k_type)t}, plain = d;
            plain.nhwc = 0;
            float xs[CNT];
            memcpy(xs, x, sizeof x);
            round_to_type(&plain, xs);
            for (int i = 0; i < CNT; i++) want[i] = xs[i] * m[i / PER];
            to_layout(&d, want, wl);
            void *dx = dtensor(&d, x), *dy = dalloc(bytes_of(&d));
            LAUNCH(dsrt_k_drop_path(&d, dx, dy, 99, iter, NULL, 4, 0.35f, S));
            CHECK_EQ(check_tensor("stochastic depth", &d, dy, wl, 0), 0);
            uint64_t *dit = dcopy(&iter, sizeof iter);
            LAUNCH(dsrt_k_drop_path(&d, dx, dx, 99, 0, dit, 4, 0.35f, S));
            CHECK_EQ(check_tensor("stochastic depth, step on the device", &d, dx, wl, 0), 0);
            CU(cudaFree(dit));
            CU(cudaFree(dx));
            CU(cudaFree(dy));
        }
    dsrt_k_desc d = {N, C, H, W, 0, DSRT_K_F32};
    CHECK_EQ(dsrt_k_drop_path(&d, NULL, NULL, 1, 1, NULL, 1, 1.0f, S), cudaErrorInvalidValue);
}

/* ceil=1's partial last windows: an average counting the padding divides
 * each window's sum by its part inside the padded image (PyTorch's), the
 * backward likewise, both layouts, against plain references (1e-6). */
static void test_pool_ceil(void) {
    enum { N = 2, C = 3, H = 6, W = 7, CNT = N * C * H * W };
    /* 3x3 windows, stride 2, padding 1 top and left, 0 bottom, 1 right:
     * 6 -> 3 rows (the floor's 2), 7 -> 4 columns (the floor's 3). */
    const int kh = 3, kw = 3, s = 2, pt = 1, pl = 1, pb = 0, pr = 1, oh = 3, ow = 4;
    enum { OCNT = N * C * 3 * 4 };
    float x[CNT], dy[OCNT], y[OCNT], dx[CNT], wl[CNT];
    fill_uniform(x, CNT, 13, -2, 2);
    fill_uniform(dy, OCNT, 14, -1, 1);
    memset(dx, 0, sizeof dx);
    for (int q = 0; q < N * C; q++)
        for (int a = 0; a < oh; a++)
            for (int b = 0; b < ow; b++) {
                int r0 = a * s - pt, c0 = b * s - pl;
                int r1 = DSRT_MIN(r0 + kh, H + pb), c1 = DSRT_MIN(c0 + kw, W + pr);
                float area = (float)((r1 - r0) * (c1 - c0)), sum = 0;
                for (int r = DSRT_MAX(r0, 0); r < DSRT_MIN(r1, H); r++)
                    for (int c = DSRT_MAX(c0, 0); c < DSRT_MIN(c1, W); c++)
                        sum += x[(q * H + r) * W + c];
                y[(q * oh + a) * ow + b] = sum / area;
                for (int r = DSRT_MAX(r0, 0); r < DSRT_MIN(r1, H); r++)
                    for (int c = DSRT_MAX(c0, 0); c < DSRT_MIN(c1, W); c++)
                        dx[(q * H + r) * W + c] += dy[(q * oh + a) * ow + b] / area;
            }
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        dsrt_k_pool p = {{N, C, H, W, nhwc, DSRT_K_F32},
                         {N, C, oh, ow, nhwc, DSRT_K_F32},
                         kh,
                         kw,
                         s,
                         s,
                         pt,
                         pl,
                         DSRT_K_POOL_AVG_PADDED,
                         pb,
                         pr};
        void *dxx = dtensor(&p.xd, x), *dyy = dtensor(&p.yd, dy), *dout = dalloc(OCNT * 4),
             *ddx = dalloc(CNT * 4);
        LAUNCH(dsrt_k_pool_fwd(&p, dxx, dout, NULL, S));
        to_layout(&p.yd, y, wl);
        CHECK_EQ(check_tensor("pooling, ceil=1", &p.yd, dout, wl, 1e-6), 0);
        LAUNCH(dsrt_k_pool_bwd(&p, dxx, NULL, dyy, ddx, S));
        to_layout(&p.xd, dx, wl);
        CHECK_EQ(check_tensor("pooling backward, ceil=1", &p.xd, ddx, wl, 1e-6), 0);
        CU(cudaFree(dxx));
        CU(cudaFree(dyy));
        CU(cudaFree(dout));
        CU(cudaFree(ddx));
    }
}

int main(void) {
    int skip = gpu_skip();
    if (skip) return skip;
    /* A blocking stream: its kernels wait for the copies and memsets that the
     * tests issue on the default stream. */
    CU(cudaStreamCreate(&S));
    RUN_WANTED(test_input_u8);
    RUN_WANTED(test_input_f32);
    RUN_WANTED(test_pad);
    RUN_WANTED(test_relu);
    RUN_WANTED(test_activations);
    RUN_WANTED(test_bias);
    RUN_WANTED(test_pool);
    RUN_WANTED(test_lrn);
    RUN_WANTED(test_conv);
    RUN_WANTED(test_dropout);
    RUN_WANTED(test_bn_sync);
    RUN_WANTED(test_softmax);
    RUN_WANTED(test_optimizer);
    RUN_WANTED(test_convert);
    RUN_WANTED(test_products);
    RUN_WANTED(test_layernorm);
    RUN_WANTED(test_drop_path);
    RUN_WANTED(test_pool_ceil);
    CU(cudaStreamDestroy(S));
    return TEST_RESULT();
}

/*
 * The GPU backend's kernels, their very bodies (nn/kernels_body.h, the
 * kinds' nn/layers/<kind>_kernels.h) run on the host by their host runs
 * (dsrt_kh_*, nn/kernels.h), against the CPU backend: on every machine, so
 * that the kernels' arithmetic is tested where no GPU is. What stays for a
 * device (test_gpu_kernels) is the launch configuration and where memory
 * lives.
 *
 * Against the CPU backend itself: the input stage from uint8 NHWC (the
 * backend's own conversion and its input layer's normalisation, bit for
 * bit), dropout (the CPU net's dropout layer, bit for bit, NCHW and NHWC),
 * softmax with cross-entropy (the CPU net's probabilities and loss within
 * 1e-6 relative: the warp sums the exponentials in another order; the
 * correct count exactly), synchronised batchnorm's sums (those the CPU net
 * hands its hook, within 1e-6 of the sums of absolute values: float tiles
 * with compensated sums, added in double) and running
 * statistics (the CPU net's, bit for bit), and the optimizer for every
 * solver and gradient-threshold method (dsrt_optimizer_step: bit for bit
 * without norm clipping, within 1e-5 relative with it: the norms are summed
 * in double in another order). Against plain references (tests/nnref.h,
 * the CPU backend's formulas written out): the batchnorm backward sums and
 * input gradient, padding and cropping in every layout and type, ReLU, the
 * bias with the ReLU after it and the bias gradient with the ReLU's backward
 * folded in (NHWC, both types), pooling and local response normalisation
 * (forward against the CPU net's layers, backward against references, both
 * layouts and types), bfloat16 conversions, and the per-step scalars read
 * from memory (dropout's step, the optimizer's scalars, the loss gradient's
 * scale). The activations against tests/actref.h (both types, the kinks
 * and their neighbours: float32 within 4e-6 relative plus 2e-7 max(1,
 * |x|), bfloat16 within 2^-8 relative plus that). Reductions give the same
 * bits run to run. Where the C compiler may fuse multiplies
 * and adds in the CPU code (__FMA__), the bit-for-bit checks allow 1e-6.
 */
#include "actref.h"
#include "kernelcheck.h"
#include "nn/act_kernel.h"
#include "nn/internal.h"
#include "nn/kernels.h"
#include "nn/layers/batchnorm_kernels.h"
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

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void *zalloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    REQUIRE(p);
    return p;
}

static dsrt_net *cpu_net(const char *desc, int h, int w, int c, int classes) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    o.seed = 17;
    o.fuse = 1; /* the ReLUs folded; each layer's output kept at inference */
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, desc, h, w, c, classes, &o);
    if (rc) fprintf(stderr, "dsrt_net_create: %s\n", dsrt_last_error());
    REQUIRE(net);
    return net;
}

/* Copies every element between NCHW floats and a tensor of d (its layout
 * and type; bf16 rounded): into the tensor t with to_t, else out of it. */
static void convert(const dsrt_k_desc *d, float *nchw, void *t, int to_t) {
    dsrt_k_desc plain = *d;
    plain.nhwc = 0;
    for (int b = 0; b < d->n; b++)
        for (int c = 0; c < d->c; c++)
            for (int h = 0; h < d->h; h++)
                for (int w = 0; w < d->w; w++) {
                    size_t i = at(&plain, b, c, h, w), j = at(d, b, c, h, w);
                    if (to_t)
                        dsrt_kb_store(t, d->type, j, nchw[i]);
                    else
                        nchw[i] = dsrt_kb_load(t, d->type, j);
                }
}

static void *to_tensor(const dsrt_k_desc *d, const float *nchw) {
    void *t = zalloc(dsrt_kb_count(d) * (d->type == DSRT_K_BF16 ? 2 : 4));
    convert(d, (float *)nchw, t, 1);
    return t;
}

static float *to_nchw(const dsrt_k_desc *d, const void *t) {
    float *out = zalloc(dsrt_kb_count(d) * sizeof(float));
    convert(d, out, (void *)t, 0);
    return out;
}

// ----------------------------------------------------------------------------
// The input stage

/* uint8 NHWC batches through the kernel: (x - sub) / div as the CPU
 * backend converts them, then the input layer's normalisation as the CPU
 * net's input layer computes it. */
static void test_staging(void) {
    enum { N = 3, C = 3, H = 7, W = 9, CNT = N * C * H * W };
    uint8_t px[CNT];
    dsrt_rng r = dsrt_rng_init(31, 0, 0, 0);
    for (int i = 0; i < CNT; i++) px[i] = (uint8_t)dsrt_rng_below(&r, 256);
    const float sub[4] = {120, 110.5f, 100, 0}, div[4] = {60, 50, 41.7f, 1};
    const float unit_sub[4] = {0, 0, 0, 0}, unit_div[4] = {255, 255, 255, 255};
    float want[CNT], *got;
    for (int z = 0; z < 2; z++) {
        const float *s = z ? sub : unit_sub, *d = z ? div : unit_div;
        dsrt__batch_u8_to_f32(px, want, N, C, H, W, s, d);
        dsrt_k_pixel pix;
        memcpy(pix.sub, s, sizeof pix.sub);
        memcpy(pix.div, d, sizeof pix.div);
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            dsrt_k_desc yd = {N, C, H, W, nhwc, DSRT_K_F32};
            void *y = zalloc(CNT * sizeof(float));
            CHECK_OK(dsrt_kh_input_u8(px, &pix, DSRT_NORM_NONE, NULL, &yd, y));
            got = to_nchw(&yd, y);
            CHECK_EQ(mismatches("uint8 -> float", got, want, CNT, 0, 0), 0);
            free(got), free(y);
        }
    }
    /* The input layer's normalisations, as the CPU net's layer 0. */
    static const char *const norms[] = {
        "input normalization=zerocenter mean=0.5,0.45,0.4\nfc outputs=2\nsoftmax\n",
        "input normalization=zscore mean=0.5,0.45,0.4 std=0.25,0.2,0.3\nfc outputs=2\nsoftmax\n",
        "input normalization=rescale min=0,0.1,0 max=1,0.9,1\nfc outputs=2\nsoftmax\n",
        "input normalization=rescale-symmetric min=0,0.1,0 max=1,0.9,1\nfc outputs=2\nsoftmax\n"};
    dsrt__batch_u8_to_f32(px, want, N, C, H, W, unit_sub, unit_div);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(norms); k++) {
        dsrt_net *net = cpu_net(norms[k], H, W, C, 2);
        CHECK_OK(dsrt__net_forward(net, want, N, 0, NULL, NULL, NULL, NULL));
        float cpu[CNT];
        CHECK_OK(dsrt__net_layer_output(net, 0, cpu, 0));
        const dsrt_layer *L = &net->layers[0];
        dsrt_k_pixel pix;
        memcpy(pix.sub, unit_sub, sizeof pix.sub);
        memcpy(pix.div, unit_div, sizeof pix.div);
        dsrt_k_desc yd = {N, C, H, W, 0, DSRT_K_F32};
        float y[CNT];
        CHECK_OK(
            dsrt_kh_input_u8(px, &pix, L->o.norm, dsrt_net_state(net, NULL) + L->s_off, &yd, y));
        CHECK_EQ(mismatches("normalised input", y, cpu, CNT, FUSED_TOL, 0), 0);
        /* And from floats. */
        CHECK_OK(dsrt_kh_input_f32(want, L->o.norm, dsrt_net_state(net, NULL) + L->s_off, &yd, y));
        CHECK_EQ(mismatches("normalised float input", y, cpu, CNT, FUSED_TOL, 0), 0);
        dsrt_net_destroy(net);
    }
    /* Refused as the device refuses: five channels, a norm without state. */
    dsrt_k_pixel pix = {{0}, {1, 1, 1, 1}};
    dsrt_k_desc wide = {1, 5, 2, 2, 0, DSRT_K_F32}, d3 = {1, 3, 2, 2, 0, DSRT_K_F32};
    float y[20];
    CHECK_EQ(dsrt_kh_input_u8(px, &pix, DSRT_NORM_NONE, NULL, &wide, y), -EINVAL);
    CHECK_EQ(dsrt_kh_input_u8(px, &pix, DSRT_NORM_ZSCORE, NULL, &d3, y), -EINVAL);
}

// ----------------------------------------------------------------------------
// Dropout

/* The CPU net's dropout layer in training: the kernel on its input gives
 * its output, in either layout. */
static void test_dropout(void) {
    const char *desc =
        "input\nconv filters=5 size=3 pad=1\ndropout p=0.35\nfc outputs=3\nsoftmax\n";
    enum { N = 3, C = 5, H = 6, W = 7, CNT = N * C * H * W };
    dsrt_net *net = cpu_net(desc, H, W, 2, 3);
    float x[N * 2 * H * W];
    int32_t labels[N] = {0, 1, 2};
    dsrt_rng r = dsrt_rng_init(32, 0, 0, 0);
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(x); i++) x[i] = uniform(&r, -1, 1);
    for (int64_t it = 41; it < 44; it++) {
        dsrt_net_set_iteration(net, it);
        CHECK_OK(dsrt_net_forward_backward(net, x, labels, N, NULL, NULL));
        float in[CNT], out[CNT];
        CHECK_OK(dsrt__net_layer_output(net, 1, in, 1));
        CHECK_OK(dsrt__net_layer_output(net, 2, out, 1));
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            dsrt_k_desc d = {N, C, H, W, nhwc, DSRT_K_F32};
            void *t = to_tensor(&d, in);
            CHECK_OK(dsrt_kh_dropout(&d, t, t, 17, (uint64_t)it, NULL, 2, 0.35f));
            float *got = to_nchw(&d, t);
            CHECK_EQ(mismatches("dropout", got, out, CNT, 0, 0), 0);
            free(got), free(t);
            /* The step read from (device) memory instead: the same masks. */
            uint64_t step = (uint64_t)it;
            t = to_tensor(&d, in);
            CHECK_OK(dsrt_kh_dropout(&d, t, t, 17, 0, &step, 2, 0.35f));
            got = to_nchw(&d, t);
            CHECK_EQ(mismatches("dropout, step in memory", got, out, CNT, 0, 0), 0);
            free(got), free(t);
        }
    }
    /* The mask itself, and p = 1 refused. */
    float ones[CNT], m[CNT];
    for (int i = 0; i < CNT; i++) ones[i] = 1.0f;
    dsrt_k_desc d = {N, C, H, W, 0, DSRT_K_F32};
    CHECK_OK(dsrt_kh_dropout(&d, ones, ones, 9, 10, NULL, 11, 0.25f));
    ref_dropout_mask(m, CNT, 9, 10, 11, 0.25f);
    CHECK_EQ(mismatches("mask", ones, m, CNT, 0, 0), 0);
    CHECK_EQ(dsrt_kh_dropout(&d, ones, ones, 9, 10, NULL, 11, 1.0f), -EINVAL);
    dsrt_net_destroy(net);
}

// ----------------------------------------------------------------------------
// Softmax and cross-entropy

/* The CPU net "input, softmax" on logits z: its probabilities, loss and
 * correct count against the kernel's. */
static void softmax_case(const char *what, const float *z, const int32_t *labels, int n, int k) {
    char desc[64];
    snprintf(desc, sizeof desc, "input size=1x1x%d\nsoftmax\n", k);
    dsrt_net *net = cpu_net(desc, 0, 0, 0, k);
    size_t cnt = (size_t)n * k;
    float *pc = zalloc(cnt * 4), *pk = zalloc(cnt * 4), *dz = zalloc(cnt * 4),
          *want = zalloc(cnt * 4);
    double lc = 0, lk = 0, lk2 = 0;
    int cc = 0;
    int32_t ck = 0, ck2 = 0;
    CHECK_OK(dsrt__net_forward(net, z, n, 0, labels, &lc, &cc, pc));
    void *work = zalloc(dsrt_kb_softmax_work(n));
    CHECK_OK(dsrt_kh_softmax_xent_fwd(z, DSRT_K_F32, labels, NULL, n, k, pk, &lk, &ck, work));
    CHECK_EQ(mismatches(what, pk, pc, cnt, 1e-6, 1e-30), 0);
    CHECK_EQ(ck, cc);
    if (isnan(lc))
        CHECK(isnan(lk));
    else
        CHECK_NEAR(lk, lc, 1e-12 * fabs(lc) + 1e-15);
    /* Run to run, the same bits. */
    CHECK_OK(dsrt_kh_softmax_xent_fwd(z, DSRT_K_F32, labels, NULL, n, k, pk, &lk2, &ck2, work));
    CHECK(memcmp(&lk, &lk2, sizeof lk) == 0 && ck == ck2);
    /* Backward from these probabilities, as the CPU rounds it. */
    float scale = 1.0f / n;
    for (size_t i = 0; i < cnt; i++) want[i] = pk[i] * scale;
    for (int b = 0; b < n; b++) want[(size_t)b * k + labels[b]] -= scale;
    CHECK_OK(dsrt_kh_softmax_xent_bwd(pk, labels, NULL, NULL, n, k, scale, NULL, dz, DSRT_K_F32));
    CHECK_EQ(mismatches("softmax backward", dz, want, cnt, FUSED_TOL, 0), 0);
    /* bfloat16 logits and gradient: the logits as bf16 holds them give the
     * same bits as those values in float; the gradient is the float one
     * rounded once, with the scale read from memory. */
    dsrt_k_desc bd = {1, 1, 1, (int)cnt, 0, DSRT_K_BF16}, fd = bd;
    fd.type = DSRT_K_F32;
    void *z16 = to_tensor(&bd, z), *dz16 = zalloc(cnt * 2);
    float *zr = to_nchw(&bd, z16), *p16 = zalloc(cnt * 4), *pr = zalloc(cnt * 4);
    double l16 = 0, lr = 0;
    int32_t c16 = 0, cr = 0;
    CHECK_OK(dsrt_kh_softmax_xent_fwd(z16, DSRT_K_BF16, labels, NULL, n, k, p16, &l16, &c16, work));
    CHECK_OK(dsrt_kh_softmax_xent_fwd(zr, DSRT_K_F32, labels, NULL, n, k, pr, &lr, &cr, work));
    CHECK(memcmp(p16, pr, cnt * 4) == 0 && c16 == cr && (memcmp(&l16, &lr, 8) == 0 || isnan(lr)));
    CHECK_OK(
        dsrt_kh_softmax_xent_bwd(pr, labels, NULL, NULL, n, k, 0.0f, &scale, dz16, DSRT_K_BF16));
    CHECK_OK(dsrt_kh_softmax_xent_bwd(pr, labels, NULL, NULL, n, k, scale, NULL, dz, DSRT_K_F32));
    float *got16 = to_nchw(&bd, dz16);
    void *dzr = to_tensor(&bd, dz);
    float *want16 = to_nchw(&bd, dzr);
    CHECK_EQ(mismatches("softmax backward, bf16", got16, want16, cnt, 0, 0), 0);
    (void)fd;
    free(z16), free(dz16), free(zr), free(p16), free(pr), free(got16), free(dzr), free(want16);
    free(pc), free(pk), free(dz), free(want), free(work);
    dsrt_net_destroy(net);
}

static void test_softmax(void) {
    const int shapes[][2] = {{37, 10}, {5, 1000}, {256, 33}, {300, 2}, {1, 1}};
    for (size_t s = 0; s < DSRT_ARRAY_SIZE(shapes); s++) {
        int n = shapes[s][0], k = shapes[s][1];
        float *z = zalloc((size_t)n * k * 4);
        int32_t *labels = zalloc((size_t)n * 4);
        dsrt_rng r = dsrt_rng_init(33, s, 0, 0);
        for (size_t i = 0; i < (size_t)n * k; i++) z[i] = uniform(&r, -8, 8);
        for (int b = 0; b < n; b++) {
            labels[b] = (int32_t)dsrt_rng_below(&r, (uint64_t)k);
            /* Ties: the first maximum counts. */
            if (k > 40 && b % 3 == 0) z[(size_t)b * k + 39] = z[(size_t)b * k + 3] = 20.0f;
            if (k > 40 && b % 3 == 0) labels[b] = b % 2 ? 3 : 39;
        }
        char what[64];
        snprintf(what, sizeof what, "softmax %dx%d", n, k);
        softmax_case(what, z, labels, n, k);
        free(z), free(labels);
    }
    /* Non-finite logits: NaN first (kept as the maximum), NaN later, +inf. */
    float z[3 * 3] = {NAN, 1, 2, 1, NAN, 3, 0, INFINITY, 1};
    int32_t labels[3] = {0, 2, 1};
    for (int row = 0; row < 3; row++) {
        char what[64];
        snprintf(what, sizeof what, "softmax non-finite row %d", row);
        softmax_case(what, z + 3 * row, labels + row, 1, 3);
    }
    float pr[3];
    CHECK_EQ(dsrt_kh_softmax_xent_fwd(z, DSRT_K_F32, labels, NULL, 1, 0, pr, NULL, NULL, pr),
             -EINVAL);
}

// ----------------------------------------------------------------------------
// Synchronised batch normalisation

/* The sums the CPU net hands its hook for its batchnorm layer. */
typedef struct {
    double fwd[65], bwd[64];
    int c, calls;
} bn_capture;

static int capture(void *ctx, dsrt_bn_sums *s) {
    bn_capture *k = ctx;
    k->c = s->channels;
    memcpy(s->backward ? k->bwd : k->fwd, s->sums, s->n * sizeof(double));
    k->calls++;
    return 0;
}

static void test_bn_sync(void) {
    const char *desc = "input\nconv filters=6 size=3 pad=1 bias=0\nbatchnorm momentum=0.3\nrelu\n"
                       "fc outputs=3\nsoftmax\n";
    enum { N = 5, C = 6, H = 7, W = 9, HW = H * W, CNT = N * C * HW };
    dsrt_net *net = cpu_net(desc, H, W, 2, 3);
    bn_capture cap;
    memset(&cap, 0, sizeof cap);
    CHECK_OK(dsrt_net_set_bn_sync(net, capture, &cap));
    float x[N * 2 * HW], in[CNT];
    int32_t labels[N] = {0, 1, 2, 0, 1};
    dsrt_rng r = dsrt_rng_init(34, 0, 0, 0);
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(x); i++) x[i] = uniform(&r, -1, 1);
    const dsrt_layer *L = &net->layers[2];
    REQUIRE(L->kind == DSRT_LAYER_BATCHNORM);
    size_t ns;
    float run0[2 * C];
    memcpy(run0, dsrt_net_state(net, &ns) + L->s_off, sizeof run0);
    CHECK_OK(dsrt_net_forward_backward(net, x, labels, N, NULL, NULL));
    CHECK_EQ(cap.calls, 2);
    CHECK_OK(dsrt__net_layer_output(net, 1, in, 1));
    /* Forward sums, against the CPU's. */
    double sums[2 * C + 1], sums2[2 * C + 1], scale[2 * C + 1];
    const dsrt_k_desc xd = {N, C, H, W, 0, DSRT_K_F32};
    float *work = zalloc(dsrt_kb_bn_work(&xd) * sizeof(float));
    CHECK_OK(dsrt_kh_bn_sums(&xd, in, sums, work));
    memset(scale, 0, sizeof scale);
    for (int ch = 0; ch < C; ch++)
        for (int b = 0; b < N; b++)
            for (int k = 0; k < HW; k++) {
                double v = in[((size_t)b * C + ch) * HW + k];
                scale[ch] += fabs(v);
                scale[C + ch] += v * v;
            }
    scale[2 * C] = 1;
    int bad = 0;
    for (int i = 0; i <= 2 * C; i++)
        if (!(fabs(sums[i] - cap.fwd[i]) <= 1e-6 * scale[i]) && bad++ < 5)
            fprintf(stderr, "  bn sums[%d]: got %.17g, want %.17g\n", i, sums[i], cap.fwd[i]);
    CHECK_EQ(bad, 0);
    CHECK_OK(dsrt_kh_bn_sums(&xd, in, sums2, work));
    CHECK(memcmp(sums, sums2, sizeof sums) == 0);
    /* Statistics and running averages from the CPU's sums, as the CPU net
     * updated its state. */
    float mean[C], var[C], inv[C], run[2 * C];
    memcpy(run, run0, sizeof run);
    CHECK_OK(dsrt_kh_bn_stats(cap.fwd, C, L->o.eps, L->o.momentum, mean, var, inv, run, run + C));
    CHECK_EQ(mismatches("running statistics", run, dsrt_net_state(net, NULL) + L->s_off, 2 * C,
                        FUSED_TOL, 0),
             0);
    float rm[C], rv[C], m2[C], v2[C], i2[C];
    memcpy(rm, run0, sizeof rm);
    memcpy(rv, run0 + C, sizeof rv);
    ref_bn_stats(cap.fwd, C, L->o.eps, L->o.momentum, m2, v2, i2, rm, rv);
    CHECK_EQ(mismatches("mean", mean, m2, C, 0, 0), 0);
    CHECK_EQ(mismatches("variance", var, v2, C, 0, 0), 0);
    CHECK_EQ(mismatches("inverse deviation", inv, i2, C, 0, 0), 0);
    /* The normalised output with the fused ReLU: the CPU net's layer 2
     * (within 1e-6: oneDNN normalises in float), in both layouts; then at
     * inference from the running statistics. */
    {
        float out[CNT], got[CNT];
        const float *params = dsrt_net_params(net, NULL);
        const float *scale = params + L->w_off, *shift = params + L->b_off;
        CHECK_OK(dsrt__net_layer_output(net, 2, out, 1));
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            dsrt_k_desc d = {N, C, H, W, nhwc, DSRT_K_F32};
            void *tx = to_tensor(&d, in), *ty = zalloc(CNT * 4);
            CHECK_OK(dsrt_kh_bn_apply(&d, tx, mean, inv, NULL, 0, scale, shift, 1, 0.0f, ty));
            float *g = to_nchw(&d, ty);
            CHECK_EQ(mismatches("bn output", g, out, CNT, 1e-6, 1e-6), 0);
            free(tx), free(ty), free(g);
        }
        CHECK_OK(dsrt__net_forward(net, x, N, 0, NULL, NULL, NULL, NULL));
        float in2[CNT];
        CHECK_OK(dsrt__net_layer_output(net, 1, in2, 0));
        CHECK_OK(dsrt__net_layer_output(net, 2, out, 0));
        const float *st = dsrt_net_state(net, NULL) + L->s_off;
        CHECK_OK(
            dsrt_kh_bn_apply(&xd, in2, st, NULL, st + C, L->o.eps, scale, shift, 1, 0.0f, got));
        CHECK_EQ(mismatches("bn inference output", got, out, CNT, 1e-6, 1e-6), 0);
        CHECK_EQ(dsrt_kh_bn_apply(&xd, in2, st, NULL, NULL, 0, scale, shift, 0, 0, got), -EINVAL);
    }
    /* Backward sums and the input gradient, against the references. */
    float dy[CNT], dx[CNT], dxr[CNT], ds[C], dh[C], dsr[C], dhr[C], sc[C];
    for (int i = 0; i < CNT; i++) dy[i] = uniform(&r, -1, 1);
    for (int ch = 0; ch < C; ch++) sc[ch] = uniform(&r, 0.5f, 1.5f);
    double bs[2 * C], bsr[2 * C], count = cap.fwd[2 * C];
    CHECK_OK(dsrt_kh_bn_bwd_sums(&xd, in, dy, NULL, 0.0f, mean, inv, bs, ds, dh, work));
    ref_bn_bwd_sums(in, dy, mean, inv, N, C, HW, bsr, dsr, dhr);
    bad = 0;
    for (int i = 0; i < 2 * C; i++)
        if (!(fabs(bs[i] - bsr[i]) <= 1e-6 * (fabs(bsr[i]) + CNT)) && bad++ < 5)
            fprintf(stderr, "  bn backward sums[%d]: got %.17g, want %.17g\n", i, bs[i], bsr[i]);
    CHECK_EQ(bad, 0);
    CHECK_EQ(mismatches("dscale", ds, dsr, C, 1e-6, 1e-7), 0);
    CHECK_EQ(mismatches("dshift", dh, dhr, C, 1e-6, 1e-7), 0);
    CHECK_OK(dsrt_kh_bn_bwd_dx(&xd, in, dy, NULL, 0.0f, mean, inv, sc, bsr, &count, dx));
    ref_bn_bwd_dx(in, dy, mean, inv, sc, bsr, count, N, C, HW, dxr);
    CHECK_EQ(mismatches("bn input gradient", dx, dxr, CNT, 1e-6, 1e-7), 0);
    /* NHWC bfloat16 with a leaky ReLU folded into the backward: the sums
     * run over the same elements in the same order, so they equal those of
     * float NCHW on the rounded values with dy masked by hand, bit for bit;
     * the input gradient is the float one rounded. */
    const dsrt_k_desc hd = {N, C, H, W, 1, DSRT_K_BF16};
    void *x16 = to_tensor(&hd, in), *dy16 = to_tensor(&hd, dy), *dx16 = zalloc(CNT * 2);
    float yv[CNT], dym[CNT];
    for (int i = 0; i < CNT; i++) yv[i] = i % 3 ? uniform(&r, 0.1f, 1) : uniform(&r, -1, 0);
    void *y16 = to_tensor(&hd, yv);
    float *xr = to_nchw(&hd, x16), *dyr = to_nchw(&hd, dy16), *yr = to_nchw(&hd, y16);
    for (int i = 0; i < CNT; i++) dym[i] = yr[i] > 0 ? dyr[i] : dyr[i] * 0.2f;
    double s16[2 * C + 1], sf[2 * C + 1], b16[2 * C], bf[2 * C];
    CHECK_OK(dsrt_kh_bn_sums(&hd, x16, s16, work));
    CHECK_OK(dsrt_kh_bn_sums(&xd, xr, sf, work));
    CHECK(memcmp(s16, sf, sizeof s16) == 0);
    CHECK_OK(dsrt_kh_bn_bwd_sums(&hd, x16, dy16, y16, 0.2f, mean, inv, b16, NULL, NULL, work));
    CHECK_OK(dsrt_kh_bn_bwd_sums(&xd, xr, dym, NULL, 0.0f, mean, inv, bf, NULL, NULL, work));
    CHECK(memcmp(b16, bf, sizeof b16) == 0);
    CHECK_OK(dsrt_kh_bn_bwd_dx(&hd, x16, dy16, y16, 0.2f, mean, inv, sc, bf, &count, dx16));
    CHECK_OK(dsrt_kh_bn_bwd_dx(&xd, xr, dym, NULL, 0.0f, mean, inv, sc, bf, &count, dx));
    float *got16 = to_nchw(&hd, dx16);
    void *dxr16 = to_tensor(&hd, dx);
    float *want16 = to_nchw(&hd, dxr16);
    CHECK_EQ(mismatches("bn input gradient, nhwc bf16", got16, want16, CNT, 0, 0), 0);
    free(x16), free(dy16), free(dx16), free(y16), free(xr), free(dyr), free(yr), free(got16);
    free(dxr16), free(want16), free(work);
    dsrt_net_destroy(net);
}

// ----------------------------------------------------------------------------
// The optimizer

static void optim_case(dsrt_solver solver, int clip, double threshold) {
    dsrt_net *net = cpu_net(OPT_NET, 0, 0, 0, 3);
    size_t np = net->n_params, bytes = np * sizeof(float);
    dsrt_k_segment seg[16];
    int n_seg = dsrt_kb_net_segments(net, seg);
    dsrt_optimizer_options o = dsrt_optimizer_defaults(solver);
    o.l2 = 1e-3;
    o.schedule = DSRT_LR_PIECEWISE, o.drop_period = 1, o.drop_factor = 0.5;
    if (clip >= 0) o.clip = (dsrt_grad_clip)clip, o.grad_threshold = threshold;
    dsrt_optimizer *opt = NULL;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    uint32_t blocks;
    dsrt_k_optim ko = {seg, n_seg, 0, NULL};
    ko.work = zalloc(dsrt_kb_optim_layout(seg, n_seg, &blocks));
    ko.blocks = blocks;
    float *w = zalloc(bytes), *g = zalloc(bytes), *m = zalloc(bytes), *v = zalloc(bytes);
    float *w2 = zalloc(bytes), *g2 = zalloc(bytes), *m2 = zalloc(bytes), *v2 = zalloc(bytes);
    dsrt_bf16 *w16 = zalloc(np * 2);
    memcpy(w, net->params, bytes);
    memcpy(w2, net->params, bytes);
    int norm = clip == DSRT_CLIP_L2NORM || clip == DSRT_CLIP_GLOBAL_L2NORM;
    double rel = norm ? 1e-5 : FUSED_TOL, abs = norm ? 1e-8 : 0;
    for (int step = 0; step < 3; step++) {
        make_grads(g, np, seg, n_seg, 35, step);
        memcpy(net->grads, g, bytes);
        memcpy(g2, g, bytes);
        double lr = dsrt_optimizer_learn_rate(opt, step);
        CHECK_OK(dsrt_optimizer_step(opt, net, step));
        dsrt_k_step st;
        dsrt_kb_optim_step_params(&st, &o, lr, step + 1);
        float *b1 = solver == DSRT_SOLVER_ADAM ? v : NULL,
              *b2 = solver == DSRT_SOLVER_ADAM ? v2 : NULL;
        CHECK_OK(dsrt_kh_optim_update(&ko, &st, NULL, w, g, m, b1, w16));
        /* The scalars read from (device) memory: the same step. */
        dsrt_k_consts kc;
        memset(&kc, 0, sizeof kc);
        CHECK_OK(dsrt_kh_set_consts(&kc, &(dsrt_k_consts){st, 0, 0, 0}));
        CHECK_OK(dsrt_kh_optim_update(&ko, &st, &kc.step, w2, g2, m2, b2, NULL));
        CHECK_EQ(mismatches("weights", w, net->params, np, rel, abs), 0);
        CHECK_EQ(mismatches("clipped gradients", g, net->grads, np, rel, abs), 0);
        for (int b = 0; b < dsrt__optimizer_n_buffers(opt); b++)
            CHECK_EQ(mismatches("state", b ? v : m, dsrt__optimizer_buffer(opt, b), np, rel, abs),
                     0);
        CHECK_EQ(memcmp(w, w2, bytes), 0); /* run to run, with or without the bf16 copy */
        int bad16 = 0;
        for (size_t i = 0; i < np; i++) bad16 += w16[i] != dsrt_bf16_from_f32(w[i]);
        CHECK_EQ(bad16, 0);
    }
    free(w), free(g), free(m), free(v), free(w2), free(g2), free(m2), free(v2), free(w16);
    free(ko.work);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

static void test_optimizer(void) {
    for (size_t s = 0; s < DSRT_ARRAY_SIZE(OPT_SOLVERS); s++)
        for (size_t k = 0; k < DSRT_ARRAY_SIZE(OPT_CLIPS); k++)
            optim_case(OPT_SOLVERS[s], OPT_CLIPS[k].clip, OPT_CLIPS[k].threshold);
    dsrt_k_step st;
    memset(&st, 0, sizeof st);
    st.solver = DSRT_SOLVER_ADAM;
    float w;
    dsrt_k_optim ko = {NULL, 0, 0, NULL};
    CHECK_EQ(dsrt_kh_optim_update(&ko, &st, NULL, &w, &w, &w, NULL, NULL), -EINVAL);
}

// ----------------------------------------------------------------------------
// Biases, pooling, local response normalisation

/* A convolution's bias and ReLU over NHWC bfloat16 and NCHW float: the
 * channel of each element, the value rounded once; the bias gradient over
 * NHWC with the ReLU's backward folded in: dy masked in place and summed
 * per channel (within 1e-5 of the absolute sums, chunked so that every
 * chunk count and the cap are met), the same bits run to run. */
static void test_bias_grad(void) {
    const int shapes[][4] = {{3, 5, 7, 6}, {2, 1, 1, 33}, {4, 20, 20, 9}, {2, 200, 200, 3}};
    for (size_t sh = 0; sh < DSRT_ARRAY_SIZE(shapes); sh++) {
        int n = shapes[sh][0], h = shapes[sh][1], w = shapes[sh][2], c = shapes[sh][3];
        size_t cnt = (size_t)n * h * w * c;
        float *x = zalloc(cnt * 4), *dy = zalloc(cnt * 4), *want = zalloc(cnt * 4);
        float *bias = zalloc(c * 4), *db = zalloc(c * 4), *db2 = zalloc(c * 4);
        dsrt_rng r = dsrt_rng_init(38, sh, 0, 0);
        for (size_t i = 0; i < cnt; i++) x[i] = uniform(&r, -3, 3), dy[i] = uniform(&r, -1, 1);
        for (int k = 0; k < c; k++) bias[k] = uniform(&r, -1, 1);
        for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++)
            for (int nhwc = 0; nhwc < 2; nhwc++) {
                dsrt_k_desc d = {n, c, h, w, nhwc, (dsrt_k_type)t};
                void *tx = to_tensor(&d, x), *ty = zalloc(cnt * 4);
                float *xs = to_nchw(&d, tx);
                for (int b = 0; b < n; b++)
                    for (int k = 0; k < c; k++)
                        for (size_t p = 0; p < (size_t)h * w; p++) {
                            size_t i = ((size_t)b * c + k) * h * w + p;
                            float v = xs[i] + bias[k];
                            want[i] = v < 0 ? v * 0.1f : v;
                        }
                void *tw = to_tensor(&d, want);
                float *ws = to_nchw(&d, tw);
                const dsrt_k_act leaky = {DSRT_K_ACT_RELU, 0.1f, 0.0f};
                CHECK_OK(dsrt_kh_bias_act(&d, tx, bias, ty, &leaky));
                float *got = to_nchw(&d, ty);
                CHECK_EQ(mismatches("bias and relu", got, ws, cnt, FUSED_TOL, 0), 0);
                free(got), free(ws), free(tw), free(xs);
                if (!nhwc) {
                    if (h * w > 1) CHECK_EQ(dsrt_kh_bias_grad(&d, tx, NULL, 0, db, db), -EINVAL);
                    free(tx), free(ty);
                    continue;
                }
                /* The gradient behind a leaky ReLU of output y = x. */
                void *tdy = to_tensor(&d, dy), *work = zalloc(dsrt_kb_bias_grad_work(&d));
                float *dys = to_nchw(&d, tdy), *ys = to_nchw(&d, tx);
                for (size_t i = 0; i < cnt; i++) {
                    float v = ys[i] > 0 ? dys[i] : dys[i] * 0.1f;
                    want[i] = t == DSRT_K_BF16 ? dsrt_f32_from_bf16(dsrt_bf16_from_f32(v)) : v;
                }
                CHECK_OK(dsrt_kh_bias_grad(&d, tdy, tx, 0.1f, db, work));
                got = to_nchw(&d, tdy);
                CHECK_EQ(mismatches("masked gradient", got, want, cnt, 0, 0), 0);
                int bad = 0;
                for (int k = 0; k < c; k++) {
                    double s = 0, a = 0;
                    for (int b = 0; b < n; b++)
                        for (size_t p = 0; p < (size_t)h * w; p++) {
                            double v = want[((size_t)b * c + k) * h * w + p];
                            s += v, a += fabs(v);
                        }
                    if (!(fabs(db[k] - s) <= 1e-5 * a + 1e-30) && bad++ < 5)
                        fprintf(stderr, "  bias grad[%d]: got %.9g, want %.9g\n", k, db[k], s);
                }
                CHECK_EQ(bad, 0);
                /* Run to run, the same bits. */
                free(tdy);
                tdy = to_tensor(&d, dy);
                CHECK_OK(dsrt_kh_bias_grad(&d, tdy, tx, 0.1f, db2, work));
                CHECK(memcmp(db, db2, c * 4) == 0);
                free(got), free(dys), free(ys), free(tdy), free(work), free(tx), free(ty);
            }
        free(x), free(dy), free(want), free(bias), free(db), free(db2);
    }
}

/* The pooling kernel's arguments for pooling layer L over n images. */
static dsrt_k_pool pool_of(const dsrt_layer *L, int n, int oh, int ow, int nhwc, dsrt_k_type t,
                           int max) {
    dsrt_k_pool p = {{n, L->in.c, L->in.h, L->in.w, nhwc, t},
                     {n, L->in.c, oh, ow, nhwc, t},
                     L->o.kh,
                     L->o.kw,
                     L->o.sh,
                     L->o.sw,
                     L->pt,
                     L->pl,
                     max > 0   ? DSRT_K_POOL_MAX
                     : max < 0 ? DSRT_K_POOL_AVG_INSIDE
                               : DSRT_K_POOL_AVG,
                     L->pb,
                     L->pr};
    /* ceil=1 with a partial last window, averaging with the padding: the
     * window's part inside the padded image. */
    if (!max && L->kind == DSRT_LAYER_AVGPOOL &&
        ((oh - 1) * L->o.sh + L->o.kh > L->in.h + L->pt + L->pb ||
         (ow - 1) * L->o.sw + L->o.kw > L->in.w + L->pl + L->pr))
        p.mode = DSRT_K_POOL_AVG_PADDED;
    return p;
}

/* Average pooling's input gradient where each window's divisor is its part
 * inside the padded image (pb, pr at the bottom and the right: ceil=1's
 * partial windows, PyTorch's count_include_pad), over NCHW floats. */
static void ref_pool_bwd_padded(const float *dy, float *dx, int n, int c, int h, int w, int oh,
                                int ow, const dsrt_layer *L) {
    for (size_t i = 0; i < (size_t)n * c * h * w; i++) dx[i] = 0;
    for (int b = 0; b < n; b++)
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < oh; y++)
                for (int z = 0; z < ow; z++) {
                    int r0 = y * L->o.sh - L->pt, c0 = z * L->o.sw - L->pl;
                    int r1 = DSRT_MIN(r0 + L->o.kh, h + L->pb),
                        c1 = DSRT_MIN(c0 + L->o.kw, w + L->pr);
                    float area = (float)((r1 - r0) * (c1 - c0));
                    float g = dy[(((size_t)b * c + ch) * oh + y) * ow + z];
                    for (int ih = DSRT_MAX(r0, 0); ih < DSRT_MIN(r1, h); ih++)
                        for (int iw = DSRT_MAX(c0, 0); iw < DSRT_MIN(c1, w); iw++)
                            dx[(((size_t)b * c + ch) * h + ih) * w + iw] += g / area;
                }
}

/* The CPU net's pooling layers, forward (max exactly, average within 1e-6:
 * another order of sums), and the input gradient against the plain
 * reference, in float NCHW and NHWC and in bfloat16. ceil=1's partial last
 * windows included (averaging with the padding: PyTorch's divisors). */
static void test_pool(void) {
    static const struct {
        const char *layer;
        int max; /* 1 max, 0 average (padding counted), -1 average over the inside */
    } cases[] = {{"maxpool size=3 stride=2 pad=1", 1},
                 {"maxpool size=2 stride=1", 1},
                 {"avgpool size=3 stride=2 pad=1", 0},
                 {"avgpool size=3 stride=2 pad=1,0,0,1", 0},
                 {"avgpool size=3 stride=2 pad=1 count_pad=0", -1},
                 {"avgpool size=3 stride=2 pad=1,0,0,1 count_pad=0", -1},
                 {"maxpool size=3 stride=2 pad=0,1,1,0", 1},
                 {"maxpool size=3 stride=2 ceil=1", 1},
                 {"avgpool size=3 stride=2 pad=1 ceil=1", 0},
                 {"avgpool size=2 stride=2 pad=1,0,1,0 ceil=1", 0},
                 {"avgpool size=3 stride=2 ceil=1 count_pad=0", -1},
                 {"gap", 0}};
    enum { N = 2, C = 3, H = 9, W = 8, CNT = N * C * H * W };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        char desc[160];
        snprintf(desc, sizeof desc, "input\n%s\nfc outputs=2\nsoftmax\n", cases[k].layer);
        dsrt_net *net = cpu_net(desc, H, W, C, 2);
        const dsrt_layer *L = &net->layers[1];
        int oh = L->out.h, ow = L->out.w, ocnt = N * C * oh * ow;
        float x[CNT], dy[CNT], out[CNT], dxr[CNT];
        dsrt_rng r = dsrt_rng_init(39, k, 0, 0);
        for (int i = 0; i < CNT; i++) x[i] = uniform(&r, -2, 2), dy[i] = uniform(&r, -1, 1);
        x[5] = x[6]; /* a tie */
        CHECK_OK(dsrt__net_forward(net, x, N, 0, NULL, NULL, NULL, NULL));
        CHECK_OK(dsrt__net_layer_output(net, 1, out, 0));
        ref_pool_bwd(x, dy, dxr, N, C, H, W, oh, ow, L->o.kh, L->o.kw, L->o.sh, L->o.sw, L->pt,
                     L->pl, cases[k].max);
        if (pool_of(L, N, oh, ow, 0, DSRT_K_F32, cases[k].max).mode == DSRT_K_POOL_AVG_PADDED)
            ref_pool_bwd_padded(dy, dxr, N, C, H, W, oh, ow, L);
        /* Max pooling's backward both from the winners the forward kept
         * and finding them again: the same gradient, ties to the first. */
        for (int nhwc = 0; nhwc < 2; nhwc++)
            for (int kept = 0; kept <= (cases[k].max > 0); kept++) {
                dsrt_k_pool p = pool_of(L, N, oh, ow, nhwc, DSRT_K_F32, cases[k].max);
                void *tx = to_tensor(&p.xd, x), *ty = zalloc(ocnt * 4);
                void *tdy = to_tensor(&p.yd, dy), *tdx = zalloc(CNT * 4);
                uint8_t *arg = kept ? zalloc(ocnt) : NULL;
                if (arg) memset(arg, 0xee, ocnt);
                CHECK_OK(dsrt_kh_pool_fwd(&p, tx, ty, arg));
                float *got = to_nchw(&p.yd, ty);
                char what[96];
                snprintf(what, sizeof what, "%s%s%s", cases[k].layer, nhwc ? " nhwc" : "",
                         kept ? ", winners kept" : "");
                CHECK_EQ(mismatches(what, got, out, ocnt, cases[k].max > 0 ? 0 : 1e-6, 1e-7), 0);
                for (int i = 0; arg && i < ocnt; i++) CHECK_LT(arg[i], p.kh * p.kw);
                CHECK_OK(dsrt_kh_pool_bwd(&p, kept ? NULL : tx, arg, tdy, tdx));
                float *gdx = to_nchw(&p.xd, tdx);
                CHECK_EQ(mismatches(what, gdx, dxr, CNT, 1e-6, 1e-7), 0);
                free(tx), free(ty), free(tdy), free(tdx), free(got), free(gdx), free(arg);
            }
        /* bfloat16: the same windows over the rounded values. */
        dsrt_k_pool p = pool_of(L, N, oh, ow, 1, DSRT_K_BF16, cases[k].max);
        void *tx = to_tensor(&p.xd, x), *ty = zalloc(ocnt * 2);
        float *xr = to_nchw(&p.xd, tx), *want = zalloc(ocnt * 4);
        dsrt_k_pool pf = p;
        pf.xd.type = pf.yd.type = DSRT_K_F32;
        pf.xd.nhwc = pf.yd.nhwc = 0;
        CHECK_OK(dsrt_kh_pool_fwd(&pf, xr, want, NULL));
        void *tw = to_tensor(&p.yd, want);
        float *wr = to_nchw(&p.yd, tw);
        CHECK_OK(dsrt_kh_pool_fwd(&p, tx, ty, NULL));
        float *got = to_nchw(&p.yd, ty);
        CHECK_EQ(mismatches("pooling, bf16", got, wr, ocnt, 0, 0), 0);
        free(tx), free(ty), free(xr), free(want), free(tw), free(wr), free(got);
        p.kh = 0;
        CHECK_EQ(dsrt_kh_pool_fwd(&p, x, x, NULL), -EINVAL);
        dsrt_net_destroy(net);
    }
}

/* The CPU net's LRN layer forward (within 1e-5: both compute in float),
 * its backward against the plain reference in double (1e-5), in both
 * layouts, from the scales the forward kept and computing them again. */
static void test_lrn(void) {
    static const dsrt_k_lrn cases[] = {
        {5, 0.1f, 0.75f, 1.0f}, {3, 1e-2f, 0.5f, 2.0f}, {5, 1e-4f, 0.75f, 1.0f}};
    enum { N = 2, C = 7, H = 4, W = 5, CNT = N * C * H * W };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        const dsrt_k_lrn *l = &cases[k];
        char desc[160];
        snprintf(desc, sizeof desc,
                 "input\nlrn size=%d alpha=%g beta=%g k=%g\nfc outputs=2\nsoftmax\n", l->size,
                 (double)l->alpha, (double)l->beta, (double)l->k);
        dsrt_net *net = cpu_net(desc, H, W, C, 2);
        float x[CNT], dy[CNT], out[CNT], dxr[CNT];
        dsrt_rng r = dsrt_rng_init(40, k, 0, 0);
        for (int i = 0; i < CNT; i++) x[i] = uniform(&r, -3, 3), dy[i] = uniform(&r, -1, 1);
        CHECK_OK(dsrt__net_forward(net, x, N, 0, NULL, NULL, NULL, NULL));
        CHECK_OK(dsrt__net_layer_output(net, 1, out, 0));
        ref_lrn_bwd(x, out, dy, dxr, N, C, H * W, l->size, l->alpha, l->beta, l->k);
        for (int nhwc = 0; nhwc < 2; nhwc++)
            for (int kept = 0; kept < 2; kept++) {
                dsrt_k_desc d = {N, C, H, W, nhwc, DSRT_K_F32};
                void *tx = to_tensor(&d, x), *ty = zalloc(CNT * 4), *tdy = to_tensor(&d, dy);
                void *tdx = zalloc(CNT * 4);
                float *scale = kept ? zalloc(CNT * 4) : NULL;
                CHECK_OK(dsrt_kh_lrn_fwd(&d, l, tx, ty, scale));
                float *got = to_nchw(&d, ty);
                CHECK_EQ(mismatches("lrn", got, out, CNT, 1e-5, 1e-7), 0);
                void *tout = to_tensor(&d, out);
                CHECK_OK(dsrt_kh_lrn_bwd(&d, l, tx, tout, tdy, scale, tdx));
                float *gdx = to_nchw(&d, tdx);
                CHECK_EQ(mismatches(kept ? "lrn backward, scales kept" : "lrn backward", gdx, dxr,
                                    CNT, 1e-5, 1e-7),
                         0);
                free(tx), free(ty), free(tdy), free(tdx), free(got), free(tout), free(gdx);
                free(scale);
            }
        dsrt_net_destroy(net);
    }
    dsrt_k_desc d = {1, 2, 1, 1, 0, DSRT_K_F32};
    dsrt_k_lrn even = {4, 1, 1, 1};
    float v[2];
    CHECK_EQ(dsrt_kh_lrn_fwd(&d, &even, v, v, NULL), -EINVAL);
}

// ----------------------------------------------------------------------------
// Padding, ReLU, the bias, conversions

static void pad_case(dsrt_k_desc xd, dsrt_k_desc yd, int top, int left, float fill,
                     int accumulate) {
    size_t nx = dsrt_kb_count(&xd), ny = dsrt_kb_count(&yd);
    float *x = zalloc(nx * 4), *y = zalloc(ny * 4), *want = zalloc(ny * 4);
    dsrt_rng r = dsrt_rng_init(36, (uint64_t)top + 100, (uint64_t)left + 100, accumulate);
    for (size_t i = 0; i < nx; i++) x[i] = uniform(&r, -2, 2);
    for (size_t i = 0; i < ny; i++) y[i] = uniform(&r, -2, 2);
    void *tx = to_tensor(&xd, x), *ty = to_tensor(&yd, y);
    float *xs = to_nchw(&xd, tx), *ys = to_nchw(&yd, ty); /* as the types hold them */
    dsrt_k_desc px = xd, py = yd;
    px.nhwc = py.nhwc = 0;
    for (int b = 0; b < yd.n; b++)
        for (int c = 0; c < yd.c; c++)
            for (int h = 0; h < yd.h; h++)
                for (int w = 0; w < yd.w; w++) {
                    int sh = h - top, sw = w - left;
                    float v = fill;
                    if (sh >= 0 && sh < xd.h && sw >= 0 && sw < xd.w) v = xs[at(&px, b, c, sh, sw)];
                    size_t i = at(&py, b, c, h, w);
                    want[i] = accumulate ? ys[i] + v : v;
                }
    if (yd.type == DSRT_K_BF16)
        for (size_t i = 0; i < ny; i++) want[i] = dsrt_f32_from_bf16(dsrt_bf16_from_f32(want[i]));
    CHECK_OK(dsrt_kh_pad(&xd, tx, &yd, ty, top, left, fill, accumulate));
    float *got = to_nchw(&yd, ty);
    char what[96];
    snprintf(what, sizeof what, "pad %dx%d%s -> %dx%d%s at (%d,%d)%s", xd.h, xd.w,
             xd.nhwc ? " nhwc" : "", yd.h, yd.w, yd.nhwc ? " nhwc" : "", top, left,
             accumulate ? " +=" : "");
    CHECK_EQ(mismatches(what, got, want, ny, 0, 0), 0);
    free(x), free(y), free(want), free(tx), free(ty), free(xs), free(ys), free(got);
}

static void test_pad(void) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(PAD_CASES); k++)
        pad_case(PAD_CASES[k].x, PAD_CASES[k].y, PAD_CASES[k].top, PAD_CASES[k].left,
                 PAD_CASES[k].fill, PAD_CASES[k].accumulate);
    CHECK_EQ(dsrt_kh_pad(&PAD_BAD_X, NULL, &PAD_BAD_Y, NULL, 0, 0, 0, 0), -EINVAL);
}

static void test_relu_bias_convert(void) {
    enum { ROWS = 37, OUT = 21, N = ROWS * OUT };
    float x[N], y[N], dy[N], dx[N], want[N];
    dsrt_rng r = dsrt_rng_init(37, 0, 0, 0);
    for (int i = 0; i < N; i++) x[i] = uniform(&r, -4, 4), dy[i] = uniform(&r, -1, 1);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = INFINITY, x[3] = -INFINITY;
    CHECK_OK(dsrt_kh_relu_fwd(DSRT_K_F32, x, y, N, 0.1f));
    for (int i = 0; i < N; i++) want[i] = x[i] > 0 ? x[i] : x[i] * 0.1f;
    CHECK_EQ(mismatches("relu", y, want, N, 0, 0), 0);
    CHECK_OK(dsrt_kh_relu_bwd(DSRT_K_F32, y, dy, dx, N, 0.1f));
    for (int i = 0; i < N; i++) want[i] = y[i] > 0 ? dy[i] : dy[i] * 0.1f;
    CHECK_EQ(mismatches("relu backward", dx, want, N, 0, 0), 0);
    CHECK_EQ(dsrt_kh_relu_fwd((dsrt_k_type)7, x, y, N, 0), -EINVAL);
    /* The fully connected bias and ReLU: (n, out, 1, 1). */
    float b[OUT], out[ROWS * OUT];
    for (int o = 0; o < OUT; o++) b[o] = uniform(&r, -1, 1);
    const dsrt_k_desc fd = {ROWS, OUT, 1, 1, 0, DSRT_K_F32};
    const dsrt_k_act leaky = {DSRT_K_ACT_RELU, 0.25f, 0.0f};
    CHECK_OK(dsrt_kh_bias_act(&fd, x, b, out, &leaky));
    for (int i = 0; i < ROWS * OUT; i++) {
        float v = x[i] + b[i % OUT];
        want[i] = v < 0 ? v * 0.25f : v;
    }
    CHECK_EQ(mismatches("bias", out, want, ROWS * OUT, FUSED_TOL, 0), 0);
    /* bfloat16 both ways: every bf16 pattern exactly; floats rounded to
     * nearest even, NaN kept. */
    enum { M = 65536 };
    dsrt_bf16 *h = zalloc(M * 2), *h2 = zalloc(M * 2);
    float *f = zalloc(M * 4);
    for (int i = 0; i < M; i++) h[i] = (dsrt_bf16)i;
    CHECK_OK(dsrt_kh_bf16_to_f32(h, f, M));
    CHECK_OK(dsrt_kh_f32_to_bf16(f, h2, M));
    int bad = 0;
    for (int i = 0; i < M; i++)
        bad += isnan(f[i]) ? !isnan(dsrt_f32_from_bf16(h2[i])) : h2[i] != h[i];
    CHECK_EQ(bad, 0);
    CHECK_OK(dsrt_kh_fill(f, M, -1.5f));
    CHECK(f[0] == -1.5f && f[M - 1] == -1.5f);
    CHECK_OK(dsrt_kh_scale(f, f, M, 0.5f));
    CHECK(f[7] == -0.75f);
    free(h), free(h2), free(f);
}

/* The activation kernels (clip, sigmoid, hardsigmoid, hardswish, SiLU,
 * GELU) on the host, both types, against tests/actref.h's references:
 * kinks and their neighbours with PyTorch's gradients there; in place;
 * an unknown function refused. */
static int host_act_fwd(void *ctx, dsrt_k_type t, const dsrt_k_act *a, const void *x, void *y,
                        size_t n) {
    return dsrt_kh_act_fwd(t, a, x, y, n);
}

static int host_act_bwd(void *ctx, dsrt_k_type t, const dsrt_k_act *a, const void *x, const void *y,
                        const void *dy, void *dx, size_t n) {
    return dsrt_kh_act_bwd(t, a, x, y, dy, dx, n);
}

static void test_activations(void) {
    const act_runner r = {host_act_fwd, host_act_bwd, NULL};
    CHECK_EQ(act_kernel_check(&r, 3001), 0);
    enum { N = 64 };
    float x[N], y[N], z[N], dy[N], dx[N];
    dsrt_rng rng = dsrt_rng_init(42, 0, 0, 0);
    for (int i = 0; i < N; i++) x[i] = uniform(&rng, -5, 5), dy[i] = uniform(&rng, -1, 1);
    const dsrt_k_act gelu = {DSRT_K_ACT_GELU, 0, 0}, bad = {DSRT_K_ACT_COUNT, 0, 0};
    CHECK_OK(dsrt_kh_act_fwd(DSRT_K_F32, &gelu, x, y, N));
    memcpy(z, x, sizeof z);
    CHECK_OK(dsrt_kh_act_fwd(DSRT_K_F32, &gelu, z, z, N));
    CHECK_EQ(mismatches("gelu in place", z, y, N, 0, 0), 0);
    CHECK_OK(dsrt_kh_act_bwd(DSRT_K_F32, &gelu, x, y, dy, dx, N));
    memcpy(z, dy, sizeof z);
    CHECK_OK(dsrt_kh_act_bwd(DSRT_K_F32, &gelu, x, y, z, z, N));
    CHECK_EQ(mismatches("gelu backward in place", z, dx, N, 0, 0), 0);
    CHECK_EQ(dsrt_kh_act_fwd(DSRT_K_F32, &bad, x, y, N), -EINVAL);
    CHECK_EQ(dsrt_kh_act_bwd((dsrt_k_type)7, &gelu, x, y, dy, dx, N), -EINVAL);
    CHECK_EQ(dsrt_kh_act_fwd(DSRT_K_F32, NULL, x, y, N), -EINVAL);
}

/* The bias kernel with each activation a convolution computes at
 * inference (the kinds' infer_act through dsrt__act_kernel_of) against the
 * CPU backend's layer of the kind on the biased values: both layouts and
 * types, within float rounding and 1e-6 (oneDNN's GELU differs from the
 * erfc form's digits in its tails; bfloat16: one rounding). */
static void test_bias_act(void) {
    static const char *const acts[] = {"relu",
                                       "leakyrelu leak=0.1",
                                       "relu6",
                                       "clip min=-0.25 max=0.4",
                                       "sigmoid",
                                       "hardsigmoid",
                                       "hardsigmoid alpha=0.4 beta=0.3",
                                       "hardswish",
                                       "silu",
                                       "gelu",
                                       "gelu approximate=tanh"};
    enum { N = 2, C = 5, H = 3, W = 4, CNT = N * C * H * W };
    float x[CNT], bias[C], v[CNT], want[CNT];
    dsrt_rng r = dsrt_rng_init(43, 0, 0, 0);
    for (int i = 0; i < CNT; i++) x[i] = uniform(&r, -6, 6);
    x[0] = 0.0f, x[1] = -3.0f, x[2] = 3.0f;
    for (int k = 0; k < C; k++) bias[k] = uniform(&r, -1, 1);
    bias[0] = 0.0f;
    for (int i = 0; i < CNT; i++) v[i] = x[i] + bias[i / (H * W) % C];
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(acts); k++) {
        char desc[160];
        snprintf(desc, sizeof desc, "input\n%s\nfc outputs=2\nsoftmax\n", acts[k]);
        dsrt_net *net = cpu_net(desc, H, W, C, 2);
        const dsrt_layer *L = &net->layers[1];
        dsrt_act act;
        dsrt_k_act ka = {DSRT_K_ACT_IDENTITY, 0.0f, 0.0f};
        REQUIRE(dsrt__layer_ops(L)->infer_act && dsrt__layer_ops(L)->infer_act(L, &act));
        CHECK(dsrt__act_kernel_of(&act, &ka));
        CHECK_OK(dsrt__net_forward(net, v, N, 0, NULL, NULL, NULL, NULL));
        CHECK_OK(dsrt__net_layer_output(net, 1, want, 0));
        for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++)
            for (int nhwc = 0; nhwc < 2; nhwc++) {
                dsrt_k_desc d = {N, C, H, W, nhwc, (dsrt_k_type)t};
                void *tx = to_tensor(&d, x), *ty = zalloc(CNT * 4);
                float *xs = to_nchw(&d, tx), *vs = zalloc(CNT * 4), *ws = zalloc(CNT * 4);
                /* bf16: the CPU layer on the rounded input plus the bias,
                 * its output rounded once. */
                for (int i = 0; i < CNT; i++) vs[i] = xs[i] + bias[i / (H * W) % C];
                const float *ref = want;
                if (t == DSRT_K_BF16) {
                    CHECK_OK(dsrt__net_forward(net, vs, N, 0, NULL, NULL, NULL, NULL));
                    CHECK_OK(dsrt__net_layer_output(net, 1, ws, 0));
                    void *tw = to_tensor(&d, ws);
                    float *wr = to_nchw(&d, tw);
                    memcpy(ws, wr, CNT * 4);
                    free(tw), free(wr);
                    ref = ws;
                }
                CHECK_OK(dsrt_kh_bias_act(&d, tx, bias, ty, &ka));
                float *got = to_nchw(&d, ty);
                char what[96];
                snprintf(what, sizeof what, "bias and %s, %s%s", acts[k],
                         t == DSRT_K_BF16 ? "bf16" : "fp32", nhwc ? ", nhwc" : "");
                CHECK_EQ(mismatches(what, got, ref, CNT, t == DSRT_K_BF16 ? 1.0 / 128 : 2e-6, 1e-6),
                         0);
                free(tx), free(ty), free(xs), free(vs), free(ws), free(got);
            }
        dsrt_net_destroy(net);
    }
    const dsrt_k_desc d = {N, C, H, W, 1, DSRT_K_F32};
    const dsrt_k_act bad = {DSRT_K_ACT_COUNT, 0, 0};
    float y[CNT];
    CHECK_EQ(dsrt_kh_bias_act(&d, x, bias, y, &bad), -EINVAL);
    CHECK_EQ(dsrt_kh_bias_act(&d, x, bias, y, NULL), -EINVAL);
    const dsrt_act swish2 = {DSRT_ACT_SWISH, 2.0f, 0.0f};
    dsrt_k_act ka;
    CHECK(!dsrt__act_kernel_of(&swish2, &ka));
}

/* The bias kernel with a residual sum (an inference chain ending with an
 * add): post(act(x + b) + r), in both layouts and types, in place on r
 * too, against the same in float (bfloat16: one rounding of the result). */
static void test_bias_act_sum(void) {
    enum { N = 2, C = 5, H = 3, W = 4, CNT = N * C * H * W };
    float x[CNT], res[CNT], bias[C];
    dsrt_rng r = dsrt_rng_init(44, 0, 0, 0);
    for (int i = 0; i < CNT; i++) x[i] = uniform(&r, -3, 3), res[i] = uniform(&r, -3, 3);
    for (int k = 0; k < C; k++) bias[k] = uniform(&r, -1, 1);
    const dsrt_k_act acts[] = {{DSRT_K_ACT_IDENTITY, 0, 0}, {DSRT_K_ACT_RELU, 0, 0}};
    const dsrt_k_act post = {DSRT_K_ACT_RELU, 0.1f, 0};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(acts); k++)
        for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++)
            for (int nhwc = 0; nhwc < 2; nhwc++) {
                dsrt_k_desc d = {N, C, H, W, nhwc, (dsrt_k_type)t};
                void *tx = to_tensor(&d, x), *tr = to_tensor(&d, res), *ty = zalloc(CNT * 4);
                float *xs = to_nchw(&d, tx), *rs = to_nchw(&d, tr), want[CNT];
                for (int i = 0; i < CNT; i++) {
                    float v = xs[i] + bias[i / (H * W) % C];
                    if (k == 1 && v < 0) v = 0;
                    v += rs[i];
                    want[i] = v > 0 ? v : v * 0.1f;
                }
                CHECK_OK(dsrt_kh_bias_act_sum(&d, tx, bias, &acts[k], tr, &post, ty));
                float *got = to_nchw(&d, ty);
                char what[96];
                snprintf(what, sizeof what, "bias, %s, residual, leaky ReLU: %s%s",
                         k ? "ReLU" : "identity", t == DSRT_K_BF16 ? "bf16" : "fp32",
                         nhwc ? ", nhwc" : "");
                double tol = t == DSRT_K_BF16 ? 1.0 / 128 : 1e-6;
                CHECK_EQ(mismatches(what, got, want, CNT, tol, 1e-6), 0);
                /* In place on the residual. */
                CHECK_OK(dsrt_kh_bias_act_sum(&d, tx, bias, &acts[k], tr, &post, tr));
                float *again = to_nchw(&d, tr);
                CHECK_EQ(mismatches(what, again, want, CNT, tol, 1e-6), 0);
                free(tx), free(tr), free(ty), free(xs), free(rs), free(got), free(again);
            }
    const dsrt_k_desc d = {N, C, H, W, 1, DSRT_K_F32};
    float y[CNT];
    CHECK_EQ(dsrt_kh_bias_act_sum(&d, x, bias, &acts[0], NULL, &post, y), -EINVAL);
}

// ----------------------------------------------------------------------------
// Products, layer normalisation, stochastic depth

/* Fills n floats in [lo, hi). */
static void fill_uniform(float *v, size_t n, uint64_t seed, float lo, float hi) {
    dsrt_rng r = dsrt_rng_init(seed, 5, 0, 0);
    for (size_t i = 0; i < n; i++) v[i] = uniform(&r, lo, hi);
}

/* mul's product: a times b of a's shape, a gate (n, c, 1, 1) and a
 * channel's float32 factors (1, c, 1, 1), in both layouts and types: the
 * float product of the values as the tensors hold them, rounded once, bit
 * for bit. The gate's gradient against sums in double (1e-6 in float, a
 * bfloat16 rounding in bfloat16). */
static void test_mul(void) {
    enum { N = 3, C = 5, H = 4, W = 6, CNT = N * C * H * W };
    float a[CNT], b[CNT], gate[N * C], fac[C], dy[CNT];
    fill_uniform(a, CNT, 1, -2, 2);
    fill_uniform(b, CNT, 2, -2, 2);
    fill_uniform(gate, N * C, 3, 0, 1);
    fill_uniform(fac, C, 4, -1, 1);
    fill_uniform(dy, CNT, 5, -1, 1);
    for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++)
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            dsrt_k_desc ad = {N, C, H, W, nhwc, (dsrt_k_type)t};
            dsrt_k_desc bds[3] = {
                ad, {N, C, 1, 1, nhwc, (dsrt_k_type)t}, {1, C, 1, 1, 1, DSRT_K_F32}};
            const float *bs[3] = {b, gate, fac};
            void *ta = to_tensor(&ad, a);
            float *ar = to_nchw(&ad, ta);
            for (int k = 0; k < 3; k++) {
                const dsrt_k_desc *bd = &bds[k];
                void *tb = to_tensor(bd, bs[k]), *ty = zalloc(CNT * 4);
                float *br = to_nchw(bd, tb), want[CNT];
                for (int q = 0; q < N; q++)
                    for (int c = 0; c < C; c++)
                        for (int h = 0; h < H; h++)
                            for (int w = 0; w < W; w++) {
                                size_t i = (((size_t)q * C + c) * H + h) * W + w;
                                size_t j = k == 0 ? i : k == 1 ? (size_t)q * C + c : (size_t)c;
                                want[i] = ar[i] * br[j];
                            }
                void *tw = to_tensor(&ad, want);
                float *wr = to_nchw(&ad, tw);
                CHECK_OK(dsrt_kh_mul(&ad, ta, bd, tb, ty));
                float *got = to_nchw(&ad, ty);
                char what[64];
                snprintf(what, sizeof what, "mul %s, %s, %s",
                         k == 0   ? "same"
                         : k == 1 ? "gate"
                                  : "factors",
                         nhwc ? "nhwc" : "nchw", t ? "bf16" : "f32");
                CHECK_EQ(mismatches(what, got, wr, CNT, 0, 0), 0);
                free(tb), free(ty), free(br), free(tw), free(wr), free(got);
            }
            /* The gate's gradient: the sum of dy a over each image's pixels. */
            void *tdy = to_tensor(&ad, dy), *tdb = zalloc(N * C * 4);
            float *dyr = to_nchw(&ad, tdy), want[N * C];
            for (int q = 0; q < N * C; q++) {
                double sum = 0;
                for (int k = 0; k < H * W; k++)
                    sum += (double)dyr[q * H * W + k] * ar[q * H * W + k];
                want[q] = (float)sum;
            }
            CHECK_OK(dsrt_kh_mul_grad(&ad, tdy, ta, &bds[1], tdb));
            float *got = to_nchw(&bds[1], tdb);
            CHECK_EQ(mismatches("gate gradient", got, want, N * C, t ? 1.0 / 128 : 1e-6, 1e-7), 0);
            free(tdy), free(tdb), free(dyr), free(got), free(ta), free(ar);
        }
    dsrt_k_desc ad = {N, C, H, W, 1, DSRT_K_F32}, bad = {N, C + 1, 1, 1, 1, DSRT_K_F32};
    CHECK_EQ(dsrt_kh_mul(&ad, a, &bad, b, b), -EINVAL);
    CHECK_EQ(dsrt_kh_mul_grad(&ad, dy, a, &ad, b), -EINVAL);
}

/* The channel sums of a scale layer's and layernorm's parameter gradients
 * (two tiles of rows, two blocks of channels) against sums in double:
 * within 1e-5 of the sum of the terms' magnitudes (compensated float
 * sums), the same bits run to run. */
static void test_chan_grads(void) {
    enum { N = 3, C = 37, H = 20, W = 23, CNT = N * C * H * W, ROWS = N * H * W };
    float *x = zalloc(CNT * 4), *dy = zalloc(CNT * 4), mean[ROWS], rstd[ROWS];
    fill_uniform(x, CNT, 6, -2, 2);
    fill_uniform(dy, CNT, 7, -1, 1);
    fill_uniform(mean, ROWS, 8, -0.5f, 0.5f);
    fill_uniform(rstd, ROWS, 9, 0.5f, 2);
    for (int stats = 0; stats < 2; stats++)
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            dsrt_k_desc d = {N, C, H, W, nhwc, DSRT_K_F32};
            void *tx = to_tensor(&d, x), *tdy = to_tensor(&d, dy);
            float *work = zalloc(dsrt_kb_bn_work(&d) * 4), ds[C], dh[C], ds2[C], dh2[C];
            CHECK_OK(dsrt_kh_chan_grads(&d, tx, tdy, stats ? mean : NULL, stats ? rstd : NULL, ds,
                                        dh, work));
            CHECK_OK(dsrt_kh_chan_grads(&d, tx, tdy, stats ? mean : NULL, stats ? rstd : NULL, ds2,
                                        dh2, work));
            CHECK(!memcmp(ds, ds2, sizeof ds) && !memcmp(dh, dh2, sizeof dh));
            int bad = 0;
            for (int c = 0; c < C; c++) {
                double s = 0, q = 0, as = 0, aq = 0;
                for (int r = 0; r < ROWS; r++) {
                    size_t i = ((size_t)(r / (H * W)) * C + c) * H * W + r % (H * W);
                    double v = stats ? ((double)x[i] - mean[r]) * rstd[r] : x[i];
                    s += dy[i], as += fabs(dy[i]);
                    q += dy[i] * v, aq += fabs(dy[i] * v);
                }
                bad += fabs(dh[c] - s) > 1e-5 * as || fabs(ds[c] - q) > 1e-5 * aq;
            }
            CHECK_EQ(bad, 0);
            free(tx), free(tdy), free(work);
        }
    dsrt_k_desc d = {N, C, H, W, 1, DSRT_K_F32};
    float w[4];
    CHECK_EQ(dsrt_kh_chan_grads(&d, x, dy, mean, NULL, w, w, w), -EINVAL);
    free(x), free(dy);
}

/* Layer normalisation: the forward against the CPU net's layernorm layer
 * (oneDNN; 1e-5), the input gradient against the formula in double (1e-5),
 * both layouts; bfloat16 tensors give the float results of their values,
 * rounded once. */
static void test_layernorm(void) {
    enum { N = 2, C = 40, H = 3, W = 5, CNT = N * C * H * W, ROWS = N * H * W };
    dsrt_net *net = cpu_net("input\nlayernorm eps=1e-3\nfc outputs=2\nsoftmax\n", H, W, C, 2);
    const dsrt_layer *L = &net->layers[1];
    float *params = dsrt_net_params(net, NULL), x[CNT], dy[CNT], cpu[CNT];
    fill_uniform(x, CNT, 10, -3, 3);
    fill_uniform(dy, CNT, 11, -1, 1);
    fill_uniform(params + L->w_off, C, 12, 0.5f, 1.5f);
    fill_uniform(params + L->b_off, C, 13, -0.5f, 0.5f);
    dsrt_net_params_changed(net);
    const float *gamma = params + L->w_off, *beta = params + L->b_off;
    CHECK_OK(dsrt__net_forward(net, x, N, 0, NULL, NULL, NULL, NULL));
    CHECK_OK(dsrt__net_layer_output(net, 1, cpu, 0));
    /* The input gradient in double. */
    float want[CNT];
    for (int r = 0; r < ROWS; r++) {
        int b = r / (H * W), k = r % (H * W);
        double m = 0, v = 0, sg = 0, sgx = 0;
        for (int c = 0; c < C; c++) m += x[(b * C + c) * H * W + k];
        m /= C;
        for (int c = 0; c < C; c++) v += pow(x[(b * C + c) * H * W + k] - m, 2);
        double rs = 1 / sqrt(v / C + 1e-3);
        for (int c = 0; c < C; c++) {
            size_t i = (b * C + c) * H * W + k;
            double g = (double)dy[i] * gamma[c];
            sg += g, sgx += g * (x[i] - m) * rs;
        }
        for (int c = 0; c < C; c++) {
            size_t i = (b * C + c) * H * W + k;
            double g = (double)dy[i] * gamma[c];
            want[i] = (float)(rs * (g - sg / C - (x[i] - m) * rs * sgx / C));
        }
    }
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        dsrt_k_desc d = {N, C, H, W, nhwc, DSRT_K_F32};
        void *tx = to_tensor(&d, x), *tdy = to_tensor(&d, dy), *ty = zalloc(CNT * 4),
             *tdx = zalloc(CNT * 4);
        float mean[ROWS], rstd[ROWS];
        CHECK_OK(dsrt_kh_ln_fwd(&d, tx, gamma, beta, 1e-3f, ty, mean, rstd));
        float *got = to_nchw(&d, ty);
        CHECK_EQ(mismatches(nhwc ? "layernorm nhwc" : "layernorm", got, cpu, CNT, 1e-5, 1e-6), 0);
        CHECK_OK(dsrt_kh_ln_bwd(&d, tx, tdy, gamma, mean, rstd, tdx));
        float *gdx = to_nchw(&d, tdx);
        CHECK_EQ(mismatches("layernorm backward", gdx, want, CNT, 1e-5, 1e-6), 0);
        /* Without the statistics kept: the same output. */
        void *ty2 = zalloc(CNT * 4);
        CHECK_OK(dsrt_kh_ln_fwd(&d, tx, gamma, beta, 1e-3f, ty2, NULL, NULL));
        CHECK(!memcmp(ty, ty2, CNT * 4));
        free(tx), free(tdy), free(ty), free(tdx), free(got), free(gdx), free(ty2);
    }
    /* bfloat16: the float computation of the values it holds, rounded. */
    dsrt_k_desc d16 = {N, C, H, W, 1, DSRT_K_BF16}, d32 = d16;
    d32.type = DSRT_K_F32;
    void *x16 = to_tensor(&d16, x), *y16 = zalloc(CNT * 2), *dy16 = to_tensor(&d16, dy),
         *dx16 = zalloc(CNT * 2);
    float *xr = to_nchw(&d16, x16), *dyr = to_nchw(&d16, dy16);
    void *x32 = to_tensor(&d32, xr), *y32 = zalloc(CNT * 4), *dy32 = to_tensor(&d32, dyr),
         *dx32 = zalloc(CNT * 4);
    float m16[ROWS], r16[ROWS], m32[ROWS], r32[ROWS];
    CHECK_OK(dsrt_kh_ln_fwd(&d16, x16, gamma, beta, 1e-3f, y16, m16, r16));
    CHECK_OK(dsrt_kh_ln_fwd(&d32, x32, gamma, beta, 1e-3f, y32, m32, r32));
    CHECK_OK(dsrt_kh_ln_bwd(&d16, x16, dy16, gamma, m16, r16, dx16));
    CHECK_OK(dsrt_kh_ln_bwd(&d32, x32, dy32, gamma, m32, r32, dx32));
    float *a = to_nchw(&d16, y16), *b32 = to_nchw(&d32, y32), *ga = to_nchw(&d16, dx16),
          *gb32 = to_nchw(&d32, dx32);
    void *b16 = to_tensor(&d16, b32), *gb16 = to_tensor(&d16, gb32);
    float *b = to_nchw(&d16, b16), *gb = to_nchw(&d16, gb16);
    CHECK_EQ(mismatches("layernorm bf16", a, b, CNT, 0, 0), 0);
    CHECK_EQ(mismatches("layernorm backward bf16", ga, gb, CNT, 0, 0), 0);
    free(x16), free(y16), free(dy16), free(dx16), free(xr), free(dyr), free(x32), free(y32);
    free(dy32), free(dx32), free(a), free(b32), free(ga), free(gb32), free(b16), free(gb16);
    free(b), free(gb);
    CHECK_EQ(dsrt_kh_ln_fwd(&d32, x, gamma, NULL, 1e-3f, x, NULL, NULL), -EINVAL);
    CHECK_EQ(dsrt_kh_ln_bwd(&d32, x, dy, gamma, NULL, NULL, x), -EINVAL);
    dsrt_net_destroy(net);
}

/* Stochastic depth: the CPU net's layer in training, its input through the
 * kernel, gives its output bit for bit in either layout (the step read from
 * memory too); each image's factor is the reference draw. */
static void test_drop_path(void) {
    const char *desc = "input\nconv filters=5 size=3 pad=1\nstochastic_depth p=0.4\nfc outputs=3\n"
                       "softmax\n";
    enum { N = 9, C = 5, H = 4, W = 3, CNT = N * C * H * W };
    dsrt_net *net = cpu_net(desc, H, W, 2, 3);
    float x[N * 2 * H * W];
    int32_t labels[N] = {0, 1, 2, 0, 1, 2, 0, 1, 2};
    fill_uniform(x, DSRT_ARRAY_SIZE(x), 14, -1, 1);
    int dropped = 0, kept = 0;
    for (int64_t it = 5; it < 9; it++) {
        dsrt_net_set_iteration(net, it);
        CHECK_OK(dsrt_net_forward_backward(net, x, labels, N, NULL, NULL));
        float in[CNT], out[CNT], m[N];
        CHECK_OK(dsrt__net_layer_output(net, 1, in, 1));
        CHECK_OK(dsrt__net_layer_output(net, 2, out, 1));
        ref_drop_path_mask(m, N, 17, (uint64_t)it, 2, 0.4f);
        for (int b = 0; b < N; b++) {
            dropped += m[b] == 0, kept += m[b] != 0;
            for (int k = 0; k < C * H * W; k++)
                if (out[b * C * H * W + k] != in[b * C * H * W + k] * m[b]) {
                    test_failures++;
                    fprintf(stderr, "  image %d: the CPU's output is not its factor's\n", b);
                    break;
                }
        }
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            dsrt_k_desc d = {N, C, H, W, nhwc, DSRT_K_F32};
            uint64_t step = (uint64_t)it;
            for (int mem = 0; mem < 2; mem++) {
                void *t = to_tensor(&d, in);
                CHECK_OK(
                    dsrt_kh_drop_path(&d, t, t, 17, mem ? 0 : step, mem ? &step : NULL, 2, 0.4f));
                float *got = to_nchw(&d, t);
                CHECK_EQ(mismatches("stochastic depth", got, out, CNT, 0, 0), 0);
                free(got), free(t);
            }
        }
    }
    CHECK_GT(dropped, 0);
    CHECK_GT(kept, 0);
    dsrt_k_desc d = {N, C, H, W, 0, DSRT_K_F32};
    CHECK_EQ(dsrt_kh_drop_path(&d, x, x, 1, 1, NULL, 1, 1.0f), -EINVAL);
    dsrt_net_destroy(net);
}

int main(void) {
    RUN(test_staging);
    RUN(test_dropout);
    RUN(test_softmax);
    RUN(test_bn_sync);
    RUN(test_optimizer);
    RUN(test_pad);
    RUN(test_relu_bias_convert);
    RUN(test_activations);
    RUN(test_bias_act);
    RUN(test_bias_act_sum);
    RUN(test_bias_grad);
    RUN(test_pool);
    RUN(test_lrn);
    RUN(test_mul);
    RUN(test_chan_grads);
    RUN(test_layernorm);
    RUN(test_drop_path);
    return TEST_RESULT();
}

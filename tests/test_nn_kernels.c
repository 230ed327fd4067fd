/*
 * The GPU backend's kernels, their very bodies (nn/kernels_body.h) run on the
 * host by tests/kernels_host.c, against the CPU backend: on every machine,
 * so that the kernels' arithmetic is tested where no GPU is. What stays for
 * a device (test_gpu_kernels) is the launch configuration and where memory
 * lives.
 *
 * Against the CPU backend itself: the input stage from uint8 NHWC (the
 * backend's own conversion and its input layer's normalisation, bit for
 * bit), dropout (the CPU net's dropout layer, bit for bit, NCHW and NHWC),
 * softmax with cross-entropy (the CPU net's probabilities and loss within
 * 1e-6 relative: the warp sums the exponentials in another order; the
 * correct count exactly), synchronised batchnorm's sums (those the CPU net
 * hands its hook, within 1e-12 of the sums of absolute values) and running
 * statistics (the CPU net's, bit for bit), and the optimizer for every
 * solver and gradient-threshold method (dsrt_optimizer_step: bit for bit
 * without norm clipping, within 1e-5 relative with it: the norms are summed
 * in double in another order). Against plain references (tests/nnref.h,
 * the CPU backend's formulas written out): the batchnorm backward sums and
 * input gradient, padding and cropping in every layout and type, ReLU, the
 * fully connected bias and its gradient, bfloat16 conversions. Reductions
 * give the same bits run to run. Where the C compiler may fuse multiplies
 * and adds in the CPU code (__FMA__), the bit-for-bit checks allow 1e-6.
 */
#include "kernelcheck.h"
#include "kernels_host.h"
#include "nn/internal.h"
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
            CHECK_OK(dsrt_kh_dropout(&d, t, t, 17, (uint64_t)it, 2, 0.35f));
            float *got = to_nchw(&d, t);
            CHECK_EQ(mismatches("dropout", got, out, CNT, 0, 0), 0);
            free(got), free(t);
        }
    }
    /* The mask itself, and p = 1 refused. */
    float ones[CNT], m[CNT];
    for (int i = 0; i < CNT; i++) ones[i] = 1.0f;
    dsrt_k_desc d = {N, C, H, W, 0, DSRT_K_F32};
    CHECK_OK(dsrt_kh_dropout(&d, ones, ones, 9, 10, 11, 0.25f));
    ref_dropout_mask(m, CNT, 9, 10, 11, 0.25f);
    CHECK_EQ(mismatches("mask", ones, m, CNT, 0, 0), 0);
    CHECK_EQ(dsrt_kh_dropout(&d, ones, ones, 9, 10, 11, 1.0f), -EINVAL);
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
    CHECK_OK(dsrt_kh_softmax_xent_fwd(z, labels, n, k, pk, &lk, &ck, work));
    CHECK_EQ(mismatches(what, pk, pc, cnt, 1e-6, 1e-30), 0);
    CHECK_EQ(ck, cc);
    if (isnan(lc))
        CHECK(isnan(lk));
    else
        CHECK_NEAR(lk, lc, 1e-12 * fabs(lc) + 1e-15);
    /* Run to run, the same bits. */
    CHECK_OK(dsrt_kh_softmax_xent_fwd(z, labels, n, k, pk, &lk2, &ck2, work));
    CHECK(memcmp(&lk, &lk2, sizeof lk) == 0 && ck == ck2);
    /* Backward from these probabilities, as the CPU rounds it. */
    float scale = 1.0f / n;
    for (size_t i = 0; i < cnt; i++) want[i] = pk[i] * scale;
    for (int b = 0; b < n; b++) want[(size_t)b * k + labels[b]] -= scale;
    CHECK_OK(dsrt_kh_softmax_xent_bwd(pk, labels, n, k, scale, dz));
    CHECK_EQ(mismatches("softmax backward", dz, want, cnt, FUSED_TOL, 0), 0);
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
    CHECK_EQ(dsrt_kh_softmax_xent_fwd(z, labels, 1, 0, pr, NULL, NULL, pr), -EINVAL);
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
    CHECK_OK(dsrt_kh_bn_sums(in, N, C, HW, sums));
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
        if (!(fabs(sums[i] - cap.fwd[i]) <= 1e-12 * scale[i]) && bad++ < 5)
            fprintf(stderr, "  bn sums[%d]: got %.17g, want %.17g\n", i, sums[i], cap.fwd[i]);
    CHECK_EQ(bad, 0);
    CHECK_OK(dsrt_kh_bn_sums(in, N, C, HW, sums2));
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
    /* Backward sums and the input gradient, against the references. */
    float dy[CNT], dx[CNT], dxr[CNT], ds[C], dh[C], dsr[C], dhr[C], sc[C];
    for (int i = 0; i < CNT; i++) dy[i] = uniform(&r, -1, 1);
    for (int ch = 0; ch < C; ch++) sc[ch] = uniform(&r, 0.5f, 1.5f);
    double bs[2 * C], bsr[2 * C], count = cap.fwd[2 * C];
    CHECK_OK(dsrt_kh_bn_bwd_sums(in, dy, mean, inv, N, C, HW, bs, ds, dh));
    ref_bn_bwd_sums(in, dy, mean, inv, N, C, HW, bsr, dsr, dhr);
    bad = 0;
    for (int i = 0; i < 2 * C; i++)
        if (!(fabs(bs[i] - bsr[i]) <= 1e-12 * (fabs(bsr[i]) + CNT)) && bad++ < 5)
            fprintf(stderr, "  bn backward sums[%d]: got %.17g, want %.17g\n", i, bs[i], bsr[i]);
    CHECK_EQ(bad, 0);
    CHECK_EQ(mismatches("dscale", ds, dsr, C, 1e-6, 1e-7), 0);
    CHECK_EQ(mismatches("dshift", dh, dhr, C, 1e-6, 1e-7), 0);
    CHECK_OK(dsrt_kh_bn_bwd_dx(in, dy, mean, inv, sc, bsr, &count, N, C, HW, dx));
    ref_bn_bwd_dx(in, dy, mean, inv, sc, bsr, count, N, C, HW, dxr);
    CHECK_EQ(mismatches("bn input gradient", dx, dxr, CNT, 1e-6, 1e-7), 0);
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
        CHECK_OK(dsrt_kh_optim_update(&ko, &st, w, g, m, b1, w16));
        CHECK_OK(dsrt_kh_optim_update(&ko, &st, w2, g2, m2, b2, NULL));
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
    CHECK_EQ(dsrt_kh_optim_update(&ko, &st, &w, &w, &w, NULL, NULL), -EINVAL);
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
    /* The fully connected bias and ReLU, and the bias gradient: column sums
     * within 1e-5 of the column's absolute sum, the same bits run to run. */
    float b[OUT], out[ROWS * OUT], db[OUT], db2[OUT];
    for (int o = 0; o < OUT; o++) b[o] = uniform(&r, -1, 1);
    CHECK_OK(dsrt_kh_bias_act(x, b, out, ROWS, OUT, 1, 0.25f));
    for (int i = 0; i < ROWS * OUT; i++) {
        float v = x[i] + b[i % OUT];
        want[i] = v < 0 ? v * 0.25f : v;
    }
    CHECK_EQ(mismatches("bias", out, want, ROWS * OUT, FUSED_TOL, 0), 0);
    CHECK_OK(dsrt_kh_bias_grad(dy, db, ROWS, OUT));
    CHECK_OK(dsrt_kh_bias_grad(dy, db2, ROWS, OUT));
    CHECK(memcmp(db, db2, sizeof db) == 0);
    for (int o = 0; o < OUT; o++) {
        double s = 0, a = 0;
        for (int k = 0; k < ROWS; k++) s += dy[k * OUT + o], a += fabs(dy[k * OUT + o]);
        CHECK(fabs(db[o] - s) <= 1e-5 * a);
    }
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

int main(void) {
    RUN(test_staging);
    RUN(test_dropout);
    RUN(test_softmax);
    RUN(test_bn_sync);
    RUN(test_optimizer);
    RUN(test_pad);
    RUN(test_relu_bias_convert);
    return TEST_RESULT();
}

/*
 * What the two tests of the GPU backend's kernels share: test_gpu_kernels
 * (on a device) and test_nn_kernels (their bodies on the host, against the
 * CPU backend). Float comparisons that print the first misses, the random
 * values they draw, tensor indexing in either layout, and the optimizer's
 * test net and gradients. Where the C compiler may fuse multiplies and adds
 * in the references (__FMA__), FUSED_TOL relaxes bit-for-bit checks to 1e-6.
 */
#ifndef DSRT_TEST_KERNELCHECK_H
#define DSRT_TEST_KERNELCHECK_H

#include "nn/kernels_body.h"
#include "task.h"

#include <math.h>
#include <stdio.h>

#ifdef __FMA__
#define FUSED_TOL 1e-6
#else
#define FUSED_TOL 0.0
#endif

static inline float uniform(dsrt_rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)dsrt_rng_uniform(r);
}

/* Elements of got that differ from want by more than rel * |want| + abs
 * (NaN matches NaN; with rel = abs = 0, the bits must match); prints the
 * first few. */
static inline int mismatches(const char *what, const float *got, const float *want, size_t n,
                             double rel, double abs) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        int ok;
        if (isnan(want[i]) || isnan(got[i]))
            ok = isnan(want[i]) && isnan(got[i]);
        else if (rel == 0 && abs == 0)
            ok = dsrt_f32_bits(got[i]) == dsrt_f32_bits(want[i]);
        else
            ok = fabs((double)got[i] - want[i]) <= rel * fabs((double)want[i]) + abs;
        if (!ok && bad++ < 5)
            fprintf(stderr, "  %s[%zu]: got %.9g, want %.9g\n", what, i, got[i], want[i]);
    }
    return bad;
}

/* Index of logical element (b, c, h, w) in a layout. */
static inline size_t at(const dsrt_k_desc *d, size_t b, int c, int h, int w) {
    if (d->nhwc) return ((b * d->h + h) * d->w + w) * d->c + c;
    return ((b * d->c + c) * d->h + h) * d->w + w;
}

/* A net with multi-block segments (fc 64 -> 100: 6400 weights), factors,
 * and a frozen layer. */
static const char *const OPT_NET = "input size=6x6x2\n"
                                   "conv filters=4 size=3 wlr=2 bl2=0.5\n"
                                   "batchnorm wl2=0\n"
                                   "relu\n"
                                   "fc outputs=100 wl2=3 blr=0.5\n"
                                   "relu\n"
                                   "fc outputs=classes wlr=0 blr=0\n"
                                   "softmax\n";

/* The padding cases: pads of either layout and type with 0, -infinity (max
 * pooling) and another fill, then crops (the backward of a pad), plain and
 * accumulating. */
#define KC_X                                                                                       \
    { 2, 3, 5, 6, 0, DSRT_K_F32 }
#define KC_X_HWC                                                                                   \
    { 2, 3, 5, 6, 1, DSRT_K_F32 }
static const struct {
    dsrt_k_desc x, y;
    int top, left;
    float fill;
    int accumulate;
} PAD_CASES[] = {
    {KC_X, {2, 3, 8, 9, 0, DSRT_K_F32}, 1, 2, -INFINITY, 0},
    {KC_X, {2, 3, 8, 9, 0, DSRT_K_F32}, 0, 0, 0.0f, 0},
    {KC_X, {2, 3, 8, 9, 0, DSRT_K_F32}, 3, 3, 0.0f, 0},
    {KC_X, {2, 3, 8, 9, 1, DSRT_K_BF16}, 2, 1, -INFINITY, 0},
    {KC_X_HWC, {2, 3, 8, 9, 0, DSRT_K_F32}, 1, 0, 0.5f, 0},
    {KC_X, {2, 3, 3, 4, 0, DSRT_K_F32}, -1, -2, 0.0f, 0},
    {KC_X, {2, 3, 3, 4, 0, DSRT_K_F32}, -2, -1, 0.0f, 1},
    {KC_X, {2, 3, 3, 4, 1, DSRT_K_BF16}, -1, -1, 0.0f, 1},
};
/* A pad between tensors of other channel counts: refused. */
static const dsrt_k_desc PAD_BAD_X = KC_X, PAD_BAD_Y = {2, 4, 5, 6, 0, DSRT_K_F32};

/* The solvers, and the gradient-threshold methods each is tested with:
 * none; per tensor and global norms (segment norms are about 0.1 to 40:
 * some clipped, some not), one never reached; absolute values. */
static const dsrt_solver OPT_SOLVERS[] = {DSRT_SOLVER_SGDM, DSRT_SOLVER_ADAM, DSRT_SOLVER_RMSPROP};
static const struct {
    int clip; /* dsrt_grad_clip, or -1: none */
    double threshold;
} OPT_CLIPS[] = {{-1, INFINITY},
                 {DSRT_CLIP_L2NORM, 1.5},
                 {DSRT_CLIP_GLOBAL_L2NORM, 2.0},
                 {DSRT_CLIP_GLOBAL_L2NORM, 1e6},
                 {DSRT_CLIP_ABSOLUTE, 0.05}};

/* Gradients of step `step` (seed picks the draws): each segment at its own
 * scale, so that norm clipping applies to some and not others. */
static inline void make_grads(float *g, size_t n_params, const dsrt_k_segment *seg, int n_seg,
                              uint64_t seed, int step) {
    dsrt_rng r = dsrt_rng_init(seed, (uint64_t)step, 0, 0);
    for (size_t i = 0; i < n_params; i++) g[i] = uniform(&r, -0.1f, 0.1f);
    for (int k = 0; k < n_seg; k++) {
        float s = k % 3 == 0 ? 0.2f : k % 3 == 1 ? 1.0f : 8.0f;
        for (size_t i = 0; i < seg[k].n; i++) g[seg[k].off + i] *= s;
    }
}

#endif

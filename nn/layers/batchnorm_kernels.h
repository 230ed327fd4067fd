/*
 * Batch normalisation's own kernels (nn/layers/batchnorm.c), which its GPU
 * part (batchnorm_cuda.c) runs where cuDNN's are not the CPU backend's
 * arithmetic: synchronised batchnorm (the sums each worker makes, the
 * statistics from the summed sums, the input gradient with the global
 * terms) and the output from given statistics, the ReLU after it folded in
 * both ways. As nn/kernels.h lays a kernel out: the bodies, the kernels'
 * arguments, their runs on the host, and the launchers
 * (nn/layers/batchnorm.cu).
 */
#ifndef DSRT_NN_LAYERS_BATCHNORM_KERNELS_H
#define DSRT_NN_LAYERS_BATCHNORM_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Synchronised batch normalisation: the per-channel sums in tiles
// (nn/kernels_body.h), the statistics one thread a channel, the output and
// the input gradient one thread an element
//
// x, dy, y and dx are tensors of d (either layout, either type); the sums,
// statistics and parameters are per channel. Where the layer computes the
// ReLU after it (y, its output, given), the backward reads dy through the
// ReLU's backward: y > 0 ? dy : dy * leak.

static inline int dsrt_kb_bn_ok(const dsrt_k_desc *d) {
    return dsrt_kb_desc_ok(d);
}

/* dy at element i, through the folded ReLU when y is given. */
static inline DSRT_HOST_DEVICE float dsrt_kb_bn_dy(const dsrt_k_desc *d, const void *dy,
                                                   const void *y, float leak, size_t i) {
    float v = dsrt_kb_load(dy, d->type, i);
    if (y && !(dsrt_kb_load(y, d->type, i) > 0.0f)) v = DSRT_FMUL(v, leak);
    return v;
}

/* Lane l's share of tile t of channel ch: the sums of x and x^2, or (dy
 * given) of dy' and dy' (x - mu) is, dy' being dy through the folded ReLU
 * when y is given. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_lane(const dsrt_k_desc *d, const void *x,
                                                    const void *dy, const void *y, float leak,
                                                    float mu, float is, size_t t, int ch, int l,
                                                    float *s, float *q) {
    size_t rows = (size_t)d->n * d->h * d->w, r1 = (t + 1) * DSRT_KB_BN_ROWS;
    if (r1 > rows) r1 = rows;
    float a = 0.0f, ae = 0.0f, b = 0.0f, be = 0.0f;
    for (size_t j = t * DSRT_KB_BN_ROWS + (size_t)l; j < r1; j += DSRT_KB_BN_LANES) {
        size_t i = dsrt_kb_bn_index(d, ch, j);
        float v = dsrt_kb_load(x, d->type, i);
        if (dy) {
            float g = dsrt_kb_bn_dy(d, dy, y, leak, i);
            dsrt_kb_kahan(&a, &ae, g);
            dsrt_kb_kahan(&b, &be, DSRT_FMUL(g, DSRT_FMUL(DSRT_FSUB(v, mu), is)));
        } else {
            dsrt_kb_kahan(&a, &ae, v);
            dsrt_kb_kahan(&b, &be, DSRT_FMUL(v, v));
        }
    }
    *s = DSRT_FSUB(a, ae);
    *q = DSRT_FSUB(b, be);
}

/* Channel k's batch statistics and running averages from the summed sums. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_stats(const double *sums, int c, float eps,
                                                     float momentum, float *mean, float *var,
                                                     float *inv, float *run_mean, float *run_var,
                                                     size_t k) {
    double count = sums[2 * c];
    if (!(count > 0)) {
        mean[k] = var[k] = inv[k] = NAN;
        return;
    }
    double m = sums[k] / count, v = DSRT_DSUB(sums[c + k] / count, DSRT_DMUL(m, m));
    float mf = (float)m, vf = (float)(v > 0 ? v : 0);
    mean[k] = mf;
    var[k] = vf;
    inv[k] = (float)(1.0 / sqrt(DSRT_DADD((double)vf, (double)eps)));
    float unbias = count > 1 ? (float)(count / (count - 1)) : 1.0f,
          keep = DSRT_FSUB(1.0f, momentum);
    run_mean[k] = DSRT_FADD(DSRT_FMUL(keep, run_mean[k]), DSRT_FMUL(momentum, mf));
    run_var[k] = DSRT_FADD(DSRT_FMUL(keep, run_var[k]), DSRT_FMUL(DSRT_FMUL(momentum, vf), unbias));
}

/* Element i of the input gradient with the global terms:
 * a dy - a S1 / M - (x - mean) a inv S2 / M, a = scale * inv. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_bwd_dx(const dsrt_k_desc *d, const void *x,
                                                      const void *dy, const void *y, float leak,
                                                      const float *mean, const float *inv,
                                                      const float *scale, const double *sums,
                                                      double inv_m, void *dx, size_t i) {
    int c = d->c, ch = dsrt_kb_channel(d, i);
    double is = inv[ch], a = DSRT_DMUL((double)scale[ch], is);
    double k1 = DSRT_DMUL(DSRT_DMUL(a, sums[ch]), inv_m);
    double k2 = DSRT_DMUL(DSRT_DMUL(DSRT_DMUL(a, sums[c + ch]), inv_m), is);
    double g = dsrt_kb_bn_dy(d, dy, y, leak, i), xv = dsrt_kb_load(x, d->type, i);
    dsrt_kb_store(
        dx, d->type, i,
        (float)DSRT_DSUB(DSRT_DSUB(DSRT_DMUL(a, g), k1), DSRT_DMUL(xv - (double)mean[ch], k2)));
}

/* Element i of the normalised output: (x - mean) inv scale + shift, in
 * double, then the ReLU when relu; inv NULL: 1 / sqrt(var + eps) (running
 * statistics at inference). */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_apply(const dsrt_k_desc *d, const void *x,
                                                     const float *mean, const float *inv,
                                                     const float *var, float eps,
                                                     const float *scale, const float *shift,
                                                     int relu, float leak, void *y, size_t i) {
    int ch = dsrt_kb_channel(d, i);
    double is = inv ? (double)inv[ch] : 1.0 / sqrt(DSRT_DADD((double)var[ch], (double)eps));
    double xv = dsrt_kb_load(x, d->type, i);
    double v = DSRT_DADD(DSRT_DMUL(DSRT_DMUL(xv - (double)mean[ch], is), (double)scale[ch]),
                         (double)shift[ch]);
    float f = (float)v;
    if (relu && f < 0.0f) f = DSRT_FMUL(f, leak);
    dsrt_kb_store(y, d->type, i, f);
}

// ----------------------------------------------------------------------------
// The kernels' arguments

/* The tiles' sums: a block 32 channels of a tile (tiles x channel groups). */
typedef struct {
    dsrt_k_desc d;
    const void *x, *dy, *y;
    float leak;
    const float *mean, *inv;
    float *part; /* (tiles, 2c) */
} bn_tile_args;

typedef struct {
    const float *part;
    size_t tiles;
    int c;
    double *sums;
    double count; /* the forward's n h w (sums[2c]); the backward's: -1, none */
    float *dscale, *dshift;
} bn_total_args;

typedef struct {
    const double *sums;
    int c;
    float eps, momentum;
    float *mean, *var, *inv, *run_mean, *run_var;
} bn_stats_args;

typedef struct {
    dsrt_k_desc d;
    const void *x, *dy, *y;
    float leak;
    const float *mean, *inv, *scale;
    const double *sums, *count;
    size_t total;
    void *dx;
} bn_bwd_dx_args;

typedef struct {
    dsrt_k_desc d;
    const void *x;
    const float *mean, *inv, *var;
    float eps;
    const float *scale, *shift;
    int relu;
    float leak;
    void *y;
    size_t total;
} bn_apply_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
/* Each tile's lanes and their tree, the partials in part. */
static inline void bn_tile_kernel_host(const void *p) {
    const bn_tile_args *a = (const bn_tile_args *)p;
    for (size_t t = 0, tiles = dsrt_kb_bn_tiles(&a->d); t < tiles; t++)
        for (int ch = 0; ch < a->d.c; ch++) {
            float vs[DSRT_KB_BN_LANES], vq[DSRT_KB_BN_LANES];
            for (int l = 0; l < DSRT_KB_BN_LANES; l++)
                dsrt_kb_bn_lane(&a->d, a->x, a->dy, a->y, a->leak, a->dy ? a->mean[ch] : 0.0f,
                                a->dy ? a->inv[ch] : 0.0f, t, ch, l, &vs[l], &vq[l]);
            dsrt_kb_tile_part(vs, vq, a->part, t, a->d.c, ch);
        }
}

static inline void bn_total_kernel_host(const void *p) {
    const bn_total_args *a = (const bn_total_args *)p;
    for (int ch = 0; ch < a->c; ch++) {
        double s, q;
        dsrt_kb_bn_total(a->part, a->tiles, a->c, ch, &s, &q);
        a->sums[ch] = s;
        a->sums[a->c + ch] = q;
        if (a->dshift) a->dshift[ch] = (float)s;
        if (a->dscale) a->dscale[ch] = (float)q;
        if (ch == 0 && a->count >= 0) a->sums[2 * a->c] = a->count;
    }
}

static inline void bn_stats_kernel_host(const void *p) {
    const bn_stats_args *a = (const bn_stats_args *)p;
    for (int k = 0; k < a->c; k++)
        dsrt_kb_bn_stats(a->sums, a->c, a->eps, a->momentum, a->mean, a->var, a->inv, a->run_mean,
                         a->run_var, (size_t)k);
}

static inline void bn_bwd_dx_kernel_host(const void *p) {
    const bn_bwd_dx_args *a = (const bn_bwd_dx_args *)p;
    double inv_m = 1.0 / *a->count;
    for (size_t i = 0; i < a->total; i++)
        dsrt_kb_bn_bwd_dx(&a->d, a->x, a->dy, a->y, a->leak, a->mean, a->inv, a->scale, a->sums,
                          inv_m, a->dx, i);
}

static inline void bn_apply_kernel_host(const void *p) {
    const bn_apply_args *a = (const bn_apply_args *)p;
    for (size_t i = 0; i < a->total; i++)
        dsrt_kb_bn_apply(&a->d, a->x, a->mean, a->inv, a->var, a->eps, a->scale, a->shift, a->relu,
                         a->leak, a->y, i);
}

/* The sums forward (dy NULL) or backward, as dsrt_k_bn_sums and
 * dsrt_k_bn_bwd_sums make them. */
static inline int bn_tiles_host(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                                float leak, const float *mean, const float *inv, double *sums,
                                float *dscale, float *dshift, float *work) {
    if (!dsrt_kb_bn_ok(xd) || !work) return -EINVAL;
    bn_tile_args a = {*xd, x, dy, y, leak, mean, inv, work};
    bn_total_args t = {work,
                       dsrt_kb_bn_tiles(xd),
                       xd->c,
                       sums,
                       dy ? -1.0 : (double)((size_t)xd->n * xd->h * xd->w),
                       dscale,
                       dshift};
    bn_tile_kernel_host(&a);
    bn_total_kernel_host(&t);
    return 0;
}

static inline int dsrt_kh_bn_sums(const dsrt_k_desc *xd, const void *x, double *sums, float *work) {
    return bn_tiles_host(xd, x, NULL, NULL, 0.0f, NULL, NULL, sums, NULL, NULL, work);
}

static inline int dsrt_kh_bn_stats(const double *sums, int c, float eps, float momentum,
                                   float *mean, float *var, float *inv, float *run_mean,
                                   float *run_var) {
    if (c < 0) return -EINVAL;
    bn_stats_args a = {sums, c, eps, momentum, mean, var, inv, run_mean, run_var};
    bn_stats_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_bn_bwd_sums(const dsrt_k_desc *xd, const void *x, const void *dy,
                                      const void *y, float leak, const float *mean,
                                      const float *inv, double *sums, float *dscale, float *dshift,
                                      float *work) {
    if (!dy || !mean || !inv) return -EINVAL;
    return bn_tiles_host(xd, x, dy, y, leak, mean, inv, sums, dscale, dshift, work);
}

static inline int dsrt_kh_bn_bwd_dx(const dsrt_k_desc *xd, const void *x, const void *dy,
                                    const void *y, float leak, const float *mean, const float *inv,
                                    const float *scale, const double *sums, const double *count,
                                    void *dx) {
    if (!dsrt_kb_bn_ok(xd)) return -EINVAL;
    bn_bwd_dx_args a = {*xd, x, dy, y, leak, mean, inv, scale, sums, count, dsrt_kb_count(xd), dx};
    bn_bwd_dx_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_bn_apply(const dsrt_k_desc *xd, const void *x, const float *mean,
                                   const float *inv, const float *var, float eps,
                                   const float *scale, const float *shift, int relu, float leak,
                                   void *y) {
    if (!dsrt_kb_bn_ok(xd) || (!inv && !var)) return -EINVAL;
    bn_apply_args a = {*xd, x, mean, inv, var, eps, scale, shift, relu, leak, y, dsrt_kb_count(xd)};
    bn_apply_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
// The tensors x, dy, y and dx are of xd (either layout, either type);
// statistics and parameters are float32, a value a channel (c = xd->c).

/*
 * The sums of synchronised batchnorm (dsrt_bn_sums in include/dsrt/nn.h)
 * over x: sums[ch] = sum of x, sums[c + ch] = sum of x^2 over channel ch,
 * sums[2c] = n h w. A tiled reduction (nn/kernels_body.h says how: float
 * compensated sums in tiles, the tiles added in double), each channel in
 * one fixed order (identical from run to run). sums: 2c + 1 device doubles;
 * work: dsrt_kb_bn_work(xd) device floats.
 */
cudaError_t dsrt_k_bn_sums(const dsrt_k_desc *xd, const void *x, double *sums, float *work,
                           cudaStream_t stream);

/*
 * The batch statistics from the summed sums (over every worker, 2c + 1),
 * as the CPU backend's synchronised batchnorm: with M = sums[2c], mean =
 * sums[ch] / M and the biased variance var = sums[c + ch] / M - mean^2
 * (0 where rounding makes it negative), each rounded to float, and inv =
 * 1 / sqrt(var + eps). Then the running statistics (run_mean, run_var: c
 * floats each, updated in place) as the CPU backend updates them:
 * r = (1 - momentum) r + momentum batch, the variance times M / (M - 1)
 * (1 for M <= 1). A count that is not positive (a broken hook) makes mean,
 * var and inv NaN and leaves the running statistics alone.
 */
cudaError_t dsrt_k_bn_stats(const double *sums, int c, float eps, float momentum, float *mean,
                            float *var, float *inv, float *run_mean, float *run_var,
                            cudaStream_t stream);

/*
 * The backward sums over dy and x with the layer's mean and inv (xhat = (x
 * - mean) * inv): sums[ch] = sum of dy, sums[c + ch] = sum of dy * xhat,
 * tiled as the forward's (work the same size), each channel in a fixed
 * order; with y (the layer's output) dy is
 * read through the ReLU the layer computes after it (y > 0 ? dy : dy *
 * leak). dshift and dscale (c floats each; may be NULL) receive the same
 * sums rounded to float: this worker's gradients of the shift and the
 * scale. sums: 2c device doubles.
 */
cudaError_t dsrt_k_bn_bwd_sums(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                               float leak, const float *mean, const float *inv, double *sums,
                               float *dscale, float *dshift, float *work, cudaStream_t stream);

/*
 * The input gradient with the global terms, as the CPU backend's
 * synchronised batchnorm: with a = scale * inv, M = *count (the summed
 * count, a device double) and S1, S2 the summed backward sums (2c),
 *     dx = a dy - a S1 / M - (x - mean) a inv S2 / M,
 * in double, rounded to xd's type; dy through the folded ReLU as for the
 * sums. dx may not alias x, dy or y.
 */
cudaError_t dsrt_k_bn_bwd_dx(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                             float leak, const float *mean, const float *inv, const float *scale,
                             const double *sums, const double *count, void *dx,
                             cudaStream_t stream);

/*
 * Batchnorm's output: y = (x - mean) inv scale + shift per channel, in
 * double, rounded to xd's type, then the ReLU after it when relu (leaky
 * with leak). With inv NULL, inv = 1 / sqrt(var + eps) (the running
 * statistics, at inference). In place (y == x) allowed.
 */
cudaError_t dsrt_k_bn_apply(const dsrt_k_desc *xd, const void *x, const float *mean,
                            const float *inv, const float *var, float eps, const float *scale,
                            const float *shift, int relu, float leak, void *y, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

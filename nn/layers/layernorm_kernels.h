/*
 * Layer normalisation's kernels (nn/layers/layernorm.c), which its GPU part
 * (layernorm_cuda.c) runs each way: over the channels of each pixel, one
 * warp a pixel, sums in double in a fixed order (gamma's and beta's
 * gradients are the engine's channel sums, nn/kernels.h dsrt_k_chan_grads).
 * As nn/kernels.h lays a kernel out: the bodies, the kernels' arguments,
 * their runs on the host, and the launchers (nn/layers/layernorm.cu).
 */
#ifndef DSRT_NN_LAYERS_LAYERNORM_KERNELS_H
#define DSRT_NN_LAYERS_LAYERNORM_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Layer normalisation over the channels of each pixel: n h w rows of c
// values (row j image by image, pixel by pixel; its values at
// dsrt_kb_bn_index), one warp a row, lane l taking the channels l, l + 32,
// ...; the lanes' sums in double, combined by the warp's butterfly (lane l
// adds lane l ^ o, o halving from 16)
//
// Forward: mean = sum x / c, then var = sum (x - mean)^2 / c (a second
// pass), rstd = 1 / sqrt(var + eps); mean and rstd are kept in float, and
// y = (x - mean) rstd gamma + beta is computed from them in double, rounded
// once. Backward from the kept statistics, with g = dy gamma and xhat =
// (x - mean) rstd:
//     dx = rstd (g - sum g / c - xhat sum (g xhat) / c),
// in double, rounded once; the gradients of gamma and beta are the channel
// sums above of dy over xhat.

static inline int dsrt_kb_ln_ok(const dsrt_k_desc *d, const float *gamma, const float *beta) {
    return dsrt_kb_desc_ok(d) && d->c > 0 && gamma && beta;
}

static inline int dsrt_kb_ln_bwd_ok(const dsrt_k_desc *d, const float *gamma, const float *mean,
                                    const float *rstd) {
    return dsrt_kb_desc_ok(d) && d->c > 0 && gamma && mean && rstd;
}

/* Lane l's share of row j: the sum of x (pass 0), or of (x - mean)^2. */
static inline DSRT_HOST_DEVICE double dsrt_kb_ln_lane_sum(const dsrt_k_desc *d, const void *x,
                                                          size_t j, int l, int pass, double mean) {
    double s = 0.0;
    for (int ch = l; ch < d->c; ch += DSRT_KB_WARP) {
        double v = dsrt_kb_load(x, d->type, dsrt_kb_bn_index(d, ch, j));
        if (pass) {
            v = DSRT_DSUB(v, mean);
            v = DSRT_DMUL(v, v);
        }
        s = DSRT_DADD(s, v);
    }
    return s;
}

/* 1 / sqrt(var + eps) from the row's sum of squared deviations q. */
static inline DSRT_HOST_DEVICE float dsrt_kb_ln_rstd(double q, int c, float eps) {
    return (float)(1.0 / sqrt(DSRT_DADD(q / (double)c, (double)eps)));
}

/* Lane l's outputs of row j. */
static inline DSRT_HOST_DEVICE void dsrt_kb_ln_lane_apply(const dsrt_k_desc *d, const void *x,
                                                          const float *gamma, const float *beta,
                                                          float mean, float rstd, void *y, size_t j,
                                                          int l) {
    for (int ch = l; ch < d->c; ch += DSRT_KB_WARP) {
        size_t i = dsrt_kb_bn_index(d, ch, j);
        double xh =
            DSRT_DMUL(DSRT_DSUB((double)dsrt_kb_load(x, d->type, i), (double)mean), (double)rstd);
        double v = DSRT_DADD(DSRT_DMUL(xh, (double)gamma[ch]), (double)beta[ch]);
        dsrt_kb_store(y, d->type, i, (float)v);
    }
}

/* Lane l's share of row j's backward sums: of g (*sg) and of g xhat
 * (*sgx). */
static inline DSRT_HOST_DEVICE void dsrt_kb_ln_lane_bwd(const dsrt_k_desc *d, const void *x,
                                                        const void *dy, const float *gamma,
                                                        float mean, float rstd, size_t j, int l,
                                                        double *sg, double *sgx) {
    double a = 0.0, b = 0.0;
    for (int ch = l; ch < d->c; ch += DSRT_KB_WARP) {
        size_t i = dsrt_kb_bn_index(d, ch, j);
        double g = DSRT_DMUL((double)dsrt_kb_load(dy, d->type, i), (double)gamma[ch]);
        double xh =
            DSRT_DMUL(DSRT_DSUB((double)dsrt_kb_load(x, d->type, i), (double)mean), (double)rstd);
        a = DSRT_DADD(a, g);
        b = DSRT_DADD(b, DSRT_DMUL(g, xh));
    }
    *sg = a;
    *sgx = b;
}

/* Lane l's input gradients of row j, from the row's totals sg and sgx. */
static inline DSRT_HOST_DEVICE void dsrt_kb_ln_lane_dx(const dsrt_k_desc *d, const void *x,
                                                       const void *dy, const float *gamma,
                                                       float mean, float rstd, double sg,
                                                       double sgx, void *dx, size_t j, int l) {
    double ma = sg / (double)d->c, mb = sgx / (double)d->c;
    for (int ch = l; ch < d->c; ch += DSRT_KB_WARP) {
        size_t i = dsrt_kb_bn_index(d, ch, j);
        double g = DSRT_DMUL((double)dsrt_kb_load(dy, d->type, i), (double)gamma[ch]);
        double xh =
            DSRT_DMUL(DSRT_DSUB((double)dsrt_kb_load(x, d->type, i), (double)mean), (double)rstd);
        double v = DSRT_DMUL((double)rstd, DSRT_DSUB(DSRT_DSUB(g, ma), DSRT_DMUL(xh, mb)));
        dsrt_kb_store(dx, d->type, i, (float)v);
    }
}

// ----------------------------------------------------------------------------
// The kernels' arguments

/* One warp a row (SOFT_WARPS rows a block), rows strided over the grid. */
typedef struct {
    dsrt_k_desc d;
    const void *x;
    const float *gamma, *beta;
    float eps;
    void *y;
    float *mean, *rstd;
    size_t rows;
} ln_fwd_args;

typedef struct {
    dsrt_k_desc d;
    const void *x, *dy;
    const float *gamma, *mean, *rstd;
    void *dx;
    size_t rows;
} ln_bwd_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void ln_fwd_kernel_host(const void *p) {
    const ln_fwd_args *a = (const ln_fwd_args *)p;
    const dsrt_k_desc *d = &a->d;
    double v[DSRT_KB_WARP];
    for (size_t j = 0; j < a->rows; j++) {
        for (int l = 0; l < DSRT_KB_WARP; l++) v[l] = dsrt_kb_ln_lane_sum(d, a->x, j, l, 0, 0.0);
        double m = dsrt_kh_butterfly(v) / (double)d->c;
        for (int l = 0; l < DSRT_KB_WARP; l++) v[l] = dsrt_kb_ln_lane_sum(d, a->x, j, l, 1, m);
        double q = dsrt_kh_butterfly(v);
        float mf = (float)m, rf = dsrt_kb_ln_rstd(q, d->c, a->eps);
        if (a->mean) {
            a->mean[j] = mf;
            a->rstd[j] = rf;
        }
        for (int l = 0; l < DSRT_KB_WARP; l++)
            dsrt_kb_ln_lane_apply(d, a->x, a->gamma, a->beta, mf, rf, a->y, j, l);
    }
}

static inline void ln_bwd_kernel_host(const void *p) {
    const ln_bwd_args *a = (const ln_bwd_args *)p;
    double sg[DSRT_KB_WARP], sgx[DSRT_KB_WARP];
    for (size_t j = 0; j < a->rows; j++) {
        for (int l = 0; l < DSRT_KB_WARP; l++)
            dsrt_kb_ln_lane_bwd(&a->d, a->x, a->dy, a->gamma, a->mean[j], a->rstd[j], j, l, &sg[l],
                                &sgx[l]);
        double g = dsrt_kh_butterfly(sg), gx = dsrt_kh_butterfly(sgx);
        for (int l = 0; l < DSRT_KB_WARP; l++)
            dsrt_kb_ln_lane_dx(&a->d, a->x, a->dy, a->gamma, a->mean[j], a->rstd[j], g, gx, a->dx,
                               j, l);
    }
}

static inline int dsrt_kh_ln_fwd(const dsrt_k_desc *d, const void *x, const float *gamma,
                                 const float *beta, float eps, void *y, float *mean, float *rstd) {
    if (!dsrt_kb_ln_ok(d, gamma, beta) || !mean != !rstd) return -EINVAL;
    ln_fwd_args a = {*d, x, gamma, beta, eps, y, mean, rstd, (size_t)d->n * d->h * d->w};
    ln_fwd_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_ln_bwd(const dsrt_k_desc *d, const void *x, const void *dy,
                                 const float *gamma, const float *mean, const float *rstd,
                                 void *dx) {
    if (!dsrt_kb_ln_bwd_ok(d, gamma, mean, rstd)) return -EINVAL;
    ln_bwd_args a = {*d, x, dy, gamma, mean, rstd, dx, (size_t)d->n * d->h * d->w};
    ln_bwd_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/* Layer normalisation over the channels of each pixel of x (d: either
 * layout and type): y = (x - mean) rstd gamma + beta (gamma, beta: c
 * floats), each pixel's mean and rstd = 1 / sqrt(var + eps) kept in mean
 * and rstd (n h w floats each) unless NULL. The bodies above say in what
 * order and precision. y may not alias x. */
cudaError_t dsrt_k_ln_fwd(const dsrt_k_desc *d, const void *x, const float *gamma,
                          const float *beta, float eps, void *y, float *mean, float *rstd,
                          cudaStream_t stream);

/* Its input gradient from x, dy and the forward's mean and rstd: dx =
 * rstd (g - mean of g - xhat mean of g xhat) over each pixel's channels,
 * g = dy gamma, xhat = (x - mean) rstd. dx may not alias x or dy. */
cudaError_t dsrt_k_ln_bwd(const dsrt_k_desc *d, const void *x, const void *dy, const float *gamma,
                          const float *mean, const float *rstd, void *dx, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

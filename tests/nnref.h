/*
 * Plain C references of the CPU backend's definitions (nn/backend_cpu.c),
 * written out as that backend computes them, for tests of the other
 * implementations: dropout masks drawn sequentially, one draw a pair of
 * elements (and stochastic depth's, a pair of images), softmax with cross-entropy in double,
 * synchronised batch normalisation's sums, statistics and input gradient (step_bn_sync_fwd,
 * step_bn_running and step_bn_sync_bwd), and the backward passes of pooling
 * and local response normalisation (oneDNN's definitions: the first
 * largest element of a window takes its gradient; LRN's derivative).
 */
#ifndef DSRT_TEST_NNREF_H
#define DSRT_TEST_NNREF_H

#include "core/internal.h"

#include <math.h>

/* The mask (0 or 1 / (1 - p)) of n elements in logical NCHW order of layer
 * `layer` at step `iter` of a net seeded with `seed`. */
static inline void ref_dropout_mask(float *m, size_t n, uint64_t seed, uint64_t iter,
                                    uint64_t layer, float p) {
    float keep = 1.0f / (1.0f - p);
    uint32_t thresh = (uint32_t)fmin(4294967295.0, ldexp((double)p, 32));
    dsrt_rng rng = dsrt_rng_init(seed, iter, layer, 0x44524f50u /* "DROP" */);
    for (size_t k = 0; k < n; k += 2) {
        uint64_t r = dsrt_rng_u64(&rng);
        m[k] = (uint32_t)r >= thresh ? keep : 0.0f;
        if (k + 1 < n) m[k + 1] = (uint32_t)(r >> 32) >= thresh ? keep : 0.0f;
    }
}

/* Stochastic depth's factor (0 or 1 / (1 - p)) of each of n images of
 * layer `layer` at step `iter` of a net seeded with `seed`: one draw a pair
 * of images, as dropout's a pair of elements, on its own stream. */
static inline void ref_drop_path_mask(float *m, int n, uint64_t seed, uint64_t iter, uint64_t layer,
                                      float p) {
    float keep = 1.0f / (1.0f - p);
    uint32_t thresh = (uint32_t)fmin(4294967295.0, ldexp((double)p, 32));
    dsrt_rng rng = dsrt_rng_init(seed, iter, layer, 0x44505448u /* "DPTH" */);
    for (int k = 0; k < n; k += 2) {
        uint64_t r = dsrt_rng_u64(&rng);
        m[k] = (uint32_t)r >= thresh ? keep : 0.0f;
        if (k + 1 < n) m[k + 1] = (uint32_t)(r >> 32) >= thresh ? keep : 0.0f;
    }
}

/* Softmax of z (n, k) into probs, the mean cross-entropy against labels and
 * the count of rows whose first maximum is the label. */
static inline void ref_softmax_xent(const float *z, const int32_t *labels, int n, int k,
                                    float *probs, double *loss_out, int *correct_out) {
    double loss = 0;
    int correct = 0;
    for (int b = 0; b < n; b++) {
        const float *zb = z + (size_t)b * k;
        float *pb = probs + (size_t)b * k;
        float mx = zb[0];
        int arg = 0;
        for (int j = 1; j < k; j++)
            if (zb[j] > mx) mx = zb[j], arg = j;
        double sum = 0;
        for (int j = 0; j < k; j++) sum += exp((double)zb[j] - mx);
        double inv = 1.0 / sum, lse = log(sum);
        for (int j = 0; j < k; j++) pb[j] = (float)(exp((double)zb[j] - mx) * inv);
        int y = labels[b];
        loss += lse - ((double)zb[y] - mx);
        correct += arg == y;
        if (!isfinite(mx)) loss = NAN;
    }
    *loss_out = loss / n;
    *correct_out = correct;
}

/* Forward sums of x (n, c, hw) NCHW: sum, sum of squares, count (2c + 1). */
static inline void ref_bn_sums(const float *x, int n, int c, int hw, double *sums) {
    for (int ch = 0; ch < c; ch++) {
        double s = 0, q = 0;
        for (int b = 0; b < n; b++)
            for (int k = 0; k < hw; k++) {
                double v = x[((size_t)b * c + ch) * hw + k];
                s += v;
                q += v * v;
            }
        sums[ch] = s;
        sums[c + ch] = q;
    }
    sums[2 * c] = (double)n * hw;
}

/* Batch statistics from summed sums, then the running statistics. */
static inline void ref_bn_stats(const double *sums, int c, float eps, float momentum, float *mean,
                                float *var, float *inv, float *run_mean, float *run_var) {
    double count = sums[2 * c];
    for (int k = 0; k < c; k++) {
        if (!(count > 0)) {
            mean[k] = var[k] = inv[k] = NAN;
            continue;
        }
        double m = sums[k] / count, v = sums[c + k] / count - m * m;
        mean[k] = (float)m;
        var[k] = (float)(v > 0 ? v : 0);
        inv[k] = (float)(1.0 / sqrt((double)var[k] + eps));
        float unbias = count > 1 ? (float)(count / (count - 1)) : 1.0f;
        run_mean[k] = (1.0f - momentum) * run_mean[k] + momentum * mean[k];
        run_var[k] = (1.0f - momentum) * run_var[k] + momentum * var[k] * unbias;
    }
}

/* Backward sums: sum of dy and of dy * xhat a channel (2c); dscale and
 * dshift (may be NULL) get them rounded to float. */
static inline void ref_bn_bwd_sums(const float *x, const float *dy, const float *mean,
                                   const float *inv, int n, int c, int hw, double *sums,
                                   float *dscale, float *dshift) {
    for (int ch = 0; ch < c; ch++) {
        double s = 0, q = 0, mu = mean[ch], is = inv[ch];
        for (int b = 0; b < n; b++)
            for (int k = 0; k < hw; k++) {
                size_t i = ((size_t)b * c + ch) * hw + k;
                s += dy[i];
                q += dy[i] * ((x[i] - mu) * is);
            }
        sums[ch] = s;
        sums[c + ch] = q;
        if (dshift) dshift[ch] = (float)s;
        if (dscale) dscale[ch] = (float)q;
    }
}

/* The input gradient with the global terms of the summed backward sums. */
static inline void ref_bn_bwd_dx(const float *x, const float *dy, const float *mean,
                                 const float *inv, const float *scale, const double *sums,
                                 double count, int n, int c, int hw, float *dx) {
    for (int b = 0; b < n; b++)
        for (int ch = 0; ch < c; ch++) {
            double is = inv[ch], a = (double)scale[ch] * is;
            double k1 = a * sums[ch] / count, k2 = a * sums[c + ch] / count * is;
            for (int k = 0; k < hw; k++) {
                size_t i = ((size_t)b * c + ch) * hw + k;
                dx[i] = (float)(a * dy[i] - k1 - ((double)x[i] - mean[ch]) * k2);
            }
        }
}

/* Pooling's input gradient over NCHW x (n, c, h, w) from dy (n, c, oh, ow):
 * each window (kh x kw from (-pt, -pl), stride sh x sw) gives its gradient
 * to its first largest element (max 1) or dy / (kh kw) to each of its
 * elements inside the image (max 0: average, padding counted), or dy / the
 * number of those elements (max -1: average over the window's inside). dx
 * is zeroed. */
static inline void ref_pool_bwd(const float *x, const float *dy, float *dx, int n, int c, int h,
                                int w, int oh, int ow, int kh, int kw, int sh, int sw, int pt,
                                int pl, int max) {
    for (size_t i = 0; i < (size_t)n * c * h * w; i++) dx[i] = 0;
    for (int b = 0; b < n; b++)
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < oh; y++)
                for (int z = 0; z < ow; z++) {
                    float g = dy[(((size_t)b * c + ch) * oh + y) * ow + z];
                    size_t arg = 0;
                    float best = -INFINITY, area = (float)(kh * kw);
                    int any = 0;
                    if (max < 0) {
                        int inside = 0;
                        for (int r = 0; r < kh; r++)
                            for (int q = 0; q < kw; q++) {
                                int ih = y * sh - pt + r, iw = z * sw - pl + q;
                                inside += ih >= 0 && iw >= 0 && ih < h && iw < w;
                            }
                        area = (float)inside;
                    }
                    for (int r = 0; r < kh; r++)
                        for (int q = 0; q < kw; q++) {
                            int ih = y * sh - pt + r, iw = z * sw - pl + q;
                            if (ih < 0 || iw < 0 || ih >= h || iw >= w) continue;
                            size_t i = (((size_t)b * c + ch) * h + ih) * w + iw;
                            if (max <= 0)
                                dx[i] += g / area;
                            else if (!any || x[i] > best)
                                best = x[i], arg = i, any = 1;
                        }
                    if (max > 0 && any) dx[arg] += g;
                }
}

/* LRN across channels of NCHW x (n, c, hw): the scale k + alpha / size *
 * (sum of x^2 over the window of channel ch), and the input gradient from
 * the output y and dy, in double. */
static inline double ref_lrn_scale(const float *x, int c, int hw, size_t b, int ch, int k, int size,
                                   double alpha, double kk) {
    double s = 0;
    for (int j = ch - (size - 1) / 2; j <= ch + (size - 1) / 2; j++)
        if (j >= 0 && j < c) {
            double v = x[(b * c + j) * hw + k];
            s += v * v;
        }
    return kk + alpha / size * s;
}

static inline void ref_lrn_bwd(const float *x, const float *y, const float *dy, float *dx, int n,
                               int c, int hw, int size, double alpha, double beta, double kk) {
    for (size_t b = 0; b < (size_t)n; b++)
        for (int ch = 0; ch < c; ch++)
            for (int k = 0; k < hw; k++) {
                size_t i = (b * c + ch) * hw + k;
                double acc = 0;
                for (int j = ch - (size - 1) / 2; j <= ch + (size - 1) / 2; j++)
                    if (j >= 0 && j < c) {
                        size_t ij = (b * c + j) * hw + k;
                        acc += (double)dy[ij] * y[ij] /
                               ref_lrn_scale(x, c, hw, b, j, k, size, alpha, kk);
                    }
                double s = ref_lrn_scale(x, c, hw, b, ch, k, size, alpha, kk);
                dx[i] = (float)(dy[i] * pow(s, -beta) - 2.0 * alpha * beta / size * x[i] * acc);
            }
}

#endif

/*
 * The GPU backend's kernels on the host: the grid of each kernel of
 * nn/kernels.cu walked in plain loops, every element computed by the same
 * body (nn/kernels_body.h) the device runs. Where a kernel reduces, the
 * lanes' shares are kept in arrays and combined in the order the device
 * combines them: a block's tree (dsrt_kb_tree_*, lane t adding lane t + s),
 * a warp's butterfly (lane l adding lane l ^ o, as __shfl_xor_sync hands
 * it), or a bias column's lanes in order. Compiled without contraction of
 * multiplies and adds (-ffp-contract=off), as the device's intrinsics are.
 * tests/kernels_host.h says what each function takes.
 */
#include "kernels_host.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define THREADS DSRT_KB_THREADS
#define WARP    DSRT_KB_WARP

/* The block's tree over THREADS doubles (and ints, when c is not NULL):
 * the result in v[0]. */
static void tree(double *v, int *c) {
    for (int s = THREADS / 2; s > 0; s >>= 1)
        for (int t = 0; t < s; t++) {
            dsrt_kb_tree_d(v, t, s);
            if (c) dsrt_kb_tree_i(c, t, s);
        }
}

// ----------------------------------------------------------------------------
// Input, padding, activations

int dsrt_kh_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm, const float *stats,
                     const dsrt_k_desc *yd, void *y) {
    if (!dsrt_kb_input_u8_ok(pix, norm, stats, yd)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(yd); i < n; i++)
        dsrt_kb_input_u8(x, pix, norm, stats, yd, y, i);
    return 0;
}

int dsrt_kh_input_f32(const float *x, int norm, const float *stats, const dsrt_k_desc *yd,
                      void *y) {
    if (!dsrt_kb_input_ok(norm, stats, yd)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(yd); i < n; i++)
        dsrt_kb_input_f32(x, norm, stats, yd, y, i);
    return 0;
}

int dsrt_kh_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd, void *y, int top,
                int left, float fill, int accumulate) {
    if (!dsrt_kb_pad_ok(xd, yd)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(yd); i < n; i++)
        dsrt_kb_pad(xd, x, yd, y, top, left, fill, accumulate, i);
    return 0;
}

int dsrt_kh_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak) {
    if (!dsrt_kb_type_ok(t)) return -EINVAL;
    for (size_t i = 0; i < n; i++) dsrt_kb_relu_fwd(t, x, y, leak, i);
    return 0;
}

int dsrt_kh_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n, float leak) {
    if (!dsrt_kb_type_ok(t)) return -EINVAL;
    for (size_t i = 0; i < n; i++) dsrt_kb_relu_bwd(t, y, dy, dx, leak, i);
    return 0;
}

int dsrt_kh_act_fwd(dsrt_k_type t, const dsrt_k_act *a, const void *x, void *y, size_t n) {
    if (!dsrt_kb_act_ok(t, a)) return -EINVAL;
    for (size_t i = 0; i < n; i++) dsrt_kb_act_fwd(t, a, x, y, i);
    return 0;
}

int dsrt_kh_act_bwd(dsrt_k_type t, const dsrt_k_act *a, const void *x, const void *y,
                    const void *dy, void *dx, size_t n) {
    if (!dsrt_kb_act_ok(t, a)) return -EINVAL;
    for (size_t i = 0; i < n; i++) dsrt_kb_act_bwd(t, a, x, y, dy, dx, i);
    return 0;
}

int dsrt_kh_bias_act(const dsrt_k_desc *d, const void *x, const float *b, void *y, int relu,
                     float leak) {
    if (!dsrt_kb_desc_ok(d)) return -EINVAL;
    for (size_t i = 0, cnt = dsrt_kb_count(d); i < cnt; i++)
        dsrt_kb_bias_act(d, x, b, y, relu, leak, i);
    return 0;
}

int dsrt_kh_bias_grad(const dsrt_k_desc *d, void *dy, const void *y, float leak, float *db,
                      void *work) {
    if (!dsrt_kb_bias_grad_ok(d) || !work) return -EINVAL;
    int cols = d->c;
    size_t rows = (size_t)d->n * d->h * d->w;
    int chunks = dsrt_kb_bias_chunks(rows);
    float *partial = work;
    for (int k = 0; k < chunks; k++) {
        size_t r0, r1;
        dsrt_kb_bias_rows(rows, chunks, k, &r0, &r1);
        for (int col = 0; col < cols; col++) {
            float lanes[DSRT_KB_BIAS_LANES];
            for (int l = 0; l < DSRT_KB_BIAS_LANES; l++)
                lanes[l] = dsrt_kb_bias_lane(d->type, dy, y, leak, cols, col, r0, r1, l);
            partial[(size_t)k * cols + col] = dsrt_kb_bias_lanes_total(lanes);
        }
    }
    for (int col = 0; col < cols; col++) db[col] = dsrt_kb_bias_total(partial, chunks, cols, col);
    return 0;
}

int dsrt_kh_pool_fwd(const dsrt_k_pool *p, const void *x, void *y, uint8_t *arg) {
    if (!p || !dsrt_kb_pool_ok(p) || (arg && !dsrt_kb_pool_arg_ok(p))) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(&p->yd); i < n; i++) dsrt_kb_pool_fwd(p, x, y, arg, i);
    return 0;
}

int dsrt_kh_pool_bwd(const dsrt_k_pool *p, const void *x, const uint8_t *arg, const void *dy,
                     void *dx) {
    if (!p || !dsrt_kb_pool_ok(p) || (arg && !dsrt_kb_pool_arg_ok(p))) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(&p->xd); i < n; i++)
        dsrt_kb_pool_bwd(p, x, arg, dy, dx, i);
    return 0;
}

int dsrt_kh_lrn_fwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, void *y,
                    float *scale) {
    if (!dsrt_kb_lrn_ok(d, l)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(d); i < n; i++) dsrt_kb_lrn_fwd(d, x, l, y, scale, i);
    return 0;
}

int dsrt_kh_lrn_bwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, const void *y,
                    const void *dy, const float *scale, void *dx) {
    if (!dsrt_kb_lrn_ok(d, l)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(d); i < n; i++)
        dsrt_kb_lrn_bwd(d, x, y, dy, scale, l, dx, i);
    return 0;
}

int dsrt_kh_sum(dsrt_k_type t, const dsrt_k_sum *s, void *y, size_t count, int relu, float leak) {
    if (!s || s->n < 1 || s->n > DSRT_KB_SUM_MAX || !dsrt_kb_type_ok(t)) return -EINVAL;
    for (size_t i = 0; i < count; i++) dsrt_kb_sum(t, s, y, relu, leak, i);
    return 0;
}

int dsrt_kh_channels(const dsrt_k_desc *xd, void *x, const dsrt_k_desc *yd, void *y, int c0,
                     int to_y, int accumulate) {
    if (!dsrt_kb_channels_ok(xd, yd, c0)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(xd); i < n; i++)
        dsrt_kb_channels(xd, x, yd, y, c0, to_y, accumulate, i);
    return 0;
}

int dsrt_kh_conv_fwd(const dsrt_k_conv *p, const void *x, const void *w, void *y) {
    if (!p || !dsrt_kb_conv_ok(p)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(&p->yd); i < n; i++) dsrt_kb_conv_fwd(p, x, w, y, i);
    return 0;
}

int dsrt_kh_conv_bwd_data(const dsrt_k_conv *p, const void *w, const void *dy, void *dx) {
    if (!p || !dsrt_kb_conv_ok(p)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(&p->xd); i < n; i++)
        dsrt_kb_conv_bwd_data(p, w, dy, dx, i);
    return 0;
}

int dsrt_kh_conv_bwd_filter(const dsrt_k_conv *p, const void *x, const void *dy, void *dw,
                            dsrt_k_type dwt) {
    if (!p || !dsrt_kb_conv_ok(p) || !dsrt_kb_type_ok(dwt)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_conv_w_count(p); i < n; i++)
        dsrt_kb_conv_bwd_filter(p, x, dy, dw, dwt, i);
    return 0;
}

int dsrt_kh_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed, uint64_t iteration,
                    const uint64_t *iteration_dev, int layer, float p) {
    if (!dsrt_kb_dropout_ok(d, p, layer)) return -EINVAL;
    dsrt_rng rng =
        dsrt_dropout_rng(seed, iteration_dev ? *iteration_dev : iteration, (uint64_t)layer);
    uint32_t threshold = dsrt_dropout_threshold(p);
    float scale = dsrt_dropout_scale(p);
    for (size_t i = 0, n = dsrt_kb_count(d); i < n; i++)
        dsrt_kb_dropout(d, x, y, &rng, threshold, scale, i);
    return 0;
}

// ----------------------------------------------------------------------------
// Softmax and cross-entropy

int dsrt_kh_softmax_xent_fwd(const void *z, dsrt_k_type zt, const int32_t *labels,
                             const float *soft, int n, int k, float *probs, double *loss,
                             int32_t *correct, void *work) {
    if (!dsrt_kb_softmax_fwd_ok(n, k, labels, soft, work) || !dsrt_kb_type_ok(zt)) return -EINVAL;
    dsrt_k_row_result *res = work;
    for (int row = 0; row < n; row++) {
        dsrt_kb_row zrow = {z, zt, (size_t)row * k};
        const dsrt_kb_row *zr = &zrow;
        float best[WARP], nb[WARP];
        int arg[WARP], na[WARP];
        double sum[WARP], ns[WARP];
        for (int l = 0; l < WARP; l++) dsrt_kb_sm_lane_max(zr, k, l, &best[l], &arg[l]);
        for (int o = WARP / 2; o > 0; o >>= 1) {
            for (int l = 0; l < WARP; l++) {
                nb[l] = best[l], na[l] = arg[l];
                dsrt_kb_sm_merge(&nb[l], &na[l], best[l ^ o], arg[l ^ o]);
            }
            memcpy(best, nb, sizeof best);
            memcpy(arg, na, sizeof arg);
        }
        int a = arg[0];
        float mx = dsrt_kb_sm_row_max(zr, best[0], &a);
        double dm = (double)mx;
        for (int l = 0; l < WARP; l++) sum[l] = dsrt_kb_sm_lane_sumexp(zr, k, l, dm);
        for (int o = WARP / 2; o > 0; o >>= 1) {
            for (int l = 0; l < WARP; l++) ns[l] = DSRT_DADD(sum[l], sum[l ^ o]);
            memcpy(sum, ns, sizeof sum);
        }
        for (int l = 0; l < WARP; l++)
            dsrt_kb_sm_lane_store(zr, probs + (size_t)row * k, k, l, dm, 1.0 / sum[0]);
        if (labels) dsrt_kb_sm_row_result(zr, labels[row], k, mx, sum[0], a, &res[row]);
        if (soft) dsrt_kb_sm_row_soft(zr, soft + (size_t)row * k, k, mx, sum[0], &res[row]);
    }
    if (!labels || !n || (!loss && !correct)) return 0;
    double l[THREADS];
    int c[THREADS];
    for (int t = 0; t < THREADS; t++) dsrt_kb_sm_total_part(res, n, t, &l[t], &c[t]);
    tree(l, c);
    if (loss) *loss = l[0] / n;
    if (correct) *correct = c[0];
    return 0;
}

int dsrt_kh_softmax_xent_bwd(const float *probs, const int32_t *labels, const float *soft,
                             const void *work, int n, int k, float scale, const float *scale_dev,
                             void *dz, dsrt_k_type dzt) {
    if (!dsrt_kb_softmax_bwd_ok(n, k, labels, soft, work) || !dsrt_kb_type_ok(dzt)) return -EINVAL;
    float sc = scale_dev ? *scale_dev : scale;
    for (size_t i = 0, cnt = (size_t)n * k; i < cnt; i++) {
        if (soft)
            dsrt_kb_sm_bwd_soft(probs, soft, work, k, sc, dz, dzt, i);
        else
            dsrt_kb_sm_bwd(probs, labels, k, sc, dz, dzt, i);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Synchronised batch normalisation

/* The tiled sums as the device makes them: each tile's lanes, their tree,
 * the partials in work, then the totals in tile order. */
static int bn_sums(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y, float leak,
                   const float *mean, const float *inv, double *sums, float *dscale, float *dshift,
                   float *work) {
    if (!dsrt_kb_bn_ok(xd) || !work) return -EINVAL;
    int c = xd->c;
    size_t tiles = dsrt_kb_bn_tiles(xd);
    for (size_t t = 0; t < tiles; t++)
        for (int ch = 0; ch < c; ch++) {
            float vs[DSRT_KB_BN_LANES], vq[DSRT_KB_BN_LANES];
            for (int l = 0; l < DSRT_KB_BN_LANES; l++)
                dsrt_kb_bn_lane(xd, x, dy, y, leak, dy ? mean[ch] : 0.0f, dy ? inv[ch] : 0.0f, t,
                                ch, l, &vs[l], &vq[l]);
            for (int h = DSRT_KB_BN_LANES / 2; h > 0; h >>= 1)
                for (int k = 0; k < h; k++) {
                    dsrt_kb_tree_f(vs, k, h);
                    dsrt_kb_tree_f(vq, k, h);
                }
            work[t * 2 * (size_t)c + (size_t)ch] = vs[0];
            work[t * 2 * (size_t)c + (size_t)c + (size_t)ch] = vq[0];
        }
    for (int ch = 0; ch < c; ch++) {
        double s, q;
        dsrt_kb_bn_total(work, tiles, c, ch, &s, &q);
        sums[ch] = s;
        sums[c + ch] = q;
        if (dshift) dshift[ch] = (float)s;
        if (dscale) dscale[ch] = (float)q;
    }
    if (c && !dy) sums[2 * c] = (double)((size_t)xd->n * xd->h * xd->w);
    return 0;
}

int dsrt_kh_bn_sums(const dsrt_k_desc *xd, const void *x, double *sums, float *work) {
    return bn_sums(xd, x, NULL, NULL, 0.0f, NULL, NULL, sums, NULL, NULL, work);
}

int dsrt_kh_bn_stats(const double *sums, int c, float eps, float momentum, float *mean, float *var,
                     float *inv, float *run_mean, float *run_var) {
    if (c < 0) return -EINVAL;
    for (int k = 0; k < c; k++)
        dsrt_kb_bn_stats(sums, c, eps, momentum, mean, var, inv, run_mean, run_var, (size_t)k);
    return 0;
}

int dsrt_kh_bn_bwd_sums(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                        float leak, const float *mean, const float *inv, double *sums,
                        float *dscale, float *dshift, float *work) {
    if (!dy || !mean || !inv) return -EINVAL;
    return bn_sums(xd, x, dy, y, leak, mean, inv, sums, dscale, dshift, work);
}

int dsrt_kh_bn_bwd_dx(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                      float leak, const float *mean, const float *inv, const float *scale,
                      const double *sums, const double *count, void *dx) {
    if (!dsrt_kb_bn_ok(xd)) return -EINVAL;
    double inv_m = 1.0 / *count;
    for (size_t i = 0, total = dsrt_kb_count(xd); i < total; i++)
        dsrt_kb_bn_bwd_dx(xd, x, dy, y, leak, mean, inv, scale, sums, inv_m, dx, i);
    return 0;
}

int dsrt_kh_bn_apply(const dsrt_k_desc *xd, const void *x, const float *mean, const float *inv,
                     const float *var, float eps, const float *scale, const float *shift, int relu,
                     float leak, void *y) {
    if (!dsrt_kb_bn_ok(xd) || (!inv && !var)) return -EINVAL;
    for (size_t i = 0, total = dsrt_kb_count(xd); i < total; i++)
        dsrt_kb_bn_apply(xd, x, mean, inv, var, eps, scale, shift, relu, leak, y, i);
    return 0;
}

// ----------------------------------------------------------------------------
// The optimizer

int dsrt_kh_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st_host,
                         const dsrt_k_step *st_dev, float *w, float *g, float *buf0, float *buf1,
                         dsrt_bf16 *w16) {
    if (!dsrt_kb_optim_ok(o, st_host, buf0, buf1)) return -EINVAL;
    /* The kernels read the step's scalars where the device would. */
    const dsrt_k_step *st = st_dev ? st_dev : st_host;
    if (!o->n_seg || !o->blocks) return 0;
    const float *scale = NULL;
    if (dsrt_kb_optim_norm_clip(st_host)) {
        if (!o->work) return -EINVAL;
        double *partial = o->work, v[THREADS];
        float *sc = (float *)(partial + o->blocks);
        for (uint32_t b = 0; b < o->blocks; b++) {
            for (int t = 0; t < THREADS; t++)
                v[t] = dsrt_kb_optim_sumsq_part(o->seg, o->n_seg, g, b, t);
            tree(v, NULL);
            partial[b] = v[0];
        }
        int global = st_host->clip == DSRT_CLIP_GLOBAL_L2NORM;
        double total = 0.0;
        for (int k = 0; k < o->n_seg; k++) {
            for (int t = 0; t < THREADS; t++) v[t] = dsrt_kb_optim_seg_part(&o->seg[k], partial, t);
            tree(v, NULL);
            if (!global)
                sc[k] = dsrt_kb_clip_scale(v[0], st->threshold);
            else if (o->seg[k].lr != 0.0f)
                total = DSRT_DADD(total, v[0]);
        }
        if (global) {
            float f = dsrt_kb_clip_scale(total, st->threshold);
            for (int k = 0; k < o->n_seg; k++) sc[k] = f;
        }
        scale = sc;
    }
    for (uint32_t b = 0; b < o->blocks; b++) {
        int k = dsrt_kb_segment_of(o->seg, o->n_seg, b);
        const dsrt_k_segment *s = &o->seg[k];
        float sc = scale ? scale[k] : 1.0f;
        if (!dsrt_kb_optim_moves(st, s, sc, w16)) continue;
        size_t begin, end;
        dsrt_kb_block_range(s, b, &begin, &end);
        for (size_t i = s->off + begin; i < s->off + end; i++)
            dsrt_kb_optim_update(st, s, sc, i, w, g, buf0, buf1, w16);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Products, layer normalisation, stochastic depth

int dsrt_kh_mul(const dsrt_k_desc *ad, const void *a, const dsrt_k_desc *bd, const void *b,
                void *y) {
    if (!dsrt_kb_mul_ok(ad, bd)) return -EINVAL;
    for (size_t i = 0, n = dsrt_kb_count(ad); i < n; i++) dsrt_kb_mul(ad, a, bd, b, y, i);
    return 0;
}

int dsrt_kh_mul_grad(const dsrt_k_desc *ad, const void *dy, const void *a, const dsrt_k_desc *bd,
                     void *db) {
    if (!dsrt_kb_mul_grad_ok(ad, bd)) return -EINVAL;
    double v[THREADS];
    for (size_t j = 0, n = dsrt_kb_count(bd); j < n; j++) {
        for (int t = 0; t < THREADS; t++) v[t] = dsrt_kb_mul_grad_lane(ad, dy, a, j, t);
        tree(v, NULL);
        dsrt_kb_store(db, bd->type, j, (float)v[0]);
    }
    return 0;
}

/* Each tile's lanes and their tree, as the device's chan_tile_kernel, the
 * partials in work; then the totals in tile order. */
int dsrt_kh_chan_grads(const dsrt_k_desc *d, const void *x, const void *dy, const float *mean,
                       const float *rstd, float *dscale, float *dshift, float *work) {
    if (!dsrt_kb_chan_grads_ok(d, mean, rstd) || !work) return -EINVAL;
    int c = d->c;
    size_t tiles = dsrt_kb_bn_tiles(d);
    for (size_t t = 0; t < tiles; t++)
        for (int ch = 0; ch < c; ch++) {
            float vs[DSRT_KB_BN_LANES], vq[DSRT_KB_BN_LANES];
            for (int l = 0; l < DSRT_KB_BN_LANES; l++)
                dsrt_kb_chan_grads_lane(d, x, dy, mean, rstd, t, ch, l, &vs[l], &vq[l]);
            for (int h = DSRT_KB_BN_LANES / 2; h > 0; h >>= 1)
                for (int k = 0; k < h; k++) {
                    dsrt_kb_tree_f(vs, k, h);
                    dsrt_kb_tree_f(vq, k, h);
                }
            work[t * 2 * (size_t)c + (size_t)ch] = vs[0];
            work[t * 2 * (size_t)c + (size_t)c + (size_t)ch] = vq[0];
        }
    for (int ch = 0; ch < c; ch++) {
        double s, q;
        dsrt_kb_bn_total(work, tiles, c, ch, &s, &q);
        if (dshift) dshift[ch] = (float)s;
        if (dscale) dscale[ch] = (float)q;
    }
    return 0;
}

/* The warp's butterfly over the lanes' doubles: lane l adds lane l ^ o.
 * Every lane ends with the total; lane 0's is returned. */
static double butterfly(double *v) {
    double nv[WARP];
    for (int o = WARP / 2; o > 0; o >>= 1) {
        for (int l = 0; l < WARP; l++) nv[l] = DSRT_DADD(v[l], v[l ^ o]);
        memcpy(v, nv, sizeof nv);
    }
    return v[0];
}

int dsrt_kh_ln_fwd(const dsrt_k_desc *d, const void *x, const float *gamma, const float *beta,
                   float eps, void *y, float *mean, float *rstd) {
    if (!dsrt_kb_ln_ok(d, gamma, beta) || !mean != !rstd) return -EINVAL;
    double v[WARP];
    for (size_t j = 0, rows = (size_t)d->n * d->h * d->w; j < rows; j++) {
        for (int l = 0; l < WARP; l++) v[l] = dsrt_kb_ln_lane_sum(d, x, j, l, 0, 0.0);
        double m = butterfly(v) / (double)d->c;
        for (int l = 0; l < WARP; l++) v[l] = dsrt_kb_ln_lane_sum(d, x, j, l, 1, m);
        double q = butterfly(v);
        float mf = (float)m, rf = dsrt_kb_ln_rstd(q, d->c, eps);
        if (mean) {
            mean[j] = mf;
            rstd[j] = rf;
        }
        for (int l = 0; l < WARP; l++) dsrt_kb_ln_lane_apply(d, x, gamma, beta, mf, rf, y, j, l);
    }
    return 0;
}

int dsrt_kh_ln_bwd(const dsrt_k_desc *d, const void *x, const void *dy, const float *gamma,
                   const float *mean, const float *rstd, void *dx) {
    if (!dsrt_kb_ln_bwd_ok(d, gamma, mean, rstd)) return -EINVAL;
    double a[WARP], b[WARP];
    for (size_t j = 0, rows = (size_t)d->n * d->h * d->w; j < rows; j++) {
        for (int l = 0; l < WARP; l++)
            dsrt_kb_ln_lane_bwd(d, x, dy, gamma, mean[j], rstd[j], j, l, &a[l], &b[l]);
        double sg = butterfly(a), sgx = butterfly(b);
        for (int l = 0; l < WARP; l++)
            dsrt_kb_ln_lane_dx(d, x, dy, gamma, mean[j], rstd[j], sg, sgx, dx, j, l);
    }
    return 0;
}

int dsrt_kh_drop_path(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                      uint64_t iteration, const uint64_t *iteration_dev, int layer, float p) {
    if (!dsrt_kb_drop_path_ok(d, p, layer)) return -EINVAL;
    dsrt_rng rng =
        dsrt_drop_path_rng(seed, iteration_dev ? *iteration_dev : iteration, (uint64_t)layer);
    uint32_t threshold = dsrt_dropout_threshold(p);
    float scale = dsrt_dropout_scale(p);
    for (size_t i = 0, n = dsrt_kb_count(d); i < n; i++)
        dsrt_kb_drop_path(d, x, y, &rng, threshold, scale, i);
    return 0;
}

// ----------------------------------------------------------------------------
// Conversions and helpers

int dsrt_kh_f32_to_bf16(const float *x, dsrt_bf16 *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = dsrt_bf16_from_f32(x[i]);
    return 0;
}

int dsrt_kh_bf16_to_f32(const dsrt_bf16 *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = dsrt_f32_from_bf16(x[i]);
    return 0;
}

int dsrt_kh_set_consts(dsrt_k_consts *dst, const dsrt_k_consts *v) {
    if (!dst || !v) return -EINVAL;
    *dst = *v;
    return 0;
}

int dsrt_kh_fill(float *y, size_t n, float v) {
    for (size_t i = 0; i < n; i++) y[i] = v;
    return 0;
}

int dsrt_kh_scale(const float *x, float *y, size_t n, float a) {
    for (size_t i = 0; i < n; i++) y[i] = DSRT_FMUL(a, x[i]);
    return 0;
}

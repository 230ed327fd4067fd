/*
 * The pooling kinds' kernel (maxpool, avgpool, gap: nn/layers/pool.c),
 * which their GPU part (pool_cuda.c) runs each way: max or average over any
 * window, padding and ceil=1's partial last window included. As
 * nn/kernels.h lays a kernel out: the bodies, the kernels' arguments, their
 * runs on the host, and the launchers (nn/layers/pool.cu).
 */
#ifndef DSRT_NN_LAYERS_POOL_KERNELS_H
#define DSRT_NN_LAYERS_POOL_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Pooling: one thread an output element forward, one an input element
// backward (it gathers the gradients of the windows that hold it, in window
// order: no atomics, the same bits every run)

/* Pooling: x (xd) to y (yd), both of one n, c, layout and type; a kh x kw
 * window moved by (sh, sw) from (-pt, -pl). Max ignores the padding (as
 * padding with -infinity); average divides by kh * kw, the padding counted
 * as zeros (as the CPU backend's pooling), or with DSRT_K_POOL_AVG_INSIDE by
 * the number of the window's elements inside the image (avgpool
 * count_pad=0), or with DSRT_K_POOL_AVG_PADDED by the number of them inside
 * the padded image, (-pt, -pl) to (h + pb, w + pr): PyTorch's
 * count_include_pad with ceil_mode, whose last window may reach past the
 * padding (avgpool ceil=1). Global average pooling is the window of the
 * whole image. */
typedef enum {
    DSRT_K_POOL_MAX = 0,
    DSRT_K_POOL_AVG = 1,
    DSRT_K_POOL_AVG_INSIDE = 2,
    DSRT_K_POOL_AVG_PADDED = 3,
} dsrt_k_pool_mode;

typedef struct {
    dsrt_k_desc xd, yd;
    int kh, kw, sh, sw, pt, pl;
    int mode;   /* dsrt_k_pool_mode */
    int pb, pr; /* DSRT_K_POOL_AVG_PADDED: the padding at the bottom and the right */
} dsrt_k_pool;

static inline int dsrt_kb_pool_ok(const dsrt_k_pool *p) {
    const dsrt_k_desc *x = &p->xd, *y = &p->yd;
    return dsrt_kb_desc_ok(x) && dsrt_kb_desc_ok(y) && x->n == y->n && x->c == y->c &&
           x->nhwc == y->nhwc && x->type == y->type && p->kh > 0 && p->kw > 0 && p->sh > 0 &&
           p->sw > 0 && p->pt >= 0 && p->pl >= 0 && p->pt < p->kh && p->pl < p->kw &&
           (p->mode == DSRT_K_POOL_MAX || p->mode == DSRT_K_POOL_AVG ||
            p->mode == DSRT_K_POOL_AVG_INSIDE ||
            (p->mode == DSRT_K_POOL_AVG_PADDED && p->pb >= 0 && p->pr >= 0));
}

/* What average pooling divides window (oh, ow)'s sum by: kh kw, or the
 * number of its elements inside the image, or inside the padded image. */
static inline DSRT_HOST_DEVICE float dsrt_kb_pool_area(const dsrt_k_pool *p, int oh, int ow) {
    if (p->mode != DSRT_K_POOL_AVG_INSIDE && p->mode != DSRT_K_POOL_AVG_PADDED)
        return (float)(p->kh * p->kw);
    int padded = p->mode == DSRT_K_POOL_AVG_PADDED;
    int r0 = oh * p->sh - p->pt, c0 = ow * p->sw - p->pl;
    int he = padded ? p->xd.h + p->pb : p->xd.h, we = padded ? p->xd.w + p->pr : p->xd.w;
    int r1 = r0 + p->kh < he ? r0 + p->kh : he, c1 = c0 + p->kw < we ? c0 + p->kw : we;
    if (padded) return (float)((r1 - r0) * (c1 - c0));
    r0 = r0 > 0 ? r0 : 0;
    c0 = c0 > 0 ? c0 : 0;
    int n = (r1 - r0) * (c1 - c0);
    return (float)(n > 0 ? n : 1);
}

/* The first largest element of window (b, ch, oh, ow) (NaN wins: it
 * propagates), as the index of x; *sum the window's sum, padding as zeros. */
static inline DSRT_HOST_DEVICE size_t dsrt_kb_pool_window(const dsrt_k_pool *p, const void *x,
                                                          dsrt_kb_coord o, float *best,
                                                          float *sum) {
    const dsrt_k_desc *xd = &p->xd;
    int r0 = o.r * p->sh - p->pt, c0 = o.col * p->sw - p->pl;
    float b = -INFINITY, s = 0.0f;
    size_t arg = (size_t)-1;
    for (int r = 0; r < p->kh; r++) {
        int ih = r0 + r;
        if (ih < 0 || ih >= xd->h) continue;
        for (int q = 0; q < p->kw; q++) {
            int iw = c0 + q;
            if (iw < 0 || iw >= xd->w) continue;
            dsrt_kb_coord k = o;
            k.r = ih;
            k.col = iw;
            size_t i = dsrt_kb_index_of(k, xd->c, xd->h, xd->w, xd->nhwc);
            float v = dsrt_kb_load(x, xd->type, i);
            if (arg == (size_t)-1 || v > b || (v != v && b == b)) b = v, arg = i;
            s = DSRT_FADD(s, v);
        }
    }
    *best = b;
    *sum = s;
    return arg;
}

/* Whether max pooling p may keep each window's winner as its offset in
 * the window (one byte an output element: windows of at most 255). */
static inline DSRT_HOST_DEVICE int dsrt_kb_pool_arg_ok(const dsrt_k_pool *p) {
    return p->mode == DSRT_K_POOL_MAX && p->kh * p->kw <= 255;
}

/* Element i of y; for max pooling with arg given, the winner's offset in
 * its window (r kw + q) in arg[i], for the backward pass. */
static inline DSRT_HOST_DEVICE void dsrt_kb_pool_fwd(const dsrt_k_pool *p, const void *x, void *y,
                                                     uint8_t *arg, size_t i) {
    const dsrt_k_desc *yd = &p->yd;
    dsrt_kb_coord o = dsrt_kb_coord_of(i, yd->c, yd->h, yd->w, yd->nhwc);
    float best, sum;
    size_t at = dsrt_kb_pool_window(p, x, o, &best, &sum);
    float v = p->mode == DSRT_K_POOL_MAX ? best : DSRT_FDIV(sum, dsrt_kb_pool_area(p, o.r, o.col));
    dsrt_kb_store(y, yd->type, i, v);
    if (arg && p->mode == DSRT_K_POOL_MAX) {
        dsrt_kb_coord k = dsrt_kb_coord_of(at, p->xd.c, p->xd.h, p->xd.w, p->xd.nhwc);
        int r = k.r - (o.r * p->sh - p->pt), q = k.col - (o.col * p->sw - p->pl);
        arg[i] = at == (size_t)-1 ? 255 : (uint8_t)(r * p->kw + q);
    }
}

/* The first and last output index along one axis whose window holds input
 * position at (window k, stride s, padding pad, n outputs); hi < lo: none. */
static inline DSRT_HOST_DEVICE void dsrt_kb_pool_span(int at, int k, int s, int pad, int n, int *lo,
                                                      int *hi) {
    int first = at + pad - k + 1;
    *lo = first <= 0 ? 0 : (first + s - 1) / s;
    int last = (at + pad) / s;
    *hi = last < n - 1 ? last : n - 1;
}

/* Element i of dx (p->xd): the gradients of the windows holding it. Max
 * pooling reads each window's winner from arg (the forward's) when given,
 * else finds it again in x. */
static inline DSRT_HOST_DEVICE void dsrt_kb_pool_bwd(const dsrt_k_pool *p, const void *x,
                                                     const uint8_t *arg, const void *dy, void *dx,
                                                     size_t i) {
    const dsrt_k_desc *xd = &p->xd, *yd = &p->yd;
    dsrt_kb_coord k = dsrt_kb_coord_of(i, xd->c, xd->h, xd->w, xd->nhwc);
    int h0, h1, w0, w1;
    dsrt_kb_pool_span(k.r, p->kh, p->sh, p->pt, yd->h, &h0, &h1);
    dsrt_kb_pool_span(k.col, p->kw, p->sw, p->pl, yd->w, &w0, &w1);
    float acc = 0.0f;
    for (int oh = h0; oh <= h1; oh++)
        for (int ow = w0; ow <= w1; ow++) {
            dsrt_kb_coord o = k;
            o.r = oh;
            o.col = ow;
            size_t oi = dsrt_kb_index_of(o, yd->c, yd->h, yd->w, yd->nhwc);
            if (p->mode == DSRT_K_POOL_MAX) {
                int won;
                if (arg) {
                    int off = (k.r - (oh * p->sh - p->pt)) * p->kw + (k.col - (ow * p->sw - p->pl));
                    won = arg[oi] == off;
                } else {
                    float best, sum;
                    won = dsrt_kb_pool_window(p, x, o, &best, &sum) == i;
                }
                if (won) acc = DSRT_FADD(acc, dsrt_kb_load(dy, yd->type, oi));
            } else {
                acc = DSRT_FADD(
                    acc, DSRT_FDIV(dsrt_kb_load(dy, yd->type, oi), dsrt_kb_pool_area(p, oh, ow)));
            }
        }
    dsrt_kb_store(dx, xd->type, i, acc);
}

// ----------------------------------------------------------------------------
// The kernels' arguments

typedef struct {
    dsrt_k_pool p;
    const void *x;
    void *y;
    uint8_t *arg;
    size_t count; /* elements of y */
} pool_fwd_args;

typedef struct {
    dsrt_k_pool p;
    const void *x;
    const uint8_t *arg;
    const void *dy;
    void *dx;
    size_t count; /* elements of dx */
} pool_bwd_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void pool_fwd_kernel_host(const void *p) {
    const pool_fwd_args *a = (const pool_fwd_args *)p;
    for (size_t i = 0; i < a->count; i++) dsrt_kb_pool_fwd(&a->p, a->x, a->y, a->arg, i);
}

static inline void pool_bwd_kernel_host(const void *p) {
    const pool_bwd_args *a = (const pool_bwd_args *)p;
    for (size_t i = 0; i < a->count; i++) dsrt_kb_pool_bwd(&a->p, a->x, a->arg, a->dy, a->dx, i);
}

static inline int dsrt_kh_pool_fwd(const dsrt_k_pool *p, const void *x, void *y, uint8_t *arg) {
    if (!p || !dsrt_kb_pool_ok(p) || (arg && !dsrt_kb_pool_arg_ok(p))) return -EINVAL;
    pool_fwd_args a = {*p, x, y, arg, dsrt_kb_count(&p->yd)};
    pool_fwd_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_pool_bwd(const dsrt_k_pool *p, const void *x, const uint8_t *arg,
                                   const void *dy, void *dx) {
    if (!p || !dsrt_kb_pool_ok(p) || (arg && !dsrt_kb_pool_arg_ok(p))) return -EINVAL;
    pool_bwd_args a = {*p, x, arg, dy, dx, dsrt_kb_count(&p->xd)};
    pool_bwd_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/* Max or average pooling, y from x (dsrt_k_pool says how), padding
 * included; every element of y is written. For max pooling with arg given
 * (one byte an element of y; windows of at most 255, dsrt_kb_pool_arg_ok),
 * each window's winner as its offset in the window. */
cudaError_t dsrt_k_pool_fwd(const dsrt_k_pool *p, const void *x, void *y, uint8_t *arg,
                            cudaStream_t stream);

/* Its backward: dx (p->xd) from dy (p->yd); max pooling reads the winners
 * from arg (the forward's), or, arg NULL, finds them again in the forward's
 * input x (the first largest, as the forward); every element of dx is
 * written, in a fixed order. */
cudaError_t dsrt_k_pool_bwd(const dsrt_k_pool *p, const void *x, const uint8_t *arg, const void *dy,
                            void *dx, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

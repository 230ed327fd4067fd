/*
 * The convolution's own kernels (nn/layers/conv.c), which its GPU part
 * (conv_cuda.c) runs where cuDNN has no algorithm for a convolution: a
 * direct convolution and its gradients, correct for any shape, not fast.
 * As nn/kernels.h lays a kernel out: the bodies, the kernels' arguments,
 * their runs on the host, and the launchers (nn/layers/conv.cu).
 */
#ifndef DSRT_NN_LAYERS_CONV_KERNELS_H
#define DSRT_NN_LAYERS_CONV_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Direct convolution: one thread an output element forward, an input
// element backward (it gathers the outputs whose windows hold it), a filter
// element for the filter's gradient; sums in double, in a fixed order

/* A direct convolution (cross-correlation) of x (xd: n, c, h, w) with
 * filters w (k, kh, kw, c / groups: cuDNN's NHWC filter order, xd's type)
 * into y (yd: n, k, oh, ow): a (kh, kw) window dilated by (dh, dw), moved
 * by (sh, sw) from (-pt, -pl), over groups channel groups. The fallback for
 * a convolution cuDNN has no algorithm for: any shape, layout and type. */
typedef struct {
    dsrt_k_desc xd, yd;
    int kh, kw, sh, sw, dh, dw, pt, pl, groups;
} dsrt_k_conv;

static inline int dsrt_kb_conv_ok(const dsrt_k_conv *p) {
    const dsrt_k_desc *x = &p->xd, *y = &p->yd;
    return dsrt_kb_desc_ok(x) && dsrt_kb_desc_ok(y) && x->type == y->type && x->n == y->n &&
           p->groups > 0 && x->c % p->groups == 0 && y->c % p->groups == 0 && p->kh > 0 &&
           p->kw > 0 && p->sh > 0 && p->sw > 0 && p->dh > 0 && p->dw > 0 && p->pt >= 0 &&
           p->pl >= 0;
}

/* Filter element (k, r, q, cg) as an index of w. */
static inline DSRT_HOST_DEVICE size_t dsrt_kb_conv_w(const dsrt_k_conv *p, int k, int r, int q,
                                                     int cg) {
    return (((size_t)k * p->kh + r) * p->kw + q) * (p->xd.c / p->groups) + cg;
}

/* Element i of y. */
static inline DSRT_HOST_DEVICE void dsrt_kb_conv_fwd(const dsrt_k_conv *p, const void *x,
                                                     const void *w, void *y, size_t i) {
    const dsrt_k_desc *xd = &p->xd, *yd = &p->yd;
    dsrt_kb_coord o = dsrt_kb_coord_of(i, yd->c, yd->h, yd->w, yd->nhwc);
    int cpg = xd->c / p->groups, c0 = (o.ch / (yd->c / p->groups)) * cpg;
    double acc = 0.0;
    for (int r = 0; r < p->kh; r++) {
        int ih = o.r * p->sh - p->pt + r * p->dh;
        if (ih < 0 || ih >= xd->h) continue;
        for (int q = 0; q < p->kw; q++) {
            int iw = o.col * p->sw - p->pl + q * p->dw;
            if (iw < 0 || iw >= xd->w) continue;
            for (int cg = 0; cg < cpg; cg++) {
                dsrt_kb_coord k = {o.b, c0 + cg, ih, iw};
                double xv =
                    dsrt_kb_load(x, xd->type, dsrt_kb_index_of(k, xd->c, xd->h, xd->w, xd->nhwc));
                double wv = dsrt_kb_load(w, xd->type, dsrt_kb_conv_w(p, o.ch, r, q, cg));
                acc = DSRT_DADD(acc, DSRT_DMUL(xv, wv));
            }
        }
    }
    dsrt_kb_store(y, yd->type, i, (float)acc);
}

/* Element i of dx (p->xd) from dy (p->yd). */
static inline DSRT_HOST_DEVICE void dsrt_kb_conv_bwd_data(const dsrt_k_conv *p, const void *w,
                                                          const void *dy, void *dx, size_t i) {
    const dsrt_k_desc *xd = &p->xd, *yd = &p->yd;
    dsrt_kb_coord k = dsrt_kb_coord_of(i, xd->c, xd->h, xd->w, xd->nhwc);
    int cpg = xd->c / p->groups, kpg = yd->c / p->groups, grp = k.ch / cpg, cg = k.ch % cpg;
    double acc = 0.0;
    for (int r = 0; r < p->kh; r++) {
        int t = k.r + p->pt - r * p->dh;
        if (t < 0 || t % p->sh) continue;
        int oh = t / p->sh;
        if (oh >= yd->h) continue;
        for (int q = 0; q < p->kw; q++) {
            int u = k.col + p->pl - q * p->dw;
            if (u < 0 || u % p->sw) continue;
            int ow = u / p->sw;
            if (ow >= yd->w) continue;
            for (int kk = grp * kpg; kk < (grp + 1) * kpg; kk++) {
                dsrt_kb_coord o = {k.b, kk, oh, ow};
                double g =
                    dsrt_kb_load(dy, yd->type, dsrt_kb_index_of(o, yd->c, yd->h, yd->w, yd->nhwc));
                double wv = dsrt_kb_load(w, xd->type, dsrt_kb_conv_w(p, kk, r, q, cg));
                acc = DSRT_DADD(acc, DSRT_DMUL(g, wv));
            }
        }
    }
    dsrt_kb_store(dx, xd->type, i, (float)acc);
}

/* Element i of dw (filter order, of type dwt) from x and dy. */
static inline DSRT_HOST_DEVICE void dsrt_kb_conv_bwd_filter(const dsrt_k_conv *p, const void *x,
                                                            const void *dy, void *dw,
                                                            dsrt_k_type dwt, size_t i) {
    const dsrt_k_desc *xd = &p->xd, *yd = &p->yd;
    int cpg = xd->c / p->groups, kpg = yd->c / p->groups;
    int cg = (int)(i % cpg), q = (int)(i / cpg % p->kw), r = (int)(i / cpg / p->kw % p->kh);
    int kk = (int)(i / cpg / p->kw / p->kh), c = (kk / kpg) * cpg + cg;
    double acc = 0.0;
    for (int b = 0; b < yd->n; b++)
        for (int oh = 0; oh < yd->h; oh++) {
            int ih = oh * p->sh - p->pt + r * p->dh;
            if (ih < 0 || ih >= xd->h) continue;
            for (int ow = 0; ow < yd->w; ow++) {
                int iw = ow * p->sw - p->pl + q * p->dw;
                if (iw < 0 || iw >= xd->w) continue;
                dsrt_kb_coord o = {(size_t)b, kk, oh, ow}, k = {(size_t)b, c, ih, iw};
                double g =
                    dsrt_kb_load(dy, yd->type, dsrt_kb_index_of(o, yd->c, yd->h, yd->w, yd->nhwc));
                double xv =
                    dsrt_kb_load(x, xd->type, dsrt_kb_index_of(k, xd->c, xd->h, xd->w, xd->nhwc));
                acc = DSRT_DADD(acc, DSRT_DMUL(g, xv));
            }
        }
    dsrt_kb_store(dw, dwt, i, (float)acc);
}

/* Elements of the filters (and of their gradient). */
static inline DSRT_HOST_DEVICE size_t dsrt_kb_conv_w_count(const dsrt_k_conv *p) {
    return (size_t)p->yd.c * p->kh * p->kw * (p->xd.c / p->groups);
}

// ----------------------------------------------------------------------------
// The kernels' arguments

typedef struct {
    dsrt_k_conv p;
    const void *x, *w;
    void *y;
    size_t count; /* elements of y */
} conv_fwd_args;

typedef struct {
    dsrt_k_conv p;
    const void *w, *dy;
    void *dx;
    size_t count; /* elements of dx */
} conv_bwd_data_args;

typedef struct {
    dsrt_k_conv p;
    const void *x, *dy;
    void *dw;
    dsrt_k_type dwt;
    size_t count; /* elements of dw */
} conv_bwd_filter_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void conv_fwd_kernel_host(const void *p) {
    const conv_fwd_args *a = (const conv_fwd_args *)p;
    for (size_t i = 0; i < a->count; i++) dsrt_kb_conv_fwd(&a->p, a->x, a->w, a->y, i);
}

static inline void conv_bwd_data_kernel_host(const void *p) {
    const conv_bwd_data_args *a = (const conv_bwd_data_args *)p;
    for (size_t i = 0; i < a->count; i++) dsrt_kb_conv_bwd_data(&a->p, a->w, a->dy, a->dx, i);
}

static inline void conv_bwd_filter_kernel_host(const void *p) {
    const conv_bwd_filter_args *a = (const conv_bwd_filter_args *)p;
    for (size_t i = 0; i < a->count; i++)
        dsrt_kb_conv_bwd_filter(&a->p, a->x, a->dy, a->dw, a->dwt, i);
}

static inline int dsrt_kh_conv_fwd(const dsrt_k_conv *p, const void *x, const void *w, void *y) {
    if (!p || !dsrt_kb_conv_ok(p)) return -EINVAL;
    conv_fwd_args a = {*p, x, w, y, dsrt_kb_count(&p->yd)};
    conv_fwd_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_conv_bwd_data(const dsrt_k_conv *p, const void *w, const void *dy,
                                        void *dx) {
    if (!p || !dsrt_kb_conv_ok(p)) return -EINVAL;
    conv_bwd_data_args a = {*p, w, dy, dx, dsrt_kb_count(&p->xd)};
    conv_bwd_data_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_conv_bwd_filter(const dsrt_k_conv *p, const void *x, const void *dy,
                                          void *dw, dsrt_k_type dwt) {
    if (!p || !dsrt_kb_conv_ok(p) || !dsrt_kb_type_ok(dwt)) return -EINVAL;
    conv_bwd_filter_args a = {*p, x, dy, dw, dwt, dsrt_kb_conv_w_count(p)};
    conv_bwd_filter_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/* Convolution p (dsrt_k_conv) of x with the filters w (cuDNN's NHWC filter
 * order, x's type) into y; the gradient of its input, dx from w and dy;
 * the gradient of its filters, dw (of type dwt, in the filters' order)
 * from x and dy. Each overwrites its output, summing in double in a fixed
 * order (deterministic). The fallback for a convolution cuDNN has no
 * algorithm for: correct for any shape, not fast. */
cudaError_t dsrt_k_conv_fwd(const dsrt_k_conv *p, const void *x, const void *w, void *y,
                            cudaStream_t stream);
cudaError_t dsrt_k_conv_bwd_data(const dsrt_k_conv *p, const void *w, const void *dy, void *dx,
                                 cudaStream_t stream);
cudaError_t dsrt_k_conv_bwd_filter(const dsrt_k_conv *p, const void *x, const void *dy, void *dw,
                                   dsrt_k_type dwt, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

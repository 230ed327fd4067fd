/*
 * Local response normalisation's kernels (nn/layers/lrn.c), which its GPU
 * part (lrn_cuda.c) runs each way. As nn/kernels.h lays a kernel out: the
 * bodies, the kernels' arguments, their runs on the host, and the launchers
 * (nn/layers/lrn.cu).
 */
#ifndef DSRT_NN_LAYERS_LRN_KERNELS_H
#define DSRT_NN_LAYERS_LRN_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Local response normalisation: one thread an element, its window of
// channels summed in float; the forward keeps each element's scale for the
// backward, which then reads one value a neighbour instead of its window

/* Local response normalisation across channels (AlexNet's): y = x / (k +
 * alpha / size * sum of x^2 over the size channels centred on x)^beta. */
typedef struct {
    int size; /* odd */
    float alpha, beta, k;
} dsrt_k_lrn;

static inline int dsrt_kb_lrn_ok(const dsrt_k_desc *d, const dsrt_k_lrn *l) {
    return dsrt_kb_desc_ok(d) && l && l->size > 0 && l->size % 2 == 1 && l->k > 0.0f;
}

/* k + alpha / size * (sum of x^2 over the channels centred on k.ch). */
static inline DSRT_HOST_DEVICE float dsrt_kb_lrn_scale(const dsrt_k_desc *d, const void *x,
                                                       const dsrt_k_lrn *l, dsrt_kb_coord k) {
    int half = (l->size - 1) / 2;
    float s = 0.0f;
    for (int j = k.ch - half; j <= k.ch + half; j++) {
        if (j < 0 || j >= d->c) continue;
        dsrt_kb_coord kj = k;
        kj.ch = j;
        float v = dsrt_kb_load(x, d->type, dsrt_kb_index_of(kj, d->c, d->h, d->w, d->nhwc));
        s = DSRT_FADD(s, DSRT_FMUL(v, v));
    }
    return DSRT_FADD(l->k, DSRT_FMUL(DSRT_FDIV(l->alpha, (float)l->size), s));
}

/* Element i of y = x * scale^-beta; the scale in scale[i] when given. */
static inline DSRT_HOST_DEVICE void dsrt_kb_lrn_fwd(const dsrt_k_desc *d, const void *x,
                                                    const dsrt_k_lrn *l, void *y, float *scale,
                                                    size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, d->c, d->h, d->w, d->nhwc);
    float v = dsrt_kb_load(x, d->type, i), sc = dsrt_kb_lrn_scale(d, x, l, k);
    if (scale) scale[i] = sc;
    dsrt_kb_store(y, d->type, i, DSRT_FMUL(v, powf(sc, -l->beta)));
}

/* Element i of dx = dy scale^-beta - 2 alpha beta / size x (sum over the
 * channels j whose window holds i of dy_j y_j / scale_j); the scales from
 * the forward's scale when given, else from x. */
static inline DSRT_HOST_DEVICE void dsrt_kb_lrn_bwd(const dsrt_k_desc *d, const void *x,
                                                    const void *y, const void *dy,
                                                    const float *scale, const dsrt_k_lrn *l,
                                                    void *dx, size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, d->c, d->h, d->w, d->nhwc);
    int half = (l->size - 1) / 2;
    float acc = 0.0f;
    for (int j = k.ch - half; j <= k.ch + half; j++) {
        if (j < 0 || j >= d->c) continue;
        dsrt_kb_coord kj = k;
        kj.ch = j;
        size_t ij = dsrt_kb_index_of(kj, d->c, d->h, d->w, d->nhwc);
        float g = dsrt_kb_load(dy, d->type, ij), yv = dsrt_kb_load(y, d->type, ij);
        float sj = scale ? scale[ij] : dsrt_kb_lrn_scale(d, x, l, kj);
        acc = DSRT_FADD(acc, DSRT_FDIV(DSRT_FMUL(g, yv), sj));
    }
    float g = dsrt_kb_load(dy, d->type, i), xv = dsrt_kb_load(x, d->type, i);
    float si = scale ? scale[i] : dsrt_kb_lrn_scale(d, x, l, k);
    float f = DSRT_FDIV(DSRT_FMUL(2.0f * l->alpha, l->beta), (float)l->size);
    float v = DSRT_FSUB(DSRT_FMUL(g, powf(si, -l->beta)), DSRT_FMUL(DSRT_FMUL(f, xv), acc));
    dsrt_kb_store(dx, d->type, i, v);
}

// ----------------------------------------------------------------------------
// The kernels' arguments

typedef struct {
    dsrt_k_desc d;
    dsrt_k_lrn l;
    const void *x;
    void *y;
    float *scale;
    size_t count;
} lrn_fwd_args;

typedef struct {
    dsrt_k_desc d;
    dsrt_k_lrn l;
    const void *x, *y, *dy;
    const float *scale;
    void *dx;
    size_t count;
} lrn_bwd_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void lrn_fwd_kernel_host(const void *p) {
    const lrn_fwd_args *a = (const lrn_fwd_args *)p;
    for (size_t i = 0; i < a->count; i++) dsrt_kb_lrn_fwd(&a->d, a->x, &a->l, a->y, a->scale, i);
}

static inline void lrn_bwd_kernel_host(const void *p) {
    const lrn_bwd_args *a = (const lrn_bwd_args *)p;
    for (size_t i = 0; i < a->count; i++)
        dsrt_kb_lrn_bwd(&a->d, a->x, a->y, a->dy, a->scale, &a->l, a->dx, i);
}

static inline int dsrt_kh_lrn_fwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, void *y,
                                  float *scale) {
    if (!dsrt_kb_lrn_ok(d, l)) return -EINVAL;
    lrn_fwd_args a = {*d, *l, x, y, scale, dsrt_kb_count(d)};
    lrn_fwd_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_lrn_bwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x,
                                  const void *y, const void *dy, const float *scale, void *dx) {
    if (!dsrt_kb_lrn_ok(d, l)) return -EINVAL;
    lrn_bwd_args a = {*d, *l, x, y, dy, scale, dx, dsrt_kb_count(d)};
    lrn_bwd_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/* Local response normalisation across channels of x (d: any layout and
 * type) into y, in float, each element's scale (k + alpha / size * sum of
 * squares) kept in scale (float, one an element) when given; and its
 * backward from x, y, dy and the forward's scale (NULL: computed again)
 * into dx. */
cudaError_t dsrt_k_lrn_fwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, void *y,
                           float *scale, cudaStream_t stream);
cudaError_t dsrt_k_lrn_bwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, const void *y,
                           const void *dy, const float *scale, void *dx, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

/*
 * The mul layer's own kernel (nn/layers/mul.c), which its GPU part
 * (mul_cuda.c) runs for the gradient of a gate broadcast over the pixels
 * (squeeze and excitation); the product itself, and the gradients of the
 * same shape, are the engine's broadcast product (nn/kernels.h dsrt_k_mul).
 * As nn/kernels.h lays a kernel out: the bodies, the kernel's arguments,
 * its run on the host, and the launcher (nn/layers/mul.cu).
 */
#ifndef DSRT_NN_LAYERS_MUL_KERNELS_H
#define DSRT_NN_LAYERS_MUL_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// A gate's gradient: one block an element of the gate, the pixels summed in
// double by the block's lanes and its tree (the product itself, both ways,
// is nn/kernels.h's dsrt_k_mul)

/* A gate's gradient: b (bd) has a's n and c and one pixel. */
static inline int dsrt_kb_mul_grad_ok(const dsrt_k_desc *ad, const dsrt_k_desc *bd) {
    return dsrt_kb_desc_ok(ad) && dsrt_kb_desc_ok(bd) && bd->n == ad->n && bd->c == ad->c &&
           bd->h == 1 && bd->w == 1;
}

/* Lane t's share of element j (image j / c, channel j % c) of the gate's
 * gradient, the sum of dy a over the image's pixels of that channel (dy
 * and a of ad): the pixels t, t + THREADS, ... in double. The lanes are
 * added by the block's tree (dsrt_kb_tree_d). */
static inline DSRT_HOST_DEVICE double dsrt_kb_mul_grad_lane(const dsrt_k_desc *ad, const void *dy,
                                                            const void *a, size_t j, int t) {
    dsrt_kb_coord k;
    k.b = j / (size_t)ad->c;
    k.ch = (int)(j % (size_t)ad->c);
    size_t hw = (size_t)ad->h * ad->w;
    double s = 0.0;
    for (size_t q = (size_t)t; q < hw; q += DSRT_KB_THREADS) {
        k.r = (int)(q / (size_t)ad->w);
        k.col = (int)(q % (size_t)ad->w);
        size_t i = dsrt_kb_index_of(k, ad->c, ad->h, ad->w, ad->nhwc);
        s = DSRT_DADD(s, DSRT_DMUL((double)dsrt_kb_load(dy, ad->type, i),
                                   (double)dsrt_kb_load(a, ad->type, i)));
    }
    return s;
}

// ----------------------------------------------------------------------------
// The kernels' arguments

/* One block an element of the gate (count of them). */
typedef struct {
    dsrt_k_desc ad;
    const void *dy, *a;
    dsrt_k_desc bd;
    void *db;
    size_t count;
} mul_grad_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void mul_grad_kernel_host(const void *p) {
    const mul_grad_args *a = (const mul_grad_args *)p;
    double v[DSRT_KB_THREADS];
    for (size_t j = 0; j < a->count; j++) {
        for (int t = 0; t < DSRT_KB_THREADS; t++)
            v[t] = dsrt_kb_mul_grad_lane(&a->ad, a->dy, a->a, j, t);
        dsrt_kh_tree(v, NULL);
        dsrt_kb_store(a->db, a->bd.type, j, (float)v[0]);
    }
}

static inline int dsrt_kh_mul_grad(const dsrt_k_desc *ad, const void *dy, const void *a,
                                   const dsrt_k_desc *bd, void *db) {
    if (!dsrt_kb_mul_grad_ok(ad, bd)) return -EINVAL;
    mul_grad_args g = {*ad, dy, a, *bd, db, dsrt_kb_count(bd)};
    mul_grad_kernel_host(&g);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/* The gradient of a gate b of y = a * b (bd: a's n and c, one pixel): db =
 * the sum of dy a over the pixels of each image and channel (dy and a of
 * ad), in double in a fixed order, rounded to bd's type. */
cudaError_t dsrt_k_mul_grad(const dsrt_k_desc *ad, const void *dy, const void *a,
                            const dsrt_k_desc *bd, void *db, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

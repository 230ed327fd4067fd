/*
 * The concat layer's kernel (nn/layers/concat.c), which its GPU part
 * (concat_cuda.c) runs each way: an input to its channels of the output,
 * and those channels of the output's gradient back to the input's. As
 * nn/kernels.h lays a kernel out: the bodies, the kernel's arguments, its
 * run on the host, and the launcher (nn/layers/concat.cu).
 */
#ifndef DSRT_NN_LAYERS_CONCAT_KERNELS_H
#define DSRT_NN_LAYERS_CONCAT_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Channel ranges: one thread an element of the input

/* Element i of x (xd) and its place among y's (yd) channels from c0 on (one
 * n, h, w, type): to_y copies it there (concat forward), else from there
 * (backward: the input's share of the gradient), added to what x holds
 * when accumulate. */
static inline DSRT_HOST_DEVICE void dsrt_kb_channels(const dsrt_k_desc *xd, void *x,
                                                     const dsrt_k_desc *yd, void *y, int c0,
                                                     int to_y, int accumulate, size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, xd->c, xd->h, xd->w, xd->nhwc);
    dsrt_kb_coord o = k;
    o.ch = k.ch + c0;
    size_t j = dsrt_kb_index_of(o, yd->c, yd->h, yd->w, yd->nhwc);
    if (to_y) {
        dsrt_kb_store(y, yd->type, j, dsrt_kb_load(x, xd->type, i));
    } else {
        float v = dsrt_kb_load(y, yd->type, j);
        if (accumulate) v = DSRT_FADD(dsrt_kb_load(x, xd->type, i), v);
        dsrt_kb_store(x, xd->type, i, v);
    }
}

static inline int dsrt_kb_channels_ok(const dsrt_k_desc *xd, const dsrt_k_desc *yd, int c0) {
    return dsrt_kb_desc_ok(xd) && dsrt_kb_desc_ok(yd) && xd->n == yd->n && xd->h == yd->h &&
           xd->w == yd->w && c0 >= 0 && c0 + xd->c <= yd->c;
}

// ----------------------------------------------------------------------------
// The kernels' arguments

typedef struct {
    dsrt_k_desc xd;
    void *x;
    dsrt_k_desc yd;
    void *y;
    int c0, to_y, accumulate;
    size_t count; /* elements of x */
} channels_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void channels_kernel_host(const void *p) {
    const channels_args *a = (const channels_args *)p;
    for (size_t i = 0; i < a->count; i++)
        dsrt_kb_channels(&a->xd, a->x, &a->yd, a->y, a->c0, a->to_y, a->accumulate, i);
}

static inline int dsrt_kh_channels(const dsrt_k_desc *xd, void *x, const dsrt_k_desc *yd, void *y,
                                   int c0, int to_y, int accumulate) {
    if (!dsrt_kb_channels_ok(xd, yd, c0)) return -EINVAL;
    channels_args a = {*xd, x, *yd, y, c0, to_y, accumulate, dsrt_kb_count(xd)};
    channels_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/* x (xd) to channels c0 .. c0 + xd->c of y (yd: one n, h, w) when to_y (a
 * concat's input into its output), else those channels of y to x, added to
 * x when accumulate (the input's share of the gradient). */
cudaError_t dsrt_k_channels(const dsrt_k_desc *xd, void *x, const dsrt_k_desc *yd, void *y, int c0,
                            int to_y, int accumulate, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

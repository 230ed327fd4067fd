/*
 * Dropout's kernel (nn/layers/dropout.c), which its GPU part
 * (dropout_cuda.c) runs each way: the CPU backend's masks, bit for bit. As
 * nn/kernels.h lays a kernel out: the bodies, the kernel's arguments, its
 * run on the host, and the launcher (nn/layers/dropout.cu).
 */
#ifndef DSRT_NN_LAYERS_DROPOUT_KERNELS_H
#define DSRT_NN_LAYERS_DROPOUT_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Dropout: one thread an element

/* Element i of y = x * mask, the mask of the element's logical NCHW index. */
static inline DSRT_HOST_DEVICE void dsrt_kb_dropout(const dsrt_k_desc *d, const void *x, void *y,
                                                    const dsrt_rng *rng, uint32_t threshold,
                                                    float scale, size_t i) {
    size_t j = i;
    if (d->nhwc)
        j = dsrt_kb_index_of(dsrt_kb_coord_of(i, d->c, d->h, d->w, 1), d->c, d->h, d->w, 0);
    float m = dsrt_dropout_mask(rng, j, threshold, scale);
    dsrt_kb_store(y, d->type, i, DSRT_FMUL(dsrt_kb_load(x, d->type, i), m));
}

// ----------------------------------------------------------------------------
// The kernels' arguments

typedef struct {
    dsrt_k_desc d;
    const void *x;
    void *y;
    dsrt_k_mask m;
    size_t count;
} dropout_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void dropout_kernel_host(const void *p) {
    const dropout_args *a = (const dropout_args *)p;
    dsrt_rng rng = dsrt_dropout_rng(a->m.seed, dsrt_kb_mask_iteration(&a->m), (uint64_t)a->m.layer);
    for (size_t i = 0; i < a->count; i++)
        dsrt_kb_dropout(&a->d, a->x, a->y, &rng, a->m.threshold, a->m.scale, i);
}

static inline int dsrt_kh_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                                  uint64_t iteration, const uint64_t *iteration_dev, int layer,
                                  float p) {
    if (!dsrt_kb_mask_ok(d, p, layer)) return -EINVAL;
    dropout_args a = {*d, x, y, dsrt_kb_mask_of(seed, iteration, iteration_dev, layer, p),
                      dsrt_kb_count(d)};
    dropout_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/*
 * y = x * mask over the tensor d (any layout, either type), the mask of layer
 * `layer` at training step `iteration` of a net seeded with `seed`, for drop
 * probability p: element (i, ch, r, col) takes dsrt_dropout_mask (nn/arith.h)
 * of its logical NCHW index, whatever d's layout, so masks are the CPU
 * backend's bit for bit. With iteration_dev (device memory) the step is read
 * from there when the kernel runs, not from `iteration`. The forward passes
 * the layer's input as x; the backward passes dy as x and gets dx, with the
 * same key. In place allowed.
 */
cudaError_t dsrt_k_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                           uint64_t iteration, const uint64_t *iteration_dev, int layer, float p,
                           cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

/*
 * Stochastic depth's kernel (nn/layers/stochastic_depth.c), which its GPU
 * part (stochastic_depth_cuda.c) runs each way: every value of an image
 * times the image's factor, drawn as the CPU backend draws it. As
 * nn/kernels.h lays a kernel out: the bodies, the kernel's arguments, its
 * run on the host, and the launcher (nn/layers/stochastic_depth.cu).
 */
#ifndef DSRT_NN_LAYERS_STOCHASTIC_DEPTH_KERNELS_H
#define DSRT_NN_LAYERS_STOCHASTIC_DEPTH_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Stochastic depth: every value of an image times the image's factor, one
// thread an element

/* Element i of y = x times the factor of its image (nn/arith.h
 * dsrt_drop_path_mask); the image is outermost in either layout. */
static inline DSRT_HOST_DEVICE void dsrt_kb_drop_path(const dsrt_k_desc *d, const void *x, void *y,
                                                      const dsrt_rng *rng, uint32_t threshold,
                                                      float scale, size_t i) {
    size_t b = i / ((size_t)d->c * d->h * d->w);
    float m = dsrt_drop_path_mask(rng, b, threshold, scale);
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
} drop_path_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void drop_path_kernel_host(const void *p) {
    const drop_path_args *a = (const drop_path_args *)p;
    dsrt_rng rng =
        dsrt_drop_path_rng(a->m.seed, dsrt_kb_mask_iteration(&a->m), (uint64_t)a->m.layer);
    for (size_t i = 0; i < a->count; i++)
        dsrt_kb_drop_path(&a->d, a->x, a->y, &rng, a->m.threshold, a->m.scale, i);
}

static inline int dsrt_kh_drop_path(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                                    uint64_t iteration, const uint64_t *iteration_dev, int layer,
                                    float p) {
    if (!dsrt_kb_mask_ok(d, p, layer)) return -EINVAL;
    drop_path_args a = {*d, x, y, dsrt_kb_mask_of(seed, iteration, iteration_dev, layer, p),
                        dsrt_kb_count(d)};
    drop_path_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/* y = x times the factor of its image over the tensor d (any layout, either
 * type): 0 for an image dropped with probability p, 1 / (1 - p) for one
 * kept, drawn for layer `layer` at training step `iteration` of a net
 * seeded with `seed` (nn/arith.h dsrt_drop_path_mask), as the CPU backend
 * draws them. iteration_dev, x and y as dsrt_k_dropout's; forward and
 * backward alike. */
cudaError_t dsrt_k_drop_path(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                             uint64_t iteration, const uint64_t *iteration_dev, int layer, float p,
                             cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

/*
 * Stochastic depth's kernel (nn/layers/stochastic_depth_kernels.h): one
 * thread an element, grid-stride loops, the images' generator keyed once a
 * thread.
 */
#include "nn/layers/stochastic_depth_kernels.h"

#ifdef __CUDACC__
__global__ void drop_path_kernel(drop_path_args a) {
    dsrt_rng rng = dsrt_drop_path_rng(a.m.seed, dsrt_kb_mask_iteration(&a.m), (uint64_t)a.m.layer);
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_drop_path(&a.d, a.x, a.y, &rng, a.m.threshold, a.m.scale, i);
}
#endif

cudaError_t dsrt_k_drop_path(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                             uint64_t iteration, const uint64_t *iteration_dev, int layer, float p,
                             cudaStream_t stream) {
    if (!dsrt_kb_mask_ok(d, p, layer)) return cudaErrorInvalidValue;
    drop_path_args a = {*d, x, y, dsrt_kb_mask_of(seed, iteration, iteration_dev, layer, p),
                        dsrt_kb_count(d)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(drop_path_kernel, grid_for(a.count), THREADS, stream, a);
}

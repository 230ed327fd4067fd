/*
 * Local response normalisation's kernels (nn/layers/lrn_kernels.h): one
 * thread an element, grid-stride loops.
 */
#include "nn/layers/lrn_kernels.h"

#ifdef __CUDACC__
__global__ void lrn_fwd_kernel(lrn_fwd_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_lrn_fwd(&a.d, a.x, &a.l, a.y, a.scale, i);
}

__global__ void lrn_bwd_kernel(lrn_bwd_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_lrn_bwd(&a.d, a.x, a.y, a.dy, a.scale, &a.l, a.dx, i);
}
#endif

cudaError_t dsrt_k_lrn_fwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, void *y,
                           float *scale, cudaStream_t stream) {
    if (!dsrt_kb_lrn_ok(d, l)) return cudaErrorInvalidValue;
    lrn_fwd_args a = {*d, *l, x, y, scale, dsrt_kb_count(d)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(lrn_fwd_kernel, grid_for(a.count), THREADS, stream, a);
}

cudaError_t dsrt_k_lrn_bwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, const void *y,
                           const void *dy, const float *scale, void *dx, cudaStream_t stream) {
    if (!dsrt_kb_lrn_ok(d, l)) return cudaErrorInvalidValue;
    lrn_bwd_args a = {*d, *l, x, y, dy, scale, dx, dsrt_kb_count(d)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(lrn_bwd_kernel, grid_for(a.count), THREADS, stream, a);
}

/*
 * The concat layer's kernel (nn/layers/concat_kernels.h): one thread an
 * element of the input, grid-stride loops.
 */
#include "nn/layers/concat_kernels.h"

#ifdef __CUDACC__
__global__ void channels_kernel(channels_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_channels(&a.xd, a.x, &a.yd, a.y, a.c0, a.to_y, a.accumulate, i);
}
#endif

cudaError_t dsrt_k_channels(const dsrt_k_desc *xd, void *x, const dsrt_k_desc *yd, void *y, int c0,
                            int to_y, int accumulate, cudaStream_t stream) {
    if (!dsrt_kb_channels_ok(xd, yd, c0)) return cudaErrorInvalidValue;
    channels_args a = {*xd, x, *yd, y, c0, to_y, accumulate, dsrt_kb_count(xd)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(channels_kernel, grid_for(a.count), THREADS, stream, a);
}

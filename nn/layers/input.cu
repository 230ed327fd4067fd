/*
 * The input layer's kernels (nn/layers/input_kernels.h): one thread an
 * element, grid-stride loops.
 */
#include "nn/layers/input_kernels.h"

#ifdef __CUDACC__
__global__ void input_u8_kernel(input_u8_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_input_u8(a.x, &a.pix, a.norm, a.stats, &a.yd, a.y, i);
}

__global__ void input_f32_kernel(input_f32_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_input_f32(a.x, a.norm, a.stats, &a.yd, a.y, i);
}
#endif

cudaError_t dsrt_k_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm, const float *stats,
                            const dsrt_k_desc *yd, void *y, cudaStream_t stream) {
    if (!dsrt_kb_input_u8_ok(pix, norm, stats, yd)) return cudaErrorInvalidValue;
    input_u8_args a = {x, *pix, norm, stats, *yd, y, dsrt_kb_count(yd)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(input_u8_kernel, grid_for(a.count), THREADS, stream, a);
}

cudaError_t dsrt_k_input_f32(const float *x, int norm, const float *stats, const dsrt_k_desc *yd,
                             void *y, cudaStream_t stream) {
    if (!dsrt_kb_input_ok(norm, stats, yd)) return cudaErrorInvalidValue;
    input_f32_args a = {x, norm, stats, *yd, y, dsrt_kb_count(yd)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(input_f32_kernel, grid_for(a.count), THREADS, stream, a);
}

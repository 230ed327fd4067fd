/*
 * The mul layer's own kernel (nn/layers/mul_kernels.h): a gate's gradient,
 * one block an element, each thread's strided share of the pixels, then the
 * block's tree.
 */
#include "nn/layers/mul_kernels.h"

#ifdef __CUDACC__
__global__ void mul_grad_kernel(mul_grad_args a) {
    __shared__ double sh[THREADS];
    for (size_t j = blockIdx.x; j < a.count; j += gridDim.x) {
        double s = block_sum(dsrt_kb_mul_grad_lane(&a.ad, a.dy, a.a, j, (int)threadIdx.x), sh);
        if (threadIdx.x == 0) dsrt_kb_store(a.db, a.bd.type, j, (float)s);
    }
}
#endif

cudaError_t dsrt_k_mul_grad(const dsrt_k_desc *ad, const void *dy, const void *a,
                            const dsrt_k_desc *bd, void *db, cudaStream_t stream) {
    if (!dsrt_kb_mul_grad_ok(ad, bd)) return cudaErrorInvalidValue;
    mul_grad_args g = {*ad, dy, a, *bd, db, dsrt_kb_count(bd)};
    if (!g.count) return cudaSuccess;
    return DSRT_K_LAUNCH(mul_grad_kernel, g.count < GRID_MAX ? (unsigned)g.count : GRID_MAX,
                         THREADS, stream, g);
}

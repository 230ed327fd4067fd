/*
 * The pooling kinds' kernels (nn/layers/pool_kernels.h): one thread an
 * output element forward, one an input element backward (it gathers the
 * gradients of the windows that hold it), grid-stride loops.
 */
#include "nn/layers/pool_kernels.h"

#ifdef __CUDACC__
__global__ void pool_fwd_kernel(pool_fwd_args a) {
    for (size_t i = tid(); i < a.count; i += stride()) dsrt_kb_pool_fwd(&a.p, a.x, a.y, a.arg, i);
}

__global__ void pool_bwd_kernel(pool_bwd_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_pool_bwd(&a.p, a.x, a.arg, a.dy, a.dx, i);
}
#endif

cudaError_t dsrt_k_pool_fwd(const dsrt_k_pool *p, const void *x, void *y, uint8_t *arg,
                            cudaStream_t stream) {
    if (!p || !dsrt_kb_pool_ok(p) || (arg && !dsrt_kb_pool_arg_ok(p))) return cudaErrorInvalidValue;
    pool_fwd_args a = {*p, x, y, arg, dsrt_kb_count(&p->yd)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(pool_fwd_kernel, grid_for(a.count), THREADS, stream, a);
}

cudaError_t dsrt_k_pool_bwd(const dsrt_k_pool *p, const void *x, const uint8_t *arg, const void *dy,
                            void *dx, cudaStream_t stream) {
    if (!p || !dsrt_kb_pool_ok(p) || (arg && !dsrt_kb_pool_arg_ok(p))) return cudaErrorInvalidValue;
    pool_bwd_args a = {*p, x, arg, dy, dx, dsrt_kb_count(&p->xd)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(pool_bwd_kernel, grid_for(a.count), THREADS, stream, a);
}

/*
 * The activation kinds' kernels (nn/layers/eltwise_kernels.h): one thread
 * an element, grid-stride loops.
 */
#include "nn/layers/eltwise_kernels.h"

#ifdef __CUDACC__
__global__ void act_fwd_kernel(act_fwd_args a) {
    for (size_t i = tid(); i < a.n; i += stride()) dsrt_kb_act_fwd(a.t, &a.a, a.x, a.y, i);
}

__global__ void act_bwd_kernel(act_bwd_args a) {
    for (size_t i = tid(); i < a.n; i += stride())
        dsrt_kb_act_bwd(a.t, &a.a, a.x, a.y, a.dy, a.dx, i);
}
#endif

cudaError_t dsrt_k_act_fwd(dsrt_k_type t, const dsrt_k_act *act, const void *x, void *y, size_t n,
                           cudaStream_t stream) {
    if (!dsrt_kb_act_ok(t, act)) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    act_fwd_args a = {t, *act, x, y, n};
    return DSRT_K_LAUNCH(act_fwd_kernel, grid_for(n), THREADS, stream, a);
}

cudaError_t dsrt_k_act_bwd(dsrt_k_type t, const dsrt_k_act *act, const void *x, const void *y,
                           const void *dy, void *dx, size_t n, cudaStream_t stream) {
    if (!dsrt_kb_act_ok(t, act)) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    act_bwd_args a = {t, *act, x, y, dy, dx, n};
    return DSRT_K_LAUNCH(act_bwd_kernel, grid_for(n), THREADS, stream, a);
}

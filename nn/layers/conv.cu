/*
 * The convolution's own kernels (nn/layers/conv_kernels.h), the fallback
 * where cuDNN has no algorithm: one thread an output element forward, an
 * input element backward, a filter element for the filters' gradient;
 * grid-stride loops.
 */
#include "nn/layers/conv_kernels.h"

#ifdef __CUDACC__
__global__ void conv_fwd_kernel(conv_fwd_args a) {
    for (size_t i = tid(); i < a.count; i += stride()) dsrt_kb_conv_fwd(&a.p, a.x, a.w, a.y, i);
}

__global__ void conv_bwd_data_kernel(conv_bwd_data_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_conv_bwd_data(&a.p, a.w, a.dy, a.dx, i);
}

__global__ void conv_bwd_filter_kernel(conv_bwd_filter_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_conv_bwd_filter(&a.p, a.x, a.dy, a.dw, a.dwt, i);
}
#endif

cudaError_t dsrt_k_conv_fwd(const dsrt_k_conv *p, const void *x, const void *w, void *y,
                            cudaStream_t stream) {
    if (!p || !dsrt_kb_conv_ok(p)) return cudaErrorInvalidValue;
    conv_fwd_args a = {*p, x, w, y, dsrt_kb_count(&p->yd)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(conv_fwd_kernel, grid_for(a.count), THREADS, stream, a);
}

cudaError_t dsrt_k_conv_bwd_data(const dsrt_k_conv *p, const void *w, const void *dy, void *dx,
                                 cudaStream_t stream) {
    if (!p || !dsrt_kb_conv_ok(p)) return cudaErrorInvalidValue;
    conv_bwd_data_args a = {*p, w, dy, dx, dsrt_kb_count(&p->xd)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(conv_bwd_data_kernel, grid_for(a.count), THREADS, stream, a);
}

cudaError_t dsrt_k_conv_bwd_filter(const dsrt_k_conv *p, const void *x, const void *dy, void *dw,
                                   dsrt_k_type dwt, cudaStream_t stream) {
    if (!p || !dsrt_kb_conv_ok(p) || !dsrt_kb_type_ok(dwt)) return cudaErrorInvalidValue;
    conv_bwd_filter_args a = {*p, x, dy, dw, dwt, dsrt_kb_conv_w_count(p)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(conv_bwd_filter_kernel, grid_for(a.count), THREADS, stream, a);
}

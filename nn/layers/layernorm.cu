/*
 * Layer normalisation's kernels (nn/layers/layernorm_kernels.h): one warp a
 * pixel's channels (SOFT_WARPS pixels a block, pixels strided over the
 * grid), the lanes' sums combined by the warp's butterfly through shuffles.
 */
#include "nn/layers/layernorm_kernels.h"

#ifdef __CUDACC__
__global__ void ln_fwd_kernel(ln_fwd_args a) {
    int lane = threadIdx.x & (DSRT_KB_WARP - 1);
    size_t warps = (size_t)gridDim.x * DSRT_KB_SOFT_WARPS;
    for (size_t j = (size_t)blockIdx.x * DSRT_KB_SOFT_WARPS + threadIdx.x / DSRT_KB_WARP;
         j < a.rows; j += warps) {
        double m = warp_sum(dsrt_kb_ln_lane_sum(&a.d, a.x, j, lane, 0, 0.0)) / (double)a.d.c;
        double q = warp_sum(dsrt_kb_ln_lane_sum(&a.d, a.x, j, lane, 1, m));
        float mf = (float)m, rf = dsrt_kb_ln_rstd(q, a.d.c, a.eps);
        if (lane == 0 && a.mean) {
            a.mean[j] = mf;
            a.rstd[j] = rf;
        }
        dsrt_kb_ln_lane_apply(&a.d, a.x, a.gamma, a.beta, mf, rf, a.y, j, lane);
    }
}

__global__ void ln_bwd_kernel(ln_bwd_args a) {
    int lane = threadIdx.x & (DSRT_KB_WARP - 1);
    size_t warps = (size_t)gridDim.x * DSRT_KB_SOFT_WARPS;
    for (size_t j = (size_t)blockIdx.x * DSRT_KB_SOFT_WARPS + threadIdx.x / DSRT_KB_WARP;
         j < a.rows; j += warps) {
        double sg, sgx;
        dsrt_kb_ln_lane_bwd(&a.d, a.x, a.dy, a.gamma, a.mean[j], a.rstd[j], j, lane, &sg, &sgx);
        sg = warp_sum(sg);
        sgx = warp_sum(sgx);
        dsrt_kb_ln_lane_dx(&a.d, a.x, a.dy, a.gamma, a.mean[j], a.rstd[j], sg, sgx, a.dx, j, lane);
    }
}

/* Blocks of SOFT_WARPS rows, at most GRID_MAX. */
static inline unsigned ln_grid(size_t rows) {
    size_t b = (rows + DSRT_KB_SOFT_WARPS - 1) / DSRT_KB_SOFT_WARPS;
    return b < GRID_MAX ? (unsigned)b : GRID_MAX;
}
#endif

cudaError_t dsrt_k_ln_fwd(const dsrt_k_desc *d, const void *x, const float *gamma,
                          const float *beta, float eps, void *y, float *mean, float *rstd,
                          cudaStream_t stream) {
    if (!dsrt_kb_ln_ok(d, gamma, beta) || !mean != !rstd) return cudaErrorInvalidValue;
    ln_fwd_args a = {*d, x, gamma, beta, eps, y, mean, rstd, (size_t)d->n * d->h * d->w};
    if (!a.rows) return cudaSuccess;
    return DSRT_K_LAUNCH(ln_fwd_kernel, ln_grid(a.rows), DSRT_KB_SOFT_WARPS * DSRT_KB_WARP, stream,
                         a);
}

cudaError_t dsrt_k_ln_bwd(const dsrt_k_desc *d, const void *x, const void *dy, const float *gamma,
                          const float *mean, const float *rstd, void *dx, cudaStream_t stream) {
    if (!dsrt_kb_ln_bwd_ok(d, gamma, mean, rstd)) return cudaErrorInvalidValue;
    ln_bwd_args a = {*d, x, dy, gamma, mean, rstd, dx, (size_t)d->n * d->h * d->w};
    if (!a.rows) return cudaSuccess;
    return DSRT_K_LAUNCH(ln_bwd_kernel, ln_grid(a.rows), DSRT_KB_SOFT_WARPS * DSRT_KB_WARP, stream,
                         a);
}

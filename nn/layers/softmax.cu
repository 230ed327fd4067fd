/*
 * The softmax layer's kernels (nn/layers/softmax_kernels.h): one warp a
 * row, its lanes' shares combined by the warp's butterfly through shuffles;
 * the batch's loss and correct count by one block's tree; the gradient one
 * thread an element.
 */
#include "nn/layers/softmax_kernels.h"

#ifdef __CUDACC__
/* One warp a row: each lane's share, then the butterfly (lane l takes lane
 * l ^ o's value, o = 16, 8, ..., 1). */
__global__ void softmax_fwd_kernel(softmax_fwd_args a) {
    int lane = threadIdx.x & (DSRT_KB_WARP - 1);
    int row = blockIdx.x * DSRT_KB_SOFT_WARPS + (threadIdx.x / DSRT_KB_WARP);
    if (row >= a.n) return;
    dsrt_kb_row zrow = {a.z, a.zt, (size_t)row * a.k};
    const dsrt_kb_row *zr = &zrow;
    float best;
    int arg;
    dsrt_kb_sm_lane_max(zr, a.k, lane, &best, &arg);
    for (int o = DSRT_KB_WARP / 2; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oa = __shfl_xor_sync(0xffffffffu, arg, o);
        dsrt_kb_sm_merge(&best, &arg, ob, oa);
    }
    float mx = dsrt_kb_sm_row_max(zr, best, &arg);
    double dm = (double)mx, sum = warp_sum(dsrt_kb_sm_lane_sumexp(zr, a.k, lane, dm));
    dsrt_kb_sm_lane_store(zr, a.probs + (size_t)row * a.k, a.k, lane, dm, 1.0 / sum);
    if (lane == 0 && a.labels) {
        dsrt_kb_sm_row_result(zr, a.labels[row], a.k, mx, sum, arg, &a.res[row]);
        if (a.soft) dsrt_kb_sm_row_soft(zr, a.soft + (size_t)row * a.k, a.k, mx, sum, &a.res[row]);
    }
}

/* One block: each thread's strided share, then the tree. */
__global__ void softmax_total_kernel(softmax_total_args a) {
    __shared__ double sl[THREADS];
    __shared__ int sc[THREADS];
    int t = (int)threadIdx.x;
    dsrt_kb_sm_total_part(a.res, a.n, t, &sl[t], &sc[t]);
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        dsrt_kb_tree_d(sl, t, s);
        dsrt_kb_tree_i(sc, t, s);
        __syncthreads();
    }
    if (t == 0) {
        if (a.loss) *a.loss = sl[0] / a.n;
        if (a.correct) *a.correct = sc[0];
    }
}

__global__ void softmax_bwd_kernel(softmax_bwd_args a) {
    float sc = a.scale_dev ? *a.scale_dev : a.scale;
    for (size_t i = tid(); i < a.count; i += stride()) {
        if (a.soft)
            dsrt_kb_sm_bwd_soft(a.probs, a.soft, a.res, a.k, sc, a.dz, a.t, i);
        else
            dsrt_kb_sm_bwd(a.probs, a.labels, a.k, sc, a.dz, a.t, i);
    }
}
#endif

size_t dsrt_k_softmax_xent_work(int n) {
    return dsrt_kb_softmax_work(n);
}

cudaError_t dsrt_k_softmax_xent_fwd(const void *z, dsrt_k_type zt, const int32_t *labels,
                                    const float *soft, int n, int k, float *probs, double *loss,
                                    int32_t *correct, void *work, cudaStream_t stream) {
    if (!dsrt_kb_softmax_fwd_ok(n, k, labels, soft, work) || !dsrt_kb_type_ok(zt))
        return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    softmax_fwd_args a = {z, zt, labels, soft, n, k, probs, (dsrt_k_row_result *)work};
    softmax_total_args t = {a.res, n, loss, correct};
    cudaError_t e = DSRT_K_LAUNCH(softmax_fwd_kernel,
                                  (unsigned)((n + DSRT_KB_SOFT_WARPS - 1) / DSRT_KB_SOFT_WARPS),
                                  DSRT_KB_SOFT_WARPS * DSRT_KB_WARP, stream, a);
    if (e != cudaSuccess || !labels || (!loss && !correct)) return e;
    return DSRT_K_LAUNCH(softmax_total_kernel, 1, THREADS, stream, t);
}

cudaError_t dsrt_k_softmax_xent_bwd(const float *probs, const int32_t *labels, const float *soft,
                                    const void *work, int n, int k, float scale,
                                    const float *scale_dev, void *dz, dsrt_k_type dzt,
                                    cudaStream_t stream) {
    if (!dsrt_kb_softmax_bwd_ok(n, k, labels, soft, work) || !dsrt_kb_type_ok(dzt))
        return cudaErrorInvalidValue;
    softmax_bwd_args a = {probs, labels,       soft,      (const dsrt_k_row_result *)work,
                          k,     scale,        scale_dev, dz,
                          dzt,   (size_t)n * k};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(softmax_bwd_kernel, grid_for(a.count), THREADS, stream, a);
}

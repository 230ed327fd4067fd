/*
 * The GPU backend's own kernels (nn/kernels.h says what each computes).
 * C-style CUDA: each __global__ kernel is a launch shape around a body of
 * nn/kernels_body.h, which holds all the arithmetic and which the host runs
 * too (tests/kernels_host.c); one extern "C" launcher a kernel, no state.
 * Scalars that change from step to step (the optimizer's, dropout's step,
 * the loss gradient's scale) can be read from device memory when the kernel
 * runs, so that a step recorded as a CUDA graph replays with new values.
 * Element-wise kernels run grid-stride loops over size_t indices on blocks
 * of 256 threads. Reductions follow the bodies' fixed order (a thread's
 * strided share, then a tree over the block in shared memory, or a warp
 * butterfly through shuffles), so a run gives the same bits each time.
 */
#include "nn/kernels.h"

#include <cuda_runtime.h>
#include <math.h>

#define THREADS  DSRT_KB_THREADS
#define GRID_MAX 8192u

static unsigned grid_for(size_t n) {
    size_t b = (n + THREADS - 1) / THREADS;
    return b < GRID_MAX ? (unsigned)b : GRID_MAX;
}

static __device__ __forceinline__ size_t tid() {
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

static __device__ __forceinline__ size_t stride() {
    return (size_t)gridDim.x * blockDim.x;
}

/* The tree over the block's THREADS lanes, as dsrt_kb_tree_d orders it; the
 * result is in sh[0], read by every thread. */
static __device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        dsrt_kb_tree_d(sh, (int)threadIdx.x, s);
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

// ----------------------------------------------------------------------------
// Input

__global__ void input_u8_kernel(const uint8_t *__restrict__ x, dsrt_k_pixel pix, int norm,
                                const float *__restrict__ stats, dsrt_k_desc yd, void *y,
                                size_t count) {
    for (size_t i = tid(); i < count; i += stride())
        dsrt_kb_input_u8(x, &pix, norm, stats, &yd, y, i);
}

__global__ void input_f32_kernel(const float *__restrict__ x, int norm,
                                 const float *__restrict__ stats, dsrt_k_desc yd, void *y,
                                 size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_input_f32(x, norm, stats, &yd, y, i);
}

extern "C" cudaError_t dsrt_k_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm,
                                       const float *stats, const dsrt_k_desc *yd, void *y,
                                       cudaStream_t stream) {
    if (!dsrt_kb_input_u8_ok(pix, norm, stats, yd)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(yd);
    if (!count) return cudaSuccess;
    input_u8_kernel<<<grid_for(count), THREADS, 0, stream>>>(x, *pix, norm, stats, *yd, y, count);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_input_f32(const float *x, int norm, const float *stats,
                                        const dsrt_k_desc *yd, void *y, cudaStream_t stream) {
    if (!dsrt_kb_input_ok(norm, stats, yd)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(yd);
    if (!count) return cudaSuccess;
    input_f32_kernel<<<grid_for(count), THREADS, 0, stream>>>(x, norm, stats, *yd, y, count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Padding and cropping

__global__ void pad_kernel(dsrt_k_desc xd, const void *x, dsrt_k_desc yd, void *y, int top,
                           int left, float fill, int accumulate, size_t count) {
    for (size_t i = tid(); i < count; i += stride())
        dsrt_kb_pad(&xd, x, &yd, y, top, left, fill, accumulate, i);
}

extern "C" cudaError_t dsrt_k_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd,
                                  void *y, int top, int left, float fill, int accumulate,
                                  cudaStream_t stream) {
    if (!dsrt_kb_pad_ok(xd, yd)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(yd);
    if (!count) return cudaSuccess;
    pad_kernel<<<grid_for(count), THREADS, 0, stream>>>(*xd, x, *yd, y, top, left, fill, accumulate,
                                                        count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Activations and biases

__global__ void relu_fwd_kernel(dsrt_k_type t, const void *x, void *y, size_t n, float leak) {
    for (size_t i = tid(); i < n; i += stride()) dsrt_kb_relu_fwd(t, x, y, leak, i);
}

__global__ void relu_bwd_kernel(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n,
                                float leak) {
    for (size_t i = tid(); i < n; i += stride()) dsrt_kb_relu_bwd(t, y, dy, dx, leak, i);
}

extern "C" cudaError_t dsrt_k_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak,
                                       cudaStream_t stream) {
    if (!dsrt_kb_type_ok(t)) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    relu_fwd_kernel<<<grid_for(n), THREADS, 0, stream>>>(t, x, y, n, leak);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx,
                                       size_t n, float leak, cudaStream_t stream) {
    if (!dsrt_kb_type_ok(t)) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    relu_bwd_kernel<<<grid_for(n), THREADS, 0, stream>>>(t, y, dy, dx, n, leak);
    return cudaGetLastError();
}

__global__ void act_fwd_kernel(dsrt_k_type t, dsrt_k_act a, const void *x, void *y, size_t n) {
    for (size_t i = tid(); i < n; i += stride()) dsrt_kb_act_fwd(t, &a, x, y, i);
}

__global__ void act_bwd_kernel(dsrt_k_type t, dsrt_k_act a, const void *x, const void *y,
                               const void *dy, void *dx, size_t n) {
    for (size_t i = tid(); i < n; i += stride()) dsrt_kb_act_bwd(t, &a, x, y, dy, dx, i);
}

extern "C" cudaError_t dsrt_k_act_fwd(dsrt_k_type t, const dsrt_k_act *a, const void *x, void *y,
                                      size_t n, cudaStream_t stream) {
    if (!dsrt_kb_act_ok(t, a)) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    act_fwd_kernel<<<grid_for(n), THREADS, 0, stream>>>(t, *a, x, y, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_act_bwd(dsrt_k_type t, const dsrt_k_act *a, const void *x,
                                      const void *y, const void *dy, void *dx, size_t n,
                                      cudaStream_t stream) {
    if (!dsrt_kb_act_ok(t, a)) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    act_bwd_kernel<<<grid_for(n), THREADS, 0, stream>>>(t, *a, x, y, dy, dx, n);
    return cudaGetLastError();
}

__global__ void bias_act_kernel(dsrt_k_desc d, const void *x, const float *__restrict__ b, void *y,
                                int relu, float leak, size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_bias_act(&d, x, b, y, relu, leak, i);
}

extern "C" cudaError_t dsrt_k_bias_act(const dsrt_k_desc *d, const void *x, const float *b, void *y,
                                       int relu, float leak, cudaStream_t stream) {
    if (!dsrt_kb_desc_ok(d)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(d);
    if (!count) return cudaSuccess;
    bias_act_kernel<<<grid_for(count), THREADS, 0, stream>>>(*d, x, b, y, relu, leak, count);
    return cudaGetLastError();
}

extern "C" size_t dsrt_k_bias_grad_work(const dsrt_k_desc *d) {
    return dsrt_kb_bias_grad_work(d);
}

/* Blocks of BIAS_COLS columns x BIAS_LANES row lanes over one chunk of rows
 * (blockIdx.y); lane 0 adds the lanes' sums in lane order into the chunk's
 * partial sum. */
__global__ void bias_grad_kernel(dsrt_k_type t, void *dy, const void *y, float leak, size_t rows,
                                 int cols, int chunks, float *__restrict__ partial) {
    __shared__ float part[DSRT_KB_BIAS_LANES][DSRT_KB_BIAS_COLS + 1];
    int col = blockIdx.x * DSRT_KB_BIAS_COLS + threadIdx.x, k = blockIdx.y;
    size_t r0, r1;
    dsrt_kb_bias_rows(rows, chunks, k, &r0, &r1);
    part[threadIdx.y][threadIdx.x] =
        col < cols ? dsrt_kb_bias_lane(t, dy, y, leak, cols, col, r0, r1, (int)threadIdx.y) : 0.0f;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float lanes[DSRT_KB_BIAS_LANES];
        for (int l = 0; l < DSRT_KB_BIAS_LANES; l++) lanes[l] = part[l][threadIdx.x];
        partial[(size_t)k * cols + col] = dsrt_kb_bias_lanes_total(lanes);
    }
}

__global__ void bias_total_kernel(const float *__restrict__ partial, int chunks, int cols,
                                  float *__restrict__ db) {
    for (size_t c = tid(); c < (size_t)cols; c += stride())
        db[c] = dsrt_kb_bias_total(partial, chunks, cols, (int)c);
}

extern "C" cudaError_t dsrt_k_bias_grad(const dsrt_k_desc *d, void *dy, const void *y, float leak,
                                        float *db, void *work, cudaStream_t stream) {
    if (!dsrt_kb_bias_grad_ok(d) || !work) return cudaErrorInvalidValue;
    int cols = d->c;
    size_t rows = (size_t)d->n * d->h * d->w;
    if (!cols) return cudaSuccess;
    int chunks = dsrt_kb_bias_chunks(rows);
    dim3 grid((unsigned)((cols + DSRT_KB_BIAS_COLS - 1) / DSRT_KB_BIAS_COLS), (unsigned)chunks);
    bias_grad_kernel<<<grid, dim3(DSRT_KB_BIAS_COLS, DSRT_KB_BIAS_LANES), 0, stream>>>(
        d->type, dy, y, leak, rows, cols, chunks, (float *)work);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    bias_total_kernel<<<grid_for((size_t)cols), THREADS, 0, stream>>>((const float *)work, chunks,
                                                                      cols, db);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Pooling and local response normalisation

__global__ void pool_fwd_kernel(dsrt_k_pool p, const void *x, void *y, uint8_t *arg, size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_pool_fwd(&p, x, y, arg, i);
}

__global__ void pool_bwd_kernel(dsrt_k_pool p, const void *x, const uint8_t *arg, const void *dy,
                                void *dx, size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_pool_bwd(&p, x, arg, dy, dx, i);
}

extern "C" cudaError_t dsrt_k_pool_fwd(const dsrt_k_pool *p, const void *x, void *y, uint8_t *arg,
                                       cudaStream_t stream) {
    if (!p || !dsrt_kb_pool_ok(p) || (arg && !dsrt_kb_pool_arg_ok(p))) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(&p->yd);
    if (!count) return cudaSuccess;
    pool_fwd_kernel<<<grid_for(count), THREADS, 0, stream>>>(*p, x, y, arg, count);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_pool_bwd(const dsrt_k_pool *p, const void *x, const uint8_t *arg,
                                       const void *dy, void *dx, cudaStream_t stream) {
    if (!p || !dsrt_kb_pool_ok(p) || (arg && !dsrt_kb_pool_arg_ok(p))) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(&p->xd);
    if (!count) return cudaSuccess;
    pool_bwd_kernel<<<grid_for(count), THREADS, 0, stream>>>(*p, x, arg, dy, dx, count);
    return cudaGetLastError();
}

__global__ void lrn_fwd_kernel(dsrt_k_desc d, dsrt_k_lrn l, const void *x, void *y, float *scale,
                               size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_lrn_fwd(&d, x, &l, y, scale, i);
}

__global__ void lrn_bwd_kernel(dsrt_k_desc d, dsrt_k_lrn l, const void *x, const void *y,
                               const void *dy, const float *scale, void *dx, size_t count) {
    for (size_t i = tid(); i < count; i += stride())
        dsrt_kb_lrn_bwd(&d, x, y, dy, scale, &l, dx, i);
}

extern "C" cudaError_t dsrt_k_lrn_fwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x,
                                      void *y, float *scale, cudaStream_t stream) {
    if (!dsrt_kb_lrn_ok(d, l)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(d);
    if (!count) return cudaSuccess;
    lrn_fwd_kernel<<<grid_for(count), THREADS, 0, stream>>>(*d, *l, x, y, scale, count);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_lrn_bwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x,
                                      const void *y, const void *dy, const float *scale, void *dx,
                                      cudaStream_t stream) {
    if (!dsrt_kb_lrn_ok(d, l)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(d);
    if (!count) return cudaSuccess;
    lrn_bwd_kernel<<<grid_for(count), THREADS, 0, stream>>>(*d, *l, x, y, dy, scale, dx, count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Graphs

__global__ void sum_kernel(dsrt_k_type t, dsrt_k_sum s, void *y, int relu, float leak,
                           size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_sum(t, &s, y, relu, leak, i);
}

extern "C" cudaError_t dsrt_k_sum_fwd(dsrt_k_type t, const dsrt_k_sum *s, void *y, size_t count,
                                      int relu, float leak, cudaStream_t stream) {
    if (!s || s->n < 1 || s->n > DSRT_KB_SUM_MAX || !dsrt_kb_type_ok(t))
        return cudaErrorInvalidValue;
    if (!count) return cudaSuccess;
    sum_kernel<<<grid_for(count), THREADS, 0, stream>>>(t, *s, y, relu, leak, count);
    return cudaGetLastError();
}

__global__ void channels_kernel(dsrt_k_desc xd, void *x, dsrt_k_desc yd, void *y, int c0, int to_y,
                                int accumulate, size_t count) {
    for (size_t i = tid(); i < count; i += stride())
        dsrt_kb_channels(&xd, x, &yd, y, c0, to_y, accumulate, i);
}

extern "C" cudaError_t dsrt_k_channels(const dsrt_k_desc *xd, void *x, const dsrt_k_desc *yd,
                                       void *y, int c0, int to_y, int accumulate,
                                       cudaStream_t stream) {
    if (!dsrt_kb_channels_ok(xd, yd, c0)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(xd);
    if (!count) return cudaSuccess;
    channels_kernel<<<grid_for(count), THREADS, 0, stream>>>(*xd, x, *yd, y, c0, to_y, accumulate,
                                                             count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Direct convolution (the fallback where cuDNN has no algorithm)

__global__ void conv_fwd_kernel(dsrt_k_conv p, const void *x, const void *w, void *y,
                                size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_conv_fwd(&p, x, w, y, i);
}

__global__ void conv_bwd_data_kernel(dsrt_k_conv p, const void *w, const void *dy, void *dx,
                                     size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_conv_bwd_data(&p, w, dy, dx, i);
}

__global__ void conv_bwd_filter_kernel(dsrt_k_conv p, const void *x, const void *dy, void *dw,
                                       dsrt_k_type dwt, size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_conv_bwd_filter(&p, x, dy, dw, dwt, i);
}

extern "C" cudaError_t dsrt_k_conv_fwd(const dsrt_k_conv *p, const void *x, const void *w, void *y,
                                       cudaStream_t stream) {
    if (!p || !dsrt_kb_conv_ok(p)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(&p->yd);
    if (!count) return cudaSuccess;
    conv_fwd_kernel<<<grid_for(count), THREADS, 0, stream>>>(*p, x, w, y, count);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_conv_bwd_data(const dsrt_k_conv *p, const void *w, const void *dy,
                                            void *dx, cudaStream_t stream) {
    if (!p || !dsrt_kb_conv_ok(p)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(&p->xd);
    if (!count) return cudaSuccess;
    conv_bwd_data_kernel<<<grid_for(count), THREADS, 0, stream>>>(*p, w, dy, dx, count);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_conv_bwd_filter(const dsrt_k_conv *p, const void *x, const void *dy,
                                              void *dw, dsrt_k_type dwt, cudaStream_t stream) {
    if (!p || !dsrt_kb_conv_ok(p) || !dsrt_kb_type_ok(dwt)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_conv_w_count(p);
    if (!count) return cudaSuccess;
    conv_bwd_filter_kernel<<<grid_for(count), THREADS, 0, stream>>>(*p, x, dy, dw, dwt, count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Dropout

__global__ void dropout_kernel(dsrt_k_desc d, const void *x, void *y, uint64_t seed,
                               uint64_t iteration, const uint64_t *iteration_dev, int layer,
                               uint32_t threshold, float scale, size_t count) {
    dsrt_rng rng =
        dsrt_dropout_rng(seed, iteration_dev ? *iteration_dev : iteration, (uint64_t)layer);
    for (size_t i = tid(); i < count; i += stride())
        dsrt_kb_dropout(&d, x, y, &rng, threshold, scale, i);
}

extern "C" cudaError_t dsrt_k_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                                      uint64_t iteration, const uint64_t *iteration_dev, int layer,
                                      float p, cudaStream_t stream) {
    if (!dsrt_kb_dropout_ok(d, p, layer)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(d);
    if (!count) return cudaSuccess;
    dropout_kernel<<<grid_for(count), THREADS, 0, stream>>>(
        *d, x, y, seed, iteration, iteration_dev, layer, dsrt_dropout_threshold(p),
        dsrt_dropout_scale(p), count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Softmax and cross-entropy

/* One warp a row: each lane's share, then the butterfly (lane l takes lane
 * l ^ o's value, o = 16, 8, ..., 1). */
__global__ void softmax_fwd_kernel(const void *z, dsrt_k_type zt,
                                   const int32_t *__restrict__ labels,
                                   const float *__restrict__ soft, int n, int k,
                                   float *__restrict__ probs, dsrt_k_row_result *__restrict__ res) {
    int lane = threadIdx.x & (DSRT_KB_WARP - 1);
    int row = blockIdx.x * DSRT_KB_SOFT_WARPS + (threadIdx.x / DSRT_KB_WARP);
    if (row >= n) return;
    dsrt_kb_row zrow = {z, zt, (size_t)row * k};
    const dsrt_kb_row *zr = &zrow;
    float best;
    int arg;
    dsrt_kb_sm_lane_max(zr, k, lane, &best, &arg);
    for (int o = DSRT_KB_WARP / 2; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oa = __shfl_xor_sync(0xffffffffu, arg, o);
        dsrt_kb_sm_merge(&best, &arg, ob, oa);
    }
    float mx = dsrt_kb_sm_row_max(zr, best, &arg);
    double dm = (double)mx, sum = dsrt_kb_sm_lane_sumexp(zr, k, lane, dm);
    for (int o = DSRT_KB_WARP / 2; o > 0; o >>= 1)
        sum = DSRT_DADD(sum, __shfl_xor_sync(0xffffffffu, sum, o));
    dsrt_kb_sm_lane_store(zr, probs + (size_t)row * k, k, lane, dm, 1.0 / sum);
    if (lane == 0 && labels) {
        dsrt_kb_sm_row_result(zr, labels[row], k, mx, sum, arg, &res[row]);
        if (soft) dsrt_kb_sm_row_soft(zr, soft + (size_t)row * k, k, mx, sum, &res[row]);
    }
}

/* One block: each thread's strided share, then the tree. */
__global__ void softmax_total_kernel(const dsrt_k_row_result *__restrict__ res, int n, double *loss,
                                     int32_t *correct) {
    __shared__ double sl[THREADS];
    __shared__ int sc[THREADS];
    int t = (int)threadIdx.x;
    dsrt_kb_sm_total_part(res, n, t, &sl[t], &sc[t]);
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        dsrt_kb_tree_d(sl, t, s);
        dsrt_kb_tree_i(sc, t, s);
        __syncthreads();
    }
    if (t == 0) {
        if (loss) *loss = sl[0] / n;
        if (correct) *correct = sc[0];
    }
}

extern "C" size_t dsrt_k_softmax_xent_work(int n) {
    return dsrt_kb_softmax_work(n);
}

extern "C" cudaError_t dsrt_k_softmax_xent_fwd(const void *z, dsrt_k_type zt, const int32_t *labels,
                                               const float *soft, int n, int k, float *probs,
                                               double *loss, int32_t *correct, void *work,
                                               cudaStream_t stream) {
    if (!dsrt_kb_softmax_fwd_ok(n, k, labels, soft, work) || !dsrt_kb_type_ok(zt))
        return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    dsrt_k_row_result *res = (dsrt_k_row_result *)work;
    softmax_fwd_kernel<<<(unsigned)((n + DSRT_KB_SOFT_WARPS - 1) / DSRT_KB_SOFT_WARPS),
                         DSRT_KB_SOFT_WARPS * DSRT_KB_WARP, 0, stream>>>(z, zt, labels, soft, n, k,
                                                                         probs, res);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || !labels || (!loss && !correct)) return e;
    softmax_total_kernel<<<1, THREADS, 0, stream>>>(res, n, loss, correct);
    return cudaGetLastError();
}

__global__ void softmax_bwd_kernel(const float *__restrict__ probs,
                                   const int32_t *__restrict__ labels,
                                   const float *__restrict__ soft,
                                   const dsrt_k_row_result *__restrict__ res, int k, float scale,
                                   const float *scale_dev, void *dz, dsrt_k_type t, size_t count) {
    float sc = scale_dev ? *scale_dev : scale;
    for (size_t i = tid(); i < count; i += stride()) {
        if (soft)
            dsrt_kb_sm_bwd_soft(probs, soft, res, k, sc, dz, t, i);
        else
            dsrt_kb_sm_bwd(probs, labels, k, sc, dz, t, i);
    }
}

extern "C" cudaError_t dsrt_k_softmax_xent_bwd(const float *probs, const int32_t *labels,
                                               const float *soft, const void *work, int n, int k,
                                               float scale, const float *scale_dev, void *dz,
                                               dsrt_k_type dzt, cudaStream_t stream) {
    if (!dsrt_kb_softmax_bwd_ok(n, k, labels, soft, work) || !dsrt_kb_type_ok(dzt))
        return cudaErrorInvalidValue;
    size_t count = (size_t)n * k;
    if (!count) return cudaSuccess;
    softmax_bwd_kernel<<<grid_for(count), THREADS, 0, stream>>>(
        probs, labels, soft, (const dsrt_k_row_result *)work, k, scale, scale_dev, dz, dzt, count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// The optimizer
//
// The grid covers every segment in blocks of OPT_CHUNK elements (a segment's
// last block may be short). With norm clipping, a first kernel writes each
// block's sum of squares (double) to the workspace, a one-block kernel adds
// them up per segment in block order, then over the non-frozen segments in
// segment order (as nn/optim.c), and writes each segment's gradient scale;
// the update kernel reads it. Workspace: partial sums (blocks doubles), then
// the scales (n_seg floats).

extern "C" size_t dsrt_k_optim_layout(dsrt_k_segment *seg, int n_seg, uint32_t *blocks) {
    return dsrt_kb_optim_layout(seg, n_seg, blocks);
}

extern "C" void dsrt_k_optim_step_params(dsrt_k_step *st, const dsrt_optimizer_options *o,
                                         double lr, int64_t t) {
    dsrt_kb_optim_step_params(st, o, lr, t);
}

__global__ void optim_sumsq_kernel(const dsrt_k_segment *__restrict__ seg, int n_seg,
                                   const float *__restrict__ g, double *__restrict__ partial) {
    __shared__ double sh[THREADS];
    uint32_t b = blockIdx.x;
    double acc = block_sum(dsrt_kb_optim_sumsq_part(seg, n_seg, g, b, (int)threadIdx.x), sh);
    if (threadIdx.x == 0) partial[b] = acc;
}

__global__ void optim_scale_kernel(const dsrt_k_segment *__restrict__ seg, int n_seg,
                                   const double *__restrict__ partial, int global, double threshold,
                                   const dsrt_k_step *st_dev, float *__restrict__ scale) {
    __shared__ double sh[THREADS];
    if (st_dev) threshold = st_dev->threshold;
    double total = 0.0;
    for (int k = 0; k < n_seg; k++) {
        double acc = block_sum(dsrt_kb_optim_seg_part(&seg[k], partial, (int)threadIdx.x), sh);
        if (threadIdx.x == 0) {
            if (!global)
                scale[k] = dsrt_kb_clip_scale(acc, threshold);
            else if (seg[k].lr != 0.0f)
                total = DSRT_DADD(total, acc);
        }
    }
    if (global && threadIdx.x == 0) {
        float f = dsrt_kb_clip_scale(total, threshold);
        for (int k = 0; k < n_seg; k++) scale[k] = f;
    }
}

__global__ void optim_update_kernel(const dsrt_k_segment *__restrict__ seg, int n_seg,
                                    dsrt_k_step st_val, const dsrt_k_step *st_dev,
                                    const float *__restrict__ scale, float *w, float *g, float *m,
                                    float *v, dsrt_bf16 *w16) {
    const dsrt_k_step st = st_dev ? *st_dev : st_val;
    uint32_t b = blockIdx.x;
    int k = dsrt_kb_segment_of(seg, n_seg, b);
    const dsrt_k_segment s = seg[k];
    float sc = scale ? scale[k] : 1.0f;
    if (!dsrt_kb_optim_moves(&st, &s, sc, w16)) return; /* nothing changes */
    size_t begin, end;
    dsrt_kb_block_range(&s, b, &begin, &end);
    for (size_t i = s.off + begin + threadIdx.x; i < s.off + end; i += THREADS)
        dsrt_kb_optim_update(&st, &s, sc, i, w, g, m, v, w16);
}

extern "C" cudaError_t dsrt_k_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st,
                                           const dsrt_k_step *st_dev, float *w, float *g,
                                           float *buf0, float *buf1, dsrt_bf16 *w16,
                                           cudaStream_t stream) {
    if (!dsrt_kb_optim_ok(o, st, buf0, buf1)) return cudaErrorInvalidValue;
    if (!o->n_seg || !o->blocks) return cudaSuccess;
    const float *scale = NULL;
    if (dsrt_kb_optim_norm_clip(st)) {
        double *partial = (double *)o->work;
        float *sc = (float *)(partial + o->blocks);
        optim_sumsq_kernel<<<o->blocks, THREADS, 0, stream>>>(o->seg, o->n_seg, g, partial);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        optim_scale_kernel<<<1, THREADS, 0, stream>>>(o->seg, o->n_seg, partial,
                                                      st->clip == DSRT_CLIP_GLOBAL_L2NORM,
                                                      st->threshold, st_dev, sc);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        scale = sc;
    }
    optim_update_kernel<<<o->blocks, THREADS, 0, stream>>>(o->seg, o->n_seg, *st, st_dev, scale, w,
                                                           g, buf0, buf1, w16);
    return cudaGetLastError();
}

__global__ void consts_kernel(dsrt_k_consts *dst, dsrt_k_consts v) {
    *dst = v;
}

extern "C" cudaError_t dsrt_k_set_consts(dsrt_k_consts *dst, const dsrt_k_consts *v,
                                         cudaStream_t stream) {
    if (!dst || !v) return cudaErrorInvalidValue;
    consts_kernel<<<1, 1, 0, stream>>>(dst, *v);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Synchronised batch normalisation: one block a channel

/* Tile blockIdx.x, channels blockIdx.y * 32 + threadIdx.x: lane threadIdx.y's
 * share, the lanes' tree in shared memory, the tile's partial into part. */
__global__ void bn_tile_kernel(dsrt_k_desc d, const void *x, const void *dy, const void *y,
                               float leak, const float *mean, const float *inv, float *part) {
    __shared__ float ss[DSRT_KB_BN_LANES][DSRT_KB_BN_CHANS], sq[DSRT_KB_BN_LANES][DSRT_KB_BN_CHANS];
    int cx = (int)threadIdx.x, l = (int)threadIdx.y;
    int ch = (int)blockIdx.y * DSRT_KB_BN_CHANS + cx;
    size_t t = blockIdx.x;
    float s = 0.0f, q = 0.0f;
    if (ch < d.c)
        dsrt_kb_bn_lane(&d, x, dy, y, leak, dy ? mean[ch] : 0.0f, dy ? inv[ch] : 0.0f, t, ch, l, &s,
                        &q);
    float vs[DSRT_KB_BN_LANES], vq[DSRT_KB_BN_LANES];
    ss[l][cx] = s;
    sq[l][cx] = q;
    __syncthreads();
    if (l == 0 && ch < d.c) {
        for (int k = 0; k < DSRT_KB_BN_LANES; k++) vs[k] = ss[k][cx], vq[k] = sq[k][cx];
        for (int h = DSRT_KB_BN_LANES / 2; h > 0; h >>= 1)
            for (int k = 0; k < h; k++) {
                dsrt_kb_tree_f(vs, k, h);
                dsrt_kb_tree_f(vq, k, h);
            }
        part[t * 2 * (size_t)d.c + (size_t)ch] = vs[0];
        part[t * 2 * (size_t)d.c + (size_t)d.c + (size_t)ch] = vq[0];
    }
}

/* Channel ch's totals: the forward's sums (and the count), or the
 * backward's with the parameter gradients. */
__global__ void bn_total_kernel(const float *part, size_t tiles, int c, double *sums, double count,
                                float *dscale, float *dshift) {
    for (size_t ch = tid(); ch < (size_t)c; ch += stride()) {
        double s, q;
        dsrt_kb_bn_total(part, tiles, c, (int)ch, &s, &q);
        sums[ch] = s;
        sums[c + ch] = q;
        if (dshift) dshift[ch] = (float)s;
        if (dscale) dscale[ch] = (float)q;
        if (ch == 0 && count >= 0) sums[2 * c] = count;
    }
}

static cudaError_t bn_sums(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                           float leak, const float *mean, const float *inv, double *sums,
                           float *dscale, float *dshift, float *work, cudaStream_t stream) {
    if (!dsrt_kb_bn_ok(xd) || !work) return cudaErrorInvalidValue;
    if (!xd->c) return cudaSuccess;
    size_t tiles = dsrt_kb_bn_tiles(xd);
    dim3 block(DSRT_KB_BN_CHANS, DSRT_KB_BN_LANES),
        grid((unsigned)tiles, (unsigned)((xd->c + DSRT_KB_BN_CHANS - 1) / DSRT_KB_BN_CHANS));
    bn_tile_kernel<<<grid, block, 0, stream>>>(*xd, x, dy, y, leak, mean, inv, work);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    double count = dy ? -1.0 : (double)((size_t)xd->n * xd->h * xd->w);
    bn_total_kernel<<<grid_for((size_t)xd->c), THREADS, 0, stream>>>(work, tiles, xd->c, sums,
                                                                     count, dscale, dshift);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_bn_sums(const dsrt_k_desc *xd, const void *x, double *sums,
                                      float *work, cudaStream_t stream) {
    return bn_sums(xd, x, NULL, NULL, 0.0f, NULL, NULL, sums, NULL, NULL, work, stream);
}

__global__ void bn_stats_kernel(const double *__restrict__ sums, int c, float eps, float momentum,
                                float *mean, float *var, float *inv, float *run_mean,
                                float *run_var) {
    for (size_t k = tid(); k < (size_t)c; k += stride())
        dsrt_kb_bn_stats(sums, c, eps, momentum, mean, var, inv, run_mean, run_var, k);
}

extern "C" cudaError_t dsrt_k_bn_stats(const double *sums, int c, float eps, float momentum,
                                       float *mean, float *var, float *inv, float *run_mean,
                                       float *run_var, cudaStream_t stream) {
    if (c < 0) return cudaErrorInvalidValue;
    if (!c) return cudaSuccess;
    bn_stats_kernel<<<grid_for((size_t)c), THREADS, 0, stream>>>(sums, c, eps, momentum, mean, var,
                                                                 inv, run_mean, run_var);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_bn_bwd_sums(const dsrt_k_desc *xd, const void *x, const void *dy,
                                          const void *y, float leak, const float *mean,
                                          const float *inv, double *sums, float *dscale,
                                          float *dshift, float *work, cudaStream_t stream) {
    if (!dy || !mean || !inv) return cudaErrorInvalidValue;
    return bn_sums(xd, x, dy, y, leak, mean, inv, sums, dscale, dshift, work, stream);
}

__global__ void bn_bwd_dx_kernel(dsrt_k_desc d, const void *x, const void *dy, const void *y,
                                 float leak, const float *__restrict__ mean,
                                 const float *__restrict__ inv, const float *__restrict__ scale,
                                 const double *__restrict__ sums, const double *__restrict__ count,
                                 size_t total, void *dx) {
    double inv_m = 1.0 / *count;
    for (size_t i = tid(); i < total; i += stride())
        dsrt_kb_bn_bwd_dx(&d, x, dy, y, leak, mean, inv, scale, sums, inv_m, dx, i);
}

extern "C" cudaError_t dsrt_k_bn_bwd_dx(const dsrt_k_desc *xd, const void *x, const void *dy,
                                        const void *y, float leak, const float *mean,
                                        const float *inv, const float *scale, const double *sums,
                                        const double *count, void *dx, cudaStream_t stream) {
    if (!dsrt_kb_bn_ok(xd)) return cudaErrorInvalidValue;
    size_t total = dsrt_kb_count(xd);
    if (!total) return cudaSuccess;
    bn_bwd_dx_kernel<<<grid_for(total), THREADS, 0, stream>>>(*xd, x, dy, y, leak, mean, inv, scale,
                                                              sums, count, total, dx);
    return cudaGetLastError();
}

__global__ void bn_apply_kernel(dsrt_k_desc d, const void *x, const float *__restrict__ mean,
                                const float *__restrict__ inv, const float *__restrict__ var,
                                float eps, const float *__restrict__ scale,
                                const float *__restrict__ shift, int relu, float leak, void *y,
                                size_t total) {
    for (size_t i = tid(); i < total; i += stride())
        dsrt_kb_bn_apply(&d, x, mean, inv, var, eps, scale, shift, relu, leak, y, i);
}

extern "C" cudaError_t dsrt_k_bn_apply(const dsrt_k_desc *xd, const void *x, const float *mean,
                                       const float *inv, const float *var, float eps,
                                       const float *scale, const float *shift, int relu, float leak,
                                       void *y, cudaStream_t stream) {
    if (!dsrt_kb_bn_ok(xd) || (!inv && !var)) return cudaErrorInvalidValue;
    size_t total = dsrt_kb_count(xd);
    if (!total) return cudaSuccess;
    bn_apply_kernel<<<grid_for(total), THREADS, 0, stream>>>(*xd, x, mean, inv, var, eps, scale,
                                                             shift, relu, leak, y, total);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Products, layer normalisation, stochastic depth

__global__ void mul_kernel(dsrt_k_desc ad, const void *a, dsrt_k_desc bd, const void *b, void *y,
                           size_t count) {
    for (size_t i = tid(); i < count; i += stride()) dsrt_kb_mul(&ad, a, &bd, b, y, i);
}

extern "C" cudaError_t dsrt_k_mul(const dsrt_k_desc *ad, const void *a, const dsrt_k_desc *bd,
                                  const void *b, void *y, cudaStream_t stream) {
    if (!dsrt_kb_mul_ok(ad, bd)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(ad);
    if (!count) return cudaSuccess;
    mul_kernel<<<grid_for(count), THREADS, 0, stream>>>(*ad, a, *bd, b, y, count);
    return cudaGetLastError();
}

/* One block an element of the gate's gradient: each thread's strided
 * share, then the block's tree. */
__global__ void mul_grad_kernel(dsrt_k_desc ad, const void *dy, const void *a, dsrt_k_desc bd,
                                void *db, size_t count) {
    __shared__ double sh[THREADS];
    for (size_t j = blockIdx.x; j < count; j += gridDim.x) {
        double s = block_sum(dsrt_kb_mul_grad_lane(&ad, dy, a, j, (int)threadIdx.x), sh);
        if (threadIdx.x == 0) dsrt_kb_store(db, bd.type, j, (float)s);
    }
}

extern "C" cudaError_t dsrt_k_mul_grad(const dsrt_k_desc *ad, const void *dy, const void *a,
                                       const dsrt_k_desc *bd, void *db, cudaStream_t stream) {
    if (!dsrt_kb_mul_grad_ok(ad, bd)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(bd);
    if (!count) return cudaSuccess;
    unsigned blocks = count < GRID_MAX ? (unsigned)count : GRID_MAX;
    mul_grad_kernel<<<blocks, THREADS, 0, stream>>>(*ad, dy, a, *bd, db, count);
    return cudaGetLastError();
}

/* Tile blockIdx.x, channels blockIdx.y * 32 + threadIdx.x: as
 * bn_tile_kernel, the channel gradients' lanes. */
__global__ void chan_tile_kernel(dsrt_k_desc d, const void *x, const void *dy, const float *mean,
                                 const float *rstd, float *part) {
    __shared__ float ss[DSRT_KB_BN_LANES][DSRT_KB_BN_CHANS], sq[DSRT_KB_BN_LANES][DSRT_KB_BN_CHANS];
    int cx = (int)threadIdx.x, l = (int)threadIdx.y;
    int ch = (int)blockIdx.y * DSRT_KB_BN_CHANS + cx;
    size_t t = blockIdx.x;
    float s = 0.0f, q = 0.0f;
    if (ch < d.c) dsrt_kb_chan_grads_lane(&d, x, dy, mean, rstd, t, ch, l, &s, &q);
    ss[l][cx] = s;
    sq[l][cx] = q;
    __syncthreads();
    if (l == 0 && ch < d.c) {
        float vs[DSRT_KB_BN_LANES], vq[DSRT_KB_BN_LANES];
        for (int k = 0; k < DSRT_KB_BN_LANES; k++) vs[k] = ss[k][cx], vq[k] = sq[k][cx];
        for (int h = DSRT_KB_BN_LANES / 2; h > 0; h >>= 1)
            for (int k = 0; k < h; k++) {
                dsrt_kb_tree_f(vs, k, h);
                dsrt_kb_tree_f(vq, k, h);
            }
        part[t * 2 * (size_t)d.c + (size_t)ch] = vs[0];
        part[t * 2 * (size_t)d.c + (size_t)d.c + (size_t)ch] = vq[0];
    }
}

__global__ void chan_total_kernel(const float *part, size_t tiles, int c, float *dscale,
                                  float *dshift) {
    for (size_t ch = tid(); ch < (size_t)c; ch += stride()) {
        double s, q;
        dsrt_kb_bn_total(part, tiles, c, (int)ch, &s, &q);
        if (dshift) dshift[ch] = (float)s;
        if (dscale) dscale[ch] = (float)q;
    }
}

extern "C" cudaError_t dsrt_k_chan_grads(const dsrt_k_desc *d, const void *x, const void *dy,
                                         const float *mean, const float *rstd, float *dscale,
                                         float *dshift, float *work, cudaStream_t stream) {
    if (!dsrt_kb_chan_grads_ok(d, mean, rstd) || !work) return cudaErrorInvalidValue;
    if (!d->c) return cudaSuccess;
    size_t tiles = dsrt_kb_bn_tiles(d);
    dim3 block(DSRT_KB_BN_CHANS, DSRT_KB_BN_LANES),
        grid((unsigned)tiles, (unsigned)((d->c + DSRT_KB_BN_CHANS - 1) / DSRT_KB_BN_CHANS));
    chan_tile_kernel<<<grid, block, 0, stream>>>(*d, x, dy, mean, rstd, work);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    chan_total_kernel<<<grid_for((size_t)d->c), THREADS, 0, stream>>>(work, tiles, d->c, dscale,
                                                                      dshift);
    return cudaGetLastError();
}

/* The warp's butterfly over a double: every lane ends with the total. */
static __device__ double warp_sum(double v) {
    for (int o = DSRT_KB_WARP / 2; o > 0; o >>= 1)
        v = DSRT_DADD(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* One warp a row (DSRT_KB_SOFT_WARPS a block), rows strided over the grid. */
__global__ void ln_fwd_kernel(dsrt_k_desc d, const void *x, const float *__restrict__ gamma,
                              const float *__restrict__ beta, float eps, void *y, float *mean,
                              float *rstd, size_t rows) {
    int lane = threadIdx.x & (DSRT_KB_WARP - 1);
    size_t warps = (size_t)gridDim.x * DSRT_KB_SOFT_WARPS;
    for (size_t j = (size_t)blockIdx.x * DSRT_KB_SOFT_WARPS + threadIdx.x / DSRT_KB_WARP; j < rows;
         j += warps) {
        double m = warp_sum(dsrt_kb_ln_lane_sum(&d, x, j, lane, 0, 0.0)) / (double)d.c;
        double q = warp_sum(dsrt_kb_ln_lane_sum(&d, x, j, lane, 1, m));
        float mf = (float)m, rf = dsrt_kb_ln_rstd(q, d.c, eps);
        if (lane == 0 && mean) {
            mean[j] = mf;
            rstd[j] = rf;
        }
        dsrt_kb_ln_lane_apply(&d, x, gamma, beta, mf, rf, y, j, lane);
    }
}

__global__ void ln_bwd_kernel(dsrt_k_desc d, const void *x, const void *dy,
                              const float *__restrict__ gamma, const float *__restrict__ mean,
                              const float *__restrict__ rstd, void *dx, size_t rows) {
    int lane = threadIdx.x & (DSRT_KB_WARP - 1);
    size_t warps = (size_t)gridDim.x * DSRT_KB_SOFT_WARPS;
    for (size_t j = (size_t)blockIdx.x * DSRT_KB_SOFT_WARPS + threadIdx.x / DSRT_KB_WARP; j < rows;
         j += warps) {
        double sg, sgx;
        dsrt_kb_ln_lane_bwd(&d, x, dy, gamma, mean[j], rstd[j], j, lane, &sg, &sgx);
        sg = warp_sum(sg);
        sgx = warp_sum(sgx);
        dsrt_kb_ln_lane_dx(&d, x, dy, gamma, mean[j], rstd[j], sg, sgx, dx, j, lane);
    }
}

static unsigned ln_grid(size_t rows) {
    size_t b = (rows + DSRT_KB_SOFT_WARPS - 1) / DSRT_KB_SOFT_WARPS;
    return b < GRID_MAX ? (unsigned)b : GRID_MAX;
}

extern "C" cudaError_t dsrt_k_ln_fwd(const dsrt_k_desc *d, const void *x, const float *gamma,
                                     const float *beta, float eps, void *y, float *mean,
                                     float *rstd, cudaStream_t stream) {
    if (!dsrt_kb_ln_ok(d, gamma, beta) || !mean != !rstd) return cudaErrorInvalidValue;
    size_t rows = (size_t)d->n * d->h * d->w;
    if (!rows) return cudaSuccess;
    ln_fwd_kernel<<<ln_grid(rows), DSRT_KB_SOFT_WARPS * DSRT_KB_WARP, 0, stream>>>(
        *d, x, gamma, beta, eps, y, mean, rstd, rows);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_ln_bwd(const dsrt_k_desc *d, const void *x, const void *dy,
                                     const float *gamma, const float *mean, const float *rstd,
                                     void *dx, cudaStream_t stream) {
    if (!dsrt_kb_ln_bwd_ok(d, gamma, mean, rstd)) return cudaErrorInvalidValue;
    size_t rows = (size_t)d->n * d->h * d->w;
    if (!rows) return cudaSuccess;
    ln_bwd_kernel<<<ln_grid(rows), DSRT_KB_SOFT_WARPS * DSRT_KB_WARP, 0, stream>>>(
        *d, x, dy, gamma, mean, rstd, dx, rows);
    return cudaGetLastError();
}

__global__ void drop_path_kernel(dsrt_k_desc d, const void *x, void *y, uint64_t seed,
                                 uint64_t iteration, const uint64_t *iteration_dev, int layer,
                                 uint32_t threshold, float scale, size_t count) {
    dsrt_rng rng =
        dsrt_drop_path_rng(seed, iteration_dev ? *iteration_dev : iteration, (uint64_t)layer);
    for (size_t i = tid(); i < count; i += stride())
        dsrt_kb_drop_path(&d, x, y, &rng, threshold, scale, i);
}

extern "C" cudaError_t dsrt_k_drop_path(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                                        uint64_t iteration, const uint64_t *iteration_dev,
                                        int layer, float p, cudaStream_t stream) {
    if (!dsrt_kb_drop_path_ok(d, p, layer)) return cudaErrorInvalidValue;
    size_t count = dsrt_kb_count(d);
    if (!count) return cudaSuccess;
    drop_path_kernel<<<grid_for(count), THREADS, 0, stream>>>(
        *d, x, y, seed, iteration, iteration_dev, layer, dsrt_dropout_threshold(p),
        dsrt_dropout_scale(p), count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Conversions and helpers

__global__ void to_bf16_kernel(const float *__restrict__ x, dsrt_bf16 *__restrict__ y, size_t n) {
    for (size_t i = tid(); i < n; i += stride()) y[i] = dsrt_bf16_from_f32(x[i]);
}

__global__ void from_bf16_kernel(const dsrt_bf16 *__restrict__ x, float *__restrict__ y, size_t n) {
    for (size_t i = tid(); i < n; i += stride()) y[i] = dsrt_f32_from_bf16(x[i]);
}

__global__ void fill_kernel(float *__restrict__ y, size_t n, float v) {
    for (size_t i = tid(); i < n; i += stride()) y[i] = v;
}

__global__ void scale_kernel(const float *x, float *y, size_t n, float a) {
    for (size_t i = tid(); i < n; i += stride()) y[i] = DSRT_FMUL(a, x[i]);
}

extern "C" cudaError_t dsrt_k_f32_to_bf16(const float *x, dsrt_bf16 *y, size_t n,
                                          cudaStream_t stream) {
    if (!n) return cudaSuccess;
    to_bf16_kernel<<<grid_for(n), THREADS, 0, stream>>>(x, y, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_bf16_to_f32(const dsrt_bf16 *x, float *y, size_t n,
                                          cudaStream_t stream) {
    if (!n) return cudaSuccess;
    from_bf16_kernel<<<grid_for(n), THREADS, 0, stream>>>(x, y, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_fill(float *y, size_t n, float v, cudaStream_t stream) {
    if (!n) return cudaSuccess;
    fill_kernel<<<grid_for(n), THREADS, 0, stream>>>(y, n, v);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_scale(const float *x, float *y, size_t n, float a,
                                    cudaStream_t stream) {
    if (!n) return cudaSuccess;
    scale_kernel<<<grid_for(n), THREADS, 0, stream>>>(x, y, n, a);
    return cudaGetLastError();
}

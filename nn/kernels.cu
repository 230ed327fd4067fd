/*
 * The GPU backend's own kernels (nn/kernels.h says what each computes).
 * C-style CUDA: small kernels over plain pointers, one extern "C" launcher
 * each, no state. Element-wise kernels run grid-stride loops over size_t
 * indices on blocks of 256 threads. Every sum whose result the CPU backend
 * also produces (norms, losses, column sums) runs in a fixed order, so a
 * run gives the same bits each time; products and sums the CPU rounds one
 * by one are written with __fmul_rn and friends, which the compiler never
 * fuses into an FMA.
 */
#include "nn/arith.h"
#include "nn/kernels.h"

#include <cuda_runtime.h>
#include <math.h>

#define THREADS    256
#define GRID_MAX   8192u
#define OPT_CHUNK  4096u /* elements of one optimizer block */
#define SOFT_WARPS 8     /* rows of one softmax block */

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

/* Loads and stores of either type, as float. */
static __device__ __forceinline__ float load(const void *p, dsrt_k_type t, size_t i) {
    return t == DSRT_K_BF16 ? dsrt_f32_from_bf16(((const dsrt_bf16 *)p)[i]) : ((const float *)p)[i];
}

static __device__ __forceinline__ void store(void *p, dsrt_k_type t, size_t i, float v) {
    if (t == DSRT_K_BF16)
        ((dsrt_bf16 *)p)[i] = dsrt_bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}

static size_t desc_count(const dsrt_k_desc *d) {
    return (size_t)d->n * d->c * d->h * d->w;
}

static int desc_ok(const dsrt_k_desc *d) {
    return d && d->n >= 0 && d->c >= 0 && d->h >= 0 && d->w >= 0 &&
           (d->type == DSRT_K_F32 || d->type == DSRT_K_BF16);
}

/* Logical coordinates of element i of a tensor in its layout. */
typedef struct {
    size_t b;
    int ch, r, col;
} coord;

static __device__ __forceinline__ coord coord_of(size_t i, int c, int h, int w, int nhwc) {
    coord k;
    if (nhwc) {
        k.ch = (int)(i % c);
        i /= c;
        k.col = (int)(i % w);
        i /= w;
        k.r = (int)(i % h);
        k.b = i / h;
    } else {
        k.col = (int)(i % w);
        i /= w;
        k.r = (int)(i % h);
        i /= h;
        k.ch = (int)(i % c);
        k.b = i / c;
    }
    return k;
}

static __device__ __forceinline__ size_t index_of(coord k, int c, int h, int w, int nhwc) {
    if (nhwc) return ((k.b * h + k.r) * w + k.col) * c + k.ch;
    return ((k.b * c + k.ch) * h + k.r) * w + k.col;
}

// ----------------------------------------------------------------------------
// Input

__global__ void input_u8_kernel(const uint8_t *__restrict__ x, dsrt_k_pixel pix, int norm,
                                const float *__restrict__ stats, dsrt_k_desc yd, void *y,
                                size_t count) {
    for (size_t i = tid(); i < count; i += stride()) {
        coord k = coord_of(i, yd.c, yd.h, yd.w, yd.nhwc);
        uint8_t p = x[index_of(k, yd.c, yd.h, yd.w, 1)];
        float v = DSRT_FDIV(DSRT_FSUB((float)p, pix.sub[k.ch]), pix.div[k.ch]);
        if (norm != DSRT_NORM_NONE) {
            float a, o;
            dsrt_input_affine(norm, stats, yd.c, k.ch, &a, &o);
            v = dsrt_input_apply(a, o, v);
        }
        store(y, yd.type, i, v);
    }
}

__global__ void input_f32_kernel(const float *__restrict__ x, int norm,
                                 const float *__restrict__ stats, dsrt_k_desc yd, void *y,
                                 size_t count) {
    for (size_t i = tid(); i < count; i += stride()) {
        coord k = coord_of(i, yd.c, yd.h, yd.w, yd.nhwc);
        float v = x[index_of(k, yd.c, yd.h, yd.w, 0)];
        if (norm != DSRT_NORM_NONE) {
            float a, o;
            dsrt_input_affine(norm, stats, yd.c, k.ch, &a, &o);
            v = dsrt_input_apply(a, o, v);
        }
        store(y, yd.type, i, v);
    }
}

static int input_args_ok(int norm, const float *stats, const dsrt_k_desc *yd) {
    if (!desc_ok(yd) || norm < DSRT_NORM_NONE || norm > DSRT_NORM_RESCALE_SYMMETRIC) return 0;
    return norm == DSRT_NORM_NONE || stats;
}

extern "C" cudaError_t dsrt_k_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm,
                                       const float *stats, const dsrt_k_desc *yd, void *y,
                                       cudaStream_t stream) {
    if (!pix || !input_args_ok(norm, stats, yd) || yd->c > DSRT_K_PIXEL_CH_MAX)
        return cudaErrorInvalidValue;
    size_t count = desc_count(yd);
    if (!count) return cudaSuccess;
    input_u8_kernel<<<grid_for(count), THREADS, 0, stream>>>(x, *pix, norm, stats, *yd, y, count);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_input_f32(const float *x, int norm, const float *stats,
                                        const dsrt_k_desc *yd, void *y, cudaStream_t stream) {
    if (!input_args_ok(norm, stats, yd)) return cudaErrorInvalidValue;
    size_t count = desc_count(yd);
    if (!count) return cudaSuccess;
    input_f32_kernel<<<grid_for(count), THREADS, 0, stream>>>(x, norm, stats, *yd, y, count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Padding and cropping

__global__ void pad_kernel(dsrt_k_desc xd, const void *x, dsrt_k_desc yd, void *y, int top,
                           int left, float fill, int accumulate, size_t count) {
    for (size_t i = tid(); i < count; i += stride()) {
        coord k = coord_of(i, yd.c, yd.h, yd.w, yd.nhwc);
        coord s = k;
        s.r = k.r - top;
        s.col = k.col - left;
        float v = fill;
        if (s.r >= 0 && s.r < xd.h && s.col >= 0 && s.col < xd.w)
            v = load(x, xd.type, index_of(s, xd.c, xd.h, xd.w, xd.nhwc));
        if (accumulate) v = DSRT_FADD(load(y, yd.type, i), v);
        store(y, yd.type, i, v);
    }
}

extern "C" cudaError_t dsrt_k_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd,
                                  void *y, int top, int left, float fill, int accumulate,
                                  cudaStream_t stream) {
    if (!desc_ok(xd) || !desc_ok(yd) || xd->n != yd->n || xd->c != yd->c)
        return cudaErrorInvalidValue;
    size_t count = desc_count(yd);
    if (!count) return cudaSuccess;
    pad_kernel<<<grid_for(count), THREADS, 0, stream>>>(*xd, x, *yd, y, top, left, fill, accumulate,
                                                        count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Activations and the fully connected bias

__global__ void relu_fwd_kernel(dsrt_k_type t, const void *x, void *y, size_t n, float leak) {
    for (size_t i = tid(); i < n; i += stride()) {
        float v = load(x, t, i);
        store(y, t, i, v > 0.0f ? v : DSRT_FMUL(v, leak));
    }
}

__global__ void relu_bwd_kernel(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n,
                                float leak) {
    for (size_t i = tid(); i < n; i += stride()) {
        float d = load(dy, t, i);
        store(dx, t, i, load(y, t, i) > 0.0f ? d : DSRT_FMUL(d, leak));
    }
}

extern "C" cudaError_t dsrt_k_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak,
                                       cudaStream_t stream) {
    if (t != DSRT_K_F32 && t != DSRT_K_BF16) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    relu_fwd_kernel<<<grid_for(n), THREADS, 0, stream>>>(t, x, y, n, leak);
    return cudaGetLastError();
}

extern "C" cudaError_t dsrt_k_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx,
                                       size_t n, float leak, cudaStream_t stream) {
    if (t != DSRT_K_F32 && t != DSRT_K_BF16) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    relu_bwd_kernel<<<grid_for(n), THREADS, 0, stream>>>(t, y, dy, dx, n, leak);
    return cudaGetLastError();
}

__global__ void bias_act_kernel(const float *x, const float *__restrict__ b, float *y, size_t count,
                                int out, int relu, float leak) {
    for (size_t i = tid(); i < count; i += stride()) {
        float v = DSRT_FADD(x[i], b ? b[i % out] : 0.0f);
        if (relu && v < 0.0f) v = DSRT_FMUL(v, leak);
        y[i] = v;
    }
}

extern "C" cudaError_t dsrt_k_bias_act(const float *x, const float *b, float *y, int n, int out,
                                       int relu, float leak, cudaStream_t stream) {
    if (n < 0 || out < 0) return cudaErrorInvalidValue;
    size_t count = (size_t)n * out;
    if (!count) return cudaSuccess;
    bias_act_kernel<<<grid_for(count), THREADS, 0, stream>>>(x, b, y, count, out, relu, leak);
    return cudaGetLastError();
}

/* Blocks of 32 columns x 8 row lanes: lane ty sums rows ty, ty + 8, ... of
 * its column, then the 8 partial sums are added in lane order. */
__global__ void bias_grad_kernel(const float *__restrict__ dy, float *__restrict__ db, int n,
                                 int out) {
    __shared__ float part[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (col < out)
        for (int r = threadIdx.y; r < n; r += 8) s += dy[(size_t)r * out + col];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < out) {
        float t = part[0][threadIdx.x];
        for (int k = 1; k < 8; k++) t += part[k][threadIdx.x];
        db[col] = t;
    }
}

extern "C" cudaError_t dsrt_k_bias_grad(const float *dy, float *db, int n, int out,
                                        cudaStream_t stream) {
    if (n < 0 || out < 0) return cudaErrorInvalidValue;
    if (!out) return cudaSuccess;
    bias_grad_kernel<<<(unsigned)((out + 31) / 32), dim3(32, 8), 0, stream>>>(dy, db, n, out);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Dropout

__global__ void dropout_kernel(dsrt_k_desc d, const void *x, void *y, dsrt_rng rng,
                               uint32_t threshold, float scale, size_t count) {
    for (size_t i = tid(); i < count; i += stride()) {
        size_t j = i;
        if (d.nhwc) j = index_of(coord_of(i, d.c, d.h, d.w, 1), d.c, d.h, d.w, 0);
        float m = dsrt_dropout_mask(&rng, j, threshold, scale);
        store(y, d.type, i, DSRT_FMUL(load(x, d.type, i), m));
    }
}

extern "C" cudaError_t dsrt_k_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                                      uint64_t iteration, int layer, float p, cudaStream_t stream) {
    if (!desc_ok(d) || !(p >= 0.0f && p < 1.0f) || layer < 0) return cudaErrorInvalidValue;
    size_t count = desc_count(d);
    if (!count) return cudaSuccess;
    dsrt_rng rng = dsrt_dropout_rng(seed, iteration, (uint64_t)layer);
    dropout_kernel<<<grid_for(count), THREADS, 0, stream>>>(
        *d, x, y, rng, dsrt_dropout_threshold(p), dsrt_dropout_scale(p), count);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Softmax and cross-entropy

/* The per-row results, in the workspace. */
typedef struct {
    double loss;
    int32_t correct;
    int32_t pad_;
} row_result;

static __device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One warp a row. The first maximum: a lane keeps the first of its largest
 * values (NaN never compares larger), then lanes merge keeping the lower
 * index on ties, which is what one pass from the left finds when the first
 * logit is a number; when it is NaN, the CPU's pass keeps it (index 0). */
__global__ void softmax_fwd_kernel(const float *__restrict__ z, const int32_t *__restrict__ labels,
                                   int n, int k, float *__restrict__ probs,
                                   row_result *__restrict__ res) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * SOFT_WARPS + (threadIdx.x >> 5);
    if (row >= n) return;
    const float *zr = z + (size_t)row * k;
    float *pr = probs + (size_t)row * k;
    float best = -INFINITY;
    int arg = 0x7fffffff;
    for (int j = lane; j < k; j += 32) {
        float v = zr[j];
        if (v > best || (v == best && j < arg)) best = v, arg = j;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oa = __shfl_xor_sync(0xffffffffu, arg, o);
        if (ob > best || (ob == best && oa < arg)) best = ob, arg = oa;
    }
    float mx = zr[0];
    if (mx == mx) {
        mx = best;
    } else {
        arg = 0;
    }
    double dm = (double)mx, sum = 0.0;
    for (int j = lane; j < k; j += 32) sum += exp((double)zr[j] - dm);
    sum = warp_sum(sum);
    double inv = 1.0 / sum;
    for (int j = lane; j < k; j += 32) pr[j] = (float)(exp((double)zr[j] - dm) * inv);
    if (lane == 0 && labels) {
        int y = labels[row];
        double l = NAN;
        if (y >= 0 && y < k && isfinite(mx)) l = log(sum) - ((double)zr[y] - dm);
        res[row].loss = l;
        res[row].correct = arg == y;
    }
}

/* One block: the batch mean of the row losses and the count of correct
 * rows, each thread summing a strided share, then a tree in fixed order. */
__global__ void softmax_total_kernel(const row_result *__restrict__ res, int n, double *loss,
                                     int32_t *correct) {
    __shared__ double sl[THREADS];
    __shared__ int sc[THREADS];
    double l = 0.0;
    int c = 0;
    for (int i = threadIdx.x; i < n; i += THREADS) {
        l += res[i].loss;
        c += res[i].correct;
    }
    sl[threadIdx.x] = l;
    sc[threadIdx.x] = c;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            sl[threadIdx.x] += sl[threadIdx.x + s];
            sc[threadIdx.x] += sc[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (loss) *loss = sl[0] / n;
        if (correct) *correct = sc[0];
    }
}

extern "C" size_t dsrt_k_softmax_xent_work(int n) {
    return (size_t)(n > 0 ? n : 1) * sizeof(row_result);
}

extern "C" cudaError_t dsrt_k_softmax_xent_fwd(const float *z, const int32_t *labels, int n, int k,
                                               float *probs, double *loss, int32_t *correct,
                                               void *work, cudaStream_t stream) {
    if (n < 0 || k <= 0 || (labels && !work)) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    row_result *res = (row_result *)work;
    softmax_fwd_kernel<<<(unsigned)((n + SOFT_WARPS - 1) / SOFT_WARPS), SOFT_WARPS * 32, 0,
                         stream>>>(z, labels, n, k, probs, res);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || !labels || (!loss && !correct)) return e;
    softmax_total_kernel<<<1, THREADS, 0, stream>>>(res, n, loss, correct);
    return cudaGetLastError();
}

__global__ void softmax_bwd_kernel(const float *__restrict__ probs,
                                   const int32_t *__restrict__ labels, int k, float scale,
                                   float *__restrict__ dz, size_t count) {
    for (size_t i = tid(); i < count; i += stride()) {
        float d = DSRT_FMUL(probs[i], scale);
        if ((int)(i % k) == labels[i / k]) d = DSRT_FSUB(d, scale);
        dz[i] = d;
    }
}

extern "C" cudaError_t dsrt_k_softmax_xent_bwd(const float *probs, const int32_t *labels, int n,
                                               int k, float scale, float *dz, cudaStream_t stream) {
    if (n < 0 || k <= 0 || !labels) return cudaErrorInvalidValue;
    size_t count = (size_t)n * k;
    if (!count) return cudaSuccess;
    softmax_bwd_kernel<<<grid_for(count), THREADS, 0, stream>>>(probs, labels, k, scale, dz, count);
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
    uint32_t b = 0;
    for (int k = 0; k < n_seg; k++) {
        seg[k].block0 = b;
        seg[k].blocks = (uint32_t)((seg[k].n + OPT_CHUNK - 1) / OPT_CHUNK);
        b += seg[k].blocks;
    }
    *blocks = b;
    return (size_t)(b ? b : 1) * sizeof(double) + (size_t)(n_seg > 0 ? n_seg : 1) * sizeof(float);
}

extern "C" void dsrt_k_optim_step_params(dsrt_k_step *st, const dsrt_optimizer_options *o,
                                         double lr, int64_t t) {
    st->solver = (int)o->solver;
    st->clip = (int)o->clip;
    st->threshold = o->grad_threshold;
    st->lr = lr;
    st->l2 = o->l2;
    st->momentum = (float)o->momentum;
    st->decay = (float)o->gradient_decay;
    st->sq_decay = (float)o->sq_gradient_decay;
    st->c1 = (float)(1.0 / (1.0 - pow(o->gradient_decay, (double)t)));
    st->c2 = (float)(1.0 / (1.0 - pow(o->sq_gradient_decay, (double)t)));
    st->eps = (float)o->epsilon;
}

/* The segment block b lies in: the first whose blocks end after b. */
static __device__ int segment_of(const dsrt_k_segment *seg, int n_seg, uint32_t b) {
    int lo = 0, hi = n_seg - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (seg[mid].block0 + seg[mid].blocks > b)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Sum of v over the block's threads, in a fixed tree order; the result is
 * valid in thread 0. */
static __device__ double block_sum(double v, double *shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    double r = shared[0];
    __syncthreads();
    return r;
}

__global__ void optim_sumsq_kernel(const dsrt_k_segment *__restrict__ seg, int n_seg,
                                   const float *__restrict__ g, double *__restrict__ partial) {
    __shared__ double sh[THREADS];
    uint32_t b = blockIdx.x;
    const dsrt_k_segment s = seg[segment_of(seg, n_seg, b)];
    size_t begin = (size_t)(b - s.block0) * OPT_CHUNK;
    size_t end = begin + OPT_CHUNK < s.n ? begin + OPT_CHUNK : s.n;
    double acc = 0.0;
    for (size_t i = begin + threadIdx.x; i < end; i += THREADS) {
        double v = g[s.off + i];
        acc += v * v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[b] = acc;
}

__global__ void optim_scale_kernel(const dsrt_k_segment *__restrict__ seg, int n_seg,
                                   const double *__restrict__ partial, int global, double threshold,
                                   float *__restrict__ scale) {
    __shared__ double sh[THREADS];
    double total = 0.0;
    for (int k = 0; k < n_seg; k++) {
        double acc = 0.0;
        for (uint32_t i = threadIdx.x; i < seg[k].blocks; i += THREADS)
            acc += partial[seg[k].block0 + i];
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) {
            if (global) {
                if (seg[k].lr != 0.0f) total += acc;
            } else {
                double norm = sqrt(acc);
                scale[k] = norm > threshold ? (float)(threshold / norm) : 1.0f;
            }
        }
    }
    if (global && threadIdx.x == 0) {
        double norm = sqrt(total);
        float f = norm > threshold ? (float)(threshold / norm) : 1.0f;
        for (int k = 0; k < n_seg; k++) scale[k] = f;
    }
}

/* The rules of nn/optim.c, each operation rounded as there. */
__global__ void optim_update_kernel(const dsrt_k_segment *__restrict__ seg, int n_seg,
                                    dsrt_k_step st, const float *__restrict__ scale, float *w,
                                    float *g, float *m, float *v, dsrt_bf16 *w16) {
    uint32_t b = blockIdx.x;
    int k = segment_of(seg, n_seg, b);
    const dsrt_k_segment s = seg[k];
    size_t begin = (size_t)(b - s.block0) * OPT_CHUNK;
    size_t end = begin + OPT_CHUNK < s.n ? begin + OPT_CHUNK : s.n;
    int clamping = isfinite(st.threshold) && st.clip == DSRT_CLIP_ABSOLUTE;
    float t = (float)st.threshold;
    float sc = scale ? scale[k] : 1.0f;
    if (s.lr == 0.0f && !clamping && sc == 1.0f && !w16) return; /* nothing changes */
    float lr = (float)(st.lr * s.lr), l2 = (float)(st.l2 * s.l2);
    for (size_t i = s.off + begin + threadIdx.x; i < s.off + end; i += THREADS) {
        float gi = g[i];
        if (clamping) {
            gi = gi > t ? t : (gi < -t ? -t : gi);
            g[i] = gi;
        } else if (sc != 1.0f) {
            gi = DSRT_FMUL(gi, sc);
            g[i] = gi;
        }
        float wi = w[i];
        if (s.lr != 0.0f) {
            gi = DSRT_FADD(gi, DSRT_FMUL(l2, wi));
            if (st.solver == DSRT_SOLVER_SGDM) {
                float vi = DSRT_FSUB(DSRT_FMUL(st.momentum, m[i]), DSRT_FMUL(lr, gi));
                m[i] = vi;
                wi = DSRT_FADD(wi, vi);
            } else if (st.solver == DSRT_SOLVER_ADAM) {
                float mi =
                    DSRT_FADD(DSRT_FMUL(st.decay, m[i]), DSRT_FMUL(DSRT_FSUB(1.0f, st.decay), gi));
                float vi = DSRT_FADD(DSRT_FMUL(st.sq_decay, v[i]),
                                     DSRT_FMUL(DSRT_FMUL(DSRT_FSUB(1.0f, st.sq_decay), gi), gi));
                m[i] = mi;
                v[i] = vi;
                float den = DSRT_FADD(__fsqrt_rn(DSRT_FMUL(vi, st.c2)), st.eps);
                wi = DSRT_FSUB(wi, DSRT_FDIV(DSRT_FMUL(lr, DSRT_FMUL(mi, st.c1)), den));
            } else {
                float vi = DSRT_FADD(DSRT_FMUL(st.sq_decay, m[i]),
                                     DSRT_FMUL(DSRT_FMUL(DSRT_FSUB(1.0f, st.sq_decay), gi), gi));
                m[i] = vi;
                float den = DSRT_FADD(__fsqrt_rn(vi), st.eps);
                wi = DSRT_FSUB(wi, DSRT_FDIV(DSRT_FMUL(lr, gi), den));
            }
            w[i] = wi;
        }
        if (w16) w16[i] = dsrt_bf16_from_f32(wi);
    }
}

extern "C" cudaError_t dsrt_k_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st, float *w,
                                           float *g, float *buf0, float *buf1, dsrt_bf16 *w16,
                                           cudaStream_t stream) {
    if (!o || !st || o->n_seg < 0 || st->solver < DSRT_SOLVER_SGDM ||
        st->solver > DSRT_SOLVER_RMSPROP || !buf0 || (st->solver == DSRT_SOLVER_ADAM && !buf1))
        return cudaErrorInvalidValue;
    if (!o->n_seg || !o->blocks) return cudaSuccess;
    const float *scale = NULL;
    if (isfinite(st->threshold) &&
        (st->clip == DSRT_CLIP_L2NORM || st->clip == DSRT_CLIP_GLOBAL_L2NORM)) {
        double *partial = (double *)o->work;
        float *sc = (float *)(partial + o->blocks);
        optim_sumsq_kernel<<<o->blocks, THREADS, 0, stream>>>(o->seg, o->n_seg, g, partial);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        optim_scale_kernel<<<1, THREADS, 0, stream>>>(
            o->seg, o->n_seg, partial, st->clip == DSRT_CLIP_GLOBAL_L2NORM, st->threshold, sc);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        scale = sc;
    }
    optim_update_kernel<<<o->blocks, THREADS, 0, stream>>>(o->seg, o->n_seg, *st, scale, w, g, buf0,
                                                           buf1, w16);
    return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Synchronised batch normalisation
//
// One block a channel walks the channel's n * hw values of NCHW in a fixed
// order and adds the threads' partial sums with block_sum: run to run the
// same bits.

__global__ void bn_sums_kernel(const float *__restrict__ x, int n, int c, int hw,
                               double *__restrict__ sums) {
    __shared__ double sh[THREADS];
    int ch = blockIdx.x;
    size_t per = (size_t)n * hw;
    double s = 0.0, q = 0.0;
    for (size_t j = threadIdx.x; j < per; j += THREADS) {
        double v = x[((j / hw) * c + ch) * hw + j % hw];
        s += v;
        q += v * v;
    }
    s = block_sum(s, sh);
    q = block_sum(q, sh);
    if (threadIdx.x == 0) {
        sums[ch] = s;
        sums[c + ch] = q;
        if (ch == 0) sums[2 * c] = (double)per;
    }
}

extern "C" cudaError_t dsrt_k_bn_sums(const float *x, int n, int c, int hw, double *sums,
                                      cudaStream_t stream) {
    if (n < 0 || c < 0 || hw < 0) return cudaErrorInvalidValue;
    if (!c) return cudaSuccess;
    bn_sums_kernel<<<(unsigned)c, THREADS, 0, stream>>>(x, n, c, hw, sums);
    return cudaGetLastError();
}

__global__ void bn_stats_kernel(const double *__restrict__ sums, int c, float eps, float momentum,
                                float *mean, float *var, float *inv, float *run_mean,
                                float *run_var) {
    double count = sums[2 * c];
    for (size_t k = tid(); k < (size_t)c; k += stride()) {
        if (!(count > 0)) {
            mean[k] = var[k] = inv[k] = __int_as_float(0x7fc00000);
            continue;
        }
        double m = sums[k] / count, v = sums[c + k] / count - m * m;
        float mf = (float)m, vf = (float)(v > 0 ? v : 0);
        mean[k] = mf;
        var[k] = vf;
        inv[k] = (float)(1.0 / sqrt((double)vf + eps));
        float unbias = count > 1 ? (float)(count / (count - 1)) : 1.0f, keep = 1.0f - momentum;
        run_mean[k] = DSRT_FADD(DSRT_FMUL(keep, run_mean[k]), DSRT_FMUL(momentum, mf));
        run_var[k] =
            DSRT_FADD(DSRT_FMUL(keep, run_var[k]), DSRT_FMUL(DSRT_FMUL(momentum, vf), unbias));
    }
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

__global__ void bn_bwd_sums_kernel(const float *__restrict__ x, const float *__restrict__ dy,
                                   const float *__restrict__ mean, const float *__restrict__ inv,
                                   int n, int c, int hw, double *__restrict__ sums, float *dscale,
                                   float *dshift) {
    __shared__ double sh[THREADS];
    int ch = blockIdx.x;
    size_t per = (size_t)n * hw;
    double mu = mean[ch], is = inv[ch], s = 0.0, q = 0.0;
    for (size_t j = threadIdx.x; j < per; j += THREADS) {
        size_t i = ((j / hw) * c + ch) * hw + j % hw;
        double d = dy[i];
        s += d;
        q += d * ((x[i] - mu) * is);
    }
    s = block_sum(s, sh);
    q = block_sum(q, sh);
    if (threadIdx.x == 0) {
        sums[ch] = s;
        sums[c + ch] = q;
        if (dshift) dshift[ch] = (float)s;
        if (dscale) dscale[ch] = (float)q;
    }
}

extern "C" cudaError_t dsrt_k_bn_bwd_sums(const float *x, const float *dy, const float *mean,
                                          const float *inv, int n, int c, int hw, double *sums,
                                          float *dscale, float *dshift, cudaStream_t stream) {
    if (n < 0 || c < 0 || hw < 0) return cudaErrorInvalidValue;
    if (!c) return cudaSuccess;
    bn_bwd_sums_kernel<<<(unsigned)c, THREADS, 0, stream>>>(x, dy, mean, inv, n, c, hw, sums,
                                                            dscale, dshift);
    return cudaGetLastError();
}

__global__ void bn_bwd_dx_kernel(const float *__restrict__ x, const float *__restrict__ dy,
                                 const float *__restrict__ mean, const float *__restrict__ inv,
                                 const float *__restrict__ scale, const double *__restrict__ sums,
                                 const double *__restrict__ count, int c, int hw, size_t total,
                                 float *__restrict__ dx) {
    double inv_m = 1.0 / *count;
    for (size_t i = tid(); i < total; i += stride()) {
        int ch = (int)((i / hw) % c);
        double is = inv[ch], a = (double)scale[ch] * is;
        double k1 = a * sums[ch] * inv_m, k2 = a * sums[c + ch] * inv_m * is;
        dx[i] = (float)(a * dy[i] - k1 - ((double)x[i] - mean[ch]) * k2);
    }
}

extern "C" cudaError_t dsrt_k_bn_bwd_dx(const float *x, const float *dy, const float *mean,
                                        const float *inv, const float *scale, const double *sums,
                                        const double *count, int n, int c, int hw, float *dx,
                                        cudaStream_t stream) {
    if (n < 0 || c < 0 || hw < 0) return cudaErrorInvalidValue;
    size_t total = (size_t)n * c * hw;
    if (!total) return cudaSuccess;
    bn_bwd_dx_kernel<<<grid_for(total), THREADS, 0, stream>>>(x, dy, mean, inv, scale, sums, count,
                                                              c, hw, total, dx);
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

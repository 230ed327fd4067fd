/*
 * The engine's own kernels (nn/kernels.h says what each computes and how a
 * kernel is made). C-style CUDA: each __global__ kernel is a launch shape
 * around a body of nn/kernels_body.h, which holds all the arithmetic and
 * which the host runs too (nn/kernels.h's <kernel>_host); one launcher a
 * kernel, no state. Scalars that change from step to step (the optimizer's)
 * can be read from device memory when the kernel runs, so that a step
 * recorded as a CUDA graph replays with new values. Element-wise kernels
 * run grid-stride loops over size_t indices on blocks of 256 threads.
 * Reductions follow the bodies' fixed order (a thread's strided share, then
 * a tree over the block in shared memory), so a run gives the same bits
 * each time. The stand-in of the GPU compiles this file as C: the kernels
 * are left out, the launchers queue their host runs.
 */
#include "nn/kernels.h"

#include <math.h>

// ----------------------------------------------------------------------------
// The kernels

#ifdef __CUDACC__
__global__ void pad_kernel(pad_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_pad(&a.xd, a.x, &a.yd, a.y, a.top, a.left, a.fill, a.accumulate, i);
}

__global__ void relu_fwd_kernel(relu_fwd_args a) {
    for (size_t i = tid(); i < a.n; i += stride()) dsrt_kb_relu_fwd(a.t, a.x, a.y, a.leak, i);
}

__global__ void relu_bwd_kernel(relu_bwd_args a) {
    for (size_t i = tid(); i < a.n; i += stride())
        dsrt_kb_relu_bwd(a.t, a.y, a.dy, a.dx, a.leak, i);
}

__global__ void bias_act_kernel(bias_act_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_bias_act_sum(&a.d, a.x, a.b, &a.act, a.r, &a.post, a.y, i);
}

/* Blocks of BIAS_COLS columns x BIAS_LANES row lanes over one chunk of rows
 * (blockIdx.y); lane 0 adds the lanes' sums in lane order into the chunk's
 * partial sum. */
__global__ void bias_grad_kernel(bias_grad_args a) {
    __shared__ float part[DSRT_KB_BIAS_LANES][DSRT_KB_BIAS_COLS + 1];
    int col = blockIdx.x * DSRT_KB_BIAS_COLS + threadIdx.x, k = blockIdx.y;
    size_t r0, r1;
    dsrt_kb_bias_rows(a.rows, a.chunks, k, &r0, &r1);
    part[threadIdx.y][threadIdx.x] =
        col < a.cols
            ? dsrt_kb_bias_lane(a.t, a.dy, a.y, a.leak, a.cols, col, r0, r1, (int)threadIdx.y)
            : 0.0f;
    __syncthreads();
    if (threadIdx.y == 0 && col < a.cols) {
        float lanes[DSRT_KB_BIAS_LANES];
        for (int l = 0; l < DSRT_KB_BIAS_LANES; l++) lanes[l] = part[l][threadIdx.x];
        a.partial[(size_t)k * a.cols + col] = dsrt_kb_bias_lanes_total(lanes);
    }
}

__global__ void bias_total_kernel(bias_total_args a) {
    for (size_t c = tid(); c < (size_t)a.cols; c += stride())
        a.db[c] = dsrt_kb_bias_total(a.partial, a.chunks, a.cols, (int)c);
}

__global__ void sum_kernel(sum_args a) {
    for (size_t i = tid(); i < a.count; i += stride())
        dsrt_kb_sum(a.t, &a.s, a.y, a.relu, a.leak, i);
}

__global__ void mul_kernel(mul_args a) {
    for (size_t i = tid(); i < a.count; i += stride()) dsrt_kb_mul(&a.ad, a.a, &a.bd, a.b, a.y, i);
}

/* Tile blockIdx.x, channels blockIdx.y * 32 + threadIdx.x: lane
 * threadIdx.y's share, the lanes' tree, the tile's partial into part. */
__global__ void chan_tile_kernel(chan_tile_args a) {
    int ch = (int)blockIdx.y * DSRT_KB_BN_CHANS + (int)threadIdx.x;
    size_t t = blockIdx.x;
    float s = 0.0f, q = 0.0f;
    if (ch < a.d.c)
        dsrt_kb_chan_grads_lane(&a.d, a.x, a.dy, a.mean, a.rstd, t, ch, (int)threadIdx.y, &s, &q);
    tile_part(s, q, a.part, t, a.d.c, ch);
}

__global__ void chan_total_kernel(chan_total_args a) {
    for (size_t ch = tid(); ch < (size_t)a.c; ch += stride()) {
        double s, q;
        dsrt_kb_bn_total(a.part, a.tiles, a.c, (int)ch, &s, &q);
        if (a.dshift) a.dshift[ch] = (float)s;
        if (a.dscale) a.dscale[ch] = (float)q;
    }
}

/* The optimizer. The grid covers every segment in blocks of OPT_CHUNK
 * elements (a segment's last block may be short). With norm clipping, a
 * first kernel writes each block's sum of squares (double) to the
 * workspace, a one-block kernel adds them up per segment in block order,
 * then over the non-frozen segments in segment order (as nn/optim.c), and
 * writes each segment's gradient scale; the update kernel reads it.
 * Workspace: partial sums (blocks doubles), then the scales (n_seg floats). */
__global__ void optim_sumsq_kernel(optim_sumsq_args a) {
    __shared__ double sh[THREADS];
    uint32_t b = blockIdx.x;
    double acc = block_sum(dsrt_kb_optim_sumsq_part(a.seg, a.n_seg, a.g, b, (int)threadIdx.x), sh);
    if (threadIdx.x == 0) a.partial[b] = acc;
}

__global__ void optim_scale_kernel(optim_scale_args a) {
    __shared__ double sh[THREADS];
    double threshold = a.st_dev ? a.st_dev->threshold : a.threshold, total = 0.0;
    for (int k = 0; k < a.n_seg; k++) {
        double acc = block_sum(dsrt_kb_optim_seg_part(&a.seg[k], a.partial, (int)threadIdx.x), sh);
        if (threadIdx.x == 0) {
            if (!a.global)
                a.scale[k] = dsrt_kb_clip_scale(acc, threshold);
            else if (a.seg[k].lr != 0.0f)
                total = DSRT_DADD(total, acc);
        }
    }
    if (a.global && threadIdx.x == 0) {
        float f = dsrt_kb_clip_scale(total, threshold);
        for (int k = 0; k < a.n_seg; k++) a.scale[k] = f;
    }
}

__global__ void optim_update_kernel(optim_update_args a) {
    const dsrt_k_step st = a.st_dev ? *a.st_dev : a.st;
    uint32_t b = blockIdx.x;
    int k = dsrt_kb_segment_of(a.seg, a.n_seg, b);
    const dsrt_k_segment s = a.seg[k];
    float sc = a.scale ? a.scale[k] : 1.0f;
    if (!dsrt_kb_optim_moves(&st, &s, sc, a.w16)) return; /* nothing changes */
    size_t begin, end;
    dsrt_kb_block_range(&s, b, &begin, &end);
    for (size_t i = s.off + begin + threadIdx.x; i < s.off + end; i += THREADS)
        dsrt_kb_optim_update(&st, &s, sc, i, a.w, a.g, a.m, a.v, a.w16);
}

__global__ void consts_kernel(consts_args a) {
    *a.dst = a.v;
}

__global__ void to_bf16_kernel(to_bf16_args a) {
    for (size_t i = tid(); i < a.n; i += stride()) a.y[i] = dsrt_bf16_from_f32(a.x[i]);
}

__global__ void from_bf16_kernel(from_bf16_args a) {
    for (size_t i = tid(); i < a.n; i += stride()) a.y[i] = dsrt_f32_from_bf16(a.x[i]);
}

__global__ void fill_kernel(fill_args a) {
    for (size_t i = tid(); i < a.n; i += stride()) a.y[i] = a.v;
}

__global__ void scale_kernel(scale_args a) {
    for (size_t i = tid(); i < a.n; i += stride()) a.y[i] = DSRT_FMUL(a.a, a.x[i]);
}
#endif

// ----------------------------------------------------------------------------
// The launchers

cudaError_t dsrt_k_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd, void *y,
                       int top, int left, float fill, int accumulate, cudaStream_t stream) {
    if (!dsrt_kb_pad_ok(xd, yd)) return cudaErrorInvalidValue;
    pad_args a = {*xd, x, *yd, y, top, left, fill, accumulate, dsrt_kb_count(yd)};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(pad_kernel, grid_for(a.count), THREADS, stream, a);
}

cudaError_t dsrt_k_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak,
                            cudaStream_t stream) {
    if (!dsrt_kb_type_ok(t)) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    relu_fwd_args a = {t, x, y, n, leak};
    return DSRT_K_LAUNCH(relu_fwd_kernel, grid_for(n), THREADS, stream, a);
}

cudaError_t dsrt_k_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n,
                            float leak, cudaStream_t stream) {
    if (!dsrt_kb_type_ok(t)) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    relu_bwd_args a = {t, y, dy, dx, n, leak};
    return DSRT_K_LAUNCH(relu_bwd_kernel, grid_for(n), THREADS, stream, a);
}

cudaError_t dsrt_k_bias_act(const dsrt_k_desc *d, const void *x, const float *b, void *y,
                            const dsrt_k_act *act, cudaStream_t stream) {
    if (!dsrt_kb_desc_ok(d) || !dsrt_kb_act_fn_ok(act)) return cudaErrorInvalidValue;
    bias_act_args a = {*d, x, b, y, *act, dsrt_kb_count(d), NULL, {DSRT_K_ACT_IDENTITY, 0, 0}};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(bias_act_kernel, grid_for(a.count), THREADS, stream, a);
}

cudaError_t dsrt_k_bias_act_sum(const dsrt_k_desc *d, const void *x, const float *b,
                                const dsrt_k_act *act, const void *r, const dsrt_k_act *post,
                                void *y, cudaStream_t stream) {
    if (!dsrt_kb_desc_ok(d) || !dsrt_kb_act_fn_ok(act) || !r || !dsrt_kb_act_fn_ok(post))
        return cudaErrorInvalidValue;
    bias_act_args a = {*d, x, b, y, *act, dsrt_kb_count(d), r, *post};
    if (!a.count) return cudaSuccess;
    return DSRT_K_LAUNCH(bias_act_kernel, grid_for(a.count), THREADS, stream, a);
}

size_t dsrt_k_bias_grad_work(const dsrt_k_desc *d) {
    return dsrt_kb_bias_grad_work(d);
}

cudaError_t dsrt_k_bias_grad(const dsrt_k_desc *d, void *dy, const void *y, float leak, float *db,
                             void *work, cudaStream_t stream) {
    if (!dsrt_kb_bias_grad_ok(d) || !work) return cudaErrorInvalidValue;
    if (!d->c) return cudaSuccess;
    size_t rows = (size_t)d->n * d->h * d->w;
    bias_grad_args a = {d->type, dy, y, leak, rows, d->c, dsrt_kb_bias_chunks(rows), (float *)work};
    bias_total_args t = {a.partial, a.chunks, a.cols, db};
    cudaError_t e = DSRT_K_LAUNCH(
        bias_grad_kernel,
        dim3((unsigned)((a.cols + DSRT_KB_BIAS_COLS - 1) / DSRT_KB_BIAS_COLS), (unsigned)a.chunks),
        dim3(DSRT_KB_BIAS_COLS, DSRT_KB_BIAS_LANES), stream, a);
    if (e != cudaSuccess) return e;
    return DSRT_K_LAUNCH(bias_total_kernel, grid_for((size_t)a.cols), THREADS, stream, t);
}

cudaError_t dsrt_k_sum_fwd(dsrt_k_type t, const dsrt_k_sum *s, void *y, size_t count, int relu,
                           float leak, cudaStream_t stream) {
    if (!s || s->n < 1 || s->n > DSRT_KB_SUM_MAX || !dsrt_kb_type_ok(t))
        return cudaErrorInvalidValue;
    if (!count) return cudaSuccess;
    sum_args a = {t, *s, y, relu, leak, count};
    return DSRT_K_LAUNCH(sum_kernel, grid_for(count), THREADS, stream, a);
}

cudaError_t dsrt_k_mul(const dsrt_k_desc *ad, const void *a, const dsrt_k_desc *bd, const void *b,
                       void *y, cudaStream_t stream) {
    if (!dsrt_kb_mul_ok(ad, bd)) return cudaErrorInvalidValue;
    mul_args m = {*ad, a, *bd, b, y, dsrt_kb_count(ad)};
    if (!m.count) return cudaSuccess;
    return DSRT_K_LAUNCH(mul_kernel, grid_for(m.count), THREADS, stream, m);
}

cudaError_t dsrt_k_chan_grads(const dsrt_k_desc *d, const void *x, const void *dy,
                              const float *mean, const float *rstd, float *dscale, float *dshift,
                              float *work, cudaStream_t stream) {
    if (!dsrt_kb_chan_grads_ok(d, mean, rstd) || !work) return cudaErrorInvalidValue;
    if (!d->c) return cudaSuccess;
    chan_tile_args a = {*d, x, dy, mean, rstd, work};
    chan_total_args t = {work, dsrt_kb_bn_tiles(d), d->c, dscale, dshift};
    cudaError_t e = DSRT_K_LAUNCH(
        chan_tile_kernel,
        dim3((unsigned)t.tiles, (unsigned)((d->c + DSRT_KB_BN_CHANS - 1) / DSRT_KB_BN_CHANS)),
        dim3(DSRT_KB_BN_CHANS, DSRT_KB_BN_LANES), stream, a);
    if (e != cudaSuccess) return e;
    return DSRT_K_LAUNCH(chan_total_kernel, grid_for((size_t)d->c), THREADS, stream, t);
}

size_t dsrt_k_optim_layout(dsrt_k_segment *seg, int n_seg, uint32_t *blocks) {
    return dsrt_kb_optim_layout(seg, n_seg, blocks);
}

void dsrt_k_optim_step_params(dsrt_k_step *st, const dsrt_optimizer_options *o, double lr,
                              int64_t t) {
    dsrt_kb_optim_step_params(st, o, lr, t);
}

cudaError_t dsrt_k_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st,
                                const dsrt_k_step *st_dev, float *w, float *g, float *buf0,
                                float *buf1, dsrt_bf16 *w16, cudaStream_t stream) {
    if (!dsrt_kb_optim_ok(o, st, buf0, buf1)) return cudaErrorInvalidValue;
    if (!o->n_seg || !o->blocks) return cudaSuccess;
    optim_update_args u = {o->seg, o->n_seg, o->blocks, *st, st_dev, NULL, w, g, buf0, buf1, w16};
    if (dsrt_kb_optim_norm_clip(st)) {
        double *partial = (double *)o->work;
        float *sc = (float *)(partial + o->blocks);
        optim_sumsq_args q = {o->seg, o->n_seg, o->blocks, g, partial};
        optim_scale_args c = {o->seg,        o->n_seg, partial, st->clip == DSRT_CLIP_GLOBAL_L2NORM,
                              st->threshold, st_dev,   sc};
        cudaError_t e = DSRT_K_LAUNCH(optim_sumsq_kernel, o->blocks, THREADS, stream, q);
        if (e != cudaSuccess) return e;
        if ((e = DSRT_K_LAUNCH(optim_scale_kernel, 1, THREADS, stream, c)) != cudaSuccess) return e;
        u.scale = sc;
    }
    return DSRT_K_LAUNCH(optim_update_kernel, o->blocks, THREADS, stream, u);
}

cudaError_t dsrt_k_set_consts(dsrt_k_consts *dst, const dsrt_k_consts *v, cudaStream_t stream) {
    if (!dst || !v) return cudaErrorInvalidValue;
    consts_args a = {dst, *v};
    return DSRT_K_LAUNCH(consts_kernel, 1, 1, stream, a);
}

cudaError_t dsrt_k_f32_to_bf16(const float *x, dsrt_bf16 *y, size_t n, cudaStream_t stream) {
    if (!n) return cudaSuccess;
    to_bf16_args a = {x, y, n};
    return DSRT_K_LAUNCH(to_bf16_kernel, grid_for(n), THREADS, stream, a);
}

cudaError_t dsrt_k_bf16_to_f32(const dsrt_bf16 *x, float *y, size_t n, cudaStream_t stream) {
    if (!n) return cudaSuccess;
    from_bf16_args a = {x, y, n};
    return DSRT_K_LAUNCH(from_bf16_kernel, grid_for(n), THREADS, stream, a);
}

cudaError_t dsrt_k_fill(float *y, size_t n, float v, cudaStream_t stream) {
    if (!n) return cudaSuccess;
    fill_args a = {y, n, v};
    return DSRT_K_LAUNCH(fill_kernel, grid_for(n), THREADS, stream, a);
}

cudaError_t dsrt_k_scale(const float *x, float *y, size_t n, float a, cudaStream_t stream) {
    if (!n) return cudaSuccess;
    scale_args s = {x, y, n, a};
    return DSRT_K_LAUNCH(scale_kernel, grid_for(n), THREADS, stream, s);
}

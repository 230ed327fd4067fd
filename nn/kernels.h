/*
 * dsrt's CUDA kernels: how each is made and launched, and the engine's own,
 * those no layer kind owns: padding and cropping (and layout changes), ReLU,
 * the bias with the ReLU after it and the bias gradient with the ReLU's
 * backward folded in, sums of tensors, the broadcast product, the gradients
 * of a factor and an offset a channel, the fused optimizer step, the
 * per-step scalars in device memory, and float32 <-> bfloat16 conversions.
 * A layer kind's own kernels are beside it, in nn/layers/<kind>_kernels.h
 * (as this header) and nn/layers/<kind>.cu (as nn/kernels.cu). Each one
 * computes exactly what the CPU backend (nn/backend_cpu.c) or the optimizer
 * (nn/optim.c) computes; the definitions they share live in nn/arith.h.
 *
 * A kernel is four pieces. Its arithmetic: bodies of one element, or of
 * one lane's share of a reduction, that the device and the host both run
 * (nn/kernels_body.h says how). Its arguments: one struct, which the
 * __global__ kernel takes by value. Its run on the host, <kernel>_host (not
 * under nvcc): the kernel's grid walked in plain loops, each lane's share
 * combined in the order the device combines it, so that the host computes
 * the device's very bits. And its launcher, dsrt_k_*, which checks the
 * arguments and queues the kernel through DSRT_K_LAUNCH: under nvcc the
 * <<<grid, block, 0, stream>>> launch then cudaGetLastError(); in the CPU
 * stand-in of the GPU (DSRT_FAKE_GPU: tests/fakegpu.c, whose build compiles
 * the .cu files as C, the kernels left out) a copy of the arguments and the
 * host run, queued on the stream. The host runs also make dsrt_kh_*, which
 * take the launcher's arguments but the stream and run at once (0, or
 * -EINVAL where the launcher returns cudaErrorInvalidValue): test_nn_kernels
 * checks the kernels' arithmetic through them on every machine.
 *
 * A launcher is a plain C entry point taking device pointers, sizes and a
 * stream: it queues its kernel(s) on the stream and returns
 * cudaGetLastError() (cudaSuccess, or the launch's error); it never
 * synchronises, allocates or copies, and an empty tensor launches nothing.
 * Pointers are device pointers unless a comment says otherwise; tensors are
 * dense. The launchers take the CUDA runtime's types, so they are declared
 * (DSRT_K_LAUNCHERS) where its header is found; elsewhere (a build without
 * the CUDA toolkit) the bodies and the host runs are all there is. A .cu
 * file defines its launchers without extern "C": they keep the C linkage
 * of their declarations here.
 */
#ifndef DSRT_NN_KERNELS_H
#define DSRT_NN_KERNELS_H

#include "nn/kernels_body.h"

#include <dsrt/nn.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define DSRT_K_LAUNCHERS 1
#elif defined(__has_include)
#if __has_include(<cuda_runtime_api.h>)
#define DSRT_K_LAUNCHERS 1
#endif
#endif

#ifdef DSRT_K_LAUNCHERS
#include <cuda_runtime_api.h>
#endif
#ifndef __CUDACC__
#include <errno.h>
#include <string.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Launching

#ifdef __CUDACC__
/* Element-wise kernels run grid-stride loops over size_t indices on blocks
 * of THREADS threads, at most GRID_MAX blocks. */
#define THREADS  DSRT_KB_THREADS
#define GRID_MAX 8192u

#define DSRT_K_LAUNCH(kernel, grid, block, stream, args)                                           \
    (kernel<<<grid, block, 0, stream>>>(args), cudaGetLastError())

static inline unsigned grid_for(size_t n) {
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
static __device__ __forceinline__ double block_sum(double v, double *sh) {
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

/* A tile of per-channel sums (nn/kernels_body.h dsrt_kb_tile_part), on
 * blocks of DSRT_KB_BN_CHANS channels (threadIdx.x) by DSRT_KB_BN_LANES
 * lanes (threadIdx.y): each lane's shares s and q of channel ch (of c) go
 * through shared memory to lane 0, which adds them in the lanes' tree and
 * writes tile t's partials into part. Every thread of the block calls it. */
static __device__ __forceinline__ void tile_part(float s, float q, float *part, size_t t, int c,
                                                 int ch) {
    __shared__ float ss[DSRT_KB_BN_LANES][DSRT_KB_BN_CHANS], sq[DSRT_KB_BN_LANES][DSRT_KB_BN_CHANS];
    int cx = (int)threadIdx.x, l = (int)threadIdx.y;
    ss[l][cx] = s;
    sq[l][cx] = q;
    __syncthreads();
    if (l == 0 && ch < c) {
        float vs[DSRT_KB_BN_LANES], vq[DSRT_KB_BN_LANES];
        for (int k = 0; k < DSRT_KB_BN_LANES; k++) vs[k] = ss[k][cx], vq[k] = sq[k][cx];
        dsrt_kb_tile_part(vs, vq, part, t, c, ch);
    }
}

/* The warp's butterfly over a double: every lane ends with the total. */
static __device__ __forceinline__ double warp_sum(double v) {
    for (int o = DSRT_KB_WARP / 2; o > 0; o >>= 1)
        v = DSRT_DADD(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#elif defined(DSRT_FAKE_GPU) && defined(DSRT_K_LAUNCHERS)
/* The stand-in queues run(a copy of the size bytes at args) on the stream,
 * as the launch of the kernel named `kernel` (tests/fakegpu.c). */
cudaError_t dsrt_k_launch(cudaStream_t stream, const char *kernel, void (*run)(const void *args),
                          const void *args, size_t size);

#define DSRT_K_LAUNCH(kernel, grid, block, stream, args)                                           \
    dsrt_k_launch(stream, #kernel, kernel##_host, &(args), sizeof(args))
#endif

// ----------------------------------------------------------------------------
// The engine's kernels' arguments

typedef struct {
    dsrt_k_desc xd;
    const void *x;
    dsrt_k_desc yd;
    void *y;
    int top, left;
    float fill;
    int accumulate;
    size_t count; /* elements of y */
} pad_args;

typedef struct {
    dsrt_k_type t;
    const void *x;
    void *y;
    size_t n;
    float leak;
} relu_fwd_args;

typedef struct {
    dsrt_k_type t;
    const void *y, *dy;
    void *dx;
    size_t n;
    float leak;
} relu_bwd_args;

typedef struct {
    dsrt_k_desc d;
    const void *x;
    const float *b;
    void *y;
    dsrt_k_act act;
    size_t count;
    const void *r;   /* a residual added after act (NULL: none), of d */
    dsrt_k_act post; /* after the residual */
} bias_act_args;

/* The bias gradient's chunks: BIAS_COLS columns x BIAS_LANES row lanes a
 * block, a chunk of rows a row of blocks. */
typedef struct {
    dsrt_k_type t;
    void *dy;
    const void *y;
    float leak;
    size_t rows;
    int cols, chunks;
    float *partial; /* (chunks, cols) */
} bias_grad_args;

typedef struct {
    const float *partial;
    int chunks, cols;
    float *db;
} bias_total_args;

typedef struct {
    dsrt_k_type t;
    dsrt_k_sum s;
    void *y;
    int relu;
    float leak;
    size_t count;
} sum_args;

typedef struct {
    dsrt_k_desc ad;
    const void *a;
    dsrt_k_desc bd;
    const void *b;
    void *y;
    size_t count;
} mul_args;

/* The channel gradients' tiles: a block 32 channels of a tile. */
typedef struct {
    dsrt_k_desc d;
    const void *x, *dy;
    const float *mean, *rstd;
    float *part; /* (tiles, 2c) */
} chan_tile_args;

typedef struct {
    const float *part;
    size_t tiles;
    int c;
    float *dscale, *dshift;
} chan_total_args;

/* The optimizer's kernels: one block a chunk of a segment (blocks of them),
 * or one block. */
typedef struct {
    const dsrt_k_segment *seg;
    int n_seg;
    uint32_t blocks;
    const float *g;
    double *partial;
} optim_sumsq_args;

typedef struct {
    const dsrt_k_segment *seg;
    int n_seg;
    const double *partial;
    int global;
    double threshold;
    const dsrt_k_step *st_dev;
    float *scale;
} optim_scale_args;

typedef struct {
    const dsrt_k_segment *seg;
    int n_seg;
    uint32_t blocks;
    dsrt_k_step st;
    const dsrt_k_step *st_dev;
    const float *scale;
    float *w, *g, *m, *v;
    dsrt_bf16 *w16;
} optim_update_args;

typedef struct {
    dsrt_k_consts *dst;
    dsrt_k_consts v;
} consts_args;

typedef struct {
    const float *x;
    dsrt_bf16 *y;
    size_t n;
} to_bf16_args;

typedef struct {
    const dsrt_bf16 *x;
    float *y;
    size_t n;
} from_bf16_args;

typedef struct {
    float *y;
    size_t n;
    float v;
} fill_args;

typedef struct {
    const float *x;
    float *y;
    size_t n;
    float a;
} scale_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
/* The block's tree over THREADS doubles (and ints, when c is not NULL):
 * the result in v[0]. */
static inline void dsrt_kh_tree(double *v, int *c) {
    for (int s = DSRT_KB_THREADS / 2; s > 0; s >>= 1)
        for (int t = 0; t < s; t++) {
            dsrt_kb_tree_d(v, t, s);
            if (c) dsrt_kb_tree_i(c, t, s);
        }
}

/* The warp's butterfly over the lanes' doubles: lane l adds lane l ^ o, as
 * __shfl_xor_sync hands it. Every lane ends with the total; lane 0's is
 * returned. */
static inline double dsrt_kh_butterfly(double *v) {
    double nv[DSRT_KB_WARP];
    for (int o = DSRT_KB_WARP / 2; o > 0; o >>= 1) {
        for (int l = 0; l < DSRT_KB_WARP; l++) nv[l] = DSRT_DADD(v[l], v[l ^ o]);
        memcpy(v, nv, sizeof nv);
    }
    return v[0];
}

static inline void pad_kernel_host(const void *p) {
    const pad_args *a = (const pad_args *)p;
    for (size_t i = 0; i < a->count; i++)
        dsrt_kb_pad(&a->xd, a->x, &a->yd, a->y, a->top, a->left, a->fill, a->accumulate, i);
}

static inline void relu_fwd_kernel_host(const void *p) {
    const relu_fwd_args *a = (const relu_fwd_args *)p;
    for (size_t i = 0; i < a->n; i++) dsrt_kb_relu_fwd(a->t, a->x, a->y, a->leak, i);
}

static inline void relu_bwd_kernel_host(const void *p) {
    const relu_bwd_args *a = (const relu_bwd_args *)p;
    for (size_t i = 0; i < a->n; i++) dsrt_kb_relu_bwd(a->t, a->y, a->dy, a->dx, a->leak, i);
}

static inline void bias_act_kernel_host(const void *p) {
    const bias_act_args *a = (const bias_act_args *)p;
    for (size_t i = 0; i < a->count; i++)
        dsrt_kb_bias_act_sum(&a->d, a->x, a->b, &a->act, a->r, &a->post, a->y, i);
}

/* Each chunk's columns: the lanes' sums, added in lane order. */
static inline void bias_grad_kernel_host(const void *p) {
    const bias_grad_args *a = (const bias_grad_args *)p;
    for (int k = 0; k < a->chunks; k++) {
        size_t r0, r1;
        dsrt_kb_bias_rows(a->rows, a->chunks, k, &r0, &r1);
        for (int col = 0; col < a->cols; col++) {
            float lanes[DSRT_KB_BIAS_LANES];
            for (int l = 0; l < DSRT_KB_BIAS_LANES; l++)
                lanes[l] = dsrt_kb_bias_lane(a->t, a->dy, a->y, a->leak, a->cols, col, r0, r1, l);
            a->partial[(size_t)k * a->cols + col] = dsrt_kb_bias_lanes_total(lanes);
        }
    }
}

static inline void bias_total_kernel_host(const void *p) {
    const bias_total_args *a = (const bias_total_args *)p;
    for (int col = 0; col < a->cols; col++)
        a->db[col] = dsrt_kb_bias_total(a->partial, a->chunks, a->cols, col);
}

static inline void sum_kernel_host(const void *p) {
    const sum_args *a = (const sum_args *)p;
    for (size_t i = 0; i < a->count; i++) dsrt_kb_sum(a->t, &a->s, a->y, a->relu, a->leak, i);
}

static inline void mul_kernel_host(const void *p) {
    const mul_args *a = (const mul_args *)p;
    for (size_t i = 0; i < a->count; i++) dsrt_kb_mul(&a->ad, a->a, &a->bd, a->b, a->y, i);
}

/* Each tile's lanes and their tree, the partials in part. */
static inline void chan_tile_kernel_host(const void *p) {
    const chan_tile_args *a = (const chan_tile_args *)p;
    for (size_t t = 0, tiles = dsrt_kb_bn_tiles(&a->d); t < tiles; t++)
        for (int ch = 0; ch < a->d.c; ch++) {
            float vs[DSRT_KB_BN_LANES], vq[DSRT_KB_BN_LANES];
            for (int l = 0; l < DSRT_KB_BN_LANES; l++)
                dsrt_kb_chan_grads_lane(&a->d, a->x, a->dy, a->mean, a->rstd, t, ch, l, &vs[l],
                                        &vq[l]);
            dsrt_kb_tile_part(vs, vq, a->part, t, a->d.c, ch);
        }
}

static inline void chan_total_kernel_host(const void *p) {
    const chan_total_args *a = (const chan_total_args *)p;
    for (int ch = 0; ch < a->c; ch++) {
        double s, q;
        dsrt_kb_bn_total(a->part, a->tiles, a->c, ch, &s, &q);
        if (a->dshift) a->dshift[ch] = (float)s;
        if (a->dscale) a->dscale[ch] = (float)q;
    }
}

static inline void optim_sumsq_kernel_host(const void *p) {
    const optim_sumsq_args *a = (const optim_sumsq_args *)p;
    double v[DSRT_KB_THREADS];
    for (uint32_t b = 0; b < a->blocks; b++) {
        for (int t = 0; t < DSRT_KB_THREADS; t++)
            v[t] = dsrt_kb_optim_sumsq_part(a->seg, a->n_seg, a->g, b, t);
        dsrt_kh_tree(v, NULL);
        a->partial[b] = v[0];
    }
}

static inline void optim_scale_kernel_host(const void *p) {
    const optim_scale_args *a = (const optim_scale_args *)p;
    double threshold = a->st_dev ? a->st_dev->threshold : a->threshold, total = 0.0,
           v[DSRT_KB_THREADS];
    for (int k = 0; k < a->n_seg; k++) {
        for (int t = 0; t < DSRT_KB_THREADS; t++)
            v[t] = dsrt_kb_optim_seg_part(&a->seg[k], a->partial, t);
        dsrt_kh_tree(v, NULL);
        if (!a->global)
            a->scale[k] = dsrt_kb_clip_scale(v[0], threshold);
        else if (a->seg[k].lr != 0.0f)
            total = DSRT_DADD(total, v[0]);
    }
    if (a->global) {
        float f = dsrt_kb_clip_scale(total, threshold);
        for (int k = 0; k < a->n_seg; k++) a->scale[k] = f;
    }
}

static inline void optim_update_kernel_host(const void *p) {
    const optim_update_args *a = (const optim_update_args *)p;
    const dsrt_k_step *st = a->st_dev ? a->st_dev : &a->st;
    for (uint32_t b = 0; b < a->blocks; b++) {
        int k = dsrt_kb_segment_of(a->seg, a->n_seg, b);
        const dsrt_k_segment *s = &a->seg[k];
        float sc = a->scale ? a->scale[k] : 1.0f;
        if (!dsrt_kb_optim_moves(st, s, sc, a->w16)) continue; /* nothing changes */
        size_t begin, end;
        dsrt_kb_block_range(s, b, &begin, &end);
        for (size_t i = s->off + begin; i < s->off + end; i++)
            dsrt_kb_optim_update(st, s, sc, i, a->w, a->g, a->m, a->v, a->w16);
    }
}

static inline void consts_kernel_host(const void *p) {
    const consts_args *a = (const consts_args *)p;
    *a->dst = a->v;
}

static inline void to_bf16_kernel_host(const void *p) {
    const to_bf16_args *a = (const to_bf16_args *)p;
    for (size_t i = 0; i < a->n; i++) a->y[i] = dsrt_bf16_from_f32(a->x[i]);
}

static inline void from_bf16_kernel_host(const void *p) {
    const from_bf16_args *a = (const from_bf16_args *)p;
    for (size_t i = 0; i < a->n; i++) a->y[i] = dsrt_f32_from_bf16(a->x[i]);
}

static inline void fill_kernel_host(const void *p) {
    const fill_args *a = (const fill_args *)p;
    for (size_t i = 0; i < a->n; i++) a->y[i] = a->v;
}

static inline void scale_kernel_host(const void *p) {
    const scale_args *a = (const scale_args *)p;
    for (size_t i = 0; i < a->n; i++) a->y[i] = DSRT_FMUL(a->a, a->x[i]);
}

/* The launchers below, run on the host at once. */

static inline int dsrt_kh_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd, void *y,
                              int top, int left, float fill, int accumulate) {
    if (!dsrt_kb_pad_ok(xd, yd)) return -EINVAL;
    pad_args a = {*xd, x, *yd, y, top, left, fill, accumulate, dsrt_kb_count(yd)};
    pad_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak) {
    if (!dsrt_kb_type_ok(t)) return -EINVAL;
    relu_fwd_args a = {t, x, y, n, leak};
    relu_fwd_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n,
                                   float leak) {
    if (!dsrt_kb_type_ok(t)) return -EINVAL;
    relu_bwd_args a = {t, y, dy, dx, n, leak};
    relu_bwd_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_bias_act(const dsrt_k_desc *d, const void *x, const float *b, void *y,
                                   const dsrt_k_act *act) {
    if (!dsrt_kb_desc_ok(d) || !dsrt_kb_act_fn_ok(act)) return -EINVAL;
    bias_act_args a = {*d, x, b, y, *act, dsrt_kb_count(d), NULL, {DSRT_K_ACT_IDENTITY, 0, 0}};
    bias_act_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_bias_act_sum(const dsrt_k_desc *d, const void *x, const float *b,
                                       const dsrt_k_act *act, const void *r, const dsrt_k_act *post,
                                       void *y) {
    if (!dsrt_kb_desc_ok(d) || !dsrt_kb_act_fn_ok(act) || !r || !dsrt_kb_act_fn_ok(post))
        return -EINVAL;
    bias_act_args a = {*d, x, b, y, *act, dsrt_kb_count(d), r, *post};
    bias_act_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_bias_grad(const dsrt_k_desc *d, void *dy, const void *y, float leak,
                                    float *db, void *work) {
    if (!dsrt_kb_bias_grad_ok(d) || !work) return -EINVAL;
    size_t rows = (size_t)d->n * d->h * d->w;
    bias_grad_args a = {d->type, dy, y, leak, rows, d->c, dsrt_kb_bias_chunks(rows), (float *)work};
    bias_total_args t = {a.partial, a.chunks, a.cols, db};
    bias_grad_kernel_host(&a);
    bias_total_kernel_host(&t);
    return 0;
}

static inline int dsrt_kh_sum(dsrt_k_type t, const dsrt_k_sum *s, void *y, size_t count, int relu,
                              float leak) {
    if (!s || s->n < 1 || s->n > DSRT_KB_SUM_MAX || !dsrt_kb_type_ok(t)) return -EINVAL;
    sum_args a = {t, *s, y, relu, leak, count};
    sum_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_mul(const dsrt_k_desc *ad, const void *a, const dsrt_k_desc *bd,
                              const void *b, void *y) {
    if (!dsrt_kb_mul_ok(ad, bd)) return -EINVAL;
    mul_args m = {*ad, a, *bd, b, y, dsrt_kb_count(ad)};
    mul_kernel_host(&m);
    return 0;
}

static inline int dsrt_kh_chan_grads(const dsrt_k_desc *d, const void *x, const void *dy,
                                     const float *mean, const float *rstd, float *dscale,
                                     float *dshift, float *work) {
    if (!dsrt_kb_chan_grads_ok(d, mean, rstd) || !work) return -EINVAL;
    chan_tile_args a = {*d, x, dy, mean, rstd, work};
    chan_total_args t = {work, dsrt_kb_bn_tiles(d), d->c, dscale, dshift};
    chan_tile_kernel_host(&a);
    chan_total_kernel_host(&t);
    return 0;
}

static inline int dsrt_kh_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st,
                                       const dsrt_k_step *st_dev, float *w, float *g, float *buf0,
                                       float *buf1, dsrt_bf16 *w16) {
    if (!dsrt_kb_optim_ok(o, st, buf0, buf1)) return -EINVAL;
    if (!o->n_seg || !o->blocks) return 0;
    optim_update_args u = {o->seg, o->n_seg, o->blocks, *st, st_dev, NULL, w, g, buf0, buf1, w16};
    if (dsrt_kb_optim_norm_clip(st)) {
        if (!o->work) return -EINVAL;
        double *partial = (double *)o->work;
        float *sc = (float *)(partial + o->blocks);
        optim_sumsq_args q = {o->seg, o->n_seg, o->blocks, g, partial};
        optim_scale_args c = {o->seg,        o->n_seg, partial, st->clip == DSRT_CLIP_GLOBAL_L2NORM,
                              st->threshold, st_dev,   sc};
        optim_sumsq_kernel_host(&q);
        optim_scale_kernel_host(&c);
        u.scale = sc;
    }
    optim_update_kernel_host(&u);
    return 0;
}

static inline int dsrt_kh_set_consts(dsrt_k_consts *dst, const dsrt_k_consts *v) {
    if (!dst || !v) return -EINVAL;
    consts_args a = {dst, *v};
    consts_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_f32_to_bf16(const float *x, dsrt_bf16 *y, size_t n) {
    to_bf16_args a = {x, y, n};
    to_bf16_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_bf16_to_f32(const dsrt_bf16 *x, float *y, size_t n) {
    from_bf16_args a = {x, y, n};
    from_bf16_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_fill(float *y, size_t n, float v) {
    fill_args a = {y, n, v};
    fill_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_scale(const float *x, float *y, size_t n, float v) {
    scale_args a = {x, y, n, v};
    scale_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/*
 * y (yd) = x (xd) placed with its top-left pixel at (top, left) of y, fill
 * everywhere else; negative offsets crop. xd and yd have the same n and c
 * and may differ in layout and type. With accumulate, y += that instead
 * (fill included). For convolutions and pooling with asymmetric or 'same'
 * padding: pad with 0 (convolution, average pooling, which counts the
 * padding like the CPU backend) or -INFINITY (max pooling), then run cuDNN
 * unpadded. The backward is the crop of the gradient: dx = dy at (-top,
 * -left), with accumulate where dx already holds a contribution.
 */
cudaError_t dsrt_k_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd, void *y,
                       int top, int left, float fill, int accumulate, cudaStream_t stream);

/* y = x > 0 ? x : x * leak over n elements of type t (leak 0: ReLU). In place
 * (y == x) allowed. */
cudaError_t dsrt_k_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak,
                            cudaStream_t stream);

/* dx = y > 0 ? dy : dy * leak, from the forward's output y (as oneDNN's
 * relu_use_dst_for_bwd). In place (dx == dy) allowed. */
cudaError_t dsrt_k_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n,
                            float leak, cudaStream_t stream);

/* A convolution's or fully connected layer's output (d: any layout and
 * type; a fully connected layer's is (n, out, 1, 1)): y = act(x +
 * b[channel]) (b NULL: none; act: a (leaky) ReLU, the identity, or at
 * inference the activation after the layer), in float and rounded once, as
 * the CPU backend's fused step. In place (y == x) allowed. */
cudaError_t dsrt_k_bias_act(const dsrt_k_desc *d, const void *x, const float *b, void *y,
                            const dsrt_k_act *act, cudaStream_t stream);
/* The same, then a residual r (of d) added and post applied: y =
 * post(act(x + b[channel]) + r), in float and rounded once, as the CPU
 * backend's convolution with a sum post-op (an inference plan's residual
 * add computed by the convolution before it). In place (y == x or y == r)
 * allowed. */
cudaError_t dsrt_k_bias_act_sum(const dsrt_k_desc *d, const void *x, const float *b,
                                const dsrt_k_act *act, const void *r, const dsrt_k_act *post,
                                void *y, cudaStream_t stream);

/* Bytes of workspace dsrt_k_bias_grad needs for d. */
size_t dsrt_k_bias_grad_work(const dsrt_k_desc *d);

/*
 * db (d->c floats) = the per-channel sums of dy (d: NHWC, or h = w = 1),
 * in a fixed order (run to run identical). With y (the layer's output, of
 * d) the ReLU's backward is folded in: dy becomes y > 0 ? dy : dy * leak,
 * in place, in the same pass, so the convolution's or matrix product's
 * backward that follows reads the gradient behind the ReLU. work: a device
 * buffer of dsrt_k_bias_grad_work(d) bytes.
 */
cudaError_t dsrt_k_bias_grad(const dsrt_k_desc *d, void *dy, const void *y, float leak, float *db,
                             void *work, cudaStream_t stream);

/* y = the sum of s's inputs (count elements of type t each, added in order
 * in float), the ReLU after it when relu (leak: slope below zero); y may
 * be one of the inputs. The add layer, and a gradient adding another
 * layer's share (y = x[0]). */
cudaError_t dsrt_k_sum_fwd(dsrt_k_type t, const dsrt_k_sum *s, void *y, size_t count, int relu,
                           float leak, cudaStream_t stream);

/* y (ad) = a (ad) times b (bd: a's channels; along n, h and w a's size or
 * 1, where it broadcasts), in float, rounded once to ad's type: a mul
 * layer (b its second input, or a gate (n, c, 1, 1)), a scale layer (b its
 * factors, float32 (1, c, 1, 1)), and their input gradients (a = dy). y may
 * be a, not b. */
cudaError_t dsrt_k_mul(const dsrt_k_desc *ad, const void *a, const dsrt_k_desc *bd, const void *b,
                       void *y, cudaStream_t stream);

/* The gradients of a factor and an offset a channel over d's every pixel:
 * dscale[ch] = the sum of dy v, dshift[ch] = the sum of dy (c floats each;
 * either may be NULL), v being x, or with per-pixel statistics (mean and
 * rstd: n h w floats each, as dsrt_k_ln_fwd keeps them) (x - mean) rstd.
 * Batchnorm's tiled reduction (its order fixed); work:
 * dsrt_kb_bn_work(d) device floats. */
cudaError_t dsrt_k_chan_grads(const dsrt_k_desc *d, const void *x, const void *dy,
                              const float *mean, const float *rstd, float *dscale, float *dshift,
                              float *work, cudaStream_t stream);

/*
 * Lays out the step's grids over the segments seg (host memory, n_seg of
 * them, in flat-buffer order): fills their block0 and blocks, sets *blocks to
 * the total and returns the bytes of device workspace the step needs. Call
 * once per net, then copy seg to the device.
 */
size_t dsrt_k_optim_layout(dsrt_k_segment *seg, int n_seg, uint32_t *blocks);

/* Host: the scalars of step number t (1 for the first step) at learning rate
 * lr (dsrt_optimizer_learn_rate of the epoch), as dsrt_optimizer_step. */
void dsrt_k_optim_step_params(dsrt_k_step *st, const dsrt_optimizer_options *o, double lr,
                              int64_t t);

/*
 * One optimizer step over the flat buffers w (weights), g (gradients, which
 * are clipped in place as nn/optim.c clips them) and the state buffers
 * buf0 (SGDM velocity, Adam first moment, RMSProp mean square) and buf1
 * (Adam second moment; NULL otherwise), each as long as the flat buffers.
 * Gradient clipping by l2norm (each segment) or global-l2norm (the
 * non-frozen segments together) reduces the norms on the device in a fixed
 * order, then updates: no host round trip, identical from run to run. w16,
 * when not NULL, receives the updated weights in bfloat16 (every segment,
 * frozen ones included). Agrees with nn/optim.c to rounding: bit for bit
 * without norm clipping (on a CPU build without FMA contraction), within a
 * few float ulps with it (the norm is summed in double in another order).
 * st decides which kernels run (the solver, whether a norm is clipped); with
 * st_dev (device memory holding the same solver and clipping method) the
 * kernels read the step's scalars from there when they run.
 */
cudaError_t dsrt_k_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st,
                                const dsrt_k_step *st_dev, float *w, float *g, float *buf0,
                                float *buf1, dsrt_bf16 *w16, cudaStream_t stream);

/* Writes v into the device's per-step scalars *dst (one small kernel, whose
 * argument is v: queued on the stream before the step that reads them, it
 * is what changes from one replay of a recorded step to the next). */
cudaError_t dsrt_k_set_consts(dsrt_k_consts *dst, const dsrt_k_consts *v, cudaStream_t stream);

cudaError_t dsrt_k_f32_to_bf16(const float *x, dsrt_bf16 *y, size_t n, cudaStream_t stream);
cudaError_t dsrt_k_bf16_to_f32(const dsrt_bf16 *x, float *y, size_t n, cudaStream_t stream);

/* y = v over n floats. */
cudaError_t dsrt_k_fill(float *y, size_t n, float v, cudaStream_t stream);

/* y = a * x over n floats (in place allowed): loss scaling, averaging. */
cudaError_t dsrt_k_scale(const float *x, float *y, size_t n, float a, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

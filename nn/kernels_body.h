/*
 * The arithmetic of the GPU backend's own kernels, written once for the
 * device and the host. nn/kernels.cu wraps each body in a __global__ kernel
 * (grid-stride loops, blocks, warps and shared memory); a host translation
 * unit (tests/kernels_host.c) runs the very same bodies in plain loops, so
 * that the kernels' arithmetic runs and is tested on a machine without a
 * GPU, and the CPU stand-in of the GPU (tests/fakegpu.c) computes with it.
 * Only the launch configuration and where memory lives stay device-only.
 *
 * A body computes one element (or one thread's share of a reduction) from
 * plain pointers. Reductions run in a fixed order that both sides follow:
 * a thread's strided partial sum, then the tree of DSRT_KB_THREADS lanes
 * (dsrt_kb_tree_*: lane t adds lane t + s, s halving from THREADS / 2), or
 * a warp's butterfly (lane l adds lane l ^ o, o halving from 16), so that a
 * reduction gives the same bits run to run, and the host the same bits as
 * the device. Products and sums are written with nn/arith.h's DSRT_F* and
 * DSRT_D* macros, which the device never fuses and the host compiles
 * without contraction (-ffp-contract=off); only exp and log, in softmax,
 * may differ between the device's and the C library's last bit.
 *
 * Tensors are described by dsrt_k_desc (NCHW or NHWC, float32 or bfloat16):
 * the GPU backend keeps its activations NHWC, in bfloat16 under bf16
 * precision, and every body that touches them takes the layout and the type
 * from the descriptor, so one body serves every layout and type.
 *
 * Also the types the launchers (nn/kernels.h) take, which need no CUDA
 * header, and the argument checks every launcher makes.
 */
#ifndef DSRT_NN_KERNELS_BODY_H
#define DSRT_NN_KERNELS_BODY_H

#include "nn/arith.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Types

/* bfloat16 as its bits: the high half of a float32 (nn/arith.h converts). */
typedef uint16_t dsrt_bf16;

typedef enum {
    DSRT_K_F32 = 0,
    DSRT_K_BF16 = 1,
} dsrt_k_type;

/* A 4-d tensor of n images, c channels, h x w pixels, in NCHW or NHWC order,
 * of float32 or bfloat16. */
typedef struct {
    int n, c, h, w;
    int nhwc; /* 0: (n, c, h, w); 1: (n, h, w, c) */
    dsrt_k_type type;
} dsrt_k_desc;

#define DSRT_K_PIXEL_CH_MAX 4

/* How a pipeline byte p of channel ch becomes a float, as dsrt_augment's
 * float output writes whole pixels: ((float)p - sub[ch]) / div[ch],
 * correctly rounded. sub 0, div 255 is x / 255 (DSRT_AUGMENT_NORM_RESCALE). */
typedef struct {
    float sub[DSRT_K_PIXEL_CH_MAX];
    float div[DSRT_K_PIXEL_CH_MAX];
} dsrt_k_pixel;

/* One parameter tensor the optimizer updates, as nn/optim.c's segments. */
typedef struct {
    size_t off, n;   /* the range of the flat buffers, in floats */
    float lr, l2;    /* learn-rate factor (0: frozen) and L2 factor */
    uint32_t block0; /* first block of the step's grids on this segment: set by
                      * dsrt_k_optim_layout */
    uint32_t blocks; /* its blocks */
} dsrt_k_segment;

/* The optimizer's device-side plan. */
typedef struct {
    const dsrt_k_segment *seg; /* device copy of the table dsrt_k_optim_layout filled */
    int n_seg;
    uint32_t blocks; /* as dsrt_k_optim_layout returned */
    void *work;      /* device workspace of the size it returned */
} dsrt_k_optim;

/* The scalars of one step. dsrt_k_optim_step_params fills them from the
 * options as nn/optim.c does. */
typedef struct {
    int solver;            /* dsrt_solver */
    int clip;              /* dsrt_grad_clip */
    double threshold;      /* gradient threshold; INFINITY: no clipping */
    double lr;             /* this step's learning rate (schedule applied) */
    double l2;             /* L2 regularisation */
    float momentum;        /* SGDM */
    float decay, sq_decay; /* gradient decay (Adam beta1), squared gradient decay */
    float c1, c2;          /* Adam's bias corrections 1 / (1 - decay^t), 1 / (1 - sq_decay^t) */
    float eps;
} dsrt_k_step;

/* The per-step scalars the step's kernels read from device memory rather
 * than from their launch arguments, so that a step recorded once as a CUDA
 * graph replays with each new step's values: the optimizer's scalars (the
 * learn rate of the schedule, Adam's bias corrections), the training step
 * that keys dropout masks, and the loss gradient's scale. */
typedef struct {
    dsrt_k_step step;   /* the optimizer step */
    uint64_t iteration; /* the training step (dropout masks) */
    float grad_scale;   /* 1 / images of the global batch */
    float pad_;
} dsrt_k_consts;

/* Pooling: x (xd) to y (yd), both of one n, c, layout and type; a kh x kw
 * window moved by (sh, sw) from (-pt, -pl). Max ignores the padding (as
 * padding with -infinity); average divides by kh * kw, the padding counted
 * as zeros (as the CPU backend's pooling), or with DSRT_K_POOL_AVG_INSIDE by
 * the number of the window's elements inside the image (avgpool
 * count_pad=0), or with DSRT_K_POOL_AVG_PADDED by the number of them inside
 * the padded image, (-pt, -pl) to (h + pb, w + pr): PyTorch's
 * count_include_pad with ceil_mode, whose last window may reach past the
 * padding (avgpool ceil=1). Global average pooling is the window of the
 * whole image. */
typedef enum {
    DSRT_K_POOL_MAX = 0,
    DSRT_K_POOL_AVG = 1,
    DSRT_K_POOL_AVG_INSIDE = 2,
    DSRT_K_POOL_AVG_PADDED = 3,
} dsrt_k_pool_mode;

typedef struct {
    dsrt_k_desc xd, yd;
    int kh, kw, sh, sw, pt, pl;
    int mode;   /* dsrt_k_pool_mode */
    int pb, pr; /* DSRT_K_POOL_AVG_PADDED: the padding at the bottom and the right */
} dsrt_k_pool;

/* Local response normalisation across channels (AlexNet's): y = x / (k +
 * alpha / size * sum of x^2 over the size channels centred on x)^beta. */
typedef struct {
    int size; /* odd */
    float alpha, beta, k;
} dsrt_k_lrn;

/* A direct convolution (cross-correlation) of x (xd: n, c, h, w) with
 * filters w (k, kh, kw, c / groups: cuDNN's NHWC filter order, xd's type)
 * into y (yd: n, k, oh, ow): a (kh, kw) window dilated by (dh, dw), moved
 * by (sh, sw) from (-pt, -pl), over groups channel groups. The fallback for
 * a convolution cuDNN has no algorithm for: any shape, layout and type. */
typedef struct {
    dsrt_k_desc xd, yd;
    int kh, kw, sh, sw, dh, dw, pt, pl, groups;
} dsrt_k_conv;

/* Softmax's per-row results, in its workspace. */
typedef struct {
    double loss;
    double tsum; /* with soft targets: the row's sum of them, for the backward */
    int32_t correct;
    int32_t pad_;
} dsrt_k_row_result;

// ----------------------------------------------------------------------------
// The shape of the reductions

#define DSRT_KB_THREADS     256   /* threads of a block, lanes of a tree reduction */
#define DSRT_KB_WARP        32    /* lanes of a warp butterfly */
#define DSRT_KB_SOFT_WARPS  8     /* softmax rows a block (one warp a row) */
#define DSRT_KB_BIAS_COLS   32    /* bias gradient: columns a block */
#define DSRT_KB_BIAS_LANES  8     /* ... and row lanes a column */
#define DSRT_KB_BIAS_ROWS   256   /* ... rows a chunk at least */
#define DSRT_KB_BIAS_CHUNKS 256   /* ... and chunks at most */
#define DSRT_KB_OPT_CHUNK   4096u /* optimizer: elements of one block */

/* One level s of the tree: lane t < s adds lane t + s. */
static inline DSRT_HOST_DEVICE void dsrt_kb_tree_d(double *v, int t, int s) {
    if (t < s) v[t] = DSRT_DADD(v[t], v[t + s]);
}

static inline DSRT_HOST_DEVICE void dsrt_kb_tree_i(int *v, int t, int s) {
    if (t < s) v[t] += v[t + s];
}

// ----------------------------------------------------------------------------
// Tensors

/* Logical coordinates of an element. */
typedef struct {
    size_t b;
    int ch, r, col;
} dsrt_kb_coord;

static inline DSRT_HOST_DEVICE dsrt_kb_coord dsrt_kb_coord_of(size_t i, int c, int h, int w,
                                                              int nhwc) {
    dsrt_kb_coord k;
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

static inline DSRT_HOST_DEVICE size_t dsrt_kb_index_of(dsrt_kb_coord k, int c, int h, int w,
                                                       int nhwc) {
    if (nhwc) return ((k.b * h + k.r) * w + k.col) * c + k.ch;
    return ((k.b * c + k.ch) * h + k.r) * w + k.col;
}

static inline DSRT_HOST_DEVICE size_t dsrt_kb_count(const dsrt_k_desc *d) {
    return (size_t)d->n * d->c * d->h * d->w;
}

static inline int dsrt_kb_desc_ok(const dsrt_k_desc *d) {
    return d && d->n >= 0 && d->c >= 0 && d->h >= 0 && d->w >= 0 &&
           (d->type == DSRT_K_F32 || d->type == DSRT_K_BF16);
}

/* The channel of element i. */
static inline DSRT_HOST_DEVICE int dsrt_kb_channel(const dsrt_k_desc *d, size_t i) {
    if (d->nhwc) return (int)(i % (size_t)d->c);
    return (int)((i / ((size_t)d->h * d->w)) % (size_t)d->c);
}

/* Loads and stores of either type, as float. */
static inline DSRT_HOST_DEVICE float dsrt_kb_load(const void *p, dsrt_k_type t, size_t i) {
    return t == DSRT_K_BF16 ? dsrt_f32_from_bf16(((const dsrt_bf16 *)p)[i]) : ((const float *)p)[i];
}

static inline DSRT_HOST_DEVICE void dsrt_kb_store(void *p, dsrt_k_type t, size_t i, float v) {
    if (t == DSRT_K_BF16)
        ((dsrt_bf16 *)p)[i] = dsrt_bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}

// ----------------------------------------------------------------------------
// Input

static inline int dsrt_kb_input_ok(int norm, const float *stats, const dsrt_k_desc *yd) {
    if (!dsrt_kb_desc_ok(yd) || norm < DSRT_NORM_NONE || norm > DSRT_NORM_RESCALE_SYMMETRIC)
        return 0;
    return norm == DSRT_NORM_NONE || stats;
}

static inline int dsrt_kb_input_u8_ok(const dsrt_k_pixel *pix, int norm, const float *stats,
                                      const dsrt_k_desc *yd) {
    return pix && dsrt_kb_input_ok(norm, stats, yd) && yd->c <= DSRT_K_PIXEL_CH_MAX;
}

/* The input layer's normalisation of v, channel ch. */
static inline DSRT_HOST_DEVICE float dsrt_kb_normalise(int norm, const float *stats, int c, int ch,
                                                       float v) {
    if (norm == DSRT_NORM_NONE) return v;
    float a, o;
    dsrt_input_affine(norm, stats, c, ch, &a, &o);
    return dsrt_input_apply(a, o, v);
}

/* Element i of y (yd) from the uint8 NHWC batch x. */
static inline DSRT_HOST_DEVICE void dsrt_kb_input_u8(const uint8_t *x, const dsrt_k_pixel *pix,
                                                     int norm, const float *stats,
                                                     const dsrt_k_desc *yd, void *y, size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, yd->c, yd->h, yd->w, yd->nhwc);
    uint8_t p = x[dsrt_kb_index_of(k, yd->c, yd->h, yd->w, 1)];
    float v = DSRT_FDIV(DSRT_FSUB((float)p, pix->sub[k.ch]), pix->div[k.ch]);
    dsrt_kb_store(y, yd->type, i, dsrt_kb_normalise(norm, stats, yd->c, k.ch, v));
}

/* Element i of y (yd) from the float NCHW batch x. */
static inline DSRT_HOST_DEVICE void dsrt_kb_input_f32(const float *x, int norm, const float *stats,
                                                      const dsrt_k_desc *yd, void *y, size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, yd->c, yd->h, yd->w, yd->nhwc);
    float v = x[dsrt_kb_index_of(k, yd->c, yd->h, yd->w, 0)];
    dsrt_kb_store(y, yd->type, i, dsrt_kb_normalise(norm, stats, yd->c, k.ch, v));
}

// ----------------------------------------------------------------------------
// Padding and cropping

static inline int dsrt_kb_pad_ok(const dsrt_k_desc *xd, const dsrt_k_desc *yd) {
    return dsrt_kb_desc_ok(xd) && dsrt_kb_desc_ok(yd) && xd->n == yd->n && xd->c == yd->c;
}

/* Element i of y: x's element at (row - top, col - left), or fill outside
 * x; added to y's own value with accumulate. */
static inline DSRT_HOST_DEVICE void dsrt_kb_pad(const dsrt_k_desc *xd, const void *x,
                                                const dsrt_k_desc *yd, void *y, int top, int left,
                                                float fill, int accumulate, size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, yd->c, yd->h, yd->w, yd->nhwc);
    dsrt_kb_coord s = k;
    s.r = k.r - top;
    s.col = k.col - left;
    float v = fill;
    if (s.r >= 0 && s.r < xd->h && s.col >= 0 && s.col < xd->w)
        v = dsrt_kb_load(x, xd->type, dsrt_kb_index_of(s, xd->c, xd->h, xd->w, xd->nhwc));
    if (accumulate) v = DSRT_FADD(dsrt_kb_load(y, yd->type, i), v);
    dsrt_kb_store(y, yd->type, i, v);
}

// ----------------------------------------------------------------------------
// Activations and the fully connected bias

static inline int dsrt_kb_type_ok(dsrt_k_type t) {
    return t == DSRT_K_F32 || t == DSRT_K_BF16;
}

static inline DSRT_HOST_DEVICE void dsrt_kb_relu_fwd(dsrt_k_type t, const void *x, void *y,
                                                     float leak, size_t i) {
    float v = dsrt_kb_load(x, t, i);
    dsrt_kb_store(y, t, i, v > 0.0f ? v : DSRT_FMUL(v, leak));
}

static inline DSRT_HOST_DEVICE void dsrt_kb_relu_bwd(dsrt_k_type t, const void *y, const void *dy,
                                                     void *dx, float leak, size_t i) {
    float d = dsrt_kb_load(dy, t, i);
    dsrt_kb_store(dx, t, i, dsrt_kb_load(y, t, i) > 0.0f ? d : DSRT_FMUL(d, leak));
}

/* Element i of a convolution's or fully connected layer's output: x plus
 * the bias of its channel (b NULL: none), then with relu the (leaky) ReLU,
 * in float and rounded once to d's type. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bias_act(const dsrt_k_desc *d, const void *x,
                                                     const float *b, void *y, int relu, float leak,
                                                     size_t i) {
    float v = DSRT_FADD(dsrt_kb_load(x, d->type, i), b ? b[dsrt_kb_channel(d, i)] : 0.0f);
    if (relu && v < 0.0f) v = DSRT_FMUL(v, leak);
    dsrt_kb_store(y, d->type, i, v);
}

/*
 * The bias gradient: the sum of dy over every pixel of every image, per
 * channel, over dy (rows = n h w, cols = c) in NHWC (or with h = w = 1, as a
 * fully connected layer's (n, out)). The rows are cut into chunks of at
 * least BIAS_ROWS (at most BIAS_CHUNKS of them), each summed by BIAS_LANES
 * lanes a column, the lanes added in order into the chunk's partial sum,
 * then the chunks' partial sums in order. With y (the layer's output) the
 * ReLU's backward is folded in: dy becomes y > 0 ? dy : dy * leak, in place,
 * as it is read.
 */
static inline int dsrt_kb_bias_grad_ok(const dsrt_k_desc *d) {
    return dsrt_kb_desc_ok(d) && (d->nhwc || (d->h == 1 && d->w == 1));
}

static inline DSRT_HOST_DEVICE int dsrt_kb_bias_chunks(size_t rows) {
    size_t c = (rows + DSRT_KB_BIAS_ROWS - 1) / DSRT_KB_BIAS_ROWS;
    return c < 1 ? 1 : c > DSRT_KB_BIAS_CHUNKS ? DSRT_KB_BIAS_CHUNKS : (int)c;
}

/* The rows [*r0, *r1) of chunk k. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bias_rows(size_t rows, int chunks, int k, size_t *r0,
                                                      size_t *r1) {
    size_t per = (rows + (size_t)chunks - 1) / (size_t)chunks;
    *r0 = per * (size_t)k < rows ? per * (size_t)k : rows;
    *r1 = *r0 + per < rows ? *r0 + per : rows;
}

/* The workspace of a bias gradient over d: a partial sum a chunk a
 * channel. */
static inline size_t dsrt_kb_bias_grad_work(const dsrt_k_desc *d) {
    size_t rows = (size_t)d->n * d->h * d->w;
    return (size_t)dsrt_kb_bias_chunks(rows) * (size_t)(d->c > 0 ? d->c : 1) * sizeof(float);
}

/* Lane `lane` of column col's sum over rows [r0, r1): rows r0 + lane, r0 +
 * lane + LANES, ...; with y, each dy masked by the ReLU first (and written
 * back). */
static inline DSRT_HOST_DEVICE float dsrt_kb_bias_lane(dsrt_k_type t, void *dy, const void *y,
                                                       float leak, int cols, int col, size_t r0,
                                                       size_t r1, int lane) {
    float s = 0.0f;
    for (size_t r = r0 + (size_t)lane; r < r1; r += DSRT_KB_BIAS_LANES) {
        size_t i = r * (size_t)cols + (size_t)col;
        float v = dsrt_kb_load(dy, t, i);
        if (y && !(dsrt_kb_load(y, t, i) > 0.0f)) {
            dsrt_kb_store(dy, t, i, DSRT_FMUL(v, leak));
            v = dsrt_kb_load(dy, t, i);
        }
        s = DSRT_FADD(s, v);
    }
    return s;
}

/* A chunk's sum from its lanes' (LANES floats), added in lane order. */
static inline DSRT_HOST_DEVICE float dsrt_kb_bias_lanes_total(const float *lanes) {
    float t = lanes[0];
    for (int k = 1; k < DSRT_KB_BIAS_LANES; k++) t = DSRT_FADD(t, lanes[k]);
    return t;
}

/* Column col's total from the chunks' partial sums (chunks x cols), in
 * chunk order. */
static inline DSRT_HOST_DEVICE float dsrt_kb_bias_total(const float *partial, int chunks, int cols,
                                                        int col) {
    float t = partial[col];
    for (int k = 1; k < chunks; k++) t = DSRT_FADD(t, partial[(size_t)k * cols + col]);
    return t;
}

// ----------------------------------------------------------------------------
// Activations (nn/layers/eltwise.c): one thread an element

/*
 * The functions as PyTorch defines them, in float on the value loaded as
 * float, the result rounded once to the tensor's type; their gradients
 * with PyTorch's conventions where a function has a kink: Hardtanh's and
 * Hardsigmoid's (0 at a bound), Hardswish's (x / 3 + 1/2 at -3 and at 3).
 * GELU's Phi(x) is erfc(-x / sqrt 2) / 2, which keeps its digits far below
 * zero where 1 + erf(x / sqrt 2) cancels.
 */
typedef enum {
    DSRT_K_ACT_CLIP = 0,    /* min(max(x, a), b) (b where a > b); dx = dy where a < x < b */
    DSRT_K_ACT_SIGMOID,     /* 1 / (1 + e^-x); dx = dy (1 - y) y, from the output y */
    DSRT_K_ACT_HARDSIGMOID, /* t = a x + b, min(max(t, 0), 1); dx = dy a where 0 < t < 1 */
    DSRT_K_ACT_HARDSWISH,   /* x min(max(x + 3, 0), 6) / 6; dx = 0 below -3, dy (x / 3 + 1/2)
                             * from -3 to 3, dy above */
    DSRT_K_ACT_SILU,        /* x / (1 + e^-x); dx = dy s (1 + x (1 - s)), s = sigmoid(x) */
    DSRT_K_ACT_GELU,        /* x Phi(x); dx = dy (Phi(x) + x e^(-x^2 / 2) / sqrt(2 pi)) */
    DSRT_K_ACT_GELU_TANH,   /* x (1 + tanh(u)) / 2, u = sqrt(2 / pi) (x + 0.044715 x^3) */
    DSRT_K_ACT_COUNT
} dsrt_k_act_fn;

typedef struct {
    int fn;     /* dsrt_k_act_fn */
    float a, b; /* clip: the bounds; hardsigmoid: the slope and the offset */
} dsrt_k_act;

#define DSRT_KB_SQRT1_2      0.707106781f /* 1 / sqrt 2 */
#define DSRT_KB_RSQRT_2PI    0.398942280f /* 1 / sqrt(2 pi) */
#define DSRT_KB_SQRT_2_PI    0.797884561f /* sqrt(2 / pi) */
#define DSRT_KB_GELU_KAPPA   0.044715f
#define DSRT_KB_GELU_KAPPA_3 0.134145f /* 3 kappa */

static inline int dsrt_kb_act_ok(dsrt_k_type t, const dsrt_k_act *a) {
    return dsrt_kb_type_ok(t) && a && a->fn >= 0 && a->fn < DSRT_K_ACT_COUNT;
}

static inline DSRT_HOST_DEVICE float dsrt_kb_sigmoid(float x) {
    return DSRT_FDIV(1.0f, DSRT_FADD(1.0f, expf(-x)));
}

static inline DSRT_HOST_DEVICE float dsrt_kb_gelu_cdf(float x) {
    return DSRT_FMUL(0.5f, erfcf(DSRT_FMUL(-x, DSRT_KB_SQRT1_2)));
}

static inline DSRT_HOST_DEVICE float dsrt_kb_gelu_u(float x) {
    float x3 = DSRT_FMUL(DSRT_FMUL(x, x), x);
    return DSRT_FMUL(DSRT_KB_SQRT_2_PI, DSRT_FADD(x, DSRT_FMUL(DSRT_KB_GELU_KAPPA, x3)));
}

static inline DSRT_HOST_DEVICE float dsrt_kb_act(const dsrt_k_act *a, float x) {
    switch (a->fn) {
    case DSRT_K_ACT_CLIP: {
        float t = x < a->a ? a->a : x;
        return t > a->b ? a->b : t;
    }
    case DSRT_K_ACT_SIGMOID:
        return dsrt_kb_sigmoid(x);
    case DSRT_K_ACT_HARDSIGMOID: {
        float t = DSRT_FADD(DSRT_FMUL(a->a, x), a->b);
        return t < 0.0f ? 0.0f : t > 1.0f ? 1.0f : t;
    }
    case DSRT_K_ACT_HARDSWISH: {
        float r = DSRT_FADD(x, 3.0f);
        r = r < 0.0f ? 0.0f : r > 6.0f ? 6.0f : r;
        return DSRT_FDIV(DSRT_FMUL(x, r), 6.0f);
    }
    case DSRT_K_ACT_SILU:
        return DSRT_FDIV(x, DSRT_FADD(1.0f, expf(-x)));
    case DSRT_K_ACT_GELU:
        return DSRT_FMUL(x, dsrt_kb_gelu_cdf(x));
    default: /* DSRT_K_ACT_GELU_TANH */
        return DSRT_FMUL(DSRT_FMUL(0.5f, x), DSRT_FADD(1.0f, tanhf(dsrt_kb_gelu_u(x))));
    }
}

/* The gradient d (of the output) through the function at x, whose output
 * was y. */
static inline DSRT_HOST_DEVICE float dsrt_kb_act_grad(const dsrt_k_act *a, float x, float y,
                                                      float d) {
    switch (a->fn) {
    case DSRT_K_ACT_CLIP:
        return a->a < x && x < a->b ? d : 0.0f;
    case DSRT_K_ACT_SIGMOID:
        return DSRT_FMUL(DSRT_FMUL(d, DSRT_FSUB(1.0f, y)), y);
    case DSRT_K_ACT_HARDSIGMOID: {
        float t = DSRT_FADD(DSRT_FMUL(a->a, x), a->b);
        return 0.0f < t && t < 1.0f ? DSRT_FMUL(d, a->a) : 0.0f;
    }
    case DSRT_K_ACT_HARDSWISH:
        return x < -3.0f ? 0.0f : x <= 3.0f ? DSRT_FMUL(d, DSRT_FADD(DSRT_FDIV(x, 3.0f), 0.5f)) : d;
    case DSRT_K_ACT_SILU: {
        float s = dsrt_kb_sigmoid(x);
        return DSRT_FMUL(DSRT_FMUL(d, s), DSRT_FADD(1.0f, DSRT_FMUL(x, DSRT_FSUB(1.0f, s))));
    }
    case DSRT_K_ACT_GELU: {
        float pdf = DSRT_FMUL(expf(DSRT_FMUL(DSRT_FMUL(-0.5f, x), x)), DSRT_KB_RSQRT_2PI);
        return DSRT_FMUL(d, DSRT_FADD(dsrt_kb_gelu_cdf(x), DSRT_FMUL(x, pdf)));
    }
    default: { /* DSRT_K_ACT_GELU_TANH, as PyTorch writes it */
        float th = tanhf(dsrt_kb_gelu_u(x)), left = DSRT_FMUL(0.5f, x);
        float dleft = DSRT_FMUL(0.5f, DSRT_FADD(1.0f, th));
        float dtanh = DSRT_FSUB(1.0f, DSRT_FMUL(th, th));
        float du = DSRT_FMUL(DSRT_KB_SQRT_2_PI,
                             DSRT_FADD(1.0f, DSRT_FMUL(DSRT_KB_GELU_KAPPA_3, DSRT_FMUL(x, x))));
        return DSRT_FMUL(d, DSRT_FADD(dleft, DSRT_FMUL(DSRT_FMUL(left, dtanh), du)));
    }
    }
}

/* Element i of y = f(x) over elements of type t. */
static inline DSRT_HOST_DEVICE void dsrt_kb_act_fwd(dsrt_k_type t, const dsrt_k_act *a,
                                                    const void *x, void *y, size_t i) {
    dsrt_kb_store(y, t, i, dsrt_kb_act(a, dsrt_kb_load(x, t, i)));
}

/* Element i of dx from the forward's input x and output y and dy. */
static inline DSRT_HOST_DEVICE void dsrt_kb_act_bwd(dsrt_k_type t, const dsrt_k_act *a,
                                                    const void *x, const void *y, const void *dy,
                                                    void *dx, size_t i) {
    float yv = a->fn == DSRT_K_ACT_SIGMOID ? dsrt_kb_load(y, t, i) : 0.0f;
    dsrt_kb_store(dx, t, i, dsrt_kb_act_grad(a, dsrt_kb_load(x, t, i), yv, dsrt_kb_load(dy, t, i)));
}

// ----------------------------------------------------------------------------
// Dropout

static inline int dsrt_kb_dropout_ok(const dsrt_k_desc *d, float p, int layer) {
    return dsrt_kb_desc_ok(d) && p >= 0.0f && p < 1.0f && layer >= 0;
}

/* Element i of y = x * mask, the mask of the element's logical NCHW index. */
static inline DSRT_HOST_DEVICE void dsrt_kb_dropout(const dsrt_k_desc *d, const void *x, void *y,
                                                    const dsrt_rng *rng, uint32_t threshold,
                                                    float scale, size_t i) {
    size_t j = i;
    if (d->nhwc)
        j = dsrt_kb_index_of(dsrt_kb_coord_of(i, d->c, d->h, d->w, 1), d->c, d->h, d->w, 0);
    float m = dsrt_dropout_mask(rng, j, threshold, scale);
    dsrt_kb_store(y, d->type, i, DSRT_FMUL(dsrt_kb_load(x, d->type, i), m));
}

// ----------------------------------------------------------------------------
// Softmax and cross-entropy: one warp a row

static inline int dsrt_kb_softmax_fwd_ok(int n, int k, const int32_t *labels, const float *soft,
                                         const void *work) {
    return n >= 0 && k > 0 && (!labels || work) && (!soft || labels);
}

static inline size_t dsrt_kb_softmax_work(int n) {
    return (size_t)(n > 0 ? n : 1) * sizeof(dsrt_k_row_result);
}

/* The logits of one row: k values of type t from z + base. */
typedef struct {
    const void *z;
    dsrt_k_type t;
    size_t base;
} dsrt_kb_row;

static inline DSRT_HOST_DEVICE float dsrt_kb_row_at(const dsrt_kb_row *r, int j) {
    return dsrt_kb_load(r->z, r->t, r->base + (size_t)j);
}

/* Lane `lane`: the first of its largest logits (NaN never compares larger). */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_lane_max(const dsrt_kb_row *zr, int k, int lane,
                                                        float *best, int *arg) {
    float b = -INFINITY;
    int a = 0x7fffffff;
    for (int j = lane; j < k; j += DSRT_KB_WARP) {
        float v = dsrt_kb_row_at(zr, j);
        if (v > b || (v == b && j < a)) b = v, a = j;
    }
    *best = b;
    *arg = a;
}

/* One butterfly step: the partner lane's (ob, oa) merged in, keeping the
 * larger value and on ties the lower index (the same on both lanes). */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_merge(float *best, int *arg, float ob, int oa) {
    if (ob > *best || (ob == *best && oa < *arg)) *best = ob, *arg = oa;
}

/* The value subtracted from the row and its first maximum, from the
 * merged (best, *arg): what one pass from the left finds when the first
 * logit is a number; when it is NaN, the CPU's pass keeps it (index 0). */
static inline DSRT_HOST_DEVICE float dsrt_kb_sm_row_max(const dsrt_kb_row *zr, float best,
                                                        int *arg) {
    float mx = dsrt_kb_row_at(zr, 0);
    if (mx == mx) return best;
    *arg = 0;
    return mx;
}

/* Lane `lane`'s share of the sum of exp(z - max), in double. */
static inline DSRT_HOST_DEVICE double dsrt_kb_sm_lane_sumexp(const dsrt_kb_row *zr, int k, int lane,
                                                             double dm) {
    double s = 0.0;
    for (int j = lane; j < k; j += DSRT_KB_WARP)
        s = DSRT_DADD(s, exp((double)dsrt_kb_row_at(zr, j) - dm));
    return s;
}

/* Lane `lane`'s probabilities: exp(z - max) / sum, rounded to float. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_lane_store(const dsrt_kb_row *zr, float *pr, int k,
                                                          int lane, double dm, double inv) {
    for (int j = lane; j < k; j += DSRT_KB_WARP)
        pr[j] = (float)DSRT_DMUL(exp((double)dsrt_kb_row_at(zr, j) - dm), inv);
}

/* The row's loss and whether its first maximum is its label. A label out of
 * range or a maximum that is not finite gives NaN. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_row_result(const dsrt_kb_row *zr, int32_t label,
                                                          int k, float mx, double sum, int arg,
                                                          dsrt_k_row_result *res) {
    double l = NAN;
    if (label >= 0 && label < k && isfinite(mx))
        l = DSRT_DSUB(log(sum), (double)dsrt_kb_row_at(zr, label) - (double)mx);
    res->loss = l;
    res->correct = arg == label;
}

/* With soft targets t (the row's k floats): the loss is sum_j t_j (log sum -
 * (z_j - max)) over the targets that are not 0, added in order as the CPU
 * backend adds them, and the targets' sum is kept for the backward. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_row_soft(const dsrt_kb_row *zr, const float *t,
                                                        int k, float mx, double sum,
                                                        dsrt_k_row_result *res) {
    double lse = log(sum), l = 0.0, ts = 0.0;
    for (int j = 0; j < k; j++) {
        ts = DSRT_DADD(ts, (double)t[j]);
        if (t[j] != 0.0f)
            l = DSRT_DADD(l, DSRT_DMUL((double)t[j],
                                       DSRT_DSUB(lse, (double)dsrt_kb_row_at(zr, j) - (double)mx)));
    }
    res->loss = isfinite(mx) ? l : NAN;
    res->tsum = ts;
}

/* Thread t's share of the batch totals: rows t, t + THREADS, ... */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_total_part(const dsrt_k_row_result *res, int n,
                                                          int t, double *loss, int *correct) {
    double l = 0.0;
    int c = 0;
    for (int i = t; i < n; i += DSRT_KB_THREADS) {
        l = DSRT_DADD(l, res[i].loss);
        c += res[i].correct;
    }
    *loss = l;
    *correct = c;
}

static inline int dsrt_kb_softmax_bwd_ok(int n, int k, const int32_t *labels, const float *soft,
                                         const void *work) {
    return n >= 0 && k > 0 && labels && (!soft || work);
}

/* Element i of dz (type t) = (probs - onehot) * scale, rounded as the CPU
 * backend. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_bwd(const float *probs, const int32_t *labels, int k,
                                                   float scale, void *dz, dsrt_k_type t, size_t i) {
    float d = DSRT_FMUL(probs[i], scale);
    if ((int)(i % k) == labels[i / k]) d = DSRT_FSUB(d, scale);
    dsrt_kb_store(dz, t, i, d);
}

/* With soft targets: (probs * sum(targets) - target) * scale in double,
 * rounded once, as the CPU backend (the row's sum from the forward). */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_bwd_soft(const float *probs, const float *soft,
                                                        const dsrt_k_row_result *res, int k,
                                                        float scale, void *dz, dsrt_k_type t,
                                                        size_t i) {
    double d = DSRT_DMUL(DSRT_DSUB(DSRT_DMUL((double)probs[i], res[i / k].tsum), (double)soft[i]),
                         (double)scale);
    dsrt_kb_store(dz, t, i, (float)d);
}

// ----------------------------------------------------------------------------
// Synchronised batch normalisation: one block a channel
//
// x, dy, y and dx are tensors of d (either layout, either type); the sums,
// statistics and parameters are per channel. Where the layer computes the
// ReLU after it (y, its output, given), the backward reads dy through the
// ReLU's backward: y > 0 ? dy : dy * leak.

static inline int dsrt_kb_bn_ok(const dsrt_k_desc *d) {
    return dsrt_kb_desc_ok(d);
}

/* Index of element j (0 .. n h w - 1, image by image, pixel by pixel) of
 * channel ch. */
static inline DSRT_HOST_DEVICE size_t dsrt_kb_bn_index(const dsrt_k_desc *d, int ch, size_t j) {
    size_t hw = (size_t)d->h * d->w;
    if (d->nhwc) return j * (size_t)d->c + (size_t)ch;
    return ((j / hw) * (size_t)d->c + (size_t)ch) * hw + j % hw;
}

/* dy at element i, through the folded ReLU when y is given. */
static inline DSRT_HOST_DEVICE float dsrt_kb_bn_dy(const dsrt_k_desc *d, const void *dy,
                                                   const void *y, float leak, size_t i) {
    float v = dsrt_kb_load(dy, d->type, i);
    if (y && !(dsrt_kb_load(y, d->type, i) > 0.0f)) v = DSRT_FMUL(v, leak);
    return v;
}

/*
 * The per-channel sums (of x and x^2 forward; of dy' and dy' xhat backward)
 * as a tiled reduction: the n h w positions are cut into tiles of
 * DSRT_KB_BN_ROWS; in a tile, lane l (of DSRT_KB_BN_LANES) sums the rows l,
 * l + LANES, ... in float with a compensated (Kahan) sum, the lanes are
 * added by a tree, and each tile's partial goes to a workspace (2c floats a
 * tile); the tiles' partials are then added in double, in tile order. On a
 * GPU a block takes 32 channels of a tile, a warp reading 32 neighbouring
 * channels of a position (coalesced in NHWC), and the grid covers tiles x
 * channel groups. Every sum has one fixed order: the same bits run to run,
 * on the device and in these bodies on the host.
 */
#define DSRT_KB_BN_ROWS  1024
#define DSRT_KB_BN_LANES 8
#define DSRT_KB_BN_CHANS 32 /* channels a block */

static inline DSRT_HOST_DEVICE size_t dsrt_kb_bn_tiles(const dsrt_k_desc *d) {
    size_t rows = (size_t)d->n * d->h * d->w;
    return rows ? (rows + DSRT_KB_BN_ROWS - 1) / DSRT_KB_BN_ROWS : 1;
}

/* Floats of the workspace the sums of d take. */
static inline size_t dsrt_kb_bn_work(const dsrt_k_desc *d) {
    return dsrt_kb_bn_tiles(d) * 2 * (size_t)d->c;
}

/* A compensated sum: s the sum, e the running error. */
static inline DSRT_HOST_DEVICE void dsrt_kb_kahan(float *s, float *e, float v) {
    float y = DSRT_FSUB(v, *e), t = DSRT_FADD(*s, y);
    *e = DSRT_FSUB(DSRT_FSUB(t, *s), y);
    *s = t;
}

/* Lane l's share of tile t of channel ch: the sums of x and x^2, or (dy
 * given) of dy' and dy' (x - mu) is, dy' being dy through the folded ReLU
 * when y is given. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_lane(const dsrt_k_desc *d, const void *x,
                                                    const void *dy, const void *y, float leak,
                                                    float mu, float is, size_t t, int ch, int l,
                                                    float *s, float *q) {
    size_t rows = (size_t)d->n * d->h * d->w, r1 = (t + 1) * DSRT_KB_BN_ROWS;
    if (r1 > rows) r1 = rows;
    float a = 0.0f, ae = 0.0f, b = 0.0f, be = 0.0f;
    for (size_t j = t * DSRT_KB_BN_ROWS + (size_t)l; j < r1; j += DSRT_KB_BN_LANES) {
        size_t i = dsrt_kb_bn_index(d, ch, j);
        float v = dsrt_kb_load(x, d->type, i);
        if (dy) {
            float g = dsrt_kb_bn_dy(d, dy, y, leak, i);
            dsrt_kb_kahan(&a, &ae, g);
            dsrt_kb_kahan(&b, &be, DSRT_FMUL(g, DSRT_FMUL(DSRT_FSUB(v, mu), is)));
        } else {
            dsrt_kb_kahan(&a, &ae, v);
            dsrt_kb_kahan(&b, &be, DSRT_FMUL(v, v));
        }
    }
    *s = DSRT_FSUB(a, ae);
    *q = DSRT_FSUB(b, be);
}

/* One level of the lanes' tree: lane l < h adds lane l + h. */
static inline DSRT_HOST_DEVICE void dsrt_kb_tree_f(float *v, int l, int h) {
    if (l < h) v[l] = DSRT_FADD(v[l], v[l + h]);
}

/* Channel ch's totals over the tiles' partials (part: tiles x 2c). */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_total(const float *part, size_t tiles, int c, int ch,
                                                     double *s, double *q) {
    double a = 0.0, b = 0.0;
    for (size_t t = 0; t < tiles; t++) {
        a = DSRT_DADD(a, (double)part[t * 2 * (size_t)c + (size_t)ch]);
        b = DSRT_DADD(b, (double)part[t * 2 * (size_t)c + (size_t)c + (size_t)ch]);
    }
    *s = a;
    *q = b;
}

/* Channel k's batch statistics and running averages from the summed sums. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_stats(const double *sums, int c, float eps,
                                                     float momentum, float *mean, float *var,
                                                     float *inv, float *run_mean, float *run_var,
                                                     size_t k) {
    double count = sums[2 * c];
    if (!(count > 0)) {
        mean[k] = var[k] = inv[k] = NAN;
        return;
    }
    double m = sums[k] / count, v = DSRT_DSUB(sums[c + k] / count, DSRT_DMUL(m, m));
    float mf = (float)m, vf = (float)(v > 0 ? v : 0);
    mean[k] = mf;
    var[k] = vf;
    inv[k] = (float)(1.0 / sqrt(DSRT_DADD((double)vf, (double)eps)));
    float unbias = count > 1 ? (float)(count / (count - 1)) : 1.0f,
          keep = DSRT_FSUB(1.0f, momentum);
    run_mean[k] = DSRT_FADD(DSRT_FMUL(keep, run_mean[k]), DSRT_FMUL(momentum, mf));
    run_var[k] = DSRT_FADD(DSRT_FMUL(keep, run_var[k]), DSRT_FMUL(DSRT_FMUL(momentum, vf), unbias));
}

/* Element i of the input gradient with the global terms:
 * a dy - a S1 / M - (x - mean) a inv S2 / M, a = scale * inv. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_bwd_dx(const dsrt_k_desc *d, const void *x,
                                                      const void *dy, const void *y, float leak,
                                                      const float *mean, const float *inv,
                                                      const float *scale, const double *sums,
                                                      double inv_m, void *dx, size_t i) {
    int c = d->c, ch = dsrt_kb_channel(d, i);
    double is = inv[ch], a = DSRT_DMUL((double)scale[ch], is);
    double k1 = DSRT_DMUL(DSRT_DMUL(a, sums[ch]), inv_m);
    double k2 = DSRT_DMUL(DSRT_DMUL(DSRT_DMUL(a, sums[c + ch]), inv_m), is);
    double g = dsrt_kb_bn_dy(d, dy, y, leak, i), xv = dsrt_kb_load(x, d->type, i);
    dsrt_kb_store(
        dx, d->type, i,
        (float)DSRT_DSUB(DSRT_DSUB(DSRT_DMUL(a, g), k1), DSRT_DMUL(xv - (double)mean[ch], k2)));
}

/* Element i of the normalised output: (x - mean) inv scale + shift, in
 * double, then the ReLU when relu; inv NULL: 1 / sqrt(var + eps) (running
 * statistics at inference). */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_apply(const dsrt_k_desc *d, const void *x,
                                                     const float *mean, const float *inv,
                                                     const float *var, float eps,
                                                     const float *scale, const float *shift,
                                                     int relu, float leak, void *y, size_t i) {
    int ch = dsrt_kb_channel(d, i);
    double is = inv ? (double)inv[ch] : 1.0 / sqrt(DSRT_DADD((double)var[ch], (double)eps));
    double xv = dsrt_kb_load(x, d->type, i);
    double v = DSRT_DADD(DSRT_DMUL(DSRT_DMUL(xv - (double)mean[ch], is), (double)scale[ch]),
                         (double)shift[ch]);
    float f = (float)v;
    if (relu && f < 0.0f) f = DSRT_FMUL(f, leak);
    dsrt_kb_store(y, d->type, i, f);
}

// ----------------------------------------------------------------------------
// Pooling: one thread an output element forward, one an input element
// backward (it gathers the gradients of the windows that hold it, in window
// order: no atomics, the same bits every run)

static inline int dsrt_kb_pool_ok(const dsrt_k_pool *p) {
    const dsrt_k_desc *x = &p->xd, *y = &p->yd;
    return dsrt_kb_desc_ok(x) && dsrt_kb_desc_ok(y) && x->n == y->n && x->c == y->c &&
           x->nhwc == y->nhwc && x->type == y->type && p->kh > 0 && p->kw > 0 && p->sh > 0 &&
           p->sw > 0 && p->pt >= 0 && p->pl >= 0 && p->pt < p->kh && p->pl < p->kw &&
           (p->mode == DSRT_K_POOL_MAX || p->mode == DSRT_K_POOL_AVG ||
            p->mode == DSRT_K_POOL_AVG_INSIDE ||
            (p->mode == DSRT_K_POOL_AVG_PADDED && p->pb >= 0 && p->pr >= 0));
}

/* What average pooling divides window (oh, ow)'s sum by: kh kw, or the
 * number of its elements inside the image, or inside the padded image. */
static inline DSRT_HOST_DEVICE float dsrt_kb_pool_area(const dsrt_k_pool *p, int oh, int ow) {
    if (p->mode != DSRT_K_POOL_AVG_INSIDE && p->mode != DSRT_K_POOL_AVG_PADDED)
        return (float)(p->kh * p->kw);
    int padded = p->mode == DSRT_K_POOL_AVG_PADDED;
    int r0 = oh * p->sh - p->pt, c0 = ow * p->sw - p->pl;
    int he = padded ? p->xd.h + p->pb : p->xd.h, we = padded ? p->xd.w + p->pr : p->xd.w;
    int r1 = r0 + p->kh < he ? r0 + p->kh : he, c1 = c0 + p->kw < we ? c0 + p->kw : we;
    if (padded) return (float)((r1 - r0) * (c1 - c0));
    r0 = r0 > 0 ? r0 : 0;
    c0 = c0 > 0 ? c0 : 0;
    int n = (r1 - r0) * (c1 - c0);
    return (float)(n > 0 ? n : 1);
}

/* The first largest element of window (b, ch, oh, ow) (NaN wins: it
 * propagates), as the index of x; *sum the window's sum, padding as zeros. */
static inline DSRT_HOST_DEVICE size_t dsrt_kb_pool_window(const dsrt_k_pool *p, const void *x,
                                                          dsrt_kb_coord o, float *best,
                                                          float *sum) {
    const dsrt_k_desc *xd = &p->xd;
    int r0 = o.r * p->sh - p->pt, c0 = o.col * p->sw - p->pl;
    float b = -INFINITY, s = 0.0f;
    size_t arg = (size_t)-1;
    for (int r = 0; r < p->kh; r++) {
        int ih = r0 + r;
        if (ih < 0 || ih >= xd->h) continue;
        for (int q = 0; q < p->kw; q++) {
            int iw = c0 + q;
            if (iw < 0 || iw >= xd->w) continue;
            dsrt_kb_coord k = o;
            k.r = ih;
            k.col = iw;
            size_t i = dsrt_kb_index_of(k, xd->c, xd->h, xd->w, xd->nhwc);
            float v = dsrt_kb_load(x, xd->type, i);
            if (arg == (size_t)-1 || v > b || (v != v && b == b)) b = v, arg = i;
            s = DSRT_FADD(s, v);
        }
    }
    *best = b;
    *sum = s;
    return arg;
}

/* Whether max pooling p may keep each window's winner as its offset in
 * the window (one byte an output element: windows of at most 255). */
static inline DSRT_HOST_DEVICE int dsrt_kb_pool_arg_ok(const dsrt_k_pool *p) {
    return p->mode == DSRT_K_POOL_MAX && p->kh * p->kw <= 255;
}

/* Element i of y; for max pooling with arg given, the winner's offset in
 * its window (r kw + q) in arg[i], for the backward pass. */
static inline DSRT_HOST_DEVICE void dsrt_kb_pool_fwd(const dsrt_k_pool *p, const void *x, void *y,
                                                     uint8_t *arg, size_t i) {
    const dsrt_k_desc *yd = &p->yd;
    dsrt_kb_coord o = dsrt_kb_coord_of(i, yd->c, yd->h, yd->w, yd->nhwc);
    float best, sum;
    size_t at = dsrt_kb_pool_window(p, x, o, &best, &sum);
    float v = p->mode == DSRT_K_POOL_MAX ? best : DSRT_FDIV(sum, dsrt_kb_pool_area(p, o.r, o.col));
    dsrt_kb_store(y, yd->type, i, v);
    if (arg && p->mode == DSRT_K_POOL_MAX) {
        dsrt_kb_coord k = dsrt_kb_coord_of(at, p->xd.c, p->xd.h, p->xd.w, p->xd.nhwc);
        int r = k.r - (o.r * p->sh - p->pt), q = k.col - (o.col * p->sw - p->pl);
        arg[i] = at == (size_t)-1 ? 255 : (uint8_t)(r * p->kw + q);
    }
}

/* The first and last output index along one axis whose window holds input
 * position at (window k, stride s, padding pad, n outputs); hi < lo: none. */
static inline DSRT_HOST_DEVICE void dsrt_kb_pool_span(int at, int k, int s, int pad, int n, int *lo,
                                                      int *hi) {
    int first = at + pad - k + 1;
    *lo = first <= 0 ? 0 : (first + s - 1) / s;
    int last = (at + pad) / s;
    *hi = last < n - 1 ? last : n - 1;
}

/* Element i of dx (p->xd): the gradients of the windows holding it. Max
 * pooling reads each window's winner from arg (the forward's) when given,
 * else finds it again in x. */
static inline DSRT_HOST_DEVICE void dsrt_kb_pool_bwd(const dsrt_k_pool *p, const void *x,
                                                     const uint8_t *arg, const void *dy, void *dx,
                                                     size_t i) {
    const dsrt_k_desc *xd = &p->xd, *yd = &p->yd;
    dsrt_kb_coord k = dsrt_kb_coord_of(i, xd->c, xd->h, xd->w, xd->nhwc);
    int h0, h1, w0, w1;
    dsrt_kb_pool_span(k.r, p->kh, p->sh, p->pt, yd->h, &h0, &h1);
    dsrt_kb_pool_span(k.col, p->kw, p->sw, p->pl, yd->w, &w0, &w1);
    float acc = 0.0f;
    for (int oh = h0; oh <= h1; oh++)
        for (int ow = w0; ow <= w1; ow++) {
            dsrt_kb_coord o = k;
            o.r = oh;
            o.col = ow;
            size_t oi = dsrt_kb_index_of(o, yd->c, yd->h, yd->w, yd->nhwc);
            if (p->mode == DSRT_K_POOL_MAX) {
                int won;
                if (arg) {
                    int off = (k.r - (oh * p->sh - p->pt)) * p->kw + (k.col - (ow * p->sw - p->pl));
                    won = arg[oi] == off;
                } else {
                    float best, sum;
                    won = dsrt_kb_pool_window(p, x, o, &best, &sum) == i;
                }
                if (won) acc = DSRT_FADD(acc, dsrt_kb_load(dy, yd->type, oi));
            } else {
                acc = DSRT_FADD(
                    acc, DSRT_FDIV(dsrt_kb_load(dy, yd->type, oi), dsrt_kb_pool_area(p, oh, ow)));
            }
        }
    dsrt_kb_store(dx, xd->type, i, acc);
}

// ----------------------------------------------------------------------------
// Local response normalisation: one thread an element, its window of
// channels summed in float; the forward keeps each element's scale for the
// backward, which then reads one value a neighbour instead of its window

static inline int dsrt_kb_lrn_ok(const dsrt_k_desc *d, const dsrt_k_lrn *l) {
    return dsrt_kb_desc_ok(d) && l && l->size > 0 && l->size % 2 == 1 && l->k > 0.0f;
}

/* k + alpha / size * (sum of x^2 over the channels centred on k.ch). */
static inline DSRT_HOST_DEVICE float dsrt_kb_lrn_scale(const dsrt_k_desc *d, const void *x,
                                                       const dsrt_k_lrn *l, dsrt_kb_coord k) {
    int half = (l->size - 1) / 2;
    float s = 0.0f;
    for (int j = k.ch - half; j <= k.ch + half; j++) {
        if (j < 0 || j >= d->c) continue;
        dsrt_kb_coord kj = k;
        kj.ch = j;
        float v = dsrt_kb_load(x, d->type, dsrt_kb_index_of(kj, d->c, d->h, d->w, d->nhwc));
        s = DSRT_FADD(s, DSRT_FMUL(v, v));
    }
    return DSRT_FADD(l->k, DSRT_FMUL(DSRT_FDIV(l->alpha, (float)l->size), s));
}

/* Element i of y = x * scale^-beta; the scale in scale[i] when given. */
static inline DSRT_HOST_DEVICE void dsrt_kb_lrn_fwd(const dsrt_k_desc *d, const void *x,
                                                    const dsrt_k_lrn *l, void *y, float *scale,
                                                    size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, d->c, d->h, d->w, d->nhwc);
    float v = dsrt_kb_load(x, d->type, i), sc = dsrt_kb_lrn_scale(d, x, l, k);
    if (scale) scale[i] = sc;
    dsrt_kb_store(y, d->type, i, DSRT_FMUL(v, powf(sc, -l->beta)));
}

/* Element i of dx = dy scale^-beta - 2 alpha beta / size x (sum over the
 * channels j whose window holds i of dy_j y_j / scale_j); the scales from
 * the forward's scale when given, else from x. */
static inline DSRT_HOST_DEVICE void dsrt_kb_lrn_bwd(const dsrt_k_desc *d, const void *x,
                                                    const void *y, const void *dy,
                                                    const float *scale, const dsrt_k_lrn *l,
                                                    void *dx, size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, d->c, d->h, d->w, d->nhwc);
    int half = (l->size - 1) / 2;
    float acc = 0.0f;
    for (int j = k.ch - half; j <= k.ch + half; j++) {
        if (j < 0 || j >= d->c) continue;
        dsrt_kb_coord kj = k;
        kj.ch = j;
        size_t ij = dsrt_kb_index_of(kj, d->c, d->h, d->w, d->nhwc);
        float g = dsrt_kb_load(dy, d->type, ij), yv = dsrt_kb_load(y, d->type, ij);
        float sj = scale ? scale[ij] : dsrt_kb_lrn_scale(d, x, l, kj);
        acc = DSRT_FADD(acc, DSRT_FDIV(DSRT_FMUL(g, yv), sj));
    }
    float g = dsrt_kb_load(dy, d->type, i), xv = dsrt_kb_load(x, d->type, i);
    float si = scale ? scale[i] : dsrt_kb_lrn_scale(d, x, l, k);
    float f = DSRT_FDIV(DSRT_FMUL(2.0f * l->alpha, l->beta), (float)l->size);
    float v = DSRT_FSUB(DSRT_FMUL(g, powf(si, -l->beta)), DSRT_FMUL(DSRT_FMUL(f, xv), acc));
    dsrt_kb_store(dx, d->type, i, v);
}

// ----------------------------------------------------------------------------
// Graphs: element-wise sums (add layers, gradients of outputs that feed
// several layers) and channel ranges (concat layers)

/* The inputs of a sum (at most DSRT_KB_SUM_MAX, one type and count). */
#define DSRT_KB_SUM_MAX 64
typedef struct {
    const void *x[DSRT_KB_SUM_MAX];
    int n;
} dsrt_k_sum;

/* Element i of y = x[0] + ... + x[n-1], added in that order in float, then
 * the ReLU (leak: its slope below zero) when relu. y may be x[0]. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sum(dsrt_k_type t, const dsrt_k_sum *s, void *y,
                                                int relu, float leak, size_t i) {
    float v = dsrt_kb_load(s->x[0], t, i);
    for (int k = 1; k < s->n; k++) v = DSRT_FADD(v, dsrt_kb_load(s->x[k], t, i));
    if (relu && !(v > 0.0f)) v = v < 0.0f ? DSRT_FMUL(v, leak) : v;
    dsrt_kb_store(y, t, i, v);
}

/* Element i of x (xd) and its place among y's (yd) channels from c0 on (one
 * n, h, w, type): to_y copies it there (concat forward), else from there
 * (backward: the input's share of the gradient), added to what x holds
 * when accumulate. */
static inline DSRT_HOST_DEVICE void dsrt_kb_channels(const dsrt_k_desc *xd, void *x,
                                                     const dsrt_k_desc *yd, void *y, int c0,
                                                     int to_y, int accumulate, size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, xd->c, xd->h, xd->w, xd->nhwc);
    dsrt_kb_coord o = k;
    o.ch = k.ch + c0;
    size_t j = dsrt_kb_index_of(o, yd->c, yd->h, yd->w, yd->nhwc);
    if (to_y) {
        dsrt_kb_store(y, yd->type, j, dsrt_kb_load(x, xd->type, i));
    } else {
        float v = dsrt_kb_load(y, yd->type, j);
        if (accumulate) v = DSRT_FADD(dsrt_kb_load(x, xd->type, i), v);
        dsrt_kb_store(x, xd->type, i, v);
    }
}

static inline int dsrt_kb_channels_ok(const dsrt_k_desc *xd, const dsrt_k_desc *yd, int c0) {
    return dsrt_kb_desc_ok(xd) && dsrt_kb_desc_ok(yd) && xd->n == yd->n && xd->h == yd->h &&
           xd->w == yd->w && c0 >= 0 && c0 + xd->c <= yd->c;
}

// ----------------------------------------------------------------------------
// Direct convolution: one thread an output element forward, an input
// element backward (it gathers the outputs whose windows hold it), a filter
// element for the filter's gradient; sums in double, in a fixed order

static inline int dsrt_kb_conv_ok(const dsrt_k_conv *p) {
    const dsrt_k_desc *x = &p->xd, *y = &p->yd;
    return dsrt_kb_desc_ok(x) && dsrt_kb_desc_ok(y) && x->type == y->type && x->n == y->n &&
           p->groups > 0 && x->c % p->groups == 0 && y->c % p->groups == 0 && p->kh > 0 &&
           p->kw > 0 && p->sh > 0 && p->sw > 0 && p->dh > 0 && p->dw > 0 && p->pt >= 0 &&
           p->pl >= 0;
}

/* Filter element (k, r, q, cg) as an index of w. */
static inline DSRT_HOST_DEVICE size_t dsrt_kb_conv_w(const dsrt_k_conv *p, int k, int r, int q,
                                                     int cg) {
    return (((size_t)k * p->kh + r) * p->kw + q) * (p->xd.c / p->groups) + cg;
}

/* Element i of y. */
static inline DSRT_HOST_DEVICE void dsrt_kb_conv_fwd(const dsrt_k_conv *p, const void *x,
                                                     const void *w, void *y, size_t i) {
    const dsrt_k_desc *xd = &p->xd, *yd = &p->yd;
    dsrt_kb_coord o = dsrt_kb_coord_of(i, yd->c, yd->h, yd->w, yd->nhwc);
    int cpg = xd->c / p->groups, c0 = (o.ch / (yd->c / p->groups)) * cpg;
    double acc = 0.0;
    for (int r = 0; r < p->kh; r++) {
        int ih = o.r * p->sh - p->pt + r * p->dh;
        if (ih < 0 || ih >= xd->h) continue;
        for (int q = 0; q < p->kw; q++) {
            int iw = o.col * p->sw - p->pl + q * p->dw;
            if (iw < 0 || iw >= xd->w) continue;
            for (int cg = 0; cg < cpg; cg++) {
                dsrt_kb_coord k = {o.b, c0 + cg, ih, iw};
                double xv =
                    dsrt_kb_load(x, xd->type, dsrt_kb_index_of(k, xd->c, xd->h, xd->w, xd->nhwc));
                double wv = dsrt_kb_load(w, xd->type, dsrt_kb_conv_w(p, o.ch, r, q, cg));
                acc = DSRT_DADD(acc, DSRT_DMUL(xv, wv));
            }
        }
    }
    dsrt_kb_store(y, yd->type, i, (float)acc);
}

/* Element i of dx (p->xd) from dy (p->yd). */
static inline DSRT_HOST_DEVICE void dsrt_kb_conv_bwd_data(const dsrt_k_conv *p, const void *w,
                                                          const void *dy, void *dx, size_t i) {
    const dsrt_k_desc *xd = &p->xd, *yd = &p->yd;
    dsrt_kb_coord k = dsrt_kb_coord_of(i, xd->c, xd->h, xd->w, xd->nhwc);
    int cpg = xd->c / p->groups, kpg = yd->c / p->groups, grp = k.ch / cpg, cg = k.ch % cpg;
    double acc = 0.0;
    for (int r = 0; r < p->kh; r++) {
        int t = k.r + p->pt - r * p->dh;
        if (t < 0 || t % p->sh) continue;
        int oh = t / p->sh;
        if (oh >= yd->h) continue;
        for (int q = 0; q < p->kw; q++) {
            int u = k.col + p->pl - q * p->dw;
            if (u < 0 || u % p->sw) continue;
            int ow = u / p->sw;
            if (ow >= yd->w) continue;
            for (int kk = grp * kpg; kk < (grp + 1) * kpg; kk++) {
                dsrt_kb_coord o = {k.b, kk, oh, ow};
                double g =
                    dsrt_kb_load(dy, yd->type, dsrt_kb_index_of(o, yd->c, yd->h, yd->w, yd->nhwc));
                double wv = dsrt_kb_load(w, xd->type, dsrt_kb_conv_w(p, kk, r, q, cg));
                acc = DSRT_DADD(acc, DSRT_DMUL(g, wv));
            }
        }
    }
    dsrt_kb_store(dx, xd->type, i, (float)acc);
}

/* Element i of dw (filter order, of type dwt) from x and dy. */
static inline DSRT_HOST_DEVICE void dsrt_kb_conv_bwd_filter(const dsrt_k_conv *p, const void *x,
                                                            const void *dy, void *dw,
                                                            dsrt_k_type dwt, size_t i) {
    const dsrt_k_desc *xd = &p->xd, *yd = &p->yd;
    int cpg = xd->c / p->groups, kpg = yd->c / p->groups;
    int cg = (int)(i % cpg), q = (int)(i / cpg % p->kw), r = (int)(i / cpg / p->kw % p->kh);
    int kk = (int)(i / cpg / p->kw / p->kh), c = (kk / kpg) * cpg + cg;
    double acc = 0.0;
    for (int b = 0; b < yd->n; b++)
        for (int oh = 0; oh < yd->h; oh++) {
            int ih = oh * p->sh - p->pt + r * p->dh;
            if (ih < 0 || ih >= xd->h) continue;
            for (int ow = 0; ow < yd->w; ow++) {
                int iw = ow * p->sw - p->pl + q * p->dw;
                if (iw < 0 || iw >= xd->w) continue;
                dsrt_kb_coord o = {(size_t)b, kk, oh, ow}, k = {(size_t)b, c, ih, iw};
                double g =
                    dsrt_kb_load(dy, yd->type, dsrt_kb_index_of(o, yd->c, yd->h, yd->w, yd->nhwc));
                double xv =
                    dsrt_kb_load(x, xd->type, dsrt_kb_index_of(k, xd->c, xd->h, xd->w, xd->nhwc));
                acc = DSRT_DADD(acc, DSRT_DMUL(g, xv));
            }
        }
    dsrt_kb_store(dw, dwt, i, (float)acc);
}

/* Elements of the filters (and of their gradient). */
static inline DSRT_HOST_DEVICE size_t dsrt_kb_conv_w_count(const dsrt_k_conv *p) {
    return (size_t)p->yd.c * p->kh * p->kw * (p->xd.c / p->groups);
}

// ----------------------------------------------------------------------------
// The optimizer: blocks of OPT_CHUNK elements over every segment

/* Lays the grids out over seg (host memory, flat-buffer order): block0 and
 * blocks of each, *blocks the total; returns the workspace bytes (partial
 * sums, then one scale a segment). */
static inline size_t dsrt_kb_optim_layout(dsrt_k_segment *seg, int n_seg, uint32_t *blocks) {
    uint32_t b = 0;
    for (int k = 0; k < n_seg; k++) {
        seg[k].block0 = b;
        seg[k].blocks = (uint32_t)((seg[k].n + DSRT_KB_OPT_CHUNK - 1) / DSRT_KB_OPT_CHUNK);
        b += seg[k].blocks;
    }
    *blocks = b;
    return (size_t)(b ? b : 1) * sizeof(double) + (size_t)(n_seg > 0 ? n_seg : 1) * sizeof(float);
}

/* The segments of every parameter tensor of net as nn/optim.c makes them
 * (each layer's weights, then its bias) into seg (2 n_layers entries at
 * most); returns their number. */
static inline int dsrt_kb_net_segments(const dsrt_net *net, dsrt_k_segment *seg) {
    int n = 0;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        if (l->w_n) seg[n++] = (dsrt_k_segment){l->w_off, l->w_n, l->o.wlr, l->o.wl2, 0, 0};
        if (l->b_n) seg[n++] = (dsrt_k_segment){l->b_off, l->b_n, l->o.blr, l->o.bl2, 0, 0};
    }
    return n;
}

/* The scalars of step t (1 for the first) at learning rate lr. */
static inline void dsrt_kb_optim_step_params(dsrt_k_step *st, const dsrt_optimizer_options *o,
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

static inline int dsrt_kb_optim_ok(const dsrt_k_optim *o, const dsrt_k_step *st, const float *buf0,
                                   const float *buf1) {
    return o && st && o->n_seg >= 0 && st->solver >= DSRT_SOLVER_SGDM &&
           st->solver <= DSRT_SOLVER_RMSPROP && buf0 && (st->solver != DSRT_SOLVER_ADAM || buf1);
}

/* Whether the step clips by a norm (and so reduces first). */
static inline int dsrt_kb_optim_norm_clip(const dsrt_k_step *st) {
    return isfinite(st->threshold) &&
           (st->clip == DSRT_CLIP_L2NORM || st->clip == DSRT_CLIP_GLOBAL_L2NORM);
}

/* The segment block b lies in: the first whose blocks end after b. */
static inline DSRT_HOST_DEVICE int dsrt_kb_segment_of(const dsrt_k_segment *seg, int n_seg,
                                                      uint32_t b) {
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

/* The element range [*begin, *end) of segment s that block b covers (in
 * the segment, from its offset). */
static inline DSRT_HOST_DEVICE void dsrt_kb_block_range(const dsrt_k_segment *s, uint32_t b,
                                                        size_t *begin, size_t *end) {
    *begin = (size_t)(b - s->block0) * DSRT_KB_OPT_CHUNK;
    *end = *begin + DSRT_KB_OPT_CHUNK < s->n ? *begin + DSRT_KB_OPT_CHUNK : s->n;
}

/* Thread t's share of block b's sum of squared gradients. */
static inline DSRT_HOST_DEVICE double dsrt_kb_optim_sumsq_part(const dsrt_k_segment *seg, int n_seg,
                                                               const float *g, uint32_t b, int t) {
    const dsrt_k_segment *s = &seg[dsrt_kb_segment_of(seg, n_seg, b)];
    size_t begin, end;
    dsrt_kb_block_range(s, b, &begin, &end);
    double acc = 0.0;
    for (size_t i = begin + (size_t)t; i < end; i += DSRT_KB_THREADS) {
        double v = g[s->off + i];
        acc = DSRT_DADD(acc, DSRT_DMUL(v, v));
    }
    return acc;
}

/* Thread t's share of segment s's sum of its blocks' partial sums. */
static inline DSRT_HOST_DEVICE double dsrt_kb_optim_seg_part(const dsrt_k_segment *s,
                                                             const double *partial, int t) {
    double acc = 0.0;
    for (uint32_t i = (uint32_t)t; i < s->blocks; i += DSRT_KB_THREADS)
        acc = DSRT_DADD(acc, partial[s->block0 + i]);
    return acc;
}

/* The gradient scale of a norm whose square is sumsq. */
static inline DSRT_HOST_DEVICE float dsrt_kb_clip_scale(double sumsq, double threshold) {
    double norm = sqrt(sumsq);
    return norm > threshold ? (float)(threshold / norm) : 1.0f;
}

/* Whether segment s's elements change at all this step (scale sc). */
static inline DSRT_HOST_DEVICE int dsrt_kb_optim_moves(const dsrt_k_step *st,
                                                       const dsrt_k_segment *s, float sc,
                                                       const dsrt_bf16 *w16) {
    int clamping = isfinite(st->threshold) && st->clip == DSRT_CLIP_ABSOLUTE;
    return s->lr != 0.0f || clamping || sc != 1.0f || w16;
}

/* Element i (of the flat buffers) of segment s: clipping (clamped, or
 * scaled by sc), L2 and the solver's rule, each operation rounded as in
 * nn/optim.c; then the bfloat16 copy. */
static inline DSRT_HOST_DEVICE void dsrt_kb_optim_update(const dsrt_k_step *st,
                                                         const dsrt_k_segment *s, float sc,
                                                         size_t i, float *w, float *g, float *m,
                                                         float *v, dsrt_bf16 *w16) {
    int clamping = isfinite(st->threshold) && st->clip == DSRT_CLIP_ABSOLUTE;
    float t = (float)st->threshold;
    float lr = (float)(st->lr * s->lr), l2 = (float)(st->l2 * s->l2);
    float gi = g[i];
    if (clamping) {
        gi = gi > t ? t : (gi < -t ? -t : gi);
        g[i] = gi;
    } else if (sc != 1.0f) {
        gi = DSRT_FMUL(gi, sc);
        g[i] = gi;
    }
    float wi = w[i];
    if (s->lr != 0.0f) {
        gi = DSRT_FADD(gi, DSRT_FMUL(l2, wi));
        if (st->solver == DSRT_SOLVER_SGDM) {
            float vi = DSRT_FSUB(DSRT_FMUL(st->momentum, m[i]), DSRT_FMUL(lr, gi));
            m[i] = vi;
            wi = DSRT_FADD(wi, vi);
        } else if (st->solver == DSRT_SOLVER_ADAM) {
            float mi =
                DSRT_FADD(DSRT_FMUL(st->decay, m[i]), DSRT_FMUL(DSRT_FSUB(1.0f, st->decay), gi));
            float vi = DSRT_FADD(DSRT_FMUL(st->sq_decay, v[i]),
                                 DSRT_FMUL(DSRT_FMUL(DSRT_FSUB(1.0f, st->sq_decay), gi), gi));
            m[i] = mi;
            v[i] = vi;
            float den = DSRT_FADD(DSRT_FSQRT(DSRT_FMUL(vi, st->c2)), st->eps);
            wi = DSRT_FSUB(wi, DSRT_FDIV(DSRT_FMUL(lr, DSRT_FMUL(mi, st->c1)), den));
        } else {
            float vi = DSRT_FADD(DSRT_FMUL(st->sq_decay, m[i]),
                                 DSRT_FMUL(DSRT_FMUL(DSRT_FSUB(1.0f, st->sq_decay), gi), gi));
            m[i] = vi;
            float den = DSRT_FADD(DSRT_FSQRT(vi), st->eps);
            wi = DSRT_FSUB(wi, DSRT_FDIV(DSRT_FMUL(lr, gi), den));
        }
        w[i] = wi;
    }
    if (w16) w16[i] = dsrt_bf16_from_f32(wi);
}

// ----------------------------------------------------------------------------
// Element-wise products: mul layers (a second input of one shape, or a gate
// of one value an image and channel broadcast over the pixels: squeeze and
// excitation) and scale layers (a factor a channel)

/* b broadcasts over a: a's channels, and along n, h and w a's size or 1. */
static inline int dsrt_kb_mul_ok(const dsrt_k_desc *ad, const dsrt_k_desc *bd) {
    return dsrt_kb_desc_ok(ad) && dsrt_kb_desc_ok(bd) && bd->c == ad->c &&
           (bd->n == ad->n || bd->n == 1) && (bd->h == ad->h || bd->h == 1) &&
           (bd->w == ad->w || bd->w == 1);
}

/* Element i of y (ad) = a[i] times b at the element's place (0 along an
 * axis where b has one), in float, rounded once to ad's type. */
static inline DSRT_HOST_DEVICE void dsrt_kb_mul(const dsrt_k_desc *ad, const void *a,
                                                const dsrt_k_desc *bd, const void *b, void *y,
                                                size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, ad->c, ad->h, ad->w, ad->nhwc);
    if (bd->n == 1) k.b = 0;
    if (bd->h == 1) k.r = 0;
    if (bd->w == 1) k.col = 0;
    float v = dsrt_kb_load(b, bd->type, dsrt_kb_index_of(k, bd->c, bd->h, bd->w, bd->nhwc));
    dsrt_kb_store(y, ad->type, i, DSRT_FMUL(dsrt_kb_load(a, ad->type, i), v));
}

/* A gate's gradient: b (bd) has a's n and c and one pixel. */
static inline int dsrt_kb_mul_grad_ok(const dsrt_k_desc *ad, const dsrt_k_desc *bd) {
    return dsrt_kb_desc_ok(ad) && dsrt_kb_desc_ok(bd) && bd->n == ad->n && bd->c == ad->c &&
           bd->h == 1 && bd->w == 1;
}

/* Lane t's share of element j (image j / c, channel j % c) of the gate's
 * gradient, the sum of dy a over the image's pixels of that channel (dy
 * and a of ad): the pixels t, t + THREADS, ... in double. The lanes are
 * added by the block's tree (dsrt_kb_tree_d). */
static inline DSRT_HOST_DEVICE double dsrt_kb_mul_grad_lane(const dsrt_k_desc *ad, const void *dy,
                                                            const void *a, size_t j, int t) {
    dsrt_kb_coord k;
    k.b = j / (size_t)ad->c;
    k.ch = (int)(j % (size_t)ad->c);
    size_t hw = (size_t)ad->h * ad->w;
    double s = 0.0;
    for (size_t q = (size_t)t; q < hw; q += DSRT_KB_THREADS) {
        k.r = (int)(q / (size_t)ad->w);
        k.col = (int)(q % (size_t)ad->w);
        size_t i = dsrt_kb_index_of(k, ad->c, ad->h, ad->w, ad->nhwc);
        s = DSRT_DADD(s, DSRT_DMUL((double)dsrt_kb_load(dy, ad->type, i),
                                   (double)dsrt_kb_load(a, ad->type, i)));
    }
    return s;
}

// ----------------------------------------------------------------------------
// The gradients of a factor and an offset a channel (scale layers,
// layernorm's gamma and beta): sums over every pixel of every image, in
// batchnorm's tiles (DSRT_KB_BN_*: each lane a compensated float sum, the
// lanes a tree, the tiles' partials, dsrt_kb_bn_work(d) floats, added in
// double in tile order)

static inline int dsrt_kb_chan_grads_ok(const dsrt_k_desc *d, const float *mean,
                                        const float *rstd) {
    return dsrt_kb_desc_ok(d) && !mean == !rstd;
}

/* Lane l's share of tile t of channel ch: the sums of dy and of dy v, v
 * being x, or with per-pixel statistics (mean and rstd, one a row of
 * dsrt_kb_bn_index) (x - mean) rstd, in float. */
static inline DSRT_HOST_DEVICE void dsrt_kb_chan_grads_lane(const dsrt_k_desc *d, const void *x,
                                                            const void *dy, const float *mean,
                                                            const float *rstd, size_t t, int ch,
                                                            int l, float *s, float *q) {
    size_t rows = (size_t)d->n * d->h * d->w, r1 = (t + 1) * DSRT_KB_BN_ROWS;
    if (r1 > rows) r1 = rows;
    float a = 0.0f, ae = 0.0f, b = 0.0f, be = 0.0f;
    for (size_t j = t * DSRT_KB_BN_ROWS + (size_t)l; j < r1; j += DSRT_KB_BN_LANES) {
        size_t i = dsrt_kb_bn_index(d, ch, j);
        float g = dsrt_kb_load(dy, d->type, i), v = dsrt_kb_load(x, d->type, i);
        if (mean) v = DSRT_FMUL(DSRT_FSUB(v, mean[j]), rstd[j]);
        dsrt_kb_kahan(&a, &ae, g);
        dsrt_kb_kahan(&b, &be, DSRT_FMUL(g, v));
    }
    *s = DSRT_FSUB(a, ae);
    *q = DSRT_FSUB(b, be);
}

// ----------------------------------------------------------------------------
// Layer normalisation over the channels of each pixel: n h w rows of c
// values (row j image by image, pixel by pixel; its values at
// dsrt_kb_bn_index), one warp a row, lane l taking the channels l, l + 32,
// ...; the lanes' sums in double, combined by the warp's butterfly (lane l
// adds lane l ^ o, o halving from 16)
//
// Forward: mean = sum x / c, then var = sum (x - mean)^2 / c (a second
// pass), rstd = 1 / sqrt(var + eps); mean and rstd are kept in float, and
// y = (x - mean) rstd gamma + beta is computed from them in double, rounded
// once. Backward from the kept statistics, with g = dy gamma and xhat =
// (x - mean) rstd:
//     dx = rstd (g - sum g / c - xhat sum (g xhat) / c),
// in double, rounded once; the gradients of gamma and beta are the channel
// sums above of dy over xhat.

static inline int dsrt_kb_ln_ok(const dsrt_k_desc *d, const float *gamma, const float *beta) {
    return dsrt_kb_desc_ok(d) && d->c > 0 && gamma && beta;
}

static inline int dsrt_kb_ln_bwd_ok(const dsrt_k_desc *d, const float *gamma, const float *mean,
                                    const float *rstd) {
    return dsrt_kb_desc_ok(d) && d->c > 0 && gamma && mean && rstd;
}

/* Lane l's share of row j: the sum of x (pass 0), or of (x - mean)^2. */
static inline DSRT_HOST_DEVICE double dsrt_kb_ln_lane_sum(const dsrt_k_desc *d, const void *x,
                                                          size_t j, int l, int pass, double mean) {
    double s = 0.0;
    for (int ch = l; ch < d->c; ch += DSRT_KB_WARP) {
        double v = dsrt_kb_load(x, d->type, dsrt_kb_bn_index(d, ch, j));
        if (pass) {
            v = DSRT_DSUB(v, mean);
            v = DSRT_DMUL(v, v);
        }
        s = DSRT_DADD(s, v);
    }
    return s;
}

/* 1 / sqrt(var + eps) from the row's sum of squared deviations q. */
static inline DSRT_HOST_DEVICE float dsrt_kb_ln_rstd(double q, int c, float eps) {
    return (float)(1.0 / sqrt(DSRT_DADD(q / (double)c, (double)eps)));
}

/* Lane l's outputs of row j. */
static inline DSRT_HOST_DEVICE void dsrt_kb_ln_lane_apply(const dsrt_k_desc *d, const void *x,
                                                          const float *gamma, const float *beta,
                                                          float mean, float rstd, void *y, size_t j,
                                                          int l) {
    for (int ch = l; ch < d->c; ch += DSRT_KB_WARP) {
        size_t i = dsrt_kb_bn_index(d, ch, j);
        double xh =
            DSRT_DMUL(DSRT_DSUB((double)dsrt_kb_load(x, d->type, i), (double)mean), (double)rstd);
        double v = DSRT_DADD(DSRT_DMUL(xh, (double)gamma[ch]), (double)beta[ch]);
        dsrt_kb_store(y, d->type, i, (float)v);
    }
}

/* Lane l's share of row j's backward sums: of g (*sg) and of g xhat
 * (*sgx). */
static inline DSRT_HOST_DEVICE void dsrt_kb_ln_lane_bwd(const dsrt_k_desc *d, const void *x,
                                                        const void *dy, const float *gamma,
                                                        float mean, float rstd, size_t j, int l,
                                                        double *sg, double *sgx) {
    double a = 0.0, b = 0.0;
    for (int ch = l; ch < d->c; ch += DSRT_KB_WARP) {
        size_t i = dsrt_kb_bn_index(d, ch, j);
        double g = DSRT_DMUL((double)dsrt_kb_load(dy, d->type, i), (double)gamma[ch]);
        double xh =
            DSRT_DMUL(DSRT_DSUB((double)dsrt_kb_load(x, d->type, i), (double)mean), (double)rstd);
        a = DSRT_DADD(a, g);
        b = DSRT_DADD(b, DSRT_DMUL(g, xh));
    }
    *sg = a;
    *sgx = b;
}

/* Lane l's input gradients of row j, from the row's totals sg and sgx. */
static inline DSRT_HOST_DEVICE void dsrt_kb_ln_lane_dx(const dsrt_k_desc *d, const void *x,
                                                       const void *dy, const float *gamma,
                                                       float mean, float rstd, double sg,
                                                       double sgx, void *dx, size_t j, int l) {
    double ma = sg / (double)d->c, mb = sgx / (double)d->c;
    for (int ch = l; ch < d->c; ch += DSRT_KB_WARP) {
        size_t i = dsrt_kb_bn_index(d, ch, j);
        double g = DSRT_DMUL((double)dsrt_kb_load(dy, d->type, i), (double)gamma[ch]);
        double xh =
            DSRT_DMUL(DSRT_DSUB((double)dsrt_kb_load(x, d->type, i), (double)mean), (double)rstd);
        double v = DSRT_DMUL((double)rstd, DSRT_DSUB(DSRT_DSUB(g, ma), DSRT_DMUL(xh, mb)));
        dsrt_kb_store(dx, d->type, i, (float)v);
    }
}

// ----------------------------------------------------------------------------
// Stochastic depth: every value of an image times the image's factor

static inline int dsrt_kb_drop_path_ok(const dsrt_k_desc *d, float p, int layer) {
    return dsrt_kb_desc_ok(d) && p >= 0.0f && p < 1.0f && layer >= 0;
}

/* Element i of y = x times the factor of its image (nn/arith.h
 * dsrt_drop_path_mask); the image is outermost in either layout. */
static inline DSRT_HOST_DEVICE void dsrt_kb_drop_path(const dsrt_k_desc *d, const void *x, void *y,
                                                      const dsrt_rng *rng, uint32_t threshold,
                                                      float scale, size_t i) {
    size_t b = i / ((size_t)d->c * d->h * d->w);
    float m = dsrt_drop_path_mask(rng, b, threshold, scale);
    dsrt_kb_store(y, d->type, i, DSRT_FMUL(dsrt_kb_load(x, d->type, i), m));
}

#ifdef __cplusplus
}
#endif
#endif

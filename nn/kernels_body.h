/*
 * The arithmetic of dsrt's CUDA kernels that the engine and the layer kinds
 * share, written once for the device and the host: the types the kernels
 * take (tensor descriptors, float32 and bfloat16, the optimizer's plan),
 * loads and stores of either type, the shape of the reductions, and the
 * bodies of the engine's own kernels (nn/kernels.h): padding and cropping,
 * the activations, ReLU, the bias (with an activation) and its gradient, sums of tensors, the
 * broadcast product, per-channel sums in tiles (batchnorm's statistics, the gradients of a factor
 * and an offset a channel) and the optimizer. A layer kind's bodies are beside it, in
 * nn/layers/<kind>_kernels.h. A __global__ kernel wraps its body (grid-stride loops, blocks, warps
 * and shared memory); its run on the host walks the same grid in plain loops over the very same
 * body (nn/kernels.h), so that the kernels' arithmetic runs and is tested on a machine without a
 * GPU, and the CPU stand-in of the GPU (tests/fakegpu.c) computes with it. Only the launch
 * configuration and where memory lives stay device-only.
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
 * Also the argument checks the launchers make. Needs no CUDA header.
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
 * correctly rounded. sub 0, div 255 is x / 255 (DSRT_AUGMENT_NORM_RESCALE).
 * The engine keeps it with each staged batch; the input layer's kernel
 * (nn/layers/input_kernels.h) converts by it. */
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

// ----------------------------------------------------------------------------
// The shape of the reductions

#define DSRT_KB_THREADS     256   /* threads of a block, lanes of a tree reduction */
#define DSRT_KB_WARP        32    /* lanes of a warp butterfly */
#define DSRT_KB_SOFT_WARPS  8     /* rows a block, one warp a row (softmax, layernorm) */
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
// Keyed masks: what the kernels of dropout and stochastic depth take besides
// their tensors (nn/arith.h draws the masks)

/* The masks of layer `layer` at training step `iteration` of a net seeded
 * with `seed` (with iteration_dev, device memory, the step is read from
 * there when the kernel runs), for drop probability p as its threshold and
 * the factor of what is kept (dsrt_dropout_threshold, dsrt_dropout_scale). */
typedef struct {
    uint64_t seed, iteration;
    const uint64_t *iteration_dev;
    int layer;
    uint32_t threshold;
    float scale;
} dsrt_k_mask;

static inline int dsrt_kb_mask_ok(const dsrt_k_desc *d, float p, int layer) {
    return dsrt_kb_desc_ok(d) && p >= 0.0f && p < 1.0f && layer >= 0;
}

static inline dsrt_k_mask dsrt_kb_mask_of(uint64_t seed, uint64_t iteration,
                                          const uint64_t *iteration_dev, int layer, float p) {
    dsrt_k_mask m = {
        seed, iteration, iteration_dev, layer, dsrt_dropout_threshold(p), dsrt_dropout_scale(p)};
    return m;
}

/* The training step the masks are keyed by. */
static inline DSRT_HOST_DEVICE uint64_t dsrt_kb_mask_iteration(const dsrt_k_mask *m) {
    return m->iteration_dev ? *m->iteration_dev : m->iteration;
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
// Activations

static inline int dsrt_kb_type_ok(dsrt_k_type t) {
    return t == DSRT_K_F32 || t == DSRT_K_BF16;
}

/*
 * The activations as PyTorch defines them, in float on the value loaded
 * as float, the result rounded once to the tensor's type: the kernels of
 * the activation kinds (nn/layers/eltwise_kernels.h, with the gradients:
 * PyTorch's conventions where a function has a kink, Hardtanh's and
 * Hardsigmoid's 0 at a bound, Hardswish's x / 3 + 1/2 at -3 and at 3), and
 * the bias kernel of convolutions and fully connected layers, which
 * computes the activation after them at inference. GELU's Phi(x) is erfc(-x / sqrt 2) / 2, which
 * keeps its digits far below zero where 1 + erf(x / sqrt 2) cancels.
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
    DSRT_K_ACT_RELU,        /* x > 0 ? x : x a (a: the leak); dx = dy where x > 0, else dy a */
    DSRT_K_ACT_IDENTITY,    /* x; dx = dy */
    DSRT_K_ACT_COUNT
} dsrt_k_act_fn;

typedef struct {
    int fn;     /* dsrt_k_act_fn */
    float a, b; /* clip: the bounds; hardsigmoid: the slope and the offset; relu: a the leak */
} dsrt_k_act;

#define DSRT_KB_SQRT1_2      0.707106781f /* 1 / sqrt 2 */
#define DSRT_KB_RSQRT_2PI    0.398942280f /* 1 / sqrt(2 pi) */
#define DSRT_KB_SQRT_2_PI    0.797884561f /* sqrt(2 / pi) */
#define DSRT_KB_GELU_KAPPA   0.044715f
#define DSRT_KB_GELU_KAPPA_3 0.134145f /* 3 kappa */

static inline int dsrt_kb_act_fn_ok(const dsrt_k_act *a) {
    return a && a->fn >= 0 && a->fn < DSRT_K_ACT_COUNT;
}

static inline int dsrt_kb_act_ok(dsrt_k_type t, const dsrt_k_act *a) {
    return dsrt_kb_type_ok(t) && dsrt_kb_act_fn_ok(a);
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
    case DSRT_K_ACT_RELU:
        return x > 0.0f ? x : DSRT_FMUL(x, a->a);
    case DSRT_K_ACT_IDENTITY:
        return x;
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

// ----------------------------------------------------------------------------
// ReLU, and the bias of convolutions and fully connected layers

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
 * the bias of its channel (b NULL: none), then the activation a (a ReLU,
 * or at inference any dsrt_k_act_fn), in float and rounded once to d's
 * type. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bias_act(const dsrt_k_desc *d, const void *x,
                                                     const float *b, void *y, const dsrt_k_act *a,
                                                     size_t i) {
    float v = DSRT_FADD(dsrt_kb_load(x, d->type, i), b ? b[dsrt_kb_channel(d, i)] : 0.0f);
    dsrt_kb_store(y, d->type, i, dsrt_kb_act(a, v));
}

/* The same with a residual r added after the activation, then post (r
 * NULL: dsrt_kb_bias_act). */
static inline DSRT_HOST_DEVICE void dsrt_kb_bias_act_sum(const dsrt_k_desc *d, const void *x,
                                                         const float *b, const dsrt_k_act *a,
                                                         const void *r, const dsrt_k_act *post,
                                                         void *y, size_t i) {
    if (!r) {
        dsrt_kb_bias_act(d, x, b, y, a, i);
        return;
    }
    float v = DSRT_FADD(dsrt_kb_load(x, d->type, i), b ? b[dsrt_kb_channel(d, i)] : 0.0f);
    v = DSRT_FADD(dsrt_kb_act(a, v), dsrt_kb_load(r, d->type, i));
    dsrt_kb_store(y, d->type, i, dsrt_kb_act(post, v));
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
// Per-channel sums in tiles: batchnorm's statistics and their gradients,
// the gradients of a factor and an offset a channel (scale, layernorm)

/* Index of element j (0 .. n h w - 1, image by image, pixel by pixel) of
 * channel ch. */
static inline DSRT_HOST_DEVICE size_t dsrt_kb_bn_index(const dsrt_k_desc *d, int ch, size_t j) {
    size_t hw = (size_t)d->h * d->w;
    if (d->nhwc) return j * (size_t)d->c + (size_t)ch;
    return ((j / hw) * (size_t)d->c + (size_t)ch) * hw + j % hw;
}

/*
 * The per-channel sums (batchnorm's of x and x^2 forward and of dy' and dy'
 * xhat backward, a factor's and an offset's gradients) as a tiled
 * reduction: the n h w positions are cut into tiles of
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

/* Tile t's partials of channel ch into part (tiles x 2c) from its lanes'
 * sums vs and vq (LANES each), added by the lanes' tree in place. */
static inline DSRT_HOST_DEVICE void dsrt_kb_tile_part(float *vs, float *vq, float *part, size_t t,
                                                      int c, int ch) {
    for (int h = DSRT_KB_BN_LANES / 2; h > 0; h >>= 1)
        for (int k = 0; k < h; k++) {
            dsrt_kb_tree_f(vs, k, h);
            dsrt_kb_tree_f(vq, k, h);
        }
    part[t * 2 * (size_t)c + (size_t)ch] = vs[0];
    part[t * 2 * (size_t)c + (size_t)c + (size_t)ch] = vq[0];
}

// ----------------------------------------------------------------------------
// Element-wise sums (add layers, gradients of outputs that feed several
// layers)

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
// The broadcast product: mul layers (a second input of one shape, or a gate
// of one value an image and channel broadcast over the pixels: squeeze and
// excitation), scale layers (a factor a channel), and their input
// gradients

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

#ifdef __cplusplus
}
#endif
#endif

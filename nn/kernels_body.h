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

/* Softmax's per-row results, in its workspace. */
typedef struct {
    double loss;
    int32_t correct;
    int32_t pad_;
} dsrt_k_row_result;

// ----------------------------------------------------------------------------
// The shape of the reductions

#define DSRT_KB_THREADS    256   /* threads of a block, lanes of a tree reduction */
#define DSRT_KB_WARP       32    /* lanes of a warp butterfly */
#define DSRT_KB_SOFT_WARPS 8     /* softmax rows a block (one warp a row) */
#define DSRT_KB_BIAS_COLS  32    /* bias gradient: columns a block */
#define DSRT_KB_BIAS_LANES 8     /* ... and row lanes a column */
#define DSRT_KB_OPT_CHUNK  4096u /* optimizer: elements of one block */

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

/* Element i of the fully connected output (n, out): x + b, then the ReLU. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bias_act(const float *x, const float *b, float *y,
                                                     int out, int relu, float leak, size_t i) {
    float v = DSRT_FADD(x[i], b ? b[i % out] : 0.0f);
    if (relu && v < 0.0f) v = DSRT_FMUL(v, leak);
    y[i] = v;
}

/* Lane `lane` of column col's sum: rows lane, lane + LANES, ... */
static inline DSRT_HOST_DEVICE float dsrt_kb_bias_grad_lane(const float *dy, int n, int out,
                                                            int col, int lane) {
    float s = 0.0f;
    for (int r = lane; r < n; r += DSRT_KB_BIAS_LANES) s = DSRT_FADD(s, dy[(size_t)r * out + col]);
    return s;
}

/* The column's sum from its lanes' (LANES floats), added in lane order. */
static inline DSRT_HOST_DEVICE float dsrt_kb_bias_grad_total(const float *lanes) {
    float t = lanes[0];
    for (int k = 1; k < DSRT_KB_BIAS_LANES; k++) t = DSRT_FADD(t, lanes[k]);
    return t;
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

static inline int dsrt_kb_softmax_fwd_ok(int n, int k, const int32_t *labels, const void *work) {
    return n >= 0 && k > 0 && (!labels || work);
}

static inline size_t dsrt_kb_softmax_work(int n) {
    return (size_t)(n > 0 ? n : 1) * sizeof(dsrt_k_row_result);
}

/* Lane `lane`: the first of its largest logits (NaN never compares larger). */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_lane_max(const float *zr, int k, int lane,
                                                        float *best, int *arg) {
    float b = -INFINITY;
    int a = 0x7fffffff;
    for (int j = lane; j < k; j += DSRT_KB_WARP) {
        float v = zr[j];
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
static inline DSRT_HOST_DEVICE float dsrt_kb_sm_row_max(const float *zr, float best, int *arg) {
    float mx = zr[0];
    if (mx == mx) return best;
    *arg = 0;
    return mx;
}

/* Lane `lane`'s share of the sum of exp(z - max), in double. */
static inline DSRT_HOST_DEVICE double dsrt_kb_sm_lane_sumexp(const float *zr, int k, int lane,
                                                             double dm) {
    double s = 0.0;
    for (int j = lane; j < k; j += DSRT_KB_WARP) s = DSRT_DADD(s, exp((double)zr[j] - dm));
    return s;
}

/* Lane `lane`'s probabilities: exp(z - max) / sum, rounded to float. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_lane_store(const float *zr, float *pr, int k,
                                                          int lane, double dm, double inv) {
    for (int j = lane; j < k; j += DSRT_KB_WARP)
        pr[j] = (float)DSRT_DMUL(exp((double)zr[j] - dm), inv);
}

/* The row's loss and whether its first maximum is its label. A label out of
 * range or a maximum that is not finite gives NaN. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_row_result(const float *zr, int32_t label, int k,
                                                          float mx, double sum, int arg,
                                                          dsrt_k_row_result *res) {
    double l = NAN;
    if (label >= 0 && label < k && isfinite(mx))
        l = DSRT_DSUB(log(sum), (double)zr[label] - (double)mx);
    res->loss = l;
    res->correct = arg == label;
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

static inline int dsrt_kb_softmax_bwd_ok(int n, int k, const int32_t *labels) {
    return n >= 0 && k > 0 && labels;
}

/* Element i of dz = (probs - onehot) * scale, rounded as the CPU backend. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_bwd(const float *probs, const int32_t *labels, int k,
                                                   float scale, float *dz, size_t i) {
    float d = DSRT_FMUL(probs[i], scale);
    if ((int)(i % k) == labels[i / k]) d = DSRT_FSUB(d, scale);
    dz[i] = d;
}

// ----------------------------------------------------------------------------
// Synchronised batch normalisation: one block a channel

static inline int dsrt_kb_bn_ok(int n, int c, int hw) {
    return n >= 0 && c >= 0 && hw >= 0;
}

/* Thread t's share of channel ch's sums of x and x^2 over NCHW x. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_sums_part(const float *x, int n, int c, int hw,
                                                         int ch, int t, double *s, double *q) {
    size_t per = (size_t)n * hw;
    double a = 0.0, b = 0.0;
    for (size_t j = (size_t)t; j < per; j += DSRT_KB_THREADS) {
        double v = x[((j / hw) * c + ch) * hw + j % hw];
        a = DSRT_DADD(a, v);
        b = DSRT_DADD(b, DSRT_DMUL(v, v));
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

/* Thread t's share of channel ch's backward sums: dy, and dy * xhat. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_bwd_part(const float *x, const float *dy, double mu,
                                                        double is, int n, int c, int hw, int ch,
                                                        int t, double *s, double *q) {
    size_t per = (size_t)n * hw;
    double a = 0.0, b = 0.0;
    for (size_t j = (size_t)t; j < per; j += DSRT_KB_THREADS) {
        size_t i = ((j / hw) * c + ch) * hw + j % hw;
        double d = dy[i];
        a = DSRT_DADD(a, d);
        b = DSRT_DADD(b, DSRT_DMUL(d, DSRT_DMUL((double)x[i] - mu, is)));
    }
    *s = a;
    *q = b;
}

/* Element i of the input gradient with the global terms:
 * a dy - a S1 / M - (x - mean) a inv S2 / M, a = scale * inv. */
static inline DSRT_HOST_DEVICE void dsrt_kb_bn_bwd_dx(const float *x, const float *dy,
                                                      const float *mean, const float *inv,
                                                      const float *scale, const double *sums,
                                                      double inv_m, int c, int hw, float *dx,
                                                      size_t i) {
    int ch = (int)((i / hw) % c);
    double is = inv[ch], a = DSRT_DMUL((double)scale[ch], is);
    double k1 = DSRT_DMUL(DSRT_DMUL(a, sums[ch]), inv_m);
    double k2 = DSRT_DMUL(DSRT_DMUL(DSRT_DMUL(a, sums[c + ch]), inv_m), is);
    dx[i] = (float)DSRT_DSUB(DSRT_DSUB(DSRT_DMUL(a, (double)dy[i]), k1),
                             DSRT_DMUL((double)x[i] - (double)mean[ch], k2));
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

#ifdef __cplusplus
}
#endif
#endif

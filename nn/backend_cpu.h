/*
 * The CPU backend's engine, as the layer kinds see it: a plan (one for each
 * batch size, training and inference apart) is two lists of steps, forward
 * and backward, each a oneDNN primitive with its arguments or a small C
 * function; every layer adds its steps through its kind's cpu_plan
 * (nn/layers/<kind>.c) with the helpers below, which make memories and
 * primitives owned by the plan, put gradients in the plan's pool, add
 * reorders where a primitive wants another layout, and sum a gradient's
 * parts where an output feeds several layers. backend_cpu.c runs the
 * plans; it knows no layer kind.
 */
#ifndef DSRT_NN_BACKEND_CPU_H
#define DSRT_NN_BACKEND_CPU_H

#include "nn/internal.h"

#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct dsrt_cpu_backend cpu_backend;
typedef struct dsrt_cpu_plan cpu_plan;

typedef enum {
    STEP_ALWAYS = 0,
    STEP_WEIGHTS, /* a weight reorder: runs only when the parameters changed */
} step_kind;

typedef struct {
    dnnl_primitive_t prim; /* NULL: fn, and with fn NULL too a copy of the */
                           /* FROM argument into TO, the same layout (copy_step) */
    int (*fn)(cpu_backend *be, cpu_plan *p, int layer);
    int layer;
    step_kind kind;
    uint64_t *cache; /* STEP_WEIGHTS: the version the copy was made from */
    int nargs;
    dnnl_exec_arg_t args[DSRT_INPUTS_MAX + 8];
} step;

typedef struct {
    dnnl_memory_desc_t md;
    dnnl_memory_t mem;  /* the layer's output */
    dnnl_memory_t diff; /* gradient of the loss with respect to it (training) */
} tensor;

typedef struct {
    tensor out;
    dnnl_memory_t src;                     /* what the main primitive read (after a reorder) */
    uint64_t w_fwd_version, w_bwd_version; /* weights reordered for forward, backward */
    /* What the kind keeps of its own (dropout's masks, batchnorm's
     * statistics), freed with the plan by own_free (NULL: free). */
    void *own;
    void (*own_free)(void *own);
    /* Training: an output left unwritten because its one taker normalises
     * src on its way in (a batchnorm before an add): the output is
     * (src - mean) scale + shift a channel in the layout v, the factors
     * made by the layer's forward; write_out writes it where another
     * reader needs it. NULL: the output is written. */
    const struct cpu_affine *defer;
    const struct cpu_chans *defer_v;
    void (*write_out)(cpu_backend *be, cpu_plan *p, int layer);
} layer_plan;

/*
 * A gradient tensor of a plan. Layer i's output gradient lives from the
 * backward of the last layer taking that output, which writes it first, to
 * layer i's own backward, which reads it last (the gradient an add shares
 * with its inputs: over all of their lives); a scratch tensor that sums one
 * part of a gradient lives within one layer's backward. Tensors whose lives
 * do not overlap take the same bytes of the plan's pool, so a deep net's
 * backward holds a few layers' gradients at a time, not one for every layer.
 * The memories are made without a buffer and given their bytes when the
 * plan is complete (diff_pool_make). A view (the same bytes in another
 * shape, or a part of them) takes its base's bytes.
 */
typedef struct {
    dnnl_memory_t mem;
    int base;            /* the entry whose bytes it takes: itself for a tensor of its own */
    int lo, hi;          /* its life, in layers (a base's: over every view of it) */
    size_t size, offset; /* bytes, and where they start in the pool (bases) */
} diff_entry;

/*
 * Inference: what a layer that computes the layers after it (DSRT_LAYER_
 * F_POSTOPS: convolution, fully connected) takes on in an inference plan.
 * Along its output's one taker after another: a per-channel affine map right
 * after it (batchnorm, scale: infer_affine), folded into its weights and
 * bias; element-wise functions (activations and the ReLUs layers compute:
 * infer_act), as oneDNN eltwise post-ops; the sum of an add of two inputs
 * whose other input is computed before it (DSRT_LAYER_F_SUM), as a sum
 * post-op on an output that holds that input first (the input's own bytes
 * when no later layer reads them, else a copy), then the add's ReLU. The
 * layers taken on run no steps: their output is this layer's.
 */
#define CPU_FUSE_OPS 8
typedef struct {
    int affine; /* the layer folded into the weights and bias, or -1 */
    int sum;    /* the add's other input, or -1 */
    int last;   /* the last layer taken on: this layer's output is its */
    int n_ops;  /* post-ops, in order */
    struct {
        int sum; /* 1: the sum; 0: act */
        dsrt_act act;
    } ops[CPU_FUSE_OPS];
    /* The folded weights and bias (plain, the layer's shapes), remade from
     * the parameters and state when they change (version). */
    float *w, *b;
    uint64_t version;
} cpu_fusion;

struct dsrt_cpu_plan {
    int n, train;
    /* An inference plan of the full fusion (net option fuse 2): the layers'
     * outputs and the temporaries their steps read take bytes of one pool,
     * shared by tensors whose lives do not overlap (the gradients' pool,
     * diff_entry, holds them: an inference plan has no gradient). A
     * tensor lives from the layer whose step writes it to the last step
     * that reads it, so a deep net's forward holds a few layers' outputs at
     * a time. Training plans keep every output (backward reads them). */
    int pool_acts;
    int bn_sync; /* built for synchronised batchnorm (net->bn_sync_fn set) */
    int n_layers;
    uint64_t used; /* for least-recently-used eviction */
    layer_plan *lp;
    step *fwd, *bwd;
    size_t n_fwd, cap_fwd, n_bwd, cap_bwd;
    /* Everything created for the plan, destroyed with it. */
    dnnl_memory_t *mems;
    size_t n_mems, cap_mems;
    dnnl_primitive_t *prims;
    size_t n_prims, cap_prims;
    dnnl_memory_t *scratch_mems; /* share one buffer */
    size_t n_scratch, cap_scratch;
    void *scratch;
    size_t scratch_size;
    /* (n_layers) the last layer (in the written order) that takes layer j's
     * output: backward runs last to first, so it writes j's gradient first
     * and the others add theirs (grad_target). */
    int *last_use;
    /* (n_layers) the gradient of a layer whose inputs may share it
     * (DSRT_LAYER_F_GRAD_PASSES, net.c's grad_share), made for the first of
     * them, which take its buffer when their layout is the same. */
    dnnl_memory_t *share;
    /* The gradients of the layers' outputs and the scratch tensors that sum
     * a gradient's parts (diff_new): one pool of bytes. */
    diff_entry *diffs;
    size_t n_diffs, cap_diffs;
    void *diff_pool;
    size_t diff_pool_size;
    /* Inference (net option fuse): (n_layers) each layer's fusion (NULL:
     * none), and the layer whose fusion computes it (-1: itself). */
    cpu_fusion **fuse;
    int *taken_by;
    /* The input layer's memory that is the caller's batch itself (its
     * handle set at each forward), or NULL when the input layer copies it. */
    dnnl_memory_t batch;
    /* The classification output: probabilities (n, classes), the batch's
     * labels or soft targets (n, classes; NULL: one-hot labels), and the
     * loss and correct count of the last forward. */
    float *probs;
    const int32_t *labels;
    const float *soft;
    double loss;
    int correct;
};

typedef enum { LAYOUT_AUTO = 0, LAYOUT_BLOCKED, LAYOUT_NHWC } layout_mode;

/* The vector instructions of dsrt's own C steps: the best this CPU has,
 * capped by the environment variable DSRT_MAX_CPU_ISA (scalar, avx2 or
 * avx512, as for augmentation). */
typedef enum { CPU_ISA_BASE = 0, CPU_ISA_AVX2, CPU_ISA_AVX512, CPU_ISA_COUNT } cpu_isa;

struct dsrt_cpu_backend {
    dsrt_net *net;
    int block;          /* channel block of oneDNN's blocked layouts: 16 (AVX-512) or 8 */
    layout_mode layout; /* of convolutions */
    dnnl_alg_kind_t conv_alg;
    int depthwise; /* depthwise weight gradients may take dsrt's C step */
    int pointwise; /* 1x1 convolutions' weight gradients may take dsrt's own kernel */
    int pw_taps;   /* and larger filters', a tap at a time */
    int batchnorm; /* a batchnorm before an add may leave its output to the add */
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    cpu_plan *plans[4];
    cpu_plan *last_train, *last_infer;
    uint64_t clock;
    const float *x;   /* the batch of the current forward */
    cpu_plan *last;   /* the plan of the last forward */
    float grad_scale; /* 1 / images the loss gradient is averaged over */
    float *xbuf;      /* uint8 batches converted to float */
    size_t xbuf_n;
    pthread_t team_master; /* the thread whose OpenMP team holds signals, */
    int team_held;         /* and that team's size (0: none yet) */
    cpu_isa isa;           /* the instructions dsrt's own C steps use */
    float *wino_scratch;   /* Winograd convolutions' (backend_cpu_winograd.c) */
    int wino_tile;         /* their output tile: 2, 4, or 0 (the default) */
    size_t wino_scratch_n;
    /* Inference in pieces (micro_batch): the images a piece, 0 until
     * worked out; the last forward's results when it ran in pieces. */
    int micro;
    int pieces, piece_n;
    /* Dense nets' inference in two segments (forward_segments): allowed,
     * and the cut and piece worked out for batches of seg_n. */
    int segments, seg_n, seg_cut, seg_m;
    int seg_cut_run; /* the last inference's cut, or -1: it ran whole */
    double piece_loss;
    int piece_correct;
    float *piece_probs;
    size_t piece_probs_n;
};

// ----------------------------------------------------------------------------
// Failing

/* DSRT_EBACKEND with oneDNN's status, naming the layer (may be NULL). */
int dsrt__cpu_fail(dnnl_status_t st, const char *what, const dsrt_layer *l);

/* Returns from the calling function with the failure of a oneDNN call;
 * `L` (the layer being planned, or NULL) names it in the message. */
#define DN(what, call)                                                                             \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) return dsrt__cpu_fail(st_, what, L);                              \
    } while (0)

// ----------------------------------------------------------------------------
// Steps, memories, primitives

/* Adds an argument to a step; a NULL memory (no bias, no workspace) is left
 * out. */
void dsrt__cpu_arg(step *s, int what, dnnl_memory_t m);
/* A step running fn (a C function) in layer's forward or backward. */
int dsrt__cpu_c_step(cpu_plan *p, int backward, int (*fn)(cpu_backend *, cpu_plan *, int),
                     int layer);
/* A memory of md: on handle (the flat buffers, user data), or allocated by
 * oneDNN when handle is NULL. Owned by the plan. */
int dsrt__cpu_mem(cpu_plan *p, const dnnl_memory_desc_t *md, dnnl_engine_t eng, void *handle,
                  dnnl_memory_t *out, const dsrt_layer *L);
const dnnl_memory_desc_t *dsrt__cpu_md_of(dnnl_memory_t m);
void *dsrt__cpu_handle(dnnl_memory_t m);
/* Plain row-major, and "any" (the primitive chooses), f32 descriptors; the
 * same logical tensor as md in plain layout. Return 0 or DSRT_EBACKEND. */
int dsrt__cpu_md_plain(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims);
int dsrt__cpu_md_any(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims);
int dsrt__cpu_md_plain_like(dnnl_memory_desc_t *out, const dnnl_memory_desc_t *md);
/* Whether md is the layout tag of its dims. */
int dsrt__cpu_md_is(const dnnl_memory_desc_t *md, dnnl_format_tag_t tag);
/* A primitive descriptor from an op descriptor with the plan's attributes:
 * the user scratchpad, and a ReLU (leak) post-op when relu is set. */
int dsrt__cpu_pd(dnnl_primitive_desc_t *pd, const void *desc, cpu_backend *be, int relu, float leak,
                 const_dnnl_primitive_desc_t hint, const char *what, const dsrt_layer *L);
/* The attributes dsrt__cpu_pd uses (destroy them after use). */
int dsrt__cpu_attr(dnnl_primitive_attr_t *attr, int relu, float leak, const dsrt_layer *L);
/* A step running pd's primitive (pd stays the caller's); the caller adds
 * the arguments. */
int dsrt__cpu_prim_step(cpu_plan *p, cpu_backend *be, const_dnnl_primitive_desc_t pd, int backward,
                        int layer, step **out, const dsrt_layer *L);
/* A reorder step from one memory to another. */
int dsrt__cpu_reorder_step(cpu_plan *p, cpu_backend *be, dnnl_memory_t from, dnnl_memory_t to,
                           int backward, int layer, step_kind kind, uint64_t *cache,
                           const dsrt_layer *L);
/* have in the layout want: have itself, or a new memory filled by a reorder
 * step added now. */
int dsrt__cpu_ensure(cpu_plan *p, cpu_backend *be, dnnl_memory_t have,
                     const dnnl_memory_desc_t *want, int backward, int layer, dnnl_memory_t *out,
                     const dsrt_layer *L);
/* Where a primitive producing layout `made` should write so that the result
 * lands in target: target itself, or a temporary (*tmp) that the caller
 * reorders into target after the primitive's step. */
int dsrt__cpu_deliver(cpu_plan *p, cpu_backend *be, dnnl_memory_t target,
                      const dnnl_memory_desc_t *made, dnnl_memory_t *out, dnnl_memory_t *tmp,
                      const dsrt_layer *L);

// ----------------------------------------------------------------------------
// Outputs and gradients

/* The output tensor of layer i in layout md, and its gradient buffer when
 * backward needs it. In an inference plan that pools activations its bytes
 * are given when the plan is complete: a layer that writes its output while
 * planning (pad's border) takes dsrt__cpu_output_kept instead, whose bytes
 * are its own. */
int dsrt__cpu_output(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *md);
int dsrt__cpu_output_kept(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *md);
/* A memory of md on the same bytes as `of` (from their start): of's handle,
 * or, when of's bytes come from the plan's pool, a view given them with
 * of's. */
int dsrt__cpu_view(cpu_plan *p, cpu_backend *be, const dnnl_memory_desc_t *md, dnnl_memory_t of,
                   dnnl_memory_t *out, const dsrt_layer *L);
/* 1 when memory m takes its bytes from the plan's pool. */
int dsrt__cpu_pooled(const cpu_plan *p, dnnl_memory_t m);
/* A gradient memory in layout md (bytes from the plan's pool), alive from
 * layer lo's backward to layer hi's; or, with on, a view of on's bytes. */
int dsrt__cpu_diff(cpu_plan *p, dnnl_engine_t eng, const dnnl_memory_desc_t *md, int lo, int hi,
                   dnnl_memory_t on, dnnl_memory_t *out, const dsrt_layer *L);
/* 1 when gradient memories a and b take the same bytes. */
int dsrt__cpu_diff_same(const cpu_plan *p, dnnl_memory_t a, dnnl_memory_t b);
/*
 * Where layer i's backward writes the gradient for its k-th input (in that
 * input's gradient layout): the gradient itself when layer i is the last
 * layer written that takes the input (backward runs last to first, so it
 * writes first), else a scratch tensor (*acc) that dsrt__cpu_grad_add then
 * adds into the gradient: a layer whose output feeds several gets the sum of
 * theirs. _of: for the input tensor `in` (a view of the input).
 */
int dsrt__cpu_grad_target(cpu_backend *be, cpu_plan *p, int i, int k, dnnl_memory_t *out,
                          dnnl_memory_t *acc);
int dsrt__cpu_grad_target_of(cpu_backend *be, cpu_plan *p, int i, int k, const tensor *in,
                             dnnl_memory_t *out, dnnl_memory_t *acc);
/* diff += acc (when the target was a scratch tensor), in layer i's backward. */
int dsrt__cpu_grad_add(cpu_backend *be, cpu_plan *p, int i, dnnl_memory_t diff, dnnl_memory_t acc);
/* Layer L's k-th input as a 4-d tensor (n, c, h, w): the tensor itself, or
 * a fully connected layer's (n, c) output seen as (n, c, 1, 1). */
int dsrt__cpu_input4(cpu_backend *be, cpu_plan *p, const dsrt_layer *L, int k, tensor *out);
/* Backward of a ReLU the layer computes (fuse_relu): in place on its output
 * gradient. */
int dsrt__cpu_fused_relu_bwd(cpu_backend *be, cpu_plan *p, int i);
/* A step telling the net that layer i's gradients are complete. */
int dsrt__cpu_ready_step(cpu_plan *p, int i);

// ----------------------------------------------------------------------------
// Layers with weights (convolution, fully connected)

/* Inference: layer i's fusion (NULL: none, or a training plan). */
static inline const cpu_fusion *dsrt__cpu_fusion(const cpu_plan *p, int i) {
    return p->fuse ? p->fuse[i] : NULL;
}
/* The primitive descriptor of layer i's forward from desc: with its fusion's
 * post-ops, else with the ReLU it computes (fuse_relu). */
int dsrt__cpu_pd_fused(dnnl_primitive_desc_t *pd, const void *desc, cpu_backend *be, cpu_plan *p,
                       int i, const char *what);
/* Layer i's weights (w_plain: their plain descriptor) and bias (b_md; *b
 * NULL when the layer has none and no fusion gives it one) as forward takes
 * them: the net's, or with a fused affine map the folded copies, remade by
 * a step when the parameters changed. */
int dsrt__cpu_fused_params(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *w_plain,
                           const dnnl_memory_desc_t *b_md, dnnl_memory_t *w, dnnl_memory_t *b);
/* Layer i's output in layout md (dsrt__cpu_output), with a fused sum: the
 * add's other input's bytes, or a copy of it made by a step added now (so
 * call it right before the forward step). */
int dsrt__cpu_fused_output(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *md);

/* Weights plain in the flat buffer (wplain, of descriptor plain), in layout
 * want for a primitive: wplain itself, or a copy made by a cached reorder
 * step (it runs when the parameters changed since *cache). */
int dsrt__cpu_weights_for(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *plain,
                          const dnnl_memory_desc_t *want, dnnl_memory_t wplain, int backward,
                          uint64_t *cache, dnnl_memory_t *out);
/* The weights' (and bias's) gradient, once the backward-weights primitive
 * bpd is made: written into the net's gradients, then the layer's
 * gradients are ready. ensure_ddst: the output gradient is reordered to
 * the layout bpd wants. Destroys bpd. */
int dsrt__cpu_weights_grad(cpu_backend *be, cpu_plan *p, int i, dnnl_primitive_desc_t bpd,
                           const dnnl_memory_desc_t *w_plain, const dnnl_memory_desc_t *b_md,
                           int ensure_ddst);
/* The input's gradient, once the backward-data primitive bpd is made: the
 * weights as forward took them (wfwd) when bpd wants that layout, else
 * reordered from wplain; the result added into the input's gradient.
 * Destroys bpd. */
int dsrt__cpu_data_grad(cpu_backend *be, cpu_plan *p, int i, dnnl_primitive_desc_t bpd,
                        const dnnl_memory_desc_t *w_plain, dnnl_memory_t wplain, dnnl_memory_t wfwd,
                        int ensure_ddst);

// ----------------------------------------------------------------------------
// Layers of one primitive each way (activations, pooling, LRN)

/* The op descriptor of such a layer. */
typedef union {
    dnnl_eltwise_desc_t eltwise;
    dnnl_pooling_v2_desc_t pool;
    dnnl_lrn_desc_t lrn;
} dsrt_cpu_op_desc;

/* Its backward: how its descriptor is made once the forward chose the
 * output layout (dst), and which forward tensors it reads. */
typedef struct {
    const char *what;
    dnnl_status_t (*init)(dsrt_cpu_op_desc *bd, const dsrt_layer *L, const dnnl_memory_desc_t *src,
                          const dnnl_memory_desc_t *dst);
    int reads_src, reads_dst;
} dsrt_cpu_one_backward;

/* One primitive forward (descriptor fd) into a new output in the layout it
 * chooses, with its workspace when training, and one backward into the
 * input's gradient when that is needed. */
int dsrt__cpu_one_primitive(cpu_backend *be, cpu_plan *p, int i, const dsrt_cpu_op_desc *fd,
                            const dsrt_cpu_one_backward *b);

// ----------------------------------------------------------------------------
// dsrt's own C steps (backend_cpu_kernels.c)
//
// A kind's C step does its arithmetic in the layout its tensors have, on the
// OpenMP team oneDNN computes on, with the helpers below. Every sum is taken
// in an order that does not depend on the number of threads, so a result is
// the same bits whatever the team's size.

/* The loop body of a C step compiled for each instruction set: fn (a
 * static inline function of (void *ctx, size_t lo, size_t hi)) as fn_isa[],
 * indexed by cpu_isa, for dsrt__cpu_parallel. The loops inside fn are
 * vectorised by the compiler for each. */
#if defined(__x86_64__) && defined(__clang__)
#define DSRT_CPU_AVX2   __attribute__((target("avx2,fma")))
#define DSRT_CPU_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw")))
#elif defined(__x86_64__) && defined(__GNUC__)
#define DSRT_CPU_AVX2 __attribute__((target("avx2,fma")))
#define DSRT_CPU_AVX512                                                                            \
    __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512")))
#else
#define DSRT_CPU_AVX2
#define DSRT_CPU_AVX512
#endif
#define DSRT_CPU_ISA_VARIANTS(fn)                                                                  \
    static void fn##_base(void *c, size_t lo, size_t hi) {                                         \
        fn(c, lo, hi);                                                                             \
    }                                                                                              \
    static DSRT_CPU_AVX2 void fn##_avx2(void *c, size_t lo, size_t hi) {                           \
        fn(c, lo, hi);                                                                             \
    }                                                                                              \
    static DSRT_CPU_AVX512 void fn##_avx512(void *c, size_t lo, size_t hi) {                       \
        fn(c, lo, hi);                                                                             \
    }                                                                                              \
    static void (*const fn##_isa[CPU_ISA_COUNT])(void *, size_t, size_t) = {fn##_base, fn##_avx2,  \
                                                                            fn##_avx512}
#define DSRT_CPU_INLINE static inline __attribute__((always_inline))

/* Threads of the OpenMP team the net computes on. */
int dsrt__cpu_team(const cpu_backend *be);

/* fn(ctx, lo, hi) over [0, n) cut into one contiguous range a thread of the
 * OpenMP team oneDNN runs on (the whole range on the calling thread without
 * OpenMP, or when n is 1). fn must not depend on how the range is cut. */
void dsrt__cpu_parallel(cpu_backend *be, size_t n, void (*fn)(void *ctx, size_t lo, size_t hi),
                        void *ctx);

/*
 * A 4-d tensor (n, c, h, w) in one of the dense layouts oneDNN's primitives
 * use, seen as (n, blocks, pixels, inner): channel b * inner + k of image i
 * at pixel p is the float at i * s_n + b * s_b + p * inner + k. NCHW has
 * c blocks of 1, NHWC one block of c, nChw8c and nChw16c blocks of 8 or 16
 * (the last one's channels past c padding, zero). An image of one pixel is
 * seen as NHWC whatever its tag.
 */
typedef struct cpu_chans {
    size_t n, blocks, hw, inner, s_n, s_b;
    size_t c;
} cpu_chans;

/* Whether md is such a layout (then *v describes it). */
int dsrt__cpu_chans(const dnnl_memory_desc_t *md, cpu_chans *v);
/* Whether md keeps value (i, ch) of an (n, c, 1, 1) tensor at i * c + ch. */
int dsrt__cpu_is_nc(const dnnl_memory_desc_t *md);
/* y = x f[i * f_n + ch] on each image i and channel ch (f_n = c: one
 * factor an image and channel; 0: one a channel, the same for every image),
 * padded channels 0. x and y share the layout v. */
void dsrt__cpu_mul_chans(cpu_backend *be, const cpu_chans *v, const float *x, const float *f,
                         size_t f_n, float *y);
/* out[i * c + ch] (per_image) or out[ch] = the sum of a b over the pixels
 * (and the images, image by image), each channel in double in one order. */
void dsrt__cpu_dot_chans(cpu_backend *be, const cpu_chans *v, const float *a, const float *b,
                         int per_image, float *out);
/* y = a b, n floats. */
void dsrt__cpu_mul(cpu_backend *be, size_t n, const float *a, const float *b, float *y);
/* y = x m[r] on each of rows ranges of per floats. */
void dsrt__cpu_mul_rows(cpu_backend *be, size_t rows, size_t per, const float *x, const float *m,
                        float *y);

/* Whether dsrt__cpu_stats and dsrt__cpu_affine_sum take layout v: channels
 * in runs of 8 or 16 (oneDNN's channel blocks, NHWC of 8 or 16 channels). */
int dsrt__cpu_stats_usable(const cpu_chans *v);
/* The mean and the biased variance of each channel of x (layout v) over the
 * images and pixels, in one pass (each channel's values less its first, in
 * floats over runs of pixels, then doubles); part: n blocks 2 inner
 * doubles of scratch. Padded channels are left alone. */
void dsrt__cpu_stats(cpu_backend *be, const cpu_chans *v, const float *x, double *part, float *mean,
                     float *var);
/* A tensor normalised a channel: (x - mean) scale + shift, mean, scale and
 * shift padded to the blocks with zeros (an input as it is: 0, 1, 0). */
typedef struct cpu_affine {
    const float *x, *mean, *scale, *shift;
} cpu_affine;
/* Layer plan lp's deferred output (layer_plan.defer) as such an input: its
 * factors over the layer's input as it is now. */
static inline cpu_affine dsrt__cpu_deferred(const layer_plan *lp) {
    cpu_affine a = *lp->defer;
    a.x = dsrt__cpu_handle(lp->src);
    return a;
}
/* z = the sum of n (1 or 2) such inputs, all in layout v, then a ReLU (slope
 * leak below 0) when relu is set. */
void dsrt__cpu_affine_sum(cpu_backend *be, const cpu_chans *v, int n, const cpu_affine *in,
                          float *z, int relu, float leak);

// ----------------------------------------------------------------------------
// Winograd convolutions F(m x m, 3x3), m = 2 or 4 (backend_cpu_winograd.c):
// 3x3, stride 1, padding 1, where oneDNN has no Winograd for training

/* Whether the convolution of c input and k output channels at h x w is
 * faster here by Winograd: AVX2 without AVX-512; both counts multiples of
 * 16 from 32 (the backward pass swaps them), at most 512 x 512, and 49
 * pixels or more. */
int dsrt__wino_usable(const cpu_backend *be, int c, int k, int h, int w);
/* The output tile m (2 or 4) it runs with. */
int dsrt__wino_tile(const cpu_backend *be);
/* Floats of the scratch dsrt__wino_conv takes (every thread's). */
size_t dsrt__wino_scratch_floats(const cpu_backend *be, int m, int c, int k);
/* The transformed filters u ((m + 2)^2 x c x k floats) of w (k, c, 3, 3);
 * with backward, those of the input's gradient (its filters turned 180
 * degrees, input and output channels swapped: (m + 2)^2 x k x c); on the
 * OpenMP team. */
void dsrt__wino_weights(cpu_backend *be, const float *w, int m, int k, int c, int backward,
                        float *u);
/* What follows the sums into y: a ReLU (slope leak below 0), the value y
 * held before (a residual's sum), another ReLU, each when set. */
typedef struct {
    int relu, sum, relu2;
    float leak, leak2;
} wino_epilogue;

/* y (n, k, h, w) = the convolution of x (n, c, h, w) by the filters u
 * transforms, plus bias (k floats, or NULL), through e; on the OpenMP
 * team. x and y in the layouts xl and yl, whose runs of channels (inner)
 * are multiples of 8. */
void dsrt__wino_conv(cpu_backend *be, int m, const float *x, const cpu_chans *xl, const float *u,
                     const float *bias, float *y, const cpu_chans *yl, int n, int h, int w, int c,
                     int k, const wino_epilogue *e, float *scratch);
/* Floats of the scratch dsrt__wino_weights_grad takes. */
size_t dsrt__wino_wgrad_floats(int m, int c, int k);
/* dw (k, c, 3, 3) and db (k floats, or NULL) of that convolution: its input
 * x (layout xl) and its output's gradient dy (layout yl); on the team. */
void dsrt__wino_weights_grad(cpu_backend *be, int m, const float *x, const cpu_chans *xl,
                             const float *dy, const cpu_chans *yl, int n, int h, int w, int c,
                             int k, float *dw, float *db, float *scratch);

// ----------------------------------------------------------------------------
// The weights' gradient of pointwise (1x1) convolutions
// (backend_cpu_pointwise.c): any stride, no padding or dilation, ungrouped

/* Whether it runs here for c input channels: AVX2 without AVX-512, c a
 * multiple of 16. */
int dsrt__pw_wgrad_usable(const cpu_backend *be, int c);
/* dw (k, c) and db (k floats, or NULL) of the convolution of x (n, c, ., iw)
 * at strides sh x sw whose output's gradient dy is (n, k, oh, ow); x and dy
 * in the layouts xl and yl, xl's runs of channels multiples of 8; on the
 * OpenMP team. */
void dsrt__pw_weights_grad(cpu_backend *be, const float *x, const cpu_chans *xl, const float *dy,
                           const cpu_chans *yl, int n, int oh, int ow, int iw, int sh, int sw,
                           int c, int k, float *dw, float *db);
/* A convolution of kh x kw filters (padding pt, pl; no dilation; ungrouped)
 * of x (n, c, ih, iw) into dy's (n, k, oh, ow). */
typedef struct {
    int n, c, k, ih, iw, oh, ow, kh, kw, sh, sw, pt, pl;
} pw_taps;
/* Its weights' gradient dw (k, c, kh, kw) and db (k floats, or NULL) by the
 * same kernel, a tap at a time: each tap is a 1x1 convolution over the
 * outputs whose inputs lie inside x, summed into its part of tap (kh kw k
 * c floats of scratch), then spread into dw. */
void dsrt__pw_taps_weights_grad(cpu_backend *be, const float *x, const cpu_chans *xl,
                                const float *dy, const cpu_chans *yl, const pw_taps *t, float *dw,
                                float *db, float *tap);

#endif

/*
 * The GPU backend's engine, as the layer kinds see it (the CUDA module:
 * nn/backend_cuda.c and nn/layers/<kind>_cuda.c). For each batch size,
 * training and inference apart, a plan carves every activation and
 * gradient tensor from one device allocation; each layer's kind makes its
 * descriptors, asks for the scratch it needs, may search algorithms and try
 * fused calls on the plan's tensors, and queues its forward and backward
 * work on the compute stream with cuDNN, cuBLAS and dsrt's kernels
 * (nn/kernels.h). The engine stages batches, records steps as CUDA graphs,
 * runs the optimizer and hands the host its callouts; it knows no layer
 * kind. Activations are NHWC, in bfloat16 under bf16.
 */
#ifndef DSRT_NN_BACKEND_CUDA_H
#define DSRT_NN_BACKEND_CUDA_H

#include "nn/internal.h"
#include "nn/kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSRT_CUDA_ALIGN 256 /* every tensor of a plan starts on this */
#define PLAN_SLOTS      16  /* batch shapes kept planned */
#define EV_RING         4   /* steps whose device time is accounted two behind */
#define GRAPH_SLOTS     16  /* recorded steps kept */
/* The most workspace an algorithm search may try, and the most any chosen
 * algorithm may keep. */
#define FIND_WS_MAX ((size_t)1 << 30)

/* The scaling factors of cuDNN and cuBLAS calls: out = 1 * result + 0 * out. */
static const float ONE = 1.0f, ZERO = 0.0f;

typedef struct cuda_backend cuda_backend;
typedef struct gpu_plan gpu_plan;

// ----------------------------------------------------------------------------
// Errors

int dsrt__cuda_cu_fail(cudaError_t e, const char *call, const dsrt_layer *l);
int dsrt__cuda_dnn_fail(cudnnStatus_t s, const char *call, const dsrt_layer *l);
int dsrt__cuda_blas_fail(cublasStatus_t s, const char *call, const dsrt_layer *l);

/* Each returns from the calling function with the failure; `L` (the layer
 * being worked on, or NULL) names it in the message. */
#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return dsrt__cuda_cu_fail(e_, #call, L);                            \
    } while (0)
#define DNN(call)                                                                                  \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) return dsrt__cuda_dnn_fail(s_, #call, L);                  \
    } while (0)
#define BLAS(call)                                                                                 \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) return dsrt__cuda_blas_fail(s_, #call, L);                \
    } while (0)
#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) return rc_;                                                                       \
    } while (0)

// ----------------------------------------------------------------------------
// Plans

/* How a layer's forward is fused (kept in the plan, said by the profile). */
enum {
    FUSE_NONE = 0,
    FUSE_CUDNN, /* convolution + bias + activation, or batchnorm + ReLU, in one cuDNN call */
    FUSE_KERNEL /* the bias and the activation in one dsrt kernel after the product */
};

typedef struct {
    /* (n, out.h, out.w, out.c) the layer's output, NHWC in the activation
     * type (DSRT_CUDA_F32_OUT: float32). May be the previous layer's (a ReLU
     * computed by the layer before it, a kind that is the identity at
     * inference: DSRT_LAYER_F_INFER_IDENTITY). */
    void *y;
    void *dy;       /* same shape: gradient of the loss with respect to y; NULL unused */
    dsrt_k_desc kd; /* y as dsrt's kernels see it */
    cudnnTensorDescriptor_t yd; /* y as cuDNN sees it, made by a layer that needs it */
    int in0;                    /* the layer whose output is this one's (first) input */
    int fuse;                   /* FUSE_* of the forward */
    /* The activation its forward computes after it (DSRT_K_ACT_IDENTITY:
     * none): the layer's own ReLU (fuse_relu), or in an inference plan that
     * of the affine layer folded into it or the activation layer after it
     * (plan_chains). */
    dsrt_k_act act;
    /* Inference plans (net option fuse 2, DSRT_CUDA_FOLDS): the layer whose
     * per-channel affine map (infer_affine) this one's weights and bias
     * take on, folded (dsrt__cuda_fwd_weights), or -1; and the last layer of
     * the chain it computes (itself when none). taken_by: for a layer of
     * such a chain, the layer that computes it (-1: itself); its output is
     * that layer's. */
    int affine, last, taken_by;
    /* Inference: the other input of a two-input add the chain ends with
     * (computed before this layer), added after act, then post (the add's
     * ReLU): dsrt_k_bias_act_sum; -1: none. */
    int sum;
    dsrt_k_act post;
    /* A pooled inference plan (gpu_plan.pooled): the last step its output
     * lives to; later steps may take its bytes. */
    int hi;
    /* What the kind keeps of its own (descriptors, algorithms, pointers
     * into the plan's memory), freed with the plan by own_free. */
    void *own;
    void (*own_free)(void *own);
} gpu_layer;

/* One device buffer a batch is copied into. */
typedef struct {
    void *x;
    size_t cap;
    int32_t *labels;
    size_t lcap;
    float *soft; /* soft targets (n, classes) */
    size_t scap;
    cudaEvent_t copied;   /* on the copy stream: the batch is on the device */
    cudaEvent_t consumed; /* on the compute stream: the last step reading it is done */
    int n, layout, has_labels, has_soft;
    float sub[DSRT_K_PIXEL_CH_MAX], div[DSRT_K_PIXEL_CH_MAX];
} stage_slot;

struct gpu_plan {
    int n, train;
    int n_layers;
    uint64_t used;
    gpu_layer *gl;
    void *mem;       /* every tensor of the plan */
    size_t mem_size; /* what the plan's tensors take */
    gpu_plan *owner; /* whose memory mem is (NULL: the plan's own allocation) */
    int reserved;    /* made by cuda_reserve: kept while the run lasts */
    /* The classification output's loss and correct count (device). */
    double *loss;
    int32_t *correct;
    /* Scratch that a layer's kernels use within one call (bias gradients'
     * partial sums, batchnorm's tiles): the largest asked for. */
    void *work;
    /* (n_layers) the last layer (in the written order) that takes layer j's
     * output: backward runs last to first, so it writes j's gradient and the
     * others add theirs, through acc (the largest such gradient's size). */
    int *last_use;
    void *acc;
    /* Inference, fuse 2: the outputs' bytes reused once dead (output_pool);
     * held the span they take, each what they would take each alone. */
    int pooled;
    size_t act_held, act_each;
    const stage_slot *slot; /* the batch of the forward being queued */
    const int32_t *labels;  /* device labels of the batch of the last forward, or NULL */
    const float *soft;      /* ... and its soft targets (n, classes), or NULL */
    int bn_sync;            /* the last forward synchronised its batchnorm layers */
};

/* Plan memory being laid out: pointers are NULL while measuring. */
typedef struct {
    char *base;
    size_t at;
} carve;

/* bytes of the plan's memory (NULL while measuring). */
void *dsrt__cuda_take(carve *c, size_t bytes);

// ----------------------------------------------------------------------------
// Recorded steps

/* What the host does between two segments of a recorded step. */
typedef enum {
    CALL_NONE = 0,
    CALL_GRADS, /* dsrt__net_grads_ready(layer): a gradient bucket is complete */
    CALL_BN,    /* the synchronised batchnorm hook, on bs */
} callout_kind;

typedef struct {
    callout_kind kind;
    int layer;
    dsrt_bn_sums bs;
} callout;

typedef struct {
    cudaGraphExec_t exec;
    callout after;
} segment;

/* What a recording captured, beyond the backend's memory (whose changes
 * bump graph_gen and drop every graph). Compared with memcmp: zeroed
 * before it is filled. */
typedef struct {
    const gpu_plan *plan;
    int slot, layout, labels, soft, bn_sync;
    const void *ready_fn, *bn_fn; /* the hooks */
    uint64_t hook_gen;            /* the bucket layout: which dsrt_net_set_grad_hook set it */
    int n_buckets;
    int with_opt; /* the optimizer step is queued first */
    int solver, norm_clip, n_buf, bf16;
    const void *seg;
    int n_seg;
    uint32_t blocks;
    int profile;
} step_key;

typedef struct {
    step_key key;
    segment *seg; /* (n_seg) none while the key warms up */
    int n_seg;
    int warm; /* steps of this key seen */
    uint64_t used;
} step_graph;

/* A recording in progress: segments captured so far. */
typedef struct {
    segment *seg;
    int n_seg, cap;
    int failed;
} recording;

/* The optimizer step waiting to be queued with the next training step. */
typedef struct {
    int on;
    dsrt_k_step st;
    int n_buf; /* the solver's state buffers */
    int norm_clip;
} pending_opt;

/* The training forward waiting for its backward. */
typedef struct {
    int on;
    gpu_plan *plan;
    int slot;
} pending_fwd;

/* Profile events: per layer forward and backward, the optimizer. */
typedef struct {
    cudaEvent_t *fwd0, *fwd1, *bwd0, *bwd1; /* (n_layers) each */
    cudaEvent_t opt0, opt1;
    int recorded; /* a step's events are recorded and not yet read */
    int has_bwd, has_opt;
    int replayed; /* that step was a replay of recorded graphs */
} prof_events;

struct cuda_backend {
    dsrt_net *net;
    int device;
    int bf16, det;
    dsrt_k_type act;        /* the activations' type */
    cudnnDataType_t act_dt; /* ... as cuDNN names it */
    cudaStream_t compute, copy;
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    void *blas_ws;
    cudnnMathType_t conv_math;
    void *flat; /* one allocation: params, grads (n_params floats each), state, then under bf16
                 * w16 and g16; each starting on an ALIGN boundary */
    float *params, *grads, *state;
    dsrt_bf16 *w16, *g16; /* bf16: the weights the products read, convolution gradients */
    uint64_t seen_version;
    int any_state; /* a training forward changes the net's state (batchnorm) */
    stage_slot slot[2];
    int next_slot, staged; /* staged: the slot of the last stage(), -1 none */
    void *ws;
    size_t ws_size;
    gpu_plan *plans[PLAN_SLOTS];
    gpu_plan *last_train, *last_infer, *last;
    uint64_t clock;
    /* The per-step scalars: on the device, and as the host last wrote them. */
    dsrt_k_consts *dconst;
    dsrt_k_consts hconst;
    /* Results of the last forward, copied back asynchronously. */
    double *h_loss;
    int32_t *h_correct;
    cudaEvent_t results_ev;
    int results_labels;
    /* The optimizer state held here, and the step's segment table: its
     * device copy (seg_cap entries, workspace work_cap bytes), written from
     * the pinned seg_pin on the compute stream that reads it (seg_copied:
     * that copy is done, seg_pin may be written again). */
    float *opt_buf[2];
    uint64_t opt_version;
    dsrt_segment *seg_host;
    int n_seg;
    dsrt_k_segment *seg_dev, *seg_pin;
    int seg_cap;
    size_t work_cap;
    cudaEvent_t seg_copied;
    dsrt_k_optim kopt;
    /* Sizes were reserved: the backend allocates no more (cuda_reserve). */
    int frozen;
    cudaEvent_t sync_ev; /* recorded to wait for a stream */
    /* Inference: (n_layers) the folded weights and bias of layers whose
     * plans take on the affine map after them, made again when the
     * parameters or the state changed since (param_gen: bumped by an upload
     * of the host's, an optimizer step and a training forward that changes
     * the state). */
    struct cuda_fold *fold;
    uint64_t param_gen;
    /* Device time: per step, the data arrived (go) and the last queued work
     * (done); accumulated two steps behind. */
    cudaEvent_t ev_go[EV_RING], ev_done[EV_RING];
    int64_t steps, acc_upto;
    double busy_s, idle_s;
    /* Deferred work and recorded steps. */
    pending_opt popt;
    pending_fwd pfwd;
    int graphs; /* recording allowed (net option) */
    step_graph *graph[GRAPH_SLOTS];
    uint64_t graph_gen, graph_clock;
    step_key warm_key;
    int warm_count;
    recording *rec; /* the recording in progress, or NULL */
    int64_t graph_steps, captures;
    prof_events prof;
};

// ----------------------------------------------------------------------------
// What a kind does on the GPU

enum {
    DSRT_CUDA_F32_OUT = 1,   /* its output is float32 whatever the activations' type */
    DSRT_CUDA_DX_ALWAYS = 4, /* its input carries a gradient whenever it trains (cuDNN's
                                batchnorm always computes it) */
    DSRT_CUDA_STATE = 8,     /* training forward changes the net's state */
    /* At inference its weights and bias may take on a per-channel affine map
     * that follows it (the plan's affine: dsrt__cuda_fwd_weights and
     * dsrt__cuda_fwd_bias), and it computes the plan's activation (act, any
     * function of dsrt_k_act). */
    DSRT_CUDA_FOLDS = 16,
};

typedef struct {
    unsigned flags; /* DSRT_CUDA_* */
    /* Whether the device keeps layer l's weights in another order than the
     * host's, and the reordering (to_dev: host to device, else back). */
    int (*reorders)(const dsrt_layer *l);
    void (*reorder)(const dsrt_layer *l, float *dst, const float *src, int to_dev);
    /* Layer i's descriptors and what it keeps (p->gl[i].own), before any
     * tensor exists; *need grows to the workspace it takes. */
    int (*desc)(cuda_backend *be, gpu_plan *p, int i, size_t *need);
    /* Its scratch tensors from the plan's memory (twice: measuring with
     * c->base NULL, then placing); *work grows to the scratch its kernels
     * take within one call (p->work). */
    void (*layout)(cuda_backend *be, gpu_plan *p, int i, carve *c, size_t *work);
    /* Algorithms searched on the plan's tensors (scratch fws of fws_size
     * bytes, or NULL), *need growing to the workspace they take; fused
     * calls tried once the workspace is there. */
    int (*search)(cuda_backend *be, gpu_plan *p, int i, void *fws, size_t fws_size, size_t *need);
    void (*try_fused)(cuda_backend *be, gpu_plan *p, int i);
    /* Queues layer i's forward and backward on the compute stream. */
    int (*forward)(cuda_backend *be, gpu_plan *p, int i);
    int (*backward)(cuda_backend *be, gpu_plan *p, int i);
} dsrt_cuda_layer_ops;

#define DSRT_CUDA_LAYER_EXTERN(K, k) extern const dsrt_cuda_layer_ops dsrt__cuda_layer_##k;
DSRT_LAYER_KINDS(DSRT_CUDA_LAYER_EXTERN)
#undef DSRT_CUDA_LAYER_EXTERN

// ----------------------------------------------------------------------------
// Helpers for the kinds

static inline size_t dsrt__cuda_out_count(const dsrt_layer *l, int n) {
    return (size_t)n * l->out.c * l->out.h * l->out.w;
}

static inline size_t dsrt__cuda_in_count(const dsrt_layer *l, int n) {
    return (size_t)n * l->in.c * l->in.h * l->in.w;
}

static inline size_t dsrt__cuda_type_size(dsrt_k_type t) {
    return t == DSRT_K_BF16 ? sizeof(dsrt_bf16) : sizeof(float);
}

static inline dsrt_k_desc dsrt__cuda_kdesc(int n, int c, int h, int w, int nhwc, dsrt_k_type t) {
    dsrt_k_desc d = {n, c, h, w, nhwc, t};
    return d;
}

/* An NHWC tensor descriptor (made when *d is NULL); a (1, c, 1, 1) float
 * parameter descriptor. */
int dsrt__cuda_set_nhwc(cudnnTensorDescriptor_t *d, cudnnDataType_t t, int n, int c, int h, int w,
                        const dsrt_layer *L);
int dsrt__cuda_set_param_desc(cudnnTensorDescriptor_t *d, int c, const dsrt_layer *L);
/* The weights a product reads: the bfloat16 copy under bf16. */
const void *dsrt__cuda_weights(const cuda_backend *be, const dsrt_layer *l);
/* The weights layer i's forward reads in plan p: with an affine map folded
 * in (p->gl[i].affine), the folded copy (bfloat16 under bf16), else
 * dsrt__cuda_weights. */
const void *dsrt__cuda_fwd_weights(const cuda_backend *be, const gpu_plan *p, int i);
/* ... and its bias (out.c floats; NULL when it has none), and that bias in
 * bfloat16 under bf16, or NULL where there is no such copy: the folded
 * one, or the one at its offset in the weights' bfloat16 copy when that
 * starts on 16 bytes. */
const float *dsrt__cuda_fwd_bias(const cuda_backend *be, const gpu_plan *p, int i);
const dsrt_bf16 *dsrt__cuda_fwd_bias16(const cuda_backend *be, const gpu_plan *p, int i);
/* After a convolution's or fully connected layer's product in y: its bias
 * b (NULL: none), its activation and, in an inference chain ending with a
 * residual add, the sum and the add's ReLU, in one kernel. */
cudaError_t dsrt__cuda_epilogue(cuda_backend *be, gpu_plan *p, int i, const float *b);
/* Makes the shared workspace at least need bytes (the device quiet first). */
int dsrt__cuda_ensure_workspace(cuda_backend *be, size_t need);
/* Where layer i's backward writes the gradient for input j: j's gradient
 * when layer i is the last layer written that takes j, else the plan's acc,
 * which dsrt__cuda_grad_add then adds into j's gradient. */
void *dsrt__cuda_grad_ptr(const gpu_plan *p, int i, int j);
int dsrt__cuda_grad_add(cuda_backend *be, gpu_plan *p, int i, int j);
/* Layer i's gradients are queued: its bucket's callout, if it closes one. */
int dsrt__cuda_grads_ready(cuda_backend *be, int i);
/* The synchronised batchnorm hook on n sums of layer i (forward, or
 * backward), at this point of the step. */
int dsrt__cuda_bn_callout(cuda_backend *be, int i, int backward, double *sums, size_t n);
/* The gradient of a layer's output behind the ReLU the layer computes:
 * folded into the bias gradient when there is one (the kernel masks dy in
 * place as it sums it, its partial sums in p->work), else on its own. */
int dsrt__cuda_bias_relu_bwd(cuda_backend *be, gpu_plan *p, int i);
/* Says something of how layer L runs, once, in the net's backend note. */
void dsrt__cuda_note(cuda_backend *be, const dsrt_layer *L, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif

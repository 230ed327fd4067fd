/*
 * The GPU backend: the nn ops table (internal.h) on one CUDA device, with
 * cuDNN 9's C API for convolutions and batch normalisation, cuBLAS for
 * fully connected layers, and dsrt's own kernels (nn/kernels.h) for the
 * input stage, padding, biases and ReLUs, pooling, LRN, dropout, softmax
 * with cross-entropy and the optimizer step. It computes what the CPU
 * backend (backend_cpu.c) computes, on the same flat buffers of parameters,
 * gradients and state, so offsets, gradient buckets and model files mean
 * the same on both.
 *
 * Activations: channels-last (NHWC) between every pair of layers, as the
 * tensor cores' convolutions want them, from the input stage (which writes
 * NHWC straight from the pipeline's uint8 slots) to the last fully
 * connected layer. Under bf16 every activation and its gradient is stored
 * in bfloat16 (the softmax's probabilities and the loss excepted): no layer
 * converts its input or output; cuDNN and cuBLAS take bfloat16 tensors and
 * sum in float32, and dsrt's kernels load and store bfloat16 and compute in
 * float. fp32 and tf32 keep float32 activations (tf32: TensorFloat-32
 * products). Master weights, their gradients (what the all-reduce sums),
 * batchnorm statistics, the loss and the optimizer stay float32.
 *
 * Weights on the device. The device's flat buffers (params, grads, state,
 * each starting on a 256-byte boundary) hold every layer's parameters at
 * the host's offsets; a convolution's filters are kept in cuDNN's NHWC
 * filter order (out, kh, kw, in / groups) instead of the host's (out, in /
 * groups, kh, kw), and every transfer between host and device (parameters,
 * gradients, optimizer state) reorders them, so that the host buffers,
 * model files and checkpoints are the CPU backend's. A fully connected
 * layer keeps the host's (out, in_c, in_h, in_w): its NHWC input is put in
 * that order at the flatten (one small layout change forward, its inverse
 * backward). Under bf16 a bfloat16 copy of the weights, in the device's
 * order, is what convolutions and matrix products read; the optimizer
 * kernel refreshes it as it updates the float32 weights.
 *
 * Fusion. A convolution with a bias runs as one cuDNN call with its bias
 * and the ReLU after it (cudnnConvolutionBiasActivationForward: ReLU, or
 * identity when the algorithm is IMPLICIT_PRECOMP_GEMM, which cuDNN
 * requires then), tried once when the plan is made and replaced by the
 * convolution and one dsrt kernel (bias and any ReLU in one pass) where
 * cuDNN refuses. Training batchnorm runs cuDNN's NHWC persistent kernels
 * with the ReLU after it fused (cudnnBatchNormalizationForwardTrainingEx /
 * BackwardEx, CUDNN_BATCHNORM_OPS_BN_ACTIVATION), likewise tried and
 * replaced by dsrt's batchnorm kernels (any layout and type, the ReLU folded
 * in) where refused; those kernels also run batchnorm at inference and
 * whenever its statistics are synchronised over the workers. Backward, the
 * ReLU's backward is folded into the next kernel that reads the gradient:
 * the bias gradient of a convolution or fully connected layer (which masks
 * the gradient in place while summing it), batchnorm's fused backward, or
 * the batchnorm kernels' sums and input gradient.
 *
 * Per device there is one compute stream and one copy stream. stage()
 * copies the next batch from host memory into one of two device slots on
 * the copy stream and records an event; the compute stream waits for that
 * event only where the input layer reads the slot, so a batch crosses PCIe
 * while the previous step computes, and the copy stream waits for the step
 * that last read a slot before refilling it. results() waits for the loss
 * of the last forward (copied back asynchronously); the read-backs wait for
 * the compute stream.
 *
 * One CUDA graph a step. A training forward and its backward are queued
 * together when backward is called, and the optimizer step is queued with
 * the next training step (work that another call needs first is queued at
 * once, op by op). After two steps of the same shape, a step's work (the
 * optimizer, forward, loss, backward, the events the host polls) is
 * recorded once as CUDA graphs and replayed from then on: a key of what the
 * recording captured (the plan and its memory, the staging slot, the
 * layout, the hooks, the optimizer's kernels) picks it, and a step whose key
 * differs runs op by op and is recorded in turn. The per-step scalars
 * (learn rate, Adam's corrections, dropout's step, the loss gradient's
 * scale) are read from device memory, written by a small kernel before each
 * replay, so a schedule changes no graph. The host's callouts within a step
 * (a gradient bucket's all-reduce, synchronised batchnorm's sums) cut the
 * recording into segments: NCCL's calls stay outside the graphs (NCCL's
 * rules make a captured collective a collective property of every rank,
 * and warn that several GPUs driven from one process may deadlock in graph
 * launches; outside, the communicator's events and deadline watch work as
 * before), and each replay launches segment, callout, segment, in order.
 * Recording executes nothing, so a recording that fails leaves the step to
 * run op by op.
 *
 * Plans. For each batch size, training and inference separately, a plan is
 * built once: every activation and gradient tensor of the step carved from
 * one device allocation, the cuDNN descriptors, and the convolution
 * algorithms, timed once with cudnnFind*AlgorithmEx on the very tensors,
 * weights and gradients the steps will use (or, in deterministic mode, taken
 * from the cudnnGet*_v7 heuristics among deterministic algorithms only, each
 * tried once on those pointers). Every plan shares one workspace, grown to
 * the largest need.
 *
 * Memory before collectives. Allocating or freeing device memory while NCCL
 * kernels may be in flight can hang them, so a training run (dsrt_train,
 * through dsrt__net_reserve and cuda_reserve) reserves before its first
 * collective the plans of every batch size its steps take, the workspace,
 * the staging slots and the optimizer's state; the optimizer's segment
 * table and workspace are sized when the backend is made. From then on the
 * backend allocates nothing: an inference pass of another size gets a plan
 * whose tensors lie in the memory of a larger inference plan. Growth beyond
 * that, and any allocation (graph instantiation included) while a
 * communicator's hooks are on the net, first waits for the device's queued
 * work to finish.
 *
 * Host waits. With a communicator on the net (net->wait_check), the host
 * never blocks on the device in one call: it polls, and the communicator's
 * check fails the wait when a collective the device waits for has passed
 * its deadline.
 *
 * Profile (dsrt_net_profile_start): events around every layer's forward and
 * backward and the optimizer, recorded in the graphs too, give each layer's
 * device time and the idle gaps between consecutive pieces of a step.
 *
 * Every CUDA, cuDNN and cuBLAS return is checked, the message naming the
 * call and the layer. It is the module dsrt_cuda.so (core/module.h), which
 * net.c's backend table loads when a net first asks for a GPU.
 */
#include "internal.h"

#include "core/module.h"
#include "runtime/internal.h"

#include "kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PLAN_SLOTS 16
#define EV_RING    4
/* The most workspace the algorithm search may try, and the most any
 * chosen algorithm may keep. */
#define FIND_WS_MAX ((size_t)1 << 30)
#define ALIGN       256
/* cuBLAS's own workspace (set once, so that recording a step never makes
 * it allocate): the size NVIDIA suggests for Hopper. */
#define BLAS_WS ((size_t)32 << 20)
/* Steps of one key run op by op before the key is recorded as graphs, and
 * graphs kept. */
#define GRAPH_WARMUP 2
#define GRAPH_SLOTS  16

/* The scaling factors of cuDNN and cuBLAS calls: out = 1 * result + 0 * out. */
static const float ONE = 1.0f, ZERO = 0.0f;

// ----------------------------------------------------------------------------
// Errors

/* The function's name from a call's text ("cudaMalloc(&p, n)" -> "cudaMalloc"). */
static void call_name(char *out, size_t size, const char *call) {
    size_t k = 0;
    while (call[k] && call[k] != '(' && call[k] != ' ' && k + 1 < size) {
        out[k] = call[k];
        k++;
    }
    out[k] = 0;
}

static int fail_msg(const char *call, const char *err, const dsrt_layer *l) {
    char name[64];
    call_name(name, sizeof name, call);
    if (l)
        return dsrt__fail(DSRT_EBACKEND, "cuda backend: layer '%s' (%s, line %d): %s: %s", l->name,
                          l->type, l->line, name, err);
    return dsrt__fail(DSRT_EBACKEND, "cuda backend: %s: %s", name, err);
}

static int cu_fail(cudaError_t e, const char *call, const dsrt_layer *l) {
    /* A failed call also leaves its error as the thread's last error: reset
     * it, or the next launch's check reports it again under its own name. */
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) {
        char name[64];
        call_name(name, sizeof name, call);
        return dsrt__fail(-ENOMEM, "cuda backend%s%s: %s: out of device memory",
                          l ? ": layer " : "", l ? l->name : "", name);
    }
    return fail_msg(call, cudaGetErrorString(e), l);
}

static int dnn_fail(cudnnStatus_t s, const char *call, const dsrt_layer *l) {
    char detail[256] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    char msg[400];
    snprintf(msg, sizeof msg, "%s%s%s", cudnnGetErrorString(s), *detail ? " (" : "",
             *detail ? detail : "");
    if (*detail) strncat(msg, ")", sizeof msg - strlen(msg) - 1);
    return fail_msg(call, msg, l);
}

static int blas_fail(cublasStatus_t s, const char *call, const dsrt_layer *l) {
    return fail_msg(call, cublasGetStatusString(s), l);
}

/* Each returns from the calling function with the failure; `L` (the layer
 * being worked on, or NULL) names it in the message. */
#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return cu_fail(e_, #call, L);                                       \
    } while (0)
#define DNN(call)                                                                                  \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) return dnn_fail(s_, #call, L);                             \
    } while (0)
#define BLAS(call)                                                                                 \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) return blas_fail(s_, #call, L);                           \
    } while (0)
#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) return rc_;                                                                       \
    } while (0)

// ----------------------------------------------------------------------------
// Plans

typedef struct {
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t data;
    cudnnConvolutionBwdFilterAlgo_t filter;
    cudnnMathType_t m_fwd, m_data, m_filter;
    int has_data; /* backward data runs (the input needs a gradient) */
    /* By direction (DIR_*): cuDNN has no algorithm for it, and dsrt's direct
     * convolution kernels run it instead (dsrt_k_conv_*). */
    int own[3];
} conv_algos;

/* How a layer's forward is fused (kept in the plan, said by the profile). */
enum {
    FUSE_NONE = 0,
    FUSE_CUDNN, /* convolution + bias + activation, or batchnorm + ReLU, in one cuDNN call */
    FUSE_KERNEL /* the bias and the ReLU in one dsrt kernel after the product */
};

typedef struct {
    /* (n, out.h, out.w, out.c) the layer's output, NHWC in the activation
     * type; the softmax's probabilities (n, classes) in float32. May be the
     * previous layer's (a ReLU computed by the layer before it, dropout at
     * inference). */
    void *y;
    void *dy;       /* same shape: gradient of the loss with respect to y; NULL unused */
    dsrt_k_desc kd; /* y as dsrt's kernels see it */
    cudnnTensorDescriptor_t yd; /* y as cuDNN sees it (convolutions, batchnorm) */
    /* Convolution: the input as cuDNN reads it. */
    int pad_explicit;           /* asymmetric padding: copied into xp */
    int ph, pw;                 /* the padded input's height and width */
    void *xp;                   /* (n, ph, pw, in.c) the padded input; then its gradient */
    cudnnTensorDescriptor_t xd; /* what cuDNN reads: the padded input or the previous y */
    cudnnFilterDescriptor_t wd; /* (out.c, in.c / groups, kh, kw) as NHWC filters */
    cudnnConvolutionDescriptor_t cd;
    cudnnTensorDescriptor_t bd; /* (1, c, 1, 1) float: conv bias, batchnorm parameters */
    /* Under bf16, the fused convolution's bias in bfloat16 (its copy in w16)
     * where cuDNN refuses a float bias with bfloat16 data. */
    cudnnTensorDescriptor_t bd16;
    int bias16;
    cudnnActivationDescriptor_t act; /* fused convolution or batchnorm: the activation */
    conv_algos al;
    int fuse; /* FUSE_* of the forward */
    /* Batchnorm in training: cuDNN's Ex calls (NHWC persistent kernels, the
     * ReLU fused when bn_ops says so) with their reserve space; else the
     * plain calls. */
    int bn_ex;
    cudnnBatchNormOps_t bn_ops;
    void *bn_reserve;
    size_t bn_reserve_size;
    /* Batchnorm: the batch's mean and inverse standard deviation (c each);
     * synchronised, also its variance (c) and the sums the hook adds up over
     * the workers: forward (2c + 1) and backward (2c). */
    float *save_mean, *save_inv, *save_var;
    double *bn_sums, *bn_bsums;
    /* Fully connected over an image: its input in the host's (c, h, w)
     * order, then the gradient in that order. */
    void *xf;
    dsrt_k_pool pool;
    dsrt_k_lrn lrn;
    dsrt_k_conv kconv; /* a convolution for dsrt's direct kernels */
    int in0;           /* the layer whose output is this one's (first) input */
    /* In training: max pooling's winners, their offsets in the windows
     * (one byte an output element), and local response normalisation's
     * scales (one float an element), kept by the forward for the backward. */
    uint8_t *pool_arg;
    float *lrn_scale;
} gpu_layer;

typedef struct gpu_plan gpu_plan;
struct gpu_plan {
    int n, train;
    int n_layers;
    uint64_t used;
    gpu_layer *gl;
    void *mem;       /* every tensor of the plan */
    size_t mem_size; /* what the plan's tensors take */
    gpu_plan *owner; /* whose memory mem is (NULL: the plan's own allocation) */
    int reserved;    /* made by cuda_reserve: kept while the run lasts */
    double *loss;
    int32_t *correct;
    void *sm_work;  /* softmax reductions */
    void *bg_work;  /* bias gradients' partial sums (the largest layer's) */
    float *bn_work; /* dsrt's batchnorm sums' tiles (the largest layer's) */
    /* (n_layers) the last layer (in the written order) that takes layer j's
     * output: backward runs last to first, so it writes j's gradient and the
     * others add theirs, through acc (the largest such gradient's size). */
    int *last_use;
    void *acc;
    const int32_t *labels; /* device labels of the batch of the last forward, or NULL */
    const float *soft;     /* ... and its soft targets (n, classes), or NULL */
    int bn_sync;           /* the last forward synchronised its batchnorm layers */
};

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
    const void *ready_fn, *buckets, *bn_fn; /* the hooks, and the bucket layout */
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

typedef struct cuda_backend {
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
    int any_bn;
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
} cuda_backend;

static size_t out_count(const dsrt_layer *l, int n) {
    return (size_t)n * l->out.c * l->out.h * l->out.w;
}

static size_t in_count(const dsrt_layer *l, int n) {
    return (size_t)n * l->in.c * l->in.h * l->in.w;
}

static size_t type_size(dsrt_k_type t) {
    return t == DSRT_K_BF16 ? sizeof(dsrt_bf16) : sizeof(float);
}

/* An NHWC tensor descriptor of cuDNN. */
static int set_nhwc(cudnnTensorDescriptor_t *d, cudnnDataType_t t, int n, int c, int h, int w,
                    const dsrt_layer *L) {
    if (!*d) DNN(cudnnCreateTensorDescriptor(d));
    DNN(cudnnSetTensor4dDescriptor(*d, CUDNN_TENSOR_NHWC, t, n, c, h, w));
    return 0;
}

static int set_param_desc(cudnnTensorDescriptor_t *d, int c, const dsrt_layer *L) {
    if (!*d) DNN(cudnnCreateTensorDescriptor(d));
    DNN(cudnnSetTensor4dDescriptor(*d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, c, 1, 1));
    return 0;
}

static dsrt_k_desc kdesc(int n, int c, int h, int w, int nhwc, dsrt_k_type t) {
    dsrt_k_desc d = {n, c, h, w, nhwc, t};
    return d;
}

static size_t align_up(size_t bytes) {
    return (bytes + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

/* The weights a product reads: the bfloat16 copy under bf16. */
static const void *weights(const cuda_backend *be, const dsrt_layer *l) {
    return be->bf16 ? (const void *)(be->w16 + l->w_off) : (const void *)(be->params + l->w_off);
}

/* Records a host-visible event on the compute stream: inside a recording
 * it becomes an event node of the graph, so a replay records it. The
 * external flag is refused outside a capture (cudaErrorIllegalState), so it
 * is given only while the stream is capturing. */
static cudaError_t mark(cuda_backend *be, cudaEvent_t ev) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(be->compute, &st);
    if (e != cudaSuccess) return e;
    unsigned flags = st == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : 0;
    return cudaEventRecordWithFlags(ev, be->compute, flags);
}

// ----------------------------------------------------------------------------
// Host waits and device memory

/* Whether a communicator's collectives may be queued on this device or
 * waited for by its streams: its hooks are on the net. */
static int collectives_possible(const cuda_backend *be) {
    const dsrt_net *net = be->net;
    return net->ready_fn || net->bn_sync_fn || net->wait_check;
}

/* Waits until ev has happened. With a communicator's check on the net, by
 * polling, and the check's failure (a collective past its deadline) ends
 * the wait; what names the wait in messages. */
static int wait_event(cuda_backend *be, cudaEvent_t ev, const char *what) {
    dsrt_net *net = be->net;
    if (!net->wait_check) {
        cudaError_t e = cudaEventSynchronize(ev);
        return e == cudaSuccess ? 0 : cu_fail(e, what, NULL);
    }
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return cu_fail(e, what, NULL);
        int rc = net->wait_check(net->wait_ctx);
        if (rc) return rc;
        struct timespec t = {0, 20000};
        nanosleep(&t, NULL);
    }
}

/* Waits until the work queued on s so far is done. */
static int wait_stream(cuda_backend *be, cudaStream_t s) {
    const dsrt_layer *L = NULL;
    CU(cudaEventRecord(be->sync_ev, s));
    return wait_event(be, be->sync_ev, "cudaStreamSynchronize");
}

/* Waits until the device has nothing queued: the collectives the compute
 * stream waits for included. */
static int quiet(cuda_backend *be) {
    TRY(wait_stream(be, be->copy));
    return wait_stream(be, be->compute);
}

static void graphs_drop(cuda_backend *be);

/* Device memory after the backend was made: once its sizes are reserved,
 * or with collectives possible, only when the device is quiet (cudaMalloc
 * and cudaFree while NCCL kernels may run can hang them). Recorded steps
 * may hold the old pointers: they go. */
static int dev_alloc(cuda_backend *be, void **p, size_t bytes, const dsrt_layer *L) {
    if (be->frozen || collectives_possible(be)) TRY(quiet(be));
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return cu_fail(e, "cudaMalloc", L);
    }
    return 0;
}

static int dev_free(cuda_backend *be, void *p) {
    const dsrt_layer *L = NULL;
    if (!p) return 0;
    if (be->frozen || collectives_possible(be)) TRY(quiet(be));
    graphs_drop(be);
    CU(cudaFree(p));
    return 0;
}

// ----------------------------------------------------------------------------
// The device's order of convolution filters

/* Whether layer l's weights are kept in another order on the device: a
 * convolution's filters as NHWC filters (out, kh, kw, in / groups), where
 * that order differs from the host's (out, in / groups, kh, kw). */
static int reordered(const dsrt_layer *l) {
    return l->kind == DSRT_LAYER_CONV && l->o.kh * l->o.kw > 1 && l->in.c / l->o.groups > 1;
}

/* Layer l's filters from the host's order into the device's (to_dev), or
 * back. */
static void reorder(const dsrt_layer *l, float *dst, const float *src, int to_dev) {
    size_t K = (size_t)l->out.c, C = (size_t)(l->in.c / l->o.groups), R = (size_t)l->o.kh,
           S = (size_t)l->o.kw;
    for (size_t k = 0; k < K; k++)
        for (size_t c = 0; c < C; c++)
            for (size_t r = 0; r < R; r++)
                for (size_t s = 0; s < S; s++) {
                    size_t h = ((k * C + c) * R + r) * S + s, d = ((k * R + r) * S + s) * C + c;
                    if (to_dev)
                        dst[d] = src[h];
                    else
                        dst[h] = src[d];
                }
}

/* A flat buffer of the host (n_params floats, the host's order) into the
 * device's dst, reordered, on the compute stream. The copies are from
 * pageable memory: each returns once its source is read, so the reordered
 * filters' buffer may go at once. */
static int put_flat(cuda_backend *be, float *dst, const float *src) {
    const dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    if (!net->n_params) return 0;
    CU(cudaMemcpyAsync(dst, src, net->n_params * sizeof(float), cudaMemcpyHostToDevice,
                       be->compute));
    for (int i = 1; i < net->n_layers; i++) {
        L = &net->layers[i];
        if (!reordered(L)) continue;
        float *t = malloc(L->w_n * sizeof *t);
        if (!t) return dsrt__fail(-ENOMEM, "cuda backend: out of memory reordering filters");
        reorder(L, t, src + L->w_off, 1);
        cudaError_t e = cudaMemcpyAsync(dst + L->w_off, t, L->w_n * sizeof *t,
                                        cudaMemcpyHostToDevice, be->compute);
        free(t);
        if (e != cudaSuccess) return cu_fail(e, "cudaMemcpyAsync", L);
    }
    return 0;
}

/* A device flat buffer into the host's dst, in the host's order (the
 * compute stream's work done first). */
static int get_flat(cuda_backend *be, float *dst, const float *src) {
    const dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    if (!net->n_params) return 0;
    CU(cudaMemcpy(dst, src, net->n_params * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 1; i < net->n_layers; i++) {
        L = &net->layers[i];
        if (!reordered(L)) continue;
        float *t = malloc(L->w_n * sizeof *t);
        if (!t) return dsrt__fail(-ENOMEM, "cuda backend: out of memory reordering filters");
        memcpy(t, dst + L->w_off, L->w_n * sizeof *t);
        reorder(L, dst + L->w_off, t, 0);
        free(t);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Plan memory: every tensor of a plan from one allocation

typedef struct {
    char *base; /* NULL while measuring */
    size_t at;
} carve;

static void *take(carve *c, size_t bytes) {
    size_t at = (c->at + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    c->at = at + ((bytes + ALIGN - 1) & ~(size_t)(ALIGN - 1));
    return c->base ? c->base + at : NULL;
}

/* Whether layer i's output is layer i-1's (a ReLU computed by the layer
 * before it, dropout at inference). */
static int aliases(const dsrt_layer *l, int train) {
    return l->fused_away || (l->kind == DSRT_LAYER_DROPOUT && !train);
}

/* Whether cuDNN's symmetric padding cannot express convolution l's. */
static int pad_explicit(const dsrt_layer *l) {
    return l->kind == DSRT_LAYER_CONV && (l->pt != l->pb || l->pl != l->pr);
}

/* Whether a fully connected layer's input must be put in the host's (c, h,
 * w) order first. */
static int flattens(const dsrt_layer *l) {
    return l->kind == DSRT_LAYER_FC && l->in.h * l->in.w > 1 && l->in.c > 1;
}

/* Lays the plan's tensors out over c (pointers are NULL while measuring). */
static void plan_layout(cuda_backend *be, gpu_plan *p, carve *c, const int *need_dy, void **share) {
    const dsrt_net *net = be->net;
    int n = p->n;
    for (int i = 0; i < net->n_layers; i++) share[i] = NULL;
    size_t at = type_size(be->act), bg = 0, bnw = 0, acc = 0;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        gpu_layer *g = &p->gl[i];
        size_t cnt = out_count(l, n), el = l->kind == DSRT_LAYER_SOFTMAX ? sizeof(float) : at;
        if (i > 0 && aliases(l, p->train)) {
            g->y = p->gl[l->inputs[0]].y;
            g->dy = p->gl[l->inputs[0]].dy;
        } else {
            g->y = take(c, cnt * el);
            /* An add and the inputs that share its gradient (net.c's
             * grad_share): one buffer, made for the first of them. */
            int key = net->grad_share[i] >= 0     ? net->grad_share[i]
                      : l->kind == DSRT_LAYER_ADD ? i
                                                  : -1;
            if (!need_dy[i])
                g->dy = NULL;
            else if (p->train && key >= 0) {
                if (!share[key]) share[key] = take(c, cnt * at);
                g->dy = share[key];
            } else
                g->dy = take(c, cnt * at);
        }
        if (i == 0) continue;
        if (g->pad_explicit) g->xp = take(c, (size_t)n * l->in.c * g->ph * g->pw * at);
        if (flattens(l)) g->xf = take(c, in_count(l, n) * at);
        if ((l->kind == DSRT_LAYER_CONV || l->kind == DSRT_LAYER_FC) && l->b_n && p->train)
            bg = DSRT_MAX(bg, dsrt_k_bias_grad_work(&g->kd));
        g->pool_arg = NULL;
        g->lrn_scale = NULL;
        if (l->kind == DSRT_LAYER_MAXPOOL && p->train && dsrt_kb_pool_arg_ok(&g->pool))
            g->pool_arg = take(c, cnt);
        if (l->kind == DSRT_LAYER_LRN && p->train) g->lrn_scale = take(c, cnt * sizeof(float));
        if (l->kind == DSRT_LAYER_BATCHNORM && p->train)
            bnw = DSRT_MAX(bnw, dsrt_kb_bn_work(&p->gl[l->inputs[0]].kd) * sizeof(float));
        if (p->train && l->consumers > 1 && need_dy[i]) acc = DSRT_MAX(acc, cnt * at);
        if (l->kind == DSRT_LAYER_BATCHNORM && p->train) {
            g->save_mean = take(c, (size_t)l->out.c * sizeof(float));
            g->save_inv = take(c, (size_t)l->out.c * sizeof(float));
            g->save_var = take(c, (size_t)l->out.c * sizeof(float));
            g->bn_sums = take(c, ((size_t)2 * l->out.c + 1) * sizeof(double));
            g->bn_bsums = take(c, (size_t)2 * l->out.c * sizeof(double));
            g->bn_reserve = g->bn_ex ? take(c, g->bn_reserve_size) : NULL;
        }
        if (l->kind == DSRT_LAYER_SOFTMAX) {
            p->loss = take(c, sizeof(double));
            p->correct = take(c, sizeof(int32_t));
            p->sm_work = take(c, dsrt_k_softmax_xent_work(n));
        }
    }
    p->bg_work = bg ? take(c, bg) : NULL;
    p->bn_work = bnw ? take(c, bnw) : NULL;
    p->acc = acc ? take(c, acc) : NULL;
}

/* Frees p's descriptors and, when it owns it, its memory (no queued work
 * may use it any more). */
static void plan_free(gpu_plan *p) {
    if (!p) return;
    for (int i = 0; p->gl && i < p->n_layers; i++) {
        gpu_layer *g = &p->gl[i];
        if (g->yd) cudnnDestroyTensorDescriptor(g->yd);
        if (g->xd) cudnnDestroyTensorDescriptor(g->xd);
        if (g->bd) cudnnDestroyTensorDescriptor(g->bd);
        if (g->bd16) cudnnDestroyTensorDescriptor(g->bd16);
        if (g->wd) cudnnDestroyFilterDescriptor(g->wd);
        if (g->cd) cudnnDestroyConvolutionDescriptor(g->cd);
        if (g->act) cudnnDestroyActivationDescriptor(g->act);
    }
    if (p->mem && !p->owner) cudaFree(p->mem);
    free(p->gl);
    free(p->last_use);
    free(p);
}

// ----------------------------------------------------------------------------
// Convolution algorithms
//
// Each direction (forward, backward data, backward filter) is searched on
// the tensors it will run on: the call's three pointers a, b, c in its
// order (forward: x, w, y; data: w, dy, dx; filter: x, dy, dw).

enum { DIR_FWD, DIR_DATA, DIR_FILTER };

static const char *const DIR_NAME[] = {"forward", "backward data", "backward filter"};

/* One search result, whichever direction. */
typedef struct {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
} algo_perf;

#define ALGO_MAX 8

#define COPY_PERF(out, r, got)                                                                     \
    for (int k_ = 0; k_ < (got); k_++) (out)[k_] = (algo_perf) {                                   \
            (int)(r)[k_].algo, (r)[k_].status, (r)[k_].memory, (r)[k_].determinism,                \
                (r)[k_].mathType                                                                   \
        }

static cudnnStatus_t dir_search(cuda_backend *be, gpu_layer *g, int dir, const void *a,
                                const void *b, void *c, void *ws, size_t ws_size, algo_perf *out,
                                int *got) {
    cudnnStatus_t st;
    if (dir == DIR_FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int n = DSRT_MIN(CUDNN_CONVOLUTION_FWD_ALGO_COUNT, ALGO_MAX);
        st = be->det ? cudnnGetConvolutionForwardAlgorithm_v7(be->dnn, g->xd, g->wd, g->cd, g->yd,
                                                              n, got, r)
                     : cudnnFindConvolutionForwardAlgorithmEx(be->dnn, g->xd, a, g->wd, b, g->cd,
                                                              g->yd, c, n, got, r, ws, ws_size);
        if (st == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *got);
    } else if (dir == DIR_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        int n = DSRT_MIN(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, ALGO_MAX);
        st = be->det ? cudnnGetConvolutionBackwardDataAlgorithm_v7(be->dnn, g->wd, g->yd, g->cd,
                                                                   g->xd, n, got, r)
                     : cudnnFindConvolutionBackwardDataAlgorithmEx(
                           be->dnn, g->wd, a, g->yd, b, g->cd, g->xd, c, n, got, r, ws, ws_size);
        if (st == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *got);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        int n = DSRT_MIN(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, ALGO_MAX);
        st = be->det ? cudnnGetConvolutionBackwardFilterAlgorithm_v7(be->dnn, g->xd, g->yd, g->cd,
                                                                     g->wd, n, got, r)
                     : cudnnFindConvolutionBackwardFilterAlgorithmEx(
                           be->dnn, g->xd, a, g->yd, b, g->cd, g->wd, c, n, got, r, ws, ws_size);
        if (st == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *got);
    }
    return st;
}

static cudnnStatus_t dir_workspace(cuda_backend *be, gpu_layer *g, int dir, int algo, size_t *sz) {
    if (dir == DIR_FWD)
        return cudnnGetConvolutionForwardWorkspaceSize(be->dnn, g->xd, g->wd, g->cd, g->yd,
                                                       (cudnnConvolutionFwdAlgo_t)algo, sz);
    if (dir == DIR_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            be->dnn, g->wd, g->yd, g->cd, g->xd, (cudnnConvolutionBwdDataAlgo_t)algo, sz);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        be->dnn, g->xd, g->yd, g->cd, g->wd, (cudnnConvolutionBwdFilterAlgo_t)algo, sz);
}

/* One run of algo on the direction's pointers (what it writes is scratch
 * until the step writes it again). */
static cudnnStatus_t dir_run(cuda_backend *be, gpu_layer *g, int dir, int algo, const void *a,
                             const void *b, void *c) {
    if (dir == DIR_FWD)
        return cudnnConvolutionForward(be->dnn, &ONE, g->xd, a, g->wd, b, g->cd,
                                       (cudnnConvolutionFwdAlgo_t)algo, be->ws, be->ws_size, &ZERO,
                                       g->yd, c);
    if (dir == DIR_DATA)
        return cudnnConvolutionBackwardData(be->dnn, &ONE, g->wd, a, g->yd, b, g->cd,
                                            (cudnnConvolutionBwdDataAlgo_t)algo, be->ws,
                                            be->ws_size, &ZERO, g->xd, c);
    return cudnnConvolutionBackwardFilter(be->dnn, &ONE, g->xd, a, g->yd, b, g->cd,
                                          (cudnnConvolutionBwdFilterAlgo_t)algo, be->ws,
                                          be->ws_size, &ZERO, g->wd, c);
}

/* Whether a search result may be used: it ran, and in deterministic mode
 * it is deterministic. */
#define USABLE(be, r)                                                                              \
    ((r).status == CUDNN_STATUS_SUCCESS && (!(be)->det || (r).determinism == CUDNN_DETERMINISTIC))

/* The math type an algorithm runs with: fp32 runs are held to FMA
 * arithmetic whatever the search tried; otherwise the result's own. */
static cudnnMathType_t math_for(const cuda_backend *be, cudnnMathType_t found) {
    return be->conv_math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : found;
}

static int ensure_workspace(cuda_backend *be, size_t need);

/*
 * Picks direction dir's algorithm of layer L (plan layer g) for the
 * pointers a, b, c: the fastest usable one whose workspace the backend can
 * give (at most FIND_WS_MAX; once sizes are reserved, what the workspace
 * holds). In deterministic mode the heuristics' candidates are tried once
 * on those very pointers, as the timed search runs them. *need grows to
 * the workspace it takes.
 */
static int pick(cuda_backend *be, gpu_layer *g, const dsrt_layer *L, int dir, const void *a,
                const void *b, void *c, void *fws, size_t fws_size, size_t *need) {
    algo_perf r[ALGO_MAX];
    int got = 0;
    size_t cap = be->frozen ? be->ws_size : FIND_WS_MAX;
    DNN(cudnnSetConvolutionMathType(g->cd, be->conv_math));
    DNN(dir_search(be, g, dir, a, b, c, fws, fws_size, r, &got));
    for (int k = 0; k < got; k++) {
        if (!USABLE(be, r[k]) || r[k].memory > cap) continue;
        size_t sz = 0;
        cudnnMathType_t m = math_for(be, r[k].math);
        DNN(cudnnSetConvolutionMathType(g->cd, m));
        if (dir_workspace(be, g, dir, r[k].algo, &sz) != CUDNN_STATUS_SUCCESS || sz > cap) continue;
        if (be->det) {
            TRY(ensure_workspace(be, sz));
            if (dir_run(be, g, dir, r[k].algo, a, b, c) != CUDNN_STATUS_SUCCESS) {
                (void)cudaGetLastError();
                continue;
            }
        }
        if (dir == DIR_FWD) {
            g->al.fwd = (cudnnConvolutionFwdAlgo_t)r[k].algo;
            g->al.m_fwd = m;
        } else if (dir == DIR_DATA) {
            g->al.data = (cudnnConvolutionBwdDataAlgo_t)r[k].algo;
            g->al.m_data = m;
        } else {
            g->al.filter = (cudnnConvolutionBwdFilterAlgo_t)r[k].algo;
            g->al.m_filter = m;
        }
        if (sz > *need) *need = sz;
        g->al.own[dir] = 0;
        return 0;
    }
    /* None: dsrt's direct convolution runs this direction (correct for any
     * shape, deterministic, slow), said once in the backend's note. */
    g->al.own[dir] = 1;
    if (!strstr(be->net->backend_note, L->name)) {
        size_t used = strlen(be->net->backend_note);
        snprintf(be->net->backend_note + used, sizeof be->net->backend_note - used,
                 "%slayer '%s': cuDNN has no %s%s algorithm%s: dsrt's direct convolution",
                 used ? "; " : "", L->name, be->det ? "deterministic " : "", DIR_NAME[dir],
                 be->frozen ? " within the workspace reserved" : "");
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Planning

/* Batchnorm in training through cuDNN's Ex calls: persistent NHWC kernels,
 * the ReLU after it fused (not a leaky one). Sizes its workspaces and
 * reserve space; bn_ex stays 0 where cuDNN refuses the layer. */
static int plan_bn_ex(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    g->bn_ex = 0;
    if (!p->train) return 0;
    /* Its kernels read a pixel's channels 16 bytes at a time: cuDNN accepts
     * any channel count, but a row that is not a multiple of 16 bytes (6
     * fp32 channels) faults with misaligned reads once they run (seen on an
     * H100 with cuDNN 9, found by compute-sanitizer). Such layers run dsrt's
     * kernels. */
    size_t el = be->bf16 ? sizeof(uint16_t) : sizeof(float);
    if (((size_t)L->out.c * el) % 16 != 0) return 0;
    /* Its per-channel vectors are read the same way: the scale and shift,
     * their gradients (the flat buffers at the layer's offsets, the buffers
     * on 256 bytes) and the running statistics must each start on 16 bytes. */
    size_t vec = (L->w_off | L->b_off | L->s_off | (L->s_off + (size_t)L->out.c)) * sizeof(float);
    if (vec % 16 != 0) return 0;
    /* With the ReLU fused where cuDNN takes it, else batchnorm alone and the
     * ReLU by dsrt's kernel (the fused op is refused in some precisions). */
    int relu = L->fuse_relu && L->fuse_leak == 0.0f;
    size_t fws = 0, bws = 0, res = 0;
    cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
    cudnnStatus_t st = CUDNN_STATUS_NOT_SUPPORTED;
    for (int fused = relu; fused >= 0 && st != CUDNN_STATUS_SUCCESS; fused--) {
        g->bn_ops = fused ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN;
        cudnnActivationDescriptor_t act = fused ? g->act : NULL;
        st = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
            be->dnn, mode, g->bn_ops, in->yd, NULL, g->yd, g->bd, act, &fws);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
                be->dnn, mode, g->bn_ops, in->yd, g->yd, g->yd, NULL, in->yd, g->bd, act, &bws);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(be->dnn, mode, g->bn_ops, act,
                                                                      in->yd, &res);
    }
    if (st != CUDNN_STATUS_SUCCESS) return 0;
    g->bn_ex = 1;
    g->bn_reserve_size = res ? res : 1;
    *need = DSRT_MAX(*need, DSRT_MAX(fws, bws));
    return 0;
}

/* The descriptors of layer i (no tensor needed yet). */
static int plan_layer_desc(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    int n = p->n;
    dsrt_k_type t = L->kind == DSRT_LAYER_SOFTMAX ? DSRT_K_F32 : be->act;
    g->kd = kdesc(n, L->out.c, L->out.h, L->out.w, 1, t);
    if (i == 0) return 0;
    g->in0 = L->inputs[0];
    const dsrt_k_desc xk = p->gl[g->in0].kd;
    switch (L->kind) {
    case DSRT_LAYER_CONV: {
        int sym = !g->pad_explicit;
        TRY(set_nhwc(&g->yd, be->act_dt, n, L->out.c, L->out.h, L->out.w, L));
        TRY(set_nhwc(&g->xd, be->act_dt, n, L->in.c, g->ph, g->pw, L));
        DNN(cudnnCreateFilterDescriptor(&g->wd));
        DNN(cudnnSetFilter4dDescriptor(g->wd, be->act_dt, CUDNN_TENSOR_NHWC, L->out.c,
                                       L->in.c / L->o.groups, L->o.kh, L->o.kw));
        DNN(cudnnCreateConvolutionDescriptor(&g->cd));
        DNN(cudnnSetConvolution2dDescriptor(g->cd, sym ? L->pt : 0, sym ? L->pl : 0, L->o.sh,
                                            L->o.sw, L->o.dh, L->o.dw, CUDNN_CROSS_CORRELATION,
                                            CUDNN_DATA_FLOAT));
        DNN(cudnnSetConvolutionGroupCount(g->cd, L->o.groups));
        DNN(cudnnSetConvolutionMathType(g->cd, be->conv_math));
        g->kconv = (dsrt_k_conv){kdesc(n, L->in.c, g->ph, g->pw, 1, be->act),
                                 kdesc(n, L->out.c, L->out.h, L->out.w, 1, be->act),
                                 L->o.kh,
                                 L->o.kw,
                                 L->o.sh,
                                 L->o.sw,
                                 L->o.dh,
                                 L->o.dw,
                                 sym ? L->pt : 0,
                                 sym ? L->pl : 0,
                                 L->o.groups};
        if (L->b_n) TRY(set_param_desc(&g->bd, L->out.c, L));
        DNN(cudnnCreateActivationDescriptor(&g->act));
        DNN(cudnnSetActivationDescriptor(
            g->act, L->fuse_relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
            CUDNN_PROPAGATE_NAN, 0.0));
        int on, oc, oh, ow;
        DNN(cudnnGetConvolution2dForwardOutputDim(g->cd, g->xd, g->wd, &on, &oc, &oh, &ow));
        if (on != n || oc != L->out.c || oh != L->out.h || ow != L->out.w)
            return dsrt__fail(DSRT_EBACKEND,
                              "cuda backend: layer '%s' (line %d): cuDNN makes a %dx%dx%d output, "
                              "the layer %dx%dx%d",
                              L->name, L->line, oc, oh, ow, L->out.c, L->out.h, L->out.w);
        return 0;
    }
    case DSRT_LAYER_BATCHNORM: {
        cudnnTensorDescriptor_t xd = p->gl[g->in0].yd;
        if (!xd) {
            /* Its input was made by a layer cuDNN does not see. */
            TRY(set_nhwc(&p->gl[g->in0].yd, be->act_dt, n, L->in.c, L->in.h, L->in.w, L));
            xd = p->gl[g->in0].yd;
        }
        TRY(set_nhwc(&g->yd, be->act_dt, n, L->out.c, L->out.h, L->out.w, L));
        if (!g->bd) DNN(cudnnCreateTensorDescriptor(&g->bd));
        DNN(cudnnDeriveBNTensorDescriptor(g->bd, xd, CUDNN_BATCHNORM_SPATIAL));
        DNN(cudnnCreateActivationDescriptor(&g->act));
        DNN(cudnnSetActivationDescriptor(g->act, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
        return plan_bn_ex(be, p, i, need);
    }
    case DSRT_LAYER_MAXPOOL:
    case DSRT_LAYER_AVGPOOL:
    case DSRT_LAYER_GAP: {
        int gap = L->kind == DSRT_LAYER_GAP;
        g->pool = (dsrt_k_pool){xk,
                                g->kd,
                                gap ? L->in.h : L->o.kh,
                                gap ? L->in.w : L->o.kw,
                                gap ? 1 : L->o.sh,
                                gap ? 1 : L->o.sw,
                                gap ? 0 : L->pt,
                                gap ? 0 : L->pl,
                                L->kind == DSRT_LAYER_MAXPOOL ? DSRT_K_POOL_MAX
                                : L->kind == DSRT_LAYER_AVGPOOL && !L->o.count_pad
                                    ? DSRT_K_POOL_AVG_INSIDE
                                    : DSRT_K_POOL_AVG};
        return 0;
    }
    case DSRT_LAYER_LRN:
        g->lrn = (dsrt_k_lrn){L->o.lrn_size, L->o.alpha, L->o.beta, L->o.k};
        return 0;
    case DSRT_LAYER_INPUT:
    case DSRT_LAYER_RELU:
    case DSRT_LAYER_FC:
    case DSRT_LAYER_DROPOUT:
    case DSRT_LAYER_SOFTMAX:
    case DSRT_LAYER_ADD:
    case DSRT_LAYER_CONCAT:
        return 0;
    }
    return dsrt__fail(DSRT_EUNSUPPORTED, "cuda backend: layer '%s': kind %d", L->name,
                      (int)L->kind);
}

/* Where layer i's backward writes the gradient for input j (a layer it
 * takes): j's gradient when layer i is the last layer written that takes j
 * (backward runs last to first, so it writes first), else the plan's acc,
 * which grad_add then adds into j's gradient. */
static void *grad_ptr(const gpu_plan *p, int i, int j) {
    return p->last_use[j] == i ? p->gl[j].dy : p->acc;
}

/* After layer i wrote input j's share into grad_ptr: added where it went
 * to acc. */
static int grad_add(cuda_backend *be, gpu_plan *p, int i, int j) {
    if (p->last_use[j] == i) return 0;
    const dsrt_layer *L = &be->net->layers[i];
    dsrt_k_sum s = {{p->gl[j].dy, p->acc}, 2};
    CU(dsrt_k_sum_fwd(be->act, &s, p->gl[j].dy, out_count(&be->net->layers[j], p->n), 0, 0.0f,
                      be->compute));
    return 0;
}

/* The tensor a convolution reads: its input, or the padded copy. */
static const void *conv_input(const gpu_plan *p, int i) {
    const gpu_layer *g = &p->gl[i];
    return g->pad_explicit ? g->xp : p->gl[g->in0].y;
}

/*
 * Whether convolution i runs fused with its bias and activation in one
 * cuDNN call: it has a bias, the activation after it is a plain ReLU or
 * none (identity needs IMPLICIT_PRECOMP_GEMM, cuDNN's rule), and one trial
 * call on the plan's tensors succeeds; else the bias and any ReLU run in
 * one dsrt kernel after the convolution.
 */
static void plan_conv_fuse(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    g->fuse = L->b_n || L->fuse_relu ? FUSE_KERNEL : FUSE_NONE;
    if (!L->b_n || !be->net->opts.fuse || g->al.own[DIR_FWD]) return;
    if (L->fuse_relu ? L->fuse_leak != 0.0f
                     : g->al.fwd != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
        return;
    if (cudnnSetConvolutionMathType(g->cd, g->al.m_fwd) != CUDNN_STATUS_SUCCESS) return;
    g->bias16 = 0;
    cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
        be->dnn, &ONE, g->xd, conv_input(p, i), g->wd, weights(be, L), g->cd, g->al.fwd, be->ws,
        be->ws_size, &ZERO, g->yd, g->y, g->bd, be->params + L->b_off, g->act, g->yd, g->y);
    (void)cudaGetLastError();
    /* A float bias with bfloat16 data is not among cuDNN's documented
     * configurations: again with the bias's bfloat16 copy (which the
     * optimizer refreshes with the weights), where it starts on 16 bytes as
     * cuDNN's vector loads want. */
    if (st != CUDNN_STATUS_SUCCESS && be->bf16 && (L->b_off * sizeof(dsrt_bf16)) % 16 == 0) {
        if (!g->bd16 && cudnnCreateTensorDescriptor(&g->bd16) != CUDNN_STATUS_SUCCESS) return;
        if (cudnnSetTensor4dDescriptor(g->bd16, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, 1, L->out.c,
                                       1, 1) != CUDNN_STATUS_SUCCESS)
            return;
        st = cudnnConvolutionBiasActivationForward(
            be->dnn, &ONE, g->xd, conv_input(p, i), g->wd, weights(be, L), g->cd, g->al.fwd, be->ws,
            be->ws_size, &ZERO, g->yd, g->y, g->bd16, be->w16 + L->b_off, g->act, g->yd, g->y);
        (void)cudaGetLastError();
        g->bias16 = st == CUDNN_STATUS_SUCCESS;
    }
    if (st == CUDNN_STATUS_SUCCESS) g->fuse = FUSE_CUDNN;
}

/* One trial of batchnorm i's Ex calls on the plan's tensors (running
 * statistics and parameter gradients left alone: scratch takes them);
 * bn_ex goes back to 0 where they fail. */
static void plan_bn_try(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    if (!g->bn_ex) return;
    cudnnActivationDescriptor_t act =
        g->bn_ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION ? g->act : NULL;
    const float *scale = be->params + L->w_off, *shift = be->params + L->b_off;
    cudnnStatus_t st = cudnnBatchNormalizationForwardTrainingEx(
        be->dnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, g->bn_ops, &ONE, &ZERO, in->yd, in->y, NULL,
        NULL, g->yd, g->y, g->bd, scale, shift, 0.0, NULL, NULL, (double)L->o.eps, g->save_mean,
        g->save_inv, act, be->ws, be->ws_size, g->bn_reserve, g->bn_reserve_size);
    if (st == CUDNN_STATUS_SUCCESS && in->dy && g->dy)
        st = cudnnBatchNormalizationBackwardEx(
            be->dnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, g->bn_ops, &ONE, &ZERO, &ONE, &ZERO,
            in->yd, in->y, g->yd, g->y, g->yd, g->dy, NULL, NULL, in->yd, in->dy, g->bd, scale,
            shift, g->save_var, g->bn_bsums, (double)L->o.eps, g->save_mean, g->save_inv, act,
            be->ws, be->ws_size, g->bn_reserve, g->bn_reserve_size);
    (void)cudaGetLastError();
    if (st != CUDNN_STATUS_SUCCESS) g->bn_ex = 0;
}

/* The convolution algorithms of layer i, searched on the plan's own
 * tensors, the layer's weights and its gradient in the flat buffers: the
 * pointers the steps use. */
static int plan_conv_algos(cuda_backend *be, gpu_plan *p, int i, void *fws, size_t fws_size,
                           size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    const void *x = conv_input(p, i), *w = weights(be, L);
    TRY(pick(be, g, L, DIR_FWD, x, w, g->y, fws, fws_size, need));
    if (!p->train) return 0;
    void *dw = be->bf16 ? (void *)(be->g16 + L->w_off) : (void *)(be->grads + L->w_off);
    TRY(pick(be, g, L, DIR_FILTER, x, g->dy, dw, fws, fws_size, need));
    g->al.has_data = dsrt__net_need_diff(be->net, L->inputs[0]);
    if (g->al.has_data) {
        void *dx = g->pad_explicit ? g->xp : grad_ptr(p, i, g->in0);
        TRY(pick(be, g, L, DIR_DATA, w, g->dy, dx, fws, fws_size, need));
    }
    return 0;
}

/* Makes the shared workspace at least `need` bytes. */
static int ensure_workspace(cuda_backend *be, size_t need) {
    if (need <= be->ws_size) return 0;
    if (be->ws) {
        TRY(quiet(be)); /* queued work may still use it */
        TRY(dev_free(be, be->ws));
        be->ws = NULL;
        be->ws_size = 0;
    }
    TRY(dev_alloc(be, &be->ws, need, NULL));
    be->ws_size = need;
    return 0;
}

/* The smallest plan of the same mode whose own memory holds `bytes`. */
static gpu_plan *plan_owner(cuda_backend *be, int train, size_t bytes) {
    gpu_plan *best = NULL;
    for (int k = 0; k < PLAN_SLOTS; k++) {
        gpu_plan *q = be->plans[k];
        if (q && !q->owner && q->train == train && q->mem_size >= bytes &&
            (!best || q->mem_size < best->mem_size))
            best = q;
    }
    return best;
}

/* Which outputs carry a gradient: those backward must produce, and the
 * input of a batchnorm (cuDNN always computes it); a layer that shares
 * its input's tensors passes the need on. The classifier's output has
 * none. */
static void plan_need_dy(dsrt_net *net, int train, int *need_dy) {
    int nl = net->n_layers;
    for (int i = nl - 1; train && i >= 0; i--) {
        const dsrt_layer *l = &net->layers[i];
        if (i < nl - 1) need_dy[i] |= dsrt__net_need_diff(net, i);
        if (l->kind == DSRT_LAYER_BATCHNORM) need_dy[l->inputs[0]] = 1;
        if (i > 0 && aliases(l, train) && need_dy[i]) need_dy[l->inputs[0]] = 1;
    }
}

/* Convolution algorithms, timed with a scratch workspace as large as
 * memory allows (up to FIND_WS_MAX), or once sizes are reserved, in the
 * workspace as it is; need grows to the workspace they want. */
static int plan_search(cuda_backend *be, gpu_plan *p, size_t *need) {
    dsrt_net *net = be->net;
    int nl = net->n_layers, rc = 0;
    void *fws = NULL;
    int fws_own = 0;
    int convs = 0, bns = 0;
    for (int i = 1; i < nl; i++) {
        convs += net->layers[i].kind == DSRT_LAYER_CONV;
        bns += p->gl[i].bn_ex;
    }
    size_t fws_size = 0;
    /* A search blocks the host until the device is done with what is
     * queued: with collectives possible, wait for that with the deadline. */
    if ((convs || bns) && (be->frozen || collectives_possible(be)) && (rc = quiet(be))) goto fail;
    if (convs && !be->det) {
        if (be->frozen) {
            fws = be->ws;
            fws_size = be->ws_size;
        } else {
            size_t free_b = 0, total_b = 0;
            cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
            if (e != cudaSuccess) {
                rc = cu_fail(e, "cudaMemGetInfo", NULL);
                goto fail;
            }
            fws_size = free_b / 2 < FIND_WS_MAX ? free_b / 2 : FIND_WS_MAX;
            while (fws_size >= ((size_t)1 << 20) && cudaMalloc(&fws, fws_size) != cudaSuccess) {
                (void)cudaGetLastError();
                fws = NULL;
                fws_size /= 2;
            }
            fws_own = fws != NULL;
            if (!fws) fws_size = 0;
        }
    }
    for (int i = 1; i < nl; i++) {
        if (net->layers[i].kind != DSRT_LAYER_CONV) continue;
        if ((rc = plan_conv_algos(be, p, i, fws, fws_size, need))) goto fail;
    }
    /* The search's memory goes back before the workspace grows. */
    if (fws_own) {
        cudaError_t e = cudaFree(fws);
        fws = NULL;
        fws_own = 0;
        if (e != cudaSuccess) return cu_fail(e, "cudaFree", NULL);
    }
    return 0;
fail:
    if (fws_own) cudaFree(fws);
    return rc;
}

static int plan_build(cuda_backend *be, int n, int train, gpu_plan **out) {
    dsrt_net *net = be->net;
    int nl = net->n_layers, rc = 0;
    int *need_dy = NULL;
    void **share = NULL;
    size_t need = 0;
    *out = NULL;
    gpu_plan *p = dsrt__calloc(1, sizeof *p);
    if (!p) return -ENOMEM;
    p->n = n;
    p->train = train;
    p->n_layers = nl;
    p->gl = dsrt__calloc((size_t)nl, sizeof *p->gl);
    need_dy = dsrt__calloc((size_t)nl, sizeof *need_dy);
    share = dsrt__calloc((size_t)nl, sizeof *share);
    if (!p->gl || !need_dy || !share) {
        rc = -ENOMEM;
        goto fail;
    }
    plan_need_dy(net, train, need_dy);
    p->last_use = dsrt__calloc((size_t)nl, sizeof *p->last_use);
    if (!p->last_use) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 1; i < nl; i++)
        for (int k = 0; k < net->layers[i].n_inputs; k++) p->last_use[net->layers[i].inputs[k]] = i;
    for (int i = 1; i < nl; i++) {
        const dsrt_layer *l = &net->layers[i];
        gpu_layer *g = &p->gl[i];
        g->pad_explicit = pad_explicit(l);
        g->ph = l->in.h + (g->pad_explicit ? l->pt + l->pb : 0);
        g->pw = l->in.w + (g->pad_explicit ? l->pl + l->pr : 0);
    }
    for (int i = 0; i < nl; i++)
        if ((rc = plan_layer_desc(be, p, i, &need))) goto fail;
    carve c = {NULL, 0};
    plan_layout(be, p, &c, need_dy, share);
    p->mem_size = c.at ? c.at : 1;
    /* Once sizes are reserved, a smaller batch's tensors lie in the memory of
     * a larger batch's plan of the same mode (only one of them runs at a
     * time: they share the compute stream). */
    p->owner = be->frozen ? plan_owner(be, train, p->mem_size) : NULL;
    if (p->owner)
        p->mem = p->owner->mem;
    else if ((rc = dev_alloc(be, &p->mem, p->mem_size, NULL)))
        goto fail;
    c.base = p->mem;
    c.at = 0;
    plan_layout(be, p, &c, need_dy, share);

    if ((rc = plan_search(be, p, &need))) goto fail;
    if ((rc = ensure_workspace(be, need))) goto fail;
    /* The fused calls, tried once on the plan's tensors. */
    for (int i = 1; i < nl; i++) {
        if (net->layers[i].kind == DSRT_LAYER_CONV) plan_conv_fuse(be, p, i);
        if (net->layers[i].kind == DSRT_LAYER_BATCHNORM) plan_bn_try(be, p, i);
    }
    free(need_dy);
    free(share);
    *out = p;
    return 0;
fail:
    free(need_dy);
    free(share);
    plan_free(p);
    return rc;
}

/* Whether plan slot k may give way: not reserved, and no other plan lives
 * in its memory. */
static int evictable(const cuda_backend *be, int k) {
    const gpu_plan *p = be->plans[k];
    if (!p || p->reserved) return 0;
    for (int j = 0; j < PLAN_SLOTS; j++)
        if (be->plans[j] && be->plans[j]->owner == p) return 0;
    return 1;
}

static int settle(cuda_backend *be);

/* The plan for (n, train), built on first use; the least recently used
 * plan that may give way does when every slot is taken. Building one runs
 * convolutions on the net's gradient buffer (the algorithm search): the
 * work waiting for them (an optimizer step) is queued first. */
static int plan_get(cuda_backend *be, int n, int train, gpu_plan **out) {
    int slot = -1;
    for (int k = 0; k < PLAN_SLOTS; k++) {
        gpu_plan *p = be->plans[k];
        if (p && p->n == n && p->train == train) {
            p->used = ++be->clock;
            *out = p;
            return 0;
        }
        if (!p && slot < 0) slot = k;
    }
    TRY(settle(be));
    if (slot < 0) {
        for (int k = 0; k < PLAN_SLOTS; k++)
            if (evictable(be, k) && (slot < 0 || be->plans[k]->used < be->plans[slot]->used))
                slot = k;
        if (slot < 0)
            return dsrt__fail(DSRT_EBACKEND,
                              "cuda backend: %d batch shapes are in use at once, the most it keeps",
                              PLAN_SLOTS);
        gpu_plan *old = be->plans[slot];
        /* Its tensors may still be in use by queued work. */
        if (!old->owner) TRY(quiet(be));
        if (be->last_train == old) be->last_train = NULL;
        if (be->last_infer == old) be->last_infer = NULL;
        if (be->last == old) be->last = NULL;
        graphs_drop(be);
        plan_free(old);
        be->plans[slot] = NULL;
    }
    TRY(plan_build(be, n, train, &be->plans[slot]));
    be->plans[slot]->used = ++be->clock;
    *out = be->plans[slot];
    return 0;
}

// ----------------------------------------------------------------------------
// Callouts: the host's part of a step

static int rec_cut(cuda_backend *be, const callout *after);

static int callout_run(cuda_backend *be, const callout *c) {
    dsrt_net *net = be->net;
    if (c->kind == CALL_GRADS) {
        dsrt__net_grads_ready(net, c->layer);
        return 0;
    }
    if (c->kind != CALL_BN) return 0;
    if (!net->bn_sync_fn)
        return dsrt__fail(DSRT_EBACKEND,
                          "cuda backend: layer '%s': the batchnorm hook was removed during a "
                          "synchronised step",
                          net->layers[c->layer].name);
    dsrt_bn_sums bs = c->bs;
    return net->bn_sync_fn(net->bn_sync_ctx, &bs);
}

/* A callout where the step has come to: now, or in a recording after the
 * segment recorded so far. */
static int callout_at(cuda_backend *be, const callout *c) {
    return be->rec ? rec_cut(be, c) : callout_run(be, c);
}

/* Layer i's gradients are queued: its bucket, if it closes one. */
static int grads_ready(cuda_backend *be, int i) {
    const dsrt_net *net = be->net;
    if (!net->ready_fn || net->layer_bucket[i] < 0) return 0;
    callout c = {CALL_GRADS, i, {0}};
    return callout_at(be, &c);
}

static int bn_callout(cuda_backend *be, int i, int backward, double *sums, size_t n) {
    const dsrt_layer *L = &be->net->layers[i];
    callout c = {CALL_BN, i, {i, backward, L->out.c, sums, n, be->device, be->compute}};
    return callout_at(be, &c);
}

// ----------------------------------------------------------------------------
// Profile events

static void prof_free(prof_events *e, int n_layers) {
    for (int i = 0; i < n_layers && e->fwd0; i++) {
        cudaEvent_t *all[] = {&e->fwd0[i], &e->fwd1[i], &e->bwd0[i], &e->bwd1[i]};
        for (int k = 0; k < 4; k++)
            if (*all[k]) cudaEventDestroy(*all[k]);
    }
    if (e->opt0) cudaEventDestroy(e->opt0);
    if (e->opt1) cudaEventDestroy(e->opt1);
    free(e->fwd0);
    free(e->fwd1);
    free(e->bwd0);
    free(e->bwd1);
    memset(e, 0, sizeof *e);
}

/* The events of a profiled step, made the first time. */
static int prof_ready(cuda_backend *be) {
    prof_events *e = &be->prof;
    const dsrt_layer *L = NULL;
    int n = be->net->n_layers;
    if (e->fwd0) return 0;
    e->fwd0 = dsrt__calloc((size_t)n, sizeof *e->fwd0);
    e->fwd1 = dsrt__calloc((size_t)n, sizeof *e->fwd1);
    e->bwd0 = dsrt__calloc((size_t)n, sizeof *e->bwd0);
    e->bwd1 = dsrt__calloc((size_t)n, sizeof *e->bwd1);
    if (!e->fwd0 || !e->fwd1 || !e->bwd0 || !e->bwd1) {
        prof_free(e, n);
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        CU(cudaEventCreate(&e->fwd0[i]));
        CU(cudaEventCreate(&e->fwd1[i]));
        CU(cudaEventCreate(&e->bwd0[i]));
        CU(cudaEventCreate(&e->bwd1[i]));
    }
    CU(cudaEventCreate(&e->opt0));
    CU(cudaEventCreate(&e->opt1));
    return 0;
}

static int profiling(const cuda_backend *be) {
    return dsrt__prof_on(be->net) && be->prof.fwd0 != NULL;
}

/* Records the profile event set[i] when the step is profiled. */
static int prof_mark(cuda_backend *be, cudaEvent_t *set, int i) {
    const dsrt_layer *L = NULL;
    if (profiling(be)) CU(mark(be, set[i]));
    return 0;
}

static double elapsed_s(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return ms / 1e3;
}

/* The last profiled step's times into the net's profile: each layer's
 * forward and backward, the optimizer, and between consecutive pieces of
 * the forward and backward the device's idle gaps. Waits for the step. */
static int prof_collect(cuda_backend *be) {
    prof_events *e = &be->prof;
    dsrt_net *net = be->net;
    dsrt_net_prof *pr = net->prof;
    if (!e->recorded || !pr) return 0;
    e->recorded = 0;
    cudaEvent_t last = e->has_bwd ? e->bwd1[1] : e->fwd1[net->n_layers - 1];
    TRY(wait_event(be, last, "cudaEventSynchronize"));
    if (e->has_opt) {
        TRY(wait_event(be, e->opt1, "cudaEventSynchronize"));
        pr->opt_s += elapsed_s(e->opt0, e->opt1);
        pr->opt_steps++;
    }
    if (!e->has_bwd) return 0;
    cudaEvent_t first = e->fwd0[0], prev = NULL;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < net->n_layers; k++) {
            int i = pass ? net->n_layers - 1 - k : k;
            if (pass && i == 0) continue;
            if (i > 0 && net->layers[i].fused_away) continue;
            cudaEvent_t a = pass ? e->bwd0[i] : e->fwd0[i], b = pass ? e->bwd1[i] : e->fwd1[i];
            double t = elapsed_s(a, b);
            if (pass)
                pr->bwd_s[i] += t;
            else
                pr->fwd_s[i] += t;
            if (prev) {
                double gap = elapsed_s(prev, a);
                if (gap > 0) pr->gap_s += gap;
                pr->gaps++;
            }
            prev = b;
        }
    pr->span_s += elapsed_s(first, prev);
    pr->steps++;
    pr->graph_steps += e->replayed;
    return 0;
}

// ----------------------------------------------------------------------------
// Forward

/* The input stage: the staged batch, normalised into layer 0's output
 * (NHWC, the activations' type) straight from the slot. */
static int fwd_input(cuda_backend *be, gpu_plan *p, const stage_slot *s) {
    const dsrt_layer *L = &be->net->layers[0];
    const dsrt_k_desc *yd = &p->gl[0].kd;
    const float *stats = L->o.norm != DSRT_NORM_NONE ? be->state + L->s_off : NULL;
    if (s->layout == DSRT_INPUT_U8_NHWC) {
        dsrt_k_pixel pix;
        memcpy(pix.sub, s->sub, sizeof pix.sub);
        memcpy(pix.div, s->div, sizeof pix.div);
        CU(dsrt_k_input_u8(s->x, &pix, L->o.norm, stats, yd, p->gl[0].y, be->compute));
    } else {
        CU(dsrt_k_input_f32(s->x, L->o.norm, stats, yd, p->gl[0].y, be->compute));
    }
    return 0;
}

static dsrt_k_desc padded_desc(const cuda_backend *be, const gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    const gpu_layer *g = &p->gl[i];
    return kdesc(p->n, L->in.c, g->ph, g->pw, 1, be->act);
}

static int fwd_conv(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    if (g->pad_explicit) {
        dsrt_k_desc pd = padded_desc(be, p, i);
        CU(dsrt_k_pad(&in->kd, in->y, &pd, g->xp, L->pt, L->pl, 0.0f, 0, be->compute));
    }
    const void *x = conv_input(p, i), *w = weights(be, L);
    const float *b = L->b_n ? be->params + L->b_off : NULL;
    if (g->al.own[DIR_FWD]) {
        CU(dsrt_k_conv_fwd(&g->kconv, x, w, g->y, be->compute));
        if (g->fuse == FUSE_KERNEL)
            CU(dsrt_k_bias_act(&g->kd, g->y, b, g->y, L->fuse_relu, L->fuse_leak, be->compute));
        return 0;
    }
    DNN(cudnnSetConvolutionMathType(g->cd, g->al.m_fwd));
    if (g->fuse == FUSE_CUDNN) {
        DNN(cudnnConvolutionBiasActivationForward(
            be->dnn, &ONE, g->xd, x, g->wd, w, g->cd, g->al.fwd, be->ws, be->ws_size, &ZERO, g->yd,
            g->y, g->bias16 ? g->bd16 : g->bd,
            g->bias16 ? (const void *)(be->w16 + L->b_off) : (const void *)b, g->act, g->yd, g->y));
        return 0;
    }
    DNN(cudnnConvolutionForward(be->dnn, &ONE, g->xd, x, g->wd, w, g->cd, g->al.fwd, be->ws,
                                be->ws_size, &ZERO, g->yd, g->y));
    if (g->fuse == FUSE_KERNEL)
        CU(dsrt_k_bias_act(&g->kd, g->y, b, g->y, L->fuse_relu, L->fuse_leak, be->compute));
    return 0;
}

/*
 * Batchnorm by dsrt's kernels: in training this batch's sums of x and x^2
 * per channel (synchronised: handed to the net's hook, which queues their
 * sum over the workers on the compute stream), the statistics and the
 * running averages from them exactly as the CPU backend makes them, then
 * the normalised output with the ReLU after it; at inference the running
 * statistics. What runs when the statistics are synchronised, when cuDNN
 * refused the layer's Ex calls, and at inference.
 */
static int fwd_batchnorm_kernels(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    int c = L->out.c;
    const float *scale = be->params + L->w_off, *shift = be->params + L->b_off;
    float *rm = be->state + L->s_off, *rv = rm + c;
    if (!p->train) {
        CU(dsrt_k_bn_apply(&in->kd, in->y, rm, NULL, rv, L->o.eps, scale, shift, L->fuse_relu,
                           L->fuse_leak, g->y, be->compute));
        return 0;
    }
    CU(dsrt_k_bn_sums(&in->kd, in->y, g->bn_sums, p->bn_work, be->compute));
    if (p->bn_sync) TRY(bn_callout(be, i, 0, g->bn_sums, (size_t)2 * c + 1));
    CU(dsrt_k_bn_stats(g->bn_sums, c, L->o.eps, L->o.momentum, g->save_mean, g->save_var,
                       g->save_inv, rm, rv, be->compute));
    CU(dsrt_k_bn_apply(&in->kd, in->y, g->save_mean, g->save_inv, NULL, 0.0f, scale, shift,
                       L->fuse_relu, L->fuse_leak, g->y, be->compute));
    return 0;
}

/* Batchnorm in training by cuDNN's persistent NHWC kernels (the ReLU after
 * it fused, unless leaky), else by dsrt's kernels. */
static int fwd_batchnorm(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    if (!p->train || !g->bn_ex || p->bn_sync) return fwd_batchnorm_kernels(be, p, i);
    int c = L->out.c;
    const float *scale = be->params + L->w_off, *shift = be->params + L->b_off;
    float *rm = be->state + L->s_off, *rv = rm + c;
    /* Running averages as the CPU backend keeps them: r = (1 - momentum) r +
     * momentum batch, the variance unbiased (cuDNN's definition too). One
     * value per channel has no unbiased variance: the CPU backend then
     * takes the biased one (0), done here by hand. */
    int one = (size_t)p->n * L->out.h * L->out.w == 1;
    int fused = g->bn_ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    DNN(cudnnBatchNormalizationForwardTrainingEx(
        be->dnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, g->bn_ops, &ONE, &ZERO, in->yd, in->y, NULL,
        NULL, g->yd, g->y, g->bd, scale, shift, (double)L->o.momentum, one ? NULL : rm,
        one ? NULL : rv, (double)L->o.eps, g->save_mean, g->save_inv, fused ? g->act : NULL, be->ws,
        be->ws_size, g->bn_reserve, g->bn_reserve_size));
    if (one) {
        float m = L->o.momentum, keep = 1.0f - m;
        DNN(cudnnAddTensor(be->dnn, &m, g->bd, g->save_mean, &keep, g->bd, rm));
        DNN(cudnnScaleTensor(be->dnn, g->bd, rv, &keep));
    }
    if (L->fuse_relu && !fused)
        CU(dsrt_k_relu_fwd(be->act, g->y, g->y, out_count(L, p->n), L->fuse_leak, be->compute));
    return 0;
}

/*
 * Fully connected, on row-major tensors through column-major cuBLAS: y (n,
 * out) = x (n, in) W^T, W (out, in), is y^T = W^T' x^T' where cuBLAS sees W
 * as an (in x out) matrix and x as (in x n): gemm(T, N, out, n, in). An
 * image input is put in the host's (c, h, w) order first, the order of W.
 */
static int fwd_fc(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    int n = p->n, oc = L->out.c, ic = L->in.c * L->in.h * L->in.w;
    const void *x = in->y;
    if (flattens(L)) {
        dsrt_k_desc fk = in->kd;
        fk.nhwc = 0;
        CU(dsrt_k_pad(&in->kd, in->y, &fk, g->xf, 0, 0, 0.0f, 0, be->compute));
        x = g->xf;
    }
    if (be->bf16)
        BLAS(cublasGemmEx(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, ic, &ONE, be->w16 + L->w_off,
                          CUDA_R_16BF, ic, x, CUDA_R_16BF, ic, &ZERO, g->y, CUDA_R_16BF, oc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        BLAS(cublasSgemm(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, ic, &ONE, be->params + L->w_off,
                         ic, x, ic, &ZERO, g->y, oc));
    if (L->b_n || L->fuse_relu)
        CU(dsrt_k_bias_act(&g->kd, g->y, L->b_n ? be->params + L->b_off : NULL, g->y, L->fuse_relu,
                           L->fuse_leak, be->compute));
    return 0;
}

static int fwd_layer(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    switch (L->kind) {
    case DSRT_LAYER_CONV:
        return fwd_conv(be, p, i);
    case DSRT_LAYER_BATCHNORM:
        return fwd_batchnorm(be, p, i);
    case DSRT_LAYER_RELU:
        if (!L->fused_away)
            CU(dsrt_k_relu_fwd(be->act, in->y, g->y, out_count(L, p->n), L->o.leak, be->compute));
        return 0;
    case DSRT_LAYER_MAXPOOL:
    case DSRT_LAYER_AVGPOOL:
    case DSRT_LAYER_GAP:
        CU(dsrt_k_pool_fwd(&g->pool, in->y, g->y, g->pool_arg, be->compute));
        return 0;
    case DSRT_LAYER_FC:
        return fwd_fc(be, p, i);
    case DSRT_LAYER_DROPOUT:
        if (p->train)
            CU(dsrt_k_dropout(&g->kd, in->y, g->y, be->net->opts.seed, 0, &be->dconst->iteration, i,
                              L->o.p, be->compute));
        return 0;
    case DSRT_LAYER_LRN:
        CU(dsrt_k_lrn_fwd(&in->kd, &g->lrn, in->y, g->y, g->lrn_scale, be->compute));
        return 0;
    case DSRT_LAYER_SOFTMAX:
        CU(dsrt_k_softmax_xent_fwd(in->y, be->act, p->labels, p->soft, p->n, be->net->classes, g->y,
                                   p->labels ? p->loss : NULL, p->labels ? p->correct : NULL,
                                   p->sm_work, be->compute));
        return 0;
    case DSRT_LAYER_ADD: {
        dsrt_k_sum s = {.n = L->n_inputs};
        for (int k = 0; k < L->n_inputs; k++) s.x[k] = p->gl[L->inputs[k]].y;
        CU(dsrt_k_sum_fwd(be->act, &s, g->y, out_count(L, p->n), L->fuse_relu, L->fuse_leak,
                          be->compute));
        return 0;
    }
    case DSRT_LAYER_CONCAT: {
        int c0 = 0;
        for (int k = 0; k < L->n_inputs; k++) {
            gpu_layer *x = &p->gl[L->inputs[k]];
            CU(dsrt_k_channels(&x->kd, x->y, &g->kd, g->y, c0, 1, 0, be->compute));
            c0 += x->kd.c;
        }
        return 0;
    }
    case DSRT_LAYER_INPUT:
        break;
    }
    return dsrt__fail(DSRT_EUNSUPPORTED, "cuda backend: layer '%s': kind %d", L->name,
                      (int)L->kind);
}

// ----------------------------------------------------------------------------
// Backward

/* The gradient of a layer's output behind the ReLU the layer computes:
 * folded into the bias gradient when there is one (the kernel masks dy in
 * place as it sums it), else on its own. */
static int bias_relu_bwd(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    if (L->b_n)
        CU(dsrt_k_bias_grad(&g->kd, g->dy, L->fuse_relu ? g->y : NULL, L->fuse_leak,
                            be->grads + L->b_off, p->bg_work, be->compute));
    else if (L->fuse_relu)
        CU(dsrt_k_relu_bwd(be->act, g->y, g->dy, g->dy, out_count(L, p->n), L->fuse_leak,
                           be->compute));
    return 0;
}

static int bwd_conv(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    TRY(bias_relu_bwd(be, p, i));
    const void *x = conv_input(p, i), *w = weights(be, L);
    void *dw = be->bf16 ? (void *)(be->g16 + L->w_off) : (void *)(be->grads + L->w_off);
    if (g->al.own[DIR_FILTER]) {
        CU(dsrt_k_conv_bwd_filter(&g->kconv, x, g->dy, dw, be->act, be->compute));
    } else {
        DNN(cudnnSetConvolutionMathType(g->cd, g->al.m_filter));
        DNN(cudnnConvolutionBackwardFilter(be->dnn, &ONE, g->xd, x, g->yd, g->dy, g->cd,
                                           g->al.filter, be->ws, be->ws_size, &ZERO, g->wd, dw));
    }
    /* The all-reduce and the optimizer take float32 gradients. */
    if (be->bf16)
        CU(dsrt_k_bf16_to_f32(be->g16 + L->w_off, be->grads + L->w_off, L->w_n, be->compute));
    TRY(grads_ready(be, i));
    if (!g->al.has_data) return 0;
    /* The padded input was read; its buffer takes the padded gradient. */
    void *dx = g->pad_explicit ? g->xp : grad_ptr(p, i, g->in0);
    if (g->al.own[DIR_DATA]) {
        CU(dsrt_k_conv_bwd_data(&g->kconv, w, g->dy, dx, be->compute));
    } else {
        DNN(cudnnSetConvolutionMathType(g->cd, g->al.m_data));
        DNN(cudnnConvolutionBackwardData(be->dnn, &ONE, g->wd, w, g->yd, g->dy, g->cd, g->al.data,
                                         be->ws, be->ws_size, &ZERO, g->xd, dx));
    }
    if (g->pad_explicit) {
        dsrt_k_desc pd = padded_desc(be, p, i);
        CU(dsrt_k_pad(&pd, g->xp, &in->kd, in->dy, -L->pt, -L->pl, 0.0f, p->last_use[g->in0] != i,
                      be->compute));
        return 0;
    }
    return grad_add(be, p, i, g->in0);
}

static int bwd_batchnorm(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    const float *scale = be->params + L->w_off, *shift = be->params + L->b_off;
    float *dscale = be->grads + L->w_off, *dshift = be->grads + L->b_off;
    if (!g->bn_ex || p->bn_sync) {
        /* dsrt's kernels, the ReLU's backward folded into both passes: the
         * sums of dy' and of dy' xhat are the shift's and the scale's
         * gradients (the gradient all-reduce adds them up), and, summed
         * over the workers when synchronised, give the input gradient's
         * mean and variance terms. */
        int c = L->out.c;
        const void *y = L->fuse_relu ? g->y : NULL;
        CU(dsrt_k_bn_bwd_sums(&in->kd, in->y, g->dy, y, L->fuse_leak, g->save_mean, g->save_inv,
                              g->bn_bsums, dscale, dshift, p->bn_work, be->compute));
        if (p->bn_sync) TRY(bn_callout(be, i, 1, g->bn_bsums, (size_t)2 * c));
        CU(dsrt_k_bn_bwd_dx(&in->kd, in->y, g->dy, y, L->fuse_leak, g->save_mean, g->save_inv,
                            scale, g->bn_bsums, g->bn_sums + 2 * c, grad_ptr(p, i, g->in0),
                            be->compute));
        TRY(grad_add(be, p, i, g->in0));
        return grads_ready(be, i);
    }
    int fused = g->bn_ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    if (L->fuse_relu && !fused)
        CU(dsrt_k_relu_bwd(be->act, g->y, g->dy, g->dy, out_count(L, p->n), L->fuse_leak,
                           be->compute));
    DNN(cudnnBatchNormalizationBackwardEx(
        be->dnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, g->bn_ops, &ONE, &ZERO, &ONE, &ZERO, in->yd,
        in->y, g->yd, g->y, g->yd, g->dy, NULL, NULL, in->yd, grad_ptr(p, i, g->in0), g->bd, scale,
        shift, dscale, dshift, (double)L->o.eps, g->save_mean, g->save_inv, fused ? g->act : NULL,
        be->ws, be->ws_size, g->bn_reserve, g->bn_reserve_size));
    TRY(grad_add(be, p, i, g->in0));
    return grads_ready(be, i);
}

/* Column-major views as in fwd_fc: dW^T (in x out) = x^T (in x n) dy (n x
 * out): gemm(N, T, in, out, n); dx^T (in x n) = W^T (in x out) dy^T (out x
 * n): gemm(N, N, in, n, out). An image input's gradient comes in the
 * host's (c, h, w) order and is put back in NHWC. */
static int bwd_fc(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    int n = p->n, oc = L->out.c, ic = L->in.c * L->in.h * L->in.w, flat = flattens(L);
    TRY(bias_relu_bwd(be, p, i));
    const void *x = flat ? g->xf : in->y;
    float *dw = be->grads + L->w_off;
    if (be->bf16)
        BLAS(cublasGemmEx(be->blas, CUBLAS_OP_N, CUBLAS_OP_T, ic, oc, n, &ONE, x, CUDA_R_16BF, ic,
                          g->dy, CUDA_R_16BF, oc, &ZERO, dw, CUDA_R_32F, ic, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
    else
        BLAS(cublasSgemm(be->blas, CUBLAS_OP_N, CUBLAS_OP_T, ic, oc, n, &ONE, x, ic, g->dy, oc,
                         &ZERO, dw, ic));
    TRY(grads_ready(be, i));
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    void *dx = flat ? g->xf : grad_ptr(p, i, g->in0);
    if (be->bf16)
        BLAS(cublasGemmEx(be->blas, CUBLAS_OP_N, CUBLAS_OP_N, ic, n, oc, &ONE, be->w16 + L->w_off,
                          CUDA_R_16BF, ic, g->dy, CUDA_R_16BF, oc, &ZERO, dx, CUDA_R_16BF, ic,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        BLAS(cublasSgemm(be->blas, CUBLAS_OP_N, CUBLAS_OP_N, ic, n, oc, &ONE, be->params + L->w_off,
                         ic, g->dy, oc, &ZERO, dx, ic));
    if (flat) {
        dsrt_k_desc fk = in->kd;
        fk.nhwc = 0;
        CU(dsrt_k_pad(&fk, g->xf, &in->kd, in->dy, 0, 0, 0.0f, p->last_use[g->in0] != i,
                      be->compute));
        return 0;
    }
    return grad_add(be, p, i, g->in0);
}

/* An add's gradient goes to each input unchanged (behind its ReLU, applied
 * in place first); a concat's channels go to their inputs. */
static int bwd_join(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    if (L->kind == DSRT_LAYER_ADD && L->fuse_relu)
        CU(dsrt_k_relu_bwd(be->act, g->y, g->dy, g->dy, out_count(L, p->n), L->fuse_leak,
                           be->compute));
    int c0 = 0;
    for (int k = 0; k < L->n_inputs; k++) {
        int j = L->inputs[k];
        gpu_layer *in = &p->gl[j];
        if (dsrt__net_need_diff(be->net, j)) {
            if (L->kind == DSRT_LAYER_CONCAT) {
                CU(dsrt_k_channels(&in->kd, in->dy, &g->kd, g->dy, c0, 0, p->last_use[j] != i,
                                   be->compute));
            } else if (in->dy != g->dy) { /* else it shares the add's gradient */
                void *dx = grad_ptr(p, i, j);
                CU(cudaMemcpyAsync(dx, g->dy, out_count(L, p->n) * type_size(be->act),
                                   cudaMemcpyDeviceToDevice, be->compute));
                TRY(grad_add(be, p, i, j));
            }
        }
        c0 += be->net->layers[j].out.c;
    }
    return 0;
}

static int bwd_layer(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    int need_dx = dsrt__net_need_diff(be->net, L->inputs[0]);
    void *dx = need_dx ? grad_ptr(p, i, g->in0) : NULL;
    switch (L->kind) {
    case DSRT_LAYER_CONV:
        return bwd_conv(be, p, i);
    case DSRT_LAYER_BATCHNORM:
        return bwd_batchnorm(be, p, i);
    case DSRT_LAYER_FC:
        return bwd_fc(be, p, i);
    case DSRT_LAYER_ADD:
    case DSRT_LAYER_CONCAT:
        return bwd_join(be, p, i);
    case DSRT_LAYER_RELU:
        if (!need_dx || L->fused_away) return 0;
        CU(dsrt_k_relu_bwd(be->act, g->y, g->dy, dx, out_count(L, p->n), L->o.leak, be->compute));
        break;
    case DSRT_LAYER_MAXPOOL:
    case DSRT_LAYER_AVGPOOL:
    case DSRT_LAYER_GAP:
        if (!need_dx) return 0;
        CU(dsrt_k_pool_bwd(&g->pool, in->y, g->pool_arg, g->dy, dx, be->compute));
        break;
    case DSRT_LAYER_DROPOUT:
        if (!need_dx) return 0;
        CU(dsrt_k_dropout(&g->kd, g->dy, dx, be->net->opts.seed, 0, &be->dconst->iteration, i,
                          L->o.p, be->compute));
        break;
    case DSRT_LAYER_LRN:
        if (!need_dx) return 0;
        CU(dsrt_k_lrn_bwd(&in->kd, &g->lrn, in->y, g->y, g->dy, g->lrn_scale, dx, be->compute));
        break;
    case DSRT_LAYER_SOFTMAX:
        if (!need_dx) return 0;
        CU(dsrt_k_softmax_xent_bwd(g->y, p->labels, p->soft, p->sm_work, p->n, be->net->classes,
                                   1.0f, &be->dconst->grad_scale, dx, be->act, be->compute));
        break;
    case DSRT_LAYER_INPUT:
        return dsrt__fail(DSRT_EUNSUPPORTED, "cuda backend: layer '%s': kind %d", L->name,
                          (int)L->kind);
    }
    return grad_add(be, p, i, g->in0);
}

// ----------------------------------------------------------------------------
// Device time

/* Adds step s's device time: busy from its data's arrival to its last
 * queued work, idle from the previous step's end to that arrival (waiting
 * for the batch or for the host to queue work). */
static void account(cuda_backend *be, int64_t s) {
    int k = (int)(s % EV_RING), pk = (int)((s + EV_RING - 1) % EV_RING);
    float ms = 0;
    if (cudaEventElapsedTime(&ms, be->ev_go[k], be->ev_done[k]) == cudaSuccess)
        be->busy_s += ms / 1e3;
    else
        (void)cudaGetLastError();
    if (s > 0 && cudaEventElapsedTime(&ms, be->ev_done[pk], be->ev_go[k]) == cudaSuccess && ms > 0)
        be->idle_s += ms / 1e3;
    else
        (void)cudaGetLastError();
}

/* Accounts for the steps up to two behind whose work is done, without
 * waiting for the device, unless the ring of events is about to reuse a
 * step's (then it waits for that step). */
static int account_done(cuda_backend *be) {
    while (be->acc_upto + 2 <= be->steps) {
        cudaEvent_t done = be->ev_done[be->acc_upto % EV_RING];
        cudaError_t e = cudaEventQuery(done);
        if (e == cudaErrorNotReady && be->acc_upto + EV_RING <= be->steps + 1) {
            TRY(wait_event(be, done, "cudaEventSynchronize"));
            e = cudaSuccess;
        }
        if (e == cudaErrorNotReady) break;
        if (e != cudaSuccess) (void)cudaGetLastError();
        account(be, be->acc_upto++);
    }
    return 0;
}

/* Marks the end of the work queued so far for the current step. */
static int mark_done(cuda_backend *be) {
    const dsrt_layer *L = NULL;
    if (be->steps == 0) return 0;
    CU(cudaEventRecord(be->ev_done[(be->steps - 1) % EV_RING], be->compute));
    return 0;
}

// ----------------------------------------------------------------------------
// The step's work, as queued op by op or recorded

/* The per-step scalars on the device, from the host's copy (a kernel whose
 * argument carries them; queued before the work that reads them). */
static int put_consts(cuda_backend *be) {
    const dsrt_layer *L = NULL;
    CU(dsrt_k_set_consts(be->dconst, &be->hconst, be->compute));
    return 0;
}

/* The optimizer step waiting in popt (its scalars already in dconst). */
static int opt_body(cuda_backend *be) {
    const dsrt_layer *L = NULL;
    const pending_opt *o = &be->popt;
    TRY(prof_mark(be, &be->prof.opt0, 0));
    CU(dsrt_k_optim_update(&be->kopt, &o->st, &be->dconst->step, be->params, be->grads,
                           be->opt_buf[0], o->n_buf > 1 ? be->opt_buf[1] : NULL,
                           be->bf16 ? be->w16 : NULL, be->compute));
    TRY(prof_mark(be, &be->prof.opt1, 0));
    if (profiling(be)) be->prof.has_opt = 1;
    return 0;
}

/* Forward over plan p from slot s: the layers, the loss and correct count
 * copied back, the events the host waits on. */
static int fwd_body(cuda_backend *be, gpu_plan *p, stage_slot *s) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    prof_events *e = &be->prof;
    TRY(prof_mark(be, e->fwd0, 0));
    TRY(fwd_input(be, p, s));
    TRY(prof_mark(be, e->fwd1, 0));
    for (int i = 1; i < net->n_layers; i++) {
        if (net->layers[i].fused_away) continue;
        TRY(prof_mark(be, e->fwd0, i));
        TRY(fwd_layer(be, p, i));
        TRY(prof_mark(be, e->fwd1, i));
    }
    if (p->labels) {
        CU(cudaMemcpyAsync(be->h_loss, p->loss, sizeof(double), cudaMemcpyDeviceToHost,
                           be->compute));
        CU(cudaMemcpyAsync(be->h_correct, p->correct, sizeof(int32_t), cudaMemcpyDeviceToHost,
                           be->compute));
    }
    CU(mark(be, be->results_ev));
    CU(mark(be, s->consumed));
    return 0;
}

static int bwd_body(cuda_backend *be, gpu_plan *p, stage_slot *s) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    prof_events *e = &be->prof;
    for (int i = net->n_layers - 1; i >= 1; i--) {
        if (net->layers[i].fused_away) continue;
        TRY(prof_mark(be, e->bwd0, i));
        TRY(bwd_layer(be, p, i));
        TRY(prof_mark(be, e->bwd1, i));
    }
    /* The labels of the staged slot were read until here. */
    CU(mark(be, s->consumed));
    return 0;
}

/* Before a step's work: the steps before it accounted for, the batch
 * waited for, the step's start marked, its scalars on the device. */
static int step_pre(cuda_backend *be, stage_slot *s) {
    const dsrt_layer *L = NULL;
    TRY(prof_collect(be));
    TRY(account_done(be));
    int k = (int)(be->steps % EV_RING);
    CU(cudaStreamWaitEvent(be->compute, s->copied, 0));
    CU(cudaEventRecord(be->ev_go[k], be->compute));
    be->steps++;
    be->hconst.iteration = (uint64_t)be->net->iteration;
    if (dsrt__prof_on(be->net)) {
        TRY(prof_ready(be));
        be->prof.has_bwd = be->prof.has_opt = 0;
        be->prof.recorded = 1;
    }
    return put_consts(be);
}

// ----------------------------------------------------------------------------
// Recorded steps

static void graph_free(step_graph *sg) {
    if (!sg) return;
    for (int k = 0; k < sg->n_seg; k++)
        if (sg->seg[k].exec) cudaGraphExecDestroy(sg->seg[k].exec);
    free(sg->seg);
    free(sg);
}

/* Every recorded step goes (their memory changed); a launched graph that
 * is still running is freed when it completes. */
static void graphs_drop(cuda_backend *be) {
    for (int k = 0; k < GRAPH_SLOTS; k++) {
        graph_free(be->graph[k]);
        be->graph[k] = NULL;
    }
    be->graph_gen++;
}

/* What a recording of a training step on plan p from slot `slot` would
 * capture, beyond memory. */
static void step_key_of(const cuda_backend *be, const gpu_plan *p, int slot, step_key *k) {
    const dsrt_net *net = be->net;
    memset(k, 0, sizeof *k);
    k->plan = p;
    k->slot = slot;
    k->layout = be->slot[slot].layout;
    k->labels = p->labels != NULL;
    k->soft = p->soft != NULL;
    k->bn_sync = p->bn_sync;
    k->ready_fn = (const void *)net->ready_fn;
    k->buckets = net->ready_fn ? (const void *)net->buckets : NULL;
    k->n_buckets = net->ready_fn ? net->n_buckets : 0;
    k->bn_fn = (const void *)net->bn_sync_fn;
    k->with_opt = be->popt.on;
    if (be->popt.on) {
        k->solver = be->popt.st.solver;
        k->norm_clip = be->popt.norm_clip;
        k->n_buf = be->popt.n_buf;
        k->bf16 = be->bf16;
        k->seg = be->kopt.seg;
        k->n_seg = be->kopt.n_seg;
        k->blocks = be->kopt.blocks;
    }
    k->profile = profiling(be);
}

/* The cache entry of key k (recorded, or still warming up), made when
 * `make`: the least recently used gives way. */
static step_graph *graph_entry(cuda_backend *be, const step_key *k, int make) {
    int free_slot = -1, old = -1;
    for (int j = 0; j < GRAPH_SLOTS; j++) {
        step_graph *sg = be->graph[j];
        if (!sg) {
            if (free_slot < 0) free_slot = j;
            continue;
        }
        if (!memcmp(&sg->key, k, sizeof *k)) {
            sg->used = ++be->graph_clock;
            return sg;
        }
        if (old < 0 || sg->used < be->graph[old]->used) old = j;
    }
    if (!make) return NULL;
    int j = free_slot >= 0 ? free_slot : old;
    step_graph *sg = dsrt__calloc(1, sizeof *sg);
    if (!sg) return NULL;
    graph_free(be->graph[j]);
    sg->key = *k;
    sg->used = ++be->graph_clock;
    be->graph[j] = sg;
    return sg;
}

static int rec_begin(cuda_backend *be) {
    const dsrt_layer *L = NULL;
    CU(cudaStreamBeginCapture(be->compute, cudaStreamCaptureModeThreadLocal));
    return 0;
}

/* Ends the segment being recorded (then the callout `after`), and begins
 * the next unless after is none. */
static int rec_cut(cuda_backend *be, const callout *after) {
    const dsrt_layer *L = NULL;
    recording *r = be->rec;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CU(cudaStreamEndCapture(be->compute, &graph));
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return cu_fail(e, "cudaGraphInstantiate", L);
    if (r->n_seg == r->cap) {
        int cap = r->cap ? 2 * r->cap : 8;
        segment *ns = realloc(r->seg, (size_t)cap * sizeof *ns);
        if (!ns) {
            cudaGraphExecDestroy(exec);
            return -ENOMEM;
        }
        r->seg = ns;
        r->cap = cap;
    }
    r->seg[r->n_seg].exec = exec;
    r->seg[r->n_seg].after = *after;
    r->n_seg++;
    return after->kind == CALL_NONE ? 0 : rec_begin(be);
}

/* Leaves a recording that failed: the capture ended and discarded. */
static void rec_abandon(cuda_backend *be) {
    recording *r = be->rec;
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(be->compute, &st) == cudaSuccess &&
        st != cudaStreamCaptureStatusNone) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(be->compute, &g);
        if (g) cudaGraphDestroy(g);
    }
    (void)cudaGetLastError();
    for (int k = 0; k < r->n_seg; k++) cudaGraphExecDestroy(r->seg[k].exec);
    free(r->seg);
    memset(r, 0, sizeof *r);
}

/* Records the step's work (the optimizer first when with_opt) into sg's
 * segments. Recording queues nothing: on failure the graphs are turned off
 * for this backend and the caller runs the step op by op. */
static int record(cuda_backend *be, step_graph *sg, gpu_plan *p, stage_slot *s, int with_opt) {
    recording r;
    memset(&r, 0, sizeof r);
    /* Instantiating may allocate device memory: with collectives possible,
     * only on a quiet device. */
    if (collectives_possible(be)) TRY(quiet(be));
    be->rec = &r;
    int rc = rec_begin(be);
    if (!rc && with_opt) rc = opt_body(be);
    if (!rc) rc = fwd_body(be, p, s);
    if (!rc) rc = bwd_body(be, p, s);
    callout none = {CALL_NONE, 0, {0}};
    if (!rc) rc = rec_cut(be, &none);
    be->rec = NULL;
    if (rc) {
        rec_abandon(be);
        be->graphs = 0;
        snprintf(be->net->backend_note, sizeof be->net->backend_note,
                 "CUDA graphs off: recording a step failed: %s", dsrt_last_error());
        return 1;
    }
    sg->seg = r.seg;
    sg->n_seg = r.n_seg;
    be->captures++;
    return 0;
}

/* Launches a recorded step: segment, callout, segment, ... */
static int replay(cuda_backend *be, const step_graph *sg) {
    const dsrt_layer *L = NULL;
    for (int k = 0; k < sg->n_seg; k++) {
        CU(cudaGraphLaunch(sg->seg[k].exec, be->compute));
        TRY(callout_run(be, &sg->seg[k].after));
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Deferred work

/* The training forward queued with its backward: the optimizer step
 * waiting (if any), forward and backward, as a replay of the recorded step
 * when its key has one, else op by op (recorded first once the key has
 * warmed up). */
static int run_step(cuda_backend *be) {
    dsrt_net *net = be->net;
    gpu_plan *p = be->pfwd.plan;
    stage_slot *s = &be->slot[be->pfwd.slot];
    be->pfwd.on = 0;
    int with_opt = be->popt.on;
    TRY(step_pre(be, s));
    step_graph *sg = NULL;
    step_key key;
    step_key_of(be, p, be->pfwd.slot, &key);
    /* Whatever happens now, that optimizer step is this step's (never run
     * twice). */
    be->popt.on = 0;
    if (be->graphs) {
        sg = graph_entry(be, &key, 1);
        if (sg && !sg->n_seg && ++sg->warm > GRAPH_WARMUP) {
            int rc = record(be, sg, p, s, with_opt);
            if (rc < 0) return rc;
        }
        if (sg && !sg->n_seg) sg = NULL;
    }
    if (sg) {
        TRY(replay(be, sg));
        be->graph_steps++;
        be->prof.replayed = 1;
    } else {
        be->prof.replayed = 0;
        if (with_opt) TRY(opt_body(be));
        TRY(fwd_body(be, p, s));
        TRY(bwd_body(be, p, s));
    }
    if (profiling(be)) {
        be->prof.has_bwd = 1;
        be->prof.has_opt = with_opt;
    }
    TRY(mark_done(be));
    if (be->any_bn) net->host_stale |= DSRT_BUF_STATE;
    net->host_stale |= DSRT_BUF_GRADS;
    return 0;
}

/* Queues whatever waits, op by op: the optimizer step, then a training
 * forward whose backward never came. Every call that needs the device's
 * state or queues other work comes here first. */
static int settle(cuda_backend *be) {
    const dsrt_layer *L = NULL;
    CU(cudaSetDevice(be->device));
    if (be->popt.on) {
        be->popt.on = 0;
        TRY(put_consts(be));
        TRY(opt_body(be));
        TRY(mark_done(be));
    }
    if (be->pfwd.on) {
        gpu_plan *p = be->pfwd.plan;
        stage_slot *s = &be->slot[be->pfwd.slot];
        be->pfwd.on = 0;
        TRY(step_pre(be, s));
        TRY(fwd_body(be, p, s));
        TRY(mark_done(be));
        if (be->any_bn) be->net->host_stale |= DSRT_BUF_STATE;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Flat buffers between host and device

/* Uploads the host's parameters and state when they changed since the
 * device last saw them (net->version). */
static int upload(cuda_backend *be) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    if (be->seen_version == net->version) return 0;
    /* A copy from pageable memory first waits for the stream's work without
     * a deadline: with collectives possible, wait for it here instead. */
    if (collectives_possible(be)) TRY(wait_stream(be, be->compute));
    if (net->n_params) {
        TRY(put_flat(be, be->params, net->params));
        if (be->bf16) CU(dsrt_k_f32_to_bf16(be->params, be->w16, net->n_params, be->compute));
    }
    if (net->n_state)
        CU(cudaMemcpyAsync(be->state, net->state, net->n_state * sizeof(float),
                           cudaMemcpyHostToDevice, be->compute));
    be->seen_version = net->version;
    return 0;
}

static int cuda_to_host(dsrt_backend *b, unsigned what) {
    cuda_backend *be = (cuda_backend *)b;
    dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    TRY(settle(be));
    TRY(wait_stream(be, be->compute));
    if (what & DSRT_BUF_PARAMS) TRY(get_flat(be, net->params, be->params));
    if (what & DSRT_BUF_GRADS) TRY(get_flat(be, net->grads, be->grads));
    if ((what & DSRT_BUF_STATE) && net->n_state)
        CU(cudaMemcpy(net->state, be->state, net->n_state * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

static void cuda_device_time(dsrt_backend *b, double *busy_s, double *idle_s) {
    cuda_backend *be = (cuda_backend *)b;
    if (settle(be) == 0 && wait_stream(be, be->compute) == 0)
        while (be->acc_upto < be->steps) account(be, be->acc_upto++);
    else
        (void)cudaGetLastError();
    *busy_s = be->busy_s;
    *idle_s = be->idle_s;
}

// ----------------------------------------------------------------------------
// Staging

/* Makes *buf at least need bytes (what it held is lost). */
static int grow(cuda_backend *be, void **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    if (*buf) {
        TRY(dev_free(be, *buf)); /* cudaFree waits for the work that may read it */
        *buf = NULL;
        *cap = 0;
    }
    TRY(dev_alloc(be, buf, need, NULL));
    *cap = need;
    return 0;
}

static int cuda_stage(dsrt_backend *b, const dsrt_net_batch *batch) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    CU(cudaSetDevice(be->device));
    stage_slot *s = &be->slot[be->next_slot];
    /* A forward waiting for its backward reads the other slot; nothing
     * queued is lost by queuing it now if this one is refilled. */
    if (be->pfwd.on && be->pfwd.slot == be->next_slot) TRY(settle(be));
    size_t values = (size_t)batch->n * net->input.c * net->input.h * net->input.w;
    size_t bytes = values * (batch->layout == DSRT_INPUT_U8_NHWC ? 1 : sizeof(float));
    TRY(grow(be, &s->x, &s->cap, bytes));
    int soft = batch->labels && batch->soft_labels;
    size_t soft_bytes = (size_t)batch->n * net->classes * sizeof(float);
    if (batch->labels) TRY(grow(be, (void **)&s->labels, &s->lcap, batch->n * sizeof(int32_t)));
    if (soft) TRY(grow(be, (void **)&s->soft, &s->scap, soft_bytes));
    /* The slot is refilled only once the step that read it is done. */
    CU(cudaStreamWaitEvent(be->copy, s->consumed, 0));
    CU(cudaMemcpyAsync(s->x, batch->data, bytes, cudaMemcpyHostToDevice, be->copy));
    if (batch->labels)
        CU(cudaMemcpyAsync(s->labels, batch->labels, batch->n * sizeof(int32_t),
                           cudaMemcpyHostToDevice, be->copy));
    if (soft)
        CU(cudaMemcpyAsync(s->soft, batch->soft_labels, soft_bytes, cudaMemcpyHostToDevice,
                           be->copy));
    CU(cudaEventRecord(s->copied, be->copy));
    s->n = batch->n;
    s->layout = batch->layout;
    s->has_labels = batch->labels != NULL;
    s->has_soft = soft;
    for (int c = 0; c < DSRT_K_PIXEL_CH_MAX; c++) {
        s->sub[c] = batch->sub[c];
        s->div[c] = batch->div[c];
    }
    be->staged = be->next_slot;
    be->next_slot ^= 1;
    return 1;
}

static int cuda_stage_wait(dsrt_backend *b) {
    cuda_backend *be = (cuda_backend *)b;
    if (be->staged < 0) return 0;
    return wait_event(be, be->slot[be->staged].copied, "cudaEventSynchronize");
}

// ----------------------------------------------------------------------------
// Steps

/*
 * A forward. Inference runs at once, op by op (after anything waiting); a
 * training forward waits for its backward, to be queued with it (and with
 * the optimizer step waiting) as one step.
 */
static int cuda_forward(dsrt_backend *b, const dsrt_net_batch *batch, int train) {
    cuda_backend *be = (cuda_backend *)b;
    dsrt_net *net = be->net;
    if (be->staged < 0 || be->slot[be->staged].n != batch->n)
        return dsrt__fail(-EINVAL, "cuda backend: forward without its batch staged");
    /* Inference, a training forward that never got its backward, and an
     * upload of host edits go after the work waiting; a training forward
     * takes the optimizer step waiting with it. */
    if (be->pfwd.on || !train || be->seen_version != net->version) TRY(settle(be));
    const dsrt_layer *L = NULL;
    CU(cudaSetDevice(be->device));
    stage_slot *s = &be->slot[be->staged];
    TRY(upload(be));
    gpu_plan *p = NULL;
    TRY(plan_get(be, batch->n, train, &p));
    p->labels = batch->labels && s->has_labels ? s->labels : NULL;
    p->soft = p->labels && batch->soft_labels && s->has_soft ? s->soft : NULL;
    p->bn_sync = train && net->bn_sync_fn != NULL;
    be->hconst.grad_scale = 1.0f / (float)(batch->global_n > 0 ? batch->global_n : batch->n);
    be->last = p;
    if (train)
        be->last_train = p;
    else
        be->last_infer = p;
    be->results_labels = p->labels != NULL;
    if (train) {
        be->pfwd = (pending_fwd){1, p, be->staged};
        return 0;
    }
    TRY(step_pre(be, s));
    TRY(fwd_body(be, p, s));
    TRY(mark_done(be));
    return 0;
}

static int cuda_backward(dsrt_backend *b) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = NULL;
    gpu_plan *p = be->last_train;
    if (!p || !p->labels || be->last != p || !be->pfwd.on || be->pfwd.plan != p)
        return dsrt__fail(-EINVAL, "cuda backend: backward without a training forward");
    CU(cudaSetDevice(be->device));
    return run_step(be);
}

static int cuda_results(dsrt_backend *b, double *loss, int *correct, float *probs) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = NULL;
    gpu_plan *p = be->last;
    if (!p) return dsrt__fail(-EINVAL, "cuda backend: no forward pass");
    TRY(settle(be));
    TRY(wait_event(be, be->results_ev, "cudaEventSynchronize"));
    if (loss) *loss = be->results_labels ? *be->h_loss : 0.0;
    if (correct) *correct = be->results_labels ? (int)*be->h_correct : 0;
    if (probs) {
        const gpu_layer *g = &p->gl[p->n_layers - 1];
        CU(cudaMemcpyAsync(probs, g->y, (size_t)p->n * be->net->classes * sizeof(float),
                           cudaMemcpyDeviceToHost, be->compute));
        TRY(wait_stream(be, be->compute));
    }
    return 0;
}

// ----------------------------------------------------------------------------
// The optimizer

/* Room for a segment table of n_seg entries and a workspace of work bytes:
 * made with the backend for the net's own segments; growth (another
 * table) waits for the device first. */
static int optim_room(cuda_backend *be, int n_seg, size_t work) {
    const dsrt_layer *L = NULL;
    if (n_seg > be->seg_cap) {
        size_t bytes = ((size_t)n_seg + 1) * sizeof(dsrt_k_segment);
        TRY(wait_event(be, be->seg_copied, "cudaEventSynchronize"));
        TRY(dev_free(be, be->seg_dev));
        be->seg_dev = NULL;
        be->seg_cap = 0;
        if (be->seg_pin) CU(cudaFreeHost(be->seg_pin));
        be->seg_pin = NULL;
        CU(cudaMallocHost((void **)&be->seg_pin, bytes));
        TRY(dev_alloc(be, (void **)&be->seg_dev, bytes, NULL));
        be->seg_cap = n_seg;
    }
    if (work > be->work_cap) {
        TRY(dev_free(be, be->kopt.work));
        be->kopt.work = NULL;
        be->work_cap = 0;
        TRY(dev_alloc(be, &be->kopt.work, work, NULL));
        be->work_cap = work;
    }
    return 0;
}

/* The step's segment table on the device, rebuilt when the segments differ
 * from the last step's: written into the pinned copy, then copied on the
 * compute stream, which the optimizer kernel reads it on. */
static int optim_plan(cuda_backend *be, const dsrt_optim_step *s) {
    const dsrt_layer *L = NULL;
    if (be->seg_host && be->n_seg == s->n_seg) {
        int same = 1;
        for (int k = 0; k < s->n_seg && same; k++)
            same = be->seg_host[k].off == s->seg[k].off && be->seg_host[k].n == s->seg[k].n &&
                   be->seg_host[k].lr == s->seg[k].lr && be->seg_host[k].l2 == s->seg[k].l2;
        if (same) return 0;
    }
    dsrt_k_segment *ks = dsrt__calloc((size_t)s->n_seg + 1, sizeof *ks);
    dsrt_segment *copy = dsrt__calloc((size_t)s->n_seg + 1, sizeof *copy);
    int rc = ks && copy ? 0 : -ENOMEM;
    for (int k = 0; !rc && k < s->n_seg; k++) {
        ks[k] = (dsrt_k_segment){s->seg[k].off, s->seg[k].n, s->seg[k].lr, s->seg[k].l2, 0, 0};
        copy[k] = s->seg[k];
    }
    uint32_t blocks = 0;
    size_t work = rc ? 0 : dsrt_k_optim_layout(ks, s->n_seg, &blocks);
    if (!rc) rc = optim_room(be, s->n_seg, work);
    /* The pinned table may still be read by the last copy from it. */
    if (!rc) rc = wait_event(be, be->seg_copied, "cudaEventSynchronize");
    if (!rc) {
        size_t bytes = ((size_t)s->n_seg + 1) * sizeof *ks;
        memcpy(be->seg_pin, ks, bytes);
        cudaError_t e =
            cudaMemcpyAsync(be->seg_dev, be->seg_pin, bytes, cudaMemcpyHostToDevice, be->compute);
        if (e == cudaSuccess) e = cudaEventRecord(be->seg_copied, be->compute);
        if (e != cudaSuccess) rc = cu_fail(e, "cudaMemcpyAsync", L);
    }
    free(ks);
    if (rc) {
        free(copy);
        free(be->seg_host);
        be->seg_host = NULL;
        return rc;
    }
    free(be->seg_host);
    be->seg_host = copy;
    be->n_seg = s->n_seg;
    be->kopt.seg = be->seg_dev;
    be->kopt.n_seg = s->n_seg;
    be->kopt.blocks = blocks;
    return 0;
}

/* An optimizer step: what it needs is made ready now (parameters, the
 * segment table, the state on the device), its kernels wait to be queued
 * with the next training step (or at once, when another call comes
 * first). */
static int cuda_optimize(dsrt_backend *b, const dsrt_optim_step *s) {
    cuda_backend *be = (cuda_backend *)b;
    dsrt_net *net = be->net;
    TRY(settle(be));
    TRY(upload(be));
    TRY(optim_plan(be, s));
    size_t bytes = net->n_params * sizeof(float);
    for (int k = 0; k < s->n_buf; k++)
        if (!be->opt_buf[k]) TRY(dev_alloc(be, (void **)&be->opt_buf[k], bytes, NULL));
    /* The device holds this optimizer's state only when the net says so and
     * the host's has not been written since. */
    if (net->opt_on_device != s->owner || be->opt_version != s->version) {
        if (bytes && collectives_possible(be)) TRY(wait_stream(be, be->compute));
        for (int k = 0; k < s->n_buf; k++) TRY(put_flat(be, be->opt_buf[k], s->buf[k]));
        be->opt_version = s->version;
    }
    dsrt_k_step *st = &be->popt.st;
    memset(st, 0, sizeof *st);
    st->solver = (int)s->solver;
    st->clip = (int)s->clip;
    st->threshold = s->threshold;
    st->lr = s->lr;
    st->l2 = s->l2;
    st->momentum = s->momentum;
    st->decay = s->b1;
    st->sq_decay = s->b2;
    st->c1 = s->c1;
    st->c2 = s->c2;
    st->eps = s->eps;
    be->popt.n_buf = s->n_buf;
    be->popt.norm_clip = isfinite(s->threshold) &&
                         (s->clip == DSRT_CLIP_L2NORM || s->clip == DSRT_CLIP_GLOBAL_L2NORM);
    be->popt.on = 1;
    be->hconst.step = *st;
    /* Clipping rewrites the gradients too. */
    net->host_stale |= DSRT_BUF_PARAMS | DSRT_BUF_GRADS;
    return 0;
}

static int cuda_optim_to_host(dsrt_backend *b, const dsrt_optim_step *s) {
    cuda_backend *be = (cuda_backend *)b;
    TRY(settle(be));
    TRY(wait_stream(be, be->compute));
    for (int k = 0; k < s->n_buf; k++)
        if (be->opt_buf[k]) TRY(get_flat(be, s->buf[k], be->opt_buf[k]));
    return 0;
}

static int cuda_sync(dsrt_backend *b) {
    cuda_backend *be = (cuda_backend *)b;
    TRY(settle(be));
    TRY(prof_collect(be));
    return quiet(be);
}

/* No compute threads of its own: the thread that queues the work is the
 * only one. */
static int cuda_run_on_threads(dsrt_backend *b, int (*fn)(void *, int), void *ctx) {
    return fn(ctx, 0) != 0;
}

static void cuda_memory(dsrt_backend *b, dsrt_backend_memory *m) {
    cuda_backend *be = (cuda_backend *)b;
    m->device = be->device;
    m->grads = be->grads;
    m->params = be->params;
    m->state = be->state;
    m->stream = be->compute;
}

/* Layer `layer`'s output of the last forward, as float NCHW. */
static int cuda_read_output(dsrt_backend *b, int layer, int train, float *out) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = &be->net->layers[layer];
    gpu_plan *p = train ? be->last_train : be->last_infer;
    if (!p) return dsrt__fail(-EINVAL, "cuda backend: no forward pass to read");
    TRY(settle(be));
    TRY(wait_stream(be, be->compute));
    const gpu_layer *g = &p->gl[layer];
    size_t cnt = out_count(L, p->n), el = type_size(g->kd.type);
    char *h = malloc(cnt * el + 1);
    if (!h) return -ENOMEM;
    cudaError_t e = cudaMemcpy(h, g->y, cnt * el, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        free(h);
        return cu_fail(e, "cudaMemcpy", L);
    }
    const dsrt_k_desc *d = &g->kd;
    for (size_t i = 0; i < cnt; i++) {
        dsrt_kb_coord k = dsrt_kb_coord_of(i, d->c, d->h, d->w, d->nhwc);
        out[dsrt_kb_index_of(k, d->c, d->h, d->w, 0)] = dsrt_kb_load(h, d->type, i);
    }
    free(h);
    return 0;
}

// ----------------------------------------------------------------------------
// Reserving before the collectives

/*
 * Builds the plans of every shape in r (each keeps its own memory and stays
 * while the run lasts), grows the workspace to what they need, sizes both
 * staging slots for the largest batch in its layout, and allocates the
 * optimizer's state buffers; then freezes the sizes: later shapes borrow
 * (plan_build), later growth waits for a quiet device (dev_alloc).
 */
static int cuda_reserve(dsrt_backend *b, const dsrt_net_reserve *r) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    TRY(settle(be));
    be->frozen = 0;
    for (int k = 0; k < PLAN_SLOTS; k++)
        if (be->plans[k]) be->plans[k]->reserved = 0;
    size_t bytes = 0, per = (size_t)net->input.c * net->input.h * net->input.w;
    int max_n = 0;
    for (int k = 0; k < r->n_train + r->n_infer; k++) {
        int train = k < r->n_train, n = train ? r->train_n[k] : r->infer_n[k - r->n_train];
        gpu_plan *p = NULL;
        TRY(plan_get(be, n, train, &p));
        p->reserved = 1;
        max_n = DSRT_MAX(max_n, n);
        int layout = train ? r->layout : r->infer_layout;
        bytes = DSRT_MAX(bytes, n * per * (layout == DSRT_INPUT_U8_NHWC ? 1 : sizeof(float)));
    }
    for (int k = 0; k < 2; k++) {
        stage_slot *s = &be->slot[k];
        TRY(grow(be, &s->x, &s->cap, bytes));
        TRY(grow(be, (void **)&s->labels, &s->lcap, (size_t)max_n * sizeof(int32_t)));
        TRY(grow(be, (void **)&s->soft, &s->scap, (size_t)max_n * net->classes * sizeof(float)));
    }
    for (int k = 0; k < r->opt_buffers && k < 2; k++)
        if (!be->opt_buf[k])
            TRY(dev_alloc(be, (void **)&be->opt_buf[k], net->n_params * sizeof(float), L));
    be->frozen = 1;
    return 0;
}

// ----------------------------------------------------------------------------
// Lifetime and the ops table

static void cuda_destroy(dsrt_backend *b) {
    cuda_backend *be = (cuda_backend *)b;
    if (!be) return;
    if (cudaSetDevice(be->device) == cudaSuccess) {
        (void)settle(be); /* an optimizer step asked for is done before the weights go home */
        if (be->compute) cudaStreamSynchronize(be->compute);
        if (be->copy) cudaStreamSynchronize(be->copy);
    }
    graphs_drop(be);
    prof_free(&be->prof, be->net->n_layers);
    /* Plans that borrow memory first, then the owners. */
    for (int k = 0; k < PLAN_SLOTS; k++)
        if (be->plans[k] && be->plans[k]->owner) {
            plan_free(be->plans[k]);
            be->plans[k] = NULL;
        }
    for (int k = 0; k < PLAN_SLOTS; k++) plan_free(be->plans[k]);
    for (int k = 0; k < 2; k++) {
        stage_slot *s = &be->slot[k];
        if (s->x) cudaFree(s->x);
        if (s->labels) cudaFree(s->labels);
        if (s->soft) cudaFree(s->soft);
        if (s->copied) cudaEventDestroy(s->copied);
        if (s->consumed) cudaEventDestroy(s->consumed);
        if (be->opt_buf[k]) cudaFree(be->opt_buf[k]);
    }
    for (int k = 0; k < EV_RING; k++) {
        if (be->ev_go[k]) cudaEventDestroy(be->ev_go[k]);
        if (be->ev_done[k]) cudaEventDestroy(be->ev_done[k]);
    }
    if (be->results_ev) cudaEventDestroy(be->results_ev);
    if (be->seg_copied) cudaEventDestroy(be->seg_copied);
    if (be->sync_ev) cudaEventDestroy(be->sync_ev);
    if (be->seg_dev) cudaFree(be->seg_dev);
    if (be->seg_pin) cudaFreeHost(be->seg_pin);
    if (be->kopt.work) cudaFree(be->kopt.work);
    if (be->ws) cudaFree(be->ws);
    if (be->blas_ws) cudaFree(be->blas_ws);
    if (be->dconst) cudaFree(be->dconst);
    if (be->flat) cudaFree(be->flat);
    if (be->h_loss) cudaFreeHost(be->h_loss);
    if (be->h_correct) cudaFreeHost(be->h_correct);
    if (be->blas) cublasDestroy(be->blas);
    if (be->dnn) cudnnDestroy(be->dnn);
    if (be->copy) cudaStreamDestroy(be->copy);
    if (be->compute) cudaStreamDestroy(be->compute);
    (void)cudaGetLastError();
    free(be->seg_host);
    free(be);
}

/* Everything a backend needs on its device; be is destroyed by the caller
 * on failure. */
static int cuda_setup(cuda_backend *be) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    CU(cudaSetDevice(be->device));
    CU(cudaStreamCreateWithFlags(&be->compute, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&be->copy, cudaStreamNonBlocking));
    DNN(cudnnCreate(&be->dnn));
    DNN(cudnnSetStream(be->dnn, be->compute));
    BLAS(cublasCreate(&be->blas));
    BLAS(cublasSetStream(be->blas, be->compute));
    BLAS(cublasSetMathMode(be->blas, net->precision == DSRT_PRECISION_TF32
                                         ? CUBLAS_TF32_TENSOR_OP_MATH
                                         : CUBLAS_DEFAULT_MATH));
    /* cuBLAS's workspace, set once: a recorded step must not make it
     * allocate one. */
    CU(cudaMalloc(&be->blas_ws, BLAS_WS));
    BLAS(cublasSetWorkspace(be->blas, be->blas_ws, BLAS_WS));
    for (int k = 0; k < 2; k++) {
        CU(cudaEventCreateWithFlags(&be->slot[k].copied, cudaEventDisableTiming));
        CU(cudaEventCreateWithFlags(&be->slot[k].consumed, cudaEventDisableTiming));
    }
    for (int k = 0; k < EV_RING; k++) {
        CU(cudaEventCreate(&be->ev_go[k]));
        CU(cudaEventCreate(&be->ev_done[k]));
    }
    CU(cudaEventCreateWithFlags(&be->results_ev, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&be->seg_copied, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&be->sync_ev, cudaEventDisableTiming));
    CU(cudaMallocHost((void **)&be->h_loss, sizeof(double)));
    CU(cudaMallocHost((void **)&be->h_correct, sizeof(int32_t)));
    CU(cudaMalloc((void **)&be->dconst, sizeof *be->dconst));
    /* params, grads and state, then the bfloat16 weights and convolution
     * gradients: one allocation, each buffer on an ALIGN boundary (cuDNN's
     * and cuBLAS's vectorised kernels want aligned tensors, and the
     * algorithm search ran on these very pointers). */
    size_t np = net->n_params, f32 = align_up(np * sizeof(float)), b16 = align_up(np * 2);
    size_t at_state = 2 * f32, at16 = at_state + align_up(net->n_state * sizeof(float));
    size_t total = be->bf16 ? at16 + 2 * b16 : at16;
    CU(cudaMalloc(&be->flat, total ? total : 1));
    be->params = be->flat;
    be->grads = (float *)((char *)be->flat + f32);
    be->state = (float *)((char *)be->flat + at_state);
    if (be->bf16) {
        be->w16 = (dsrt_bf16 *)((char *)be->flat + at16);
        be->g16 = (dsrt_bf16 *)((char *)be->flat + at16 + b16);
    }
    /* The optimizer's segment table and workspace for the net's own
     * segments, so that its first step allocates nothing. */
    dsrt_k_segment *ks = dsrt__calloc(2 * (size_t)net->n_layers + 1, sizeof *ks);
    if (!ks) return -ENOMEM;
    int n_seg = dsrt_kb_net_segments(net, ks);
    uint32_t blocks = 0;
    size_t work = dsrt_k_optim_layout(ks, n_seg, &blocks),
           tbytes = ((size_t)n_seg + 1) * sizeof *ks;
    free(ks);
    CU(cudaMallocHost((void **)&be->seg_pin, tbytes));
    CU(cudaMalloc((void **)&be->seg_dev, tbytes));
    CU(cudaMalloc(&be->kopt.work, work));
    be->seg_cap = n_seg;
    be->work_cap = work;
    if (np) CU(cudaMemsetAsync(be->grads, 0, np * sizeof(float), be->compute));
    be->hconst.grad_scale = 1.0f;
    TRY(put_consts(be));
    be->seen_version = net->version - 1;
    TRY(upload(be));
    CU(cudaStreamSynchronize(be->compute));
    return 0;
}

static int cuda_create(dsrt_backend **out, dsrt_net *net) {
    *out = NULL;
    cuda_backend *be = dsrt__calloc(1, sizeof *be);
    if (!be) return -ENOMEM;
    be->net = net;
    be->device = net->opts.device;
    be->det = net->opts.deterministic != 0;
    be->staged = -1;
    net->precision =
        net->opts.precision == DSRT_PRECISION_DEFAULT ? DSRT_PRECISION_TF32 : net->opts.precision;
    be->bf16 = net->precision == DSRT_PRECISION_BF16;
    be->act = be->bf16 ? DSRT_K_BF16 : DSRT_K_F32;
    be->act_dt = be->bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    be->conv_math = net->precision == DSRT_PRECISION_FP32   ? CUDNN_FMA_MATH
                    : net->precision == DSRT_PRECISION_BF16 ? CUDNN_TENSOR_OP_MATH
                                                            : CUDNN_DEFAULT_MATH;
    be->graphs = net->opts.cuda_graphs != 0;
    net->backend_note[0] = 0;
    for (int i = 0; i < net->n_layers; i++)
        be->any_bn |= net->layers[i].kind == DSRT_LAYER_BATCHNORM;
    int rc = cuda_setup(be);
    if (rc) {
        cuda_destroy((dsrt_backend *)be);
        return dsrt__fail_prefix(rc, "%s: GPU %d", net->source, net->opts.device);
    }
    *out = (dsrt_backend *)be;
    return 0;
}

/* How the backend runs the net: fused layers, recorded steps. */
static void cuda_describe(dsrt_backend *b, dsrt_backend_report *r) {
    cuda_backend *be = (cuda_backend *)b;
    const gpu_plan *p = be->last_train ? be->last_train : be->last_infer;
    memset(r, 0, sizeof *r);
    r->graph_steps = be->graph_steps;
    r->captures = be->captures;
    r->graphs = be->graphs;
    for (int i = 1; p && i < p->n_layers; i++) {
        const gpu_layer *g = &p->gl[i];
        r->fused_cudnn += g->fuse == FUSE_CUDNN || g->bn_ex;
        r->fused_kernel += g->fuse == FUSE_KERNEL;
    }
}

const dsrt_backend_ops dsrt__backend_cuda = {
    .name = "cuda-cudnn",
    .device_kind = 1,
    .devices = dsrt__cuda_devices, /* the CUDA runtime's count (runtime/hostmem.c) */
    .create = cuda_create,
    .destroy = cuda_destroy,
    .stage = cuda_stage,
    .stage_wait = cuda_stage_wait,
    .forward = cuda_forward,
    .backward = cuda_backward,
    .results = cuda_results,
    .optimize = cuda_optimize,
    .to_host = cuda_to_host,
    .optim_to_host = cuda_optim_to_host,
    .run_on_threads = cuda_run_on_threads,
    .sync = cuda_sync,
    .device_time = cuda_device_time,
    .memory = cuda_memory,
    .read_output = cuda_read_output,
    .bn_sync = 1,
    .reserve = cuda_reserve,
    .describe = cuda_describe,
};

DSRT_MODULE_DEFINE(cuda, &dsrt__backend_cuda, dsrt__net_grads_ready);

/*
 * The GPU backend: the nn ops table (internal.h) on one CUDA device, with
 * cuDNN 9's C API for convolutions, batch normalisation, pooling and LRN,
 * cuBLAS for fully connected layers, and dsrt's own kernels (nn/kernels.h)
 * for the input stage, padding, ReLU, dropout, softmax with cross-entropy
 * and the optimizer step. It computes what the CPU backend (backend_cpu.c)
 * computes, on the same flat layout of parameters, gradients and state, so
 * offsets, gradient buckets and model files mean the same on both.
 *
 * Per device there is one compute stream and one copy stream. stage() copies
 * the next batch (float NCHW or uint8 NHWC, with its labels) from host memory
 * into one of two device slots on the copy stream and records an event; the
 * compute stream waits for that event only where the input layer reads the
 * slot, so a batch crosses PCIe while the previous step computes, and the
 * copy stream waits for the step that last read a slot before refilling it.
 * Nothing in the step loop synchronises the device: results() waits for the
 * loss and correct count of the last forward (copied back asynchronously),
 * and the read-backs (to_host, read_output) wait for the compute stream.
 *
 * For each batch size, training and inference separately, a plan is built
 * once: every activation and gradient tensor of the step carved from one
 * device allocation, the cuDNN descriptors, and the convolution algorithms,
 * timed once with cudnnFind*AlgorithmEx on the very tensors, weights and
 * gradients the steps will use (or, in deterministic mode, taken from the
 * cudnnGet*_v7 heuristics, which do not depend on timing, keeping only
 * deterministic algorithms, each tried once on those pointers). Every plan
 * shares one workspace, grown to the largest need. Activations are float32
 * NCHW between layers; the device keeps its own copies of the flat buffers
 * (params, grads, state, each starting on a 256-byte boundary) and uploads
 * the host's whenever net->version moves.
 *
 * Memory before collectives. Allocating or freeing device memory while NCCL
 * kernels may be in flight can hang them, so a training run (dsrt_train,
 * through dsrt__net_reserve and cuda_reserve) reserves before its first
 * collective the plans
 * of every batch size its steps take, the workspace, the staging slots and
 * the optimizer's state; the optimizer's segment table and workspace are
 * sized when the backend is made. From then on the backend allocates
 * nothing: an inference pass of another size (a validation batch short of
 * a bad image) gets a plan whose tensors lie in the memory of a larger
 * inference plan, with algorithms that fit the workspace as it is. Growth
 * beyond that, and any allocation while a communicator's hooks are on the
 * net, first waits for the device's queued work (and so for the
 * collectives it waits for) to finish.
 *
 * Host waits. With a communicator on the net (net->wait_check), the host
 * never blocks on the device in one call: it polls, and the communicator's
 * check fails the wait when a collective the device waits for has passed
 * its deadline, so that a lost peer ends the step with a message instead
 * of a hang; the communicator itself never waits for its sums on the host.
 *
 * Precision: fp32 (cuDNN FMA math, plain cuBLAS sgemm), tf32 (TensorFloat-32
 * tensor-core products in convolutions and matrix products, float32 sums) or
 * bf16: convolutions and fully connected products take bfloat16 copies of
 * their inputs and weights (the weight copy refreshed by the optimizer
 * kernel itself), accumulate in float32, and everything else, the master
 * weights and the optimizer state included, stays float32.
 *
 * Synchronised batchnorm (dsrt_net_set_bn_sync): in training, each
 * batchnorm layer's per-channel sums (kernels in double) go to the net's
 * hook in device memory with the compute stream, and the statistics, the
 * running averages and the input gradient come from the totals as in the
 * CPU backend.
 *
 * Padding that cuDNN cannot express (asymmetric, 'same' with an odd total)
 * is done by copying the input into a padded buffer (dsrt_k_pad; -infinity
 * for max pooling) and running cuDNN unpadded; the backward crops the
 * gradient back. Every CUDA, cuDNN and cuBLAS return is checked, the message
 * naming the call and the layer.
 *
 * It is the module dsrt_cuda.so (core/module.h), which net.c's backend table
 * loads when a net first asks for a GPU.
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
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
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
} conv_algos;

typedef struct {
    float *y;  /* (n, out.c, out.h, out.w) the layer's output; may be the previous layer's */
    float *dy; /* same shape: gradient of the loss with respect to y; NULL when unused */
    cudnnTensorDescriptor_t yd; /* y, float32 NCHW */
    /* Convolution and pooling: the input as cuDNN reads it. */
    int pad_explicit;           /* asymmetric padding: copied into xp */
    int ph, pw;                 /* the padded input's height and width */
    float *xp;                  /* (n, in.c, ph, pw) padded input (float32 runs); convolutions
                                 * reuse it for the padded input gradient */
    float *dxp;                 /* pooling: (n, in.c, ph, pw) padded input gradient */
    cudnnTensorDescriptor_t xd; /* what cuDNN reads: the padded input or the previous y */
    /* Convolution */
    cudnnFilterDescriptor_t wd;      /* (out.c, in.c / groups, kh, kw) */
    cudnnConvolutionDescriptor_t cd; /* padding, stride, dilation, groups */
    cudnnTensorDescriptor_t bd;      /* (1, c, 1, 1): convolution bias, batchnorm parameters */
    conv_algos al;
    /* bfloat16 runs of convolutions and fully connected layers */
    cudnnTensorDescriptor_t xd16, yd16;
    cudnnFilterDescriptor_t wd16;
    dsrt_bf16 *x16; /* the input as the product reads it (padded); then its gradient */
    dsrt_bf16 *y16; /* the product's output; then the output gradient */
    /* Batchnorm: the batch's mean and inverse standard deviation (c each);
     * synchronised, also its variance (c) and the sums the hook adds up over
     * the workers: forward (2c + 1) and backward (2c). */
    float *save_mean, *save_inv, *save_var;
    double *bn_sums, *bn_bsums;
    cudnnPoolingDescriptor_t pool;
    cudnnLRNDescriptor_t lrn;
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
    void *sm_work;         /* softmax reductions */
    const int32_t *labels; /* device labels of the batch of the last forward, or NULL */
    uint64_t iteration;    /* of the last forward (dropout masks) */
    int bn_sync;           /* the last forward synchronised its batchnorm layers */
};

/* One device buffer a batch is copied into. */
typedef struct {
    void *x;
    size_t cap;
    int32_t *labels;
    size_t lcap;
    cudaEvent_t copied;   /* on the copy stream: the batch is on the device */
    cudaEvent_t consumed; /* on the compute stream: the last step reading it is done */
    int n, layout, has_labels;
    float sub[DSRT_K_PIXEL_CH_MAX], div[DSRT_K_PIXEL_CH_MAX];
} stage_slot;

typedef struct cuda_backend {
    dsrt_net *net;
    int device;
    int bf16, det;
    cudaStream_t compute, copy;
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    cudnnMathType_t conv_math;
    void *flat; /* one allocation: params, grads (n_params floats each), state; each
                 * starting on an ALIGN boundary */
    float *params, *grads, *state;
    dsrt_bf16 *w16, *g16; /* bf16: weight copy and gradient staging (n_params each) */
    uint64_t seen_version;
    int *need_diff; /* (n_layers) backward must produce the gradient of layer i's output */
    int any_bn;
    stage_slot slot[2];
    int next_slot, staged; /* staged: the slot of the last stage(), -1 none */
    void *ws;
    size_t ws_size;
    gpu_plan *plans[PLAN_SLOTS];
    gpu_plan *last_train, *last_infer, *last;
    uint64_t clock;
    float grad_scale;
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
} cuda_backend;

static size_t out_count(const dsrt_layer *l, int n) {
    return (size_t)n * l->out.c * l->out.h * l->out.w;
}

static size_t in_count(const dsrt_layer *l, int n) {
    return (size_t)n * l->in.c * l->in.h * l->in.w;
}

static int set_4d(cudnnTensorDescriptor_t *d, cudnnDataType_t t, int n, int c, int h, int w,
                  const dsrt_layer *L) {
    if (!*d) DNN(cudnnCreateTensorDescriptor(d));
    DNN(cudnnSetTensor4dDescriptor(*d, CUDNN_TENSOR_NCHW, t, n, c, h, w));
    return 0;
}

static dsrt_k_desc kdesc(int n, int c, int h, int w, dsrt_k_type t) {
    dsrt_k_desc d = {n, c, h, w, 0, t};
    return d;
}

static size_t align_up(size_t bytes) {
    return (bytes + ALIGN - 1) & ~(size_t)(ALIGN - 1);
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

/* Device memory after the backend was made: once its sizes are reserved,
 * or with collectives possible, only when the device is quiet (cudaMalloc
 * and cudaFree while NCCL kernels may run can hang them). */
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
    CU(cudaFree(p));
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

static int uses_bf16(const cuda_backend *be, const dsrt_layer *l) {
    return be->bf16 && (l->kind == DSRT_LAYER_CONV || l->kind == DSRT_LAYER_FC);
}

/* Whether cuDNN's symmetric padding cannot express layer l's. */
static int pad_explicit(const dsrt_layer *l) {
    if (l->kind != DSRT_LAYER_CONV && l->kind != DSRT_LAYER_MAXPOOL &&
        l->kind != DSRT_LAYER_AVGPOOL)
        return 0;
    return l->pt != l->pb || l->pl != l->pr;
}

/* Lays the plan's tensors out over c (pointers are NULL while measuring). */
static void plan_layout(cuda_backend *be, gpu_plan *p, carve *c, const int *need_dy) {
    const dsrt_net *net = be->net;
    int n = p->n;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        gpu_layer *g = &p->gl[i];
        size_t cnt = out_count(l, n);
        if (i > 0 && aliases(l, p->train)) {
            g->y = p->gl[i - 1].y;
            g->dy = p->gl[i - 1].dy;
        } else {
            g->y = take(c, cnt * sizeof(float));
            g->dy = need_dy[i] ? take(c, cnt * sizeof(float)) : NULL;
        }
        if (i == 0) continue;
        size_t padded = (size_t)n * l->in.c * g->ph * g->pw;
        int bf = uses_bf16(be, l);
        if (l->kind == DSRT_LAYER_CONV) {
            if (bf) {
                g->x16 = take(c, padded * sizeof(dsrt_bf16));
                g->y16 = take(c, cnt * sizeof(dsrt_bf16));
            } else if (g->pad_explicit) {
                g->xp = take(c, padded * sizeof(float));
            }
        } else if (l->kind == DSRT_LAYER_FC && bf) {
            g->x16 = take(c, in_count(l, n) * sizeof(dsrt_bf16));
            g->y16 = take(c, cnt * sizeof(dsrt_bf16));
        } else if (g->pad_explicit) {
            g->xp = take(c, padded * sizeof(float));
            if (p->train) g->dxp = take(c, padded * sizeof(float));
        }
        if (l->kind == DSRT_LAYER_BATCHNORM && p->train) {
            g->save_mean = take(c, (size_t)l->out.c * sizeof(float));
            g->save_inv = take(c, (size_t)l->out.c * sizeof(float));
            g->save_var = take(c, (size_t)l->out.c * sizeof(float));
            g->bn_sums = take(c, ((size_t)2 * l->out.c + 1) * sizeof(double));
            g->bn_bsums = take(c, (size_t)2 * l->out.c * sizeof(double));
        }
        if (l->kind == DSRT_LAYER_SOFTMAX) {
            p->loss = take(c, sizeof(double));
            p->correct = take(c, sizeof(int32_t));
            p->sm_work = take(c, dsrt_k_softmax_xent_work(n));
        }
    }
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
        if (g->xd16) cudnnDestroyTensorDescriptor(g->xd16);
        if (g->yd16) cudnnDestroyTensorDescriptor(g->yd16);
        if (g->wd) cudnnDestroyFilterDescriptor(g->wd);
        if (g->wd16) cudnnDestroyFilterDescriptor(g->wd16);
        if (g->cd) cudnnDestroyConvolutionDescriptor(g->cd);
        if (g->pool) cudnnDestroyPoolingDescriptor(g->pool);
        if (g->lrn) cudnnDestroyLRNDescriptor(g->lrn);
    }
    if (p->mem && !p->owner) cudaFree(p->mem);
    free(p->gl);
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

static cudnnStatus_t dir_search(cuda_backend *be, gpu_layer *g, int dir, int bf, const void *a,
                                const void *b, void *c, void *ws, size_t ws_size, algo_perf *out,
                                int *got) {
    cudnnTensorDescriptor_t xd = bf ? g->xd16 : g->xd, yd = bf ? g->yd16 : g->yd;
    cudnnFilterDescriptor_t wd = bf ? g->wd16 : g->wd;
    cudnnStatus_t st;
    if (dir == DIR_FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int n = DSRT_MIN(CUDNN_CONVOLUTION_FWD_ALGO_COUNT, ALGO_MAX);
        st = be->det ? cudnnGetConvolutionForwardAlgorithm_v7(be->dnn, xd, wd, g->cd, yd, n, got, r)
                     : cudnnFindConvolutionForwardAlgorithmEx(be->dnn, xd, a, wd, b, g->cd, yd, c,
                                                              n, got, r, ws, ws_size);
        if (st == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *got);
    } else if (dir == DIR_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        int n = DSRT_MIN(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, ALGO_MAX);
        st = be->det ? cudnnGetConvolutionBackwardDataAlgorithm_v7(be->dnn, wd, yd, g->cd, xd, n,
                                                                   got, r)
                     : cudnnFindConvolutionBackwardDataAlgorithmEx(be->dnn, wd, a, yd, b, g->cd, xd,
                                                                   c, n, got, r, ws, ws_size);
        if (st == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *got);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        int n = DSRT_MIN(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, ALGO_MAX);
        st = be->det ? cudnnGetConvolutionBackwardFilterAlgorithm_v7(be->dnn, xd, yd, g->cd, wd, n,
                                                                     got, r)
                     : cudnnFindConvolutionBackwardFilterAlgorithmEx(be->dnn, xd, a, yd, b, g->cd,
                                                                     wd, c, n, got, r, ws, ws_size);
        if (st == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *got);
    }
    return st;
}

static cudnnStatus_t dir_workspace(cuda_backend *be, gpu_layer *g, int dir, int bf, int algo,
                                   size_t *sz) {
    cudnnTensorDescriptor_t xd = bf ? g->xd16 : g->xd, yd = bf ? g->yd16 : g->yd;
    cudnnFilterDescriptor_t wd = bf ? g->wd16 : g->wd;
    if (dir == DIR_FWD)
        return cudnnGetConvolutionForwardWorkspaceSize(be->dnn, xd, wd, g->cd, yd,
                                                       (cudnnConvolutionFwdAlgo_t)algo, sz);
    if (dir == DIR_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            be->dnn, wd, yd, g->cd, xd, (cudnnConvolutionBwdDataAlgo_t)algo, sz);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        be->dnn, xd, yd, g->cd, wd, (cudnnConvolutionBwdFilterAlgo_t)algo, sz);
}

/* One run of algo on the direction's pointers (what it writes is scratch
 * until the step writes it again). */
static cudnnStatus_t dir_run(cuda_backend *be, gpu_layer *g, int dir, int bf, int algo,
                             const void *a, const void *b, void *c) {
    cudnnTensorDescriptor_t xd = bf ? g->xd16 : g->xd, yd = bf ? g->yd16 : g->yd;
    cudnnFilterDescriptor_t wd = bf ? g->wd16 : g->wd;
    if (dir == DIR_FWD)
        return cudnnConvolutionForward(be->dnn, &ONE, xd, a, wd, b, g->cd,
                                       (cudnnConvolutionFwdAlgo_t)algo, be->ws, be->ws_size, &ZERO,
                                       yd, c);
    if (dir == DIR_DATA)
        return cudnnConvolutionBackwardData(be->dnn, &ONE, wd, a, yd, b, g->cd,
                                            (cudnnConvolutionBwdDataAlgo_t)algo, be->ws,
                                            be->ws_size, &ZERO, xd, c);
    return cudnnConvolutionBackwardFilter(be->dnn, &ONE, xd, a, yd, b, g->cd,
                                          (cudnnConvolutionBwdFilterAlgo_t)algo, be->ws,
                                          be->ws_size, &ZERO, wd, c);
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
static int pick(cuda_backend *be, gpu_layer *g, const dsrt_layer *L, int dir, int bf, const void *a,
                const void *b, void *c, void *fws, size_t fws_size, size_t *need) {
    algo_perf r[ALGO_MAX];
    int got = 0;
    size_t cap = be->frozen ? be->ws_size : FIND_WS_MAX;
    DNN(cudnnSetConvolutionMathType(g->cd, be->conv_math));
    DNN(dir_search(be, g, dir, bf, a, b, c, fws, fws_size, r, &got));
    for (int k = 0; k < got; k++) {
        if (!USABLE(be, r[k]) || r[k].memory > cap) continue;
        size_t sz = 0;
        cudnnMathType_t m = math_for(be, r[k].math);
        DNN(cudnnSetConvolutionMathType(g->cd, m));
        if (dir_workspace(be, g, dir, bf, r[k].algo, &sz) != CUDNN_STATUS_SUCCESS || sz > cap)
            continue;
        if (be->det) {
            TRY(ensure_workspace(be, sz));
            if (dir_run(be, g, dir, bf, r[k].algo, a, b, c) != CUDNN_STATUS_SUCCESS) {
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
        return 0;
    }
    return dsrt__fail(DSRT_EUNSUPPORTED,
                      "cuda backend: layer '%s' (line %d): cuDNN has no %s%s convolution "
                      "algorithm for it%s",
                      L->name, L->line, be->det ? "deterministic " : "", DIR_NAME[dir],
                      be->frozen ? " within the workspace reserved" : "");
}

// ----------------------------------------------------------------------------
// Planning

/* The descriptors of layer i (tensors carved already). */
static int plan_layer_desc(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    int n = p->n;
    TRY(set_4d(&g->yd, CUDNN_DATA_FLOAT, n, L->out.c, L->out.h, L->out.w, L));
    if (i == 0) return 0;
    switch (L->kind) {
    case DSRT_LAYER_CONV: {
        int sym = !g->pad_explicit;
        TRY(set_4d(&g->xd, CUDNN_DATA_FLOAT, n, L->in.c, g->ph, g->pw, L));
        DNN(cudnnCreateFilterDescriptor(&g->wd));
        DNN(cudnnSetFilter4dDescriptor(g->wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, L->out.c,
                                       L->in.c / L->o.groups, L->o.kh, L->o.kw));
        DNN(cudnnCreateConvolutionDescriptor(&g->cd));
        DNN(cudnnSetConvolution2dDescriptor(g->cd, sym ? L->pt : 0, sym ? L->pl : 0, L->o.sh,
                                            L->o.sw, L->o.dh, L->o.dw, CUDNN_CROSS_CORRELATION,
                                            CUDNN_DATA_FLOAT));
        DNN(cudnnSetConvolutionGroupCount(g->cd, L->o.groups));
        DNN(cudnnSetConvolutionMathType(g->cd, be->conv_math));
        if (L->b_n) TRY(set_4d(&g->bd, CUDNN_DATA_FLOAT, 1, L->out.c, 1, 1, L));
        if (uses_bf16(be, L)) {
            TRY(set_4d(&g->xd16, CUDNN_DATA_BFLOAT16, n, L->in.c, g->ph, g->pw, L));
            TRY(set_4d(&g->yd16, CUDNN_DATA_BFLOAT16, n, L->out.c, L->out.h, L->out.w, L));
            DNN(cudnnCreateFilterDescriptor(&g->wd16));
            DNN(cudnnSetFilter4dDescriptor(g->wd16, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NCHW,
                                           L->out.c, L->in.c / L->o.groups, L->o.kh, L->o.kw));
        }
        int on, oc, oh, ow;
        DNN(cudnnGetConvolution2dForwardOutputDim(g->cd, g->xd, g->wd, &on, &oc, &oh, &ow));
        if (on != n || oc != L->out.c || oh != L->out.h || ow != L->out.w)
            return dsrt__fail(DSRT_EBACKEND,
                              "cuda backend: layer '%s' (line %d): cuDNN makes a %dx%dx%d output, "
                              "the layer %dx%dx%d",
                              L->name, L->line, oc, oh, ow, L->out.c, L->out.h, L->out.w);
        return 0;
    }
    case DSRT_LAYER_BATCHNORM:
        TRY(set_4d(&g->bd, CUDNN_DATA_FLOAT, 1, L->out.c, 1, 1, L));
        return 0;
    case DSRT_LAYER_MAXPOOL:
    case DSRT_LAYER_AVGPOOL:
    case DSRT_LAYER_GAP: {
        int sym = !g->pad_explicit, gap = L->kind == DSRT_LAYER_GAP;
        cudnnPoolingMode_t mode = L->kind != DSRT_LAYER_MAXPOOL
                                      ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                  : be->det ? CUDNN_POOLING_MAX_DETERMINISTIC
                                            : CUDNN_POOLING_MAX;
        TRY(set_4d(&g->xd, CUDNN_DATA_FLOAT, n, L->in.c, g->ph, g->pw, L));
        DNN(cudnnCreatePoolingDescriptor(&g->pool));
        DNN(cudnnSetPooling2dDescriptor(g->pool, mode, CUDNN_PROPAGATE_NAN, gap ? L->in.h : L->o.kh,
                                        gap ? L->in.w : L->o.kw, gap || !sym ? 0 : L->pt,
                                        gap || !sym ? 0 : L->pl, gap ? 1 : L->o.sh,
                                        gap ? 1 : L->o.sw));
        int on, oc, oh, ow;
        DNN(cudnnGetPooling2dForwardOutputDim(g->pool, g->xd, &on, &oc, &oh, &ow));
        if (on != n || oc != L->out.c || oh != L->out.h || ow != L->out.w)
            return dsrt__fail(DSRT_EBACKEND,
                              "cuda backend: layer '%s' (line %d): cuDNN pools to %dx%dx%d, the "
                              "layer to %dx%dx%d",
                              L->name, L->line, oc, oh, ow, L->out.c, L->out.h, L->out.w);
        return 0;
    }
    case DSRT_LAYER_LRN:
        if (L->o.lrn_size < CUDNN_LRN_MIN_N || L->o.lrn_size > CUDNN_LRN_MAX_N ||
            L->o.k < CUDNN_LRN_MIN_K || L->o.beta < CUDNN_LRN_MIN_BETA)
            return dsrt__fail(DSRT_EUNSUPPORTED,
                              "cuda backend: layer '%s' (line %d): cuDNN's LRN takes size %d..%d, "
                              "k >= %g and beta >= %g (size=%d k=%g beta=%g)",
                              L->name, L->line, CUDNN_LRN_MIN_N, CUDNN_LRN_MAX_N, CUDNN_LRN_MIN_K,
                              CUDNN_LRN_MIN_BETA, L->o.lrn_size, (double)L->o.k, (double)L->o.beta);
        DNN(cudnnCreateLRNDescriptor(&g->lrn));
        /* cuDNN divides alpha by the window size, as the CPU backend's
         * oneDNN does. */
        DNN(cudnnSetLRNDescriptor(g->lrn, (unsigned)L->o.lrn_size, L->o.alpha, L->o.beta, L->o.k));
        TRY(set_4d(&g->xd, CUDNN_DATA_FLOAT, n, L->in.c, L->in.h, L->in.w, L));
        return 0;
    case DSRT_LAYER_INPUT:
    case DSRT_LAYER_RELU:
    case DSRT_LAYER_FC:
    case DSRT_LAYER_DROPOUT:
    case DSRT_LAYER_SOFTMAX:
        return 0;
    }
    return dsrt__fail(DSRT_EUNSUPPORTED, "cuda backend: layer '%s': kind %d", L->name,
                      (int)L->kind);
}

/* The convolution algorithms of layer i, searched on the plan's own
 * tensors, the layer's weights and its gradient in the flat buffers: the
 * pointers the steps use. */
static int plan_conv_algos(cuda_backend *be, gpu_plan *p, int i, void *fws, size_t fws_size,
                           size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    int bf = uses_bf16(be, L);
    const float *prev = p->gl[i - 1].y;
    const void *x = bf ? (const void *)g->x16 : g->pad_explicit ? (const void *)g->xp : prev;
    const void *w = bf ? (const void *)(be->w16 + L->w_off) : (const void *)(be->params + L->w_off);
    void *y = bf ? (void *)g->y16 : (void *)g->y;
    TRY(pick(be, g, L, DIR_FWD, bf, x, w, y, fws, fws_size, need));
    if (!p->train) return 0;
    void *dyb = bf ? (void *)g->y16 : (void *)g->dy;
    void *dw = bf ? (void *)(be->g16 + L->w_off) : (void *)(be->grads + L->w_off);
    TRY(pick(be, g, L, DIR_FILTER, bf, x, dyb, dw, fws, fws_size, need));
    g->al.has_data = be->need_diff[i - 1];
    if (g->al.has_data) {
        void *dx = bf ? (void *)g->x16 : g->pad_explicit ? (void *)g->xp : (void *)p->gl[i - 1].dy;
        TRY(pick(be, g, L, DIR_DATA, bf, w, dyb, dx, fws, fws_size, need));
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

static int plan_build(cuda_backend *be, int n, int train, gpu_plan **out) {
    dsrt_net *net = be->net;
    int nl = net->n_layers, rc = 0;
    void *fws = NULL;
    int fws_own = 0;
    int *need_dy = NULL;
    *out = NULL;
    gpu_plan *p = dsrt__calloc(1, sizeof *p);
    if (!p) return -ENOMEM;
    p->n = n;
    p->train = train;
    p->n_layers = nl;
    p->gl = dsrt__calloc((size_t)nl, sizeof *p->gl);
    need_dy = dsrt__calloc((size_t)nl, sizeof *need_dy);
    if (!p->gl || !need_dy) {
        rc = -ENOMEM;
        goto fail;
    }
    /* Which outputs carry a gradient: those backward must produce, and the
     * input of a batchnorm (cuDNN always computes it); a layer that shares
     * its input's tensors passes the need on. The classifier's output has
     * none. */
    for (int i = nl - 2; train && i >= 0; i--) {
        need_dy[i] |= be->need_diff[i] || net->layers[i + 1].kind == DSRT_LAYER_BATCHNORM;
        if (i > 0 && aliases(&net->layers[i], train) && need_dy[i]) need_dy[i - 1] = 1;
    }
    for (int i = 1; i < nl; i++) {
        const dsrt_layer *l = &net->layers[i];
        gpu_layer *g = &p->gl[i];
        g->pad_explicit = pad_explicit(l);
        g->ph = l->in.h + (g->pad_explicit ? l->pt + l->pb : 0);
        g->pw = l->in.w + (g->pad_explicit ? l->pl + l->pr : 0);
    }
    carve c = {NULL, 0};
    plan_layout(be, p, &c, need_dy);
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
    plan_layout(be, p, &c, need_dy);
    for (int i = 0; i < nl; i++)
        if ((rc = plan_layer_desc(be, p, i))) goto fail;

    /* Convolution algorithms, timed with a scratch workspace as large as
     * memory allows (up to FIND_WS_MAX), or once sizes are reserved, in the
     * workspace as it is. */
    int convs = 0;
    for (int i = 1; i < nl; i++) convs += net->layers[i].kind == DSRT_LAYER_CONV;
    size_t need = 0, fws_size = 0;
    /* A search blocks the host until the device is done with what is
     * queued: with collectives possible, wait for that with the deadline. */
    if (convs && (be->frozen || collectives_possible(be)) && (rc = quiet(be))) goto fail;
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
        if ((rc = plan_conv_algos(be, p, i, fws, fws_size, &need))) goto fail;
    }
    /* The search's memory goes back before the workspace grows. */
    if (fws_own) {
        cudaError_t e = cudaFree(fws);
        fws = NULL;
        fws_own = 0;
        if (e != cudaSuccess) {
            rc = cu_fail(e, "cudaFree", NULL);
            goto fail;
        }
    }
    if ((rc = ensure_workspace(be, need))) goto fail;
    free(need_dy);
    *out = p;
    return 0;
fail:
    if (fws_own) cudaFree(fws);
    free(need_dy);
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

/* The plan for (n, train), built on first use; the least recently used
 * plan that may give way does when every slot is taken. */
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
        plan_free(old);
        be->plans[slot] = NULL;
    }
    TRY(plan_build(be, n, train, &be->plans[slot]));
    be->plans[slot]->used = ++be->clock;
    *out = be->plans[slot];
    return 0;
}

// ----------------------------------------------------------------------------
// Forward

/* The input stage: the staged batch, normalised into layer 0's output. */
static int fwd_input(cuda_backend *be, gpu_plan *p, const stage_slot *s) {
    const dsrt_layer *L = &be->net->layers[0];
    dsrt_k_desc yd = kdesc(p->n, L->out.c, L->out.h, L->out.w, DSRT_K_F32);
    const float *stats = L->o.norm != DSRT_NORM_NONE ? be->state + L->s_off : NULL;
    if (s->layout == DSRT_INPUT_U8_NHWC) {
        dsrt_k_pixel pix;
        memcpy(pix.sub, s->sub, sizeof pix.sub);
        memcpy(pix.div, s->div, sizeof pix.div);
        CU(dsrt_k_input_u8(s->x, &pix, L->o.norm, stats, &yd, p->gl[0].y, be->compute));
    } else {
        CU(dsrt_k_input_f32(s->x, L->o.norm, stats, &yd, p->gl[0].y, be->compute));
    }
    return 0;
}

/* The tensor a convolution or pooling reads: its input, padded by copying
 * where cuDNN cannot pad (fill: 0, or -infinity for max pooling). */
static int padded_input(cuda_backend *be, gpu_plan *p, int i, float fill, const float **x) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    *x = p->gl[i - 1].y;
    if (!g->pad_explicit) return 0;
    dsrt_k_desc xd = kdesc(p->n, L->in.c, L->in.h, L->in.w, DSRT_K_F32);
    dsrt_k_desc pd = kdesc(p->n, L->in.c, g->ph, g->pw, DSRT_K_F32);
    CU(dsrt_k_pad(&xd, *x, &pd, g->xp, L->pt, L->pl, fill, 0, be->compute));
    *x = g->xp;
    return 0;
}

static int fwd_conv(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    size_t cnt = out_count(L, p->n);
    if (uses_bf16(be, L)) {
        /* The input to bfloat16 (padded on the way), the product, and back. */
        dsrt_k_desc xd = kdesc(p->n, L->in.c, L->in.h, L->in.w, DSRT_K_F32);
        dsrt_k_desc pd = kdesc(p->n, L->in.c, g->ph, g->pw, DSRT_K_BF16);
        if (g->pad_explicit)
            CU(dsrt_k_pad(&xd, p->gl[i - 1].y, &pd, g->x16, L->pt, L->pl, 0.0f, 0, be->compute));
        else
            CU(dsrt_k_f32_to_bf16(p->gl[i - 1].y, g->x16, in_count(L, p->n), be->compute));
        DNN(cudnnSetConvolutionMathType(g->cd, g->al.m_fwd));
        DNN(cudnnConvolutionForward(be->dnn, &ONE, g->xd16, g->x16, g->wd16, be->w16 + L->w_off,
                                    g->cd, g->al.fwd, be->ws, be->ws_size, &ZERO, g->yd16, g->y16));
        CU(dsrt_k_bf16_to_f32(g->y16, g->y, cnt, be->compute));
    } else {
        const float *x;
        TRY(padded_input(be, p, i, 0.0f, &x));
        DNN(cudnnSetConvolutionMathType(g->cd, g->al.m_fwd));
        DNN(cudnnConvolutionForward(be->dnn, &ONE, g->xd, x, g->wd, be->params + L->w_off, g->cd,
                                    g->al.fwd, be->ws, be->ws_size, &ZERO, g->yd, g->y));
    }
    if (L->b_n) DNN(cudnnAddTensor(be->dnn, &ONE, g->bd, be->params + L->b_off, &ONE, g->yd, g->y));
    if (L->fuse_relu) CU(dsrt_k_relu_fwd(DSRT_K_F32, g->y, g->y, cnt, L->fuse_leak, be->compute));
    return 0;
}

/* Synchronised batchnorm, forward: this batch's sums of x and x^2 per
 * channel go through the net's hook (which queues their sum over the
 * workers on the compute stream), the statistics and the running averages
 * come from the totals exactly as in the CPU backend, and cuDNN normalises
 * with them as given statistics. */
static int fwd_batchnorm_sync(cuda_backend *be, gpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[i - 1];
    int c = L->out.c, hw = L->out.h * L->out.w;
    float *rm = be->state + L->s_off, *rv = rm + c;
    CU(dsrt_k_bn_sums(in->y, p->n, c, hw, g->bn_sums, be->compute));
    dsrt_bn_sums bs = {i, 0, c, g->bn_sums, (size_t)2 * c + 1, be->device, be->compute};
    TRY(net->bn_sync_fn(net->bn_sync_ctx, &bs));
    CU(dsrt_k_bn_stats(g->bn_sums, c, L->o.eps, L->o.momentum, g->save_mean, g->save_var,
                       g->save_inv, rm, rv, be->compute));
    DNN(cudnnBatchNormalizationForwardInference(
        be->dnn, CUDNN_BATCHNORM_SPATIAL, &ONE, &ZERO, in->yd, in->y, g->yd, g->y, g->bd,
        be->params + L->w_off, be->params + L->b_off, g->save_mean, g->save_var, (double)L->o.eps));
    return 0;
}

static int fwd_batchnorm(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[i - 1];
    int c = L->out.c;
    const float *scale = be->params + L->w_off, *shift = be->params + L->b_off;
    float *rm = be->state + L->s_off, *rv = rm + c;
    /* Running averages as the CPU backend keeps them: r = (1 - momentum) r +
     * momentum batch, the variance unbiased (cuDNN's definition too). One
     * value per channel has no unbiased variance: the CPU backend then
     * takes the biased one (0), done here by hand. */
    if (p->bn_sync) {
        TRY(fwd_batchnorm_sync(be, p, i));
    } else if (p->train) {
        int one = (size_t)p->n * L->out.h * L->out.w == 1;
        DNN(cudnnBatchNormalizationForwardTraining(
            be->dnn, CUDNN_BATCHNORM_SPATIAL, &ONE, &ZERO, in->yd, in->y, g->yd, g->y, g->bd, scale,
            shift, (double)L->o.momentum, one ? NULL : rm, one ? NULL : rv, (double)L->o.eps,
            g->save_mean, g->save_inv));
        if (one) {
            float m = L->o.momentum, keep = 1.0f - m;
            DNN(cudnnAddTensor(be->dnn, &m, g->bd, g->save_mean, &keep, g->bd, rm));
            DNN(cudnnScaleTensor(be->dnn, g->bd, rv, &keep));
        }
    } else
        DNN(cudnnBatchNormalizationForwardInference(be->dnn, CUDNN_BATCHNORM_SPATIAL, &ONE, &ZERO,
                                                    in->yd, in->y, g->yd, g->y, g->bd, scale, shift,
                                                    rm, rv, (double)L->o.eps));
    if (L->fuse_relu)
        CU(dsrt_k_relu_fwd(DSRT_K_F32, g->y, g->y, out_count(L, p->n), L->fuse_leak, be->compute));
    return 0;
}

static int fwd_pool(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    const float *x;
    TRY(padded_input(be, p, i, L->kind == DSRT_LAYER_MAXPOOL ? -INFINITY : 0.0f, &x));
    DNN(cudnnPoolingForward(be->dnn, g->pool, &ONE, g->xd, x, &ZERO, g->yd, g->y));
    return 0;
}

static int fwd_lrn(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    DNN(cudnnLRNCrossChannelForward(be->dnn, g->lrn, CUDNN_LRN_CROSS_CHANNEL_DIM1, &ONE, g->xd,
                                    p->gl[i - 1].y, &ZERO, g->yd, g->y));
    return 0;
}

/*
 * Fully connected, on row-major tensors through column-major cuBLAS: y (n,
 * out) = x (n, in) W^T, W (out, in), is y^T = W^T' x^T' where cuBLAS sees W
 * as an (in x out) matrix and x as (in x n): gemm(T, N, out, n, in).
 */
static int fwd_fc(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    int n = p->n, oc = L->out.c, ic = L->in.c * L->in.h * L->in.w;
    const float *x = p->gl[i - 1].y;
    if (uses_bf16(be, L)) {
        CU(dsrt_k_f32_to_bf16(x, g->x16, in_count(L, n), be->compute));
        BLAS(cublasGemmEx(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, ic, &ONE, be->w16 + L->w_off,
                          CUDA_R_16BF, ic, g->x16, CUDA_R_16BF, ic, &ZERO, g->y, CUDA_R_32F, oc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        BLAS(cublasSgemm(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, ic, &ONE, be->params + L->w_off,
                         ic, x, ic, &ZERO, g->y, oc));
    }
    if (L->b_n || L->fuse_relu)
        CU(dsrt_k_bias_act(g->y, L->b_n ? be->params + L->b_off : NULL, g->y, n, oc, L->fuse_relu,
                           L->fuse_leak, be->compute));
    return 0;
}

static int fwd_layer(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    switch (L->kind) {
    case DSRT_LAYER_CONV:
        return fwd_conv(be, p, i);
    case DSRT_LAYER_BATCHNORM:
        return fwd_batchnorm(be, p, i);
    case DSRT_LAYER_RELU:
        if (!L->fused_away)
            CU(dsrt_k_relu_fwd(DSRT_K_F32, p->gl[i - 1].y, g->y, out_count(L, p->n), L->o.leak,
                               be->compute));
        return 0;
    case DSRT_LAYER_MAXPOOL:
    case DSRT_LAYER_AVGPOOL:
    case DSRT_LAYER_GAP:
        return fwd_pool(be, p, i);
    case DSRT_LAYER_FC:
        return fwd_fc(be, p, i);
    case DSRT_LAYER_DROPOUT:
        if (p->train) {
            dsrt_k_desc d = kdesc(p->n, L->out.c, L->out.h, L->out.w, DSRT_K_F32);
            CU(dsrt_k_dropout(&d, p->gl[i - 1].y, g->y, be->net->opts.seed, p->iteration, i, L->o.p,
                              be->compute));
        }
        return 0;
    case DSRT_LAYER_LRN:
        return fwd_lrn(be, p, i);
    case DSRT_LAYER_SOFTMAX:
        CU(dsrt_k_softmax_xent_fwd(p->gl[i - 1].y, p->labels, p->n, be->net->classes, g->y,
                                   p->labels ? p->loss : NULL, p->labels ? p->correct : NULL,
                                   p->sm_work, be->compute));
        return 0;
    case DSRT_LAYER_INPUT:
        break;
    }
    return dsrt__fail(DSRT_EUNSUPPORTED, "cuda backend: layer '%s': kind %d", L->name,
                      (int)L->kind);
}

// ----------------------------------------------------------------------------
// Backward

/* dx of a convolution or pooling that read a padded copy: the padded
 * gradient cropped into the input's gradient. */
static int crop_grad(cuda_backend *be, gpu_plan *p, int i, const void *dxp, dsrt_k_type t) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    dsrt_k_desc pd = kdesc(p->n, L->in.c, g->ph, g->pw, t);
    dsrt_k_desc xd = kdesc(p->n, L->in.c, L->in.h, L->in.w, DSRT_K_F32);
    CU(dsrt_k_pad(&pd, dxp, &xd, p->gl[i - 1].dy, -L->pt, -L->pl, 0.0f, 0, be->compute));
    return 0;
}

static int bwd_conv(cuda_backend *be, gpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[i - 1];
    size_t cnt = out_count(L, p->n);
    if (L->fuse_relu)
        CU(dsrt_k_relu_bwd(DSRT_K_F32, g->y, g->dy, g->dy, cnt, L->fuse_leak, be->compute));
    if (L->b_n)
        DNN(cudnnConvolutionBackwardBias(be->dnn, &ONE, g->yd, g->dy, &ZERO, g->bd,
                                         be->grads + L->b_off));
    if (uses_bf16(be, L)) {
        /* x16 still holds the (padded) input; y16 takes the output gradient. */
        CU(dsrt_k_f32_to_bf16(g->dy, g->y16, cnt, be->compute));
        DNN(cudnnSetConvolutionMathType(g->cd, g->al.m_filter));
        DNN(cudnnConvolutionBackwardFilter(be->dnn, &ONE, g->xd16, g->x16, g->yd16, g->y16, g->cd,
                                           g->al.filter, be->ws, be->ws_size, &ZERO, g->wd16,
                                           be->g16 + L->w_off));
        CU(dsrt_k_bf16_to_f32(be->g16 + L->w_off, be->grads + L->w_off, L->w_n, be->compute));
        dsrt__net_grads_ready(net, i);
        if (!g->al.has_data) return 0;
        DNN(cudnnSetConvolutionMathType(g->cd, g->al.m_data));
        DNN(cudnnConvolutionBackwardData(be->dnn, &ONE, g->wd16, be->w16 + L->w_off, g->yd16,
                                         g->y16, g->cd, g->al.data, be->ws, be->ws_size, &ZERO,
                                         g->xd16, g->x16));
        if (g->pad_explicit) return crop_grad(be, p, i, g->x16, DSRT_K_BF16);
        CU(dsrt_k_bf16_to_f32(g->x16, in->dy, in_count(L, p->n), be->compute));
        return 0;
    }
    const float *x = g->pad_explicit ? g->xp : in->y;
    DNN(cudnnSetConvolutionMathType(g->cd, g->al.m_filter));
    DNN(cudnnConvolutionBackwardFilter(be->dnn, &ONE, g->xd, x, g->yd, g->dy, g->cd, g->al.filter,
                                       be->ws, be->ws_size, &ZERO, g->wd, be->grads + L->w_off));
    dsrt__net_grads_ready(net, i);
    if (!g->al.has_data) return 0;
    /* The padded input is read; its buffer takes the padded gradient. */
    float *dx = g->pad_explicit ? g->xp : in->dy;
    DNN(cudnnSetConvolutionMathType(g->cd, g->al.m_data));
    DNN(cudnnConvolutionBackwardData(be->dnn, &ONE, g->wd, be->params + L->w_off, g->yd, g->dy,
                                     g->cd, g->al.data, be->ws, be->ws_size, &ZERO, g->xd, dx));
    if (g->pad_explicit) return crop_grad(be, p, i, g->xp, DSRT_K_F32);
    return 0;
}

static int bwd_batchnorm(cuda_backend *be, gpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[i - 1];
    if (L->fuse_relu)
        CU(dsrt_k_relu_bwd(DSRT_K_F32, g->y, g->dy, g->dy, out_count(L, p->n), L->fuse_leak,
                           be->compute));
    if (p->bn_sync) {
        /* Synchronised: the local sums of dy' (after the fused ReLU) and of
         * dy' xhat are the shift's and the scale's gradients (the gradient
         * all-reduce adds them up); their sums over the workers give the
         * input gradient's mean and variance terms. */
        int c = L->out.c, hw = L->out.h * L->out.w;
        if (!net->bn_sync_fn)
            return dsrt__fail(DSRT_EBACKEND,
                              "cuda backend: layer '%s': the batchnorm hook was removed between "
                              "a synchronised forward and its backward",
                              L->name);
        CU(dsrt_k_bn_bwd_sums(in->y, g->dy, g->save_mean, g->save_inv, p->n, c, hw, g->bn_bsums,
                              be->grads + L->w_off, be->grads + L->b_off, be->compute));
        dsrt_bn_sums bs = {i, 1, c, g->bn_bsums, (size_t)2 * c, be->device, be->compute};
        TRY(net->bn_sync_fn(net->bn_sync_ctx, &bs));
        CU(dsrt_k_bn_bwd_dx(in->y, g->dy, g->save_mean, g->save_inv, be->params + L->w_off,
                            g->bn_bsums, g->bn_sums + 2 * c, p->n, c, hw, in->dy, be->compute));
        dsrt__net_grads_ready(net, i);
        return 0;
    }
    DNN(cudnnBatchNormalizationBackward(
        be->dnn, CUDNN_BATCHNORM_SPATIAL, &ONE, &ZERO, &ONE, &ZERO, in->yd, in->y, g->yd, g->dy,
        in->yd, in->dy, g->bd, be->params + L->w_off, be->grads + L->w_off, be->grads + L->b_off,
        (double)L->o.eps, g->save_mean, g->save_inv));
    dsrt__net_grads_ready(net, i);
    return 0;
}

static int bwd_pool(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[i - 1];
    const float *x = g->pad_explicit ? g->xp : in->y;
    float *dx = g->pad_explicit ? g->dxp : in->dy;
    DNN(cudnnPoolingBackward(be->dnn, g->pool, &ONE, g->yd, g->y, g->yd, g->dy, g->xd, x, &ZERO,
                             g->xd, dx));
    if (g->pad_explicit) return crop_grad(be, p, i, g->dxp, DSRT_K_F32);
    return 0;
}

/* Column-major views as in fwd_fc: dW^T (in x out) = x^T (in x n) dy (n x
 * out): gemm(N, T, in, out, n); dx^T (in x n) = W^T (in x out) dy^T (out x
 * n): gemm(N, N, in, n, out). */
static int bwd_fc(cuda_backend *be, gpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[i - 1];
    int n = p->n, oc = L->out.c, ic = L->in.c * L->in.h * L->in.w;
    if (L->fuse_relu)
        CU(dsrt_k_relu_bwd(DSRT_K_F32, g->y, g->dy, g->dy, (size_t)n * oc, L->fuse_leak,
                           be->compute));
    if (L->b_n) CU(dsrt_k_bias_grad(g->dy, be->grads + L->b_off, n, oc, be->compute));
    int need_dx = be->need_diff[i - 1];
    if (uses_bf16(be, L)) {
        CU(dsrt_k_f32_to_bf16(g->dy, g->y16, (size_t)n * oc, be->compute));
        BLAS(cublasGemmEx(be->blas, CUBLAS_OP_N, CUBLAS_OP_T, ic, oc, n, &ONE, g->x16, CUDA_R_16BF,
                          ic, g->y16, CUDA_R_16BF, oc, &ZERO, be->grads + L->w_off, CUDA_R_32F, ic,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        dsrt__net_grads_ready(net, i);
        if (need_dx)
            BLAS(cublasGemmEx(be->blas, CUBLAS_OP_N, CUBLAS_OP_N, ic, n, oc, &ONE,
                              be->w16 + L->w_off, CUDA_R_16BF, ic, g->y16, CUDA_R_16BF, oc, &ZERO,
                              in->dy, CUDA_R_32F, ic, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return 0;
    }
    BLAS(cublasSgemm(be->blas, CUBLAS_OP_N, CUBLAS_OP_T, ic, oc, n, &ONE, in->y, ic, g->dy, oc,
                     &ZERO, be->grads + L->w_off, ic));
    dsrt__net_grads_ready(net, i);
    if (need_dx)
        BLAS(cublasSgemm(be->blas, CUBLAS_OP_N, CUBLAS_OP_N, ic, n, oc, &ONE, be->params + L->w_off,
                         ic, g->dy, oc, &ZERO, in->dy, ic));
    return 0;
}

static int bwd_layer(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[i - 1];
    int need_dx = be->need_diff[i - 1];
    switch (L->kind) {
    case DSRT_LAYER_CONV:
        return bwd_conv(be, p, i);
    case DSRT_LAYER_BATCHNORM:
        return bwd_batchnorm(be, p, i);
    case DSRT_LAYER_FC:
        return bwd_fc(be, p, i);
    case DSRT_LAYER_RELU:
        if (need_dx && !L->fused_away)
            CU(dsrt_k_relu_bwd(DSRT_K_F32, g->y, g->dy, in->dy, out_count(L, p->n), L->o.leak,
                               be->compute));
        return 0;
    case DSRT_LAYER_MAXPOOL:
    case DSRT_LAYER_AVGPOOL:
    case DSRT_LAYER_GAP:
        return need_dx ? bwd_pool(be, p, i) : 0;
    case DSRT_LAYER_DROPOUT:
        if (need_dx) {
            dsrt_k_desc d = kdesc(p->n, L->out.c, L->out.h, L->out.w, DSRT_K_F32);
            CU(dsrt_k_dropout(&d, g->dy, in->dy, be->net->opts.seed, p->iteration, i, L->o.p,
                              be->compute));
        }
        return 0;
    case DSRT_LAYER_LRN:
        if (need_dx)
            DNN(cudnnLRNCrossChannelBackward(be->dnn, g->lrn, CUDNN_LRN_CROSS_CHANNEL_DIM1, &ONE,
                                             g->yd, g->y, g->yd, g->dy, g->xd, in->y, &ZERO, g->xd,
                                             in->dy));
        return 0;
    case DSRT_LAYER_SOFTMAX:
        if (need_dx)
            CU(dsrt_k_softmax_xent_bwd(g->y, p->labels, p->n, be->net->classes, be->grad_scale,
                                       in->dy, be->compute));
        return 0;
    case DSRT_LAYER_INPUT:
        break;
    }
    return dsrt__fail(DSRT_EUNSUPPORTED, "cuda backend: layer '%s': kind %d", L->name,
                      (int)L->kind);
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
    /* From pageable memory: each copy returns once the host buffer is read. */
    if (net->n_params) {
        CU(cudaMemcpyAsync(be->params, net->params, net->n_params * sizeof(float),
                           cudaMemcpyHostToDevice, be->compute));
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
    CU(cudaSetDevice(be->device));
    TRY(wait_stream(be, be->compute));
    if ((what & DSRT_BUF_PARAMS) && net->n_params)
        CU(cudaMemcpy(net->params, be->params, net->n_params * sizeof(float),
                      cudaMemcpyDeviceToHost));
    if ((what & DSRT_BUF_GRADS) && net->n_params)
        CU(cudaMemcpy(net->grads, be->grads, net->n_params * sizeof(float),
                      cudaMemcpyDeviceToHost));
    if ((what & DSRT_BUF_STATE) && net->n_state)
        CU(cudaMemcpy(net->state, be->state, net->n_state * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
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

static void cuda_device_time(dsrt_backend *b, double *busy_s, double *idle_s) {
    cuda_backend *be = (cuda_backend *)b;
    if (cudaSetDevice(be->device) == cudaSuccess && wait_stream(be, be->compute) == 0)
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
    size_t values = (size_t)batch->n * net->input.c * net->input.h * net->input.w;
    size_t bytes = values * (batch->layout == DSRT_INPUT_U8_NHWC ? 1 : sizeof(float));
    TRY(grow(be, &s->x, &s->cap, bytes));
    if (batch->labels) TRY(grow(be, (void **)&s->labels, &s->lcap, batch->n * sizeof(int32_t)));
    /* The slot is refilled only once the step that read it is done. */
    CU(cudaStreamWaitEvent(be->copy, s->consumed, 0));
    CU(cudaMemcpyAsync(s->x, batch->data, bytes, cudaMemcpyHostToDevice, be->copy));
    if (batch->labels)
        CU(cudaMemcpyAsync(s->labels, batch->labels, batch->n * sizeof(int32_t),
                           cudaMemcpyHostToDevice, be->copy));
    CU(cudaEventRecord(s->copied, be->copy));
    s->n = batch->n;
    s->layout = batch->layout;
    s->has_labels = batch->labels != NULL;
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

static int cuda_forward(dsrt_backend *b, const dsrt_net_batch *batch, int train) {
    cuda_backend *be = (cuda_backend *)b;
    dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    if (be->staged < 0 || be->slot[be->staged].n != batch->n)
        return dsrt__fail(-EINVAL, "cuda backend: forward without its batch staged");
    stage_slot *s = &be->slot[be->staged];
    CU(cudaSetDevice(be->device));
    TRY(upload(be));
    gpu_plan *p = NULL;
    TRY(plan_get(be, batch->n, train, &p));
    p->labels = batch->labels && s->has_labels ? s->labels : NULL;
    p->iteration = (uint64_t)net->iteration;
    p->bn_sync = train && net->bn_sync_fn != NULL;
    be->grad_scale = 1.0f / (float)(batch->global_n > 0 ? batch->global_n : batch->n);
    be->last = p;
    if (train)
        be->last_train = p;
    else
        be->last_infer = p;
    be->results_labels = p->labels != NULL;

    /* A new step: account for the ones done, then wait for the batch. */
    TRY(account_done(be));
    int k = (int)(be->steps % EV_RING);
    CU(cudaStreamWaitEvent(be->compute, s->copied, 0));
    CU(cudaEventRecord(be->ev_go[k], be->compute));
    be->steps++;

    TRY(fwd_input(be, p, s));
    for (int i = 1; i < net->n_layers; i++) TRY(fwd_layer(be, p, i));
    if (p->labels) {
        CU(cudaMemcpyAsync(be->h_loss, p->loss, sizeof(double), cudaMemcpyDeviceToHost,
                           be->compute));
        CU(cudaMemcpyAsync(be->h_correct, p->correct, sizeof(int32_t), cudaMemcpyDeviceToHost,
                           be->compute));
    }
    CU(cudaEventRecord(be->results_ev, be->compute));
    CU(cudaEventRecord(s->consumed, be->compute));
    TRY(mark_done(be));
    if (train && be->any_bn) net->host_stale |= DSRT_BUF_STATE;
    return 0;
}

static int cuda_backward(dsrt_backend *b) {
    cuda_backend *be = (cuda_backend *)b;
    dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    gpu_plan *p = be->last_train;
    if (!p || !p->labels || be->last != p)
        return dsrt__fail(-EINVAL, "cuda backend: backward without a training forward");
    CU(cudaSetDevice(be->device));
    for (int i = net->n_layers - 1; i >= 1; i--) TRY(bwd_layer(be, p, i));
    /* The labels of the staged slot were read until here. */
    if (be->staged >= 0) CU(cudaEventRecord(be->slot[be->staged].consumed, be->compute));
    TRY(mark_done(be));
    net->host_stale |= DSRT_BUF_GRADS;
    return 0;
}

static int cuda_results(dsrt_backend *b, double *loss, int *correct, float *probs) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = NULL;
    gpu_plan *p = be->last;
    if (!p) return dsrt__fail(-EINVAL, "cuda backend: no forward pass");
    CU(cudaSetDevice(be->device));
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

static int cuda_optimize(dsrt_backend *b, const dsrt_optim_step *s) {
    cuda_backend *be = (cuda_backend *)b;
    dsrt_net *net = be->net;
    const dsrt_layer *L = NULL;
    CU(cudaSetDevice(be->device));
    TRY(upload(be));
    TRY(optim_plan(be, s));
    size_t bytes = net->n_params * sizeof(float);
    for (int k = 0; k < s->n_buf; k++)
        if (!be->opt_buf[k]) TRY(dev_alloc(be, (void **)&be->opt_buf[k], bytes, NULL));
    /* The device holds this optimizer's state only when the net says so and
     * the host's has not been written since. */
    if (net->opt_on_device != s->owner || be->opt_version != s->version) {
        if (bytes && collectives_possible(be)) TRY(wait_stream(be, be->compute));
        for (int k = 0; k < s->n_buf; k++)
            if (bytes)
                CU(cudaMemcpyAsync(be->opt_buf[k], s->buf[k], bytes, cudaMemcpyHostToDevice,
                                   be->compute));
        be->opt_version = s->version;
    }
    dsrt_k_step st;
    st.solver = (int)s->solver;
    st.clip = (int)s->clip;
    st.threshold = s->threshold;
    st.lr = s->lr;
    st.l2 = s->l2;
    st.momentum = s->momentum;
    st.decay = s->b1;
    st.sq_decay = s->b2;
    st.c1 = s->c1;
    st.c2 = s->c2;
    st.eps = s->eps;
    CU(dsrt_k_optim_update(&be->kopt, &st, be->params, be->grads, be->opt_buf[0],
                           s->n_buf > 1 ? be->opt_buf[1] : NULL, be->bf16 ? be->w16 : NULL,
                           be->compute));
    TRY(mark_done(be));
    /* Clipping rewrote the gradients too. */
    net->host_stale |= DSRT_BUF_PARAMS | DSRT_BUF_GRADS;
    return 0;
}

static int cuda_optim_to_host(dsrt_backend *b, const dsrt_optim_step *s) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = NULL;
    size_t bytes = be->net->n_params * sizeof(float);
    CU(cudaSetDevice(be->device));
    TRY(wait_stream(be, be->compute));
    for (int k = 0; k < s->n_buf; k++)
        if (be->opt_buf[k] && bytes)
            CU(cudaMemcpy(s->buf[k], be->opt_buf[k], bytes, cudaMemcpyDeviceToHost));
    return 0;
}

static int cuda_sync(dsrt_backend *b) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = NULL;
    CU(cudaSetDevice(be->device));
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

static int cuda_read_output(dsrt_backend *b, int layer, int train, float *out) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = &be->net->layers[layer];
    gpu_plan *p = train ? be->last_train : be->last_infer;
    if (!p) return dsrt__fail(-EINVAL, "cuda backend: no forward pass to read");
    CU(cudaSetDevice(be->device));
    TRY(wait_stream(be, be->compute));
    CU(cudaMemcpy(out, p->gl[layer].y, out_count(L, p->n) * sizeof(float), cudaMemcpyDeviceToHost));
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
    CU(cudaSetDevice(be->device));
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
        if (be->compute) cudaStreamSynchronize(be->compute);
        if (be->copy) cudaStreamSynchronize(be->copy);
    }
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
    if (be->flat) cudaFree(be->flat);
    if (be->h_loss) cudaFreeHost(be->h_loss);
    if (be->h_correct) cudaFreeHost(be->h_correct);
    if (be->blas) cublasDestroy(be->blas);
    if (be->dnn) cudnnDestroy(be->dnn);
    if (be->copy) cudaStreamDestroy(be->copy);
    if (be->compute) cudaStreamDestroy(be->compute);
    (void)cudaGetLastError();
    free(be->seg_host);
    free(be->need_diff);
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
    /* params, grads and state, then the bfloat16 weights and gradient
     * staging: one allocation, each buffer on an ALIGN boundary (cuDNN's
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
    be->grad_scale = 1.0f;
    net->precision =
        net->opts.precision == DSRT_PRECISION_DEFAULT ? DSRT_PRECISION_TF32 : net->opts.precision;
    be->bf16 = net->precision == DSRT_PRECISION_BF16;
    be->conv_math = net->precision == DSRT_PRECISION_FP32   ? CUDNN_FMA_MATH
                    : net->precision == DSRT_PRECISION_BF16 ? CUDNN_TENSOR_OP_MATH
                                                            : CUDNN_DEFAULT_MATH;
    be->need_diff = dsrt__calloc((size_t)net->n_layers, sizeof *be->need_diff);
    if (!be->need_diff) {
        free(be);
        return -ENOMEM;
    }
    /* Layer i's output needs a gradient when some layer up to i learns. */
    int learns = 0;
    for (int i = 0; i < net->n_layers; i++) {
        learns |= net->layers[i].w_n > 0 || net->layers[i].b_n > 0;
        be->need_diff[i] = learns;
        be->any_bn |= net->layers[i].kind == DSRT_LAYER_BATCHNORM;
    }
    int rc = cuda_setup(be);
    if (rc) {
        cuda_destroy((dsrt_backend *)be);
        return dsrt__fail_prefix(rc, "%s: GPU %d", net->source, net->opts.device);
    }
    *out = (dsrt_backend *)be;
    return 0;
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
};

DSRT_MODULE_DEFINE(cuda, &dsrt__backend_cuda, dsrt__net_grads_ready);

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
 * timed once with cudnnFind*AlgorithmEx (or, in deterministic mode, taken
 * from the cudnnGet*_v7 heuristics, which do not depend on timing, keeping
 * only deterministic algorithms). Every plan shares one workspace, grown to
 * the largest need. Activations are float32 NCHW between layers; the
 * device keeps its own copies of the flat buffers and uploads the host's
 * whenever net->version moves.
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

#define PLAN_SLOTS 4
#define EV_RING    4
/* The most workspace the algorithm search may try, and the most any
 * chosen algorithm may keep. */
#define FIND_WS_MAX ((size_t)1 << 30)
#define ALIGN       256

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

typedef struct {
    int n, train;
    int n_layers;
    uint64_t used;
    gpu_layer *gl;
    void *mem; /* every tensor of the plan */
    double *loss;
    int32_t *correct;
    void *sm_work;         /* softmax reductions */
    const int32_t *labels; /* device labels of the batch of the last forward, or NULL */
    uint64_t iteration;    /* of the last forward (dropout masks) */
    int bn_sync;           /* the last forward synchronised its batchnorm layers */
} gpu_plan;

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
    void *flat; /* one allocation: params, grads (n_params floats each), state */
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
    /* The optimizer state held here, and the step's segment table. */
    float *opt_buf[2];
    uint64_t opt_version;
    dsrt_segment *seg_host;
    int n_seg;
    dsrt_k_segment *seg_dev;
    dsrt_k_optim kopt;
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
    if (p->mem) cudaFree(p->mem);
    free(p->gl);
    free(p);
}

// ----------------------------------------------------------------------------
// Convolution algorithms

/* Whether a search result may be used: it ran, its workspace is affordable,
 * and in deterministic mode it is deterministic. */
#define USABLE(be, r)                                                                              \
    ((r).status == CUDNN_STATUS_SUCCESS && (r).memory <= FIND_WS_MAX &&                            \
     (!(be)->det || (r).determinism == CUDNN_DETERMINISTIC))

/* The math type an algorithm runs with: fp32 runs are held to FMA
 * arithmetic whatever the search tried; otherwise the result's own. */
static cudnnMathType_t math_for(const cuda_backend *be, cudnnMathType_t found) {
    return be->conv_math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : found;
}

static int pick_fwd(cuda_backend *be, gpu_layer *g, const dsrt_layer *L, int bf, const void *x,
                    const void *w, void *y, void *fws, size_t fws_size, size_t *need) {
    cudnnTensorDescriptor_t xd = bf ? g->xd16 : g->xd, yd = bf ? g->yd16 : g->yd;
    cudnnFilterDescriptor_t wd = bf ? g->wd16 : g->wd;
    cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    DNN(cudnnSetConvolutionMathType(g->cd, be->conv_math));
    if (be->det)
        DNN(cudnnGetConvolutionForwardAlgorithm_v7(be->dnn, xd, wd, g->cd, yd,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, r));
    else
        DNN(cudnnFindConvolutionForwardAlgorithmEx(be->dnn, xd, x, wd, w, g->cd, yd, y,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, r, fws,
                                                   fws_size));
    for (int k = 0; k < got; k++) {
        if (!USABLE(be, r[k])) continue;
        size_t sz = 0;
        cudnnMathType_t m = math_for(be, r[k].mathType);
        DNN(cudnnSetConvolutionMathType(g->cd, m));
        if (cudnnGetConvolutionForwardWorkspaceSize(be->dnn, xd, wd, g->cd, yd, r[k].algo, &sz) !=
                CUDNN_STATUS_SUCCESS ||
            sz > FIND_WS_MAX)
            continue;
        g->al.fwd = r[k].algo;
        g->al.m_fwd = m;
        if (sz > *need) *need = sz;
        return 0;
    }
    return dsrt__fail(DSRT_EUNSUPPORTED,
                      "cuda backend: layer '%s' (line %d): cuDNN has no %sforward convolution "
                      "algorithm for it",
                      L->name, L->line, be->det ? "deterministic " : "");
}

static int pick_data(cuda_backend *be, gpu_layer *g, const dsrt_layer *L, int bf, const void *w,
                     const void *dy, void *dx, void *fws, size_t fws_size, size_t *need) {
    cudnnTensorDescriptor_t xd = bf ? g->xd16 : g->xd, yd = bf ? g->yd16 : g->yd;
    cudnnFilterDescriptor_t wd = bf ? g->wd16 : g->wd;
    cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int got = 0;
    DNN(cudnnSetConvolutionMathType(g->cd, be->conv_math));
    if (be->det)
        DNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            be->dnn, wd, yd, g->cd, xd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, r));
    else
        DNN(cudnnFindConvolutionBackwardDataAlgorithmEx(be->dnn, wd, w, yd, dy, g->cd, xd, dx,
                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got,
                                                        r, fws, fws_size));
    for (int k = 0; k < got; k++) {
        if (!USABLE(be, r[k])) continue;
        size_t sz = 0;
        cudnnMathType_t m = math_for(be, r[k].mathType);
        DNN(cudnnSetConvolutionMathType(g->cd, m));
        if (cudnnGetConvolutionBackwardDataWorkspaceSize(be->dnn, wd, yd, g->cd, xd, r[k].algo,
                                                         &sz) != CUDNN_STATUS_SUCCESS ||
            sz > FIND_WS_MAX)
            continue;
        g->al.data = r[k].algo;
        g->al.m_data = m;
        if (sz > *need) *need = sz;
        return 0;
    }
    return dsrt__fail(DSRT_EUNSUPPORTED,
                      "cuda backend: layer '%s' (line %d): cuDNN has no %sbackward data "
                      "algorithm for it",
                      L->name, L->line, be->det ? "deterministic " : "");
}

static int pick_filter(cuda_backend *be, gpu_layer *g, const dsrt_layer *L, int bf, const void *x,
                       const void *dy, void *dw, void *fws, size_t fws_size, size_t *need) {
    cudnnTensorDescriptor_t xd = bf ? g->xd16 : g->xd, yd = bf ? g->yd16 : g->yd;
    cudnnFilterDescriptor_t wd = bf ? g->wd16 : g->wd;
    cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int got = 0;
    DNN(cudnnSetConvolutionMathType(g->cd, be->conv_math));
    if (be->det)
        DNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            be->dnn, xd, yd, g->cd, wd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, r));
    else
        DNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(be->dnn, xd, x, yd, dy, g->cd, wd, dw,
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                          &got, r, fws, fws_size));
    for (int k = 0; k < got; k++) {
        if (!USABLE(be, r[k])) continue;
        size_t sz = 0;
        cudnnMathType_t m = math_for(be, r[k].mathType);
        DNN(cudnnSetConvolutionMathType(g->cd, m));
        if (cudnnGetConvolutionBackwardFilterWorkspaceSize(be->dnn, xd, yd, g->cd, wd, r[k].algo,
                                                           &sz) != CUDNN_STATUS_SUCCESS ||
            sz > FIND_WS_MAX)
            continue;
        g->al.filter = r[k].algo;
        g->al.m_filter = m;
        if (sz > *need) *need = sz;
        return 0;
    }
    return dsrt__fail(DSRT_EUNSUPPORTED,
                      "cuda backend: layer '%s' (line %d): cuDNN has no %sbackward filter "
                      "algorithm for it",
                      L->name, L->line, be->det ? "deterministic " : "");
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

/* The convolution algorithms of layer i, timed on the plan's own tensors.
 * dw: scratch the size of the layer's weights (the search writes it). */
static int plan_conv_algos(cuda_backend *be, gpu_plan *p, int i, void *fws, size_t fws_size,
                           void *dw, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    int bf = uses_bf16(be, L);
    const float *prev = p->gl[i - 1].y;
    const void *x = bf ? (const void *)g->x16 : g->pad_explicit ? (const void *)g->xp : prev;
    const void *w = bf ? (const void *)(be->w16 + L->w_off) : (const void *)(be->params + L->w_off);
    void *y = bf ? (void *)g->y16 : (void *)g->y;
    TRY(pick_fwd(be, g, L, bf, x, w, y, fws, fws_size, need));
    if (!p->train) return 0;
    void *dyb = bf ? (void *)g->y16 : (void *)g->dy;
    TRY(pick_filter(be, g, L, bf, x, dyb, dw, fws, fws_size, need));
    g->al.has_data = be->need_diff[i - 1];
    if (g->al.has_data) {
        void *dx = bf ? (void *)g->x16 : g->pad_explicit ? (void *)g->xp : (void *)p->gl[i - 1].dy;
        TRY(pick_data(be, g, L, bf, w, dyb, dx, fws, fws_size, need));
    }
    return 0;
}

/* Makes the shared workspace at least `need` bytes. */
static int ensure_workspace(cuda_backend *be, size_t need) {
    const dsrt_layer *L = NULL;
    if (need <= be->ws_size) return 0;
    if (be->ws) {
        CU(cudaStreamSynchronize(be->compute));
        CU(cudaFree(be->ws));
        be->ws = NULL;
        be->ws_size = 0;
    }
    CU(cudaMalloc(&be->ws, need));
    be->ws_size = need;
    return 0;
}

static int plan_build(cuda_backend *be, int n, int train, gpu_plan **out) {
    dsrt_net *net = be->net;
    int nl = net->n_layers, rc = 0;
    void *fws = NULL, *dw = NULL;
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
    size_t w_max = 0;
    for (int i = 1; i < nl; i++) {
        const dsrt_layer *l = &net->layers[i];
        gpu_layer *g = &p->gl[i];
        g->pad_explicit = pad_explicit(l);
        g->ph = l->in.h + (g->pad_explicit ? l->pt + l->pb : 0);
        g->pw = l->in.w + (g->pad_explicit ? l->pl + l->pr : 0);
        if (l->kind == DSRT_LAYER_CONV && l->w_n > w_max) w_max = l->w_n;
    }
    carve c = {NULL, 0};
    plan_layout(be, p, &c, need_dy);
    cudaError_t e = cudaMalloc(&p->mem, c.at ? c.at : 1);
    if (e != cudaSuccess) {
        rc = cu_fail(e, "cudaMalloc", NULL);
        p->mem = NULL;
        goto fail;
    }
    c.base = p->mem;
    c.at = 0;
    plan_layout(be, p, &c, need_dy);
    for (int i = 0; i < nl; i++)
        if ((rc = plan_layer_desc(be, p, i))) goto fail;

    /* Convolution algorithms, searched with a temporary workspace as large
     * as memory allows (up to FIND_WS_MAX). */
    int convs = 0;
    for (int i = 1; i < nl; i++) convs += net->layers[i].kind == DSRT_LAYER_CONV;
    size_t need = 0;
    if (convs) {
        size_t fws_size = 0;
        if (!be->det) {
            size_t free_b = 0, total_b = 0;
            e = cudaMemGetInfo(&free_b, &total_b);
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
            if (!fws) fws_size = 0;
        }
        if (train && !be->bf16 && w_max) {
            e = cudaMalloc(&dw, w_max * sizeof(float));
            if (e != cudaSuccess) {
                rc = cu_fail(e, "cudaMalloc", NULL);
                goto fail;
            }
        }
        for (int i = 1; i < nl; i++) {
            const dsrt_layer *l = &net->layers[i];
            if (l->kind != DSRT_LAYER_CONV) continue;
            void *dwl = be->bf16 ? (void *)(be->g16 + l->w_off) : dw;
            if ((rc = plan_conv_algos(be, p, i, fws, fws_size, dwl, &need))) goto fail;
        }
    }
    /* The search's memory goes back before the workspace grows. */
    cudaError_t e1 = fws ? cudaFree(fws) : cudaSuccess, e2 = dw ? cudaFree(dw) : cudaSuccess;
    fws = dw = NULL;
    if (e1 != cudaSuccess || e2 != cudaSuccess) {
        rc = cu_fail(e1 != cudaSuccess ? e1 : e2, "cudaFree", NULL);
        goto fail;
    }
    if ((rc = ensure_workspace(be, need))) goto fail;
    free(need_dy);
    *out = p;
    return 0;
fail:
    if (fws) cudaFree(fws);
    if (dw) cudaFree(dw);
    free(need_dy);
    plan_free(p);
    return rc;
}

/* The plan for (n, train), built on first use; the least recently used plan
 * gives way when every slot is taken. */
static int plan_get(cuda_backend *be, int n, int train, gpu_plan **out) {
    const dsrt_layer *L = NULL;
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
        slot = 0;
        for (int k = 1; k < PLAN_SLOTS; k++)
            if (be->plans[k]->used < be->plans[slot]->used) slot = k;
        /* Its tensors may still be in use by queued work. */
        CU(cudaStreamSynchronize(be->compute));
        if (be->last_train == be->plans[slot]) be->last_train = NULL;
        if (be->last_infer == be->plans[slot]) be->last_infer = NULL;
        if (be->last == be->plans[slot]) be->last = NULL;
        plan_free(be->plans[slot]);
        be->plans[slot] = NULL;
    }
    TRY(plan_build(be, n, train, &be->plans[slot]));
    be->plans[slot]->used = ++be->clock;
    *out = be->plans[slot];
    return 0;
}

// ----------------------------------------------------------------------------
// Forward

static const float ONE = 1.0f, ZERO = 0.0f;

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
    CU(cudaStreamSynchronize(be->compute));
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
    if (cudaEventSynchronize(be->ev_done[k]) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (cudaEventElapsedTime(&ms, be->ev_go[k], be->ev_done[k]) == cudaSuccess)
        be->busy_s += ms / 1e3;
    else
        (void)cudaGetLastError();
    if (s > 0 && cudaEventElapsedTime(&ms, be->ev_done[pk], be->ev_go[k]) == cudaSuccess && ms > 0)
        be->idle_s += ms / 1e3;
    else
        (void)cudaGetLastError();
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
    if (cudaSetDevice(be->device) == cudaSuccess &&
        cudaStreamSynchronize(be->compute) == cudaSuccess)
        while (be->acc_upto < be->steps) account(be, be->acc_upto++);
    else
        (void)cudaGetLastError();
    *busy_s = be->busy_s;
    *idle_s = be->idle_s;
}

// ----------------------------------------------------------------------------
// Staging

static int grow(void **buf, size_t *cap, size_t need, const dsrt_layer *L) {
    if (need <= *cap) return 0;
    if (*buf) {
        CU(cudaFree(*buf)); /* waits for the work that may read it */
        *buf = NULL;
        *cap = 0;
    }
    CU(cudaMalloc(buf, need));
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
    TRY(grow(&s->x, &s->cap, bytes, L));
    if (batch->labels) TRY(grow((void **)&s->labels, &s->lcap, batch->n * sizeof(int32_t), L));
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
    const dsrt_layer *L = NULL;
    if (be->staged < 0) return 0;
    CU(cudaEventSynchronize(be->slot[be->staged].copied));
    return 0;
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

    /* A new step: account for the one two back, then wait for the batch. */
    while (be->acc_upto + 2 <= be->steps) account(be, be->acc_upto++);
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
    CU(cudaEventSynchronize(be->results_ev));
    if (loss) *loss = be->results_labels ? *be->h_loss : 0.0;
    if (correct) *correct = be->results_labels ? (int)*be->h_correct : 0;
    if (probs) {
        const gpu_layer *g = &p->gl[p->n_layers - 1];
        CU(cudaMemcpyAsync(probs, g->y, (size_t)p->n * be->net->classes * sizeof(float),
                           cudaMemcpyDeviceToHost, be->compute));
        CU(cudaStreamSynchronize(be->compute));
    }
    return 0;
}

/* The step's segment table on the device, rebuilt when the segments differ
 * from the last step's. */
static int optim_plan(cuda_backend *be, const dsrt_optim_step *s) {
    if (be->seg_host && be->n_seg == s->n_seg) {
        int same = 1;
        for (int k = 0; k < s->n_seg && same; k++)
            same = be->seg_host[k].off == s->seg[k].off && be->seg_host[k].n == s->seg[k].n &&
                   be->seg_host[k].lr == s->seg[k].lr && be->seg_host[k].l2 == s->seg[k].l2;
        if (same) return 0;
    }
    dsrt_k_segment *ks = dsrt__calloc((size_t)s->n_seg + 1, sizeof *ks);
    dsrt_segment *copy = dsrt__calloc((size_t)s->n_seg + 1, sizeof *copy);
    if (!ks || !copy) {
        free(ks);
        free(copy);
        return -ENOMEM;
    }
    for (int k = 0; k < s->n_seg; k++) {
        ks[k].off = s->seg[k].off;
        ks[k].n = s->seg[k].n;
        ks[k].lr = s->seg[k].lr;
        ks[k].l2 = s->seg[k].l2;
        copy[k] = s->seg[k];
    }
    uint32_t blocks = 0;
    size_t work = dsrt_k_optim_layout(ks, s->n_seg, &blocks);
    int rc = 0;
    cudaError_t e = cudaStreamSynchronize(be->compute);
    const char *call = "cudaStreamSynchronize";
    if (e == cudaSuccess) {
        call = "cudaFree";
        if (be->seg_dev) e = cudaFree(be->seg_dev);
        if (be->kopt.work && e == cudaSuccess) e = cudaFree(be->kopt.work);
        be->seg_dev = NULL;
        be->kopt.work = NULL;
    }
    if (e == cudaSuccess) {
        call = "cudaMalloc";
        e = cudaMalloc((void **)&be->seg_dev, ((size_t)s->n_seg + 1) * sizeof *ks);
    }
    if (e == cudaSuccess) e = cudaMalloc(&be->kopt.work, work);
    if (e == cudaSuccess) {
        call = "cudaMemcpy";
        e = cudaMemcpy(be->seg_dev, ks, ((size_t)s->n_seg + 1) * sizeof *ks,
                       cudaMemcpyHostToDevice);
    }
    free(ks);
    if (e != cudaSuccess) {
        free(copy);
        free(be->seg_host);
        be->seg_host = NULL;
        return cu_fail(e, call, NULL);
    }
    free(be->seg_host);
    be->seg_host = copy;
    be->n_seg = s->n_seg;
    be->kopt.seg = be->seg_dev;
    be->kopt.n_seg = s->n_seg;
    be->kopt.blocks = blocks;
    return rc;
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
        if (!be->opt_buf[k]) CU(cudaMalloc((void **)&be->opt_buf[k], bytes ? bytes : 1));
    /* The device holds this optimizer's state only when the net says so and
     * the host's has not been written since. */
    if (net->opt_on_device != s->owner || be->opt_version != s->version) {
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
    CU(cudaStreamSynchronize(be->compute));
    for (int k = 0; k < s->n_buf; k++)
        if (be->opt_buf[k] && bytes)
            CU(cudaMemcpy(s->buf[k], be->opt_buf[k], bytes, cudaMemcpyDeviceToHost));
    return 0;
}

static int cuda_sync(dsrt_backend *b) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = NULL;
    CU(cudaSetDevice(be->device));
    CU(cudaStreamSynchronize(be->copy));
    CU(cudaStreamSynchronize(be->compute));
    return 0;
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
    m->stream = be->compute;
}

static int cuda_read_output(dsrt_backend *b, int layer, int train, float *out) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = &be->net->layers[layer];
    gpu_plan *p = train ? be->last_train : be->last_infer;
    if (!p) return dsrt__fail(-EINVAL, "cuda backend: no forward pass to read");
    CU(cudaSetDevice(be->device));
    CU(cudaStreamSynchronize(be->compute));
    CU(cudaMemcpy(out, p->gl[layer].y, out_count(L, p->n) * sizeof(float), cudaMemcpyDeviceToHost));
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
    if (be->seg_dev) cudaFree(be->seg_dev);
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
    CU(cudaMallocHost((void **)&be->h_loss, sizeof(double)));
    CU(cudaMallocHost((void **)&be->h_correct, sizeof(int32_t)));
    /* params, grads and state, then the bfloat16 weights and gradient
     * staging: one allocation. */
    size_t np = net->n_params, f = (2 * np + net->n_state) * sizeof(float);
    size_t at16 = (f + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    size_t total =
        be->bf16 ? at16 + 2 * ((np * sizeof(dsrt_bf16) + ALIGN - 1) & ~(size_t)(ALIGN - 1)) : f;
    CU(cudaMalloc(&be->flat, total ? total : 1));
    be->params = be->flat;
    be->grads = be->params + np;
    be->state = be->grads + np;
    if (be->bf16) {
        be->w16 = (dsrt_bf16 *)((char *)be->flat + at16);
        be->g16 = (dsrt_bf16 *)((char *)be->w16 +
                                ((np * sizeof(dsrt_bf16) + ALIGN - 1) & ~(size_t)(ALIGN - 1)));
    }
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
};

DSRT_MODULE_DEFINE(cuda, &dsrt__backend_cuda, dsrt__net_grads_ready);

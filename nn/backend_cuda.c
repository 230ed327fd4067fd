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
 * Inference plans (net option fuse 2) fold a per-channel affine map into
 * the layer before it: a convolution whose output's one taker is batchnorm
 * (any kind with infer_affine, through layers that are the identity at
 * inference) runs with weights and a bias that already hold it, w a and
 * b a + shift by output channel, and computes that layer's ReLU too (cuDNN's
 * fused call, else its bias kernel); the affine layer runs nothing and its
 * output is the convolution's. An element-wise activation that is the one
 * taker of such a chain's output or of a convolution's (any kind with
 * infer_act: ReLU, clip, sigmoid, hard sigmoid, hard swish, SiLU, GELU) is
 * computed likewise by the convolution's bias kernel (cuDNN's fused call
 * where it is a plain ReLU) and runs nothing. A two-input add that ends such
 * a chain, or takes a convolution's output alone, whose other input is
 * computed before the convolution (a residual block's shortcut), is
 * computed by the same kernel: the sum after the activation, then the
 * add's ReLU. The folded copies, one a layer for every
 * plan, in the device's order and the activations' type, are made on the
 * host from the host's parameters and state (brought back first when the
 * device's are newer) and uploaded, again whenever the parameters or the
 * state changed since: an upload of the host's, an optimizer step, a
 * training forward that moves batchnorm's statistics. Reading the output of
 * a layer so taken on, but the chain's last, is refused: nothing holds it.
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
#include "nn/backend_cuda.h"
#include "nn/act_kernel.h"

#include "core/module.h"
#include "platform/internal.h"

#include "kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ALIGN DSRT_CUDA_ALIGN
/* cuBLAS's own workspace (set once, so that recording a step never makes
 * it allocate): the size NVIDIA suggests for Hopper. */
#define BLAS_WS ((size_t)32 << 20)
/* Steps of one key run op by op before the key is recorded as graphs, and
 * graphs kept. */
#define GRAPH_WARMUP 2

/* The scaling factors of cuDNN and cuBLAS calls: out = 1 * result + 0 * out. */

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

int dsrt__cuda_cu_fail(cudaError_t e, const char *call, const dsrt_layer *l) {
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

int dsrt__cuda_dnn_fail(cudnnStatus_t s, const char *call, const dsrt_layer *l) {
    char detail[256] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    char msg[400];
    snprintf(msg, sizeof msg, "%s%s%s", cudnnGetErrorString(s), *detail ? " (" : "",
             *detail ? detail : "");
    if (*detail) strncat(msg, ")", sizeof msg - strlen(msg) - 1);
    return fail_msg(call, msg, l);
}

int dsrt__cuda_blas_fail(cublasStatus_t s, const char *call, const dsrt_layer *l) {
    return fail_msg(call, cublasGetStatusString(s), l);
}

/* An NHWC tensor descriptor of cuDNN. */
int dsrt__cuda_set_nhwc(cudnnTensorDescriptor_t *d, cudnnDataType_t t, int n, int c, int h, int w,
                        const dsrt_layer *L) {
    if (!*d) DNN(cudnnCreateTensorDescriptor(d));
    DNN(cudnnSetTensor4dDescriptor(*d, CUDNN_TENSOR_NHWC, t, n, c, h, w));
    return 0;
}

int dsrt__cuda_set_param_desc(cudnnTensorDescriptor_t *d, int c, const dsrt_layer *L) {
    if (!*d) DNN(cudnnCreateTensorDescriptor(d));
    DNN(cudnnSetTensor4dDescriptor(*d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, c, 1, 1));
    return 0;
}

static size_t align_up(size_t bytes) {
    return (bytes + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

/* The weights a product reads: the bfloat16 copy under bf16. */
const void *dsrt__cuda_weights(const cuda_backend *be, const dsrt_layer *l) {
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
        return e == cudaSuccess ? 0 : dsrt__cuda_cu_fail(e, what, NULL);
    }
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return dsrt__cuda_cu_fail(e, what, NULL);
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
        return dsrt__cuda_cu_fail(e, "cudaMalloc", L);
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
// The kinds' GPU parts, and the device's order of weights

static const dsrt_cuda_layer_ops *const CUDA_LAYERS[DSRT_LAYER_KIND_COUNT] = {
#define DSRT_CUDA_LAYER_ENTRY(K, k) [DSRT_LAYER_##K] = &dsrt__cuda_layer_##k,
    DSRT_LAYER_KINDS(DSRT_CUDA_LAYER_ENTRY)
#undef DSRT_CUDA_LAYER_ENTRY
};

static const dsrt_cuda_layer_ops *gpu_ops(const dsrt_layer *l) {
    return CUDA_LAYERS[l->kind];
}

/* Whether the device keeps layer l's weights in another order. */
static int reordered(const dsrt_layer *l) {
    const dsrt_cuda_layer_ops *o = gpu_ops(l);
    return o->reorders && o->reorders(l);
}

/* A layer's weights and bias with the affine map after it folded in
 * (inference plans): float32 and, under bf16, bfloat16 copies, from one
 * allocation (mem). */
typedef struct cuda_fold {
    void *mem;
    float *w;       /* (w_n) in the device's order */
    float *b;       /* (out.c) */
    dsrt_bf16 *w16; /* bf16: (w_n), (out.c) */
    dsrt_bf16 *b16;
    uint64_t gen; /* the backend's param_gen they hold */
} cuda_fold;

const void *dsrt__cuda_fwd_weights(const cuda_backend *be, const gpu_plan *p, int i) {
    const cuda_fold *f = &be->fold[i];
    if (p->gl[i].affine < 0) return dsrt__cuda_weights(be, &be->net->layers[i]);
    return be->bf16 ? (const void *)f->w16 : (const void *)f->w;
}

const float *dsrt__cuda_fwd_bias(const cuda_backend *be, const gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    if (p->gl[i].affine >= 0) return be->fold[i].b;
    return L->b_n ? be->params + L->b_off : NULL;
}

cudaError_t dsrt__cuda_epilogue(cuda_backend *be, gpu_plan *p, int i, const float *b) {
    gpu_layer *g = &p->gl[i];
    if (g->sum >= 0)
        return dsrt_k_bias_act_sum(&g->kd, g->y, b, &g->act, p->gl[g->sum].y, &g->post, g->y,
                                   be->compute);
    return dsrt_k_bias_act(&g->kd, g->y, b, g->y, &g->act, be->compute);
}

const dsrt_bf16 *dsrt__cuda_fwd_bias16(const cuda_backend *be, const gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    if (!be->bf16) return NULL;
    if (p->gl[i].affine >= 0) return be->fold[i].b16;
    return L->b_n && (L->b_off * sizeof(dsrt_bf16)) % 16 == 0 ? be->w16 + L->b_off : NULL;
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
        gpu_ops(L)->reorder(L, t, src + L->w_off, 1);
        cudaError_t e = cudaMemcpyAsync(dst + L->w_off, t, L->w_n * sizeof *t,
                                        cudaMemcpyHostToDevice, be->compute);
        free(t);
        if (e != cudaSuccess) return dsrt__cuda_cu_fail(e, "cudaMemcpyAsync", L);
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
        gpu_ops(L)->reorder(L, dst + L->w_off, t, 0);
        free(t);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Plan memory: every tensor of a plan from one allocation

void *dsrt__cuda_take(carve *c, size_t bytes) {
    size_t at = (c->at + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    c->at = at + ((bytes + ALIGN - 1) & ~(size_t)(ALIGN - 1));
    return c->base ? c->base + at : NULL;
}

/* Whether layer i's output is its input's: a ReLU computed by the layer
 * before it, a kind that is the identity at inference, or at inference a
 * layer the one before it computes (taken_by). */
static int aliases(const gpu_plan *p, int i, const dsrt_layer *l) {
    return l->fused_away || (!p->train && (dsrt__layer_is(l, DSRT_LAYER_F_INFER_IDENTITY) ||
                                           p->gl[i].taken_by >= 0));
}

/* Bytes of layer l's output for n images (DSRT_CUDA_F32_OUT: float32, else
 * the activations' type). */
static size_t output_bytes(const cuda_backend *be, const dsrt_layer *l, int n) {
    size_t el =
        gpu_ops(l)->flags & DSRT_CUDA_F32_OUT ? sizeof(float) : dsrt__cuda_type_size(be->act);
    return dsrt__cuda_out_count(l, n) * el;
}

/* The layer whose memory layer i's output is (itself unless it aliases). */
static int output_owner(const gpu_plan *p, const dsrt_net *net, int i) {
    while (i > 0 && aliases(p, i, &net->layers[i]))
        i = p->gl[i].taken_by >= 0 ? p->gl[i].taken_by : net->layers[i].inputs[0];
    return i;
}

/*
 * An inference plan of the full fusion (fuse 2) reuses the bytes of outputs
 * no later step reads: each output lives from its layer's step to the step
 * of the last layer that reads it (a layer a chain took runs in its taker's
 * step), the last layer's to the end, and they are placed in one span by
 * their lives (dsrt__place_by_life). Sets lives[i].offset for the layers
 * with memory of their own and returns the span; 0 when the plan keeps
 * every output (training, fuse below 2, keep_outputs).
 */
static size_t output_pool(cuda_backend *be, gpu_plan *p, dsrt_life *lives) {
    const dsrt_net *net = be->net;
    if (p->train || net->opts.fuse < 2 || net->keep_outputs || !lives) return 0;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        int own = i == 0 || !aliases(p, i, l);
        lives[i] = (dsrt_life){own ? output_bytes(be, l, p->n) : 0, 0, i, i};
    }
    for (int k = 1; k < net->n_layers; k++) {
        int step = p->gl[k].taken_by >= 0 ? p->gl[k].taken_by : k;
        for (int q = 0; q < net->layers[k].n_inputs; q++) {
            dsrt_life *b = &lives[output_owner(p, net, net->layers[k].inputs[q])];
            b->hi = DSRT_MAX(b->hi, step);
        }
    }
    lives[output_owner(p, net, net->n_layers - 1)].hi = net->n_layers;
    size_t span, each = 0;
    if (dsrt__place_by_life(lives, (size_t)net->n_layers, ALIGN, &span)) return 0;
    for (int i = 0; i < net->n_layers; i++) each += lives[i].size;
    p->act_held = span;
    p->act_each = each;
    return span;
}

/* Lays the plan's tensors out over c (pointers are NULL while measuring):
 * every layer's output (in an inference plan of the full fusion, from a
 * pool of their lives: output_pool) and gradient, each kind's scratch, the
 * shared scratch and the gradient sums. */
static void plan_layout(cuda_backend *be, gpu_plan *p, carve *c, const int *need_dy, void **share) {
    const dsrt_net *net = be->net;
    int n = p->n;
    for (int i = 0; i < net->n_layers; i++) share[i] = NULL;
    size_t at = dsrt__cuda_type_size(be->act), work = 0, acc = 0;
    dsrt_life *lives = p->train ? NULL : dsrt__calloc((size_t)net->n_layers, sizeof *lives);
    size_t span = output_pool(be, p, lives);
    char *pool = span ? dsrt__cuda_take(c, span) : NULL;
    p->pooled = span > 0;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        const dsrt_cuda_layer_ops *ops = gpu_ops(l);
        gpu_layer *g = &p->gl[i];
        size_t cnt = dsrt__cuda_out_count(l, n);
        if (i > 0 && aliases(p, i, l)) {
            /* A layer a chain took: the taker's output (an add's other
             * input may be its first). */
            int from = g->taken_by >= 0 ? g->taken_by : l->inputs[0];
            g->y = p->gl[from].y;
            g->dy = p->gl[from].dy;
        } else if (span) {
            g->y = pool ? pool + lives[i].offset : NULL;
            g->dy = NULL; /* inference: no gradient */
            g->hi = lives[i].hi;
        } else {
            g->y = dsrt__cuda_take(c, output_bytes(be, l, n));
            /* A layer whose inputs share its gradient and those inputs
             * (net.c's grad_share): one buffer, made for the first of them. */
            int key = net->grad_share[i] >= 0                       ? net->grad_share[i]
                      : dsrt__layer_is(l, DSRT_LAYER_F_GRAD_PASSES) ? i
                                                                    : -1;
            if (!need_dy[i])
                g->dy = NULL;
            else if (p->train && key >= 0) {
                if (!share[key]) share[key] = dsrt__cuda_take(c, cnt * at);
                g->dy = share[key];
            } else
                g->dy = dsrt__cuda_take(c, cnt * at);
        }
        if (ops->layout) ops->layout(be, p, i, c, &work);
        if (i > 0 && p->train && l->consumers > 1 && need_dy[i]) acc = DSRT_MAX(acc, cnt * at);
    }
    p->work = work ? dsrt__cuda_take(c, work) : NULL;
    p->acc = acc ? dsrt__cuda_take(c, acc) : NULL;
    free(lives);
}

/* Frees p's descriptors and, when it owns it, its memory (no queued work
 * may use it any more). */
static void plan_free(gpu_plan *p) {
    if (!p) return;
    for (int i = 0; p->gl && i < p->n_layers; i++) {
        gpu_layer *g = &p->gl[i];
        if (g->yd) cudnnDestroyTensorDescriptor(g->yd);
        if (g->own_free)
            g->own_free(g->own);
        else
            free(g->own);
    }
    if (p->mem && !p->owner) cudaFree(p->mem);
    free(p->gl);
    free(p->last_use);
    free(p);
}

// ----------------------------------------------------------------------------
// Planning

/* Where layer i's backward writes the gradient for input j (a layer it
 * takes): j's gradient when layer i is the last layer written that takes j
 * (backward runs last to first, so it writes first), else the plan's acc,
 * which grad_add then adds into j's gradient. */
void *dsrt__cuda_grad_ptr(const gpu_plan *p, int i, int j) {
    return p->last_use[j] == i ? p->gl[j].dy : p->acc;
}

int dsrt__cuda_bias_relu_bwd(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    if (L->b_n)
        CU(dsrt_k_bias_grad(&g->kd, g->dy, L->fuse_relu ? g->y : NULL, L->fuse_leak,
                            be->grads + L->b_off, p->work, be->compute));
    else if (L->fuse_relu)
        CU(dsrt_k_relu_bwd(be->act, g->y, g->dy, g->dy, dsrt__cuda_out_count(L, p->n), L->fuse_leak,
                           be->compute));
    return 0;
}

void dsrt__cuda_note(cuda_backend *be, const dsrt_layer *L, const char *fmt, ...) {
    char *note = be->net->backend_note;
    size_t cap = sizeof be->net->backend_note;
    if (strstr(note, L->name)) return;
    size_t used = strlen(note);
    int n = snprintf(note + used, cap - used, "%slayer '%s': ", used ? "; " : "", L->name);
    if (n < 0 || (size_t)n >= cap - used) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + used + n, cap - used - (size_t)n, fmt, ap);
    va_end(ap);
}

/* After layer i wrote input j's share into grad_ptr: added where it went
 * to acc. */
int dsrt__cuda_grad_add(cuda_backend *be, gpu_plan *p, int i, int j) {
    if (p->last_use[j] == i) return 0;
    const dsrt_layer *L = &be->net->layers[i];
    dsrt_k_sum s = {{p->gl[j].dy, p->acc}, 2};
    CU(dsrt_k_sum_fwd(be->act, &s, p->gl[j].dy, dsrt__cuda_out_count(&be->net->layers[j], p->n), 0,
                      0.0f, be->compute));
    return 0;
}

/* Makes the shared workspace at least `need` bytes. */
int dsrt__cuda_ensure_workspace(cuda_backend *be, size_t need) {
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
 * input of a kind that always computes it (DSRT_CUDA_DX_ALWAYS: cuDNN's
 * batchnorm); a layer that shares its input's tensors passes the need on.
 * The classifier's output has none. */
static void plan_need_dy(dsrt_net *net, const gpu_plan *p, int *need_dy) {
    int nl = net->n_layers;
    for (int i = nl - 1; p->train && i >= 0; i--) {
        const dsrt_layer *l = &net->layers[i];
        if (i < nl - 1) need_dy[i] |= dsrt__net_need_diff(net, i);
        if (i > 0 && (gpu_ops(l)->flags & DSRT_CUDA_DX_ALWAYS)) need_dy[l->inputs[0]] = 1;
        if (i > 0 && aliases(p, i, l) && need_dy[i]) need_dy[l->inputs[0]] = 1;
    }
}

/*
 * What each layer computes beyond itself. Every layer computes the ReLU it
 * took on (fuse_relu). In an inference plan of a net with the option fuse
 * 2, a layer whose kind folds (DSRT_CUDA_FOLDS) and computes no ReLU of its
 * own takes on, along its output's one taker after another, layers that
 * are the identity at inference, then a per-channel affine map of one input
 * (infer_affine) with its ReLU, then an element-wise activation
 * (infer_act) unless the affine map brought a ReLU, then the sum of a
 * two-input add whose other input is computed before the layer (sum) and
 * the add's ReLU (post), and the layers that pass that output on unchanged
 * (a ReLU it computes, the identity at inference) anywhere between: the
 * chain ends at the first other layer, or after the add. The layer's
 * forward computes the activation (act) after its bias, then the sum; the
 * layers taken on run nothing. Without an affine map, an activation or a
 * sum nothing is taken on.
 */
static void plan_chains(cuda_backend *be, gpu_plan *p) {
    const dsrt_net *net = be->net;
    for (int i = 0; i < p->n_layers; i++) {
        const dsrt_layer *L = &net->layers[i];
        gpu_layer *g = &p->gl[i];
        g->act = L->fuse_relu ? (dsrt_k_act){DSRT_K_ACT_RELU, L->fuse_leak, 0.0f}
                              : (dsrt_k_act){DSRT_K_ACT_IDENTITY, 0.0f, 0.0f};
        g->affine = -1;
        g->last = i;
        g->taken_by = -1;
        g->sum = -1;
        g->post = (dsrt_k_act){DSRT_K_ACT_IDENTITY, 0.0f, 0.0f};
    }
    if (p->train || net->opts.fuse < 2) return;
    for (int i = 1; i < p->n_layers; i++) {
        const dsrt_layer *L = &net->layers[i];
        gpu_layer *g = &p->gl[i];
        if (!(gpu_ops(L)->flags & DSRT_CUDA_FOLDS) || L->fuse_relu || g->taken_by >= 0) continue;
        int affine = -1, acts = 0, last = i, sum = -1;
        dsrt_k_act act = g->act, post = g->post;
        for (int cur = i, j; (j = dsrt__net_only_taker(net, cur)) > 0; cur = j) {
            const dsrt_layer *J = &net->layers[j];
            const dsrt_layer_ops *o = dsrt__layer_ops(J);
            dsrt_act a;
            if (J->fused_away || dsrt__layer_is(J, DSRT_LAYER_F_INFER_IDENTITY)) {
                /* a ReLU the affine map computes (in act already), or the
                 * identity */
            } else if (affine < 0 && !acts && o->infer_affine && J->n_inputs == 1) {
                affine = j;
                if (J->fuse_relu) act = (dsrt_k_act){DSRT_K_ACT_RELU, J->fuse_leak, 0.0f};
                acts = J->fuse_relu;
            } else if (sum < 0 && !acts && o->infer_act && J->n_inputs == 1 &&
                       o->infer_act(J, &a) && dsrt__act_kernel_of(&a, &act)) {
                acts = 1;
            } else if (sum < 0 && dsrt__layer_is(J, DSRT_LAYER_F_SUM) && J->n_inputs == 2 &&
                       J->inputs[0] != J->inputs[1] && J->inputs[J->inputs[0] == cur] < i) {
                sum = J->inputs[J->inputs[0] == cur];
                if (J->fuse_relu) post = (dsrt_k_act){DSRT_K_ACT_RELU, J->fuse_leak, 0.0f};
                acts = 1;
            } else {
                break;
            }
            last = j;
        }
        if (affine < 0 && act.fn == DSRT_K_ACT_IDENTITY && sum < 0) continue;
        g->affine = affine;
        g->last = last;
        g->act = act;
        g->sum = sum;
        g->post = post;
        for (int j = dsrt__net_only_taker(net, i); j > 0 && j <= last;
             j = dsrt__net_only_taker(net, j))
            p->gl[j].taken_by = i;
    }
}

/* The folded weights' memory of every layer of inference plan p that
 * takes on an affine map (made once: every plan shares them). */
static int plan_folds(cuda_backend *be, const gpu_plan *p) {
    for (int i = 1; i < p->n_layers; i++) {
        const dsrt_layer *L = &be->net->layers[i];
        cuda_fold *f = &be->fold[i];
        if (p->gl[i].affine < 0 || f->mem) continue;
        size_t c = (size_t)L->out.c, w32 = align_up(L->w_n * sizeof(float)),
               b32 = align_up(c * sizeof(float)), w16 = be->bf16 ? align_up(L->w_n * 2) : 0;
        size_t bytes = w32 + b32 + (be->bf16 ? w16 + align_up(c * 2) : 0);
        TRY(dev_alloc(be, &f->mem, bytes, L));
        CU(cudaMemsetAsync(f->mem, 0, bytes, be->compute));
        f->w = f->mem;
        f->b = (float *)((char *)f->mem + w32);
        if (be->bf16) {
            f->w16 = (dsrt_bf16 *)((char *)f->mem + w32 + b32);
            f->b16 = (dsrt_bf16 *)((char *)f->mem + w32 + b32 + w16);
        }
        f->gen = be->param_gen - 1;
    }
    return 0;
}

/* The kinds' algorithm searches (convolutions), timed with a scratch
 * workspace as large as memory allows (up to FIND_WS_MAX), or once sizes
 * are reserved, in the workspace as it is; need grows to the workspace
 * they want. */
static int plan_search(cuda_backend *be, gpu_plan *p, size_t *need) {
    dsrt_net *net = be->net;
    int nl = net->n_layers, rc = 0;
    void *fws = NULL;
    int fws_own = 0;
    int searches = 0, trials = 0;
    for (int i = 1; i < nl; i++) {
        searches += gpu_ops(&net->layers[i])->search != NULL;
        trials += gpu_ops(&net->layers[i])->try_fused != NULL;
    }
    size_t fws_size = 0;
    /* A search or a trial blocks the host until the device is done with
     * what is queued: with collectives possible, wait for that with the
     * deadline. */
    if ((searches || trials) && (be->frozen || collectives_possible(be)) && (rc = quiet(be)))
        goto fail;
    if (searches && !be->det) {
        if (be->frozen) {
            fws = be->ws;
            fws_size = be->ws_size;
        } else {
            size_t free_b = 0, total_b = 0;
            cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
            if (e != cudaSuccess) {
                rc = dsrt__cuda_cu_fail(e, "cudaMemGetInfo", NULL);
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
        const dsrt_cuda_layer_ops *ops = gpu_ops(&net->layers[i]);
        if (ops->search && (rc = ops->search(be, p, i, fws, fws_size, need))) goto fail;
    }
    /* The search's memory goes back before the workspace grows. */
    if (fws_own) {
        cudaError_t e = cudaFree(fws);
        fws = NULL;
        fws_own = 0;
        if (e != cudaSuccess) return dsrt__cuda_cu_fail(e, "cudaFree", NULL);
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
    plan_chains(be, p);
    if ((rc = plan_folds(be, p))) goto fail;
    plan_need_dy(net, p, need_dy);
    p->last_use = dsrt__calloc((size_t)nl, sizeof *p->last_use);
    if (!p->last_use) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 1; i < nl; i++)
        for (int k = 0; k < net->layers[i].n_inputs; k++) p->last_use[net->layers[i].inputs[k]] = i;
    /* Every layer's output as dsrt's kernels see it, then the kinds'
     * descriptors. */
    for (int i = 0; i < nl; i++) {
        const dsrt_layer *l = &net->layers[i];
        dsrt_k_type t = gpu_ops(l)->flags & DSRT_CUDA_F32_OUT ? DSRT_K_F32 : be->act;
        p->gl[i].kd = dsrt__cuda_kdesc(n, l->out.c, l->out.h, l->out.w, 1, t);
        p->gl[i].in0 = i ? l->inputs[0] : 0;
    }
    for (int i = 0; i < nl; i++) {
        const dsrt_cuda_layer_ops *ops = gpu_ops(&net->layers[i]);
        if (ops->desc && (rc = ops->desc(be, p, i, &need))) goto fail;
    }
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
    if ((rc = dsrt__cuda_ensure_workspace(be, need))) goto fail;
    /* The fused calls, tried once on the plan's tensors. */
    for (int i = 1; i < nl; i++) {
        const dsrt_cuda_layer_ops *ops = gpu_ops(&net->layers[i]);
        if (ops->try_fused) ops->try_fused(be, p, i);
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
int dsrt__cuda_grads_ready(cuda_backend *be, int i) {
    const dsrt_net *net = be->net;
    if (!net->ready_fn || net->layer_bucket[i] < 0) return 0;
    callout c = {CALL_GRADS, i, {0}};
    return callout_at(be, &c);
}

int dsrt__cuda_bn_callout(cuda_backend *be, int i, int backward, double *sums, size_t n) {
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

// ----------------------------------------------------------------------------
// Backward

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
    p->slot = s;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        if (l->fused_away) continue;
        TRY(prof_mark(be, e->fwd0, i));
        if (!aliases(p, i, l)) TRY(gpu_ops(l)->forward(be, p, i));
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
        const dsrt_layer *l = &net->layers[i];
        if (l->fused_away) continue;
        TRY(prof_mark(be, e->bwd0, i));
        TRY(gpu_ops(l)->backward(be, p, i));
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
    k->hook_gen = net->ready_fn ? net->hook_gen : 0;
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
    if (e != cudaSuccess) return dsrt__cuda_cu_fail(e, "cudaGraphInstantiate", L);
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
    if (be->any_state) net->host_stale |= DSRT_BUF_STATE;
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
        if (be->any_state) be->net->host_stale |= DSRT_BUF_STATE;
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
    be->param_gen++;
    return 0;
}

static int cuda_to_host(dsrt_backend *b, unsigned what);

/* Layer i's folded weights and bias from the host's parameters and state:
 * the affine map's scale and shift by output channel (infer_affine), each
 * output channel's weights times its scale (in the host's order, then the
 * device's), the bias times it plus the shift; uploaded on the compute
 * stream, and converted there to bfloat16 under bf16. */
static int fold_make(cuda_backend *be, int i, int affine) {
    const dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i], *A = &net->layers[affine];
    cuda_fold *f = &be->fold[i];
    size_t c = (size_t)L->out.c, per = L->w_n / c;
    float *w = malloc((2 * L->w_n + 3 * c) * sizeof *w);
    if (!w) return dsrt__fail(-ENOMEM, "cuda backend: out of memory folding layer '%s'", L->name);
    float *dev = w + L->w_n, *b = dev + L->w_n, *scale = b + c, *shift = scale + c;
    int rc = 0;
    if (!dsrt__layer_ops(A)->infer_affine(A, net->params, net->state, scale, shift)) {
        rc = dsrt__fail(DSRT_EBACKEND, "cuda backend: layer '%s': no affine map to fold", A->name);
        goto out;
    }
    const float *hw = net->params + L->w_off, *hb = L->b_n ? net->params + L->b_off : NULL;
    for (size_t o = 0; o < c; o++) {
        for (size_t k = 0; k < per; k++) w[o * per + k] = hw[o * per + k] * scale[o];
        b[o] = (hb ? hb[o] : 0.0f) * scale[o] + shift[o];
    }
    const float *src = w;
    if (reordered(L)) {
        gpu_ops(L)->reorder(L, dev, w, 1);
        src = dev;
    }
    /* From pageable memory: each copy returns once its source is read. */
    cudaError_t e =
        cudaMemcpyAsync(f->w, src, L->w_n * sizeof *w, cudaMemcpyHostToDevice, be->compute);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(f->b, b, c * sizeof *b, cudaMemcpyHostToDevice, be->compute);
    if (e == cudaSuccess && be->bf16) e = dsrt_k_f32_to_bf16(f->w, f->w16, L->w_n, be->compute);
    if (e == cudaSuccess && be->bf16) e = dsrt_k_f32_to_bf16(f->b, f->b16, c, be->compute);
    if (e != cudaSuccess) rc = dsrt__cuda_cu_fail(e, "folding", L);
out:
    free(w);
    return rc;
}

/* Before an inference forward over plan p: the folded weights that the
 * parameters or the state changed under are made again (once the device's
 * newer values are on the host). */
static int folds_refresh(cuda_backend *be, const gpu_plan *p) {
    dsrt_net *net = be->net;
    for (int i = 1; i < p->n_layers; i++) {
        if (p->gl[i].affine < 0 || be->fold[i].gen == be->param_gen) continue;
        unsigned what = net->host_stale & (DSRT_BUF_PARAMS | DSRT_BUF_STATE);
        if (what) {
            TRY(cuda_to_host((dsrt_backend *)be, what));
            net->host_stale &= ~what;
        }
        TRY(fold_make(be, i, p->gl[i].affine));
        be->fold[i].gen = be->param_gen;
    }
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
        if (be->any_state) be->param_gen++;
        return 0;
    }
    TRY(folds_refresh(be, p));
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
        if (e != cudaSuccess) rc = dsrt__cuda_cu_fail(e, "cudaMemcpyAsync", L);
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
    be->param_gen++;
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
/* The activations of the plan for (n, train): pooled (inference, fuse 2) or
 * each layer's output with memory of its own. */
static int cuda_activation_bytes(dsrt_backend *b, int n, int train, size_t *held, size_t *each) {
    cuda_backend *be = (cuda_backend *)b;
    const gpu_plan *p = NULL;
    for (int k = 0; k < PLAN_SLOTS && !p; k++)
        if (be->plans[k] && be->plans[k]->n == n && be->plans[k]->train == train) p = be->plans[k];
    if (!p) return -ENOENT;
    if (p->pooled) {
        *held = p->act_held;
        *each = p->act_each;
        return 0;
    }
    size_t sum = 0;
    for (int i = 0; i < be->net->n_layers; i++) {
        const dsrt_layer *l = &be->net->layers[i];
        if (i == 0 || !aliases(p, i, l)) sum += output_bytes(be, l, n);
    }
    *held = *each = sum;
    return 0;
}

static int cuda_read_output(dsrt_backend *b, int layer, int train, float *out) {
    cuda_backend *be = (cuda_backend *)b;
    const dsrt_layer *L = &be->net->layers[layer];
    gpu_plan *p = train ? be->last_train : be->last_infer;
    if (!p) return dsrt__fail(-EINVAL, "cuda backend: no forward pass to read");
    /* In an inference plan a chain's layers share the output of the layer
     * computing them, which holds the last one's values. */
    int owner = p->gl[layer].taken_by >= 0 ? p->gl[layer].taken_by : layer;
    if (p->gl[owner].last != layer)
        return dsrt__fail(-EINVAL,
                          "cuda backend: layer '%s': its output is fused into layer '%s''s in the "
                          "inference plan (the net option fuse = 0 keeps it)",
                          L->name, be->net->layers[p->gl[owner].last].name);
    /* Pooled: bytes later layers took once no later step read them. */
    if (p->pooled && p->gl[output_owner(p, be->net, layer)].hi < be->net->n_layers - 1)
        return dsrt__fail(-EINVAL,
                          "cuda backend: layer '%s': its output's memory is reused by later layers "
                          "in the inference plan (the net option fuse = 1 keeps it)",
                          L->name);
    TRY(settle(be));
    TRY(wait_stream(be, be->compute));
    const gpu_layer *g = &p->gl[layer];
    size_t cnt = dsrt__cuda_out_count(L, p->n), el = dsrt__cuda_type_size(g->kd.type);
    char *h = malloc(cnt * el + 1);
    if (!h) return -ENOMEM;
    cudaError_t e = cudaMemcpy(h, g->y, cnt * el, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        free(h);
        return dsrt__cuda_cu_fail(e, "cudaMemcpy", L);
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
    for (int i = 0; be->fold && i < be->net->n_layers; i++)
        if (be->fold[i].mem) cudaFree(be->fold[i].mem);
    free(be->fold);
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
    be->fold = dsrt__calloc((size_t)net->n_layers, sizeof *be->fold);
    if (!be->fold) {
        free(be);
        return -ENOMEM;
    }
    for (int i = 0; i < net->n_layers; i++)
        be->any_state |= (gpu_ops(&net->layers[i])->flags & DSRT_CUDA_STATE) != 0;
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
        r->fused_cudnn += g->fuse == FUSE_CUDNN;
        r->fused_kernel += g->fuse == FUSE_KERNEL;
    }
}

const dsrt_backend_ops dsrt__backend_cuda = {
    .name = "cuda-cudnn",
    .device_kind = 1,
    .devices = dsrt__cuda_devices, /* the CUDA runtime's count (platform/hostmem.c) */
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
    .activation_bytes = cuda_activation_bytes,
    .bn_sync = 1,
    .reserve = cuda_reserve,
    .describe = cuda_describe,
};

DSRT_MODULE_DEFINE(cuda, &dsrt__backend_cuda, dsrt__net_grads_ready);

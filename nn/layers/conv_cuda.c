/*
 * conv on the GPU: cuDNN's convolutions in NHWC (filters kept on the device
 * in cuDNN's NHWC order, reordered at every transfer so that the host's
 * buffers stay the CPU backend's), algorithms found by timing them on the
 * plan's own tensors, the bias and a ReLU after it fused into one cuDNN
 * call where cuDNN takes it, else into one dsrt kernel; dsrt's direct
 * convolution where cuDNN has no algorithm. At inference a batchnorm after
 * it may be folded into its weights and bias (the engine's folded copies),
 * its ReLU then computed by the convolution, and an activation layer after
 * either computed by the bias kernel. See nn/layers/conv.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/conv_kernels.h"

/* What a convolution keeps of its plan. */
typedef struct {
    cudnnTensorDescriptor_t xd; /* what cuDNN reads: the padded input or the previous y */
    cudnnFilterDescriptor_t wd; /* (out.c, in.c / groups, kh, kw) as NHWC filters */
    cudnnConvolutionDescriptor_t cd;
    cudnnTensorDescriptor_t bd; /* (1, c, 1, 1) float: the bias */
    /* Under bf16, the fused convolution's bias in bfloat16 (its copy in w16)
     * where cuDNN refuses a float bias with bfloat16 data. */
    cudnnTensorDescriptor_t bd16;
    int bias16;
    cudnnActivationDescriptor_t act; /* the fused call's activation */
    struct {
        cudnnConvolutionFwdAlgo_t fwd;
        cudnnConvolutionBwdDataAlgo_t data;
        cudnnConvolutionBwdFilterAlgo_t filter;
        cudnnMathType_t m_fwd, m_data, m_filter;
        int has_data; /* backward data runs (the input needs a gradient) */
        /* By direction (DIR_*): cuDNN has no algorithm for it, and dsrt's
         * direct convolution kernels run it instead (dsrt_k_conv_*). */
        int own[3];
    } al;
    dsrt_k_conv kconv; /* the convolution for dsrt's direct kernels */
    int pad_explicit;  /* asymmetric padding: copied into xp */
    int ph, pw;        /* the padded input's height and width */
    void *xp;          /* (n, ph, pw, in.c) the padded input; then its gradient */
} conv_own;

static void own_free(void *own) {
    conv_own *o = own;
    if (!o) return;
    if (o->xd) cudnnDestroyTensorDescriptor(o->xd);
    if (o->bd) cudnnDestroyTensorDescriptor(o->bd);
    if (o->bd16) cudnnDestroyTensorDescriptor(o->bd16);
    if (o->wd) cudnnDestroyFilterDescriptor(o->wd);
    if (o->cd) cudnnDestroyConvolutionDescriptor(o->cd);
    if (o->act) cudnnDestroyActivationDescriptor(o->act);
    free(o);
}

/* Whether layer l's weights are kept in another order on the device: a
 * convolution's filters as NHWC filters (out, kh, kw, in / groups), where
 * that order differs from the host's (out, in / groups, kh, kw). */
static int reorders(const dsrt_layer *l) {
    return l->o.kh * l->o.kw > 1 && l->in.c / l->o.groups > 1;
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

// ----------------------------------------------------------------------------
// Algorithms
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

/* Whether a search result may be used: it ran, and in deterministic mode
 * it is deterministic. */
#define USABLE(be, r)                                                                              \
    ((r).status == CUDNN_STATUS_SUCCESS && (!(be)->det || (r).determinism == CUDNN_DETERMINISTIC))

static cudnnStatus_t dir_search(cuda_backend *be, gpu_layer *g, int dir, const void *a,
                                const void *b, void *c, void *ws, size_t ws_size, algo_perf *out,
                                int *got) {
    conv_own *o = g->own;
    cudnnStatus_t st;
    if (dir == DIR_FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int n = DSRT_MIN(CUDNN_CONVOLUTION_FWD_ALGO_COUNT, ALGO_MAX);
        st = be->det ? cudnnGetConvolutionForwardAlgorithm_v7(be->dnn, o->xd, o->wd, o->cd, g->yd,
                                                              n, got, r)
                     : cudnnFindConvolutionForwardAlgorithmEx(be->dnn, o->xd, a, o->wd, b, o->cd,
                                                              g->yd, c, n, got, r, ws, ws_size);
        if (st == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *got);
    } else if (dir == DIR_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        int n = DSRT_MIN(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, ALGO_MAX);
        st = be->det ? cudnnGetConvolutionBackwardDataAlgorithm_v7(be->dnn, o->wd, g->yd, o->cd,
                                                                   o->xd, n, got, r)
                     : cudnnFindConvolutionBackwardDataAlgorithmEx(
                           be->dnn, o->wd, a, g->yd, b, o->cd, o->xd, c, n, got, r, ws, ws_size);
        if (st == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *got);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        int n = DSRT_MIN(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, ALGO_MAX);
        st = be->det ? cudnnGetConvolutionBackwardFilterAlgorithm_v7(be->dnn, o->xd, g->yd, o->cd,
                                                                     o->wd, n, got, r)
                     : cudnnFindConvolutionBackwardFilterAlgorithmEx(
                           be->dnn, o->xd, a, g->yd, b, o->cd, o->wd, c, n, got, r, ws, ws_size);
        if (st == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *got);
    }
    return st;
}

static cudnnStatus_t dir_workspace(cuda_backend *be, gpu_layer *g, int dir, int algo, size_t *sz) {
    conv_own *o = g->own;
    if (dir == DIR_FWD)
        return cudnnGetConvolutionForwardWorkspaceSize(be->dnn, o->xd, o->wd, o->cd, g->yd,
                                                       (cudnnConvolutionFwdAlgo_t)algo, sz);
    if (dir == DIR_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            be->dnn, o->wd, g->yd, o->cd, o->xd, (cudnnConvolutionBwdDataAlgo_t)algo, sz);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        be->dnn, o->xd, g->yd, o->cd, o->wd, (cudnnConvolutionBwdFilterAlgo_t)algo, sz);
}

/* One run of algo on the direction's pointers (what it writes is scratch
 * until the step writes it again). */
static cudnnStatus_t dir_run(cuda_backend *be, gpu_layer *g, int dir, int algo, const void *a,
                             const void *b, void *c) {
    conv_own *o = g->own;
    if (dir == DIR_FWD)
        return cudnnConvolutionForward(be->dnn, &ONE, o->xd, a, o->wd, b, o->cd,
                                       (cudnnConvolutionFwdAlgo_t)algo, be->ws, be->ws_size, &ZERO,
                                       g->yd, c);
    if (dir == DIR_DATA)
        return cudnnConvolutionBackwardData(be->dnn, &ONE, o->wd, a, g->yd, b, o->cd,
                                            (cudnnConvolutionBwdDataAlgo_t)algo, be->ws,
                                            be->ws_size, &ZERO, o->xd, c);
    return cudnnConvolutionBackwardFilter(be->dnn, &ONE, o->xd, a, g->yd, b, o->cd,
                                          (cudnnConvolutionBwdFilterAlgo_t)algo, be->ws,
                                          be->ws_size, &ZERO, o->wd, c);
}

/* The math type an algorithm runs with: fp32 runs are held to FMA
 * arithmetic whatever the search tried; otherwise the result's own. */
static cudnnMathType_t math_for(const cuda_backend *be, cudnnMathType_t found) {
    return be->conv_math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : found;
}

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
    conv_own *o = g->own;
    algo_perf r[ALGO_MAX];
    int got = 0;
    size_t cap = be->frozen ? be->ws_size : FIND_WS_MAX;
    DNN(cudnnSetConvolutionMathType(o->cd, be->conv_math));
    DNN(dir_search(be, g, dir, a, b, c, fws, fws_size, r, &got));
    for (int k = 0; k < got; k++) {
        if (!USABLE(be, r[k]) || r[k].memory > cap) continue;
        size_t sz = 0;
        cudnnMathType_t m = math_for(be, r[k].math);
        DNN(cudnnSetConvolutionMathType(o->cd, m));
        if (dir_workspace(be, g, dir, r[k].algo, &sz) != CUDNN_STATUS_SUCCESS || sz > cap) continue;
        if (be->det) {
            TRY(dsrt__cuda_ensure_workspace(be, sz));
            if (dir_run(be, g, dir, r[k].algo, a, b, c) != CUDNN_STATUS_SUCCESS) {
                (void)cudaGetLastError();
                continue;
            }
        }
        if (dir == DIR_FWD) {
            o->al.fwd = (cudnnConvolutionFwdAlgo_t)r[k].algo;
            o->al.m_fwd = m;
        } else if (dir == DIR_DATA) {
            o->al.data = (cudnnConvolutionBwdDataAlgo_t)r[k].algo;
            o->al.m_data = m;
        } else {
            o->al.filter = (cudnnConvolutionBwdFilterAlgo_t)r[k].algo;
            o->al.m_filter = m;
        }
        if (sz > *need) *need = sz;
        o->al.own[dir] = 0;
        return 0;
    }
    /* None: dsrt's direct convolution runs this direction (correct for any
     * shape, deterministic, slow), said once in the backend's note. */
    o->al.own[dir] = 1;
    dsrt__cuda_note(be, L, "cuDNN has no %s%s algorithm%s: dsrt's direct convolution",
                    be->det ? "deterministic " : "", DIR_NAME[dir],
                    be->frozen ? " within the workspace reserved" : "");
    return 0;
}

/* Layer i's descriptors: cuDNN's view of the (padded) input, the output,
 * the filters and the convolution, and dsrt's direct convolution for what
 * cuDNN has no algorithm for. Asymmetric padding, which cuDNN cannot
 * express, is done by a copy into a padded input. */
static int desc(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    int n = p->n;
    conv_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    g->own = o;
    g->own_free = own_free;
    o->pad_explicit = L->pt != L->pb || L->pl != L->pr;
    o->ph = L->in.h + (o->pad_explicit ? L->pt + L->pb : 0);
    o->pw = L->in.w + (o->pad_explicit ? L->pl + L->pr : 0);
    int sym = !o->pad_explicit;
    TRY(dsrt__cuda_set_nhwc(&g->yd, be->act_dt, n, L->out.c, L->out.h, L->out.w, L));
    TRY(dsrt__cuda_set_nhwc(&o->xd, be->act_dt, n, L->in.c, o->ph, o->pw, L));
    DNN(cudnnCreateFilterDescriptor(&o->wd));
    DNN(cudnnSetFilter4dDescriptor(o->wd, be->act_dt, CUDNN_TENSOR_NHWC, L->out.c,
                                   L->in.c / L->o.groups, L->o.kh, L->o.kw));
    DNN(cudnnCreateConvolutionDescriptor(&o->cd));
    DNN(cudnnSetConvolution2dDescriptor(o->cd, sym ? L->pt : 0, sym ? L->pl : 0, L->o.sh, L->o.sw,
                                        L->o.dh, L->o.dw, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionGroupCount(o->cd, L->o.groups));
    DNN(cudnnSetConvolutionMathType(o->cd, be->conv_math));
    o->kconv = (dsrt_k_conv){dsrt__cuda_kdesc(n, L->in.c, o->ph, o->pw, 1, be->act),
                             dsrt__cuda_kdesc(n, L->out.c, L->out.h, L->out.w, 1, be->act),
                             L->o.kh,
                             L->o.kw,
                             L->o.sh,
                             L->o.sw,
                             L->o.dh,
                             L->o.dw,
                             sym ? L->pt : 0,
                             sym ? L->pl : 0,
                             L->o.groups};
    if (L->b_n || g->affine >= 0) TRY(dsrt__cuda_set_param_desc(&o->bd, L->out.c, L));
    DNN(cudnnCreateActivationDescriptor(&o->act));
    DNN(cudnnSetActivationDescriptor(
        o->act, g->act.fn == DSRT_K_ACT_RELU ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
        CUDNN_PROPAGATE_NAN, 0.0));
    int on, oc, oh, ow;
    DNN(cudnnGetConvolution2dForwardOutputDim(o->cd, o->xd, o->wd, &on, &oc, &oh, &ow));
    if (on != n || oc != L->out.c || oh != L->out.h || ow != L->out.w)
        return dsrt__fail(DSRT_EBACKEND,
                          "cuda backend: layer '%s' (line %d): cuDNN makes a %dx%dx%d output, "
                          "the layer %dx%dx%d",
                          L->name, L->line, oc, oh, ow, L->out.c, L->out.h, L->out.w);
    return 0;
}

/* The padded input, where the padding is asymmetric; the bias gradients'
 * partial sums. */
static void layout(cuda_backend *be, gpu_plan *p, int i, carve *c, size_t *work) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    conv_own *o = g->own;
    o->xp = o->pad_explicit ? dsrt__cuda_take(c, (size_t)p->n * L->in.c * o->ph * o->pw *
                                                     dsrt__cuda_type_size(be->act))
                            : NULL;
    if (L->b_n && p->train) *work = DSRT_MAX(*work, dsrt_k_bias_grad_work(&g->kd));
}

/* The tensor a convolution reads: its input, or the padded copy. */
static const void *conv_input(const gpu_plan *p, int i) {
    const gpu_layer *g = &p->gl[i];
    const conv_own *o = g->own;
    return o->pad_explicit ? o->xp : p->gl[g->in0].y;
}

static dsrt_k_desc padded_desc(const cuda_backend *be, const gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    const conv_own *o = p->gl[i].own;
    return dsrt__cuda_kdesc(p->n, L->in.c, o->ph, o->pw, 1, be->act);
}

/* The convolution algorithms of layer i, searched on the plan's own
 * tensors, the layer's weights and its gradient in the flat buffers: the
 * pointers the steps use. */
static int search(cuda_backend *be, gpu_plan *p, int i, void *fws, size_t fws_size, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    conv_own *o = p->gl[i].own;
    const void *x = conv_input(p, i), *w = dsrt__cuda_weights(be, L);
    TRY(pick(be, g, L, DIR_FWD, x, dsrt__cuda_fwd_weights(be, p, i), g->y, fws, fws_size, need));
    if (!p->train) return 0;
    void *dw = be->bf16 ? (void *)(be->g16 + L->w_off) : (void *)(be->grads + L->w_off);
    TRY(pick(be, g, L, DIR_FILTER, x, g->dy, dw, fws, fws_size, need));
    o->al.has_data = dsrt__net_need_diff(be->net, L->inputs[0]);
    if (o->al.has_data) {
        void *dx = o->pad_explicit ? o->xp : dsrt__cuda_grad_ptr(p, i, g->in0);
        TRY(pick(be, g, L, DIR_DATA, w, g->dy, dx, fws, fws_size, need));
    }
    return 0;
}

/*
 * Whether convolution i runs fused with its bias and activation in one
 * cuDNN call: it has a bias (its own, or a folded one), the activation
 * after it is a plain ReLU or none (identity needs IMPLICIT_PRECOMP_GEMM,
 * cuDNN's rule), and one trial call on the plan's tensors succeeds; else
 * the bias and the activation (any of dsrt_k_act: a leaky ReLU, or at
 * inference the activation layer after it) run in one dsrt kernel after
 * the convolution.
 */
static void try_fused(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    conv_own *o = p->gl[i].own;
    const float *bias = dsrt__cuda_fwd_bias(be, p, i);
    const dsrt_bf16 *bias16 = dsrt__cuda_fwd_bias16(be, p, i);
    int act = g->act.fn != DSRT_K_ACT_IDENTITY;
    g->fuse = bias || act || g->sum >= 0 ? FUSE_KERNEL : FUSE_NONE;
    /* A residual sum runs in dsrt's kernel, after the activation. */
    if (!bias || !be->net->opts.fuse || o->al.own[DIR_FWD] || g->sum >= 0) return;
    if (act ? g->act.fn != DSRT_K_ACT_RELU || g->act.a != 0.0f
            : o->al.fwd != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
        return;
    if (cudnnSetConvolutionMathType(o->cd, o->al.m_fwd) != CUDNN_STATUS_SUCCESS) return;
    o->bias16 = 0;
    const void *w = dsrt__cuda_fwd_weights(be, p, i);
    cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
        be->dnn, &ONE, o->xd, conv_input(p, i), o->wd, w, o->cd, o->al.fwd, be->ws, be->ws_size,
        &ZERO, g->yd, g->y, o->bd, bias, o->act, g->yd, g->y);
    (void)cudaGetLastError();
    /* A float bias with bfloat16 data is not among cuDNN's documented
     * configurations: again with the bias's bfloat16 copy (which the
     * optimizer refreshes with the weights, or the folded one), where it
     * starts on 16 bytes as cuDNN's vector loads want. */
    if (st != CUDNN_STATUS_SUCCESS && bias16) {
        if (!o->bd16 && cudnnCreateTensorDescriptor(&o->bd16) != CUDNN_STATUS_SUCCESS) return;
        if (cudnnSetTensor4dDescriptor(o->bd16, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, 1, L->out.c,
                                       1, 1) != CUDNN_STATUS_SUCCESS)
            return;
        st = cudnnConvolutionBiasActivationForward(
            be->dnn, &ONE, o->xd, conv_input(p, i), o->wd, w, o->cd, o->al.fwd, be->ws, be->ws_size,
            &ZERO, g->yd, g->y, o->bd16, bias16, o->act, g->yd, g->y);
        (void)cudaGetLastError();
        o->bias16 = st == CUDNN_STATUS_SUCCESS;
    }
    if (st == CUDNN_STATUS_SUCCESS) g->fuse = FUSE_CUDNN;
}

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    conv_own *o = p->gl[i].own;
    if (o->pad_explicit) {
        dsrt_k_desc pd = padded_desc(be, p, i);
        CU(dsrt_k_pad(&in->kd, in->y, &pd, o->xp, L->pt, L->pl, 0.0f, 0, be->compute));
    }
    const void *x = conv_input(p, i), *w = dsrt__cuda_fwd_weights(be, p, i);
    const float *b = dsrt__cuda_fwd_bias(be, p, i);
    if (o->al.own[DIR_FWD]) {
        CU(dsrt_k_conv_fwd(&o->kconv, x, w, g->y, be->compute));
        if (g->fuse == FUSE_KERNEL) CU(dsrt__cuda_epilogue(be, p, i, b));
        return 0;
    }
    DNN(cudnnSetConvolutionMathType(o->cd, o->al.m_fwd));
    if (g->fuse == FUSE_CUDNN) {
        DNN(cudnnConvolutionBiasActivationForward(
            be->dnn, &ONE, o->xd, x, o->wd, w, o->cd, o->al.fwd, be->ws, be->ws_size, &ZERO, g->yd,
            g->y, o->bias16 ? o->bd16 : o->bd,
            o->bias16 ? (const void *)dsrt__cuda_fwd_bias16(be, p, i) : (const void *)b, o->act,
            g->yd, g->y));
        return 0;
    }
    DNN(cudnnConvolutionForward(be->dnn, &ONE, o->xd, x, o->wd, w, o->cd, o->al.fwd, be->ws,
                                be->ws_size, &ZERO, g->yd, g->y));
    if (g->fuse == FUSE_KERNEL) CU(dsrt__cuda_epilogue(be, p, i, b));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    conv_own *o = p->gl[i].own;
    TRY(dsrt__cuda_bias_relu_bwd(be, p, i));
    const void *x = conv_input(p, i), *w = dsrt__cuda_weights(be, L);
    void *dw = be->bf16 ? (void *)(be->g16 + L->w_off) : (void *)(be->grads + L->w_off);
    if (o->al.own[DIR_FILTER]) {
        CU(dsrt_k_conv_bwd_filter(&o->kconv, x, g->dy, dw, be->act, be->compute));
    } else {
        DNN(cudnnSetConvolutionMathType(o->cd, o->al.m_filter));
        DNN(cudnnConvolutionBackwardFilter(be->dnn, &ONE, o->xd, x, g->yd, g->dy, o->cd,
                                           o->al.filter, be->ws, be->ws_size, &ZERO, o->wd, dw));
    }
    /* The all-reduce and the optimizer take float32 gradients. */
    if (be->bf16)
        CU(dsrt_k_bf16_to_f32(be->g16 + L->w_off, be->grads + L->w_off, L->w_n, be->compute));
    TRY(dsrt__cuda_grads_ready(be, i));
    if (!o->al.has_data) return 0;
    /* The padded input was read; its buffer takes the padded gradient. */
    void *dx = o->pad_explicit ? o->xp : dsrt__cuda_grad_ptr(p, i, g->in0);
    if (o->al.own[DIR_DATA]) {
        CU(dsrt_k_conv_bwd_data(&o->kconv, w, g->dy, dx, be->compute));
    } else {
        DNN(cudnnSetConvolutionMathType(o->cd, o->al.m_data));
        DNN(cudnnConvolutionBackwardData(be->dnn, &ONE, o->wd, w, g->yd, g->dy, o->cd, o->al.data,
                                         be->ws, be->ws_size, &ZERO, o->xd, dx));
    }
    if (o->pad_explicit) {
        dsrt_k_desc pd = padded_desc(be, p, i);
        CU(dsrt_k_pad(&pd, o->xp, &in->kd, in->dy, -L->pt, -L->pl, 0.0f, p->last_use[g->in0] != i,
                      be->compute));
        return 0;
    }
    return dsrt__cuda_grad_add(be, p, i, g->in0);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_conv = {
    .flags = DSRT_CUDA_FOLDS,
    .reorders = reorders,
    .reorder = reorder,
    .desc = desc,
    .layout = layout,
    .search = search,
    .try_fused = try_fused,
    .forward = forward,
    .backward = backward,
};

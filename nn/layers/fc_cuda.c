/*
 * fc on the GPU: cuBLAS on row-major tensors (bfloat16 products summed in
 * float32 under bf16), the bias and a ReLU after it in one dsrt kernel. In
 * an inference plan a batchnorm after it is folded into its weights and
 * bias (the engine's folded copies), and the activation after that is
 * computed by the same kernel (DSRT_CUDA_FOLDS), as for a convolution. The
 * weights keep the host's (out, in_c, in_h, in_w) order, so an image input
 * is put in that order first (one small layout change forward, its inverse
 * backward). See nn/layers/fc.c.
 */
#include "nn/backend_cuda.h"

/* What a fully connected layer keeps of its plan. */
typedef struct {
    /* The input is an image of several pixels and channels, whose NHWC
     * order is not the weights' (c, h, w): it is copied into xf in that
     * order, and its gradient comes back through xf. */
    int flat;
    void *xf;
} fc_own;

static int desc(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    fc_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    p->gl[i].own = o;
    o->flat = L->in.h * L->in.w > 1 && L->in.c > 1;
    return 0;
}

static void layout(cuda_backend *be, gpu_plan *p, int i, carve *c, size_t *work) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    fc_own *o = g->own;
    o->xf = o->flat
                ? dsrt__cuda_take(c, dsrt__cuda_in_count(L, p->n) * dsrt__cuda_type_size(be->act))
                : NULL;
    if (L->b_n && p->train) *work = DSRT_MAX(*work, dsrt_k_bias_grad_work(&g->kd));
}

/*
 * Fully connected, on row-major tensors through column-major cuBLAS: y (n,
 * out) = x (n, in) W^T, W (out, in), is y^T = W^T' x^T' where cuBLAS sees W
 * as an (in x out) matrix and x as (in x n): gemm(T, N, out, n, in). An
 * image input is put in the host's (c, h, w) order first, the order of W.
 */
static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    fc_own *o = p->gl[i].own;
    int n = p->n, oc = L->out.c, ic = L->in.c * L->in.h * L->in.w;
    const void *x = in->y;
    if (o->flat) {
        dsrt_k_desc fk = in->kd;
        fk.nhwc = 0;
        CU(dsrt_k_pad(&in->kd, in->y, &fk, o->xf, 0, 0, 0.0f, 0, be->compute));
        x = o->xf;
    }
    /* The layer's weights, or the folded ones (inference, a batchnorm after
     * it): the same (out, in) order. */
    const void *w = dsrt__cuda_fwd_weights(be, p, i);
    const float *b = dsrt__cuda_fwd_bias(be, p, i);
    if (be->bf16)
        BLAS(cublasGemmEx(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, ic, &ONE, w, CUDA_R_16BF, ic,
                          x, CUDA_R_16BF, ic, &ZERO, g->y, CUDA_R_16BF, oc, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
    else
        BLAS(cublasSgemm(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, ic, &ONE, w, ic, x, ic, &ZERO,
                         g->y, oc));
    if (b || g->act.fn != DSRT_K_ACT_IDENTITY || g->sum >= 0) CU(dsrt__cuda_epilogue(be, p, i, b));
    return 0;
}

/* Column-major views as in fwd_fc: dW^T (in x out) = x^T (in x n) dy (n x
 * out): gemm(N, T, in, out, n); dx^T (in x n) = W^T (in x out) dy^T (out x
 * n): gemm(N, N, in, n, out). An image input's gradient comes in the
 * host's (c, h, w) order and is put back in NHWC. */
static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    fc_own *o = p->gl[i].own;
    int n = p->n, oc = L->out.c, ic = L->in.c * L->in.h * L->in.w, flat = o->flat;
    TRY(dsrt__cuda_bias_relu_bwd(be, p, i));
    const void *x = flat ? o->xf : in->y;
    float *dw = be->grads + L->w_off;
    if (be->bf16)
        BLAS(cublasGemmEx(be->blas, CUBLAS_OP_N, CUBLAS_OP_T, ic, oc, n, &ONE, x, CUDA_R_16BF, ic,
                          g->dy, CUDA_R_16BF, oc, &ZERO, dw, CUDA_R_32F, ic, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
    else
        BLAS(cublasSgemm(be->blas, CUBLAS_OP_N, CUBLAS_OP_T, ic, oc, n, &ONE, x, ic, g->dy, oc,
                         &ZERO, dw, ic));
    TRY(dsrt__cuda_grads_ready(be, i));
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    void *dx = flat ? o->xf : dsrt__cuda_grad_ptr(p, i, g->in0);
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
        CU(dsrt_k_pad(&fk, o->xf, &in->kd, in->dy, 0, 0, 0.0f, p->last_use[g->in0] != i,
                      be->compute));
        return 0;
    }
    return dsrt__cuda_grad_add(be, p, i, g->in0);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_fc = {
    .flags = DSRT_CUDA_FOLDS,
    .desc = desc,
    .layout = layout,
    .forward = forward,
    .backward = backward,
};

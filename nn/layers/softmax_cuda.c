/*
 * softmax on the GPU: dsrt's softmax with cross-entropy (against labels or
 * soft targets), the loss and correct count kept on the device for the
 * host to fetch, the probabilities in float32. See nn/layers/softmax.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/softmax_kernels.h"

/* What the classification output keeps of its plan: its reductions'
 * scratch. */
typedef struct {
    void *work;
} softmax_own;

static int desc(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    softmax_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    p->gl[i].own = o;
    return 0;
}

static void layout(cuda_backend *be, gpu_plan *p, int i, carve *c, size_t *work) {
    softmax_own *o = p->gl[i].own;
    p->loss = dsrt__cuda_take(c, sizeof(double));
    p->correct = dsrt__cuda_take(c, sizeof(int32_t));
    o->work = dsrt__cuda_take(c, dsrt_k_softmax_xent_work(p->n));
}

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    softmax_own *o = g->own;
    CU(dsrt_k_softmax_xent_fwd(in->y, be->act, p->labels, p->soft, p->n, be->net->classes, g->y,
                               p->labels ? p->loss : NULL, p->labels ? p->correct : NULL, o->work,
                               be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    softmax_own *o = g->own;
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    CU(dsrt_k_softmax_xent_bwd(g->y, p->labels, p->soft, o->work, p->n, be->net->classes, 1.0f,
                               &be->dconst->grad_scale, dsrt__cuda_grad_ptr(p, i, g->in0), be->act,
                               be->compute));
    return dsrt__cuda_grad_add(be, p, i, g->in0);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_softmax = {
    .flags = DSRT_CUDA_F32_OUT,
    .desc = desc,
    .layout = layout,
    .forward = forward,
    .backward = backward,
};

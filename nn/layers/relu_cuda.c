/*
 * relu on the GPU: one dsrt kernel each way (a ReLU the layer before
 * computes is not run here: the engine skips a fused-away layer). See
 * nn/layers/relu.c.
 */
#include "nn/backend_cuda.h"

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    CU(dsrt_k_relu_fwd(be->act, in->y, g->y, dsrt__cuda_out_count(L, p->n), L->o.leak,
                       be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    CU(dsrt_k_relu_bwd(be->act, g->y, g->dy, dsrt__cuda_grad_ptr(p, i, g->in0),
                       dsrt__cuda_out_count(L, p->n), L->o.leak, be->compute));
    return dsrt__cuda_grad_add(be, p, i, g->in0);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_relu = {
    .forward = forward,
    .backward = backward,
};

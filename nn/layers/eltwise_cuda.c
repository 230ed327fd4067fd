/*
 * clip, sigmoid, hardsigmoid, hardswish, silu and gelu on the GPU: their
 * kernels each way (nn/layers/eltwise_kernels.h dsrt_k_act, in float on the
 * activations' type, PyTorch's gradients at the kinks), the backward
 * reading the layer's input and output. See nn/layers/eltwise.c.
 */
#include "nn/layers/eltwise.h"
#include "nn/backend_cuda.h"

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    dsrt_k_act a = dsrt__act_kernel(L);
    CU(dsrt_k_act_fwd(be->act, &a, in->y, g->y, dsrt__cuda_out_count(L, p->n), be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    dsrt_k_act a = dsrt__act_kernel(L);
    CU(dsrt_k_act_bwd(be->act, &a, in->y, g->y, g->dy, dsrt__cuda_grad_ptr(p, i, g->in0),
                      dsrt__cuda_out_count(L, p->n), be->compute));
    return dsrt__cuda_grad_add(be, p, i, g->in0);
}

#define ACT_OPS                                                                                    \
    { .forward = forward, .backward = backward }

const dsrt_cuda_layer_ops dsrt__cuda_layer_clip = ACT_OPS;
const dsrt_cuda_layer_ops dsrt__cuda_layer_sigmoid = ACT_OPS;
const dsrt_cuda_layer_ops dsrt__cuda_layer_hardsigmoid = ACT_OPS;
const dsrt_cuda_layer_ops dsrt__cuda_layer_hardswish = ACT_OPS;
const dsrt_cuda_layer_ops dsrt__cuda_layer_silu = ACT_OPS;
const dsrt_cuda_layer_ops dsrt__cuda_layer_gelu = ACT_OPS;

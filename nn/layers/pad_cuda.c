/*
 * pad on the GPU: dsrt's padding kernel, the value around the input;
 * backward the same kernel cropping the output's gradient back to the
 * input. See nn/layers/pad.c.
 */
#include "nn/layers/pad.h"
#include "nn/backend_cuda.h"

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    CU(dsrt_k_pad(&in->kd, in->y, &g->kd, g->y, L->pt, L->pl, dsrt__pad_value(L), 0, be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    int j = L->inputs[0];
    if (!dsrt__net_need_diff(be->net, j)) return 0;
    CU(dsrt_k_pad(&g->kd, g->dy, &in->kd, dsrt__cuda_grad_ptr(p, i, j), -L->pt, -L->pl, 0.0f, 0,
                  be->compute));
    return dsrt__cuda_grad_add(be, p, i, j);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_pad = {
    .forward = forward,
    .backward = backward,
};

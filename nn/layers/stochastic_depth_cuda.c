/*
 * stochastic_depth on the GPU: one dsrt kernel each way, every value of an
 * image times the image's factor, drawn as the CPU backend draws it from
 * (seed, iteration, layer) (nn/arith.h), the iteration read from the
 * step's device scalars so that a recorded step draws anew at each replay;
 * the identity at inference. See nn/layers/stochastic_depth.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/stochastic_depth_kernels.h"

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    CU(dsrt_k_drop_path(&g->kd, in->y, g->y, be->net->opts.seed, 0, &be->dconst->iteration, i,
                        L->o.p, be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    CU(dsrt_k_drop_path(&g->kd, g->dy, dsrt__cuda_grad_ptr(p, i, g->in0), be->net->opts.seed, 0,
                        &be->dconst->iteration, i, L->o.p, be->compute));
    return dsrt__cuda_grad_add(be, p, i, g->in0);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_stochastic_depth = {
    .forward = forward,
    .backward = backward,
};

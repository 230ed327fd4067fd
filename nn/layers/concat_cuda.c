/*
 * concat on the GPU: each input's channels copied into its range of the
 * output's (dsrt's channel kernel), and back for the gradients. See
 * nn/layers/concat.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/concat_kernels.h"

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    int c0 = 0;
    for (int k = 0; k < L->n_inputs; k++) {
        gpu_layer *x = &p->gl[L->inputs[k]];
        CU(dsrt_k_channels(&x->kd, x->y, &g->kd, g->y, c0, 1, 0, be->compute));
        c0 += x->kd.c;
    }
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    int c0 = 0;
    for (int k = 0; k < L->n_inputs; k++) {
        int j = L->inputs[k];
        gpu_layer *in = &p->gl[j];
        if (dsrt__net_need_diff(be->net, j))
            CU(dsrt_k_channels(&in->kd, in->dy, &g->kd, g->dy, c0, 0, p->last_use[j] != i,
                               be->compute));
        c0 += be->net->layers[j].out.c;
    }
    return 0;
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_concat = {
    .forward = forward,
    .backward = backward,
};

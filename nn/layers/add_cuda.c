/*
 * add on the GPU: dsrt's sum kernel (its ReLU folded in); backward the
 * ReLU's mask in place, then the gradient to each input unchanged (no copy
 * where the input shares the add's gradient). See nn/layers/add.c.
 */
#include "nn/backend_cuda.h"

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    dsrt_k_sum s = {.n = L->n_inputs};
    for (int k = 0; k < L->n_inputs; k++) s.x[k] = p->gl[L->inputs[k]].y;
    CU(dsrt_k_sum_fwd(be->act, &s, g->y, dsrt__cuda_out_count(L, p->n), L->fuse_relu, L->fuse_leak,
                      be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    size_t count = dsrt__cuda_out_count(L, p->n);
    if (L->fuse_relu)
        CU(dsrt_k_relu_bwd(be->act, g->y, g->dy, g->dy, count, L->fuse_leak, be->compute));
    for (int k = 0; k < L->n_inputs; k++) {
        int j = L->inputs[k];
        gpu_layer *in = &p->gl[j];
        if (!dsrt__net_need_diff(be->net, j) || in->dy == g->dy) continue; /* shared: no copy */
        CU(cudaMemcpyAsync(dsrt__cuda_grad_ptr(p, i, j), g->dy,
                           count * dsrt__cuda_type_size(be->act), cudaMemcpyDeviceToDevice,
                           be->compute));
        TRY(dsrt__cuda_grad_add(be, p, i, j));
    }
    return 0;
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_add = {
    .forward = forward,
    .backward = backward,
};

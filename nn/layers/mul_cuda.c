/*
 * mul on the GPU: dsrt's product kernel (a gate broadcast over the pixels);
 * backward the product of the output's gradient and the other input, a
 * gate's summed over the pixels by a block an element. See
 * nn/layers/mul.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/mul_kernels.h"

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *a = &p->gl[L->inputs[0]], *b = &p->gl[L->inputs[1]];
    CU(dsrt_k_mul(&a->kd, a->y, &b->kd, b->y, g->y, be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *a = &p->gl[L->inputs[0]], *b = &p->gl[L->inputs[1]];
    int ja = L->inputs[0], jb = L->inputs[1];
    if (dsrt__net_need_diff(be->net, ja)) {
        CU(dsrt_k_mul(&g->kd, g->dy, &b->kd, b->y, dsrt__cuda_grad_ptr(p, i, ja), be->compute));
        TRY(dsrt__cuda_grad_add(be, p, i, ja));
    }
    if (dsrt__net_need_diff(be->net, jb)) {
        void *db = dsrt__cuda_grad_ptr(p, i, jb);
        if (b->kd.h == g->kd.h && b->kd.w == g->kd.w)
            CU(dsrt_k_mul(&g->kd, g->dy, &a->kd, a->y, db, be->compute));
        else
            CU(dsrt_k_mul_grad(&g->kd, g->dy, a->y, &b->kd, db, be->compute));
        TRY(dsrt__cuda_grad_add(be, p, i, jb));
    }
    return 0;
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_mul = {
    .forward = forward,
    .backward = backward,
};

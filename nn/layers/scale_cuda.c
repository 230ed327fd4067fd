/*
 * scale on the GPU: dsrt's product kernel by the factors (a float32
 * (1, c, 1, 1) on the flat buffer); backward the same product of the
 * output's gradient, and the factors' gradient by the channel sums of
 * batchnorm's tiles. See nn/layers/scale.c.
 */
#include "nn/backend_cuda.h"

static dsrt_k_desc factors(const dsrt_layer *L) {
    return dsrt__cuda_kdesc(1, L->out.c, 1, 1, 1, DSRT_K_F32);
}

static void layout(cuda_backend *be, gpu_plan *p, int i, carve *c, size_t *work) {
    if (p->train) *work = DSRT_MAX(*work, dsrt_kb_bn_work(&p->gl[i].kd) * sizeof(float));
}

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    dsrt_k_desc wd = factors(L);
    CU(dsrt_k_mul(&in->kd, in->y, &wd, be->params + L->w_off, g->y, be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    dsrt_k_desc wd = factors(L);
    CU(dsrt_k_chan_grads(&g->kd, in->y, g->dy, NULL, NULL, be->grads + L->w_off, NULL, p->work,
                         be->compute));
    if (dsrt__net_need_diff(be->net, L->inputs[0])) {
        CU(dsrt_k_mul(&g->kd, g->dy, &wd, be->params + L->w_off,
                      dsrt__cuda_grad_ptr(p, i, L->inputs[0]), be->compute));
        TRY(dsrt__cuda_grad_add(be, p, i, L->inputs[0]));
    }
    return dsrt__cuda_grads_ready(be, i);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_scale = {
    .layout = layout,
    .forward = forward,
    .backward = backward,
};

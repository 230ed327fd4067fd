/*
 * layernorm on the GPU: dsrt's kernels, one warp a pixel's channels
 * (sums in double in a fixed order), each pixel's mean and 1 / sqrt(var +
 * eps) kept in training for the backward; gamma's and beta's gradients by
 * the channel sums of batchnorm's tiles. See nn/layers/layernorm.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/layernorm_kernels.h"

/* What a layernorm layer keeps of its plan: the statistics of the training
 * forward, one a pixel of the batch. */
typedef struct {
    float *mean, *rstd;
} ln_own;

static int desc(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    ln_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    p->gl[i].own = o;
    return 0;
}

static void layout(cuda_backend *be, gpu_plan *p, int i, carve *c, size_t *work) {
    const dsrt_layer *L = &be->net->layers[i];
    ln_own *o = p->gl[i].own;
    size_t rows = (size_t)p->n * L->out.h * L->out.w;
    if (!p->train) return;
    *work = DSRT_MAX(*work, dsrt_kb_bn_work(&p->gl[i].kd) * sizeof(float));
    o->mean = dsrt__cuda_take(c, rows * sizeof(float));
    o->rstd = dsrt__cuda_take(c, rows * sizeof(float));
}

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    ln_own *o = g->own;
    CU(dsrt_k_ln_fwd(&in->kd, in->y, be->params + L->w_off, be->params + L->b_off, L->o.eps, g->y,
                     p->train ? o->mean : NULL, p->train ? o->rstd : NULL, be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    ln_own *o = g->own;
    int j = L->inputs[0];
    CU(dsrt_k_chan_grads(&g->kd, in->y, g->dy, o->mean, o->rstd, be->grads + L->w_off,
                         be->grads + L->b_off, p->work, be->compute));
    if (dsrt__net_need_diff(be->net, j)) {
        CU(dsrt_k_ln_bwd(&in->kd, in->y, g->dy, be->params + L->w_off, o->mean, o->rstd,
                         dsrt__cuda_grad_ptr(p, i, j), be->compute));
        TRY(dsrt__cuda_grad_add(be, p, i, j));
    }
    return dsrt__cuda_grads_ready(be, i);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_layernorm = {
    .desc = desc,
    .layout = layout,
    .forward = forward,
    .backward = backward,
};

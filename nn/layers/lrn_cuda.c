/*
 * lrn on the GPU: dsrt's kernels, the forward keeping each element's scale
 * in training for backward. See nn/layers/lrn.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/lrn_kernels.h"

/* What an LRN layer keeps of its plan. */
typedef struct {
    dsrt_k_lrn lrn;
    float *scale; /* training: (size of the output) each element's scale */
} lrn_own;

static int desc(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    lrn_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    p->gl[i].own = o;
    o->lrn = (dsrt_k_lrn){L->o.lrn_size, L->o.alpha, L->o.beta, L->o.k};
    return 0;
}

static void layout(cuda_backend *be, gpu_plan *p, int i, carve *c, size_t *work) {
    const dsrt_layer *L = &be->net->layers[i];
    lrn_own *o = p->gl[i].own;
    o->scale = p->train ? dsrt__cuda_take(c, dsrt__cuda_out_count(L, p->n) * sizeof(float)) : NULL;
}

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    lrn_own *o = g->own;
    CU(dsrt_k_lrn_fwd(&in->kd, &o->lrn, in->y, g->y, o->scale, be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    lrn_own *o = g->own;
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    CU(dsrt_k_lrn_bwd(&in->kd, &o->lrn, in->y, g->y, g->dy, o->scale,
                      dsrt__cuda_grad_ptr(p, i, g->in0), be->compute));
    return dsrt__cuda_grad_add(be, p, i, g->in0);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_lrn = {
    .desc = desc,
    .layout = layout,
    .forward = forward,
    .backward = backward,
};

/*
 * maxpool, avgpool and gap on the GPU: dsrt's pooling kernel over any
 * window (gap: the whole image; ceil=1's partial last window included),
 * max pooling keeping its winners' offsets in training for backward. See
 * nn/layers/pool.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/pool_kernels.h"

/* What a pooling layer keeps of its plan. */
typedef struct {
    dsrt_k_pool pool;
    uint8_t *arg; /* training max pooling: each output's winner, its offset in the window */
} pool_own;

static int desc(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    pool_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    g->own = o;
    int gap = L->kind == DSRT_LAYER_GAP;
    o->pool =
        (dsrt_k_pool){p->gl[g->in0].kd,
                      g->kd,
                      gap ? L->in.h : L->o.kh,
                      gap ? L->in.w : L->o.kw,
                      gap ? 1 : L->o.sh,
                      gap ? 1 : L->o.sw,
                      gap ? 0 : L->pt,
                      gap ? 0 : L->pl,
                      L->kind == DSRT_LAYER_MAXPOOL                      ? DSRT_K_POOL_MAX
                      : L->kind == DSRT_LAYER_AVGPOOL && !L->o.count_pad ? DSRT_K_POOL_AVG_INSIDE
                                                                         : DSRT_K_POOL_AVG,
                      0,
                      0};
    /* ceil=1: a last window that reaches past the padding, which an average
     * counting the padding divides by its part inside the padded image. */
    if (!gap && o->pool.mode == DSRT_K_POOL_AVG &&
        ((int64_t)(L->out.h - 1) * L->o.sh + L->o.kh > (int64_t)L->in.h + L->pt + L->pb ||
         (int64_t)(L->out.w - 1) * L->o.sw + L->o.kw > (int64_t)L->in.w + L->pl + L->pr)) {
        o->pool.mode = DSRT_K_POOL_AVG_PADDED;
        o->pool.pb = L->pb;
        o->pool.pr = L->pr;
    }
    return 0;
}

static void layout(cuda_backend *be, gpu_plan *p, int i, carve *c, size_t *work) {
    const dsrt_layer *L = &be->net->layers[i];
    pool_own *o = p->gl[i].own;
    o->arg = L->kind == DSRT_LAYER_MAXPOOL && p->train && dsrt_kb_pool_arg_ok(&o->pool)
                 ? dsrt__cuda_take(c, dsrt__cuda_out_count(L, p->n))
                 : NULL;
}

static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    pool_own *o = g->own;
    CU(dsrt_k_pool_fwd(&o->pool, in->y, g->y, o->arg, be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    pool_own *o = g->own;
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    CU(dsrt_k_pool_bwd(&o->pool, in->y, o->arg, g->dy, dsrt__cuda_grad_ptr(p, i, g->in0),
                       be->compute));
    return dsrt__cuda_grad_add(be, p, i, g->in0);
}

#define POOL_OPS                                                                                   \
    { .desc = desc, .layout = layout, .forward = forward, .backward = backward }

const dsrt_cuda_layer_ops dsrt__cuda_layer_maxpool = POOL_OPS;
const dsrt_cuda_layer_ops dsrt__cuda_layer_avgpool = POOL_OPS;
const dsrt_cuda_layer_ops dsrt__cuda_layer_gap = POOL_OPS;

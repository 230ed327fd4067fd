/*
 * scale: a learnable factor a channel on its one input, y = w[c] x (the
 * layer scale of ConvNeXt's blocks, which start it at 1e-6), its factors
 * the layer's weights. In ONNX it is a Mul by a constant of one value a
 * channel (written as (1, C, 1, 1), or (C) for a flattened (N, C)); the
 * Mul mapping of nn/layers/mul.c makes it on import.
 *
 *   init= [1] (the factors' starting value)  wlr= [1]  wl2= [1]
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

/* The options of its own. */
typedef struct {
    float init;
} scale_opts;

static const dsrt_opt_spec OPTS[] = {
    {"init", OPT_FLOAT, "1", DSRT_OWN_OPT(scale_opts, init), 0, -1e6, 1e6, NULL},
    {"wlr", OPT_FLOAT, "1", DSRT_O(wlr), 0, 0, 1e6, NULL},
    {"wl2", OPT_FLOAT, "1", DSRT_O(wl2), 0, 0, 1e6, NULL},
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"scale", OPTS, "a learnable factor a channel"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    l->w_n = (size_t)in->c;
    l->flops = (double)in->c * in->h * in->w;
    return 0;
}

static void init(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int how) {
    float v = DSRT_LAYER_OPTS(const scale_opts, l)->init;
    for (size_t k = 0; k < l->w_n; k++) params[l->w_off + k] = v;
}

// ----------------------------------------------------------------------------
// CPU backend

/* What the layer keeps: its input, output and their gradients (dx NULL:
 * not needed) in the layout it works in, and how that is seen. */
typedef struct {
    dnnl_memory_t x, y, dy, dx;
    cpu_chans v;
} scale_own;

static int step_scale_fwd(cpu_backend *be, cpu_plan *p, int i) {
    const scale_own *o = p->lp[i].own;
    const float *w = be->net->params + be->net->layers[i].w_off;
    dsrt__cpu_mul_chans(be, &o->v, dsrt__cpu_handle(o->x), w, 0, dsrt__cpu_handle(o->y));
    return 0;
}

/* dw[c] = the sum of dy x over every pixel of every image, in double;
 * dx = dy w. */
static int step_scale_bwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *l = &be->net->layers[i];
    const scale_own *o = p->lp[i].own;
    const float *dy = dsrt__cpu_handle(o->dy);
    dsrt__cpu_dot_chans(be, &o->v, dy, dsrt__cpu_handle(o->x), 0, be->net->grads + l->w_off);
    if (o->dx)
        dsrt__cpu_mul_chans(be, &o->v, dy, be->net->params + l->w_off, 0, dsrt__cpu_handle(o->dx));
    return 0;
}

/*
 * A C step each way in the input's layout (NCHW, NHWC or oneDNN's channel
 * blocks; another one is reordered to NHWC), the factors read from the
 * flat buffer and their gradient written into the net's gradients.
 */
static int plan_scale(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor in;
    int rc = dsrt__cpu_input4(be, p, L, 0, &in);
    if (rc) return rc;
    scale_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    lp->own = o;
    dnnl_dims_t dims = {p->n, L->out.c, L->out.h, L->out.w};
    dnnl_memory_desc_t md = in.md;
    if (!dsrt__cpu_chans(&md, &o->v))
        DN("memory descriptors", dnnl_memory_desc_init_by_tag(&md, 4, dims, dnnl_f32, dnnl_acdb));
    if (!dsrt__cpu_chans(&md, &o->v)) return dsrt__cpu_fail(dnnl_invalid_arguments, "scale", L);
    if ((rc = dsrt__cpu_ensure(p, be, in.mem, &md, 0, i, &o->x, L))) return rc;
    if ((rc = dsrt__cpu_output(be, p, i, &md))) return rc;
    o->y = lp->out.mem;
    if ((rc = dsrt__cpu_c_step(p, 0, step_scale_fwd, i)) || !p->train) return rc;
    o->dy = lp->out.diff;
    dnnl_memory_t tgt = NULL, acc = NULL, tmp = NULL;
    int need = dsrt__net_need_diff(net, L->inputs[0]);
    if (need) {
        rc = dsrt__cpu_grad_target_of(be, p, i, 0, &in, &tgt, &acc);
        if (!rc) rc = dsrt__cpu_deliver(p, be, tgt, &md, &o->dx, &tmp, L);
    }
    if (!rc) rc = dsrt__cpu_c_step(p, 1, step_scale_bwd, i);
    if (!rc && tmp) rc = dsrt__cpu_reorder_step(p, be, tmp, tgt, 1, i, STEP_ALWAYS, NULL, L);
    if (!rc && need) rc = dsrt__cpu_grad_add(be, p, i, in.diff, acc);
    if (!rc) rc = dsrt__cpu_ready_step(p, i);
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

/* Mul by the factors: (1, C, 1, 1) for an image, (C) for a flattened
 * (N, C), so that ONNX's broadcasting lines them up with the channels. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    int j = l->inputs[0];
    char w[DSRT_LAYER_NAME_MAX + 32];
    dsrt__onnx_aux_name(w, sizeof w, l, "scale");
    int64_t dims4[4] = {1, l->out.c, 1, 1}, dims1[1] = {l->out.c};
    if (e->rank[j] == 4)
        dsrt__onnx_floats(e, w, dims4, 4, e->net->params + l->w_off);
    else
        dsrt__onnx_floats(e, w, dims1, 1, e->net->params + l->w_off);
    const char *in[2] = {e->value[j], w};
    dsrt__onnx_node(e, "Mul", l->name, in, 2, out, NULL, l, NULL);
    e->rank[i] = e->rank[j];
    return 0;
}

/* ONNX's Mul is mapped by nn/layers/mul.c, which makes scale layers. */
static const dsrt_onnx_op ONNX_OPS[] = {
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

/* At inference: y = x factor, a channel's. */
static int infer_affine(const dsrt_layer *l, const float *params, const float *state, float *scale,
                        float *shift) {
    for (int c = 0; c < l->out.c; c++) {
        scale[c] = params[l->w_off + c];
        shift[c] = 0.0f;
    }
    return 1;
}

const dsrt_layer_ops dsrt__layer_scale = {
    .name = "scale",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .init = init,
    .cpu_plan = plan_scale,
    .infer_affine = infer_affine,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=4x5x3\nconv filters=4 size=3 pad=1\nscale init=0.5\nfc outputs=4\n"
               "scale\nfc outputs=3\nsoftmax\n",
};

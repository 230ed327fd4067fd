/*
 * mul {multiplicationLayer}: the element-wise product of two inputs, the
 * second of the first's shape, or a gate of one value an image and channel
 * (1x1xC: a fully connected layer's or a global pooling's output) that
 * broadcasts over the pixels: the squeeze-and-excitation of MobileNetV3 and
 * EfficientNet, x * sigmoid(fc(gap(x))). Backward: each input's gradient is
 * the output's times the other input, a gate's summed over the pixels.
 *
 *   inputs=x,g (two: g of x's shape, or 1x1 with x's channels)
 *
 * Its ONNX Mul is every Mul the import meets: of the image by a constant it
 * hands to the import's input normalisation, of a computed value by a
 * constant of one value a channel it makes a scale layer (nn/layers/
 * scale.c), and of two computed values a mul layer.
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"mul", OPTS, "element-wise product of two inputs (the second may be a 1x1 gate)"},
    {NULL, NULL, NULL},
};

/* Whether shape b is a gate over a: 1x1 with a's channels, a not 1x1. */
static int is_gate(const dsrt_shape *a, const dsrt_shape *b) {
    return b->c == a->c && b->h == 1 && b->w == 1 && (a->h != 1 || a->w != 1);
}

static int join(const dsrt_shape *const *ins, int n, dsrt_shape *out, const char **must) {
    const dsrt_shape *a = ins[0], *b = ins[1];
    *out = *a;
    *must = "one shape, or the second 1x1 with the first's channels";
    return !(n == 2 && ((b->c == a->c && b->h == a->h && b->w == a->w) || is_gate(a, b)));
}

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    l->flops = (double)in->c * in->h * in->w;
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

/* What the layer keeps: its inputs and output (the second input in the
 * first's layout, or a gate as (n, c)), their gradients (NULL: not
 * needed; da, db where backward writes them), how the first input's
 * layout is seen, and whether the second input is a gate. */
typedef struct {
    dnnl_memory_t a, b, y, dy, da, db;
    cpu_chans v;
    size_t count; /* floats of a tensor of the first input's layout */
    int gate;
} mul_own;

static float *fp(dnnl_memory_t m) {
    return m ? dsrt__cpu_handle(m) : NULL;
}

static int step_mul_fwd(cpu_backend *be, cpu_plan *p, int i) {
    const mul_own *o = p->lp[i].own;
    if (o->gate)
        dsrt__cpu_mul_chans(be, &o->v, fp(o->a), fp(o->b), o->v.c, fp(o->y));
    else
        dsrt__cpu_mul(be, o->count, fp(o->a), fp(o->b), fp(o->y));
    return 0;
}

/* da = dy b, db = dy a (a gate's summed over the pixels, in double). */
static int step_mul_bwd(cpu_backend *be, cpu_plan *p, int i) {
    const mul_own *o = p->lp[i].own;
    float *dy = fp(o->dy);
    if (o->da) {
        if (o->gate)
            dsrt__cpu_mul_chans(be, &o->v, dy, fp(o->b), o->v.c, fp(o->da));
        else
            dsrt__cpu_mul(be, o->count, dy, fp(o->b), fp(o->da));
    }
    if (o->db) {
        if (o->gate)
            dsrt__cpu_dot_chans(be, &o->v, dy, fp(o->a), 1, fp(o->db));
        else
            dsrt__cpu_mul(be, o->count, dy, fp(o->a), fp(o->db));
    }
    return 0;
}

/*
 * A C step each way in the first input's layout (NCHW, NHWC or oneDNN's
 * channel blocks; another one is reordered to NHWC): the second input
 * reordered to that layout, or a gate read as (n, c) (a copy only where
 * its layout is not that). Backward writes each input's gradient in its
 * own layout where that is the layout the step works in, else into a
 * scratch tensor reordered to it.
 */
static int plan_mul(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor in[2];
    int rc = 0;
    if (L->n_inputs != 2) return dsrt__cpu_fail(dnnl_invalid_arguments, "mul", L);
    for (int k = 0; k < 2 && !rc; k++) rc = dsrt__cpu_input4(be, p, L, k, &in[k]);
    if (rc) return rc;
    const dsrt_shape *sa = &be->net->layers[L->inputs[0]].out,
                     *sb = &be->net->layers[L->inputs[1]].out;
    mul_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    lp->own = o;
    o->gate = is_gate(sa, sb);
    dnnl_dims_t adims = {p->n, sa->c, sa->h, sa->w}, bdims = {p->n, sb->c, sb->h, sb->w};
    dnnl_memory_desc_t md = in[0].md, pb;
    if (dsrt__cpu_md_plain(&pb, 4, bdims)) return dsrt__cpu_fail(dnnl_invalid_arguments, "mul", L);
    if (!dsrt__cpu_chans(&md, &o->v))
        DN("memory descriptors", dnnl_memory_desc_init_by_tag(&md, 4, adims, dnnl_f32, dnnl_acdb));
    if (!dsrt__cpu_chans(&md, &o->v)) return dsrt__cpu_fail(dnnl_invalid_arguments, "mul", L);
    o->count = dnnl_memory_desc_get_size(&md) / sizeof(float);
    const dnnl_memory_desc_t *bmd = o->gate && dsrt__cpu_is_nc(&in[1].md) ? &in[1].md
                                    : o->gate                             ? &pb
                                                                          : &md;
    if ((rc = dsrt__cpu_ensure(p, be, in[0].mem, &md, 0, i, &o->a, L))) return rc;
    if ((rc = dsrt__cpu_ensure(p, be, in[1].mem, bmd, 0, i, &o->b, L))) return rc;
    if ((rc = dsrt__cpu_output(be, p, i, &md))) return rc;
    o->y = lp->out.mem;
    if ((rc = dsrt__cpu_c_step(p, 0, step_mul_fwd, i))) return rc;
    int need[2] = {dsrt__net_need_diff(be->net, L->inputs[0]),
                   dsrt__net_need_diff(be->net, L->inputs[1])};
    if (!p->train || (!need[0] && !need[1])) return 0;

    o->dy = lp->out.diff;
    /* The layout each gradient is computed in: the first input's, or a
     * gate's (n, c). */
    const dnnl_memory_desc_t *made[2] = {
        &md, o->gate ? (dsrt__cpu_is_nc(&in[1].md) ? &in[1].md : &pb) : &md};
    dnnl_memory_t tgt[2] = {NULL, NULL}, acc[2] = {NULL, NULL}, tmp[2] = {NULL, NULL};
    dnnl_memory_t *res[2] = {&o->da, &o->db};
    for (int k = 0; k < 2 && !rc; k++) {
        if (!need[k]) continue;
        rc = dsrt__cpu_grad_target_of(be, p, i, k, &in[k], &tgt[k], &acc[k]);
        if (!rc) rc = dsrt__cpu_deliver(p, be, tgt[k], made[k], res[k], &tmp[k], L);
    }
    if (!rc) rc = dsrt__cpu_c_step(p, 1, step_mul_bwd, i);
    for (int k = 0; k < 2 && !rc; k++) {
        if (!need[k]) continue;
        if (tmp[k]) rc = dsrt__cpu_reorder_step(p, be, tmp[k], tgt[k], 1, i, STEP_ALWAYS, NULL, L);
        if (!rc) rc = dsrt__cpu_grad_add(be, p, i, in[k].diff, acc[k]);
    }
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

/* Mul of the two inputs, at rank 4 unless both are flat; a gate is a
 * (N, C, 1, 1) then, which ONNX broadcasts as dsrt does. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    char names[2][DSRT_LAYER_NAME_MAX + 32];
    int rank = e->rank[l->inputs[0]] == 4 || e->rank[l->inputs[1]] == 4 ? 4 : 2;
    const char *in[2];
    for (int k = 0; k < 2; k++)
        in[k] = dsrt__onnx_as_rank(e, l, l->inputs[k], rank, names[k], sizeof names[k]);
    dsrt__onnx_node(e, "Mul", l->name, in, 2, out, NULL, l, NULL);
    e->rank[i] = rank;
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

/* The shape of constant t as text, for messages. */
static const char *dims_text(const onnx_tensor *t, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (int d = 0; d < t->ndims && at + 24 < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", d ? ", " : "", (long long)t->dims[d]);
    return buf;
}

/*
 * x times the constant t: a scale layer when t is one value a channel as
 * ONNX broadcasts it along x's axes (the last ones: (C, 1, 1) or (1, C, 1,
 * 1) for an image, (C) or (1, C) for a flattened (N, C) of one pixel, (C)
 * to (1, 1, 1, C) for a channels-last value), or one value for every
 * channel ((), (1), all ones), which the layer's factors repeat.
 */
static int map_scale(onnx_import *c, onnx_val *x, onnx_tensor *t) {
    dsrt_shape s = dsrt__onnx_shape_of(c, x);
    if (x->flat && !dsrt__onnx_flat_is_channels(c, x))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "it multiplies the flattened image '%s' by a constant: dsrt scales "
                               "channels",
                               ONNX_SHOWN(x->name));
    int rank = x->flat ? 2 : 4, ch_axis = x->nhwc ? 3 : 1, per = 0;
    int64_t axes[4] = {1, 1, 1, 1};
    int ok = t->ndims <= rank;
    for (int d = 0; ok && d < t->ndims; d++) axes[rank - t->ndims + d] = t->dims[d];
    for (int a = 0; ok && a < rank; a++) {
        if (a == ch_axis && axes[a] == s.c && s.c > 1)
            per = 1;
        else
            ok = axes[a] == 1;
    }
    if (!ok) {
        char dims[160];
        return dsrt__onnx_fail(
            c, DSRT_EUNSUPPORTED,
            "it multiplies '%s' by the constant '%s' of shape (%s): ONNX broadcasts it along "
            "the last axes of the %s, where dsrt's scale layer takes one factor a channel "
            "(%s)",
            ONNX_SHOWN(x->name), ONNX_SHOWN(t->name), dims_text(t, dims, sizeof dims),
            x->flat   ? "(N, C)"
            : x->nhwc ? "channels-last (N, H, W, C)"
                      : "(N, C, H, W)",
            x->flat || x->nhwc ? "(C) or (1, C)" : "(C, 1, 1) or (1, C, 1, 1)");
    }
    onnx_tensor *w = t;
    if (!per) {
        /* One value: the layer's factors are s.c copies of it. */
        double v;
        int rc = dsrt__onnx_scalar(c, t, &v);
        if (rc) return rc;
        float *f = dsrt__arena_alloc(&c->m.arena, (size_t)s.c * sizeof *f, 8);
        w = dsrt__arena_alloc(&c->m.arena, sizeof *w, 8);
        if (!f || !w) return -ENOMEM;
        for (int k = 0; k < s.c; k++) f[k] = (float)v;
        memset(w, 0, sizeof *w);
        w->name = t->name;
        w->dtype = ONNX_FLOAT;
        w->ndims = 1;
        w->dims[0] = s.c;
        w->count = (uint64_t)s.c;
        w->made_f = f;
    }
    onnx_layer *l = dsrt__onnx_add_layer(c, "scale", &x, 1);
    if (!l) return c->err;
    l->w = w;
    l->out = s;
    c->out_nhwc = x->nhwc;
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static int map_mul(onnx_import *c) {
    if (c->cur->n_in != 2) return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "%d inputs", c->cur->n_in);
    onnx_val *v[2];
    for (int k = 0; k < 2; k++)
        if (!(v[k] = dsrt__onnx_input(c, k)))
            return c->err ? c->err : dsrt__onnx_fail(c, DSRT_ECORRUPT, "an input is missing");
    /* The image times a constant: the input's normalisation. */
    for (int k = 0; k < 2; k++)
        if (v[k]->kind == ONNX_V_INPUT && v[1 - k]->kind == ONNX_V_CONST)
            return dsrt__onnx_affine(c);
    for (int k = 0; k < 2; k++)
        if (v[1 - k]->kind == ONNX_V_CONST) {
            onnx_val *x = dsrt__onnx_data_input(c, k, k ? "second" : "first");
            return x ? map_scale(c, x, v[1 - k]->t) : c->err;
        }
    onnx_val *in[2];
    for (int k = 0; k < 2; k++)
        if (!(in[k] = dsrt__onnx_data_input(c, k, k ? "second" : "first"))) return c->err;
    dsrt_shape a = dsrt__onnx_shape_of(c, in[0]), b = dsrt__onnx_shape_of(c, in[1]);
    /* dsrt takes the gate second. */
    if (!in[0]->flat && !in[1]->flat && !in[0]->nhwc && !in[1]->nhwc && is_gate(&b, &a)) {
        onnx_val *t = in[0];
        in[0] = in[1];
        in[1] = t;
        dsrt_shape u = a;
        a = b;
        b = u;
    }
    int same = a.c == b.c && a.h == b.h && a.w == b.w;
    if (in[0]->flat != in[1]->flat || in[0]->nhwc != in[1]->nhwc ||
        (in[0]->flat && !dsrt__onnx_flat_is_channels(c, in[0])) ||
        !(same || (!in[0]->flat && !in[0]->nhwc && is_gate(&a, &b))))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "its inputs' shapes (%dx%dx%d%s, %dx%dx%d%s) are not one shape, "
                               "or an image and a (N, C, 1, 1) gate of its channels",
                               a.c, a.h, a.w,
                               in[0]->flat   ? " flattened"
                               : in[0]->nhwc ? " channels-last"
                                             : "",
                               b.c, b.h, b.w,
                               in[1]->flat   ? " flattened"
                               : in[1]->nhwc ? " channels-last"
                                             : "");
    if (in[0]->layer == in[1]->layer)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "it multiplies a value by itself");
    onnx_layer *l = dsrt__onnx_add_layer(c, "mul", in, 2);
    if (!l) return c->err;
    l->out = a;
    c->out_nhwc = in[0]->nhwc;
    dsrt__onnx_produce(c, l, in[0]->flat);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Mul", map_mul, "", ONNX_OP_NHWC},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_mul = {
    .name = "mul",
    .types = TYPES,
    .min_inputs = 2,
    .max_inputs = 2,
    .join = join,
    .build = build,
    .cpu_plan = plan_mul,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input name=in size=5x4x3\nconv name=x filters=4 size=3 pad=1\ngap inputs=in\n"
               "conv name=g filters=4 size=1\nmul name=m inputs=x,g\n"
               "conv name=y filters=4 size=1 inputs=in\nmul inputs=m,y\nfc outputs=3\nsoftmax\n",
};

/*
 * softmax {softmaxLayer + classificationLayer}: the classification output,
 * softmax over the flattened input (which must have `classes` values) and
 * the cross-entropy loss against the batch's labels, or against soft
 * targets (mixup, cutmix, label smoothing). It sets the net's class count
 * when the description leaves it to the input.
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {DSRT_OPT_END};

static const dsrt_layer_type TYPES[] = {
    {"softmax", OPTS, "softmax and cross-entropy: the classification output"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    int64_t k = dsrt__volume(in->c, in->h, in->w);
    if (*classes > 0 && k != *classes)
        return dsrt__fail(DSRT_EOPTION,
                          "softmax: its input has %lld values per image but there are %d classes",
                          (long long)k, *classes);
    if (k < 1) return dsrt__fail(DSRT_EOPTION, "softmax: empty input");
    if (k > INT32_MAX)
        return dsrt__fail(DSRT_ETOOBIG, "softmax: %lld classes, more than 2^31 - 1", (long long)k);
    *classes = (int)k;
    l->out = (dsrt_shape){(int)k, 1, 1};
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

/* Where the layer reads its input and writes the input's gradient, both
 * plain (n, classes). */
typedef struct {
    dnnl_memory_t plain_in, plain_diff;
} softmax_own;

static int step_softmax_fwd(cpu_backend *be, cpu_plan *p, int i) {
    int k = be->net->classes;
    const float *z = dsrt__cpu_handle(((softmax_own *)p->lp[i].own)->plain_in);
    double loss = 0;
    int correct = 0;
    for (int b = 0; b < p->n; b++) {
        const float *zb = z + (size_t)b * k;
        float *pb = p->probs + (size_t)b * k;
        float mx = zb[0];
        int arg = 0;
        for (int j = 1; j < k; j++)
            if (zb[j] > mx) mx = zb[j], arg = j;
        double sum = 0;
        for (int j = 0; j < k; j++) sum += exp((double)zb[j] - mx);
        double inv = 1.0 / sum, lse = log(sum);
        for (int j = 0; j < k; j++) pb[j] = (float)(exp((double)zb[j] - mx) * inv);
        if (p->soft) {
            const float *tb = p->soft + (size_t)b * k;
            for (int j = 0; j < k; j++)
                if (tb[j] != 0) loss += (double)tb[j] * (lse - ((double)zb[j] - mx));
        }
        if (p->labels) {
            int y = p->labels[b];
            if (!p->soft) loss += lse - ((double)zb[y] - mx);
            correct += arg == y;
        }
        if (!isfinite(mx)) loss = NAN;
    }
    p->loss = loss / p->n;
    p->correct = correct;
    return 0;
}

static int step_softmax_bwd(cpu_backend *be, cpu_plan *p, int i) {
    int k = be->net->classes;
    float *d = dsrt__cpu_handle(((softmax_own *)p->lp[i].own)->plain_diff);
    float inv = be->grad_scale;
    for (int b = 0; b < p->n; b++) {
        const float *pb = p->probs + (size_t)b * k;
        float *db = d + (size_t)b * k;
        if (p->soft) {
            /* d/dz_j of -sum_i t_i log p_i = p_j * sum_i t_i - t_j */
            const float *tb = p->soft + (size_t)b * k;
            double sum = 0;
            for (int j = 0; j < k; j++) sum += tb[j];
            for (int j = 0; j < k; j++) db[j] = (float)((pb[j] * sum - tb[j]) * inv);
            continue;
        }
        for (int j = 0; j < k; j++) db[j] = pb[j] * inv;
        db[p->labels[b]] -= inv;
    }
    return 0;
}

static int plan_softmax(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dnnl_memory_desc_t plain;
    if (dsrt__cpu_md_plain_like(&plain, &in->md))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "softmax", L);
    softmax_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    lp->own = o;
    int rc = dsrt__cpu_ensure(p, be, in->mem, &plain, 0, i, &o->plain_in, L);
    if (rc) return rc;
    dnnl_dims_t dims = {p->n, be->net->classes};
    if (dsrt__cpu_md_plain(&lp->out.md, 2, dims))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "softmax", L);
    p->probs =
        aligned_alloc(64, ((size_t)p->n * be->net->classes * sizeof(float) + 63) & ~(size_t)63);
    if (!p->probs) return dsrt__fail(-ENOMEM, "cpu backend: out of memory");
    rc = dsrt__cpu_mem(p, &lp->out.md, be->engine, p->probs, &lp->out.mem, L);
    if (!rc) rc = dsrt__cpu_c_step(p, 0, step_softmax_fwd, i);
    if (rc || !p->train || !dsrt__net_need_diff(be->net, L->inputs[0])) return rc;
    dnnl_memory_t tmp, tgt, acc;
    if ((rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc))) return rc;
    if ((rc = dsrt__cpu_deliver(p, be, tgt, &plain, &o->plain_diff, &tmp, L))) return rc;
    if ((rc = dsrt__cpu_c_step(p, 1, step_softmax_bwd, i))) return rc;
    if (tmp && (rc = dsrt__cpu_reorder_step(p, be, tmp, tgt, 1, i, STEP_ALWAYS, NULL, L)))
        return rc;
    return dsrt__cpu_grad_add(be, p, i, in->diff, acc);
}

// ----------------------------------------------------------------------------
// ONNX export

/* Softmax over the flattened input: the model's output "probabilities". */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    char x0[DSRT_LAYER_NAME_MAX + 32];
    const char *in[1] = {dsrt__onnx_as_rank(e, l, l->inputs[0], 2, x0, sizeof x0)};
    snprintf(out, DSRT_ONNX_VALUE_MAX, "%s", "probabilities");
    dsrt__onnx_node(e, "Softmax", l->name, in, 1, out, dsrt__onnx_axis1_attrs, l, NULL);
    e->rank[i] = 2;
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

static int map_softmax(onnx_import *c) {
    onnx_val *x = dsrt__onnx_data_input(c, 0, "first");
    if (!x) return c->err;
    onnx_val *o = dsrt__onnx_output(c, 0);
    if (!o || o->uses != 1 || !onnx_same(o->name, c->m.outputs[0].name))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "dsrt's softmax is the network's output, not a layer "
                               "inside it");
    int64_t axis;
    int rc;
    if ((rc = dsrt__onnx_get_int(c, "axis", c->m.opset < 13 ? 1 : -1, &axis))) return rc;
    int rank = x->flat ? 2 : 4;
    if (axis < 0) axis += rank;
    dsrt_shape s = dsrt__onnx_shape_of(c, x);
    /* Before opset 13 the input is seen as 2-D at axis: axis 1 is dsrt's
     * softmax over each image's values; from 13 the axis alone is
     * normalised, which is each image's values only when the other axes of
     * an image have one element. */
    int ok = axis == 1 && (x->flat || c->m.opset < 13 || (s.h == 1 && s.w == 1));
    if (!ok && !x->flat && c->m.opset >= 13 && s.c == 1 && ((axis == 2 && s.w == 1) || axis == 3) &&
        (axis == 3 ? s.h == 1 : 1))
        ok = 1;
    if (!ok)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "axis %lld of a %s input: dsrt's softmax is over each "
                               "image's values",
                               (long long)axis, x->flat ? "(N, K)" : "(N, C, H, W)");
    dsrt_shape os;
    if ((rc = dsrt__onnx_out_shape(c, dsrt__volume(s.c, s.h, s.w), 1, 1, &os))) return rc;
    onnx_layer *l = dsrt__onnx_add_layer(c, "softmax", &x, 1);
    if (!l) return c->err;
    l->out = os;
    dsrt__onnx_produce(c, l, 1);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Softmax", map_softmax, "axis", 0},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_softmax = {
    .name = "softmax",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = DSRT_LAYER_F_OUTPUT,
    .build = build,
    .cpu_plan = plan_softmax,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=3x3x1\nfc outputs=4\nsoftmax\n",
};

/*
 * pad: constant padding of an image, pad=T,B,L,R rows and columns of
 * value= around it (the explicit padding TensorFlow's 'SAME' convolutions
 * become in ONNX, ZeroPad2d). Backward: the output's gradient cropped
 * back to the input.
 *
 *   pad=T,B,L,R (or N, or HxW; required)  value= [0]
 */
#include "nn/layers/pad.h"
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    {"pad", OPT_PAD, NULL, DSRT_O(pt), DSRT_O(pad_same), 0, 1 << 12, NULL},
    {"value", OPT_FLOAT, "0", DSRT_OWN_OPT(dsrt_pad_opts, value), 0, -3e38, 3e38, NULL},
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"pad", OPTS, "constant padding"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    if (l->o.pad_same)
        return dsrt__fail(DSRT_EOPTION,
                          "%s: option 'pad': 'same' is a window's padding; give T,B,L,R", l->type);
    l->pt = l->o.pt;
    l->pb = l->o.pb;
    l->pl = l->o.pl;
    l->pr = l->o.pr;
    l->out = (dsrt_shape){in->c, in->h + l->pt + l->pb, in->w + l->pl + l->pr};
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

/*
 * The output is plain (NCHW), filled with the value once when the plan is
 * made; each forward reorders the input into the part of it inside the
 * padding (a oneDNN submemory), which is all it ever writes. Backward: the
 * same part of the output's gradient reordered into the input's.
 */
static int plan_pad(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor in;
    int rc = dsrt__cpu_input4(be, p, L, 0, &in);
    if (rc) return rc;
    dnnl_dims_t od = {p->n, L->out.c, L->out.h, L->out.w}, id = {p->n, L->in.c, L->in.h, L->in.w};
    dnnl_dims_t at = {0, 0, L->pt, L->pl};
    dnnl_memory_desc_t out_md, sub;
    if (dsrt__cpu_md_plain(&out_md, 4, od)) return dsrt__cpu_fail(dnnl_invalid_arguments, "pad", L);
    DN("pad", dnnl_memory_desc_init_submemory(&sub, &out_md, id, at));
    /* Its bytes its own: the border written now must stay. */
    if ((rc = dsrt__cpu_output_kept(be, p, i, &out_md))) return rc;
    float *y = dsrt__cpu_handle(lp->out.mem), v = dsrt__pad_value(L);
    for (size_t k = 0, n = dnnl_memory_desc_get_size(&out_md) / sizeof *y; k < n; k++) y[k] = v;
    dnnl_memory_t inside;
    if ((rc = dsrt__cpu_mem(p, &sub, be->engine, y, &inside, L))) return rc;
    if ((rc = dsrt__cpu_reorder_step(p, be, in.mem, inside, 0, i, STEP_ALWAYS, NULL, L))) return rc;
    if (!p->train || !dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    dnnl_memory_t dy, tgt, acc;
    rc = dsrt__cpu_diff(p, be->engine, &sub, -1, -1, lp->out.diff, &dy, L);
    if (!rc) rc = dsrt__cpu_grad_target_of(be, p, i, 0, &in, &tgt, &acc);
    if (!rc) rc = dsrt__cpu_reorder_step(p, be, dy, tgt, 1, i, STEP_ALWAYS, NULL, L);
    if (!rc) rc = dsrt__cpu_grad_add(be, p, i, in.diff, acc);
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

static void pad_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    int64_t pads[8] = {0, 0, l->pt, l->pl, 0, 0, l->pb, l->pr};
    dsrt__onnx_attr_ints(w, "pads", pads, 8);
    dsrt__onnx_attr_float(w, "value", dsrt__pad_value(l));
}

/* Pad in constant mode: the pads (and from opset 11 the value) as constant
 * inputs, before that as attributes. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    char x0[DSRT_LAYER_NAME_MAX + 32], pads[DSRT_LAYER_NAME_MAX + 32],
        value[DSRT_LAYER_NAME_MAX + 32];
    const char *x = dsrt__onnx_as_rank(e, l, l->inputs[0], 4, x0, sizeof x0);
    e->rank[i] = 4;
    if (e->opset < 11) {
        const char *in[1] = {x};
        dsrt__onnx_node(e, "Pad", l->name, in, 1, out, pad_attrs, l, NULL);
        return 0;
    }
    int64_t p[8] = {0, 0, l->pt, l->pl, 0, 0, l->pb, l->pr}, dims[1] = {8};
    float v = dsrt__pad_value(l);
    dsrt__onnx_aux_name(pads, sizeof pads, l, "pads");
    dsrt__onnx_aux_name(value, sizeof value, l, "value");
    dsrt__onnx_int64s(e, pads, dims, 1, p);
    dsrt__onnx_floats(e, value, dims, 0, &v);
    const char *in[3] = {x, pads, value};
    dsrt__onnx_node(e, "Pad", l->name, in, 3, out, NULL, l, NULL);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

/*
 * Pad in constant mode of an image's height and width (axes 2 and 3, or 1
 * and 2 of a channels-last value): pads and value as attributes (before
 * opset 11) or constant inputs (then; from opset 18 with the axes they
 * apply to). Any other axis padded, a negative pad (a crop) or another
 * mode is refused, naming the node.
 */
static int map_pad(onnx_import *c) {
    onnx_val *x = dsrt__onnx_image_input(c);
    if (!x) return c->err;
    char mode[32];
    int rc;
    if ((rc = dsrt__onnx_get_string(c, "mode", "constant", mode, sizeof mode))) return rc;
    if (strcmp(mode, "constant") != 0)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "mode '%s': dsrt pads with a constant", mode);
    int64_t pads[8] = {0}, given[8] = {0}, axes[4] = {0, 1, 2, 3};
    int n = 0, n_axes = 4;
    double value = 0;
    if (c->m.opset < 11) {
        float f;
        if ((rc = dsrt__onnx_get_ints(c, "pads", 8, given)) < 0) return rc;
        if (!rc) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute 'pads' is required");
        if ((rc = dsrt__onnx_get_float(c, "value", 0.0f, &f))) return rc;
        value = f;
        n = 8;
    } else {
        const onnx_tensor *t = dsrt__onnx_const_input(c, 1, "pads");
        if (!t) return c->err;
        if ((n = dsrt__onnx_tensor_ints(c, t, given, 8)) < 0) return n;
        if (dsrt__onnx_has_input(c, 2)) {
            const onnx_tensor *v = dsrt__onnx_const_input(c, 2, "constant_value");
            if (!v) return c->err;
            if ((rc = dsrt__onnx_scalar(c, v, &value))) return rc;
        }
        if (dsrt__onnx_has_input(c, 3)) {
            const onnx_tensor *a = dsrt__onnx_const_input(c, 3, "axes");
            if (!a) return c->err;
            if ((n_axes = dsrt__onnx_tensor_ints(c, a, axes, 4)) < 0) return n_axes;
        }
    }
    if (n != 2 * n_axes)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "%d pads for %d axes of a 4-D image", n,
                               n_axes);
    for (int k = 0; k < n_axes; k++) {
        int64_t a = axes[k] < 0 ? axes[k] + 4 : axes[k];
        if (a < 0 || a > 3)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "axis %lld of a 4-D image",
                                   (long long)axes[k]);
        pads[a] = given[k];
        pads[a + 4] = given[k + n_axes];
    }
    int hw0 = x->nhwc ? 1 : 2; /* the height's axis; the width's follows */
    for (int k = 0; k < 8; k++) {
        if (pads[k] < 0)
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "a negative pad (%lld) crops: dsrt's pad layer only pads",
                                   (long long)pads[k]);
        if ((k % 4 != hw0 && k % 4 != hw0 + 1 && pads[k]) || pads[k] > 4096)
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "pads (%lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld): dsrt "
                                   "pads the height and the width, 0 to 4096 each",
                                   (long long)pads[0], (long long)pads[1], (long long)pads[2],
                                   (long long)pads[3], (long long)pads[4], (long long)pads[5],
                                   (long long)pads[6], (long long)pads[7]);
    }
    if (!isfinite(value) || fabs(value) > 3e38)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "it pads with %g: dsrt pads with a finite value", value);
    int64_t t = pads[hw0], b = pads[hw0 + 4], le = pads[hw0 + 1], r = pads[hw0 + 5];
    if (!t && !b && !le && !r) { /* nothing to pad (PyTorch's before an average pooling) */
        dsrt__onnx_alias(c, x, x->flat);
        return 0;
    }
    dsrt_shape s = dsrt__onnx_shape_of(c, x), os;
    if ((rc = dsrt__onnx_out_shape(c, s.c, s.h + t + b, s.w + le + r, &os))) return rc;
    onnx_layer *l = dsrt__onnx_add_layer(c, "pad", &x, 1);
    if (!l) return c->err;
    dsrt__onnx_opt(l, " pad=%lld,%lld,%lld,%lld", (long long)t, (long long)b, (long long)le,
                   (long long)r);
    if (value != 0) dsrt__onnx_opt(l, " value=%.9g", value);
    l->out = os;
    c->out_nhwc = x->nhwc;
    dsrt__onnx_produce(c, l, 0);
    return 0;
}

/* The four numbers after " pad=" in a layer's options; 0 when absent. */
static int pads_of(const char *opts, int p[4]) {
    const char *at = strstr(opts, " pad=");
    return at && sscanf(at, " pad=%d,%d,%d,%d", &p[0], &p[1], &p[2], &p[3]) == 4;
}

/*
 * At import: a padding with zeros whose only taker is a convolution, or an
 * average pooling that counts its padding as zeros (or has none of its
 * own; not ceil=1, whose partial windows divide by the padded input's
 * extent), is that layer's own padding. The pad layer becomes the taker
 * with the pads added: the same sums, one pass and one buffer fewer.
 */
static int absorb(onnx_layer *self, const onnx_layer *taker) {
    int p[4], q[4];
    int conv = taker->kind == DSRT_LAYER_CONV, avg = taker->kind == DSRT_LAYER_AVGPOOL;
    if ((!conv && !avg) || strstr(self->opts, "value=") || !pads_of(self->opts, p) ||
        !pads_of(taker->opts, q))
        return 0;
    if (avg && (strstr(taker->opts, "ceil=1") ||
                (strstr(taker->opts, "count_pad=0") && (q[0] || q[1] || q[2] || q[3]))))
        return 0;
    for (int k = 0; k < 4; k++)
        if ((q[k] += p[k]) > 4096) return 0;
    /* The taker's options with the sums for its pads, and no count_pad=0
     * (the zeros are counted now, as they were as inputs). */
    char opts[sizeof self->opts];
    const char *at = strstr(taker->opts, " pad="), *end = strchr(at + 1, ' ');
    int n = snprintf(opts, sizeof opts, "%.*s pad=%d,%d,%d,%d%s", (int)(at - taker->opts),
                     taker->opts, q[0], q[1], q[2], q[3], end ? end : "");
    if (n < 0 || (size_t)n >= sizeof opts) return 0;
    char *cp = strstr(opts, " count_pad=0");
    if (cp) memmove(cp, cp + 12, strlen(cp + 12) + 1);
    onnx_layer merged = *taker;
    memcpy(merged.in, self->in, sizeof merged.in);
    merged.n_in = self->n_in;
    snprintf(merged.opts, sizeof merged.opts, "%s", opts);
    *self = merged;
    return 1;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Pad", map_pad, "mode,pads,value", ONNX_OP_NHWC},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_pad = {
    .name = "pad",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_pad,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .onnx_absorb = absorb,
    .example = "input size=4x5x2\nconv filters=3 size=1\npad pad=1,2,0,1 value=0.5\n"
               "conv filters=3 size=3\nfc outputs=3\nsoftmax\n",
};

/*
 * Pooling: maxpool {maxPooling2dLayer}, avgpool {averagePooling2dLayer} and
 * gap {globalAveragePooling2dLayer}, three kinds on one window sweep. An
 * average divides each window's sum by its size, the padding counting as
 * zeros (count_pad=1: MATLAB's and PyTorch's default), or by the number of
 * its elements inside the image (count_pad=0: PyTorch's
 * count_include_pad=False, ONNX's default). gap is the average over the
 * whole image (a window of its size).
 *
 *   maxpool: size= (required) stride= [1] pad= [0] as conv
 *   avgpool: as maxpool, and count_pad=0|1 [1]      gap: no options
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS_MAX[] = {
    {"size", OPT_PAIR, NULL, DSRT_O(kh), 0, 1, 1 << 12, NULL},
    {"stride", OPT_PAIR, "1", DSRT_O(sh), 0, 1, 1 << 12, NULL},
    {"pad", OPT_PAD, "0", DSRT_O(pt), DSRT_O(pad_same), 0, 1 << 12, NULL},
    DSRT_OPT_END,
};

static const dsrt_opt_spec OPTS_AVG[] = {
    {"size", OPT_PAIR, NULL, DSRT_O(kh), 0, 1, 1 << 12, NULL},
    {"stride", OPT_PAIR, "1", DSRT_O(sh), 0, 1, 1 << 12, NULL},
    {"pad", OPT_PAD, "0", DSRT_O(pt), DSRT_O(pad_same), 0, 1 << 12, NULL},
    {"count_pad", OPT_BOOL, "1", DSRT_O(count_pad), 0, 0, 1, NULL},
    DSRT_OPT_END,
};

static const dsrt_opt_spec OPTS_NONE[] = {DSRT_OPT_END};

static const dsrt_layer_type TYPES_MAX[] = {
    {"maxpool", OPTS_MAX, "max pooling"},
    {NULL, NULL, NULL},
};

static const dsrt_layer_type TYPES_AVG[] = {
    {"avgpool", OPTS_AVG, "average pooling"},
    {NULL, NULL, NULL},
};

static const dsrt_layer_type TYPES_GAP[] = {
    {"gap", OPTS_NONE, "global average pooling"},
    {NULL, NULL, NULL},
};

static int build_pool(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    int rc = dsrt__layer_window(l, in, 1, 1);
    l->out.c = in->c;
    return rc;
}

static int build_gap(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = (dsrt_shape){in->c, 1, 1};
    l->o.kh = in->h;
    l->o.kw = in->w;
    l->o.sh = l->o.sw = 1;
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

static dnnl_alg_kind_t pool_alg(const dsrt_layer *L) {
    if (L->kind == DSRT_LAYER_MAXPOOL) return dnnl_pooling_max;
    if (L->kind == DSRT_LAYER_AVGPOOL && !L->o.count_pad) return dnnl_pooling_avg_exclude_padding;
    return dnnl_pooling_avg_include_padding; /* gap's windows have no padding */
}

static dnnl_status_t pool_backward(dsrt_cpu_op_desc *bd, const dsrt_layer *L,
                                   const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst) {
    dnnl_dims_t strides = {L->o.sh, L->o.sw}, kernel = {L->o.kh, L->o.kw}, dil = {0, 0};
    dnnl_dims_t pad_l = {L->pt, L->pl}, pad_r = {L->pb, L->pr};
    return dnnl_pooling_v2_backward_desc_init(&bd->pool, pool_alg(L), src, dst, strides, kernel,
                                              dil, pad_l, pad_r);
}

static int plan_pool(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dnnl_dims_t ddims = {p->n, L->out.c, L->out.h, L->out.w};
    dnnl_dims_t strides = {L->o.sh, L->o.sw}, kernel = {L->o.kh, L->o.kw}, dil = {0, 0};
    dnnl_dims_t pad_l = {L->pt, L->pl}, pad_r = {L->pb, L->pr};
    dnnl_memory_desc_t dst_any;
    if (dsrt__cpu_md_any(&dst_any, 4, ddims))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "pooling", L);
    dsrt_cpu_op_desc fd;
    DN("pooling", dnnl_pooling_v2_forward_desc_init(
                      &fd.pool, p->train ? dnnl_forward_training : dnnl_forward_inference,
                      pool_alg(L), &in->md, &dst_any, strides, kernel, dil, pad_l, pad_r));
    static const dsrt_cpu_one_backward b = {"pooling", pool_backward, 0, 0};
    return dsrt__cpu_one_primitive(be, p, i, &fd, &b);
}

// ----------------------------------------------------------------------------
// ONNX export

static void pool_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    int64_t k[2] = {l->o.kh, l->o.kw}, s[2] = {l->o.sh, l->o.sw};
    int64_t p[4] = {l->pt, l->pl, l->pb, l->pr};
    dsrt__onnx_attr_ints(w, "kernel_shape", k, 2);
    dsrt__onnx_attr_ints(w, "strides", s, 2);
    dsrt__onnx_attr_ints(w, "pads", p, 4);
    if (l->kind == DSRT_LAYER_AVGPOOL) dsrt__onnx_attr_int(w, "count_include_pad", l->o.count_pad);
}

static int export_pool(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    char x0[DSRT_LAYER_NAME_MAX + 32];
    const char *in[1] = {dsrt__onnx_as_rank(e, l, l->inputs[0], 4, x0, sizeof x0)};
    dsrt__onnx_node(e, l->kind == DSRT_LAYER_MAXPOOL ? "MaxPool" : "AveragePool", l->name, in, 1,
                    out, pool_attrs, l, NULL);
    return 0;
}

static int export_gap(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    char x0[DSRT_LAYER_NAME_MAX + 32];
    const char *in[1] = {dsrt__onnx_as_rank(e, l, l->inputs[0], 4, x0, sizeof x0)};
    dsrt__onnx_node(e, "GlobalAveragePool", l->name, in, 1, out, NULL, l, NULL);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

/* ceil_mode: the extra bottom (right) padding that makes the floor of
 * dsrt's window count the ceiling of ONNX's, or 0. A window that would start
 * in the padding at the end is not counted (as ONNX and PyTorch do). */
static int ceil_extra(int in, int k, int s, int p0, int p1, int64_t *out) {
    int64_t span = (int64_t)in + p0 + p1 - k;
    int64_t ce = (span + s - 1) / s + 1;
    if ((ce - 1) * s >= (int64_t)in + p0) ce--;
    int64_t extra = (ce - 1) * s + k - ((int64_t)in + p0 + p1);
    *out = ce;
    return extra > 0 ? (int)extra : 0;
}

static int map_pool(onnx_import *c) {
    int max = onnx_is(c->cur->op, "MaxPool");
    onnx_val *x = dsrt__onnx_image_input(c);
    if (!x) return c->err;
    if (max && dsrt__onnx_output_used(c, 1))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "its Indices output is used: dsrt has no indices");
    dsrt_shape s = dsrt__onnx_shape_of(c, x);
    onnx_window w;
    int rc;
    if ((rc = dsrt__onnx_geometry(c, &s, NULL, 0, &w))) return rc;
    int64_t ceil_mode, include;
    if ((rc = dsrt__onnx_get_int(c, "ceil_mode", 0, &ceil_mode)) ||
        (rc = dsrt__onnx_get_int(c, "count_include_pad", 0, &include)))
        return rc;
    if (ceil_mode) {
        int eh = ceil_extra(s.h, w.kh, w.sh, w.pt, w.pb, &w.oh);
        int ew = ceil_extra(s.w, w.kw, w.sw, w.pl, w.pr, &w.ow);
        if ((eh || ew) && !max)
            return dsrt__onnx_fail(
                c, DSRT_EUNSUPPORTED,
                "ceil_mode=1 adds a partial window that dsrt's average pooling would "
                "divide differently");
        if (w.pb + eh >= w.kh || w.pr + ew >= w.kw)
            return dsrt__onnx_fail(
                c, DSRT_EUNSUPPORTED,
                "ceil_mode=1 needs %d,%d more padding at the bottom and right, which "
                "would not be smaller than the %dx%d window",
                eh, ew, w.kh, w.kw);
        w.pb += eh;
        w.pr += ew;
    }
    dsrt_shape os;
    if ((rc = dsrt__onnx_out_shape(c, s.c, w.oh, w.ow, &os))) return rc;
    onnx_layer *l = dsrt__onnx_add_layer(c, max ? "maxpool" : "avgpool", &x, 1);
    if (!l) return c->err;
    dsrt__onnx_window_opts(l, &w);
    if (!max && !include && (w.pt || w.pb || w.pl || w.pr)) dsrt__onnx_opt(l, " count_pad=0");
    l->out = os;
    dsrt__onnx_produce(c, l, 0);
    return 0;
}

static int map_gap(onnx_import *c) {
    onnx_val *x = dsrt__onnx_image_input(c);
    if (!x) return c->err;
    onnx_layer *l = dsrt__onnx_add_layer(c, "gap", &x, 1);
    if (!l) return c->err;
    l->out = (dsrt_shape){dsrt__onnx_shape_of(c, x).c, 1, 1};
    dsrt__onnx_produce(c, l, 0);
    return 0;
}

static const dsrt_onnx_op ONNX_MAX[] = {
    {"MaxPool", map_pool, "auto_pad,ceil_mode,dilations,kernel_shape,pads,storage_order,strides",
     0},
    {NULL, NULL, NULL, 0},
};

static const dsrt_onnx_op ONNX_AVG[] = {
    {"AveragePool", map_pool,
     "auto_pad,ceil_mode,count_include_pad,dilations,kernel_shape,pads,strides", 0},
    {NULL, NULL, NULL, 0},
};

static const dsrt_onnx_op ONNX_GAP[] = {
    {"GlobalAveragePool", map_gap, "", 0},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_maxpool = {
    .name = "maxpool",
    .types = TYPES_MAX,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build_pool,
    .cpu_plan = plan_pool,
    .onnx_export = export_pool,
    .onnx_ops = ONNX_MAX,
    .example = "input size=9x8x2\nconv filters=2 size=1\nmaxpool size=3 stride=2 pad=1\nfc "
               "outputs=3\nsoftmax\n",
};

const dsrt_layer_ops dsrt__layer_avgpool = {
    .name = "avgpool",
    .types = TYPES_AVG,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build_pool,
    .cpu_plan = plan_pool,
    .onnx_export = export_pool,
    .onnx_ops = ONNX_AVG,
    .example = "input size=7x7x2\nconv filters=3 size=1\navgpool size=3 stride=2 pad=1 "
               "count_pad=0\nfc outputs=3\nsoftmax\n",
};

const dsrt_layer_ops dsrt__layer_gap = {
    .name = "gap",
    .types = TYPES_GAP,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build_gap,
    .cpu_plan = plan_pool,
    .onnx_export = export_gap,
    .onnx_ops = ONNX_GAP,
    .example = "input size=5x4x2\nconv filters=3 size=1\ngap\nfc outputs=3\nsoftmax\n",
};

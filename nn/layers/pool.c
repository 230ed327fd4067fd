/*
 * Pooling: maxpool {maxPooling2dLayer}, avgpool {averagePooling2dLayer} and
 * gap {globalAveragePooling2dLayer}, three kinds on one window sweep. An
 * average divides each window's sum by its size, the padding counting as
 * zeros (count_pad=1: MATLAB's and PyTorch's default), or by the number of
 * its elements inside the image (count_pad=0: PyTorch's
 * count_include_pad=False, ONNX's default). gap is the average over the
 * whole image (a window of its size).
 *
 * ceil=1 rounds the output size up, as PyTorch's and ONNX's ceil_mode: a
 * last window that would start in the bottom (right) padding is dropped,
 * and the last one kept may reach past the padding. Max pooling and an
 * average over the window's inside ignore what lies beyond; an average
 * counting the padding divides such a partial window by its part inside
 * the padded image, as PyTorch's count_include_pad (its windows' sizes
 * clipped to the padded input).
 *
 *   maxpool: size= (required) stride= [1] pad= [0] as conv, ceil=0|1 [0]
 *   avgpool: as maxpool, and count_pad=0|1 [1]      gap: no options
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

/* The options of maxpool's and avgpool's own. */
typedef struct {
    int ceil; /* the output size rounded up */
} pool_opts;

static const dsrt_opt_spec OPTS_MAX[] = {
    {"size", OPT_PAIR, NULL, DSRT_O(kh), 0, 1, 1 << 12, NULL},
    {"stride", OPT_PAIR, "1", DSRT_O(sh), 0, 1, 1 << 12, NULL},
    {"pad", OPT_PAD, "0", DSRT_O(pt), DSRT_O(pad_same), 0, 1 << 12, NULL},
    {"ceil", OPT_BOOL, "0", DSRT_OWN_OPT(pool_opts, ceil), 0, 0, 1, NULL},
    DSRT_OPT_END,
};

static const dsrt_opt_spec OPTS_AVG[] = {
    {"size", OPT_PAIR, NULL, DSRT_O(kh), 0, 1, 1 << 12, NULL},
    {"stride", OPT_PAIR, "1", DSRT_O(sh), 0, 1, 1 << 12, NULL},
    {"pad", OPT_PAD, "0", DSRT_O(pt), DSRT_O(pad_same), 0, 1 << 12, NULL},
    {"count_pad", OPT_BOOL, "1", DSRT_O(count_pad), 0, 0, 1, NULL},
    {"ceil", OPT_BOOL, "0", DSRT_OWN_OPT(pool_opts, ceil), 0, 0, 1, NULL},
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

/* Outputs along one axis with ceil=1: the windows that start inside the
 * image or its top (left) padding. */
static int ceil_out(int in, int k, int s, int p0, int p1) {
    int64_t span = (int64_t)in + p0 + p1 - k, out = (span + s - 1) / s + 1;
    if ((out - 1) * s >= (int64_t)in + p0) out--;
    return (int)out;
}

/* How far layer l's last window reaches past the padding at the bottom
 * (*eh) and the right (*ew): 0 without a partial window. */
static void partial(const dsrt_layer *l, int *eh, int *ew) {
    int64_t h = (int64_t)(l->out.h - 1) * l->o.sh + l->o.kh - ((int64_t)l->in.h + l->pt + l->pb);
    int64_t w = (int64_t)(l->out.w - 1) * l->o.sw + l->o.kw - ((int64_t)l->in.w + l->pl + l->pr);
    *eh = h > 0 ? (int)h : 0;
    *ew = w > 0 ? (int)w : 0;
}

static int build_pool(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    int rc = dsrt__layer_window(l, in, 1, 1);
    l->out.c = in->c;
    if (!rc && DSRT_LAYER_OPTS(const pool_opts, l)->ceil) {
        l->out.h = ceil_out(in->h, l->o.kh, l->o.sh, l->pt, l->pb);
        l->out.w = ceil_out(in->w, l->o.kw, l->o.sw, l->pl, l->pr);
    }
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

/* The padding oneDNN takes at the bottom and the right: the layer's, and
 * with ceil=1 what its last window reaches past it (padding that max
 * pooling and an average over the inside ignore). */
static void pad_r_of(const dsrt_layer *L, dnnl_dims_t pad_r) {
    int eh = 0, ew = 0;
    if (L->kind != DSRT_LAYER_GAP) partial(L, &eh, &ew);
    pad_r[0] = L->pb + eh;
    pad_r[1] = L->pr + ew;
}

static dnnl_status_t pool_backward(dsrt_cpu_op_desc *bd, const dsrt_layer *L,
                                   const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst) {
    dnnl_dims_t strides = {L->o.sh, L->o.sw}, kernel = {L->o.kh, L->o.kw}, dil = {0, 0};
    dnnl_dims_t pad_l = {L->pt, L->pl}, pad_r;
    pad_r_of(L, pad_r);
    return dnnl_pooling_v2_backward_desc_init(&bd->pool, pool_alg(L), src, dst, strides, kernel,
                                              dil, pad_l, pad_r);
}

/*
 * avgpool counting its padding with ceil=1 and a partial last window:
 * PyTorch divides that window's sum by its part inside the padded input,
 * which is oneDNN's average over the window's inside (exclude_padding) of
 * the input padded explicitly with zeros: a buffer zeroed once when the
 * plan is made, the input reordered into its inside (a submemory) at each
 * forward; what the last window reaches beyond is the primitive's own
 * padding. Backward: the primitive's into the padded buffer's gradient,
 * whose inside is reordered into the input's.
 */
static int plan_pool_padded(cpu_backend *be, cpu_plan *p, int i, int eh, int ew) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dnnl_dims_t pdims = {p->n, L->in.c, L->in.h + L->pt + L->pb, L->in.w + L->pl + L->pr};
    dnnl_dims_t idims = {p->n, L->in.c, L->in.h, L->in.w}, at = {0, 0, L->pt, L->pl};
    dnnl_dims_t ddims = {p->n, L->out.c, L->out.h, L->out.w};
    dnnl_dims_t strides = {L->o.sh, L->o.sw}, kernel = {L->o.kh, L->o.kw}, dil = {0, 0};
    dnnl_dims_t pad_l = {0, 0}, pad_r = {eh, ew};
    dnnl_memory_desc_t pmd, sub, dst_any;
    if (dsrt__cpu_md_plain(&pmd, 4, pdims) || dsrt__cpu_md_any(&dst_any, 4, ddims))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "pooling", L);
    DN("pooling", dnnl_memory_desc_init_submemory(&sub, &pmd, idims, at));
    dnnl_memory_t padded, inside;
    int rc = dsrt__cpu_mem(p, &pmd, be->engine, NULL, &padded, L);
    if (rc) return rc;
    memset(dsrt__cpu_handle(padded), 0, dnnl_memory_desc_get_size(&pmd));
    if ((rc = dsrt__cpu_mem(p, &sub, be->engine, dsrt__cpu_handle(padded), &inside, L))) return rc;
    if ((rc = dsrt__cpu_reorder_step(p, be, in->mem, inside, 0, i, STEP_ALWAYS, NULL, L)))
        return rc;
    dnnl_pooling_v2_desc_t fd;
    dnnl_primitive_desc_t fpd;
    step *s;
    DN("pooling",
       dnnl_pooling_v2_forward_desc_init(
           &fd, p->train ? dnnl_forward_training : dnnl_forward_inference,
           dnnl_pooling_avg_exclude_padding, &pmd, &dst_any, strides, kernel, dil, pad_l, pad_r));
    if ((rc = dsrt__cpu_pd(&fpd, &fd, be, 0, 0, NULL, "pooling", L))) return rc;
    rc = dsrt__cpu_output(be, p, i, dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0));
    if (!rc) rc = dsrt__cpu_prim_step(p, be, fpd, 0, i, &s, L);
    if (rc) goto out;
    dsrt__cpu_arg(s, DNNL_ARG_SRC, padded);
    dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
    if (!p->train || !dsrt__net_need_diff(be->net, L->inputs[0])) goto out;
    dnnl_pooling_v2_desc_t bd;
    dnnl_primitive_desc_t bpd;
    dnnl_status_t st =
        dnnl_pooling_v2_backward_desc_init(&bd, dnnl_pooling_avg_exclude_padding, &pmd, &lp->out.md,
                                           strides, kernel, dil, pad_l, pad_r);
    if (st != dnnl_success) {
        rc = dsrt__cpu_fail(st, "pooling backward", L);
        goto out;
    }
    if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, "pooling backward", L))) goto out;
    dnnl_memory_t dpadded, dinside, tgt, acc;
    rc = dsrt__cpu_mem(p, &pmd, be->engine, NULL, &dpadded, L);
    if (!rc) rc = dsrt__cpu_prim_step(p, be, bpd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(bpd);
    if (rc) goto out;
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_DST, lp->out.diff);
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_SRC, dpadded);
    rc = dsrt__cpu_mem(p, &sub, be->engine, dsrt__cpu_handle(dpadded), &dinside, L);
    if (!rc) rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc);
    if (!rc) rc = dsrt__cpu_reorder_step(p, be, dinside, tgt, 1, i, STEP_ALWAYS, NULL, L);
    if (!rc) rc = dsrt__cpu_grad_add(be, p, i, in->diff, acc);
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

static int plan_pool(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    int eh = 0, ew = 0;
    if (L->kind == DSRT_LAYER_AVGPOOL && L->o.count_pad) partial(L, &eh, &ew);
    if (eh || ew) return plan_pool_padded(be, p, i, eh, ew);
    dnnl_dims_t ddims = {p->n, L->out.c, L->out.h, L->out.w};
    dnnl_dims_t strides = {L->o.sh, L->o.sw}, kernel = {L->o.kh, L->o.kw}, dil = {0, 0};
    dnnl_dims_t pad_l = {L->pt, L->pl}, pad_r;
    pad_r_of(L, pad_r);
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

/* What a pooling node's attributes say beyond the layer's options. */
typedef struct {
    int64_t pads[4]; /* ONNX's order: top, left, bottom, right */
    int ceil;        /* ceil_mode=1 */
} pool_form;

static void pool_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    const pool_form *f = ctx;
    int64_t k[2] = {l->o.kh, l->o.kw}, s[2] = {l->o.sh, l->o.sw};
    dsrt__onnx_attr_ints(w, "kernel_shape", k, 2);
    dsrt__onnx_attr_ints(w, "strides", s, 2);
    dsrt__onnx_attr_ints(w, "pads", f->pads, 4);
    if (f->ceil) dsrt__onnx_attr_int(w, "ceil_mode", 1);
    if (l->kind == DSRT_LAYER_AVGPOOL) dsrt__onnx_attr_int(w, "count_include_pad", l->o.count_pad);
}

/* A partial last window (ceil=1) is ceil_mode=1, from opset 10; before it,
 * padding at the bottom and right that reaches as far, the same to max
 * pooling and to an average over the window's inside, while an average
 * counting the padding would divide by the whole window: refused. */
static int export_pool(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    char x0[DSRT_LAYER_NAME_MAX + 32];
    int eh, ew;
    partial(l, &eh, &ew);
    pool_form f = {{l->pt, l->pl, l->pb, l->pr}, (eh || ew) && e->opset >= 10};
    if ((eh || ew) && !f.ceil) {
        if (l->kind == DSRT_LAYER_AVGPOOL && l->o.count_pad)
            return dsrt__fail(DSRT_EUNSUPPORTED,
                              "onnx export: layer '%s' (avgpool ceil=1 count_pad=1): its partial "
                              "last window needs ceil_mode, opset 10 or later (asked for %d)",
                              l->name, e->opset);
        f.pads[2] += eh;
        f.pads[3] += ew;
    }
    const char *in[1] = {dsrt__onnx_as_rank(e, l, l->inputs[0], 4, x0, sizeof x0)};
    dsrt__onnx_node(e, l->kind == DSRT_LAYER_MAXPOOL ? "MaxPool" : "AveragePool", l->name, in, 1,
                    out, pool_attrs, l, &f);
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

/* ceil_mode: how far the last window reaches past the padding at the end,
 * or 0 (no partial window: the floor's count); *out the window count. A
 * window that would start in the padding at the end is not counted (as
 * ONNX and PyTorch do). */
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
    /* A partial last window is dsrt's ceil=1 (which divides an average
     * counting the padding as ONNX and PyTorch do); without one the
     * output is the floor's. */
    int ceil = 0;
    if (ceil_mode) {
        int64_t oh, ow;
        int eh = ceil_extra(s.h, w.kh, w.sh, w.pt, w.pb, &oh);
        int ew = ceil_extra(s.w, w.kw, w.sw, w.pl, w.pr, &ow);
        if ((ceil = eh || ew)) {
            w.oh = oh;
            w.ow = ow;
        }
    }
    dsrt_shape os;
    if ((rc = dsrt__onnx_out_shape(c, s.c, w.oh, w.ow, &os))) return rc;
    onnx_layer *l = dsrt__onnx_add_layer(c, max ? "maxpool" : "avgpool", &x, 1);
    if (!l) return c->err;
    dsrt__onnx_window_opts(l, &w);
    if (!max && !include && (w.pt || w.pb || w.pl || w.pr || ceil))
        dsrt__onnx_opt(l, " count_pad=0");
    if (ceil) dsrt__onnx_opt(l, " ceil=1");
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

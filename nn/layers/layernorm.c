/*
 * layernorm {layerNormalizationLayer}: normalisation over the channels of
 * each pixel, y = (x - mean) / sqrt(var + eps) gamma + beta with the mean
 * and the (biased) variance of that pixel's c values and a learnable gamma
 * and beta a channel (the weights and the bias of the flat buffers):
 * ConvNeXt's LayerNorm2d, and on a 1x1 input (a global pooling's or a fully
 * connected layer's output) the LayerNorm before a classifier's Linear.
 * The statistics are each image's and pixel's own: training and inference
 * compute alike, and the layer keeps no state.
 *
 *   eps= [1e-6]  wlr blr (gamma, beta) [1]  wl2 bl2 [1]
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    {"eps", OPT_FLOAT, "1e-6", DSRT_O(eps), 0, 1e-12, 1, NULL},
    DSRT_LR_OPTS("1", "1"),
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"layernorm", OPTS, "layer normalization over the channels of each pixel"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    l->w_n = l->b_n = (size_t)in->c;
    l->flops = 8.0 * in->c * in->h * in->w;
    return 0;
}

static void init(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int how) {
    for (int k = 0; k < l->out.c; k++) {
        params[l->w_off + k] = 1.0f;
        params[l->b_off + k] = 0.0f;
    }
}

// ----------------------------------------------------------------------------
// CPU backend

/* What the layer keeps: its input channels-last (src) and the same bytes
 * seen as (n h w, c) rows (src2), whose handle a step takes from src at
 * each forward (src may be the caller's batch); the statistics of the
 * last training forward. */
typedef struct {
    dnnl_memory_t src, src2;
    dnnl_memory_t mean, var;
} ln_own;

/* A memory of md without bytes of its own, owned by the plan: a view whose
 * handle is set before it is used. */
static int view(cpu_plan *p, cpu_backend *be, const dnnl_memory_desc_t *md, void *handle,
                dnnl_memory_t *out, const dsrt_layer *L) {
    if (dsrt__grow((void **)&p->mems, &p->cap_mems, p->n_mems + 1, sizeof *p->mems)) return -ENOMEM;
    DN("layernorm view",
       dnnl_memory_create(out, md, be->engine, handle ? handle : DNNL_MEMORY_NONE));
    p->mems[p->n_mems++] = *out;
    return 0;
}

static int step_ln_view(cpu_backend *be, cpu_plan *p, int i) {
    const ln_own *o = p->lp[i].own;
    if (dnnl_memory_set_data_handle(o->src2, dsrt__cpu_handle(o->src)) != dnnl_success)
        return dsrt__fail(DSRT_EBACKEND, "cpu backend: layer '%s': layernorm view",
                          be->net->layers[i].name);
    return 0;
}

/*
 * oneDNN's layer normalisation over the last dimension of (n h w, c) rows:
 * the input reordered channels-last (NHWC) where it is not, and its bytes
 * seen as rows; the output channels-last, seen the same way. Backward: the
 * same primitive's backward, into the input's gradient channels-last (or
 * reordered from there) and the gradients of gamma and beta.
 */
static int plan_layernorm(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor in;
    int rc = dsrt__cpu_input4(be, p, L, 0, &in);
    if (rc) return rc;
    int c = L->out.c;
    dnnl_dim_t rows = (dnnl_dim_t)p->n * L->out.h * L->out.w;
    dnnl_dims_t d4 = {p->n, c, L->out.h, L->out.w}, d2 = {rows, c}, d1 = {rows}, dc = {c};
    dnnl_memory_desc_t nhwc, md2, stat_md, c_md;
    if (dsrt__cpu_md_plain(&md2, 2, d2) || dsrt__cpu_md_plain(&stat_md, 1, d1) ||
        dsrt__cpu_md_plain(&c_md, 1, dc))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "layernorm", L);
    DN("layernorm layout", dnnl_memory_desc_init_by_tag(&nhwc, 4, d4, dnnl_f32, dnnl_acdb));
    ln_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    lp->own = o;
    if ((rc = dsrt__cpu_ensure(p, be, in.mem, &nhwc, 0, i, &o->src, L))) return rc;
    if ((rc = dsrt__cpu_output(be, p, i, &nhwc))) return rc;
    dnnl_memory_t dst2, gamma, beta;
    rc = view(p, be, &md2, NULL, &o->src2, L);
    if (!rc) rc = dsrt__cpu_view(p, be, &md2, lp->out.mem, &dst2, L);
    if (!rc) rc = dsrt__cpu_mem(p, &c_md, be->engine, net->params + L->w_off, &gamma, L);
    if (!rc) rc = dsrt__cpu_mem(p, &c_md, be->engine, net->params + L->b_off, &beta, L);
    if (!rc && p->train) rc = dsrt__cpu_mem(p, &stat_md, be->engine, NULL, &o->mean, L);
    if (!rc && p->train) rc = dsrt__cpu_mem(p, &stat_md, be->engine, NULL, &o->var, L);
    if (!rc) rc = dsrt__cpu_c_step(p, 0, step_ln_view, i);
    if (rc) return rc;
    unsigned flags = dnnl_use_scale | dnnl_use_shift;
    dnnl_layer_normalization_desc_t fd;
    dnnl_primitive_desc_t fpd;
    step *s;
    DN("layernorm", dnnl_layer_normalization_forward_desc_init(
                        &fd, p->train ? dnnl_forward_training : dnnl_forward_inference, &md2,
                        &stat_md, L->o.eps, flags));
    if ((rc = dsrt__cpu_pd(&fpd, &fd, be, 0, 0, NULL, "layernorm", L))) return rc;
    rc = dsrt__cpu_prim_step(p, be, fpd, 0, i, &s, L);
    if (rc) goto out;
    dsrt__cpu_arg(s, DNNL_ARG_SRC, o->src2);
    dsrt__cpu_arg(s, DNNL_ARG_DST, dst2);
    dsrt__cpu_arg(s, DNNL_ARG_SCALE, gamma);
    dsrt__cpu_arg(s, DNNL_ARG_SHIFT, beta);
    dsrt__cpu_arg(s, DNNL_ARG_MEAN, o->mean);
    dsrt__cpu_arg(s, DNNL_ARG_VARIANCE, o->var);
    if (!p->train) goto out;

    /* Backward: the input's gradient is always computed (into scratch
     * when nothing takes it). */
    {
        dnnl_layer_normalization_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_layer_normalization_backward_desc_init(
            &bd, dnnl_backward, &md2, &md2, &stat_md, L->o.eps, flags);
        if (st != dnnl_success) {
            rc = dsrt__cpu_fail(st, "layernorm backward", L);
            goto out;
        }
        if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, "layernorm backward", L))) goto out;
        dnnl_memory_t dy2, dgamma, dbeta, tgt = NULL, acc = NULL, dx = NULL, tmp = NULL, dx2;
        rc = dsrt__cpu_diff(p, be->engine, &md2, -1, -1, lp->out.diff, &dy2, L);
        if (!rc) rc = dsrt__cpu_mem(p, &c_md, be->engine, net->grads + L->w_off, &dgamma, L);
        if (!rc) rc = dsrt__cpu_mem(p, &c_md, be->engine, net->grads + L->b_off, &dbeta, L);
        if (!rc && in.diff) rc = dsrt__cpu_grad_target_of(be, p, i, 0, &in, &tgt, &acc);
        if (!rc && in.diff) rc = dsrt__cpu_deliver(p, be, tgt, &nhwc, &dx, &tmp, L);
        if (!rc && !in.diff) rc = dsrt__cpu_mem(p, &nhwc, be->engine, NULL, &tmp, L);
        /* dx2: the rows of the gradient's bytes, a view of a gradient or of
         * a memory of its own. */
        if (!rc && tmp) rc = view(p, be, &md2, dsrt__cpu_handle(tmp), &dx2, L);
        if (!rc && !tmp) rc = dsrt__cpu_diff(p, be->engine, &md2, -1, -1, dx, &dx2, L);
        if (!rc) rc = dsrt__cpu_prim_step(p, be, bpd, 1, i, &s, L);
        dnnl_primitive_desc_destroy(bpd);
        if (rc) goto out;
        dsrt__cpu_arg(s, DNNL_ARG_SRC, o->src2);
        dsrt__cpu_arg(s, DNNL_ARG_MEAN, o->mean);
        dsrt__cpu_arg(s, DNNL_ARG_VARIANCE, o->var);
        dsrt__cpu_arg(s, DNNL_ARG_DIFF_DST, dy2);
        dsrt__cpu_arg(s, DNNL_ARG_SCALE, gamma);
        dsrt__cpu_arg(s, DNNL_ARG_SHIFT, beta);
        dsrt__cpu_arg(s, DNNL_ARG_DIFF_SRC, dx2);
        dsrt__cpu_arg(s, DNNL_ARG_DIFF_SCALE, dgamma);
        dsrt__cpu_arg(s, DNNL_ARG_DIFF_SHIFT, dbeta);
        if (in.diff && tmp &&
            (rc = dsrt__cpu_reorder_step(p, be, tmp, tgt, 1, i, STEP_ALWAYS, NULL, L)))
            goto out;
        if (in.diff && (rc = dsrt__cpu_grad_add(be, p, i, in.diff, acc))) goto out;
        rc = dsrt__cpu_ready_step(p, i);
    }
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

static void ln_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    dsrt__onnx_attr_int(w, "axis", -1);
    dsrt__onnx_attr_float(w, "epsilon", l->o.eps);
}

static void perm_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    dsrt__onnx_attr_ints(w, "perm", ctx, 4);
}

static void mean_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    int64_t axes[1] = {-1};
    dsrt__onnx_attr_ints(w, "axes", axes, 1);
    dsrt__onnx_attr_int(w, "keepdims", 1);
}

/* Before opset 17: the normalisation of x (channels last) written out as
 * PyTorch writes it there, into out: d = x - ReduceMean(x), y = d /
 * Sqrt(ReduceMean(d d) + eps) scale + bias. */
static void export_expanded(onnx_export *e, const dsrt_layer *l, const char *x, const char *scale,
                            const char *bias, const char *out) {
    static const char *const what[] = {"mean",   "dev", "sq",   "var",
                                       "vareps", "std", "xhat", "scaled"};
    char v[8][DSRT_LAYER_NAME_MAX + 32], nm[DSRT_LAYER_NAME_MAX + 32],
        eps[DSRT_LAYER_NAME_MAX + 32];
    for (int k = 0; k < 8; k++) dsrt__onnx_aux_name(v[k], sizeof v[k], l, what[k]);
    dsrt__onnx_aux_name(eps, sizeof eps, l, "eps");
    float ev = l->o.eps;
    dsrt__onnx_floats(e, eps, NULL, 0, &ev);
    static const char *const op[] = {"ReduceMean", "Sub", "Mul", "ReduceMean", "Add",
                                     "Sqrt",       "Div", "Mul", "Add"};
    const char *in[9][2] = {{x, NULL},    {x, v[0]},    {v[1], v[1]},  {v[2], NULL}, {v[3], eps},
                            {v[4], NULL}, {v[1], v[5]}, {v[6], scale}, {v[7], bias}};
    for (int k = 0; k < 9; k++) {
        snprintf(nm, sizeof nm, "%s.%s%d", l->name, op[k], k);
        dsrt__onnx_node(e, op[k], nm, in[k], in[k][1] ? 2 : 1, k < 8 ? v[k] : out,
                        k == 0 || k == 3 ? mean_attrs : NULL, l, NULL);
    }
}

/*
 * LayerNormalization (opset 17) over the last axis: of the (N, C) input
 * flattened when it has one pixel, else of the image transposed to
 * channels-last (N, H, W, C) and back, as PyTorch writes ConvNeXt's
 * LayerNorm2d. Before opset 17, which has no such operator, the same
 * written out in ReduceMean, Sub, Mul, Add, Sqrt and Div (which the import
 * reads back as one layer: onnx_rewrite.c).
 */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    int j = l->inputs[0], flat = l->out.h == 1 && l->out.w == 1;
    char names[5][DSRT_LAYER_NAME_MAX + 32];
    int64_t dims[1] = {l->out.c};
    dsrt__onnx_aux_name(names[0], sizeof names[0], l, "scale");
    dsrt__onnx_aux_name(names[1], sizeof names[1], l, "bias");
    dsrt__onnx_floats(e, names[0], dims, 1, e->net->params + l->w_off);
    dsrt__onnx_floats(e, names[1], dims, 1, e->net->params + l->b_off);
    const char *x;
    if (flat) {
        x = dsrt__onnx_as_rank(e, l, j, 2, names[2], sizeof names[2]);
    } else {
        static const int64_t to_last[4] = {0, 2, 3, 1};
        char node[DSRT_LAYER_NAME_MAX + 32];
        dsrt__onnx_aux_name(names[3], sizeof names[3], l, "nhwc");
        dsrt__onnx_aux_name(node, sizeof node, l, "to_nhwc");
        const char *t_in[1] = {dsrt__onnx_as_rank(e, l, j, 4, names[2], sizeof names[2])};
        dsrt__onnx_node(e, "Transpose", node, t_in, 1, names[3], perm_attrs, l, to_last);
        x = names[3];
    }
    dsrt__onnx_aux_name(names[4], sizeof names[4], l, "norm");
    const char *y = flat ? out : names[4];
    if (e->opset < 17) {
        export_expanded(e, l, x, names[0], names[1], y);
    } else {
        const char *in[3] = {x, names[0], names[1]};
        dsrt__onnx_node(e, "LayerNormalization", l->name, in, 3, y, ln_attrs, l, NULL);
    }
    e->rank[i] = flat ? 2 : 4;
    if (flat) return 0;
    static const int64_t to_first[4] = {0, 3, 1, 2};
    char node[DSRT_LAYER_NAME_MAX + 32];
    dsrt__onnx_aux_name(node, sizeof node, l, "to_nchw");
    const char *b_in[1] = {names[4]};
    dsrt__onnx_node(e, "Transpose", node, b_in, 1, out, perm_attrs, l, to_first);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

/*
 * LayerNormalization whose normalised axes (axis to the last) are the
 * channels: the last axis of a flattened (N, C) of one pixel, or of a
 * channels-last value; axis 1 of an image of one pixel. Scale (and B, when
 * given: else zeros) hold one value a channel.
 */
static int map_layernorm(onnx_import *c) {
    onnx_val *x = dsrt__onnx_data_input(c, 0, "first");
    if (!x) return c->err;
    for (int k = 1; k < c->cur->n_out; k++)
        if (dsrt__onnx_output_used(c, k))
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "its Mean or InvStdDev output is used: dsrt keeps neither");
    int64_t axis, stash;
    float eps;
    int rc;
    if ((rc = dsrt__onnx_get_int(c, "axis", -1, &axis)) ||
        (rc = dsrt__onnx_get_float(c, "epsilon", 1e-5f, &eps)) ||
        (rc = dsrt__onnx_get_int(c, "stash_type", 1, &stash)))
        return rc;
    dsrt_shape s = dsrt__onnx_shape_of(c, x);
    int rank = x->flat ? 2 : 4, one = s.h == 1 && s.w == 1;
    if (axis < 0) axis += rank;
    int ok = x->nhwc ? axis == 3 : one && axis == 1;
    if (!ok)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "axis %lld of the %s value '%s' (%dx%dx%d): dsrt normalises the "
                               "channels of each pixel (the last axis of a channels-last value)",
                               (long long)axis,
                               x->flat   ? "(N, K)"
                               : x->nhwc ? "channels-last (N, H, W, C)"
                                         : "(N, C, H, W)",
                               ONNX_SHOWN(x->name), s.c, s.h, s.w);
    if (eps < 1e-12f || eps > 1)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "epsilon %g: dsrt's is 1e-12 to 1",
                               (double)eps);
    onnx_tensor *t[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        if (k && !dsrt__onnx_has_input(c, 2)) break;
        if (!(t[k] = dsrt__onnx_const_input(c, k + 1, k ? "B" : "Scale"))) return c->err;
        if (t[k]->count != (uint64_t)s.c || !dsrt__onnx_row_const(t[k], s.c, x->flat ? 2 : 4))
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "%s '%s' has %llu values in %d dimensions, not one a channel "
                                   "(%d) along the last axis",
                                   k ? "B" : "Scale", ONNX_SHOWN(t[k]->name),
                                   (unsigned long long)t[k]->count, t[k]->ndims, s.c);
    }
    onnx_layer *l = dsrt__onnx_add_layer(c, "layernorm", &x, 1);
    if (!l) return c->err;
    dsrt__onnx_opt(l, " eps=%.9g", (double)eps);
    l->w = t[0];
    l->b = t[1];
    l->out = s;
    c->out_nhwc = x->nhwc;
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"LayerNormalization", map_layernorm, "axis,epsilon,stash_type", ONNX_OP_NHWC},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_layernorm = {
    .name = "layernorm",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .init = init,
    .cpu_plan = plan_layernorm,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=4x4x3\nconv filters=6 size=3 pad=1\nlayernorm\ngap\nlayernorm eps=1e-3\n"
               "fc outputs=3\nsoftmax\n",
};

/*
 * concat {depthConcatenationLayer}: two or more inputs of one height and
 * width side by side along the channels, in the order named.
 *
 *   inputs=a,b,... (two or more)
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {DSRT_OPT_END};

static const dsrt_layer_type TYPES[] = {
    {"concat", OPTS, "concatenation of two or more inputs along the channels"},
    {NULL, NULL, NULL},
};

static int join(const dsrt_shape *const *ins, int n, dsrt_shape *out, const char **must) {
    *out = *ins[0];
    *must = "one height and width";
    int64_t channels = out->c;
    for (int k = 1; k < n; k++) {
        if (ins[k]->h != out->h || ins[k]->w != out->w) return 1;
        channels += ins[k]->c;
    }
    if (dsrt__volume(channels, out->h, out->w) > INT32_MAX) return 2;
    out->c = (int)channels;
    return 0;
}

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    return dsrt__layer_check_size(l, (double)in->c * in->h * in->w, "an output image");
}

// ----------------------------------------------------------------------------
// CPU backend

/*
 * The inputs side by side along the channels, in plain NHWC (where any
 * channel range of the output is a view, whatever the offsets); backward
 * hands each input its channels of the gradient through such a view.
 */
static int plan_concat(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    int n = L->n_inputs, rc;
    dnnl_dims_t dims = {p->n, L->out.c, L->out.h, L->out.w};
    dnnl_memory_desc_t dst, mds[DSRT_INPUTS_MAX];
    tensor in[DSRT_INPUTS_MAX];
    DN("concat", dnnl_memory_desc_init_by_tag(&dst, 4, dims, dnnl_f32, dnnl_acdb));
    for (int k = 0; k < n; k++) {
        if ((rc = dsrt__cpu_input4(be, p, L, k, &in[k]))) return rc;
        mds[k] = in[k].md;
    }
    dnnl_primitive_attr_t attr;
    if ((rc = dsrt__cpu_attr(&attr, 0, 0, L))) return rc;
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_concat_primitive_desc_create(&pd, &dst, n, 1, mds, attr, be->engine);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return dsrt__cpu_fail(st, "concat", L);
    step *s;
    rc = dsrt__cpu_output(be, p, i, &dst);
    if (!rc) rc = dsrt__cpu_prim_step(p, be, pd, 0, i, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    for (int k = 0; k < n; k++) dsrt__cpu_arg(s, DNNL_ARG_MULTIPLE_SRC + k, in[k].mem);
    dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
    if (!p->train) return 0;
    int c0 = 0;
    for (int k = 0; k < n && !rc; k++) {
        int ck = be->net->layers[L->inputs[k]].out.c;
        if (dsrt__net_need_diff(be->net, L->inputs[k])) {
            dnnl_dims_t sd = {p->n, ck, L->out.h, L->out.w}, off = {0, c0, 0, 0};
            dnnl_memory_desc_t sub;
            dnnl_memory_t view, tgt, acc;
            DN("concat backward", dnnl_memory_desc_init_submemory(&sub, &dst, sd, off));
            rc = dsrt__cpu_diff(p, be->engine, &sub, -1, -1, lp->out.diff, &view, L);
            if (!rc) rc = dsrt__cpu_grad_target_of(be, p, i, k, &in[k], &tgt, &acc);
            if (!rc) rc = dsrt__cpu_reorder_step(p, be, view, tgt, 1, i, STEP_ALWAYS, NULL, L);
            if (!rc) rc = dsrt__cpu_grad_add(be, p, i, in[k].diff, acc);
        }
        c0 += ck;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

/* Concat along the channels, every input at one rank (4 unless all are
 * flat). */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    int rank = 2;
    for (int k = 0; k < l->n_inputs; k++)
        if (e->rank[l->inputs[k]] == 4) rank = 4;
    char(*names)[DSRT_LAYER_NAME_MAX + 32] = dsrt__calloc((size_t)l->n_inputs, sizeof *names);
    const char **in = dsrt__calloc((size_t)l->n_inputs, sizeof *in);
    if (!names || !in) {
        free(names);
        free(in);
        return -ENOMEM;
    }
    for (int k = 0; k < l->n_inputs; k++)
        in[k] = dsrt__onnx_as_rank(e, l, l->inputs[k], rank, names[k], sizeof names[k]);
    e->rank[i] = rank;
    dsrt__onnx_node(e, "Concat", l->name, in, l->n_inputs, out, dsrt__onnx_axis1_attrs, l, NULL);
    free(names);
    free(in);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

static int map_concat(onnx_import *c) {
    int n = c->cur->n_in;
    if (n < 1 || n > DSRT_INPUTS_MAX)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "%d inputs: dsrt joins 1 to %d", n,
                               DSRT_INPUTS_MAX);
    onnx_val *in[DSRT_INPUTS_MAX];
    for (int k = 0; k < n; k++)
        if (!(in[k] = dsrt__onnx_data_input(c, k, "an"))) return c->err;
    int64_t axis;
    int rc;
    if ((rc = dsrt__onnx_get_int(c, "axis", 1, &axis))) return rc;
    int rank = in[0]->flat ? 2 : 4;
    if (axis < 0) axis += rank;
    if (axis != 1)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "axis %lld: dsrt joins along the channels (axis 1)",
                               (long long)axis);
    dsrt_shape s0 = dsrt__onnx_shape_of(c, in[0]), os;
    int64_t channels = 0;
    for (int k = 0; k < n; k++) {
        dsrt_shape s = dsrt__onnx_shape_of(c, in[k]);
        if (in[k]->flat != in[0]->flat || s.h != s0.h || s.w != s0.w ||
            (in[k]->flat && !dsrt__onnx_flat_is_channels(c, in[k])))
            return dsrt__onnx_fail(
                c, DSRT_EUNSUPPORTED, "input '%s' is %dx%dx%d%s, input '%s' %dx%dx%d%s",
                ONNX_SHOWN(in[0]->name), s0.c, s0.h, s0.w, in[0]->flat ? " flattened" : "",
                ONNX_SHOWN(in[k]->name), s.c, s.h, s.w, in[k]->flat ? " flattened" : "");
        for (int j = 0; j < k; j++)
            if (in[j]->layer == in[k]->layer)
                return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "it joins '%s' twice",
                                       ONNX_SHOWN(in[k]->name));
        channels += s.c;
    }
    if (n == 1) {
        dsrt__onnx_alias(c, in[0], in[0]->flat);
        return 0;
    }
    if ((rc = dsrt__onnx_out_shape(c, channels, s0.h, s0.w, &os))) return rc;
    onnx_layer *l = dsrt__onnx_add_layer(c, "concat", in, n);
    if (!l) return c->err;
    l->out = os;
    dsrt__onnx_produce(c, l, in[0]->flat);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Concat", map_concat, "axis", 0},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_concat = {
    .name = "concat",
    .types = TYPES,
    .min_inputs = 2,
    .max_inputs = DSRT_INPUTS_MAX,
    .join = join,
    .build = build,
    .cpu_plan = plan_concat,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input name=in size=4x4x2\nconv name=a filters=3 size=1\nconv name=b filters=2 "
               "size=1 inputs=in\nconcat inputs=a,b\nfc outputs=3\nsoftmax\n",
};

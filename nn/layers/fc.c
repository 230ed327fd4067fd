/*
 * fc {fullyConnectedLayer}: every output a weighted sum of the whole input
 * image (weights (outputs, in_c, in_h, in_w)) and an optional bias;
 * outputs=classes makes it the classifier for the data's class count. It
 * computes a ReLU that takes its output as its own.
 *
 *   outputs=N|classes (required)  bias init wlr blr wl2 bl2 as conv
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    {"outputs", OPT_OUTPUTS, NULL, DSRT_O(outputs), 0, 1, 1 << 24, NULL},
    {"bias", OPT_BOOL, "1", DSRT_O(bias), 0, 0, 1, NULL},
    {"init", OPT_INIT, "default", DSRT_O(init), 0, 0, 0, NULL},
    DSRT_LR_OPTS("1", "0"),
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"fc", OPTS, "fully connected"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    int outputs = l->o.outputs;
    if (outputs == DSRT_CLASSES_AUTO) {
        if (*classes <= 0)
            return dsrt__fail(DSRT_EOPTION,
                              "fc: option 'outputs': 'classes' but the class count is not known");
        outputs = *classes;
    }
    l->o.outputs = outputs;
    l->out = (dsrt_shape){outputs, 1, 1};
    double wn = (double)outputs * in->c * in->h * in->w;
    int rc = dsrt__layer_check_size(l, wn, "the weights");
    if (rc) return rc;
    l->w_n = (size_t)wn;
    l->b_n = l->o.bias ? (size_t)outputs : 0;
    l->flops = 2.0 * wn;
    return 0;
}

static void init(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int net_init) {
    int how = l->o.init == DSRT_INIT_DEFAULT ? net_init : l->o.init;
    double fan_in = (double)l->in.c * l->in.h * l->in.w;
    dsrt__layer_draw(params + l->w_off, l->w_n, how, fan_in, (double)l->o.outputs, rng);
    dsrt__layer_init_bias(params + l->b_off, l->b_n, how, fan_in, rng);
}

// ----------------------------------------------------------------------------
// CPU backend

/* The plain way's tensors: the weights and bias in the flat buffers, and
 * the product before the transpose. */
typedef struct {
    dnnl_memory_t w, b;
    float *t; /* (outputs, n) */
} fc_own;

static void own_free(void *own) {
    fc_own *f = own;
    if (f) free(f->t);
    free(f);
}

/* Plain fully connected forward as one sgemm, y^T (outputs x n) = W (outputs
 * x in) * x^T, then bias, ReLU and the transpose to y (n x outputs) in one
 * pass. With few images and many weights this orientation streams W once;
 * oneDNN 2.6's inner product computes x * W^T and runs 3-4x slower on such
 * shapes (AlexNet fc6: 62 ms against 15 ms on two cores). */
static int step_fc_fwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    int n = p->n, oc = L->out.c, ic = L->in.c * L->in.h * L->in.w;
    const fc_own *f = lp->own;
    const float *x = dsrt__cpu_handle(lp->src), *w = dsrt__cpu_handle(f->w);
    const float *b = f->b ? dsrt__cpu_handle(f->b) : NULL;
    float *t = f->t, *y = dsrt__cpu_handle(lp->out.mem);
    dnnl_status_t st = dnnl_sgemm('N', 'T', oc, n, ic, 1.0f, w, ic, x, ic, 0.0f, t, n);
    if (st != dnnl_success) return dsrt__cpu_fail(st, "fc sgemm", L);
    float leak = L->fuse_leak;
    for (int o = 0; o < oc; o++) {
        float bo = b ? b[o] : 0.0f;
        const float *to = t + (size_t)o * n;
        for (int k = 0; k < n; k++) {
            float v = to[k] + bo;
            if (L->fuse_relu && v < 0) v *= leak;
            y[(size_t)k * oc + o] = v;
        }
    }
    return 0;
}

/*
 * Fully connected. Two ways, whichever moves fewer bytes per step: with
 * large weights (AlexNet's fc6: 38M) the input is reordered to plain NCHW and
 * the weights and their gradient are used in place in the flat buffers; with
 * small weights (digits: 115k weights, 1.5M activations) the input stays in
 * its blocked layout and the weights are reordered to match once per step.
 */
static int plan_fc(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    int four = in->md.ndims == 4, rc;
    size_t act = (size_t)p->n * L->in.c * L->in.h * L->in.w;
    /* At inference, layers it computes (cpu_fusion) take the primitive's post-ops. */
    const cpu_fusion *fu = dsrt__cpu_fusion(p, i);
    int plain = (!four || L->w_n >= act || dsrt__cpu_md_is(&in->md, dnnl_abcd)) && !fu;
    dnnl_dims_t sdims4 = {p->n, L->in.c, L->in.h, L->in.w}, sdims2 = {p->n, L->in.c};
    dnnl_dims_t wdims4 = {L->out.c, L->in.c, L->in.h, L->in.w}, wdims2 = {L->out.c, L->in.c};
    dnnl_dims_t ddims = {p->n, L->out.c}, bdims = {L->out.c};
    dnnl_memory_desc_t src_md, w_plain, w_md, b_md, dst_md;
    if (dsrt__cpu_md_plain(&src_md, four ? 4 : 2, four ? sdims4 : sdims2) ||
        dsrt__cpu_md_plain(&w_plain, four ? 4 : 2, four ? wdims4 : wdims2) ||
        dsrt__cpu_md_plain(&b_md, 1, bdims) || dsrt__cpu_md_plain(&dst_md, 2, ddims))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "memory descriptors", L);
    w_md = w_plain;
    if (!plain) {
        src_md = in->md;
        dsrt__cpu_md_any(&w_md, four ? 4 : 2, four ? wdims4 : wdims2);
    }
    const dnnl_memory_desc_t *bias = L->b_n || (fu && fu->affine >= 0) ? &b_md : NULL;
    dnnl_inner_product_desc_t fd;
    dnnl_primitive_desc_t fpd;
    DN("fc", dnnl_inner_product_forward_desc_init(
                 &fd, p->train ? dnnl_forward_training : dnnl_forward_inference, &src_md, &w_md,
                 bias, &dst_md));
    if ((rc = dsrt__cpu_pd_fused(&fpd, &fd, be, p, i, "fc"))) return rc;
    dnnl_memory_t wplain, wfwd, b = NULL;
    step *s;
    rc = dsrt__cpu_ensure(p, be, in->mem, dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0),
                          0, i, &lp->src, L);
    if (!rc) rc = dsrt__cpu_fused_params(be, p, i, &w_plain, &b_md, &wplain, &b);
    if (!rc)
        rc = dsrt__cpu_weights_for(be, p, i, &w_plain,
                                   dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0),
                                   wplain, 0, &lp->w_fwd_version, &wfwd);
    if (!rc) rc = dsrt__cpu_fused_output(be, p, i, &dst_md);
    if (rc) goto out;
    if (plain) {
        fc_own *f = dsrt__calloc(1, sizeof *f);
        if (!f) {
            rc = -ENOMEM;
            goto out;
        }
        lp->own = f;
        lp->own_free = own_free;
        f->w = wplain;
        f->b = b;
        f->t = aligned_alloc(64, ((size_t)p->n * L->out.c * sizeof(float) + 63) & ~(size_t)63);
        if (!f->t) {
            rc = dsrt__fail(-ENOMEM, "cpu backend: layer '%s': out of memory", L->name);
            goto out;
        }
        if ((rc = dsrt__cpu_c_step(p, 0, step_fc_fwd, i))) goto out;
    } else {
        if ((rc = dsrt__cpu_prim_step(p, be, fpd, 0, i, &s, L))) goto out;
        dsrt__cpu_arg(s, DNNL_ARG_SRC, lp->src);
        dsrt__cpu_arg(s, DNNL_ARG_WEIGHTS, wfwd);
        dsrt__cpu_arg(s, DNNL_ARG_BIAS, b);
        dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
    }
    if (!p->train) goto out;

    if (L->fuse_relu && (rc = dsrt__cpu_fused_relu_bwd(be, p, i))) goto out;
    {
        dnnl_inner_product_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_inner_product_backward_weights_desc_init(
            &bd, dsrt__cpu_md_of(lp->src), &w_md, bias, &dst_md);
        if (st != dnnl_success) {
            rc = dsrt__cpu_fail(st, "fc backward weights", L);
            goto out;
        }
        if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, "fc backward weights", L))) goto out;
        if ((rc = dsrt__cpu_weights_grad(be, p, i, bpd, &w_plain, &b_md, 0))) goto out;
    }
    if (dsrt__net_need_diff(be->net, L->inputs[0])) {
        dnnl_inner_product_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_memory_desc_t dsrc_md = *dsrt__cpu_md_of(lp->src);
        dnnl_status_t st =
            dnnl_inner_product_backward_data_desc_init(&bd, &dsrc_md, &w_md, &dst_md);
        if (st != dnnl_success) {
            rc = dsrt__cpu_fail(st, "fc backward data", L);
            goto out;
        }
        if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, "fc backward data", L))) goto out;
        rc = dsrt__cpu_data_grad(be, p, i, bpd, &w_plain, wplain, wfwd, 0);
    }
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

static void gemm_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    dsrt__onnx_attr_int(w, "transB", 1);
}

/* Gemm (its B transposed: (N, K), K in C, H, W order, as the flat buffer
 * holds the weights), or before opset 11 without a bias, a MatMul by the
 * transposed weights. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    const float *params = e->net->params;
    char a[DSRT_LAYER_NAME_MAX + 32], b[DSRT_LAYER_NAME_MAX + 32], x0[DSRT_LAYER_NAME_MAX + 32];
    const char *x = dsrt__onnx_as_rank(e, l, l->inputs[0], 2, x0, sizeof x0);
    int64_t w[2] = {l->out.c, (int64_t)l->in.c * l->in.h * l->in.w}, bd[1] = {l->out.c};
    dsrt__onnx_aux_name(a, sizeof a, l, "weight");
    dsrt__onnx_aux_name(b, sizeof b, l, "bias");
    const char *in[3] = {x, a, b};
    e->rank[i] = 2;
    if (!l->b_n && e->opset < 11) {
        /* Gemm's C is optional from opset 11; before, a MatMul by the
         * transposed weights (a zero bias would come back as one). */
        size_t n = (size_t)w[0], k = (size_t)w[1];
        float *t = dsrt__malloc(n * k * sizeof *t);
        if (!t) return -ENOMEM;
        for (size_t r = 0; r < n; r++)
            for (size_t q = 0; q < k; q++) t[q * n + r] = params[l->w_off + r * k + q];
        int64_t tw[2] = {w[1], w[0]};
        dsrt__onnx_floats(e, a, tw, 2, t);
        free(t);
        dsrt__onnx_node(e, "MatMul", l->name, in, 2, out, NULL, l, NULL);
        return 0;
    }
    dsrt__onnx_floats(e, a, w, 2, params + l->w_off);
    if (l->b_n) dsrt__onnx_floats(e, b, bd, 1, params + l->b_off);
    dsrt__onnx_node(e, "Gemm", l->name, in, l->b_n ? 3 : 2, out, gemm_attrs, l, NULL);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

/* Gemm and MatMul: a fully connected layer over the flattened input. */
static int fc_layer(onnx_import *c, onnx_val *a, onnx_tensor *w, int trans_b, float alpha,
                    onnx_tensor *bias, float beta) {
    dsrt_shape s = dsrt__onnx_shape_of(c, a);
    int64_t k = dsrt__volume(s.c, s.h, s.w);
    if (w->ndims != 2)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "weight '%s' has %d dimensions, not 2",
                               ONNX_SHOWN(w->name), w->ndims);
    int64_t wk = trans_b ? w->dims[1] : w->dims[0], n = trans_b ? w->dims[0] : w->dims[1];
    if (wk != k || n < 1 || n > (1 << 24))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT,
                               "weight '%s' (%lld, %lld) does not take the %lld values of "
                               "its input",
                               ONNX_SHOWN(w->name), (long long)w->dims[0], (long long)w->dims[1],
                               (long long)k);
    if (bias && !dsrt__onnx_row_const(bias, n, 2))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "bias '%s' of %llu values in %d dimensions does not broadcast to "
                               "the %lld outputs as one row",
                               ONNX_SHOWN(bias->name), (unsigned long long)bias->count, bias->ndims,
                               (long long)n);
    dsrt_shape os;
    int rc = dsrt__onnx_out_shape(c, n, 1, 1, &os);
    if (rc) return rc;
    onnx_layer *l = dsrt__onnx_add_layer(c, "fc", &a, 1);
    if (!l) return c->err;
    dsrt__onnx_opt(l, " outputs=%lld bias=%d", (long long)n, bias != NULL);
    l->w = w;
    if (!trans_b) {
        l->w_rows = k;
        l->w_cols = n;
    }
    l->w_scale = alpha;
    l->b = bias;
    l->b_scale = beta;
    l->out = os;
    return (int)(l - c->L);
}

static onnx_val *flat_input(onnx_import *c, const char *op) {
    onnx_val *a = dsrt__onnx_data_input(c, 0, "first");
    if (a && !a->flat) {
        dsrt_shape s = dsrt__onnx_shape_of(c, a);
        dsrt__onnx_fail(
            c, DSRT_EUNSUPPORTED,
            "its input '%s' is a (N, %d, %d, %d) image: %s takes (N, K) (a Flatten first)",
            ONNX_SHOWN(a->name), s.c, s.h, s.w, op);
        return NULL;
    }
    return a;
}

static int map_gemm(onnx_import *c) {
    onnx_val *a = flat_input(c, "Gemm");
    if (!a) return c->err;
    onnx_tensor *b = dsrt__onnx_const_input(c, 1, "weight (B)"), *cc = NULL;
    if (!b) return c->err;
    if (dsrt__onnx_has_input(c, 2) && !(cc = dsrt__onnx_const_input(c, 2, "bias (C)")))
        return c->err;
    int64_t ta, tb;
    float alpha, beta;
    int rc;
    if ((rc = dsrt__onnx_get_int(c, "transA", 0, &ta)) ||
        (rc = dsrt__onnx_get_int(c, "transB", 0, &tb)) ||
        (rc = dsrt__onnx_get_float(c, "alpha", 1.0f, &alpha)) ||
        (rc = dsrt__onnx_get_float(c, "beta", 1.0f, &beta)))
        return rc;
    if (ta) return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "transA=1: the batch must be A's rows");
    rc = fc_layer(c, a, b, tb != 0, alpha, beta != 0 ? cc : NULL, beta);
    if (rc < 0) return rc;
    dsrt__onnx_produce(c, &c->L[rc], 1);
    return 0;
}

/* MatMul of a channels-last image (N, H, W, C) by a constant (C, M): the
 * same product at every pixel, a 1x1 convolution of M filters (its
 * output channels-last too). The weights are (inputs, outputs), dsrt's
 * transposed. */
static int pixel_linear(onnx_import *c, onnx_val *a, onnx_tensor *w, onnx_tensor *bias) {
    dsrt_shape s = dsrt__onnx_shape_of(c, a);
    if (w->ndims != 2 || w->dims[0] != s.c || w->dims[1] < 1 || w->dims[1] > (1 << 20))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT,
                               "weight '%s' (%d dimensions) does not take the %d channels of its "
                               "channels-last input",
                               ONNX_SHOWN(w->name), w->ndims, s.c);
    int64_t m = w->dims[1];
    if (bias && !dsrt__onnx_row_const(bias, m, 4))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "bias '%s' of %llu values in %d dimensions for %lld outputs: one "
                               "value an output, along the last axis",
                               ONNX_SHOWN(bias->name), (unsigned long long)bias->count, bias->ndims,
                               (long long)m);
    dsrt_shape os;
    int rc = dsrt__onnx_out_shape(c, m, s.h, s.w, &os);
    if (rc) return rc;
    onnx_layer *l = dsrt__onnx_add_layer(c, "conv", &a, 1);
    if (!l) return c->err;
    dsrt__onnx_opt(l, " filters=%lld size=1 bias=%d", (long long)m, bias != NULL);
    l->w = w;
    l->w_rows = s.c;
    l->w_cols = m;
    l->b = bias;
    l->out = os;
    c->out_nhwc = 1;
    return (int)(l - c->L);
}

static int map_matmul(onnx_import *c) {
    onnx_val *a = dsrt__onnx_data_input(c, 0, "first");
    if (!a) return c->err;
    int pixels = a->nhwc;
    if (!pixels && !(a = flat_input(c, "MatMul"))) return c->err;
    onnx_tensor *b = dsrt__onnx_const_input(c, 1, "weight (B)"), *bias = NULL;
    if (!b) return c->err;
    /* The Add of a bias that takes this product alone: one fc layer. */
    onnx_val *o = dsrt__onnx_output(c, 0);
    int add = -1;
    if (o && o->uses == 1)
        for (int j = c->cur->index + 1; j < c->m.n_nodes && add < 0; j++) {
            const onnx_node *n = &c->m.nodes[j];
            if (!c->live[j] || !onnx_is(n->op, "Add") || n->n_in != 2 || n->n_out < 1) continue;
            for (int k = 0; k < 2; k++) {
                if (!onnx_same(n->in[k], o->name)) continue;
                onnx_val *other = dsrt__onnx_find(c, n->in[1 - k]);
                if (other && other->kind == ONNX_V_CONST) {
                    add = j;
                    bias = other->t;
                }
            }
        }
    int rc = pixels ? pixel_linear(c, a, b, bias) : fc_layer(c, a, b, 0, 1.0f, bias, 1.0f);
    if (rc < 0) return rc;
    dsrt__onnx_produce(c, &c->L[rc], !pixels);
    if (add >= 0) {
        c->absorbed[add] = 1;
        onnx_val *sum = dsrt__onnx_find(c, c->m.nodes[add].out[0]);
        if (sum) {
            sum->kind = ONNX_V_LAYER;
            sum->layer = rc;
            sum->flat = !pixels;
            sum->nhwc = pixels;
        }
    }
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Gemm", map_gemm, "alpha,beta,transA,transB", 0},
    {"MatMul", map_matmul, "", ONNX_OP_NHWC},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_fc = {
    .name = "fc",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = DSRT_LAYER_F_TAKES_RELU | DSRT_LAYER_F_POSTOPS,
    .build = build,
    .init = init,
    .cpu_plan = plan_fc,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=3x3x2\nfc outputs=5\nfc outputs=3 bias=0\nsoftmax\n",
};

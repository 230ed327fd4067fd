/*
 * dropout {dropoutLayer}: in training each value is dropped with
 * probability p and the survivors scaled by 1/(1-p), from a generator
 * keyed by (seed, iteration, layer) so that every backend drops the same
 * values (nn/arith.h); the identity at inference.
 *
 *   p= [0.5]
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"
#include "nn/arith.h"

static const dsrt_opt_spec OPTS[] = {
    {"p", OPT_FLOAT, "0.5", DSRT_O(p), 0, 0, 0.999999, NULL},
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"dropout", OPTS, "dropout"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

/* What the layer keeps: the masks of the last training forward, and where
 * backward writes the input's gradient in plain layout. */
typedef struct {
    float *mask; /* (n) 0 or 1/(1-p) */
    size_t n;
    dnnl_memory_t plain_diff;
} dropout_own;

static void own_free(void *own) {
    dropout_own *d = own;
    if (d) free(d->mask);
    free(d);
}

/* Masks are indexed by the logical NCHW position of each value (the layer
 * works on the plain layout), as nn/arith.h defines them for every backend:
 * one draw of the layer's generator gives two elements' masks. */
static int step_dropout_fwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    const float *x = dsrt__cpu_handle(lp->src);
    dropout_own *d = lp->own;
    float *y = dsrt__cpu_handle(lp->out.mem), *m = d->mask;
    size_t n = d->n;
    float keep = dsrt_dropout_scale(l->o.p);
    uint32_t thresh = dsrt_dropout_threshold(l->o.p);
    dsrt_rng rng = dsrt_dropout_rng(net->opts.seed, (uint64_t)net->iteration, (uint64_t)i);
    for (size_t k = 0; k < n; k += 2) {
        uint64_t r = dsrt_rng_u64(&rng);
        m[k] = (uint32_t)r >= thresh ? keep : 0.0f;
        if (k + 1 < n) m[k + 1] = (uint32_t)(r >> 32) >= thresh ? keep : 0.0f;
    }
    for (size_t k = 0; k < n; k++) y[k] = x[k] * m[k];
    return 0;
}

static int step_dropout_bwd(cpu_backend *be, cpu_plan *p, int i) {
    layer_plan *lp = &p->lp[i];
    const dropout_own *d = lp->own;
    const float *dy = dsrt__cpu_handle(lp->out.diff), *m = d->mask;
    float *dx = dsrt__cpu_handle(d->plain_diff);
    for (size_t k = 0; k < d->n; k++) dx[k] = dy[k] * m[k];
    return 0;
}

static int plan_dropout(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    if (!p->train) {
        lp->out = *in;
        return 0;
    }
    /* In plain layout, where memory order is the logical order the masks
     * are defined in. */
    dnnl_memory_desc_t plain;
    if (dsrt__cpu_md_plain_like(&plain, &in->md))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "dropout", L);
    int rc = dsrt__cpu_ensure(p, be, in->mem, &plain, 0, i, &lp->src, L);
    if (!rc) rc = dsrt__cpu_output(be, p, i, &plain);
    if (rc) return rc;
    dropout_own *d = dsrt__calloc(1, sizeof *d);
    if (!d) return -ENOMEM;
    lp->own = d;
    lp->own_free = own_free;
    d->n = dnnl_memory_desc_get_size(&plain) / sizeof(float);
    d->mask = aligned_alloc(64, (d->n * sizeof(float) + 63) & ~(size_t)63);
    if (!d->mask) return dsrt__fail(-ENOMEM, "cpu backend: layer '%s': out of memory", L->name);
    if ((rc = dsrt__cpu_c_step(p, 0, step_dropout_fwd, i))) return rc;
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    dnnl_memory_t tmp, tgt, acc;
    if ((rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc))) return rc;
    if ((rc = dsrt__cpu_deliver(p, be, tgt, &plain, &d->plain_diff, &tmp, L))) return rc;
    if ((rc = dsrt__cpu_c_step(p, 1, step_dropout_bwd, i))) return rc;
    if (tmp && (rc = dsrt__cpu_reorder_step(p, be, tmp, tgt, 1, i, STEP_ALWAYS, NULL, L)))
        return rc;
    return dsrt__cpu_grad_add(be, p, i, in->diff, acc);
}

// ----------------------------------------------------------------------------
// ONNX export

/* The identity at inference: no node, its input's value. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    int j = l->inputs[0];
    snprintf(out, DSRT_ONNX_VALUE_MAX, "%s", e->value[j]);
    e->rank[i] = e->rank[j];
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

static int map_dropout(onnx_import *c) {
    onnx_val *x = dsrt__onnx_data_input(c, 0, "first");
    if (!x) return c->err;
    if (dsrt__onnx_output_used(c, 1))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "its mask output is used");
    float ratio = 0.5f;
    int rc;
    if ((rc = dsrt__onnx_get_float(c, "ratio", 0.5f, &ratio))) return rc;
    if (dsrt__onnx_has_input(c, 1)) {
        const onnx_tensor *t = dsrt__onnx_const_input(c, 1, "ratio");
        double v;
        if (!t) return c->err;
        if ((rc = dsrt__onnx_scalar(c, t, &v))) return rc;
        ratio = (float)v;
    }
    if (dsrt__onnx_has_input(c, 2)) {
        const onnx_tensor *t = dsrt__onnx_const_input(c, 2, "training_mode");
        double v;
        if (!t) return c->err;
        if ((rc = dsrt__onnx_scalar(c, t, &v))) return rc;
        if (v != 0)
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "training_mode is true: dsrt imports the "
                                   "inference form");
    }
    if (!(ratio >= 0 && ratio < 1))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "ratio %g", (double)ratio);
    if (ratio == 0) {
        dsrt__onnx_alias(c, x, x->flat);
        return 0;
    }
    onnx_layer *l = dsrt__onnx_add_layer(c, "dropout", &x, 1);
    if (!l) return c->err;
    dsrt__onnx_opt(l, " p=%.9g", (double)ratio);
    l->out = dsrt__onnx_shape_of(c, x);
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Dropout", map_dropout, "ratio,seed", ONNX_OP_ELEMENTWISE},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_dropout = {
    .name = "dropout",
    .types = TYPES,
    .flags = DSRT_LAYER_F_INFER_IDENTITY,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_dropout,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=4x4x2\nconv filters=4 size=1\ndropout p=0.3\nfc outputs=3\nsoftmax\n",
};

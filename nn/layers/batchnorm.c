/*
 * batchnorm {batchNormalizationLayer}: batch normalisation over each
 * channel, with a learnable scale and offset (the weights and the bias of
 * the flat buffers) and running mean and variance (its state), updated in
 * training as r = (1 - momentum) r + momentum batch, the variance unbiased.
 * It computes a ReLU (not a leaky one) that takes its output as its own.
 *
 *   eps= [1e-5]  momentum= [0.1]  wlr blr (scale, offset) [1]  wl2 bl2 [1]
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    {"eps", OPT_FLOAT, "1e-5", DSRT_O(eps), 0, 1e-12, 1, NULL},
    {"momentum", OPT_FLOAT, "0.1", DSRT_O(momentum), 0, 0, 1, NULL},
    DSRT_LR_OPTS("1", "1"),
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"batchnorm", OPTS, "batch normalization"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    l->w_n = l->b_n = (size_t)in->c;
    l->s_n = 2 * (size_t)in->c;
    return 0;
}

static void init(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int how) {
    int c = l->out.c;
    for (int i = 0; i < c; i++) {
        params[l->w_off + i] = 1.0f;
        params[l->b_off + i] = 0.0f;
        state[l->s_off + i] = 0.0f;
        state[l->s_off + c + i] = 1.0f;
    }
}

// ----------------------------------------------------------------------------
// CPU backend

/* The batch's statistics, and for synchronised batchnorm the input's
 * gradient as the primitive wrote it, the sums handed to the net's hook
 * and the values a channel over the global batch. */
typedef struct {
    dnnl_memory_t mean, var;
    dnnl_memory_t dsrc;
    double *sums; /* (2c + 1) */
    double count;
    /* Deferred to the add that takes the output (defer_to): the layout, the
     * normalisation the add applies (mean, scale, shift: the padded channel
     * count each, in one buffer) and the statistics' scratch. */
    cpu_chans v;
    cpu_affine norm;
    float *factors;
    double *part;
} bn_own;

static void own_free(void *own) {
    bn_own *b = own;
    if (b) free(b->sums), free(b->factors), free(b->part);
    free(b);
}

static bn_own *own_of(cpu_plan *p, int i) {
    return p->lp[i].own;
}

static int step_bn_running(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    int c = l->out.c;
    const float *mean = dsrt__cpu_handle(own_of(p, i)->mean),
                *var = dsrt__cpu_handle(own_of(p, i)->var);
    float *rm = net->state + l->s_off, *rv = rm + c;
    double count = p->bn_sync ? own_of(p, i)->count : (double)p->n * l->out.h * l->out.w;
    float m = l->o.momentum, unbias = count > 1 ? (float)(count / (count - 1)) : 1.0f;
    for (int k = 0; k < c; k++) {
        rm[k] = (1.0f - m) * rm[k] + m * mean[k];
        rv[k] = (1.0f - m) * rv[k] + m * var[k] * unbias;
    }
    return 0;
}

/* Synchronised batchnorm, forward: the batch statistics over every
 * worker's batch. Sums of x and x^2 per channel over this batch's plain
 * NCHW input go through the net's hook (which sums them over the workers);
 * the mean and the biased variance come from the totals, and the primitive
 * normalises with them as given statistics. */
static int step_bn_sync_fwd(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    int c = l->out.c;
    size_t hw = (size_t)l->out.h * l->out.w;
    const float *x = dsrt__cpu_handle(lp->src);
    double *sums = own_of(p, i)->sums;
    for (int ch = 0; ch < c; ch++) {
        double s = 0, q = 0;
        for (int b = 0; b < p->n; b++) {
            const float *xs = x + ((size_t)b * c + ch) * hw;
            for (size_t k = 0; k < hw; k++) {
                s += xs[k];
                q += (double)xs[k] * xs[k];
            }
        }
        sums[ch] = s;
        sums[c + ch] = q;
    }
    sums[2 * c] = (double)p->n * (double)hw;
    dsrt_bn_sums bs = {i, 0, c, sums, (size_t)2 * c + 1, DSRT_DEVICE_CPU, NULL};
    int rc = net->bn_sync_fn(net->bn_sync_ctx, &bs);
    if (rc) return rc;
    double count = sums[2 * c];
    if (!(count > 0))
        return dsrt__fail(DSRT_EBACKEND, "%s: synchronised batchnorm: %g values over the workers",
                          l->name, count);
    own_of(p, i)->count = count;
    float *mean = dsrt__cpu_handle(own_of(p, i)->mean), *var = dsrt__cpu_handle(own_of(p, i)->var);
    for (int ch = 0; ch < c; ch++) {
        double m = sums[ch] / count, v = sums[c + ch] / count - m * m;
        mean[ch] = (float)m;
        var[ch] = (float)(v > 0 ? v : 0);
    }
    return 0;
}

/* Synchronised batchnorm, backward. The primitive, run with the statistics
 * as given constants, wrote dx = scale / sigma * dy' (dy' after the fused
 * ReLU) and the local sums of dy' (the shift's gradient) and of dy' * xhat
 * (the scale's). Over the global batch of M values a channel, the gradient
 * also has the terms of the mean and variance:
 *     dx -= scale / sigma * (sum dy' + xhat * sum dy' xhat) / M
 * with the sums over every worker, which the hook gives. The parameters'
 * own gradients stay local sums: the gradient all-reduce adds them up. */
static int step_bn_sync_bwd(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    int c = l->out.c;
    size_t hw = (size_t)l->out.h * l->out.w;
    double *sums = own_of(p, i)->sums;
    const float *x = dsrt__cpu_handle(lp->src), *mean = dsrt__cpu_handle(own_of(p, i)->mean),
                *var = dsrt__cpu_handle(own_of(p, i)->var);
    /* The local sums of dy' (behind the fused ReLU: where the output is not
     * positive, none) and of dy' xhat, in double as the forward's: the
     * correction below cancels against scale / sigma * dy', so float sums
     * (the primitive's parameter gradients) would set how far one worker
     * and several drift apart, layer after layer. The parameter gradients
     * become these sums rounded. */
    const float *dy = dsrt__cpu_handle(lp->out.diff), *y = dsrt__cpu_handle(lp->out.mem);
    float *dshift = net->grads + l->b_off, *dscale = net->grads + l->w_off;
    for (int ch = 0; ch < c; ch++) {
        double inv_sigma = 1.0 / sqrt((double)var[ch] + l->o.eps), mu = mean[ch], s1 = 0, s2 = 0;
        for (int b = 0; b < p->n; b++) {
            size_t at = ((size_t)b * c + ch) * hw;
            for (size_t k = 0; k < hw; k++) {
                double g = dy[at + k];
                if (l->fuse_relu && !(y[at + k] > 0)) g = 0;
                s1 += g;
                s2 += g * ((x[at + k] - mu) * inv_sigma);
            }
        }
        sums[ch] = s1;
        sums[c + ch] = s2;
        dshift[ch] = (float)s1;
        dscale[ch] = (float)s2;
    }
    dsrt_bn_sums bs = {i, 1, c, sums, (size_t)2 * c, DSRT_DEVICE_CPU, NULL};
    int rc = net->bn_sync_fn(net->bn_sync_ctx, &bs);
    if (rc) return rc;
    const float *scale = net->params + l->w_off;
    float *dx = dsrt__cpu_handle(own_of(p, i)->dsrc);
    double inv_m = 1.0 / own_of(p, i)->count;
    for (int ch = 0; ch < c; ch++) {
        double inv_sigma = 1.0 / sqrt((double)var[ch] + l->o.eps);
        double a = scale[ch] * inv_sigma;
        double k1 = a * sums[ch] * inv_m, k2 = a * sums[c + ch] * inv_m * inv_sigma;
        double mu = mean[ch];
        for (int b = 0; b < p->n; b++) {
            const float *xs = x + ((size_t)b * c + ch) * hw;
            float *ds = dx + ((size_t)b * c + ch) * hw;
            for (size_t k = 0; k < hw; k++) ds[k] = (float)(ds[k] - k1 - (xs[k] - mu) * k2);
        }
    }
    return 0;
}

/*
 * Training, where the one layer taking the output is an add of two inputs
 * (the last batchnorm of a residual block, and its shortcut's; net option
 * fuse 2): the output is not written. The forward computes the statistics
 * in one pass of its own (oneDNN's reads the input twice for them and a
 * third time to normalise), and the add normalises the input on its way
 * into the sum (layer_plan.defer): the normalised tensor is neither written
 * nor read back. Backward is oneDNN's as before: it reads the input, the
 * statistics and the gradient, never the output. Taken where the input's
 * channels come in runs of 8 or 16 (oneDNN's channel blocks; NHWC of 8 or
 * 16 channels) and the input is not the net's (the caller's batch, which
 * may change before a deferred output is read and written).
 */
static int defer_to(cpu_backend *be, const cpu_plan *p, int i, const dnnl_memory_desc_t *md,
                    cpu_chans *v) {
    const dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    if (!be->batchnorm || !p->train || p->bn_sync || L->fuse_relu || net->opts.fuse < 2 ||
        dsrt__layer_is(&net->layers[L->inputs[0]], DSRT_LAYER_F_INPUT))
        return 0;
    if (!dsrt__cpu_chans(md, v) || !dsrt__cpu_stats_usable(v)) return 0;
    int taker = dsrt__net_only_taker(net, i);
    return taker > 0 && dsrt__layer_is(&net->layers[taker], DSRT_LAYER_F_SUM) &&
           net->layers[taker].n_inputs == 2;
}

/* The deferred forward: the statistics, and the factors the add takes. */
static int step_bn_stats(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    bn_own *o = own_of(p, i);
    float *mean = dsrt__cpu_handle(o->mean), *var = dsrt__cpu_handle(o->var);
    dsrt__cpu_stats(be, &o->v, dsrt__cpu_handle(p->lp[i].src), o->part, mean, var);
    const float *scale = net->params + l->w_off, *shift = net->params + l->b_off;
    float *m = o->factors, *a = m + o->v.blocks * o->v.inner, *b = a + o->v.blocks * o->v.inner;
    for (int c = 0; c < l->out.c; c++) {
        m[c] = mean[c];
        a[c] = scale[c] / sqrtf(var[c] + l->o.eps);
        b[c] = shift[c];
    }
    return 0;
}

/* The output, written where a reader other than the add needs it. */
static void write_out(cpu_backend *be, cpu_plan *p, int i) {
    const layer_plan *lp = &p->lp[i];
    cpu_affine a = dsrt__cpu_deferred(lp);
    dsrt__cpu_affine_sum(be, lp->defer_v, 1, &a, dsrt__cpu_handle(lp->out.mem), 0, 0.0f);
}

static int plan_defer(cpu_plan *p, int i, bn_own *o) {
    size_t cp = o->v.blocks * o->v.inner;
    if (!(o->factors = dsrt__calloc(3 * cp, sizeof *o->factors)) ||
        !(o->part = dsrt__calloc(o->v.n * cp * 2, sizeof *o->part)))
        return -ENOMEM;
    o->norm = (cpu_affine){NULL, o->factors, o->factors + cp, o->factors + 2 * cp};
    p->lp[i].defer = &o->norm;
    p->lp[i].defer_v = &o->v;
    p->lp[i].write_out = write_out;
    return dsrt__cpu_c_step(p, 0, step_bn_stats, i);
}

static int plan_batchnorm(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    int c = L->out.c, rc;
    dnnl_dims_t cdims = {c};
    dnnl_memory_desc_t c_md;
    if (dsrt__cpu_md_plain(&c_md, 1, cdims))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "batchnorm", L);
    bn_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    lp->own = o;
    lp->own_free = own_free;
    unsigned flags = dnnl_use_scale | dnnl_use_shift | (L->fuse_relu ? dnnl_fuse_norm_relu : 0);
    /* Synchronised: the statistics come from every worker (step_bn_sync_*),
     * the primitive takes them as given, and the data is plain NCHW so that
     * the C steps can walk it. */
    int sync = p->train && p->bn_sync;
    if (!p->train || sync) flags |= dnnl_use_global_stats;
    /* oneDNN 2.6 normalises NHWC with channels off the block only in a slow
     * generic kernel: such inputs are reordered to the blocked layout. */
    dnnl_memory_desc_t data_md = in->md;
    if (sync && dsrt__cpu_md_plain_like(&data_md, &in->md))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "batchnorm", L);
    if (sync && !(own_of(p, i)->sums = dsrt__calloc((size_t)2 * c + 1, sizeof *own_of(p, i)->sums)))
        return -ENOMEM;
    if (!sync && in->md.ndims == 4 && dsrt__cpu_md_is(&in->md, dnnl_acdb) && c % be->block != 0)
        DN("batchnorm layout",
           dnnl_memory_desc_init_by_tag(&data_md, 4, in->md.dims, dnnl_f32,
                                        be->block == 16 ? dnnl_aBcd16b : dnnl_aBcd8b));
    if ((rc = dsrt__cpu_ensure(p, be, in->mem, &data_md, 0, i, &lp->src, L))) return rc;
    dnnl_batch_normalization_desc_t fd;
    dnnl_primitive_desc_t fpd;
    DN("batchnorm", dnnl_batch_normalization_forward_desc_init(
                        &fd, p->train ? dnnl_forward_training : dnnl_forward_inference, &data_md,
                        L->o.eps, flags));
    if ((rc = dsrt__cpu_pd(&fpd, &fd, be, 0, 0, NULL, "batchnorm", L))) return rc;
    dnnl_memory_t scale, shift, ws = NULL;
    step *s;
    rc = dsrt__cpu_mem(p, &c_md, be->engine, net->params + L->w_off, &scale, L);
    if (!rc) rc = dsrt__cpu_mem(p, &c_md, be->engine, net->params + L->b_off, &shift, L);
    float *rstats = net->state + L->s_off;
    if (!rc)
        rc = dsrt__cpu_mem(p, &c_md, be->engine, p->train ? NULL : rstats, &own_of(p, i)->mean, L);
    if (!rc)
        rc = dsrt__cpu_mem(p, &c_md, be->engine, p->train ? NULL : rstats + c, &own_of(p, i)->var,
                           L);
    if (!rc)
        rc = dsrt__cpu_output(be, p, i, dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0));
    const dnnl_memory_desc_t *wsmd = dnnl_primitive_desc_query_md(fpd, dnnl_query_workspace_md, 0);
    if (!rc && wsmd && dnnl_memory_desc_get_size(wsmd))
        rc = dsrt__cpu_mem(p, wsmd, be->engine, NULL, &ws, L);
    if (!rc && sync) rc = dsrt__cpu_c_step(p, 0, step_bn_sync_fwd, i);
    if (!rc && defer_to(be, p, i, &lp->out.md, &o->v) &&
        dnnl_memory_desc_equal(&lp->out.md, &data_md)) {
        if ((rc = plan_defer(p, i, o))) goto out;
    } else if (!rc) {
        if ((rc = dsrt__cpu_prim_step(p, be, fpd, 0, i, &s, L))) goto out;
        dsrt__cpu_arg(s, DNNL_ARG_SRC, lp->src);
        dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
        dsrt__cpu_arg(s, DNNL_ARG_SCALE, scale);
        dsrt__cpu_arg(s, DNNL_ARG_SHIFT, shift);
        dsrt__cpu_arg(s, DNNL_ARG_MEAN, own_of(p, i)->mean);
        dsrt__cpu_arg(s, DNNL_ARG_VARIANCE, own_of(p, i)->var);
        dsrt__cpu_arg(s, DNNL_ARG_WORKSPACE, ws);
    }
    if (rc) goto out;
    if (!p->train) goto out;
    if ((rc = dsrt__cpu_c_step(p, 0, step_bn_running, i))) goto out;

    /* Backward: gradients of scale, shift and (always computed) input. */
    {
        dnnl_batch_normalization_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_batch_normalization_backward_desc_init(
            &bd, dnnl_backward, &lp->out.md, &data_md, L->o.eps, flags);
        if (st != dnnl_success) {
            rc = dsrt__cpu_fail(st, "batchnorm backward", L);
            goto out;
        }
        if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, "batchnorm backward", L))) goto out;
        dnnl_memory_t dscale, dshift, dsrc = NULL, dsrc_tmp = NULL, tgt = NULL, acc = NULL;
        rc = dsrt__cpu_mem(p, &c_md, be->engine, net->grads + L->w_off, &dscale, L);
        if (!rc) rc = dsrt__cpu_mem(p, &c_md, be->engine, net->grads + L->b_off, &dshift, L);
        if (!rc && in->diff) rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc);
        if (!rc && in->diff)
            rc = dsrt__cpu_deliver(p, be, tgt, &data_md, &dsrc, &dsrc_tmp, L);
        else if (!rc)
            rc = dsrt__cpu_mem(p, &data_md, be->engine, NULL, &dsrc, L);
        if (!rc) rc = dsrt__cpu_prim_step(p, be, bpd, 1, i, &s, L);
        dnnl_primitive_desc_destroy(bpd);
        if (rc) goto out;
        dsrt__cpu_arg(s, DNNL_ARG_SRC, lp->src);
        dsrt__cpu_arg(s, DNNL_ARG_MEAN, own_of(p, i)->mean);
        dsrt__cpu_arg(s, DNNL_ARG_VARIANCE, own_of(p, i)->var);
        dsrt__cpu_arg(s, DNNL_ARG_DIFF_DST, lp->out.diff);
        dsrt__cpu_arg(s, DNNL_ARG_SCALE, scale);
        dsrt__cpu_arg(s, DNNL_ARG_SHIFT, shift);
        dsrt__cpu_arg(s, DNNL_ARG_WORKSPACE, ws);
        dsrt__cpu_arg(s, DNNL_ARG_DIFF_SRC, dsrc);
        dsrt__cpu_arg(s, DNNL_ARG_DIFF_SCALE, dscale);
        dsrt__cpu_arg(s, DNNL_ARG_DIFF_SHIFT, dshift);
        /* Without a gradient to pass down there is nothing to correct. */
        own_of(p, i)->dsrc = dsrc;
        if (sync && in->diff && (rc = dsrt__cpu_c_step(p, 1, step_bn_sync_bwd, i))) goto out;
        if (dsrc_tmp &&
            (rc = dsrt__cpu_reorder_step(p, be, dsrc_tmp, tgt, 1, i, STEP_ALWAYS, NULL, L)))
            goto out;
        if ((rc = dsrt__cpu_grad_add(be, p, i, in->diff, acc))) goto out;
        rc = dsrt__cpu_ready_step(p, i);
    }
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

static void bn_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    dsrt__onnx_attr_float(w, "epsilon", l->o.eps);
    dsrt__onnx_attr_float(w, "momentum", 1.0f - l->o.momentum);
}

/* BatchNormalization in inference form, with the running statistics. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    const float *params = e->net->params, *state = e->net->state;
    int j = l->inputs[0];
    int64_t dims[1] = {l->out.c};
    const char *what[4] = {"scale", "bias", "mean", "var"};
    const float *src[4] = {params + l->w_off, params + l->b_off, state + l->s_off,
                           state + l->s_off + l->out.c};
    char names[4][DSRT_LAYER_NAME_MAX + 32];
    const char *in[5] = {e->value[j], names[0], names[1], names[2], names[3]};
    for (int k = 0; k < 4; k++) {
        dsrt__onnx_aux_name(names[k], sizeof names[k], l, what[k]);
        dsrt__onnx_floats(e, names[k], dims, 1, src[k]);
    }
    dsrt__onnx_node(e, "BatchNormalization", l->name, in, 5, out, bn_attrs, l, NULL);
    e->rank[i] = e->rank[j];
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

static int map_batchnorm(onnx_import *c) {
    onnx_val *x = dsrt__onnx_data_input(c, 0, "first");
    if (!x) return c->err;
    if (x->flat && !dsrt__onnx_flat_is_channels(c, x))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "its input '%s' is a flattened image: dsrt normalises "
                               "channels",
                               ONNX_SHOWN(x->name));
    for (int k = 1; k < c->cur->n_out; k++)
        if (dsrt__onnx_output_used(c, k))
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "its training outputs (running mean and variance) "
                                   "are used: dsrt imports the inference form");
    onnx_tensor *t[4];
    static const char *const what[4] = {"scale", "bias (B)", "mean", "variance"};
    dsrt_shape s = dsrt__onnx_shape_of(c, x);
    for (int k = 0; k < 4; k++) {
        if (!(t[k] = dsrt__onnx_const_input(c, k + 1, what[k]))) return c->err;
        if (t[k]->count != (uint64_t)s.c || t[k]->ndims != 1)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "its %s '%s' has %llu values for %d channels",
                                   what[k], ONNX_SHOWN(t[k]->name), (unsigned long long)t[k]->count,
                                   s.c);
    }
    float eps, mom;
    int64_t spatial, training;
    int rc;
    if ((rc = dsrt__onnx_get_float(c, "epsilon", 1e-5f, &eps)) ||
        (rc = dsrt__onnx_get_float(c, "momentum", 0.9f, &mom)) ||
        (rc = dsrt__onnx_get_int(c, "spatial", 1, &spatial)) ||
        (rc = dsrt__onnx_get_int(c, "training_mode", 0, &training)))
        return rc;
    if (!spatial) return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "spatial=0: statistics per pixel");
    if (training)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "training_mode=1: dsrt imports the inference form");
    if (eps < 1e-12f || eps > 1)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "epsilon %g: dsrt's is 1e-12 to 1",
                               (double)eps);
    if (mom < 0 || mom > 1) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "momentum %g", (double)mom);
    onnx_layer *l = dsrt__onnx_add_layer(c, "batchnorm", &x, 1);
    if (!l) return c->err;
    /* ONNX keeps m of the running value; dsrt takes momentum of the batch. */
    dsrt__onnx_opt(l, " eps=%.9g momentum=%.9g", (double)eps, (double)(1.0f - mom));
    l->w = t[0];
    l->b = t[1];
    l->s[0] = t[2];
    l->s[1] = t[3];
    l->n_s = 2;
    l->s_nonneg = 2; /* the variance */
    l->out = s;
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"BatchNormalization", map_batchnorm, "epsilon,momentum,spatial,training_mode", 0},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

/* At inference y = (x - mean) / sqrt(var + eps) scale + offset: x s + (offset - mean s),
 * s = scale / sqrt(var + eps), from the running statistics. */
static int infer_affine(const dsrt_layer *l, const float *params, const float *state, float *scale,
                        float *shift) {
    const float *g = params + l->w_off, *b = params + l->b_off, *mean = state + l->s_off,
                *var = mean + l->out.c;
    for (int c = 0; c < l->out.c; c++) {
        scale[c] = g[c] / sqrtf(var[c] + l->o.eps);
        shift[c] = b[c] - mean[c] * scale[c];
    }
    return 1;
}

const dsrt_layer_ops dsrt__layer_batchnorm = {
    .name = "batchnorm",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = DSRT_LAYER_F_TAKES_RELU_PLAIN,
    .build = build,
    .init = init,
    .cpu_plan = plan_batchnorm,
    .infer_affine = infer_affine,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=4x4x3\nconv filters=3 size=1 bias=0\nbatchnorm\nfc outputs=3\nsoftmax\n",
};

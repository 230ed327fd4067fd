/*
 * lrn {crossChannelNormalizationLayer}: local response normalisation
 * across channels (AlexNet's), a window of `size` channels centred on each:
 * y = x / (k + alpha/size * sum of x^2 over the window)^beta.
 *
 *   size= [5]  alpha= [1e-4]  beta= [0.75]  k= [2]
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    {"size", OPT_INT, "5", DSRT_O(lrn_size), 0, 1, 1 << 12, NULL},
    {"alpha", OPT_FLOAT, "1e-4", DSRT_O(alpha), 0, 0, 1e6, NULL},
    {"beta", OPT_FLOAT, "0.75", DSRT_O(beta), 0, 0, 1e6, NULL},
    {"k", OPT_FLOAT, "2", DSRT_O(k), 0, 1e-12, 1e6, NULL},
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"lrn", OPTS, "cross-channel (local response) normalization"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    if (l->o.lrn_size % 2 == 0)
        return dsrt__fail(DSRT_EOPTION, "lrn: option 'size': %d is even; the window is centred",
                          l->o.lrn_size);
    l->out = *in;
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

static dnnl_status_t lrn_backward(dsrt_cpu_op_desc *bd, const dsrt_layer *L,
                                  const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst) {
    return dnnl_lrn_backward_desc_init(&bd->lrn, dnnl_lrn_across_channels, dst, src, L->o.lrn_size,
                                       L->o.alpha, L->o.beta, L->o.k);
}

static int plan_lrn(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dsrt_cpu_op_desc fd;
    DN("lrn", dnnl_lrn_forward_desc_init(
                  &fd.lrn, p->train ? dnnl_forward_training : dnnl_forward_inference,
                  dnnl_lrn_across_channels, &in->md, L->o.lrn_size, L->o.alpha, L->o.beta, L->o.k));
    static const dsrt_cpu_one_backward b = {"lrn", lrn_backward, 1, 0};
    return dsrt__cpu_one_primitive(be, p, i, &fd, &b);
}

// ----------------------------------------------------------------------------
// ONNX export

static void lrn_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    dsrt__onnx_attr_int(w, "size", l->o.lrn_size);
    dsrt__onnx_attr_float(w, "alpha", l->o.alpha);
    dsrt__onnx_attr_float(w, "beta", l->o.beta);
    dsrt__onnx_attr_float(w, "bias", l->o.k);
}

static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    char x0[DSRT_LAYER_NAME_MAX + 32];
    const char *in[1] = {dsrt__onnx_as_rank(e, l, l->inputs[0], 4, x0, sizeof x0)};
    dsrt__onnx_node(e, "LRN", l->name, in, 1, out, lrn_attrs, l, NULL);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

static int map_lrn(onnx_import *c) {
    onnx_val *x = dsrt__onnx_image_input(c);
    if (!x) return c->err;
    float alpha, beta, bias;
    int64_t size;
    int rc;
    if ((rc = dsrt__onnx_get_float(c, "alpha", 1e-4f, &alpha)) ||
        (rc = dsrt__onnx_get_float(c, "beta", 0.75f, &beta)) ||
        (rc = dsrt__onnx_get_float(c, "bias", 1.0f, &bias)) ||
        (rc = dsrt__onnx_get_int(c, "size", 0, &size)))
        return rc;
    if (!dsrt__onnx_get_attr(c, "size"))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute 'size' is required");
    if (size < 1 || size > 4096 || size % 2 == 0)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "size %lld: dsrt's window is odd (centred)",
                               (long long)size);
    onnx_layer *l = dsrt__onnx_add_layer(c, "lrn", &x, 1);
    if (!l) return c->err;
    dsrt__onnx_opt(l, " size=%lld alpha=%.9g beta=%.9g k=%.9g", (long long)size, (double)alpha,
                   (double)beta, (double)bias);
    l->out = dsrt__onnx_shape_of(c, x);
    dsrt__onnx_produce(c, l, 0);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"LRN", map_lrn, "alpha,beta,bias,size", 0},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_lrn = {
    .name = "lrn",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_lrn,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=4x4x2\nconv filters=6 size=1\nlrn size=3 alpha=0.5 beta=0.75 k=2\nfc "
               "outputs=3\nsoftmax\n",
};

/*
 * relu {reluLayer}, leakyrelu {leakyReluLayer}: max(x, leak x). The layer
 * whose output it takes computes it instead when it can (a convolution or
 * fully connected layer's post-op, batchnorm's flag, an add's sum) and it
 * is that output's only taker: the ReLU then passes its input through.
 *
 *   relu: leak= [0]   leakyrelu: leak= [0.01]  (slope for negative inputs)
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS_RELU[] = {
    {"leak", OPT_FLOAT, "0", DSRT_O(leak), 0, 0, 1e6, NULL},
    DSRT_OPT_END,
};

static const dsrt_opt_spec OPTS_LEAKY[] = {
    {"leak", OPT_FLOAT, "0.01", DSRT_O(leak), 0, 0, 1e6, NULL},
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"relu", OPTS_RELU, "rectified linear unit"},
    {"leakyrelu", OPTS_LEAKY, "leaky ReLU"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

static dnnl_status_t relu_backward(dsrt_cpu_op_desc *bd, const dsrt_layer *L,
                                   const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst) {
    return dnnl_eltwise_backward_desc_init(&bd->eltwise, dnnl_eltwise_relu_use_dst_for_bwd, src,
                                           dst, L->o.leak, 0);
}

static int plan_relu(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    if (L->fused_away) {
        p->lp[i].out = *in;
        return 0;
    }
    dsrt_cpu_op_desc fd;
    DN("relu", dnnl_eltwise_forward_desc_init(
                   &fd.eltwise, p->train ? dnnl_forward_training : dnnl_forward_inference,
                   dnnl_eltwise_relu_use_dst_for_bwd, &in->md, L->o.leak, 0));
    static const dsrt_cpu_one_backward b = {"relu", relu_backward, 0, 1};
    return dsrt__cpu_one_primitive(be, p, i, &fd, &b);
}

// ----------------------------------------------------------------------------
// ONNX export

static void leaky_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    dsrt__onnx_attr_float(w, "alpha", l->o.leak);
}

static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    int j = l->inputs[0];
    const char *in[1] = {e->value[j]};
    if (l->o.leak != 0.0f)
        dsrt__onnx_node(e, "LeakyRelu", l->name, in, 1, out, leaky_attrs, l, NULL);
    else
        dsrt__onnx_node(e, "Relu", l->name, in, 1, out, NULL, l, NULL);
    e->rank[i] = e->rank[j];
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

static int map_relu(onnx_import *c) {
    onnx_val *x = dsrt__onnx_data_input(c, 0, "first");
    if (!x) return c->err;
    int leaky = onnx_is(c->cur->op, "LeakyRelu");
    float alpha = 0.01f;
    int rc;
    if (leaky && (rc = dsrt__onnx_get_float(c, "alpha", 0.01f, &alpha))) return rc;
    if (leaky && (alpha < 0 || alpha > 1e6))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "alpha %g: dsrt's slope is 0 to 1e6",
                               (double)alpha);
    onnx_layer *l = dsrt__onnx_add_layer(c, leaky ? "leakyrelu" : "relu", &x, 1);
    if (!l) return c->err;
    if (leaky) dsrt__onnx_opt(l, " leak=%.9g", (double)alpha);
    l->out = dsrt__onnx_shape_of(c, x);
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Relu", map_relu, "", ONNX_OP_ELEMENTWISE},
    {"LeakyRelu", map_relu, "alpha", ONNX_OP_ELEMENTWISE},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

static int infer_act(const dsrt_layer *l, dsrt_act *act) {
    *act = (dsrt_act){DSRT_ACT_RELU, l->o.leak, 0.0f};
    return 1;
}

const dsrt_layer_ops dsrt__layer_relu = {
    .name = "relu",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = DSRT_LAYER_F_RELU,
    .build = build,
    .cpu_plan = plan_relu,
    .infer_act = infer_act,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=5x5x2\nconv filters=4 size=3 pad=1\nleakyrelu leak=0.1\nconv filters=3 "
               "size=1\nrelu\nfc outputs=3\nsoftmax\n",
};

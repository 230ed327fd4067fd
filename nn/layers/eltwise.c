/*
 * Activations, element by element, one kind each, computing what PyTorch's
 * modules of the same name compute:
 *
 *   clip {clippedReluLayer}: min(max(x, min), max)   min= max= [the float range: no bound]
 *   relu6: clip with min=0 max=6 (torchvision's ReLU6: MobileNetV2)
 *   sigmoid {sigmoidLayer}: 1 / (1 + e^-x)
 *   hardsigmoid: max(0, min(1, alpha x + beta))      alpha= [1/6] beta= [0.5] (PyTorch's)
 *   hardswish: x relu6(x + 3) / 6 (MobileNetV3)
 *   silu, swish {swishLayer}: x sigmoid(x)
 *   gelu {geluLayer}: x Phi(x)                       approximate=none|tanh [none]
 *
 * Where a function has a kink the gradient there is PyTorch's: 0 at clip's
 * bounds and where hardsigmoid reaches 0 or 1 (Hardtanh's and
 * Hardsigmoid's backward), x / 3 + 1/2 at hardswish's -3 and 3.
 *
 * On the CPU each is oneDNN's eltwise primitive both ways (clip_v2, whose
 * backward is Hardtanh's; logistic; swish; gelu_erf and gelu_tanh), which
 * keep the padded channels of blocked layouts zero; hardsigmoid is linear
 * then clip_v2, in place, and back; hardswish's backward is a step of its
 * own, since oneDNN's takes 0 and 1 at -3 and 3 (its forward, x / 6 relu6(x
 * + 3), is PyTorch's to rounding). On the GPU dsrt's activation kernels
 * (nn/layers/eltwise_kernels.h dsrt_k_act). nn/layers/eltwise.h has their
 * options.
 *
 * ONNX: Clip (min and max attributes before opset 11, optional constant
 * inputs from it; neither: the identity; 0 and 6: relu6), Sigmoid,
 * HardSigmoid (alpha, beta: ONNX's alpha is 0.2, so both are always
 * written), HardSwish (opset 14; before it HardSigmoid and Mul), Gelu
 * (opset 20; before it the Erf or Tanh expansion); silu is written as
 * Sigmoid and Mul. The import reads x * Sigmoid(x) back as silu, x *
 * HardSigmoid(x) (PyTorch's 1/6 and 1/2) as hardswish and the Erf
 * expansion as gelu (onnx_rewrite.c); the Tanh expansion stays other
 * layers.
 */
#include "nn/layers/eltwise.h"
#include "nn/backend_cpu.h"
#include "nn/onnx.h"
#include "nn/protobuf.h"

#include <float.h>

#define NO_MIN "-3.4028234e38" /* the float nearest: -FLT_MAX */
#define NO_MAX "3.4028234e38"

#define ACT_OPT(f) DSRT_OWN_OPT(dsrt_act_opts, f)

static const dsrt_opt_spec OPTS_CLIP[] = {
    {"min", OPT_FLOAT, NO_MIN, ACT_OPT(min), 0, -FLT_MAX, FLT_MAX, NULL},
    {"max", OPT_FLOAT, NO_MAX, ACT_OPT(max), 0, -FLT_MAX, FLT_MAX, NULL},
    DSRT_OPT_END,
};

static const dsrt_opt_spec OPTS_RELU6[] = {
    {"min", OPT_FLOAT, "0", ACT_OPT(min), 0, -FLT_MAX, FLT_MAX, NULL},
    {"max", OPT_FLOAT, "6", ACT_OPT(max), 0, -FLT_MAX, FLT_MAX, NULL},
    DSRT_OPT_END,
};

static const dsrt_opt_spec OPTS_HARDSIGMOID[] = {
    {"alpha", OPT_FLOAT, "0.166666667", ACT_OPT(alpha), 0, -1e6, 1e6, NULL},
    {"beta", OPT_FLOAT, "0.5", ACT_OPT(beta), 0, -1e6, 1e6, NULL},
    DSRT_OPT_END,
};

static const dsrt_opt_spec OPTS_GELU[] = {
    {"approximate", OPT_ENUM, "none", ACT_OPT(approximate), 0, 0, 0, "none|tanh"},
    DSRT_OPT_END,
};

static const dsrt_opt_spec OPTS_NONE[] = {DSRT_OPT_END};

static const dsrt_layer_type TYPES_CLIP[] = {
    {"clip", OPTS_CLIP, "clipped activation min(max(x, min), max)"},
    {"relu6", OPTS_RELU6, "ReLU6: clip to [0, 6]"},
    {NULL, NULL, NULL},
};

static const dsrt_layer_type TYPES_SIGMOID[] = {
    {"sigmoid", OPTS_NONE, "logistic sigmoid"},
    {NULL, NULL, NULL},
};

static const dsrt_layer_type TYPES_HARDSIGMOID[] = {
    {"hardsigmoid", OPTS_HARDSIGMOID, "hard sigmoid max(0, min(1, alpha x + beta))"},
    {NULL, NULL, NULL},
};

static const dsrt_layer_type TYPES_HARDSWISH[] = {
    {"hardswish", OPTS_NONE, "hard swish x relu6(x + 3) / 6"},
    {NULL, NULL, NULL},
};

static const dsrt_layer_type TYPES_SILU[] = {
    {"silu", OPTS_NONE, "SiLU (swish) x sigmoid(x)"},
    {"swish", OPTS_NONE, "SiLU (swish) x sigmoid(x)"},
    {NULL, NULL, NULL},
};

static const dsrt_layer_type TYPES_GELU[] = {
    {"gelu", OPTS_GELU, "Gaussian error linear unit x Phi(x) (approximate=tanh: its tanh form)"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    const dsrt_act_opts *o = dsrt__act_opts(l);
    if (l->kind == DSRT_LAYER_CLIP && o->min > o->max)
        return dsrt__fail(DSRT_EOPTION, "min=%g is above max=%g", (double)o->min, (double)o->max);
    l->out = *in;
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

/* oneDNN's algorithm for layer L (hardsigmoid: its first, linear), its
 * alpha and beta, and whether its backward reads the output. */
static dnnl_alg_kind_t cpu_alg(const dsrt_layer *L, float *a, float *b, int *use_dst) {
    const dsrt_act_opts *o = dsrt__act_opts(L);
    *a = *b = 0.0f;
    *use_dst = 0;
    switch (L->kind) {
    case DSRT_LAYER_CLIP:
        *a = o->min, *b = o->max;
        return dnnl_eltwise_clip_v2;
    case DSRT_LAYER_SIGMOID:
        *use_dst = 1;
        return dnnl_eltwise_logistic_use_dst_for_bwd;
    case DSRT_LAYER_HARDSIGMOID:
        *a = o->alpha, *b = o->beta;
        return dnnl_eltwise_linear;
    case DSRT_LAYER_HARDSWISH:
        return dnnl_eltwise_hardswish;
    case DSRT_LAYER_SILU:
        *a = 1.0f;
        return dnnl_eltwise_swish;
    default: /* DSRT_LAYER_GELU */
        return o->approximate ? dnnl_eltwise_gelu_tanh : dnnl_eltwise_gelu_erf;
    }
}

static dnnl_status_t act_backward(dsrt_cpu_op_desc *bd, const dsrt_layer *L,
                                  const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst) {
    float a, b;
    int use_dst;
    dnnl_alg_kind_t alg = cpu_alg(L, &a, &b, &use_dst);
    return dnnl_eltwise_backward_desc_init(&bd->eltwise, alg, dst, use_dst ? dst : src, a, b);
}

/* clip, sigmoid, silu, gelu: one primitive each way. */
static int plan_act(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    float a, b;
    int use_dst;
    dnnl_alg_kind_t alg = cpu_alg(L, &a, &b, &use_dst);
    dsrt_cpu_op_desc fd;
    DN(L->type, dnnl_eltwise_forward_desc_init(
                    &fd.eltwise, p->train ? dnnl_forward_training : dnnl_forward_inference, alg,
                    &in->md, a, b));
    const dsrt_cpu_one_backward bw = {L->type, act_backward, !use_dst, use_dst};
    return dsrt__cpu_one_primitive(be, p, i, &fd, &bw);
}

/* An eltwise primitive of L's, alg (a, b), over md: forward (hint NULL),
 * or backward with the forward's pd as hint. The caller destroys *pd. */
static int eltwise_pd(cpu_backend *be, const dsrt_layer *L, int train, dnnl_alg_kind_t alg,
                      const dnnl_memory_desc_t *md, float a, float b,
                      const_dnnl_primitive_desc_t hint, const char *what,
                      dnnl_primitive_desc_t *pd) {
    dsrt_cpu_op_desc d;
    dnnl_status_t st = hint
                           ? dnnl_eltwise_backward_desc_init(&d.eltwise, alg, md, md, a, b)
                           : dnnl_eltwise_forward_desc_init(
                                 &d.eltwise, train ? dnnl_forward_training : dnnl_forward_inference,
                                 alg, md, a, b);
    if (st != dnnl_success) return dsrt__cpu_fail(st, what, L);
    return dsrt__cpu_pd(pd, &d, be, 0, 0, hint, what, L);
}

/* A step of pd's primitive with its arguments (what, memory pairs, n). */
static int eltwise_step(cpu_backend *be, cpu_plan *p, int i, int backward,
                        const_dnnl_primitive_desc_t pd, const int *what, const dnnl_memory_t *mem,
                        int n) {
    step *s;
    int rc = dsrt__cpu_prim_step(p, be, pd, backward, i, &s, &be->net->layers[i]);
    if (rc) return rc;
    for (int k = 0; k < n; k++) dsrt__cpu_arg(s, what[k], mem[k]);
    return 0;
}

/* hardsigmoid: y = alpha x + beta (linear), then clipped to [0, 1] in place
 * (clip_v2, its backward reading y: 0 where y is 0 or 1); backward the
 * clip's into the input's gradient, then the linear's (alpha dy) in place. */
static int plan_hardsigmoid(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    const dsrt_act_opts *o = dsrt__act_opts(L);
    const dnnl_alg_kind_t clip = dnnl_eltwise_clip_v2_use_dst_for_bwd;
    dnnl_primitive_desc_t lin = NULL, cl = NULL, blin = NULL, bcl = NULL;
    int rc = eltwise_pd(be, L, p->train, dnnl_eltwise_linear, &in->md, o->alpha, o->beta, NULL,
                        "hardsigmoid", &lin);
    if (!rc)
        rc = dsrt__cpu_output(be, p, i, dnnl_primitive_desc_query_md(lin, dnnl_query_dst_md, 0));
    if (!rc) rc = eltwise_pd(be, L, p->train, clip, &lp->out.md, 0, 1, NULL, "hardsigmoid", &cl);
    if (!rc)
        rc = eltwise_step(be, p, i, 0, lin, (const int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                          (const dnnl_memory_t[]){in->mem, lp->out.mem}, 2);
    if (!rc)
        rc = eltwise_step(be, p, i, 0, cl, (const int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                          (const dnnl_memory_t[]){lp->out.mem, lp->out.mem}, 2);
    if (rc || !p->train || !dsrt__net_need_diff(be->net, L->inputs[0])) goto out;
    dnnl_memory_t tgt = NULL, acc = NULL;
    rc = eltwise_pd(be, L, 1, clip, &lp->out.md, 0, 1, cl, "hardsigmoid backward", &bcl);
    if (!rc)
        rc = eltwise_pd(be, L, 1, dnnl_eltwise_linear, &in->md, o->alpha, o->beta, lin,
                        "hardsigmoid backward", &blin);
    if (!rc) rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc);
    if (!rc)
        rc = eltwise_step(be, p, i, 1, bcl,
                          (const int[]){DNNL_ARG_DST, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC},
                          (const dnnl_memory_t[]){lp->out.mem, lp->out.diff, tgt}, 3);
    if (!rc)
        rc = eltwise_step(be, p, i, 1, blin,
                          (const int[]){DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC},
                          (const dnnl_memory_t[]){in->mem, tgt, tgt}, 3);
    if (!rc) rc = dsrt__cpu_grad_add(be, p, i, in->diff, acc);
out:
    dnnl_primitive_desc_destroy(bcl);
    dnnl_primitive_desc_destroy(blin);
    dnnl_primitive_desc_destroy(cl);
    dnnl_primitive_desc_destroy(lin);
    return rc;
}

/* What hardswish's backward step reads and writes: its input, its output's
 * gradient and the input's gradient (or the scratch it is summed from), of
 * one layout, n floats each (the padding of a blocked layout included). */
typedef struct {
    dnnl_memory_t x, dy, dx;
    size_t n;
} hardswish_own;

/* dx = dy times PyTorch's hardswish gradient: 0 below -3, x / 3 + 1/2 from
 * -3 to 3, 1 above (the padding, 0 in x and in dy, stays 0). */
static int step_hardswish_bwd(cpu_backend *be, cpu_plan *p, int i) {
    const hardswish_own *h = p->lp[i].own;
    const float *x = dsrt__cpu_handle(h->x), *dy = dsrt__cpu_handle(h->dy);
    float *dx = dsrt__cpu_handle(h->dx);
    for (size_t k = 0; k < h->n; k++) {
        float v = x[k];
        dx[k] = v < -3.0f ? 0.0f : v <= 3.0f ? dy[k] * (v / 3.0f + 0.5f) : dy[k];
    }
    return 0;
}

/* hardswish: oneDNN's forward, the backward step above. */
static int plan_hardswish(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dnnl_primitive_desc_t fpd = NULL;
    int rc =
        eltwise_pd(be, L, p->train, dnnl_eltwise_hardswish, &in->md, 0, 0, NULL, "hardswish", &fpd);
    if (!rc)
        rc = dsrt__cpu_output(be, p, i, dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0));
    if (!rc)
        rc = eltwise_step(be, p, i, 0, fpd, (const int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                          (const dnnl_memory_t[]){in->mem, lp->out.mem}, 2);
    dnnl_primitive_desc_destroy(fpd);
    if (rc || !p->train || !dsrt__net_need_diff(be->net, L->inputs[0])) return rc;
    dnnl_memory_t tgt = NULL, acc = NULL;
    if ((rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc))) return rc;
    /* The step walks the three buffers as one: they must share a layout. */
    if (!dnnl_memory_desc_equal(&lp->out.md, &in->md) ||
        !dnnl_memory_desc_equal(dsrt__cpu_md_of(tgt), &in->md))
        return dsrt__cpu_fail(dnnl_unimplemented, "hardswish backward", L);
    hardswish_own *h = dsrt__calloc(1, sizeof *h);
    if (!h) return -ENOMEM;
    lp->own = h;
    *h = (hardswish_own){in->mem, lp->out.diff, tgt, dnnl_memory_desc_get_size(&in->md) / 4};
    if ((rc = dsrt__cpu_c_step(p, 1, step_hardswish_bwd, i))) return rc;
    return dsrt__cpu_grad_add(be, p, i, in->diff, acc);
}

// ----------------------------------------------------------------------------
// ONNX export

/* Writes op (attrs, ctx) on layer j's output as layer l's output out. */
static void export_on(onnx_export *e, const char *op, const dsrt_layer *l, int i, const char *out,
                      dsrt_onnx_attrs_fn attrs, const void *ctx) {
    int j = l->inputs[0];
    const char *in[1] = {e->value[j]};
    dsrt__onnx_node(e, op, l->name, in, 1, out, attrs, l, ctx);
    e->rank[i] = e->rank[j];
}

/* An auxiliary node op on ins (n of them) into the value <layer>.<what>,
 * which is written into val (cap DSRT_ONNX_VALUE_MAX). */
static void aux_node(onnx_export *e, const dsrt_layer *l, const char *op, const char *what,
                     const char *const *ins, int n, char *val, dsrt_onnx_attrs_fn attrs,
                     const void *ctx) {
    dsrt__onnx_aux_name(val, DSRT_ONNX_VALUE_MAX, l, what);
    dsrt__onnx_node(e, op, val, ins, n, val, attrs, l, ctx);
}

/* A float scalar initializer <layer>.<what> of value v, its name in name. */
static void scalar(onnx_export *e, const dsrt_layer *l, const char *what, float v, char *name) {
    int64_t none[1] = {0};
    dsrt__onnx_aux_name(name, DSRT_ONNX_VALUE_MAX, l, what);
    dsrt__onnx_floats(e, name, none, 0, &v);
}

static void clip_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    const dsrt_act_opts *o = dsrt__act_opts(l);
    if (o->min > -FLT_MAX) dsrt__onnx_attr_float(w, "min", o->min);
    if (o->max < FLT_MAX) dsrt__onnx_attr_float(w, "max", o->max);
}

/* Clip: a bound that is the float range's is left out (ONNX's default). */
static int export_clip(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    const dsrt_act_opts *o = dsrt__act_opts(l);
    int j = l->inputs[0];
    if (e->opset < 11) {
        export_on(e, "Clip", l, i, out, clip_attrs, NULL);
        return 0;
    }
    char lo[DSRT_ONNX_VALUE_MAX] = "", hi[DSRT_ONNX_VALUE_MAX] = "";
    if (o->min > -FLT_MAX) scalar(e, l, "min", o->min, lo);
    if (o->max < FLT_MAX) scalar(e, l, "max", o->max, hi);
    const char *in[3] = {e->value[j], lo, hi};
    dsrt__onnx_node(e, "Clip", l->name, in, hi[0] ? 3 : lo[0] ? 2 : 1, out, NULL, l, NULL);
    e->rank[i] = e->rank[j];
    return 0;
}

static int export_sigmoid(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    export_on(e, "Sigmoid", l, i, out, NULL, NULL);
    return 0;
}

/* HardSigmoid's alpha and beta: ctx (two floats), or the layer's. */
static void hardsigmoid_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    const float *ab = ctx;
    const dsrt_act_opts *o = dsrt__act_opts(l);
    dsrt__onnx_attr_float(w, "alpha", ab ? ab[0] : o->alpha);
    dsrt__onnx_attr_float(w, "beta", ab ? ab[1] : o->beta);
}

static int export_hardsigmoid(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    export_on(e, "HardSigmoid", l, i, out, hardsigmoid_attrs, NULL);
    return 0;
}

/* x times gate(x): the gate (HardSigmoid with PyTorch's alpha and beta, or
 * Sigmoid) into <layer>.<gate>, then Mul. */
static void export_gated(onnx_export *e, const dsrt_layer *l, int i, char *out, int hard) {
    static const float pytorch[2] = {1.0f / 6.0f, 0.5f};
    int j = l->inputs[0];
    char g[DSRT_ONNX_VALUE_MAX];
    const char *x[1] = {e->value[j]};
    if (hard)
        aux_node(e, l, "HardSigmoid", "hardsigmoid", x, 1, g, hardsigmoid_attrs, pytorch);
    else
        aux_node(e, l, "Sigmoid", "sigmoid", x, 1, g, NULL, NULL);
    const char *in[2] = {e->value[j], g};
    dsrt__onnx_node(e, "Mul", l->name, in, 2, out, NULL, l, NULL);
    e->rank[i] = e->rank[j];
}

static int export_hardswish(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    if (e->opset >= 14)
        export_on(e, "HardSwish", l, i, out, NULL, NULL);
    else
        export_gated(e, l, i, out, 1);
    return 0;
}

static int export_silu(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    export_gated(e, l, i, out, 0);
    return 0;
}

static void gelu_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    size_t m = dsrt__pb_begin(w, 5); /* AttributeProto */
    dsrt__pb_put_string(w, 1, "approximate");
    dsrt__pb_put_varint(w, 20, 3); /* STRING */
    dsrt__pb_put_string(w, 4, dsrt__act_opts(l)->approximate ? "tanh" : "none");
    dsrt__pb_end(w, m);
}

/* Gelu from opset 20; before it, as PyTorch writes it:
 *   erf:  x (erf(x / sqrt 2) + 1) / 2
 *   tanh: x (tanh(sqrt(2 / pi) (x + 0.044715 x^3)) + 1) / 2 */
static int export_gelu(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    int tanh_form = dsrt__act_opts(l)->approximate;
    if (e->opset >= 20) {
        export_on(e, "Gelu", l, i, out, gelu_attrs, NULL);
        return 0;
    }
    if (!tanh_form && e->opset < 9)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "onnx export: layer '%s' (gelu) needs Erf: opset 9 or later", l->name);
    int j = l->inputs[0];
    const char *x = e->value[j];
    char one[DSRT_ONNX_VALUE_MAX], half[DSRT_ONNX_VALUE_MAX], c1[DSRT_ONNX_VALUE_MAX],
        c2[DSRT_ONNX_VALUE_MAX], t[DSRT_ONNX_VALUE_MAX], u[DSRT_ONNX_VALUE_MAX],
        v[DSRT_ONNX_VALUE_MAX];
    scalar(e, l, "one", 1.0f, one);
    scalar(e, l, "half", 0.5f, half);
    if (tanh_form) {
        scalar(e, l, "kappa", 0.044715f, c1);
        scalar(e, l, "sqrt_2_pi", 0.797884561f, c2);
        aux_node(e, l, "Mul", "square", (const char *[]){x, x}, 2, t, NULL, NULL);
        aux_node(e, l, "Mul", "cube", (const char *[]){t, x}, 2, u, NULL, NULL);
        aux_node(e, l, "Mul", "cube_kappa", (const char *[]){u, c1}, 2, v, NULL, NULL);
        aux_node(e, l, "Add", "inner_sum", (const char *[]){x, v}, 2, t, NULL, NULL);
        aux_node(e, l, "Mul", "inner", (const char *[]){t, c2}, 2, u, NULL, NULL);
        aux_node(e, l, "Tanh", "tanh", (const char *[]){u}, 1, v, NULL, NULL);
    } else {
        scalar(e, l, "sqrt2", 1.41421354f, c1);
        aux_node(e, l, "Div", "scaled", (const char *[]){x, c1}, 2, t, NULL, NULL);
        aux_node(e, l, "Erf", "erf", (const char *[]){t}, 1, v, NULL, NULL);
    }
    aux_node(e, l, "Add", "plus_one", (const char *[]){v, one}, 2, t, NULL, NULL);
    aux_node(e, l, "Mul", "times_x", (const char *[]){x, t}, 2, u, NULL, NULL);
    const char *in[2] = {u, half};
    dsrt__onnx_node(e, "Mul", l->name, in, 2, out, NULL, l, NULL);
    e->rank[i] = e->rank[j];
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

/* A layer of keyword type on the node's first input, its output the
 * node's (after the caller's options); NULL after a failure. */
static onnx_layer *act_layer(onnx_import *c, const char *type, onnx_val **x) {
    *x = dsrt__onnx_data_input(c, 0, "first");
    if (!*x) return NULL;
    onnx_layer *l = dsrt__onnx_add_layer(c, type, x, 1);
    if (l) l->out = dsrt__onnx_shape_of(c, *x);
    return l;
}

/* A bound of Clip from opset 11: input k, a constant scalar, if given
 * (infinite: none). */
static int clip_bound(onnx_import *c, int k, float *v) {
    if (!dsrt__onnx_has_input(c, k)) return 0;
    const onnx_tensor *t = dsrt__onnx_const_input(c, k, k == 1 ? "min" : "max");
    double d;
    int rc;
    if (!t) return c->err;
    if ((rc = dsrt__onnx_scalar(c, t, &d))) return rc;
    if (isnan(d)) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "its %s is NaN", k == 1 ? "min" : "max");
    *v = d < -FLT_MAX ? -FLT_MAX : d > FLT_MAX ? FLT_MAX : (float)d;
    return 0;
}

static int map_clip(onnx_import *c) {
    float lo = -FLT_MAX, hi = FLT_MAX;
    int rc;
    if (c->m.opset < 11) {
        if (dsrt__onnx_has_input(c, 1) || dsrt__onnx_has_input(c, 2))
            return dsrt__onnx_fail(c, DSRT_ECORRUPT,
                                   "min and max are inputs: before opset 11 they are attributes");
        if ((rc = dsrt__onnx_get_float(c, "min", -FLT_MAX, &lo)) ||
            (rc = dsrt__onnx_get_float(c, "max", FLT_MAX, &hi)))
            return rc;
    } else {
        if (dsrt__onnx_get_attr(c, "min") || dsrt__onnx_get_attr(c, "max"))
            return dsrt__onnx_fail(c, DSRT_ECORRUPT,
                                   "min and max are attributes: from opset 11 they are inputs");
        if ((rc = clip_bound(c, 1, &lo)) || (rc = clip_bound(c, 2, &hi))) return rc;
    }
    if (lo > hi)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "min %g is above max %g", (double)lo,
                               (double)hi);
    onnx_val *x;
    if (lo == -FLT_MAX && hi == FLT_MAX) { /* no bound: the identity */
        if (!(x = dsrt__onnx_data_input(c, 0, "first"))) return c->err;
        dsrt__onnx_alias(c, x, x->flat);
        return 0;
    }
    int relu6 = lo == 0.0f && hi == 6.0f;
    onnx_layer *l = act_layer(c, relu6 ? "relu6" : "clip", &x);
    if (!l) return c->err;
    if (!relu6 && lo > -FLT_MAX) dsrt__onnx_opt(l, " min=%.9g", (double)lo);
    if (!relu6 && hi < FLT_MAX) dsrt__onnx_opt(l, " max=%.9g", (double)hi);
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static int map_sigmoid(onnx_import *c) {
    onnx_val *x;
    onnx_layer *l = act_layer(c, "sigmoid", &x);
    if (!l) return c->err;
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static int map_hardsigmoid(onnx_import *c) {
    float alpha, beta;
    int rc;
    if ((rc = dsrt__onnx_get_float(c, "alpha", 0.2f, &alpha)) ||
        (rc = dsrt__onnx_get_float(c, "beta", 0.5f, &beta)))
        return rc;
    if (fabsf(alpha) > 1e6f || fabsf(beta) > 1e6f)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "alpha %g, beta %g: dsrt's are -1e6 to 1e6",
                               (double)alpha, (double)beta);
    onnx_val *x;
    onnx_layer *l = act_layer(c, "hardsigmoid", &x);
    if (!l) return c->err;
    dsrt__onnx_opt(l, " alpha=%.9g beta=%.9g", (double)alpha, (double)beta);
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static int map_hardswish(onnx_import *c) {
    onnx_val *x;
    onnx_layer *l = act_layer(c, "hardswish", &x);
    if (!l) return c->err;
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

/* SiLU: the rewrites make it of x * Sigmoid(x). */
static int map_silu(onnx_import *c) {
    onnx_val *x;
    onnx_layer *l = act_layer(c, "silu", &x);
    if (!l) return c->err;
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static int map_gelu(onnx_import *c) {
    char how[8];
    int rc = dsrt__onnx_get_string(c, "approximate", "none", how, sizeof how);
    if (rc) return rc;
    if (strcmp(how, "none") && strcmp(how, "tanh"))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "approximate '%s': ONNX's are none and tanh",
                               how);
    onnx_val *x;
    onnx_layer *l = act_layer(c, "gelu", &x);
    if (!l) return c->err;
    if (!strcmp(how, "tanh")) dsrt__onnx_opt(l, " approximate=tanh");
    dsrt__onnx_produce(c, l, x->flat);
    return 0;
}

static const dsrt_onnx_op ONNX_CLIP[] = {
    {"Clip", map_clip, "min,max", ONNX_OP_ELEMENTWISE},
    {NULL, NULL, NULL, 0},
};

static const dsrt_onnx_op ONNX_SIGMOID[] = {
    {"Sigmoid", map_sigmoid, "", ONNX_OP_ELEMENTWISE},
    {NULL, NULL, NULL, 0},
};

static const dsrt_onnx_op ONNX_HARDSIGMOID[] = {
    {"HardSigmoid", map_hardsigmoid, "alpha,beta", ONNX_OP_ELEMENTWISE},
    {NULL, NULL, NULL, 0},
};

static const dsrt_onnx_op ONNX_HARDSWISH[] = {
    {"HardSwish", map_hardswish, "", ONNX_OP_ELEMENTWISE},
    {NULL, NULL, NULL, 0},
};

/* ONNX has no SiLU: x * Sigmoid(x) is two nodes, read back as two layers. */
static const dsrt_onnx_op ONNX_SILU[] = {
    {"Silu", map_silu, "", ONNX_OP_ELEMENTWISE | ONNX_OP_MADE},
    {NULL, NULL, NULL, 0},
};

static const dsrt_onnx_op ONNX_GELU[] = {
    {"Gelu", map_gelu, "approximate", ONNX_OP_ELEMENTWISE},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

/* At inference, each kind's function for the layer before it to compute. */
static int infer_act(const dsrt_layer *l, dsrt_act *act) {
    const dsrt_act_opts *o = dsrt__act_opts(l);
    switch (l->kind) {
    case DSRT_LAYER_CLIP:
        *act = (dsrt_act){DSRT_ACT_CLIP, o->min, o->max};
        return 1;
    case DSRT_LAYER_SIGMOID:
        *act = (dsrt_act){DSRT_ACT_LOGISTIC, 0.0f, 0.0f};
        return 1;
    case DSRT_LAYER_HARDSIGMOID:
        *act = (dsrt_act){DSRT_ACT_HARDSIGMOID, o->alpha, o->beta};
        return 1;
    case DSRT_LAYER_HARDSWISH:
        *act = (dsrt_act){DSRT_ACT_HARDSWISH, 0.0f, 0.0f};
        return 1;
    case DSRT_LAYER_SILU:
        *act = (dsrt_act){DSRT_ACT_SWISH, 1.0f, 0.0f};
        return 1;
    case DSRT_LAYER_GELU:
        *act = (dsrt_act){o->approximate ? DSRT_ACT_GELU_TANH : DSRT_ACT_GELU_ERF, 0.0f, 0.0f};
        return 1;
    default:
        return 0;
    }
}

const dsrt_layer_ops dsrt__layer_clip = {
    .name = "clip",
    .types = TYPES_CLIP,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_act,
    .infer_act = infer_act,
    .onnx_export = export_clip,
    .onnx_ops = ONNX_CLIP,
    .example = "input size=5x5x2\nconv filters=4 size=3 pad=1\nrelu6\nconv filters=3 size=1\n"
               "clip min=-0.25 max=0.4\nfc outputs=3\nsoftmax\n",
};

const dsrt_layer_ops dsrt__layer_sigmoid = {
    .name = "sigmoid",
    .types = TYPES_SIGMOID,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_act,
    .infer_act = infer_act,
    .onnx_export = export_sigmoid,
    .onnx_ops = ONNX_SIGMOID,
    .example = "input size=5x5x2\nconv filters=4 size=1\nsigmoid\nfc outputs=3\nsoftmax\n",
};

const dsrt_layer_ops dsrt__layer_hardsigmoid = {
    .name = "hardsigmoid",
    .types = TYPES_HARDSIGMOID,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_hardsigmoid,
    .infer_act = infer_act,
    .onnx_export = export_hardsigmoid,
    .onnx_ops = ONNX_HARDSIGMOID,
    .example = "input size=5x5x2\nconv filters=4 size=1\nhardsigmoid\nconv filters=3 size=1\n"
               "hardsigmoid alpha=0.4 beta=0.3\nfc outputs=3\nsoftmax\n",
};

const dsrt_layer_ops dsrt__layer_hardswish = {
    .name = "hardswish",
    .types = TYPES_HARDSWISH,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_hardswish,
    .infer_act = infer_act,
    .onnx_export = export_hardswish,
    .onnx_ops = ONNX_HARDSWISH,
    .example = "input size=5x5x2\nconv filters=4 size=3 pad=1\nhardswish\nfc outputs=3\nsoftmax\n",
};

const dsrt_layer_ops dsrt__layer_silu = {
    .name = "silu",
    .types = TYPES_SILU,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_act,
    .infer_act = infer_act,
    .onnx_export = export_silu,
    .onnx_ops = ONNX_SILU,
    .example = "input size=5x5x2\nconv filters=4 size=1\nsilu\nfc outputs=3\nsoftmax\n",
};

const dsrt_layer_ops dsrt__layer_gelu = {
    .name = "gelu",
    .types = TYPES_GELU,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_act,
    .infer_act = infer_act,
    .onnx_export = export_gelu,
    .onnx_ops = ONNX_GELU,
    .onnx_round_trip = 20,
    .example = "input size=5x5x2\nconv filters=4 size=1\ngelu\nconv filters=3 size=1\n"
               "gelu approximate=tanh\nfc outputs=3\nsoftmax\n",
};

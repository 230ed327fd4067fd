/*
 * conv {convolution2dLayer, groupedConvolution2dLayer}: 2-D convolution of
 * filters x (in_c / groups) x kh x kw weights and an optional bias, with
 * stride, padding (explicit, or MATLAB's 'same': out = ceil(in / stride))
 * and dilation. It computes a ReLU that takes its output as its own.
 *
 *   filters=N (required)  size=K|KHxKW (required)  stride=S|SHxSW [1]
 *   pad=P|PHxPW|T,B,L,R|same [0]  dilation=D|DHxDW [1]  groups=G [1]
 *   bias=0|1 [1]  init=default|glorot|he|uniform [the net's]
 *   wlr= blr= [1] learn-rate factors; wl2= [1] bl2= [0] L2 factors
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    {"filters", OPT_INT, NULL, DSRT_O(filters), 0, 1, 1 << 20, NULL},
    {"size", OPT_PAIR, NULL, DSRT_O(kh), 0, 1, 1 << 12, NULL},
    {"stride", OPT_PAIR, "1", DSRT_O(sh), 0, 1, 1 << 12, NULL},
    {"pad", OPT_PAD, "0", DSRT_O(pt), DSRT_O(pad_same), 0, 1 << 12, NULL},
    {"dilation", OPT_PAIR, "1", DSRT_O(dh), 0, 1, 1 << 12, NULL},
    {"groups", OPT_INT, "1", DSRT_O(groups), 0, 1, 1 << 20, NULL},
    {"bias", OPT_BOOL, "1", DSRT_O(bias), 0, 0, 1, NULL},
    {"init", OPT_INIT, "default", DSRT_O(init), 0, 0, 0, NULL},
    DSRT_LR_OPTS("1", "0"),
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"conv", OPTS, "2-D convolution (grouped with groups > 1)"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    int g = l->o.groups;
    if (in->c % g || l->o.filters % g)
        return dsrt__fail(DSRT_EOPTION,
                          "conv: option 'groups': %d does not divide the %d input channels and "
                          "the %d filters",
                          g, in->c, l->o.filters);
    int rc = dsrt__layer_window(l, in, l->o.dh, l->o.dw);
    if (rc) return rc;
    l->out.c = l->o.filters;
    double wn = (double)l->o.filters * (in->c / g) * l->o.kh * l->o.kw;
    if ((rc = dsrt__layer_check_size(l, wn, "the weights"))) return rc;
    if ((rc = dsrt__layer_check_size(l, (double)l->out.c * l->out.h * l->out.w, "an output image")))
        return rc;
    l->w_n = (size_t)wn;
    l->b_n = l->o.bias ? (size_t)l->o.filters : 0;
    l->flops = 2.0 * wn * l->out.h * l->out.w;
    return 0;
}

static void init(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int net_init) {
    int how = l->o.init == DSRT_INIT_DEFAULT ? net_init : l->o.init;
    double k = (double)l->o.kh * l->o.kw;
    double fan_in = k * (l->in.c / l->o.groups), fan_out = k * (l->o.filters / l->o.groups);
    dsrt__layer_draw(params + l->w_off, l->w_n, how, fan_in, fan_out, rng);
    dsrt__layer_init_bias(params + l->b_off, l->b_n, how, fan_in, rng);
}

// ----------------------------------------------------------------------------
// CPU backend

/* Whether convolution L runs in NHWC rather than in the blocked layout that
 * format_tag any gives. The blocked layouts pad channels to the block (16
 * floats on AVX-512), which costs up to 2.5x the arithmetic for channel
 * counts like 20; oneDNN's NHWC convolutions do not pad. */
static int conv_nhwc(const cpu_backend *be, const dsrt_layer *L) {
    if (be->layout == LAYOUT_BLOCKED) return 0;
    if (be->layout == LAYOUT_NHWC) return 1;
    return L->out.c % be->block != 0 || (L->in.c > 4 && L->in.c % be->block != 0);
}

static int plan_conv(cpu_backend *be, cpu_plan *p, int i) {
    dnnl_alg_kind_t conv_alg = be->conv_alg;
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    int g = L->o.groups, rc;
    dnnl_dims_t sdims = {p->n, L->in.c, L->in.h, L->in.w};
    dnnl_dims_t ddims = {p->n, L->out.c, L->out.h, L->out.w};
    dnnl_dims_t wdims5 = {g, L->out.c / g, L->in.c / g, L->o.kh, L->o.kw};
    dnnl_dims_t wdims4 = {L->out.c, L->in.c, L->o.kh, L->o.kw};
    dnnl_dims_t bdims = {L->out.c};
    dnnl_dims_t strides = {L->o.sh, L->o.sw}, dil = {L->o.dh - 1, L->o.dw - 1};
    dnnl_dims_t pad_l = {L->pt, L->pl}, pad_r = {L->pb, L->pr};
    int wnd = g > 1 ? 5 : 4;
    const dnnl_dim_t *wdims = g > 1 ? wdims5 : wdims4;
    dnnl_memory_desc_t src_any, w_any, w_plain, b_md, dst_any;
    if (dsrt__cpu_md_any(&src_any, 4, sdims) || dsrt__cpu_md_any(&w_any, wnd, wdims) ||
        dsrt__cpu_md_plain(&w_plain, wnd, wdims) || dsrt__cpu_md_plain(&b_md, 1, bdims) ||
        dsrt__cpu_md_any(&dst_any, 4, ddims))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "memory descriptors", L);
    if (conv_nhwc(be, L)) {
        DN("memory descriptors",
           dnnl_memory_desc_init_by_tag(&src_any, 4, sdims, dnnl_f32, dnnl_acdb));
        DN("memory descriptors",
           dnnl_memory_desc_init_by_tag(&dst_any, 4, ddims, dnnl_f32, dnnl_acdb));
    }
    const dnnl_memory_desc_t *bias = L->b_n ? &b_md : NULL;
    dnnl_prop_kind_t prop = p->train ? dnnl_forward_training : dnnl_forward_inference;

    /* Forward */
    dnnl_convolution_desc_t fd;
    dnnl_primitive_desc_t fpd = NULL;
    DN("convolution",
       dnnl_dilated_convolution_forward_desc_init(&fd, prop, conv_alg, &src_any, &w_any, bias,
                                                  &dst_any, strides, dil, pad_l, pad_r));
    if ((rc = dsrt__cpu_pd(&fpd, &fd, be, L->fuse_relu, L->fuse_leak, NULL, "convolution", L)))
        return rc;
    dnnl_memory_t wplain, wfwd, bmem = NULL;
    step *s;
    if ((rc = dsrt__cpu_ensure(p, be, in->mem,
                               dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0), 0, i,
                               &lp->src, L)))
        goto out;
    if ((rc = dsrt__cpu_mem(p, &w_plain, be->engine, net->params + L->w_off, &wplain, L))) goto out;
    if ((rc = dsrt__cpu_weights_for(be, p, i, &w_plain,
                                    dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0),
                                    wplain, 0, &lp->w_fwd_version, &wfwd)))
        goto out;
    if (L->b_n && (rc = dsrt__cpu_mem(p, &b_md, be->engine, net->params + L->b_off, &bmem, L)))
        goto out;
    if ((rc = dsrt__cpu_output(be, p, i, dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0))))
        goto out;
    if ((rc = dsrt__cpu_prim_step(p, be, fpd, 0, i, &s, L))) goto out;
    dsrt__cpu_arg(s, DNNL_ARG_SRC, lp->src);
    dsrt__cpu_arg(s, DNNL_ARG_WEIGHTS, wfwd);
    dsrt__cpu_arg(s, DNNL_ARG_BIAS, bmem);
    dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
    if (!p->train) goto out;

    /* Backward: the fused ReLU, weights, then data. */
    if (L->fuse_relu && (rc = dsrt__cpu_fused_relu_bwd(be, p, i))) goto out;
    {
        dnnl_convolution_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_dilated_convolution_backward_weights_desc_init(
            &bd, conv_alg, &src_any, &w_any, bias, &dst_any, strides, dil, pad_l, pad_r);
        if (st != dnnl_success) {
            rc = dsrt__cpu_fail(st, "convolution backward weights", L);
            goto out;
        }
        if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, "convolution backward weights", L)))
            goto out;
        if ((rc = dsrt__cpu_weights_grad(be, p, i, bpd, &w_plain, &b_md, 1))) goto out;
    }
    if (dsrt__net_need_diff(be->net, L->inputs[0])) {
        dnnl_convolution_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_dilated_convolution_backward_data_desc_init(
            &bd, conv_alg, &src_any, &w_any, &dst_any, strides, dil, pad_l, pad_r);
        if (st != dnnl_success) {
            rc = dsrt__cpu_fail(st, "convolution backward data", L);
            goto out;
        }
        if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, "convolution backward data", L))) goto out;
        rc = dsrt__cpu_data_grad(be, p, i, bpd, &w_plain, wplain, wfwd, 1);
    }
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

static void conv_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    int64_t k[2] = {l->o.kh, l->o.kw}, s[2] = {l->o.sh, l->o.sw}, d[2] = {l->o.dh, l->o.dw};
    int64_t p[4] = {l->pt, l->pl, l->pb, l->pr};
    dsrt__onnx_attr_ints(w, "kernel_shape", k, 2);
    dsrt__onnx_attr_ints(w, "strides", s, 2);
    dsrt__onnx_attr_ints(w, "pads", p, 4);
    dsrt__onnx_attr_ints(w, "dilations", d, 2);
    dsrt__onnx_attr_int(w, "group", l->o.groups);
}

/* Conv, its weights (M, C/g, kH, kW) as the flat buffer holds them. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    const float *params = e->net->params;
    char a[DSRT_LAYER_NAME_MAX + 32], b[DSRT_LAYER_NAME_MAX + 32], x0[DSRT_LAYER_NAME_MAX + 32];
    const char *x = dsrt__onnx_as_rank(e, l, l->inputs[0], 4, x0, sizeof x0);
    int64_t w[4] = {l->o.filters, l->in.c / l->o.groups, l->o.kh, l->o.kw}, bd[1] = {l->out.c};
    dsrt__onnx_aux_name(a, sizeof a, l, "weight");
    dsrt__onnx_aux_name(b, sizeof b, l, "bias");
    dsrt__onnx_floats(e, a, w, 4, params + l->w_off);
    if (l->b_n) dsrt__onnx_floats(e, b, bd, 1, params + l->b_off);
    const char *in[3] = {x, a, b};
    dsrt__onnx_node(e, "Conv", l->name, in, l->b_n ? 3 : 2, out, conv_attrs, l, NULL);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

static int map_conv(onnx_import *c) {
    onnx_val *x = dsrt__onnx_image_input(c);
    if (!x) return c->err;
    onnx_tensor *w = dsrt__onnx_const_input(c, 1, "weight"), *b = NULL;
    if (!w) return c->err;
    if (dsrt__onnx_has_input(c, 2) && !(b = dsrt__onnx_const_input(c, 2, "bias"))) return c->err;
    dsrt_shape s = dsrt__onnx_shape_of(c, x);
    int64_t g;
    int rc;
    if ((rc = dsrt__onnx_get_int(c, "group", 1, &g))) return rc;
    if (w->ndims != 4)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "weight '%s' has %d dimensions: dsrt convolves 2-D "
                               "images (4-D weights)",
                               ONNX_SHOWN(w->name), w->ndims);
    int64_t m = w->dims[0];
    if (g < 1 || g > s.c || s.c % g || m < 1 || m > (1 << 20) || m % g || w->dims[1] != s.c / g)
        return dsrt__onnx_fail(
            c, DSRT_ECORRUPT,
            "weight '%s' (%lld, %lld, %lld, %lld) and group %lld do not fit %d input "
            "channels",
            ONNX_SHOWN(w->name), (long long)w->dims[0], (long long)w->dims[1],
            (long long)w->dims[2], (long long)w->dims[3], (long long)g, s.c);
    if (b && (b->ndims != 1 || b->dims[0] != m))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "bias '%s' has %llu values for %lld filters",
                               ONNX_SHOWN(b->name), (unsigned long long)b->count, (long long)m);
    if (w->dims[2] < 1 || w->dims[3] < 1 || w->dims[2] > 4096 || w->dims[3] > 4096)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "a %lldx%lld kernel", (long long)w->dims[2],
                               (long long)w->dims[3]);
    int kernel[2] = {(int)w->dims[2], (int)w->dims[3]};
    onnx_window win;
    dsrt_shape os;
    if ((rc = dsrt__onnx_geometry(c, &s, kernel, 1, &win)) ||
        (rc = dsrt__onnx_out_shape(c, m, win.oh, win.ow, &os)))
        return rc;
    onnx_layer *l = dsrt__onnx_add_layer(c, "conv", &x, 1);
    if (!l) return c->err;
    dsrt__onnx_opt(l, " filters=%lld", (long long)m);
    dsrt__onnx_window_opts(l, &win);
    dsrt__onnx_opt(l, " dilation=%dx%d groups=%lld bias=%d", win.dh, win.dw, (long long)g,
                   b != NULL);
    l->w = w;
    l->b = b;
    l->out = os;
    dsrt__onnx_produce(c, l, 0);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Conv", map_conv, "auto_pad,dilations,group,kernel_shape,pads,strides", 0},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_conv = {
    .name = "conv",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = DSRT_LAYER_F_TAKES_RELU,
    .build = build,
    .init = init,
    .cpu_plan = plan_conv,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=8x7x2\nconv filters=4 size=3x2 stride=2 pad=1,2,0,1\nconv filters=4 "
               "size=3 dilation=2 pad=same groups=2\nfc outputs=3\nsoftmax\n",
};

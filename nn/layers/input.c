/*
 * input {imageInputLayer}: the network's image input, float NCHW batches of
 * the net's size, normalised as MATLAB's input layer does: none,
 * zerocenter (x - mean), zscore ((x - mean) / std), rescale ([min, max] to
 * [0, 1]) or rescale-symmetric ([min, max] to [-1, 1]), with one statistic
 * for every channel or one for all. The statistics are the layer's state
 * (mean, std, min, max: four values a channel), so that runtime code may
 * set them from the data and model files keep them.
 *
 *   size=HxWxC [from the caller]  normalization=none|zerocenter|zscore|
 *   rescale|rescale-symmetric [none]  mean= std= min= max= [0, 1, 0, 1]
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"
#include "nn/arith.h"

static const dsrt_opt_spec OPTS[] = {
    {"size", OPT_SIZE3, "0x0x0", DSRT_O(in_h), 0, 0, 1 << 16, NULL},
    {"normalization", OPT_ENUM, "none", DSRT_O(norm), 0, 0, 0,
     "none|zerocenter|zscore|rescale|rescale-symmetric"},
    {"mean", OPT_FLOATS, "0", DSRT_O(mean), DSRT_O(n_mean), -1e30, 1e30, NULL},
    {"std", OPT_FLOATS, "1", DSRT_O(std), DSRT_O(n_std), 1e-30, 1e30, NULL},
    {"min", OPT_FLOATS, "0", DSRT_O(min), DSRT_O(n_min), -1e30, 1e30, NULL},
    {"max", OPT_FLOATS, "1", DSRT_O(max), DSRT_O(n_max), -1e30, 1e30, NULL},
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"input", OPTS, "image input and normalization"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    int c = in->c;
    const int *counts[] = {&l->o.n_mean, &l->o.n_std, &l->o.n_min, &l->o.n_max};
    const char *names[] = {"mean", "std", "min", "max"};
    for (int i = 0; i < 4; i++)
        if (*counts[i] != 1 && *counts[i] != c)
            return dsrt__fail(DSRT_EOPTION, "input: option '%s': %d values for %d channels",
                              names[i], *counts[i], c);
    for (int i = 0; i < c; i++) {
        float lo = l->o.min[l->o.n_min == 1 ? 0 : i], hi = l->o.max[l->o.n_max == 1 ? 0 : i];
        if ((l->o.norm == DSRT_NORM_RESCALE || l->o.norm == DSRT_NORM_RESCALE_SYMMETRIC) &&
            !(hi > lo))
            return dsrt__fail(DSRT_EOPTION, "input: option 'max': must be larger than min");
    }
    l->s_n = 4 * (size_t)c;
    return dsrt__layer_check_size(l, (double)c * in->h * in->w, "an image");
}

static void init(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int how) {
    int c = l->out.c;
    float *s = state + l->s_off;
    const float *src[] = {l->o.mean, l->o.std, l->o.min, l->o.max};
    const int n[] = {l->o.n_mean, l->o.n_std, l->o.n_min, l->o.n_max};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < c; i++) s[k * c + i] = src[k][n[k] == 1 ? 0 : i];
}

// ----------------------------------------------------------------------------
// CPU backend

static int step_normalize(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[0];
    int c = l->out.c;
    size_t hw = (size_t)l->out.h * l->out.w;
    const float *st = net->state + l->s_off;
    float *y = dsrt__cpu_handle(p->lp[0].out.mem);
    for (int ch = 0; ch < c; ch++) {
        float a, o;
        dsrt_input_affine(l->o.norm, st, c, ch, &a, &o);
        for (int b = 0; b < p->n; b++) {
            const float *xs = be->x + ((size_t)b * c + ch) * hw;
            float *ys = y + ((size_t)b * c + ch) * hw;
            for (size_t k = 0; k < hw; k++) ys[k] = dsrt_input_apply(a, o, xs[k]);
        }
    }
    return 0;
}

static int plan_input(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *out = &p->lp[i].out;
    dnnl_dims_t dims = {p->n, L->out.c, L->out.h, L->out.w};
    /* One channel: NCHW and NHWC are the same bytes; say NHWC, which the
     * convolutions that run in it then take without a copy. */
    if (dnnl_memory_desc_init_by_tag(&out->md, 4, dims, dnnl_f32,
                                     L->out.c == 1 ? dnnl_acdb : dnnl_abcd) != dnnl_success)
        return dsrt__cpu_fail(dnnl_invalid_arguments, "input", L);
    if (L->o.norm == DSRT_NORM_NONE) {
        /* The caller's batch, set as the handle at each forward. */
        DN("memory", dnnl_memory_create(&out->mem, &out->md, be->engine, DNNL_MEMORY_NONE));
        if (dsrt__grow((void **)&p->mems, &p->cap_mems, p->n_mems + 1, sizeof *p->mems)) {
            dnnl_memory_destroy(out->mem);
            return -ENOMEM;
        }
        p->mems[p->n_mems++] = out->mem;
        p->batch = out->mem;
        return 0;
    }
    int rc = dsrt__cpu_mem(p, &out->md, be->engine, NULL, &out->mem, L);
    if (rc) return rc;
    return dsrt__cpu_c_step(p, 0, step_normalize, i);
}

// ----------------------------------------------------------------------------
// ONNX export

/* pixels / 255 (or * the scale the net was given), then the input layer's
 * a x + o per channel (nn/arith.h), so that a runtime given a file's pixels
 * sees what dsrt's net saw. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    const float *state = e->net->state;
    int ch = l->out.c;
    const char *cur = "pixels";
    int64_t one[1] = {1};
    if (fabs(e->input_scale * 255.0 - 1.0) < 1e-12) {
        float v = 255.0f;
        dsrt__onnx_floats(e, "pixels.divisor", one, 0, &v);
        const char *in[2] = {cur, "pixels.divisor"};
        dsrt__onnx_node(e, "Div", "pixels.scale", in, 2, "pixels.scaled", NULL, l, NULL);
    } else {
        float v = (float)e->input_scale;
        dsrt__onnx_floats(e, "pixels.factor", one, 0, &v);
        const char *in[2] = {cur, "pixels.factor"};
        dsrt__onnx_node(e, "Mul", "pixels.scale", in, 2, "pixels.scaled", NULL, l, NULL);
    }
    cur = "pixels.scaled";
    if (l->o.norm != DSRT_NORM_NONE) {
        float *av = dsrt__calloc(2 * (size_t)ch, sizeof *av);
        if (!av) return -ENOMEM;
        for (int k = 0; k < ch; k++)
            dsrt_input_affine(l->o.norm, state + l->s_off, ch, k, &av[k], &av[ch + k]);
        int64_t dims[4] = {1, ch, 1, 1};
        dsrt__onnx_floats(e, "input.scale", dims, 4, av);
        dsrt__onnx_floats(e, "input.offset", dims, 4, av + ch);
        free(av);
        const char *in1[2] = {cur, "input.scale"}, *in2[2] = {"input.scaled", "input.offset"};
        dsrt__onnx_node(e, "Mul", "input.normalise_scale", in1, 2, "input.scaled", NULL, l, NULL);
        dsrt__onnx_node(e, "Add", "input.normalise_offset", in2, 2, "input.normalised", NULL, l,
                        NULL);
        cur = "input.normalised";
    }
    snprintf(out, DSRT_ONNX_VALUE_MAX, "%s", cur);
    return 0;
}

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_input = {
    .name = "input",
    .types = TYPES,
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = DSRT_LAYER_F_INPUT,
    .build = build,
    .init = init,
    .cpu_plan = plan_input,
    .onnx_export = export_onnx,
    .example = "input name=in size=5x5x2 normalization=zscore mean=0.1,0.2 std=2,3\nconv filters=3 "
               "size=2\nfc outputs=3\nsoftmax\n",
};

/*
 * Layer constructors and initialisers. A constructor checks a layer's options
 * against the shape of its input, infers its output shape, resolves 'same'
 * padding, and says how many parameters and how much state it owns; an
 * initialiser draws the starting values as MATLAB does by default (Glorot
 * uniform weights, zero biases, unit batch-norm scales). Nothing here
 * computes a forward or backward pass: that is the backends' work.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Shapes

/* Output length of a window sweep, or 0 when the window does not fit. With
 * same, the padding is chosen so that out = ceil(in / stride) (MATLAB's
 * 'same'), the odd pixel going to the bottom/right. */
static int window(int in, int k, int stride, int dil, int same, int *p0, int *p1) {
    int64_t keff = (int64_t)(k - 1) * dil + 1;
    if (same) {
        int64_t out = ((int64_t)in + stride - 1) / stride;
        int64_t total = DSRT_MAX((out - 1) * stride + keff - in, 0);
        if (total > INT32_MAX) return 0;
        *p0 = (int)(total / 2);
        *p1 = (int)(total - *p0);
        return (int)out;
    }
    int64_t span = (int64_t)in + *p0 + *p1 - keff;
    if (span < 0 || span / stride + 1 > INT32_MAX) return 0;
    return (int)(span / stride + 1);
}

static int spatial(dsrt_layer *l, const dsrt_shape *in, int dh, int dw) {
    l->pt = l->o.pt;
    l->pb = l->o.pb;
    l->pl = l->o.pl;
    l->pr = l->o.pr;
    int oh = window(in->h, l->o.kh, l->o.sh, dh, l->o.pad_same, &l->pt, &l->pb);
    int ow = window(in->w, l->o.kw, l->o.sw, dw, l->o.pad_same, &l->pl, &l->pr);
    if (oh < 1 || ow < 1)
        return dsrt__fail(DSRT_EOPTION,
                          "%s: option 'size': a %dx%d window (dilation %dx%d, padding %d,%d,%d,%d) "
                          "does not fit the %dx%d input",
                          l->type, l->o.kh, l->o.kw, dh, dw, l->pt, l->pb, l->pl, l->pr, in->h,
                          in->w);
    /* Padding at least as large as the window would make outputs that see
     * only padding; oneDNN refuses them too. */
    int64_t keh = (int64_t)(l->o.kh - 1) * dh + 1, kew = (int64_t)(l->o.kw - 1) * dw + 1;
    if (l->pt >= keh || l->pb >= keh || l->pl >= kew || l->pr >= kew)
        return dsrt__fail(DSRT_EOPTION, "%s: option 'pad': padding must be smaller than the window",
                          l->type);
    l->out.h = oh;
    l->out.w = ow;
    return 0;
}

/* Refuses nets whose tensors would not fit an int or a sane allocation. */
static int check_size(dsrt_layer *l, double elems, const char *what) {
    if (elems > (double)(1u << 31) - 1)
        return dsrt__fail(DSRT_ETOOBIG, "%s: %s has %.0f elements, more than 2^31 - 1", l->type,
                          what, elems);
    return 0;
}

// ----------------------------------------------------------------------------
// Constructors

int dsrt__build_input(dsrt_layer *l, const dsrt_shape *in, int *classes) {
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
    return check_size(l, (double)c * in->h * in->w, "an image");
}

int dsrt__build_conv(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    int g = l->o.groups;
    if (in->c % g || l->o.filters % g)
        return dsrt__fail(DSRT_EOPTION,
                          "conv: option 'groups': %d does not divide the %d input channels and "
                          "the %d filters",
                          g, in->c, l->o.filters);
    int rc = spatial(l, in, l->o.dh, l->o.dw);
    if (rc) return rc;
    l->out.c = l->o.filters;
    double wn = (double)l->o.filters * (in->c / g) * l->o.kh * l->o.kw;
    if ((rc = check_size(l, wn, "the weights"))) return rc;
    if ((rc = check_size(l, (double)l->out.c * l->out.h * l->out.w, "an output image"))) return rc;
    l->w_n = (size_t)wn;
    l->b_n = l->o.bias ? (size_t)l->o.filters : 0;
    l->flops = 2.0 * wn * l->out.h * l->out.w;
    return 0;
}

int dsrt__build_batchnorm(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    l->w_n = l->b_n = (size_t)in->c;
    l->s_n = 2 * (size_t)in->c;
    return 0;
}

int dsrt__build_same(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    return 0;
}

int dsrt__build_pool(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    int rc = spatial(l, in, 1, 1);
    l->out.c = in->c;
    return rc;
}

int dsrt__build_gap(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = (dsrt_shape){in->c, 1, 1};
    l->o.kh = in->h;
    l->o.kw = in->w;
    l->o.sh = l->o.sw = 1;
    return 0;
}

int dsrt__build_fc(dsrt_layer *l, const dsrt_shape *in, int *classes) {
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
    int rc = check_size(l, wn, "the weights");
    if (rc) return rc;
    l->w_n = (size_t)wn;
    l->b_n = l->o.bias ? (size_t)outputs : 0;
    l->flops = 2.0 * wn;
    return 0;
}

int dsrt__build_dropout(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    return 0;
}

int dsrt__build_lrn(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    if (l->o.lrn_size % 2 == 0)
        return dsrt__fail(DSRT_EOPTION, "lrn: option 'size': %d is even; the window is centred",
                          l->o.lrn_size);
    l->out = *in;
    return 0;
}

int dsrt__build_softmax(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    int64_t k = dsrt__volume(in->c, in->h, in->w);
    if (*classes > 0 && k != *classes)
        return dsrt__fail(DSRT_EOPTION,
                          "softmax: its input has %lld values per image but there are %d classes",
                          (long long)k, *classes);
    if (k < 1) return dsrt__fail(DSRT_EOPTION, "softmax: empty input");
    if (k > INT32_MAX)
        return dsrt__fail(DSRT_ETOOBIG, "softmax: %lld classes, more than 2^31 - 1", (long long)k);
    *classes = (int)k;
    l->out = (dsrt_shape){(int)k, 1, 1};
    return 0;
}

/* add and concat: in is the shape the net made of their inputs (which it
 * checked agree). */
int dsrt__build_add(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    l->flops = (double)(l->n_inputs - 1) * in->c * in->h * in->w;
    return 0;
}

int dsrt__build_concat(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    return check_size(l, (double)in->c * in->h * in->w, "an output image");
}

// ----------------------------------------------------------------------------
// Initialisers

static double normal(dsrt_rng *rng) {
    double u1 = dsrt_rng_uniform(rng), u2 = dsrt_rng_uniform(rng);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

static void draw(float *w, size_t n, int how, double fan_in, double fan_out, dsrt_rng *rng) {
    if (how == DSRT_INIT_HE) {
        double sd = sqrt(2.0 / fan_in);
        for (size_t i = 0; i < n; i++) w[i] = (float)(sd * normal(rng));
    } else if (how == DSRT_INIT_UNIFORM) {
        double s = 1.0 / sqrt(fan_in);
        for (size_t i = 0; i < n; i++) w[i] = (float)(s * (2.0 * dsrt_rng_uniform(rng) - 1.0));
    } else {
        double s = sqrt(6.0 / (fan_in + fan_out));
        for (size_t i = 0; i < n; i++) w[i] = (float)(s * (2.0 * dsrt_rng_uniform(rng) - 1.0));
    }
}

/* Biases: zero, or for DSRT_INIT_UNIFORM drawn as the weights are. */
static void init_bias(float *b, size_t n, int how, double fan_in, dsrt_rng *rng) {
    if (how == DSRT_INIT_UNIFORM)
        draw(b, n, how, fan_in, 0, rng);
    else if (n)
        memset(b, 0, n * sizeof(float));
}

void dsrt__init_input(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int init) {
    int c = l->out.c;
    float *s = state + l->s_off;
    const float *src[] = {l->o.mean, l->o.std, l->o.min, l->o.max};
    const int n[] = {l->o.n_mean, l->o.n_std, l->o.n_min, l->o.n_max};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < c; i++) s[k * c + i] = src[k][n[k] == 1 ? 0 : i];
}

void dsrt__init_conv(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int init) {
    int how = l->o.init == DSRT_INIT_DEFAULT ? init : l->o.init;
    double k = (double)l->o.kh * l->o.kw;
    double fan_in = k * (l->in.c / l->o.groups), fan_out = k * (l->o.filters / l->o.groups);
    draw(params + l->w_off, l->w_n, how, fan_in, fan_out, rng);
    init_bias(params + l->b_off, l->b_n, how, fan_in, rng);
}

void dsrt__init_batchnorm(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng,
                          int init) {
    int c = l->out.c;
    for (int i = 0; i < c; i++) {
        params[l->w_off + i] = 1.0f;
        params[l->b_off + i] = 0.0f;
        state[l->s_off + i] = 0.0f;
        state[l->s_off + c + i] = 1.0f;
    }
}

void dsrt__init_fc(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int init) {
    int how = l->o.init == DSRT_INIT_DEFAULT ? init : l->o.init;
    double fan_in = (double)l->in.c * l->in.h * l->in.w;
    draw(params + l->w_off, l->w_n, how, fan_in, (double)l->o.outputs, rng);
    init_bias(params + l->b_off, l->b_n, how, fan_in, rng);
}

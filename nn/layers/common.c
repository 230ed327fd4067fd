/*
 * What the layer kinds share: the table of every kind's ops (made from
 * nn/layers/list.h), the window arithmetic of convolution and pooling, and
 * the weight initialisers (MATLAB's defaults: Glorot uniform weights, zero
 * biases; He and PyTorch's uniform on request).
 */
#include "nn/internal.h"

#include <math.h>
#include <string.h>

// ----------------------------------------------------------------------------
// The table

const dsrt_layer_ops *const dsrt__layers[DSRT_LAYER_KIND_COUNT] = {
#define DSRT_LAYER_ENTRY(K, k) [DSRT_LAYER_##K] = &dsrt__layer_##k,
    DSRT_LAYER_KINDS(DSRT_LAYER_ENTRY)
#undef DSRT_LAYER_ENTRY
};

// ----------------------------------------------------------------------------
// Windows

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

int dsrt__layer_window(dsrt_layer *l, const dsrt_shape *in, int dh, int dw) {
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

int dsrt__layer_check_size(const dsrt_layer *l, double elems, const char *what) {
    if (elems > (double)(1u << 31) - 1)
        return dsrt__fail(DSRT_ETOOBIG, "%s: %s has %.0f elements, more than 2^31 - 1", l->type,
                          what, elems);
    return 0;
}

// ----------------------------------------------------------------------------
// Initialisers

static double normal(dsrt_rng *rng) {
    double u1 = dsrt_rng_uniform(rng), u2 = dsrt_rng_uniform(rng);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

void dsrt__layer_draw(float *w, size_t n, int how, double fan_in, double fan_out, dsrt_rng *rng) {
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

void dsrt__layer_init_bias(float *b, size_t n, int how, double fan_in, dsrt_rng *rng) {
    if (how == DSRT_INIT_UNIFORM)
        dsrt__layer_draw(b, n, how, fan_in, 0, rng);
    else if (n)
        memset(b, 0, n * sizeof(float));
}

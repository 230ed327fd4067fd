/*
 * Tests of the nn module's layers on the CPU backend: every layer's forward
 * against a naive reference written here, every layer's backward against
 * central finite differences of the loss, ReLU fusion against the unfused
 * net, the description parser's errors, the built-in networks' sizes, the
 * gradient buckets, and a short training run on an easy generated problem
 * that must reach (nearly) 100%. The activations also at their kinks and
 * the kinks' float neighbours (PyTorch's gradient conventions there,
 * tests/actref.h: forward within 2e-6, gradients within 1e-5 relative plus
 * 1e-6 of their scale), and on oneDNN's blocked layout against channels-last
 * (1e-5), its padded channels left zero.
 *
 * Tolerances: forward outputs within 1e-4 (absolute, plus 1e-4 relative) of
 * the double-precision reference (Winograd convolutions included); gradients
 * within a relative error (norm of the difference over the larger norm) of
 * 2e-2 against central differences with step 1e-3 in float32 (retried at 1e-4
 * and 1e-5 for an entry whose step crosses a ReLU or max-pooling kink), on up
 * to 24 sampled entries per tensor; Winograd weight gradients within 1e-2 of
 * the direct convolution's.
 */
#include "actref.h"
#include "nn/backend_cpu.h"
#include "nn/layers/eltwise.h"
#include "nn/layers/pad.h"
#include "nnref.h"
#include "task.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Helpers

static dsrt_net *make(const char *desc, int h, int w, int c, int classes, int fuse) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 7;
    o.fuse = fuse;
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, desc, h, w, c, classes, &o);
    if (rc) fprintf(stderr, "net_create: %s\n", dsrt_last_error());
    REQUIRE(rc == 0);
    return net;
}

static void fill(float *x, size_t n, uint64_t seed, float lo, float hi) {
    dsrt_rng r = dsrt_rng_init(seed, 1, 2, 3);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)dsrt_rng_uniform(&r);
}

static size_t out_size(const dsrt_net *net, int i, int n) {
    const dsrt_shape *s = &net->layers[i].out;
    return (size_t)n * s->c * s->h * s->w;
}

static float *layer_out(dsrt_net *net, int i, int n, int train) {
    float *y = malloc(out_size(net, i, n) * sizeof *y);
    REQUIRE(y);
    CHECK_OK(dsrt__net_layer_output(net, i, y, train));
    return y;
}

static double loss_of(dsrt_net *net, const float *x, const int32_t *labels, int n) {
    double loss = 0;
    int correct;
    int rc = dsrt__net_forward(net, x, n, 1, labels, &loss, &correct, NULL);
    REQUIRE(rc == 0);
    return loss;
}

static int close_arrays(const float *a, const double *ref, size_t n, double tol, const char *what) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(a[i] - ref[i]) <= tol * (1 + fabs(ref[i]))) continue;
        if (bad++ < 3)
            fprintf(stderr, "  %s[%zu] = %.7g, reference %.7g\n", what, i, (double)a[i], ref[i]);
    }
    if (bad) fprintf(stderr, "  %s: %zu of %zu values off\n", what, bad, n);
    return bad == 0;
}

// ----------------------------------------------------------------------------
// Gradient check

/* Compares the net's gradient of every parameter tensor with central
 * differences of the training loss (dropout masks fixed by the iteration).
 * h, w, c and classes 0: the description's. */
static void grad_check(const char *desc, int h, int w, int c, int classes, int n, int fuse) {
    dsrt_net *net = make(desc, h, w, c, classes, fuse);
    classes = net->classes;
    size_t per = (size_t)net->input.h * net->input.w * net->input.c;
    float *x = malloc((size_t)n * per * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    REQUIRE(x && y);
    fill(x, (size_t)n * per, 11, -1, 1);
    for (int i = 0; i < n; i++) y[i] = i % classes;
    /* Random biases and BN parameters, so that nothing sits at a symmetric
     * point. */
    dsrt_rng r = dsrt_rng_init(5, 0, 0, 0);
    for (int i = 0; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        for (size_t k = 0; k < l->b_n; k++)
            net->params[l->b_off + k] = (float)(0.2 * (dsrt_rng_uniform(&r) - 0.5));
        if (l->kind == DSRT_LAYER_BATCHNORM)
            for (size_t k = 0; k < l->w_n; k++)
                net->params[l->w_off + k] = (float)(0.5 + dsrt_rng_uniform(&r));
    }
    dsrt_net_params_changed(net);
    dsrt_net_set_iteration(net, 3);
    float loss;
    CHECK_OK(dsrt_net_forward_backward(net, x, y, n, &loss, NULL));
    float *g = malloc(net->n_params * sizeof *g);
    REQUIRE(g);
    memcpy(g, net->grads, net->n_params * sizeof *g);
    dsrt_net_set_iteration(net, 3);
    const double eps = 1e-3;
    for (int i = 1; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        for (int t = 0; t < 2; t++) {
            size_t off = t ? l->b_off : l->w_off, cnt = t ? l->b_n : l->w_n;
            if (!cnt) continue;
            double num = 0, dd = 0, na = 0, nf = 0;
            int samples = cnt < 24 ? (int)cnt : 24;
            for (int s = 0; s < samples; s++) {
                size_t k = off + (cnt <= 24 ? (size_t)s : dsrt_rng_below(&r, cnt));
                double fd = 0;
                /* A step that crosses a kink (ReLU, max pooling) is retried
                 * smaller. */
                for (double e = eps; e >= eps / 100; e /= 10) {
                    float keep = net->params[k];
                    net->params[k] = keep + (float)e;
                    dsrt_net_params_changed(net);
                    double lp = loss_of(net, x, y, n);
                    net->params[k] = keep - (float)e;
                    dsrt_net_params_changed(net);
                    double lm = loss_of(net, x, y, n);
                    net->params[k] = keep;
                    dsrt_net_params_changed(net);
                    fd = (lp - lm) / (2 * e);
                    if (fabs(fd - g[k]) <= 1e-2 * fabs(g[k]) + 1e-4) break;
                }
                dd += (fd - g[k]) * (fd - g[k]);
                na += (double)g[k] * g[k];
                nf += fd * fd;
                num++;
            }
            /* A gradient that is zero in theory (a bias before batch
             * normalisation) is compared absolutely, against the float
             * noise of the differences. */
            double rel = sqrt(dd) / fmax(fmax(sqrt(na), sqrt(nf)), 1e-6);
            if (!(rel < 2e-2) && !(sqrt(dd) < 1e-3 && sqrt(na) < 1e-5)) {
                fprintf(stderr, "  %s (%s, fuse %d): %s gradient relative error %.3g (norm %.3g)\n",
                        l->name, l->type, fuse, t ? "bias" : "weight", rel, sqrt(na));
                test_failures++;
            }
        }
    }
    free(g);
    free(x);
    free(y);
    dsrt_net_destroy(net);
}

static void test_grad_conv(void) {
    grad_check("input\nconv filters=4 size=3 pad=1\nfc outputs=3\nsoftmax\n", 6, 6, 2, 3, 4, 0);
    grad_check("input\nconv filters=4 size=3 stride=2 pad=same\nfc outputs=3\nsoftmax\n", 7, 7, 2,
               3, 3, 0);
    grad_check("input\nconv filters=4 size=3x2 dilation=2 pad=2,1,1,0\nfc outputs=3\nsoftmax\n", 8,
               7, 2, 3, 3, 0);
    grad_check("input\nconv filters=4 size=1\nconv filters=6 size=3 groups=2 pad=1\n"
               "fc outputs=3\nsoftmax\n",
               5, 5, 2, 3, 3, 0);
    grad_check("input\nconv filters=3 size=3 bias=0\nfc outputs=2 bias=0\nsoftmax\n", 5, 5, 1, 2, 2,
               0);
    /* fc weights smaller than the batch's activations: the fc reads its input
     * in the convolution's layout */
    grad_check("input\nconv filters=16 size=1\nfc outputs=2\nsoftmax\n", 4, 4, 2, 2, 6, 0);
    grad_check("input\nconv filters=20 size=3 pad=1\nrelu\nfc outputs=2\nsoftmax\n", 4, 4, 2, 2, 6,
               1);
}

static void forward_check(const char *desc, int h, int w, int c, int classes, int n, int train);

/* Large enough that oneDNN computes the 3x3 convolution with Winograd. */
static void test_winograd(void) {
    const char *desc = "input\nconv filters=32 size=3 pad=1\nconv filters=32 size=3 pad=1\n"
                       "gap\nfc outputs=3\nsoftmax\n";
    forward_check(desc, 16, 16, 32, 3, 64, 1);
    grad_check(desc, 16, 16, 32, 3, 64, 0);
    /* At cifar's size oneDNN also takes Winograd for weight gradients: those
     * must agree with the direct convolutions (checked above against finite
     * differences) on the loss (1e-4) and every gradient (1e-2 relative:
     * Winograd's rounding, about 4e-4 at the last layer, grows to about 5e-3
     * through twelve convolution and batch-norm layers). */
    setenv("DSRT_CPU_CONV", "direct", 1);
    dsrt_net *direct = make("cifar", 0, 0, 0, 10, 1);
    unsetenv("DSRT_CPU_CONV");
    dsrt_net *wino = make("cifar", 0, 0, 0, 10, 1);
    enum { N = 128 };
    float *x = malloc((size_t)N * 3 * 32 * 32 * sizeof *x);
    int32_t y[N];
    REQUIRE(x);
    fill(x, (size_t)N * 3 * 32 * 32, 8, 0, 1);
    for (int i = 0; i < N; i++) y[i] = i % 10;
    float ld, lw;
    CHECK_OK(dsrt_net_forward_backward(direct, x, y, N, &ld, NULL));
    CHECK_OK(dsrt_net_forward_backward(wino, x, y, N, &lw, NULL));
    CHECK_NEAR(lw, ld, 1e-4 * ld);
    for (int i = 1; i < direct->n_layers; i++) {
        const dsrt_layer *l = &direct->layers[i];
        double dd = 0, nn = 0;
        for (size_t k = l->w_off; k < l->w_off + l->w_n; k++) {
            dd += pow(wino->grads[k] - direct->grads[k], 2);
            nn += pow(direct->grads[k], 2);
        }
        if (l->w_n && !(sqrt(dd) <= 1e-2 * sqrt(nn))) {
            fprintf(stderr, "  %s: Winograd and direct gradients differ by %.3g of %.3g\n", l->name,
                    sqrt(dd), sqrt(nn));
            test_failures++;
        }
    }
    free(x);
    dsrt_net_destroy(direct);
    dsrt_net_destroy(wino);
}

static void test_grad_batchnorm(void) {
    grad_check("input\nconv filters=3 size=1\nbatchnorm\nfc outputs=3\nsoftmax\n", 4, 4, 2, 3, 4,
               0);
    grad_check("input\nfc outputs=5\nbatchnorm\nfc outputs=3\nsoftmax\n", 3, 3, 2, 3, 6, 0);
}

static void test_grad_relu(void) {
    for (int fuse = 0; fuse < 2; fuse++) {
        grad_check("input\nconv filters=4 size=3 pad=1\nrelu\nfc outputs=3\nsoftmax\n", 5, 5, 2, 3,
                   3, fuse);
        grad_check(
            "input\nconv filters=4 size=3 pad=1\nleakyrelu leak=0.1\nfc outputs=3\nsoftmax\n", 5, 5,
            2, 3, 3, fuse);
        grad_check("input\nconv filters=3 size=1\nbatchnorm\nrelu\nfc outputs=3\nsoftmax\n", 4, 4,
                   2, 3, 4, fuse);
        grad_check("input\nfc outputs=6\nrelu\nfc outputs=3\nsoftmax\n", 3, 3, 2, 3, 3, fuse);
    }
}

static void test_grad_pool(void) {
    grad_check("input\nconv filters=3 size=1\nmaxpool size=2 stride=2\nfc outputs=3\nsoftmax\n", 6,
               6, 2, 3, 3, 0);
    grad_check(
        "input\nconv filters=3 size=1\nmaxpool size=3 stride=2 pad=1\nfc outputs=3\nsoftmax\n", 7,
        7, 2, 3, 3, 0);
    grad_check(
        "input\nconv filters=3 size=1\navgpool size=3 stride=2 pad=1 count_pad=0\nfc outputs=3\n"
        "softmax\n",
        7, 7, 2, 3, 3, 0);
    grad_check(
        "input\nconv filters=3 size=1\navgpool size=3 stride=2 pad=1\nfc outputs=3\nsoftmax\n", 7,
        7, 2, 3, 3, 0);
    grad_check("input\nconv filters=3 size=1\ngap\nfc outputs=3\nsoftmax\n", 5, 4, 2, 3, 3, 0);
}

static void test_grad_misc(void) {
    grad_check("input\nconv filters=4 size=1\ndropout p=0.3\nfc outputs=3\nsoftmax\n", 4, 4, 2, 3,
               3, 0);
    grad_check("input\nfc outputs=8\ndropout p=0.5\nfc outputs=3\nsoftmax\n", 3, 3, 2, 3, 3, 0);
    grad_check("input\nconv filters=6 size=1\nlrn size=3 alpha=0.5 beta=0.75 k=2\nfc outputs=3\n"
               "softmax\n",
               4, 4, 2, 3, 3, 0);
    grad_check("input\nconv filters=7 size=1\nlrn size=5 alpha=1e-1 beta=0.75 k=1\nfc outputs=3\n"
               "softmax\n",
               3, 3, 2, 3, 3, 0);
    grad_check("input normalization=zscore mean=0.1 std=2\nconv filters=2 size=2\nfc outputs=2\n"
               "softmax\n",
               3, 3, 1, 2, 2, 0);
}

/* Every layer kind of the table: its keywords with options and help, a
 * shape rule, a CPU plan, an ONNX form both ways (the input's is the
 * graph's input itself), and an example net whose gradients check out,
 * fused and not. */
static void test_layer_table(void) {
    for (int k = 0; k < DSRT_LAYER_KIND_COUNT; k++) {
        const dsrt_layer_ops *o = dsrt__layers[k];
        REQUIRE(o);
        CHECK(o->name && o->types && o->types[0].name);
        for (const dsrt_layer_type *t = o->types; t->name; t++) CHECK(t->opts && t->help);
        CHECK(o->build != NULL);
        CHECK(o->cpu_plan != NULL);
        CHECK(o->onnx_export != NULL);
        CHECK(o->onnx_ops != NULL || (o->flags & DSRT_LAYER_F_INPUT));
        CHECK(o->min_inputs <= o->max_inputs && o->max_inputs <= DSRT_INPUTS_MAX);
        CHECK(o->example != NULL);
        if (!o->example) continue;
        /* The example has a layer of this kind. */
        dsrt_net *net = make(o->example, 0, 0, 0, 0, 1);
        int has = 0;
        for (int i = 0; i < net->n_layers; i++) has |= net->layers[i].kind == (dsrt_layer_kind)k;
        if (!has) fprintf(stderr, "  %s: its example has no layer of the kind\n", o->name);
        CHECK(has);
        dsrt_net_destroy(net);
        grad_check(o->example, 0, 0, 0, 0, 4, 0);
        grad_check(o->example, 0, 0, 0, 0, 3, 1);
    }
}

// ----------------------------------------------------------------------------
// Forward references

static double in_at(const float *x, const dsrt_shape *s, int b, int c, int y, int xx) {
    return x[(((size_t)b * s->c + c) * s->h + y) * s->w + xx];
}

static void ref_conv(const dsrt_net *net, const dsrt_layer *l, const float *x, double *yv, int n,
                     int relu) {
    const dsrt_shape *is = &l->in, *os = &l->out;
    int g = l->o.groups, cpg = is->c / g, fpg = os->c / g;
    const float *w = net->params + l->w_off, *bias = l->b_n ? net->params + l->b_off : NULL;
    for (int b = 0; b < n; b++)
        for (int o = 0; o < os->c; o++)
            for (int oy = 0; oy < os->h; oy++)
                for (int ox = 0; ox < os->w; ox++) {
                    double acc = bias ? bias[o] : 0;
                    int gi = o / fpg;
                    for (int ci = 0; ci < cpg; ci++)
                        for (int ky = 0; ky < l->o.kh; ky++)
                            for (int kx = 0; kx < l->o.kw; kx++) {
                                int iy = oy * l->o.sh - l->pt + ky * l->o.dh;
                                int ix = ox * l->o.sw - l->pl + kx * l->o.dw;
                                if (iy < 0 || iy >= is->h || ix < 0 || ix >= is->w) continue;
                                acc += w[((o * cpg + ci) * l->o.kh + ky) * l->o.kw + kx] *
                                       in_at(x, is, b, gi * cpg + ci, iy, ix);
                            }
                    if (relu && acc < 0) acc *= l->fuse_leak;
                    yv[(((size_t)b * os->c + o) * os->h + oy) * os->w + ox] = acc;
                }
}

static void ref_pool(const dsrt_layer *l, const float *x, double *yv, int n) {
    const dsrt_shape *is = &l->in, *os = &l->out;
    for (int b = 0; b < n; b++)
        for (int c = 0; c < os->c; c++)
            for (int oy = 0; oy < os->h; oy++)
                for (int ox = 0; ox < os->w; ox++) {
                    double mx = -INFINITY, sum = 0;
                    int inside = 0;
                    for (int ky = 0; ky < l->o.kh; ky++)
                        for (int kx = 0; kx < l->o.kw; kx++) {
                            int iy = oy * l->o.sh - l->pt + ky, ix = ox * l->o.sw - l->pl + kx;
                            if (iy < 0 || iy >= is->h || ix < 0 || ix >= is->w) continue;
                            double v = in_at(x, is, b, c, iy, ix);
                            mx = fmax(mx, v);
                            sum += v;
                            inside++;
                        }
                    yv[(((size_t)b * os->c + c) * os->h + oy) * os->w + ox] =
                        l->kind == DSRT_LAYER_MAXPOOL ? mx
                        : l->o.count_pad              ? sum / (l->o.kh * l->o.kw)
                                                      : sum / inside;
                }
}

static void ref_lrn(const dsrt_layer *l, const float *x, double *yv, int n) {
    const dsrt_shape *s = &l->in;
    int half = l->o.lrn_size / 2;
    for (int b = 0; b < n; b++)
        for (int c = 0; c < s->c; c++)
            for (int y = 0; y < s->h; y++)
                for (int xx = 0; xx < s->w; xx++) {
                    double sum = 0;
                    for (int k = c - half; k <= c + half; k++)
                        if (k >= 0 && k < s->c) sum += pow(in_at(x, s, b, k, y, xx), 2);
                    yv[(((size_t)b * s->c + c) * s->h + y) * s->w + xx] =
                        in_at(x, s, b, c, y, xx) /
                        pow(l->o.k + l->o.alpha / l->o.lrn_size * sum, l->o.beta);
                }
}

static void ref_bn(const dsrt_net *net, const dsrt_layer *l, const float *x, double *yv, int n,
                   int train) {
    const dsrt_shape *s = &l->in;
    size_t hw = (size_t)s->h * s->w;
    for (int c = 0; c < s->c; c++) {
        double mean = 0, var = 0;
        if (train) {
            for (int b = 0; b < n; b++)
                for (size_t k = 0; k < hw; k++) mean += x[((size_t)b * s->c + c) * hw + k];
            mean /= n * hw;
            for (int b = 0; b < n; b++)
                for (size_t k = 0; k < hw; k++)
                    var += pow(x[((size_t)b * s->c + c) * hw + k] - mean, 2);
            var /= n * hw;
        } else {
            mean = net->state[l->s_off + c];
            var = net->state[l->s_off + s->c + c];
        }
        double ga = net->params[l->w_off + c], be = net->params[l->b_off + c];
        for (int b = 0; b < n; b++)
            for (size_t k = 0; k < hw; k++) {
                size_t at = ((size_t)b * s->c + c) * hw + k;
                yv[at] = ga * (x[at] - mean) / sqrt(var + l->o.eps) + be;
            }
    }
}

static void ref_fc(const dsrt_net *net, const dsrt_layer *l, const float *x, double *yv, int n) {
    size_t in = (size_t)l->in.c * l->in.h * l->in.w;
    for (int b = 0; b < n; b++)
        for (int o = 0; o < l->out.c; o++) {
            double acc = l->b_n ? net->params[l->b_off + o] : 0;
            for (size_t k = 0; k < in; k++)
                acc += (double)net->params[l->w_off + o * in + k] * x[b * in + k];
            yv[(size_t)b * l->out.c + o] = acc;
        }
}

/* Runs a forward (train or inference) and checks every layer of the net
 * against the reference from the previous layer's actual output. */
static void forward_check(const char *desc, int h, int w, int c, int classes, int n, int train) {
    dsrt_net *net = make(desc, h, w, c, classes, 0);
    size_t per = (size_t)h * w * c;
    float *x = malloc((size_t)n * per * sizeof *x);
    int32_t *labels = malloc((size_t)n * sizeof *labels);
    REQUIRE(x && labels);
    fill(x, (size_t)n * per, 3, -2, 2);
    for (int i = 0; i < n; i++) labels[i] = i % classes;
    /* Non-trivial running statistics for inference. */
    for (int i = 0; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        if (l->kind != DSRT_LAYER_BATCHNORM) continue;
        for (int k = 0; k < l->out.c; k++) {
            net->state[l->s_off + k] = 0.1f * k;
            net->state[l->s_off + l->out.c + k] = 1.0f + 0.5f * k;
            net->params[l->b_off + k] = 0.05f * k;
        }
    }
    dsrt_net_params_changed(net);
    double loss;
    int correct;
    float *probs = malloc((size_t)n * classes * sizeof *probs);
    REQUIRE(probs);
    REQUIRE(dsrt__net_forward(net, x, n, train, labels, &loss, &correct, probs) == 0);
    double ref_loss = 0;
    int ref_correct = 0;
    for (int i = 1; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        float *xin = layer_out(net, i - 1, n, train);
        float *yout = layer_out(net, i, n, train);
        size_t m = out_size(net, i, n);
        double *ref = calloc(m, sizeof *ref);
        REQUIRE(ref);
        switch (l->kind) {
        case DSRT_LAYER_CONV:
            ref_conv(net, l, xin, ref, n, 0);
            break;
        case DSRT_LAYER_MAXPOOL:
        case DSRT_LAYER_AVGPOOL:
            ref_pool(l, xin, ref, n);
            break;
        case DSRT_LAYER_GAP: {
            size_t hw = (size_t)l->in.h * l->in.w;
            for (size_t k = 0; k < m; k++) {
                double s = 0;
                for (size_t j = 0; j < hw; j++) s += xin[k * hw + j];
                ref[k] = s / hw;
            }
            break;
        }
        case DSRT_LAYER_LRN:
            ref_lrn(l, xin, ref, n);
            break;
        case DSRT_LAYER_BATCHNORM:
            ref_bn(net, l, xin, ref, n, train);
            break;
        case DSRT_LAYER_RELU:
            for (size_t k = 0; k < m; k++) ref[k] = xin[k] > 0 ? xin[k] : xin[k] * l->o.leak;
            break;
        case DSRT_LAYER_CLIP:
        case DSRT_LAYER_SIGMOID:
        case DSRT_LAYER_HARDSIGMOID:
        case DSRT_LAYER_HARDSWISH:
        case DSRT_LAYER_SILU:
        case DSRT_LAYER_GELU: {
            dsrt_k_act a = dsrt__act_kernel(l);
            for (size_t k = 0; k < m; k++) ref[k] = act_ref(&a, xin[k]);
            break;
        }
        case DSRT_LAYER_FC:
            ref_fc(net, l, xin, ref, n);
            break;
        case DSRT_LAYER_DROPOUT: {
            /* Each output is dropped (0) or kept and scaled by 1/(1-p). */
            size_t dropped = 0;
            for (size_t k = 0; k < m; k++) {
                int drop = train && yout[k] == 0 && xin[k] != 0;
                dropped += drop;
                ref[k] = drop ? 0 : train ? xin[k] / (1 - l->o.p) : xin[k];
            }
            size_t nonzero = 0;
            for (size_t k = 0; k < m; k++) nonzero += xin[k] != 0;
            if (train) {
                double frac = (double)dropped / nonzero;
                CHECK(fabs(frac - l->o.p) < 4 * sqrt(l->o.p * (1 - l->o.p) / nonzero));
            }
            break;
        }
        case DSRT_LAYER_SOFTMAX:
            for (int b = 0; b < n; b++) {
                const float *z = xin + (size_t)b * classes;
                double mx = z[0], s = 0;
                int arg = 0;
                for (int k = 1; k < classes; k++)
                    if (z[k] > mx) mx = z[k], arg = k;
                for (int k = 0; k < classes; k++) s += exp(z[k] - mx);
                for (int k = 0; k < classes; k++) ref[(size_t)b * classes + k] = exp(z[k] - mx) / s;
                ref_loss += -(z[labels[b]] - mx - log(s));
                ref_correct += arg == labels[b];
            }
            CHECK(close_arrays(probs, ref, m, 1e-5, "probs"));
            break;
        default:
            break;
        }
        char what[96];
        snprintf(what, sizeof what, "%s (%s, %s)", l->name, l->type, train ? "train" : "infer");
        CHECK(close_arrays(yout, ref, m, 1e-4, what));
        free(ref);
        free(xin);
        free(yout);
    }
    CHECK_NEAR(loss, ref_loss / n, 1e-5);
    CHECK_EQ(correct, ref_correct);
    free(probs);
    free(x);
    free(labels);
    dsrt_net_destroy(net);
}

static void test_forward_layers(void) {
    for (int train = 0; train < 2; train++) {
        forward_check(
            "input\nconv filters=5 size=3 pad=1\nbatchnorm\nrelu\nmaxpool size=2 stride=2\n"
            "fc outputs=4\nsoftmax\n",
            8, 8, 3, 4, 3, train);
        forward_check("input\nconv filters=6 size=3x2 stride=2x1 dilation=2 pad=same groups=3\n"
                      "leakyrelu leak=0.2\navgpool size=3 stride=2 pad=1\nlrn size=5 alpha=0.1 "
                      "beta=0.75 k=1\ngap\nfc outputs=3\nsoftmax\n",
                      9, 8, 3, 3, 2, train);
        forward_check(
            "input\nconv filters=4 size=3 pad=1\navgpool size=3 stride=2 pad=1,0,0,1 "
            "count_pad=0\nrelu\navgpool size=2 pad=1 count_pad=0\nfc outputs=3\nsoftmax\n",
            9, 8, 3, 3, 2, train);
        forward_check("input\nconv filters=16 size=1\nbatchnorm\nfc outputs=3\nsoftmax\n", 4, 4, 3,
                      3, 8, train);
        forward_check("input\nconv filters=20 size=3 pad=1\nbatchnorm\nfc outputs=3\nsoftmax\n", 4,
                      4, 1, 3, 8, train);
        forward_check("input\nconv filters=4 size=5 stride=2 pad=2,1,0,2 bias=0\n"
                      "maxpool size=3 stride=2 pad=1\nfc outputs=16\nbatchnorm\nrelu\n"
                      "dropout p=0.4\nfc outputs=5\nsoftmax\n",
                      11, 10, 2, 5, 4, train);
    }
}

// ----------------------------------------------------------------------------
// Activations

/* Every activation kind after a convolution of 20 channels (the padding of
 * a blocked layout), against the reference, in training and inference. */
static void test_forward_activations(void) {
    for (int train = 0; train < 2; train++) {
        forward_check("input\nconv filters=20 size=3 pad=1\nrelu6\nconv filters=20 size=1\n"
                      "clip min=-0.3 max=0.2\nconv filters=20 size=1\nsigmoid\nconv filters=20 "
                      "size=1\nhardsigmoid\nconv filters=20 size=1\nhardsigmoid alpha=-0.7 "
                      "beta=0.4\nfc outputs=4\nsoftmax\n",
                      6, 5, 3, 4, 3, train);
        forward_check("input\nconv filters=20 size=3 pad=1\nhardswish\nconv filters=20 size=1\n"
                      "silu\nconv filters=20 size=1\ngelu\nconv filters=20 size=1\ngelu "
                      "approximate=tanh\nfc outputs=8\nswish\nfc outputs=3\nsoftmax\n",
                      6, 5, 3, 3, 3, train);
    }
}

/*
 * Values at the kinks and their float neighbours (tests/actref.h), one a
 * channel of one image: an identity fully connected layer, the activation,
 * a fully connected layer whose first output weighs every channel 0.01 and
 * whose second none, the label 1. Each channel's output gradient is then
 * 0.01 p0, and the first layer's bias gradient is that times the
 * activation's gradient at the value: PyTorch's at the kinks. Forward
 * within 2e-6 (relative, and absolute) of the reference, the gradients
 * within 1e-5 relative plus 1e-6 of 0.01 p0 (oneDNN's GELUs are that far
 * where the value is small: x = -3, -6).
 */
static void test_activation_kinks(void) {
    enum { K = sizeof ACT_PROBES / sizeof ACT_PROBES[0] };
    for (size_t c = 0; c < sizeof ACT_CASES / sizeof ACT_CASES[0]; c++) {
        const dsrt_k_act *a = &ACT_CASES[c];
        char act[96], desc[256];
        act_desc(a, act, sizeof act);
        snprintf(desc, sizeof desc, "input size=1x1x%d\nfc outputs=%d\n%s\nfc outputs=2\nsoftmax\n",
                 K, K, act);
        dsrt_net *net = make(desc, 0, 0, 0, 0, 0);
        const dsrt_layer *f1 = &net->layers[1], *f2 = &net->layers[3];
        memset(net->params, 0, net->n_params * sizeof *net->params);
        for (int k = 0; k < K; k++) {
            net->params[f1->w_off + (size_t)k * K + k] = 1.0f;
            net->params[f2->w_off + k] = 0.01f;
        }
        dsrt_net_params_changed(net);
        float x[K];
        int32_t label = 1;
        memcpy(x, ACT_PROBES, sizeof x);
        float loss;
        CHECK_OK(dsrt_net_forward_backward(net, x, &label, 1, &loss, NULL));
        float *xin = layer_out(net, 1, 1, 1), *y = layer_out(net, 2, 1, 1);
        double z0 = 0;
        for (int k = 0; k < K; k++) {
            CHECK(xin[k] == x[k] || (xin[k] == 0 && x[k] == 0));
            z0 += 0.01 * y[k];
        }
        double p0 = 1 / (1 + exp(-z0));
        int bad = 0;
        for (int k = 0; k < K; k++) {
            double want = act_ref(a, x[k]), g = 0.01 * p0 * act_ref_grad(a, x[k], y[k]);
            double got = net->grads[f1->b_off + k];
            if (fabs(y[k] - want) > 2e-6 * (1 + fabs(want)) ||
                fabs(got - g) > 1e-5 * fabs(g) + 1e-6 * 0.01 * p0) {
                if (bad++ < 4)
                    fprintf(stderr, "  %s at %.9g: y %.9g (want %.9g), dx %.9g (want %.9g)\n", act,
                            (double)x[k], (double)y[k], want, got, g);
            }
        }
        CHECK_EQ(bad, 0);
        free(xin);
        free(y);
        dsrt_net_destroy(net);
    }
}

/* The padded channels of a blocked layout (n, c / b, h, w, b) of md in
 * memory m that are not zero; -1 when md is no such layout. */
static long padding_nonzero(dnnl_memory_t m) {
    const dnnl_memory_desc_t *md = dsrt__cpu_md_of(m);
    const dnnl_blocking_desc_t *bk = &md->format_desc.blocking;
    if (md->format_kind != dnnl_blocked || md->ndims != 4 || bk->inner_nblks != 1 ||
        bk->inner_idxs[0] != 1)
        return -1;
    const float *v = dsrt__cpu_handle(m);
    int64_t b = bk->inner_blks[0];
    long bad = 0;
    for (int64_t n = 0; n < md->dims[0]; n++)
        for (int64_t c = md->dims[1]; c < md->padded_dims[1]; c++)
            for (int64_t h = 0; h < md->dims[2]; h++)
                for (int64_t w = 0; w < md->dims[3]; w++)
                    bad += v[md->offset0 + n * bk->strides[0] + c / b * bk->strides[1] +
                             h * bk->strides[2] + w * bk->strides[3] + c % b] != 0.0f;
    return bad;
}

/* Each activation on oneDNN's blocked layout (20 channels, forced by
 * DSRT_CPU_LAYOUT=blocked) gives what it gives channels-last (1e-5), and
 * the padded channels of its output and of its input's gradient stay zero. */
static void test_activation_layouts(void) {
    static const char *const acts[] = {"relu6",
                                       "clip min=-0.5 max=0.25",
                                       "sigmoid",
                                       "hardsigmoid",
                                       "hardsigmoid alpha=-0.3 beta=0.2",
                                       "hardswish",
                                       "silu",
                                       "gelu",
                                       "gelu approximate=tanh"};
    enum { N = 3 };
    for (size_t k = 0; k < sizeof acts / sizeof acts[0]; k++) {
        char desc[256];
        snprintf(desc, sizeof desc,
                 "input size=5x4x3\nconv filters=20 size=3 pad=1\n%s\nconv filters=5 size=1\n"
                 "fc outputs=3\nsoftmax\n",
                 acts[k]);
        dsrt_net *nets[2];
        float loss[2], *y[2];
        float x[N * 60];
        int32_t labels[N] = {0, 1, 2};
        fill(x, N * 60, 17, -2, 2);
        for (int b = 0; b < 2; b++) {
            setenv("DSRT_CPU_LAYOUT", b ? "nhwc" : "blocked", 1);
            nets[b] = make(desc, 0, 0, 0, 0, 0);
            unsetenv("DSRT_CPU_LAYOUT");
            CHECK_OK(dsrt_net_forward_backward(nets[b], x, labels, N, &loss[b], NULL));
            y[b] = layer_out(nets[b], 2, N, 1);
        }
        char what[160];
        snprintf(what, sizeof what, "%s, blocked against channels-last", acts[k]);
        size_t m = out_size(nets[0], 2, N);
        double *ref = malloc(m * sizeof *ref);
        double *gref = malloc(nets[1]->n_params * sizeof *gref);
        REQUIRE(ref && gref);
        for (size_t i = 0; i < m; i++) ref[i] = y[1][i];
        for (size_t i = 0; i < nets[1]->n_params; i++) gref[i] = nets[1]->grads[i];
        CHECK(close_arrays(y[0], ref, m, 1e-5, what));
        CHECK(close_arrays(nets[0]->grads, gref, nets[0]->n_params, 1e-5, what));
        CHECK_NEAR(loss[0], loss[1], 1e-5);
        const cpu_plan *p = ((cpu_backend *)nets[0]->be)->last;
        long out_pad = padding_nonzero(p->lp[2].out.mem),
             grad_pad = padding_nonzero(p->lp[1].out.diff);
        if (out_pad || grad_pad)
            fprintf(stderr,
                    "  %s: padded channels not zero: %ld in the output, %ld in the input's "
                    "gradient (-1: not blocked)\n",
                    acts[k], out_pad, grad_pad);
        CHECK_EQ(out_pad, 0);
        CHECK_EQ(grad_pad, 0);
        free(ref);
        free(gref);
        for (int b = 0; b < 2; b++) {
            free(y[b]);
            dsrt_net_destroy(nets[b]);
        }
    }
}

// ----------------------------------------------------------------------------
// Products, layer normalisation, padding, stochastic depth, partial windows

/* A pooling layer's output by PyTorch's rules (ceil=1's last window may
 * reach past the padding): the maximum over the window's inside; the
 * average's sum divided by the window clipped to the padded image (counting
 * the padding) or by its inside. */
static void ref_pool_ceil(const dsrt_layer *l, const float *x, double *yv, int n) {
    const dsrt_shape *is = &l->in, *os = &l->out;
    for (int b = 0; b < n; b++)
        for (int c = 0; c < os->c; c++)
            for (int oy = 0; oy < os->h; oy++)
                for (int ox = 0; ox < os->w; ox++) {
                    int y0 = oy * l->o.sh - l->pt, x0 = ox * l->o.sw - l->pl;
                    int y1 = DSRT_MIN(y0 + l->o.kh, is->h + l->pb),
                        x1 = DSRT_MIN(x0 + l->o.kw, is->w + l->pr);
                    double mx = -INFINITY, sum = 0;
                    int inside = 0;
                    for (int iy = DSRT_MAX(y0, 0); iy < DSRT_MIN(y1, is->h); iy++)
                        for (int ix = DSRT_MAX(x0, 0); ix < DSRT_MIN(x1, is->w); ix++) {
                            double v = in_at(x, is, b, c, iy, ix);
                            mx = fmax(mx, v);
                            sum += v;
                            inside++;
                        }
                    yv[(((size_t)b * os->c + c) * os->h + oy) * os->w + ox] =
                        l->kind == DSRT_LAYER_MAXPOOL ? mx
                        : l->o.count_pad              ? sum / ((y1 - y0) * (x1 - x0))
                                                      : sum / inside;
                }
}

/* Layer l's output from its inputs' (ins[k], plain NCHW) by the kinds'
 * definitions, in double. */
static void ref_kind(const dsrt_net *net, const dsrt_layer *l, int i, float *const *ins, double *yv,
                     int n, int train) {
    const dsrt_shape *s = &l->out;
    size_t hw = (size_t)s->h * s->w, m = (size_t)n * s->c * hw;
    const float *x = ins[0], *w = net->params + l->w_off, *b = net->params + l->b_off;
    switch (l->kind) {
    case DSRT_LAYER_MUL: {
        const dsrt_shape *g = &net->layers[l->inputs[1]].out;
        int gate = g->h == 1 && g->w == 1 && hw > 1;
        for (size_t k = 0; k < m; k++) yv[k] = (double)x[k] * ins[1][gate ? k / hw : k];
        break;
    }
    case DSRT_LAYER_SCALE:
        for (size_t k = 0; k < m; k++) yv[k] = (double)x[k] * w[k / hw % s->c];
        break;
    case DSRT_LAYER_LAYERNORM:
        for (int q = 0; q < n; q++)
            for (size_t p = 0; p < hw; p++) {
                double mean = 0, var = 0;
                for (int c = 0; c < s->c; c++) mean += x[((size_t)q * s->c + c) * hw + p];
                mean /= s->c;
                for (int c = 0; c < s->c; c++)
                    var += pow(x[((size_t)q * s->c + c) * hw + p] - mean, 2);
                var /= s->c;
                for (int c = 0; c < s->c; c++) {
                    size_t at = ((size_t)q * s->c + c) * hw + p;
                    yv[at] = (x[at] - mean) / sqrt(var + l->o.eps) * w[c] + b[c];
                }
            }
        break;
    case DSRT_LAYER_PAD:
        for (size_t k = 0; k < m; k++) {
            int col = (int)(k % s->w), row = (int)(k / s->w % s->h);
            size_t qc = k / hw;
            int r = row - l->pt, cc = col - l->pl;
            yv[k] = r >= 0 && r < l->in.h && cc >= 0 && cc < l->in.w
                        ? x[(qc * l->in.h + r) * l->in.w + cc]
                        : (double)dsrt__pad_value(l);
        }
        break;
    case DSRT_LAYER_STOCHASTIC_DEPTH: {
        float *mask = malloc((size_t)n * sizeof *mask);
        REQUIRE(mask);
        ref_drop_path_mask(mask, n, net->opts.seed, (uint64_t)net->iteration, (uint64_t)i, l->o.p);
        for (size_t k = 0; k < m; k++) yv[k] = train ? (double)x[k] * mask[k / (m / n)] : x[k];
        free(mask);
        break;
    }
    default:
        ref_pool_ceil(l, x, yv, n);
        break;
    }
}

/* Every layer of the kinds above (and pooling with ceil=1) in a forward,
 * against the reference from the outputs of the layers it takes, within
 * 1e-4 as forward_check; the factors, gamma and beta drawn at random. */
static void kinds_check(const char *desc, int h, int w, int c, int n, int train) {
    dsrt_net *net = make(desc, h, w, c, 3, 0);
    dsrt_rng r = dsrt_rng_init(21, 0, 0, 0);
    for (int i = 0; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        if (l->kind != DSRT_LAYER_SCALE && l->kind != DSRT_LAYER_LAYERNORM) continue;
        for (size_t k = 0; k < l->w_n; k++)
            net->params[l->w_off + k] = (float)(0.5 + dsrt_rng_uniform(&r));
        for (size_t k = 0; k < l->b_n; k++)
            net->params[l->b_off + k] = (float)(dsrt_rng_uniform(&r) - 0.5);
    }
    dsrt_net_params_changed(net);
    size_t per = (size_t)h * w * c;
    float *x = malloc((size_t)n * per * sizeof *x);
    int32_t labels[16] = {0};
    REQUIRE(x && n <= 16);
    fill(x, (size_t)n * per, 5, -2, 2);
    dsrt_net_set_iteration(net, 12);
    REQUIRE(dsrt__net_forward(net, x, n, train, labels, NULL, NULL, NULL) == 0);
    int checked = 0;
    for (int i = 1; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        int ceil = (l->kind == DSRT_LAYER_MAXPOOL || l->kind == DSRT_LAYER_AVGPOOL) &&
                   strstr(desc, "ceil=1");
        if (l->kind != DSRT_LAYER_MUL && l->kind != DSRT_LAYER_SCALE &&
            l->kind != DSRT_LAYER_LAYERNORM && l->kind != DSRT_LAYER_PAD &&
            l->kind != DSRT_LAYER_STOCHASTIC_DEPTH && !ceil)
            continue;
        float *ins[2] = {NULL, NULL};
        for (int k = 0; k < l->n_inputs; k++) ins[k] = layer_out(net, l->inputs[k], n, train);
        float *y = layer_out(net, i, n, train);
        size_t m = out_size(net, i, n);
        double *ref = calloc(m, sizeof *ref);
        REQUIRE(ref);
        ref_kind(net, l, i, ins, ref, n, train);
        char what[96];
        snprintf(what, sizeof what, "%s (%s, %s)", l->name, l->type, train ? "train" : "infer");
        CHECK(close_arrays(y, ref, m, 1e-4, what));
        checked++;
        free(ins[0]), free(ins[1]), free(y), free(ref);
    }
    CHECK_GT(checked, 0);
    free(x);
    dsrt_net_destroy(net);
}

static const char *const KINDS_NET =
    "input name=in\nconv name=x filters=6 size=3 pad=1\ngap inputs=in\nfc name=g outputs=6\n"
    "mul name=m inputs=x,g\nconv name=y filters=6 size=1 inputs=in\nmul name=p inputs=m,y\n"
    "scale init=0.5\nlayernorm eps=1e-3\nstochastic_depth p=0.5\npad pad=1,0,2,1 value=-0.5\n"
    "avgpool size=3 stride=2 pad=1 ceil=1\nmaxpool size=2 stride=2 ceil=1\nfc outputs=3\n"
    "softmax\n";

/* mul (a gate from a fully connected layer, and two values of one shape),
 * scale, layernorm (channels of every pixel, and of one-pixel inputs, one
 * a fully connected layer's), pad, stochastic depth (its images' factors
 * the reference draw in training, the identity at inference) and pooling
 * with ceil=1 against their references; then their gradients against
 * finite differences, fused and not. */
static void test_forward_kinds(void) {
    for (int train = 0; train < 2; train++) {
        kinds_check(KINDS_NET, 7, 6, 3, 5, train);
        kinds_check(
            "input\nconv filters=5 size=1\ngap\nlayernorm\nfc outputs=6\nlayernorm eps=0.1\n"
            "scale init=-2\nfc outputs=3\nsoftmax\n",
            3, 3, 2, 4, train);
        kinds_check("input\nconv filters=4 size=1\navgpool size=3 stride=2 ceil=1 count_pad=0\n"
                    "avgpool size=2 stride=2 pad=1,0,1,0 ceil=1\nfc outputs=3\nsoftmax\n",
                    8, 9, 2, 3, train);
    }
    for (int fuse = 0; fuse < 2; fuse++) {
        grad_check(KINDS_NET, 7, 6, 3, 3, 4, fuse);
        grad_check("input\nconv filters=4 size=3 pad=1\nlayernorm\nfc outputs=3\nsoftmax\n", 5, 4,
                   3, 3, 3, fuse);
        grad_check("input\nconv filters=3 size=1\navgpool size=3 stride=2 ceil=1 count_pad=0\n"
                   "fc outputs=3\nsoftmax\n",
                   8, 8, 2, 3, 3, fuse);
    }
}

/* ceil=1 against PyTorch (1.13)'s avg_pool2d and max_pool2d with
 * ceil_mode=True (count_include_pad as count_pad) on a 6x6 image of
 * (k % 7) + 1: the output sizes and values, the divisors of the partial
 * windows those of the window clipped to the padded input. */
static void test_pool_ceil_pytorch(void) {
    static const struct {
        const char *layer;
        int oh, ow;
        float y[16];
    } cases[] = {
        {"avgpool size=3 stride=2 pad=1 ceil=1",
         4,
         4,
         {1.22222221f, 1.66666663f, 3, 1.83333337f, 3.55555558f, 3.33333325f, 3, 2, 3, 5.22222233f,
          3.33333325f, 1, 1.16666663f, 2.5f, 2.33333325f, 0.25f}},
        {"avgpool size=3 stride=2 pad=1 ceil=1 count_pad=0",
         4,
         4,
         {2.75f, 2.5f, 4.5f, 5.5f, 5.33333349f, 3.33333325f, 3, 4, 4.5f, 5.22222233f, 3.33333325f,
          2, 3.5f, 5, 4.66666651f, 1}},
        {"avgpool size=2 stride=2 pad=1 ceil=1",
         4,
         4,
         {0.25f, 1.25f, 2.25f, 1.5f, 3.25f, 2.75f, 3, 2.25f, 2.25f, 6, 2.75f, 1.25f, 0.75f, 2.25f,
          3.25f, 0.25f}},
        {"avgpool size=3 stride=3 pad=1 ceil=1",
         3,
         3,
         {1.22222221f, 2.33333325f, 1.83333337f, 3.66666675f, 3.33333325f, 1.5f, 1.16666663f, 3,
          0.25f}},
        {"avgpool size=3 stride=2 ceil=1",
         3,
         3,
         {3.33333325f, 3, 4.5f, 5.22222233f, 3.33333325f, 2.5f, 4.5f, 5.33333349f, 2.75f}},
        {"maxpool size=3 stride=2 pad=1 ceil=1",
         4,
         4,
         {7, 4, 6, 6, 7, 7, 5, 5, 6, 7, 7, 3, 4, 6, 7, 1}},
        {"maxpool size=2 stride=2 ceil=1", 3, 3, {7, 4, 6, 7, 7, 4, 5, 7, 7}},
        {"maxpool size=3 stride=3 pad=1 ceil=1", 3, 3, {7, 5, 6, 7, 7, 4, 4, 7, 1}},
    };
    float x[36];
    for (int k = 0; k < 36; k++) x[k] = (float)(k % 7 + 1);
    for (size_t c = 0; c < DSRT_ARRAY_SIZE(cases); c++) {
        char desc[160];
        snprintf(desc, sizeof desc, "input size=6x6x1\n%s\nfc outputs=2\nsoftmax\n",
                 cases[c].layer);
        dsrt_net *net = make(desc, 0, 0, 0, 0, 0);
        const dsrt_layer *l = &net->layers[1];
        CHECK_EQ(l->out.h, cases[c].oh);
        CHECK_EQ(l->out.w, cases[c].ow);
        for (int train = 0; train < 2 && l->out.h == cases[c].oh && l->out.w == cases[c].ow;
             train++) {
            int32_t label = 0;
            REQUIRE(dsrt__net_forward(net, x, 1, train, &label, NULL, NULL, NULL) == 0);
            float *y = layer_out(net, 1, 1, train);
            double want[16];
            for (int k = 0; k < cases[c].oh * cases[c].ow; k++) want[k] = cases[c].y[k];
            CHECK(close_arrays(y, want, (size_t)cases[c].oh * cases[c].ow, 1e-6, cases[c].layer));
            free(y);
        }
        dsrt_net_destroy(net);
    }
}

static void expect_error(const char *desc, const char *a, const char *b);

/* The shapes the new kinds make, and what they refuse. */
static void test_kind_shapes(void) {
    dsrt_net *net =
        make("input size=5x6x2\npad pad=1,2,3,4\nfc outputs=2\nsoftmax\n", 0, 0, 0, 0, 0);
    CHECK_EQ(net->layers[1].out.h, 8);
    CHECK_EQ(net->layers[1].out.w, 13);
    CHECK_EQ(net->layers[1].out.c, 2);
    dsrt_net_destroy(net);
    net = make("input size=5x6x2\npad pad=2\nfc outputs=2\nsoftmax\n", 0, 0, 0, 0, 0);
    CHECK_EQ(net->layers[1].out.h, 9);
    CHECK_EQ(net->layers[1].out.w, 10);
    dsrt_net_destroy(net);
    expect_error("input\npad pad=same\nfc outputs=3\nsoftmax\n", "line 2", "'same'");
    expect_error("input\npad\nfc outputs=3\nsoftmax\n", "line 2", "option 'pad' is required");
    expect_error("input name=in\nconv name=a filters=2 size=1\nconv name=b filters=3 size=1 "
                 "inputs=in\nmul inputs=a,b\nfc outputs=3\nsoftmax\n",
                 "line 4", "one shape, or the second 1x1 with the first's channels");
    expect_error("input\nconv filters=2 size=1\nmul\nfc outputs=3\nsoftmax\n", "line 3",
                 "it takes two inputs, 1 given");
    expect_error("input\nstochastic_depth\nfc outputs=3\nsoftmax\n", "line 2",
                 "option 'p' is required");
    expect_error("input\nstochastic_depth p=1\nfc outputs=3\nsoftmax\n", "line 2", "out of range");
    expect_error("input\nlayernorm eps=0\nfc outputs=3\nsoftmax\n", "line 2", "out of range");
    /* A gate of the first's channels from a fully connected layer. */
    net = make("input name=in size=4x4x3\ngap\nfc name=g outputs=3\nmul inputs=in,g\nfc outputs=2\n"
               "softmax\n",
               0, 0, 0, 0, 0);
    CHECK_EQ(net->layers[3].out.h, 4);
    CHECK_EQ(net->layers[3].out.c, 3);
    dsrt_net_destroy(net);
}

/* The input layer's normalisations against their formulas. */
static void test_input_normalization(void) {
    const char *modes[] = {"zerocenter", "zscore", "rescale", "rescale-symmetric"};
    for (int m = 0; m < 4; m++) {
        char desc[256];
        snprintf(desc, sizeof desc,
                 "input normalization=%s mean=0.5,-1 std=2,4 min=-1,0 max=3,2\nfc outputs=2\n"
                 "softmax\n",
                 modes[m]);
        dsrt_net *net = make(desc, 3, 2, 2, 2, 0);
        float x[2 * 12];
        int32_t lab[2] = {0, 1};
        fill(x, 24, 9, -3, 3);
        float sc[4];
        CHECK_OK(dsrt_net_predict(net, x, 2, sc, lab, NULL, NULL));
        float *y = layer_out(net, 0, 2, 0);
        double ref[24];
        const double mean[] = {0.5, -1}, sd[] = {2, 4}, mn[] = {-1, 0}, mx[] = {3, 2};
        for (int k = 0; k < 24; k++) {
            int c = (k / 6) % 2;
            double v = x[k];
            ref[k] = m == 0   ? v - mean[c]
                     : m == 1 ? (v - mean[c]) / sd[c]
                     : m == 2 ? (v - mn[c]) / (mx[c] - mn[c])
                              : 2 * (v - mn[c]) / (mx[c] - mn[c]) - 1;
        }
        CHECK(close_arrays(y, ref, 24, 1e-5, modes[m]));
        free(y);
        /* Statistics set through the API take effect. */
        float mean2[2] = {1, 2}, std2[2] = {1, 1};
        CHECK_OK(dsrt_net_set_input_stats(net, mean2, std2, NULL, NULL));
        float bad[2] = {1, 0};
        CHECK_EQ(dsrt_net_set_input_stats(net, NULL, bad, NULL, NULL), DSRT_EOPTION);
        dsrt_net_destroy(net);
    }
}

// ----------------------------------------------------------------------------
// Fusion, batch sizes, modes

static void test_fusion_equivalence(void) {
    const char *desc = dsrt_net_builtin("cifar", NULL);
    dsrt_net *a = make(desc, 0, 0, 0, 10, 1), *b = make(desc, 0, 0, 0, 10, 0);
    CHECK_EQ(a->n_params, b->n_params);
    int n = 5;
    size_t per = 3 * 32 * 32;
    float *x = malloc(n * per * sizeof *x);
    int32_t y[5] = {1, 2, 3, 4, 5};
    REQUIRE(x);
    fill(x, n * per, 4, 0, 1);
    float la, lb;
    CHECK_OK(dsrt_net_forward_backward(a, x, y, n, &la, NULL));
    CHECK_OK(dsrt_net_forward_backward(b, x, y, n, &lb, NULL));
    CHECK_NEAR(la, lb, 1e-5);
    double dd = 0, nn = 0;
    for (size_t k = 0; k < a->n_params; k++) {
        dd += pow(a->grads[k] - b->grads[k], 2);
        nn += pow(b->grads[k], 2);
    }
    CHECK(sqrt(dd) <= 1e-4 * sqrt(nn));
    int fused = 0;
    for (int i = 0; i < a->n_layers; i++) fused += a->layers[i].fused_away;
    CHECK_EQ(fused, 12);
    free(x);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

/* Different batch sizes (new plans), inference after training, and the
 * batch-norm running averages. */
static void test_batch_sizes_and_modes(void) {
    dsrt_net *net = make("input\nconv filters=4 size=3\nbatchnorm momentum=0.5\nrelu\n"
                         "fc outputs=3\nsoftmax\n",
                         6, 6, 1, 3, 1);
    float x[7 * 36];
    int32_t y[7] = {0, 1, 2, 0, 1, 2, 0};
    fill(x, sizeof x / sizeof x[0], 2, 0, 1);
    float l7, l3, s7[21], s3[9];
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 7, &l7, NULL));
    float *bo = layer_out(net, 1, 7, 1);
    /* running mean after one step with momentum 0.5 from 0: half the batch mean */
    const dsrt_layer *bn = &net->layers[2];
    for (int c = 0; c < 4; c++) {
        double mean = 0;
        for (int b = 0; b < 7; b++)
            for (int k = 0; k < 16; k++) mean += bo[(b * 4 + c) * 16 + k];
        mean /= 7 * 16;
        CHECK_NEAR(net->state[bn->s_off + c], 0.5 * mean, 1e-5);
    }
    free(bo);
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 3, &l3, NULL));
    CHECK_OK(dsrt_net_predict(net, x, 7, s7, NULL, NULL, NULL));
    CHECK_OK(dsrt_net_predict(net, x, 3, s3, NULL, NULL, NULL));
    for (int k = 0; k < 9; k++) CHECK_NEAR(s3[k], s7[k], 1e-6);
    for (int b = 0; b < 7; b++) {
        double s = 0;
        for (int k = 0; k < 3; k++) s += s7[b * 3 + k];
        CHECK_NEAR(s, 1.0, 1e-5);
    }
    /* More sizes than plan slots, then back. */
    for (int n = 1; n <= 7; n++) CHECK_OK(dsrt_net_forward_backward(net, x, y, n, NULL, NULL));
    float again[21];
    CHECK_OK(dsrt_net_predict(net, x, 7, again, NULL, NULL, NULL));
    /* Bad calls. */
    int32_t bad[2] = {0, 3};
    CHECK_EQ(dsrt_net_forward_backward(net, x, bad, 2, NULL, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "label 3");
    CHECK_EQ(dsrt_net_forward_backward(net, x, y, 0, NULL, NULL), -EINVAL);
    dsrt_net_destroy(net);
}

// ----------------------------------------------------------------------------
// Descriptions

static void expect_error(const char *desc, const char *a, const char *b) {
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, desc, 8, 8, 1, 3, NULL);
    CHECK(rc != 0);
    CHECK(net == NULL);
    CHECK_CONTAINS(dsrt_last_error(), a);
    if (b) CHECK_CONTAINS(dsrt_last_error(), b);
}

static void test_parse_errors(void) {
    expect_error("input\nconvv filters=3\nsoftmax\n", "line 2", "unknown layer type 'convv'");
    expect_error("input\n# c\nconv filtrs=3 size=3\nsoftmax\n", "line 3",
                 "unknown option 'filtrs'");
    expect_error("input\nconv size=3\nsoftmax\n", "line 2", "option 'filters' is required");
    expect_error("input\nconv filters=x size=3\nfc outputs=3\nsoftmax\n", "line 2",
                 "option 'filters': expected an integer");
    expect_error("input\nconv filters=0 size=3\nfc outputs=3\nsoftmax\n", "line 2", "out of range");
    expect_error("input\nconv filters=2 size=3 size=2\nsoftmax\n", "line 2", "given twice");
    expect_error("input\nconv filters=2 size=9\nfc outputs=3\nsoftmax\n", "line 2", "does not fit");
    expect_error("input\nconv filters=3 size=3 groups=2\nfc outputs=3\nsoftmax\n", "line 2",
                 "option 'groups'");
    expect_error("input\nconv name=a filters=3 size=3\nrelu name=a\nfc outputs=3\nsoftmax\n",
                 "line 3", "name 'a' is already used on line 2");
    expect_error("conv filters=2 size=3\nsoftmax\n", "line 1", "first layer must be 'input'");
    expect_error("input\nfc outputs=3\n", "line 2", "last layer must be 'softmax'");
    expect_error("input\nfc outputs=4\nsoftmax\n", "line 3", "3 classes");
    expect_error("input normalization=foo\nfc outputs=3\nsoftmax\n", "line 1",
                 "not one of none|zerocenter");
    expect_error("input mean=1,2\nfc outputs=3\nsoftmax\n", "line 1", "option 'mean'");
    expect_error("input\npool size=2\nsoftmax\n", "line 2", "unknown layer type");
    expect_error("input\nmaxpool size=2 pad=1,2\nfc outputs=3\nsoftmax\n", "line 2",
                 "option 'pad'");
    expect_error("input\nlrn size=4\nfc outputs=3\nsoftmax\n", "line 2", "even");
    expect_error("input\nconv filters=2 size=3 = \nsoftmax\n", "line 2", "expected name=value");
    expect_error("nosuchnet", "unknown network 'nosuchnet'", "digits");
    dsrt_net *net = NULL;
    CHECK_EQ(dsrt_net_create(&net, "input\nfc outputs=classes\nsoftmax\n", 4, 4, 1, 0, NULL),
             DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "class count is not known");
    CHECK_EQ(dsrt_net_create(&net, "input\nfc outputs=3\nsoftmax\n", 0, 0, 0, 0, NULL),
             DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "input size is not known");
    /* Comments, blank lines, tabs, default names. */
    net = make("# a net\n\n  input size=4x5x2   # HxWxC\n\tconv filters=3 size=3\n"
               "conv filters=2 size=1\nfc outputs=classes\nsoftmax\n",
               0, 0, 0, 4, 1);
    CHECK_EQ(net->input.h, 4);
    CHECK_EQ(net->input.w, 5);
    CHECK_EQ(net->input.c, 2);
    CHECK_STR_EQ(net->layers[1].name, "conv_1");
    CHECK_STR_EQ(net->layers[2].name, "conv_2");
    CHECK_EQ(net->layers[2].line, 5);
    CHECK_EQ(net->classes, 4);
    dsrt_net_destroy(net);
    char help[8192];
    CHECK(dsrt__desc_help(help, sizeof help) < sizeof help);
    CHECK_CONTAINS(help, "conv");
    CHECK_CONTAINS(help, "filters=(required)");
}

static size_t learnable(const dsrt_net *net) {
    size_t s = 0;
    for (int i = 0; i < net->n_layers; i++) s += net->layers[i].w_n + net->layers[i].b_n;
    return s;
}

static void test_builtin_sizes(void) {
    /* Parameter counts of the peer benchmark's PyTorch modules (BN scale and
     * shift included, running statistics not). */
    dsrt_net *d = make("digits", 0, 0, 0, 10, 1);
    CHECK_EQ(learnable(d), 520 + 40 + 3620 + 40 + 3620 + 40 + 115210);
    CHECK_EQ(d->layers[d->n_layers - 2].in.c * d->layers[d->n_layers - 2].in.h *
                 d->layers[d->n_layers - 2].in.w,
             24 * 24 * 20);
    dsrt_net_destroy(d);
    dsrt_net *c = make("cifar", 0, 0, 0, 10, 1);
    size_t conv = 0, widths[] = {32, 64, 128}, cin = 3;
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 4; k++) {
            conv += widths[b] * cin * 9 + widths[b] + 2 * widths[b];
            cin = widths[b];
        }
    CHECK_EQ(learnable(c), conv + 128 * 10 + 10);
    CHECK_EQ(c->layers[c->n_layers - 2].in.h, 1);
    dsrt_net_destroy(c);
    dsrt_net *a = make("alexnet", 0, 0, 0, 55, 1);
    CHECK_EQ(learnable(a),
             34944 + 307456 + 885120 + 663936 + 442624 + 37752832 + 16781312 + (4096 * 55 + 55));
    int fc6 = 0;
    while (strcmp(a->layers[fc6].name, "fc6")) fc6++;
    CHECK_EQ(a->layers[fc6].in.c, 256);
    CHECK_EQ(a->layers[fc6].in.h, 6);
    dsrt_net_info info;
    dsrt_net_get_info(a, &info);
    CHECK_EQ(info.classes, 55);
    CHECK(info.forward_flops > 1.3e9 && info.forward_flops < 1.6e9);
    dsrt_net_destroy(a);
    /* The residual and mobile networks: learnables as torchvision counts
     * them (1000 classes), and the peer benchmark's resnet20 (10 classes);
     * the shape before the pooling (7x7x512, 7x7x2048, 8x8x64, ...). */
    static const struct {
        const char *name;
        int classes;
        size_t learnable;
        int c, hw;
        double gflops_lo, gflops_hi;
    } res[] = {{"resnet18", 1000, 11689512, 512, 7, 3.4, 3.9},
               {"resnet50", 1000, 25557032, 2048, 7, 7.6, 8.6},
               {"resnet20", 10, 272474, 64, 8, 0.07, 0.09},
               /* torchvision's mobile nets (1000 classes): their GFLOP are
                * twice the multiply-adds torchvision's docs give */
               {"mobilenet_v2", 1000, 3504872, 1280, 7, 0.58, 0.63},
               {"mobilenet_v3_large", 1000, 5483032, 960, 7, 0.42, 0.45},
               {"mobilenet_v3_small", 1000, 2542856, 576, 7, 0.10, 0.12},
               {"efficientnet_b0", 1000, 5288548, 1280, 7, 0.75, 0.80}};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(res); k++) {
        dsrt_net *r = make(res[k].name, 0, 0, 0, res[k].classes, 1);
        CHECK_EQ(learnable(r), res[k].learnable);
        const dsrt_layer *pool = NULL;
        for (int i = 0; i < r->n_layers; i++)
            if (!strcmp(r->layers[i].name, "pool")) pool = &r->layers[i];
        REQUIRE(pool);
        CHECK_STR_EQ(pool->type, "gap");
        CHECK_EQ(pool->in.c, res[k].c);
        CHECK_EQ(pool->in.h, res[k].hw);
        dsrt_net_get_info(r, &info);
        fprintf(stderr, "  %s: %zu learnables, %.3f GFLOP forward an image\n", res[k].name,
                info.learnable, info.forward_flops * 1e-9);
        CHECK(info.forward_flops * 1e-9 > res[k].gflops_lo &&
              info.forward_flops * 1e-9 < res[k].gflops_hi);
        dsrt_net_destroy(r);
    }
}

// ----------------------------------------------------------------------------
// Buckets

typedef struct {
    int calls, order[64];
    dsrt_range r[64];
} ready_log;

static void on_ready(void *ctx, int bucket, dsrt_range range) {
    ready_log *log = ctx;
    if (log->calls < 64) {
        log->order[log->calls] = bucket;
        log->r[log->calls] = range;
    }
    log->calls++;
}

static void test_buckets(void) {
    dsrt_net *net = make("cifar", 0, 0, 0, 10, 1);
    dsrt_range r[64];
    int nb = dsrt_net_buckets(net, 64 << 10, r, 64);
    CHECK(nb > 1 && nb < 64);
    /* Contiguous, back to front, covering the buffer. */
    size_t end = net->n_params;
    for (int k = 0; k < nb; k++) {
        CHECK_EQ(r[k].offset + r[k].count, end);
        end = r[k].offset;
        if (k < nb - 1) CHECK_GE(r[k].count * 4, 64 << 10);
    }
    CHECK_EQ(end, 0);
    CHECK_EQ(dsrt_net_buckets(net, 0, NULL, 0), 25); /* one a layer: 12 conv, 12 bn, fc */
    ready_log log = {0};
    CHECK_OK(dsrt_net_set_grad_ready(net, 64 << 10, on_ready, &log));
    float *x = malloc(2 * 3 * 32 * 32 * sizeof *x);
    int32_t y[2] = {0, 1};
    REQUIRE(x);
    fill(x, 2 * 3 * 32 * 32, 1, 0, 1);
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 2, NULL, NULL));
    CHECK_EQ(log.calls, nb);
    for (int k = 0; k < nb && k < 64; k++) {
        CHECK_EQ(log.order[k], k);
        CHECK_EQ(log.r[k].offset, r[k].offset);
    }
    CHECK_OK(dsrt_net_set_grad_ready(net, 0, NULL, NULL));
    log.calls = 0;
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 2, NULL, NULL));
    CHECK_EQ(log.calls, 0);
    free(x);
    dsrt_net_destroy(net);
}

// ----------------------------------------------------------------------------
// Training

/* Two classes: a bright 3x3 blob in the left or the right half, on noise. */
static void make_blobs(float *x, int32_t *y, int n, uint64_t seed) {
    dsrt_rng r = dsrt_rng_init(seed, 0, 0, 9);
    for (int b = 0; b < n; b++) {
        float *im = x + (size_t)b * 12 * 12;
        for (int k = 0; k < 144; k++) im[k] = 0.3f * (float)dsrt_rng_uniform(&r);
        int cls = (int)dsrt_rng_below(&r, 2);
        int cx = (int)dsrt_rng_below(&r, 4) + (cls ? 7 : 1), cy = (int)dsrt_rng_below(&r, 9) + 1;
        for (int dy = -1; dy <= 1; dy++)
            for (int dx = -1; dx <= 1; dx++) im[(cy + dy) * 12 + cx + dx] += 1.0f;
        y[b] = cls;
    }
}

static void train_easy(dsrt_solver solver, double lr) {
    dsrt_net *net =
        make("input size=12x12x1 normalization=zerocenter mean=0.2\n"
             "conv filters=4 size=3 pad=same\nbatchnorm\nrelu\nmaxpool size=2 stride=2\n"
             "conv filters=8 size=3 pad=same\nbatchnorm\nrelu\ngap\n"
             "dropout p=0.1\nfc outputs=classes\nsoftmax\n",
             0, 0, 0, 2, 1);
    dsrt_optimizer_options o = dsrt_optimizer_defaults(solver);
    o.learn_rate = lr;
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    enum { B = 32, TEST = 256 };
    float x[B * 144], tx[TEST * 144];
    int32_t y[B], ty[TEST];
    float loss = 0;
    for (int step = 0; step < 150; step++) {
        make_blobs(x, y, B, (uint64_t)step);
        CHECK_OK(dsrt_net_forward_backward(net, x, y, B, &loss, NULL));
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    }
    make_blobs(tx, ty, TEST, 99999);
    int correct = 0;
    float tloss;
    CHECK_OK(dsrt_net_predict(net, tx, TEST, NULL, ty, &tloss, &correct));
    fprintf(stderr, "  solver %d: last training loss %.4f, test accuracy %d/%d, test loss %.4f\n",
            (int)solver, (double)loss, correct, TEST, (double)tloss);
    CHECK_GE(correct, TEST * 98 / 100);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

static void test_training_converges(void) {
    train_easy(DSRT_SOLVER_SGDM, 0.05);
    train_easy(DSRT_SOLVER_ADAM, 0.01);
    train_easy(DSRT_SOLVER_RMSPROP, 0.005);
}

/* The same seed gives the same weights and the same training. */
static void test_determinism(void) {
    dsrt_net *a = make("digits", 0, 0, 0, 10, 1), *b = make("digits", 0, 0, 0, 10, 1);
    CHECK(memcmp(a->params, b->params, a->n_params * sizeof(float)) == 0);
    dsrt_net_options o = dsrt_net_defaults();
    o.seed = 8;
    dsrt_net *c;
    CHECK_OK(dsrt_net_create(&c, "digits", 0, 0, 0, 10, &o));
    CHECK(memcmp(a->params, c->params, a->n_params * sizeof(float)) != 0);
    /* Glorot bound of conv2: sqrt(6 / (9*20 + 9*20)) */
    const dsrt_layer *l = &a->layers[4];
    double bound = sqrt(6.0 / 360), mx = 0;
    for (size_t k = 0; k < l->w_n; k++) mx = fmax(mx, fabs(a->params[l->w_off + k]));
    CHECK(mx <= bound && mx > 0.9 * bound);
    dsrt_net_destroy(c);
    o.init = DSRT_INIT_HE;
    CHECK_OK(dsrt_net_create(&c, "digits", 0, 0, 0, 10, &o));
    double ss = 0;
    for (size_t k = 0; k < l->w_n; k++) ss += pow(c->params[l->w_off + k], 2);
    CHECK_NEAR(sqrt(ss / l->w_n), sqrt(2.0 / 180), 0.2 * sqrt(2.0 / 180));
    CHECK(l->b_n > 0);
    for (size_t k = 0; k < l->b_n; k++) CHECK(c->params[l->b_off + k] == 0.0f);
    dsrt_net_destroy(c);
    /* PyTorch's default: weights and biases uniform in +-1/sqrt(fan_in),
     * fan_in 9*20; the standard deviation of a uniform is its bound/sqrt(3). */
    o.init = DSRT_INIT_UNIFORM;
    CHECK_OK(dsrt_net_create(&c, "digits", 0, 0, 0, 10, &o));
    double ub = 1.0 / sqrt(180.0);
    ss = 0, mx = 0;
    for (size_t k = 0; k < l->w_n; k++) {
        ss += pow(c->params[l->w_off + k], 2);
        mx = fmax(mx, fabs(c->params[l->w_off + k]));
    }
    CHECK(mx <= ub && mx > 0.9 * ub);
    CHECK_NEAR(sqrt(ss / l->w_n), ub / sqrt(3.0), 0.1 * ub / sqrt(3.0));
    double bmx = 0;
    for (size_t k = 0; k < l->b_n; k++) bmx = fmax(bmx, fabs(c->params[l->b_off + k]));
    CHECK(bmx > 0 && bmx <= ub);
    dsrt_net_destroy(c);
    /* A layer's init= names it in a description, over the net's. */
    CHECK_OK(dsrt_net_create(&c,
                             "input size=4x4x1\nconv filters=8 size=3 init=uniform\nfc outputs=2\n"
                             "softmax\n",
                             0, 0, 0, 2, NULL));
    const dsrt_layer *cu = &c->layers[1];
    mx = 0;
    for (size_t k = 0; k < cu->w_n; k++) mx = fmax(mx, fabs(c->params[cu->w_off + k]));
    CHECK(mx <= 1.0 / 3.0 && mx > 0.8 / 3.0);
    dsrt_net_destroy(c);
    CHECK(dsrt_net_create(&c,
                          "input size=4x4x1\nconv filters=8 size=3 init=kaiming\nfc outputs=2\n"
                          "softmax\n",
                          0, 0, 0, 2, NULL) == DSRT_EOPTION);
    CHECK(strstr(dsrt_last_error(), "default|glorot|he|uniform") != NULL);
    float x[3 * 784];
    int32_t y[3] = {1, 2, 3};
    fill(x, 3 * 784, 5, 0, 1);
    float la, lb;
    CHECK_OK(dsrt_net_forward_backward(a, x, y, 3, &la, NULL));
    CHECK_OK(dsrt_net_forward_backward(b, x, y, 3, &lb, NULL));
    CHECK(la == lb);
    CHECK(memcmp(a->grads, b->grads, a->n_params * sizeof(float)) == 0);
    CHECK_EQ(dsrt_net_iteration(a), 1);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

// ----------------------------------------------------------------------------
// Graphs: add, concat, outputs that feed several layers

/* A ResNet basic block (conv-bn-relu-conv-bn plus a projected skip, summed,
 * ReLU), a block whose skip is the identity (the ReLU's output feeds two
 * layers: its gradient is the sum of theirs), a three-way add, a concat of
 * branches of different widths (one of them the input itself), and an
 * Inception-like join of pooled and convolved branches; each with and
 * without fusion, against central differences. */
static void test_grad_graph(void) {
    const char *block =
        "input\nconv name=c1 filters=4 size=3 pad=1 bias=0\nbatchnorm name=b1\nrelu name=r1\n"
        "conv filters=4 size=3 pad=1 bias=0\nbatchnorm name=b2\n"
        "conv name=skip filters=4 size=1 bias=0 inputs=input_1\nbatchnorm name=bs\n"
        "add inputs=b2,bs relu=1\nfc outputs=3\nsoftmax\n";
    const char *identity =
        "input\nconv filters=3 size=3 pad=1\nrelu name=r0\n"
        "conv filters=3 size=3 pad=1\nrelu\nconv name=c2 filters=3 size=3 pad=1\n"
        "add inputs=c2,r0\nrelu\nfc outputs=3\nsoftmax\n";
    /* A leaky ReLU the add computes (its gradient's slope below zero). */
    const char *leaky = "input\nconv filters=3 size=3 pad=1\nrelu name=r0\n"
                        "conv name=c2 filters=3 size=3 pad=1\n"
                        "add inputs=c2,r0\nleakyrelu leak=0.1\nfc outputs=3\nsoftmax\n";
    const char *three =
        "input\nconv name=a filters=2 size=1\nconv name=b filters=2 size=3 pad=1 inputs=input_1\n"
        "conv name=c filters=2 size=3 pad=same stride=1 inputs=input_1\n"
        "add inputs=a,b,c relu=1\nfc outputs=3\nsoftmax\n";
    const char *cat = "input\nconv name=a filters=3 size=1\nrelu name=ra\n"
                      "conv name=b filters=5 size=3 pad=1 inputs=input_1\n"
                      "concat inputs=ra,b,input_1\nconv filters=4 size=1\nfc outputs=3\nsoftmax\n";
    const char *inception =
        "input\nconv name=stem filters=6 size=3 pad=1\nrelu name=s\n"
        "conv name=b1 filters=2 size=1 inputs=s\n"
        "conv name=b2a filters=3 size=1 inputs=s\nrelu\nconv name=b2 filters=2 size=3 pad=1\n"
        "maxpool name=p size=3 stride=1 pad=1 inputs=s\nconv name=b3 filters=2 size=1\n"
        "concat inputs=b1,b2,b3\navgpool size=2 stride=2\nfc outputs=3\nsoftmax\n";
    /* Joins of fully connected outputs ((n, c) tensors), with each other
     * and with a pooled (n, c, 1, 1) one. */
    const char *fcs = "input\nconv name=c filters=4 size=3 pad=1\nfc name=a outputs=4\nfc name=b "
                      "outputs=4 inputs=c\n"
                      "gap name=g inputs=c\nadd inputs=a,b,g relu=1\nfc name=d outputs=5 inputs=c\n"
                      "concat inputs=add_1,d,g\nfc outputs=3\nsoftmax\n";
    for (int fuse = 0; fuse < 2; fuse++) {
        grad_check(fcs, 4, 4, 2, 3, 3, fuse);
        grad_check(block, 5, 5, 2, 3, 4, fuse);
        grad_check(identity, 4, 4, 2, 3, 3, fuse);
        grad_check(leaky, 4, 4, 2, 3, 3, fuse);
        grad_check(three, 4, 5, 2, 3, 3, fuse);
        grad_check(cat, 5, 4, 2, 3, 3, fuse);
        grad_check(inception, 6, 6, 2, 3, 2, fuse);
    }
}

/* Sets conv layer `name`'s weights and bias from w and b. */
static void set_conv(dsrt_net *net, const char *name, const float *w, const float *b) {
    for (int i = 0; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        if (strcmp(l->name, name)) continue;
        memcpy(net->params + l->w_off, w, l->w_n * sizeof *w);
        if (l->b_n) memcpy(net->params + l->b_off, b, l->b_n * sizeof *b);
        dsrt_net_params_changed(net);
        return;
    }
    REQUIRE(!"no such layer");
}

static const dsrt_layer *layer_named(const dsrt_net *net, const char *name) {
    for (int i = 0; i < net->n_layers; i++)
        if (!strcmp(net->layers[i].name, name)) return &net->layers[i];
    REQUIRE(!"no such layer");
    return NULL;
}

/* Graphs against the chains they equal: conv_a(x) + conv_b(x) is one
 * convolution with the weights summed (each branch's weight gradient is
 * the chain's); concat(conv_a(x), conv_b(x)) is one convolution with the
 * filters stacked (each branch's gradient is its rows of the chain's). */
static void test_graph_equals_chain(void) {
    enum { N = 3, H = 5, W = 6, C = 2, F = 3, G = 4 };
    float x[N * C * H * W];
    int32_t y[N] = {0, 1, 2};
    fill(x, sizeof x / sizeof x[0], 21, -1, 1);
    float wa[F * C * 9], wb[F * C * 9], ba[F], bb[F], wsum[F * C * 9], bsum[F];
    fill(wa, F * C * 9, 1, -0.5f, 0.5f);
    fill(wb, F * C * 9, 2, -0.5f, 0.5f);
    fill(ba, F, 3, -0.2f, 0.2f);
    fill(bb, F, 4, -0.2f, 0.2f);
    for (int k = 0; k < F * C * 9; k++) wsum[k] = wa[k] + wb[k];
    for (int k = 0; k < F; k++) bsum[k] = ba[k] + bb[k];
    for (int fuse = 0; fuse < 2; fuse++) {
        dsrt_net *g = make("input\nconv name=a filters=3 size=3 pad=1\n"
                           "conv name=b filters=3 size=3 pad=1 inputs=input_1\n"
                           "add name=s inputs=a,b relu=1\nfc name=f outputs=3\nsoftmax\n",
                           H, W, C, 3, 1);
        dsrt_net *c = make("input\nconv name=a filters=3 size=3 pad=1\nrelu\nfc name=f outputs=3\n"
                           "softmax\n",
                           H, W, C, 3, fuse);
        set_conv(g, "a", wa, ba);
        set_conv(g, "b", wb, bb);
        set_conv(c, "a", wsum, bsum);
        const dsrt_layer *fg = layer_named(g, "f"), *fc = layer_named(c, "f");
        memcpy(c->params + fc->w_off, g->params + fg->w_off, fg->w_n * sizeof(float));
        memcpy(c->params + fc->b_off, g->params + fg->b_off, fg->b_n * sizeof(float));
        dsrt_net_params_changed(c);
        float lg, lc;
        CHECK_OK(dsrt_net_forward_backward(g, x, y, N, &lg, NULL));
        CHECK_OK(dsrt_net_forward_backward(c, x, y, N, &lc, NULL));
        CHECK_NEAR(lg, lc, 1e-5 * fabs(lc));
        const dsrt_layer *ga = layer_named(g, "a"), *gb = layer_named(g, "b"),
                         *ca = layer_named(c, "a");
        double ref[F * C * 9];
        for (size_t k = 0; k < ca->w_n; k++) ref[k] = c->grads[ca->w_off + k];
        CHECK(close_arrays(g->grads + ga->w_off, ref, ca->w_n, 1e-4, "add: branch a's weights"));
        CHECK(close_arrays(g->grads + gb->w_off, ref, ca->w_n, 1e-4, "add: branch b's weights"));
        for (size_t k = 0; k < ca->b_n; k++) ref[k] = c->grads[ca->b_off + k];
        CHECK(close_arrays(g->grads + gb->b_off, ref, ca->b_n, 1e-4, "add: branch b's bias"));
        dsrt_net_destroy(g);
        dsrt_net_destroy(c);

        /* concat: branch a's F filters, then b's G (stacked in that order). */
        g = make("input\nconv name=a filters=3 size=3 pad=1\n"
                 "conv name=b filters=4 size=3 pad=1 inputs=input_1\n"
                 "concat name=j inputs=a,b\nrelu\nfc name=f outputs=3\nsoftmax\n",
                 H, W, C, 3, fuse);
        c = make("input\nconv name=a filters=7 size=3 pad=1\nrelu\nfc name=f outputs=3\nsoftmax\n",
                 H, W, C, 3, fuse);
        float wg[G * C * 9], bg[G], wall[(F + G) * C * 9], ball[F + G];
        fill(wg, G * C * 9, 5, -0.5f, 0.5f);
        fill(bg, G, 6, -0.2f, 0.2f);
        memcpy(wall, wa, sizeof wa);
        memcpy(wall + F * C * 9, wg, sizeof wg);
        memcpy(ball, ba, sizeof ba);
        memcpy(ball + F, bg, sizeof bg);
        set_conv(g, "a", wa, ba);
        set_conv(g, "b", wg, bg);
        set_conv(c, "a", wall, ball);
        fg = layer_named(g, "f");
        fc = layer_named(c, "f");
        memcpy(c->params + fc->w_off, g->params + fg->w_off, fg->w_n * sizeof(float));
        memcpy(c->params + fc->b_off, g->params + fg->b_off, fg->b_n * sizeof(float));
        dsrt_net_params_changed(c);
        CHECK_OK(dsrt_net_forward_backward(g, x, y, N, &lg, NULL));
        CHECK_OK(dsrt_net_forward_backward(c, x, y, N, &lc, NULL));
        CHECK_NEAR(lg, lc, 1e-5 * fabs(lc));
        ga = layer_named(g, "a");
        gb = layer_named(g, "b");
        ca = layer_named(c, "a");
        double all[(F + G) * C * 9];
        for (size_t k = 0; k < ca->w_n; k++) all[k] = c->grads[ca->w_off + k];
        CHECK(close_arrays(g->grads + ga->w_off, all, ga->w_n, 1e-4, "concat: branch a's weights"));
        CHECK(close_arrays(g->grads + gb->w_off, all + ga->w_n, gb->w_n, 1e-4,
                           "concat: branch b's weights"));
        dsrt_net_destroy(g);
        dsrt_net_destroy(c);
    }
}

/* An add hands its gradient to its inputs unchanged: resnet20's adds share
 * their output gradient's buffer with both inputs (the block's last
 * batchnorm or projection, and the block's input unless it is a ReLU the
 * layer before computes), so backward copies nothing there. */
static void test_grad_share(void) {
    dsrt_net *r = make("resnet20", 0, 0, 0, 10, 1);
    int adds = 0, shared = 0;
    for (int i = 1; i < r->n_layers; i++) {
        const dsrt_layer *l = &r->layers[i];
        if (l->kind != DSRT_LAYER_ADD) continue;
        adds++;
        for (int k = 0; k < l->n_inputs; k++) {
            const dsrt_layer *in = &r->layers[l->inputs[k]];
            int share = r->grad_share[l->inputs[k]] == i;
            shared += share;
            if (in->kind == DSRT_LAYER_BATCHNORM || in->kind == DSRT_LAYER_ADD) CHECK(share);
        }
    }
    fprintf(stderr, "  resnet20: %d of its adds' %d inputs share the add's gradient\n", shared,
            2 * adds);
    CHECK_EQ(adds, 9);
    CHECK_EQ(shared, 17);
    dsrt_net_destroy(r);
}

/* Graph descriptions refused, naming the line and what is wrong. */
static void test_graph_errors(void) {
    expect_error("input\nconv name=a filters=2 size=1 inputs=b\nconv name=b filters=2 size=1\n"
                 "fc outputs=3\nsoftmax\n",
                 "line 2", "'b' (line 3) is not above this line");
    expect_error("input\nconv filters=2 size=1 inputs=nope\nfc outputs=3\nsoftmax\n", "line 2",
                 "no layer is named 'nope'");
    expect_error(
        "input\nconv name=a filters=2 size=1\nconv name=b filters=3 size=1 inputs=input_1\n"
        "add inputs=a,b\nfc outputs=3\nsoftmax\n",
        "line 4", "a 8x8x2, b 8x8x3");
    expect_error(
        "input\nconv name=a filters=2 size=1\nconv name=b filters=2 size=2 inputs=input_1\n"
        "concat inputs=a,b\nfc outputs=3\nsoftmax\n",
        "line 4", "one height and width");
    expect_error(
        "input\nconv name=a filters=2 size=1\nconv name=b filters=2 size=1 inputs=input_1\n"
        "fc outputs=3\nsoftmax\n",
        "line 2", "the output of 'a' feeds no layer");
    expect_error("input\nconv name=a filters=2 size=1\nconv filters=2 size=1 inputs=a,input_1\n"
                 "fc outputs=3\nsoftmax\n",
                 "line 3", "it takes one input, 2 given");
    expect_error("input\nconv name=a filters=2 size=1\nadd inputs=a\nfc outputs=3\nsoftmax\n",
                 "line 3", "two or more inputs, 1 given");
    expect_error("input\nconv name=a filters=2 size=1\nadd inputs=a,a\nfc outputs=3\nsoftmax\n",
                 "line 3", "'a' is named twice");
    expect_error("input inputs=x\nfc outputs=3\nsoftmax\n", "line 1", "takes none");
    expect_error("input\nconv filters=2 size=1 inputs=a,,b\nfc outputs=3\nsoftmax\n", "line 2",
                 "not a comma-separated list");
}

/* A description of n lines, each made by line(i, buf, cap). */
static char *lines_of(int n, void (*line)(int i, char *buf, size_t cap)) {
    size_t cap = (size_t)n * 128 + 1, at = 0;
    char *d = malloc(cap);
    REQUIRE(d);
    for (int i = 0; i < n; i++) {
        line(i, d + at, cap - at);
        at += strlen(d + at);
    }
    return d;
}

/* input, 4000 relus (the first ten named relu_2 to relu_11, the others
 * not), fc, softmax. */
static void relus_line(int i, char *b, size_t cap) {
    if (i == 0)
        snprintf(b, cap, "input size=2x2x1\n");
    else if (i <= 10)
        snprintf(b, cap, "relu name=relu_%d\n", i + 1);
    else if (i <= 4000)
        snprintf(b, cap, "relu\n");
    else
        snprintf(b, cap, i == 4001 ? "fc outputs=3\n" : "softmax\n");
}

/* input 1x1x1, 2048 convs of 2^20 filters, 32 concats of 64 of them (2^26
 * channels each), one concat of the 32: 2^31 channels. */
static void wide_line(int i, char *b, size_t cap) {
    if (i == 0) {
        snprintf(b, cap, "input size=1x1x1\n");
    } else if (i <= 2048) {
        snprintf(b, cap, "conv name=c%d filters=1048576 size=1 inputs=input_1\n", i - 1);
    } else if (i <= 2048 + 32) {
        int j = i - 2049, at = snprintf(b, cap, "concat name=j%d inputs=", j);
        for (int k = 0; k < 64; k++)
            at += snprintf(b + at, cap - (size_t)at, "%sc%d", k ? "," : "", 64 * j + k);
        snprintf(b + at, cap - (size_t)at, "\n");
    } else if (i == 2048 + 33) {
        int at = snprintf(b, cap, "concat name=all inputs=");
        for (int k = 0; k < 32; k++)
            at += snprintf(b + at, cap - (size_t)at, "%sj%d", k ? "," : "", k);
        snprintf(b + at, cap - (size_t)at, "\n");
    } else {
        snprintf(b, cap, i == 2048 + 34 ? "gap\nfc outputs=3\n" : "softmax\n");
    }
}

/* Thousands of layers are named and found by name in linear time; shapes
 * and counts are worked out in 64 bits, and a layer whose images would
 * have 2^31 values or more is refused naming it. */
static void test_large_graphs(void) {
    char *d = lines_of(4003, relus_line);
    dsrt_net *net = make(d, 0, 0, 0, 3, 1);
    CHECK_EQ(net->n_layers, 4003);
    CHECK_STR_EQ(net->layers[1].name, "relu_2");
    CHECK_STR_EQ(net->layers[10].name, "relu_11");
    CHECK_STR_EQ(net->layers[11].name, "relu_12");
    CHECK_STR_EQ(net->layers[12].name, "relu_13");
    CHECK_STR_EQ(net->layers[4000].name, "relu_4001");
    dsrt_net_destroy(net);
    free(d);
    net = NULL;
    d = lines_of(2048 + 36, wide_line);
    CHECK_EQ(dsrt_net_create(&net, d, 0, 0, 0, 3, NULL), DSRT_ETOOBIG);
    CHECK(net == NULL);
    CHECK_CONTAINS(dsrt_last_error(), "line 2082: concat: its inputs together are 1x1x2147483648");
    CHECK_CONTAINS(dsrt_last_error(), "more than 2^31 - 1 values an image");
    free(d);
    /* A pooling whose padding makes its output larger than its input. */
    CHECK_EQ(dsrt_net_create(&net,
                             "input size=65536x32767x1\nmaxpool size=4096 stride=1 pad=4095\n"
                             "gap\nfc outputs=3\nsoftmax\n",
                             0, 0, 0, 3, NULL),
             DSRT_ETOOBIG);
    CHECK(net == NULL);
    CHECK_CONTAINS(dsrt_last_error(),
                   "line 2: maxpool: its output 69631x36862x1 (HxWxC) has more than 2^31 - 1");
}

/* A float option's range holds the floats nearest its bounds: eps=1e-12 as
 * a float reads back as 9.99999996e-13. */
static void test_float_ranges(void) {
    dsrt_net *net = make("input size=2x2x1\nbatchnorm eps=9.99999996e-13\nfc outputs=3\nsoftmax\n",
                         0, 0, 0, 3, 1);
    CHECK(net->layers[1].o.eps == 1e-12f);
    dsrt_net_destroy(net);
    net = NULL;
    CHECK_EQ(dsrt_net_create(&net,
                             "input size=2x2x1\nbatchnorm eps=9.9999e-13\nfc outputs=3\nsoftmax\n",
                             0, 0, 0, 3, NULL),
             DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "option 'eps': '9.9999e-13' is out of range");
    CHECK_EQ(dsrt_net_create(&net, "input size=2x2x1\nleakyrelu leak=1e39\nfc outputs=3\nsoftmax\n",
                             0, 0, 0, 3, NULL),
             DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "option 'leak': '1e39' is out of range");
}

// ----------------------------------------------------------------------------
// Soft targets (mixup, cutmix, label smoothing)

/* Training loss and gradients with soft targets t (n, classes). */
static double soft_step(dsrt_net *net, const float *x, const int32_t *y, const float *t, int n) {
    dsrt_net_batch b;
    memset(&b, 0, sizeof b);
    b.data = x;
    b.labels = y;
    b.soft_labels = t;
    b.n = n;
    float loss;
    CHECK_OK(dsrt_net_train_start(net, &b));
    CHECK_OK(dsrt_net_train_finish(net, &loss, NULL));
    return loss;
}

/* The loss is -sum t log p averaged over the batch (checked against the
 * probabilities), one-hot rows give the hard-label loss and gradients, and
 * every parameter's gradient matches central differences of the loss. */
static void test_soft_targets(void) {
    const int n = 4, K = 5, H = 5, W = 5, C = 2;
    dsrt_net *net =
        make("input\nconv filters=3 size=3 pad=1\nfc outputs=5\nsoftmax\n", H, W, C, K, 0);
    size_t per = (size_t)H * W * C;
    float x[4 * 50], t[4 * 5], onehot[4 * 5], probs[4 * 5];
    int32_t y[4] = {0, 3, 4, 1};
    fill(x, n * per, 13, -1, 1);
    /* Rows as mixup with label smoothing 0.1 makes them: 0.02 everywhere,
     * 0.9 * lambda on the own label, 0.9 * (1 - lambda) on the partner's. */
    const double lam = 0.3, e = 0.1;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < K; j++) t[i * K + j] = (float)(e / K), onehot[i * K + j] = 0;
        t[i * K + y[i]] += (float)((1 - e) * lam);
        t[i * K + y[n - 1 - i]] += (float)((1 - e) * (1 - lam));
        onehot[i * K + y[i]] = 1;
    }
    dsrt_rng r = dsrt_rng_init(9, 0, 0, 0);
    for (size_t k = 0; k < net->n_params; k++)
        net->params[k] = (float)(0.6 * (dsrt_rng_uniform(&r) - 0.5));
    dsrt_net_params_changed(net);

    /* One-hot soft rows: the same loss and gradients as the labels. */
    float hard_loss;
    CHECK_OK(dsrt_net_forward_backward(net, x, y, n, &hard_loss, NULL));
    float *gh = malloc(net->n_params * sizeof *gh), *g = malloc(net->n_params * sizeof *g);
    REQUIRE(gh && g);
    memcpy(gh, net->grads, net->n_params * sizeof *gh);
    double l1 = soft_step(net, x, y, onehot, n);
    CHECK_NEAR(l1, hard_loss, 1e-6);
    size_t off = 0;
    for (size_t k = 0; k < net->n_params; k++) off += fabsf(net->grads[k] - gh[k]) > 1e-6f;
    CHECK_EQ(off, 0);

    /* The loss against the probabilities. */
    double loss = soft_step(net, x, y, t, n);
    memcpy(g, net->grads, net->n_params * sizeof *g);
    CHECK_OK(dsrt_net_predict(net, x, n, probs, NULL, NULL, NULL));
    double ref = 0;
    for (int i = 0; i < n * K; i++) ref -= t[i] * log((double)probs[i]);
    /* predict uses running statistics; this net has none, so the
     * probabilities are the training forward's. */
    CHECK_NEAR(loss, ref / n, 1e-5);

    /* Central differences. */
    double dd = 0, na = 0;
    for (size_t k = 0; k < net->n_params; k++) {
        const double h = 1e-3;
        float keep = net->params[k];
        net->params[k] = keep + (float)h;
        dsrt_net_params_changed(net);
        double lp = soft_step(net, x, y, t, n);
        net->params[k] = keep - (float)h;
        dsrt_net_params_changed(net);
        double lm = soft_step(net, x, y, t, n);
        net->params[k] = keep;
        dsrt_net_params_changed(net);
        double fd = (lp - lm) / (2 * h);
        dd += (fd - g[k]) * (fd - g[k]);
        na += (double)g[k] * g[k];
    }
    double rel = sqrt(dd) / fmax(sqrt(na), 1e-9);
    if (!(rel < 1e-2)) fprintf(stderr, "  soft-target gradient relative error %.3g\n", rel);
    CHECK(rel < 1e-2);

    /* Negative or non-finite targets are refused. */
    t[3] = -0.5f;
    dsrt_net_batch b;
    memset(&b, 0, sizeof b);
    b.data = x;
    b.labels = y;
    b.soft_labels = t;
    b.n = n;
    CHECK_EQ(dsrt_net_train_start(net, &b), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "soft label 3 of image 0");
    free(g);
    free(gh);
    dsrt_net_destroy(net);
}

int main(void) {
    RUN(test_layer_table);
    RUN(test_parse_errors);
    RUN(test_soft_targets);
    RUN(test_graph_errors);
    RUN(test_large_graphs);
    RUN(test_float_ranges);
    RUN(test_grad_graph);
    RUN(test_graph_equals_chain);
    RUN(test_grad_share);
    RUN(test_builtin_sizes);
    RUN(test_forward_layers);
    RUN(test_forward_activations);
    RUN(test_activation_kinks);
    RUN(test_activation_layouts);
    RUN(test_input_normalization);
    RUN(test_forward_kinds);
    RUN(test_pool_ceil_pytorch);
    RUN(test_kind_shapes);
    RUN(test_grad_conv);
    RUN(test_winograd);
    RUN(test_grad_batchnorm);
    RUN(test_grad_relu);
    RUN(test_grad_pool);
    RUN(test_grad_misc);
    RUN(test_fusion_equivalence);
    RUN(test_batch_sizes_and_modes);
    RUN(test_buckets);
    RUN(test_determinism);
    RUN(test_training_converges);
    return TEST_RESULT();
}

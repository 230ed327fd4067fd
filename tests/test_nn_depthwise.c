/*
 * The CPU backend's own C steps: depthwise convolutions' weight gradients
 * (nn/layers/conv.c, where oneDNN has no depthwise kernel for them) against
 * oneDNN's (DSRT_CPU_DEPTHWISE=onednn) in every layout, stride, dilation,
 * padding and kernel size, with and without a bias and a fused ReLU, every
 * layer's output and every gradient within 1e-4; mul, scale
 * and stochastic depth's steps in NHWC and blocked layouts against the
 * same nets in the layouts oneDNN chooses, and under each instruction set;
 * training convolutions by Winograd's F(2x2, 3x3) (AVX2) against oneDNN's
 * direct ones within 1e-4, on sizes that end in half tiles; pointwise
 * convolutions' weight gradients (AVX2) against oneDNN's; batchnorms
 * whose add normalises their input on the way in against oneDNN's forward;
 * every one of them the same bits run to run.
 */
#include "nn/backend_cpu.h"
#include "task.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Helpers

/* The outputs of one training step: every layer's output, the loss and the
 * gradients. */
typedef struct {
    float *outs, *grads;
    size_t n_outs, n_grads;
    float loss;
} run_result;

static void run_free(run_result *r) {
    free(r->outs);
    free(r->grads);
}

/* One forward and backward of desc on a fixed batch, with the environment
 * as the caller set it. */
static run_result run(const char *desc, int n, int threads) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = threads;
    o.seed = 7;
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, desc, 0, 0, 0, 0, &o);
    if (rc) fprintf(stderr, "net_create: %s\n", dsrt_last_error());
    REQUIRE(rc == 0);
    /* Random biases, so that no gradient is zero by symmetry. */
    dsrt_rng r = dsrt_rng_init(5, 0, 0, 0);
    for (int i = 0; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        for (size_t k = 0; k < l->b_n; k++)
            net->params[l->b_off + k] = (float)(0.2 * (dsrt_rng_uniform(&r) - 0.5));
    }
    dsrt_net_params_changed(net);
    dsrt_net_set_iteration(net, 3);
    size_t per = (size_t)net->input.h * net->input.w * net->input.c;
    float *x = malloc((size_t)n * per * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    REQUIRE(x && y);
    dsrt_rng rx = dsrt_rng_init(11, 1, 2, 3);
    for (size_t k = 0; k < (size_t)n * per; k++) x[k] = (float)(2 * dsrt_rng_uniform(&rx) - 1);
    for (int i = 0; i < n; i++) y[i] = i % net->classes;
    run_result res = {0};
    CHECK_OK(dsrt_net_forward_backward(net, x, y, n, &res.loss, NULL));
    for (int i = 1; i < net->n_layers; i++) {
        const dsrt_shape *s = &net->layers[i].out;
        res.n_outs += (size_t)n * s->c * s->h * s->w;
    }
    res.outs = malloc(res.n_outs * sizeof *res.outs);
    res.grads = malloc(net->n_params * sizeof *res.grads);
    REQUIRE(res.outs && res.grads);
    size_t at = 0;
    for (int i = 1; i < net->n_layers; i++) {
        const dsrt_shape *s = &net->layers[i].out;
        CHECK_OK(dsrt__net_layer_output(net, i, res.outs + at, 1));
        at += (size_t)n * s->c * s->h * s->w;
    }
    memcpy(res.grads, net->grads, net->n_params * sizeof *res.grads);
    res.n_grads = net->n_params;
    free(x);
    free(y);
    dsrt_net_destroy(net);
    return res;
}

static int close_to(const float *a, const float *b, size_t n, double tol, const char *what,
                    const char *desc) {
    double scale = 0;
    for (size_t k = 0; k < n; k++) scale = fmax(scale, fabs(b[k]));
    size_t bad = 0;
    for (size_t k = 0; k < n; k++) {
        if (fabs(a[k] - b[k]) <= tol * (fabs(b[k]) + 1e-2 * scale)) continue;
        if (bad++ < 3)
            fprintf(stderr, "  %s[%zu] = %.7g, reference %.7g\n", what, k, (double)a[k],
                    (double)b[k]);
    }
    if (bad) fprintf(stderr, "  %s: %zu of %zu values off in\n%s", what, bad, n, desc);
    return bad == 0;
}

static int same_bits(const run_result *a, const run_result *b) {
    return a->n_outs == b->n_outs && a->n_grads == b->n_grads &&
           !memcmp(a->outs, b->outs, a->n_outs * sizeof *a->outs) &&
           !memcmp(a->grads, b->grads, a->n_grads * sizeof *a->grads) && a->loss == b->loss;
}

/* Whether dsrt's own AVX2 kernels can run here. */
static int have_avx2(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* desc with the environment variable var set to "onednn" (the reference)
 * and unset (dsrt's own step), in the layout lay (NULL: the default): the
 * outputs within tol_out, the gradients within tol, the own step's runs
 * the same bits; with differ, its gradients not the reference's bits (it
 * ran). */
static void own_vs_onednn(const char *desc, const char *lay, const char *var, double tol_out,
                          double tol, int differ) {
    if (lay)
        setenv("DSRT_CPU_LAYOUT", lay, 1);
    else
        unsetenv("DSRT_CPU_LAYOUT");
    setenv(var, "onednn", 1);
    run_result ref = run(desc, 5, 2);
    unsetenv(var);
    run_result own = run(desc, 5, 2), again = run(desc, 5, 2);
    CHECK(close_to(own.outs, ref.outs, own.n_outs, tol_out, "outputs", desc));
    CHECK(close_to(own.grads, ref.grads, own.n_grads, tol, "gradients", desc));
    if (differ) CHECK(memcmp(own.grads, ref.grads, own.n_grads * sizeof *own.grads));
    CHECK(same_bits(&own, &again));
    run_free(&ref);
    run_free(&own);
    run_free(&again);
}

// ----------------------------------------------------------------------------
// Depthwise convolutions

/* Depthwise layers of several shapes after a 1x1 convolution of c
 * channels (so that they have an input gradient), each in the layouts
 * DSRT_CPU_LAYOUT makes. */
static const char *const DW_NETS[] = {
    "input size=9x8x3\nconv filters=%d size=1\nconv filters=%d size=3 pad=1 groups=%d\n"
    "fc outputs=3\nsoftmax\n",
    "input size=9x10x3\nconv filters=%d size=1\nconv filters=%d size=5 stride=2 pad=2 groups=%d "
    "bias=0\nfc outputs=3\nsoftmax\n",
    "input size=11x9x3\nconv filters=%d size=1\nconv filters=%d size=3x2 stride=2x1 dilation=2 "
    "pad=2,1,0,1 groups=%d\nrelu\nfc outputs=3\nsoftmax\n",
    "input size=7x7x3\nconv filters=%d size=1\nconv filters=%d size=3 stride=2 pad=same "
    "groups=%d\nrelu\nconv filters=4 size=1\nfc outputs=3\nsoftmax\n",
};

static void test_depthwise_vs_onednn(void) {
    static const int channels[] = {8, 20, 32, 40};
    static const char *const layouts[] = {NULL, "blocked", "nhwc"};
    for (size_t d = 0; d < DSRT_ARRAY_SIZE(DW_NETS); d++)
        for (size_t c = 0; c < DSRT_ARRAY_SIZE(channels); c++)
            for (size_t l = 0; l < DSRT_ARRAY_SIZE(layouts); l++) {
                char desc[512];
                snprintf(desc, sizeof desc, DW_NETS[d], channels[c], channels[c], channels[c]);
                own_vs_onednn(desc, layouts[l], "DSRT_CPU_DEPTHWISE", 1e-4, 1e-4, 0);
            }
    unsetenv("DSRT_CPU_LAYOUT");
    unsetenv("DSRT_CPU_WINO_TILE");
}

// ----------------------------------------------------------------------------
// Batchnorms left to the add that takes them

/* Residual blocks of k channels: an identity shortcut (one batchnorm left
 * to the add), a shortcut through a strided 1x1 convolution and its own
 * batchnorm (both left to it), a sum without a ReLU and one whose leaky
 * ReLU it computes, a batchnorm with several takers (kept), one on the
 * net's input (kept: the caller's batch), an add whose other input has
 * another layout (the batchnorm's output written out first); every output
 * read back (the deferred ones written when read). */
static const char *const BN_NETS[] = {
    "input size=9x8x3\nconv filters=%d size=3 pad=1 bias=0\nbatchnorm\nrelu name=r\n"
    "conv filters=%d size=3 pad=1 bias=0\nbatchnorm name=b\nadd inputs=b,r relu=1\n"
    "conv name=c filters=%d size=3 stride=2 pad=1 bias=0\nbatchnorm name=cb\n"
    "conv name=d filters=%d size=1 stride=2 bias=0 inputs=add_1\nbatchnorm name=db\n"
    "add inputs=cb,db\nleakyrelu leak=0.2\ngap\nfc outputs=3\nsoftmax\n",
    "input size=7x9x3\nconv name=a filters=%d size=3 pad=1 bias=0\nbatchnorm name=ab\n"
    "conv name=b filters=%d size=1 bias=0\nbatchnorm name=bb\nadd inputs=ab,bb relu=1\n"
    "conv filters=%d size=1 bias=0 inputs=ab\nadd name=t inputs=conv_3,add_1,ab\n"
    "conv filters=%d size=1 inputs=t\nfc outputs=3\nsoftmax\n",
    "input name=in size=6x7x%d\nbatchnorm name=ib\nconv name=a filters=%d size=3 pad=1 "
    "inputs=in\nadd name=s inputs=ib,a\nconv name=b filters=%d size=1 bias=0\n"
    "batchnorm name=bb\nadd inputs=a,bb relu=1\nconv filters=%d size=1\nfc outputs=3\nsoftmax\n",
};

/* The same bits under each instruction set where nothing else in the net
 * changes with it (no Winograd, no pointwise kernel: fewer than 32
 * channels). */
static void batchnorm_isa_bits(const char *desc) {
    unsetenv("DSRT_CPU_LAYOUT");
    unsetenv("DSRT_MAX_CPU_ISA");
    run_result best = run(desc, 5, 2);
    static const char *const isas[] = {"avx2", "scalar"};
    for (size_t s = 0; s < DSRT_ARRAY_SIZE(isas); s++) {
        setenv("DSRT_MAX_CPU_ISA", isas[s], 1);
        run_result r = run(desc, 5, 2);
        CHECK(same_bits(&r, &best));
        run_free(&r);
    }
    unsetenv("DSRT_MAX_CPU_ISA");
    run_free(&best);
}

static void test_batchnorm_left_to_add(void) {
    static const int channels[] = {8, 20, 32};
    static const char *const layouts[] = {NULL, "blocked", "nhwc"};
    static const char *const isas[] = {NULL, "avx2", "scalar"};
    for (size_t d = 0; d < DSRT_ARRAY_SIZE(BN_NETS); d++)
        for (size_t c = 0; c < DSRT_ARRAY_SIZE(channels); c++)
            for (size_t l = 0; l < DSRT_ARRAY_SIZE(layouts); l++)
                for (size_t s = 0; s < DSRT_ARRAY_SIZE(isas); s++) {
                    if (isas[s] && l) continue; /* each instruction set in the default layout */
                    char desc[1024];
                    int k = channels[c];
                    snprintf(desc, sizeof desc, BN_NETS[d], k, k, k, k);
                    if (isas[s])
                        setenv("DSRT_MAX_CPU_ISA", isas[s], 1);
                    else
                        unsetenv("DSRT_MAX_CPU_ISA");
                    /* In blocks it runs (not the reference's bits). */
                    own_vs_onednn(desc, layouts[l], "DSRT_CPU_BATCHNORM", 1e-4, 1e-4,
                                  layouts[l] == NULL || !strcmp(layouts[l], "blocked"));
                    if (k < 32 && !l && !s) batchnorm_isa_bits(desc);
                }
    unsetenv("DSRT_MAX_CPU_ISA");
    unsetenv("DSRT_CPU_LAYOUT");
}

/* A batchnorm on the net's input (one-pixel images of 16 channels: NHWC,
 * runs of 16) that an add takes keeps its output: read after the caller
 * has overwritten its batch, the output is still the forward's. */
static void test_batchnorm_on_input_kept(void) {
    const char *desc = "input name=in size=1x1x16\nbatchnorm name=b\nconv name=c filters=16 "
                       "size=1 inputs=in\nadd inputs=b,c\nfc outputs=3\nsoftmax\n";
    float out[2][4 * 16];
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            unsetenv("DSRT_CPU_BATCHNORM");
        else
            setenv("DSRT_CPU_BATCHNORM", "onednn", 1);
        dsrt_net_options o = dsrt_net_defaults();
        o.threads = 2;
        dsrt_net *net = NULL;
        REQUIRE(dsrt_net_create(&net, desc, 0, 0, 0, 0, &o) == 0);
        float x[4 * 16];
        int32_t y[4] = {0, 1, 2, 0};
        for (int k = 0; k < 4 * 16; k++) x[k] = (float)((k * 7) % 13) / 13.0f - 0.4f;
        CHECK_OK(dsrt_net_forward_backward(net, x, y, 4, NULL, NULL));
        for (int k = 0; k < 4 * 16; k++) x[k] = 1e6f; /* the caller's next batch */
        CHECK_OK(dsrt__net_layer_output(net, 1, out[pass], 1));
        dsrt_net_destroy(net);
    }
    unsetenv("DSRT_CPU_BATCHNORM");
    CHECK(close_to(out[1], out[0], 4 * 16, 1e-5, "outputs", desc));
}

// ----------------------------------------------------------------------------
// Products and stochastic depth

/* A gate over a convolution's output, two values of one shape (images and
 * one-pixel ones), scales and stochastic depth, of k channels: in every
 * layout and under each instruction set. */
static void test_products_layouts_threads(void) {
    static const int channels[] = {8, 20, 32};
    for (size_t c = 0; c < DSRT_ARRAY_SIZE(channels); c++) {
        int k = channels[c];
        char desc[1024];
        snprintf(desc, sizeof desc,
                 "input name=in size=6x5x3\nconv name=x filters=%d size=3 pad=1\ngap inputs=x\n"
                 "conv name=f filters=%d size=1\nsigmoid name=g\nmul name=m inputs=x,g\n"
                 "conv name=y filters=%d size=1 inputs=in\nmul name=p inputs=m,y\nscale "
                 "init=0.5\nstochastic_depth name=s p=0.4\nconv name=z filters=%d size=1 "
                 "inputs=in\nadd inputs=s,z\nfc name=fa outputs=%d\nfc name=fb outputs=%d "
                 "inputs=in\nmul inputs=fa,fb\nscale\nfc outputs=3\nsoftmax\n",
                 k, k, k, k, k, k);
        unsetenv("DSRT_CPU_LAYOUT");
        run_result ref = run(desc, 6, 2);
        static const char *const layouts[] = {"blocked", "nhwc"};
        for (size_t l = 0; l < DSRT_ARRAY_SIZE(layouts); l++) {
            setenv("DSRT_CPU_LAYOUT", layouts[l], 1);
            run_result r = run(desc, 6, 2);
            CHECK(close_to(r.outs, ref.outs, r.n_outs, 1e-4, "outputs", desc));
            CHECK(close_to(r.grads, ref.grads, r.n_grads, 1e-4, "gradients", desc));
            run_free(&r);
        }
        unsetenv("DSRT_CPU_LAYOUT");
        run_result again = run(desc, 6, 2);
        CHECK(same_bits(&ref, &again));
        static const char *const isas[] = {"scalar", "avx2"};
        for (size_t s = 0; s < DSRT_ARRAY_SIZE(isas); s++) {
            setenv("DSRT_MAX_CPU_ISA", isas[s], 1);
            run_result r = run(desc, 6, 2);
            CHECK(close_to(r.outs, ref.outs, r.n_outs, 1e-5, "outputs", desc));
            CHECK(close_to(r.grads, ref.grads, r.n_grads, 1e-5, "gradients", desc));
            run_free(&r);
        }
        unsetenv("DSRT_MAX_CPU_ISA");
        run_free(&ref);
        run_free(&again);
    }
}

// ----------------------------------------------------------------------------
// Winograd's F(4x4, 3x3) and F(2x2, 3x3) for training convolutions (AVX2
// without AVX-512)

/* 3x3 convolutions of 16 to 48 channels on even and odd sizes (tiles past
 * the edge; 49 pixels or more, below which the direct one is kept; 40x36,
 * whose tiles the weights' gradient sums in more than one chunk), with
 * and without a bias, a ReLU the convolution computes, an input whose
 * gradient two layers add to (the residual) and one whose gradient nothing
 * needs (the first); and 192 to 208 channels, whose filters' transforms
 * take the staged products (208 filters: a last column of 16). */
static const char *const WINO_NETS[] = {
    "input size=%dx%dx16\nconv name=a filters=16 size=3 pad=1\nrelu\n"
    "conv name=b filters=32 size=3 pad=1 bias=0\nbatchnorm\nrelu name=r\n"
    "conv name=c filters=32 size=3 pad=1\nadd inputs=c,r\nrelu\n"
    "conv filters=48 size=3 pad=1\ngap\nfc outputs=3\nsoftmax\n",
    "input size=%dx%dx32\nconv filters=192 size=3 pad=1\nrelu\n"
    "conv filters=208 size=3 pad=1\ngap\nfc outputs=3\nsoftmax\n",
};

static void test_winograd_vs_direct(void) {
    int avx2 = have_avx2();
    static const int sizes[][2] = {{7, 7}, {8, 8}, {11, 9}, {12, 13}, {40, 36}};
    static const char *const layouts[] = {NULL, "nhwc"};
    setenv("DSRT_MAX_CPU_ISA", "avx2", 1);
    for (int m = 2; m <= 4; m += 2)
        for (size_t d = 0; d < DSRT_ARRAY_SIZE(WINO_NETS); d++)
            for (size_t z = 0; z < DSRT_ARRAY_SIZE(sizes); z++)
                for (size_t l = 0; l < DSRT_ARRAY_SIZE(layouts); l++) {
                    if (d > 0 && sizes[z][0] > 16) continue; /* the small channels' chunks */
                    char desc[1024];
                    snprintf(desc, sizeof desc, WINO_NETS[d], sizes[z][0], sizes[z][1]);
                    if (layouts[l])
                        setenv("DSRT_CPU_LAYOUT", layouts[l], 1);
                    else
                        unsetenv("DSRT_CPU_LAYOUT");
                    setenv("DSRT_CPU_WINO_TILE", m == 2 ? "2" : "4", 1);
                    /* F(4x4, 3x3)'s transforms take values up to 8 and 1/24:
                     * its rounding is some times F(2x2, 3x3)'s. The 40x36
                     * maps' weight gradients sum 7,200 products a value
                     * (2.3e-4 apart at most against oneDNN's AVX2 sums). */
                    double tol = m == 4 ? 5e-4 : sizes[z][0] > 16 ? 3e-4 : 1e-4;
                    setenv("DSRT_CPU_CONV", "direct", 1);
                    run_result ref = run(desc, 5, 2);
                    unsetenv("DSRT_CPU_CONV");
                    run_result own = run(desc, 5, 2), again = run(desc, 5, 2);
                    CHECK(close_to(own.outs, ref.outs, own.n_outs, tol, "outputs", desc));
                    CHECK(close_to(own.grads, ref.grads, own.n_grads, tol, "gradients", desc));
                    CHECK(fabs(own.loss - ref.loss) <= tol / 10 * fabs(ref.loss));
                    /* Winograd's sums are not the direct ones: it ran. */
                    if (avx2) CHECK(!same_bits(&own, &ref));
                    CHECK(same_bits(&own, &again));
                    run_free(&ref);
                    run_free(&own);
                    run_free(&again);
                }
    unsetenv("DSRT_CPU_LAYOUT");
    /* More threads after the plans were made: each thread's scratch is
     * there (AddressSanitizer would see one past it). */
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    dsrt_net *net = NULL;
    char desc[1024];
    snprintf(desc, sizeof desc, WINO_NETS[0], 12, 12);
    REQUIRE(dsrt_net_create(&net, desc, 0, 0, 0, 0, &o) == 0);
    size_t per = (size_t)net->input.h * net->input.w * net->input.c;
    float *x = calloc(4 * per, sizeof *x);
    int32_t y[4] = {0, 1, 2, 0};
    REQUIRE(x);
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 4, NULL, NULL));
    dsrt_net_set_threads(net, 4);
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 4, NULL, NULL));
    CHECK_OK(dsrt_net_predict(net, x, 4, NULL, NULL, NULL, NULL));
    free(x);
    dsrt_net_destroy(net);
    unsetenv("DSRT_MAX_CPU_ISA");
}

/* Pointwise (1x1) convolutions' weight gradients by dsrt's own kernel
 * (AVX2) against oneDNN's (DSRT_CPU_POINTWISE=onednn): strides 1, 2, 3 and
 * 2x1, output channels that leave 1, 2 or 4 rows of a register block,
 * with and without a bias and a fused ReLU, images of more pixels than a
 * chunk and strided ones whose rows end a chunk early, in the blocked
 * layout and NHWC; and strided 3x3 and 5x5 filters of 64 input channels, a
 * tap at a time (taps whose outputs' inputs lie partly, or on small images
 * wholly, in the padding). */
static const char *const PW_NETS[] = {
    "input size=%dx%dx16\nconv filters=32 size=1\nrelu\nconv filters=20 size=1 stride=2 "
    "bias=0\nrelu\nconv filters=48 size=3 pad=1\nconv filters=64 size=1\ngap\nfc outputs=3\n"
    "softmax\n",
    "input size=%dx%dx32\nconv filters=7 size=1 stride=3\nrelu\nconv filters=16 size=3 pad=1\n"
    "conv filters=16 size=1 stride=2x1 bias=0\nbatchnorm\nrelu\ngap\nfc outputs=3\nsoftmax\n",
    "input size=%dx%dx16\nconv filters=64 size=1\nconv filters=48 size=3 stride=2 pad=1\nrelu\n"
    "conv filters=64 size=1 bias=0\nconv filters=32 size=5 stride=2x1 pad=2 bias=0\ngap\n"
    "fc outputs=3\nsoftmax\n",
};

static void test_pointwise_vs_onednn(void) {
    int avx2 = have_avx2();
    static const int sizes[][2] = {{7, 7}, {23, 20}, {61, 5}};
    static const char *const layouts[] = {NULL, "nhwc"};
    setenv("DSRT_MAX_CPU_ISA", "avx2", 1);
    for (size_t d = 0; d < DSRT_ARRAY_SIZE(PW_NETS); d++)
        for (size_t z = 0; z < DSRT_ARRAY_SIZE(sizes); z++)
            for (size_t l = 0; l < DSRT_ARRAY_SIZE(layouts); l++) {
                char desc[1024];
                snprintf(desc, sizeof desc, PW_NETS[d], sizes[z][0], sizes[z][1]);
                own_vs_onednn(desc, layouts[l], "DSRT_CPU_POINTWISE", 1e-5, 1e-4, avx2);
            }
    unsetenv("DSRT_CPU_LAYOUT");
    unsetenv("DSRT_MAX_CPU_ISA");
}

/* Inference plans by Winograd: batchnorm folded into the filters, the
 * chain's ReLUs (leaky too) and a residual's sum in the transform's
 * epilogue; the probabilities against the direct convolution's. */
static float *predict(const char *desc, int n) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 9;
    dsrt_net *net = NULL;
    REQUIRE(dsrt_net_create(&net, desc, 0, 0, 0, 0, &o) == 0);
    dsrt_rng r = dsrt_rng_init(4, 0, 0, 0);
    for (int i = 0; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        for (size_t k = 0; k < l->b_n; k++)
            net->params[l->b_off + k] = (float)(0.2 * (dsrt_rng_uniform(&r) - 0.5));
        if (l->kind == DSRT_LAYER_BATCHNORM)
            for (int k = 0; k < l->out.c; k++) {
                net->state[l->s_off + k] = (float)(0.2 * (dsrt_rng_uniform(&r) - 0.5));
                net->state[l->s_off + l->out.c + k] = (float)(0.5 + dsrt_rng_uniform(&r));
            }
    }
    dsrt_net_params_changed(net);
    size_t per = (size_t)net->input.h * net->input.w * net->input.c;
    float *x = malloc((size_t)n * per * sizeof *x), *p = malloc((size_t)n * 3 * sizeof *p);
    REQUIRE(x && p);
    dsrt_rng rx = dsrt_rng_init(12, 1, 2, 3);
    for (size_t k = 0; k < (size_t)n * per; k++) x[k] = (float)(2 * dsrt_rng_uniform(&rx) - 1);
    CHECK_OK(dsrt_net_predict(net, x, n, p, NULL, NULL, NULL));
    free(x);
    dsrt_net_destroy(net);
    return p;
}

static void test_winograd_inference(void) {
    static const char *const nets[] = {
        "input size=12x11x16\nconv filters=32 size=3 pad=1\nbatchnorm\nrelu name=r\n"
        "conv filters=32 size=3 pad=1 bias=0\nbatchnorm name=b2\nadd inputs=b2,r\nrelu\n"
        "conv filters=32 size=3 pad=1\nleakyrelu leak=0.1\n"
        "conv filters=32 size=3 pad=1\nbatchnorm\ngap\nfc outputs=3\nsoftmax\n",
    };
    static const char *const layouts[] = {NULL, "nhwc"};
    setenv("DSRT_MAX_CPU_ISA", "avx2", 1);
    for (int m = 2; m <= 4; m += 2)
        for (size_t d = 0; d < DSRT_ARRAY_SIZE(nets); d++)
            for (size_t l = 0; l < DSRT_ARRAY_SIZE(layouts); l++) {
                if (layouts[l])
                    setenv("DSRT_CPU_LAYOUT", layouts[l], 1);
                else
                    unsetenv("DSRT_CPU_LAYOUT");
                setenv("DSRT_CPU_WINO_TILE", m == 2 ? "2" : "4", 1);
                setenv("DSRT_CPU_CONV", "direct", 1);
                float *ref = predict(nets[d], 6);
                unsetenv("DSRT_CPU_CONV");
                float *own = predict(nets[d], 6);
                CHECK(close_to(own, ref, 6 * 3, m == 2 ? 1e-5 : 5e-5, "probabilities", nets[d]));
                free(ref);
                free(own);
            }
    unsetenv("DSRT_CPU_LAYOUT");
    unsetenv("DSRT_CPU_WINO_TILE");
    unsetenv("DSRT_MAX_CPU_ISA");
}

int main(void) {
    RUN(test_winograd_vs_direct);
    RUN(test_winograd_inference);
    RUN(test_pointwise_vs_onednn);
    RUN(test_depthwise_vs_onednn);
    RUN(test_products_layouts_threads);
    RUN(test_batchnorm_left_to_add);
    RUN(test_batchnorm_on_input_kept);
    return TEST_RESULT();
}

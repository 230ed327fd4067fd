/*
 * The CPU backend's inference plan (batchnorm and layer scales folded into
 * the convolution or fully connected layer before them, activations and a
 * residual add's sum and ReLU as that layer's post-ops) against the same
 * net's plain forward (dsrt_net_options.fuse = 0): every built-in network
 * and a graph of every fusible kind, with random weights, biases and
 * batchnorm statistics, at batch sizes 1, 3, 16 and 64 (the large nets 1
 * and 3), the scores before the
 * softmax within float rounding (1e-5 of the image's largest), then again after
 * the weights change (the folded copies are made again), and after a
 * training step on the fused net. The inference plan holds fewer bytes of
 * activations than its outputs would take each on their own (reused once
 * dead), the plain one exactly those.
 */
#include <dsrt.h>
#include "nn/internal.h"
#include "task.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Random parameters and statistics, the same for both nets: weights from
 * the net's initialiser (same seed), biases and batchnorm's scale, offset,
 * running mean and variance drawn here. */
static void randomise(dsrt_net *a, dsrt_net *b, uint64_t seed) {
    dsrt_rng r = dsrt_rng_init(seed, 0, 0, 0);
    for (int i = 0; i < a->n_layers; i++) {
        dsrt_layer *l = &a->layers[i];
        for (size_t k = 0; k < l->b_n; k++)
            a->params[l->b_off + k] = (float)(0.4 * (dsrt_rng_uniform(&r) - 0.5));
        if (l->kind == DSRT_LAYER_BATCHNORM) {
            int c = l->out.c;
            for (int k = 0; k < c; k++) {
                a->params[l->w_off + k] = (float)(0.6 + 0.8 * dsrt_rng_uniform(&r));
                a->state[l->s_off + k] = (float)(0.4 * (dsrt_rng_uniform(&r) - 0.5));
                a->state[l->s_off + c + k] = (float)(0.5 + dsrt_rng_uniform(&r));
            }
        }
        if (l->kind == DSRT_LAYER_SCALE)
            for (size_t k = 0; k < l->w_n; k++)
                a->params[l->w_off + k] = (float)(0.5 + dsrt_rng_uniform(&r));
    }
    memcpy(b->params, a->params, a->n_params * sizeof *a->params);
    memcpy(b->state, a->state, a->n_state * sizeof *a->state);
    dsrt_net_params_changed(a);
    dsrt_net_params_changed(b);
}

/* Both nets' scores before the softmax (the last layer's input) for the
 * same n images: the largest difference relative to the largest score of
 * the image (random weights give scores of any size, and a softmax over
 * large ones hides differences in probabilities of 0 and 1). */
static double compare(dsrt_net *fused, dsrt_net *plain, int n, uint64_t seed) {
    size_t per = (size_t)fused->input.c * fused->input.h * fused->input.w;
    int last = fused->n_layers - 1, k_out = fused->classes;
    float *x = malloc((size_t)n * per * sizeof *x);
    float *pa = malloc((size_t)n * k_out * sizeof *pa),
          *pb = malloc((size_t)n * k_out * sizeof *pb);
    REQUIRE(x && pa && pb);
    dsrt_rng r = dsrt_rng_init(seed, 1, 2, 3);
    for (size_t k = 0; k < (size_t)n * per; k++) x[k] = (float)dsrt_rng_uniform(&r);
    CHECK_OK(dsrt_net_predict(fused, x, n, NULL, NULL, NULL, NULL));
    CHECK_OK(dsrt__net_layer_output(fused, fused->layers[last].inputs[0], pa, 0));
    CHECK_OK(dsrt_net_predict(plain, x, n, NULL, NULL, NULL, NULL));
    CHECK_OK(dsrt__net_layer_output(plain, plain->layers[last].inputs[0], pb, 0));
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double m = 0, d = 0;
        for (int k = 0; k < k_out; k++) {
            m = fmax(m, fabs(pb[(size_t)i * k_out + k]));
            d = fmax(d, fabs((double)pa[(size_t)i * k_out + k] - pb[(size_t)i * k_out + k]));
        }
        if (m > 0) worst = fmax(worst, d / m);
    }
    free(x);
    free(pa);
    free(pb);
    return worst;
}

static void check_net(const char *spec, int classes, int h, int w, int c, int big) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 3;
    dsrt_net *a = NULL, *b = NULL;
    CHECK_OK(dsrt_net_create(&a, spec, h, w, c, classes, &o));
    o.fuse = 0;
    CHECK_OK(dsrt_net_create(&b, spec, h, w, c, classes, &o));
    REQUIRE(a && b);
    randomise(a, b, 9);
    static const int sizes[] = {1, 3, 16, 64};
    double worst = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        if (big && sizes[k] > 3) continue;
        worst = fmax(worst, compare(a, b, sizes[k], 40 + k));
    }
    /* New weights: the folded copies follow. */
    randomise(a, b, 10);
    worst = fmax(worst, compare(a, b, 3, 50));
    const char *name = strchr(spec, '\n') ? "graph" : spec;
    /* The fused plan reuses the bytes of outputs no later layer reads; the
     * plain one keeps each. */
    size_t ha, ea, hb, eb;
    CHECK_OK(dsrt_net_activation_bytes(a, 3, 0, &ha, &ea));
    CHECK_OK(dsrt_net_activation_bytes(b, 3, 0, &hb, &eb));
    CHECK(ha > 0 && ha < ea);
    CHECK(hb == eb);
    CHECK_EQ(dsrt_net_activation_bytes(a, 5, 0, &ha, &ea), -ENOENT);
    CHECK_OK(dsrt_net_activation_bytes(a, 3, 0, &ha, &ea));
    fprintf(stderr, "  %s: largest relative difference %.2g; activations %.2f of %.2f MB\n", name,
            worst, ha / 1e6, ea / 1e6);
    CHECK(worst <= 1e-5);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

static void test_builtin(void) {
    check_net("digits", 10, 0, 0, 0, 0);
    check_net("cifar", 10, 0, 0, 0, 0);
    check_net("resnet20", 10, 0, 0, 0, 0);
    check_net("resnet18", 1000, 0, 0, 0, 1);
    check_net("mobilenet_v2", 1000, 0, 0, 0, 1);
    check_net("mobilenet_v3_small", 1000, 0, 0, 0, 1);
    check_net("efficientnet_b0", 1000, 0, 0, 0, 1);
}

/* Every fusible kind: conv + batchnorm + each activation; conv + batchnorm +
 * a residual add (the add's other input computed before, and after, the
 * convolution) with its ReLU; a layer scale; fc + batchnorm + hardswish;
 * a chain interrupted by a layer that takes the convolution's output too. */
static const char GRAPH[] = "input name=in size=12x12x3 normalization=zscore mean=0.4 std=0.3\n"
                            "conv name=c0 filters=8 size=3 pad=1\n"
                            "batchnorm name=b0\n"
                            "relu name=r0\n"
                            "conv name=c1 filters=8 size=3 pad=1 bias=0\n"
                            "batchnorm name=b1\n"
                            "add name=a1 inputs=b1,r0 relu=1\n"
                            "conv name=c2 filters=8 size=3 pad=1 groups=8\n"
                            "batchnorm name=b2\n"
                            "clip name=k2 min=0 max=6\n"
                            "conv name=c3 filters=8 size=1\n"
                            "batchnorm name=b3\n"
                            "hardswish name=h3\n"
                            "conv name=c4 filters=8 size=1\n"
                            "silu name=s4\n"
                            "conv name=c5 filters=8 size=1\n"
                            "sigmoid name=g5\n"
                            "hardsigmoid name=hs5\n"
                            "conv name=c6 filters=8 size=1\n"
                            "gelu name=e6\n"
                            "conv name=c7 filters=8 size=1\n"
                            "scale name=ls7\n"
                            "add name=a7 inputs=ls7,e6\n"
                            "conv name=c8 filters=8 size=1 inputs=a7\n"
                            "leakyrelu name=l8 leak=0.1\n"
                            "conv name=c9 filters=8 size=3 pad=1\n"
                            "batchnorm name=b9\n"
                            "conv name=c10 filters=8 size=1 inputs=l8\n"
                            "add name=a10 inputs=b9,c10\n"
                            "pad name=p11 pad=1,1,1,1 value=0.5\n"
                            "conv name=c11 filters=8 size=3\n"
                            "layernorm name=n11\n"
                            "gap name=g\n"
                            "fc name=f1 outputs=16\n"
                            "batchnorm name=fb\n"
                            "hardswish name=fh\n"
                            "fc name=f2 outputs=classes\n"
                            "softmax name=out\n";

static void test_graph(void) {
    check_net(GRAPH, 5, 0, 0, 0, 0);
}

/* An inference batch run in pieces (pieces of 3 for 16 images: the last of
 * one) gives the probabilities, loss and correct count of the batch run
 * whole, image for image; the outputs of a piece are not offered as the
 * batch's. */
static void check_pieces(const char *spec, int classes) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 5;
    dsrt_net *a = NULL, *b = NULL;
    CHECK_OK(dsrt_net_create(&a, spec, 0, 0, 0, classes, &o));
    CHECK_OK(dsrt_net_create(&b, spec, 0, 0, 0, classes, &o));
    REQUIRE(a && b);
    randomise(a, b, 11);
    enum { N = 16 };
    size_t per = (size_t)a->input.c * a->input.h * a->input.w;
    float *x = malloc(N * per * sizeof *x), *pa = malloc(N * (size_t)classes * sizeof *pa),
          *pb = malloc(N * (size_t)classes * sizeof *pb);
    int32_t labels[N];
    REQUIRE(x && pa && pb);
    dsrt_rng r = dsrt_rng_init(6, 1, 2, 3);
    for (size_t k = 0; k < N * per; k++) x[k] = (float)dsrt_rng_uniform(&r);
    for (int i = 0; i < N; i++) labels[i] = (int32_t)dsrt_rng_below(&r, (uint64_t)classes);
    a->infer_pieces = 3;
    b->infer_pieces = N;
    float la, lb;
    int ca, cb;
    CHECK_OK(dsrt_net_predict(a, x, N, pa, labels, &la, &ca));
    CHECK_OK(dsrt_net_predict(b, x, N, pb, labels, &lb, &cb));
    double worst = 0;
    for (size_t k = 0; k < N * (size_t)classes; k++) worst = fmax(worst, fabs(pa[k] - pb[k]));
    fprintf(stderr, "  %s in pieces of 3: largest difference of a probability %.2g\n",
            strchr(spec, '\n') ? "graph" : spec, worst);
    CHECK(worst <= 1e-5);
    CHECK(fabs(la - lb) <= 1e-5 * fmax(1.0, fabs(lb)));
    CHECK_EQ(ca, cb);
    float out[N * 16];
    CHECK(dsrt__net_layer_output(a, a->n_layers - 2, out, 0) < 0);
    CHECK(strstr(dsrt_last_error(), "pieces") != NULL);
    free(x);
    free(pa);
    free(pb);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

static void test_pieces(void) {
    check_pieces(GRAPH, 5);
    check_pieces("mobilenet_v3_small", 10);
}

/* A dense net's batch in two segments (its first stage in pieces of 4,
 * with a last piece of 3 for 7 images, the rest whole: a last-level cache
 * of 512 KB taken for it) predicts as the whole batch does. */
static void test_segments(void) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 8;
    dsrt_net *a = NULL, *b = NULL;
    CHECK_OK(dsrt_net_create(&a, "resnet20", 0, 0, 0, 10, &o));
    setenv("DSRT_CPU_SEGMENTS", "0", 1);
    CHECK_OK(dsrt_net_create(&b, "resnet20", 0, 0, 0, 10, &o));
    unsetenv("DSRT_CPU_SEGMENTS");
    REQUIRE(a && b);
    randomise(a, b, 17);
    a->infer_llc = b->infer_llc = 512 << 10;
    enum { N = 8 };
    size_t per = (size_t)a->input.c * a->input.h * a->input.w;
    float *x = malloc(N * per * sizeof *x), pa[N * 10], pb[N * 10], out[64];
    int32_t labels[N];
    REQUIRE(x);
    dsrt_rng r = dsrt_rng_init(7, 1, 2, 3);
    for (size_t k = 0; k < N * per; k++) x[k] = (float)dsrt_rng_uniform(&r);
    for (int i = 0; i < N; i++) labels[i] = (int32_t)dsrt_rng_below(&r, 10);
    for (int n = N - 1; n <= N; n++) {
        float la, lb;
        int ca, cb;
        CHECK_OK(dsrt_net_predict(a, x, n, pa, labels, &la, &ca));
        /* The first layers ran in pieces: their outputs are not kept. */
        CHECK(dsrt__net_layer_output(a, 1, out, 0) < 0);
        CHECK(strstr(dsrt_last_error(), "pieces") != NULL);
        CHECK_OK(dsrt_net_predict(b, x, n, pb, labels, &lb, &cb));
        double worst = 0;
        for (size_t k = 0; k < (size_t)n * 10; k++) worst = fmax(worst, fabs(pa[k] - pb[k]));
        fprintf(stderr, "  resnet20, %d images in segments: largest difference %.2g\n", n, worst);
        CHECK(worst <= 1e-5);
        CHECK(fabs(la - lb) <= 1e-5 * fmax(1.0, fabs(lb)));
        CHECK_EQ(ca, cb);
    }
    free(x);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

/* Chains oneDNN 2.6 computes wrongly when fused (two post-ops of one
 * algorithm with different parameters, in the NHWC layout that a grouped
 * convolution gives: the second took the first one's), and sums whose
 * inputs differ in rank (a fully connected layer's 2-D output and a
 * pooling's 4-D one): planned and computed as the unfused net. */
static void test_odd_chains(void) {
    static const char leaky_relu[] = "input name=in size=8x8x16\n"
                                     "conv name=c2 filters=16 size=1 groups=16 bias=1\n"
                                     "relu name=r4 inputs=c2\n"
                                     "conv name=c8 filters=16 size=1 groups=1 bias=1 inputs=r4\n"
                                     "leakyrelu name=r10 leak=0.1\n"
                                     "add name=a11 inputs=r10,c2 relu=1\n"
                                     "gap name=g\nfc name=f outputs=classes\nsoftmax name=out\n";
    static const char two_clips[] = "input name=in size=8x8x24\n"
                                    "conv name=d filters=24 size=3 pad=1 groups=24\n"
                                    "clip min=0 max=6\n"
                                    "conv name=p filters=24 size=1\n"
                                    "clip min=-1 max=1\n"
                                    "gap\nfc outputs=classes\nsoftmax\n";
    static const char fc_sum[] = "input name=in size=8x8x16\n"
                                 "conv name=c0 filters=16 size=3 pad=1\n"
                                 "gap name=g\nfc name=f1 outputs=16 inputs=g\n"
                                 "fc name=f3 outputs=16 inputs=f1\nadd name=s inputs=f3,g\n"
                                 "fc name=f2 outputs=classes\nsoftmax name=out\n";
    static const char conv_sum[] =
        "input name=in size=8x8x16\n"
        "conv name=c0 filters=16 size=3 pad=1\n"
        "gap name=g\nfc name=f1 outputs=16 inputs=g\n"
        "conv name=x filters=16 size=1 inputs=g\nadd name=s inputs=x,f1\n"
        "fc name=f2 outputs=classes\nsoftmax name=out\n";
    check_net(leaky_relu, 5, 0, 0, 0, 0);
    check_net(two_clips, 5, 0, 0, 0, 0);
    check_net(fc_sum, 5, 0, 0, 0, 0);
    check_net(conv_sum, 5, 0, 0, 0, 0);
}

/* A training forward moves batchnorm's running statistics without a step:
 * the next prediction folds the new ones. */
static void test_after_forward_alone(void) {
    static const char spec[] = "input size=8x8x3\n"
                               "conv name=c0 filters=16 size=3 pad=1\nbatchnorm name=b0\nrelu\n"
                               "conv name=c1 filters=16 size=3 pad=1\nbatchnorm name=b1\nrelu\n"
                               "gap\nfc outputs=classes\nsoftmax\n";
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 3;
    dsrt_net *a = NULL, *b = NULL;
    CHECK_OK(dsrt_net_create(&a, spec, 0, 0, 0, 5, &o));
    o.fuse = 0;
    CHECK_OK(dsrt_net_create(&b, spec, 0, 0, 0, 5, &o));
    REQUIRE(a && b);
    randomise(a, b, 9);
    double before = compare(a, b, 4, 80);
    float x[8 * 8 * 8 * 3];
    int32_t y[8];
    dsrt_rng r = dsrt_rng_init(14, 0, 0, 0);
    for (size_t k = 0; k < sizeof x / sizeof *x; k++) x[k] = (float)dsrt_rng_uniform(&r);
    for (int k = 0; k < 8; k++) y[k] = k % 5;
    CHECK_OK(dsrt_net_forward_backward(a, x, y, 8, NULL, NULL));
    CHECK_OK(dsrt_net_forward_backward(b, x, y, 8, NULL, NULL));
    CHECK(!memcmp(a->state, b->state, a->n_state * sizeof *a->state));
    double after = compare(a, b, 4, 81);
    fprintf(stderr, "  after a training forward alone: %.2g (before it %.2g)\n", after, before);
    CHECK(before <= 1e-5 && after <= 1e-5);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

/* A residual add's other input, whose bytes a fused sum may take: with
 * keep_outputs its values read back as the unfused net's; without, reading
 * it is refused rather than giving the sum. */
static void test_sum_input_read(void) {
    static const char spec[] = "input name=in size=8x8x16\n"
                               "conv name=c0 filters=16 size=3 pad=1\nrelu name=r0\n"
                               "conv name=c1 filters=16 size=3 pad=1\nrelu name=r1\n"
                               "conv name=c2 filters=16 size=3 pad=1\nbatchnorm name=b1\n"
                               "add name=a1 inputs=b1,r0 relu=1\n"
                               "gap\nfc outputs=classes\nsoftmax\n";
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 5;
    dsrt_net *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(dsrt_net_create(&a, spec, 0, 0, 0, 5, &o));
    CHECK_OK(dsrt_net_create(&c, spec, 0, 0, 0, 5, &o));
    o.fuse = 0;
    CHECK_OK(dsrt_net_create(&b, spec, 0, 0, 0, 5, &o));
    REQUIRE(a && b && c);
    randomise(a, b, 15);
    memcpy(c->params, a->params, a->n_params * sizeof *a->params);
    memcpy(c->state, a->state, a->n_state * sizeof *a->state);
    dsrt_net_params_changed(c);
    a->keep_outputs = 1;
    b->keep_outputs = 1;
    int r0 = -1;
    for (int i = 0; i < a->n_layers; i++)
        if (!strcmp(a->layers[i].name, "r0")) r0 = i;
    REQUIRE(r0 > 0);
    size_t per = (size_t)a->input.c * a->input.h * a->input.w, vals = 3 * (size_t)16 * 8 * 8;
    float *x = malloc(3 * per * sizeof *x), *ya = malloc(vals * sizeof *ya),
          *yb = malloc(vals * sizeof *yb);
    REQUIRE(x && ya && yb);
    dsrt_rng r = dsrt_rng_init(16, 0, 0, 0);
    for (size_t k = 0; k < 3 * per; k++) x[k] = (float)dsrt_rng_uniform(&r);
    CHECK_OK(dsrt_net_predict(a, x, 3, NULL, NULL, NULL, NULL));
    CHECK_OK(dsrt_net_predict(b, x, 3, NULL, NULL, NULL, NULL));
    CHECK_OK(dsrt__net_layer_output(a, r0, ya, 0));
    CHECK_OK(dsrt__net_layer_output(b, r0, yb, 0));
    double d = 0;
    for (size_t k = 0; k < vals; k++) d = fmax(d, fabs((double)ya[k] - yb[k]));
    CHECK(d <= 1e-5);
    CHECK_OK(dsrt_net_predict(c, x, 3, NULL, NULL, NULL, NULL));
    CHECK_EQ(dsrt__net_layer_output(c, r0, ya, 0), -EINVAL);
    free(x);
    free(ya);
    free(yb);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    dsrt_net_destroy(c);
}

/* The fused net trains as before (training plans fuse nothing new), and
 * predicts with the new weights after a step. */
static void test_after_training(void) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 4;
    dsrt_net *a = NULL, *b = NULL;
    CHECK_OK(dsrt_net_create(&a, GRAPH, 0, 0, 0, 5, &o));
    o.fuse = 0;
    CHECK_OK(dsrt_net_create(&b, GRAPH, 0, 0, 0, 5, &o));
    REQUIRE(a && b);
    randomise(a, b, 11);
    double before = compare(a, b, 4, 60);
    size_t per = (size_t)a->input.c * a->input.h * a->input.w;
    float x[8 * 12 * 12 * 3];
    int32_t y[8];
    dsrt_rng r = dsrt_rng_init(12, 0, 0, 0);
    for (size_t k = 0; k < 8 * per; k++) x[k] = (float)dsrt_rng_uniform(&r);
    for (int k = 0; k < 8; k++) y[k] = k % 5;
    dsrt_optimizer *opt = NULL;
    dsrt_optimizer_options oo = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    oo.learn_rate = 0.1;
    CHECK_OK(dsrt_optimizer_create(&opt, a, &oo));
    CHECK_OK(dsrt_net_forward_backward(a, x, y, 8, NULL, NULL));
    CHECK_OK(dsrt_optimizer_step(opt, a, 0));
    memcpy(b->params, a->params, a->n_params * sizeof *a->params);
    memcpy(b->state, a->state, a->n_state * sizeof *a->state);
    dsrt_net_params_changed(b);
    double after = compare(a, b, 4, 61);
    fprintf(stderr, "  after a training step: %.2g (before it %.2g)\n", after, before);
    CHECK(before <= 1e-5 && after <= 1e-5);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

/* A net made for a new task from a trained one (dsrt_net_transfer: the last
 * fully connected layer new, the rest kept) predicts alike fused and not. */
static void test_after_transfer(void) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 6;
    dsrt_net *base = NULL, *twin = NULL, *a = NULL, *b = NULL;
    CHECK_OK(dsrt_net_create(&base, "resnet20", 0, 0, 0, 10, &o));
    CHECK_OK(dsrt_net_create(&twin, "resnet20", 0, 0, 0, 10, &o));
    REQUIRE(base && twin);
    randomise(base, twin, 13);
    dsrt_transfer_options t = dsrt_transfer_defaults();
    t.classes = 4;
    CHECK_OK(dsrt_net_transfer(&a, base, &t, &o));
    o.fuse = 0;
    CHECK_OK(dsrt_net_transfer(&b, base, &t, &o));
    REQUIRE(a && b);
    double d = compare(a, b, 5, 70);
    fprintf(stderr, "  after a transfer: %.2g\n", d);
    CHECK(d <= 1e-5);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    dsrt_net_destroy(base);
    dsrt_net_destroy(twin);
}

int main(void) {
    RUN(test_graph);
    RUN(test_pieces);
    RUN(test_segments);
    RUN(test_after_training);
    RUN(test_after_transfer);
    RUN(test_odd_chains);
    RUN(test_after_forward_alone);
    RUN(test_sum_input_read);
    RUN(test_builtin);
    return TEST_RESULT();
}

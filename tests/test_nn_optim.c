/*
 * Tests of the optimizers against values computed by hand: SGD with
 * momentum (MATLAB's form, L2 added to the gradient), Adam with bias
 * correction, RMSProp, per-layer learn-rate and L2 factors (0 freezes),
 * gradient clipping by l2norm, global-l2norm and absolute value, and the
 * piecewise learning-rate schedule. Tolerance 1e-6 (float32 arithmetic).
 */
#include "nn/internal.h"
#include "task.h"

#include <math.h>
#include <string.h>

/* input 1x1x2 -> fc 2 outputs: weights w[0..3] at layers[1].w_off, biases
 * b[0..1] at layers[1].b_off. */
static dsrt_net *tiny(const char *fc_opts) {
    char desc[256];
    snprintf(desc, sizeof desc, "input size=1x1x2\nfc outputs=2 %s\nsoftmax\n", fc_opts);
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, desc, 0, 0, 0, 2, NULL);
    if (rc) fprintf(stderr, "%s\n", dsrt_last_error());
    REQUIRE(rc == 0);
    return net;
}

static float *W(dsrt_net *net) {
    return net->params + net->layers[1].w_off;
}
static float *B(dsrt_net *net) {
    return net->params + net->layers[1].b_off;
}
static float *GW(dsrt_net *net) {
    return net->grads + net->layers[1].w_off;
}
static float *GB(dsrt_net *net) {
    return net->grads + net->layers[1].b_off;
}

static void set4(float *p, float a, float b, float c, float d) {
    p[0] = a, p[1] = b, p[2] = c, p[3] = d;
}

static void test_sgdm(void) {
    dsrt_net *net = tiny("blr=2 bl2=0 wl2=1");
    dsrt_optimizer_options o = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    CHECK_NEAR(o.learn_rate, 0.01, 0);
    CHECK_NEAR(o.momentum, 0.9, 0);
    CHECK_NEAR(o.l2, 1e-4, 0);
    o.learn_rate = 0.1;
    o.l2 = 0.01;
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    set4(W(net), 1, -2, 0.5, 0);
    B(net)[0] = 1, B(net)[1] = 0;
    uint64_t v0 = net->version;
    for (int step = 0; step < 2; step++) {
        set4(GW(net), 0.5, 0.5, -1, 0);
        GB(net)[0] = 0.5, GB(net)[1] = -0.25;
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    }
    CHECK(net->version != v0);
    /* w0: v1 = -0.1 (0.5 + 0.01) = -0.051, w = 0.949;
     *     v2 = 0.9 v1 - 0.1 (0.5 + 0.01 * 0.949) = -0.096849, w = 0.852151 */
    CHECK_NEAR(W(net)[0], 0.852151, 1e-6);
    /* w1 = -2: v1 = -0.1 (0.5 - 0.02) = -0.048, w = -2.048;
     *     v2 = -0.0432 - 0.1 (0.5 - 0.02048) = -0.091152, w = -2.139152 */
    CHECK_NEAR(W(net)[1], -2.139152, 1e-6);
    /* bias: rate 0.2, no L2: v1 = -0.1, b = 0.9; v2 = -0.09 - 0.1, b = 0.71 */
    CHECK_NEAR(B(net)[0], 0.71, 1e-6);
    CHECK_NEAR(B(net)[1], 0.0 + 0.05 + (0.045 + 0.05), 1e-6);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

static void test_adam_rmsprop(void) {
    dsrt_net *net = tiny("");
    dsrt_optimizer_options o = dsrt_optimizer_defaults(DSRT_SOLVER_ADAM);
    CHECK_NEAR(o.learn_rate, 0.001, 0);
    CHECK_NEAR(o.sq_gradient_decay, 0.999, 0);
    o.l2 = 0;
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    set4(W(net), 1, 1, 1, 1);
    set4(GW(net), 0.5, -2, 0, 1e-3);
    CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    /* First step: m^ = g, v^ = g^2, w -= lr g / (|g| + eps). */
    CHECK_NEAR(W(net)[0], 1 - 0.001 * 0.5 / (0.5 + 1e-8), 1e-6);
    CHECK_NEAR(W(net)[1], 1 + 0.001, 1e-6);
    CHECK_NEAR(W(net)[2], 1, 0);
    set4(GW(net), 0.5, -2, 0, 1e-3);
    GW(net)[0] = -0.5;
    CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    /* Second step, w0: m = 0.9*0.05 + 0.1*(-0.5) = -0.005, v = 0.999*0.00025 + 0.001*0.25
     * = 0.00049975; m^ = -0.005/0.19 = -0.0263158, v^ = 0.00049975/0.001999 = 0.2500 */
    double m = -0.005 / (1 - 0.81), v = (0.999 * 0.00025 + 0.00025) / (1 - 0.999 * 0.999);
    CHECK_NEAR(W(net)[0], 1 - 0.001 * 0.5 / (0.5 + 1e-8) - 0.001 * m / (sqrt(v) + 1e-8), 1e-6);
    dsrt_optimizer_destroy(opt);

    o = dsrt_optimizer_defaults(DSRT_SOLVER_RMSPROP);
    CHECK_NEAR(o.sq_gradient_decay, 0.9, 0);
    o.l2 = 0.1;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    set4(W(net), 1, 1, 1, 1);
    set4(GW(net), 0.5, 0, 0, 0);
    CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    /* g' = 0.5 + 0.1 = 0.6, v = 0.1 * 0.36 = 0.036, w = 1 - 0.001 * 0.6 / sqrt(0.036) */
    CHECK_NEAR(W(net)[0], 1 - 0.001 * 0.6 / sqrt(0.036), 1e-6);
    /* g' = 0.1 (L2 alone), v = 0.001: w = 1 - 0.001 * 0.1 / sqrt(0.001) */
    CHECK_NEAR(W(net)[1], 1 - 0.001 * 0.1 / sqrt(0.001), 1e-6);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

static void test_frozen_and_factors(void) {
    dsrt_net *net = tiny("wlr=0 blr=0.5 bl2=2");
    dsrt_optimizer_options o = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    o.learn_rate = 1;
    o.momentum = 0;
    o.l2 = 0.5;
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    set4(W(net), 1, 2, 3, 4);
    set4(GW(net), 1, 1, 1, 1);
    B(net)[0] = 1, B(net)[1] = -1;
    GB(net)[0] = 0, GB(net)[1] = 0;
    CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    for (int k = 0; k < 4; k++) CHECK_NEAR(W(net)[k], k + 1, 0);
    /* rate 0.5, L2 1.0: b -= 0.5 * (0 + 1.0 * b) */
    CHECK_NEAR(B(net)[0], 0.5, 1e-7);
    CHECK_NEAR(B(net)[1], -0.5, 1e-7);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

static void test_clipping(void) {
    dsrt_net *net = tiny("bl2=0");
    dsrt_optimizer_options o = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    o.learn_rate = 1;
    o.momentum = 0;
    o.l2 = 0;
    o.grad_threshold = 1;
    dsrt_optimizer *opt;
    /* global-l2norm: all gradients (3, 4, 0, 0 | 0, 0) of norm 5 scaled to 1 */
    o.clip = DSRT_CLIP_GLOBAL_L2NORM;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    set4(W(net), 0, 0, 0, 0);
    set4(GW(net), 3, 0, 0, 0);
    GB(net)[0] = 4, GB(net)[1] = 0;
    B(net)[0] = B(net)[1] = 0;
    CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    CHECK_NEAR(W(net)[0], -0.6, 1e-6);
    CHECK_NEAR(B(net)[0], -0.8, 1e-6);
    dsrt_optimizer_destroy(opt);
    /* l2norm: each tensor on its own: weights (3) -> 1, bias (4) -> 1 */
    o.clip = DSRT_CLIP_L2NORM;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    set4(W(net), 0, 0, 0, 0);
    set4(GW(net), 3, 0, 0, 0);
    GB(net)[0] = 0.5, GB(net)[1] = 0;
    B(net)[0] = 0;
    CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    CHECK_NEAR(W(net)[0], -1, 1e-6);
    CHECK_NEAR(B(net)[0], -0.5, 1e-6);
    dsrt_optimizer_destroy(opt);
    /* absolute-value: clamp each */
    o.clip = DSRT_CLIP_ABSOLUTE;
    o.grad_threshold = 0.25;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    set4(W(net), 0, 0, 0, 0);
    set4(GW(net), 3, -3, 0.1, -0.1);
    CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    CHECK_NEAR(W(net)[0], -0.25, 1e-7);
    CHECK_NEAR(W(net)[1], 0.25, 1e-7);
    CHECK_NEAR(W(net)[2], -0.1, 1e-7);
    CHECK_NEAR(W(net)[3], 0.1, 1e-7);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

static void test_schedule_and_options(void) {
    dsrt_net *net = tiny("");
    dsrt_optimizer_options o = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    o.schedule = DSRT_LR_PIECEWISE;
    o.drop_factor = 0.5;
    o.drop_period = 10;
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    CHECK_NEAR(dsrt_optimizer_learn_rate(opt, 0), 0.01, 1e-12);
    CHECK_NEAR(dsrt_optimizer_learn_rate(opt, 9), 0.01, 1e-12);
    CHECK_NEAR(dsrt_optimizer_learn_rate(opt, 10), 0.005, 1e-12);
    CHECK_NEAR(dsrt_optimizer_learn_rate(opt, 25), 0.0025, 1e-12);
    /* The step uses the epoch's rate. */
    o.momentum = 0;
    o.l2 = 0;
    dsrt_optimizer_destroy(opt);
    CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
    set4(W(net), 0, 0, 0, 0);
    set4(GW(net), 1, 0, 0, 0);
    CHECK_OK(dsrt_optimizer_step(opt, net, 20));
    CHECK_NEAR(W(net)[0], -0.0025, 1e-9);
    dsrt_optimizer_destroy(opt);

    dsrt_optimizer_options bad = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    bad.learn_rate = -1;
    CHECK_EQ(dsrt_optimizer_create(&opt, net, &bad), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "learn_rate");
    bad = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    bad.momentum = 1;
    CHECK_EQ(dsrt_optimizer_create(&opt, net, &bad), DSRT_EOPTION);
    bad = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    bad.drop_period = 0;
    CHECK_EQ(dsrt_optimizer_create(&opt, net, &bad), DSRT_EOPTION);
    /* An optimizer belongs to nets of its size. */
    CHECK_OK(dsrt_optimizer_create(&opt, net, NULL));
    dsrt_net *other;
    CHECK_OK(dsrt_net_create(&other, "digits", 0, 0, 0, 10, NULL));
    CHECK_EQ(dsrt_optimizer_step(opt, other, 0), -EINVAL);
    dsrt_net_destroy(other);
    dsrt_optimizer_destroy(opt);
    dsrt_optimizer_destroy(NULL);
    dsrt_net_destroy(net);
}

int main(void) {
    RUN(test_sgdm);
    RUN(test_adam_rmsprop);
    RUN(test_frozen_and_factors);
    RUN(test_clipping);
    RUN(test_schedule_and_options);
    return TEST_RESULT();
}

/*
 * The per-layer profile of training steps (dsrt_net_profile_*), on the CPU
 * backend: the clock around each layer's forward and backward and the
 * optimizer. What is checked is what the profile promises whatever the
 * machine's speed: steps counted from the start (and only while on), every
 * layer that computes has a forward time and every one that learns a
 * backward time, a ReLU folded into the layer before has none of its own,
 * the sums agree with the parts, the gaps are never negative, a restart
 * starts from zero, and reading a net that never started is refused.
 * (The GPU backend's device events are tested in test_gpu_backend.)
 */
#include "nn/internal.h"
#include "task.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define NET                                                                                        \
    "input size=8x8x3\nconv filters=8 size=3 pad=1\nrelu\nconv filters=8 size=3 pad=1 bias=0\n"    \
    "batchnorm\nrelu\nmaxpool size=2 stride=2\nfc outputs=16\nrelu\ndropout p=0.3\n"               \
    "fc outputs=4\nsoftmax\n"

static void step(dsrt_net *net, dsrt_optimizer *opt, const float *x, const int32_t *y) {
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 8, NULL, NULL));
    CHECK_OK(dsrt_optimizer_step(opt, net, 0));
}

static void test_profile(void) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    dsrt_net *net = NULL;
    CHECK_OK(dsrt_net_create(&net, NET, 0, 0, 0, 4, &o));
    REQUIRE(net);
    dsrt_optimizer *opt = NULL;
    CHECK_OK(dsrt_optimizer_create(&opt, net, NULL));
    float x[8 * 3 * 8 * 8];
    int32_t y[8];
    dsrt_rng r = dsrt_rng_init(3, 0, 0, 0);
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)dsrt_rng_uniform(&r);
    for (int i = 0; i < 8; i++) y[i] = i % 4;
    dsrt_net_profile p;
    dsrt_layer_profile lp[16];
    CHECK_EQ(dsrt_net_profile_read(net, &p, lp, 16), -ENOENT);
    step(net, opt, x, y); /* plans the shape: not timed */
    CHECK_OK(dsrt_net_profile_start(net));
    for (int s = 0; s < 4; s++) step(net, opt, x, y);
    float probs[8 * 4];
    CHECK_OK(dsrt_net_predict(net, x, 8, probs, NULL, NULL, NULL)); /* inference: not a step */
    dsrt_net_profile_stop(net);
    step(net, opt, x, y); /* stopped: not timed */
    int n = dsrt_net_profile_read(net, &p, lp, 16);
    REQUIRE(n == net->n_layers);
    CHECK_EQ(p.steps, 4);
    CHECK_EQ(p.device_events, 0);
    CHECK_EQ(p.graph_steps, 0);
    CHECK(p.optimizer_ms > 0);
    CHECK(p.layers_ms > 0 && p.step_ms >= p.layers_ms * 0.999);
    CHECK(p.gaps_ms >= 0 && p.gaps_per_step > 0);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        const dsrt_layer *L = &net->layers[i];
        CHECK_STR_EQ(lp[i].name, L->name);
        CHECK_EQ(lp[i].relu_fused, L->fuse_relu);
        sum += lp[i].forward_ms + lp[i].backward_ms;
        if (L->fused_away) {
            CHECK(lp[i].forward_ms == 0 && lp[i].backward_ms == 0);
        } else if (i > 0) {
            CHECK(lp[i].forward_ms > 0);
            if (L->w_n) CHECK(lp[i].backward_ms > 0);
        }
    }
    CHECK(fabs(sum - p.layers_ms) <= 1e-9 * sum + 1e-12);
    /* A restart counts from zero. */
    CHECK_OK(dsrt_net_profile_start(net));
    step(net, opt, x, y);
    CHECK_EQ(dsrt_net_profile_read(net, &p, NULL, 0), n);
    CHECK_EQ(p.steps, 1);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

int main(void) {
    RUN(test_profile);
    return TEST_RESULT();
}

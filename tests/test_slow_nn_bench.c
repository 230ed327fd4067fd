/*
 * Slow checks of the built-in networks at their benchmark sizes: each trains
 * for a few steps on one fixed random batch (which it must start to
 * memorise: the loss falls), inference agrees between batch sizes, a saved
 * model predicts the same, and the steps are timed (images/s printed, not
 * checked: timing belongs to `dstrain bench`).
 */
#include "nn/internal.h"
#include "task.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void run(const char *name, int batch, int classes, int steps, double lr) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    dsrt_net *net;
    CHECK_OK(dsrt_net_create(&net, name, 0, 0, 0, classes, &o));
    if (!net) return;
    dsrt_optimizer_options oo = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    oo.learn_rate = lr;
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &oo));
    size_t per = (size_t)net->input.c * net->input.h * net->input.w;
    float *x = malloc((size_t)batch * per * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    REQUIRE(x && y && opt);
    dsrt_rng r = dsrt_rng_init(1, 2, 3, 4);
    for (size_t i = 0; i < (size_t)batch * per; i++) x[i] = (float)dsrt_rng_uniform(&r);
    for (int i = 0; i < batch; i++) y[i] = (int32_t)dsrt_rng_below(&r, (uint64_t)classes);
    float first = 0, last = 0;
    double t = 0;
    for (int s = 0; s < steps; s++) {
        double t0 = now();
        CHECK_OK(dsrt_net_forward_backward(net, x, y, batch, &last, NULL));
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
        if (s >= 2) t += now() - t0;
        if (s == 0) first = last;
        CHECK(isfinite(last));
    }
    fprintf(stderr, "  %s: batch %d, loss %.4f -> %.4f over %d steps, %.1f images/s\n", name, batch,
            (double)first, (double)last, steps, batch * (steps - 2) / t);
    CHECK(last < first);
    /* Inference on the first 3 images alone and within the batch agree. */
    float *all = malloc((size_t)batch * classes * sizeof *all), three[3 * 64];
    REQUIRE(all && classes <= 64);
    CHECK_OK(dsrt_net_predict(net, x, batch, all, NULL, NULL, NULL));
    CHECK_OK(dsrt_net_predict(net, x, 3, three, NULL, NULL, NULL));
    double diff = 0;
    for (int k = 0; k < 3 * classes; k++) diff = fmax(diff, fabs(all[k] - three[k]));
    CHECK(diff < 1e-4);
    /* A saved model predicts the same. */
    const char *tmp = getenv("DSRT_TEST_TMP");
    char path[512];
    snprintf(path, sizeof path, "%s/slow_%s.dsrt", tmp ? tmp : "/tmp", name);
    CHECK_OK(dsrt_model_save(path, net));
    dsrt_net *back;
    CHECK_OK(dsrt_model_load(&back, path, &o));
    if (back) {
        float again[3 * 64];
        CHECK_OK(dsrt_net_predict(back, x, 3, again, NULL, NULL, NULL));
        CHECK(memcmp(again, three, 3 * classes * sizeof(float)) == 0);
        dsrt_net_destroy(back);
    }
    remove(path);
    free(all);
    free(x);
    free(y);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

static void test_digits(void) {
    run("digits", 128, 10, 12, 0.01);
}

static void test_cifar(void) {
    run("cifar", 64, 10, 8, 0.01);
}

static void test_alexnet(void) {
    run("alexnet", 16, 55, 6, 0.001);
}

int main(void) {
    RUN(test_digits);
    RUN(test_cifar);
    RUN(test_alexnet);
    return TEST_RESULT();
}

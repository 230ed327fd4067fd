/*
 * Benchmark of the training loop (label "slow"): the built-in digits net on
 * a generated folder of 28x28 gray PNGs (ten classes of noisy patterns,
 * 6000 images), end to end through the pipeline, against the same training
 * steps on a batch already in memory (what `dstrain bench` times). Background
 * dispatch should hide the loading: the end-to-end rate should be at least
 * 0.9 of the in-memory one on a quiet machine. The ratio is reported, not
 * checked: on a machine shared with other work (or with the other tests) it
 * says more about the load than about dsrt. Checks that the net learns, and,
 * at this size, that one epoch plus a resume to two gives the weights of two
 * epochs straight.
 */
#include "task.h"
#include "testimg.h"

#include <dsrt.h>

#include <time.h>

#define SIDE      28
#define CLASSES   10
#define PER_CLASS 600

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void make_folder(const char *dir) {
    uint8_t px[SIDE * SIDE];
    for (int c = 0; c < CLASSES; c++) {
        char sub[4200];
        snprintf(sub, sizeof sub, "%s/class%02d", dir, c);
        REQUIRE(timg_mkdirs(sub) == 0);
        for (int i = 0; i < PER_CLASS; i++) {
            uint32_t seed = (uint32_t)(c * 100000 + i);
            for (int y = 0; y < SIDE; y++)
                for (int x = 0; x < SIDE; x++) {
                    /* Class c: stripes at angle c * 18 degrees and period 3 + c % 4. */
                    double a = c * 0.314, t = x * cos(a) + y * sin(a);
                    int v = ((int)(t / (3 + c % 4) + (timg_hash(seed) % 4)) % 2) ? 190 : 60;
                    v += (int)(timg_hash(seed * 31u + (uint32_t)(y * SIDE + x)) % 61) - 30;
                    px[y * SIDE + x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
            char path[4300];
            snprintf(path, sizeof path, "%s/%04d.png", sub, i);
            dsrt_image img = {px, SIDE, SIDE, 1, SIDE};
            REQUIRE(dsrt_png_write(path, &img) == 0);
        }
    }
}

static dsrt_net *make_net(const dsrt_datastore *ds) {
    char *desc = dsrt_describe_datastore_classes("digits", ds);
    REQUIRE(desc);
    dsrt_net *net = NULL;
    CHECK_OK(dsrt_net_create(&net, desc, 0, 0, 0, CLASSES, NULL));
    free(desc);
    REQUIRE(net);
    return net;
}

/* Median seconds of a training step on one batch in memory, with the
 * compute thread count the loop used. */
static double step_seconds(const dsrt_datastore *ds, int threads, int steps) {
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = threads;
    char *desc = dsrt_describe_datastore_classes("digits", ds);
    dsrt_net *net = NULL;
    CHECK_OK(dsrt_net_create(&net, desc, 0, 0, 0, CLASSES, &no));
    free(desc);
    dsrt_optimizer *opt = NULL;
    CHECK_OK(dsrt_optimizer_create(&opt, net, NULL));
    float *x = malloc(128 * SIDE * SIDE * sizeof *x);
    int32_t y[128];
    for (int i = 0; i < 128 * SIDE * SIDE; i++) x[i] = (float)(timg_hash((uint32_t)i) % 256) / 255;
    for (int i = 0; i < 128; i++) y[i] = i % CLASSES;
    double *t = malloc((size_t)steps * sizeof *t);
    for (int s = -3; s < steps; s++) {
        double t0 = now();
        CHECK_OK(dsrt_net_forward_backward(net, x, y, 128, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
        if (s >= 0) t[s] = now() - t0;
    }
    for (int i = 1; i < steps; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double u = t[j];
            t[j] = t[j - 1];
            t[j - 1] = u;
        }
    double median = t[steps / 2];
    free(t);
    free(x);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
    return median;
}

int main(void) {
    char root[4096], data[4200], ckpt[4200];
    REQUIRE(timg_tmpdir("slow_train", root, sizeof root) == 0);
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", root);
    make_folder(data);
    dsrt_datastore *ds = NULL;
    CHECK_OK(dsrt_datastore_open(&ds, data, NULL));
    REQUIRE(ds);

    /* Two epochs straight, end to end. */
    dsrt_net *a = make_net(ds);
    dsrt_train_options o = dsrt_train_defaults();
    o.max_epochs = 2;
    o.augment.rand_x_reflection = 1;
    dsrt_train_result ra;
    CHECK_OK(dsrt_train(a, ds, &o, &ra));
    double in_memory = 128.0 / step_seconds(ds, ra.compute_threads, 20);
    double ratio = ra.images_per_s / in_memory;
    fprintf(stderr,
            "digits, batch 128, %u worker(s), %d compute thread(s): end to end %.0f images/s "
            "(the compute waited %.2f s for data), in memory %.0f images/s: ratio %.2f; "
            "accuracy of the last batch %.2f\n",
            ra.workers, ra.compute_threads, ra.images_per_s, ra.consumer_wait_s, in_memory, ratio,
            ra.accuracy);
    if (ratio < 0.9)
        fprintf(stderr, "end to end below 0.9 of in memory: is the machine busy? (%.2f)\n", ratio);
    CHECK(ra.accuracy >= 0.8);

    /* One epoch with a checkpoint, then resumed to two: the same weights. */
    dsrt_net *b = make_net(ds);
    o.max_epochs = 1;
    o.checkpoint_path = ckpt;
    CHECK_OK(dsrt_train(b, ds, &o, NULL));
    dsrt_net *c = make_net(ds);
    o.max_epochs = 2;
    o.checkpoint_path = NULL;
    o.resume = ckpt;
    dsrt_train_result rc;
    CHECK_OK(dsrt_train(c, ds, &o, &rc));
    fprintf(stderr, "two epochs straight %016llx, one + resume %016llx\n",
            (unsigned long long)ra.weights_checksum, (unsigned long long)rc.weights_checksum);
    CHECK_EQ(rc.weights_checksum, ra.weights_checksum);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    dsrt_net_destroy(c);
    dsrt_datastore_close(ds);
    return TEST_RESULT();
}

/*
 * How much of the gradient all-reduce hides behind backward: the per-step
 * figures of data-parallel training on the cifar net with 2 MPI ranks (one
 * compute thread each), from the communicator's timeline.
 *
 *     ctest -L slow -R comm_bench --verbose          # as CTest runs it
 *     build/tests/test_slow_comm_bench [BATCH [STEPS [FIRST_KIB [BUCKET_KIB]]]]
 *
 * BATCH is the global batch (default 128, 64 a rank), STEPS the measured
 * steps after 3 warm-up ones (default 10), FIRST_KIB and BUCKET_KIB the
 * bucket sizes (defaults 1024 and 25600: 1 MiB then 25 MiB). Per step, the
 * median over the steps of:
 *
 *   backward    from backward's start to its end on this rank (and, for
 *               comparison, without a communicator attached)
 *   all-reduce  one blocking all-reduce of the whole gradient buffer after
 *               the step: what communication costs when nothing hides it
 *   exposed     from the end of the LAST rank's backward until every bucket's
 *               sum was done here: the communication the step still waits
 *               for (the ranks share one clock on one machine; measuring
 *               from the last rank's end leaves out load imbalance, which
 *               no overlap can hide)
 *   hidden      1 - exposed / all-reduce: the share of the communication
 *               that ran while backward was still computing
 *
 * Figures of rank 0.
 * The launcher checks only that the job succeeds: timing is printed, not
 * asserted.
 */
#include "tests/commtest.h"

#include <dsrt/nn.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Backward's start and end, from the net's hook, for steps without a
 * communicator. */
static void on_backward(void *ctx, int end) {
    ((double *)ctx)[end] = now_s();
}

static int worker(int global, int steps, size_t first_kib, size_t bucket_kib) {
    dsrt_comm_options o = dsrt_comm_defaults();
    o.first_bucket_bytes = first_kib << 10;
    o.bucket_bytes = bucket_kib << 10;
    dsrt_comm *c = NULL;
    CHECK_OK(dsrt_comm_open(&c, &o));
    REQUIRE(c);
    int r = dsrt_comm_rank(c), size = dsrt_comm_size(c);
    int n = global / size + (r < global % size);
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    REQUIRE(dsrt_net_create(&net, "cifar", 0, 0, 0, 10, &no) == 0);
    dsrt_optimizer *opt = NULL;
    REQUIRE(dsrt_optimizer_create(&opt, net, NULL) == 0);
    size_t per = 32 * 32 * 3;
    float *x = malloc(sizeof(float) * per * (size_t)n);
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)n);
    REQUIRE(x && labels);
    for (size_t k = 0; k < per * (size_t)n; k++)
        x[k] = (float)((k * 37 + (size_t)r) % 101) / 101.0f;
    for (int k = 0; k < n; k++) labels[k] = (k + r) % 10;
    /* Backward alone first: what the communication thread costs it. */
    double *alone = calloc((size_t)steps, sizeof *alone), se[2];
    REQUIRE(alone);
    dsrt_grad_hook h = {0};
    h.first_bytes = h.min_bytes = 1 << 20;
    h.backward = on_backward;
    h.ctx = se;
    CHECK_OK(dsrt_net_set_grad_hook(net, &h));
    for (int s = -2; s < steps; s++) {
        CHECK_OK(dsrt_net_forward_backward(net, x, labels, n, NULL, NULL));
        if (s >= 0) alone[s] = se[1] - se[0];
    }
    CHECK_OK(dsrt_comm_attach(c, net));
    double *bw = calloc((size_t)steps, sizeof *bw), *ar = calloc((size_t)steps, sizeof *ar);
    double *ex = calloc((size_t)steps, sizeof *ex), *hid = calloc((size_t)steps, sizeof *hid);
    REQUIRE(bw && ar && ex && hid && size <= 64);
    dsrt_comm_timeline t = {0};
    for (int s = -3; s < steps; s++) {
        dsrt_net_batch b;
        memset(&b, 0, sizeof b);
        b.data = x;
        b.labels = labels;
        b.n = n;
        b.global_n = global;
        CHECK_OK(dsrt_net_train_start(net, &b));
        CHECK_OK(dsrt_net_train_finish(net, NULL, NULL));
        CHECK_OK(dsrt_comm_grads_wait(c));
        CHECK_OK(dsrt_comm_last_timeline(c, &t));
        /* The whole gradient once more, blocking: the cost without overlap
         * (the values are thrown away with the next step). */
        size_t np;
        float *g = dsrt_net_grads(net, &np);
        double t0 = now_s();
        CHECK_OK(dsrt_comm_sum_f32(c, g, np));
        double whole = now_s() - t0;
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
        /* When the last rank's backward ended. */
        double ends[64] = {0};
        ends[r] = t.backward_end_s;
        CHECK_OK(dsrt_comm_sum_f64(c, ends, (size_t)size));
        double last_end = 0;
        for (int k = 0; k < size; k++) last_end = fmax(last_end, ends[k]);
        if (s < 0) continue;
        bw[s] = t.backward_end_s - t.backward_start_s;
        ar[s] = whole;
        ex[s] = fmax(0, t.wait_end_s - last_end);
        hid[s] = ar[s] > 0 ? fmin(1, fmax(0, 1 - ex[s] / ar[s])) : 1;
    }
    if (r == 0) {
        size_t bytes = 0;
        for (int k = 0; k < t.n; k++) bytes += t.bucket[k].bytes;
        printf("cifar, %d ranks x %d images (global %d), 1 thread a rank, %zu gradient bytes in "
               "%d buckets (first %zu KiB, then %zu KiB)\n",
               size, n, global, bytes, t.n, first_kib, bucket_kib);
        printf("last step's buckets (ms from backward start):\n");
        for (int k = 0; k < t.n; k++)
            printf("  bucket %d: %9zu bytes  ready %7.1f  done %7.1f\n", k, t.bucket[k].bytes,
                   1e3 * (t.bucket[k].ready_s - t.backward_start_s),
                   1e3 * (t.bucket[k].done_s - t.backward_start_s));
        printf("  backward ended at %.1f, grads_wait returned at %.1f\n",
               1e3 * (t.backward_end_s - t.backward_start_s),
               1e3 * (t.wait_end_s - t.backward_start_s));
        printf("per step, median of %d: backward %.1f ms (%.1f ms without a communicator), "
               "all-reduce %.2f ms, exposed %.2f ms, hidden %.1f%%\n",
               steps, 1e3 * median(bw, steps), 1e3 * median(alone, steps), 1e3 * median(ar, steps),
               1e3 * median(ex, steps), 100 * median(hid, steps));
        fflush(stdout);
    }
    free(alone);
    free(bw);
    free(ar);
    free(ex);
    free(hid);
    free(x);
    free(labels);
    dsrt_comm_close(c);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
    return comm_test_finish();
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--worker")) {
        comm_test_launch(argc, argv, 2);
        int global = argc > 2 ? atoi(argv[2]) : 128, steps = argc > 3 ? atoi(argv[3]) : 10;
        size_t first = argc > 4 ? strtoul(argv[4], NULL, 10) : 1024;
        size_t bucket = argc > 5 ? strtoul(argv[5], NULL, 10) : 25600;
        REQUIRE(global >= 2 && steps >= 1 && first >= 1 && bucket >= 1);
        return worker(global, steps, first, bucket);
    }
    const char *extra[5] = {NULL};
    for (int i = 1; i < argc && i <= 4; i++) extra[i - 1] = argv[i];
    return comm_test_launch_args(argc, argv, 2, extra);
}

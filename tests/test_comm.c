/*
 * Tests of the MPI communicator: the collectives, and data-parallel
 * training through the C API against one process on the whole batch.
 *
 * Run by CTest, the program launches itself under
 * `mpirun --allow-run-as-root --oversubscribe -np 2` with one compute thread
 * a rank and --worker; the workers run the cases and the launcher passes on
 * their exit status. Without mpirun (or without MPI in the build) it exits
 * 77. Each worker also trains the one-process reference itself (a plain net
 * without a communicator), so the comparisons need no files. The launcher
 * runs the job twice and compares the parameter checksums rank 0 wrote after
 * every step: the runs must agree bit for bit.
 */
#include "tests/commtest.h"

#include <dsrt/nn.h>

#define GLOBAL  128 /* the global batch */
#define STEPS   20
#define SIDE    8
#define CH      3
#define CLASSES 4
#define IMG     (SIDE * SIDE * CH)

/* A net without dropout or batchnorm. */
static const char PLAIN[] = "input size=8x8x3\n"
                            "conv filters=8 size=3 pad=same\n"
                            "relu\n"
                            "maxpool size=2 stride=2\n"
                            "conv filters=8 size=3 pad=same\n"
                            "relu\n"
                            "fc outputs=classes\n"
                            "softmax\n";

/* Batchnorm after convolutions (fused ReLU) and after a fully connected
 * layer. */
static const char BN[] = "input size=8x8x3\n"
                         "conv filters=8 size=3 pad=same\n"
                         "batchnorm\n"
                         "relu\n"
                         "conv filters=8 size=3 pad=same\n"
                         "batchnorm\n"
                         "relu\n"
                         "fc outputs=16\n"
                         "batchnorm\n"
                         "relu\n"
                         "fc outputs=classes\n"
                         "softmax\n";

static const char *checksum_file; /* --checksums FILE: rank 0 writes them there */

// ----------------------------------------------------------------------------
// Helpers

/* Global batch `step`: images with a class-dependent pattern and noise, so
 * that training moves the weights. */
static void make_batch(int step, float *x, int32_t *labels) {
    uint64_t s = 0x9e3779b97f4a7c15ULL * (uint64_t)(step + 1);
    for (int b = 0; b < GLOBAL; b++) {
        int y = (b * 7 + step) % CLASSES;
        labels[b] = y;
        for (int k = 0; k < IMG; k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            float noise = (float)((s >> 40) & 0xffff) / 65536.0f - 0.5f;
            x[(size_t)b * IMG + k] = (k % (y + 2) == 0 ? 1.0f : 0.0f) + noise;
        }
    }
}

static uint64_t checksum(const float *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n * sizeof *p; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static dsrt_net *make_net(const char *spec) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    o.seed = 5;
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, spec, 0, 0, 0, CLASSES, &o);
    if (rc) fprintf(stderr, "dsrt_net_create: %s\n", dsrt_last_error());
    REQUIRE(net);
    return net;
}

static dsrt_optimizer *make_opt(dsrt_net *net, double momentum) {
    dsrt_optimizer_options oo = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    oo.learn_rate = 0.05;
    oo.momentum = momentum;
    dsrt_optimizer *opt = NULL;
    REQUIRE(dsrt_optimizer_create(&opt, net, &oo) == 0);
    return opt;
}

/* max |a - b| / max |b|: the relative distance of two buffers. */
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

/* One process on the whole batch. */
static void train_reference(const char *spec, double momentum, double *losses, dsrt_net **out) {
    dsrt_net *net = make_net(spec);
    dsrt_optimizer *opt = make_opt(net, momentum);
    float *x = malloc(sizeof(float) * GLOBAL * IMG);
    int32_t labels[GLOBAL];
    REQUIRE(x);
    for (int step = 0; step < STEPS; step++) {
        make_batch(step, x, labels);
        float loss;
        CHECK_OK(dsrt_net_forward_backward(net, x, labels, GLOBAL, &loss, NULL));
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
        losses[step] = loss;
    }
    free(x);
    dsrt_optimizer_destroy(opt);
    *out = net;
}

typedef enum {
    MODE_ALLREDUCE,     /* gradients summed every step */
    MODE_AVERAGE,       /* parameters averaged after every step */
    MODE_AVERAGE_STATE, /* parameters and optimizer state averaged */
} dist_mode;

/*
 * The same run over the ranks: rank r takes images [first[r], first[r] +
 * count[r]) of each global batch. losses receives the global mean loss.
 * Checks after every step that every rank holds the same parameters, and
 * writes their checksums to `sums` (STEPS values).
 */
static void train_distributed(dsrt_comm *c, const char *spec, double momentum, dist_mode mode,
                              int sync_bn, const int *first, const int *count, double *losses,
                              uint64_t *sums, dsrt_net **out) {
    int r = dsrt_comm_rank(c);
    dsrt_net *net = make_net(spec);
    dsrt_optimizer *opt = make_opt(net, momentum);
    if (mode == MODE_ALLREDUCE) CHECK_OK(dsrt_comm_attach(c, net));
    if (sync_bn) CHECK_OK(dsrt_comm_sync_batchnorm(c, net, 1));
    float *x = malloc(sizeof(float) * GLOBAL * IMG);
    int32_t labels[GLOBAL];
    REQUIRE(x);
    for (int step = 0; step < STEPS; step++) {
        make_batch(step, x, labels);
        dsrt_net_batch b;
        memset(&b, 0, sizeof b);
        b.data = x + (size_t)first[r] * IMG;
        b.labels = labels + first[r];
        b.n = count[r];
        b.global_n = mode == MODE_ALLREDUCE ? GLOBAL : count[r];
        float loss;
        CHECK_OK(dsrt_net_train_start(net, &b));
        CHECK_OK(dsrt_net_train_finish(net, &loss, NULL));
        if (mode == MODE_ALLREDUCE) CHECK_OK(dsrt_comm_grads_wait(c));
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
        if (mode == MODE_AVERAGE) CHECK_OK(dsrt_comm_average(c, net, NULL));
        if (mode == MODE_AVERAGE_STATE) CHECK_OK(dsrt_comm_average(c, net, opt));
        double l = (double)loss * count[r];
        CHECK_OK(dsrt_comm_sum_f64(c, &l, 1));
        losses[step] = l / GLOBAL;
        size_t np;
        const float *p = dsrt_net_params(net, &np);
        uint64_t mine = checksum(p, np), theirs = mine;
        CHECK_OK(dsrt_comm_bcast(c, &theirs, sizeof theirs, 0));
        if (mine != theirs) {
            fprintf(stderr, "step %d: rank %d's parameters differ from rank 0's\n", step, r);
            test_failures++;
        }
        if (sums) sums[step] = mine;
    }
    if (mode == MODE_ALLREDUCE) CHECK_OK(dsrt_comm_attach(c, NULL));
    free(x);
    dsrt_optimizer_destroy(opt);
    *out = net;
}

static void compare_runs(const char *what, const double *la, const double *lb, dsrt_net *a,
                         dsrt_net *b, double tol) {
    double worst = 0;
    for (int s = 0; s < STEPS; s++) worst = fmax(worst, fabs(la[s] - lb[s]) / fabs(lb[s]));
    size_t np, ns;
    const float *pa = dsrt_net_params(a, &np), *pb = dsrt_net_params(b, NULL);
    double dp = rel_diff(pa, pb, np);
    const float *sa = dsrt_net_state(a, &ns), *sb = dsrt_net_state(b, NULL);
    double ds = ns ? rel_diff(sa, sb, ns) : 0;
    /* The weights moved: the comparison is not between two starting points. */
    dsrt_net *fresh = make_net(dsrt_net_description(a));
    double moved = rel_diff(pa, dsrt_net_params(fresh, NULL), np);
    dsrt_net_destroy(fresh);
    fprintf(stderr,
            "  %s: losses %.3f -> %.3f; relative differences: losses %.2g, weights %.2g, "
            "state %.2g (weights moved %.2g)\n",
            what, lb[0], lb[STEPS - 1], worst, dp, ds, moved);
    CHECK(worst <= tol);
    CHECK(dp <= tol);
    CHECK(ds <= tol);
    CHECK(moved > 100 * tol);
}

// ----------------------------------------------------------------------------
// Collectives

static void test_basics(void) {
    dsrt_comm *c = NULL;
    CHECK_OK(dsrt_comm_open(&c, NULL));
    REQUIRE(c);
    int r = dsrt_comm_rank(c), n = dsrt_comm_size(c);
    CHECK_EQ(n, 2);
    CHECK(r >= 0 && r < n);
    CHECK_EQ(dsrt_comm_local_rank(c), r); /* one node */
    CHECK_EQ(dsrt_comm_world_size(), 2);

    double d[3] = {1.0 + r, 0.25 * r, -1};
    CHECK_OK(dsrt_comm_sum_f64(c, d, 3));
    CHECK_NEAR(d[0], 3.0, 0);
    CHECK_NEAR(d[1], 0.25, 0);
    CHECK_NEAR(d[2], -2.0, 0);
    float f[2] = {0.5f * (float)(r + 1), 7};
    CHECK_OK(dsrt_comm_sum_f32(c, f, 2));
    CHECK_NEAR(f[0], 1.5, 0);
    CHECK_NEAR(f[1], 14.0, 0);
    CHECK_OK(dsrt_comm_sum_f64(c, d, 0));

    char msg[32];
    snprintf(msg, sizeof msg, "from rank %d", r);
    CHECK_OK(dsrt_comm_bcast(c, msg, sizeof msg, 1));
    CHECK_STR_EQ(msg, "from rank 1");
    CHECK_EQ(dsrt_comm_bcast(c, msg, sizeof msg, 2), -EINVAL);

    dsrt_comm_timeline t;
    CHECK_EQ(dsrt_comm_last_timeline(c, &t), -ENOENT);
    CHECK_EQ(dsrt_comm_grads_wait(c), -EINVAL);
    dsrt_comm_close(c);

    dsrt_comm_options o = dsrt_comm_defaults();
    o.timeout_s = 0;
    CHECK_EQ(dsrt_comm_open(&c, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "timeout_s");
    dsrt_comm_close(NULL);
}

// ----------------------------------------------------------------------------
// Training

/* Attach broadcasts rank 0's weights: nets made with different seeds agree
 * afterwards. The buckets follow the sizes asked for. */
static void test_attach(void) {
    dsrt_comm_options o = dsrt_comm_defaults();
    o.first_bucket_bytes = 200;
    o.bucket_bytes = 1000;
    dsrt_comm *c = NULL;
    CHECK_OK(dsrt_comm_open(&c, &o));
    REQUIRE(c);
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    no.seed = 100 + (uint64_t)dsrt_comm_rank(c);
    dsrt_net *net = NULL;
    REQUIRE(dsrt_net_create(&net, BN, 0, 0, 0, CLASSES, &no) == 0);
    CHECK_OK(dsrt_comm_attach(c, net));
    size_t np;
    const float *p = dsrt_net_params(net, &np);
    uint64_t mine = checksum(p, np), theirs = mine;
    CHECK_OK(dsrt_comm_bcast(c, &theirs, sizeof theirs, 0));
    CHECK(mine == theirs);

    dsrt_range r[64];
    int nb = dsrt_net_buckets_sized(net, 200, 1000, r, 64);
    CHECK_EQ(nb, dsrt_net_buckets_sized(net, 200, 1000, NULL, 0));
    CHECK(nb >= 3);
    CHECK_EQ(r[0].offset + r[0].count, np);
    CHECK(r[0].count * sizeof(float) >= 200);
    for (int k = 1; k < nb; k++) CHECK_EQ(r[k].offset + r[k].count, r[k - 1].offset);
    for (int k = 1; k < nb - 1; k++) CHECK(r[k].count * sizeof(float) >= 1000);
    CHECK_EQ(r[nb - 1].offset, 0);
    /* The same as the one-size call where the sizes agree. */
    dsrt_range q[64], q2[64];
    CHECK_EQ(dsrt_net_buckets(net, 4000, q, 64), dsrt_net_buckets_sized(net, 4000, 4000, q2, 64));
    CHECK(!memcmp(q, q2, sizeof(dsrt_range) * (size_t)dsrt_net_buckets(net, 4000, NULL, 0)));

    /* A CPU net on a communicator's gradients after a step: the timeline. */
    float x[4 * IMG];
    int32_t labels[4] = {0, 1, 2, 3};
    for (int k = 0; k < 4 * IMG; k++) x[k] = (float)(k % 13) / 13.0f;
    CHECK_OK(dsrt_net_forward_backward(net, x, labels, 4, NULL, NULL));
    CHECK_OK(dsrt_comm_grads_wait(c));
    dsrt_comm_timeline t;
    CHECK_OK(dsrt_comm_last_timeline(c, &t));
    CHECK_EQ(t.n, nb);
    CHECK(t.backward_start_s <= t.backward_end_s && t.backward_end_s <= t.wait_end_s);
    for (int k = 0; k < t.n; k++) {
        CHECK_EQ(t.bucket[k].bytes, r[k].count * sizeof(float));
        CHECK(t.bucket[k].ready_s >= t.backward_start_s);
        CHECK(t.bucket[k].done_s >= t.bucket[k].ready_s && t.bucket[k].done_s <= t.wait_end_s);
    }
    CHECK_OK(dsrt_comm_attach(c, NULL));
    dsrt_net_destroy(net);
    dsrt_comm_close(c);
}

/* 2 ranks x 64 equal 1 rank x 128: even and uneven splits. */
static void test_allreduce_matches_one_process(void) {
    dsrt_comm *c = NULL;
    CHECK_OK(dsrt_comm_open(&c, NULL));
    REQUIRE(c);
    double ref_l[STEPS], l[STEPS];
    dsrt_net *ref, *net;
    train_reference(PLAIN, 0.9, ref_l, &ref);
    static const int even_first[2] = {0, 64}, even_count[2] = {64, 64};
    static const int odd_first[2] = {0, 40}, odd_count[2] = {40, 88};
    uint64_t sums[STEPS];
    train_distributed(c, PLAIN, 0.9, MODE_ALLREDUCE, 0, even_first, even_count, l, sums, &net);
    compare_runs("2 x 64", l, ref_l, net, ref, 1e-5);
    if (checksum_file && dsrt_comm_rank(c) == 0) {
        FILE *f = fopen(checksum_file, "w");
        REQUIRE(f);
        for (int s = 0; s < STEPS; s++) fprintf(f, "%016llx\n", (unsigned long long)sums[s]);
        fclose(f);
    }
    dsrt_net_destroy(net);
    train_distributed(c, PLAIN, 0.9, MODE_ALLREDUCE, 0, odd_first, odd_count, l, NULL, &net);
    compare_runs("40 + 88", l, ref_l, net, ref, 1e-5);
    dsrt_net_destroy(net);
    dsrt_net_destroy(ref);
    dsrt_comm_close(c);
}

/* Batchnorm in sync mode: 2 x 64 equal 1 x 128 with ordinary batchnorm. */
static void test_sync_batchnorm(void) {
    dsrt_comm *c = NULL;
    CHECK_OK(dsrt_comm_open(&c, NULL));
    REQUIRE(c);
    double ref_l[STEPS], l[STEPS];
    dsrt_net *ref, *net;
    train_reference(BN, 0.9, ref_l, &ref);
    static const int first[2] = {0, 64}, count[2] = {64, 64};
    train_distributed(c, BN, 0.9, MODE_ALLREDUCE, 1, first, count, l, NULL, &net);
    compare_runs("sync batchnorm 2 x 64", l, ref_l, net, ref, 1e-5);
    dsrt_net_destroy(net);
    /* Without sync the statistics are per worker: the runs part. */
    train_distributed(c, BN, 0.9, MODE_ALLREDUCE, 0, first, count, l, NULL, &net);
    size_t ns;
    const float *st = dsrt_net_state(net, &ns);
    double ds = rel_diff(st, dsrt_net_state(ref, NULL), ns);
    fprintf(stderr, "  per-worker batchnorm: state differs by %.2g\n", ds);
    CHECK(ds > 1e-4);
    /* Averaging the running statistics: their mean, the same on every rank
     * (the input layer's statistics, equal everywhere, stay what they are). */
    double *mean = malloc(sizeof(double) * ns);
    REQUIRE(mean);
    for (size_t i = 0; i < ns; i++) mean[i] = st[i];
    CHECK_OK(dsrt_comm_sum_f64(c, mean, ns));
    CHECK_OK(dsrt_comm_average_state(c, net));
    st = dsrt_net_state(net, NULL);
    uint64_t mine = checksum(st, ns), theirs = mine;
    CHECK_OK(dsrt_comm_bcast(c, &theirs, sizeof theirs, 0));
    CHECK(mine == theirs);
    double worst = 0;
    for (size_t i = 0; i < ns; i++) worst = fmax(worst, fabs(st[i] - 0.5 * mean[i]));
    CHECK(worst <= 1e-6);
    free(mean);
    dsrt_net_destroy(net);
    dsrt_net_destroy(ref);
    dsrt_comm_close(c);
}

/* Parameter averaging every step with plain SGD is all-reduce training;
 * with momentum it is too when the velocities are averaged as well. */
static void test_averaging_matches_allreduce(void) {
    dsrt_comm *c = NULL;
    CHECK_OK(dsrt_comm_open(&c, NULL));
    REQUIRE(c);
    double la[STEPS], lb[STEPS];
    dsrt_net *a, *b;
    static const int first[2] = {0, 64}, count[2] = {64, 64};
    train_distributed(c, PLAIN, 0, MODE_ALLREDUCE, 0, first, count, la, NULL, &a);
    train_distributed(c, PLAIN, 0, MODE_AVERAGE, 0, first, count, lb, NULL, &b);
    compare_runs("averaging N = 1", lb, la, b, a, 1e-5);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    train_distributed(c, PLAIN, 0.9, MODE_ALLREDUCE, 0, first, count, la, NULL, &a);
    train_distributed(c, PLAIN, 0.9, MODE_AVERAGE_STATE, 0, first, count, lb, NULL, &b);
    compare_runs("averaging N = 1 with momentum", lb, la, b, a, 1e-5);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    dsrt_comm_close(c);
}

/* The first bucket's sum completes before backward ends (cifar net): the
 * communication overlaps the computation. */
static void test_overlap(void) {
    dsrt_comm *c = NULL;
    CHECK_OK(dsrt_comm_open(&c, NULL));
    REQUIRE(c);
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    REQUIRE(dsrt_net_create(&net, "cifar", 0, 0, 0, 10, &no) == 0);
    CHECK_OK(dsrt_comm_attach(c, net));
    enum { N = 16 };
    float *x = malloc(sizeof(float) * N * 32 * 32 * 3);
    int32_t labels[N];
    REQUIRE(x);
    for (int k = 0; k < N * 32 * 32 * 3; k++) x[k] = (float)((k * 37) % 101) / 101.0f;
    for (int k = 0; k < N; k++) labels[k] = k % 10;
    dsrt_comm_timeline t;
    for (int step = 0; step < 3; step++) {
        CHECK_OK(dsrt_net_forward_backward(net, x, labels, N, NULL, NULL));
        CHECK_OK(dsrt_comm_grads_wait(c));
    }
    CHECK_OK(dsrt_comm_last_timeline(c, &t));
    CHECK(t.n >= 2);
    fprintf(stderr,
            "  cifar: backward %.1f ms; bucket 0 (%zu bytes) ready at %.1f ms, done at "
            "%.1f ms; %d buckets\n",
            1e3 * (t.backward_end_s - t.backward_start_s), t.bucket[0].bytes,
            1e3 * (t.bucket[0].ready_s - t.backward_start_s),
            1e3 * (t.bucket[0].done_s - t.backward_start_s), t.n);
    /* A sum completes only once every rank has made its bucket ready, so
     * with ranks out of step it is the last rank's backward that it must
     * beat (the ranks share one clock on one machine). */
    double ends[2] = {0, 0};
    ends[dsrt_comm_rank(c)] = t.backward_end_s;
    CHECK_OK(dsrt_comm_sum_f64(c, ends, 2));
    CHECK(t.bucket[0].done_s < fmax(ends[0], ends[1]));
    free(x);
    dsrt_comm_close(c); /* before the net it is attached to */
    dsrt_net_destroy(net);
}

// ----------------------------------------------------------------------------

static int read_file(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = 0;
    fclose(f);
    return (int)n;
}

/* The launcher: the job twice, and the two runs' checksums compared. */
static int launch(int argc, char **argv) {
    const char *tmp = getenv("DSRT_TEST_TMP");
    char dir[4096], a[4200], b[4200];
    snprintf(dir, sizeof dir, "%s", tmp && *tmp ? tmp : "/tmp");
    mkdir(dir, 0777);
    snprintf(a, sizeof a, "%s/test_comm.%d.a", dir, (int)getpid());
    snprintf(b, sizeof b, "%s/test_comm.%d.b", dir, (int)getpid());
    const char *ea[] = {"--checksums", a, NULL}, *eb[] = {"--checksums", b, NULL};
    int rc = comm_test_launch_args(argc, argv, 2, ea);
    if (rc != 0) return rc;
    /* The second run only trains (the other cases ran once). */
    const char *eb2[] = {eb[0], eb[1], "--only-training", NULL};
    rc = comm_test_launch_args(argc, argv, 2, eb2);
    if (rc != 0) return rc;
    static char ta[4096], tb[4096];
    int na = read_file(a, ta, sizeof ta), nb = read_file(b, tb, sizeof tb);
    unlink(a);
    unlink(b);
    if (na <= 0 || na != nb || memcmp(ta, tb, (size_t)na)) {
        fprintf(stderr, "two runs gave different parameters:\n%s---\n%s", ta, tb);
        return 1;
    }
    fprintf(stderr, "%-40s ok\n", "two runs: bit-identical parameters");
    return 0;
}

int main(int argc, char **argv) {
    int only_training = 0;
    if (argc < 2 || strcmp(argv[1], "--worker")) return launch(argc, argv);
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--checksums") && i + 1 < argc) checksum_file = argv[++i];
        if (!strcmp(argv[i], "--only-training")) only_training = 1;
    }
    comm_test_launch(argc, argv, 2);
    if (only_training) {
        RUN(test_allreduce_matches_one_process);
        return comm_test_finish();
    }
    RUN(test_basics);
    RUN(test_attach);
    RUN(test_allreduce_matches_one_process);
    RUN(test_sync_batchnorm);
    RUN(test_averaging_matches_allreduce);
    RUN(test_overlap);
    return comm_test_finish();
}

/*
 * Tests of the NCCL communicator, on a machine with a GPU: a one-rank NCCL
 * run equals the same run on one GPU without a communicator, both through
 * MPI (mpirun -np 1, the unique id broadcast over MPI) and in the one-process
 * mode (dsrt_comm_open_local). NCCL refuses two ranks on one GPU, so more
 * ranks are not testable on a one-GPU machine. Exits 77 without NCCL in the
 * build or without a GPU; built in every build so that the NCCL code is
 * compiled and linked everywhere.
 */
#include "tests/commtest.h"

#include <dsrt/nn.h>

#include "runtime/comm/comm_internal.h"
#ifdef DSRT_FAKE_GPU
#include "tests/fakegpu.h"
#endif

#define STEPS 5
#define N     16

static dsrt_net *make_net(void) {
    dsrt_net_options o = dsrt_net_defaults();
    o.device = 0;
    o.seed = 3;
    o.precision = DSRT_PRECISION_FP32;
    o.deterministic = 1;
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, "digits", 0, 0, 0, 10, &o);
    if (rc) fprintf(stderr, "dsrt_net_create: %s\n", dsrt_last_error());
    REQUIRE(net);
    return net;
}

/* STEPS steps of SGD on fixed batches, with c's gradients when c. */
static void train(dsrt_net *net, dsrt_comm *c) {
    dsrt_optimizer *opt = NULL;
    REQUIRE(dsrt_optimizer_create(&opt, net, NULL) == 0);
    static float x[N * 28 * 28];
    int32_t labels[N];
    for (int k = 0; k < N * 28 * 28; k++) x[k] = (float)((k * 29) % 97) / 97.0f;
    for (int k = 0; k < N; k++) labels[k] = k % 10;
    if (c) CHECK_OK(dsrt_comm_attach(c, net));
    for (int s = 0; s < STEPS; s++) {
        dsrt_net_batch b;
        memset(&b, 0, sizeof b);
        b.data = x;
        b.labels = labels;
        b.n = N;
        CHECK_OK(dsrt_net_train_start(net, &b));
        if (c) CHECK_OK(dsrt_comm_grads_wait(c));
        CHECK_OK(dsrt_net_train_finish(net, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    }
    if (c) {
        dsrt_comm_timeline t;
        CHECK_OK(dsrt_comm_last_timeline(c, &t));
        CHECK(t.n >= 1);
        CHECK_OK(dsrt_comm_attach(c, NULL));
    }
    dsrt_optimizer_destroy(opt);
}

static void compare_with_plain(dsrt_comm *c, const char *what) {
    dsrt_net *a = make_net(), *b = make_net();
    train(a, NULL);
    train(b, c);
    size_t np;
    const float *pa = dsrt_net_params(a, &np), *pb = dsrt_net_params(b, NULL);
    double worst = 0;
    for (size_t i = 0; i < np; i++) worst = fmax(worst, fabs((double)pa[i] - pb[i]));
    fprintf(stderr, "  %s: largest weight difference %.3g\n", what, worst);
    CHECK(worst <= 1e-6);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

static void test_local(void) {
    dsrt_comm *c = NULL;
    int dev = 0;
    CHECK_OK(dsrt_comm_open_local(&c, 1, &dev, NULL));
    REQUIRE(c);
    CHECK_EQ(dsrt_comm_size(c), 1);
    double v[2] = {1, 2};
    CHECK_OK(dsrt_comm_sum_f64(c, v, 2));
    CHECK_NEAR(v[1], 2, 0);
    compare_with_plain(c, "open_local, one GPU");
    dsrt_comm_close(c);
}

/* Two communicators on the one GPU, closed from one thread as one group
 * (ncclCommFinalize of both in one ncclGroupStart/End, then ncclCommDestroy
 * of both), and two more aborted as one group when a member broke: what a
 * machine with several GPUs does at every close, here on one. */
static void test_grouped_close(void) {
    int devs[2] = {0, 0};
    for (int broken = 0; broken < 2; broken++) {
#ifdef DSRT_FAKE_GPU
        fakegpu_reset_stats();
#endif
        dsrt_comm *c[2] = {NULL, NULL};
        CHECK_OK(dsrt__comm_open_local_split(c, 2, devs, NULL));
        REQUIRE(c[0] && c[1]);
        CHECK_EQ(dsrt_comm_size(c[0]), 2);
        if (broken) atomic_store(&c[0]->broken, 1);
        dsrt_comm_close(c[0]);
        dsrt_comm_close(c[1]);
#ifdef DSRT_FAKE_GPU
        fakegpu_stats st = fakegpu_get_stats();
        CHECK_EQ(st.ungrouped_closes, 0);
        if (broken) {
            CHECK_EQ(st.aborts, 2);
            CHECK_EQ(st.finalizes, 0);
            CHECK_EQ(st.close_groups, 1);
        } else {
            CHECK_EQ(st.finalizes, 2);
            CHECK_EQ(st.destroys, 2);
            CHECK_EQ(st.aborts, 0);
            CHECK_EQ(st.close_groups, 2); /* the finalizes' group, the destroys' */
        }
#endif
    }
}

static void test_mpi(void) {
    dsrt_comm_options o = dsrt_comm_defaults();
    o.kind = DSRT_COMM_NCCL;
    o.device = 0;
    dsrt_comm *c = NULL;
    CHECK_OK(dsrt_comm_open(&c, &o));
    REQUIRE(c);
    compare_with_plain(c, "NCCL over MPI, one rank");
    /* A CPU net cannot use an NCCL communicator. */
    dsrt_net *cpu = NULL;
    REQUIRE(dsrt_net_create(&cpu, "digits", 0, 0, 0, 10, NULL) == 0);
    CHECK_EQ(dsrt_comm_attach(c, cpu), DSRT_EOPTION);
    dsrt_net_destroy(cpu);
    dsrt_comm_close(c);
}

int main(int argc, char **argv) {
    if (dsrt_comm_available(DSRT_COMM_NCCL) != 0) {
        fprintf(stderr, "skipped: %s\n", dsrt_last_error());
        return TEST_SKIP;
    }
    if (dsrt_gpu_count() < 1) {
        fprintf(stderr, "skipped: no GPU\n");
        return TEST_SKIP;
    }
    if (argc >= 2 && !strcmp(argv[1], "--worker")) {
        comm_test_launch(argc, argv, 1);
        RUN(test_mpi);
        return comm_test_finish();
    }
    RUN(test_local);
    RUN(test_grouped_close);
    int rc = comm_test_launch(argc, argv, 1);
    return rc == TEST_SKIP ? TEST_RESULT() : (rc ? rc : TEST_RESULT());
}

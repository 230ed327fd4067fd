/*
 * Data-parallel training on GPUs through NCCL: multi-gpu training (one
 * worker a GPU, each on a thread, the communicators of one process) against
 * the same run on one GPU; a net without parameters; the gradient sums
 * queued without the host waiting for them; and, where several GPUs are
 * visible, the members of an in-process group closed from one thread and
 * its host collectives on buffers freed as each call returns. On a
 * machine with CUDA devices and NCCL (exit 77 without), and on two
 * stand-in GPUs in the fake build (test_fakegpu_dp), where the stand-in
 * (tests/fakegpu.h) also tells what a device would punish and these tests
 * assert it never happened: device memory allocated or freed after the
 * first collective while a communicator lives, NCCL finalize, destroy or
 * abort of one process's members outside one group, a host wait on work that
 * can never finish, an invalid event; and it makes a collective hang, so
 * that the deadline is seen to hold without the host ever blocking.
 */
#include "gpu.h"
#include "nn/internal.h"
#include "task.h"
#include "testimg.h"

#include <dsrt/comm.h>
#include <dsrt/train.h>

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef DSRT_FAKE_GPU
#include "fakegpu.h"
#endif

#define SIDE 12

static const char *const CLASSES[] = {"centre", "checker", "hstripes", "vstripes"};
static char root[4096], train_dir[4200], val_dir[4200];

// ----------------------------------------------------------------------------
// Data and nets

static void make_image(uint8_t *px, int cls, uint32_t seed) {
    for (int y = 0; y < SIDE; y++)
        for (int x = 0; x < SIDE; x++) {
            int dx = x - SIDE / 2, dy = y - SIDE / 2;
            int v = cls == 0   ? (dx * dx + dy * dy < 12 ? 220 : 40)
                    : cls == 1 ? ((x / 2 + y / 2) % 2 ? 200 : 50)
                    : cls == 2 ? (y / 2 % 2 ? 210 : 40)
                               : (x / 2 % 2 ? 210 : 40);
            v += (int)(timg_hash(seed * 977u + (uint32_t)(y * SIDE + x)) % 41) - 20;
            px[y * SIDE + x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
}

/* per images of each class; bad: one file that is not an image. */
static void make_folder(const char *dir, int per, uint32_t seed, int bad) {
    uint8_t px[SIDE * SIDE];
    for (int k = 0; k < 4; k++) {
        char sub[4400];
        snprintf(sub, sizeof sub, "%s/%s", dir, CLASSES[k]);
        REQUIRE(timg_mkdirs(sub) == 0);
        for (int i = 0; i < per; i++) {
            make_image(px, k, seed + (uint32_t)(k * 1000 + i));
            char path[4500];
            snprintf(path, sizeof path, "%s/%03d.png", sub, i);
            dsrt_image img = {px, SIDE, SIDE, 1, SIDE};
            REQUIRE(dsrt_png_write(path, &img) == 0);
        }
        if (bad && k == 1) {
            char path[4500];
            snprintf(path, sizeof path, "%s/broken.png", sub);
            REQUIRE(timg_write_file(path, "not an image at all", 19) == 0);
        }
    }
}

static dsrt_datastore *open_ds(const char *dir) {
    dsrt_datastore *ds = NULL;
    CHECK_OK(dsrt_datastore_open(&ds, dir, NULL));
    REQUIRE(ds);
    return ds;
}

static dsrt_net *make_net(const char *desc, int h, int w, int c, int classes) {
    dsrt_net_options o = dsrt_net_defaults();
    o.device = 0;
    o.seed = 11;
    o.precision = DSRT_PRECISION_FP32;
    o.threads = 2;
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, desc, h, w, c, classes, &o);
    if (rc) fprintf(stderr, "dsrt_net_create: %s\n", dsrt_last_error());
    REQUIRE(net);
    return net;
}

#define PLAIN_NET                                                                                  \
    "input size=12x12x1\nconv filters=4 size=3 pad=1\nrelu\nmaxpool size=2 stride=2\n"             \
    "fc outputs=4\nsoftmax\n"
#define BN_NET                                                                                     \
    "input size=12x12x1\nconv filters=4 size=3 pad=1 bias=0\nbatchnorm\nrelu\n"                    \
    "maxpool size=2 stride=2\nfc outputs=4\nsoftmax\n"

static int gpus_for_test(void) {
    int n = dsrt_gpu_count();
    return n >= 2 ? 2 : n;
}

// ----------------------------------------------------------------------------
// Multi-gpu training

/* 52 training images in global batches of 16 (a last batch of 4: parts of
 * 8 and 2 on two GPUs), 21 validation files with one bad (a part one short
 * of any reserved size), two epochs. */
static dsrt_train_options options(const dsrt_datastore *val) {
    dsrt_train_options o = dsrt_train_defaults();
    o.max_epochs = 2;
    o.batch = 16;
    o.validation = val;
    o.validation_batch = 8;
    o.optimizer.learn_rate = 0.05;
    o.seed = 3;
    o.workers = 1;
    o.compute_threads = 1;
    o.pin = 0;
    o.comm_options = dsrt_comm_defaults();
    o.comm_options.bucket_bytes = 256; /* a bucket a layer */
    o.comm_options.first_bucket_bytes = 64;
    return o;
}

#ifdef DSRT_FAKE_GPU
/* What the stand-in saw of a run with n GPUs. */
static void check_fake(const fakegpu_stats *s, int n) {
    fprintf(stderr,
            "  stand-in: %ld collectives, %ld allocations after one, %ld finalize / %ld destroy / "
            "%ld abort (%ld outside a group, %ld split), %ld segment tables raced, %ld host "
            "waits, %ld deadlocks, %ld bad handles\n",
            s->collectives, s->allocs_after_collective, s->finalizes, s->destroys, s->aborts,
            s->ungrouped_closes, s->split_closes, s->seg_table_races, s->host_waits, s->deadlocks,
            s->bad_handles);
    CHECK(s->collectives > 0);
    CHECK_EQ(s->allocs_after_collective, 0);
    CHECK_EQ(s->finalizes, n);
    CHECK_EQ(s->destroys, n);
    CHECK_EQ(s->aborts, 0);
    CHECK_EQ(s->ungrouped_closes, 0);
    CHECK_EQ(s->split_closes, 0);
    CHECK_EQ(s->seg_table_races, 0);
    CHECK_EQ(s->deadlocks, 0);
    CHECK_EQ(s->bad_handles, 0);
}
#endif

static void test_multi_gpu(void) {
    int n = gpus_for_test();
    dsrt_datastore *train = open_ds(train_dir), *val = open_ds(val_dir);
    dsrt_train_options o = options(val);
    /* One GPU alone. */
    dsrt_net *one = make_net(PLAIN_NET, 0, 0, 0, 4);
    dsrt_train_result r1;
    o.execution = DSRT_EXEC_GPU;
    o.gpu = 0;
    CHECK_OK(dsrt_train(one, train, &o, &r1));
    /* Every GPU, the global batch split between them. */
    dsrt_net *many = make_net(PLAIN_NET, 0, 0, 0, 4);
    dsrt_train_result rn;
    o.execution = DSRT_EXEC_MULTI_GPU;
    o.gpus = n;
#ifdef DSRT_FAKE_GPU
    fakegpu_reset_stats();
#endif
    int rc = dsrt_train(many, train, &o, &rn);
    if (rc) fprintf(stderr, "  multi-gpu: %s\n", dsrt_last_error());
    CHECK_OK(rc);
#ifdef DSRT_FAKE_GPU
    fakegpu_stats s = fakegpu_get_stats();
    check_fake(&s, n);
#endif
    CHECK_EQ(rn.iterations, r1.iterations);
    CHECK_EQ(rn.iterations, 8); /* 4 batches an epoch */
    size_t np;
    const float *a = dsrt_net_params(one, &np), *b = dsrt_net_params(many, NULL);
    REQUIRE(a && b);
    double dd = 0, aa = 0;
    for (size_t i = 0; i < np; i++) dd += (a[i] - b[i]) * (a[i] - b[i]), aa += a[i] * a[i];
    fprintf(stderr, "  %d GPUs against one: weights differ by %.3g relative; val accuracy %.3f\n",
            n, sqrt(dd / aa), rn.val_accuracy);
    CHECK(sqrt(dd / aa) <= 1e-5);
    CHECK(isfinite(rn.val_loss));
    dsrt_net_destroy(one);
    dsrt_net_destroy(many);
    dsrt_datastore_close(train);
    dsrt_datastore_close(val);
}

/* Synchronised batchnorm: its sums are NCCL collectives too (in forward
 * and backward, on the compute stream). */
static void test_multi_gpu_bn_sync(void) {
    int n = gpus_for_test();
    dsrt_datastore *train = open_ds(train_dir), *val = open_ds(val_dir);
    dsrt_train_options o = options(val);
    o.execution = DSRT_EXEC_MULTI_GPU;
    o.gpus = n;
    o.bn_statistics = DSRT_BN_SYNC;
    dsrt_net *net = make_net(BN_NET, 0, 0, 0, 4);
    dsrt_train_result r;
#ifdef DSRT_FAKE_GPU
    fakegpu_reset_stats();
#endif
    int rc = dsrt_train(net, train, &o, &r);
    if (rc) fprintf(stderr, "  multi-gpu, sync batchnorm: %s\n", dsrt_last_error());
    CHECK_OK(rc);
#ifdef DSRT_FAKE_GPU
    fakegpu_stats s = fakegpu_get_stats();
    check_fake(&s, n);
#endif
    CHECK(isfinite(r.loss) && isfinite(r.val_loss));
    dsrt_net_destroy(net);
    dsrt_datastore_close(train);
    dsrt_datastore_close(val);
}

// ----------------------------------------------------------------------------
// The communicator of one GPU

static float X[8 * SIDE * SIDE];
static int32_t Y[8];

/* The 8 images of X with their labels. */
static dsrt_net_batch batch8(void) {
    dsrt_net_batch b;
    memset(&b, 0, sizeof b);
    b.data = X;
    b.labels = Y;
    b.n = 8;
    return b;
}

static void step(dsrt_net *net, dsrt_comm *c, dsrt_optimizer *opt) {
    dsrt_net_batch b = batch8();
    CHECK_OK(dsrt_net_train_start(net, &b));
    CHECK_OK(dsrt_comm_grads_wait(c));
    CHECK_OK(dsrt_net_train_finish(net, NULL, NULL));
    if (opt) CHECK_OK(dsrt_optimizer_step(opt, net, 0));
}

/* A net without parameters has no gradient bucket: attaching it and
 * waiting for its (no) sums is fine. */
static void test_no_parameters(void) {
    dsrt_comm *c = NULL;
    int dev = 0;
    CHECK_OK(dsrt_comm_open_local(&c, 1, &dev, NULL));
    REQUIRE(c);
    dsrt_net *net = make_net("input size=1x1x8\nsoftmax\n", 0, 0, 0, 8);
    size_t np;
    dsrt_net_params(net, &np);
    CHECK_EQ(np, 0);
    CHECK_OK(dsrt_comm_attach(c, net));
#ifdef DSRT_FAKE_GPU
    fakegpu_reset_stats();
#endif
    step(net, c, NULL);
    step(net, c, NULL);
#ifdef DSRT_FAKE_GPU
    CHECK_EQ(fakegpu_get_stats().bad_handles, 0);
#endif
    dsrt_comm_close(c);
    dsrt_net_destroy(net);
}

/* grads_wait queues the device's wait for the sums and returns: the host
 * never blocks there. The timeline of a step comes once its sums are seen
 * done. */
static void test_grads_wait_queues(void) {
    dsrt_comm *c = NULL;
    int dev = 0;
    dsrt_comm_options co = dsrt_comm_defaults();
    co.bucket_bytes = 256;
    co.first_bucket_bytes = 64;
    CHECK_OK(dsrt_comm_open_local(&c, 1, &dev, &co));
    REQUIRE(c);
    dsrt_net *net = make_net(PLAIN_NET, 0, 0, 0, 4);
    dsrt_net *plain = make_net(PLAIN_NET, 0, 0, 0, 4);
    dsrt_optimizer *opt, *popt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, NULL));
    CHECK_OK(dsrt_optimizer_create(&popt, plain, NULL));
    CHECK_OK(dsrt_comm_attach(c, net));
    for (int s = 0; s < 5; s++) {
        dsrt_net_batch b = batch8();
        CHECK_OK(dsrt_net_train_start(net, &b));
#ifdef DSRT_FAKE_GPU
        long waits = fakegpu_get_stats().host_waits;
#endif
        CHECK_OK(dsrt_comm_grads_wait(c));
#ifdef DSRT_FAKE_GPU
        CHECK_EQ(fakegpu_get_stats().host_waits, waits);
#endif
        CHECK_OK(dsrt_net_train_finish(net, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
        CHECK_OK(dsrt_net_forward_backward(plain, X, Y, 8, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(popt, plain, 0));
    }
    dsrt_comm_timeline t;
    CHECK_OK(dsrt_comm_last_timeline(c, &t));
    CHECK(t.n >= 2);
    for (int k = 0; k < t.n; k++) CHECK(t.bucket[k].done_s >= t.bucket[k].ready_s);
    CHECK_OK(dsrt_comm_attach(c, NULL));
    size_t np;
    const float *a = dsrt_net_params(net, &np), *p = dsrt_net_params(plain, NULL);
    double worst = 0;
    for (size_t i = 0; i < np; i++) worst = fmax(worst, fabs((double)a[i] - p[i]));
    CHECK(worst <= 1e-6); /* one member: the sums are the gradients */
    dsrt_optimizer_destroy(opt);
    dsrt_optimizer_destroy(popt);
    dsrt_comm_close(c);
    dsrt_net_destroy(net);
    dsrt_net_destroy(plain);
}

#ifdef DSRT_FAKE_GPU
/* A collective that never completes (a peer that never comes): the step
 * after it fails with the communicator's timeout where the host waits for
 * the device, and no host call ever blocked on the hung work. */
static void test_deadline(void) {
    dsrt_comm *c = NULL;
    int dev = 0;
    dsrt_comm_options co = dsrt_comm_defaults();
    co.timeout_s = 0.3;
    CHECK_OK(dsrt_comm_open_local(&c, 1, &dev, &co));
    REQUIRE(c);
    dsrt_net *net = make_net(PLAIN_NET, 0, 0, 0, 4);
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, NULL));
    CHECK_OK(dsrt_comm_attach(c, net));
    step(net, c, opt);
    fakegpu_reset_stats();
    fakegpu_hang_collectives(1);
    dsrt_net_batch b = batch8();
    int rc = 0, waited = 0;
    for (int s = 0; s < 3 && !rc; s++) {
        rc = dsrt_net_train_start(net, &b);
        if (!rc) rc = dsrt_comm_grads_wait(c);
        waited += !rc;
        if (!rc) rc = dsrt_net_train_finish(net, NULL, NULL);
        if (!rc) rc = dsrt_optimizer_step(opt, net, 0);
    }
    fprintf(stderr, "  a hung all-reduce: %s\n", rc ? dsrt_last_error() : "no failure");
    CHECK_EQ(rc, -ETIMEDOUT);
    /* grads_wait of the hung step returned at once: the host found out
     * where it next waited for the device. */
    CHECK(waited >= 1);
    CHECK(strstr(dsrt_last_error(), "not complete after") != NULL);
    fakegpu_hang_collectives(0);
    fakegpu_stats s = fakegpu_get_stats();
    CHECK_EQ(s.deadlocks, 0);
    CHECK_EQ(s.aborts, 1);
    /* The communicator is broken: every later call says so. */
    CHECK_EQ(dsrt_comm_grads_wait(c), DSRT_ECLOSED);
    dsrt_optimizer_destroy(opt);
    dsrt_comm_close(c);
    dsrt_net_destroy(net);
}
#endif

/* Opens a group of two members on GPUs 0 and 1; 0 where fewer are seen. */
static int open_two(dsrt_comm *c[2]) {
    if (gpus_for_test() < 2) {
        fprintf(stderr, "  one GPU: nothing to group\n");
        return 0;
    }
    int devs[2] = {0, 1};
    CHECK_OK(dsrt_comm_open_local(c, 2, devs, NULL));
    REQUIRE(c[0] && c[1]);
    return 1;
}

/* The members of one process's group closed one after another by one
 * thread (as a multi-gpu run ends): their NCCL communicators are finalised
 * and destroyed together. */
static void test_close_from_one_thread(void) {
    dsrt_comm *c[2] = {NULL, NULL};
#ifdef DSRT_FAKE_GPU
    fakegpu_reset_stats();
#endif
    if (!open_two(c)) return;
    dsrt_comm_close(c[0]);
    dsrt_comm_close(c[1]);
#ifdef DSRT_FAKE_GPU
    fakegpu_stats s = fakegpu_get_stats();
    CHECK_EQ(s.finalizes, 2);
    CHECK_EQ(s.destroys, 2);
    CHECK_EQ(s.ungrouped_closes, 0);
    CHECK_EQ(s.split_closes, 0);
#endif
}

/* Host collectives of one process's group on buffers each member frees as
 * soon as the call returns (as the trainer's bad-sample exchange does): no
 * member may still read another's buffer then (AddressSanitizer's build
 * sees it). */
#define HOST_ROUNDS 3000
typedef struct {
    dsrt_comm *c;
    int member, bad;
} host_member;

static void *host_member_main(void *arg) {
    host_member *m = arg;
    for (int r = 0; r < HOST_ROUNDS && !m->bad; r++) {
        size_t n = 64 + (size_t)(r % 7) * 301;
        int root = r % 2;
        unsigned char *b = malloc(n);
        double *x = malloc(3 * sizeof *x);
        if (!b || !x) {
            m->bad = 1;
            free(b);
            free(x);
            break;
        }
        for (size_t i = 0; i < n; i++) b[i] = m->member == root ? (unsigned char)(i * 7 + r) : 0;
        for (int i = 0; i < 3; i++) x[i] = m->member + i + r;
        /* The root mostly arrives last: it leaves first, and frees. */
        if (m->member == root && r % 4 != 3) usleep(20);
        if (dsrt_comm_bcast(m->c, b, n, root)) m->bad = 1;
        for (size_t i = 0; i < n && !m->bad; i++)
            if (b[i] != (unsigned char)(i * 7 + r)) m->bad = 2;
        free(b);
        if (!m->bad && dsrt_comm_sum_f64(m->c, x, 3)) m->bad = 1;
        for (int i = 0; i < 3 && !m->bad; i++)
            if (x[i] != 1 + 2.0 * (i + r)) m->bad = 3;
        free(x);
    }
    return NULL;
}

static void test_host_collectives_then_free(void) {
    dsrt_comm *c[2] = {NULL, NULL};
    if (!open_two(c)) return;
    host_member m[2] = {{c[0], 0, 0}, {c[1], 1, 0}};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, host_member_main, &m[1]) == 0);
    host_member_main(&m[0]);
    pthread_join(t, NULL);
    CHECK_EQ(m[0].bad, 0);
    CHECK_EQ(m[1].bad, 0);
    dsrt_comm_close(c[0]);
    dsrt_comm_close(c[1]);
}

int main(void) {
#ifdef DSRT_FAKE_GPU
    fakegpu_set_devices(2);
#else
    int skip = gpu_skip();
    if (skip) return skip;
#endif
    if (dsrt_comm_available(DSRT_COMM_NCCL) != 0) {
        fprintf(stderr, "skipped: %s\n", dsrt_last_error());
        return TEST_SKIP;
    }
    REQUIRE(timg_tmpdir("gpu_dp", root, sizeof root) == 0);
    snprintf(train_dir, sizeof train_dir, "%s/train", root);
    snprintf(val_dir, sizeof val_dir, "%s/val", root);
    make_folder(train_dir, 13, 1, 0);
    make_folder(val_dir, 5, 500, 1);
    for (int i = 0; i < 8; i++) {
        uint8_t px[SIDE * SIDE];
        Y[i] = i % 4;
        make_image(px, i % 4, 77 + (uint32_t)i);
        for (int k = 0; k < SIDE * SIDE; k++) X[i * SIDE * SIDE + k] = px[k] / 255.0f;
    }
    RUN_WANTED(test_multi_gpu);
    RUN_WANTED(test_multi_gpu_bn_sync);
    RUN_WANTED(test_no_parameters);
    RUN_WANTED(test_grads_wait_queues);
#ifdef DSRT_FAKE_GPU
    RUN_WANTED(test_deadline);
#endif
    RUN_WANTED(test_close_from_one_thread);
    RUN_WANTED(test_host_collectives_then_free);
    return TEST_RESULT();
}

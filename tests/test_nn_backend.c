/*
 * Tests of what every backend owes the rest of dsrt, run here on the CPU
 * backend: the split training step (stage, train_start, train_finish) gives
 * exactly what dsrt_net_forward_backward gives; uint8 NHWC batches give
 * exactly what the same pixels as float NCHW give; the global batch scales
 * the loss gradient exactly; dropout masks depend only on the logical NCHW
 * position (whatever layout the backend keeps activations in); optimizer
 * state moves between optimizers; the compute threads can be reached; a
 * GPU that is not there is refused, with the net left working; and signals
 * handled while the CPU computes leave the heap and the result intact.
 *
 * Tolerances: none. Each comparison here is bit for bit, because each pair
 * runs the same arithmetic in the same order.
 */
#include "nn/internal.h"
#include "task.h"

#include <dsrt/pipeline.h>
#include <dsrt/train.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NET_CONV                                                                                   \
    "input size=8x8x3\n"                                                                           \
    "conv filters=16 size=3 pad=1\n"                                                               \
    "batchnorm\n"                                                                                  \
    "relu\n"                                                                                       \
    "dropout p=0.3\n"                                                                              \
    "fc outputs=classes\n"                                                                         \
    "softmax\n"

static dsrt_net *make(const char *desc, int classes) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 11;
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, desc, 0, 0, 0, classes, &o);
    if (rc) fprintf(stderr, "net_create: %s\n", dsrt_last_error());
    REQUIRE(rc == 0);
    return net;
}

/* n random uint8 images (n, h, w, c) and labels. */
static void random_batch(uint8_t *px, size_t values, int32_t *labels, int n, int classes,
                         uint64_t seed) {
    dsrt_rng r = dsrt_rng_init(seed, 0, 0, 0);
    for (size_t i = 0; i < values; i++) px[i] = (uint8_t)dsrt_rng_u64(&r);
    for (int i = 0; i < n; i++) labels[i] = (int32_t)dsrt_rng_below(&r, (uint64_t)classes);
}

static int same_floats(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof *a) == 0;
}

// ----------------------------------------------------------------------------
// The split step, uint8 batches, the global batch

static void test_split_step_and_u8(void) {
    const int n = 6, classes = 5, c = 3, h = 8, w = 8;
    size_t values = (size_t)n * c * h * w;
    uint8_t *px = malloc(values);
    float *x = malloc(values * sizeof *x);
    int32_t labels[6];
    REQUIRE(px && x);
    random_batch(px, values, labels, n, classes, 3);
    const float sub[4] = {10, 20, 30, 0}, div[4] = {255, 128, 64, 1};
    dsrt__batch_u8_to_f32(px, x, n, c, h, w, sub, div);
    /* The conversion is (x - sub) / div per channel, from NHWC to NCHW. */
    CHECK(x[0] == ((float)px[0] - 10.0f) / 255.0f);
    CHECK(x[(size_t)h * w] == ((float)px[1] - 20.0f) / 128.0f);
    CHECK(x[1] == ((float)px[3] - 10.0f) / 255.0f);

    dsrt_net *a = make(NET_CONV, classes), *b = make(NET_CONV, classes),
             *u = make(NET_CONV, classes);
    size_t np;
    float *ga = NULL;
    float la = 0, lb = 0, lu = 0;
    int ca = 0, cb = 0, cu = 0;
    CHECK_OK(dsrt_net_forward_backward(a, x, labels, n, &la, &ca));
    ga = dsrt_net_grads(a, &np);

    /* The split step on the same floats. */
    dsrt_net_batch fb = {.data = x, .layout = DSRT_INPUT_F32_NCHW, .labels = labels, .n = n};
    CHECK_EQ(dsrt_net_stage(b, &fb), 0); /* the CPU reads it in place */
    CHECK_OK(dsrt_net_stage_wait(b));
    CHECK_OK(dsrt_net_train_start(b, &fb));
    CHECK_EQ(dsrt_net_train_start(b, &fb), -EINVAL); /* not twice */
    CHECK_OK(dsrt_net_train_finish(b, &lb, &cb));
    CHECK_EQ(dsrt_net_train_finish(b, NULL, NULL), -EINVAL);
    CHECK(la == lb);
    CHECK_EQ(ca, cb);
    CHECK(same_floats(ga, dsrt_net_grads(b, NULL), np));
    CHECK_EQ(dsrt_net_iteration(a), 1);
    CHECK_EQ(dsrt_net_iteration(b), 1);

    /* uint8 pixels, normalised by the net. */
    dsrt_net_batch ub = {.data = px, .layout = DSRT_INPUT_U8_NHWC, .labels = labels, .n = n};
    memcpy(ub.sub, sub, sizeof sub);
    memcpy(ub.div, div, sizeof div);
    CHECK_OK(dsrt_net_train_start(u, &ub));
    CHECK_OK(dsrt_net_train_finish(u, &lu, &cu));
    CHECK(la == lu);
    CHECK(same_floats(ga, dsrt_net_grads(u, NULL), np));

    /* A batch that is half the global batch: the gradient is exactly half. */
    dsrt_net *g = make(NET_CONV, classes);
    dsrt_net_batch gb = fb;
    gb.global_n = 2 * n;
    float lg;
    CHECK_OK(dsrt_net_train_start(g, &gb));
    CHECK_OK(dsrt_net_train_finish(g, &lg, NULL));
    CHECK(lg == la); /* the loss is still this batch's mean */
    const float *gg = dsrt_net_grads(g, NULL);
    size_t off = 0;
    for (size_t i = 0; i < np; i++)
        if (2.0f * gg[i] != ga[i] && off++ < 3)
            fprintf(stderr, "  grad[%zu]: %g x 2 != %g\n", i, (double)gg[i], (double)ga[i]);
    CHECK_EQ(off, 0);

    /* Bad batches are refused before any work. */
    dsrt_net_batch bad = ub;
    bad.div[1] = 0;
    CHECK_EQ(dsrt_net_stage(u, &bad), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "div[1]");
    bad = fb;
    bad.global_n = n - 1;
    CHECK_EQ(dsrt_net_train_start(u, &bad), DSRT_EOPTION);
    bad = fb;
    bad.layout = (dsrt_input_layout)7;
    CHECK_EQ(dsrt_net_train_start(u, &bad), DSRT_EOPTION);
    bad = fb;
    bad.labels = NULL;
    CHECK_EQ(dsrt_net_train_start(u, &bad), -EINVAL);
    CHECK_EQ(dsrt_net_sync(u), 0);
    double busy = -1, idle = -1;
    dsrt_net_device_time(u, &busy, &idle);
    CHECK(busy == 0 && idle == 0);

    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    dsrt_net_destroy(u);
    dsrt_net_destroy(g);
    free(px);
    free(x);
}

// ----------------------------------------------------------------------------
// Dropout masks by logical position

static void test_dropout_logical_masks(void) {
    /* After a 16-channel convolution the CPU backend keeps activations in a
     * blocked layout; the mask must still follow the NCHW index. */
    const int n = 3, classes = 4;
    dsrt_net *net = make(NET_CONV, classes);
    size_t values = (size_t)n * 3 * 8 * 8;
    float *x = malloc(values * sizeof *x);
    REQUIRE(x);
    dsrt_rng r = dsrt_rng_init(5, 0, 0, 0);
    for (size_t i = 0; i < values; i++) x[i] = (float)dsrt_rng_uniform(&r);
    int32_t labels[3] = {0, 1, 3};
    dsrt_net_set_iteration(net, 41);
    double loss;
    CHECK_OK(dsrt__net_forward(net, x, n, 1, labels, &loss, NULL, NULL));
    int drop = 4; /* input conv batchnorm relu dropout */
    REQUIRE(net->layers[drop].kind == DSRT_LAYER_DROPOUT);
    size_t m = (size_t)n * 16 * 8 * 8;
    float *in = malloc(m * sizeof *in), *out = malloc(m * sizeof *out);
    REQUIRE(in && out);
    CHECK_OK(dsrt__net_layer_output(net, drop - 1, in, 1));
    CHECK_OK(dsrt__net_layer_output(net, drop, out, 1));
    float p = net->layers[drop].o.p, keep = 1.0f / (1.0f - p);
    uint32_t thresh = (uint32_t)fmin(4294967295.0, ldexp((double)p, 32));
    dsrt_rng g = dsrt_rng_init(11, 41, (uint64_t)drop, 0x44524f50u);
    size_t bad = 0, kept = 0;
    uint64_t draw = 0;
    for (size_t j = 0; j < m; j++) {
        if (j % 2 == 0) draw = dsrt_rng_u64(&g);
        uint32_t bits = j % 2 ? (uint32_t)(draw >> 32) : (uint32_t)draw;
        float want = bits >= thresh ? in[j] * keep : 0.0f;
        kept += bits >= thresh;
        if (out[j] != want && bad++ < 3)
            fprintf(stderr, "  dropout[%zu] = %g, want %g\n", j, (double)out[j], (double)want);
    }
    CHECK_EQ(bad, 0);
    CHECK(kept > m / 2 && kept < m * 9 / 10);
    free(in);
    free(out);
    free(x);
    dsrt_net_destroy(net);
}

// ----------------------------------------------------------------------------
// Optimizer state, threads, devices

static void test_optimizer_copy_state(void) {
    const int n = 4, classes = 3;
    dsrt_net *a = make(NET_CONV, classes), *b = make(NET_CONV, classes);
    size_t values = (size_t)n * 3 * 8 * 8;
    float *x = calloc(values, sizeof *x);
    REQUIRE(x);
    for (size_t i = 0; i < values; i++) x[i] = (float)(i % 17) / 17.0f;
    int32_t labels[4] = {0, 1, 2, 1};
    dsrt_optimizer_options oo = dsrt_optimizer_defaults(DSRT_SOLVER_ADAM);
    dsrt_optimizer *oa, *ob, *other;
    CHECK_OK(dsrt_optimizer_create(&oa, a, &oo));
    CHECK_OK(dsrt_optimizer_create(&ob, b, &oo));
    oo.solver = DSRT_SOLVER_SGDM;
    CHECK_OK(dsrt_optimizer_create(&other, b, &oo));
    for (int s = 0; s < 3; s++) {
        CHECK_OK(dsrt_net_forward_backward(a, x, labels, n, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(oa, a, 0));
    }
    /* b takes a's weights and optimizer state: the next steps agree. */
    size_t np;
    float *pb = dsrt_net_params(b, &np);
    memcpy(pb, dsrt_net_params(a, NULL), np * sizeof(float));
    memcpy(dsrt_net_state(b, NULL), dsrt_net_state(a, NULL), b->n_state * sizeof(float));
    dsrt_net_params_changed(b);
    dsrt_net_set_iteration(b, dsrt_net_iteration(a));
    CHECK_OK(dsrt_optimizer_copy_state(ob, oa));
    CHECK_EQ(dsrt_optimizer_copy_state(other, oa), DSRT_EOPTION);
    for (int s = 0; s < 2; s++) {
        CHECK_OK(dsrt_net_forward_backward(a, x, labels, n, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(oa, a, 0));
        CHECK_OK(dsrt_net_forward_backward(b, x, labels, n, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(ob, b, 0));
    }
    CHECK(same_floats(dsrt_net_params(a, NULL), dsrt_net_params(b, NULL), np));
    dsrt_optimizer_destroy(oa);
    dsrt_optimizer_destroy(ob);
    dsrt_optimizer_destroy(other);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    free(x);
}

static int count_member(void *ctx, int member) {
    atomic_int *seen = ctx;
    atomic_fetch_or(seen, 1 << member);
    return member == 1; /* one failure reported */
}

static void test_threads(void) {
    dsrt_net *net = make(NET_CONV, 3);
    dsrt_net_set_threads(net, 2);
    CHECK_EQ(dsrt_net_threads(net), 2);
    atomic_int seen = 0;
    int failures = dsrt_net_run_on_threads(net, count_member, &seen);
    /* libgomp runs one call on each of the two threads. */
    CHECK_EQ(atomic_load(&seen), 3);
    CHECK_EQ(failures, 1);
    dsrt_net_destroy(net);
}

static void test_devices(void) {
    dsrt_net *net = make(NET_CONV, 3);
    dsrt_net_info ni;
    dsrt_net_get_info(net, &ni);
    CHECK_EQ(ni.device, DSRT_DEVICE_CPU);
    CHECK_EQ(ni.precision, DSRT_PRECISION_FP32);
    CHECK_STR_EQ(ni.backend, "cpu-onednn");
    CHECK_STR_EQ(dsrt_precision_name(DSRT_PRECISION_BF16), "bf16");
    CHECK(dsrt_precision_name((dsrt_precision)9) == NULL);
    int ngpu = dsrt_gpu_count();
    CHECK_GE(ngpu, 0);
    /* A device that is not there: refused with the reason, and the net
     * stays on the CPU, working. */
    CHECK_EQ(dsrt_net_set_device(net, ngpu), DSRT_ENODEVICE);
    CHECK_CONTAINS(dsrt_last_error(), "GPU");
    CHECK_EQ(dsrt_gpu_check(ngpu), DSRT_ENODEVICE);
    CHECK_EQ(dsrt_net_set_device(net, -5), DSRT_EOPTION);
    CHECK_OK(dsrt_net_set_device(net, DSRT_DEVICE_CPU));
    float x[3 * 8 * 8] = {0};
    int32_t y[1] = {2};
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 1, NULL, NULL));
    /* bf16 is for GPUs. */
    dsrt_net_options o = dsrt_net_defaults();
    o.precision = DSRT_PRECISION_BF16;
    dsrt_net *b = NULL;
    CHECK_EQ(dsrt_net_create(&b, NET_CONV, 0, 0, 0, 3, &o), DSRT_EUNSUPPORTED);
    CHECK_CONTAINS(dsrt_last_error(), "bf16");
    CHECK(b == NULL);
    o.precision = DSRT_PRECISION_TF32; /* computed in fp32 on the CPU */
    CHECK_OK(dsrt_net_create(&b, NET_CONV, 0, 0, 0, 3, &o));
    dsrt_net_get_info(b, &ni);
    CHECK_EQ(ni.precision, DSRT_PRECISION_FP32);
    dsrt_net_destroy(b);
    dsrt_net_destroy(net);

    void *p = dsrt_pinned_alloc(1 << 20, -1);
    REQUIRE(p);
    CHECK_EQ(((uintptr_t)p) % 4096, 0);
    CHECK_EQ(((unsigned char *)p)[12345], 0);
    memset(p, 1, 1 << 20);
    dsrt_pinned_free(p);
    dsrt_pinned_free(NULL);
}

// ----------------------------------------------------------------------------
// Signals while the CPU computes

#define NET_FC                                                                                     \
    "input size=16x16x3\n"                                                                         \
    "fc outputs=512\n"                                                                             \
    "relu\n"                                                                                       \
    "fc outputs=512\n"                                                                             \
    "relu\n"                                                                                       \
    "fc outputs=classes\n"                                                                         \
    "softmax\n"

static atomic_long signals_taken;

static void on_signal(int sig) {
    (void)sig;
    atomic_fetch_add_explicit(&signals_taken, 1, memory_order_relaxed);
}

typedef struct {
    pthread_t target;
    atomic_int stop;
    long sent;
} storm;

/* Signals the training thread, and the process (any thread that takes it),
 * in turn, as fast as they go, until told to stop. */
static void *storm_main(void *arg) {
    storm *s = arg;
    while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
        if (s->sent % 2 == 0)
            pthread_kill(s->target, SIGUSR1);
        else
            kill(getpid(), SIGUSR1);
        s->sent++;
        struct timespec t = {0, 20000};
        nanosleep(&t, NULL);
    }
    return NULL;
}

/* Steps of SGD on random batches; the parameters' checksum after them. */
static uint64_t train_steps(dsrt_net *net, int steps, int n, int classes) {
    size_t values = (size_t)n * 3 * 16 * 16;
    float *x = malloc(values * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    uint8_t *px = malloc(values);
    REQUIRE(x && y && px);
    dsrt_optimizer_options oo = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    dsrt_optimizer *opt = NULL;
    REQUIRE(dsrt_optimizer_create(&opt, net, &oo) == 0);
    for (int k = 0; k < steps; k++) {
        random_batch(px, values, y, n, classes, (uint64_t)k + 1);
        for (size_t i = 0; i < values; i++) x[i] = (float)px[i] / 255.0f;
        CHECK_OK(dsrt_net_forward_backward(net, x, y, n, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    }
    dsrt_optimizer_destroy(opt);
    free(x);
    free(y);
    free(px);
    return dsrt_weights_checksum(net);
}

/* A program's signal handlers run while the CPU backend trains, on the
 * training thread and on any other: oneDNN's JIT GEMM kernels point the
 * stack pointer into the heap while they run, so a signal frame written
 * there would corrupt the heap. The backend holds asynchronous signals on
 * a thread while it runs oneDNN's kernels: the training ends, and its
 * weights are those of the same training without signals. */
static void test_signals_during_compute(void) {
    const int classes = 10, n = 64, steps = 60;
    for (int threads = 1; threads <= 2; threads++) {
        dsrt_net *quiet = make(NET_FC, classes), *loud = make(NET_FC, classes);
        dsrt_net_set_threads(quiet, threads);
        dsrt_net_set_threads(loud, threads);
        uint64_t want = train_steps(quiet, steps, n, classes);
        struct sigaction sa, old;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
        storm s = {.target = pthread_self()};
        atomic_init(&s.stop, 0);
        atomic_store(&signals_taken, 0);
        pthread_t th;
        REQUIRE(pthread_create(&th, NULL, storm_main, &s) == 0);
        uint64_t got = train_steps(loud, steps, n, classes);
        atomic_store(&s.stop, 1);
        pthread_join(th, NULL);
        sigaction(SIGUSR1, &old, NULL);
        CHECK_EQ(got, want);
        fprintf(stderr, "  %d thread(s): %ld signals sent, %ld handled during %d steps\n", threads,
                s.sent, atomic_load(&signals_taken), steps);
        dsrt_net_destroy(quiet);
        dsrt_net_destroy(loud);
    }
}

int main(void) {
    RUN(test_split_step_and_u8);
    RUN(test_dropout_logical_masks);
    RUN(test_optimizer_copy_state);
    RUN(test_threads);
    RUN(test_devices);
    RUN(test_signals_during_compute);
    return TEST_RESULT();
}

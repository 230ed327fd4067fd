/*
 * Data-parallel training under mpirun (2 ranks, one compute thread each),
 * against the same training in one process.
 *
 *   mpi_train CASE      runs one case: launches workers, compares their files
 *   mpi_train --worker  a worker (under mpirun, or alone for the reference)
 *
 * Cases (each a CTest test, label "mpi"):
 *   equal     2 ranks x 64 train as 1 process x 128: losses and weights
 *             after 20 steps within 1e-5 (relative), the weights of both
 *             ranks bit-identical after every step, and identical again in a
 *             second 2-rank run; parameter averaging every step with plain
 *             SGD equals summing the gradients.
 *   sync_bn   the same for a net with batch normalisation in sync mode.
 *   resnet    resnet20 (a graph) with sync batchnorm: the first step the same
 *             (its update within 1e-5), 20 steps close; 2 ranks resumed
 *             mid-epoch bit for bit as the uninterrupted run.
 *   resume    a 1-process checkpoint resumed by 2 ranks, and a 2-rank
 *             checkpoint resumed by 1 process, end as the uninterrupted run.
 *   resume_exact  2 ranks resumed mid-epoch go on bit for bit as the
 *             uninterrupted run: gradients summed, parameters averaged with
 *             and without the optimizer state, sync and averaged batchnorm;
 *             one process takes the mean of the ranks' optimizer states.
 *   local_failure  a bad image in rank 1's part only: both ranks fail at the
 *             same step, rank 0 naming worker 1 and the file.
 *   fault     rank 1 hangs at iteration 7: rank 0 exits non-zero by itself
 *             (the communicator's timeout), naming rank 1, and the last
 *             checkpoint loads; the same when rank 1 is killed (then mpirun
 *             ends the job and names it).
 *   refuse    bad options are refused by every rank of `mpirun dstrain
 *             train --execution-environment parallel`, before any work.
 *   bad_named bad files in every worker's share are skipped, and rank 0
 *             names each once in dstrain's --bad-list.
 *   bad_counts  a bad file is one file, skipped as often as by one process,
 *             whichever worker found it: text, JSON and --bad-list alike.
 *   agree     ranks given another seed, batch, epoch count, checkpoint
 *             folder, sample count, class list or file size refuse at once,
 *             naming it; `mpirun -np 2 dstrain train` without
 *             --execution-environment parallel is refused.
 *   signal    SIGTERM or SIGINT to rank 1 of `mpirun dstrain train`: every
 *             rank exits 143 or 130, and rank 0 says what it kept.
 *   python_ranks  the Python module's Pipeline(rank=r, world_size=2) gives
 *             the samples dstrain's worker r trains on (--order-log), batch
 *             for batch (the Python part skipped without NumPy or the module).
 *   resume_auto  --resume auto under mpirun: a fresh start, then the newest
 *             complete checkpoint (a truncated newer one passed over by both
 *             workers), ending as the uninterrupted run.
 *   elastic   a checkpoint 2 workers wrote mid-epoch resumed on 1 and on 3:
 *             the rest of the epoch is the same batches striped over them,
 *             each sample of the epoch trained on once (--order-log).
 *
 * Exit 77 when this dsrt lacks MPI or mpirun is missing.
 */
#include "commtest.h"
#include "testimg.h"

#include <dsrt.h>

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>

#define SIDE      16
#define PER_CLASS 64 /* 4 classes: 256 images, 2 batches of 128 an epoch */
#define STEPS     20

static const char NET[] = "input size=16x16x1\n"
                          "conv name=conv1 filters=8 size=3 pad=1\n"
                          "relu name=relu1\n"
                          "maxpool name=pool1 size=2 stride=2\n"
                          "fc name=fc1 outputs=16\n"
                          "relu name=relu2\n"
                          "fc name=fc2 outputs=classes\n"
                          "softmax name=output\n";

/* The same with batch normalisation, for sync batchnorm. */
static const char NET_BN[] = "input size=16x16x1\n"
                             "conv name=conv1 filters=8 size=3 pad=1\n"
                             "batchnorm name=bn1\n"
                             "relu name=relu1\n"
                             "maxpool name=pool1 size=2 stride=2\n"
                             "fc name=fc1 outputs=16\n"
                             "relu name=relu2\n"
                             "fc name=fc2 outputs=classes\n"
                             "softmax name=output\n";

static const char *const CLASSES[] = {"centre", "checker", "hstripes", "vstripes"};

// ----------------------------------------------------------------------------
// Data

static void make_image(uint8_t *px, int cls, uint32_t seed) {
    int phase = (int)(timg_hash(seed) % 4);
    for (int y = 0; y < SIDE; y++)
        for (int x = 0; x < SIDE; x++) {
            int v = cls == 0
                        ? ((x - 8 + phase) * (x - 8 + phase) + (y - 8) * (y - 8) < 20 ? 220 : 40)
                    : cls == 1 ? ((((x + phase) / 2 + y / 2) % 2) ? 200 : 50)
                    : cls == 2 ? (((y + phase) / 2 % 2) ? 210 : 40)
                               : (((x + phase) / 2 % 2) ? 210 : 40);
            v += (int)(timg_hash(seed * 977u + (uint32_t)(y * SIDE + x)) % 41) - 20;
            px[y * SIDE + x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
}

static void make_data(const char *dir) {
    uint8_t px[SIDE * SIDE];
    for (int k = 0; k < 4; k++) {
        char sub[4400];
        snprintf(sub, sizeof sub, "%s/%s", dir, CLASSES[k]);
        REQUIRE(timg_mkdirs(sub) == 0);
        for (int i = 0; i < PER_CLASS; i++) {
            make_image(px, k, (uint32_t)(k * 1000 + i));
            char path[4500];
            snprintf(path, sizeof path, "%s/%03d.png", sub, i);
            dsrt_image img = {px, SIDE, SIDE, 1, SIDE};
            REQUIRE(dsrt_png_write(path, &img) == 0);
        }
    }
}

// ----------------------------------------------------------------------------
// Workers

/* What a worker records: per iteration its loss and weights checksum. */
typedef struct {
    dsrt_net *net;
    FILE *out;
    int rank, hang_at;
} recorder;

static int record(void *ctx, const dsrt_train_event *e) {
    recorder *r = ctx;
    if (e->kind != DSRT_EVENT_ITERATION) return 0;
    fprintf(r->out, "%lld %.17g %016llx\n", (long long)e->iteration, e->loss,
            (unsigned long long)dsrt_weights_checksum(r->net));
    fflush(r->out);
    if (r->hang_at && r->rank == 1 && e->iteration == (r->hang_at > 0 ? r->hang_at : -r->hang_at))
        raise(r->hang_at > 0 ? SIGSTOP : SIGKILL);
    return 0;
}

/*
 * mpi_train --worker DIR TAG EPOCHS RESUME CKPT AVG HANG FLAGS: trains the net on
 * DIR/data (under mpirun: parallel, batch 128 split between the ranks) for
 * EPOCHS epochs, resuming from RESUME ("-": no), checkpoints every 2
 * iterations in CKPT ("-": none), averaging parameters every AVG iterations
 * with plain SGD (0: gradients summed, SGD with momentum; -1: summed, plain
 * SGD), rank 1 hanging at iteration HANG (0: never; negative: killed at
 * iteration -HANG); FLAGS, or'ed: 1 the net with batch normalisation, in
 * sync mode under mpirun (with 32: average mode); 2 the data's own order
 * and the first bad image fails the run; 4 averaging keeps SGD's momentum;
 * 8 averaging averages the optimizer state too; 16 batch 64 (4 an epoch)
 * and a checkpoint every 3 iterations, so that checkpoints fall mid-epoch
 * and mid-way between averagings; 64 the built-in resnet20 (a graph: skip
 * connections, projections) for 16x16x1 images, batchnorm in sync mode;
 * 128 a checkpoint every iteration. Writes
 * DIR/TAG.<rank>.log (iteration, loss, checksum a line) and DIR/TAG.<rank>.w
 * (the final weights).
 */
static int worker(int argc, char **argv) {
    if (argc < 10) return 2;
    const char *dir = argv[2], *tag = argv[3], *resume = argv[5], *ckpt = argv[6];
    int epochs = atoi(argv[4]), avg = atoi(argv[7]), hang = atoi(argv[8]), flags = atoi(argv[9]);
    int res = flags & 64, bn = (flags & 1) || res;
    int parallel = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
    dsrt_comm *comm = NULL;
    if (parallel) {
        if (dsrt_comm_init(&argc, &argv) != 0) return 1;
        dsrt_comm_options co = dsrt_comm_defaults();
        /* A short timeout where rank 1 hangs on purpose; the default
         * elsewhere, so that no rank of a loaded machine is taken for hung. */
        if (hang > 0) co.timeout_s = 8;
        if (dsrt_comm_open(&comm, &co) != 0) {
            fprintf(stderr, "comm: %s\n", dsrt_last_error());
            return 1;
        }
    }
    char data[4400], path[4400];
    snprintf(data, sizeof data, "%s/data", dir);
    dsrt_datastore *ds = NULL;
    REQUIRE(dsrt_datastore_open(&ds, data, NULL) == 0);
    char *desc = dsrt_describe_datastore_classes(res ? "resnet20" : bn ? NET_BN : NET, ds);
    dsrt_net_options no = dsrt_net_defaults();
    no.seed = 5;
    no.threads = 1;
    dsrt_net *net = NULL;
    /* resnet20 made for these 16x16 gray images. */
    REQUIRE(dsrt_net_create(&net, desc, res ? SIDE : 0, res ? SIDE : 0, res ? 1 : 0, 4, &no) == 0);
    free(desc);

    dsrt_train_options o = dsrt_train_defaults();
    o.execution = parallel ? DSRT_EXEC_PARALLEL : DSRT_EXEC_CPU;
    o.comm = comm;
    o.max_epochs = epochs;
    o.batch = flags & 16 ? 64 : 128;
    o.seed = 3;
    o.compute_threads = 1;
    o.workers = 1;
    o.pin = 0;
    o.augment.rand_x_reflection = 1;
    o.optimizer.learn_rate = 0.05;
    o.averaging_frequency = avg > 0 ? avg : 0;
    if (flags & 2) {
        o.shuffle = DSRT_SHUFFLE_NEVER;
        o.fail_on_error = 1;
    }
    if (bn) {
        /* A gentler rate: batch normalisation early in training amplifies
         * rounding differences step after step at 0.05. */
        o.bn_statistics = flags & 32 ? DSRT_BN_AVERAGE : DSRT_BN_SYNC;
        o.optimizer.learn_rate = 0.01;
    }
    /* Plain SGD (-1: with gradients summed), unless flag 4 keeps momentum. */
    if (avg && !(flags & 4)) o.optimizer.momentum = 0;
    o.average_optimizer_state = (flags & 8) != 0;
    if (strcmp(resume, "-")) o.resume = resume;
    if (strcmp(ckpt, "-")) {
        o.checkpoint_path = ckpt;
        o.checkpoint_unit = DSRT_UNIT_ITERATION;
        o.checkpoint_frequency = flags & 128 ? 1 : flags & 16 ? 3 : 2;
    }
    int rank = comm ? dsrt_comm_rank(comm) : 0;
    snprintf(path, sizeof path, "%s/%s.%d.log", dir, tag, rank);
    recorder rec = {net, fopen(path, "w"), rank, hang};
    REQUIRE(rec.out);
    o.callback = record;
    o.callback_ctx = &rec;
    dsrt_train_result r;
    int rc = dsrt_train(net, ds, &o, &r);
    fclose(rec.out);
    if (rc) fprintf(stderr, "rank %d: %s\n", rank, dsrt_last_error());
    if (o.resume) fprintf(stderr, "rank %d: resume_states %d\n", rank, r.resume_states);
    size_t n;
    const float *w = dsrt_net_params(net, &n);
    snprintf(path, sizeof path, "%s/%s.%d.w", dir, tag, rank);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(w, sizeof *w, n, f) == n && fclose(f) == 0);
    dsrt_comm_close(comm);
    dsrt_net_destroy(net);
    dsrt_datastore_close(ds);
    if (parallel) dsrt_comm_finalize();
    return rc ? 1 : 0;
}

// ----------------------------------------------------------------------------
// The launcher

static char root[4096], self[4096];

/* The whole file at path, NUL-terminated (malloc'd), or NULL. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (text && fread(text, 1, (size_t)len, f) != (size_t)len) {
        free(text);
        text = NULL;
    }
    fclose(f);
    if (text) text[len] = 0;
    return text;
}

/* Runs args (a NULL-ended argv) with its standard output and error into
 * the file out; its exit status as comm_test_run gives it. */
static int run_into(char **args, const char *out, int timeout_s) {
    fflush(stdout);
    fflush(stderr);
    int saved_err = dup(2), saved_out = dup(1), fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0 && saved_err >= 0 && saved_out >= 0);
    dup2(fd, 2);
    dup2(fd, 1);
    close(fd);
    int st = comm_test_run(args, timeout_s);
    dup2(saved_err, 2);
    dup2(saved_out, 1);
    close(saved_err);
    close(saved_out);
    return st;
}

/* The start of a command line: mpirun for np ranks (nps, 16 bytes, holds
 * the count), or nothing for np 0. Returns the arguments written. */
static int launcher(char **args, int np, char *nps) {
    if (np <= 0) return 0;
    snprintf(nps, 16, "%d", np);
    args[0] = (char *)comm_test_mpirun();
    args[1] = "--allow-run-as-root";
    args[2] = "--oversubscribe";
    args[3] = "-np";
    args[4] = nps;
    return 5;
}

/* Runs a worker: under mpirun with np ranks, or alone (np 0). Its stderr
 * goes to root/TAG.err. Returns the exit status; *seconds the time taken
 * (for reports). */
static int run_worker_bn(int np, const char *tag, int epochs, const char *resume, const char *ckpt,
                         int avg, int hang, int bn, double *seconds) {
    char nps[16], eps[16], avgs[16], hangs[16], bns[16], err[4400];
    snprintf(bns, sizeof bns, "%d", bn);
    snprintf(eps, sizeof eps, "%d", epochs);
    snprintf(avgs, sizeof avgs, "%d", avg);
    snprintf(hangs, sizeof hangs, "%d", hang);
    snprintf(err, sizeof err, "%s/%s.err", root, tag);
    char *args[24];
    int k = launcher(args, np, nps);
    args[k++] = self;
    args[k++] = "--worker";
    args[k++] = root;
    args[k++] = (char *)tag;
    args[k++] = eps;
    args[k++] = (char *)(resume ? resume : "-");
    args[k++] = (char *)(ckpt ? ckpt : "-");
    args[k++] = avgs;
    args[k++] = hangs;
    args[k++] = bns;
    args[k] = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = run_into(args, err, 120);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (seconds) *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    return st;
}

static int run_worker(int np, const char *tag, int epochs, const char *resume, const char *ckpt,
                      int avg, int hang, double *seconds) {
    return run_worker_bn(np, tag, epochs, resume, ckpt, avg, hang, 0, seconds);
}

typedef struct {
    int n;
    long long it[64];
    double loss[64];
    char sum[64][17];
} run_log;

static void read_log(const char *tag, int rank, run_log *l) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s.%d.log", root, tag, rank);
    FILE *f = fopen(path, "r");
    memset(l, 0, sizeof *l);
    if (!f) {
        fprintf(stderr, "%s: missing\n", path);
        test_failures++;
        return;
    }
    while (l->n < 64 && fscanf(f, "%lld %lf %16s", &l->it[l->n], &l->loss[l->n], l->sum[l->n]) == 3)
        l->n++;
    fclose(f);
}

static float *read_weights(const char *tag, int rank, size_t *n) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s.%d.w", root, tag, rank);
    size_t len = 0;
    uint8_t *data = NULL;
    FILE *f = fopen(path, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        len = (size_t)ftell(f);
        rewind(f);
        data = malloc(len + 1);
        if (data && fread(data, 1, len, f) != len) len = 0;
        fclose(f);
    }
    *n = len / sizeof(float);
    REQUIRE(data && *n > 0);
    return (float *)data;
}

/* ||a - b|| / ||a|| over the weights of two runs (2-norms). */
static double weights_rel_diff(const char *ta, int ra, const char *tb, int rb) {
    size_t na, nb;
    float *a = read_weights(ta, ra, &na), *b = read_weights(tb, rb, &nb);
    CHECK_EQ(na, nb);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < na && i < nb; i++) {
        double d = (double)a[i] - b[i];
        diff += d * d;
        norm += (double)a[i] * a[i];
    }
    free(a);
    free(b);
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

/* The losses of two runs, iteration by iteration, within tol (relative). */
static void check_losses(const run_log *a, const run_log *b, int from, double tol) {
    for (int i = 0; i < b->n; i++) {
        int j = (int)(b->it[i] - 1) - from; /* a's entry of the same iteration */
        if (j < 0 || j >= a->n) continue;
        CHECK_EQ(a->it[j], b->it[i]);
        CHECK_NEAR(a->loss[j], b->loss[i], tol * fmax(1, fabs(a->loss[j])));
    }
}

static void test_equal(void) {
    double s;
    /* The reference: one process, batch 128. */
    CHECK_EQ(run_worker(0, "one", 10, NULL, NULL, 0, 0, &s), 0);
    /* Two ranks, 64 each; twice. */
    CHECK_EQ(run_worker(2, "two", 10, NULL, NULL, 0, 0, &s), 0);
    fprintf(stderr, "  2 ranks, %d steps: %.1f s\n", STEPS, s);
    CHECK_EQ(run_worker(2, "again", 10, NULL, NULL, 0, 0, NULL), 0);
    run_log one, r0, r1, again;
    read_log("one", 0, &one);
    read_log("two", 0, &r0);
    read_log("two", 1, &r1);
    read_log("again", 0, &again);
    CHECK_EQ(one.n, STEPS);
    CHECK_EQ(r0.n, STEPS);
    CHECK_EQ(r1.n, STEPS);
    check_losses(&one, &r0, 0, 1e-5);
    for (int i = 0; i < r0.n && i < r1.n && i < again.n; i++) {
        CHECK_STR_EQ(r0.sum[i], r1.sum[i]);    /* every rank the same weights, every step */
        CHECK_STR_EQ(r0.sum[i], again.sum[i]); /* and so every run */
        CHECK(r0.loss[i] == r1.loss[i]);       /* the agreed figures */
    }
    double d = weights_rel_diff("one", 0, "two", 0);
    fprintf(stderr, "  weights after %d steps, 2 x 64 against 1 x 128: %.2e relative\n", STEPS, d);
    CHECK(d < 1e-5);
    CHECK(weights_rel_diff("two", 0, "two", 1) == 0);

    /* Parameter averaging every step with plain SGD: the same as summing
     * the gradients (each rank's gradient is its half's mean). */
    CHECK_EQ(run_worker(2, "avg", 10, NULL, NULL, 1, 0, NULL), 0);
    CHECK_EQ(run_worker(2, "sgd", 10, NULL, NULL, -1, 0, NULL), 0);
    run_log avg, sgd;
    read_log("avg", 0, &avg);
    read_log("sgd", 0, &sgd);
    CHECK_EQ(avg.n, STEPS);
    CHECK(weights_rel_diff("avg", 0, "avg", 1) == 0);
    check_losses(&sgd, &avg, 0, 1e-5);
    d = weights_rel_diff("sgd", 0, "avg", 0);
    fprintf(stderr, "  averaging every step against summed gradients (SGD): %.2e relative\n", d);
    CHECK(d < 1e-5);
}

/* Batch normalisation over the global batch: 2 ranks x 64 in sync mode
 * train as one process x 128. */
static void test_sync_bn(void) {
    CHECK_EQ(run_worker_bn(0, "bn_one", 10, NULL, NULL, 0, 0, 1, NULL), 0);
    CHECK_EQ(run_worker_bn(2, "bn_two", 10, NULL, NULL, 0, 0, 1, NULL), 0);
    run_log one, r0, r1;
    read_log("bn_one", 0, &one);
    read_log("bn_two", 0, &r0);
    read_log("bn_two", 1, &r1);
    CHECK_EQ(r0.n, STEPS);
    check_losses(&one, &r0, 0, 1e-5);
    for (int i = 0; i < r0.n && i < r1.n; i++) CHECK_STR_EQ(r0.sum[i], r1.sum[i]);
    double d = weights_rel_diff("bn_one", 0, "bn_two", 0);
    fprintf(stderr, "  sync batchnorm, 2 x 64 against 1 x 128 after %d steps: %.2e relative\n",
            STEPS, d);
    CHECK(d < 1e-5);
}

/* The parameters of checkpoint file `name` in folder dir (malloc'd). */
static float *ckpt_params(const char *dir, const char *name, size_t *n) {
    char path[4600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    dsrt_net *net = NULL;
    dsrt_optimizer *opt = NULL;
    if (dsrt_checkpoint_load(path, &net, &opt, NULL, NULL) != 0) {
        fprintf(stderr, "  %s: %s\n", path, dsrt_last_error());
        return NULL;
    }
    const float *w = dsrt_net_params(net, n);
    float *copy = malloc(*n * sizeof *copy);
    REQUIRE(copy);
    memcpy(copy, w, *n * sizeof *copy);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
    return copy;
}

/* resnet20, a graph, with sync batchnorm: 2 ranks x 64 against one rank x
 * 128 (the same synchronised batchnorm path). The first step's loss is the
 * same to float rounding (1e-6), and the first update (the summed gradients) within 1e-5;
 * over 20 steps the two runs stay together (losses within 5%: a deep net
 * with batchnorm amplifies the float rounding in which the sums of the
 * halves and of the whole differ, step after step). Resumed mid-epoch by 2
 * ranks, bit for bit the uninterrupted run. */
static void test_resnet(void) {
    double s;
    char ck_one[4400], ck_two[4400];
    snprintf(ck_one, sizeof ck_one, "%s/ck_res_one", root);
    snprintf(ck_two, sizeof ck_two, "%s/ck_res_two", root);
    CHECK_EQ(run_worker_bn(1, "res_one", 10, NULL, ck_one, 0, 0, 64 | 128, &s), 0);
    fprintf(stderr, "  one rank, %d steps: %.1f s\n", STEPS, s);
    CHECK_EQ(run_worker_bn(2, "res_two", 10, NULL, ck_two, 0, 0, 64 | 128, &s), 0);
    fprintf(stderr, "  2 ranks, %d steps: %.1f s\n", STEPS, s);
    run_log one, r0, r1;
    read_log("res_one", 0, &one);
    read_log("res_two", 0, &r0);
    read_log("res_two", 1, &r1);
    CHECK_EQ(one.n, STEPS);
    CHECK_EQ(r0.n, STEPS);
    /* The same samples and weights: the first loss differs only in how the
     * ranks' sums are grouped (64 + 64 against 128 at once). */
    if (one.n && r0.n) CHECK_NEAR(one.loss[0], r0.loss[0], 1e-6 * fabs(one.loss[0]));
    check_losses(&one, &r0, 0, 5e-2);
    for (int i = 0; i < r0.n && i < r1.n; i++) CHECK_STR_EQ(r0.sum[i], r1.sum[i]);
    size_t na = 0, nb = 0;
    float *a = ckpt_params(ck_one, "dsrt_ckpt_e000_i000000001.dsrt", &na);
    float *b = ckpt_params(ck_two, "dsrt_ckpt_e000_i000000001.dsrt", &nb);
    REQUIRE(a && b && na == nb);
    double diff = 0, norm = 0;
    for (size_t k = 0; k < na; k++) {
        diff += ((double)a[k] - b[k]) * ((double)a[k] - b[k]);
        norm += (double)a[k] * a[k];
    }
    double d1 = sqrt(diff / norm), d20 = weights_rel_diff("res_one", 0, "res_two", 0);
    fprintf(stderr,
            "  resnet20, 2 x 64 against 1 x 128: weights %.2e apart after the first step, %.2e "
            "after %d\n",
            d1, d20, STEPS);
    CHECK(d1 < 1e-5);
    free(a);
    free(b);
    char ck_full[4400], ck_rest[4400], from[4500];
    snprintf(ck_full, sizeof ck_full, "%s/ck_res_full", root);
    snprintf(ck_rest, sizeof ck_rest, "%s/ck_res_rest", root);
    snprintf(from, sizeof from, "%s/dsrt_ckpt_e001_i000000006.dsrt", ck_full);
    CHECK_EQ(run_worker_bn(2, "res_full", 3, NULL, ck_full, 0, 0, 64 | 16, NULL), 0);
    CHECK_EQ(run_worker_bn(2, "res_rest", 3, from, ck_rest, 0, 0, 64 | 16, NULL), 0);
    for (int rank = 0; rank < 2; rank++) {
        run_log f, r;
        read_log("res_full", rank, &f);
        read_log("res_rest", rank, &r);
        CHECK_EQ(f.n, 12);
        CHECK_EQ(r.n, 6);
        for (int i = 0; i < r.n; i++) {
            int j = (int)r.it[i] - 1;
            if (j < 0 || j >= f.n) continue;
            CHECK(f.loss[j] == r.loss[i]);
            CHECK_STR_EQ(f.sum[j], r.sum[i]);
        }
        CHECK(weights_rel_diff("res_full", rank, "res_rest", rank) == 0);
    }
}

/* A failure on one rank only (a bad image in its part of the first batch,
 * with fail_on_error): every rank fails at the same step, the other one
 * with a message that names the failing worker and the file. */
static void test_local_failure(void) {
    char bad[4400];
    snprintf(bad, sizeof bad, "%s/data/checker/010.png", root);
    REQUIRE(timg_write_file(bad, "not a png\n", 10) == 0);
    /* The data's order: batch 0 is centre (rank 0's half) then checker. */
    int st = run_worker_bn(2, "local", 10, NULL, NULL, 0, 0, 2, NULL);
    CHECK_NE(st, 0);
    char err[4400];
    snprintf(err, sizeof err, "%s/local.err", root);
    char *text = read_text(err);
    REQUIRE(text);
    CHECK_CONTAINS(text, "rank 0: train: worker 1 of 2 failed: ");
    CHECK_CONTAINS(text, "checker/010.png");
    CHECK_CONTAINS(text, "rank 1: ");
    free(text);
    run_log l0;
    read_log("local", 0, &l0);
    CHECK_EQ(l0.n, 0); /* no step was taken */
}

/* The last checkpoint in folder dir loads, at the iteration expected. */
static void check_checkpoint(const char *dir, long long want_it) {
    char path[4400];
    CHECK_OK(dsrt_checkpoint_latest(dir, path, sizeof path));
    dsrt_net *net = NULL;
    dsrt_optimizer *opt = NULL;
    dsrt_train_position pos;
    CHECK_OK(dsrt_checkpoint_load(path, &net, &opt, &pos, NULL));
    if (want_it >= 0) CHECK_EQ(pos.iteration, want_it);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

static void test_resume(void) {
    char c1[4400], c2[4400];
    snprintf(c1, sizeof c1, "%s/ckpt1", root);
    snprintf(c2, sizeof c2, "%s/ckpt2", root);
    /* Uninterrupted, 20 steps, one process. */
    CHECK_EQ(run_worker(0, "full", 10, NULL, NULL, 0, 0, NULL), 0);
    /* One process for 10 steps, then 2 ranks from its checkpoint. */
    CHECK_EQ(run_worker(0, "half1", 5, NULL, c1, 0, 0, NULL), 0);
    check_checkpoint(c1, 10);
    CHECK_EQ(run_worker(2, "rest2", 10, c1, NULL, 0, 0, NULL), 0);
    /* 2 ranks for 10 steps, then one process. */
    CHECK_EQ(run_worker(2, "half2", 5, NULL, c2, 0, 0, NULL), 0);
    check_checkpoint(c2, 10);
    CHECK_EQ(run_worker(0, "rest1", 10, c2, NULL, 0, 0, NULL), 0);
    run_log full, rest2, rest1;
    read_log("full", 0, &full);
    read_log("rest2", 0, &rest2);
    read_log("rest1", 0, &rest1);
    CHECK_EQ(rest2.n, 10);
    CHECK_EQ(rest1.n, 10);
    if (rest2.n) CHECK_EQ(rest2.it[0], 11);
    check_losses(&full, &rest2, 0, 1e-5);
    check_losses(&full, &rest1, 0, 1e-5);
    double d2 = weights_rel_diff("full", 0, "rest2", 0),
           d1 = weights_rel_diff("full", 0, "rest1", 0);
    fprintf(stderr, "  resumed: 1 -> 2 ranks %.2e, 2 ranks -> 1 %.2e relative\n", d2, d1);
    CHECK(d2 < 1e-5);
    CHECK(d1 < 1e-5);
}

/* Resumed from the checkpoint an uninterrupted 2-rank run wrote at
 * iteration 6 (mid-epoch, mid-way between averagings), 2 ranks go on bit for
 * bit as that run did, whatever the mode: the same loss and weights at
 * every step, and the same final weights on both ranks. Resumed by one
 * process, a checkpoint holding both ranks' optimizer states is taken as
 * their mean, and says so. */
static void test_resume_exact(void) {
    static const struct {
        const char *tag;
        int avg, flags;
    } modes[] = {
        {"sum", 0, 16},                /* gradients summed, SGD with momentum */
        {"avg", 4, 16 | 4},            /* averaging every 4, each rank its own momentum */
        {"avgopt", 4, 16 | 4 | 8},     /* ... with the momentum averaged too */
        {"syncbn", 0, 16 | 1},         /* sync batchnorm */
        {"avgbn", 4, 16 | 4 | 1 | 32}, /* averaging, batchnorm statistics averaged */
    };
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        char full[64], rest[64], ck_full[4400], ck_rest[4400], from[4500];
        snprintf(full, sizeof full, "%s_full", modes[m].tag);
        snprintf(rest, sizeof rest, "%s_rest", modes[m].tag);
        snprintf(ck_full, sizeof ck_full, "%s/ck_%s", root, full);
        snprintf(ck_rest, sizeof ck_rest, "%s/ck_%s", root, rest);
        /* 4 iterations an epoch: iteration 6 is the second of epoch 2. */
        snprintf(from, sizeof from, "%s/dsrt_ckpt_e001_i000000006.dsrt", ck_full);
        CHECK_EQ(run_worker_bn(2, full, 3, NULL, ck_full, modes[m].avg, 0, modes[m].flags, NULL),
                 0);
        CHECK_EQ(run_worker_bn(2, rest, 3, from, ck_rest, modes[m].avg, 0, modes[m].flags, NULL),
                 0);
        int same = 1;
        for (int rank = 0; rank < 2; rank++) {
            run_log a, b;
            read_log(full, rank, &a);
            read_log(rest, rank, &b);
            CHECK_EQ(a.n, 12);
            CHECK_EQ(b.n, 6);
            for (int i = 0; i < b.n; i++) {
                int j = (int)b.it[i] - 1;
                if (j < 0 || j >= a.n) continue;
                if (a.loss[j] != b.loss[i] || strcmp(a.sum[j], b.sum[i]) != 0) {
                    if (same)
                        fprintf(stderr,
                                "  %s, rank %d, iteration %lld: loss %.17g, weights %s resumed; "
                                "%.17g, %s uninterrupted\n",
                                modes[m].tag, rank, b.it[i], b.loss[i], b.sum[i], a.loss[j],
                                a.sum[j]);
                    same = 0;
                }
            }
            CHECK(weights_rel_diff(full, rank, rest, rank) == 0);
        }
        CHECK(same);
        fprintf(stderr, "  %-7s resumed at iteration 6: %s\n", modes[m].tag,
                same ? "bit for bit the uninterrupted run" : "DIFFERENT");
    }
    /* One process from the 2 ranks' states of the averaging run: their mean. */
    char from[4500], err[4400];
    snprintf(from, sizeof from, "%s/ck_avg_full/dsrt_ckpt_e001_i000000006.dsrt", root);
    CHECK_EQ(run_worker_bn(0, "avg_one", 3, from, NULL, 4, 0, 16 | 4, NULL), 0);
    snprintf(err, sizeof err, "%s/avg_one.err", root);
    char *text = read_text(err);
    REQUIRE(text);
    CHECK_CONTAINS(text, "rank 0: resume_states 2");
    free(text);
    run_log one;
    read_log("avg_one", 0, &one);
    CHECK_EQ(one.n, 6);
}

static void test_fault(void) {
    char c[4400], err[4400];
    snprintf(c, sizeof c, "%s/ckpt_fault", root);
    double s = 0;
    int st = run_worker(2, "fault", 10, NULL, c, 0, 7, &s);
    fprintf(stderr, "  rank 1 hung at iteration 7: the job exited with %d after %.1f s\n", st, s);
    CHECK_NE(st, 0);
    CHECK_NE(st, 124); /* ended by itself, not by the launcher's deadline */
    snprintf(err, sizeof err, "%s/fault.err", root);
    char *text = read_text(err);
    REQUIRE(text);
    CHECK_CONTAINS(text, "rank 0: ");
    CHECK_CONTAINS(text, "rank 1 not responding");
    free(text);
    /* Rank 0 went on to iteration 7's collectives; the checkpoints before
     * stay loadable, the last at iteration 6. */
    check_checkpoint(c, 6);

    /* Killed: mpirun ends the job at once and names the rank. */
    snprintf(c, sizeof c, "%s/ckpt_kill", root);
    st = run_worker(2, "kill", 10, NULL, c, 0, -7, &s);
    fprintf(stderr, "  rank 1 killed at iteration 7: the job exited with %d after %.1f s\n", st, s);
    CHECK_NE(st, 0);
    CHECK_NE(st, 124);
    snprintf(err, sizeof err, "%s/kill.err", root);
    text = read_text(err);
    REQUIRE(text);
    CHECK(strstr(text, "rank 1 not responding") || strstr(text, "rank 1 with PID"));
    free(text);
    check_checkpoint(c, 6);
}

/* The dstrain this build made, or NULL (after saying the test is skipped)
 * when there is none. */
static const char *dstrain_path(void) {
    static char path[4400];
    const char *bin = getenv("DSRT_BIN_DIR");
    snprintf(path, sizeof path, "%s/tools/dstrain", bin ? bin : ".");
    if (access(path, X_OK) == 0) return path;
    fprintf(stderr, "  no %s: skipped\n", path);
    return NULL;
}

/* The command line of dstrain train on data under mpirun with np ranks (0:
 * one process alone), digits on one compute thread, then extra (NULL-ended),
 * into args (room for 64). */
static void dstrain_argv(char **args, int np, const char *data, const char *const *extra) {
    static char nps[16];
    int k = launcher(args, np, nps);
    const char *fixed[] = {dstrain_path(), "train",     "--data", data, "--net",
                           "digits",       "--threads", "1",      NULL};
    for (int e = 0; fixed[e]; e++) args[k++] = (char *)fixed[e];
    if (np > 0) {
        args[k++] = "--execution-environment";
        args[k++] = "parallel";
    }
    for (int e = 0; extra[e] && k < 62; e++) args[k++] = (char *)extra[e];
    args[k] = NULL;
}

/* dstrain_argv's job run to its end, its output into root/TAG.out.
 * Returns the status. */
static int dstrain_job(int np, const char *tag, const char *data, const char *const *extra) {
    char out[4400], *args[64];
    snprintf(out, sizeof out, "%s/%s.out", root, tag);
    dstrain_argv(args, np, data, extra);
    return run_into(args, out, 120);
}

/* The output of dstrain_job's run TAG (malloc'd). */
static char *job_output(const char *tag) {
    char out[4400];
    snprintf(out, sizeof out, "%s/%s.out", root, tag);
    char *text = read_text(out);
    REQUIRE(text);
    return text;
}

/* dstrain under mpirun refuses bad options on every rank, before any work. */
static void test_refuse(void) {
    char data[4400];
    if (!dstrain_path()) return;
    snprintf(data, sizeof data, "%s/data", root);
    struct {
        const char *extra[4], *expect;
    } cases[] = {
        {{"--batch", "0", NULL}, "--batch: 0 is outside [1, "},
        {{"--bn-statistics", "global", NULL}, "'global' is not average or sync"},
        {{"--batch", "1", NULL}, "fewer than the 2 workers"},
        {{"--average-optimizer-state", NULL}, "goes with --averaging-frequency"},
    };
    /* Each case twice: as a user runs it (mpirun ends the job when the
     * first rank exits non-zero: the status says so), then with Open MPI
     * told to let every rank finish (the status is then 0): both ranks say
     * it. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if (pass)
                setenv("OMPI_MCA_orte_abort_on_non_zero_status", "0", 1);
            else
                unsetenv("OMPI_MCA_orte_abort_on_non_zero_status");
            int st = dstrain_job(2, "refuse", data, cases[i].extra);
            if (!pass) CHECK_NE(st, 0);
            char *text = job_output("refuse");
            int said = 0;
            for (char *p = text; (p = strstr(p, cases[i].expect)); p++) said++;
            if (said != (pass ? 2 : said ? said : 1))
                fprintf(stderr, "case %zu, pass %d: said %d times:\n%s\n", i, pass, said, text);
            if (pass)
                CHECK_EQ(said, 2);
            else
                CHECK_GE(said, 1);
            CHECK(strstr(text, "Training finished") == NULL); /* nothing trained */
            free(text);
        }
    unsetenv("OMPI_MCA_orte_abort_on_non_zero_status");
}

/* The number after "key": in JSON text, or -1. */
static long long json_number(const char *text, const char *key) {
    char k[128];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *at = strstr(text, k);
    return at ? atoll(at + strlen(k)) : -1;
}

/* A bad file counts as one, skipped as often as one process skips it,
 * whichever workers found it: in the text, the JSON and --bad-list. */
static void test_bad_counts(void) {
    char data[4400], bad[4400], list[4400];
    if (!dstrain_path()) return;
    snprintf(data, sizeof data, "%s/data", root);
    /* In the data's own order, batch 0 is centre/000..063: rank 1's share
     * is 032..063, so rank 0 never reads 040. */
    snprintf(bad, sizeof bad, "%s/centre/040.png", data);
    REQUIRE(timg_write_file(bad, "not a png\n", 10) == 0);
    const char *order[] = {"--epochs", "2", "--batch", "64", "--shuffle", "never", "--quiet", NULL};
    CHECK_EQ(dstrain_job(0, "order1", data, order), 0);
    CHECK_EQ(dstrain_job(2, "order2", data, order), 0);
    for (int np = 1; np <= 2; np++) {
        char *text = job_output(np == 1 ? "order1" : "order2");
        if (!strstr(text, "1 bad training file, skipped 2 times:"))
            fprintf(stderr, "%d process(es):\n%s\n", np, text);
        CHECK_CONTAINS(text, "1 bad training file, skipped 2 times:");
        free(text);
    }
    /* Shuffled over 4 epochs: the same counts in JSON, one line a file. */
    for (int np = 0; np <= 2; np += 2) {
        char tag[32], n[8];
        snprintf(tag, sizeof tag, "shuffled%d", np);
        snprintf(list, sizeof list, "%s/%s.jsonl", root, tag);
        snprintf(n, sizeof n, "%d", np);
        const char *opts[] = {"--epochs", "4",  "--batch",    "64", "--json",
                              "--seed",   "11", "--bad-list", list, NULL};
        CHECK_EQ(dstrain_job(np, tag, data, opts), 0);
        char *text = job_output(tag);
        CHECK_EQ(json_number(text, "bad_files_total"), 1);
        CHECK_EQ(json_number(text, "skipped"), 4);
        const char *first = strstr(text, "\"bad_files\": [");
        CHECK(first && strstr(first, "centre/040.png") &&
              !strstr(strstr(first, "040.png") + 1, "040.png"));
        free(text);
        char *lines = read_text(list);
        REQUIRE(lines);
        int count = 0;
        for (char *p = lines; (p = strchr(p, '\n')); p++) count++;
        CHECK_EQ(count, 1);
        free(lines);
    }
}

/* mpirun with one rank of dstrain train on data0 with extra0 and one on
 * data1 with extra1 (an MPMD launch), output into root/TAG.out. */
static int dstrain_pair(const char *tag, const char *data0, const char *const *extra0,
                        const char *data1, const char *const *extra1) {
    char out[4400];
    const char *dstrain = dstrain_path();
    snprintf(out, sizeof out, "%s/%s.out", root, tag);
    char *args[96];
    int k = 0;
    args[k++] = (char *)comm_test_mpirun();
    args[k++] = "--allow-run-as-root";
    args[k++] = "--oversubscribe";
    for (int r = 0; r < 2; r++) {
        if (r) args[k++] = ":";
        const char *fixed[] = {"-np",
                               "1",
                               dstrain,
                               "train",
                               "--data",
                               r ? data1 : data0,
                               "--net",
                               "digits",
                               "--threads",
                               "1",
                               "--execution-environment",
                               "parallel",
                               "--epochs",
                               "1",
                               "--drop-last",
                               "--quiet",
                               NULL};
        for (int e = 0; fixed[e]; e++) args[k++] = (char *)fixed[e];
        const char *const *extra = r ? extra1 : extra0;
        for (int e = 0; extra[e] && k < 90; e++) args[k++] = (char *)extra[e];
    }
    args[k] = NULL;
    return run_into(args, out, 120);
}

/* Workers that do not run the same job refuse at once, before any step,
 * naming the option, class or file that differs and the workers; and
 * `mpirun -np 2 dstrain train` without --execution-environment parallel is
 * refused by each process. */
static void test_agree(void) {
    char data[4400], more[4400], classes[4400], sizes[4400], path[4600];
    if (!dstrain_path()) return;
    snprintf(data, sizeof data, "%s/data", root);
    /* The same images elsewhere, with one more; with a class more; with one
     * file of another size. */
    snprintf(more, sizeof more, "%s/more", root);
    snprintf(classes, sizeof classes, "%s/classes", root);
    snprintf(sizes, sizeof sizes, "%s/sizes", root);
    make_data(more);
    make_data(classes);
    make_data(sizes);
    uint8_t px[SIDE * SIDE];
    make_image(px, 0, 4242);
    dsrt_image img = {px, SIDE, SIDE, 1, SIDE};
    snprintf(path, sizeof path, "%s/centre/064.png", more);
    REQUIRE(dsrt_png_write(path, &img) == 0);
    snprintf(path, sizeof path, "%s/dots", classes);
    REQUIRE(timg_mkdirs(path) == 0);
    snprintf(path, sizeof path, "%s/dots/000.png", classes);
    REQUIRE(dsrt_png_write(path, &img) == 0);
    snprintf(path, sizeof path, "%s/checker/005.png", sizes);
    REQUIRE(timg_write_file(path, "not a png\n", 10) == 0);
    static const char *const none[] = {NULL}, *const seed1[] = {"--seed", "1", NULL},
                             *const seed2[] = {"--seed", "2", NULL},
                             *const b64[] = {"--batch", "64", NULL},
                             *const b32[] = {"--batch", "32", NULL},
                             *const e2[] = {"--epochs", "2", NULL},
                             *const ck[] = {"--checkpoint-dir", "/tmp/dsrt-agree-ck", NULL};
    const struct {
        const char *tag, *data1;
        const char *const *extra0, *const *extra1;
        const char *expect;
    } cases[] = {
        {"seed", data, seed1, seed2, "seed is 1 on worker 0, 2 on worker 1"},
        {"batch", data, b64, b32, "batch is 64 on worker 0, 32 on worker 1"},
        {"epochs", data, none, e2, "max_epochs is 1 on worker 0, 2 on worker 1"},
        {"ckpt", data, none, ck, "checkpoint_path (given or not) is 0 on worker 0, 1 on worker 1"},
        {"count", more, none, none,
         "training data: samples is 256 on worker 0, 257 on worker 1; sample 64 is "
         "'checker/000.png'"},
        {"classes", classes, none, none,
         "training data: classes is 4 on worker 0, 5 on worker 1; class 2 is 'hstripes' on "
         "worker 0, 'dots' on worker 1"},
        {"sizes", sizes, none, none,
         "training data: files (names, sizes, labels) differ between worker 0 and worker 1; "
         "sample 69 is 'checker/005.png' (340 bytes, class 1) on worker 0, 'checker/005.png' "
         "(10 bytes, class 1) on worker 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tag[64];
        snprintf(tag, sizeof tag, "agree_%s", cases[i].tag);
        int st = dstrain_pair(tag, data, cases[i].extra0, cases[i].data1, cases[i].extra1);
        CHECK_NE(st, 0);
        CHECK_NE(st, 124);
        char *text = job_output(tag);
        int said = 0;
        for (char *p = text; (p = strstr(p, cases[i].expect)); p++) said++;
        if (said < 1) fprintf(stderr, "case %s:\n%s\n", cases[i].tag, text);
        CHECK_GE(said, 1);
        CHECK(strstr(text, "do not run the same job") != NULL);
        CHECK(strstr(text, "not responding") == NULL);
        CHECK(strstr(text, "Training finished") == NULL);
        free(text);
    }
    /* Two processes without --execution-environment parallel. */
    char out[4400], *args[64];
    snprintf(out, sizeof out, "%s/lone.out", root);
    dstrain_argv(args, 2, data, (const char *const[]){"--epochs", "1", "--quiet", NULL});
    for (int k = 0; args[k]; k++)
        if (!strcmp(args[k], "--execution-environment")) args[k + 1] = "cpu";
    CHECK_NE(run_into(args, out, 120), 0);
    char *text = read_text(out);
    REQUIRE(text);
    CHECK_CONTAINS(text, "started as one of 2 processes of an MPI job (OMPI_COMM_WORLD_SIZE=2) "
                         "without --execution-environment parallel");
    CHECK(strstr(text, "Training finished") == NULL);
    free(text);
}

/* Process pid's parent, from /proc (0 when it is gone). */
static pid_t parent_of(pid_t pid) {
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const char *paren = strrchr(text, ')');
    int ppid = 0;
    if (!paren || sscanf(paren + 1, " %*c %d", &ppid) != 1) return 0;
    return (pid_t)ppid;
}

/* The process of rank `rank` that job (mpirun's pid) started: a descendant
 * of it whose environment says OMPI_COMM_WORLD_RANK=rank. 0 when none. */
static pid_t rank_pid(pid_t job, int rank) {
    char want[64];
    int wl = snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank) + 1;
    DIR *d = opendir("/proc");
    pid_t found = 0;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0 || pid == job) continue;
        pid_t up = pid;
        for (int depth = 0; depth < 8 && up > 1 && up != job; depth++) up = parent_of(up);
        if (up != job) continue;
        char path[64];
        static char env[1 << 16]; /* NUL-separated NAME=VALUE */
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        FILE *f = fopen(path, "rb");
        size_t len = f ? fread(env, 1, sizeof env - 1, f) : 0;
        if (f) fclose(f);
        env[len] = 0;
        for (size_t at = 0; at < len; at += strlen(env + at) + 1)
            if (!memcmp(env + at, want, (size_t)wl)) found = pid;
    }
    if (d) closedir(d);
    return found;
}

/* A signal to worker 1 alone ends the job as it would worker 0's: every
 * rank stops after the step and exits 128 + the signal, and worker 0 says
 * what it kept. */
static void test_signal(void) {
    char data[4400], out[4400], ck[4400], save[4400];
    if (!dstrain_path()) return;
    snprintf(data, sizeof data, "%s/data", root);
    const int sigs[] = {SIGTERM, SIGINT};
    for (int k = 0; k < 2; k++) {
        snprintf(out, sizeof out, "%s/signal%d.out", root, k);
        snprintf(ck, sizeof ck, "%s/signal%d-ck", root, k);
        snprintf(save, sizeof save, "%s/signal%d.dsrt", root, k);
        char *args[64];
        dstrain_argv(args, 2, data,
                     (const char *const[]){"--epochs", "100000", "--batch", "64", "--json",
                                           "--checkpoint-dir", ck, "--save", save, NULL});
        fflush(stderr);
        pid_t job = fork();
        REQUIRE(job >= 0);
        if (job == 0) {
            int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
            execv(args[0], args);
            _exit(127);
        }
        /* Training has begun on both ranks once worker 0 tells the start
         * and the first checkpoint is on disk: a signal that came before a
         * worker reached the start would stop the run before its first
         * step, with nothing trained to keep. The job trains for ever
         * unless stopped. */
        int started = 0, st = 0, ended = 0;
        while (!started && !(ended = waitpid(job, &st, WNOHANG) == job)) {
            char *text = read_text(out), latest[4400];
            started = text && strstr(text, "\"event\": \"start\"") &&
                      dsrt_checkpoint_latest(ck, latest, sizeof latest) == 0;
            free(text);
            usleep(20000);
        }
        CHECK(started);
        pid_t r1 = started ? rank_pid(job, 1) : 0;
        CHECK(r1 > 0);
        if (r1 > 0) kill(r1, sigs[k]);
        /* A guard against a hang only: the job ends by itself. */
        for (int t = 0; !ended && t < 12000; t++) {
            ended = waitpid(job, &st, WNOHANG) == job;
            if (!ended) usleep(10000);
        }
        if (!ended) {
            kill(job, SIGKILL);
            waitpid(job, &st, 0);
        }
        CHECK(ended);
        char *text = read_text(out);
        REQUIRE(text);
        int status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (status != 128 + sigs[k]) fprintf(stderr, "exit %d:\n%s\n", status, text);
        CHECK_EQ(status, 128 + sigs[k]);
        char want[128];
        snprintf(want, sizeof want, "interrupted by %s to worker 1; kept the checkpoint ",
                 sigs[k] == SIGTERM ? "SIGTERM" : "SIGINT");
        CHECK_CONTAINS(text, want);
        CHECK_CONTAINS(text, " and the model ");
        free(text);
        dsrt_net *net = NULL;
        CHECK_OK(dsrt_model_load(&net, save, NULL));
        dsrt_net_destroy(net);
        check_checkpoint(ck, -1);
    }
}

/* Bad files skipped wherever they fall: worker 0, the only one that
 * writes, names every worker's in --bad-list, and the run succeeds. */
static void test_bad_named(void) {
    char data[4400], list[4400], bad[8][4400];
    if (!dstrain_path()) return;
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(list, sizeof list, "%s/bad.jsonl", root);
    /* Eight files of every class: each worker's share of the epoch holds
     * some of them whatever the order. */
    for (int i = 0; i < 8; i++) {
        snprintf(bad[i], sizeof bad[i], "%s/%s/%03d.png", data, CLASSES[i % 4], 3 + 7 * i);
        REQUIRE(timg_write_file(bad[i], "not a png\n", 10) == 0);
    }
    int st = dstrain_job(2, "bad_named", data,
                         (const char *const[]){"--epochs", "1", "--batch", "64", "--quiet",
                                               "--bad-list", list, NULL});
    char *log = job_output("bad_named");
    if (st != 0) fprintf(stderr, "dstrain exited %d:\n%s\n", st, log);
    CHECK_EQ(st, 0);
    free(log);
    char *text = read_text(list);
    REQUIRE(text);
    for (int i = 0; i < 8; i++) {
        char *at = strstr(text, bad[i]);
        if (!at) fprintf(stderr, "%s not named in %s:\n%s\n", bad[i], list, text);
        CHECK(at != NULL);
        CHECK(at && !strstr(at + 1, bad[i])); /* once */
    }
    free(text);
}

// ----------------------------------------------------------------------------
// Python's ranks against dstrain's workers; --resume auto under mpirun

/* The Python module's Pipeline(rank=r, world_size=2) delivers each epoch
 * the samples dstrain's worker r trains on under mpirun (its --order-log),
 * batch for batch: 256 samples, a global batch of 48 (24 a rank; the last
 * batch of 16 splits 8 and 8), 2 epochs. */
static const char RANKS_PY[] =
    "import sys\n"
    "try:\n"
    "    import numpy as np\n"
    "    import dsrt\n"
    "except ImportError as e:\n"
    "    print('skipped:', e)\n"
    "    sys.exit(77)\n"
    "data, world, batch, seed, epochs, out = sys.argv[1:7]\n"
    "ds = dsrt.Datastore(data)\n"
    "for r in range(int(world)):\n"
    "    with dsrt.Pipeline(ds, preset='32', batch=int(batch), rank=r, world_size=int(world),\n"
    "                       seed=int(seed), epochs=int(epochs), workers=1) as p, \\\n"
    "            open(f'{out}.{r}', 'w') as f:\n"
    "        for e in range(int(epochs)):\n"
    "            for b in p:\n"
    "                ids = ''.join(f' {i}' for i in np.from_dlpack(b.ids))\n"
    "                f.write(f'{b.epoch} {b.index}:{ids}\\n')\n";

static void test_python_ranks(void) {
    char data[4400], log[4400], py[4400], script[4400], out[4400], a[4600], b[4600];
    if (!dstrain_path()) return;
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(log, sizeof log, "%s/order", root);
    int st = dstrain_job(2, "python_ranks", data,
                         (const char *const[]){"--epochs", "2", "--batch", "48", "--seed", "3",
                                               "--quiet", "--order-log", log, NULL});
    char *text = job_output("python_ranks");
    if (st != 0) fprintf(stderr, "dstrain exited %d:\n%s\n", st, text);
    free(text);
    CHECK_EQ(st, 0);
    snprintf(script, sizeof script, "%s/ranks.py", root);
    REQUIRE(timg_write_file(script, RANKS_PY, sizeof RANKS_PY - 1) == 0);
    snprintf(py, sizeof py, "%s/py", root);
    const char *python = getenv("DSRT_PYTHON");
    char *args[] = {(char *)(python && *python ? python : "python3"),
                    script,
                    data,
                    "2",
                    "24",
                    "3",
                    "2",
                    py,
                    NULL};
    snprintf(out, sizeof out, "%s/python_ranks.py.out", root);
    st = run_into(args, out, 120);
    text = read_text(out);
    if (st == 77) {
        fprintf(stderr, "  python part skipped: %s\n", text ? text : "");
        free(text);
        return;
    }
    if (st != 0) fprintf(stderr, "python exited %d:\n%s\n", st, text ? text : "");
    free(text);
    CHECK_EQ(st, 0);
    for (int r = 0; r < 2; r++) {
        snprintf(a, sizeof a, "%s.%d", log, r);
        snprintf(b, sizeof b, "%s.%d", py, r);
        char *ta = read_text(a), *tb = read_text(b);
        REQUIRE(ta && tb);
        int lines = 0;
        for (const char *c = ta; *c; c++) lines += *c == '\n';
        CHECK_EQ(lines, 12); /* 6 batches an epoch, 2 epochs */
        if (strcmp(ta, tb) != 0) fprintf(stderr, "rank %d: dstrain:\n%s\npython:\n%s\n", r, ta, tb);
        CHECK(strcmp(ta, tb) == 0);
        free(ta);
        free(tb);
    }
}

/* The weights_checksum of a dstrain --json summary, "" when none. */
static void json_checksum(const char *text, char *sum, size_t cap) {
    const char *w = strstr(text ? text : "", "\"weights_checksum\": \"");
    sum[0] = '\0';
    if (w) snprintf(sum, cap, "%.16s", w + strlen("\"weights_checksum\": \""));
}

/* dstrain --resume auto under mpirun: 2 workers start afresh, then the same
 * command for 2 epochs resumes the newest checkpoint and ends with the
 * weights of an uninterrupted 2-epoch run; with the newest cut short both
 * workers pass over it and resume the one before. */
static void test_resume_auto(void) {
    char data[4400], ck[4400], a[4600], full[32], sum[32];
    if (!dstrain_path()) return;
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(ck, sizeof ck, "%s/auto", root);
    int st = dstrain_job(
        2, "auto_full", data,
        (const char *const[]){"--epochs", "2", "--batch", "64", "--json", "--quiet", NULL});
    char *text = job_output("auto_full");
    CHECK_EQ(st, 0);
    json_checksum(text, full, sizeof full);
    free(text);
    CHECK(full[0]);
#define AUTO_EXTRA(epochs)                                                                         \
    (const char *const[]){"--epochs",                                                              \
                          epochs,                                                                  \
                          "--batch",                                                               \
                          "64",                                                                    \
                          "--json",                                                                \
                          "--quiet",                                                               \
                          "--checkpoint-dir",                                                      \
                          ck,                                                                      \
                          "--checkpoint-unit",                                                     \
                          "iteration",                                                             \
                          "--checkpoint-frequency",                                                \
                          "3",                                                                     \
                          "--resume",                                                              \
                          "auto",                                                                  \
                          NULL}
    st = dstrain_job(2, "auto_1", data, AUTO_EXTRA("1"));
    text = job_output("auto_1");
    if (st != 0) fprintf(stderr, "%s\n", text);
    CHECK_EQ(st, 0);
    CHECK(strstr(text, "starting afresh") != NULL);
    free(text);
    /* Iterations 3 and 4 (the end of epoch 1) are there; 4 cut short. */
    snprintf(a, sizeof a, "%s/dsrt_ckpt_e001_i000000004.dsrt", ck);
    struct stat sb;
    REQUIRE(stat(a, &sb) == 0);
    REQUIRE(truncate(a, sb.st_size / 2) == 0);
    st = dstrain_job(2, "auto_2", data, AUTO_EXTRA("2"));
    text = job_output("auto_2");
    if (st != 0) fprintf(stderr, "%s\n", text);
    CHECK_EQ(st, 0);
    CHECK(strstr(text, "passing over") && strstr(text, "dsrt_ckpt_e001_i000000004.dsrt"));
    CHECK(strstr(text, "resuming from") && strstr(text, "dsrt_ckpt_e000_i000000003.dsrt"));
    json_checksum(text, sum, sizeof sum);
    free(text);
    CHECK(strcmp(sum, full) == 0);
#undef AUTO_EXTRA
}

// ----------------------------------------------------------------------------
// Elastic resume: a checkpoint of 2 workers resumed on 1 and on 3

/* Reads an --order-log file: the ids of batch `index` of `epoch` appended
 * to ids (n their count so far); 0 when the line is not there. */
static int order_line(const char *path, int epoch, int index, uint32_t *ids, size_t *n,
                      size_t cap) {
    char *text = read_text(path);
    if (!text) return 0;
    char head[32];
    snprintf(head, sizeof head, "%d %d:", epoch, index);
    int found = 0;
    for (char *line = text; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (!strncmp(line, head, strlen(head))) {
            found = 1;
            for (char *c = line + strlen(head); *c && *n < cap;) {
                char *end;
                unsigned long v = strtoul(c, &end, 10);
                if (end == c) break;
                ids[(*n)++] = (uint32_t)v;
                c = end;
            }
        }
        line = next;
    }
    free(text);
    return found;
}

/* The samples of batch (epoch, index) over the logs of `world` workers
 * (LOG.RANK; LOG alone for one), rank after rank. */
static size_t batch_ids(const char *log, int world, int epoch, int index, uint32_t *ids,
                        size_t cap) {
    size_t n = 0;
    char path[4500];
    for (int r = 0; r < world; r++) {
        if (world > 1)
            snprintf(path, sizeof path, "%s.%d", log, r);
        else
            snprintf(path, sizeof path, "%s", log);
        CHECK(order_line(path, epoch, index, ids, &n, cap));
    }
    return n;
}

/* dstrain on 2 workers writes a checkpoint mid-epoch (iteration 9: batch 3
 * of epoch 1, of 6); resumed on 1 worker and on 3, each trains the rest of
 * that epoch on the batches the 2 would have made (--order-log: the same
 * samples, in the same order, striped over the new workers), so over both
 * runs every sample of the epoch is trained on exactly once; the run says
 * it was resumed from 2 workers. */
static void test_elastic(void) {
    char data[4400], ck[4400], log[4400], from[4600];
    if (!dstrain_path()) return;
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(ck, sizeof ck, "%s/elastic", root);
    snprintf(log, sizeof log, "%s/elastic_order", root);
    int st = dstrain_job(2, "elastic_full", data,
                         (const char *const[]){"--epochs", "2", "--batch", "48", "--seed", "3",
                                               "--quiet", "--order-log", log, "--checkpoint-dir",
                                               ck, "--checkpoint-unit", "iteration",
                                               "--checkpoint-frequency", "3", NULL});
    char *text = job_output("elastic_full");
    if (st != 0) fprintf(stderr, "dstrain exited %d:\n%s\n", st, text);
    free(text);
    REQUIRE(st == 0);
    snprintf(from, sizeof from, "%s/dsrt_ckpt_e001_i000000009.dsrt", ck);
    for (int world = 1; world <= 3; world += 2) {
        char tag[32], rlog[4500];
        snprintf(tag, sizeof tag, "elastic_on%d", world);
        snprintf(rlog, sizeof rlog, "%s_%d", log, world);
        st = dstrain_job(world == 1 ? 0 : world, tag, data,
                         (const char *const[]){"--epochs", "2", "--batch", "48", "--seed", "3",
                                               "--order-log", rlog, "--resume", from,
                                               world == 1 ? "--json" : "--quiet", NULL});
        text = job_output(tag);
        if (st != 0) fprintf(stderr, "dstrain on %d exited %d:\n%s\n", world, st, text);
        CHECK_EQ(st, 0);
        if (world == 1)
            CHECK_CONTAINS(text, "\"resume_workers\": 2");
        else
            CHECK_CONTAINS(text, "Resumed from a checkpoint of 2 workers on 3");
        free(text);
        uint8_t seen[4 * PER_CLASS] = {0};
        uint32_t a[64], b[64];
        int same = 1;
        for (int index = 0; index < 6; index++) {
            size_t na = batch_ids(log, 2, 1, index, a, 64);
            size_t nb = index < 3 ? 0 : batch_ids(rlog, world, 1, index, b, 64);
            if (index >= 3) same &= na == nb && !memcmp(a, b, na * sizeof a[0]);
            const uint32_t *use = index < 3 ? a : b;
            for (size_t i = 0; i < (index < 3 ? na : nb); i++)
                if (use[i] < 4 * PER_CLASS) seen[use[i]]++;
        }
        int once = 1;
        for (int i = 0; i < 4 * PER_CLASS; i++) once &= seen[i] == 1;
        CHECK(same);
        CHECK(once);
        fprintf(stderr, "  2 workers stopped at epoch 1 batch 3, resumed on %d: %s, %s\n", world,
                same ? "the same batches" : "OTHER BATCHES",
                once ? "each sample of the epoch once" : "SAMPLES MISSED OR REPEATED");
    }
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--worker")) return worker(argc, argv);
    const char *which = argc >= 2 ? argv[1] : "equal";
    if (dsrt_comm_available(DSRT_COMM_MPI) != 0) {
        fprintf(stderr, "skipped: %s\n", dsrt_last_error());
        return TEST_SKIP;
    }
    if (!comm_test_mpirun()) {
        fprintf(stderr, "skipped: no mpirun on PATH (install openmpi-bin)\n");
        return TEST_SKIP;
    }
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    REQUIRE(len > 0);
    self[len] = 0;
    char name[64];
    snprintf(name, sizeof name, "mpi_train_%s", which);
    REQUIRE(timg_tmpdir(name, root, sizeof root) == 0);
    char data[4400];
    snprintf(data, sizeof data, "%s/data", root);
    make_data(data);
    comm_test_env(); /* one thread a rank; under ASan, what tests/lsan.supp needs */
    if (!strcmp(which, "equal"))
        RUN(test_equal);
    else if (!strcmp(which, "resume"))
        RUN(test_resume);
    else if (!strcmp(which, "resume_exact"))
        RUN(test_resume_exact);
    else if (!strcmp(which, "sync_bn"))
        RUN(test_sync_bn);
    else if (!strcmp(which, "resnet"))
        RUN(test_resnet);
    else if (!strcmp(which, "local_failure"))
        RUN(test_local_failure);
    else if (!strcmp(which, "fault"))
        RUN(test_fault);
    else if (!strcmp(which, "refuse"))
        RUN(test_refuse);
    else if (!strcmp(which, "bad_named"))
        RUN(test_bad_named);
    else if (!strcmp(which, "signal"))
        RUN(test_signal);
    else if (!strcmp(which, "bad_counts"))
        RUN(test_bad_counts);
    else if (!strcmp(which, "agree"))
        RUN(test_agree);
    else if (!strcmp(which, "python_ranks"))
        RUN(test_python_ranks);
    else if (!strcmp(which, "resume_auto"))
        RUN(test_resume_auto);
    else if (!strcmp(which, "elastic"))
        RUN(test_elastic);
    else {
        fprintf(
            stderr,
            "mpi_train: no case '%s' (equal, sync_bn, resnet, resume, resume_exact, local_failure, "
            "fault, refuse, bad_named, bad_counts, agree, signal, python_ranks, "
            "resume_auto, elastic)\n",
            which);
        return 2;
    }
    return TEST_RESULT();
}

/*
 * Tests of the training loop (dsrt_train), evaluation, transfer learning and
 * the progress plot, on small folders of PNG images generated here: four
 * classes of clearly different 16x16 gray patterns (horizontal stripes,
 * vertical stripes, a bright centre, a checkerboard) with noise.
 *
 * - the loop learns them to near 100% and reports every event once;
 * - a run resumed from a checkpoint, mid-epoch or from a folder's latest,
 *   ends with the weights of the uninterrupted run, bit for bit;
 * - a non-finite loss stops the run with DSRT_ENAN and leaves every
 *   checkpoint loadable;
 * - a child process killed at random moments while it writes a checkpoint
 *   every iteration leaves every complete checkpoint loadable;
 * - transfer learning keeps frozen layers bit-identical and sizes the new
 *   fully connected layer for the new class count;
 * - bad options are refused before any work starts;
 * - a job is launched as dstrain launches it: the launcher's local rank and
 *   job size read from the environment, a process started as one of several
 *   without data parallelism refused, resume "auto" choosing the newest
 *   complete checkpoint and passing over the broken ones.
 */
#include "nn/internal.h"
#include "task.h"
#include "testimg.h"

#include <dsrt.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <zlib.h>

#define SIDE      16
#define PER_CLASS 48
#define VAL_CLASS 12

static const char NET[] = "input size=16x16x1\n"
                          "conv name=conv1 filters=8 size=3 pad=1\n"
                          "batchnorm name=bn1\n"
                          "relu name=relu1\n"
                          "maxpool name=pool1 size=2 stride=2\n"
                          "fc name=fc1 outputs=16\n"
                          "relu name=relu2\n"
                          "fc name=fc2 outputs=classes\n"
                          "softmax name=output\n";

/* In folder (class index) order; make_image draws pattern k for class k. */
static const char *const CLASSES[] = {"centre", "checker", "hstripes", "vstripes"};

static char root[4096], train_dir[4200], val_dir[4200], two_dir[4200];

// ----------------------------------------------------------------------------
// Data

static void make_image(uint8_t *px, int cls, uint32_t seed) {
    int phase = (int)(timg_hash(seed) % 4);
    for (int y = 0; y < SIDE; y++)
        for (int x = 0; x < SIDE; x++) {
            int v;
            switch (cls) {
            case 0: {
                int dx = x - SIDE / 2 + phase / 2, dy = y - SIDE / 2;
                v = dx * dx + dy * dy < 20 ? 220 : 40;
                break;
            }
            case 1:
                v = (((x + phase) / 2 + y / 2) % 2) ? 200 : 50;
                break;
            case 2:
                v = ((y + phase) / 2 % 2) ? 210 : 40;
                break;
            default:
                v = ((x + phase) / 2 % 2) ? 210 : 40;
                break;
            }
            int noise = (int)(timg_hash(seed * 977u + (uint32_t)(y * SIDE + x)) % 41) - 20;
            v += noise;
            px[y * SIDE + x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
}

static void make_folder(const char *dir, const int *classes, int nclasses, int per, uint32_t seed) {
    uint8_t px[SIDE * SIDE];
    for (int k = 0; k < nclasses; k++) {
        char sub[4400];
        snprintf(sub, sizeof sub, "%s/%s", dir, CLASSES[classes[k]]);
        REQUIRE(timg_mkdirs(sub) == 0);
        for (int i = 0; i < per; i++) {
            make_image(px, classes[k], seed + (uint32_t)(k * 1000 + i));
            char path[4500];
            snprintf(path, sizeof path, "%s/%03d.png", sub, i);
            dsrt_image img = {px, SIDE, SIDE, 1, SIDE};
            REQUIRE(dsrt_png_write(path, &img) == 0);
        }
    }
}

static dsrt_datastore *open_ds(const char *dir) {
    dsrt_datastore *ds = NULL;
    CHECK_OK(dsrt_datastore_open(&ds, dir, NULL));
    REQUIRE(ds);
    return ds;
}

static dsrt_net *make_net(const dsrt_datastore *ds, uint64_t seed) {
    char *desc = dsrt_describe_datastore_classes(NET, ds);
    REQUIRE(desc);
    dsrt_net_options no = dsrt_net_defaults();
    no.seed = seed;
    dsrt_net *net = NULL;
    CHECK_OK(dsrt_net_create(&net, desc, 0, 0, 0, (int)dsrt_datastore_num_classes(ds), &no));
    free(desc);
    REQUIRE(net);
    return net;
}

static dsrt_train_options base_options(void) {
    dsrt_train_options o = dsrt_train_defaults();
    o.max_epochs = 3;
    o.batch = 32;
    o.optimizer.learn_rate = 0.05;
    o.seed = 7;
    o.compute_threads = 2; /* the same in every run: the sums are ordered by it */
    o.workers = 1;
    return o;
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    size_t ls = strlen(suffix);
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l > ls && !strcmp(e->d_name + l - ls, suffix) && !strncmp(e->d_name, "dsrt_ckpt_", 10))
            n++;
    }
    closedir(d);
    return n;
}

/* Every complete checkpoint in dir loads, with finite weights. Returns how
 * many there are. */
static int check_checkpoints(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".dsrt") != 0) continue;
        char path[4600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        dsrt_net *net = NULL;
        dsrt_optimizer *opt = NULL;
        dsrt_train_position pos;
        int rc = dsrt_checkpoint_load(path, &net, &opt, &pos, NULL);
        if (rc) fprintf(stderr, "checkpoint %s: %s\n", path, dsrt_last_error());
        CHECK_OK(rc);
        if (!rc) {
            size_t np;
            const float *w = dsrt_net_params(net, &np);
            int finite = 1;
            for (size_t i = 0; i < np; i++) finite &= isfinite(w[i]) != 0;
            CHECK(finite);
            if (!strncmp(e->d_name, "dsrt_ckpt_", 10)) CHECK(opt != NULL);
            n++;
        }
        dsrt_optimizer_destroy(opt);
        dsrt_net_destroy(net);
    }
    closedir(d);
    return n;
}

// ----------------------------------------------------------------------------
// Events

typedef struct {
    int start, end, iterations, validations, epochs, checkpoints;
    int64_t last_iteration;
    int order_ok;
    int64_t stop_at; /* ask to stop after this iteration (0: never) */
    int bad[2];      /* BAD_SAMPLE events: training data, validation data */
    int bad_ok;      /* every one had a path, a reason and an empty file's code */
    dsrt_train_history *hist;
} counter;

static int count_events(void *ctx, const dsrt_train_event *e) {
    counter *c = ctx;
    if (c->hist) dsrt_train_history_add(c->hist, e);
    switch (e->kind) {
    case DSRT_EVENT_START:
        c->start++;
        break;
    case DSRT_EVENT_ITERATION:
        if (e->iteration != c->last_iteration + 1 && c->iterations) c->order_ok = 0;
        c->last_iteration = e->iteration;
        c->iterations++;
        if (!(e->loss >= 0) || !(e->accuracy >= 0 && e->accuracy <= 1)) c->order_ok = 0;
        if (e->batch_in_epoch != (e->iteration - 1) % e->iterations_per_epoch + 1 ||
            e->epoch != (e->iteration - 1) / e->iterations_per_epoch + 1)
            c->order_ok = 0;
        break;
    case DSRT_EVENT_VALIDATION:
        c->validations++;
        if (!(e->val_accuracy >= 0 && e->val_accuracy <= 1)) c->order_ok = 0;
        break;
    case DSRT_EVENT_EPOCH:
        c->epochs++;
        break;
    case DSRT_EVENT_CHECKPOINT:
        c->checkpoints++;
        break;
    case DSRT_EVENT_END:
        c->end++;
        break;
    case DSRT_EVENT_BAD_SAMPLE:
        c->bad[e->validation != 0]++;
        if (!e->bad_sample || !e->bad_sample->path || e->bad_sample->code != DSRT_EEMPTY ||
            strcmp(e->bad_sample->error, "read: empty file") != 0)
            c->bad_ok = 0;
        break;
    }
    return c->stop_at && e->kind == DSRT_EVENT_ITERATION && e->iteration >= c->stop_at;
}

// ----------------------------------------------------------------------------
// Cases

static void test_learns(void) {
    dsrt_datastore *train = open_ds(train_dir), *val = open_ds(val_dir);
    dsrt_net *net = make_net(train, 1);
    dsrt_train_options o = base_options();
    o.max_epochs = 8;
    o.validation = val;
    o.augment.rand_x_reflection = 1;
    counter c = {.order_ok = 1};
    CHECK_OK(dsrt_train_history_create(&c.hist));
    o.callback = count_events;
    o.callback_ctx = &c;
    dsrt_train_result r;
    CHECK_OK(dsrt_train(net, train, &o, &r));
    CHECK_EQ(r.stop, DSRT_STOP_MAX_EPOCHS);
    CHECK_EQ(r.epochs, 8);
    CHECK_EQ(r.iterations, 8 * 6);
    CHECK_EQ(r.images, 8 * 4 * PER_CLASS);
    CHECK_GE(r.val_accuracy, 0.95);
    CHECK_GE(r.accuracy, 0.9);
    CHECK(r.images_per_s > 0 && r.train_s > 0);
    CHECK_EQ(r.workers, 1);
    CHECK_EQ(r.compute_threads, 2);
    CHECK_EQ(r.weights_checksum, dsrt_weights_checksum(net));
    CHECK_EQ(c.start, 1);
    CHECK_EQ(c.end, 1);
    CHECK_EQ(c.iterations, 48);
    CHECK_EQ(c.epochs, 8);
    CHECK_EQ(c.validations, 8);
    CHECK_EQ(c.checkpoints, 0);
    CHECK(c.order_ok);

    /* Evaluation agrees with the last validation. */
    dsrt_eval_result er;
    dsrt_eval_options eo = dsrt_eval_defaults();
    eo.batch = 20;
    CHECK_OK(dsrt_evaluate(net, val, &eo, &er));
    CHECK_EQ(er.images, 4 * VAL_CLASS);
    CHECK_NEAR(er.accuracy, r.val_accuracy, 1e-9);
    uint64_t sum = 0, diag = 0;
    for (int t = 0; t < er.classes * er.classes; t++) sum += er.confusion[t];
    for (int t = 0; t < er.classes; t++) diag += er.confusion[t * er.classes + t];
    CHECK_EQ(sum, er.images);
    CHECK_EQ(diag, er.correct);
    dsrt_eval_result_free(&er);

    /* A folder with two of the classes is matched by name. */
    dsrt_datastore *two = open_ds(two_dir);
    CHECK_OK(dsrt_evaluate(net, two, &eo, &er));
    CHECK_EQ(er.classes, 4);
    CHECK_GE(er.accuracy, 0.9);
    CHECK_EQ(er.confusion[1 * 4 + 0] + er.confusion[1 * 4 + 1] + er.confusion[1 * 4 + 2] +
                 er.confusion[1 * 4 + 3],
             0); /* no "checker" images in it */
    dsrt_eval_result_free(&er);
    dsrt_datastore_close(two);

    /* The class names travel in the description, and through a model file. */
    char name[64], path[4300];
    CHECK_EQ(dsrt_net_class_name(net, 2, name, sizeof name), 8);
    CHECK_STR_EQ(name, "hstripes");
    CHECK_EQ(dsrt_net_class_name(net, 4, name, sizeof name), -ENOENT);
    snprintf(path, sizeof path, "%s/learned.dsrt", root);
    CHECK_OK(dsrt_model_save(path, net));
    dsrt_net *back = NULL;
    CHECK_OK(dsrt_model_load(&back, path, NULL));
    if (back) {
        CHECK_EQ(dsrt_net_class_name(back, 3, name, sizeof name), 8);
        CHECK_STR_EQ(name, "vstripes");
        CHECK_EQ(dsrt_weights_checksum(back), r.weights_checksum);
    }
    dsrt_net_destroy(back);

    /* The plot. */
    snprintf(path, sizeof path, "%s/progress.svg", root);
    CHECK_OK(dsrt_train_history_svg(c.hist, path, "test <plot>"));
    uint8_t *svg;
    size_t size;
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    svg = malloc(1 << 20);
    size = fread(svg, 1, (1 << 20) - 1, f);
    svg[size] = 0;
    fclose(f);
    CHECK(strncmp((char *)svg, "<?xml", 5) == 0);
    CHECK(strstr((char *)svg, "<polyline") != NULL);
    CHECK(strstr((char *)svg, "test &lt;plot&gt;") != NULL);
    CHECK(strstr((char *)svg, "</svg>") != NULL);
    free(svg);
    dsrt_train_history_destroy(c.hist);
    dsrt_net_destroy(net);
    dsrt_datastore_close(val);
    dsrt_datastore_close(train);
}

/* A folder of per images a class, every other one (in file order) empty;
 * returns how many are empty. */
static int empty_every_other(const char *to, const int *classes, int n, int per, uint32_t seed) {
    make_folder(to, classes, n, per, seed);
    int emptied = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < per; i += 2) {
            char path[4600];
            snprintf(path, sizeof path, "%s/%s/%03d.png", to, CLASSES[classes[k]], i);
            REQUIRE(timg_write_file(path, "", 0) == 0);
            emptied++;
        }
    return emptied;
}

/* Bad samples are counted once each and never stand in for another:
 * evaluation and validation visit each readable sample exactly once, and
 * every bad one is told (BAD_SAMPLE) with its path and reason. */
static void test_bad_samples(void) {
    char half[4400], tbad[4400];
    snprintf(half, sizeof half, "%s/data/half", root);
    snprintf(tbad, sizeof tbad, "%s/data/trainbad", root);
    const int all[] = {0, 1, 2, 3};
    int nhalf = empty_every_other(half, all, 4, 25, 70001);
    CHECK_EQ(nhalf, 4 * 13);
    dsrt_datastore *train = open_ds(train_dir), *val = open_ds(half);
    REQUIRE(dsrt_datastore_count(val) == 100);
    dsrt_net *net = make_net(train, 3);

    dsrt_eval_result er;
    dsrt_eval_options eo = dsrt_eval_defaults();
    eo.batch = 16;
    CHECK_OK(dsrt_evaluate(net, val, &eo, &er));
    CHECK_EQ(er.images, 100 - nhalf);
    CHECK_EQ(er.bad_samples, nhalf);
    CHECK_EQ(er.skipped, nhalf);
    uint64_t sum = 0;
    for (int t = 0; t < er.classes * er.classes; t++) sum += er.confusion[t];
    CHECK_EQ(sum, er.images);
    int named = 0;
    for (uint64_t i = 0; i < er.bad_samples; i++) {
        named += er.bad[i].path && strstr(er.bad[i].path, half) == er.bad[i].path;
        CHECK_EQ(er.bad[i].code, DSRT_EEMPTY);
        CHECK_STR_EQ(er.bad[i].error, "read: empty file");
    }
    CHECK_EQ(named, nhalf);
    dsrt_eval_result_free(&er);
    CHECK(er.bad == NULL);

    /* Training data with bad files too: each told once, in training and
     * validation alike, however many epochs and passes. */
    int ntrain = empty_every_other(tbad, all, 4, 6, 80001);
    dsrt_datastore *tb = open_ds(tbad);
    dsrt_net_destroy(net);
    net = make_net(tb, 3);
    dsrt_train_options o = base_options();
    o.max_epochs = 2;
    o.batch = 4;
    o.validation = val;
    o.validation_batch = 16;
    counter c = {.order_ok = 1, .bad_ok = 1};
    o.callback = count_events;
    o.callback_ctx = &c;
    dsrt_train_result r;
    CHECK_OK(dsrt_train(net, tb, &o, &r));
    CHECK_EQ(c.validations, 2);
    CHECK_EQ(c.bad[1], nhalf);
    CHECK_EQ(c.bad[0], ntrain);
    CHECK(c.bad_ok);
    CHECK_EQ(r.val_bad_samples, nhalf);
    CHECK_EQ(r.val_skipped, 2 * nhalf);
    CHECK_EQ(r.bad_samples, ntrain);
    CHECK_GE(r.skipped, 2 * ntrain);
    /* The last validation saw what an evaluation of the same net sees. */
    CHECK_OK(dsrt_evaluate(net, val, &eo, &er));
    CHECK_NEAR(r.val_accuracy, er.accuracy, 1e-12);
    CHECK_EQ(er.images, 100 - nhalf);
    dsrt_eval_result_free(&er);
    dsrt_datastore_close(tb);
    dsrt_net_destroy(net);
    dsrt_datastore_close(val);
    dsrt_datastore_close(train);
}

static void test_resume(void) {
    dsrt_datastore *train = open_ds(train_dir), *val = open_ds(val_dir);
    dsrt_train_options o = base_options();
    o.augment.rand_x_reflection = 1;
    o.augment.rand_x_translation[0] = -2;
    o.augment.rand_x_translation[1] = 2;
    o.validation = val;
    o.validation_frequency = 5;
    o.output_network = DSRT_OUTPUT_BEST_VALIDATION;

    /* Uninterrupted. */
    dsrt_net *a = make_net(train, 3);
    dsrt_train_result ra;
    CHECK_OK(dsrt_train(a, train, &o, &ra));
    CHECK_EQ(ra.iterations, 18);

    /* Checkpoints every 4 iterations, stopped after iteration 9 (mid-epoch 2). */
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/resume", root);
    dsrt_net *b = make_net(train, 3);
    dsrt_train_options ob = o;
    counter c = {.order_ok = 1, .stop_at = 9};
    ob.checkpoint_path = dir;
    ob.checkpoint_unit = DSRT_UNIT_ITERATION;
    ob.checkpoint_frequency = 4;
    ob.callback = count_events;
    ob.callback_ctx = &c;
    dsrt_train_result rb;
    CHECK_OK(dsrt_train(b, train, &ob, &rb));
    CHECK_EQ(rb.stop, DSRT_STOP_CALLBACK);
    CHECK_EQ(rb.iterations, 9);
    CHECK_EQ(c.checkpoints, 3); /* 4, 8 and the last, 9 */
    CHECK_EQ(count_files(dir, ".dsrt"), 3);
    CHECK_EQ(count_files(dir, ".state"), 3);

    /* Resumed from the mid-epoch checkpoint at 8 and from the folder (9). */
    char path[4400];
    snprintf(path, sizeof path, "%s/dsrt_ckpt_e001_i000000008.dsrt", dir);
    for (int k = 0; k < 2; k++) {
        dsrt_net *n = make_net(train, 99); /* its own weights are replaced */
        dsrt_train_options oc = o;
        oc.resume = k == 0 ? path : dir;
        dsrt_train_result rr;
        CHECK_OK(dsrt_train(n, train, &oc, &rr));
        CHECK_EQ(rr.start_iteration, k == 0 ? 8 : 9);
        CHECK_EQ(rr.iterations, 18);
        CHECK_EQ(rr.weights_checksum, ra.weights_checksum);
        CHECK_NEAR(rr.best_val_loss, ra.best_val_loss, 0);
        dsrt_net_destroy(n);
    }

    /* A checkpoint of another network is refused before any work. */
    dsrt_net *other = NULL;
    CHECK_OK(dsrt_net_create(&other, "input size=16x16x1\nfc outputs=classes\nsoftmax\n", 0, 0, 0,
                             4, NULL));
    dsrt_train_options od = o;
    od.resume = path;
    CHECK_EQ(dsrt_train(other, train, &od, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "not the one given");
    dsrt_net_destroy(other);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    dsrt_datastore_close(val);
    dsrt_datastore_close(train);
}

static void test_nan(void) {
    dsrt_datastore *train = open_ds(train_dir);
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/nan", root);
    dsrt_net *net = make_net(train, 5);
    dsrt_train_options o = base_options();
    o.max_epochs = 1;
    o.checkpoint_path = dir;
    CHECK_OK(dsrt_train(net, train, &o, NULL));
    CHECK_EQ(count_files(dir, ".dsrt"), 1);
    char first[4400];
    CHECK_OK(dsrt_checkpoint_latest(dir, first, sizeof first));

    /* Going on at an absurd learning rate, a checkpoint every iteration. */
    o.max_epochs = 4;
    o.resume = dir;
    o.optimizer.learn_rate = 1e9;
    o.optimizer.momentum = 0;
    o.checkpoint_unit = DSRT_UNIT_ITERATION;
    dsrt_train_result r;
    int rc = dsrt_train(net, train, &o, &r);
    CHECK_EQ(rc, DSRT_ENAN);
    CHECK_EQ(r.stop, DSRT_STOP_ERROR);
    CHECK_CONTAINS(dsrt_last_error(), "not finite");
    CHECK_LT(r.iterations, 24);
    CHECK_GE(check_checkpoints(dir), 1);
    char last[4400];
    CHECK_OK(dsrt_checkpoint_latest(dir, last, sizeof last));
    fprintf(stderr, "  stopped at iteration %lld: %s; latest checkpoint %s\n",
            (long long)r.iterations, dsrt_last_error(), last);
    dsrt_net_destroy(net);
    dsrt_datastore_close(train);
}

/* Trains for epochs epochs with a checkpoint every iteration in dir, on one
 * compute thread. Returns dsrt_train's code. */
static int checkpointing_train(const char *data, const char *dir, int epochs) {
    dsrt_datastore *train = open_ds(data);
    dsrt_net *net = make_net(train, 11);
    dsrt_train_options o = base_options();
    o.max_epochs = epochs;
    o.checkpoint_path = dir;
    o.checkpoint_unit = DSRT_UNIT_ITERATION;
    o.compute_threads = 1;
    int rc = dsrt_train(net, train, &o, NULL);
    fprintf(stderr, "  child: %s\n", dsrt_last_error());
    dsrt_net_destroy(net);
    dsrt_datastore_close(train);
    return rc;
}

/* The child of test_killed: trains for ever with a checkpoint every
 * iteration. */
static int child_main(const char *data, const char *dir) {
    return checkpointing_train(data, dir, 100000) ? 1 : 0;
}

/* The child of test_full_disk: files larger than 4 KiB cannot be written
 * (RLIMIT_FSIZE, as a full disk): the state beside the first checkpoint
 * fits, the checkpoint does not. Exits 0 when training failed on it. */
static int full_disk_main(const char *data, const char *dir) {
    struct rlimit lim = {4096, 4096};
    signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) return 2;
    return checkpointing_train(data, dir, 1) == -EFBIG ? 0 : 1;
}

/* A checkpoint that cannot be written (full disk) fails the run and leaves
 * nothing behind: no state file without its checkpoint, no temporary file. */
static void test_full_disk(void) {
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/full", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "test_train", "--full-disk", train_dir, dir, (char *)NULL);
        _exit(127);
    }
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int left = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') {
            fprintf(stderr, "  left behind: %s\n", e->d_name);
            left++;
        }
    if (d) closedir(d);
    CHECK_EQ(left, 0);
}

static void test_killed(void) {
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/killed", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    srand((unsigned)time(NULL));
    int kills = 0;
    for (int round = 0; round < 6; round++) {
        int before = count_files(dir, ".dsrt");
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            execl("/proc/self/exe", "test_train", "--child", train_dir, dir, (char *)NULL);
            _exit(127);
        }
        /* Wait for a new checkpoint (however long the child takes to get
         * there; it trains for ever), then kill at a random moment. */
        int st, gone = 0;
        while (count_files(dir, ".dsrt") <= before && !(gone = waitpid(pid, &st, WNOHANG) == pid))
            usleep(2000);
        usleep((useconds_t)(rand() % 40000));
        kill(pid, SIGKILL);
        if (!gone) waitpid(pid, &st, 0);
        kills += WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
        CHECK_GE(check_checkpoints(dir), 1);
    }
    CHECK_EQ(kills, 6);
    char latest[4400];
    CHECK_OK(dsrt_checkpoint_latest(dir, latest, sizeof latest));
    int partial = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) partial += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    fprintf(stderr,
            "  %d checkpoints after %d kills, all loadable (%d temporary files left by kills "
            "mid-write)\n",
            count_files(dir, ".dsrt"), kills, partial);
}

static void test_transfer(void) {
    dsrt_datastore *train = open_ds(train_dir), *two = open_ds(two_dir);
    dsrt_net *base = make_net(train, 2);
    dsrt_train_options o = base_options();
    o.max_epochs = 2;
    CHECK_OK(dsrt_train(base, train, &o, NULL));

    for (int frozen = 1; frozen >= 0; frozen--) {
        dsrt_transfer_options to = dsrt_transfer_defaults();
        to.classes = 2;
        to.base_lr_factor = frozen ? 0.0f : 0.5f;
        const char *names[2] = {dsrt_datastore_class_name(two, 0),
                                dsrt_datastore_class_name(two, 1)};
        to.class_names = names;
        dsrt_net *net = NULL;
        CHECK_OK(dsrt_net_transfer(&net, base, &to, NULL));
        REQUIRE(net);
        dsrt_net_info bi, ni;
        dsrt_net_get_info(base, &bi);
        dsrt_net_get_info(net, &ni);
        CHECK_EQ(ni.classes, 2);
        CHECK_EQ(ni.layers, bi.layers);
        char name[64];
        CHECK_GE(dsrt_net_class_name(net, 1, name, sizeof name), 0);
        CHECK_STR_EQ(name, dsrt_datastore_class_name(two, 1));
        CHECK_CONTAINS(dsrt_net_description(net), "wlr=20 blr=20");
        size_t np;
        float *init = malloc(ni.params * sizeof(float));
        const float *start = dsrt_net_params(net, &np);
        memcpy(init, start, np * sizeof(float));
        /* Kept layers start with the base's weights. */
        for (int i = 1; i < bi.layers; i++) {
            dsrt_layer_info a, b;
            dsrt_net_layer(base, i, &a);
            dsrt_net_layer(net, i, &b);
            if (!strcmp(a.name, "fc2")) {
                CHECK_EQ(b.weights_count, 2 * 16);
                CHECK_EQ(b.bias_count, 2);
                continue;
            }
            CHECK_EQ(a.weights_count, b.weights_count);
            CHECK(memcmp(dsrt_net_params(base, NULL) + a.weights_offset, init + b.weights_offset,
                         a.weights_count * sizeof(float)) == 0);
        }
        dsrt_train_options ot = base_options();
        ot.max_epochs = 2;
        ot.batch = 16;
        dsrt_train_result r;
        CHECK_OK(dsrt_train(net, two, &ot, &r));
        CHECK_GE(r.accuracy, 0.8);
        const float *after = dsrt_net_params(net, NULL);
        for (int i = 1; i < ni.layers; i++) {
            dsrt_layer_info b;
            dsrt_net_layer(net, i, &b);
            if (!b.weights_count) continue;
            int same = memcmp(init + b.weights_offset, after + b.weights_offset,
                              b.weights_count * sizeof(float)) == 0 &&
                       memcmp(init + b.bias_offset, after + b.bias_offset,
                              b.bias_count * sizeof(float)) == 0;
            if (!strcmp(b.name, "fc2"))
                CHECK(!same); /* the new layer learns */
            else if (frozen)
                CHECK(same); /* frozen: bit-identical */
            else
                CHECK(!same);
        }
        free(init);
        dsrt_net_destroy(net);
    }

    /* A graph: the last fully connected layer is replaced whatever comes
     * before it (skip connections, concats keep their inputs), every other
     * layer keeps the base's weights. */
    {
        dsrt_net *g = NULL, *t = NULL;
        CHECK_OK(dsrt_net_create(&g, "resnet20", 0, 0, 0, 10, NULL));
        dsrt_transfer_options to = dsrt_transfer_defaults();
        to.classes = 3;
        CHECK_OK(dsrt_net_transfer(&t, g, &to, NULL));
        REQUIRE(t);
        dsrt_net_info gi, ti;
        dsrt_net_get_info(g, &gi);
        dsrt_net_get_info(t, &ti);
        CHECK_EQ(ti.layers, gi.layers);
        CHECK_EQ(ti.classes, 3);
        CHECK_CONTAINS(dsrt_net_description(t), "inputs=s1_b1_b_bn,stem_relu");
        for (int i = 1; i < gi.layers; i++) {
            dsrt_layer_info a, b;
            dsrt_net_layer(g, i, &a);
            dsrt_net_layer(t, i, &b);
            CHECK_STR_EQ(a.name, b.name);
            if (!strcmp(a.name, "fc")) {
                CHECK_EQ(b.weights_count, 3 * 64);
                continue;
            }
            CHECK(memcmp(dsrt_net_params(g, NULL) + a.weights_offset,
                         dsrt_net_params(t, NULL) + b.weights_offset,
                         a.weights_count * sizeof(float)) == 0);
        }
        dsrt_net_destroy(t);
        dsrt_net_destroy(g);
    }

    /* A layer that is not the last learnable one cannot be replaced. */
    dsrt_transfer_options to = dsrt_transfer_defaults();
    to.classes = 3;
    to.layer = "fc1";
    dsrt_net *bad = NULL;
    CHECK_EQ(dsrt_net_transfer(&bad, base, &to, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "fc2");
    to.layer = "conv1";
    CHECK_EQ(dsrt_net_transfer(&bad, base, &to, NULL), DSRT_EOPTION);
    CHECK(bad == NULL);
    dsrt_net_destroy(base);
    dsrt_datastore_close(two);
    dsrt_datastore_close(train);
}

static int never_called(void *ctx, const dsrt_train_event *e) {
    (*(int *)ctx)++;
    return 0;
}

static void test_bad_options(void) {
    dsrt_datastore *train = open_ds(train_dir), *two = open_ds(two_dir);
    dsrt_net *net = make_net(train, 1);
    uint64_t before = dsrt_weights_checksum(net);
    char dir[4300], missing[4400];
    snprintf(dir, sizeof dir, "%s/never", root);
    snprintf(missing, sizeof missing, "%s/no/such/folder", root);
    int calls = 0;
    struct {
        const char *what;
        int code;
        dsrt_train_options o;
    } cases[48];
    int n = 0;
#define CASE(code_, what_, stmt)                                                                   \
    do {                                                                                           \
        dsrt_train_options o = base_options();                                                     \
        o.checkpoint_path = dir;                                                                   \
        o.callback = never_called;                                                                 \
        o.callback_ctx = &calls;                                                                   \
        stmt;                                                                                      \
        cases[n].what = what_;                                                                     \
        cases[n].code = code_;                                                                     \
        cases[n++].o = o;                                                                          \
    } while (0)
    CASE(DSRT_EOPTION, "max_epochs", o.max_epochs = 0);
    CASE(DSRT_EOPTION, "batch", o.batch = 0);
    CASE(DSRT_EOPTION, "learn_rate", o.optimizer.learn_rate = -1);
    CASE(DSRT_EOPTION, "learn_rate", o.optimizer.learn_rate = NAN);
    CASE(DSRT_EOPTION, "momentum", o.optimizer.momentum = 1.5);
    CASE(DSRT_EOPTION, "l2", o.optimizer.l2 = -1e-4);
    CASE(DSRT_EOPTION, "gradient_threshold", o.optimizer.grad_threshold = 0);
    CASE(DSRT_EOPTION, "learn_rate_drop_period", o.optimizer.drop_period = 0);
    CASE(DSRT_EOPTION, "shuffle", o.shuffle = (dsrt_shuffle)9);
    CASE(DSRT_EOPTION, "validation_frequency", o.validation_frequency = -1);
    CASE(DSRT_EOPTION, "verbose_frequency", o.verbose_frequency = 0);
    CASE(DSRT_EOPTION, "output_network", o.output_network = DSRT_OUTPUT_BEST_VALIDATION);
    CASE(DSRT_EOPTION, "validation_patience", o.validation_patience = 3);
    CASE(DSRT_EOPTION, "checkpoint_frequency", o.checkpoint_frequency = 0);
    CASE(DSRT_EOPTION, "checkpoint_path", o.checkpoint_path = missing);
    CASE(DSRT_EOPTION, "resume", o.resume = missing);
    if (dsrt_gpu_count() == 0) CASE(DSRT_ENODEVICE, "'gpu': GPU 0: ", o.execution = DSRT_EXEC_GPU);
    CASE(DSRT_ENODEVICE, "'gpu': GPU 9999: ", o.execution = DSRT_EXEC_GPU; o.gpu = 9999);
    CASE(DSRT_EOPTION, "gpu: -2", o.gpu = -2);
    if (dsrt_gpu_count() == 0)
        CASE(dsrt_comm_available(DSRT_COMM_NCCL) ? DSRT_EUNSUPPORTED : DSRT_ENODEVICE,
             "'multi-gpu'", o.execution = DSRT_EXEC_MULTI_GPU);
    CASE(DSRT_EOPTION, "'parallel': no communicator", o.execution = DSRT_EXEC_PARALLEL);
    CASE(DSRT_EOPTION, "averaging_frequency", o.averaging_frequency = -1);
    CASE(DSRT_EOPTION, "average_optimizer_state", o.average_optimizer_state = 1);
    CASE(DSRT_EOPTION, "bn_statistics", o.bn_statistics = (dsrt_bn_statistics)7);
    CASE(DSRT_EOPTION, "bn_statistics: sync",
         (o.bn_statistics = DSRT_BN_SYNC, o.averaging_frequency = 2));
    CASE(DSRT_EOPTION, "augment output size", o.augment.output_width = 28);
    CASE(DSRT_EOPTION, "rand_rotation",
         (o.augment.rand_rotation[0] = 10, o.augment.rand_rotation[1] = -10));
    CASE(DSRT_EOPTION, "workers", o.workers = 5000);
    CASE(DSRT_EOPTION, "cpus", o.cpus = "zero-three");
    CASE(DSRT_EOPTION, "prefetch", o.prefetch = 0);
    CASE(DSRT_EOPTION, "drop_last", (o.drop_last = 1, o.batch = 100000));
#undef CASE
    for (int i = 0; i < n; i++) {
        dsrt_train_result r;
        int rc = dsrt_train(net, train, &cases[i].o, &r);
        if (rc != cases[i].code)
            fprintf(stderr, "case %d (%s): %d, %s\n", i, cases[i].what, rc, dsrt_last_error());
        CHECK_EQ(rc, cases[i].code);
        CHECK_CONTAINS(dsrt_last_error(), cases[i].what);
        CHECK_EQ(r.iterations, 0);
    }
    /* Validation data with a class the net does not know. */
    dsrt_net *net2 = make_net(two, 1);
    dsrt_train_options o = base_options();
    o.validation = train;
    CHECK_EQ(dsrt_train(net2, two, &o, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "'checker'");
    /* Training data with other classes than the net's. */
    dsrt_train_options plain = base_options();
    CHECK_EQ(dsrt_train(net2, train, &plain, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "classes");
    dsrt_net_destroy(net2);

    CHECK_EQ(calls, 0);
    struct stat st;
    CHECK(stat(dir, &st) != 0); /* never created */
    CHECK_EQ(dsrt_weights_checksum(net), before);
    dsrt_net_destroy(net);
    dsrt_datastore_close(two);
    dsrt_datastore_close(train);
}

/* Batches sent as uint8 and normalised by the net train exactly as float
 * batches do when no pixel is resampled (16x16 images, a 16x16 net). */
static void test_uint8_batches(void) {
    dsrt_datastore *train = open_ds(train_dir);
    uint64_t sums[2];
    for (int u8 = 0; u8 < 2; u8++) {
        dsrt_net *net = make_net(train, 3);
        dsrt_train_options o = base_options();
        o.max_epochs = 2;
        o.augment.rand_x_reflection = 1;
        o.uint8_batches = u8;
        dsrt_train_result r;
        CHECK_OK(dsrt_train(net, train, &o, &r));
        CHECK_EQ(r.iterations, 2 * 6);
        CHECK_EQ(r.device, DSRT_DEVICE_CPU);
        sums[u8] = r.weights_checksum;
        dsrt_net_destroy(net);
    }
    CHECK_EQ(sums[0], sums[1]);
    dsrt_datastore_close(train);
}

/* A checkpoint with every worker's optimizer state (section WOPT): each
 * worker's back for as many workers, the mean for any other count, and a
 * section that does not add up is refused. */
static void test_worker_states(void) {
    dsrt_datastore *train = open_ds(train_dir);
    dsrt_net *net = make_net(train, 4);
    dsrt_optimizer *opt = NULL;
    dsrt_optimizer_options oo = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    CHECK_OK(dsrt_optimizer_create(&opt, net, &oo));
    REQUIRE(opt);
    size_t n;
    dsrt_net_params(net, &n);
    float *mine = dsrt__optimizer_buffer(opt, 0);
    float *w1 = malloc(n * sizeof *w1), *w2 = malloc(n * sizeof *w2);
    REQUIRE(w1 && w2);
    for (size_t i = 0; i < n; i++) {
        mine[i] = (float)i;
        w1[i] = 2.0f * (float)i + 1.0f;
        w2[i] = -3.0f;
    }
    const float *states[2] = {w1, w2};
    const int64_t steps[2] = {5, 5};
    dsrt_ckpt_workers ws = {3, states, steps};
    dsrt_train_position pos = {1, 5, 7};
    char path[4400];
    snprintf(path, sizeof path, "%s/workers.dsrt", root);
    CHECK_OK(dsrt__checkpoint_save_workers(path, net, opt, &pos, &ws));
    for (int k = 0; k < 4; k++) {
        /* k < 3: worker k of 3 takes its own; k == 3: as one of 2, the mean. */
        dsrt_net *c = NULL;
        dsrt_optimizer *co = NULL;
        int held = 0;
        CHECK_OK(
            dsrt__checkpoint_load_worker(path, &c, &co, NULL, NULL, k % 3, k < 3 ? 3 : 2, &held));
        CHECK_EQ(held, 3);
        if (!co) continue;
        const float *got = dsrt__optimizer_buffer(co, 0);
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            float mean = ((float)i + (2.0f * (float)i + 1.0f) + -3.0f) * (1.0f / 3.0f);
            float want = k == 0 ? (float)i : k == 1 ? w1[i] : k == 2 ? w2[i] : mean;
            bad += got[i] != want;
        }
        CHECK_EQ(bad, 0);
        dsrt_optimizer_destroy(co);
        dsrt_net_destroy(c);
    }
    /* The public loader gives the mean too; a plain checkpoint says 1. */
    dsrt_net *c = NULL;
    dsrt_optimizer *co = NULL;
    CHECK_OK(dsrt_checkpoint_load(path, &c, &co, NULL, NULL));
    if (co) CHECK(dsrt__optimizer_buffer(co, 0)[1] == (1.0f + 3.0f - 3.0f) * (1.0f / 3.0f));
    dsrt_optimizer_destroy(co);
    dsrt_net_destroy(c);
    CHECK_OK(dsrt_checkpoint_save(path, net, opt, &pos));
    int held = 0;
    CHECK_OK(dsrt__checkpoint_load_worker(path, &c, &co, NULL, NULL, 1, 3, &held));
    CHECK_EQ(held, 1);
    if (co) CHECK(dsrt__optimizer_buffer(co, 0)[1] == 1.0f);
    dsrt_optimizer_destroy(co);
    dsrt_net_destroy(c);
    /* A section that claims 4 workers over 3 workers' bytes. */
    CHECK_OK(dsrt__checkpoint_save_workers(path, net, opt, &pos, &ws));
    uint8_t *data = NULL;
    size_t size = 0;
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    fseek(f, 0, SEEK_END);
    size = (size_t)ftell(f);
    rewind(f);
    data = malloc(size);
    REQUIRE(data && fread(data, 1, size, f) == size);
    fclose(f);
    size_t at = 0;
    for (size_t i = 0; i + 4 <= size; i++)
        if (!memcmp(data + i, "WOPT", 4)) at = i;
    REQUIRE(at > 0);
    data[at + 24] = 4; /* the worker count, in the payload after the 24-byte header */
    /* ... with the payload's CRC made right again, so that only its sense is wrong. */
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)data[at + 8 + i] << (8 * i);
    uint32_t crc = (uint32_t)crc32_z(0, data + at + 24, (size_t)len);
    for (int i = 0; i < 4; i++) data[at + 16 + i] = (uint8_t)(crc >> (8 * i));
    crc = (uint32_t)crc32_z(0, data + at, 20); /* and the section header's */
    for (int i = 0; i < 4; i++) data[at + 20 + i] = (uint8_t)(crc >> (8 * i));
    CHECK_EQ(dsrt__model_read_worker(data, size, "bad", &c, &co, NULL, NULL, 0, 0, NULL),
             DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "section WOPT");
    CHECK(c == NULL && co == NULL);
    free(data);
    free(w1);
    free(w2);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
    dsrt_datastore_close(train);
}

/* Mixup, cutmix and label smoothing: the loss trains against the soft
 * labels (the weights differ from a plain run's, and from each other's), the
 * loss stays finite, and a run resumed from a mid-epoch checkpoint ends
 * with the weights of an uninterrupted one. */
static void test_mixing(void) {
    dsrt_datastore *train = open_ds(train_dir);
    dsrt_train_options o = base_options();
    o.max_epochs = 2;
    dsrt_net *plain = make_net(train, 3);
    dsrt_train_result rp;
    CHECK_OK(dsrt_train(plain, train, &o, &rp));

    dsrt_train_options os = o;
    os.label_smoothing = 0.1;
    dsrt_net *smooth = make_net(train, 3);
    dsrt_train_result rs;
    CHECK_OK(dsrt_train(smooth, train, &os, &rs));
    CHECK_NE(rs.weights_checksum, rp.weights_checksum);

    dsrt_train_options om = os;
    om.mixup_alpha = 0.4;
    om.cutmix_alpha = 1.0;
    om.mix_prob = 0.8;
    dsrt_net *mixed = make_net(train, 3);
    dsrt_train_result rm;
    counter c = {.order_ok = 1};
    om.callback = count_events;
    om.callback_ctx = &c;
    CHECK_OK(dsrt_train(mixed, train, &om, &rm));
    CHECK(c.order_ok);
    CHECK_NE(rm.weights_checksum, rp.weights_checksum);
    CHECK_NE(rm.weights_checksum, rs.weights_checksum);
    CHECK_EQ(rm.iterations, 12);

    /* Stopped after iteration 7 with checkpoints every 5, resumed from 5. */
    char dir[4300], path[4400];
    snprintf(dir, sizeof dir, "%s/mixing", root);
    dsrt_train_options ob = om;
    counter cb = {.order_ok = 1, .stop_at = 7};
    ob.callback_ctx = &cb;
    ob.checkpoint_path = dir;
    ob.checkpoint_unit = DSRT_UNIT_ITERATION;
    ob.checkpoint_frequency = 5;
    dsrt_net *b = make_net(train, 3);
    CHECK_OK(dsrt_train(b, train, &ob, NULL));
    snprintf(path, sizeof path, "%s/dsrt_ckpt_e000_i000000005.dsrt", dir);
    dsrt_net *r = make_net(train, 99);
    dsrt_train_options orr = om;
    orr.callback = NULL;
    orr.resume = path;
    dsrt_train_result rr;
    CHECK_OK(dsrt_train(r, train, &orr, &rr));
    CHECK_EQ(rr.start_iteration, 5);
    CHECK_EQ(rr.weights_checksum, rm.weights_checksum);

    /* Bad values are refused naming the option. */
    dsrt_train_options bad = o;
    bad.mix_prob = 2;
    CHECK_EQ(dsrt_train(r, train, &bad, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "mix_prob: 2");
    bad = o;
    bad.label_smoothing = -0.1;
    CHECK_EQ(dsrt_train(r, train, &bad, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "label_smoothing: -0.1");
    dsrt_net_destroy(r);
    dsrt_net_destroy(b);
    dsrt_net_destroy(mixed);
    dsrt_net_destroy(smooth);
    dsrt_net_destroy(plain);
    dsrt_datastore_close(train);
}

/* A model is written to PATH.tmp.<thread> and renamed: a link planted
 * under that name is never written through (the file it names keeps its
 * bytes), and a regular file there, a stopped write's, is replaced. */
static void test_save_never_through_link(void) {
    char path[4400], tmp[4500], bait[4400];
    snprintf(path, sizeof path, "%s/linked.dsrt", root);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)gettid());
    snprintf(bait, sizeof bait, "%s/bait.txt", root);
    REQUIRE(timg_write_file(bait, "keep me", 7) == 0);
    REQUIRE(symlink(bait, tmp) == 0);
    dsrt_net *net = NULL;
    REQUIRE(dsrt_net_create(&net, "digits", 0, 0, 0, 3, NULL) == 0);
    CHECK_EQ(dsrt_model_save(path, net), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "symbolic link");
    CHECK_CONTAINS(dsrt_last_error(), tmp);
    char got[16] = {0};
    FILE *f = fopen(bait, "rb");
    REQUIRE(f);
    CHECK_EQ(fread(got, 1, sizeof got, f), 7);
    fclose(f);
    CHECK_STR_EQ(got, "keep me");
    CHECK(access(path, F_OK) != 0);
    REQUIRE(unlink(tmp) == 0);
    REQUIRE(timg_write_file(tmp, "stale", 5) == 0);
    CHECK_OK(dsrt_model_save(path, net));
    CHECK(access(tmp, F_OK) != 0);
    dsrt_net *back = NULL;
    CHECK_OK(dsrt_model_load(&back, path, NULL));
    dsrt_net_destroy(back);
    dsrt_net_destroy(net);
}

// ----------------------------------------------------------------------------
// Launching a job

static const char *const LAUNCH_VARS[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                          "SLURM_LOCALID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};

static void launch_env_clear(void) {
    for (size_t i = 0; i < sizeof LAUNCH_VARS / sizeof LAUNCH_VARS[0]; i++)
        unsetenv(LAUNCH_VARS[i]);
}

/* The launcher's variables: the first set of Open MPI's, Hydra's and
 * Slurm's local rank, and a job of several processes refused unless it
 * trains data-parallel. */
static void test_launch_environment(void) {
    launch_env_clear();
    CHECK_EQ(dsrt_train_local_rank(), 0);
    setenv("SLURM_LOCALID", "3", 1);
    CHECK_EQ(dsrt_train_local_rank(), 3);
    setenv("MPI_LOCALRANKID", "2", 1);
    CHECK_EQ(dsrt_train_local_rank(), 2);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    CHECK_EQ(dsrt_train_local_rank(), 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "", 1); /* set but empty: the next */
    CHECK_EQ(dsrt_train_local_rank(), 2);

    dsrt_train_options o = dsrt_train_defaults();
    CHECK_OK(dsrt_train_check_launch(&o));
    CHECK_OK(dsrt_train_check_launch(NULL));
    setenv("PMI_SIZE", "1", 1);
    CHECK_OK(dsrt_train_check_launch(&o));
    setenv("PMI_SIZE", "4", 1);
    CHECK_EQ(dsrt_train_check_launch(&o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "one of 4 processes of an MPI job (PMI_SIZE=4)");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    CHECK_EQ(dsrt_train_check_launch(NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "(OMPI_COMM_WORLD_SIZE=2)");
    o.execution = DSRT_EXEC_PARALLEL;
    CHECK_OK(dsrt_train_check_launch(&o));
    launch_env_clear();

    /* Not data-parallel: no communicator, nothing started. */
    dsrt_comm *comm = (dsrt_comm *)&o;
    o.execution = DSRT_EXEC_CPU;
    CHECK_OK(dsrt_train_comm_open(&o, &comm));
    CHECK(comm == NULL && o.comm == NULL);

    /* One process: it is the first that failed, or none did. */
    int first = 7, value = 7;
    CHECK_OK(dsrt_train_first_worker(NULL, 0, &first, &value));
    CHECK(first == -1 && value == 0);
    CHECK_OK(dsrt_train_first_worker(NULL, 15, &first, &value));
    CHECK(first == 0 && value == 15);
}

/* The automatic split of the cores: loading gets the cores its share of
 * the work needs, computing the rest (at least one each). */
static void test_cores_split(void) {
    dsrt_net_info ni;
    memset(&ni, 0, sizeof ni);
    ni.device = -1;
    ni.height = ni.width = 224;
    ni.channels = 3;
    unsigned w, all;
    int t;
    ni.train_flops = 0; /* loading is everything: every core loads */
    CHECK_OK(dsrt_cores_split(&ni, NULL, &all, &t));
    CHECK(all >= 1);
    CHECK_EQ(t, 1);
    ni.train_flops = 1e15; /* computing is everything */
    CHECK_OK(dsrt_cores_split(&ni, NULL, &w, &t));
    CHECK_EQ(w, 1);
    CHECK_EQ(t, (int)all);
    CHECK_OK(dsrt_cores_split(&ni, "0", &w, &t));
    CHECK_EQ(w, 1);
    CHECK_EQ(t, 1);
    CHECK(dsrt_cores_split(&ni, "zero", &w, &t) < 0);
    CHECK(strstr(dsrt_last_error(), "zero") != NULL);
}

/* resume "auto": afresh where there is no checkpoint, else the newest that
 * loads, the newer broken ones named. */
static void test_launch_resume_auto(void) {
    char dir[4300], path[4400], skipped[4400], file[4400];
    snprintf(dir, sizeof dir, "%s/launch", root);
    path[0] = 'x';
    CHECK_OK(dsrt_train_resume_auto(NULL, dir, path, sizeof path, skipped, sizeof skipped));
    CHECK_STR_EQ(path, ""); /* no folder yet */
    CHECK_STR_EQ(skipped, "");

    dsrt_datastore *train = open_ds(train_dir);
    dsrt_net *net = make_net(train, 5);
    dsrt_train_options o = base_options();
    o.max_epochs = 1;
    o.checkpoint_path = dir;
    CHECK_OK(dsrt_train(net, train, &o, NULL));
    char newest[4400];
    CHECK_OK(dsrt_checkpoint_latest(dir, newest, sizeof newest));
    CHECK_OK(dsrt_train_resume_auto(NULL, dir, path, sizeof path, skipped, sizeof skipped));
    CHECK_STR_EQ(path, newest);
    CHECK_STR_EQ(skipped, "");

    /* A newer checkpoint cut short is passed over and named. */
    snprintf(file, sizeof file, "%s/dsrt_ckpt_e009_i000000099.dsrt", dir);
    FILE *f = fopen(file, "wb");
    REQUIRE(f != NULL);
    fputs("DSRTMODL", f);
    fclose(f);
    CHECK_OK(dsrt_train_resume_auto(NULL, dir, path, sizeof path, skipped, sizeof skipped));
    CHECK_STR_EQ(path, newest);
    CHECK_CONTAINS(skipped, "dsrt_ckpt_e009_i000000099.dsrt");
    /* A path buffer too small for the choice is refused, not cut. */
    CHECK_EQ(dsrt_train_resume_auto(NULL, dir, path, 8, NULL, 0), -ENAMETOOLONG);
    dsrt_net_destroy(net);
    dsrt_datastore_close(train);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--child")) return child_main(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "--full-disk")) return full_disk_main(argv[2], argv[3]);
    REQUIRE(timg_tmpdir("train", root, sizeof root) == 0);
    snprintf(train_dir, sizeof train_dir, "%s/data/train", root);
    snprintf(val_dir, sizeof val_dir, "%s/data/val", root);
    snprintf(two_dir, sizeof two_dir, "%s/data/two", root);
    const int all[] = {0, 1, 2, 3}, two[] = {0, 3};
    make_folder(train_dir, all, 4, PER_CLASS, 1);
    make_folder(val_dir, all, 4, VAL_CLASS, 50001);
    make_folder(two_dir, two, 2, PER_CLASS / 2, 90001);
    RUN(test_bad_options);
    RUN(test_learns);
    RUN(test_uint8_batches);
    RUN(test_bad_samples);
    RUN(test_resume);
    RUN(test_mixing);
    RUN(test_worker_states);
    RUN(test_nan);
    RUN(test_transfer);
    RUN(test_killed);
    RUN(test_full_disk);
    RUN(test_save_never_through_link);
    RUN(test_launch_environment);
    RUN(test_launch_resume_auto);
    RUN(test_cores_split);
    return TEST_RESULT();
}

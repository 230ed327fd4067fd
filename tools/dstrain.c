/*
 * dstrain: train, evaluate and time image classifiers with dsrt.
 *
 * One program with subcommands (`dstrain bench ...`), each an entry in the
 * COMMANDS table below with its own option table, so that a new subcommand
 * is one function, one option table and one line in COMMANDS. Option tables
 * drive parsing, validation messages and --help alike.
 *
 * `dstrain bench` times training steps (forward, backward, optimizer step)
 * of a network on random data with no loader: the measurement of the peer
 * benchmark torch_train_bench.py (warm-up steps excluded, median step time),
 * so that the two print comparable images/s.
 *
 * `dstrain train` trains a network on an image folder (or any datastore
 * source) with the pipeline making batches in the background; `eval` gives
 * accuracy, per-class accuracy and the confusion matrix of a saved model;
 * `classify` labels image files or a folder.
 */
#include <dsrt.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Options

typedef enum { OPT_FLAG, OPT_INT, OPT_STR, OPT_U64, OPT_DBL } opt_type;

typedef struct {
    const char *name; /* without the leading "--" */
    opt_type type;
    void *value;     /* int *, const char **, uint64_t *, double * */
    int min, max;    /* OPT_INT */
    const char *arg; /* the value's name in help, e.g. "N" */
    const char *help;
} option;

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} command;

static const char *prog = "dstrain";

static void print_options(FILE *f, const option *opts) {
    for (const option *o = opts; o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "  %-22s %s\n", left, o->help);
    }
    fprintf(f, "  %-22s %s\n", "--help", "show this help");
}

/* Parses argv (after the subcommand) against opts. Returns 0, 1 for --help
 * (printed), or -1 after printing an error. */
static int parse_options(const char *cmd, int argc, char **argv, const option *opts,
                         void (*usage)(FILE *)) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "%s %s: unexpected argument '%s' (see %s %s --help)\n", prog, cmd, a,
                    prog, cmd);
            return -1;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const option *o = opts;
        while (o->name && (strlen(o->name) != nlen || strncmp(o->name, name, nlen))) o++;
        if (!o->name) {
            fprintf(stderr, "%s %s: unknown option '--%.*s' (see %s %s --help)\n", prog, cmd,
                    (int)nlen, name, prog, cmd);
            return -1;
        }
        if (o->type == OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "%s %s: --%s takes no value\n", prog, cmd, o->name);
                return -1;
            }
            *(int *)o->value = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v || !*v) {
            fprintf(stderr, "%s %s: --%s needs a value (%s)\n", prog, cmd, o->name, o->arg);
            return -1;
        }
        if (o->type == OPT_STR) {
            *(const char **)o->value = v;
            continue;
        }
        char *end;
        errno = 0;
        if (o->type == OPT_DBL) {
            double x = strtod(v, &end);
            if (*end || errno || !(x == x) || x < o->min || x > o->max) {
                fprintf(stderr, "%s %s: --%s: expected a number in [%d, %d], got '%s'\n", prog, cmd,
                        o->name, o->min, o->max, v);
                return -1;
            }
            *(double *)o->value = x;
            continue;
        }
        if (o->type == OPT_U64) {
            unsigned long long x = strtoull(v, &end, 10);
            if (*end || errno || v[0] == '-') {
                fprintf(stderr, "%s %s: --%s: expected a non-negative integer, got '%s'\n", prog,
                        cmd, o->name, v);
                return -1;
            }
            *(uint64_t *)o->value = x;
            continue;
        }
        long x = strtol(v, &end, 10);
        if (*end || errno || x < o->min || x > o->max) {
            fprintf(stderr, "%s %s: --%s: expected an integer in [%d, %d], got '%s'\n", prog, cmd,
                    o->name, o->min, o->max, v);
            return -1;
        }
        *(int *)o->value = (int)x;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// bench

static struct {
    const char *net, *solver;
    int batch, steps, warmup, threads, classes, json, no_fuse;
    uint64_t seed;
} bench;

static const option BENCH_OPTIONS[] = {
    {"net", OPT_STR, &bench.net, 0, 0, "NAME|FILE",
     "network: digits, cifar, alexnet, or a description file [digits]"},
    {"batch", OPT_INT, &bench.batch, 1, 1 << 20, "N",
     "images per step [128 for digits and cifar, 32 for alexnet]"},
    {"steps", OPT_INT, &bench.steps, 1, 1 << 20, "N", "timed steps [20]"},
    {"warmup", OPT_INT, &bench.warmup, 0, 1 << 20, "N", "untimed steps before them [3]"},
    {"threads", OPT_INT, &bench.threads, 1, 4096, "N", "compute threads [all cores]"},
    {"classes", OPT_INT, &bench.classes, 1, 1 << 24, "N", "classes [55 for alexnet, else 10]"},
    {"solver", OPT_STR, &bench.solver, 0, 0, "NAME", "sgdm, adam or rmsprop [sgdm]"},
    {"seed", OPT_U64, &bench.seed, 0, 0, "N", "seed of weights and data [0]"},
    {"no-fuse", OPT_FLAG, &bench.no_fuse, 0, 0, NULL, "do not fold ReLUs into the layer before"},
    {"json", OPT_FLAG, &bench.json, 0, 0, NULL, "print one JSON line"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: %s bench [options]\n\n"
            "Times training steps (forward, backward, optimizer step) on random data, with no\n"
            "data loading: the median step time after the warm-up steps, as images/s. SGD with\n"
            "momentum 0.9, learning rate 0.01, L2 1e-4 unless --solver says otherwise.\n"
            "GFLOP counts the arithmetic of direct convolutions and matrix products (forward,\n"
            "backward data and weights); Winograd convolutions do less, so GFLOP/s can pass\n"
            "the machine's peak.\n\n"
            "options:\n",
            prog);
    print_options(f, BENCH_OPTIONS);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v and returns its median. */
static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    char *s = malloc(cap);
    for (size_t r; s && (r = fread(s + len, 1, cap - len - 1, f)) > 0;) {
        len += r;
        if (len + 1 == cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) free(s);
            s = t;
        }
    }
    fclose(f);
    if (s) s[len] = '\0';
    return s;
}

static int cmd_bench(int argc, char **argv) {
    bench.net = "digits";
    bench.solver = "sgdm";
    bench.steps = 20;
    bench.warmup = 3;
    int rc = parse_options("bench", argc, argv, BENCH_OPTIONS, bench_usage);
    if (rc) return rc > 0 ? 0 : 2;

    dsrt_optimizer_options oo;
    if (!strcmp(bench.solver, "sgdm"))
        oo = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    else if (!strcmp(bench.solver, "adam"))
        oo = dsrt_optimizer_defaults(DSRT_SOLVER_ADAM);
    else if (!strcmp(bench.solver, "rmsprop"))
        oo = dsrt_optimizer_defaults(DSRT_SOLVER_RMSPROP);
    else {
        fprintf(stderr, "%s bench: --solver: '%s' is not one of sgdm, adam, rmsprop\n", prog,
                bench.solver);
        return 2;
    }
    int builtin = dsrt_net_builtin(bench.net, NULL) != NULL;
    int is_alexnet = !strcmp(bench.net, "alexnet");
    char *text = NULL;
    if (!builtin) {
        text = read_text(bench.net);
        if (!text) {
            const char *const *names;
            dsrt_net_builtin(NULL, &names);
            fprintf(stderr, "%s bench: --net: '%s' is neither a built-in network (", prog,
                    bench.net);
            for (int i = 0; names[i]; i++) fprintf(stderr, "%s%s", i ? ", " : "", names[i]);
            fprintf(stderr, ") nor a readable file: %s\n", strerror(errno));
            return 2;
        }
    }
    int batch = bench.batch ? bench.batch : is_alexnet ? 32 : builtin ? 128 : 32;
    int classes = bench.classes ? bench.classes : is_alexnet ? 55 : 10;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = bench.threads ? bench.threads : (int)(ncpu > 0 ? ncpu : 1);

    dsrt_net_options no = dsrt_net_defaults();
    no.threads = threads;
    no.seed = bench.seed;
    no.fuse = !bench.no_fuse;
    dsrt_net *net = NULL;
    dsrt_optimizer *opt = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    double *times = NULL, *opt_times = NULL;
    int status = 1;
    if (dsrt_net_create(&net, builtin ? bench.net : text, 0, 0, 0, classes, &no) != 0) {
        fprintf(stderr, "%s bench: %s\n", prog, dsrt_last_error());
        goto out;
    }
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    if (dsrt_optimizer_create(&opt, net, &oo) != 0) {
        fprintf(stderr, "%s bench: %s\n", prog, dsrt_last_error());
        goto out;
    }
    size_t per = (size_t)info.channels * info.height * info.width;
    x = malloc((size_t)batch * per * sizeof *x);
    y = malloc((size_t)batch * sizeof *y);
    times = malloc((size_t)bench.steps * sizeof *times);
    opt_times = malloc((size_t)bench.steps * sizeof *opt_times);
    if (!x || !y || !times || !opt_times) {
        fprintf(stderr, "%s bench: out of memory\n", prog);
        goto out;
    }
    /* Uniform [0, 1) pixels and uniform labels, like torch.rand/randint. */
    uint64_t s = bench.seed * 0x9e3779b97f4a7c15ULL + 1;
    for (size_t i = 0; i < (size_t)batch * per; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)(s >> 40) * (1.0f / 16777216.0f);
    }
    for (int i = 0; i < batch; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        y[i] = (int32_t)(s % (uint64_t)info.classes);
    }
    double plan_t = 0;
    float loss = 0;
    for (int step = 0; step < bench.warmup + bench.steps; step++) {
        double t0 = now();
        int rc = dsrt_net_forward_backward(net, x, y, batch, &loss, NULL);
        double t1 = now();
        if (rc == 0) rc = dsrt_optimizer_step(opt, net, 0);
        if (rc != 0) {
            fprintf(stderr, "%s bench: step %d: %s\n", prog, step, dsrt_last_error());
            goto out;
        }
        double t = now() - t0;
        if (step == 0) plan_t = t;
        if (step >= bench.warmup) {
            times[step - bench.warmup] = t;
            opt_times[step - bench.warmup] = t - (t1 - t0);
        }
    }
    int m = bench.steps;
    double median = median_of(times, m), opt_median = median_of(opt_times, m);
    double ips = batch / median, gflop = info.train_flops * batch * 1e-9;
    if (bench.json) {
        printf("{\"tool\": \"dstrain bench\", \"net\": \"%s\", \"batch\": %d, \"threads\": %d, "
               "\"steps\": %d, \"warmup\": %d, \"solver\": \"%s\", \"backend\": \"%s\", "
               "\"params\": %zu, \"images_per_s\": %.1f, \"ms_per_step\": %.3f, "
               "\"ms_per_step_min\": %.3f, \"ms_optimizer\": %.3f, \"ms_first_step\": %.1f, "
               "\"gflop_per_step\": %.3f, \"gflops\": %.1f, \"loss\": %.4f}\n",
               bench.net, batch, threads, bench.steps, bench.warmup, bench.solver, info.backend,
               info.learnable, ips, 1e3 * median, 1e3 * times[0], 1e3 * opt_median, 1e3 * plan_t,
               gflop, gflop / median, (double)loss);
    } else {
        printf("%s: batch %d, %d threads, %s, %zu parameters\n", bench.net, batch, threads,
               info.backend, info.learnable);
        printf("  %.1f images/s (median %.2f ms/step over %d steps, min %.2f; first step %.0f "
               "ms)\n",
               ips, 1e3 * median, bench.steps, 1e3 * times[0], 1e3 * plan_t);
        printf("  %.2f GFLOP/step, %.1f GFLOP/s; the optimizer takes %.2f ms of a step\n", gflop,
               gflop / median, 1e3 * opt_median);
    }
    status = 0;
out:
    free(times);
    free(opt_times);
    free(x);
    free(y);
    free(text);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
    return status;
}

// ----------------------------------------------------------------------------
// train

static struct {
    const char *data, *val, *net, *checkpoint_dir, *resume, *shuffle, *output_network, *exec,
        *schedule, *solver, *plot, *log, *save, *transfer, *cpus;
    int epochs, batch, threads, workers, json, val_frequency, val_patience, checkpoint_frequency,
        verbose_frequency, drop_period, x_reflection, y_reflection, drop_last, fail_on_error,
        prefetch, quiet;
    double lr, momentum, l2, drop_factor, grad_threshold, lr_factor, translation;
    uint64_t seed;
} tr;

static const option TRAIN_OPTIONS[] = {
    {"data", OPT_STR, &tr.data, 0, 0, "DIR",
     "training data: a folder of class folders (or any dsbench source)"},
    {"val", OPT_STR, &tr.val, 0, 0, "DIR", "validation data, evaluated after each epoch"},
    {"net", OPT_STR, &tr.net, 0, 0, "NAME|FILE",
     "digits, cifar, alexnet, or a description file [digits]"},
    {"transfer", OPT_STR, &tr.transfer, 0, 0, "MODEL",
     "start from a trained model: new last fc layer for this data's classes"},
    {"lr-factor", OPT_DBL, &tr.lr_factor, 0, 1000, "F",
     "with --transfer: learn-rate factor of the kept layers (0 freezes) [1]"},
    {"epochs", OPT_INT, &tr.epochs, 1, 1000000, "E", "MaxEpochs [30]"},
    {"batch", OPT_INT, &tr.batch, 1, 1 << 20, "B", "MiniBatchSize [128]"},
    {"solver", OPT_STR, &tr.solver, 0, 0, "sgdm|adam|rmsprop", "optimizer [sgdm]"},
    {"lr", OPT_DBL, &tr.lr, 0, 1000, "X", "InitialLearnRate [0.01 sgdm, 0.001 adam/rmsprop]"},
    {"momentum", OPT_DBL, &tr.momentum, 0, 1, "M", "Momentum [0.9]"},
    {"l2", OPT_DBL, &tr.l2, 0, 1000, "X", "L2Regularization [1e-4]"},
    {"lr-schedule", OPT_STR, &tr.schedule, 0, 0, "none|piecewise", "LearnRateSchedule [none]"},
    {"lr-drop-factor", OPT_DBL, &tr.drop_factor, 0, 1, "F", "LearnRateDropFactor [0.1]"},
    {"lr-drop-period", OPT_INT, &tr.drop_period, 1, 1000000, "E",
     "LearnRateDropPeriod, epochs [10]"},
    {"gradient-threshold", OPT_DBL, &tr.grad_threshold, 0, 1000000000, "T",
     "GradientThreshold, l2norm per layer [none]"},
    {"shuffle", OPT_STR, &tr.shuffle, 0, 0, "every-epoch|once|never", "Shuffle [every-epoch]"},
    {"drop-last", OPT_FLAG, &tr.drop_last, 0, 0, NULL, "drop each epoch's last, partial batch"},
    {"rand-x-reflection", OPT_FLAG, &tr.x_reflection, 0, 0, NULL,
     "RandXReflection: random left-right flips"},
    {"rand-y-reflection", OPT_FLAG, &tr.y_reflection, 0, 0, NULL,
     "RandYReflection: random top-bottom flips"},
    {"rand-translation", OPT_DBL, &tr.translation, 0, 10000, "PX",
     "RandX/YTranslation: random shifts in [-PX, PX] pixels"},
    {"seed", OPT_U64, &tr.seed, 0, 0, "S",
     "seed of the weights, the order and the augmentation [0]"},
    {"threads", OPT_INT, &tr.threads, 0, 4096, "T", "compute threads [0: automatic]"},
    {"workers", OPT_INT, &tr.workers, 0, 4096, "N",
     "pipeline workers (MATLAB WorkerLoad) [0: automatic]"},
    {"cpus", OPT_STR, &tr.cpus, 0, 0, "LIST", "cores to use, e.g. 0-3 [all]"},
    {"prefetch", OPT_INT, &tr.prefetch, 1, 1024, "P", "batches made ahead [4]"},
    {"val-frequency", OPT_INT, &tr.val_frequency, 0, INT_MAX, "N",
     "ValidationFrequency, iterations [0: each epoch]"},
    {"val-patience", OPT_INT, &tr.val_patience, 0, INT_MAX, "N",
     "ValidationPatience [0: never stop early]"},
    {"output-network", OPT_STR, &tr.output_network, 0, 0, "last|best-validation",
     "OutputNetwork [last]"},
    {"checkpoint-dir", OPT_STR, &tr.checkpoint_dir, 0, 0, "DIR",
     "CheckpointPath: write checkpoints there"},
    {"checkpoint-frequency", OPT_INT, &tr.checkpoint_frequency, 1, INT_MAX, "E",
     "CheckpointFrequency, epochs [1]"},
    {"resume", OPT_STR, &tr.resume, 0, 0, "FILE|DIR",
     "continue from a checkpoint (or a folder's latest)"},
    {"execution-environment", OPT_STR, &tr.exec, 0, 0, "auto|cpu|gpu|multi-gpu|parallel",
     "ExecutionEnvironment [auto]"},
    {"fail-on-error", OPT_FLAG, &tr.fail_on_error, 0, 0, NULL,
     "stop at the first unreadable image instead of skipping it"},
    {"verbose-frequency", OPT_INT, &tr.verbose_frequency, 1, INT_MAX, "N",
     "VerboseFrequency, iterations [50]"},
    {"plot", OPT_STR, &tr.plot, 0, 0, "FILE.svg", "write the training-progress plot"},
    {"log", OPT_STR, &tr.log, 0, 0, "FILE", "write every event, JSON lines (.jsonl) or CSV (.csv)"},
    {"save", OPT_STR, &tr.save, 0, 0, "MODEL", "save the trained network"},
    {"json", OPT_FLAG, &tr.json, 0, 0, NULL, "one JSON object a line; the last is the summary"},
    {"quiet", OPT_FLAG, &tr.quiet, 0, 0, NULL, "no table, no progress bar"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: %s train --data DIR [--val DIR] [--net NAME|FILE] [options]\n\n"
            "Trains a network while the next batches are read, decoded and augmented in the\n"
            "background. Names follow MATLAB's trainingOptions.\n\n",
            prog);
    print_options(f, TRAIN_OPTIONS);
}

typedef struct {
    FILE *log;
    int log_csv;
    dsrt_train_history *history;
    int tty;
} train_ctx;

static void fmt_time(double s, char *buf, size_t n) {
    int t = (int)s;
    snprintf(buf, n, "%02d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
}

static int on_event(void *p, const dsrt_train_event *e) {
    train_ctx *c = p;
    if (c->history) dsrt_train_history_add(c->history, e);
    if (c->log && (e->kind == DSRT_EVENT_ITERATION || e->kind == DSRT_EVENT_VALIDATION ||
                   e->kind == DSRT_EVENT_EPOCH)) {
        static const char *const kinds[] = {"start", "iteration",  "validation",
                                            "epoch", "checkpoint", "end"};
        if (c->log_csv)
            fprintf(c->log, "%s,%lld,%lld,%.3f,%.6g,%.6g,%.6g,%.6g,%.6g\n", kinds[e->kind],
                    (long long)e->epoch, (long long)e->iteration, e->elapsed_s, e->learn_rate,
                    e->loss, e->accuracy, e->val_loss, e->val_accuracy);
        else
            fprintf(c->log,
                    "{\"event\":\"%s\",\"epoch\":%lld,\"iteration\":%lld,\"elapsed_s\":%.3f,"
                    "\"learn_rate\":%.6g,\"loss\":%.6g,\"accuracy\":%.6g,\"val_loss\":%.6g,"
                    "\"val_accuracy\":%.6g}\n",
                    kinds[e->kind], (long long)e->epoch, (long long)e->iteration, e->elapsed_s,
                    e->learn_rate, e->kind == DSRT_EVENT_ITERATION ? e->loss : 0,
                    e->kind == DSRT_EVENT_ITERATION ? e->accuracy : 0,
                    e->val_loss == e->val_loss ? e->val_loss : -1,
                    e->val_accuracy == e->val_accuracy ? e->val_accuracy : -1);
    }
    if (tr.quiet) return 0;
    char t[32];
    fmt_time(e->elapsed_s, t, sizeof t);
    if (tr.json) {
        if (e->kind == DSRT_EVENT_EPOCH)
            printf("{\"epoch\":%lld,\"iteration\":%lld,\"elapsed_s\":%.2f,\"loss\":%.5f,"
                   "\"accuracy\":%.4f,\"images_per_s\":%.1f,\"learn_rate\":%.6g}\n",
                   (long long)e->epoch, (long long)e->iteration, e->elapsed_s, e->loss, e->accuracy,
                   e->images_per_s, e->learn_rate);
        else if (e->kind == DSRT_EVENT_VALIDATION)
            printf("{\"validation\":true,\"epoch\":%lld,\"iteration\":%lld,\"val_loss\":%.5f,"
                   "\"val_accuracy\":%.4f}\n",
                   (long long)e->epoch, (long long)e->iteration, e->val_loss, e->val_accuracy);
        fflush(stdout);
        return 0;
    }
    if (e->kind == DSRT_EVENT_START) {
        printf("Training on the CPU: %u pipeline worker%s, %d compute thread%s%s\n", e->workers,
               e->workers == 1 ? "" : "s", e->compute_threads, e->compute_threads == 1 ? "" : "s",
               e->pinned ? " (pinned)" : "");
        printf("|=================================================================================="
               "=====|\n"
               "|  Epoch  |  Iteration  |  Time Elapsed  |  Mini-batch  |  Validation  |  "
               "Mini-batch  |  Base Learning  |\n"
               "|         |             |   (hh:mm:ss)   |   Accuracy   |   Accuracy   |     Loss  "
               "   |      Rate       |\n"
               "|=================================================================================="
               "=====|\n");
    } else if (e->kind == DSRT_EVENT_ITERATION && e->verbose) {
        if (c->tty) fprintf(stderr, "\r\033[K");
        printf("| %7lld | %11lld | %14s | %11.2f%% | %12s | %12.4f | %15.4g |\n",
               (long long)e->epoch, (long long)e->iteration, t, 100 * e->accuracy, "", e->loss,
               e->learn_rate);
        fflush(stdout);
    } else if (e->kind == DSRT_EVENT_VALIDATION) {
        if (c->tty) fprintf(stderr, "\r\033[K");
        char v[32];
        snprintf(v, sizeof v, "%.2f%%", 100 * e->val_accuracy);
        printf("| %7lld | %11lld | %14s | %12s | %12s | %12s | %15s |\n", (long long)e->epoch,
               (long long)e->iteration, t, "", v, "", "");
        fflush(stdout);
    } else if (e->kind == DSRT_EVENT_ITERATION && c->tty && e->max_iterations > 0) {
        int width = 30, done = (int)(width * e->iteration / e->max_iterations);
        fprintf(stderr, "\r[%.*s%*s] %lld/%lld  %.0f images/s", done,
                "##############################", width - done, "", (long long)e->iteration,
                (long long)e->max_iterations, e->images_per_s);
    } else if (e->kind == DSRT_EVENT_END) {
        if (c->tty) fprintf(stderr, "\r\033[K");
        printf("|=================================================================================="
               "=====|\n");
    }
    return 0;
}

/* Reads a description file, or returns the built-in name as it is. */
static char *load_spec(const char *net) {
    if (dsrt_net_builtin(net, NULL)) return strdup(net);
    FILE *f = fopen(net, "rb");
    if (!f) {
        fprintf(stderr,
                "%s train: --net %s: neither a built-in network (digits, cifar, alexnet) "
                "nor a readable file (%s)\n",
                prog, net, strerror(errno));
        return NULL;
    }
    char *text = NULL;
    size_t len = 0, cap = 0, got;
    char buf[65536];
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        if (len + got + 1 > cap) {
            cap = 2 * (len + got + 1);
            char *t = realloc(text, cap);
            if (!t) break;
            text = t;
        }
        memcpy(text + len, buf, got);
        len += got;
    }
    fclose(f);
    if (text) text[len] = '\0';
    return text;
}

static int parse_choice(const char *opt, const char *v, const char *const *names, int n, int *out) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i])) {
            *out = i;
            return 0;
        }
    fprintf(stderr, "%s: --%s: '%s' is not one of", prog, opt, v);
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", names[i]);
    fputc('\n', stderr);
    return -1;
}

static int cmd_train(int argc, char **argv) {
    memset(&tr, 0, sizeof tr);
    tr.net = "digits";
    tr.epochs = 30;
    tr.batch = 128;
    tr.lr = -1;
    tr.momentum = -1;
    tr.l2 = -1;
    tr.drop_factor = -1;
    tr.lr_factor = 1;
    tr.verbose_frequency = 50;
    tr.checkpoint_frequency = 1;
    tr.prefetch = 4;
    int rc = parse_options("train", argc, argv, TRAIN_OPTIONS, train_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (!tr.data) {
        fprintf(stderr, "%s train: --data DIR is required (see %s train --help)\n", prog, prog);
        return 2;
    }

    /* Every choice is checked before any work starts. */
    static const char *const solvers[] = {"sgdm", "adam", "rmsprop"};
    static const char *const shuffles[] = {"never", "once", "every-epoch"};
    static const char *const outputs[] = {"last", "best-validation"};
    static const char *const execs[] = {"auto", "cpu", "gpu", "multi-gpu", "parallel"};
    static const char *const schedules[] = {"none", "piecewise"};
    int solver = 0, shuffle = 2, output = 0, exec = 0, schedule = 0;
    if ((tr.solver && parse_choice("solver", tr.solver, solvers, 3, &solver)) ||
        (tr.shuffle && parse_choice("shuffle", tr.shuffle, shuffles, 3, &shuffle)) ||
        (tr.output_network &&
         parse_choice("output-network", tr.output_network, outputs, 2, &output)) ||
        (tr.exec && parse_choice("execution-environment", tr.exec, execs, 5, &exec)) ||
        (tr.schedule && parse_choice("lr-schedule", tr.schedule, schedules, 2, &schedule)))
        return 2;
    if (exec >= DSRT_EXEC_GPU) {
        fprintf(stderr,
                "%s train: --execution-environment %s: this build of dsrt trains on the "
                "CPU only (auto or cpu); GPU training is not available yet\n",
                prog, tr.exec);
        return 2;
    }
    if (tr.plot && (strlen(tr.plot) < 4 || strcmp(tr.plot + strlen(tr.plot) - 4, ".svg"))) {
        fprintf(stderr, "%s train: --plot %s: the plot is an SVG file (name it .svg)\n", prog,
                tr.plot);
        return 2;
    }

    int status = 1;
    dsrt_datastore *ds = NULL, *val = NULL;
    dsrt_net *net = NULL, *base = NULL;
    char *spec = NULL, *desc = NULL;
    train_ctx ctx = {0};
    ctx.tty = isatty(2) && !tr.json && !tr.quiet;

    if (dsrt_datastore_open(&ds, tr.data, NULL) != 0) goto fail;
    if (tr.val && dsrt_datastore_open(&val, tr.val, NULL) != 0) goto fail;
    if (dsrt_datastore_warning_count(ds) && !tr.json)
        fprintf(stderr, "%s", dsrt_datastore_warnings(ds));

    dsrt_net_options no = dsrt_net_defaults();
    no.seed = tr.seed;
    no.threads = tr.threads;
    int classes = (int)dsrt_datastore_num_classes(ds);
    if (tr.transfer) {
        if (dsrt_model_load(&base, tr.transfer, &no) != 0) goto fail;
        dsrt_transfer_options to = dsrt_transfer_defaults();
        to.classes = classes;
        to.base_lr_factor = (float)tr.lr_factor;
        const char **names = calloc((size_t)classes, sizeof *names);
        if (!names) goto fail;
        for (int c = 0; c < classes; c++) names[c] = dsrt_datastore_class_name(ds, (size_t)c);
        to.class_names = names;
        int trc = dsrt_net_transfer(&net, base, &to, &no);
        free(names);
        if (trc != 0) goto fail;
    } else {
        if (!(spec = load_spec(tr.net))) goto done;
        if (!(desc = dsrt_describe_datastore_classes(spec, ds))) goto fail;
        if (dsrt_net_create(&net, desc, 0, 0, 0, classes, &no) != 0) goto fail;
    }

    dsrt_train_options o = dsrt_train_defaults();
    o.max_epochs = tr.epochs;
    o.batch = tr.batch;
    o.shuffle = (dsrt_shuffle)shuffle;
    o.drop_last = tr.drop_last;
    o.optimizer = dsrt_optimizer_defaults((dsrt_solver)solver);
    if (tr.lr >= 0) o.optimizer.learn_rate = tr.lr;
    if (tr.momentum >= 0) o.optimizer.momentum = tr.momentum;
    if (tr.l2 >= 0) o.optimizer.l2 = tr.l2;
    o.optimizer.schedule = (dsrt_lr_schedule)schedule;
    if (tr.drop_factor >= 0) o.optimizer.drop_factor = tr.drop_factor;
    if (tr.drop_period) o.optimizer.drop_period = tr.drop_period;
    if (tr.grad_threshold > 0) o.optimizer.grad_threshold = tr.grad_threshold;
    o.validation = val;
    o.validation_frequency = tr.val_frequency;
    o.validation_patience = tr.val_patience;
    o.verbose_frequency = tr.verbose_frequency;
    o.output_network = (dsrt_output_network)output;
    o.checkpoint_path = tr.checkpoint_dir;
    o.checkpoint_frequency = tr.checkpoint_frequency;
    o.resume = tr.resume;
    o.execution = (dsrt_execution)exec;
    o.augment.rand_x_reflection = tr.x_reflection;
    o.augment.rand_y_reflection = tr.y_reflection;
    if (tr.translation > 0) {
        o.augment.rand_x_translation[0] = o.augment.rand_y_translation[0] = -tr.translation;
        o.augment.rand_x_translation[1] = o.augment.rand_y_translation[1] = tr.translation;
    }
    o.seed = tr.seed;
    o.workers = (unsigned)tr.workers;
    o.compute_threads = tr.threads;
    o.cpus = tr.cpus;
    o.prefetch = (unsigned)tr.prefetch;
    o.fail_on_error = tr.fail_on_error;
    o.callback = on_event;
    o.callback_ctx = &ctx;
    if (dsrt_train_check(&o, net, ds) != 0) goto fail;

    if (tr.log) {
        if (!(ctx.log = fopen(tr.log, "w"))) {
            fprintf(stderr, "%s train: --log %s: %s\n", prog, tr.log, strerror(errno));
            goto done;
        }
        size_t n = strlen(tr.log);
        ctx.log_csv = n > 4 && !strcmp(tr.log + n - 4, ".csv");
        if (ctx.log_csv)
            fprintf(ctx.log, "event,epoch,iteration,elapsed_s,learn_rate,loss,accuracy,val_loss,"
                             "val_accuracy\n");
    }
    if (tr.plot && dsrt_train_history_create(&ctx.history) != 0) goto fail;

    dsrt_train_result r;
    int trc = dsrt_train(net, ds, &o, &r);
    if (ctx.history && dsrt_train_history_svg(ctx.history, tr.plot, "dstrain") != 0)
        fprintf(stderr, "%s train: --plot: %s\n", prog, dsrt_last_error());
    if (trc != 0) goto fail;
    if (tr.save && dsrt_model_save(tr.save, net) != 0) goto fail;

    static const char *const stops[] = {"max-epochs", "validation-patience", "callback", "error"};
    if (tr.json) {
        printf("{\"summary\":true,\"images_per_s\":%.1f,\"val_accuracy\":%.4f,\"val_loss\":%.5f,"
               "\"epochs\":%lld,\"iterations\":%lld,\"train_s\":%.2f,\"val_s\":%.2f,"
               "\"images\":%llu,\"skipped\":%llu,\"loss\":%.5f,\"accuracy\":%.4f,"
               "\"workers\":%u,\"compute_threads\":%d,\"consumer_wait_s\":%.3f,"
               "\"stop\":\"%s\",\"seed\":%llu,\"weights_checksum\":\"%016llx\"}\n",
               r.images_per_s, r.val_accuracy == r.val_accuracy ? r.val_accuracy : -1.0,
               r.val_loss == r.val_loss ? r.val_loss : -1.0, (long long)r.epochs,
               (long long)r.iterations, r.train_s, r.val_s, (unsigned long long)r.images,
               (unsigned long long)r.skipped, r.loss, r.accuracy, r.workers, r.compute_threads,
               r.consumer_wait_s, stops[r.stop], (unsigned long long)r.seed,
               (unsigned long long)r.weights_checksum);
    } else if (!tr.quiet) {
        printf("Training finished (%s): %lld epochs, %lld iterations, %.1f s, %.0f images/s "
               "(loading included; the compute waited %.2f s for data)\n",
               stops[r.stop], (long long)r.epochs, (long long)r.iterations, r.train_s,
               r.images_per_s, r.consumer_wait_s);
        if (r.val_accuracy == r.val_accuracy)
            printf("Validation accuracy: %.2f%% (loss %.4f)\n", 100 * r.val_accuracy, r.val_loss);
        if (r.skipped) printf("%llu unreadable images skipped\n", (unsigned long long)r.skipped);
        printf("Weights checksum: %016llx\n", (unsigned long long)r.weights_checksum);
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "%s train: %s\n", prog, dsrt_last_error());
done:
    if (ctx.log) fclose(ctx.log);
    dsrt_train_history_destroy(ctx.history);
    free(spec);
    free(desc);
    dsrt_net_destroy(net);
    dsrt_net_destroy(base);
    dsrt_datastore_close(val);
    dsrt_datastore_close(ds);
    return status;
}

// ----------------------------------------------------------------------------
// eval

static struct {
    const char *model, *data;
    int batch, threads, json;
} ev;

static const option EVAL_OPTIONS[] = {
    {"model", OPT_STR, &ev.model, 0, 0, "MODEL", "a model saved by dstrain train --save"},
    {"data", OPT_STR, &ev.data, 0, 0, "DIR", "labelled data (a folder of class folders, ...)"},
    {"batch", OPT_INT, &ev.batch, 1, 1 << 20, "B", "images a batch [128]"},
    {"threads", OPT_INT, &ev.threads, 0, 4096, "T", "compute threads [0: automatic]"},
    {"json", OPT_FLAG, &ev.json, 0, 0, NULL, "one JSON line"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

static void eval_usage(FILE *f) {
    fprintf(
        f,
        "usage: %s eval --model MODEL --data DIR [options]\n\n"
        "Accuracy, per-class accuracy and the confusion matrix of a model on labelled data.\n\n",
        prog);
    print_options(f, EVAL_OPTIONS);
}

static int cmd_eval(int argc, char **argv) {
    memset(&ev, 0, sizeof ev);
    ev.batch = 128;
    int rc = parse_options("eval", argc, argv, EVAL_OPTIONS, eval_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (!ev.model || !ev.data) {
        fprintf(stderr, "%s eval: --model and --data are required\n", prog);
        return 2;
    }
    int status = 1;
    dsrt_net *net = NULL;
    dsrt_datastore *ds = NULL;
    dsrt_eval_result r;
    memset(&r, 0, sizeof r);
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = ev.threads;
    if (dsrt_model_load(&net, ev.model, &no) != 0 || dsrt_datastore_open(&ds, ev.data, NULL) != 0)
        goto fail;
    dsrt_eval_options eo = dsrt_eval_defaults();
    eo.batch = ev.batch;
    eo.compute_threads = ev.threads;
    if (dsrt_evaluate(net, ds, &eo, &r) != 0) goto fail;
    int k = r.classes;
    char name[256];
    if (ev.json) {
        printf("{\"images\":%llu,\"correct\":%llu,\"accuracy\":%.5f,\"loss\":%.5f,"
               "\"images_per_s\":%.1f,\"skipped\":%llu,\"per_class\":[",
               (unsigned long long)r.images, (unsigned long long)r.correct, r.accuracy, r.loss,
               r.images_per_s, (unsigned long long)r.skipped);
        for (int t = 0; t < k; t++) {
            uint64_t n = 0;
            for (int p = 0; p < k; p++) n += r.confusion[t * k + p];
            printf("%s%.5f", t ? "," : "", n ? (double)r.confusion[t * k + t] / n : 0.0);
        }
        printf("],\"confusion\":[");
        for (int t = 0; t < k; t++) {
            printf("%s[", t ? "," : "");
            for (int p = 0; p < k; p++)
                printf("%s%llu", p ? "," : "", (unsigned long long)r.confusion[t * k + p]);
            printf("]");
        }
        printf("]}\n");
    } else {
        printf("%s on %s: accuracy %.2f%% (%llu of %llu), loss %.4f, %.0f images/s\n", ev.model,
               ev.data, 100 * r.accuracy, (unsigned long long)r.correct,
               (unsigned long long)r.images, r.loss, r.images_per_s);
        if (r.skipped) printf("%llu unreadable images skipped\n", (unsigned long long)r.skipped);
        printf("\n%-20s %9s %9s\n", "class", "images", "accuracy");
        for (int t = 0; t < k; t++) {
            uint64_t n = 0;
            for (int p = 0; p < k; p++) n += r.confusion[t * k + p];
            if (dsrt_net_class_name(net, t, name, sizeof name) < 0)
                snprintf(name, sizeof name, "%d", t);
            printf("%-20s %9llu %8.2f%%\n", name, (unsigned long long)n,
                   n ? 100.0 * r.confusion[t * k + t] / n : 0.0);
        }
        printf("\nconfusion matrix (rows: true class, columns: predicted)\n");
        for (int t = 0; t < k; t++) {
            for (int p = 0; p < k; p++) printf("%7llu", (unsigned long long)r.confusion[t * k + p]);
            putchar('\n');
        }
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "%s eval: %s\n", prog, dsrt_last_error());
done:
    dsrt_eval_result_free(&r);
    dsrt_datastore_close(ds);
    dsrt_net_destroy(net);
    return status;
}

// ----------------------------------------------------------------------------
// classify

static struct {
    const char *model;
    int top, json;
} cl;

static const option CLASSIFY_OPTIONS[] = {
    {"model", OPT_STR, &cl.model, 0, 0, "MODEL", "a model saved by dstrain train --save"},
    {"top", OPT_INT, &cl.top, 1, 1000, "K", "scores of the K likeliest classes [3]"},
    {"json", OPT_FLAG, &cl.json, 0, 0, NULL, "one JSON line per image"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

static void classify_usage(FILE *f) {
    fprintf(f,
            "usage: %s classify --model MODEL [options] IMAGE|FOLDER...\n\n"
            "The label and scores of each image (JPEG or PNG), or of every image in a folder.\n\n",
            prog);
    print_options(f, CLASSIFY_OPTIONS);
}

/* Runs the net on one decoded image and prints its likeliest classes. */
static int classify_image(dsrt_net *net, dsrt_augmenter *aug, const dsrt_augment_options *ao,
                          const char *path, const dsrt_image *img, float *x, float *scores, int k) {
    if (dsrt_augment_apply(aug, ao, img, img->width, img->height, 0, 0, 0, x) != 0 ||
        dsrt_net_predict(net, x, 1, scores, NULL, NULL, NULL) != 0) {
        fprintf(stderr, "%s classify: %s: %s\n", prog, path, dsrt_last_error());
        return 1;
    }
    int order[1000], top = cl.top < k ? cl.top : k;
    for (int j = 0; j < top; j++) {
        int best = -1;
        for (int c = 0; c < k; c++) {
            int used = 0;
            for (int q = 0; q < j; q++) used |= order[q] == c;
            if (!used && (best < 0 || scores[c] > scores[best])) best = c;
        }
        order[j] = best;
    }
    char name[256];
    if (cl.json) {
        printf("{\"file\":");
        putchar('"');
        for (const char *s = path; *s; s++) {
            if (*s == '"' || *s == '\\') putchar('\\');
            putchar(*s);
        }
        printf("\",\"top\":[");
    } else {
        printf("%s:", path);
    }
    for (int j = 0; j < top; j++) {
        if (dsrt_net_class_name(net, order[j], name, sizeof name) < 0)
            snprintf(name, sizeof name, "%d", order[j]);
        if (cl.json)
            printf("%s{\"class\":\"%s\",\"index\":%d,\"score\":%.5f}", j ? "," : "", name, order[j],
                   scores[order[j]]);
        else
            printf(" %s %.4f", name, scores[order[j]]);
    }
    printf(cl.json ? "]}\n" : "\n");
    return 0;
}

static int cmd_classify(int argc, char **argv) {
    memset(&cl, 0, sizeof cl);
    cl.top = 3;
    /* Options first, then the images. */
    int nopt = 0;
    while (nopt < argc && !strncmp(argv[nopt], "--", 2)) {
        const option *o = CLASSIFY_OPTIONS;
        const char *name = argv[nopt] + 2;
        while (o->name && strncmp(o->name, name, strlen(o->name))) o++;
        nopt += (o->name && o->type != OPT_FLAG && !strchr(name, '=')) ? 2 : 1;
    }
    if (nopt > argc) nopt = argc;
    int rc = parse_options("classify", nopt, argv, CLASSIFY_OPTIONS, classify_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (!cl.model || nopt == argc) {
        fprintf(stderr,
                "%s classify: --model MODEL and at least one image or folder are "
                "required\n",
                prog);
        return 2;
    }
    int status = 1, bad = 0;
    dsrt_net *net = NULL;
    dsrt_decoder *dec = NULL;
    dsrt_augmenter *aug = NULL;
    float *x = NULL, *scores = NULL;
    if (dsrt_model_load(&net, cl.model, NULL) != 0 || dsrt_decoder_create(&dec, NULL) != 0 ||
        dsrt_augmenter_create(&aug) != 0)
        goto fail;
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    dsrt_augment_options ao = dsrt_augment_defaults();
    ao.output_height = info.height;
    ao.output_width = info.width;
    ao.output_channels = info.channels;
    x = malloc(dsrt_augment_sample_bytes(&ao));
    scores = malloc((size_t)info.classes * sizeof *scores);
    if (!x || !scores) goto fail;
    for (int a = nopt; a < argc; a++) {
        dsrt_datastore *ds = NULL;
        dsrt_datastore_options dso = dsrt_datastore_defaults();
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "%s classify: %s: %s\n", prog, argv[a], strerror(errno));
            bad++;
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            dso.label_source = DSRT_LABEL_NONE;
            dso.source = DSRT_SOURCE_FOLDER;
            if (dsrt_datastore_open(&ds, argv[a], &dso) != 0) {
                fprintf(stderr, "%s classify: %s\n", prog, dsrt_last_error());
                bad++;
                continue;
            }
            dsrt_decode_request req = {.channels = info.channels};
            for (size_t i = 0; i < dsrt_datastore_count(ds); i++) {
                dsrt_image img;
                if (dsrt_datastore_read_image(ds, i, dec, &req, &img) != 0) {
                    fprintf(stderr, "%s classify: %s\n", prog, dsrt_last_error());
                    bad++;
                    continue;
                }
                bad += classify_image(net, aug, &ao, dsrt_datastore_path(ds, i), &img, x, scores,
                                      info.classes);
            }
            dsrt_datastore_close(ds);
        } else {
            /* One file: read and decoded here, not through a datastore. */
            FILE *f = fopen(argv[a], "rb");
            unsigned char *buf = NULL;
            long n = -1;
            if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
                (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
                dsrt_decode_request req = {.channels = info.channels};
                dsrt_image img;
                if (dsrt_decode(dec, buf, (size_t)n, &req, &img) != 0) {
                    fprintf(stderr, "%s classify: %s: %s\n", prog, argv[a], dsrt_last_error());
                    bad++;
                } else {
                    bad += classify_image(net, aug, &ao, argv[a], &img, x, scores, info.classes);
                }
            } else {
                fprintf(stderr, "%s classify: %s: cannot read\n", prog, argv[a]);
                bad++;
            }
            free(buf);
            if (f) fclose(f);
        }
    }
    status = bad ? 1 : 0;
    goto done;
fail:
    fprintf(stderr, "%s classify: %s\n", prog, dsrt_last_error());
done:
    free(x);
    free(scores);
    dsrt_augmenter_destroy(aug);
    dsrt_decoder_destroy(dec);
    dsrt_net_destroy(net);
    return status;
}

// ----------------------------------------------------------------------------
// Subcommands

static const command COMMANDS[] = {
    {"train", "train a network on an image folder, loading in the background", cmd_train},
    {"eval", "accuracy, per-class accuracy and confusion matrix of a model", cmd_eval},
    {"classify", "label and scores of image files or a folder", cmd_classify},
    {"bench", "time training steps on random data (no loader)", cmd_bench},
};

static void usage(FILE *f) {
    fprintf(f, "usage: %s COMMAND [options]\n\ncommands:\n", prog);
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(f, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f,
            "\n`%s COMMAND --help` describes a command's options. %s --version prints the "
            "library version.\n",
            prog, prog);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("dstrain (dsrt %s)\n", dsrt_version_string());
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(COMMANDS[i].name, cmd)) return COMMANDS[i].run(argc - 2, argv + 2);
    fprintf(stderr, "%s: unknown command '%s' (see %s --help)\n", prog, cmd, prog);
    return 2;
}

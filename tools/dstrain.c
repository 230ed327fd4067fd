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
 */
#include <dsrt/core.h>
#include <dsrt/nn.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Options

typedef enum { OPT_FLAG, OPT_INT, OPT_STR, OPT_U64 } opt_type;

typedef struct {
    const char *name; /* without the leading "--" */
    opt_type type;
    void *value;     /* int *, const char **, uint64_t * */
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
// Subcommands

static const command COMMANDS[] = {
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

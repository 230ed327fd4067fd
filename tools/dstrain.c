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

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool_common.h"
#include "tool_options.h"

// ----------------------------------------------------------------------------
// Options

/* OPT_STRS: an option that may be given several times, each value kept
 * in a str_list. */
typedef enum { OPT_FLAG, OPT_INT, OPT_STR, OPT_U64, OPT_DBL, OPT_STRS } opt_type;

#define STR_LIST_MAX 64
typedef struct {
    const char *v[STR_LIST_MAX];
    size_t n;
} str_list;

/* A binding: the option's row in the library's tables (dsrt/options.h:
 * name, type, range, default, help) gives everything but where its value
 * goes, which is this. */
typedef struct {
    const char *name; /* without the leading "--" */
    opt_type type;
    void *value; /* int *, const char **, uint64_t *, double *, str_list * */
} option;

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} command;

static const char *prog = "dstrain";

/* The loop's state file beside each checkpoint (see dsrt/train.h). */
#define STATE_SUFFIX_TEXT ".state"

static const struct {
    const char *name;
    unsigned where;
} COMMAND_BITS[] = {{"train", DSRT_IN_TRAIN},       {"eval", DSRT_IN_EVAL},
                    {"classify", DSRT_IN_CLASSIFY}, {"bench", DSRT_IN_BENCH},
                    {"scale", DSRT_IN_SCALE},       {"analyze", DSRT_IN_ANALYZE},
                    {"import", DSRT_IN_IMPORT},     {"export", DSRT_IN_EXPORT}};

static unsigned command_bit(const char *cmd) {
    for (size_t i = 0; i < sizeof COMMAND_BITS / sizeof COMMAND_BITS[0]; i++)
        if (!strcmp(cmd, COMMAND_BITS[i].name)) return COMMAND_BITS[i].where;
    return 0;
}

static tool_tables tables(void) {
    tool_tables t;
    t.count[0] = dsrt_train_option_groups(&t.groups[0]);
    t.count[1] = dsrt_option_groups(&t.groups[1]);
    return t;
}

/* The library's row for an option of cmd; every binding has one (test_tools
 * runs every command's --help, which looks them all up). */
static const dsrt_option *row_of(const char *cmd, const char *name) {
    tool_tables t = tables();
    const dsrt_option *row = tool_option_find(&t, name, command_bit(cmd), NULL);
    if (!row) tool_die("%s: --%s has no row in the option tables", cmd, name);
    return row;
}

/* The options of cmd in the order of its bindings, from their rows. */
static void print_options(FILE *f, const char *cmd, const option *opts) {
    fprintf(f, "\n");
    for (const option *o = opts; o->name; o++) tool_option_help_row(f, row_of(cmd, o->name));
    fprintf(f, "  %-24s %s\n", "--help", "show this help");
}

static const char *fail_cmd; /* for option_error */

static void option_error(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s %s: ", prog, fail_cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see %s %s --help)\n", prog, fail_cmd);
    exit(2);
}

/* Stores one option's value where its binding says. */
static void option_store(const option *o, const tool_arg *a) {
    if (o->type == OPT_FLAG) {
        *(int *)o->value = 1;
    } else if (o->type == OPT_STR) {
        *(const char **)o->value = a->value;
    } else if (o->type == OPT_STRS) {
        str_list *l = o->value;
        if (l->n == STR_LIST_MAX) option_error("%s: at most %d of them", a->spelled, STR_LIST_MAX);
        l->v[l->n++] = a->value;
    } else if (o->type == OPT_DBL) {
        *(double *)o->value = a->number;
    } else if (o->type == OPT_U64) {
        *(uint64_t *)o->value = strtoull(a->value, NULL, 10);
    } else {
        *(int *)o->value = (int)a->number;
    }
}

/* Parses argv (after the subcommand) against the rows of cmd's options and
 * their bindings opts. Returns 0, or 1 for --help (printed); exits with
 * status 2 after a message on a bad option or value. */
static int parse_options(const char *cmd, int argc, char **argv, const option *opts,
                         void (*usage)(FILE *)) {
    tool_tables t = tables();
    fail_cmd = cmd;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        tool_arg arg;
        if (tool_option_read(&t, command_bit(cmd), argc, argv, &i, &arg, option_error) != 0)
            option_error("unexpected argument '%s'", a);
        const option *o = opts;
        while (o->name && strcmp(o->name, arg.row->name)) o++;
        if (!o->name) option_error("unknown option '%s'", arg.spelled);
        option_store(o, &arg);
    }
    return 0;
}

/* Index of v among the names of cmd's option name (its row's choices, in
 * the order of the enum they stand for), or -1 after a message. */
static int parse_choice(const char *cmd, const char *name, const char *v) {
    char spelled[64];
    double index;
    snprintf(spelled, sizeof spelled, "--%s", name);
    if (dsrt_option_value(row_of(cmd, name), spelled, v, &index, NULL) == 0) return (int)index;
    fprintf(stderr, "%s %s: %s\n", prog, cmd, dsrt_last_error());
    return -1;
}

// ----------------------------------------------------------------------------
// Where nets compute

/* Requests to an object store, shared by train and eval: 0 leaves the
 * reader's default. */
typedef struct {
    int depth, max_connections;
    double retry_deadline, timeout;
    const char *cache_dir, *cache_limit;
} remote_opts;

#define REMOTE_OPTIONS(r)                                                                          \
    {"remote-depth", OPT_INT, &(r).depth}, {"max-connections", OPT_INT, &(r).max_connections},     \
        {"retry-deadline", OPT_DBL, &(r).retry_deadline},                                          \
        {"request-timeout", OPT_DBL, &(r).timeout}, {"cache-dir", OPT_STR, &(r).cache_dir}, {      \
        "cache-limit", OPT_STR, &(r).cache_limit                                                   \
    }

static void remote_set(dsrt_remote_options *o, const remote_opts *r) {
    o->depth = (unsigned)r->depth;
    o->max_connections = (unsigned)r->max_connections;
    o->retry_deadline_s = r->retry_deadline;
    o->timeout_s = r->timeout;
    o->cache_dir = r->cache_dir;
    o->cache_limit =
        r->cache_limit ? tool_bytes("--cache-limit", r->cache_limit, 0, UINT64_MAX) : 0;
}

/* --execution-environment, --gpu, --precision and --deterministic, shared by
 * the commands that run a net. */
typedef struct {
    const char *where, *precision;
    int gpu, deterministic;
} device_args;

#define DEVICE_OPTIONS(d)                                                                          \
    {"execution-environment", OPT_STR, &(d).where}, {"gpu", OPT_INT, &(d).gpu},                    \
        {"precision", OPT_STR, &(d).precision}, {                                                  \
        "deterministic", OPT_FLAG, &(d).deterministic                                              \
    }

/*
 * Resolves them into the net options and the execution environment, before
 * any work: a GPU that is not there, or bf16 on the CPU, is refused with a
 * message. Returns 0, or 2 after the message.
 */
static int resolve_device_args(const char *cmd, const device_args *d, dsrt_net_options *no,
                               dsrt_execution *exec) {
    int k = DSRT_EXEC_AUTO, p = DSRT_PRECISION_DEFAULT;
    if (d->where && (k = parse_choice(cmd, "execution-environment", d->where)) < 0) return 2;
    if (k >= DSRT_EXEC_MULTI_GPU && !exec) {
        fprintf(stderr,
                "%s %s: --execution-environment %s: data-parallel training is for %s train "
                "(here: auto, cpu or gpu)\n",
                prog, cmd, d->where, prog);
        return 2;
    }
    if (k >= DSRT_EXEC_MULTI_GPU &&
        dsrt_comm_available(k == DSRT_EXEC_MULTI_GPU ? DSRT_COMM_NCCL : DSRT_COMM_MPI) != 0) {
        fprintf(stderr, "%s %s: --execution-environment %s: %s\n", prog, cmd, d->where,
                dsrt_last_error());
        return 2;
    }
    if (k == DSRT_EXEC_MULTI_GPU && dsrt_gpu_count() < 1) {
        fprintf(stderr,
                "%s %s: --execution-environment multi-gpu: no CUDA device is visible (it trains "
                "on every GPU of this machine; for CPU workers use parallel under mpirun)\n",
                prog, cmd);
        return 2;
    }
    if (d->precision && (p = parse_choice(cmd, "precision", d->precision)) < 0) return 2;
    int device = DSRT_DEVICE_CPU;
    if (k == DSRT_EXEC_GPU) {
        if (dsrt_gpu_check(d->gpu) != 0) {
            fprintf(stderr, "%s %s: --execution-environment gpu: %s\n", prog, cmd,
                    dsrt_last_error());
            return 2;
        }
        device = d->gpu;
    } else if (k == DSRT_EXEC_AUTO && dsrt_gpu_count() > d->gpu) {
        device = d->gpu;
    } else if (k == DSRT_EXEC_MULTI_GPU || (k == DSRT_EXEC_PARALLEL && dsrt_gpu_count() > 0)) {
        device = 0; /* parallel: the rank's GPU is chosen once MPI has started */
    }
    if (device < 0 && p == DSRT_PRECISION_BF16) {
        fprintf(stderr,
                "%s %s: --precision bf16: the CPU computes in fp32 only (bf16 is for "
                "GPUs)\n",
                prog, cmd);
        return 2;
    }
    no->device = device;
    no->precision = (dsrt_precision)p;
    no->deterministic = d->deterministic;
    if (exec)
        *exec = k >= DSRT_EXEC_MULTI_GPU ? (dsrt_execution)k
                                         : (device >= 0 ? DSRT_EXEC_GPU : DSRT_EXEC_CPU);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX models where a model or net is named

/* --preprocess, --input-scale, --mean, --std, --classes and --input-size:
 * how an ONNX model's input is made from pixels, and its class names. */
typedef struct {
    const char *preprocess, *input_scale, *mean, *std, *classes, *size;
} onnx_args;

#define ONNX_OPTIONS(a)                                                                            \
    {"preprocess", OPT_STR, &(a).preprocess}, {"input-scale", OPT_STR, &(a).input_scale},          \
        {"mean", OPT_STR, &(a).mean}, {"std", OPT_STR, &(a).std}, {                                \
        "input-size", OPT_STR, &(a).size                                                           \
    }
/* ... and its class names (not for bench and analyze, whose --classes is a
 * count). */
#define ONNX_CLASSES_OPTION(a)                                                                     \
    { "classes", OPT_STR, &(a).classes }

/* 1 when path names an ONNX model (by its extension: the format has no
 * magic number). */
static int is_onnx_file(const char *path) {
    size_t n = strlen(path);
    return n > 5 && !strcasecmp(path + n - 5, ".onnx");
}

/* Comma-separated numbers into v (at most cap); the count, or -1. */
static int parse_floats(const char *s, float *v, int cap) {
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno || !isfinite(x) || n == cap) return -1;
        v[n++] = (float)x;
        if (*end == '\0') return n;
        if (*end != ',') return -1;
        p = end + 1;
    }
}

/* The class names of a --classes file, one a line (blank lines at the end
 * ignored); NULL after a message naming the file and the line. */
static char **read_class_names(const char *cmd, const char *path, int *n) {
    char why[256];
    size_t len;
    char *text = tool_read_file(path, (size_t)64 << 20, &len, why, sizeof why);
    if (!text) {
        fprintf(stderr, "%s %s: --classes %s: %s\n", prog, cmd, path, why);
        return NULL;
    }
    char **names = NULL;
    if (dsrt_class_names_parse(text, len, &names, n) != 0)
        fprintf(stderr, "%s %s: --classes %s: %s\n", prog, cmd, path, dsrt_last_error());
    free(text);
    return names;
}

/* The import options that a's flags say; 0, or 2 after a message. *names
 * (free_names) holds the --classes file's. */
static int onnx_resolve(const char *cmd, const onnx_args *a, dsrt_onnx_import_options *o,
                        char ***names) {
    *o = dsrt_onnx_import_defaults();
    *names = NULL;
    if (a->preprocess) {
        if (!strcmp(a->preprocess, "torchvision")) {
            dsrt_onnx_preprocess_torchvision(o);
        } else if (strcmp(a->preprocess, "none") != 0) {
            fprintf(stderr, "%s %s: --preprocess: '%s' is not torchvision or none\n", prog, cmd,
                    a->preprocess);
            return 2;
        }
    }
    if (a->input_scale) {
        char *end;
        double s = strtod(a->input_scale, &end);
        /* "1/255" reads as a fraction */
        if (*end == '/') {
            double d = strtod(end + 1, &end);
            s = d > 0 ? s / d : -1;
        }
        if (*end || !(s > 0) || !isfinite(s)) {
            fprintf(stderr, "%s %s: --input-scale: '%s' is not a positive number\n", prog, cmd,
                    a->input_scale);
            return 2;
        }
        o->input_scale = s;
    }
    const struct {
        const char *name, *value;
        float *v;
        int *n;
    } stats[] = {{"mean", a->mean, o->mean, &o->n_mean}, {"std", a->std, o->std, &o->n_std}};
    for (int k = 0; k < 2; k++) {
        if (!stats[k].value) continue;
        int n = parse_floats(stats[k].value, stats[k].v, DSRT_ONNX_CHANNELS_MAX);
        if (n < 1 || (k == 1 && n > 0 && !(stats[k].v[0] > 0))) {
            fprintf(stderr, "%s %s: --%s: '%s' is not 1 to %d numbers separated by commas%s\n",
                    prog, cmd, stats[k].name, stats[k].value, DSRT_ONNX_CHANNELS_MAX,
                    k ? " (each positive)" : "");
            return 2;
        }
        *stats[k].n = n;
    }
    if (a->size) {
        int h, w;
        char x;
        if (sscanf(a->size, "%dx%d%c", &h, &w, &x) != 2 || h < 1 || w < 1 || h > 65536 ||
            w > 65536) {
            fprintf(stderr, "%s %s: --input-size: '%s' is not HxW\n", prog, cmd, a->size);
            return 2;
        }
        o->height = h;
        o->width = w;
    }
    if (a->classes) {
        int n = 0;
        if (!(*names = read_class_names(cmd, a->classes, &n))) return 2;
        o->class_names = (const char *const *)*names;
        o->n_class_names = n;
    }
    return 0;
}

static void free_names(char **names) {
    dsrt_class_names_free(names);
}

/* Whether any of a's flags is given (they go with an ONNX model). */
static int onnx_given(const onnx_args *a) {
    return a->preprocess || a->input_scale || a->mean || a->std || a->classes || a->size;
}

/* Refuses a's flags when no ONNX model is named (path, path2 may be NULL):
 * 0, or 2 after a message. */
static int onnx_flags_alone(const char *cmd, const onnx_args *a, const char *path,
                            const char *path2) {
    if (!onnx_given(a) || (path && is_onnx_file(path)) || (path2 && is_onnx_file(path2))) return 0;
    fprintf(stderr,
            "%s %s: --preprocess, --input-scale, --mean, --std, --classes and --input-size go "
            "with an ONNX model (a .onnx file)\n",
            prog, cmd);
    return 2;
}

/* 1 when path is a regular file that starts as a dsrt model does. */
static int is_model_file(const char *path) {
    char magic[8] = {0}, why[8];
    long long size;
    int fd = tool_open_regular(path, why, sizeof why, &size);
    if (fd < 0) return 0;
    ssize_t n = pread(fd, magic, 8, 0);
    close(fd);
    return n == 8 && !memcmp(magic, "DSRTMODL", 8);
}

/*
 * The net of a model file: a dsrt model or checkpoint, or an ONNX model
 * (imported with a's options). what names the option in messages. Returns
 * 0, or 1 or 2 after a message.
 */
static int load_model(const char *cmd, const char *what, const char *path, const onnx_args *a,
                      const dsrt_net_options *no, dsrt_net **net) {
    if (!is_onnx_file(path)) {
        if (onnx_given(a)) {
            fprintf(stderr,
                    "%s %s: --preprocess, --input-scale, --mean, --std, --classes and "
                    "--input-size go with an ONNX model (%s is not a .onnx file)\n",
                    prog, cmd, path);
            return 2;
        }
        if (dsrt_model_load(net, path, no) != 0) {
            fprintf(stderr, "%s %s: %s: %s\n", prog, cmd, what, dsrt_last_error());
            return 1;
        }
        return 0;
    }
    dsrt_onnx_import_options o;
    char **names;
    int rc = onnx_resolve(cmd, a, &o, &names);
    if (rc) return rc;
    rc = dsrt_onnx_import(net, path, &o, no);
    free_names(names);
    if (rc) {
        fprintf(stderr, "%s %s: %s: %s\n", prog, cmd, what, dsrt_last_error());
        return 1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// bench

static struct {
    const char *net, *solver, *input;
    int batch, steps, warmup, threads, classes, json, no_fuse, profile, no_graphs, inference;
    uint64_t seed;
    device_args dev;
    onnx_args onnx;
} bench;

static const option BENCH_OPTIONS[] = {
    {"net", OPT_STR, &bench.net},
    {"batch", OPT_INT, &bench.batch},
    {"steps", OPT_INT, &bench.steps},
    {"warmup", OPT_INT, &bench.warmup},
    {"threads", OPT_INT, &bench.threads},
    {"num-classes", OPT_INT, &bench.classes},
    {"solver", OPT_STR, &bench.solver},
    {"seed", OPT_U64, &bench.seed},
    {"no-fuse", OPT_FLAG, &bench.no_fuse},
    {"no-cuda-graphs", OPT_FLAG, &bench.no_graphs},
    {"input", OPT_STR, &bench.input},
    {"profile", OPT_FLAG, &bench.profile},
    {"inference", OPT_FLAG, &bench.inference},
    DEVICE_OPTIONS(bench.dev),
    ONNX_OPTIONS(bench.onnx),
    {"json", OPT_FLAG, &bench.json},
    {NULL, 0, NULL},
};

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: %s bench [options]\n\n"
            "Times training steps (forward, backward, optimizer step) on random data, with no\n"
            "data loading: the median step time after the warm-up steps, as images/s. SGD with\n"
            "momentum 0.9, learning rate 0.01, L2 1e-4 unless --solver says otherwise.\n"
            "GFLOP counts the arithmetic of direct convolutions and matrix products (forward,\n"
            "backward data and weights); Winograd convolutions do less, so GFLOP/s can pass\n"
            "the machine's peak. On a GPU each step's batch (uint8 pixels, as the loader makes\n"
            "them for a GPU; --input f32 for float) is copied from pinned host memory while\n"
            "the step before computes, as in training, and each step is timed to the end of\n"
            "its work on the device. --profile adds a table of where a step's time\n"
            "goes, layer by layer (forward, backward, the optimizer, the idle gaps between\n"
            "layers), from as many steps again timed with device events on a GPU and the\n"
            "clock on the CPU. --inference times the forward pass of inference instead\n"
            "(what classify and eval run on a batch), a step being one batch.\n\n"
            "options:\n",
            prog);
    print_options(f, "bench", BENCH_OPTIONS);
}

/* The per-layer profile of net (dstrain bench --profile): a table on out,
 * or with json the object's members after a comma (on the line). */
static void print_profile(dsrt_net *net, int json) {
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    dsrt_layer_profile *lp = calloc((size_t)info.layers, sizeof *lp);
    dsrt_net_profile p;
    if (!lp || dsrt_net_profile_read(net, &p, lp, info.layers) < 0) {
        fprintf(stderr, "%s bench: profile: %s\n", prog, lp ? dsrt_last_error() : "out of memory");
        free(lp);
        return;
    }
    if (json) {
        char b[5][32];
        printf(", \"profile\": {\"steps\": %lld, \"timer\": \"%s\", \"step_ms\": %s, "
               "\"layers_ms\": %s, \"optimizer_ms\": %s, \"gaps_ms\": %s, "
               "\"gaps_per_step\": %s, \"graph_steps\": %lld, \"captures\": %lld, "
               "\"cuda_graphs\": %s, \"fused_library\": %d, \"fused_kernel\": %d, \"layers\": [",
               (long long)p.steps, p.device_events ? "device events" : "host clock",
               tool_json_number(b[0], "%.4f", p.step_ms),
               tool_json_number(b[1], "%.4f", p.layers_ms),
               tool_json_number(b[2], "%.4f", p.optimizer_ms),
               tool_json_number(b[3], "%.4f", p.gaps_ms),
               tool_json_number(b[4], "%.1f", p.gaps_per_step), (long long)p.graph_steps,
               (long long)p.captures, p.graphs ? "true" : "false", p.fused_library, p.fused_kernel);
        for (int i = 0; i < info.layers; i++) {
            printf("%s{\"name\": ", i ? ", " : "");
            tool_json_string(stdout, lp[i].name);
            printf(", \"type\": ");
            tool_json_string(stdout, lp[i].type);
            printf(", \"forward_ms\": %s, \"backward_ms\": %s, \"relu_fused\": %d}",
                   tool_json_number(b[0], "%.4f", lp[i].forward_ms),
                   tool_json_number(b[1], "%.4f", lp[i].backward_ms), lp[i].relu_fused);
        }
        printf("]");
        if (p.note && *p.note) {
            printf(", \"note\": ");
            tool_json_string(stdout, p.note);
        }
        printf("}");
        free(lp);
        return;
    }
    double total = p.layers_ms + p.optimizer_ms;
    printf("\nprofile: %lld steps timed by %s\n", (long long)p.steps,
           p.device_events ? "device events" : "the host's clock");
    printf("  %-16s %-15s %10s %10s %7s\n", "layer", "type", "fwd ms", "bwd ms", "share");
    for (int i = 0; i < info.layers; i++) {
        if (i > 0 && lp[i].forward_ms == 0 && lp[i].backward_ms == 0) continue; /* fused away */
        char type[24];
        snprintf(type, sizeof type, "%s%s", lp[i].type, lp[i].relu_fused ? "+relu" : "");
        printf("  %-16s %-15s %10.3f %10.3f %6.1f%%\n", lp[i].name, type, lp[i].forward_ms,
               lp[i].backward_ms,
               total > 0 ? 100.0 * (lp[i].forward_ms + lp[i].backward_ms) / total : 0.0);
    }
    printf("  %-16s %-15s %10.3f %10s %6.1f%%\n", "optimizer", "", p.optimizer_ms, "",
           total > 0 ? 100.0 * p.optimizer_ms / total : 0.0);
    printf("  a step: %.3f ms from its first layer to its last, %.3f ms in layers; %.3f ms of "
           "gaps between layers (%.0f intervals)\n",
           p.step_ms, p.layers_ms, p.gaps_ms, p.gaps_per_step);
    if (p.device_events)
        printf("  %lld of %lld steps replayed from CUDA graphs (%lld recordings%s); %d layers "
               "fused by cuDNN, %d by a dsrt kernel\n",
               (long long)p.graph_steps, (long long)p.steps, (long long)p.captures,
               p.graphs ? "" : ", graphs off", p.fused_library, p.fused_kernel);
    if (p.note && *p.note) printf("  note: %s\n", p.note);
    free(lp);
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

/* The 95th percentile of sorted v (nearest rank: the smallest value that
 * 95% of them do not pass). */
static double p95_of(const double *v, int n) {
    int k = (int)ceil(0.95 * n) - 1;
    return v[k < 0 ? 0 : k];
}

/* Largest network description file read. */
#define NET_TEXT_MAX ((size_t)1 << 20)
/* Largest image file classify reads. */
#define IMAGE_FILE_MAX ((size_t)256 << 20)

/* A network description file: NULL with the reason in why when it is not a
 * regular file, too large, empty or not text. */
static char *read_net_text(const char *path, char *why, size_t why_cap) {
    size_t len;
    char *text = tool_read_file(path, NET_TEXT_MAX, &len, why, why_cap);
    if (!text) return NULL;
    const char *bad = NULL;
    size_t words = 0;
    for (size_t i = 0; i < len && !bad; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == 0 || (c < 0x20 && c != '\n' && c != '\r' && c != '\t') || c == 0x7f)
            bad = "binary data, not a network description (one layer a line)";
        words += !isspace(c) && (i == 0 || isspace((unsigned char)text[i - 1]));
    }
    if (!bad && words == 0) bad = "empty: a network description lists one layer a line";
    if (bad) {
        snprintf(why, why_cap, "%s", bad);
        free(text);
        return NULL;
    }
    return text;
}

/* The --solver option's optimizer defaults; -1 when unknown. */
static int bench_solver(const char *name, dsrt_optimizer_options *oo) {
    if (!strcmp(name, "sgdm"))
        *oo = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    else if (!strcmp(name, "adam"))
        *oo = dsrt_optimizer_defaults(DSRT_SOLVER_ADAM);
    else if (!strcmp(name, "rmsprop"))
        *oo = dsrt_optimizer_defaults(DSRT_SOLVER_RMSPROP);
    else {
        fprintf(stderr, "%s bench: --solver: '%s' is not one of sgdm, adam, rmsprop\n", prog, name);
        return -1;
    }
    return 0;
}

/* Uniform [0, 1) pixels and uniform labels, like torch.rand/randint:
 * as floats, or as uint8 scaled by 1/255 on the device. */
static void bench_fill(float *x, int32_t *y, int batch, size_t per, int u8, int classes) {
    uint64_t s = bench.seed * 0x9e3779b97f4a7c15ULL + 1;
    uint8_t *px = (uint8_t *)x;
    for (size_t i = 0; i < (size_t)batch * per; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        if (u8)
            px[i] = (uint8_t)(s >> 56);
        else
            x[i] = (float)(s >> 40) * (1.0f / 16777216.0f);
    }
    for (int i = 0; i < batch; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        y[i] = (int32_t)(s % (uint64_t)classes);
    }
}

/* The warm-up and the timed steps: each step's seconds, and the optimizer's
 * share of it; the first step's (the plan's) in *plan_t. -1 on a failure. */
static int bench_steps(dsrt_net *net, dsrt_optimizer *opt, const dsrt_net_batch *in, double *times,
                       double *opt_times, double *plan_t, float *loss) {
    for (int step = 0; step < bench.warmup + bench.steps; step++) {
        double t0 = now();
        /* The next step's batch is staged while this one computes. */
        int rc = dsrt_net_train_start(net, in);
        if (rc == 0 && dsrt_net_stage(net, in) < 0) rc = -1;
        if (rc == 0) rc = dsrt_net_train_finish(net, loss, NULL);
        double t1 = now();
        if (rc == 0) rc = dsrt_optimizer_step(opt, net, 0);
        if (rc == 0) rc = dsrt_net_sync(net);
        if (rc != 0) {
            fprintf(stderr, "%s bench: step %d: %s\n", prog, step, dsrt_last_error());
            return -1;
        }
        double t = now() - t0;
        if (step == 0) *plan_t = t;
        if (step >= bench.warmup) {
            times[step - bench.warmup] = t;
            opt_times[step - bench.warmup] = t - (t1 - t0);
        }
    }
    return 0;
}

/* --inference: the warm-up and the timed batches through the forward pass
 * of inference, the scores read back; -1 on a failure. */
static int bench_inference(dsrt_net *net, const float *x, int batch, float *scores, double *times,
                           double *plan_t) {
    for (int step = 0; step < bench.warmup + bench.steps; step++) {
        double t0 = now();
        if (dsrt_net_predict(net, x, batch, scores, NULL, NULL, NULL) != 0) {
            fprintf(stderr, "%s bench: batch %d: %s\n", prog, step, dsrt_last_error());
            return -1;
        }
        double t = now() - t0;
        if (step == 0) *plan_t = t;
        if (step >= bench.warmup) times[step - bench.warmup] = t;
    }
    return 0;
}

/* The profile: as many steps again, timed layer by layer (their timing
 * costs a little, so they are not the steps measured). -1 on a failure. */
static int bench_profile(dsrt_net *net, dsrt_optimizer *opt, const dsrt_net_batch *in,
                         float *loss) {
    int prc = dsrt_net_profile_start(net);
    for (int step = 0; prc == 0 && step < bench.steps; step++) {
        prc = dsrt_net_train_start(net, in);
        if (prc == 0 && dsrt_net_stage(net, in) < 0) prc = -1;
        if (prc == 0) prc = dsrt_net_train_finish(net, loss, NULL);
        if (prc == 0) prc = dsrt_optimizer_step(opt, net, 0);
        if (prc == 0) prc = dsrt_net_sync(net);
    }
    dsrt_net_profile_stop(net);
    if (prc != 0) {
        fprintf(stderr, "%s bench: profile: %s\n", prog, dsrt_last_error());
        return -1;
    }
    return 0;
}

/* --net as a description: a file's text in *text (NULL for a built-in
 * network or an ONNX model). Returns 0, or 2 (reported) when it is none of
 * them. */
/* --net NAME that is neither a built-in net nor a readable file: the
 * message lists the built-in nets, and the nearest when one is a slip away.
 * Returns 2. */
static int net_unknown(const char *cmd, const char *name, const char *why) {
    const char *const *names;
    dsrt_net_builtin(NULL, &names);
    fprintf(stderr, "%s %s: --net: '%s' is neither a built-in network (", prog, cmd, name);
    for (int i = 0; names[i]; i++) fprintf(stderr, "%s%s", i ? ", " : "", names[i]);
    const char *near = dsrt_nearest_name(name, names);
    fprintf(stderr, ")%s%s%s nor a network description file: %s\n", near ? " (did you mean " : "",
            near ? near : "", near ? "?)" : "", why);
    return 2;
}

static int bench_net_text(int builtin, int onnx, char **text) {
    *text = NULL;
    if (builtin || onnx) return 0;
    char why[256];
    *text = read_net_text(bench.net, why, sizeof why);
    return *text ? 0 : net_unknown("bench", bench.net, why);
}

/* What a benchmark measured, for its report. */
typedef struct {
    int batch, threads, u8;
    double median_s, min_s, p95_s; /* a step's */
    double opt_median_s;           /* the optimizer's part of a step */
    double first_s;                /* the first step, which plans */
    float loss;
} bench_result;

/* Prints a benchmark's figures: one JSON object with --json, else lines. */
static void bench_report(dsrt_net *net, const dsrt_net_info *info, const bench_result *r) {
    double ips = r->batch / r->median_s,
           gflop = (bench.inference ? info->forward_flops : info->train_flops) * r->batch * 1e-9;
    /* The activations' memory, where the backend says it. */
    size_t held = 0, each = 0;
    int mem = dsrt_net_activation_bytes(net, r->batch, !bench.inference, &held, &each) == 0;
    if (bench.json) {
        char b[9][32];
        printf("{\"tool\": \"dstrain bench\", \"net\": ");
        tool_json_string(stdout, bench.net);
        printf(", \"mode\": \"%s\"", bench.inference ? "inference" : "training");
        printf(", \"batch\": %d, \"threads\": %d, "
               "\"steps\": %d, \"warmup\": %d, \"solver\": \"%s\", \"backend\": \"%s\", "
               "\"device\": %d, \"precision\": \"%s\", \"input\": \"%s\", "
               "\"params\": %zu, \"images_per_s\": %s, \"ms_per_step\": %s, "
               "\"ms_per_step_min\": %s, \"ms_per_step_p95\": %s, \"ms_optimizer\": %s, "
               "\"ms_first_step\": %s, "
               "\"gflop_per_step\": %s, \"gflops\": %s, \"loss\": %s",
               r->batch, r->threads, bench.steps, bench.warmup, bench.solver, info->backend,
               info->device, dsrt_precision_name(info->precision), r->u8 ? "u8" : "f32",
               info->learnable, tool_json_number(b[0], "%.1f", ips),
               tool_json_number(b[1], "%.3f", 1e3 * r->median_s),
               tool_json_number(b[2], "%.3f", 1e3 * r->min_s),
               tool_json_number(b[8], "%.3f", 1e3 * r->p95_s),
               tool_json_number(b[3], "%.3f", 1e3 * r->opt_median_s),
               tool_json_number(b[4], "%.1f", 1e3 * r->first_s),
               tool_json_number(b[5], "%.3f", gflop),
               tool_json_number(b[6], "%.1f", gflop / r->median_s),
               tool_json_number(b[7], "%.4f", (double)r->loss));
        if (mem)
            printf(", \"activation_mb\": %.1f, \"activation_mb_unshared\": %.1f", held / 1e6,
                   each / 1e6);
        if (bench.profile) print_profile(net, 1);
        printf("}\n");
    } else {
        printf("%s: %sbatch %d, %d threads, %s (%s), %zu parameters\n", bench.net,
               bench.inference ? "inference, " : "", r->batch, r->threads, info->backend,
               dsrt_precision_name(info->precision), info->learnable);
        printf("  %.1f images/s (median %.2f ms/step over %d steps, min %.2f, p95 %.2f; first "
               "step %.0f ms)\n",
               ips, 1e3 * r->median_s, bench.steps, 1e3 * r->min_s, 1e3 * r->p95_s,
               1e3 * r->first_s);
        if (bench.inference)
            printf("  %.2f GFLOP/step, %.1f GFLOP/s\n", gflop, gflop / r->median_s);
        else
            printf("  %.2f GFLOP/step, %.1f GFLOP/s; the optimizer takes %.2f ms of a step\n",
                   gflop, gflop / r->median_s, 1e3 * r->opt_median_s);
        if (mem && held < each)
            printf("  activations %.1f MB (%.1f MB without reuse of dead ones)\n", held / 1e6,
                   each / 1e6);
        else if (mem)
            printf("  activations %.1f MB\n", held / 1e6);
        if (bench.profile) print_profile(net, 0);
    }
}

static int cmd_bench(int argc, char **argv) {
    bench.net = "digits";
    bench.solver = "sgdm";
    bench.steps = 20;
    bench.warmup = 3;
    int rc = parse_options("bench", argc, argv, BENCH_OPTIONS, bench_usage);
    if (rc) return rc > 0 ? 0 : 2;

    dsrt_optimizer_options oo;
    if (bench_solver(bench.solver, &oo)) return 2;
    if (bench.inference && (bench.profile || bench.input)) {
        fprintf(stderr, "%s bench: --inference takes float batches and has no --profile\n", prog);
        return 2;
    }
    if (bench.input && strcmp(bench.input, "u8") && strcmp(bench.input, "f32")) {
        fprintf(stderr, "%s bench: --input: '%s' is not one of u8, f32\n", prog, bench.input);
        return 2;
    }
    int builtin = dsrt_net_builtin(bench.net, NULL) != NULL;
    int is_alexnet = !strcmp(bench.net, "alexnet"),
        onnx = is_onnx_file(bench.net) || is_model_file(bench.net);
    char *text;
    if ((rc = bench_net_text(builtin, onnx, &text))) return rc;
    if ((rc = onnx_flags_alone("bench", &bench.onnx, bench.net, NULL))) {
        free(text);
        return rc;
    }
    int batch = bench.batch ? bench.batch : is_alexnet ? 32 : builtin ? 128 : 32;
    int classes = bench.classes ? bench.classes : is_alexnet ? 55 : 10;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = bench.threads ? bench.threads : (int)(ncpu > 0 ? ncpu : 1);

    dsrt_net_options no = dsrt_net_defaults();
    no.threads = threads;
    no.seed = bench.seed;
    if (bench.no_fuse) no.fuse = 0;
    no.cuda_graphs = !bench.no_graphs;
    if ((rc = resolve_device_args("bench", &bench.dev, &no, NULL))) {
        free(text);
        return rc;
    }
    dsrt_net *net = NULL;
    dsrt_optimizer *opt = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    double *times = NULL, *opt_times = NULL;
    int status = 1;
    if (onnx) {
        if ((status = load_model("bench", "--net", bench.net, &bench.onnx, &no, &net))) goto out;
        status = 1;
    } else if (dsrt_net_create(&net, builtin ? bench.net : text, 0, 0, 0, classes, &no) != 0) {
        fprintf(stderr, "%s bench: %s\n", prog, dsrt_last_error());
        goto out;
    }
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    if (!bench.inference && dsrt_optimizer_create(&opt, net, &oo) != 0) {
        fprintf(stderr, "%s bench: %s\n", prog, dsrt_last_error());
        goto out;
    }
    size_t per = (size_t)info.channels * info.height * info.width;
    int u8 = bench.input ? !strcmp(bench.input, "u8") : info.device >= 0;
    x = dsrt_pinned_alloc((size_t)batch * per * sizeof *x, info.device);
    y = malloc((size_t)batch * sizeof *y);
    times = malloc((size_t)bench.steps * sizeof *times);
    opt_times = malloc((size_t)bench.steps * sizeof *opt_times);
    if (!x || !y || !times || !opt_times) {
        fprintf(stderr, "%s bench: out of memory\n", prog);
        goto out;
    }
    if (bench.inference) u8 = 0;
    bench_fill(x, y, batch, per, u8, info.classes);
    double plan_t = 0;
    float loss = 0;
    if (bench.inference) {
        float *scores = malloc((size_t)batch * (size_t)info.classes * sizeof *scores);
        int irc = scores ? bench_inference(net, x, batch, scores, times, &plan_t) : -1;
        free(scores);
        if (irc) goto out;
        bench_result r = {.batch = batch, .threads = threads, .first_s = plan_t};
        r.median_s = median_of(times, bench.steps);
        r.min_s = times[0];
        r.p95_s = p95_of(times, bench.steps);
        bench_report(net, &info, &r);
        status = 0;
        goto out;
    }
    dsrt_net_batch in = {.data = x,
                         .layout = u8 ? DSRT_INPUT_U8_NHWC : DSRT_INPUT_F32_NCHW,
                         .labels = y,
                         .n = batch};
    for (int c = 0; c < 4; c++) in.sub[c] = 0, in.div[c] = 255;
    if (bench_steps(net, opt, &in, times, opt_times, &plan_t, &loss)) goto out;
    if (bench.profile && bench_profile(net, opt, &in, &loss)) goto out;
    bench_result r = {
        .batch = batch, .threads = threads, .u8 = u8, .first_s = plan_t, .loss = loss};
    r.median_s = median_of(times, bench.steps); /* sorts times: times[0] is the fastest */
    r.opt_median_s = median_of(opt_times, bench.steps);
    r.min_s = times[0];
    r.p95_s = p95_of(times, bench.steps);
    bench_report(net, &info, &r);
    status = 0;
out:
    free(times);
    free(opt_times);
    dsrt_pinned_free(x);
    free(y);
    free(text);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
    return status;
}

// ----------------------------------------------------------------------------
// Shared by train, eval and classify

/* A floating-point option given as text: dies (returns -1 after a message)
 * when it is not a number in [min, max]. */
static int parse_double(const char *cmd, const char *name, const char *v, double min, double max,
                        double *out) {
    if (!v) return 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || isnan(x) || x < min || x > max) {
        fprintf(stderr, "%s %s: --%s: expected a number in [%g, %g], got '%s'\n", prog, cmd, name,
                min, max, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* "LO,HI", or V: [V, V], or [-V, V] when symmetric; the range itself is
 * dsrt_augment_check's to judge. */
static int parse_range(const char *cmd, const char *name, const char *v, int symmetric,
                       double out[2]) {
    if (!v) return 0;
    char *end;
    double a = strtod(v, &end), b;
    if (end == v) goto bad;
    if (*end == ',') {
        const char *s = end + 1;
        b = strtod(s, &end);
        if (end == s || *end) goto bad;
    } else if (*end == '\0') {
        b = a;
        if (symmetric) a = -a;
    } else {
        goto bad;
    }
    out[0] = a;
    out[1] = b;
    return 0;
bad:
    fprintf(stderr, "%s %s: --%s: expected LO,HI or V (numbers), got '%s'\n", prog, cmd, name, v);
    return -1;
}

/* How data is opened besides its paths: --drop-empty-classes, for shard
 * sets --order and --shuffle-buffer, in a store --retry-deadline and
 * --request-timeout, and several paths mixed: --mix, --mix-labels,
 * --mix-replacement. */
typedef struct {
    int drop_empty;
    const char *order;
    int shuffle_buffer;
    const remote_opts *remote; /* for the requests that list or fetch the data's index */
    const char *mix;           /* weights "0.7,0.3" or a mix file, or NULL */
    dsrt_mix_options mo;
} data_args;

/* paths[0, n) as messages show them: "A + B", or "mix FILE" for a mix file
 * alone; credentials masked. Returns buf. */
static const char *data_shown(const char *const *paths, size_t n, const char *mix, char *buf,
                              size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < n && at < cap; k++) {
        char one[4096];
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", k ? " + " : "",
                               tool_shown(paths[k], one, sizeof one));
    }
    if (!n && mix) snprintf(buf, cap, "mix %s", mix);
    return buf;
}

/* Opens labelled data: prints the scan's warnings (broken or looping links,
 * unreadable folders, ...) and refuses classes without images unless
 * drop_empty leaves them out. */
static int open_data(const char *cmd, const char *what, const char *const *paths, size_t npaths,
                     const data_args *a, dsrt_datastore **ds) {
    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.drop_empty_classes = a->drop_empty;
    if (a->order && dsrt_shard_order_from_name(a->order, &o.shard_order) != 0) {
        fprintf(stderr, "%s %s: --order: %s\n", prog, cmd, dsrt_last_error());
        return -1;
    }
    if (a->shuffle_buffer) o.shuffle_buffer = (size_t)a->shuffle_buffer;
    if (a->remote) remote_set(&o.remote, a->remote);
    if (dsrt_datastore_open_mix(ds, paths, npaths, a->mix, &o, &a->mo) != 0) {
        fprintf(stderr, "%s %s: %s: %s\n", prog, cmd, what, dsrt_last_error());
        return -1;
    }
    char shown[4096];
    data_shown(paths, npaths, a->mix, shown, sizeof shown);
    size_t nw = dsrt_datastore_warning_count(*ds), nc = dsrt_datastore_num_classes(*ds);
    if (nw) {
        fprintf(stderr, "%s %s: %s %s: %zu warning%s while indexing:\n", prog, cmd, what, shown, nw,
                nw == 1 ? "" : "s");
        const char *w = dsrt_datastore_warnings(*ds);
        while (*w) {
            const char *e = strchr(w, '\n');
            size_t len = e ? (size_t)(e - w) : strlen(w);
            fprintf(stderr, "  %.*s\n", (int)len, w);
            w += len + (e != NULL);
        }
        size_t shown = 0;
        for (const char *c = dsrt_datastore_warnings(*ds); *c; c++) shown += *c == '\n';
        if (nw > shown) fprintf(stderr, "  ... and %zu more\n", nw - shown);
    }
    size_t *counts = calloc(nc ? nc : 1, sizeof *counts);
    if (!counts) {
        fprintf(stderr, "%s %s: out of memory\n", prog, cmd);
        return -1;
    }
    dsrt_datastore_class_counts(*ds, counts);
    size_t empty = 0;
    for (size_t c = 0; c < nc; c++) {
        if (counts[c]) continue;
        if (empty++ == 0)
            fprintf(stderr, "%s %s: %s %s: classes without images:", prog, cmd, what, shown);
        fputc(' ', stderr);
        tool_text_field(stderr, dsrt_datastore_class_name(*ds, c));
    }
    free(counts);
    if (empty) {
        fprintf(stderr,
                "\n  (a class must have images to be learnt or tested: add some, remove "
                "the folder%s, or give --drop-empty-classes to leave %s out)\n",
                empty == 1 ? "" : "s", empty == 1 ? "it" : "them");
        dsrt_datastore_close(*ds);
        *ds = NULL;
        return -1;
    }
    return 0;
}

static void print_hms(FILE *f, double s) {
    long t = (long)(s + 0.5);
    fprintf(f, "%02ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

/* A name in a text column: escaped (tool_text_field), padded to width. */
static void print_padded(const char *s, int width) {
    tool_text_field(stdout, s);
    int used = 0; /* columns: escapes as written, a UTF-8 character as one */
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        used += *p == '\t' || *p == '\n' || *p == '\r' || *p == '\\' ? 2
                : *p < 0x20 || *p == 0x7f                            ? 4
                : (*p & 0xc0) == 0x80                                ? 0
                                                                     : 1;
    for (int i = used; i < width; i++) putchar(' ');
}

/* A number for JSON: null when it is not finite. buf holds 32 bytes. */
static const char *jnum(char *buf, double v) {
    return tool_json_number(buf, "%.6g", v);
}

// ----------------------------------------------------------------------------
// train

static struct {
    str_list data;
    const char *mix, *mix_labels, *sample_weights;
    int mix_replacement;
    uint64_t epoch_samples;
    const char *val, *net, *resume, *checkpoint_dir, *checkpoint_unit, *solver, *shuffle;
    const char *lr, *momentum, *l2, *lr_schedule, *lr_drop_factor, *grad_threshold,
        *grad_threshold_method, *output_network, *plot, *log, *save, *transfer, *lr_factor,
        *new_lr_factor, *cpus, *rand_rotation, *rand_scale, *rand_x_translation,
        *rand_y_translation, *rand_x_shear, *rand_y_shear, *layer, *size_mode, *rand_translation,
        *bad_list, *bucket_size, *bn_statistics, *comm_timeout;
    int epochs, batch, threads, workers, val_frequency, val_patience, val_batch, verbose_frequency,
        checkpoint_frequency, lr_drop_period, prefetch, json, drop_last, no_pin, quiet, no_progress,
        rand_x_reflection, no_rand_x_reflection, rand_y_reflection, fail_on_error, resize_shorter,
        depth, drop_empty_classes, shuffle_buffer, no_decode_dc;
    const char *order;
    const char *mixup, *cutmix, *cutmix_minmax, *mix_prob, *mix_switch_prob, *label_smoothing;
    const char *order_log;
    /* The ImageNet recipe's augmentation (--preset and after). */
    const char *preset, *crop_scale, *crop_ratio, *brightness, *contrast, *saturation, *hue,
        *rand_grayscale, *random_erasing, *erase_scale, *erase_ratio, *erase_value;
    int rand_resized_crop;
    remote_opts remote;
    uint64_t seed;
    int uint8_batches, averaging_frequency, average_optimizer_state, gpus;
    device_args dev;
    onnx_args onnx;
} tr;

static const option TRAIN_OPTIONS[] = {
    {"data", OPT_STRS, &tr.data},
    {"mix", OPT_STR, &tr.mix},
    {"mix-labels", OPT_STR, &tr.mix_labels},
    {"mix-replacement", OPT_FLAG, &tr.mix_replacement},
    {"sample-weights", OPT_STR, &tr.sample_weights},
    {"epoch-samples", OPT_U64, &tr.epoch_samples},
    {"val", OPT_STR, &tr.val},
    {"net", OPT_STR, &tr.net},
    {"epochs", OPT_INT, &tr.epochs},
    {"batch", OPT_INT, &tr.batch},
    {"lr", OPT_STR, &tr.lr},
    {"seed", OPT_U64, &tr.seed},
    {"threads", OPT_INT, &tr.threads},
    {"workers", OPT_INT, &tr.workers},
    {"cpus", OPT_STR, &tr.cpus},
    {"no-pin", OPT_FLAG, &tr.no_pin},
    {"prefetch", OPT_INT, &tr.prefetch},
    {"depth", OPT_INT, &tr.depth},
    REMOTE_OPTIONS(tr.remote),
    {"solver", OPT_STR, &tr.solver},
    {"momentum", OPT_STR, &tr.momentum},
    {"l2", OPT_STR, &tr.l2},
    {"shuffle", OPT_STR, &tr.shuffle},
    {"drop-last", OPT_FLAG, &tr.drop_last},
    {"lr-schedule", OPT_STR, &tr.lr_schedule},
    {"lr-drop-factor", OPT_STR, &tr.lr_drop_factor},
    {"lr-drop-period", OPT_INT, &tr.lr_drop_period},
    {"gradient-threshold", OPT_STR, &tr.grad_threshold},
    {"gradient-threshold-method", OPT_STR, &tr.grad_threshold_method},
    {"mixup", OPT_STR, &tr.mixup},
    {"cutmix", OPT_STR, &tr.cutmix},
    {"cutmix-minmax", OPT_STR, &tr.cutmix_minmax},
    {"mix-prob", OPT_STR, &tr.mix_prob},
    {"mix-switch-prob", OPT_STR, &tr.mix_switch_prob},
    {"label-smoothing", OPT_STR, &tr.label_smoothing},
    {"val-frequency", OPT_INT, &tr.val_frequency},
    {"val-patience", OPT_INT, &tr.val_patience},
    {"val-batch", OPT_INT, &tr.val_batch},
    {"output-network", OPT_STR, &tr.output_network},
    {"checkpoint-dir", OPT_STR, &tr.checkpoint_dir},
    {"checkpoint-frequency", OPT_INT, &tr.checkpoint_frequency},
    {"checkpoint-unit", OPT_STR, &tr.checkpoint_unit},
    {"resume", OPT_STR, &tr.resume},
    DEVICE_OPTIONS(tr.dev),
    {"averaging-frequency", OPT_INT, &tr.averaging_frequency},
    {"average-optimizer-state", OPT_FLAG, &tr.average_optimizer_state},
    {"bucket-size", OPT_STR, &tr.bucket_size},
    {"bn-statistics", OPT_STR, &tr.bn_statistics},
    {"comm-timeout", OPT_STR, &tr.comm_timeout},
    {"gpus", OPT_INT, &tr.gpus},
    {"uint8-batches", OPT_INT, &tr.uint8_batches},
    {"rand-x-reflection", OPT_FLAG, &tr.rand_x_reflection},
    {"no-rand-x-reflection", OPT_FLAG, &tr.no_rand_x_reflection},
    {"rand-y-reflection", OPT_FLAG, &tr.rand_y_reflection},
    {"no-decode-dc", OPT_FLAG, &tr.no_decode_dc},
    {"rand-rotation", OPT_STR, &tr.rand_rotation},
    {"rand-scale", OPT_STR, &tr.rand_scale},
    {"rand-translation", OPT_STR, &tr.rand_translation},
    {"rand-x-translation", OPT_STR, &tr.rand_x_translation},
    {"rand-y-translation", OPT_STR, &tr.rand_y_translation},
    {"rand-x-shear", OPT_STR, &tr.rand_x_shear},
    {"rand-y-shear", OPT_STR, &tr.rand_y_shear},
    {"size-mode", OPT_STR, &tr.size_mode},
    {"resize-shorter", OPT_INT, &tr.resize_shorter},
    {"preset", OPT_STR, &tr.preset},
    {"rand-resized-crop", OPT_FLAG, &tr.rand_resized_crop},
    {"crop-scale", OPT_STR, &tr.crop_scale},
    {"crop-ratio", OPT_STR, &tr.crop_ratio},
    {"brightness", OPT_STR, &tr.brightness},
    {"contrast", OPT_STR, &tr.contrast},
    {"saturation", OPT_STR, &tr.saturation},
    {"hue", OPT_STR, &tr.hue},
    {"rand-grayscale", OPT_STR, &tr.rand_grayscale},
    {"random-erasing", OPT_STR, &tr.random_erasing},
    {"erase-scale", OPT_STR, &tr.erase_scale},
    {"erase-ratio", OPT_STR, &tr.erase_ratio},
    {"erase-value", OPT_STR, &tr.erase_value},
    {"transfer", OPT_STR, &tr.transfer},
    ONNX_OPTIONS(tr.onnx),
    ONNX_CLASSES_OPTION(tr.onnx),
    {"lr-factor", OPT_STR, &tr.lr_factor},
    {"new-lr-factor", OPT_STR, &tr.new_lr_factor},
    {"transfer-layer", OPT_STR, &tr.layer},
    {"save", OPT_STR, &tr.save},
    {"plot", OPT_STR, &tr.plot},
    {"log", OPT_STR, &tr.log},
    {"order-log", OPT_STR, &tr.order_log},
    {"verbose-frequency", OPT_INT, &tr.verbose_frequency},
    {"fail-on-error", OPT_FLAG, &tr.fail_on_error},
    {"bad-list", OPT_STR, &tr.bad_list},
    {"drop-empty-classes", OPT_FLAG, &tr.drop_empty_classes},
    {"order", OPT_STR, &tr.order},
    {"shuffle-buffer", OPT_INT, &tr.shuffle_buffer},
    {"quiet", OPT_FLAG, &tr.quiet},
    {"no-progress", OPT_FLAG, &tr.no_progress},
    {"json", OPT_FLAG, &tr.json},
    {NULL, 0, NULL},
};

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: %s train --data DIR [--val DIR] [--net NAME|FILE] [options]\n\n"
            "Trains a network on a folder of class sub-folders with MATLAB trainingOptions'\n"
            "semantics: SGD with momentum 0.9, L2 1e-4, learning rate 0.01, batch 128, shuffled\n"
            "every epoch, random left-right reflection, float input in [0, 1] at the net's\n"
            "input size (gray or RGB as the net takes). For digits on Fashion-MNIST (a folder\n"
            "made by `dsbench convert`) the usual recipe is 3 epochs of batch 128 at learning\n"
            "rate 0.01, validated on the test split after each epoch:\n\n"
            "  %s train --data fm/train --val fm/test --net digits --epochs 3\n\n"
            "Batches are made in the background on pipeline workers while compute threads\n"
            "train; both are pinned. By default the pipeline gets ceil(L) workers on the last\n"
            "cores and the compute every core but floor(L), L being the cores loading needs\n"
            "(estimated from the sample size against the net's arithmetic: for digits, 0.03\n"
            "on 2 cores, so 1 worker sharing a core with the compute). Validation runs at the\n"
            "end of each epoch unless --val-frequency says otherwise. A non-finite loss stops\n"
            "the run (exit status 1) and leaves the last checkpoint as it was. With --resume,\n"
            "the seed and the position come from the checkpoint.\n\n"
            "Several --data make a mix (WebDataset's and MosaicML Streaming's weighted\n"
            "sources): --mix 0.7,0.3 gives each epoch (--epoch-samples N, default all the\n"
            "samples) 70%% of its samples from the first and 30%% from the second, interleaved\n"
            "at random, classes merged by name (--mix-labels separate keeps them apart);\n"
            "--mix FILE reads PATH,WEIGHT lines instead. --sample-weights class-balanced\n"
            "draws every class equally often from one --data. The draws are keyed by the\n"
            "seed and the epoch: resumes and data-parallel workers see the same batches.\n\n"
            "Images that cannot be read or decoded are skipped (a training place takes the\n"
            "next image; validation leaves them out) and named at the end, on stderr and in\n"
            "the JSON summary (the first %d; --bad-list writes all). Ctrl-C, SIGTERM or SIGHUP\n"
            "(to any worker) stops after the current step, writes a checkpoint (with\n"
            "--checkpoint-dir) and the model (with --save), says what was kept and exits with\n"
            "130, 143 or 129 (every worker); a second one exits at once. Output paths (--save,\n"
            "--plot, --log, --bad-list) are checked before any work; if --save cannot be\n"
            "written at the end, the weights go to a file in the current folder (or /tmp) and\n"
            "the exit status is 1.\n\n"
            "Data parallel: `mpirun -np N %s train --execution-environment parallel ...` runs\n"
            "N workers (CPU, or one GPU each), `--execution-environment multi-gpu` one worker a\n"
            "GPU of this machine. --batch is the global mini-batch, split between the workers;\n"
            "gradients are summed in buckets while backward runs (or, with\n"
            "--averaging-frequency N, parameters averaged every N iterations); every worker\n"
            "stops at the same iteration, worker 0 alone prints and writes, and a worker that\n"
            "dies or hangs is named by the others after --comm-timeout seconds.\n\n"
            "options:\n",
            prog, prog, TOOL_BAD_SHOWN, prog);
    print_options(f, "train", TRAIN_OPTIONS);
}

typedef struct {
    FILE *log;
    int log_json;
    dsrt_train_history *hist;
    const char *plot;
    int plot_failed; /* a plot could not be written */
    int table, json, progress;
    double last_bar;
    int bar_shown;
    int64_t ipe;
    const char *title;
    tool_bad_list bad[2]; /* training, validation */
    FILE *order;          /* --order-log */
} train_ui;

/* SIGINT, SIGTERM or SIGHUP (a closed terminal or ssh session): the first
 * stops training after the current step, a second exits at once. The
 * handler may run on any thread (the one training holds signals while the
 * CPU computes), hence an atomic, lock-free and so safe in a handler. */
static atomic_int stop_signal;

static const struct {
    int sig;
    const char *name;
} stop_signals[] = {{SIGINT, "SIGINT"}, {SIGTERM, "SIGTERM"}, {SIGHUP, "SIGHUP"}};

static const char *signal_name(int sig) {
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        if (stop_signals[i].sig == sig) return stop_signals[i].name;
    return "a signal";
}

static void on_stop_signal(int sig) {
    if (atomic_exchange(&stop_signal, sig) != 0) _exit(128 + sig);
    static const char msg[] = "\ndstrain: stopping after this step (again to quit at once)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
}

static void bar_clear(train_ui *u) {
    if (u->bar_shown) {
        fprintf(stderr, "\r\033[K");
        u->bar_shown = 0;
    }
}

static void table_rule(void) {
    printf("|");
    for (int i = 0; i < 118; i++) putchar('=');
    printf("|\n");
}

static void table_head(void) {
    table_rule();
    printf("|  Epoch  |  Iteration  |  Time Elapsed  |  Mini-batch  |  Validation  |  Mini-batch  "
           "|  Validation  |  Base Learning  |\n");
    printf("|         |             |   (hh:mm:ss)   |   Accuracy   |   Accuracy   |     Loss     "
           "|     Loss     |      Rate       |\n");
    table_rule();
}

static void fmt_pct(char *b, size_t n, double v) {
    if (isnan(v))
        snprintf(b, n, "%s", "");
    else
        snprintf(b, n, "%.2f%%", 100 * v);
}

static void fmt_loss(char *b, size_t n, double v) {
    if (isnan(v))
        snprintf(b, n, "%s", "");
    else
        snprintf(b, n, "%.4f", v);
}

/* A line of the --log file (CSV or JSON lines) for an iteration. */
static void train_log(train_ui *u, const dsrt_train_event *e) {
    char b[5][32];
    if (u->log_json)
        fprintf(u->log,
                "{\"epoch\": %lld, \"iteration\": %lld, \"time_s\": %s, \"loss\": "
                "%s, \"accuracy\": %s, \"learn_rate\": %s%s",
                (long long)e->epoch, (long long)e->iteration,
                tool_json_number(b[0], "%.3f", e->elapsed_s), jnum(b[1], e->loss),
                jnum(b[2], e->accuracy), jnum(b[3], e->learn_rate),
                isnan(e->val_accuracy) ? "}\n" : "");
    else
        fprintf(u->log, "%lld,%lld,%.3f,%.6g,%.6g,%.6g,", (long long)e->epoch,
                (long long)e->iteration, e->elapsed_s, e->loss, e->accuracy, e->learn_rate);
    /* (A validation's accuracy is a count, finite even where its loss is not.) */
    if (!isnan(e->val_accuracy)) {
        if (u->log_json)
            fprintf(u->log, ", \"val_loss\": %s, \"val_accuracy\": %s}\n", jnum(b[0], e->val_loss),
                    jnum(b[1], e->val_accuracy));
        else
            fprintf(u->log, "%.6g,%.6g\n", e->val_loss, e->val_accuracy);
    } else if (!u->log_json) {
        fprintf(u->log, ",\n");
    }
}

/* The progress bar on stderr, at most ten times a second. */
static void train_bar(train_ui *u, const dsrt_train_event *e) {
    double t = now();
    if (t - u->last_bar > 0.1 || e->batch_in_epoch == e->iterations_per_epoch) {
        u->last_bar = t;
        int width = 30, fill = (int)(width * e->batch_in_epoch /
                                     (e->iterations_per_epoch ? e->iterations_per_epoch : 1));
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        double left = e->images_per_s > 0 && e->iteration > 0
                          ? (double)(e->max_iterations - e->iteration) *
                                ((double)e->images / (double)e->iteration) / e->images_per_s
                          : 0;
        fprintf(stderr, "\repoch %lld/%lld [%s] %lld/%lld  %.0f images/s  ", (long long)e->epoch,
                (long long)e->max_epochs, bar, (long long)e->batch_in_epoch,
                (long long)e->iterations_per_epoch, e->images_per_s);
        fprintf(stderr, "left ");
        print_hms(stderr, left);
        fprintf(stderr, "\033[K");
        u->bar_shown = 1;
    }
}

static int train_event(void *ctx, const dsrt_train_event *e) {
    train_ui *u = ctx;
    char b[5][32];
    if (u->hist) dsrt_train_history_add(u->hist, e);
    switch (e->kind) {
    case DSRT_EVENT_START:
        u->ipe = e->iterations_per_epoch;
        if (u->table) {
            printf("%lld iterations a epoch, %lld in all; %u pipeline worker%s, %d compute "
                   "thread%s%s\n",
                   (long long)e->iterations_per_epoch, (long long)e->max_iterations, e->workers,
                   e->workers == 1 ? "" : "s", e->compute_threads,
                   e->compute_threads == 1 ? "" : "s", e->pinned ? " (pinned)" : "");
            table_head();
        }
        if (u->json)
            printf("{\"event\": \"start\", \"iteration\": %lld, \"iterations_per_epoch\": %lld, "
                   "\"max_iterations\": %lld, \"workers\": %u, \"compute_threads\": %d, "
                   "\"pinned\": %d}\n",
                   (long long)e->iteration, (long long)e->iterations_per_epoch,
                   (long long)e->max_iterations, e->workers, e->compute_threads, e->pinned);
        break;
    case DSRT_EVENT_ITERATION:
        if (u->log) train_log(u, e);
        if (u->order) {
            fprintf(u->order, "%lld %lld:", (long long)e->epoch - 1,
                    (long long)e->batch_in_epoch - 1);
            for (size_t i = 0; i < e->ids_count; i++) fprintf(u->order, " %u", e->ids[i]);
            fputc('\n', u->order);
        }
        if (e->verbose && u->table) {
            bar_clear(u);
            char a[16], va[16], l[16], vl[16];
            fmt_pct(a, sizeof a, e->accuracy);
            fmt_pct(va, sizeof va, e->val_accuracy);
            fmt_loss(l, sizeof l, e->loss);
            fmt_loss(vl, sizeof vl, e->val_loss);
            printf("| %7lld | %11lld |       ", (long long)e->epoch, (long long)e->iteration);
            print_hms(stdout, e->elapsed_s);
            printf(" | %12s | %12s | %12s | %12s | %15.4g |\n", a, va, l, vl, e->learn_rate);
            fflush(stdout);
        }
        if (e->verbose && u->json)
            printf("{\"event\": \"iteration\", \"epoch\": %lld, \"iteration\": %lld, \"time_s\": "
                   "%s, \"loss\": %s, \"accuracy\": %s, \"learn_rate\": %s, "
                   "\"images_per_s\": %s}\n",
                   (long long)e->epoch, (long long)e->iteration,
                   tool_json_number(b[0], "%.3f", e->elapsed_s), jnum(b[1], e->loss),
                   jnum(b[2], e->accuracy), jnum(b[3], e->learn_rate),
                   tool_json_number(b[4], "%.1f", e->images_per_s));
        if (u->progress) train_bar(u, e);
        break;
    case DSRT_EVENT_VALIDATION:
        if (u->json)
            printf("{\"event\": \"validation\", \"epoch\": %lld, \"iteration\": %lld, \"time_s\": "
                   "%s, \"val_loss\": %s, \"val_accuracy\": %s}\n",
                   (long long)e->epoch, (long long)e->iteration,
                   tool_json_number(b[0], "%.3f", e->elapsed_s), jnum(b[1], e->val_loss),
                   jnum(b[2], e->val_accuracy));
        break;
    case DSRT_EVENT_EPOCH:
        if (u->json)
            printf("{\"event\": \"epoch\", \"epoch\": %lld, \"iteration\": %lld, \"time_s\": %s, "
                   "\"images_per_s\": %s}\n",
                   (long long)e->epoch, (long long)e->iteration,
                   tool_json_number(b[0], "%.3f", e->elapsed_s),
                   tool_json_number(b[1], "%.1f", e->images_per_s));
        if (u->plot && u->hist && dsrt_train_history_svg(u->hist, u->plot, u->title) != 0) {
            bar_clear(u);
            fprintf(stderr, "%s train: --plot: %s\n", prog, dsrt_last_error());
            u->plot_failed = 1;
        }
        if (u->log) fflush(u->log);
        break;
    case DSRT_EVENT_CHECKPOINT:
        if (u->json) {
            printf("{\"event\": \"checkpoint\", \"iteration\": %lld, \"path\": ",
                   (long long)e->iteration);
            tool_json_string(stdout, e->checkpoint);
            printf("}\n");
        }
        break;
    case DSRT_EVENT_END:
        bar_clear(u);
        if (u->table) table_rule();
        break;
    case DSRT_EVENT_BAD_SAMPLE:
        tool_bad_add(&u->bad[e->validation != 0], e->bad_sample);
        break;
    }
    if (u->json) fflush(stdout);
    return atomic_load(&stop_signal) != 0;
}

/* dsrt_net_create failed on the description read from file: the message
 * names the file, not "net description". */
static void net_file_error(const char *file, const char *text) {
    const char *m = dsrt_last_error();
    static const char prefix[] = "net description: ";
    if (!strncmp(m, prefix, sizeof prefix - 1)) m += sizeof prefix - 1;
    fprintf(stderr, "%s train: --net %s: %s\n", prog, file, m);
    /* A file holding only a built-in network's name. */
    char word[32];
    if (sscanf(text, " %31s", word) == 1 && dsrt_net_builtin(word, NULL)) {
        char rest[2];
        if (sscanf(text, " %*s %1s", rest) != 1)
            fprintf(stderr,
                    "  (the file names a built-in network: give --net %s for it; a description "
                    "file lists layers, one a line)\n",
                    word);
    }
}

/* What one `dstrain train` holds from parsing to exit. */
typedef struct {
    dsrt_train_options o;
    dsrt_net_options no;
    double lr_factor, new_lr_factor; /* --lr-factor, --new-lr-factor */
    FILE *logf;
    FILE *orderf; /* --order-log, on every worker */
    int log_json;
    train_ui ui;
    dsrt_datastore *train, *val;
    dsrt_net *net, *base;
    char *text, *desc; /* a description file's text; the description with class names */
    dsrt_train_history *hist;
    const char *netname;
    char ckpt[4096];      /* the checkpoint --resume names, when the net comes from it */
    char auto_ckpt[4096]; /* --resume auto: the checkpoint chosen, "" to start afresh */
    char title[8400];
    /* --execution-environment parallel: this process's communicator, its
     * rank among the world's, whether MPI was started here, and " (worker K
     * of N)" for messages. */
    dsrt_comm *comm;
    int rank, world, mpi;
    char worker[48];
} train_job;

/* The options that name one of a list, and where the index goes. */
typedef struct {
    const char *option;
    const char *const *value;
    int *out;
} train_choice;

/* The options given as numbers in text, checked against [min, max]. */
typedef struct {
    const char *option;
    const char *const *value;
    double min, max;
    double *out;
} train_number;

static void train_set_defaults(void) {
    memset(&tr, 0, sizeof tr);
    tr.epochs = 30;
    tr.batch = 128;
    tr.verbose_frequency = 50;
    tr.checkpoint_frequency = 1;
    tr.lr_drop_period = 10;
    tr.prefetch = 4;
    tr.uint8_batches = -1;
    tr.resize_shorter = -1; /* not given: the preset's, or 0 */
}

/* The choices among names (solver first: its defaults are the optimizer's
 * starting point). Returns 0, or 2 after a message. */
static int resolve_choices(dsrt_train_options *o) {
    const char *cmd = "train";
    int solver = -1;
    if (tr.solver && (solver = parse_choice(cmd, "solver", tr.solver)) < 0) return 2;
    if (solver >= 0) o->optimizer = dsrt_optimizer_defaults((dsrt_solver)solver);
    int shuffle = o->shuffle, schedule = o->optimizer.schedule, clip = o->optimizer.clip,
        output = o->output_network, unit = o->checkpoint_unit, mode = o->augment.size_mode,
        bn = o->bn_statistics;
    const train_choice choices[] = {
        {"shuffle", &tr.shuffle, &shuffle},
        {"lr-schedule", &tr.lr_schedule, &schedule},
        {"gradient-threshold-method", &tr.grad_threshold_method, &clip},
        {"output-network", &tr.output_network, &output},
        {"checkpoint-unit", &tr.checkpoint_unit, &unit},
        {"size-mode", &tr.size_mode, &mode},
        {"bn-statistics", &tr.bn_statistics, &bn},
    };
    for (size_t i = 0; i < sizeof choices / sizeof choices[0]; i++) {
        const train_choice *c = &choices[i];
        if (*c->value && (*c->out = parse_choice(cmd, c->option, *c->value)) < 0) return 2;
    }
    o->shuffle = (dsrt_shuffle)shuffle;
    o->optimizer.schedule = (dsrt_lr_schedule)schedule;
    o->optimizer.clip = (dsrt_grad_clip)clip;
    o->output_network = (dsrt_output_network)output;
    o->checkpoint_unit = (dsrt_frequency_unit)unit;
    o->augment.size_mode = (dsrt_augment_size_mode)mode;
    o->bn_statistics = (dsrt_bn_statistics)bn;
    return 0;
}

/* The augment ranges. Symmetric ranges take V as [-V, V]; --rand-translation
 * sets both shifts, the axis options given after it in this table override
 * it. What a range may hold is the library's one check (dsrt_augment_check),
 * asked here for each option alone so that the message names it. Returns 0,
 * or 2 after a message. */
static int resolve_ranges(dsrt_train_options *o) {
    const char *cmd = "train";
    const struct {
        const char *option;
        const char *const *value;
        double *out;
        int symmetric;
    } ranges[] = {
        {"rand-rotation", &tr.rand_rotation, o->augment.rand_rotation, 1},
        {"rand-scale", &tr.rand_scale, o->augment.rand_scale, 0},
        {"rand-translation", &tr.rand_translation, o->augment.rand_x_translation, 1},
        {"rand-translation", &tr.rand_translation, o->augment.rand_y_translation, 1},
        {"rand-x-translation", &tr.rand_x_translation, o->augment.rand_x_translation, 1},
        {"rand-y-translation", &tr.rand_y_translation, o->augment.rand_y_translation, 1},
        {"rand-x-shear", &tr.rand_x_shear, o->augment.rand_x_shear, 1},
        {"rand-y-shear", &tr.rand_y_shear, o->augment.rand_y_shear, 1},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        if (!*ranges[i].value) continue;
        if (parse_range(cmd, ranges[i].option, *ranges[i].value, ranges[i].symmetric,
                        ranges[i].out))
            return 2;
        dsrt_augment_options probe = dsrt_augment_defaults();
        size_t at = (size_t)((char *)ranges[i].out - (char *)&o->augment);
        memcpy((char *)&probe + at, ranges[i].out, 2 * sizeof(double));
        if (dsrt_augment_check(&probe) != 0) {
            fprintf(stderr, "%s %s: --%s %s: %s\n", prog, cmd, ranges[i].option, *ranges[i].value,
                    dsrt_last_error());
            return 2;
        }
    }
    return 0;
}

/* --cutmix-minmax, and the mixing options that need another. Returns 0,
 * or 2 after a message. */
static int resolve_mixing(dsrt_train_options *o) {
    if (parse_range("train", "cutmix-minmax", tr.cutmix_minmax, 0, o->cutmix_minmax)) return 2;
    const double *mm = o->cutmix_minmax;
    if (tr.cutmix_minmax && !(mm[0] > 0 && mm[0] < mm[1] && mm[1] <= 1)) {
        fprintf(stderr, "%s train: --cutmix-minmax %s: need 0 < LO < HI <= 1\n", prog,
                tr.cutmix_minmax);
        return 2;
    }
    int mixing = o->mixup_alpha > 0 || o->cutmix_alpha > 0 || tr.cutmix_minmax;
    if ((tr.mix_prob || tr.mix_switch_prob) && !mixing) {
        fprintf(stderr, "%s train: --%s goes with --mixup A or --cutmix A\n", prog,
                tr.mix_prob ? "mix-prob" : "mix-switch-prob");
        return 2;
    }
    return 0;
}

/* The augmentation preset (--preset), before every other augment option.
 * Returns 0, or 2 after a message. */
static int resolve_preset(dsrt_train_options *o) {
    if (!tr.preset) return 0;
    dsrt_augment_options a;
    if (dsrt_augment_preset_from_name(tr.preset, &a) != 0) {
        fprintf(stderr, "%s train: --%s\n", prog, dsrt_last_error());
        return 2;
    }
    a.output_height = a.output_width = a.output_channels = 0; /* the net's */
    o->augment = a;
    return 0;
}

/* The random-resized crop, colour and erasing options, each checked alone
 * by dsrt_augment_check so that a message names it. Returns 0, or 2 after
 * a message. */
static int resolve_recipe(dsrt_train_options *o) {
    const char *cmd = "train";
    dsrt_augment_options *a = &o->augment;
    if (tr.rand_resized_crop) a->size_mode = DSRT_AUGMENT_RANDRESIZEDCROP;
    const struct {
        const char *option;
        const char *const *value;
        double *out;
        int kind; /* 0: LO,HI; 1: a factor V: [max(0, 1 - V), 1 + V]; 2: V: [-V, V]; 3: one */
    } fields[] = {
        {"crop-scale", &tr.crop_scale, a->crop_scale, 0},
        {"crop-ratio", &tr.crop_ratio, a->crop_ratio, 0},
        {"brightness", &tr.brightness, a->brightness, 1},
        {"contrast", &tr.contrast, a->contrast, 1},
        {"saturation", &tr.saturation, a->saturation, 1},
        {"hue", &tr.hue, a->hue, 2},
        {"rand-grayscale", &tr.rand_grayscale, &a->grayscale_probability, 3},
        {"random-erasing", &tr.random_erasing, &a->erase_probability, 3},
        {"erase-scale", &tr.erase_scale, a->erase_scale, 0},
        {"erase-ratio", &tr.erase_ratio, a->erase_ratio, 0},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const char *v = *fields[i].value;
        if (!v) continue;
        int kind = fields[i].kind;
        double r[2];
        if (kind == 3) {
            if (parse_double(cmd, fields[i].option, v, -INFINITY, INFINITY, &r[0])) return 2;
        } else {
            if (parse_range(cmd, fields[i].option, v, kind == 2, r)) return 2;
            if (kind == 1 && !strchr(v, ','))
                r[0] = 1.0 - r[1] > 0.0 ? 1.0 - r[1] : 0.0, r[1] = 1.0 + r[1];
        }
        dsrt_augment_options probe = dsrt_augment_defaults();
        size_t at = (size_t)((char *)fields[i].out - (char *)a), n = kind == 3 ? 1 : 2;
        memcpy((char *)&probe + at, r, n * sizeof(double));
        if (dsrt_augment_check(&probe) != 0) {
            fprintf(stderr, "%s %s: --%s %s: %s\n", prog, cmd, fields[i].option, v,
                    dsrt_last_error());
            return 2;
        }
        memcpy(fields[i].out, r, n * sizeof(double));
    }
    if (tr.erase_value && !strcmp(tr.erase_value, "random")) {
        a->erase_random = 1;
    } else if (tr.erase_value) {
        double v[3];
        const char *at = tr.erase_value;
        char *end = NULL;
        int k = 0, ok = 1;
        while (k < 3) {
            v[k] = strtod(at, &end);
            if (end == at || !isfinite(v[k])) {
                ok = 0;
                break;
            }
            k++;
            if (*end == '\0') break;
            if (*end != ',') {
                ok = 0;
                break;
            }
            at = end + 1;
        }
        if (!ok || *end != '\0' || (k != 1 && k != 3)) {
            fprintf(stderr,
                    "%s %s: --erase-value: expected V, R,G,B (numbers) or random, got '%s'\n", prog,
                    cmd, tr.erase_value);
            return 2;
        }
        a->erase_random = 0;
        for (int c = 0; c < 3; c++) a->erase_value[c] = (float)v[k == 1 ? 0 : c];
    }
    return 0;
}

/* The options that go with others (transfer learning, data-parallel
 * execution), and the data-parallel ones. Returns 0, or 2 after a message. */
static int resolve_parallel(dsrt_train_options *o, double bucket_mib) {
    if ((tr.lr_factor || tr.new_lr_factor || tr.layer) && !tr.transfer) {
        fprintf(stderr,
                "%s train: --lr-factor, --new-lr-factor and --transfer-layer go with "
                "--transfer MODEL\n",
                prog);
        return 2;
    }
    int dp = o->execution == DSRT_EXEC_PARALLEL || o->execution == DSRT_EXEC_MULTI_GPU;
    if (!dp && (tr.averaging_frequency || tr.average_optimizer_state || tr.bucket_size ||
                tr.bn_statistics || tr.comm_timeout || tr.gpus)) {
        fprintf(stderr,
                "%s train: --averaging-frequency, --average-optimizer-state, --bucket-size, "
                "--bn-statistics, --comm-timeout and --gpus go with --execution-environment "
                "parallel or multi-gpu\n",
                prog);
        return 2;
    }
    if (tr.gpus && o->execution != DSRT_EXEC_MULTI_GPU) {
        fprintf(stderr, "%s train: --gpus goes with --execution-environment multi-gpu\n", prog);
        return 2;
    }
    if (tr.average_optimizer_state && !tr.averaging_frequency) {
        fprintf(stderr, "%s train: --average-optimizer-state goes with --averaging-frequency N\n",
                prog);
        return 2;
    }
    o->averaging_frequency = tr.averaging_frequency;
    o->average_optimizer_state = tr.average_optimizer_state;
    o->gpus = tr.gpus;
    o->comm_options.bucket_bytes = (size_t)(bucket_mib * (1 << 20));
    if (o->comm_options.first_bucket_bytes > o->comm_options.bucket_bytes)
        o->comm_options.first_bucket_bytes = o->comm_options.bucket_bytes;
    if (tr.resume && !strcmp(tr.resume, "auto") && !tr.checkpoint_dir) {
        fprintf(stderr, "%s train: --resume auto looks in --checkpoint-dir DIR: give it\n", prog);
        return 2;
    }
    if (tr.transfer && tr.resume && !strcmp(tr.resume, "auto")) {
        fprintf(stderr,
                "%s train: --resume auto and --transfer: a resumed run would not start "
                "from the transferred model; give one\n",
                prog);
        return 2;
    }
    if (tr.transfer && (tr.net || tr.resume)) {
        fprintf(stderr,
                "%s train: --transfer makes the net: give neither --net nor --resume "
                "with it\n",
                prog);
        return 2;
    }
    return 0;
}

/* The mix options --mix-replacement and --mix-labels give: 0, or -1 when
 * --mix-labels names no choice (dsrt_last_error says which there are). */
static int train_mix(dsrt_mix_options *mo) {
    *mo = dsrt_mix_defaults();
    mo->replacement = tr.mix_replacement;
    return tr.mix_labels && dsrt_mix_labels_from_name(tr.mix_labels, &mo->labels) != 0 ? -1 : 0;
}

/*
 * Turns the parsed flags into the train and net options, through the tables
 * above: every choice, number and range checked before anything is opened.
 * Returns 0, or 2 after a message.
 */
static int train_resolve_options(train_job *j) {
    const char *cmd = "train";
    dsrt_train_options *o = &j->o;
    *o = dsrt_train_defaults();
    if (!tr.data.n && !tr.mix) {
        fprintf(stderr, "%s train: --data DIR is required (see %s train --help)\n", prog, prog);
        return 2;
    }
    dsrt_mix_options mo;
    if (train_mix(&mo) != 0) {
        fprintf(stderr, "%s train: --mix-labels: %s\n", prog, dsrt_last_error());
        return 2;
    }
    if (tr.epoch_samples > UINT32_MAX) {
        fprintf(stderr, "%s train: --epoch-samples: %llu: more than 2^32 - 1\n", prog,
                (unsigned long long)tr.epoch_samples);
        return 2;
    }
    o->sample_weights = tr.sample_weights;
    o->epoch_samples = (size_t)tr.epoch_samples;
    if (resolve_preset(o)) return 2;
    if (resolve_choices(o)) return 2;
    if (tr.resize_shorter >= 0) o->augment.resize_shorter = tr.resize_shorter;

    j->no = dsrt_net_defaults();
    int rc = resolve_device_args(cmd, &tr.dev, &j->no, &o->execution);
    if (rc) return rc;
    o->gpu = tr.dev.gpu;
    o->uint8_batches = tr.uint8_batches;

    j->lr_factor = 1;
    j->new_lr_factor = 20;
    double bucket_mib = (double)o->comm_options.bucket_bytes / (1 << 20);
    const train_number numbers[] = {
        {"lr", &tr.lr, 1e-300, 1e6, &o->optimizer.learn_rate},
        {"momentum", &tr.momentum, 0, 0.999999, &o->optimizer.momentum},
        {"l2", &tr.l2, 0, 1e6, &o->optimizer.l2},
        {"lr-drop-factor", &tr.lr_drop_factor, 0, 1, &o->optimizer.drop_factor},
        {"gradient-threshold", &tr.grad_threshold, 1e-300, INFINITY, &o->optimizer.grad_threshold},
        {"lr-factor", &tr.lr_factor, 0, 1e6, &j->lr_factor},
        {"new-lr-factor", &tr.new_lr_factor, 0, 1e6, &j->new_lr_factor},
        {"bucket-size", &tr.bucket_size, 1.0 / 1024, 4096, &bucket_mib},
        {"comm-timeout", &tr.comm_timeout, 1, 86400, &o->comm_options.timeout_s},
        {"mixup", &tr.mixup, 0, 1e6, &o->mixup_alpha},
        {"cutmix", &tr.cutmix, 0, 1e6, &o->cutmix_alpha},
        {"mix-prob", &tr.mix_prob, 0, 1, &o->mix_prob},
        {"mix-switch-prob", &tr.mix_switch_prob, 0, 1, &o->mix_switch_prob},
        {"label-smoothing", &tr.label_smoothing, 0, 0.999999, &o->label_smoothing},
    };
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
        const train_number *n = &numbers[i];
        if (parse_double(cmd, n->option, *n->value, n->min, n->max, n->out)) return 2;
    }
    if (tr.rand_x_reflection && tr.no_rand_x_reflection) {
        fprintf(stderr, "%s train: --rand-x-reflection and --no-rand-x-reflection contradict\n",
                prog);
        return 2;
    }
    if (tr.no_rand_x_reflection || tr.rand_x_reflection || !tr.preset)
        o->augment.rand_x_reflection = !tr.no_rand_x_reflection;
    if (tr.rand_y_reflection) o->augment.rand_y_reflection = 1;
    o->augment.decode_dc = !tr.no_decode_dc;
    if (resolve_ranges(o)) return 2;
    if (resolve_mixing(o)) return 2;
    if (resolve_recipe(o)) return 2;
    if (resolve_parallel(o, bucket_mib)) return 2;
    o->max_epochs = tr.epochs;
    o->batch = tr.batch;
    o->drop_last = tr.drop_last;
    o->optimizer.drop_period = tr.lr_drop_period;
    o->validation_frequency = tr.val_frequency;
    o->validation_patience = tr.val_patience;
    o->validation_batch = tr.val_batch;
    o->verbose_frequency = tr.verbose_frequency;
    o->checkpoint_path = tr.checkpoint_dir;
    o->checkpoint_frequency = tr.checkpoint_frequency;
    o->resume = tr.resume;
    o->seed = tr.seed;
    o->workers = (unsigned)tr.workers;
    o->compute_threads = tr.threads;
    o->cpus = tr.cpus;
    o->pin = !tr.no_pin;
    o->prefetch = (unsigned)tr.prefetch;
    o->read_depth = (unsigned)tr.depth;
    remote_set(&o->remote, &tr.remote);
    o->fail_on_error = tr.fail_on_error;
    return 0;
}

/* This process's place among the launcher's processes on its node (Open
 * MPI, MPICH's Hydra, Slurm), or 0. */
static int local_rank_from_launcher(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

/*
 * --execution-environment parallel: starts MPI and opens this worker's
 * communicator: on a machine with GPUs one GPU a worker, picked by its
 * place on the node (NCCL), else CPU workers (MPI). Only worker 0 prints,
 * logs, plots and saves. Returns 0 or 2 after a message.
 */
static int train_start_comm(train_job *j) {
    j->world = 1;
    if (j->o.execution != DSRT_EXEC_PARALLEL) return 0;
    if (dsrt_comm_init(NULL, NULL) != 0) {
        fprintf(stderr, "%s train: --execution-environment parallel: %s\n", prog,
                dsrt_last_error());
        return 2;
    }
    j->mpi = 1;
    dsrt_comm_options co = j->o.comm_options;
    int ngpu = dsrt_gpu_count();
    if (ngpu > 0 && dsrt_comm_available(DSRT_COMM_NCCL) == 0) {
        co.kind = DSRT_COMM_NCCL;
        co.device = local_rank_from_launcher() % ngpu;
        j->o.gpu = j->no.device = co.device;
    } else {
        co.kind = DSRT_COMM_MPI;
        j->o.gpu = -1;
        j->no.device = DSRT_DEVICE_CPU;
    }
    if (dsrt_comm_open(&j->comm, &co) != 0) {
        fprintf(stderr, "%s train: --execution-environment parallel: %s\n", prog,
                dsrt_last_error());
        return 2;
    }
    j->o.comm = j->comm;
    j->rank = dsrt_comm_rank(j->comm);
    j->world = dsrt_comm_size(j->comm);
    snprintf(j->worker, sizeof j->worker, " (worker %d of %d)", j->rank, j->world);
    if (j->rank != 0) {
        tr.json = 0;
        tr.quiet = 1;
        tr.no_progress = 1;
    }
    return 0;
}

/*
 * --resume auto: the newest complete checkpoint of --checkpoint-dir becomes
 * --resume, or there is none and the run starts afresh. Worker 0 chooses and
 * tells the others (one broadcast), so every worker of a data-parallel run
 * resumes the same checkpoint even where their views of the folder differ.
 * Newer checkpoints that do not load are named and passed over. Returns 0
 * or 2 after a message.
 */
static int train_resolve_auto_resume(train_job *j) {
    if (!tr.resume || strcmp(tr.resume, "auto") != 0) return 0;
    /* 'P' path, 'N' none, 'E' message: what worker 0 found. */
    char *msg = j->auto_ckpt, skipped[2048] = "";
    char *buf = calloc(1, sizeof j->auto_ckpt + 1);
    if (!buf) return 2;
    if (j->rank == 0) {
        int rc = dsrt_checkpoint_latest_complete(tr.checkpoint_dir, buf + 1, sizeof j->auto_ckpt,
                                                 skipped, sizeof skipped);
        buf[0] = rc == 0 ? 'P' : rc == -ENOENT ? 'N' : 'E';
        if (buf[0] == 'E') snprintf(buf + 1, sizeof j->auto_ckpt, "%s", dsrt_last_error());
        for (char *line = skipped; *line;) {
            char *end = strchr(line, '\n');
            if (end) *end = '\0';
            fprintf(stderr, "%s train: --resume auto: passing over %s\n", prog, line);
            if (!end) break;
            line = end + 1;
        }
    }
    if (j->comm && dsrt_comm_bcast(j->comm, buf, sizeof j->auto_ckpt + 1, 0) != 0) {
        fprintf(stderr, "%s train%s: --resume auto: %s\n", prog, j->worker, dsrt_last_error());
        free(buf);
        return 2;
    }
    int status = 0;
    buf[sizeof j->auto_ckpt] = '\0';
    snprintf(msg, sizeof j->auto_ckpt, "%s", buf[0] == 'P' ? buf + 1 : "");
    if (buf[0] == 'E') {
        fprintf(stderr, "%s train%s: --resume auto: %s\n", prog, j->worker, buf + 1);
        status = 2;
    } else if (j->rank == 0) {
        if (msg[0])
            fprintf(stderr, "%s train: --resume auto: resuming from %s\n", prog, msg);
        else
            fprintf(stderr,
                    "%s train: --resume auto: no complete checkpoint in %s: starting "
                    "afresh\n",
                    prog, tr.checkpoint_dir);
    }
    free(buf);
    tr.resume = msg[0] ? msg : NULL;
    j->o.resume = tr.resume;
    return status;
}

/* A process that mpirun (or another MPI launcher) started as one of
 * several, without --execution-environment parallel, would train the whole
 * job alone, as would each of the others, into the same outputs: refused.
 * Open MPI and MPICH's Hydra say so in the environment, MPI library or not.
 * Returns 0 or 2 after a message. */
static int train_refuse_lone_rank(const train_job *j) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    if (j->o.execution == DSRT_EXEC_PARALLEL) return 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) {
            fprintf(stderr,
                    "%s train: started as one of %d processes of an MPI job (%s=%s) without "
                    "--execution-environment parallel: each would train the whole job alone and "
                    "write the same outputs; give --execution-environment parallel, or start "
                    "one process\n",
                    prog, atoi(v), vars[i], v);
            return 2;
        }
    }
    return 0;
}

/* Every worker says whether it could start (status 0); when one could not,
 * the others stop too, naming it. Returns the status to go on with. */
static int train_agree(train_job *j, int status) {
    if (!j->comm) return status;
    double *v = calloc((size_t)j->world, sizeof *v);
    if (!v) return status ? status : 1;
    v[j->rank] = status != 0;
    if (dsrt_comm_sum_f64(j->comm, v, (size_t)j->world) != 0) {
        fprintf(stderr, "%s train%s: %s\n", prog, j->worker, dsrt_last_error());
        free(v);
        return status ? status : 1;
    }
    int first = -1;
    for (int k = 0; k < j->world && first < 0; k++)
        if (v[k] != 0) first = k;
    free(v);
    if (first >= 0 && !status) {
        fprintf(stderr, "%s train%s: worker %d could not start (see its message); stopping\n", prog,
                j->worker, first);
        status = 2;
    }
    return status;
}

/* Checks every output path and opens the log and the bad-file list, before
 * any work: a run must not end with nowhere to put its results. Returns 0
 * or 2 after a message. */
static int train_open_outputs(train_job *j) {
    if (tr.log) {
        size_t n = strlen(tr.log);
        if (n > 4 && !strcmp(tr.log + n - 4, ".csv"))
            j->log_json = 0;
        else if ((n > 6 && !strcmp(tr.log + n - 6, ".jsonl")) ||
                 (n > 5 && !strcmp(tr.log + n - 5, ".json")))
            j->log_json = 1;
        else {
            fprintf(stderr, "%s train: --log %s: name it .csv or .jsonl\n", prog, tr.log);
            return 2;
        }
    }
    if (tr.plot) {
        size_t n = strlen(tr.plot);
        if (n < 5 || strcmp(tr.plot + n - 4, ".svg") != 0) {
            fprintf(stderr, "%s train: --plot %s: the plot is an SVG file (name it .svg)\n", prog,
                    tr.plot);
            return 2;
        }
    }
    const struct {
        const char *option, *path;
        int regular; /* written by rename: only a regular file may be replaced */
    } out_paths[] = {{"save", tr.save, 1},
                     {"plot", tr.plot, 1},
                     {"log", tr.log, 0},
                     {"bad-list", tr.bad_list, 0}};
    /* The files read: an output that is one of them (or another output)
     * would replace it. */
    const struct {
        const char *option, *path;
    } in_paths[] = {{"resume", tr.resume}, {"net", tr.net}, {"transfer", tr.transfer}};
    char why[512];
    for (size_t i = 0; i < sizeof out_paths / sizeof out_paths[0]; i++) {
        if (!out_paths[i].path) continue;
        if (tool_check_output(out_paths[i].path, out_paths[i].regular, why, sizeof why)) {
            fprintf(stderr, "%s train: --%s %s: %s\n", prog, out_paths[i].option, out_paths[i].path,
                    why);
            return 2;
        }
        for (size_t k = 0; k < sizeof in_paths / sizeof in_paths[0]; k++)
            if (tool_same_file(out_paths[i].path, in_paths[k].path)) {
                fprintf(stderr,
                        "%s train: --%s %s: is the file --%s reads (%s): it would be replaced; "
                        "give another name\n",
                        prog, out_paths[i].option, out_paths[i].path, in_paths[k].option,
                        in_paths[k].path);
                return 2;
            }
        for (size_t k = 0; k < i; k++)
            if (out_paths[k].path && (tool_same_file(out_paths[i].path, out_paths[k].path) ||
                                      !strcmp(out_paths[i].path, out_paths[k].path))) {
                fprintf(stderr, "%s train: --%s %s: is also --%s: give each its own file\n", prog,
                        out_paths[i].option, out_paths[i].path, out_paths[k].option);
                return 2;
            }
    }
    if (tr.order_log) {
        char path[4200];
        snprintf(path, sizeof path, j->world > 1 ? "%s.%d" : "%s", tr.order_log, j->rank);
        if (!(j->orderf = tool_open_output(path, why, sizeof why))) {
            fprintf(stderr, "%s train%s: --order-log %s: %s\n", prog, j->worker, path, why);
            return 2;
        }
    }
    if (j->rank != 0) {
        /* Checked on every worker alike; written by worker 0 only. */
        tr.save = tr.plot = tr.log = tr.bad_list = NULL;
        return 0;
    }
    if (tr.log && !(j->logf = tool_open_output(tr.log, why, sizeof why))) {
        fprintf(stderr, "%s train: --log %s: %s\n", prog, tr.log, why);
        return 2;
    }
    if (tr.bad_list && !(j->ui.bad[0].out = tool_open_output(tr.bad_list, why, sizeof why))) {
        fprintf(stderr, "%s train: --bad-list %s: %s\n", prog, tr.bad_list, why);
        return 2;
    }
    j->ui.bad[1].out = j->ui.bad[0].out;
    j->ui.bad[1].data = "val";
    return 0;
}

/* The net for --transfer: the base model with a new last layer for the
 * data's classes. Returns 0 or 1 after a message. */
static int train_transfer_net(train_job *j) {
    int rc = load_model("train", "--transfer", tr.transfer, &tr.onnx, &j->no, &j->base);
    if (rc) return rc;
    int classes = (int)dsrt_datastore_num_classes(j->train);
    dsrt_transfer_options to = dsrt_transfer_defaults();
    to.classes = classes;
    to.base_lr_factor = (float)j->lr_factor;
    to.new_weight_lr = to.new_bias_lr = (float)j->new_lr_factor;
    to.layer = tr.layer;
    const char **names = calloc((size_t)classes, sizeof *names);
    if (!names) return 1;
    for (int c = 0; c < classes; c++) names[c] = dsrt_datastore_class_name(j->train, (size_t)c);
    to.class_names = names;
    rc = dsrt_net_transfer(&j->net, j->base, &to, &j->no);
    free(names);
    if (rc) {
        fprintf(stderr, "%s train: --transfer: %s\n", prog, dsrt_last_error());
        return 1;
    }
    return 0;
}

/* The data, then the net: built, loaded, transferred or the checkpoint's.
 * Returns 0, or the exit status after a message. */
static int train_open_data_and_net(train_job *j) {
    const char *cmd = "train";
    if (onnx_flags_alone(cmd, &tr.onnx, tr.net, tr.transfer)) return 2;
    if (tr.resume) {
        /* The loop's state beside a checkpoint, given for it (with or
         * without --net): refused before any work, naming the checkpoint. */
        size_t n = strlen(tr.resume), ns = strlen(STATE_SUFFIX_TEXT);
        struct stat st;
        if (n > ns && !strcmp(tr.resume + n - ns, STATE_SUFFIX_TEXT) && stat(tr.resume, &st) == 0 &&
            S_ISREG(st.st_mode) && !is_model_file(tr.resume)) {
            fprintf(stderr,
                    "%s train: --resume %s: the state of the training loop kept beside a "
                    "checkpoint, not the checkpoint: give %.*s\n",
                    prog, tr.resume, (int)(n - ns), tr.resume);
            return 2;
        }
    }
    dsrt_mix_options mo;
    train_mix(&mo); /* checked with the other options */
    data_args da = {tr.drop_empty_classes, tr.order, tr.shuffle_buffer, &tr.remote, tr.mix, mo};
    data_args va = {tr.drop_empty_classes, tr.order, tr.shuffle_buffer, &tr.remote, NULL, mo};
    if (open_data(cmd, "--data", tr.data.v, tr.data.n, &da, &j->train) ||
        (tr.val && open_data(cmd, "--val", &tr.val, 1, &va, &j->val)))
        return 2;
    j->o.validation = j->val;
    j->no.seed = tr.seed;
    j->netname = tr.net;
    if (!j->netname && tr.resume) {
        struct stat st;
        if (stat(tr.resume, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (dsrt_checkpoint_latest(tr.resume, j->ckpt, sizeof j->ckpt) != 0) {
                fprintf(stderr, "%s train: --resume: %s\n", prog, dsrt_last_error());
                return 2;
            }
        } else {
            snprintf(j->ckpt, sizeof j->ckpt, "%s", tr.resume);
        }
        j->netname = j->ckpt;
    }
    if (!j->netname && !tr.transfer) j->netname = "digits";
    const char *netname = j->netname;
    /* Where the net comes from, for messages: --resume's checkpoint or --net. */
    const char *from = netname == j->ckpt ? "--resume" : "--net";
    if (tr.transfer) {
        if (train_transfer_net(j)) return 1;
    } else if (dsrt_net_builtin(netname, NULL)) {
        j->desc = dsrt_describe_datastore_classes(netname, j->train);
    } else if (is_model_file(netname) || is_onnx_file(netname)) {
        int rc = load_model("train", from, netname, &tr.onnx, &j->no, &j->net);
        if (rc) return rc;
    } else if (netname == j->ckpt) {
        /* --resume names something that is not a checkpoint. */
        char why[256];
        char *text = read_net_text(netname, why, sizeof why);
        free(text);
        if (!text)
            fprintf(stderr, "%s train: --resume: %s: %s\n", prog, netname, why);
        else
            fprintf(stderr,
                    "%s train: --resume %s: not a checkpoint (a dsrt checkpoint file, or a folder "
                    "of them)\n",
                    prog, netname);
        return 2;
    } else {
        char why[256];
        j->text = read_net_text(netname, why, sizeof why);
        if (!j->text) {
            if (netname == j->ckpt)
                fprintf(stderr, "%s train: --resume: %s: %s\n", prog, netname, why);
            else
                net_unknown("train", netname, why);
            return 2;
        }
        j->desc = dsrt_describe_datastore_classes(j->text, j->train);
    }
    if (!j->net && !j->desc && !strncmp(dsrt_last_error(), "class names:", 12)) {
        /* The names come from the data's class folders. */
        char shown[4096];
        fprintf(stderr, "%s train: --data %s: %s\n", prog,
                data_shown(tr.data.v, tr.data.n, tr.mix, shown, sizeof shown), dsrt_last_error());
        return 2;
    }
    if (!j->net) {
        int classes = (int)dsrt_datastore_num_classes(j->train);
        if (!j->desc || dsrt_net_create(&j->net, j->desc, 0, 0, 0, classes, &j->no) != 0) {
            if (j->text)
                net_file_error(netname, j->text);
            else
                fprintf(stderr, "%s train: --net: %s\n", prog, dsrt_last_error());
            return 2;
        }
    }
    return 0;
}

/* The display: table, JSON lines, progress bar, log, plot. */
static int train_setup_ui(train_job *j) {
    if (j->logf && !j->log_json)
        fprintf(j->logf, "epoch,iteration,time_s,loss,accuracy,learn_rate,val_loss,val_accuracy\n");
    if ((tr.plot && dsrt_train_history_create(&j->hist) != 0)) return 1;
    train_ui *ui = &j->ui;
    ui->log = j->logf;
    ui->order = j->orderf;
    ui->log_json = j->log_json;
    ui->hist = j->hist;
    ui->plot = tr.plot;
    ui->json = tr.json;
    ui->table = !tr.json && !tr.quiet;
    ui->progress = !tr.json && !tr.no_progress && isatty(STDERR_FILENO);
    char shown[4096];
    /* A transfer run is named after the model it starts from. */
    const char *model = tr.transfer ? strrchr(tr.transfer, '/') : NULL;
    model = model ? model + 1 : tr.transfer;
    if (model)
        snprintf(j->title, sizeof j->title, "%s (transfer) on %s", model,
                 data_shown(tr.data.v, tr.data.n, tr.mix, shown, sizeof shown));
    else
        snprintf(j->title, sizeof j->title, "%s on %s", j->netname,
                 data_shown(tr.data.v, tr.data.n, tr.mix, shown, sizeof shown));
    ui->title = j->title;
    j->o.callback = train_event;
    j->o.callback_ctx = ui;
    if (ui->table) {
        dsrt_net_info ni;
        dsrt_net_get_info(j->net, &ni);
        printf("Training %s (%zu parameters, input %dx%dx%d, %d classes) on %zu images",
               tr.transfer ? tr.transfer : j->netname, ni.learnable, ni.height, ni.width,
               ni.channels, ni.classes, dsrt_datastore_count(j->train));
        if (j->val) printf(", validating on %zu", dsrt_datastore_count(j->val));
        if (j->world > 1)
            printf(", %d workers (MPI ranks) sharing each batch of %d", j->world, j->o.batch);
        if (j->o.execution == DSRT_EXEC_MULTI_GPU) printf(", one worker a GPU");
        printf("\n");
    }
    return 0;
}

/* A failed run: the message, and the bad files met on the way. */
static void train_report_failure(train_job *j, int rc, const dsrt_train_result *r) {
    fprintf(stderr, "%s%s %s\n", prog, j->worker, dsrt_last_error());
    if (j->rank != 0) return;
    if (tr.json) {
        printf("{\"event\": \"error\", \"code\": %d, \"error\": ", rc);
        tool_json_string(stdout, dsrt_last_error());
        printf(", \"iterations\": %lld", (long long)r->iterations);
        tool_bad_json(stdout, "", &j->ui.bad[0], r->skipped);
        tool_bad_json(stdout, "val_", &j->ui.bad[1], r->val_skipped);
        printf("}\n");
    } else {
        tool_bad_print("dstrain train", "training", &j->ui.bad[0], r->skipped, 0, tr.bad_list);
        tool_bad_print("dstrain train", "validation", &j->ui.bad[1], r->val_skipped, 1,
                       tr.bad_list);
    }
}

/* The weights: to --save, or, when that fails, where they are kept anyway.
 * Returns the file holding them, or NULL (then a message said why). */
static const char *train_save(train_job *j, const dsrt_train_result *r, char *fallback,
                              size_t size) {
    if (!tr.save) return NULL;
    if (dsrt_model_save(tr.save, j->net) == 0) return tr.save;
    fprintf(stderr, "%s train: --save %s: %s\n", prog, tr.save, dsrt_last_error());
    const char *saved = NULL;
    if (r->checkpoint[0] && !strcmp(r->checkpoint + strlen(r->checkpoint) - 5, ".dsrt")) {
        fprintf(stderr, "%s train: the trained weights are in the last checkpoint, %s\n", prog,
                r->checkpoint);
        return NULL;
    }
    const char *tmp = getenv("TMPDIR");
    const char *dirs[] = {".", tmp && *tmp ? tmp : "/tmp"};
    for (int d = 0; d < 2 && !saved; d++) {
        snprintf(fallback, size, "%s/dstrain-weights-%ld.dsrt", dirs[d], (long)getpid());
        if (dsrt_model_save(fallback, j->net) == 0) saved = fallback;
    }
    if (saved)
        fprintf(stderr, "%s train: the trained weights were written to %s instead\n", prog, saved);
    else
        fprintf(stderr, "%s train: the trained weights could not be written anywhere\n", prog);
    return saved;
}

static const char *const train_stops[] = {"max epochs completed", "validation patience reached",
                                          "stopped by request", "error"};

/* Whether this run trained enough steps for its images/s to mean a rate: a
 * single step (a resumed run with one left) is mostly start-up. */
static int train_rate_known(const dsrt_train_result *r) {
    return r->iterations - r->start_iteration >= 2;
}

/* The summary as one JSON line. */
static void train_summary_json(train_job *j, const dsrt_train_result *r, const char *saved,
                               const char *interrupted) {
    dsrt_net_info ni;
    dsrt_net_get_info(j->net, &ni);
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32], b8[32];
    printf("{\"event\": \"summary\", \"net\": ");
    tool_json_string(stdout, tr.transfer ? tr.transfer : j->netname);
    printf(", \"stop\": \"%s\", \"epochs\": %lld, \"iterations\": %lld, \"images\": %llu, "
           "\"train_s\": %s, \"val_s\": %s, \"images_per_s\": %s, \"val_accuracy\": "
           "%s, \"val_loss\": %s, \"loss\": %s, \"accuracy\": %s, \"batch\": %d, "
           "\"workers\": %u, \"compute_threads\": %d, \"pinned\": %d, "
           "\"consumer_wait_s\": %s, \"seed\": %llu, \"weights_checksum\": \"%016llx\"",
           interrupted ? interrupted : train_stops[r->stop], (long long)r->epochs,
           (long long)r->iterations, (unsigned long long)r->images,
           tool_json_number(b5, "%.3f", r->train_s), tool_json_number(b6, "%.3f", r->val_s),
           train_rate_known(r) ? tool_json_number(b7, "%.1f", r->images_per_s) : "null",
           jnum(b1, r->val_accuracy), jnum(b2, r->val_loss), jnum(b3, r->loss),
           jnum(b4, r->accuracy), j->o.batch, r->workers, r->compute_threads, r->pinned,
           tool_json_number(b8, "%.3f", r->consumer_wait_s), (unsigned long long)r->seed,
           (unsigned long long)r->weights_checksum);
    printf(", \"start_iteration\": %lld", (long long)r->start_iteration);
    if (r->cache_hits || r->cache_misses)
        printf(", \"cache\": {\"hits\": %llu, \"misses\": %llu, \"bytes_from_cache\": %llu, "
               "\"bytes_from_store\": %llu, \"requests_to_store\": %llu, \"evictions\": %llu}",
               (unsigned long long)r->cache_hits, (unsigned long long)r->cache_misses,
               (unsigned long long)r->cache_bytes, (unsigned long long)r->remote_bytes,
               (unsigned long long)r->remote_requests, (unsigned long long)r->cache_evictions);
    tool_bad_json(stdout, "", &j->ui.bad[0], r->skipped);
    if (j->val) tool_bad_json(stdout, "val_", &j->ui.bad[1], r->val_skipped);
    if (r->checkpoint[0]) {
        printf(", \"checkpoint\": ");
        tool_json_string(stdout, r->checkpoint);
    }
    printf(", \"world\": %d, \"device\": %d, \"precision\": \"%s\"", r->world, r->device,
           dsrt_precision_name(ni.precision));
    if (r->resume_states) printf(", \"resume_states\": %d", r->resume_states);
    if (r->resume_workers) printf(", \"resume_workers\": %d", r->resume_workers);
    if (r->device >= 0) {
        double dev_s = r->device_busy_s + r->device_idle_s;
        printf(", \"device_busy_s\": %s, \"device_idle_s\": %s, \"device_idle_share\": %s",
               tool_json_number(b1, "%.3f", r->device_busy_s),
               tool_json_number(b2, "%.3f", r->device_idle_s),
               tool_json_number(b3, "%.4f", dev_s > 0 ? r->device_idle_s / dev_s : 0.0));
    }
    printf(", \"model\": ");
    if (saved)
        tool_json_string(stdout, saved);
    else
        printf("null");
    printf("}\n");
}

/* The summary as text. */
static void train_summary_text(train_job *j, const dsrt_train_result *r, const char *saved,
                               const char *interrupted) {
    dsrt_net_info ni;
    dsrt_net_get_info(j->net, &ni);
    if (interrupted)
        printf("Training %s after iteration %lld of %lld, %.1f s of training.\n", interrupted,
               (long long)r->iterations, (long long)(j->ui.ipe * j->o.max_epochs), r->train_s);
    else if (r->start_iteration > 0)
        printf("Training finished: %s. %lld epochs, %lld iterations; resumed at iteration %lld, "
               "this run trained %lld in %.1f s",
               train_stops[r->stop], (long long)r->epochs, (long long)r->iterations,
               (long long)r->start_iteration, (long long)(r->iterations - r->start_iteration),
               r->train_s);
    else
        printf("Training finished: %s. %lld epochs, %lld iterations, %.1f s of training",
               train_stops[r->stop], (long long)r->epochs, (long long)r->iterations, r->train_s);
    if (!interrupted) {
        if (train_rate_known(r))
            printf(": %.0f images/s (loading included; the compute waited %.2f s for data).\n",
                   r->images_per_s, r->consumer_wait_s);
        else
            printf(" (too few iterations for a rate).\n");
    }
    if (r->cache_hits || r->cache_misses)
        printf("Cache: %llu reads from it (%.1f MB), %llu from the store (%.1f MB in %llu "
               "requests), %llu entries evicted.\n",
               (unsigned long long)r->cache_hits, r->cache_bytes / 1e6,
               (unsigned long long)r->cache_misses, r->remote_bytes / 1e6,
               (unsigned long long)r->remote_requests, (unsigned long long)r->cache_evictions);
    if (r->device >= 0)
        printf("GPU %d (%s): busy %.1f s, idle between steps %.2f s (%.1f%%).\n", r->device,
               dsrt_precision_name(ni.precision), r->device_busy_s, r->device_idle_s,
               100 * r->device_idle_s / (r->device_busy_s + r->device_idle_s + 1e-9));
    if (!isnan(r->val_accuracy))
        printf("Validation accuracy %.2f%%, loss %.4f (validation took %.1f s).\n",
               100 * r->val_accuracy, r->val_loss, r->val_s);
    else if (!j->val && r->start_iteration > 0)
        printf("No validation in this run (give --val to measure it).\n");
    /* A checkpoint of workers with optimizer states of their own, resumed
     * other than by as many workers keeping theirs: the mean was taken. */
    int own = j->o.averaging_frequency > 0 && !j->o.average_optimizer_state &&
              r->world == r->resume_states;
    if (r->resume_workers && r->resume_workers != r->world)
        printf("Resumed from a checkpoint of %d worker%s on %d: the rest of its epoch was its "
               "batches split over %d, each sample once.\n",
               r->resume_workers, r->resume_workers == 1 ? "" : "s", r->world, r->world);
    if (r->resume_states > 1 && !own)
        printf("Resumed from a checkpoint of %d workers, each with its optimizer state: every "
               "worker started from their mean.\n",
               r->resume_states);
    printf("Weights checksum %016llx", (unsigned long long)r->weights_checksum);
    if (r->checkpoint[0]) printf("; last checkpoint %s", r->checkpoint);
    if (saved) printf("; model saved to %s", saved);
    printf("\n");
}

/* The signal that stopped the run, whichever worker it came to (every
 * worker stopped at the same step, having agreed to): the first by rank
 * that got one, *worker receiving which. 0 when none did. */
static int train_stop_signal(train_job *j, int *worker) {
    *worker = j->rank;
    int sig = atomic_load(&stop_signal);
    if (!j->comm) return sig;
    double *v = calloc((size_t)j->world, sizeof *v);
    if (!v) return sig;
    v[j->rank] = sig;
    if (dsrt_comm_sum_f64(j->comm, v, (size_t)j->world) != 0) {
        fprintf(stderr, "%s train%s: %s\n", prog, j->worker, dsrt_last_error());
    } else {
        for (int k = 0; k < j->world; k++)
            if (v[k] != 0) {
                sig = (int)v[k];
                *worker = k;
                break;
            }
    }
    free(v);
    return sig;
}

/* Every worker exits with worker 0's status, once worker 0 has written
 * and said what it kept (a worker that exits first with a non-zero status
 * would have mpirun end the job under it). */
static int train_final_status(train_job *j, int status) {
    if (!j->comm) return status;
    int32_t st = status;
    if (dsrt_comm_bcast(j->comm, &st, sizeof st, 0) != 0) {
        fprintf(stderr, "%s train%s: %s\n", prog, j->worker, dsrt_last_error());
        return status ? status : 1;
    }
    return st;
}

/* Trains and reports. Returns the exit status. */
static int train_run(train_job *j) {
    /* From here a signal stops after the current step (see on_stop_signal). */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        sigaction(stop_signals[i].sig, &sa, NULL);

    dsrt_train_result r;
    int rc = dsrt_train(j->net, j->train, &j->o, &r);
    if (j->hist && tr.plot && dsrt_train_history_svg(j->hist, tr.plot, j->title) != 0) {
        fprintf(stderr, "%s train: --plot: %s\n", prog, dsrt_last_error());
        j->ui.plot_failed = 1;
    }
    if (rc) {
        train_report_failure(j, rc, &r);
        return 1;
    }
    int who, sig = train_stop_signal(j, &who);
    int interrupted = r.stop == DSRT_STOP_CALLBACK && sig;
    if (j->rank != 0) /* worker 0 reports and saves */
        return train_final_status(j, interrupted ? 128 + sig : 0);
    char fallback[4200] = "", how[96] = "";
    if (interrupted && j->world > 1)
        snprintf(how, sizeof how, "interrupted by %s to worker %d", signal_name(sig), who);
    else if (interrupted)
        snprintf(how, sizeof how, "interrupted by %s", signal_name(sig));
    const char *saved = train_save(j, &r, fallback, sizeof fallback);
    if (tr.json)
        train_summary_json(j, &r, saved, interrupted ? how : NULL);
    else
        train_summary_text(j, &r, saved, interrupted ? how : NULL);
    fflush(stdout);
    if (!tr.json) {
        tool_bad_print("dstrain train", "training", &j->ui.bad[0], r.skipped, 0, tr.bad_list);
        tool_bad_print("dstrain train", "validation", &j->ui.bad[1], r.val_skipped, 1, tr.bad_list);
    }
    if (interrupted) {
        if (r.checkpoint[0] || saved)
            fprintf(stderr, "%s train: %s; kept%s%s%s%s\n", prog, how,
                    r.checkpoint[0] ? " the checkpoint " : "", r.checkpoint,
                    saved ? (r.checkpoint[0] ? " and the model " : " the model ") : "",
                    saved ? saved : "");
        else
            fprintf(stderr,
                    "%s train: %s; nothing kept (give --checkpoint-dir or --save to keep the "
                    "weights of an interrupted run)\n",
                    prog, how);
    }
    int status = interrupted ? 128 + sig : 0;
    if ((tr.save && saved != tr.save) || j->ui.plot_failed) status = status ? status : 1;
    return train_final_status(j, status);
}

/* Closes what the job opened; a status 0 becomes 1 when the log or the
 * bad-file list could not be written in full. */
static int train_close(train_job *j, int status) {
    if (j->logf && (ferror(j->logf) | fclose(j->logf))) {
        fprintf(stderr, "%s train: --log %s: the log could not be written in full\n", prog, tr.log);
        if (status == 0) status = 1;
    }
    if (j->orderf && (ferror(j->orderf) | fclose(j->orderf))) {
        fprintf(stderr, "%s train: --order-log %s: not written in full\n", prog, tr.order_log);
        if (status == 0) status = 1;
    }
    FILE *bad = j->ui.bad[0].out;
    if (bad && (j->ui.bad[0].write_failed | ferror(bad) | fclose(bad))) {
        fprintf(stderr, "%s train: --bad-list %s: the list could not be written in full\n", prog,
                tr.bad_list);
        if (status == 0) status = 1;
    }
    tool_bad_free(&j->ui.bad[0]);
    tool_bad_free(&j->ui.bad[1]);
    dsrt_train_history_destroy(j->hist);
    dsrt_comm_close(j->comm); /* before the net it may still hold */
    dsrt_net_destroy(j->net);
    dsrt_net_destroy(j->base);
    dsrt_datastore_close(j->val);
    dsrt_datastore_close(j->train);
    free(j->text);
    free(j->desc);
    if (j->mpi) dsrt_comm_finalize();
    return status;
}

/* dstrain train: parse, open the outputs, the data and the net, check the
 * options against them, train, report, close. */
static int cmd_train(int argc, char **argv) {
    train_set_defaults();
    int rc = parse_options("train", argc, argv, TRAIN_OPTIONS, train_usage);
    if (rc) return rc > 0 ? 0 : 2;
    train_job job;
    train_job *j = &job;
    memset(j, 0, sizeof *j);
    if ((rc = train_resolve_options(j)) || (rc = train_refuse_lone_rank(j))) return rc;
    int status = train_start_comm(j);
    if (status == 0) status = train_resolve_auto_resume(j);
    if (status == 0) status = train_open_outputs(j);
    if (status == 0) status = train_open_data_and_net(j);
    if (status == 0 && dsrt_train_check(&j->o, j->net, j->train) != 0) {
        fprintf(stderr, "%s%s %s\n", prog, j->worker, dsrt_last_error());
        status = 2;
    }
    if (j->mpi) status = train_agree(j, status);
    if (status == 0) status = train_setup_ui(j);
    if (status == 0) status = train_run(j);
    return train_close(j, status);
}

// ----------------------------------------------------------------------------
// eval

static struct {
    const char *model, *data, *cpus, *bad_list;
    int batch, threads, workers, json, no_pin, depth, drop_empty_classes, shuffle_buffer;
    const char *order;
    remote_opts remote;
    device_args dev;
    onnx_args onnx;
} ev;

static const option EVAL_OPTIONS[] = {
    {"model", OPT_STR, &ev.model},
    {"data", OPT_STR, &ev.data},
    {"batch", OPT_INT, &ev.batch},
    {"threads", OPT_INT, &ev.threads},
    {"workers", OPT_INT, &ev.workers},
    {"cpus", OPT_STR, &ev.cpus},
    {"no-pin", OPT_FLAG, &ev.no_pin},
    DEVICE_OPTIONS(ev.dev),
    {"depth", OPT_INT, &ev.depth},
    REMOTE_OPTIONS(ev.remote),
    {"bad-list", OPT_STR, &ev.bad_list},
    {"drop-empty-classes", OPT_FLAG, &ev.drop_empty_classes},
    {"order", OPT_STR, &ev.order},
    ONNX_OPTIONS(ev.onnx),
    ONNX_CLASSES_OPTION(ev.onnx),
    {"json", OPT_FLAG, &ev.json},
    {NULL, 0, NULL},
};

static void eval_usage(FILE *f) {
    fprintf(f,
            "usage: %s eval --model FILE --data DIR [options]\n\n"
            "Runs a trained model over labelled images and reports the accuracy, the accuracy\n"
            "of each class and the confusion matrix (rows: true class, columns: predicted).\n"
            "The data's classes are matched to the model's by name. Each image that can be\n"
            "read counts once; those that cannot are left out and named (the first %d;\n"
            "--bad-list writes all).\n\noptions:\n",
            prog, TOOL_BAD_SHOWN);
    print_options(f, "eval", EVAL_OPTIONS);
}

static void eval_print_json(const dsrt_net *net, const dsrt_eval_result *r,
                            const tool_bad_list *bad, const char *shown) {
    int C = r->classes;
    char name[256];
    printf("{\"model\": ");
    tool_json_string(stdout, ev.model);
    printf(", \"data\": ");
    tool_json_string(stdout, shown);
    char b1[32], b2[32], b3[32], b4[32];
    printf(", \"images\": %llu, \"correct\": %llu, \"accuracy\": %s, \"loss\": %s, "
           "\"seconds\": %s, \"images_per_s\": %s, ",
           (unsigned long long)r->images, (unsigned long long)r->correct, jnum(b1, r->accuracy),
           jnum(b2, r->loss), tool_json_number(b3, "%.3f", r->seconds),
           tool_json_number(b4, "%.1f", r->images_per_s));
    printf("\"not_finite\": %llu, \"classes\": [", (unsigned long long)r->not_finite);
    for (int c = 0; c < C; c++) {
        if (dsrt_net_class_name(net, c, name, sizeof name) < 0)
            snprintf(name, sizeof name, "%d", c);
        printf(c ? ", " : "");
        tool_json_string(stdout, name);
    }
    printf("], \"per_class\": [");
    for (int c = 0; c < C; c++) {
        uint64_t n = 0;
        for (int p = 0; p < C; p++) n += r->confusion[(size_t)c * C + p];
        printf("%s%s", c ? ", " : "",
               n ? jnum(b1, (double)r->confusion[(size_t)c * C + c] / (double)n) : "null");
    }
    printf("], \"confusion\": [");
    for (int c = 0; c < C; c++) {
        printf("%s[", c ? ", " : "");
        for (int p = 0; p < C; p++)
            printf("%s%llu", p ? ", " : "", (unsigned long long)r->confusion[(size_t)c * C + p]);
        printf("]");
    }
    printf("]");
    tool_bad_json(stdout, "", bad, r->skipped);
    printf("}\n");
}

static void eval_print_text(const dsrt_net *net, const dsrt_eval_result *r,
                            const tool_bad_list *bad, const char *shown) {
    int C = r->classes;
    char name[256];
    printf("%s on %s: accuracy %.2f%% (%llu of %llu), loss %.4f, %.0f images/s\n", ev.model, shown,
           100 * r->accuracy, (unsigned long long)r->correct, (unsigned long long)r->images,
           r->loss, r->images_per_s);
    if (r->not_finite)
        printf("%llu image%s got scores that are not finite (NaN or infinite) and count%s as "
               "wrong\n",
               (unsigned long long)r->not_finite, r->not_finite == 1 ? "" : "s",
               r->not_finite == 1 ? "s" : "");
    if (r->bad_samples)
        printf("%llu image%s could not be read and %s left out (see stderr)\n",
               (unsigned long long)r->bad_samples, r->bad_samples == 1 ? "" : "s",
               r->bad_samples == 1 ? "is" : "are");
    printf("\nper class:\n");
    for (int c = 0; c < C; c++) {
        uint64_t n = 0;
        for (int p = 0; p < C; p++) n += r->confusion[(size_t)c * C + p];
        if (dsrt_net_class_name(net, c, name, sizeof name) < 0)
            snprintf(name, sizeof name, "%d", c);
        printf("  %3d ", c);
        print_padded(name, 20);
        if (n)
            printf(" %7.2f%%  (%llu images)\n",
                   100.0 * (double)r->confusion[(size_t)c * C + c] / (double)n,
                   (unsigned long long)n);
        else
            printf("       -  (no images)\n");
    }
    printf("\nconfusion matrix (rows: true class, columns: predicted):\n      ");
    for (int p = 0; p < C; p++) printf(" %6d", p);
    printf("\n");
    for (int c = 0; c < C; c++) {
        printf("  %3d ", c);
        for (int p = 0; p < C; p++)
            printf(" %6llu", (unsigned long long)r->confusion[(size_t)c * C + p]);
        printf("\n");
    }
    fflush(stdout);
    tool_bad_print("dstrain eval", "", bad, r->skipped, 1, ev.bad_list);
}

static int cmd_eval(int argc, char **argv) {
    memset(&ev, 0, sizeof ev);
    ev.batch = 128;
    int rc = parse_options("eval", argc, argv, EVAL_OPTIONS, eval_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (!ev.model || !ev.data) {
        fprintf(stderr, "%s eval: --model FILE and --data DIR are required (see %s eval --help)\n",
                prog, prog);
        return 2;
    }
    dsrt_net_options no = dsrt_net_defaults();
    if ((rc = resolve_device_args("eval", &ev.dev, &no, NULL))) return rc;
    dsrt_datastore *ds = NULL;
    dsrt_net *net = NULL;
    dsrt_eval_result r = {0};
    tool_bad_list bad = {0};
    int status = 1;
    char why[512];
    if (ev.bad_list && (tool_check_output(ev.bad_list, 0, why, sizeof why) ||
                        !(bad.out = tool_open_output(ev.bad_list, why, sizeof why)))) {
        fprintf(stderr, "%s eval: --bad-list %s: %s\n", prog, ev.bad_list, why);
        return 2;
    }
    if ((status = load_model("eval", "--model", ev.model, &ev.onnx, &no, &net))) goto out;
    status = 1;
    data_args da = {ev.drop_empty_classes, ev.order, 0, &ev.remote, NULL, dsrt_mix_defaults()};
    if (open_data("eval", "--data", &ev.data, 1, &da, &ds)) goto out;
    dsrt_eval_options eo = dsrt_eval_defaults();
    eo.batch = ev.batch;
    eo.compute_threads = ev.threads;
    eo.workers = (unsigned)ev.workers;
    eo.cpus = ev.cpus;
    eo.pin = !ev.no_pin;
    eo.read_depth = (unsigned)ev.depth;
    remote_set(&eo.remote, &ev.remote);
    if (dsrt_evaluate(net, ds, &eo, &r) != 0) {
        fprintf(stderr, "%s %s\n", prog, dsrt_last_error());
        goto out;
    }
    for (uint64_t i = 0; i < r.bad_samples; i++) tool_bad_add(&bad, &r.bad[i]);
    char shown[4096];
    tool_shown(ev.data, shown, sizeof shown);
    if (ev.json)
        eval_print_json(net, &r, &bad, shown);
    else
        eval_print_text(net, &r, &bad, shown);
    status = 0;
    if (r.not_finite) {
        fprintf(stderr,
                "%s eval: %s: the model's scores are not finite (NaN or infinite) for %llu of %llu "
                "images: its weights or input statistics are broken\n",
                prog, ev.model, (unsigned long long)r.not_finite, (unsigned long long)r.images);
        status = 1;
    }
out:
    if (bad.out && (bad.write_failed | ferror(bad.out) | fclose(bad.out))) {
        fprintf(stderr, "%s eval: --bad-list %s: the list could not be written in full\n", prog,
                ev.bad_list);
        if (status == 0) status = 1;
    }
    tool_bad_free(&bad);
    dsrt_eval_result_free(&r);
    dsrt_datastore_close(ds);
    dsrt_net_destroy(net);
    return status;
}

// ----------------------------------------------------------------------------
// classify

static struct {
    const char *model;
    int top, batch, threads, json;
    device_args dev;
    onnx_args onnx;
} cl;

static const option CLASSIFY_OPTIONS[] = {
    {"model", OPT_STR, &cl.model},     {"top", OPT_INT, &cl.top},    {"batch", OPT_INT, &cl.batch},
    {"threads", OPT_INT, &cl.threads}, DEVICE_OPTIONS(cl.dev),       ONNX_OPTIONS(cl.onnx),
    ONNX_CLASSES_OPTION(cl.onnx),      {"json", OPT_FLAG, &cl.json}, {NULL, 0, NULL},
};

static void classify_usage(FILE *f) {
    fprintf(f,
            "usage: %s classify --model FILE [options] PATH...\n\n"
            "Labels images: each PATH is a JPEG, PNG or WebP file, or a folder whose images\n"
            "(in its sub-folders too) are all labelled. Prints, for each image, its path and\n"
            "the K likeliest labels (--top, 3 by default) with their scores (softmax\n"
            "probabilities), or with --json all the scores. Images are resized to the model's\n"
            "input size and converted to its channels, as in training. Columns are separated\n"
            "by tabs; a tab, newline or backslash in a path or class name is written \\t, \\n\n"
            "or \\\\.\n\n"
            "options:\n",
            prog);
    print_options(f, "classify", CLASSIFY_OPTIONS);
}

/*
 * classify streams: a thread reads, decodes and resizes the next batch's
 * images while the net computes on this one, two batches in turn, in the
 * order the paths were given.
 */
typedef struct {
    float *x;
    const char **paths; /* c->files' */
    int n, failures;
    int full; /* 0: the reader's to fill; 1: the net's; 2: the net's, and the last */
} classify_batch;

typedef struct {
    dsrt_net *net;
    dsrt_net_info ni;
    dsrt_decoder *dec;
    dsrt_augmenter *aug;
    dsrt_augment_options ao;
    float *scores;
    char **files; /* every image, folders listed */
    size_t n_files;
    classify_batch b[2];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int failures;
} classifier;

/* Predicts batch b and prints its images' classes. */
static void classify_flush(classifier *c, classify_batch *b) {
    if (b->n == 0) return;
    int C = c->ni.classes;
    if (dsrt_net_predict(c->net, b->x, b->n, c->scores, NULL, NULL, NULL) != 0) {
        fprintf(stderr, "%s classify: %s\n", prog, dsrt_last_error());
        c->failures += b->n;
    } else {
        char name[256], nb[32];
        for (int i = 0; i < b->n; i++) {
            const float *s = c->scores + (size_t)i * C;
            int finite = 1;
            for (int q = 0; q < C; q++) finite &= isfinite(s[q]) != 0;
            if (!finite) {
                /* No class can be named from NaN: the image fails, and the
                 * JSON line says so with its scores as they are. */
                fprintf(stderr,
                        "%s classify: %s: the model's scores are not finite (NaN or infinite): "
                        "its weights or input statistics are broken\n",
                        prog, b->paths[i]);
                c->failures++;
                if (cl.json) {
                    printf("{\"path\": ");
                    tool_json_string(stdout, b->paths[i]);
                    printf(", \"label\": null, \"class\": null, \"score\": null, \"scores\": [");
                    for (int q = 0; q < C; q++)
                        printf("%s%s", q ? ", " : "", jnum(nb, (double)s[q]));
                    printf("], \"error\": \"scores not finite\"}\n");
                }
                continue;
            }
            int k = cl.top < C ? cl.top : C;
            int best[64];
            if (k > 64) k = 64;
            for (int j = 0; j < k; j++) {
                int top = -1;
                for (int q = 0; q < C; q++) {
                    int taken = 0;
                    for (int t = 0; t < j; t++) taken |= best[t] == q;
                    if (!taken && (top < 0 || s[q] > s[top])) top = q;
                }
                best[j] = top;
            }
            if (cl.json) {
                printf("{\"path\": ");
                tool_json_string(stdout, b->paths[i]);
                if (dsrt_net_class_name(c->net, best[0], name, sizeof name) < 0)
                    snprintf(name, sizeof name, "%d", best[0]);
                printf(", \"label\": ");
                tool_json_string(stdout, name);
                printf(", \"class\": %d, \"score\": %.6g, \"scores\": [", best[0],
                       (double)s[best[0]]);
                for (int q = 0; q < C; q++) printf("%s%.6g", q ? ", " : "", (double)s[q]);
                printf("]}\n");
            } else {
                /* Tab-separated: tabs and newlines in names are escaped. */
                tool_text_field(stdout, b->paths[i]);
                for (int j = 0; j < k; j++) {
                    if (dsrt_net_class_name(c->net, best[j], name, sizeof name) < 0)
                        snprintf(name, sizeof name, "%d", best[j]);
                    putchar('\t');
                    tool_text_field(stdout, name);
                    printf("\t%.4f", (double)s[best[j]]);
                }
                printf("\n");
            }
        }
    }
    b->n = 0;
}

/* Reads, decodes and resizes path into batch b's next image; a failure
 * is reported and counted in b. */
static void classify_file(classifier *c, classify_batch *b, const char *path) {
    size_t len = 0;
    char why[256];
    char *data = tool_read_file(path, IMAGE_FILE_MAX, &len, why, sizeof why);
    dsrt_image_info info;
    dsrt_image img;
    if (!data) {
        fprintf(stderr, "%s classify: %s: %s\n", prog, path, why);
        b->failures++;
        return;
    }
    dsrt_decode_request req = {.channels = c->ni.channels};
    int ok = dsrt_decoder_info(c->dec, data, len, &info) == 0;
    if (ok) {
        dsrt_augment_decode_size(&c->ao, info.width, info.height, &req.min_width, &req.min_height);
        ok = dsrt_decode(c->dec, data, len, &req, &img) == 0;
    }
    float *dst = b->x + (size_t)b->n * c->ni.channels * c->ni.height * c->ni.width;
    if (ok)
        ok = dsrt_augment_apply(c->aug, &c->ao, &img, info.width, info.height, 0, 0, 0, dst) == 0;
    free(data);
    if (!ok) {
        fprintf(stderr, "%s classify: %s: %s\n", prog, path, dsrt_last_error());
        b->failures++;
        return;
    }
    b->paths[b->n++] = path;
}

/* The reader: fills the two batches in turn, each once the net is done
 * with it; the last one it fills is marked with full = 2. */
static void *classify_reader(void *arg) {
    classifier *c = arg;
    size_t next = 0;
    for (int k = 0;; k ^= 1) {
        classify_batch *b = &c->b[k];
        pthread_mutex_lock(&c->mu);
        while (b->full) pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        while (b->n < cl.batch && next < c->n_files) classify_file(c, b, c->files[next++]);
        pthread_mutex_lock(&c->mu);
        b->full = next < c->n_files ? 1 : 2;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (next == c->n_files) return NULL;
    }
}

/* Classifies c->files: the reader one batch ahead of the net. */
static int classify_all(classifier *c) {
    pthread_t reader;
    if (pthread_create(&reader, NULL, classify_reader, c) != 0) {
        fprintf(stderr, "%s classify: cannot start the reading thread\n", prog);
        return -1;
    }
    for (int k = 0;; k ^= 1) {
        classify_batch *b = &c->b[k];
        pthread_mutex_lock(&c->mu);
        while (!b->full) pthread_cond_wait(&c->cv, &c->mu);
        int last = b->full == 2;
        pthread_mutex_unlock(&c->mu);
        classify_flush(c, b);
        c->failures += b->failures;
        b->failures = 0;
        pthread_mutex_lock(&c->mu);
        b->full = 0;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (last) break;
    }
    pthread_join(reader, NULL);
    return 0;
}

/* Adds path to c->files (a copy); -1 when out of memory. */
static int classify_add(classifier *c, size_t *cap, const char *path) {
    if (c->n_files == *cap) {
        size_t n = *cap ? 2 * *cap : 256;
        char **f = realloc(c->files, n * sizeof *f);
        if (!f) return -1;
        c->files = f;
        *cap = n;
    }
    if (!(c->files[c->n_files] = strdup(path))) return -1;
    c->n_files++;
    return 0;
}

static int cmd_classify(int argc, char **argv) {
    memset(&cl, 0, sizeof cl);
    cl.top = 3;
    cl.batch = 64;
    /* Paths are the arguments that are neither options nor their values. */
    char **opts = calloc((size_t)argc + 1, sizeof *opts);
    char **paths = calloc((size_t)argc + 1, sizeof *paths);
    int nopts = 0, npaths = 0, status = 1;
    if (!opts || !paths) return 1;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0 && strcmp(argv[i], "-h") != 0) {
            paths[npaths++] = argv[i];
            continue;
        }
        opts[nopts++] = argv[i];
        const option *o = CLASSIFY_OPTIONS;
        while (o->name && strcmp(argv[i] + 2, o->name) != 0) o++;
        if (o->name && o->type != OPT_FLAG && i + 1 < argc) opts[nopts++] = argv[++i];
    }
    int rc = parse_options("classify", nopts, opts, CLASSIFY_OPTIONS, classify_usage);
    if (rc) {
        free(opts);
        free(paths);
        return rc > 0 ? 0 : 2;
    }
    if (!cl.model || npaths == 0) {
        fprintf(stderr,
                "%s classify: --model FILE and at least one PATH are required (see %s "
                "classify --help)\n",
                prog, prog);
        free(opts);
        free(paths);
        return 2;
    }
    classifier c = {0};
    size_t cap = 0;
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    dsrt_net_options no = dsrt_net_defaults();
    if ((rc = resolve_device_args("classify", &cl.dev, &no, NULL))) {
        status = rc;
        goto out;
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    no.threads = cl.threads ? cl.threads : (int)(ncpu > 0 ? ncpu : 1);
    if ((status = load_model("classify", "--model", cl.model, &cl.onnx, &no, &c.net))) goto out;
    status = 1;
    dsrt_net_get_info(c.net, &c.ni);
    c.ao = dsrt_augment_defaults();
    c.ao.output_height = c.ni.height;
    c.ao.output_width = c.ni.width;
    c.ao.output_channels = c.ni.channels;
    size_t per = (size_t)c.ni.channels * c.ni.height * c.ni.width;
    c.scores = malloc((size_t)cl.batch * c.ni.classes * sizeof *c.scores);
    int nomem =
        !c.scores || dsrt_decoder_create(&c.dec, NULL) != 0 || dsrt_augmenter_create(&c.aug) != 0;
    for (int k = 0; k < 2 && !nomem; k++) {
        c.b[k].x = malloc((size_t)cl.batch * per * sizeof *c.b[k].x);
        c.b[k].paths = calloc((size_t)cl.batch, sizeof *c.b[k].paths);
        nomem = !c.b[k].x || !c.b[k].paths;
    }
    /* Every image first (a folder's in its listing's order), then the
     * batches. */
    for (int i = 0; i < npaths && !nomem; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0) {
            int e = errno;
            char shown[4096];
            fprintf(stderr, "%s classify: %s: %s\n", prog,
                    tool_shown(paths[i], shown, sizeof shown), strerror(e));
            c.failures++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            nomem = classify_add(&c, &cap, paths[i]) != 0;
            continue;
        }
        dsrt_datastore_options dso = dsrt_datastore_defaults();
        dso.source = DSRT_SOURCE_FOLDER;
        dso.label_source = DSRT_LABEL_NONE;
        dsrt_datastore *ds;
        if (dsrt_datastore_open(&ds, paths[i], &dso) != 0) {
            fprintf(stderr, "%s classify: %s\n", prog, dsrt_last_error());
            c.failures++;
            continue;
        }
        for (size_t k = 0; k < dsrt_datastore_count(ds) && !nomem; k++)
            nomem = classify_add(&c, &cap, dsrt_datastore_path(ds, k)) != 0;
        dsrt_datastore_close(ds);
    }
    if (nomem) {
        fprintf(stderr, "%s classify: out of memory\n", prog);
        goto out;
    }
    if (c.n_files && classify_all(&c) != 0) goto out;
    status = c.failures ? 1 : 0;
out:
    for (size_t i = 0; i < c.n_files; i++) free(c.files[i]);
    free(c.files);
    for (int k = 0; k < 2; k++) {
        free(c.b[k].x);
        free(c.b[k].paths);
    }
    free(c.scores);
    dsrt_decoder_destroy(c.dec);
    dsrt_augmenter_destroy(c.aug);
    dsrt_net_destroy(c.net);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    free(opts);
    free(paths);
    return status;
}

// ----------------------------------------------------------------------------
// scale: a scaling estimate past this machine

static struct {
    const char *net, *gpus, *nvlink, *ib, *alpha_nvlink, *alpha_ib, *tflops, *bucket, *first;
    int batch, measure_batch, classes, steps, threads, json;
} sc;

static const option SCALE_OPTIONS[] = {
    {"net", OPT_STR, &sc.net},
    {"batch", OPT_INT, &sc.batch},
    {"num-classes", OPT_INT, &sc.classes},
    {"gpus", OPT_STR, &sc.gpus},
    {"tflops", OPT_STR, &sc.tflops},
    {"nvlink", OPT_STR, &sc.nvlink},
    {"ib", OPT_STR, &sc.ib},
    {"alpha-nvlink", OPT_STR, &sc.alpha_nvlink},
    {"alpha-ib", OPT_STR, &sc.alpha_ib},
    {"bucket-size", OPT_STR, &sc.bucket},
    {"first-bucket-size", OPT_STR, &sc.first},
    {"measure-batch", OPT_INT, &sc.measure_batch},
    {"steps", OPT_INT, &sc.steps},
    {"threads", OPT_INT, &sc.threads},
    {"json", OPT_FLAG, &sc.json},
    {NULL, 0, NULL},
};

static void scale_usage(FILE *f) {
    fprintf(f,
            "usage: %s scale [--net alexnet|cifar] [options]\n\n"
            "Predicts the step time and the efficiency of data-parallel training on many GPUs\n"
            "from what can be measured on this machine. It runs training steps of the net here\n"
            "with the gradient hook dstrain train uses and records when backward finishes each\n"
            "bucket of the gradient (a small first bucket, then --bucket-size: the buckets\n"
            "that are summed while backward goes on). That timeline is scaled to the compute\n"
            "time of one GPU (the net's arithmetic at --tflops), and each bucket's all-reduce\n"
            "is costed by an alpha-beta model of a hierarchical ring: within a node of 8 GPUs\n"
            "over NVLink, then across nodes over InfiniBand, one link a GPU:\n\n"
            "  t(n, p) = 2(g-1) a_nv + 2(g-1)/g n/B_nv + 2(N-1) a_ib + 2(N-1)/N (n/g)/B_ib\n\n"
            "for n bytes on p GPUs in N nodes of g. Buckets are reduced in order, each from\n"
            "when it is ready and the one before is done; what is left after backward ends is\n"
            "exposed. Efficiency = compute / (compute + exposed communication), the batch a\n"
            "GPU fixed (weak scaling). Gradients are float32; the optimizer step and the\n"
            "input pipeline are left out.\n\n"
            "options:\n",
            prog);
    print_options(f, "scale", SCALE_OPTIONS);
}

/* What the gradient hook records of a step. */
typedef struct {
    double bwd_start, bwd_end;
    double *ready; /* (n) when bucket k was final */
    int n;
} scale_timeline;

static void scale_ready(void *ctx, int bucket, dsrt_range range) {
    scale_timeline *t = ctx;
    (void)range;
    if (bucket >= 0 && bucket < t->n) t->ready[bucket] = now();
}

static void scale_backward(void *ctx, int end) {
    scale_timeline *t = ctx;
    if (end)
        t->bwd_end = now();
    else
        t->bwd_start = now();
}

/* Seconds to all-reduce n bytes over p GPUs (8 a node), as above. */
static double allreduce_s(double n, int p, double bw_nv, double bw_ib, double a_nv, double a_ib) {
    int g = p < 8 ? p : 8, nodes = (p + 7) / 8;
    double t = 0;
    if (g > 1) t += 2.0 * (g - 1) * a_nv + 2.0 * (g - 1) / g * n / bw_nv;
    if (nodes > 1) t += 2.0 * (nodes - 1) * a_ib + 2.0 * (nodes - 1) / nodes * (n / g) / bw_ib;
    return t;
}

/* What cmd_scale measured and predicts. */
typedef struct {
    int nb, mb, threads, ngpus;
    size_t grad_bytes;
    double meas_f, meas_b, compute, f, b_end;
    double tflops, nv, ib, a_nv, a_ib, bucket, first;
    int gpus[32];
    double step[32], eff[32], exposed[32], comm[32]; /* (ngpus) */
    const double *ready; /* (nb) the measured step's buckets, s into backward */
    const dsrt_net_info *info;
} scale_report;

static void scale_print_json(const scale_report *r) {
    char b[9][32];
    printf("{\"net\": ");
    tool_json_string(stdout, sc.net);
    printf(", \"batch_per_gpu\": %d, \"gradient_bytes\": %zu, \"buckets\": %d, "
           "\"measured_forward_s\": %s, \"measured_backward_s\": %s, "
           "\"measure_batch\": %d, \"gpu_compute_s\": %s, \"tflops\": %s, "
           "\"nvlink_gbs\": %s, \"ib_gbs\": %s, \"alpha_nvlink_us\": %s, \"alpha_ib_us\": %s, "
           "\"predictions\": [",
           sc.batch, r->grad_bytes, r->nb, tool_json_number(b[0], "%.6f", r->meas_f),
           tool_json_number(b[1], "%.6f", r->meas_b), r->mb,
           tool_json_number(b[2], "%.6f", r->compute), tool_json_number(b[3], "%g", r->tflops),
           tool_json_number(b[4], "%g", r->nv), tool_json_number(b[5], "%g", r->ib),
           tool_json_number(b[6], "%g", r->a_nv), tool_json_number(b[7], "%g", r->a_ib));
    for (int i = 0; i < r->ngpus; i++)
        printf("%s{\"gpus\": %d, \"step_s\": %s, \"allreduce_s\": %s, \"exposed_s\": %s, "
               "\"efficiency\": %s, \"images_per_s\": %s}",
               i ? ", " : "", r->gpus[i], tool_json_number(b[0], "%.6f", r->step[i]),
               tool_json_number(b[1], "%.6f", r->comm[i]),
               tool_json_number(b[2], "%.6f", r->exposed[i]),
               tool_json_number(b[3], "%.4f", r->eff[i]),
               tool_json_number(b[4], "%.0f", r->gpus[i] * sc.batch / r->step[i]));
    printf("]}\n");
}

static void scale_print_text(const scale_report *r) {
    printf("Scaling estimate for %s (%zu parameters, %.1f MB of float32 gradients in %d "
           "buckets: %g MiB first, then %g MiB)\n\n",
           sc.net, r->info->learnable, r->grad_bytes / 1e6, r->nb, r->first, r->bucket);
    printf("Measured here (%d images a step, %d threads, CPU): forward %.3f s, backward "
           "%.3f s; buckets ready at (share of backward):",
           r->mb, r->threads, r->meas_f, r->meas_b);
    for (int b = 0; b < r->nb; b++) printf(" %.2f", r->meas_b > 0 ? r->ready[b] / r->meas_b : 0);
    printf("\n");
    printf("Assumed: one GPU computes %d images a step at %g TFLOP/s sustained on %.2f GFLOP "
           "an image: %.1f ms a step, backward from %.1f ms to %.1f ms; nodes of 8 GPUs, "
           "NVLink %g GB/s (%g us a step), InfiniBand %g GB/s a GPU (%g us a step); "
           "buckets reduced one after another; optimizer and input left out.\n\n",
           sc.batch, r->tflops, r->info->train_flops / 1e9, r->compute * 1e3, r->f * 1e3,
           r->b_end * 1e3, r->nv, r->a_nv, r->ib, r->a_ib);
    printf("  GPUs   step (ms)   all-reduce (ms)   exposed (ms)   efficiency   images/s\n");
    for (int i = 0; i < r->ngpus; i++)
        printf("  %4d   %9.2f   %15.2f   %12.2f   %9.1f%%   %8.0f\n", r->gpus[i], r->step[i] * 1e3,
               r->comm[i] * 1e3, r->exposed[i] * 1e3, 100 * r->eff[i],
               r->gpus[i] * sc.batch / r->step[i]);
    printf("\nFor comparison: Horovod reported about 90%% scaling efficiency on 512 GPUs "
           "(Inception V3, ResNet-101); TensorFlow's AlexNet scaled 75%% on 8 P100s.\n");
}

/* The --gpus list (at most 32 counts) into gpus; -1 when malformed. */
static int scale_gpus(const char *list, int *gpus) {
    int n = 0;
    for (const char *p = list; *p && n < 32;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 20 || (*end && *end != ',')) {
            fprintf(stderr, "%s scale: --gpus: '%s': expected counts like 8,64,512\n", prog, list);
            return -1;
        }
        gpus[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

/* Runs a step to warm up, then sc.steps timed ones, keeping each step's
 * forward and backward seconds and when its buckets were ready (keep, nb a
 * step). Returns the step with the median backward, or -1 on a failure. */
static int scale_measure(dsrt_net *net, const float *x, const int32_t *y, int mb,
                         scale_timeline *tl, double *keep, double *fwd, double *bwd) {
    int nb = tl->n;
    for (int k = -1; k < sc.steps; k++) {
        double t0 = now();
        int frc = dsrt_net_forward_backward(net, x, y, mb, NULL, NULL);
        if (frc != 0 && frc != DSRT_ENAN) { /* random data may overflow: the timing holds */
            fprintf(stderr, "%s scale: %s\n", prog, dsrt_last_error());
            return -1;
        }
        if (k < 0) continue;
        fwd[k] = tl->bwd_start - t0;
        bwd[k] = tl->bwd_end - tl->bwd_start;
        for (int b = 0; b < nb; b++) keep[(size_t)k * nb + b] = tl->ready[b] - tl->bwd_start;
    }
    int med = 0;
    for (int k = 0; k < sc.steps; k++) {
        int below = 0;
        for (int j = 0; j < sc.steps; j++) below += bwd[j] < bwd[k];
        if (below == sc.steps / 2) med = k;
    }
    return med;
}

/* The prediction for each GPU count of r, from the measured step (forward
 * meas_f, backward meas_b seconds) scaled to one GPU: the net's arithmetic
 * at r->tflops. */
static void scale_predict(scale_report *r, const dsrt_range *ranges, double meas_f, double meas_b) {
    int nb = r->nb;
    r->meas_f = meas_f;
    r->meas_b = meas_b;
    r->compute = r->info->train_flops * sc.batch / (r->tflops * 1e12);
    double scale = r->compute / (meas_f + meas_b);
    r->f = meas_f * scale;
    r->b_end = r->f + meas_b * scale;
    double bw_nv = r->nv * 1e9, bw_ib = r->ib * 1e9;
    r->grad_bytes = 0;
    for (int b = 0; b < nb; b++) r->grad_bytes += ranges[b].count * sizeof(float);
    for (int i = 0; i < r->ngpus; i++) {
        double done = 0, total = 0;
        for (int b = 0; b < nb; b++) {
            double ready = r->f + r->ready[b] * scale;
            double t = allreduce_s((double)ranges[b].count * sizeof(float), r->gpus[i], bw_nv,
                                   bw_ib, r->a_nv * 1e-6, r->a_ib * 1e-6);
            done = (done > ready ? done : ready) + t;
            total += t;
        }
        r->exposed[i] = done > r->b_end ? done - r->b_end : 0;
        r->comm[i] = total;
        r->step[i] = r->compute + r->exposed[i];
        r->eff[i] = r->compute / r->step[i];
    }
}

static int cmd_scale(int argc, char **argv) {
    memset(&sc, 0, sizeof sc);
    sc.net = "alexnet";
    sc.batch = 128;
    sc.steps = 2;
    int rc = parse_options("scale", argc, argv, SCALE_OPTIONS, scale_usage);
    if (rc) return rc > 0 ? 0 : 2;
    scale_report r = {
        .tflops = 40, .nv = 450, .ib = 50, .a_nv = 5, .a_ib = 10, .bucket = 25, .first = 1};
    if (parse_double("scale", "tflops", sc.tflops, 1e-3, 1e6, &r.tflops) ||
        parse_double("scale", "nvlink", sc.nvlink, 1e-3, 1e6, &r.nv) ||
        parse_double("scale", "ib", sc.ib, 1e-3, 1e6, &r.ib) ||
        parse_double("scale", "alpha-nvlink", sc.alpha_nvlink, 0, 1e6, &r.a_nv) ||
        parse_double("scale", "alpha-ib", sc.alpha_ib, 0, 1e6, &r.a_ib) ||
        parse_double("scale", "bucket-size", sc.bucket, 1.0 / 1024, 4096, &r.bucket) ||
        parse_double("scale", "first-bucket-size", sc.first, 1.0 / 1024, 4096, &r.first))
        return 2;
    if ((r.ngpus = scale_gpus(sc.gpus ? sc.gpus : "8,64,512", r.gpus)) < 0) return 2;
    int builtin = dsrt_net_builtin(sc.net, NULL) != NULL;
    int is_alexnet = !strcmp(sc.net, "alexnet");
    char *text = NULL;
    if (!builtin) {
        char why[256];
        if (!(text = read_net_text(sc.net, why, sizeof why))) {
            return net_unknown("scale", sc.net, why);
        }
    }
    int classes = sc.classes ? sc.classes : is_alexnet ? 1000 : 10;
    int mb = r.mb = sc.measure_batch ? sc.measure_batch : is_alexnet ? 8 : 64;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = sc.threads ? sc.threads : (int)(ncpu > 0 ? ncpu : 1);
    no.device = DSRT_DEVICE_CPU;
    dsrt_net *net = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    dsrt_range *ranges = NULL;
    scale_timeline tl = {0};
    double *fwd = NULL, *bwd = NULL;
    int status = 1;
    if (dsrt_net_create(&net, builtin ? sc.net : text, 0, 0, 0, classes, &no) != 0) {
        fprintf(stderr, "%s scale: %s\n", prog, dsrt_last_error());
        goto out;
    }
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    size_t first_b = (size_t)(r.first * (1 << 20)), min_b = (size_t)(r.bucket * (1 << 20));
    int nb = r.nb = dsrt_net_buckets_sized(net, first_b, min_b, NULL, 0);
    size_t per = (size_t)info.channels * info.height * info.width;
    ranges = calloc((size_t)nb + 1, sizeof *ranges);
    tl.ready = calloc((size_t)nb + 1, sizeof *tl.ready);
    fwd = calloc((size_t)sc.steps, sizeof *fwd);
    bwd = calloc((size_t)sc.steps, sizeof *bwd);
    x = malloc((size_t)mb * per * sizeof *x);
    y = malloc((size_t)mb * sizeof *y);
    if (!ranges || !tl.ready || !fwd || !bwd || !x || !y) {
        fprintf(stderr, "%s scale: out of memory\n", prog);
        goto out;
    }
    tl.n = nb;
    dsrt_net_buckets_sized(net, first_b, min_b, ranges, nb);
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < (size_t)mb * per; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)(s >> 40) * (1.0f / 16777216.0f);
    }
    for (int i = 0; i < mb; i++) y[i] = (int32_t)(i % classes);
    dsrt_grad_hook hook = {first_b, min_b, scale_ready, scale_backward, &tl};
    if (dsrt_net_set_grad_hook(net, &hook) != 0) {
        fprintf(stderr, "%s scale: %s\n", prog, dsrt_last_error());
        goto out;
    }
    /* The timeline of the step with the median backward. */
    double *keep = calloc((size_t)nb * (size_t)sc.steps + 1, sizeof *keep);
    if (!keep) goto out;
    int med = scale_measure(net, x, y, mb, &tl, keep, fwd, bwd);
    if (med < 0) {
        free(keep);
        goto out;
    }
    r.threads = no.threads;
    r.info = &info;
    r.ready = keep + (size_t)med * nb;
    scale_predict(&r, ranges, fwd[med], bwd[med]);
    if (sc.json)
        scale_print_json(&r);
    else
        scale_print_text(&r);
    free(keep);
    status = 0;
out:
    dsrt_net_destroy(net);
    free(text);
    free(x);
    free(y);
    free(ranges);
    free(tl.ready);
    free(fwd);
    free(bwd);
    return status;
}

// ----------------------------------------------------------------------------
// Subcommands

// ----------------------------------------------------------------------------
// analyze

static struct {
    const char *net;
    int classes, json;
    onnx_args onnx;
} analyze;

static const option ANALYZE_OPTIONS[] = {
    {"net", OPT_STR, &analyze.net},
    {"num-classes", OPT_INT, &analyze.classes},
    ONNX_OPTIONS(analyze.onnx),
    {"json", OPT_FLAG, &analyze.json},
    {NULL, 0, NULL},
};

static void analyze_usage(FILE *f) {
    fprintf(f,
            "usage: %s analyze --net NAME|FILE [--classes N] [--json]\n\n"
            "Builds the network (refusing a bad description with the messages train gives) and\n"
            "prints it layer by layer, as MATLAB's analyzeNetwork: name, type, the layers it\n"
            "takes, its output (height x width x channels) and learnables, then the totals.\n\n"
            "options:\n",
            prog);
    print_options(f, "analyze", ANALYZE_OPTIONS);
}

static int cmd_analyze(int argc, char **argv) {
    int rc = parse_options("analyze", argc, argv, ANALYZE_OPTIONS, analyze_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (!analyze.net) {
        fprintf(stderr, "%s analyze: --net is required (see %s analyze --help)\n", prog, prog);
        return 2;
    }
    const char *name = analyze.net;
    if ((rc = onnx_flags_alone("analyze", &analyze.onnx, name, NULL))) return rc;
    /* torchvision's nets count their learnables with ImageNet's 1000. */
    int imagenet = !strcmp(name, "resnet18") || !strcmp(name, "resnet50") ||
                   !strncmp(name, "mobilenet_", 10) || !strcmp(name, "efficientnet_b0");
    int classes = analyze.classes            ? analyze.classes
                  : imagenet                 ? 1000
                  : !strcmp(name, "alexnet") ? 55
                                             : 10;
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    char *text = NULL;
    if (is_model_file(name) || is_onnx_file(name)) {
        if ((rc = load_model("analyze", name, name, &analyze.onnx, &no, &net))) return rc;
    } else {
        if (!dsrt_net_builtin(name, NULL)) {
            char why[256];
            if (!(text = read_net_text(name, why, sizeof why))) {
                return net_unknown("analyze", name, why);
            }
        }
        if (dsrt_net_create(&net, text ? text : name, 0, 0, 0, classes, &no) != 0) {
            fprintf(stderr, "%s analyze: %s\n", prog, dsrt_last_error());
            free(text);
            return 2;
        }
    }
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    if (analyze.json) {
        printf("{\"net\": ");
        tool_json_string(stdout, name);
        printf(", \"layers\": [");
    } else
        printf("%s: %d layers, %d classes, input %dx%dx%d\n\n  %-4s %-20s %-11s %-30s %-14s %s\n",
               name, info.layers, info.classes, info.height, info.width, info.channels, "#",
               "layer", "type", "inputs", "output", "learnables");
    for (int i = 0; i < info.layers; i++) {
        dsrt_layer_info l;
        dsrt_net_layer(net, i, &l);
        char inputs[512] = "", out[48];
        size_t at = 0;
        for (int k = 0; k < l.n_inputs && at < sizeof inputs; k++) {
            dsrt_layer_info in;
            dsrt_net_layer(net, l.inputs[k], &in);
            at += (size_t)snprintf(inputs + at, sizeof inputs - at, "%s%s", k ? "," : "", in.name);
        }
        snprintf(out, sizeof out, "%dx%dx%d", l.out_height, l.out_width, l.out_channels);
        size_t learn = l.weights_count + l.bias_count;
        int fused_away = 0;
        if (i > 0 && (!strcmp(l.type, "relu") || !strcmp(l.type, "leakyrelu"))) {
            dsrt_layer_info p;
            dsrt_net_layer(net, l.inputs[0], &p);
            /* The layer it takes computes it (its only taker). */
            fused_away = p.fused && strcmp(p.type, "add") != 0;
        }
        if (analyze.json) {
            printf("%s{\"name\": ", i ? ", " : "");
            tool_json_string(stdout, l.name);
            printf(", \"type\": ");
            tool_json_string(stdout, l.type);
            printf(", \"inputs\": ");
            tool_json_string(stdout, inputs);
            printf(", \"output\": [%d, %d, %d], \"learnables\": %zu}", l.out_height, l.out_width,
                   l.out_channels, learn);
        } else
            printf("  %-4d %-20s %-11s %-30s %-14s %zu%s\n", i, l.name, l.type,
                   l.n_inputs ? inputs : "-", out, learn,
                   fused_away ? "   (computed by the layer it takes)" : "");
    }
    char gf[32];
    if (analyze.json)
        printf("], \"learnables\": %zu, \"state\": %zu, \"forward_gflop\": %s}\n", info.learnable,
               info.state, tool_json_number(gf, "%.4f", info.forward_flops * 1e-9));
    else
        printf("\n  total: %zu learnables, %zu state values (running and input statistics), %.3f "
               "GFLOP "
               "forward an image\n",
               info.learnable, info.state, info.forward_flops * 1e-9);
    dsrt_net_destroy(net);
    free(text);
    return 0;
}

// ----------------------------------------------------------------------------
// import and export: ONNX models in and out

static struct {
    const char *output;
    int json;
    onnx_args onnx;
} im;

static const option IMPORT_OPTIONS[] = {
    {"output", OPT_STR, &im.output}, ONNX_OPTIONS(im.onnx), ONNX_CLASSES_OPTION(im.onnx),
    {"json", OPT_FLAG, &im.json},    {NULL, 0, NULL},
};

static void import_usage(FILE *f) {
    fprintf(f,
            "usage: %s import MODEL.onnx --output MODEL.dsrt [options]\n\n"
            "Imports an ONNX model (opsets 7 to 21: Conv, Gemm, MatMul with its bias Add, Relu,\n"
            "LeakyRelu, MaxPool, AveragePool, GlobalAveragePool, BatchNormalization, LRN,\n"
            "Dropout, Flatten, Reshape to 2-D, Softmax, Add, Concat, Identity, Constant) as a\n"
            "dsrt model file, which train, eval and classify take like any other. Anything\n"
            "else is refused, naming the node, its operator and the opset. The model's\n"
            "preprocessing goes into the input layer, so that the model gets raw images as\n"
            "it expects them: --preprocess torchvision for torchvision's models, or\n"
            "--input-scale, --mean and --std. A model that ends in logits gets dsrt's\n"
            "softmax. The --net, --model and --transfer options of the other commands take\n"
            "an ONNX model directly too, with the same options.\n\n"
            "options:\n",
            prog);
    print_options(f, "import", IMPORT_OPTIONS);
}

/* The one argument that is not an option (the model), taken out of argv. */
static const char *take_positional(int *argc, char **argv, const option *opts) {
    const char *found = NULL;
    int k = 0;
    for (int i = 0; i < *argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0 && strcmp(argv[i], "-h") != 0 && !found) {
            found = argv[i];
            continue;
        }
        argv[k++] = argv[i];
        const option *o = opts;
        while (o->name && strcmp(argv[i] + 2, o->name) != 0) o++;
        if (o->name && o->type != OPT_FLAG && !strchr(argv[i], '=') && i + 1 < *argc)
            argv[k++] = argv[++i];
    }
    *argc = k;
    return found;
}

static int cmd_import(int argc, char **argv) {
    const char *model = take_positional(&argc, argv, IMPORT_OPTIONS);
    int rc = parse_options("import", argc, argv, IMPORT_OPTIONS, import_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (!model || !im.output) {
        fprintf(stderr,
                "%s import: MODEL.onnx and --output FILE are required (see %s import "
                "--help)\n",
                prog, prog);
        return 2;
    }
    char why[512];
    if (tool_check_output(im.output, 1, why, sizeof why)) {
        fprintf(stderr, "%s import: --output %s: %s\n", prog, im.output, why);
        return 2;
    }
    if (tool_same_file(im.output, model)) {
        fprintf(stderr, "%s import: --output %s: is the model read (%s): give another name\n", prog,
                im.output, model);
        return 2;
    }
    dsrt_onnx_import_options o;
    char **names;
    if ((rc = onnx_resolve("import", &im.onnx, &o, &names))) return rc;
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    rc = dsrt_onnx_import(&net, model, &o, &no);
    free_names(names);
    if (rc) {
        fprintf(stderr, "%s import: %s\n", prog, dsrt_last_error());
        return 1;
    }
    if (dsrt_model_save(im.output, net) != 0) {
        fprintf(stderr, "%s import: %s\n", prog, dsrt_last_error());
        dsrt_net_destroy(net);
        return 1;
    }
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    if (im.json) {
        printf("{\"model\": ");
        tool_json_string(stdout, model);
        printf(", \"output\": ");
        tool_json_string(stdout, im.output);
        printf(", \"layers\": %d, \"input\": [%d, %d, %d], \"classes\": %d, \"learnables\": "
               "%zu}\n",
               info.layers, info.height, info.width, info.channels, info.classes, info.learnable);
    } else {
        printf("%s -> %s: %d layers, input %dx%dx%d, %d classes, %zu learnables\n", model,
               im.output, info.layers, info.height, info.width, info.channels, info.classes,
               info.learnable);
    }
    dsrt_net_destroy(net);
    return 0;
}

static struct {
    const char *output;
    int opset;
} ex;

static const option EXPORT_OPTIONS[] = {
    {"output", OPT_STR, &ex.output},
    {"opset", OPT_INT, &ex.opset},
    {NULL, 0, NULL},
};

static void export_usage(FILE *f) {
    fprintf(f,
            "usage: %s export MODEL --output MODEL.onnx [--opset N]\n\n"
            "Writes a dsrt model or checkpoint as an ONNX model: its inference graph (batch\n"
            "normalisation with the running statistics, dropout removed, the softmax output\n"
            "\"probabilities\"), taking \"pixels\", float32 NCHW images of the model's size\n"
            "and channels with values 0 to 255 as files hold them (the input normalisation\n"
            "is the model's first nodes), any batch size; the class names are in its\n"
            "metadata_props (\"classes\", one a line).\n\n"
            "options:\n",
            prog);
    print_options(f, "export", EXPORT_OPTIONS);
}

static int cmd_export(int argc, char **argv) {
    const char *model = take_positional(&argc, argv, EXPORT_OPTIONS);
    int rc = parse_options("export", argc, argv, EXPORT_OPTIONS, export_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (!model || !ex.output) {
        fprintf(stderr,
                "%s export: MODEL and --output FILE are required (see %s export "
                "--help)\n",
                prog, prog);
        return 2;
    }
    char why[512];
    if (tool_check_output(ex.output, 1, why, sizeof why)) {
        fprintf(stderr, "%s export: --output %s: %s\n", prog, ex.output, why);
        return 2;
    }
    if (tool_same_file(ex.output, model)) {
        fprintf(stderr, "%s export: --output %s: is the model read (%s): give another name\n", prog,
                ex.output, model);
        return 2;
    }
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    if (dsrt_model_load(&net, model, &no) != 0) {
        fprintf(stderr, "%s export: %s\n", prog, dsrt_last_error());
        return 1;
    }
    dsrt_onnx_export_options o = dsrt_onnx_export_defaults();
    if (ex.opset) o.opset = ex.opset;
    rc = dsrt_onnx_export(net, ex.output, &o);
    if (rc)
        fprintf(stderr, "%s export: %s\n", prog, dsrt_last_error());
    else
        printf("%s -> %s (opset %d)\n", model, ex.output, o.opset);
    dsrt_net_destroy(net);
    return rc ? 1 : 0;
}

static const command COMMANDS[] = {
    {"train", "train a network on an image folder, loading in the background", cmd_train},
    {"eval", "accuracy, per-class accuracy and confusion matrix of a model", cmd_eval},
    {"classify", "label and scores of image files or a folder", cmd_classify},
    {"bench", "time training steps on random data (no loader)", cmd_bench},
    {"scale", "predict data-parallel step time and efficiency on 8 to 512 GPUs", cmd_scale},
    {"analyze", "a network layer by layer: inputs, output shapes, learnables", cmd_analyze},
    {"import", "an ONNX model as a dsrt model file", cmd_import},
    {"export", "a dsrt model as an ONNX model", cmd_export},
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
    tool_set_name(prog);
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

/*
 * dstrain's option glue: each subcommand binds the rows of the library's
 * option tables (dsrt/options.h) to where their values go, and the options
 * that several subcommands share are read here once: where a net computes
 * (--execution-environment, --gpu, --precision), requests to an object
 * store, an ONNX model's input normalisation and class names, the data a
 * command opens. Messages name the subcommand and the option.
 */
#include "dstrain.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const prog = "dstrain";

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
void print_options(FILE *f, const char *cmd, const option *opts) {
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
int parse_options(const char *cmd, int argc, char **argv, const option *opts,
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
int parse_choice(const char *cmd, const char *name, const char *v) {
    char spelled[64];
    double index;
    snprintf(spelled, sizeof spelled, "--%s", name);
    if (dsrt_option_value(row_of(cmd, name), spelled, v, &index, NULL) == 0) return (int)index;
    fprintf(stderr, "%s %s: %s\n", prog, cmd, dsrt_last_error());
    return -1;
}

void remote_set(dsrt_remote_options *o, const remote_opts *r) {
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

/*
 * Resolves them into the net options and the execution environment, before
 * any work: a GPU that is not there, or bf16 on the CPU, is refused with a
 * message. Returns 0, or 2 after the message.
 */
int resolve_device_args(const char *cmd, const device_args *d, dsrt_net_options *no,
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

/* 1 when path names an ONNX model (by its extension: the format has no
 * magic number). */
int is_onnx_file(const char *path) {
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
int onnx_resolve(const char *cmd, const onnx_args *a, dsrt_onnx_import_options *o, char ***names) {
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

void free_names(char **names) {
    dsrt_class_names_free(names);
}

/* Whether any of a's flags is given (they go with an ONNX model). */
static int onnx_given(const onnx_args *a) {
    return a->preprocess || a->input_scale || a->mean || a->std || a->classes || a->size;
}

/* Refuses a's flags when no ONNX model is named (path, path2 may be NULL):
 * 0, or 2 after a message. */
int onnx_flags_alone(const char *cmd, const onnx_args *a, const char *path, const char *path2) {
    if (!onnx_given(a) || (path && is_onnx_file(path)) || (path2 && is_onnx_file(path2))) return 0;
    fprintf(stderr,
            "%s %s: --preprocess, --input-scale, --mean, --std, --classes and --input-size go "
            "with an ONNX model (a .onnx file)\n",
            prog, cmd);
    return 2;
}

/* 1 when path is a regular file that starts as a dsrt model does. */
int is_model_file(const char *path) {
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
int load_model(const char *cmd, const char *what, const char *path, const onnx_args *a,
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
    /* Said before any work: a model fed other numbers than it was trained
     * on answers wrongly without an error. */
    dsrt_net_info ni;
    dsrt_net_get_info(*net, &ni);
    if (ni.input_assumed)
        fprintf(stderr,
                "%s %s: note: %s%s%s says nothing of how its input is normalised (no "
                "--preprocess, --input-scale, --mean or --std, no dsrt metadata, no normalisation "
                "in its graph): it is given pixels scaled to [0, 1]; for torchvision's models "
                "give --preprocess torchvision\n",
                prog, cmd, strcmp(what, path) ? what : "", strcmp(what, path) ? " " : "", path);
    return 0;
}

/* Largest network description file read. */
#define NET_TEXT_MAX ((size_t)1 << 20)

/* A network description file: NULL with the reason in why when it is not a
 * regular file, too large, empty or not text. */
char *read_net_text(const char *path, char *why, size_t why_cap) {
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

/* --net NAME that is neither a built-in net nor a readable file: the
 * message lists the built-in nets, and the nearest when one is a slip away.
 * Returns 2. */
int net_unknown(const char *cmd, const char *name, const char *why) {
    const char *const *names;
    dsrt_net_builtin(NULL, &names);
    fprintf(stderr, "%s %s: --net: '%s' is neither a built-in network (", prog, cmd, name);
    for (int i = 0; names[i]; i++) fprintf(stderr, "%s%s", i ? ", " : "", names[i]);
    const char *near = dsrt_nearest_name(name, names);
    fprintf(stderr, ")%s%s%s nor a network description file: %s\n", near ? " (did you mean " : "",
            near ? near : "", near ? "?)" : "", why);
    return 2;
}

// ----------------------------------------------------------------------------
// Shared by train, eval and classify

/* A floating-point option given as text: dies (returns -1 after a message)
 * when it is not a number in [min, max]. */
int parse_double(const char *cmd, const char *name, const char *v, double min, double max,
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
int parse_range(const char *cmd, const char *name, const char *v, int symmetric, double out[2]) {
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

/* paths[0, n) as messages show them: "A + B", or "mix FILE" for a mix file
 * alone; credentials masked. Returns buf. */
const char *data_shown(const char *const *paths, size_t n, const char *mix, char *buf, size_t cap) {
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
int open_data(const char *cmd, const char *what, const char *const *paths, size_t npaths,
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

/* The one argument that is not an option (the model), taken out of argv. */
const char *take_positional(int *argc, char **argv, const option *opts) {
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

int model_and_output(const char *cmd, const char *what, const char *model, const char *output) {
    if (!model || !output) {
        fprintf(stderr, "%s %s: %s and --output FILE are required (see %s %s --help)\n", prog, cmd,
                what, prog, cmd);
        return 2;
    }
    char why[512];
    if (tool_check_output(output, 1, why, sizeof why)) {
        fprintf(stderr, "%s %s: --output %s: %s\n", prog, cmd, output, why);
        return 2;
    }
    if (tool_same_file(output, model)) {
        fprintf(stderr, "%s %s: --output %s: is the model read (%s): give another name\n", prog,
                cmd, output, model);
        return 2;
    }
    return 0;
}

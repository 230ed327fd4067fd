/*
 * What dstrain's subcommands share: the option bindings (a row of the
 * library's option tables and where its value goes), the options several
 * subcommands take (where a net computes, object-store requests, an ONNX
 * model's input, the data opened), and the terminal's helpers. One file a
 * subcommand; main.c holds the table of them.
 */
#ifndef DSTRAIN_H
#define DSTRAIN_H

#include <dsrt.h>

#include <stdint.h>
#include <stdio.h>

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

/* The program's name in messages. */
extern const char *const prog;

/* The subcommands (one file each). */
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_classify(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_scale(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_export(int argc, char **argv);

/* Parses argv (after the subcommand) against the rows of cmd's options and
 * their bindings opts. Returns 0, or 1 for --help (printed); exits with
 * status 2 after a message on a bad option or value. */
int parse_options(const char *cmd, int argc, char **argv, const option *opts,
                  void (*usage)(FILE *));

/* The options of cmd in the order of its bindings, from their rows. */
void print_options(FILE *f, const char *cmd, const option *opts);

/* Index of v among the names of cmd's option name (its row's choices, in
 * the order of the enum they stand for), or -1 after a message. */
int parse_choice(const char *cmd, const char *name, const char *v);

/* The one argument that is not an option (the model), taken out of argv. */
const char *take_positional(int *argc, char **argv, const option *opts);

/* import and export: the model (what: "MODEL.onnx") and --output are
 * given, and the output can be written and is not the model. 0, or 2 after
 * a message. */
int model_and_output(const char *cmd, const char *what, const char *model, const char *output);

/* A floating-point option given as text (v may be NULL: nothing to do):
 * -1 after a message when it is not a number in [min, max]. */
int parse_double(const char *cmd, const char *name, const char *v, double min, double max,
                 double *out);

/* "LO,HI", or V: [V, V], or [-V, V] when symmetric; -1 after a message. */
int parse_range(const char *cmd, const char *name, const char *v, int symmetric, double out[2]);

// ----------------------------------------------------------------------------
// Where nets compute, and requests to an object store

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

void remote_set(dsrt_remote_options *o, const remote_opts *r);

typedef struct {
    const char *where, *precision;
    int gpu, deterministic;
} device_args;

#define DEVICE_OPTIONS(d)                                                                          \
    {"execution-environment", OPT_STR, &(d).where}, {"gpu", OPT_INT, &(d).gpu},                    \
        {"precision", OPT_STR, &(d).precision}, {                                                  \
        "deterministic", OPT_FLAG, &(d).deterministic                                              \
    }

/* Resolves d into the net options and the execution environment (exec may
 * be NULL: data-parallel training refused), before any work. Returns 0, or
 * 2 after a message. */
int resolve_device_args(const char *cmd, const device_args *d, dsrt_net_options *no,
                        dsrt_execution *exec);

// ----------------------------------------------------------------------------
// ONNX models and nets where a model or net is named

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

/* 1 when path names an ONNX model (by its extension). */
int is_onnx_file(const char *path);

/* The import options that a's flags say; 0, or 2 after a message. *names
 * (free_names) holds the --classes file's. */
int onnx_resolve(const char *cmd, const onnx_args *a, dsrt_onnx_import_options *o, char ***names);
void free_names(char **names);

/* Refuses a's flags when no ONNX model is named (path, path2 may be NULL):
 * 0, or 2 after a message. */
int onnx_flags_alone(const char *cmd, const onnx_args *a, const char *path, const char *path2);

/* 1 when path is a regular file that starts as a dsrt model does. */
int is_model_file(const char *path);

/* The net of a model file: a dsrt model or checkpoint, or an ONNX model
 * (imported with a's options). what names the option in messages. Returns
 * 0, or 1 or 2 after a message. */
int load_model(const char *cmd, const char *what, const char *path, const onnx_args *a,
               const dsrt_net_options *no, dsrt_net **net);

/* A network description file: NULL with the reason in why when it is not a
 * regular file, too large, empty or not text. */
char *read_net_text(const char *path, char *why, size_t why_cap);

/* --net NAME that is neither a built-in net nor a readable file: the
 * message lists the built-in nets, and the nearest when one is a slip away.
 * Returns 2. */
int net_unknown(const char *cmd, const char *name, const char *why);

// ----------------------------------------------------------------------------
// Data

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
const char *data_shown(const char *const *paths, size_t n, const char *mix, char *buf, size_t cap);

/* Opens labelled data: prints the scan's warnings and refuses classes
 * without images unless drop_empty leaves them out. 0, or -1 after a
 * message. */
int open_data(const char *cmd, const char *what, const char *const *paths, size_t npaths,
              const data_args *a, dsrt_datastore **ds);

// ----------------------------------------------------------------------------
// The terminal (ui.c)

/* Seconds on the monotonic clock. */
double now(void);

/* s seconds as hh:mm:ss. */
void print_hms(FILE *f, double s);

/* A name in a text column: escaped (tool_text_field), padded to width. */
void print_padded(const char *s, int width);

/* A number for JSON: null when it is not finite. buf holds 32 bytes. */
const char *jnum(char *buf, double v);

#endif

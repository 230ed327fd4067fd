/*
 * dsrt's options as data: every option of dstrain, dsbench and the Python
 * module is one row of a table here, with its name, type, range, default,
 * valid names (taken from the library's own name tables: sources, shard
 * orders, presets, built-in nets), help line and the places it applies. The
 * tools parse, check and explain their options from these rows, Python
 * checks its keywords against them (the same names with '-' as '_'), and the
 * tests hold the README to them, so that an option has one name, one
 * meaning and one default everywhere (git's parse-options OPT_* arrays are
 * the model).
 *
 * The data side's groups (datastore, pipeline and augmentation) are in
 * libdsrt (dsrt_option_groups); training's and inference's in libdsrt_train
 * (dsrt_train_option_groups). The tables are static and read-only; every
 * call here is thread-safe.
 */
#ifndef DSRT_OPTIONS_H
#define DSRT_OPTIONS_H

#include <dsrt/core.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DSRT_OPTION_FLAG = 0, /* no value: given or not */
    DSRT_OPTION_INT,      /* an integer in [min, max] */
    DSRT_OPTION_NUMBER,   /* a real number in [min, max] */
    DSRT_OPTION_SIZE,     /* bytes: digits with K, M, G or T, in [min, max] */
    DSRT_OPTION_CHOICE,   /* one of the names choice() gives */
    DSRT_OPTION_TEXT,     /* a path, a list or a spec the user of the value parses */
} dsrt_option_type;

/* Where an option applies: one bit a command of a tool or a Python type. */
enum {
    DSRT_IN_TRAIN = 1u << 0, /* dstrain train */
    DSRT_IN_EVAL = 1u << 1,  /* dstrain eval */
    DSRT_IN_CLASSIFY = 1u << 2,
    DSRT_IN_BENCH = 1u << 3, /* dstrain bench */
    DSRT_IN_SCALE = 1u << 4,
    DSRT_IN_ANALYZE = 1u << 5,
    DSRT_IN_IMPORT = 1u << 6,
    DSRT_IN_EXPORT = 1u << 7,
    DSRT_IN_DSBENCH = 1u << 8,          /* dsbench DATA (the pipeline) */
    DSRT_IN_DSBENCH_INDEX = 1u << 9,    /* dsbench DATA --index */
    DSRT_IN_DSBENCH_CONVERT = 1u << 10, /* dsbench convert */
    DSRT_IN_PY_DATASTORE = 1u << 11,    /* dsrt.Datastore(...) */
    DSRT_IN_PY_PIPELINE = 1u << 12,     /* dsrt.Pipeline(...) */
    DSRT_IN_PY_NET = 1u << 13,          /* dsrt.Net.load(...), dsrt.onnx_import(...) */
};

typedef struct {
    const char *name; /* "shuffle-buffer"; Python writes shuffle_buffer */
    dsrt_option_type type;
    const char *arg; /* the value's name in help ("N"), NULL for a flag */
    double min, max; /* INT, NUMBER and SIZE */
    const char *def; /* the default as a user writes it ("4", "every-epoch"),
                      * or a phrase in brackets ("(the net's)"), or NULL */
    /* CHOICE: the i-th valid name (from 0), NULL past the last. */
    const char *(*choice)(int i);
    const char *help; /* one sentence, without the default */
    unsigned where;   /* DSRT_IN_* bits */
    /* An older spelling still accepted ("threads" for dsbench's workers),
     * with a note on stderr, where users have scripts; else NULL. Its
     * value may be an older value name too, see old_values. */
    const char *old;
    unsigned old_where; /* where the older spelling is still accepted */
    /* Older value names still accepted: pairs "old=new" separated by
     * commas ("epoch=every-epoch"), or NULL. */
    const char *old_values;
    /* Python's keyword where it is not the name with '-' as '_': the C
     * API's field, a positive keyword for a tool's negating flag
     * ("include_subfolders" for "no-subfolders", True by default); else
     * NULL. */
    const char *py;
} dsrt_option;

typedef struct {
    const char *name;  /* "datastore", "pipeline", "training", "inference" */
    const char *title; /* "Datastore options" */
    const dsrt_option *options;
    size_t count;
} dsrt_option_group;

/* The data side's groups (datastore, pipeline and augmentation): *groups
 * receives the static array; returns its length. */
DSRT_API size_t dsrt_option_groups(const dsrt_option_group **groups);

/* Training's and inference's groups (dstrain's commands), in libdsrt_train:
 * *groups receives the static array; returns its length. */
DSRT_API size_t dsrt_train_option_groups(const dsrt_option_group **groups);

/*
 * The row named name (with '-' or '_' between words, with or without a
 * leading "--") among the groups that applies where (some DSRT_IN_* bit),
 * or NULL. With old != NULL, *old is set when name was an older spelling.
 */
DSRT_API const dsrt_option *dsrt_option_find(const dsrt_option_group *groups, size_t n,
                                             const char *name, unsigned where, int *old);

/*
 * The row's name nearest to name among those that apply where, when one is
 * a slip away ("epoch" for "epochs", "suffle" for "shuffle"); else NULL.
 */
DSRT_API const char *dsrt_option_nearest(const dsrt_option_group *groups, size_t n,
                                         const char *name, unsigned where);

/*
 * Checks value against the row: an integer or number within its range, a
 * size in bytes, or one of its names (an older value name is taken and
 * *renamed set to the new one; NULL otherwise). *number receives the value
 * of INT, NUMBER and SIZE, the index of a CHOICE. Returns 0, or
 * DSRT_EOPTION with a message that starts with spelled (the option as the
 * user wrote it: "--batch" or "batch") and, for a name, lists the valid
 * ones and the nearest ("did you mean every-epoch?").
 */
DSRT_API int dsrt_option_value(const dsrt_option *o, const char *spelled, const char *value,
                               double *number, const char **renamed);

/* The type's name for messages and docs: "flag", "integer", "number",
 * "size", "choice", "text". */
DSRT_API const char *dsrt_option_type_name(dsrt_option_type t);

/* The nearest of the NULL-terminated names to name, when one is a slip
 * away; else NULL. For "did you mean" in messages. */
DSRT_API const char *dsrt_nearest_name(const char *name, const char *const *names);

#ifdef __cplusplus
}
#endif

#endif

/*
 * What dsbench's files share: its options as parsed, and each mode's entry.
 */
#ifndef DSBENCH_H
#define DSBENCH_H

#include <dsrt.h>

#include <stdint.h>

#include "tool_common.h"
#include "tool_options.h"

#define DSRT_MIN_SIZE(a, b) ((a) < (b) ? (a) : (b))

/* --preset, in the order of its names in the option table. */
typedef enum { PIPE_NONE = 0, PIPE_227, PIPE_32, PIPE_IMAGENET, PIPE_IMAGENET_VAL } pipe_kind;

#define MAX_DATA 64

typedef struct {
    const char *data;
    char shown[4096]; /* data as messages show it (credentials masked) */
    /* Several DATA and --mix: a mix (dsrt_datastore_open_mix). */
    const char *paths[MAX_DATA];
    size_t npaths;
    const char *mix;
    dsrt_mix_options mo;
    int index, json;
    /* pipeline mode */
    pipe_kind kind;
    int nhwc;         /* --layout nhwc / --dtype uint8: uint8 NHWC samples */
    int layout_given; /* -1 nchw/float32 asked, 1 nhwc/uint8 asked, 0 neither */
    int channels;     /* --channels: 1 or 3 */
    int no_decode_dc; /* --no-decode-dc */
    dsrt_pipeline_options po;
    int batch_given, sweep, cold, checksum;
    int cold_method; /* COLD_AUTO, COLD_DROP_CACHES, COLD_FADVISE */
    int limit;       /* --limit */
    size_t limit_images;
    unsigned limit_passes;
    const char *threads_list;
    const char *bad_list; /* --bad-list FILE */
    FILE *bad_out;
    unsigned epochs;
    int pipeline_given; /* some pipeline option was given */
    dsrt_datastore_options ds;
    /* convert */
    const char *out;
    int split_both;
    const char *class_names;
    uint64_t shard_bytes, shard_samples; /* --shards, --shard-samples */
} options;

enum { COLD_AUTO = 0, COLD_DROP_CACHES, COLD_FADVISE };

/* Seconds on the monotonic clock, and CPU seconds of the whole process. */
double now_s(void);
double cpu_s(void);

/* The i-th name of the dsbench option's choices ("cold-method", 1:
 * "drop-caches"), and the --preset's name. */
const char *choice_name(const char *option, int i);
const char *preset_name(const options *o);

/* The index's warnings on stderr; the datastore o names (0, or -1 after a
 * message). */
void print_warnings(const dsrt_datastore *ds);
int open_data(const options *o, dsrt_datastore **ds);

/* The layout the pipeline writes for o. */
dsrt_augment_layout layout_of(const options *o);

/* The modes: each returns the exit status. */
int run_index(const options *o);
int run_convert(options *o);
int run_pipeline(options *o);

#endif

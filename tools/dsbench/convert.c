/*
 * dsbench convert SRC OUT: writes an IDX or CIFAR source as an image
 * folder, or any source as tar shards.
 */
#include "dsbench.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// dsbench convert SRC OUT

/* Splits "a,b,c" into a NULL-terminated array (the string is modified). */
static const char **split_names(char *list, size_t *count) {
    size_t n = 1;
    for (char *p = list; *p; p++) n += *p == ',';
    const char **names = calloc(n + 1, sizeof *names);
    if (!names) tool_die("out of memory");
    size_t k = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) names[k++] = tok;
    *count = k;
    return names;
}

static int64_t convert_one(const options *o, dsrt_split split, const char *out) {
    dsrt_datastore_options dso = o->ds;
    dso.split = split;
    dsrt_datastore *ds;
    if (dsrt_datastore_open(&ds, o->data, &dso) != 0) tool_die("%s", dsrt_last_error());
    const char **names = NULL;
    char *copy = NULL;
    if (o->class_names) {
        size_t count;
        copy = strdup(o->class_names);
        if (!copy) tool_die("out of memory");
        names = split_names(copy, &count);
        if (count != dsrt_datastore_num_classes(ds))
            tool_die("--class-names: %zu names given, the data has %zu classes", count,
                     dsrt_datastore_num_classes(ds));
    }
    double t0 = now_s();
    int64_t n;
    if (o->shard_bytes) {
        dsrt_shard_write_options so = dsrt_shard_write_defaults();
        so.shard_bytes = o->shard_bytes;
        so.shard_samples = o->shard_samples;
        so.class_names = names;
        uint64_t samples;
        int64_t shards = dsrt_shards_write(ds, out, &so, &samples);
        if (shards < 0) tool_die("%s", dsrt_last_error());
        n = (int64_t)samples;
        fprintf(stderr,
                "dsbench: wrote %lld images in %zu classes to %s as %lld shard%s in %.1f s\n",
                (long long)n, dsrt_datastore_num_classes(ds), out, (long long)shards,
                shards == 1 ? "" : "s", now_s() - t0);
    } else {
        n = dsrt_datastore_export(ds, out, names);
        if (n < 0) tool_die("%s", dsrt_last_error());
        fprintf(stderr, "dsbench: wrote %lld images in %zu classes to %s in %.1f s\n", (long long)n,
                dsrt_datastore_num_classes(ds), out, now_s() - t0);
    }
    free(names);
    free(copy);
    dsrt_datastore_close(ds);
    return n;
}

/* The samples' layout the options ask for. */
dsrt_augment_layout layout_of(const options *o) {
    return o->nhwc ? DSRT_AUGMENT_U8_NHWC : DSRT_AUGMENT_F32_NCHW;
}

/* 1 when SRC is a source of pixels in memory (IDX or CIFAR files), whose
 * folders hold both splits. */
static int has_splits(const options *o) {
    dsrt_datastore *ds;
    if (dsrt_datastore_open(&ds, o->data, &o->ds) != 0) tool_die("%s", dsrt_last_error());
    int pixels = dsrt_datastore_path(ds, 0) == NULL;
    dsrt_datastore_close(ds);
    return pixels;
}

int run_convert(options *o) {
    /* A URL, a glob or a brace list is no local file; the data source says
     * what is wrong with it when it is opened. */
    struct stat st;
    int folder = 0;
    if (stat(o->data, &st) == 0)
        folder = S_ISDIR(st.st_mode);
    else if (!dsrt_path_is_url(o->data) && !strpbrk(o->data, "*?[{"))
        tool_die("convert: %s: %s", o->shown, strerror(errno));
    int both = o->split_both && folder && (!o->shard_bytes || has_splits(o));
    if (!both) {
        convert_one(o, o->ds.split, o->out);
        return 0;
    }
    size_t n = strlen(o->out) + 16;
    char *train = malloc(n), *test = malloc(n);
    if (!train || !test) tool_die("out of memory");
    snprintf(train, n, "%s/train", o->out);
    snprintf(test, n, "%s/test", o->out);
    convert_one(o, DSRT_SPLIT_TRAIN, train);
    convert_one(o, DSRT_SPLIT_TEST, test);
    free(train);
    free(test);
    return 0;
}

/*
 * The datastore's internal shapes: the index that every source fills (paths
 * or in-memory pixels, labels, class names), the view that the public handle
 * is, and the entry points of each source's loader and parser. The parsers
 * work on memory buffers so that the libFuzzer targets in tests/fuzz can
 * drive them directly.
 */
#ifndef DSRT_DATASTORE_INTERNAL_H
#define DSRT_DATASTORE_INTERNAL_H

#include <dsrt/datastore.h>
#include <stdatomic.h>

#include "core/internal.h"

// ----------------------------------------------------------------------------
// The index: what a source gives. Immutable once opened, shared by views.

typedef struct dsrt_index {
    atomic_int refs;
    dsrt_source source;
    int remote;         /* some paths are URLs of objects in a store */
    size_t n;           /* samples */
    const char **paths; /* (n) file paths in the arena; NULL for in-memory sources */
    int32_t *labels;    /* (n) class index of each sample */
    size_t num_classes;
    const char **classes; /* (num_classes) class names, in class-index order */
    dsrt_arena arena;     /* every path and class name */

    /* In-memory sources (IDX, CIFAR): pixels of every sample, HWC uint8. */
    uint8_t *pixels; /* (n, height, width, channels) */
    int width, height, channels;

    /* Shard sets: which shard and which bytes each sample is (shards.h). */
    struct dsrt_shardset *shards;

    /* Problems met while opening that did not stop it. */
    char *warnings; /* lines, NUL-terminated; NULL when none */
    size_t warnings_len, warnings_cap;
    size_t warning_count;
} dsrt_index;

/* The public handle: a view of an index. */
struct dsrt_datastore {
    dsrt_index *index;
    uint32_t *order; /* (n) index positions, or NULL for all of them in index order */
    size_t n;
};

/* Index position of view position i. */
static inline uint32_t dsrt__pos(const dsrt_datastore *ds, size_t i) {
    return ds->order ? ds->order[i] : (uint32_t)i;
}

/* Adds a warning line (printf-style); after the first 20 lines only counts. */
void dsrt__index_warn(dsrt_index *ix, const char *fmt, ...) DSRT_PRINTF(2, 3);

/* Sets the class names (copied into the arena); labels already in ix. */
int dsrt__index_set_classes(dsrt_index *ix, const char *const *names, size_t count);

// ----------------------------------------------------------------------------
// Sources. Each loader fills a zeroed index (source, n, labels, classes, and
// paths or pixels) or fails with a message naming the file; the caller frees
// the partly filled index on failure.

int dsrt__folder_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o);
int dsrt__manifest_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o);
int dsrt__idx_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o);
int dsrt__cifar_load(dsrt_index *ix, const char *path, dsrt_source kind,
                     const dsrt_datastore_options *o);
/* The shards source: datastore/shards.h. */

/* A folder at s3://bucket/prefix: lists the keys and indexes them as
 * dsrt__folder_load indexes a folder's files (s3_folder.c). */
int dsrt__s3_folder_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o);

/* A manifest at a URL: fetched whole, relative paths taken relative to it. */
int dsrt__remote_manifest_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o);

/* Folder sources, shared by the local walk and the listing of a prefix in
 * an object store, so that both index the same files the same way. */
#define DSRT_MAX_EXTENSIONS 32
#define DSRT_MAX_EXT_LEN    15
typedef struct {
    char ext[DSRT_MAX_EXTENSIONS][DSRT_MAX_EXT_LEN + 1]; /* lower case, no dot */
    size_t n;
} dsrt_extensions;
/* Parses "jpg,png" (NULL: the default list). */
int dsrt__extensions_parse(dsrt_extensions *e, const char *list);
/* Whether file name (or name[0..n)) has one of the extensions. */
int dsrt__extensions_match(const dsrt_extensions *e, const char *name);
int dsrt__extensions_match_n(const dsrt_extensions *e, const char *name, size_t n);

typedef struct {
    const char *path; /* full path, in the index arena */
    uint32_t dir_len; /* length of the folder part of path (before the last '/') */
    int32_t group;    /* class index, or folder id while walking (parent-folder labels) */
} dsrt_folder_entry;
/* Sorts by (class, folder, name) (ImageFolder's order), or by_group 0 by
 * (folder, name). */
void dsrt__folder_sort(dsrt_folder_entry *e, size_t n, int by_group);
/* Fills ix's paths and labels (group) from entries. */
int dsrt__folder_fill(dsrt_index *ix, const dsrt_folder_entry *e, size_t n);

/* Guesses the source kind of path (a folder, an IDX or CIFAR file or folder
 * of them, a manifest) for DSRT_SOURCE_AUTO; o (may be NULL) gives the
 * options of the requests that look at an s3:// prefix. */
int dsrt__detect_source(const char *path, const dsrt_datastore_options *o, dsrt_source *kind);

/*
 * Parsers on memory, for the loaders and the fuzzers. `name` is used in
 * messages only. None of them reads outside [buf, buf + len).
 */

/* An IDX file (raw or gzip): magic, dims, then unsigned bytes. On success
 * *data is a new buffer of prod(dims) bytes. max_bytes bounds the decoded size. */
typedef struct {
    int ndim;
    uint32_t dims[4];
    uint8_t *data;
    size_t size;
} dsrt_idx;
int dsrt__idx_parse(const uint8_t *buf, size_t len, const char *name, size_t max_bytes,
                    dsrt_idx *out);

/* Inflates a gzip stream into a new buffer of at most max bytes. */
int dsrt__gunzip(const uint8_t *buf, size_t len, const char *name, size_t max, uint8_t **out,
                 size_t *out_len);

/* One CIFAR binary batch: records of label byte(s) + 3072 CHW pixels.
 * Appends to ix->pixels (HWC) and ix->labels. kind picks 1 or 2 label bytes. */
int dsrt__cifar_parse(dsrt_index *ix, const uint8_t *buf, size_t len, const char *name,
                      dsrt_source kind, int coarse);

/* A manifest (CSV of path,label; RFC 4180 quoting). Relative paths are taken
 * relative to base_dir. Fills paths, labels and classes of ix. */
int dsrt__manifest_parse(dsrt_index *ix, const char *text, size_t len, const char *name,
                         const char *base_dir, int header);

#endif

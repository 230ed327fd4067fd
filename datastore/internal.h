/*
 * The entry points of each source's loader and parser (the index they fill
 * and the views of it: datastore/index/index.h). The parsers
 * work on memory buffers so that the libFuzzer targets in tests/fuzz can
 * drive them directly.
 */
#ifndef DSRT_DATASTORE_INTERNAL_H
#define DSRT_DATASTORE_INTERNAL_H

#include <dsrt/datastore.h>

#include "core/internal.h"
#include "datastore/index/index.h"

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

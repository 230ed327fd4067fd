/*
 * The IDX source (idx.c): MNIST-style IDX files, raw or gzip, as an
 * in-memory source. The parsers work on memory so that the libFuzzer
 * targets in tests/fuzz can drive them; `name` is used in messages only,
 * and none of them reads outside [buf, buf + len).
 */
#ifndef DSRT_DATASTORE_IDX_H
#define DSRT_DATASTORE_IDX_H

#include "datastore/sources/source.h"

/* Opens an IDX images file (or a folder of MNIST-named ones) into ix. */
int dsrt__idx_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o);

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

#endif

/*
 * The sources: one table of them (source.c, made from DSRT_SOURCES in the
 * public header), each a dsrt_source_ops that its own folder fills. A
 * source detects its paths, opens them into an index, and, where its
 * samples are not whole files by path or pixels in memory, reads them: a
 * reader of sample bytes for one thread, a feed that reads ahead for a
 * pipeline (and gives its epoch orders), one sample on the calling thread.
 *
 * Above the table, nothing knows a source: the datastore opens through it,
 * and the pipeline reads through the generic reader and feed (samples.c),
 * which fall back to whole files by path where a source has no reader of
 * its own.
 */
#ifndef DSRT_DATASTORE_SOURCE_H
#define DSRT_DATASTORE_SOURCE_H

#include <dsrt/datastore.h>

#include "datastore/index/index.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

// ----------------------------------------------------------------------------
// Readers of sample bytes

/* What detection looks at: a local folder, or a file's first bytes, size
 * and name, or a path that names nothing (a pattern). */
typedef struct {
    const char *path;
    int exists;
    int folder;
    unsigned char head[8];
    size_t got;    /* bytes in head */
    uint64_t size; /* of the file */
    int idx_head;  /* the file starts as an IDX file or a gzip stream does */
} dsrt_probe;

/* A reader of sample bytes for one thread, with dsrt_reader's shape: submit
 * view positions, collect results (tags as given). */
typedef struct dsrt_sample_reader dsrt_sample_reader;
typedef struct {
    int (*submit)(void *r, uint32_t pos, uint64_t epoch, void *buf, size_t cap, uint64_t tag);
    int (*collect)(void *r, dsrt_read_result *res, int wait);
    /* Forgets every request not in the kernel's hands; waits for those that are. */
    void (*cancel)(void *r);
    /* Bytes a buffer needs for view position pos (0: not known before a read). */
    size_t (*need)(const void *r, uint32_t pos);
    dsrt_io (*io)(const void *r);
    const char *(*fallback)(const void *r);
    uint64_t (*direct_refused)(const void *r);
    void (*remote_stats)(const void *r, dsrt_remote_stats *s);
    void (*destroy)(void *r);
} dsrt_sample_reader_ops;

/* A pipeline's reading ahead, on a thread of its own (the shard order's
 * stream), and the epoch orders it follows. */
typedef struct dsrt_feed dsrt_feed;

/* What a feed counts: bytes read ahead, samples it served, samples read by
 * position because it no longer held them, and its requests to a store. */
typedef struct {
    uint64_t bytes, served, ranged;
    dsrt_remote_stats remote;
} dsrt_feed_stats;

typedef struct {
    void (*run)(void *f); /* the thread's body: returns after stop */
    void (*stop)(void *f);
    /* Restarts at place `place` of epoch `epoch` (a pipeline reset); with
     * from_parts not 0, the position is one of a run of from_parts parts,
     * whose order the rest of that epoch finishes. */
    void (*seek)(void *f, uint64_t epoch, uint64_t place, unsigned from_parts);
    /* The order of epoch key: order[t] the view position at place t; with
     * from_parts not 0, the one a run of from_parts parts made. */
    int (*order)(void *f, uint64_t key, unsigned from_parts, uint32_t *order);
    void (*stats)(void *f, dsrt_feed_stats *st);
    void (*destroy)(void *f);
} dsrt_feed_ops;

struct dsrt_feed {
    const dsrt_feed_ops *ops;
    void *impl;
};

/* What a pipeline reads with: its order, batches and parts, the reader's
 * options, and how far its batches in progress reach. */
typedef struct {
    int shuffle; /* dsrt_shuffle */
    uint64_t seed;
    size_t batch;
    int drop_last;
    unsigned parts, part;
    dsrt_reader_options reader;
    uint64_t epochs;      /* of the run (0: endless) */
    unsigned open_epochs; /* epochs the batches in progress may span */
} dsrt_feed_options;

// ----------------------------------------------------------------------------
// The table

/* Sets *data and *size to the bytes of a sample, in a buffer of at least
 * need bytes that buf(ctx, need) gives (NULL: out of memory). */
typedef uint8_t *(*dsrt_buf_fn)(void *ctx, size_t need);

typedef struct dsrt_source_ops {
    dsrt_source kind;  /* its name is dsrt_source_name's, from DSRT_SOURCES */
    const char *what;  /* for messages: "a .csv manifest" (NULL: said by another) */
    const char *empty; /* added to "no samples found": what to check, or NULL */
    /* 1 when the local path (a file or a folder) is this source's; NULL:
     * never detected. p->exists 0: the path names nothing (only a pattern
     * of files may be taken then). */
    int (*detect)(const dsrt_probe *p);
    /* For a URL: 1 when it is, 0 when not, or a negative code from the
     * store; NULL: not at URLs. */
    int (*detect_url)(const char *url, const dsrt_datastore_options *o);
    /* Fills a zeroed index, or fails with a message naming the file; the
     * caller frees a partly filled index. open_url NULL: local files only. */
    int (*open)(dsrt_index *ix, const char *path, const dsrt_datastore_options *o);
    int (*open_url)(dsrt_index *ix, const char *url, const dsrt_datastore_options *o);
    /* Part i of n of view ds (NULL: contiguous ranges of positions). */
    int (*partition)(const dsrt_datastore *ds, size_t n, size_t i, uint32_t **order, size_t *count);
    /* Samples that are neither whole files by path nor pixels (NULL for
     * all three when they are): a reader for one thread, made with the
     * source's own feed or NULL; a feed (*f NULL when this datastore reads
     * in the shuffled order of positions); one sample of at most max bytes
     * on the calling thread (*mtime, may be NULL, its file's). */
    int (*reader)(void **impl, const dsrt_sample_reader_ops **ops, const dsrt_datastore *ds,
                  const dsrt_reader_options *o, dsrt_feed *feed);
    int (*feed)(dsrt_feed **f, const dsrt_datastore *ds, const dsrt_feed_options *o);
    int (*read)(const dsrt_datastore *ds, size_t i, size_t max, dsrt_buf_fn buf, void *ctx,
                uint8_t **data, size_t *size, int64_t *mtime);
    /* The read order and its shuffle buffer (NULL: EXACT, 0). */
    dsrt_shard_order (*order)(const dsrt_datastore *ds);
    size_t (*shuffle_buffer)(const dsrt_datastore *ds);
    /* The shards the samples are members of, and where sample i lies in
     * them (i in range); NULL: no shards. */
    size_t (*shard_count)(const dsrt_datastore *ds);
    const char *(*shard_path)(const dsrt_datastore *ds, size_t k);
    int (*location)(const dsrt_datastore *ds, size_t i, dsrt_sample_location *loc);
    /* Calls each for every local folder the samples of ds come from (a
     * writer must not write there); NULL: each file's folder. */
    int (*folders)(const dsrt_datastore *ds, int (*each)(void *ctx, const char *dir), void *ctx);
} dsrt_source_ops;

/* Small helpers of detection: whether name ends with suffix (any case);
 * whether the folder dir holds a regular file name. */
static inline int dsrt__ends_with_ci(const char *name, const char *suffix) {
    size_t n = strlen(name), m = strlen(suffix);
    return n >= m && strcasecmp(name + n - m, suffix) == 0;
}
static inline int dsrt__has_file(const char *dir, const char *name) {
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The source of kind, or NULL for AUTO and unknown kinds. */
const dsrt_source_ops *dsrt__source_ops(dsrt_source kind);
/* The source of a datastore. */
const dsrt_source_ops *dsrt__source_of(const dsrt_datastore *ds);

/* Guesses the source kind of path for DSRT_SOURCE_AUTO: the first source
 * of the table that takes it; o (may be NULL) gives the options of the
 * requests that look at an s3:// prefix. */
int dsrt__detect_source(const char *path, const dsrt_datastore_options *o, dsrt_source *kind);

/* Opens path (a file or a URL) as a source of kind into ix. */
int dsrt__source_open(dsrt_index *ix, dsrt_source kind, const char *path,
                      const dsrt_datastore_options *o);

// ----------------------------------------------------------------------------
// Reading samples, whatever the source (samples.c)

/* A reader of ds's samples for one thread: the source's, or whole files by
 * path (a dsrt_reader). feed: the pipeline's, or NULL. */
int dsrt__sample_reader_create(dsrt_sample_reader **r, const dsrt_datastore *ds,
                               const dsrt_reader_options *o, dsrt_feed *feed);
void dsrt__sample_reader_destroy(dsrt_sample_reader *r);
/* The reader of whole files by the paths of ds (a dsrt_reader), for a
 * source whose samples are files it does not read itself. */
int dsrt__path_reader(void **impl, const dsrt_sample_reader_ops **ops, const dsrt_datastore *ds,
                      const dsrt_reader_options *o);
int dsrt__sample_submit(dsrt_sample_reader *r, uint32_t pos, uint64_t epoch, void *buf, size_t cap,
                        uint64_t tag);
int dsrt__sample_collect(dsrt_sample_reader *r, dsrt_read_result *res, int wait);
void dsrt__sample_cancel(dsrt_sample_reader *r);
size_t dsrt__sample_need(const dsrt_sample_reader *r, uint32_t pos);
dsrt_io dsrt__sample_io(const dsrt_sample_reader *r);
const char *dsrt__sample_fallback(const dsrt_sample_reader *r);
uint64_t dsrt__sample_direct_refused(const dsrt_sample_reader *r);
void dsrt__sample_remote_stats(const dsrt_sample_reader *r, dsrt_remote_stats *s);

/* The feed of ds for a pipeline, or *f NULL when its samples are read in
 * the shuffled order of positions. */
int dsrt__feed_open(dsrt_feed **f, const dsrt_datastore *ds, const dsrt_feed_options *o);
void dsrt__feed_destroy(dsrt_feed *f);
static inline void dsrt__feed_run(dsrt_feed *f) {
    f->ops->run(f->impl);
}
static inline void dsrt__feed_stop(dsrt_feed *f) {
    f->ops->stop(f->impl);
}
static inline void dsrt__feed_seek(dsrt_feed *f, uint64_t epoch, uint64_t place,
                                   unsigned from_parts) {
    f->ops->seek(f->impl, epoch, place, from_parts);
}
static inline int dsrt__feed_order(dsrt_feed *f, uint64_t key, unsigned from_parts,
                                   uint32_t *order) {
    return f->ops->order(f->impl, key, from_parts, order);
}
static inline void dsrt__feed_stats(dsrt_feed *f, dsrt_feed_stats *st) {
    f->ops->stats(f->impl, st);
}

/* The bytes of sample i of a file source on the calling thread, at most max
 * (DSRT_ETOOBIG beyond): the file's, the object's, a member's. The message
 * of a failure starts "read: ". */
int dsrt__sample_read(const dsrt_datastore *ds, size_t i, size_t max, dsrt_buf_fn buf, void *ctx,
                      uint8_t **data, size_t *size, int64_t *mtime);

/* Calls each for every local folder the samples of ds come from. */
int dsrt__sample_folders(const dsrt_datastore *ds, int (*each)(void *ctx, const char *dir),
                         void *ctx);

#endif

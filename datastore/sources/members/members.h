/*
 * Samples that are members of shards: byte ranges of larger files, read by
 * range rather than by path. A shard is a file holding many samples (a tar
 * file of a WebDataset set, a ZIP archive); a shard set is what the index
 * of such a source carries besides paths and labels (which shard, which
 * bytes), and this layer is what those sources share: the two read orders
 * (exact, or shard by shard through a shuffle buffer), the epoch plans of
 * the shard order (plan.c), the reader of sample bytes for one thread, with
 * neighbours merged into one read, and the stream that reads the shards
 * front to back for a pipeline (reader.c), parts in whole shards and a
 * sample read on the calling thread (set.c), and the glue that makes the
 * reader and the stream a source's reader and feed (source.c).
 *
 * Where a member's range holds more than the sample's file (a ZIP member's
 * local header and compressed data), the set's codec turns the bytes read
 * into the file, wherever they were read.
 */
#ifndef DSRT_DATASTORE_MEMBERS_H
#define DSRT_DATASTORE_MEMBERS_H

#include "datastore/sources/source.h"

#include <dsrt/pipeline.h> /* dsrt_shuffle: the orders follow the pipeline's shuffle option */
#include <pthread.h>

// ----------------------------------------------------------------------------
// A shard set

typedef struct {
    const char *path; /* as opened (in the index arena) */
    uint64_t size;    /* bytes, when opened */
    uint32_t first;   /* first sample (index position) */
    uint32_t count;   /* samples */
    /* In a store: its ETag and size as listed or first answered
     * (dsrt__cache_version), so that a cache takes no block of another
     * version; 0: not known. */
    uint64_t version;
} dsrt_shard;

typedef struct dsrt_shardset dsrt_shardset;

/* How the bytes of a member's range become the sample's file, for sets
 * whose ranges hold more than the file. */
typedef struct {
    /* Bytes of sample p once decoded. */
    uint64_t (*decoded_size)(const dsrt_shardset *s, uint32_t p);
    /* buf[0..got) holds sample p's range as read (buf has cap bytes, at
     * least its range and its decoded size): leaves the file's bytes at
     * buf's start (*size of them), or returns a bad sample's code with the
     * message "read: PATH: reason" (path as the index names the sample). */
    int (*decode)(const dsrt_shardset *s, uint32_t p, const char *path, uint8_t *buf, size_t cap,
                  size_t got, size_t *size);
} dsrt_member_codec;

struct dsrt_shardset {
    dsrt_shard *shards; /* (nshards) */
    size_t nshards;
    uint64_t *offset;       /* (n) offset of each sample's range in its shard */
    uint64_t *size;         /* (n) bytes of it */
    uint32_t *shard_of;     /* (n) */
    uint32_t *member;       /* (n) where the member's name starts in paths[i] ("SHARD:MEMBER") */
    int indexed;            /* an index described every shard (a tar set's index file, a ZIP's
                               central directory) */
    int rotational;         /* the shards lie on a spinning disk */
    int remote;             /* object storage */
    dsrt_shard_order order; /* resolved: EXACT or SHARD */
    size_t shuffle_buffer;  /* samples mixed at once in the shard order */
    /* NULL when a range is the sample's file; else its codec and what the
     * codec keeps (freed with the set by codec_free). */
    const dsrt_member_codec *codec;
    void *codec_data;
    void (*codec_free)(void *data);
};

/* A set of nshards shards and n samples, its arrays allocated and zeroed,
 * made the data of ix (freed with it); NULL when out of memory. */
dsrt_shardset *dsrt__shardset_new(dsrt_index *ix, size_t nshards, size_t n);

/* The shard set of a source whose samples are members (its index's data). */
static inline const dsrt_shardset *dsrt__shardset_of(const dsrt_datastore *ds) {
    return (const dsrt_shardset *)ds->index->data;
}

/* Resolves the order (AUTO: EXACT where the set is indexed and on a disk
 * that seeks cheaply, else SHARD) and the shuffle buffer from o, once the
 * set is filled; first_shard: a path on the shards' disk. */
void dsrt__shardset_settle(dsrt_shardset *s, const dsrt_datastore_options *o,
                           const char *first_shard);

/* Part i of n of view ds in whole shards (dsrt_datastore_partition): a new
 * array of the part's index positions. */
int dsrt__shards_partition(const dsrt_datastore *ds, size_t n, size_t i, uint32_t **order,
                           size_t *count);

/* What a source of members puts in its dsrt_source_ops: the reader of
 * sample bytes (with the stream as its feed), the stream as the feed of a
 * set read in the shard order, one sample on the calling thread (its range
 * read, then decoded), the order and its shuffle buffer, the shards and
 * where a sample lies in them, the folders of the local shards. */
int dsrt__members_reader(void **impl, const dsrt_sample_reader_ops **ops, const dsrt_datastore *ds,
                         const dsrt_reader_options *o, dsrt_feed *feed);
int dsrt__members_feed(dsrt_feed **f, const dsrt_datastore *ds, const dsrt_feed_options *o);
int dsrt__members_read(const dsrt_datastore *ds, size_t i, size_t max, dsrt_buf_fn buf, void *ctx,
                       uint8_t **data, size_t *size, int64_t *mtime);
dsrt_shard_order dsrt__members_order(const dsrt_datastore *ds);
size_t dsrt__members_shuffle_buffer(const dsrt_datastore *ds);
size_t dsrt__members_shard_count(const dsrt_datastore *ds);
const char *dsrt__members_shard_path(const dsrt_datastore *ds, size_t k);
int dsrt__members_location(const dsrt_datastore *ds, size_t i, dsrt_sample_location *loc);
int dsrt__members_folders(const dsrt_datastore *ds, int (*each)(void *ctx, const char *dir),
                          void *ctx);

// ----------------------------------------------------------------------------
// Epoch orders of the shard order

typedef struct dsrt_shard_plan dsrt_shard_plan;

/* What an epoch order depends on besides the datastore. */
typedef struct {
    int shuffle; /* dsrt_shuffle */
    uint64_t seed;
    size_t batch;
    int drop_last;
    unsigned parts, part;
} dsrt_shard_plan_options;

/* The samples of a view grouped by shard, for computing epoch orders. */
int dsrt__shard_plan_create(dsrt_shard_plan **plan, const dsrt_datastore *ds,
                            const dsrt_shard_plan_options *o);
void dsrt__shard_plan_destroy(dsrt_shard_plan *plan);

/*
 * The order of epoch key (the epoch, or 0 when shuffled once): order[t] is the
 * view position at place t of the epoch (a permutation of 0..n-1). With
 * stream not NULL, also the sequence part `part` streams: stream[0..*nstream)
 * are view positions in the order they lie in its shards (shards in the
 * epoch's order), and use[v] the index of view position v among the places
 * of this part (UINT32_MAX when another part takes it).
 *
 * from_parts 0: the order this plan's parts make. Otherwise the order a run
 * of from_parts parts made (whole shards to from_parts lanes), which a run
 * resumed on another number of parts finishes: use[] then says this part's
 * places as this run stripes each batch, and the stream is empty (the
 * samples lie in every lane's shards: each is read by offset).
 */
int dsrt__shard_plan_epoch(const dsrt_shard_plan *plan, uint64_t key, unsigned from_parts,
                           uint32_t *order, uint32_t *stream, size_t *nstream, uint32_t *use);

/* Samples of the view. */
size_t dsrt__shard_plan_count(const dsrt_shard_plan *plan);

// ----------------------------------------------------------------------------
// Reading sample bytes

typedef struct dsrt_shard_stream dsrt_shard_stream;
typedef struct dsrt_shard_reader dsrt_shard_reader;

/*
 * A reader of sample bytes for one thread, with the interface of
 * dsrt_reader: submit a view position, collect results. Ranged reads on the
 * shard files (io_uring, neighbours merged into one read, or pread), or, with
 * a stream, the bytes the stream read.
 */
int dsrt__shard_reader_create(dsrt_shard_reader **r, const dsrt_datastore *ds,
                              const dsrt_reader_options *o, dsrt_shard_stream *stream);
void dsrt__shard_reader_destroy(dsrt_shard_reader *r);
dsrt_io dsrt__shard_reader_io(const dsrt_shard_reader *r);
const char *dsrt__shard_reader_fallback_reason(const dsrt_shard_reader *r);
uint64_t dsrt__shard_reader_direct_refused(const dsrt_shard_reader *r);
/* Queues sample pos (a view position) of epoch into buf (cap bytes). */
int dsrt__shard_reader_submit(dsrt_shard_reader *r, uint32_t pos, uint64_t epoch, void *buf,
                              size_t cap, uint64_t tag);
int dsrt__shard_reader_collect(dsrt_shard_reader *r, dsrt_read_result *res, int wait);
/* What its requests to an object store did (zeros for local shards). */
void dsrt__shard_reader_remote_stats(const dsrt_shard_reader *r, dsrt_remote_stats *st);
/* Forgets every request that the kernel does not hold (waiting for the
 * stream, queued, or finished and not collected): for a pipeline that stops
 * mid-chunk. Reads the kernel holds are still collected. */
void dsrt__shard_reader_cancel(dsrt_shard_reader *r);
unsigned dsrt__shard_reader_in_flight(const dsrt_shard_reader *r);
/* Buffer bytes the sample at view position pos needs: its range and its
 * decoded size, and more with O_DIRECT. */
size_t dsrt__shard_reader_need(const dsrt_shard_reader *r, uint32_t pos);
/* The size of the range of the sample at view position pos. */
uint64_t dsrt__shard_sample_size(const dsrt_datastore *ds, uint32_t pos);

/*
 * The stream of the shard order: one per pipeline, read by one thread
 * (dsrt__shard_stream_run) front to back in large blocks, shard after shard
 * in each epoch's order, a bounded distance ahead of the samples asked for.
 */
typedef struct {
    dsrt_reader_options reader; /* io back-end, O_DIRECT */
    size_t block;               /* bytes a read; 0: 4 MiB */
    size_t ahead;               /* samples read ahead of the furthest asked for, besides the
                                   shuffle buffer; 0: enough for the blocks in flight */
    uint64_t epochs;            /* epochs of the run (none read past them); 0: endless */
    unsigned open_epochs;       /* epochs the consumer may ask for at once (a pipeline's
                                   batches in progress span that many); 0: 2 */
} dsrt_shard_stream_options;

int dsrt__shard_stream_create(dsrt_shard_stream **s, const dsrt_datastore *ds,
                              const dsrt_shard_plan_options *po,
                              const dsrt_shard_stream_options *o);
void dsrt__shard_stream_destroy(dsrt_shard_stream *s);
/* The thread's body: returns when dsrt__shard_stream_stop is called. */
void dsrt__shard_stream_run(dsrt_shard_stream *s);
void dsrt__shard_stream_stop(dsrt_shard_stream *s);
/* Restarts at place `place` of epoch `epoch` (a pipeline reset); from_parts
 * not 0: the rest of that epoch follows the order a run of from_parts parts
 * made (see dsrt__shard_plan_epoch), later epochs this run's. */
void dsrt__shard_stream_seek(dsrt_shard_stream *s, uint64_t epoch, uint64_t place,
                             unsigned from_parts);
/* The epoch order the stream follows (for the pipeline's order cache);
 * from_parts as dsrt__shard_plan_epoch's. */
int dsrt__shard_stream_order(dsrt_shard_stream *s, uint64_t key, unsigned from_parts,
                             uint32_t *order);

/* Counters of a stream: bytes read by the stream, samples it served, and
 * samples read by offset because the stream no longer held them. */
typedef struct {
    uint64_t bytes, served, ranged, blocks;
} dsrt_shard_stream_stats;
void dsrt__shard_stream_stats(dsrt_shard_stream *s, dsrt_shard_stream_stats *st);
/* What the stream's requests to an object store did (zeros for local shards). */
void dsrt__shard_stream_remote_stats(dsrt_shard_stream *s, dsrt_remote_stats *st);

#endif

/*
 * Internal shapes of tar shard sets: the tar format (headers read and
 * written), the shard set a datastore's index points to (which shard and
 * which bytes each sample is), the index file that lets a set open without
 * reading its shards, the epoch orders of the `shard` order, and the
 * readers that get sample bytes out of shards (ranged reads for the `exact`
 * order, one sequential stream for the `shard` order).
 *
 * Shard sets follow WebDataset's conventions: a sample is the run of
 * consecutive members that share a key (the member's name up to the first dot
 * of its last path component), its image is the member whose extension is
 * an image's, its label the text of its `.cls` member.
 */
#ifndef DSRT_DATASTORE_SHARDS_H
#define DSRT_DATASTORE_SHARDS_H

#include "datastore/internal.h"

#include <dsrt/pipeline.h> /* dsrt_shuffle: the orders follow the pipeline's shuffle option */
#include <pthread.h>

// ----------------------------------------------------------------------------
// The tar format

#define DSRT_TAR_BLOCK 512
/* Longest member name kept (pax and GNU long names included); longer names
 * make the member a bad one. */
#define DSRT_TAR_NAME_MAX 4096

/* One member as the scanner reports it. */
typedef struct {
    const char *name; /* full name (ustar prefix, GNU long name or pax path applied) */
    size_t name_len;
    uint64_t header; /* offset of the member's own header block */
    uint64_t offset; /* of its data */
    uint64_t size;   /* of its data, as the header says */
    char type;       /* '0' for a regular file (also '\0', '7'), else the typeflag */
    int truncated;   /* the data runs past the end of the file */
} dsrt_tar_member;

/* Reads up to len bytes at off into buf; returns the bytes read (short only at
 * the end of the file) or a negative code with the message set. */
typedef int64_t (*dsrt_tar_read_fn)(void *ctx, uint64_t off, void *buf, size_t len);
/* Called for each member; a non-zero return stops the scan with that code. */
typedef int (*dsrt_tar_member_fn)(void *ctx, const dsrt_tar_member *m);
/* Called for each problem that does not stop the scan (printf-style line). */
typedef void (*dsrt_tar_warn_fn)(void *ctx, const char *msg);

/*
 * Walks the tar archive of file_size bytes that read gives, calling member
 * for every member that carries data or names a file (folders and links
 * too, with their type), with pax extended headers ('x'), GNU long names
 * ('L', 'K') and the ustar prefix applied. A header whose checksum is wrong is
 * warned about and the scan looks for the next valid header; a member whose
 * data runs past the end of the file is reported with truncated set and ends
 * the scan. Returns 0, or the code of a read failure or of member. name is
 * used in messages only.
 */
int dsrt__tar_scan(const char *name, uint64_t file_size, dsrt_tar_read_fn read, void *read_ctx,
                   dsrt_tar_member_fn member, dsrt_tar_warn_fn warn, void *ctx);

/* Writes a POSIX ustar header for a regular file of size bytes named name
 * (at most 100 bytes, no prefix needed) into block. mtime in seconds. */
int dsrt__tar_header_make(uint8_t block[DSRT_TAR_BLOCK], const char *name, uint64_t size,
                          int64_t mtime);

/* The key and extension of a member name, WebDataset's way: the key is the
 * name up to the first dot of its last path component, the extension the
 * rest. Returns 0 when the name has no such dot (not part of a sample). */
int dsrt__tar_split_key(const char *name, size_t len, size_t *key_len, const char **ext,
                        size_t *ext_len);

// ----------------------------------------------------------------------------
// A shard set: what the index of a shards datastore carries besides paths
// and labels.

typedef struct {
    const char *path; /* as opened (in the index arena) */
    uint64_t size;    /* bytes, when opened */
    uint32_t first;   /* first sample (index position) */
    uint32_t count;   /* samples */
} dsrt_shard;

typedef struct dsrt_shardset {
    dsrt_shard *shards; /* (nshards) */
    size_t nshards;
    uint64_t *offset;       /* (n) data offset of each sample's image member */
    uint64_t *size;         /* (n) bytes of it */
    uint32_t *shard_of;     /* (n) */
    uint32_t *member;       /* (n) where the member's name starts in paths[i] ("SHARD:MEMBER") */
    int indexed;            /* the index file described every shard */
    int rotational;         /* the shards lie on a spinning disk */
    int remote;             /* object storage */
    dsrt_shard_order order; /* resolved: EXACT or SHARD */
    size_t shuffle_buffer;  /* samples mixed at once in the shard order */
    char index_path[4096];  /* the index file used, "" when none */
} dsrt_shardset;

void dsrt__shardset_free(dsrt_shardset *s);

/* The shard set of an index of a shards source (its data), or NULL. */
static inline dsrt_shardset *dsrt__shardset_of(const dsrt_index *ix) {
    return ix->source == DSRT_SOURCE_SHARDS ? (dsrt_shardset *)ix->data : NULL;
}

/* Opens the shard set at path (a folder, a .tar, a glob or a brace list)
 * into ix. */
int dsrt__shards_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o);

/* What a scan finds of one sample (for the fuzzer and the tests). */
typedef struct {
    uint64_t offset, size; /* of its image member */
    int has_cls;           /* it has a .cls member */
} dsrt_shard_sample;

/* Scans a shard held in memory as dsrt__shards_load scans shard files:
 * members grouped into samples by key, images by extension (NULL: the
 * default list). Warnings go to ix; *out is a new array of *n samples. */
int dsrt__shard_scan_memory(const uint8_t *buf, size_t len, const char *name,
                            const char *extensions, dsrt_index *ix, dsrt_shard_sample **out,
                            size_t *n);

/* Part i of n of view ds in whole shards (dsrt_datastore_partition): a new
 * array of the part's index positions. */
int dsrt__shards_partition(const dsrt_datastore *ds, size_t n, size_t i, uint32_t **order,
                           size_t *count);

/* 1 when the s3:// prefix url holds a shard set (dsrt's index, or .tar
 * objects and no folder), 0 when not, or a negative code from the store.
 * o (may be NULL) gives the requests' options (dsrt__http_create_opening). */
int dsrt__s3_is_shardset(const char *url, const dsrt_datastore_options *o);

/* 1 when path names a shard set: a .tar file, a glob or brace list of them,
 * or a folder holding an index or tar files and no sub-folder. */
int dsrt__is_shardset(const char *path, int folder);

// ----------------------------------------------------------------------------
// The index file: "dsrt-shards.index" beside the shards.

#define DSRT_SHARD_INDEX_NAME   "dsrt-shards.index"
#define DSRT_SHARD_CLASSES_NAME "classes.json"

/* What an index holds; the writer takes it, the reader fills it. */
typedef struct {
    size_t nshards, n, nclasses;
    const char **shard_names; /* (nshards) file names, relative to the index's folder */
    uint64_t *shard_size;     /* (nshards) */
    uint32_t *shard_count;    /* (nshards) samples in each */
    uint64_t *offset, *size;  /* (n) */
    int32_t *label;           /* (n) */
    const char **member;      /* (n) names of the image members */
    const char **classes;     /* (nclasses) */
} dsrt_shard_index;

/* Writes the index atomically (temporary file, fsync, rename). */
int dsrt__shard_index_write(const char *path, const dsrt_shard_index *x);

/* Reads an index; the strings and arrays live in *arena and in blocks freed
 * with dsrt__shard_index_clear. */
int dsrt__shard_index_read(const char *path, dsrt_shard_index *x, dsrt_arena *arena);
void dsrt__shard_index_clear(dsrt_shard_index *x);

/* Parses an index held in memory (for the reader and the fuzzer). */
int dsrt__shard_index_parse(const uint8_t *buf, size_t len, const char *name, dsrt_shard_index *x,
                            dsrt_arena *arena);

/* Parses classes.json: a JSON array of strings (or {"classes": [...]}). */
int dsrt__classes_json_parse(const char *text, size_t len, const char *name, dsrt_arena *arena,
                             const char ***names, size_t *count);

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
 */
int dsrt__shard_plan_epoch(const dsrt_shard_plan *plan, uint64_t key, uint32_t *order,
                           uint32_t *stream, size_t *nstream, uint32_t *use);

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
/* Buffer bytes a sample of size bytes needs (more than size with O_DIRECT). */
size_t dsrt__shard_reader_need(const dsrt_shard_reader *r, size_t size);
/* Reads the bytes of the sample at view position pos into buf (its size):
 * pread from a local shard (*mtime, may be NULL, the shard's), a ranged GET
 * from an object store. A member cut short fails with DSRT_ETRUNCATED and
 * "read: SHARD:MEMBER: member cut short ...". */
int dsrt__shard_member_read(const dsrt_datastore *ds, uint32_t pos, uint8_t *buf, int64_t *mtime);
/* The size of the sample at view position pos. */
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
/* Restarts at place `place` of epoch `epoch` (a pipeline reset). */
void dsrt__shard_stream_seek(dsrt_shard_stream *s, uint64_t epoch, uint64_t place);
/* The epoch order the stream follows (for the pipeline's order cache). */
int dsrt__shard_stream_order(dsrt_shard_stream *s, uint64_t key, uint32_t *order);

/* Counters of a stream: bytes read by the stream, samples it served, and
 * samples read by offset because the stream no longer held them. */
typedef struct {
    uint64_t bytes, served, ranged, blocks;
} dsrt_shard_stream_stats;
void dsrt__shard_stream_stats(dsrt_shard_stream *s, dsrt_shard_stream_stats *st);
/* What the stream's requests to an object store did (zeros for local shards). */
void dsrt__shard_stream_remote_stats(dsrt_shard_stream *s, dsrt_remote_stats *st);

#endif

/*
 * The local cache of remote bytes (cache.c): what the HTTP client fetches
 * from a store, kept in a folder on local disk, so that later epochs, later
 * runs and every process of the machine read it from there.
 *
 * An entry is a whole object (an image of a folder in a bucket), or one
 * block of DSRT_CACHE_BLOCK bytes of an object read by ranges (a tar shard,
 * a ZIP archive), at an offset that is a multiple of the block. Its name is
 * a hash of the URL, the object's version (its ETag and size, as the
 * listing gave them) and the block, so a changed object has other names and
 * is fetched again; entries of old versions are the least recently used
 * and go first. An entry's file holds its URL, the ETag and size of the
 * object it came from, and a 64-bit hash of every 64 KiB of its bytes,
 * checked on every read: a damaged entry is removed and fetched again,
 * never handed over.
 *
 * Room. The limit counts the entries' files: an object's bytes, plus a
 * header of DSRT_CACHE_ENTRY_BYTES, its URL and 8 bytes every 64 KiB. A
 * cache smaller than the data keeps the entries it holds and streams the
 * rest (see dsrt__cache_put); entries are evicted only for lack of use
 * over whole epochs, so a run does not evict the entries of a run before
 * it that it is about to read.
 *
 * Processes share the folder through the file system alone: a fill lock is
 * a lock of a byte of a file (the kernel drops it when its process dies, so
 * nothing stale blocks), an entry is written to a temporary file and
 * published by rename (a reader sees the whole entry or none), and the
 * bytes in use are a count in a file under an flock. A handle belongs to
 * one thread (the HTTP client's).
 */
#ifndef DSRT_DATASTORE_BYTES_CACHE_H
#define DSRT_DATASTORE_BYTES_CACHE_H

#include <dsrt/datastore.h>

#include "core/internal.h"

/* Bytes of a block of an object read by ranges. One stream read of a shard
 * (8 MiB) spans 9 blocks; one member's range, one or two. */
#define DSRT_CACHE_BLOCK ((uint64_t)1 << 20)
/* Bytes of an entry's file besides its object's bytes, its URL and its
 * 64 KiB chunks' hashes (8 bytes each): the header. */
#define DSRT_CACHE_ENTRY_BYTES 168
/* The block number of a whole object's entry. */
#define DSRT_CACHE_WHOLE UINT64_MAX

typedef struct dsrt_cache dsrt_cache;

/* Refuses a cache folder that is not one (a file, a folder that cannot be
 * made or written): DSRT_EOPTION, the message naming who and the path.
 * Makes the folder when it is missing. dir NULL or "": no cache, 0. */
int dsrt__cache_check(const char *dir, uint64_t limit, const char *who);

/* Opens the cache in dir (checked as above), keeping at most limit bytes
 * of entries there (0: no limit but the disk). */
int dsrt__cache_open(dsrt_cache **c, const char *dir, uint64_t limit);
void dsrt__cache_close(dsrt_cache *c);

/* An object's version: its ETag (quotes, spaces and case of the hex
 * ignored) and size, hashed; never 0 (0 stands for "not known"). */
uint64_t dsrt__cache_version(const char *etag, size_t n, uint64_t size);

/* The name of the entry of block `block` (DSRT_CACHE_WHOLE: the whole
 * object) of url at version. */
uint64_t dsrt__cache_key(const char *url, uint64_t version, uint64_t block);

/*
 * Reads the bytes [off, off + len) of entry key (whose URL must be url) into
 * dst. Returns 1 when the entry is there and whole: *got the bytes read
 * (fewer than len where the entry ends first), *size the entry's size;
 * 0 when it is not there, or was damaged (then it is removed); a negative
 * code only for what is not the entry's fault (out of memory).
 */
int dsrt__cache_read(dsrt_cache *c, uint64_t key, const char *url, uint64_t off, size_t len,
                     void *dst, size_t *got, uint64_t *size);

/*
 * Tells the cache which epoch the requests to follow read (a number that
 * grows; an older one, a straggler of the epoch before, changes nothing).
 * Epochs decide what may be evicted: only entries not used during this
 * handle's last two whole epochs, which a shuffled pass over the data
 * would have read. A handle never told an epoch (a dsrt_reader used on
 * its own) evicts nothing: it fills the free room, then reads the rest
 * from the store.
 */
void dsrt__cache_epoch(dsrt_cache *c, uint64_t epoch);

/* 1 when the cache admits nothing more this epoch (full, and nothing it
 * may evict): a miss then goes to the store as a plain request, without a
 * fill lock, a temporary file or a look at the folder. */
int dsrt__cache_full(dsrt_cache *c);

/* Takes the fill lock of entry key without waiting: 0, -EWOULDBLOCK when
 * another handle (of this process or another) holds it, or another
 * -errno. */
int dsrt__cache_lock(dsrt_cache *c, uint64_t key);
/* Drops a fill lock; held is what dsrt__cache_lock returned (< 0: none). */
void dsrt__cache_unlock(dsrt_cache *c, uint64_t key, int held);

/* What an entry is of. */
typedef struct {
    const char *url;
    uint64_t version; /* as asked (0: not known) */
    uint64_t block;   /* DSRT_CACHE_WHOLE or a block number */
    const char *etag; /* of the answer ("" when it gave none) */
    uint64_t object_size;
} dsrt_cache_entry;

/*
 * Publishes data[0..len) as entry key, its fill lock held. When the cache
 * is full, entries not used during this handle's last two epochs go
 * first, least recently used first, and never one being read; when that
 * is not enough the entry is not kept, nor any other until the next epoch
 * (a cache smaller than what a run reads keeps what it holds rather than
 * trade it for bytes read later in the epoch). Returns 1 when published,
 * 0 when not kept (full, or the disk refused: nothing of the entry is
 * left).
 */
int dsrt__cache_put(dsrt_cache *c, uint64_t key, const dsrt_cache_entry *e, const void *data,
                    size_t len);

/* Adds this handle's counters to s: hits and bytes (counted by the caller,
 * through dsrt__cache_count), evictions. */
void dsrt__cache_stats(const dsrt_cache *c, dsrt_remote_stats *s);
/* Counts one request answered from the cache (bytes of it), or one that
 * went to the store (hit 0). */
void dsrt__cache_count(dsrt_cache *c, int hit, uint64_t bytes);

/* As dsrt_reader_submit, for a sample of a datastore read in epoch `epoch`:
 * an object in a store (with a cache, its entries of another version than
 * `version`, its listing's ETag and size, 0: not known, are not taken), or
 * a local file (reader.c). */
int dsrt__reader_submit_sample(dsrt_reader *r, const char *path, uint64_t version, uint64_t epoch,
                               void *buf, size_t cap, uint64_t tag);

#endif

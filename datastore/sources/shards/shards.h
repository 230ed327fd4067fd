/*
 * The shards source: tar shard sets in WebDataset's layout (shards.c opens
 * them; select.c names the shards of a folder, a glob or a brace list;
 * scan.c reads the headers of a shard the index does not describe; tar.c
 * the tar format; index_file.c dsrt's index beside the shards and
 * classes.json). Reading them is the members layer's
 * (datastore/sources/members/members.h), which this header includes.
 *
 * Shard sets follow WebDataset's conventions: a sample is the run of
 * consecutive members that share a key (the member's name up to the first dot
 * of its last path component), its image is the member whose extension is
 * an image's, its label the text of its `.cls` member.
 */
#ifndef DSRT_DATASTORE_SHARDS_H
#define DSRT_DATASTORE_SHARDS_H

#include "datastore/sources/members/members.h"

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
// Opening

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

#endif

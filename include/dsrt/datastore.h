/*
 * dsrt datastore: everything between "a path the user gives" and "the decoded
 * pixels and label of sample i".
 *
 * A datastore is an index of samples with labels and a class list, opened
 * from one of several sources: a folder of class sub-folders, a manifest
 * (CSV of path,label), IDX files (MNIST, Fashion-MNIST), CIFAR-10/100
 * binary batches or a set of tar shards (WebDataset's layout). Samples of a
 * folder or manifest are files, read with a dsrt_reader and decoded with a
 * dsrt_decoder; samples of a shard set are byte ranges of its tar files;
 * samples of IDX and CIFAR sources are pixels held in memory.
 *
 * A folder may be a prefix in an object store, "s3://bucket/prefix": its
 * keys are listed (ListObjectsV2) and indexed as the same folder's files
 * would be, so a bucket holding a copy of a folder gives the same classes,
 * order and batches. A manifest may sit at a URL (s3://, https://) and name
 * objects by URL.
 *
 * The order functions (split_each_label, shuffle, partition, subset) return
 * new datastores that are views: they share the index of the datastore they
 * came from and hold only an array of sample positions. Each view must be
 * closed; the index is freed with the last of them.
 *
 * Threads: an open datastore is immutable. Every dsrt_datastore_* query and
 * order function may be called from any number of threads at once. Readers
 * and decoders belong to one thread each (one io_uring ring, one TurboJPEG
 * handle per thread).
 */
#ifndef DSRT_DATASTORE_H
#define DSRT_DATASTORE_H

#include <dsrt/core.h>

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Images

/*
 * The image formats the decoder reads, one line each: X(KIND, value, name)
 * makes the constant DSRT_FORMAT_KIND = value. Each is one codec of the
 * library's table of codecs, made from this one list; a file's format is
 * told from its first bytes, in this order, and the extensions a folder
 * takes by default are those of every format here.
 */
#define DSRT_FORMATS(X)                                                                            \
    X(JPEG, 1, jpeg) /* libjpeg-turbo: .jpg .jpeg .jpe .jfif */                                    \
    X(PNG, 2, png)   /* libspng: .png */                                                           \
    X(WEBP, 4, webp) /* libwebp, lossy and lossless, still images: .webp */

#define DSRT_FORMAT_ENUM_(kind, value, name) DSRT_FORMAT_##kind = value,
/* Pixel layouts of the files a datastore reads. */
typedef enum {
    DSRT_FORMAT_UNKNOWN = 0,
    DSRT_FORMATS(DSRT_FORMAT_ENUM_) DSRT_FORMAT_RAW = 3, /* pixels held in memory (IDX, CIFAR) */
} dsrt_format;
#undef DSRT_FORMAT_ENUM_

/* What a file's header says, before any pixel is decoded. */
typedef struct {
    dsrt_format format;
    int width, height;
    int channels;  /* in the file: 1 gray, 2 gray+alpha, 3 colour, 4 colour+alpha or CMYK */
    int bit_depth; /* bits per sample in the file: 8 for JPEG and WebP; 1..16 for PNG */
    int cmyk;      /* 1 for CMYK or YCCK JPEG */
} dsrt_image_info;

/* Decoded 8-bit pixels, interleaved (HWC): row y starts at data + y * stride. */
typedef struct {
    uint8_t *data;
    int width, height;
    int channels; /* 1 (gray) or 3 (RGB) */
    size_t stride;
} dsrt_image;

/* Where a decoded image lies in the image it was decoded from: a region
 * decode (dsrt_decode_request region_*) gives a window of it, width x height
 * pixels at (x0, y0) of the decoded_width x decoded_height image (the image
 * as stored, or its DCT-scaled size). A whole decode is the window at 0, 0
 * of its own size. */
typedef struct {
    int x0, y0;
    int decoded_width, decoded_height;
} dsrt_window;

// ----------------------------------------------------------------------------
// Opening a datastore

typedef struct dsrt_datastore dsrt_datastore;

/*
 * The sources, one line each: X(KIND, value, name) makes the constant
 * DSRT_SOURCE_KIND = value and the name dsrt_source_name gives. The lines
 * are in the order DSRT_SOURCE_AUTO tries them on a path (the CIFAR
 * folders' marker files before MNIST names, names before what asks a store,
 * a folder of class folders when nothing else matched); the library's
 * table of sources is made from this one list.
 */
#define DSRT_SOURCES(X)                                                                            \
    X(CIFAR10, 4, cifar10)   /* CIFAR-10 binary batches: a .bin file or the extracted folder */    \
    X(CIFAR100, 5, cifar100) /* CIFAR-100's, the same way */                                       \
    X(IDX, 3, idx)           /* an IDX images file (MNIST; raw or gzip) or a folder of them */     \
    X(MANIFEST, 2, manifest) /* a CSV of path,label (.csv, .txt, .lst), local or at a URL */       \
    X(ZIP, 8, zip)           /* a ZIP archive of images labelled by its folders, or at a URL */    \
    X(SHARDS, 6, shards)     /* tar shards, WebDataset's layout: a folder, a .tar, a glob, a   */  \
                             /* brace list ("shard-{000000..000146}.tar"); local or in a store */  \
    X(FOLDER, 1, folder)     /* a folder of class sub-folders, or an s3:// prefix of one */

#define DSRT_SOURCE_ENUM_(kind, value, name) DSRT_SOURCE_##kind = value,
typedef enum {
    DSRT_SOURCE_AUTO = 0, /* from the path: the first source of DSRT_SOURCES that takes it */
    DSRT_SOURCES(DSRT_SOURCE_ENUM_)
    /* Several datastores drawn in proportions: made by dsrt_datastore_mix
     * (or dsrt_datastore_open_mix), never detected nor opened as a path. */
    DSRT_SOURCE_MIX = 9,
} dsrt_source;
#undef DSRT_SOURCE_ENUM_

/* How the pipeline reads a shard set. Both give every sample once an epoch
 * and are pure functions of (seed, epoch): runs and resumes are
 * bit-identical. */
typedef enum {
    /* EXACT where dsrt's index is there and the storage seeks cheaply (a
     * local disk that is not a spinning one); SHARD otherwise. */
    DSRT_SHARD_ORDER_AUTO = 0,
    /* The same global shuffle as any datastore (the batches equal those of
     * the folder the shards were written from); each sample read by offset,
     * neighbours that are wanted together in one read. */
    DSRT_SHARD_ORDER_EXACT,
    /* Shards in an order shuffled each epoch, each read once front to back
     * in large blocks; samples mixed in a shuffle buffer of shuffle_buffer
     * samples. With pipeline parts, each part takes whole shards. */
    DSRT_SHARD_ORDER_SHARD,
} dsrt_shard_order;

typedef enum {
    /* The first sub-folder under the root names the class; files anywhere
     * below it belong to it; files directly in the root are ignored. Class
     * indices equal torchvision's ImageFolder on the same folder. */
    DSRT_LABEL_FOLDER_NAMES = 0,
    /* The folder that holds the file names the class (MATLAB's
     * 'LabelSource','foldernames' with 'IncludeSubfolders'). */
    DSRT_LABEL_PARENT_FOLDER,
    /* No labels: every sample has label 0 and there is one class, "". */
    DSRT_LABEL_NONE,
} dsrt_label_source;

typedef enum { DSRT_SPLIT_TRAIN = 0, DSRT_SPLIT_TEST } dsrt_split;

/*
 * Objects in a store (s3://bucket/key, https://host/path, http://...): the
 * reader fetches them with libcurl's multi interface, many requests in
 * flight on kept-alive connections, signed with AWS Signature Version 4 for
 * s3:// (credentials, region and endpoint as the AWS tools take them:
 * AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION or
 * AWS_DEFAULT_REGION, AWS_ENDPOINT_URL, AWS_PROFILE and ~/.aws/credentials,
 * ~/.aws/config; anonymous when there are none or AWS_NO_SIGN_REQUEST=YES).
 * Throttling, server errors, resets and stalls are retried with jittered
 * exponential backoff; a request that has not succeeded retry_deadline_s
 * after its first failure fails with DSRT_EREMOTE and the cause.
 */
typedef struct {
    unsigned depth; /* requests in flight at most, 1 to 4096; default 64 */
    /* Connections to one host at most (each request in flight needs one
     * with HTTP/1.1); 0 (default): $DSRT_S3_MAX_CONNECTIONS, else depth. */
    unsigned max_connections;
    double retry_deadline_s; /* default 60 */
    /* A request that receives nothing for this long, or is not done this
     * long after it started (a server that drips a byte now and then), is
     * dropped and retried; also the limit on connecting. Default 30. */
    double timeout_s;
    /* A folder on local disk that keeps what is fetched (whole objects, and
     * blocks of 1 MiB of objects read by ranges: shards, ZIP archives), so
     * that later epochs, later runs and the other processes of the machine
     * read it from there; made when missing. Entries are checked against
     * the object's ETag and size (a changed object is fetched again) and a
     * hash of their bytes (a damaged entry is fetched again). Processes
     * share it safely (one fills an entry, the others wait for it). NULL
     * (default): no cache. The string is copied. */
    const char *cache_dir;
    /* Bytes of entries the cache folder keeps at most. An entry takes its
     * object's (or block's) bytes plus 168, its URL and 8 every 64 KiB, so
     * a limit of the data's size plus that much an object holds it all.
     * Once full, the rest is read from the store, as cheaply as without a
     * cache, and what the cache holds stays: only entries that this
     * reader's last two whole epochs did not read (another dataset's, an
     * old version's) are evicted to make room, least recently used first.
     * A dsrt_reader used on its own knows no epochs and evicts nothing.
     * 0 (default): no limit but the disk. */
    uint64_t cache_limit;
} dsrt_remote_options;

typedef struct {
    dsrt_source source;
    dsrt_label_source label_source;
    /* Folder: descend into sub-folders (MATLAB 'IncludeSubfolders'). With 0,
     * DSRT_LABEL_FOLDER_NAMES takes the files directly inside each class
     * folder only. Default 1. */
    int include_subfolders;
    /* Folder: comma-separated file extensions to take, case-insensitive, with
     * or without the dot ("jpg,png"). NULL: those of every format of
     * DSRT_FORMATS: jpg, jpeg, jpe, jfif, png, webp. */
    const char *extensions;
    /* Folder: follow symbolic links to files and folders. Loops are detected,
     * reported in the warnings and not followed. Default 1. */
    int follow_symlinks;
    /* Folder, DSRT_LABEL_FOLDER_NAMES: 1: a class folder that holds no image
     * is not a class (the warning says it was dropped); 0 (default): it is a
     * class with no sample (dsrt_datastore_class_counts says 0), which the
     * caller may refuse. */
    int drop_empty_classes;
    /* IDX: path of the labels file; NULL derives it from the images file
     * ("train-images-idx3-ubyte.gz" -> "train-labels-idx1-ubyte.gz"). */
    const char *labels_path;
    /* IDX or CIFAR given as a folder of the original files: which split. */
    dsrt_split split;
    /* CIFAR-100: 1 takes the 20 coarse labels, 0 the 100 fine ones. */
    int cifar100_coarse;
    /* Manifest: 1 the first line is a header, 0 it is not, -1 (default)
     * guess: a header when its label field is "label" or "class". */
    int manifest_header;
    /* Shards: how the pipeline reads them (default AUTO). */
    dsrt_shard_order shard_order;
    /* Shards, SHARD order: samples held in the shuffle buffer that mixes the
     * samples of consecutive shards, 1 to 2^24 (1 and shuffle never keep
     * the shards' own order). Default 1000. */
    size_t shuffle_buffer;
    /* Objects in a store: the requests that open the datastore (listing a
     * prefix, fetching a manifest, a shard set's index, scanning shards
     * without one) take these retry deadline, request timeout and
     * connection cap, and at most this depth in flight; 0 fields: the
     * reader's defaults (dsrt_reader_defaults().remote). */
    dsrt_remote_options remote;
    /* Called now and then (every 100 ms at least) on the opening thread
     * while opening waits on a store; a non-zero answer stops the open with
     * -EINTR (a program's SIGINT handler sets a flag this returns; the
     * Python binding runs the interpreter's signal handlers here). NULL
     * (default): never asked. */
    int (*interrupted)(void *ctx);
    void *interrupted_ctx;
} dsrt_datastore_options;

/* The defaults: AUTO source, folder-name labels, sub-folders included. */
DSRT_API dsrt_datastore_options dsrt_datastore_defaults(void);

/*
 * Opens the datastore at path with options o (NULL for the defaults).
 * On success *ds holds a new datastore that the caller closes with
 * dsrt_datastore_close. On failure *ds is NULL, the return value is negative
 * and dsrt_last_error() names the file or option at fault. A source with no
 * sample at all fails with DSRT_EEMPTY.
 */
DSRT_API int dsrt_datastore_open(dsrt_datastore **ds, const char *path,
                                 const dsrt_datastore_options *o);

/* Closes a datastore or a view of one. NULL is accepted. */
DSRT_API void dsrt_datastore_close(dsrt_datastore *ds);

DSRT_API dsrt_source dsrt_datastore_source(const dsrt_datastore *ds);

/*
 * Names, as the tools, the Python module and messages spell them: the name
 * of a value ("unknown" for one out of range), and the value of a name (0,
 * or DSRT_EOPTION with the message "'NAME' is not auto, folder, ... or
 * shards", to which the caller adds what was named). Thread-safe.
 */
/* "auto" and the names of DSRT_SOURCES: "folder", "manifest", "idx",
 * "cifar10", "cifar100", "shards". */
DSRT_API const char *dsrt_source_name(dsrt_source s);
DSRT_API int dsrt_source_from_name(const char *name, dsrt_source *s);
/* "folder", "parent", "none". */
DSRT_API const char *dsrt_label_source_name(dsrt_label_source l);
DSRT_API int dsrt_label_source_from_name(const char *name, dsrt_label_source *l);

/* Samples in this datastore (or view). */
DSRT_API size_t dsrt_datastore_count(const dsrt_datastore *ds);

/* Class index of sample i, in [0, dsrt_datastore_num_classes). */
DSRT_API int dsrt_datastore_label(const dsrt_datastore *ds, size_t i);

/*
 * The stable identity of sample i: its position in the datastore as opened,
 * whatever view i was taken through. Random choices for a sample are keyed
 * by it, so augmentation does not depend on the order samples come in.
 */
DSRT_API uint32_t dsrt_datastore_id(const dsrt_datastore *ds, size_t i);

/* 1 when some samples are objects in a store (URLs), 0 when all are local. */
DSRT_API int dsrt_datastore_remote(const dsrt_datastore *ds);

/* The file of sample i, or NULL when the sample is pixels in memory; for a
 * shard set "SHARD:MEMBER", the shard's path (or URL) and the image member's
 * name in it. The string lives as long as the datastore. */
DSRT_API const char *dsrt_datastore_path(const dsrt_datastore *ds, size_t i);

/* For in-memory sources: a read-only view of sample i's pixels (no copy).
 * Returns DSRT_EUNSUPPORTED for samples that are files. */
DSRT_API int dsrt_datastore_pixels(const dsrt_datastore *ds, size_t i, dsrt_image *view);

/* Classes, in class-index order (sorted by name for folders and manifests;
 * the dataset's own order for IDX and CIFAR). */
DSRT_API size_t dsrt_datastore_num_classes(const dsrt_datastore *ds);
DSRT_API const char *dsrt_datastore_class_name(const dsrt_datastore *ds, size_t c);
/* Fills counts[c] with the samples of class c in this datastore or view;
 * counts holds dsrt_datastore_num_classes() entries. */
DSRT_API void dsrt_datastore_class_counts(const dsrt_datastore *ds, size_t *counts);

/* Problems met while opening that did not stop it (a symbolic-link loop, an
 * unreadable folder, a file that is not a regular file), one a line, at most
 * a few lines then a count; "" when there were none. */
DSRT_API const char *dsrt_datastore_warnings(const dsrt_datastore *ds);
DSRT_API size_t dsrt_datastore_warning_count(const dsrt_datastore *ds);

// ----------------------------------------------------------------------------
// Shard sets

/* Shards of the datastore's shard set (every shard of the set, whatever the
 * view; an archive whose members are the samples is a set of one), 0 for
 * other sources. */
DSRT_API size_t dsrt_datastore_shard_count(const dsrt_datastore *ds);
/* The path of shard k, or NULL. */
DSRT_API const char *dsrt_datastore_shard_path(const dsrt_datastore *ds, size_t k);

/* Where a sample of a shard set lies. */
typedef struct {
    size_t shard;       /* index of its shard, for dsrt_datastore_shard_path */
    uint64_t offset;    /* of the image member's data in the shard (of its record, header
                           first, where that is what is read) */
    uint64_t size;      /* bytes of it */
    const char *member; /* the image member's name */
} dsrt_sample_location;

/* Fills *loc for sample i of a shard set (or an archive of members);
 * DSRT_EUNSUPPORTED for other sources. */
DSRT_API int dsrt_datastore_location(const dsrt_datastore *ds, size_t i, dsrt_sample_location *loc);

/* The order a shard set (or any source whose samples are members of
 * larger files) is read in, resolved (EXACT or SHARD), and its shuffle
 * buffer; EXACT for other sources, whose samples are read by position. */
DSRT_API dsrt_shard_order dsrt_datastore_shard_order(const dsrt_datastore *ds);
DSRT_API size_t dsrt_datastore_shuffle_buffer(const dsrt_datastore *ds);
/* "auto", "exact", "shard"; the value of a name as dsrt_source_from_name. */
DSRT_API const char *dsrt_shard_order_name(dsrt_shard_order o);
DSRT_API int dsrt_shard_order_from_name(const char *name, dsrt_shard_order *o);

/* Options of dsrt_shards_write. */
typedef struct {
    /* Bytes a shard holds at most (a shard holds at least one sample).
     * Default 256 MiB. */
    uint64_t shard_bytes;
    /* Samples a shard holds at most; 0 (default): no limit. */
    uint64_t shard_samples;
    /* Overrides the datastore's class names (one per class), or NULL. */
    const char *const *class_names;
} dsrt_shard_write_options;

DSRT_API dsrt_shard_write_options dsrt_shard_write_defaults(void);

/*
 * Writes the samples of ds (any source, any view, in its order) as tar
 * shards out/shard-000000.tar, ...: members <key>.cls (the label, as
 * decimal text) and <key>.jpg or <key>.png (a file's bytes as they are;
 * in-memory pixels encoded as PNG, losslessly), where key is the sample's
 * position zero-padded, then the file's name. Beside them classes.json (the
 * class names, a JSON array) and the index dsrt-shards.index (each sample's
 * shard, offset, size and label; the exact class names). The whole set is
 * written into a hidden staging folder inside out and moved into place only
 * once whole, the index last: a write that fails or is killed leaves the set
 * out held before untouched, and no part of its own that reads as a set.
 * Only what this writer made is ever removed or replaced: out must be empty,
 * absent, or hold only a set it wrote, as the record it keeps there
 * (out/.dsrt-shards-written: each file and its size) lists it; that set is
 * replaced whole. Anything else in out is refused and left alone, as is an
 * out that is, holds or lies inside a folder the samples of ds come from
 * (DSRT_EOPTION, before any work). Entries of out are looked at and removed
 * without following links: one named as the writer names what it makes
 * there but that is not (a link, a folder of the user's) is refused the
 * same way, named, and left alone with whatever it holds or points to. A
 * write locks out (flock) until it is done: a second write into the same
 * folder meanwhile fails at once with -EBUSY, naming it, and changes
 * nothing. A file that cannot be read fails the write with its name.
 * Returns the shards written, or a negative code; *samples (may be NULL)
 * gets the samples written.
 */
DSRT_API int64_t dsrt_shards_write(const dsrt_datastore *ds, const char *out,
                                   const dsrt_shard_write_options *o, uint64_t *samples);

// ----------------------------------------------------------------------------
// Order: views of a datastore. Every function is deterministic for a seed.

/* A view holding positions idx[0..n) of ds, in that order; positions may
 * repeat. Fails with DSRT_EOPTION naming the first position out of range. */
DSRT_API int dsrt_datastore_subset(const dsrt_datastore *ds, const uint32_t *idx, size_t n,
                                   dsrt_datastore **out);

/* MATLAB's splitEachLabel. */
typedef struct {
    double fraction; /* of each label into the first view, in (0, 1] ... */
    size_t count;    /* ... or this many of each label (used when fraction is 0) */
    int randomized;  /* pick at random (seeded) rather than the first ones */
    uint64_t seed;
} dsrt_split_options;

/*
 * Splits ds per label: the first view gets round(fraction * n_c) (or
 * min(count, n_c)) samples of each class c, the second view the rest. Both
 * views keep the order of ds within each part. first or rest may be NULL when
 * the caller does not want that part.
 */
DSRT_API int dsrt_datastore_split_each_label(const dsrt_datastore *ds, const dsrt_split_options *o,
                                             dsrt_datastore **first, dsrt_datastore **rest);

/* A view with the samples of ds in a random order keyed by seed. */
DSRT_API int dsrt_datastore_shuffle(const dsrt_datastore *ds, uint64_t seed, dsrt_datastore **out);

/*
 * Part i of n (0 <= i < n) for rank i of n: contiguous parts whose sizes
 * differ by at most one and that together hold every sample exactly once.
 * For a shard set, parts of whole shards instead: part i holds the samples of
 * the view that lie in a contiguous range of shards, the ranges cut where the
 * counts come closest to even; fails with DSRT_EOPTION when the view's
 * samples lie in fewer shards than n.
 */
DSRT_API int dsrt_datastore_partition(const dsrt_datastore *ds, size_t n, size_t i,
                                      dsrt_datastore **out);

// ----------------------------------------------------------------------------
// Mixing datastores in proportions

/*
 * A mix is a datastore of datastores, as WebDataset's RandomMix and MosaicML
 * Streaming's stream proportions make one: its samples are those of every
 * source, one after another (source 0's, then source 1's, ...), and a
 * pipeline over it draws each epoch's samples from the sources in the
 * proportions of their weights instead of walking them once. Epoch e of
 * `epoch_samples` samples (dsrt_pipeline_options; default: the samples of
 * every source) takes round(epoch_samples * w_k / sum w) samples from
 * source k (largest remainders, so they add up), the sources interleaved
 * in an order shuffled by (seed, epoch). Within a source the draws are
 * without replacement by default: the source is walked in a permutation,
 * and when it is exhausted a fresh one begins (the walk goes on across
 * epochs, so every sample of a source comes once before any comes again);
 * with replacement each draw is uniform over the source. Every draw is a
 * pure function of (seed, epoch): the batches are the same whatever the
 * threads, the parts and a resume, as for any datastore.
 *
 * Classes are merged by name (default): the mix's classes are the union of
 * the sources' class names, sorted, and a sample's label is its class's
 * place among them, so "cat" of two folders is one class. Kept apart, each
 * source's classes come in source order, named "K:NAME" (K the source's
 * number from 0): "0:cat", "1:cat".
 *
 * A mix holds samples that are files, objects or members of shards, of any
 * of those sources together; sources held in memory (IDX, CIFAR) are
 * refused (export them to a folder with dsrt_datastore_export). A mix is a
 * datastore like another: views, partitions and splits of it work (the
 * pipeline draws from the samples of each source that the view holds), but
 * it is not itself mixed again.
 */
typedef enum { DSRT_MIX_LABELS_MERGE = 0, DSRT_MIX_LABELS_SEPARATE } dsrt_mix_labels;

typedef struct {
    /* 1: each draw within a source is uniform, with replacement; 0
     * (default): a source is walked in fresh permutations (see above). */
    int replacement;
    dsrt_mix_labels labels; /* default DSRT_MIX_LABELS_MERGE */
    /* (n) or NULL (default): the augment preset each source's samples are
     * augmented with ("227", "32", "imagenet", "imagenet-val", as
     * dsrt_augment_preset_from_name names them; a NULL entry: the
     * pipeline's own augmentation). A preset gives the source its recipe
     * (crop, resize, flips, colour jitter, erasing); the output size,
     * channels, layout and normalisation stay the pipeline's, so every batch
     * has one shape. The names are copied; dsrt_pipeline_open checks them. */
    const char *const *presets;
} dsrt_mix_options;

/* The defaults: without replacement, classes merged by name. */
DSRT_API dsrt_mix_options dsrt_mix_defaults(void);

/*
 * Makes a mix of sources[0..n) (n >= 2) with weights[0..n) (each >= 0 and
 * finite, not all 0; NULL: each source's share of the samples, as a
 * concatenation) and options o (NULL: the defaults). The sources may be
 * closed afterwards: the mix holds what it needs. Fails with DSRT_EOPTION
 * naming the value (a negative weight, one source), DSRT_EUNSUPPORTED for
 * a source held in memory or a mix. On failure *out is NULL.
 */
DSRT_API int dsrt_datastore_mix(dsrt_datastore **out, dsrt_datastore *const *sources,
                                const double *weights, size_t n, const dsrt_mix_options *o);

/*
 * Opens a mix as the tools describe one: paths[0..npaths) are opened with
 * o and mixed with the weights `mix` gives, either a list "0.7,0.3" (one
 * weight a path) or the path of a mix file, whose lines name the sources
 * themselves (then npaths is 0): "PATH,WEIGHT", blank lines and lines that
 * start with '#' skipped, a relative PATH taken from the file's folder, and
 * an optional third column, the source's augment preset
 * ("PATH,WEIGHT,PRESET": dsrt_mix_options.presets). mix NULL with two paths or more: weights as
 * dsrt_datastore_mix's NULL. One path and no mix opens it as
 * dsrt_datastore_open does (no mix). Errors name the value or the file and
 * line: "mix: 3 weights for 2 sources".
 */
DSRT_API int dsrt_datastore_open_mix(dsrt_datastore **out, const char *const *paths, size_t npaths,
                                     const char *mix, const dsrt_datastore_options *o,
                                     const dsrt_mix_options *mo);

/* Sources of a mix (1 for a datastore that is not one), the source of
 * sample i (0 when not a mix), and source k's weight, normalised to sum 1,
 * its samples in the mix (as made, whatever the view) and replacement.
 * Thread-safe. */
DSRT_API size_t dsrt_datastore_mix_sources(const dsrt_datastore *ds);
DSRT_API size_t dsrt_datastore_mix_source(const dsrt_datastore *ds, size_t i);
DSRT_API double dsrt_datastore_mix_weight(const dsrt_datastore *ds, size_t k);
DSRT_API size_t dsrt_datastore_mix_samples(const dsrt_datastore *ds, size_t k);
DSRT_API int dsrt_datastore_mix_replacement(const dsrt_datastore *ds);
/* Source k's augment preset name (dsrt_mix_options.presets), or NULL: the
 * pipeline's augmentation (and for a datastore that is not a mix). */
DSRT_API const char *dsrt_datastore_mix_preset(const dsrt_datastore *ds, size_t k);
/* "merge", "separate"; the value of a name as dsrt_source_from_name. */
DSRT_API const char *dsrt_mix_labels_name(dsrt_mix_labels l);
DSRT_API int dsrt_mix_labels_from_name(const char *name, dsrt_mix_labels *l);

/*
 * Permutes idx[0..n) in place, keyed by (seed, epoch): the same arguments
 * always give the same order. The pipeline uses it to shuffle every epoch.
 * Thread-safe.
 */
DSRT_API void dsrt_shuffle_indices(uint32_t *idx, size_t n, uint64_t seed, uint64_t epoch);

// ----------------------------------------------------------------------------
// Reading files: io_uring with several reads in flight, or pread.

typedef struct dsrt_reader dsrt_reader;

typedef enum {
    DSRT_IO_AUTO = 0, /* io_uring when the kernel allows it, else pread */
    DSRT_IO_URING,    /* io_uring or fail */
    DSRT_IO_PREAD,
} dsrt_io;

/* Buffers given to a reader with O_DIRECT must be aligned to this, and
 * their capacity a multiple of it. */
#define DSRT_DIRECT_ALIGN 4096

typedef struct {
    dsrt_io io;
    unsigned depth; /* reads in flight at most, 1 to 4096; default 16 */
    /* Open files with O_DIRECT, bypassing the page cache (for datasets
     * larger than memory). Where a file system refuses O_DIRECT the file is
     * read through the cache and the reader counts it. Default 0. */
    int direct;
    dsrt_remote_options remote; /* for paths that are URLs */
} dsrt_reader_options;

DSRT_API dsrt_reader_options dsrt_reader_defaults(void);

/* Creates a reader. With DSRT_IO_AUTO it never fails for want of io_uring:
 * it falls back to pread and dsrt_reader_fallback_reason says why. */
DSRT_API int dsrt_reader_create(dsrt_reader **r, const dsrt_reader_options *o);
/* Waits for reads in flight, then frees the reader. NULL is accepted. */
DSRT_API void dsrt_reader_destroy(dsrt_reader *r);

/* The back-end in use: DSRT_IO_URING or DSRT_IO_PREAD. */
DSRT_API dsrt_io dsrt_reader_io(const dsrt_reader *r);
/* "io_uring", "pread" (or "auto"). */
DSRT_API const char *dsrt_io_name(dsrt_io io);
/* Why io_uring is not in use ("io_uring_queue_init: Operation not
 * permitted"), or NULL when it is, or pread was asked for. */
DSRT_API const char *dsrt_reader_fallback_reason(const dsrt_reader *r);
/* Files that had to be read through the page cache although O_DIRECT was
 * asked for. */
DSRT_API uint64_t dsrt_reader_direct_refused(const dsrt_reader *r);

/* One finished read. */
typedef struct {
    uint64_t tag;     /* as given to dsrt_reader_submit */
    const char *path; /* as given to dsrt_reader_submit */
    void *buf;
    size_t size; /* bytes of the file now in buf; for DSRT_ETOOBIG, the file's size */
    int status;  /* 0, -errno, DSRT_ETOOBIG (file larger than cap), DSRT_EEMPTY */
} dsrt_read_result;

/*
 * Queues a read of the whole file at path into buf (capacity cap bytes).
 * The file is opened at once; with io_uring the reads queued since the last
 * collect go to the kernel together at the next dsrt_reader_collect (one
 * system call for many files), so top the reader up just before collecting.
 * path and buf must stay valid until the read completes. Returns 0, or
 * -EBUSY when depth reads are already in flight (collect one first). Errors
 * of the file itself (missing, unreadable, too large) are not returned here:
 * they arrive as the status of its result, so they can be counted per file.
 */
DSRT_API int dsrt_reader_submit(dsrt_reader *r, const char *path, void *buf, size_t cap,
                                uint64_t tag);

/*
 * Like dsrt_reader_submit, for the bytes [offset, offset + length) of the
 * file or object (length 0: from offset to the end). A range that goes past
 * the end fails with DSRT_ETRUNCATED in its result. Objects are fetched
 * with a ranged GET, files with reads at the offset.
 */
DSRT_API int dsrt_reader_submit_range(dsrt_reader *r, const char *path, uint64_t offset,
                                      uint64_t length, void *buf, size_t cap, uint64_t tag);

/*
 * Collects one finished read into *res. With wait set, blocks until one is
 * done. Returns 1 when *res was filled, 0 when nothing is in flight (or, with
 * wait 0, nothing is done yet), or a negative code when the reader itself
 * failed. A result with a negative status also sets dsrt_last_error() to
 * "read: PATH: reason".
 */
DSRT_API int dsrt_reader_collect(dsrt_reader *r, dsrt_read_result *res, int wait);

/* Reads in flight. */
DSRT_API unsigned dsrt_reader_in_flight(const dsrt_reader *r);

/* Abandons every read in flight: waits for the local reads the kernel holds
 * (it writes into their buffers), drops requests to stores at once. Every
 * buffer given to the reader is free again when it returns. */
DSRT_API void dsrt_reader_cancel(dsrt_reader *r);

/* What a reader's requests to object stores did since it was created. */
typedef struct {
    uint64_t requests;    /* requests finished (a retried one counts once) */
    uint64_t retries;     /* attempts repeated after a throttle, error, reset or stall */
    uint64_t bytes;       /* bytes received for finished requests */
    uint64_t connections; /* connections opened (the rest of the requests reused one) */
    /* Requests in flight summed over time, and the time any was in flight:
     * their ratio is the mean number in flight while the reader fetched. */
    double in_flight_s, busy_s;
    /* With a cache (cache_dir): requests answered from it, and the bytes;
     * requests that went to the store for want of an entry; entries
     * removed to make room. */
    uint64_t cache_hits, cache_bytes, cache_misses, cache_evictions;
} dsrt_remote_stats;

/* Fills *s (zeros when the reader never fetched an object). */
DSRT_API void dsrt_reader_remote_stats(const dsrt_reader *r, dsrt_remote_stats *s);

/* 1 when path is a URL the reader fetches (s3://, http://, https://). */
DSRT_API int dsrt_path_is_url(const char *path);

// ----------------------------------------------------------------------------
// Decoding: JPEG (libjpeg-turbo, with DCT-domain scaling), PNG (libspng) and
// WebP (libwebp): the formats of DSRT_FORMATS.

typedef struct dsrt_decoder dsrt_decoder;

typedef struct {
    /* Refuse images whose header claims more pixels than this (decompression
     * bombs), before any pixel memory is taken. Default 178956970, Pillow's
     * DecompressionBombError threshold. */
    uint64_t max_pixels;
    /* Treat every libjpeg warning (for example "extraneous bytes before
     * marker") as an error. A truncated image is always an error. Default 0. */
    int strict;
} dsrt_decoder_options;

DSRT_API dsrt_decoder_options dsrt_decoder_defaults(void);

/* Creates a decoder: one TurboJPEG handle and scratch memory, for one thread. */
DSRT_API int dsrt_decoder_create(dsrt_decoder **d, const dsrt_decoder_options *o);
DSRT_API void dsrt_decoder_destroy(dsrt_decoder *d);

/* The format of buf from its first bytes; DSRT_FORMAT_UNKNOWN if none. */
DSRT_API dsrt_format dsrt_detect_format(const void *buf, size_t len);

/* Reads the header of the encoded image in buf. Fails with DSRT_EFORMAT,
 * DSRT_ECORRUPT, DSRT_ETRUNCATED, DSRT_EEMPTY, DSRT_ETOOBIG, DSRT_EUNSUPPORTED
 * (lossless or 12-bit JPEG, animated WebP) or -ENOMEM. Palette PNGs report 3
 * channels; WebPs 3, or 4 with alpha (which decoding drops, as PNG's). */
DSRT_API int dsrt_decoder_info(dsrt_decoder *d, const void *buf, size_t len, dsrt_image_info *info);

typedef struct {
    /* 1: gray; 3: RGB (gray images are replicated). Gray from a colour JPEG
     * is the file's own luma (the Y channel, BT.601 like rgb2gray, within a
     * couple of levels of rgb2gray of the decoded RGB); gray from a colour PNG
     * or a WebP is rgb2gray of its pixels. CMYK JPEGs are read as Adobe (Photoshop)
     * writes them, inverted: R = C K / 255. */
    int channels;
    /*
     * The smallest size the caller needs: JPEGs are decoded at the smallest
     * of the scales 1, 1/2, 1/4, 1/8 whose result is still at least
     * min_width x min_height (DCT-domain scaling: the skipped pixels are never
     * computed). 0 x 0 decodes at full size. PNGs and WebPs always decode at full size.
     * (libjpeg's scales 3/8, 5/8, 6/8 and 7/8 are slower than a whole decode
     * and are not used.)
     */
    int min_width, min_height;
    /* Where to write the pixels, rows packed (stride = width * channels), or
     * NULL for the decoder's own scratch memory, valid until its next call.
     * A region decode writes a window no larger than the whole decoded
     * image: dsrt_decode_size's pixels always fit. */
    uint8_t *dst;
    size_t dst_cap;
    /*
     * The part of the image the caller will read, in pixels of the image as
     * stored (full size): columns [region_x, region_x + region_width), rows
     * [region_y, region_y + region_height); a width or height of 0 (default)
     * means every column or row. A JPEG then decodes only what covers it:
     * the result is a window of the scaled image (dsrt_decode_finish says
     * where: dsrt_window) that holds the region, whose pixels
     * inside the region are those of a whole decode, bit for bit (outside
     * it, at the window's edges, they may differ). Rows below the region are
     * not decoded at all (unless the decoder is strict). PNGs and WebPs decode whole.
     */
    int region_x, region_y, region_width, region_height;
    /* 1: with channels 3, an image stored gray (a gray JPEG, a gray PNG of at
     * most 8 bits) comes back gray, 1 channel, for the caller to replicate
     * (dsrt_augment_apply does): no conversion, a third of the memory. */
    int allow_gray;
    /*
     * 1: a JPEG that decodes at 1/8 scale takes each pixel from its 8 x 8
     * block's DC term alone, without libjpeg's entropy decoding (dsrt's own
     * steps over the AC terms, and never reads a progressive file's AC
     * scans): 1.3-2 times as fast. The luma is libjpeg's own 1/8 result,
     * bit for bit (so is gray output, and RGB of JPEGs without chroma
     * subsampling); the chroma of subsampled JPEGs is each chroma block's
     * mean repeated over the pixels it covers, where libjpeg computes a
     * reduced inverse DCT (on photos: 2 levels apart on average, 81% of
     * samples within 2). Files it does not take (arithmetic coding, CMYK,
     * anything irregular) and strict decoders go through libjpeg. Default
     * 0: libjpeg for every scale.
     */
    int dc_eighth;
} dsrt_decode_request;

/* The size dsrt_decode gives for this header and request. */
DSRT_API void dsrt_decode_size(const dsrt_image_info *info, const dsrt_decode_request *req,
                               int *width, int *height);

/*
 * Decodes the image in buf[0..len) as req asks, into *out. On failure
 * returns a negative code and dsrt_last_error() says what went wrong (the
 * caller adds the file name; dsrt_datastore_read_image does). Never reads
 * outside buf, never writes outside the destination.
 */
DSRT_API int dsrt_decode(dsrt_decoder *d, const void *buf, size_t len,
                         const dsrt_decode_request *req, dsrt_image *out);

/*
 * dsrt_decode in two steps, for a caller that chooses the request from the
 * header without it being read twice: dsrt_decode_begin reads the header of
 * buf[0..len) into *info (failing as dsrt_decoder_info does) and keeps the
 * image open; dsrt_decode_finish decodes it as req asks, into *out, sets
 * *win (when not NULL) to where out lies in the decoded image (a window of
 * it when req has a region), and closes the image, whatever the outcome.
 * buf must stay valid and unchanged in between. Another begin, dsrt_decode
 * or dsrt_decoder_info closes an image left open; a finish without an open
 * image fails with DSRT_EOPTION.
 */
DSRT_API int dsrt_decode_begin(dsrt_decoder *d, const void *buf, size_t len, dsrt_image_info *info);
DSRT_API int dsrt_decode_finish(dsrt_decoder *d, const dsrt_decode_request *req, dsrt_image *out,
                                dsrt_window *win);

// ----------------------------------------------------------------------------
// The simple way: sample i, decoded, on the calling thread.

/*
 * Reads (with pread) and decodes sample i of ds, or converts its in-memory
 * pixels, as req asks. Files up to 256 MiB are read into the decoder's
 * scratch. On failure the message names the file: "decode: PATH: reason".
 */
DSRT_API int dsrt_datastore_read_image(const dsrt_datastore *ds, size_t i, dsrt_decoder *d,
                                       const dsrt_decode_request *req, dsrt_image *out);

// ----------------------------------------------------------------------------
// The limit: what one core decodes, and nothing else.

/* What dsrt_datastore_decode_limit measured. */
typedef struct {
    size_t images;           /* files decoded in each pass */
    size_t skipped;          /* files left out: unreadable, not decodable */
    double megapixels;       /* of the images decoded in a pass, at full size */
    double images_per_s;     /* the best pass, wall-clock */
    double megapixels_per_s; /* the same pass */
    /* The best pass in the calling thread's CPU time: the same as
     * images_per_s on an idle core, unmoved by other work on the machine. */
    double cpu_images_per_s;
    double seconds; /* the whole measurement, reading the files included */
} dsrt_decode_limit;

/*
 * The reference an input pipeline is measured against: how fast one core
 * decodes the files of ds at full size to RGB, files already in memory,
 * and does nothing else. JPEGs go through TurboJPEG (tjDecompress2, fast
 * integer DCT: libjpeg-turbo's fastest full-size decode), PNGs and WebPs
 * through the decoder (libspng, libwebp). At most max_images files are taken (0: all), spread
 * evenly over ds, read into memory first (at most 1 GiB of them); then passes passes (at least 1)
 * decode them all on the calling thread, and the best pass's rate is the limit, in wall-clock and
 * in CPU time. Fails with DSRT_EUNSUPPORTED for in-memory sources (no files to decode) and
 * DSRT_EEMPTY when no file decodes.
 */
DSRT_API int dsrt_datastore_decode_limit(const dsrt_datastore *ds, size_t max_images,
                                         unsigned passes, dsrt_decode_limit *out);

// ----------------------------------------------------------------------------
// Writing image folders from in-memory sources.

/*
 * Writes every sample of ds (an IDX or CIFAR datastore) as
 * out/<class name>/<n>.png, n being the sample's position zero-padded to 5
 * digits. class_names, when not NULL, overrides the datastore's class names
 * (one per class; they must be usable as folder names). Existing files are
 * overwritten. Returns the number of images written, or a negative code.
 */
DSRT_API int64_t dsrt_datastore_export(const dsrt_datastore *ds, const char *out,
                                       const char *const *class_names);

/* Encodes img as a PNG file at path (written to a temporary name first and
 * renamed, so a crash never leaves half a file). Not fsync'd: writing many
 * files stays fast; call syncfs(2) or sync(2) after the last for durability. */
DSRT_API int dsrt_png_write(const char *path, const dsrt_image *img);

#ifdef __cplusplus
}
#endif
#endif

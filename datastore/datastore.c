/*
 * The datastore handle: opening a source into an index, the queries on it,
 * the views that the order functions make (split per label, shuffle,
 * partition, subset), and reading one decoded sample on the calling thread.
 *
 * An index is immutable once opened and reference-counted; every view holds a
 * reference and an array of index positions, so splitting a million-sample
 * datastore costs four bytes a sample and copies no path.
 *
 * A path that is a URL opens through the same table: a folder at
 * s3://bucket/prefix is listed (s3_folder.c), a manifest at a URL fetched;
 * the other sources are files only.
 */
#include "datastore/codecs/codecs.h"
#include "datastore/internal.h"
#include "datastore/bytes/http.h"
#include "datastore/shards.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Files larger than this are refused by dsrt_datastore_read_image. */
#define READ_IMAGE_MAX ((size_t)256 << 20)

// ----------------------------------------------------------------------------
// Opening

dsrt_datastore_options dsrt_datastore_defaults(void) {
    dsrt_datastore_options o;
    memset(&o, 0, sizeof o);
    o.source = DSRT_SOURCE_AUTO;
    o.label_source = DSRT_LABEL_FOLDER_NAMES;
    o.include_subfolders = 1;
    o.follow_symlinks = 1;
    o.split = DSRT_SPLIT_TRAIN;
    o.manifest_header = -1;
    o.shard_order = DSRT_SHARD_ORDER_AUTO;
    o.shuffle_buffer = 1000;
    return o;
}

// ----------------------------------------------------------------------------
// The sources: one table of names, recognisers and loaders

/* What detection looks at: a folder, or a file's first bytes, size and name. */
typedef struct {
    const char *path;
    int folder;
    unsigned char head[4];
    size_t got;    /* bytes in head */
    uint64_t size; /* of the file */
    int idx_head;  /* the file starts as an IDX file or a gzip stream does */
} probe;

static int exists_in(const char *dir, const char *name) {
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with_ci(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

static int is_folder(const probe *p) {
    return p->folder;
}

static int is_shards(const probe *p) {
    return dsrt__is_shardset(p->path, p->folder);
}

static int is_manifest(const probe *p) {
    return !p->folder && (ends_with_ci(p->path, ".csv") || ends_with_ci(p->path, ".txt") ||
                          ends_with_ci(p->path, ".lst"));
}

static int is_idx(const probe *p) {
    static const char *const names[] = {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz",
                                        "t10k-images-idx3-ubyte",  "t10k-images-idx3-ubyte.gz",
                                        "train-images.idx3-ubyte", "t10k-images.idx3-ubyte"};
    if (!p->folder) return p->idx_head;
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(names); k++)
        if (exists_in(p->path, names[k])) return 1;
    return 0;
}

/* A CIFAR .bin batch is whole records; an IDX header wins over the size. */
static int is_cifar10(const probe *p) {
    if (p->folder)
        return exists_in(p->path, "batches.meta.txt") || exists_in(p->path, "data_batch_1.bin");
    return !p->idx_head && ends_with_ci(p->path, ".bin") && p->size % 3073 == 0;
}

static int is_cifar100(const probe *p) {
    if (p->folder)
        return exists_in(p->path, "fine_label_names.txt") ||
               (exists_in(p->path, "train.bin") && exists_in(p->path, "test.bin"));
    return !p->idx_head && ends_with_ci(p->path, ".bin") && p->size % 3074 == 0;
}

static int load_cifar10(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    return dsrt__cifar_load(ix, path, DSRT_SOURCE_CIFAR10, o);
}

static int load_cifar100(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    return dsrt__cifar_load(ix, path, DSRT_SOURCE_CIFAR100, o);
}

/* In the order detection tries them: the CIFAR folders' marker files before
 * MNIST names, and a folder of class folders when nothing else matched. */
static const struct {
    dsrt_source kind;
    const char *name;
    int (*detect)(const probe *p);
    int (*load)(dsrt_index *ix, const char *path, const dsrt_datastore_options *o);
    /* The loader for a URL, or NULL when the source must be a local file. */
    int (*load_url)(dsrt_index *ix, const char *url, const dsrt_datastore_options *o);
} SOURCES[] = {
    {DSRT_SOURCE_CIFAR10, "cifar10", is_cifar10, load_cifar10, NULL},
    {DSRT_SOURCE_CIFAR100, "cifar100", is_cifar100, load_cifar100, NULL},
    {DSRT_SOURCE_IDX, "idx", is_idx, dsrt__idx_load, NULL},
    {DSRT_SOURCE_SHARDS, "shards", is_shards, dsrt__shards_load, dsrt__shards_load},
    {DSRT_SOURCE_MANIFEST, "manifest", is_manifest, dsrt__manifest_load,
     dsrt__remote_manifest_load},
    {DSRT_SOURCE_FOLDER, "folder", is_folder, dsrt__folder_load, dsrt__s3_folder_load},
};

/* The kind of source at a URL: a manifest by its name (the query left out),
 * a shard set by its name, or an s3:// prefix holding shards (one listing
 * page looked at), else a folder, which only s3:// can list. */
static int detect_url(const char *url, const dsrt_datastore_options *o, dsrt_source *kind) {
    char name[1024];
    const char *q = strchr(url, '?');
    snprintf(name, sizeof name, "%.*s", (int)(q ? (size_t)(q - url) : strlen(url)), url);
    probe pr = {.path = name};
    if (is_manifest(&pr)) {
        *kind = DSRT_SOURCE_MANIFEST;
        return 0;
    }
    const char *last = strrchr(name, '/');
    if (ends_with_ci(name, ".tar") || (last && strpbrk(last, "*?[{"))) {
        *kind = DSRT_SOURCE_SHARDS; /* a shard, or a glob or brace list of them */
        return 0;
    }
    if (strncasecmp(url, "s3://", 5) == 0) {
        int shards = dsrt__s3_is_shardset(url, o);
        if (shards < 0) return shards;
        *kind = shards ? DSRT_SOURCE_SHARDS : DSRT_SOURCE_FOLDER;
        return 0;
    }
    char display[512];
    dsrt_text_redact(url, display, sizeof display);
    return dsrt__fail(DSRT_EFORMAT,
                      "open: %s: an http(s) URL must name a CSV manifest (.csv, .txt, .lst): "
                      "only s3:// prefixes can be listed as folders",
                      display);
}

const char *dsrt_source_name(dsrt_source s) {
    if (s == DSRT_SOURCE_AUTO) return "auto";
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(SOURCES); k++)
        if (SOURCES[k].kind == s) return SOURCES[k].name;
    return "unknown";
}

int dsrt__detect_source(const char *path, const dsrt_datastore_options *o, dsrt_source *kind) {
    struct stat st;
    probe pr = {.path = path};
    if (dsrt__is_url(path)) return detect_url(path, o, kind);
    if (stat(path, &st) != 0 && strpbrk(path, "*?[{")) {
        /* A pattern: only a shard set is named so. */
        *kind = DSRT_SOURCE_SHARDS;
        return 0;
    }
    if (stat(path, &st) != 0) return dsrt__fail(-errno, "open: %s: %s", path, strerror(errno));
    pr.folder = S_ISDIR(st.st_mode);
    if (!pr.folder) {
        if (!S_ISREG(st.st_mode))
            return dsrt__fail(DSRT_EFORMAT, "open: %s: is %s, neither a folder nor a regular file",
                              path, dsrt__file_kind(st.st_mode));
        int fd, rc = dsrt__open_regular(path, &fd, &st);
        if (rc != 0) return dsrt__fail_prefix(rc, "open");
        ssize_t got = pread(fd, pr.head, sizeof pr.head, 0);
        int e = errno;
        close(fd);
        if (got < 0) return dsrt__fail(-e, "open: %s: %s", path, strerror(e));
        if (got == 0) return dsrt__fail(DSRT_EEMPTY, "open: %s: empty file", path);
        pr.got = (size_t)got;
        pr.size = (uint64_t)st.st_size;
        const unsigned char *h = pr.head;
        pr.idx_head =
            (got >= 2 && h[0] == 0x1f && h[1] == 0x8b) ||
            (got == 4 && h[0] == 0 && h[1] == 0 && h[2] == 0x08 && h[3] >= 1 && h[3] <= 4);
    }
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(SOURCES); k++)
        if (SOURCES[k].detect(&pr)) {
            *kind = SOURCES[k].kind;
            return 0;
        }
    return dsrt__fail(DSRT_EFORMAT,
                      "open: %s: cannot tell the kind of source (expected a folder, a .csv "
                      "manifest, an IDX file, a CIFAR .bin batch or tar shards); set the source "
                      "option",
                      path);
}

static int check_options(const dsrt_datastore_options *o) {
    if ((unsigned)o->source > DSRT_SOURCE_SHARDS)
        return dsrt__fail(DSRT_EOPTION, "datastore: source %d is not a known source", o->source);
    if ((unsigned)o->label_source > DSRT_LABEL_NONE)
        return dsrt__fail(DSRT_EOPTION, "datastore: label_source %d is not a known label source",
                          o->label_source);
    if (o->split != DSRT_SPLIT_TRAIN && o->split != DSRT_SPLIT_TEST)
        return dsrt__fail(DSRT_EOPTION, "datastore: split %d is neither train nor test", o->split);
    if (o->manifest_header < -1 || o->manifest_header > 1)
        return dsrt__fail(DSRT_EOPTION, "datastore: manifest_header %d is not -1, 0 or 1",
                          o->manifest_header);
    if ((unsigned)o->shard_order > DSRT_SHARD_ORDER_SHARD)
        return dsrt__fail(DSRT_EOPTION, "datastore: shard_order %d is not auto, exact or shard",
                          (int)o->shard_order);
    if (o->shuffle_buffer > ((size_t)1 << 24))
        return dsrt__fail(DSRT_EOPTION,
                          "datastore: shuffle_buffer %zu is not in [1, 2^24] (0: the default)",
                          o->shuffle_buffer);
    dsrt_remote_options ro;
    return dsrt__remote_opening_options(o, &ro);
}

int dsrt_datastore_open(dsrt_datastore **ds, const char *path, const dsrt_datastore_options *o) {
    dsrt_datastore_options defaults = dsrt_datastore_defaults();
    dsrt_index *ix = NULL;
    int rc;
    *ds = NULL;
    if (!o) o = &defaults;
    if (!path || !*path) return dsrt__fail(DSRT_EOPTION, "datastore: no path given");
    if ((rc = check_options(o)) != 0) return rc;

    dsrt_source kind = o->source;
    if (kind == DSRT_SOURCE_AUTO && (rc = dsrt__detect_source(path, o, &kind)) != 0) return rc;

    ix = dsrt__index_new(kind);
    if (!ix) return -ENOMEM;
    size_t k = 0;
    while (k < DSRT_ARRAY_SIZE(SOURCES) && SOURCES[k].kind != kind) k++;
    if (k == DSRT_ARRAY_SIZE(SOURCES))
        rc = dsrt__fail(DSRT_EOPTION, "datastore: unknown source");
    else if (!dsrt__is_url(path))
        rc = SOURCES[k].load(ix, path, o);
    else if (SOURCES[k].load_url &&
             (kind != DSRT_SOURCE_FOLDER || strncasecmp(path, "s3://", 5) == 0))
        rc = SOURCES[k].load_url(ix, path, o);
    else
        rc = dsrt__fail(DSRT_EUNSUPPORTED,
                        "datastore: a %s source cannot be read from a URL (folders from s3:// "
                        "prefixes and manifests can): copy it to a local file",
                        dsrt_source_name(kind));
    if (rc != 0) goto fail;
    ix->source = kind;
    if (ix->n == 0) {
        rc = dsrt__fail(DSRT_EEMPTY, "datastore: %s: no samples found (%s source%s)", path,
                        dsrt_source_name(kind),
                        kind == DSRT_SOURCE_FOLDER ? "; check the extensions option" : "");
        goto fail;
    }
    if (ix->n > UINT32_MAX) {
        rc = dsrt__fail(DSRT_ETOOBIG, "datastore: %s: %zu samples, more than 2^32-1", path, ix->n);
        goto fail;
    }
    if ((rc = dsrt__view_new(ix, NULL, ix->n, ds)) != 0) goto fail;
    return 0;
fail:
    dsrt__index_free(ix);
    return rc;
}

// ----------------------------------------------------------------------------
// Parts

int dsrt_datastore_partition(const dsrt_datastore *ds, size_t n, size_t i, dsrt_datastore **out) {
    *out = NULL;
    if (n == 0 || i >= n)
        return dsrt__fail(DSRT_EOPTION, "partition: part %zu of %zu does not exist", i, n);
    uint32_t *order;
    size_t count;
    int rc = dsrt__shardset_of(ds->index) ? dsrt__shards_partition(ds, n, i, &order, &count)
                                          : dsrt__view_ranges(ds, n, i, &order, &count);
    return rc ? rc : dsrt__view_new(ds->index, order, count, out);
}

// ----------------------------------------------------------------------------
// One decoded sample, on the calling thread

/* An object at a URL, fetched whole into the decoder's file buffer. */
static int read_url(const char *url, dsrt_decoder *d, uint8_t **data, size_t *size) {
    uint8_t *tmp;
    size_t len;
    int rc = dsrt__remote_read_whole(url, READ_IMAGE_MAX, &tmp, &len);
    if (rc != 0) return dsrt__fail_prefix(rc, "read");
    uint8_t *buf = dsrt__decoder_file_buffer(d, len ? len : 1);
    if (buf) memcpy(buf, tmp, len);
    free(tmp);
    if (!buf) return -ENOMEM;
    *data = buf;
    *size = len;
    return 0;
}

static int read_file(const char *path, dsrt_decoder *d, uint8_t **data, size_t *size) {
    int rc, fd;
    struct stat st;
    if (dsrt__is_url(path)) return read_url(path, d, data, size);
    if ((rc = dsrt__open_regular(path, &fd, &st)) != 0) return dsrt__fail_prefix(rc, "read");
    if (st.st_size == 0) {
        rc = dsrt__fail(DSRT_EEMPTY, "read: %s: empty file", path);
        goto out;
    }
    if ((uint64_t)st.st_size > READ_IMAGE_MAX) {
        rc = dsrt__fail(DSRT_ETOOBIG, "read: %s: %lld bytes, more than %zu", path,
                        (long long)st.st_size, READ_IMAGE_MAX);
        goto out;
    }
    uint8_t *buf = dsrt__decoder_file_buffer(d, (size_t)st.st_size);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    size_t got = 0, want = (size_t)st.st_size;
    while (got < want) {
        ssize_t r = pread(fd, buf + got, want - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = dsrt__fail(-errno, "read: %s: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    *data = buf;
    *size = got;
    rc = 0;
out:
    close(fd);
    return rc;
}

/* Converts in-memory pixels to the channels asked, into dst or the scratch. */
static int convert_pixels(const dsrt_image *src, dsrt_decoder *d, const dsrt_decode_request *req,
                          dsrt_image *out) {
    int ch = req->channels == 3 && req->allow_gray && src->channels == 1 ? 1 : req->channels;
    size_t pixels = (size_t)src->width * src->height, bytes = pixels * (size_t)ch;
    uint8_t *dst = req->dst;
    if (dst && req->dst_cap < bytes)
        return dsrt__fail(DSRT_ETOOBIG, "decode: destination holds %zu bytes, image needs %zu",
                          req->dst_cap, bytes);
    if (!dst && !(dst = dsrt__decoder_pixel_buffer(d, bytes))) return -ENOMEM;
    if (ch == src->channels)
        memcpy(dst, src->data, bytes);
    else if (ch == 1)
        dsrt__rgb_to_gray(src->data, dst, pixels);
    else
        dsrt__gray_to_rgb(src->data, dst, pixels);
    out->data = dst;
    out->width = src->width;
    out->height = src->height;
    out->channels = ch;
    out->stride = (size_t)src->width * ch;
    return 0;
}

/* The bytes of shard sample i into the decoder's file buffer. */
static int read_member(const dsrt_datastore *ds, size_t i, dsrt_decoder *d, uint8_t **data,
                       size_t *size) {
    size_t want = (size_t)dsrt__shard_sample_size(ds, (uint32_t)i);
    if (want > READ_IMAGE_MAX)
        return dsrt__fail(DSRT_ETOOBIG, "read: %s: %zu bytes, more than %zu",
                          dsrt_datastore_path(ds, i), want, READ_IMAGE_MAX);
    uint8_t *buf = dsrt__decoder_file_buffer(d, want);
    if (!buf) return -ENOMEM;
    *data = buf;
    *size = want;
    return dsrt__shard_member_read(ds, (uint32_t)i, buf, NULL);
}

int dsrt_datastore_read_image(const dsrt_datastore *ds, size_t i, dsrt_decoder *d,
                              const dsrt_decode_request *req, dsrt_image *out) {
    if (i >= ds->n)
        return dsrt__fail(DSRT_EOPTION, "read: sample %zu out of range (%zu samples)", i, ds->n);
    if (req->channels != 1 && req->channels != 3)
        return dsrt__fail(DSRT_EOPTION, "decode: channels must be 1 or 3, not %d", req->channels);
    if (ds->index->pixels) {
        dsrt_image view;
        dsrt_datastore_pixels(ds, i, &view);
        return convert_pixels(&view, d, req, out);
    }
    const char *path = dsrt_datastore_path(ds, i);
    uint8_t *data = NULL;
    size_t size = 0;
    int rc = dsrt__shardset_of(ds->index) ? read_member(ds, i, d, &data, &size)
                                          : read_file(path, d, &data, &size);
    if (rc != 0) return rc;
    rc = dsrt_decode(d, data, size, req, out);
    if (rc != 0) {
        /* "decode: reason" from the decoder becomes "decode: PATH: reason". */
        const char *msg = dsrt_last_error();
        if (strncmp(msg, "decode: ", 8) == 0) msg += 8;
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", msg);
        return dsrt__fail(rc, "decode: %s: %s", path, reason[0] ? reason : dsrt_strerror(rc));
    }
    return 0;
}

/*
 * IDX sources: MNIST, Fashion-MNIST and any other data set stored as a pair
 * of IDX files, an idx3 file of images (n, height, width) and an idx1 file of
 * labels (n), either raw or gzip-compressed as they are distributed.
 *
 * An IDX file is two zero bytes, an element-type byte, a dimension count,
 * the dimensions as big-endian 32-bit words, then the elements. Only unsigned
 * bytes (type 0x08) are taken: every image set in this format is stored so.
 * The parser is strict about the length: the data must be exactly the
 * product of the dimensions. Fewer bytes is a truncated file; more bytes is
 * an error too, because it means the header does not describe the data (a
 * wrong element type or two files glued together), and reading it anyway
 * would give shifted images with plausible-looking labels.
 *
 * The whole data set is held in memory: the images file's data is already
 * the (n, height, width, 1) HWC layout the index wants, so after inflating
 * it is moved to the front of its buffer and handed to the index as is.
 */
#include "datastore/sources/idx/idx.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* Largest IDX file (compressed or not) and largest decoded data we accept. */
#define IDX_MAX_BYTES ((size_t)8 << 30)

/* zlib counts in unsigned int; feed it at most this much at a time. */
#define ZCHUNK ((size_t)1 << 30)

/* Deflate cannot expand data by more than about 1032:1; a bound for the
 * size hint of a gzip trailer, so a forged trailer cannot make us allocate
 * gigabytes for a few bytes of input. */
#define DEFLATE_MAX_RATIO 1032

// ----------------------------------------------------------------------------
// gzip

static uint32_t load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t load_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The first output capacity: the last member's ISIZE (the whole size for the
 * usual single-member file), bounded by what the input could possibly give. */
static size_t gunzip_first_cap(const uint8_t *buf, size_t len, size_t limit) {
    size_t hint = len >= 18 ? load_le32(buf + len - 4) : 0;
    size_t bound =
        len > (SIZE_MAX - 4096) / DEFLATE_MAX_RATIO ? SIZE_MAX : len * DEFLATE_MAX_RATIO + 4096;
    hint = DSRT_MIN(hint, bound);
    /* One byte more than the hint, so that a stream of exactly that size ends
     * without another round of growth. */
    hint = hint < SIZE_MAX ? hint + 1 : hint;
    hint = DSRT_MAX(hint, (size_t)4096);
    return DSRT_MIN(hint, limit);
}

/* Inflates buf into a new buffer of at most max bytes. With prefix set, stops
 * without error after the first max bytes (fewer when the stream is shorter):
 * enough to read a header without inflating what follows. */
static int gunzip_run(const uint8_t *buf, size_t len, const char *name, size_t max, int prefix,
                      uint8_t **out, size_t *out_len) {
    z_stream zs;
    uint8_t *dst = NULL;
    size_t cap = 0, have = 0, in_pos = 0;
    /* One byte past max, so that "exactly max bytes" and "more than max"
     * can be told apart. */
    size_t limit = prefix ? max : max < SIZE_MAX ? max + 1 : max;
    int rc = 0;

    *out = NULL;
    *out_len = 0;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 15 + 16) != Z_OK)
        return dsrt__fail(-ENOMEM, "gzip: %s: cannot start zlib's inflate", name);

    for (;;) {
        if (zs.avail_in == 0 && in_pos < len) {
            size_t chunk = DSRT_MIN(len - in_pos, ZCHUNK);
            zs.next_in = (Bytef *)(buf + in_pos);
            zs.avail_in = (uInt)chunk;
            in_pos += chunk;
        }
        if (have == cap) {
            if (prefix && have == limit && have > 0) break;
            if (cap >= limit) {
                rc =
                    dsrt__fail(DSRT_ETOOBIG,
                               "gzip: %s: inflates to more than the limit of %zu bytes", name, max);
                goto fail;
            }
            size_t ncap = cap == 0          ? gunzip_first_cap(buf, len, limit)
                          : cap > limit / 2 ? limit
                                            : cap * 2;
            uint8_t *p = dsrt__realloc(dst, ncap);
            if (!p) {
                rc = -ENOMEM;
                goto fail;
            }
            dst = p;
            cap = ncap;
        }
        size_t room = DSRT_MIN(cap - have, ZCHUNK);
        zs.next_out = dst + have;
        zs.avail_out = (uInt)room;
        int zrc = inflate(&zs, Z_NO_FLUSH);
        have += room - zs.avail_out;

        if (zrc == Z_STREAM_END) {
            /* The next unread byte. Another gzip member may follow (files
             * made with cat a.gz b.gz); zero padding after the last one is
             * ignored, as gzip itself does; anything else is an error. */
            size_t next = in_pos - zs.avail_in, rest = len - next;
            if (rest == 0) break;
            if (rest >= 2 && buf[next] == 0x1f && buf[next + 1] == 0x8b) {
                if (inflateReset(&zs) != Z_OK) {
                    rc = dsrt__fail(DSRT_ECORRUPT, "gzip: %s: cannot restart inflate", name);
                    goto fail;
                }
                continue;
            }
            size_t z = next;
            while (z < len && buf[z] == 0) z++;
            if (z == len) break;
            rc = dsrt__fail(DSRT_ECORRUPT,
                            "gzip: %s: %zu bytes after the end of the compressed data are not "
                            "another gzip member",
                            name, rest);
            goto fail;
        }
        if (zrc == Z_OK) continue;
        if (zrc == Z_BUF_ERROR) {
            if (zs.avail_out == 0) continue; /* output full: grow and go on */
            if (zs.avail_in == 0 && in_pos == len) {
                rc = dsrt__fail(DSRT_ETRUNCATED,
                                "gzip: %s: truncated: the compressed data end after %zu bytes "
                                "of output",
                                name, have);
                goto fail;
            }
            continue;
        }
        if (zrc == Z_MEM_ERROR) {
            rc = dsrt__fail(-ENOMEM, "gzip: %s: out of memory in inflate", name);
            goto fail;
        }
        rc = dsrt__fail(DSRT_ECORRUPT,
                        "gzip: %s: corrupt compressed data after %zu bytes of output: %s", name,
                        have, zs.msg ? zs.msg : "inflate failed");
        goto fail;
    }
    if (have > max) {
        rc = dsrt__fail(DSRT_ETOOBIG, "gzip: %s: inflates to more than the limit of %zu bytes",
                        name, max);
        goto fail;
    }
    inflateEnd(&zs);
    *out = dst;
    *out_len = have;
    return 0;
fail:
    inflateEnd(&zs);
    free(dst);
    return rc;
}

int dsrt__gunzip(const uint8_t *buf, size_t len, const char *name, size_t max, uint8_t **out,
                 size_t *out_len) {
    return gunzip_run(buf, len, name, max, 0, out, out_len);
}

// ----------------------------------------------------------------------------
// IDX parsing

static const char *idx_type_name(unsigned t) {
    switch (t) {
    case 0x08:
        return "unsigned byte";
    case 0x09:
        return "signed byte";
    case 0x0B:
        return "16-bit integer";
    case 0x0C:
        return "32-bit integer";
    case 0x0D:
        return "32-bit float";
    case 0x0E:
        return "64-bit float";
    }
    return "unknown type";
}

/* "60000 x 28 x 28" */
static const char *idx_dims_str(const uint32_t *dims, int ndim, char *s, size_t cap) {
    size_t at = 0;
    s[0] = '\0';
    for (int d = 0; d < ndim && at < cap; d++)
        at += (size_t)snprintf(s + at, cap - at, d ? " x %u" : "%u", dims[d]);
    return s;
}

/* Reads the header at buf (len bytes, possibly only the start of the file):
 * the dimensions into out, the header's length into *header and the data's
 * into *size. */
static int idx_header(const uint8_t *buf, size_t len, const char *name, size_t max_bytes,
                      dsrt_idx *out, size_t *header, size_t *size) {
    char dims[64];
    if (len < 4)
        return dsrt__fail(DSRT_ETRUNCATED, "idx: %s: %zu bytes, too short for an IDX header", name,
                          len);
    if (buf[0] != 0 || buf[1] != 0)
        return dsrt__fail(DSRT_EFORMAT,
                          "idx: %s: not an IDX file: it starts with %02x %02x, not with two zero "
                          "bytes",
                          name, buf[0], buf[1]);
    if (buf[2] != 0x08)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "idx: %s: element type 0x%02x (%s) is not supported; only 0x08 "
                          "(unsigned byte) is",
                          name, buf[2], idx_type_name(buf[2]));
    int ndim = buf[3];
    if (ndim == 0 || ndim > 4)
        return dsrt__fail(ndim ? DSRT_EUNSUPPORTED : DSRT_ECORRUPT,
                          "idx: %s: %d dimensions; 1 to 4 are supported", name, ndim);
    *header = 4 + 4 * (size_t)ndim;
    if (len < *header)
        return dsrt__fail(DSRT_ETRUNCATED, "idx: %s: truncated in the header (%zu bytes)", name,
                          len);
    size_t n = 1;
    int overflow = 0;
    for (int d = 0; d < ndim; d++) {
        out->dims[d] = load_be32(buf + 4 + 4 * d);
        overflow |= __builtin_mul_overflow(n, (size_t)out->dims[d], &n);
    }
    out->ndim = ndim;
    idx_dims_str(out->dims, ndim, dims, sizeof dims);
    if (overflow)
        return dsrt__fail(DSRT_ETOOBIG, "idx: %s: dimensions %s: the size overflows", name, dims);
    if (n > max_bytes)
        return dsrt__fail(DSRT_ETOOBIG,
                          "idx: %s: dimensions %s make %zu bytes, more than the limit of %zu", name,
                          dims, n, max_bytes);
    *size = n;
    return 0;
}

int dsrt__idx_parse(const uint8_t *buf, size_t len, const char *name, size_t max_bytes,
                    dsrt_idx *out) {
    uint8_t *raw = NULL; /* the inflated file, when it was gzip */
    char dims[64];
    size_t header = 0, size = 0;
    int rc;

    memset(out, 0, sizeof *out);
    if (len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b) {
        /* The header first, from the first inflated bytes; then the data,
         * never more than the header declares (and one byte, to tell a
         * longer stream): a small file whose header claims little cannot
         * inflate to gigabytes. */
        size_t head_len;
        if ((rc = gunzip_run(buf, len, name, 4 + 4 * 4, 1, &raw, &head_len)) != 0) return rc;
        rc = idx_header(raw, head_len, name, max_bytes, out, &header, &size);
        free(raw);
        raw = NULL;
        if (rc != 0) goto fail;
        size_t raw_len;
        rc = gunzip_run(buf, len, name, header + size, 0, &raw, &raw_len);
        if (rc == DSRT_ETOOBIG) {
            idx_dims_str(out->dims, out->ndim, dims, sizeof dims);
            rc = dsrt__fail(DSRT_ECORRUPT,
                            "idx: %s: the compressed data hold more than the %zu bytes of data "
                            "that dimensions %s describe",
                            name, size, dims);
        }
        if (rc != 0) goto fail;
        buf = raw;
        len = raw_len;
    }
    if ((rc = idx_header(buf, len, name, max_bytes, out, &header, &size)) != 0) goto fail;
    idx_dims_str(out->dims, out->ndim, dims, sizeof dims);
    size_t avail = len - header;
    if (avail < size) {
        rc =
            dsrt__fail(DSRT_ETRUNCATED,
                       "idx: %s: truncated: dimensions %s need %zu bytes of data, the file has %zu",
                       name, dims, size, avail);
        goto fail;
    }
    if (avail > size) {
        rc =
            dsrt__fail(DSRT_ECORRUPT,
                       "idx: %s: %zu bytes after the %zu bytes of data that dimensions %s describe",
                       name, avail - size, size, dims);
        goto fail;
    }
    if (raw) {
        memmove(raw, raw + header, size);
        out->data = raw;
        raw = NULL;
    } else {
        out->data = dsrt__malloc(size);
        if (!out->data) {
            rc = -ENOMEM;
            goto fail;
        }
        memcpy(out->data, buf + header, size);
    }
    out->size = size;
    return 0;
fail:
    free(raw);
    out->data = NULL;
    out->size = 0;
    return rc;
}

// ----------------------------------------------------------------------------
// Finding the files

/* Fashion-MNIST's classes, in label order, spelled so they can be folder names. */
static const char *const fashion_names[10] = {
    "tshirt_top", "trouser", "pullover", "dress", "coat",
    "sandal",     "shirt",   "sneaker",  "bag",   "ankle_boot",
};

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/*
 * The files of a split in an MNIST-style folder: "<prefix>-<kind>-idx3-ubyte"
 * with the dash or dot spelling, raw or .gz. Writes the first that exists
 * into p. kind is "images-idx3" or "labels-idx1".
 */
static int find_in_folder(const char *dir, dsrt_split split, const char *kind, char *p,
                          size_t cap) {
    static const char *const train[] = {"train"}, *const test[] = {"t10k", "test"};
    const char *const *prefixes = split == DSRT_SPLIT_TEST ? test : train;
    size_t np = split == DSRT_SPLIT_TEST ? DSRT_ARRAY_SIZE(test) : DSRT_ARRAY_SIZE(train);
    static const char *const seps[] = {"-", "."}, *const exts[] = {"", ".gz"};
    for (size_t i = 0; i < np; i++)
        for (size_t s = 0; s < 2; s++)
            for (size_t e = 0; e < 2; e++) {
                /* kind is "images-idx3": replace its dash by the separator. */
                snprintf(p, cap, "%s/%s-%.6s%s%s-ubyte%s", dir, prefixes[i], kind, seps[s],
                         kind + 7, exts[e]);
                if (is_file(p)) return 0;
            }
    snprintf(p, cap, "%s", "");
    return dsrt__fail(-ENOENT, "idx: %s: no %s-%s-ubyte[.gz] in this folder", dir, prefixes[0],
                      kind);
}

/*
 * The labels file that goes with an images file: "images-idx3" (or
 * "images.idx3") in the file name becomes "labels-idx1"; when that file does
 * not exist, the name with ".gz" added or removed, then the other separator.
 */
static int derive_labels_path(const char *images, char *p, size_t cap) {
    const char *base = strrchr(images, '/');
    base = base ? base + 1 : images;
    const char *at = NULL;
    for (const char *s = base; (s = strstr(s, "images")) != NULL; s++)
        if ((s[6] == '-' || s[6] == '.') && strncmp(s + 7, "idx3", 4) == 0) at = s;
    if (!at)
        return dsrt__fail(DSRT_EOPTION,
                          "idx: %s: cannot derive the labels file from this name (no "
                          "\"images-idx3\" in it); set labels_path",
                          images);
    size_t head = (size_t)(at - images);
    const char *tail = at + 11; /* after "images-idx3" */
    int gz = ends_with(tail, ".gz");
    size_t tail_len = strlen(tail) - (gz ? 3 : 0);
    const char seps[2] = {at[6], at[6] == '-' ? '.' : '-'};
    for (int s = 0; s < 2; s++)
        for (int g = 0; g < 2; g++) {
            int with_gz = g ? !gz : gz;
            int n = snprintf(p, cap, "%.*slabels%cidx1%.*s%s", (int)head, images, seps[s],
                             (int)tail_len, tail, with_gz ? ".gz" : "");
            if (n < 0 || (size_t)n >= cap)
                return dsrt__fail(-ENAMETOOLONG, "idx: %s: path too long", images);
            if (is_file(p)) return 0;
        }
    snprintf(p, cap, "%.*slabels%cidx1%.*s%s", (int)head, images, seps[0], (int)tail_len, tail,
             gz ? ".gz" : "");
    return dsrt__fail(-ENOENT,
                      "idx: %s: the labels file %s does not exist (with or without .gz); "
                      "set labels_path",
                      images, p);
}

static int read_idx(const char *path, dsrt_idx *out) {
    uint8_t *buf = NULL;
    size_t len;
    memset(out, 0, sizeof *out);
    int rc = dsrt__read_whole_file(path, IDX_MAX_BYTES, &buf, &len);
    if (rc != 0) return dsrt__fail_prefix(rc, "idx");
    rc = dsrt__idx_parse(buf, len, path, IDX_MAX_BYTES, out);
    free(buf);
    return rc;
}

/* Fashion-MNIST is told from MNIST by its name: "fashion" anywhere in the
 * path given, the files' paths, or the real path of the folder. */
static int is_fashion(const char *path, const char *images, const char *labels) {
    if (strcasestr(path, "fashion") || strcasestr(images, "fashion") ||
        strcasestr(labels, "fashion"))
        return 1;
    char *real = realpath(path, NULL);
    int yes = real && strcasestr(real, "fashion");
    free(real);
    return yes;
}

// ----------------------------------------------------------------------------
// Loading

int dsrt__idx_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    char images[PATH_MAX], labels[PATH_MAX], dims[64];
    dsrt_idx img = {0}, lab = {0};
    dsrt_split split = o ? o->split : DSRT_SPLIT_TRAIN;
    const char *labels_opt = o ? o->labels_path : NULL;
    struct stat st;
    int rc;

    if (stat(path, &st) != 0) return dsrt__fail(-errno, "idx: %s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return dsrt__fail(DSRT_EFORMAT, "idx: %s: is %s, neither a folder nor a regular file", path,
                          dsrt__file_kind(st.st_mode));
    if (S_ISDIR(st.st_mode)) {
        if ((rc = find_in_folder(path, split, "images-idx3", images, sizeof images)) != 0)
            return rc;
        if (labels_opt)
            snprintf(labels, sizeof labels, "%s", labels_opt);
        else if ((rc = find_in_folder(path, split, "labels-idx1", labels, sizeof labels)) != 0)
            return rc;
    } else {
        if (strlen(path) >= sizeof images)
            return dsrt__fail(-ENAMETOOLONG, "idx: %s: path too long", path);
        snprintf(images, sizeof images, "%s", path);
        if (labels_opt)
            snprintf(labels, sizeof labels, "%s", labels_opt);
        else if ((rc = derive_labels_path(images, labels, sizeof labels)) != 0)
            return rc;
    }

    if ((rc = read_idx(images, &img)) != 0) goto fail;
    if (img.ndim != 3) {
        rc = dsrt__fail(DSRT_ECORRUPT,
                        "idx: %s: images must have 3 dimensions (n, height, width), not %d (%s)",
                        images, img.ndim, idx_dims_str(img.dims, img.ndim, dims, sizeof dims));
        goto fail;
    }
    if (img.dims[1] == 0 || img.dims[2] == 0 || img.dims[1] > INT_MAX || img.dims[2] > INT_MAX) {
        rc = dsrt__fail(DSRT_ECORRUPT, "idx: %s: images of %u x %u pixels", images, img.dims[1],
                        img.dims[2]);
        goto fail;
    }
    if ((rc = read_idx(labels, &lab)) != 0) goto fail;
    if (lab.ndim != 1) {
        rc = dsrt__fail(DSRT_ECORRUPT, "idx: %s: labels must have 1 dimension (n), not %d (%s)",
                        labels, lab.ndim, idx_dims_str(lab.dims, lab.ndim, dims, sizeof dims));
        goto fail;
    }
    if (lab.dims[0] != img.dims[0]) {
        rc = dsrt__fail(DSRT_ECORRUPT, "idx: %s has %u images but %s has %u labels", images,
                        img.dims[0], labels, lab.dims[0]);
        goto fail;
    }

    size_t n = img.dims[0];
    ix->labels = dsrt__malloc(n * sizeof *ix->labels);
    if (!ix->labels) {
        rc = -ENOMEM;
        goto fail;
    }
    /* Labels are unsigned bytes, so always below 256. */
    unsigned max_label = 0;
    for (size_t i = 0; i < n; i++) {
        ix->labels[i] = lab.data[i];
        if (lab.data[i] > max_label) max_label = lab.data[i];
    }
    ix->source = DSRT_SOURCE_IDX;
    ix->n = n;
    ix->pixels = img.data; /* (n, height, width, 1): IDX order is already HWC */
    img.data = NULL;
    ix->height = (int)img.dims[1];
    ix->width = (int)img.dims[2];
    ix->channels = 1;

    size_t num_classes = n ? (size_t)max_label + 1 : 0;
    const char *names[256];
    char digits[256][4];
    int fashion = num_classes <= DSRT_ARRAY_SIZE(fashion_names) && is_fashion(path, images, labels);
    for (size_t c = 0; c < num_classes; c++) {
        snprintf(digits[c], sizeof digits[c], "%zu", c);
        names[c] = fashion ? fashion_names[c] : digits[c];
    }
    rc = dsrt__index_set_classes(ix, names, num_classes);
fail:
    free(img.data);
    free(lab.data);
    return rc;
}

// ----------------------------------------------------------------------------
// The source

/* An IDX images file (its first bytes: gzip or IDX magic), or a folder of
 * MNIST-named ones. */
static int detect(const dsrt_probe *p) {
    static const char *const names[] = {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz",
                                        "t10k-images-idx3-ubyte",  "t10k-images-idx3-ubyte.gz",
                                        "train-images.idx3-ubyte", "t10k-images.idx3-ubyte"};
    if (!p->exists) return 0;
    if (!p->folder) return p->idx_head;
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(names); k++)
        if (dsrt__has_file(p->path, names[k])) return 1;
    return 0;
}

const dsrt_source_ops dsrt__source_idx = {
    .kind = DSRT_SOURCE_IDX,
    .what = "an IDX file",
    .detect = detect,
    .open = dsrt__idx_load,
};

/*
 * CIFAR sources: the binary versions of CIFAR-10 and CIFAR-100, as their
 * authors distribute them (cifar-10-batches-bin, cifar-100-binary).
 *
 * A batch file is a run of fixed-size records: one label byte (CIFAR-10) or
 * two (CIFAR-100: coarse, then fine), then a 32x32 colour image stored plane
 * by plane (1024 red bytes, 1024 green, 1024 blue). The index keeps pixels
 * interleaved (HWC), like every decoded image, so the planes are interleaved
 * once at open. Class names come from the text files beside the batches, one
 * name a line; without them the classes are named by their number.
 *
 * The parser checks every label before it touches the index, so a corrupt
 * batch leaves the index as it was.
 */
#include "datastore/sources/cifar/cifar.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CIFAR_SIDE   32
#define CIFAR_PLANE  (CIFAR_SIDE * CIFAR_SIDE)
#define CIFAR_PIXELS (3 * CIFAR_PLANE)

/* Largest batch file we read (CIFAR-100's train.bin is 154 MB). */
#define CIFAR_MAX_FILE ((size_t)4 << 30)
/* Largest class-names file. */
#define CIFAR_MAX_NAMES ((size_t)1 << 20)

// ----------------------------------------------------------------------------
// Parsing a batch

static size_t label_bytes(dsrt_source kind) {
    return kind == DSRT_SOURCE_CIFAR100 ? 2 : 1;
}

static size_t class_count(dsrt_source kind, int coarse) {
    return kind == DSRT_SOURCE_CIFAR10 ? 10 : coarse ? 20 : 100;
}

int dsrt__cifar_parse(dsrt_index *ix, const uint8_t *buf, size_t len, const char *name,
                      dsrt_source kind, int coarse) {
    if (kind != DSRT_SOURCE_CIFAR10 && kind != DSRT_SOURCE_CIFAR100)
        return dsrt__fail(DSRT_EOPTION, "cifar: %s: source %d is neither CIFAR-10 nor CIFAR-100",
                          name, (int)kind);
    const size_t nl = label_bytes(kind), rec = nl + CIFAR_PIXELS;
    if (len % rec != 0)
        return dsrt__fail(DSRT_ECORRUPT,
                          "cifar: %s: %zu bytes is not a whole number of %zu-byte %s records "
                          "(%zu records and %zu bytes over)",
                          name, len, rec, kind == DSRT_SOURCE_CIFAR10 ? "CIFAR-10" : "CIFAR-100",
                          len / rec, len % rec);
    const size_t count = len / rec;

    for (size_t r = 0; r < count; r++) {
        const uint8_t *l = buf + r * rec;
        if (kind == DSRT_SOURCE_CIFAR10 && l[0] >= 10)
            return dsrt__fail(DSRT_ECORRUPT,
                              "cifar: %s: record %zu has label %u; CIFAR-10 labels are 0 to 9",
                              name, r, l[0]);
        if (kind == DSRT_SOURCE_CIFAR100 && l[0] >= 20)
            return dsrt__fail(DSRT_ECORRUPT,
                              "cifar: %s: record %zu has coarse label %u; CIFAR-100 coarse labels "
                              "are 0 to 19",
                              name, r, l[0]);
        if (kind == DSRT_SOURCE_CIFAR100 && l[1] >= 100)
            return dsrt__fail(DSRT_ECORRUPT,
                              "cifar: %s: record %zu has fine label %u; CIFAR-100 fine labels are "
                              "0 to 99",
                              name, r, l[1]);
    }
    if (count == 0) return 0;
    if (ix->n > 0 && (ix->width != CIFAR_SIDE || ix->height != CIFAR_SIDE || ix->channels != 3))
        return dsrt__fail(DSRT_EOPTION, "cifar: %s: the index already holds %dx%dx%d images", name,
                          ix->width, ix->height, ix->channels);
    if (count > UINT32_MAX - ix->n)
        return dsrt__fail(DSRT_ETOOBIG, "cifar: %s: more than 2^32-1 samples in all", name);

    /* Exact sizes: the batches of a split are few and large, so doubling
     * would only waste memory. */
    const size_t n0 = ix->n, total = n0 + count;
    uint8_t *px = dsrt__realloc(ix->pixels, total * CIFAR_PIXELS);
    if (!px) return -ENOMEM;
    ix->pixels = px;
    int32_t *lab = dsrt__realloc(ix->labels, total * sizeof *lab);
    if (!lab) return -ENOMEM;
    ix->labels = lab;

    const size_t which = kind == DSRT_SOURCE_CIFAR100 && !coarse ? 1 : 0;
    for (size_t r = 0; r < count; r++) {
        const uint8_t *s = buf + r * rec;
        lab[n0 + r] = s[which];
        const uint8_t *red = s + nl, *green = red + CIFAR_PLANE, *blue = green + CIFAR_PLANE;
        uint8_t *d = px + (n0 + r) * CIFAR_PIXELS; /* (32, 32, 3) */
        for (size_t i = 0; i < CIFAR_PLANE; i++) {
            d[3 * i + 0] = red[i];
            d[3 * i + 1] = green[i];
            d[3 * i + 2] = blue[i];
        }
    }
    ix->n = total;
    ix->width = ix->height = CIFAR_SIDE;
    ix->channels = 3;
    ix->source = kind;
    return 0;
}

// ----------------------------------------------------------------------------
// Files and folders

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int has(const char *dir, const char *name) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return is_file(p);
}

static int load_batch(dsrt_index *ix, const char *path, dsrt_source kind, int coarse) {
    uint8_t *buf;
    size_t len;
    int rc = dsrt__read_whole_file(path, CIFAR_MAX_FILE, &buf, &len);
    if (rc != 0) return dsrt__fail_prefix(rc, "cifar");
    rc = dsrt__cifar_parse(ix, buf, len, path, kind, coarse);
    free(buf);
    return rc;
}

/*
 * Sets the class names from the names file at path (one a line, blank lines
 * ignored, surrounding blanks trimmed), or "0", "1", ... when there is no
 * such file or it does not hold exactly `count` names (then with a warning).
 */
static int set_class_names(dsrt_index *ix, const char *path, size_t count) {
    const char *names[100];
    char digits[100][4];
    uint8_t *text = NULL;
    size_t len = 0, got = 0;
    int rc;

    if (path && is_file(path)) {
        if ((rc = dsrt__read_whole_file(path, CIFAR_MAX_NAMES, &text, &len)) != 0)
            return dsrt__fail_prefix(rc, "cifar");
        char *s = (char *)text, *end = s + len;
        while (s < end) {
            char *eol = memchr(s, '\n', (size_t)(end - s));
            if (!eol) eol = end;
            char *a = s, *b = eol;
            while (a < b && isspace((unsigned char)*a)) a++;
            while (b > a && isspace((unsigned char)b[-1])) b--;
            if (a < b) {
                if (got < count) names[got] = a;
                got++;
                *b = '\0';
            }
            s = eol + 1;
        }
        if (got != count)
            dsrt__index_warn(ix,
                             "cifar: %s: %zu class names where %zu were expected; classes "
                             "are named by number",
                             path, got, count);
    }
    if (got != count)
        for (size_t c = 0; c < count; c++) {
            snprintf(digits[c], sizeof digits[c], "%zu", c);
            names[c] = digits[c];
        }
    rc = dsrt__index_set_classes(ix, names, count);
    free(text);
    return rc;
}

/* The kind of a batch file, from its name, else from its size. */
static int guess_file_kind(const char *path, dsrt_source *kind) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (!strncmp(base, "data_batch", 10) || !strncmp(base, "test_batch", 10)) {
        *kind = DSRT_SOURCE_CIFAR10;
        return 0;
    }
    if (!strcmp(base, "train.bin") || !strcmp(base, "test.bin")) {
        *kind = DSRT_SOURCE_CIFAR100;
        return 0;
    }
    struct stat st;
    if (stat(path, &st) != 0) return dsrt__fail(-errno, "cifar: %s: %s", path, strerror(errno));
    int ten = st.st_size % (1 + CIFAR_PIXELS) == 0, hundred = st.st_size % (2 + CIFAR_PIXELS) == 0;
    if (ten != hundred) {
        *kind = ten ? DSRT_SOURCE_CIFAR10 : DSRT_SOURCE_CIFAR100;
        return 0;
    }
    return dsrt__fail(DSRT_EOPTION,
                      "cifar: %s: cannot tell CIFAR-10 from CIFAR-100; set the source option",
                      path);
}

/* The kind of a folder of batches, from the files in it. */
static int guess_dir_kind(const char *dir, dsrt_source *kind) {
    if (has(dir, "data_batch_1.bin") || has(dir, "test_batch.bin") ||
        has(dir, "batches.meta.txt")) {
        *kind = DSRT_SOURCE_CIFAR10;
        return 0;
    }
    if (has(dir, "train.bin") || has(dir, "test.bin") || has(dir, "fine_label_names.txt")) {
        *kind = DSRT_SOURCE_CIFAR100;
        return 0;
    }
    return dsrt__fail(DSRT_EFORMAT,
                      "cifar: %s: no CIFAR-10 (data_batch_1.bin, test_batch.bin) or CIFAR-100 "
                      "(train.bin, test.bin) batches in this folder",
                      dir);
}

int dsrt__cifar_load(dsrt_index *ix, const char *path, dsrt_source kind,
                     const dsrt_datastore_options *o) {
    char dir[PATH_MAX + 32], file[PATH_MAX + 64], names[PATH_MAX + 64];
    dsrt_split split = o ? o->split : DSRT_SPLIT_TRAIN;
    int coarse = o ? o->cifar100_coarse : 0, rc;

    if (strlen(path) >= PATH_MAX)
        return dsrt__fail(-ENAMETOOLONG, "cifar: %s: path too long", path);
    if (is_dir(path)) {
        snprintf(dir, sizeof dir, "%s", path);
        /* The folder the archive unpacks to may be given by its parent. */
        static const char *const sub[2] = {"cifar-10-batches-bin", "cifar-100-binary"};
        for (int k = 0; k < 2; k++) {
            int want = kind == DSRT_SOURCE_AUTO ||
                       kind == (k ? DSRT_SOURCE_CIFAR100 : DSRT_SOURCE_CIFAR10);
            char p[PATH_MAX + 32];
            snprintf(p, sizeof p, "%s/%s", path, sub[k]);
            if (want && guess_dir_kind(path, &(dsrt_source){0}) != 0 && is_dir(p)) {
                snprintf(dir, sizeof dir, "%s", p);
                break;
            }
        }
        if (kind == DSRT_SOURCE_AUTO && (rc = guess_dir_kind(dir, &kind)) != 0) return rc;

        if (kind == DSRT_SOURCE_CIFAR10) {
            if (split == DSRT_SPLIT_TEST) {
                snprintf(file, sizeof file, "%s/test_batch.bin", dir);
                if ((rc = load_batch(ix, file, kind, 0)) != 0) return rc;
            } else {
                for (int b = 1; b <= 5; b++) {
                    snprintf(file, sizeof file, "%s/data_batch_%d.bin", dir, b);
                    if ((rc = load_batch(ix, file, kind, 0)) != 0) return rc;
                }
            }
            snprintf(names, sizeof names, "%s/batches.meta.txt", dir);
        } else {
            snprintf(file, sizeof file, "%s/%s", dir,
                     split == DSRT_SPLIT_TEST ? "test.bin" : "train.bin");
            if ((rc = load_batch(ix, file, kind, coarse)) != 0) return rc;
            snprintf(names, sizeof names, "%s/%s", dir,
                     coarse ? "coarse_label_names.txt" : "fine_label_names.txt");
        }
    } else {
        if (kind == DSRT_SOURCE_AUTO && (rc = guess_file_kind(path, &kind)) != 0) return rc;
        if ((rc = load_batch(ix, path, kind, coarse)) != 0) return rc;
        const char *slash = strrchr(path, '/');
        int dlen = slash ? (int)(slash - path) : 1;
        const char *d = slash ? path : ".";
        snprintf(names, sizeof names, "%.*s/%s", dlen, d,
                 kind == DSRT_SOURCE_CIFAR10 ? "batches.meta.txt"
                 : coarse                    ? "coarse_label_names.txt"
                                             : "fine_label_names.txt");
    }
    ix->source = kind;
    return set_class_names(ix, names, class_count(kind, coarse));
}

// ----------------------------------------------------------------------------
// The sources

/* A CIFAR .bin batch is whole records; an IDX header wins over the size. */
static int detect10(const dsrt_probe *p) {
    if (!p->exists) return 0;
    if (p->folder)
        return dsrt__has_file(p->path, "batches.meta.txt") ||
               dsrt__has_file(p->path, "data_batch_1.bin");
    return !p->idx_head && dsrt__ends_with_ci(p->path, ".bin") && p->size % 3073 == 0;
}

static int detect100(const dsrt_probe *p) {
    if (!p->exists) return 0;
    if (p->folder)
        return dsrt__has_file(p->path, "fine_label_names.txt") ||
               (dsrt__has_file(p->path, "train.bin") && dsrt__has_file(p->path, "test.bin"));
    return !p->idx_head && dsrt__ends_with_ci(p->path, ".bin") && p->size % 3074 == 0;
}

static int open10(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    return dsrt__cifar_load(ix, path, DSRT_SOURCE_CIFAR10, o);
}

static int open100(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    return dsrt__cifar_load(ix, path, DSRT_SOURCE_CIFAR100, o);
}

const dsrt_source_ops dsrt__source_cifar10 = {
    .kind = DSRT_SOURCE_CIFAR10,
    .what = "a CIFAR .bin batch",
    .detect = detect10,
    .open = open10,
};

const dsrt_source_ops dsrt__source_cifar100 = {
    .kind = DSRT_SOURCE_CIFAR100,
    .detect = detect100,
    .open = open100,
};

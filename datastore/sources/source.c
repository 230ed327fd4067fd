/*
 * The table of sources (source.h): one entry a line of DSRT_SOURCES, in
 * its order, each the dsrt_source_ops its folder defines as
 * dsrt__source_<name>. Detection asks them in turn; opening dispatches to
 * the one asked for.
 */
#include "datastore/sources/source.h"

#include "datastore/bytes/url.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define DSRT_SOURCE_DECLARE_(kind, value, name) extern const dsrt_source_ops dsrt__source_##name;
DSRT_SOURCES(DSRT_SOURCE_DECLARE_)
#undef DSRT_SOURCE_DECLARE_

#define DSRT_SOURCE_ENTRY_(kind, value, name) &dsrt__source_##name,
static const dsrt_source_ops *const SOURCES[] = {DSRT_SOURCES(DSRT_SOURCE_ENTRY_)};
#undef DSRT_SOURCE_ENTRY_

/* A mix is made, never detected nor opened: not a line of the table. */
extern const dsrt_source_ops dsrt__source_mix;

const dsrt_source_ops *dsrt__source_ops(dsrt_source kind) {
    if (kind == DSRT_SOURCE_MIX) return &dsrt__source_mix;
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(SOURCES); k++)
        if (SOURCES[k]->kind == kind) return SOURCES[k];
    return NULL;
}

const dsrt_source_ops *dsrt__source_of(const dsrt_datastore *ds) {
    return dsrt__source_ops(ds->index->source);
}

// ----------------------------------------------------------------------------
// Detection

/* "a CIFAR .bin batch, an IDX file, ... or a folder": what the sources take. */
static void expected(char *out, size_t cap) {
    size_t n = 0, count = 0, seen = 0;
    out[0] = '\0';
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(SOURCES); k++) count += SOURCES[k]->what != NULL;
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(SOURCES) && n < cap; k++) {
        if (!SOURCES[k]->what) continue;
        seen++;
        const char *sep = seen == 1 ? "" : seen == count ? " or " : ", ";
        int w = snprintf(out + n, cap - n, "%s%s", sep, SOURCES[k]->what);
        if (w < 0) break;
        n += (size_t)w;
    }
}

/* The kind of source at a URL: the first source that takes it. */
static int detect_url(const char *url, const dsrt_datastore_options *o, dsrt_source *kind) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(SOURCES); k++) {
        if (!SOURCES[k]->detect_url) continue;
        int rc = SOURCES[k]->detect_url(url, o);
        if (rc < 0) return rc;
        if (rc) {
            *kind = SOURCES[k]->kind;
            return 0;
        }
    }
    char display[512];
    dsrt_text_redact(url, display, sizeof display);
    return dsrt__fail(DSRT_EFORMAT,
                      "open: %s: an http(s) URL must name a CSV manifest (.csv, .txt, .lst): "
                      "only s3:// prefixes can be listed as folders",
                      display);
}

/* What detection looks at of an existing local path. */
static int probe_path(dsrt_probe *pr, const struct stat *st) {
    const char *path = pr->path;
    pr->exists = 1;
    pr->folder = S_ISDIR(st->st_mode);
    if (pr->folder) return 0;
    if (!S_ISREG(st->st_mode))
        return dsrt__fail(DSRT_EFORMAT, "open: %s: is %s, neither a folder nor a regular file",
                          path, dsrt__file_kind(st->st_mode));
    int fd;
    struct stat fst;
    int rc = dsrt__open_regular(path, &fd, &fst);
    if (rc != 0) return dsrt__fail_prefix(rc, "open");
    ssize_t got = pread(fd, pr->head, sizeof pr->head, 0);
    int e = errno;
    close(fd);
    if (got < 0) return dsrt__fail(-e, "open: %s: %s", path, strerror(e));
    if (got == 0) return dsrt__fail(DSRT_EEMPTY, "open: %s: empty file", path);
    pr->got = (size_t)got;
    pr->size = (uint64_t)fst.st_size;
    const unsigned char *h = pr->head;
    pr->idx_head = (got >= 2 && h[0] == 0x1f && h[1] == 0x8b) ||
                   (got >= 4 && h[0] == 0 && h[1] == 0 && h[2] == 0x08 && h[3] >= 1 && h[3] <= 4);
    return 0;
}

int dsrt__detect_source(const char *path, const dsrt_datastore_options *o, dsrt_source *kind) {
    struct stat st;
    dsrt_probe pr = {.path = path};
    if (dsrt__is_url(path)) return detect_url(path, o, kind);
    int e = 0, rc;
    if (stat(path, &st) != 0)
        e = errno; /* a source may take a name that names nothing (a pattern) */
    else if ((rc = probe_path(&pr, &st)) != 0)
        return rc;
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(SOURCES); k++)
        if (SOURCES[k]->detect && SOURCES[k]->detect(&pr)) {
            *kind = SOURCES[k]->kind;
            return 0;
        }
    if (e) return dsrt__fail(-e, "open: %s: %s", path, strerror(e));
    char what[512];
    expected(what, sizeof what);
    return dsrt__fail(DSRT_EFORMAT,
                      "open: %s: cannot tell the kind of source (expected %s); set the source "
                      "option",
                      path, what);
}

// ----------------------------------------------------------------------------
// Opening

int dsrt__source_open(dsrt_index *ix, dsrt_source kind, const char *path,
                      const dsrt_datastore_options *o) {
    const dsrt_source_ops *ops = dsrt__source_ops(kind);
    if (!ops) return dsrt__fail(DSRT_EOPTION, "datastore: unknown source");
    if (!dsrt__is_url(path)) return ops->open(ix, path, o);
    if (ops->open_url) return ops->open_url(ix, path, o);
    return dsrt__fail(DSRT_EUNSUPPORTED,
                      "datastore: a %s source cannot be read from a URL (folders from s3:// "
                      "prefixes and manifests can): copy it to a local file",
                      dsrt_source_name(kind));
}
